#!/bin/sh
# robustness.sh DDPC [MEMORY_KB]: hostile inputs end in diagnostics or success, never
# in a crash, a hang, a sanitizer report or runaway memory. Each input is generated
# here: binary junk, empty files, a 1 MB line, deep nesting, huge repeats, thousands of
# errors. MEMORY_KB caps the compiler's address space (0: no cap, as AddressSanitizer
# needs when it maps its shadow memory).
set -u
ddpc=$1
memory_kb=${2:-4000000}
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-robust.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
cases=0

# expect NAME STATUS PATTERN: runs ddpc check on $work/NAME.ddp with a time and memory
# limit; the exit status must be STATUS and stderr must match PATTERN (grep -E), or be
# empty when PATTERN is EMPTY.
expect() {
    name=$1 want=$2 pattern=$3
    cases=$((cases + 1))
    start=$(date +%s)
    (if [ "$memory_kb" -gt 0 ]; then ulimit -v "$memory_kb"; fi
     timeout 30 "$ddpc" check "$work/$name.ddp") \
        >"$work/$name.out" 2>"$work/$name.err"
    status=$?
    seconds=$(( $(date +%s) - start ))
    if [ "$status" -ne "$want" ]; then
        echo "FAIL $name: exit $status, expected $want (124: timeout; 86/87: sanitizer; >128: signal)"
        head -c 2000 "$work/$name.err"
        failures=$((failures + 1))
    elif [ "$pattern" = EMPTY ] && [ -s "$work/$name.err" ]; then
        echo "FAIL $name: expected no diagnostics, got:"
        head -c 2000 "$work/$name.err"
        failures=$((failures + 1))
    elif [ "$pattern" != EMPTY ] && ! grep -q -E -- "$pattern" "$work/$name.err"; then
        echo "FAIL $name: stderr lacks /$pattern/:"
        head -c 2000 "$work/$name.err"
        failures=$((failures + 1))
    else
        echo "ok   $name (exit $status, ${seconds}s, $(wc -l <"$work/$name.err") lines of diagnostics)"
    fi
}

repeat_text() { # repeat_text TEXT COUNT: TEXT written COUNT times, no newline
    awk -v t="$1" -v n="$2" 'BEGIN { for (i = 0; i < n; i++) printf "%s", t }'
}

: >"$work/empty.ddp"
expect empty 0 EMPTY

printf '\n\n   \t\n# only a comment\n' >"$work/blank.ddp"
expect blank 0 EMPTY

head -c 65536 /dev/urandom >"$work/random.ddp"
expect random 1 'error:'

head -c 200000 "$ddpc" >"$work/binary.ddp"
expect binary 1 'error:'

printf 'model m(input: [4]) {\0 dense(3) }\n' >"$work/nul.ddp"
expect nul 1 'unexpected byte 0x00'

{ printf 'let x = '; repeat_text '1 + ' 250000; echo 1; } >"$work/long_line.ddp"
expect long_line 1 'nested too deeply'

{ printf '# '; repeat_text 'x' 1048576; echo; echo 'let y = 1'; } >"$work/long_comment.ddp"
expect long_comment 0 'never used'

{ printf 'let '; repeat_text 'n' 1048576; echo ' = 1'; } >"$work/long_name.ddp"
expect long_name 0 'never used'

{ printf 'let x = "'; repeat_text 'abc' 400000; echo '"'; } >"$work/long_string.ddp"
expect long_string 0 'never used'

{ printf 'let x = '; repeat_text '(' 100000; printf 1; repeat_text ')' 100000; echo; } >"$work/deep_parens.ddp"
expect deep_parens 1 'nested too deeply'

{ printf 'let x = '; repeat_text '[' 100000; repeat_text ']' 100000; echo; } >"$work/deep_lists.ddp"
expect deep_lists 1 'nested too deeply'

{ printf 'let x = '; repeat_text '- ' 100000; echo 1; } >"$work/deep_unary.ddp"
expect deep_unary 1 'nested too deeply'

{ echo 'model m(input: [4]) {'; repeat_text 'if true { ' 20000; repeat_text '} ' 20000; echo '}'; } >"$work/deep_blocks.ddp"
expect deep_blocks 1 'nested too deeply'

{ echo 'model m(input: [4]) {'; printf 'in'; repeat_text ' -> relu' 100000; echo; echo '}'; } >"$work/long_chain.ddp"
expect long_chain 1 'nested too deeply'

{ echo 'model m(input: [4]) {'; printf 'reshape(['; repeat_text '1, ' 100000; echo '4]) }'; } >"$work/long_list.ddp"
expect long_list 1 'at most 8 axes'

printf 'model m(input: [4]) {\n  repeat 1000000000 { relu }\n}\n' >"$work/huge_repeat.ddp"
expect huge_repeat 1 'repetitions ddp allows'

printf 'model m(input: [4]) {\n  repeat 100000 { repeat 100000 { repeat 100000 { } } }\n}\n' >"$work/nested_repeat.ddp"
expect nested_repeat 1 'takes more than'

printf 'model m(input: [4]) {\n  repeat 100000 { relu }\n}\n' >"$work/many_layers.ddp"
expect many_layers 1 'more than 100000 layers'

printf 'model m(input: [4]) {\n  repeat 50000 { relu }\n}\n' >"$work/large_model.ddp"
expect large_model 0 EMPTY

printf 'block b(n) { b(n) }\nmodel m(input: [4]) {\n  b(3)\n}\n' >"$work/recursion.ddp"
expect recursion 1 'uses itself'

{ echo 'model m(input: [4]) {'; repeat_text 'dens(3)
' 10000; echo '}'; } >"$work/many_errors.ddp"
expect many_errors 1 'too many errors'

{ i=0; while [ $i -lt 2000 ]; do printf 'let v%d = v%d\n' $i $((i + 1)); i=$((i + 1)); done; echo 'let v2000 = v0'; } >"$work/let_cycle.ddp"
expect let_cycle 1 'depends on itself|more than'

{ i=0; while [ $i -lt 100000 ]; do printf 'let v%d = v%d + 1\n' $i $((i + 1)); i=$((i + 1)); done; echo 'let v100000 = 0'; } >"$work/let_chain.ddp"
expect let_chain 1 'chain of more than'

{ i=0; while [ $i -lt 20000 ]; do printf 'block b%d { b%d }\n' $i $((i + 1)); i=$((i + 1)); done; echo 'block b20000 { relu }'; echo 'model m(input: [4]) { b0 }'; } >"$work/block_chain.ddp"
expect block_chain 1 'nested more than'

{ i=0; while [ $i -lt 20000 ]; do printf 'let c%d = %d\n' $i $i; i=$((i + 1)); done; } >"$work/many_lets.ddp"
expect many_lets 0 'never used'

{ printf 'block b('; i=0; while [ $i -lt 50000 ]; do printf 'p%d = 1, ' $i; i=$((i + 1)); done; echo 'last = 1) { relu }';
  printf 'model m(input: [4]) { b('; i=0; while [ $i -lt 50000 ]; do printf 'p%d = 2, ' $i; i=$((i + 1)); done; echo ') }'; } >"$work/many_params.ddp"
expect many_params 0 EMPTY

{ echo 'model m(input: [4]) {'; i=0; while [ $i -lt 50000 ]; do printf 'let v%d = in\n' $i; i=$((i + 1)); done; echo '}'; } >"$work/many_locals.ddp"
expect many_locals 0 'never used'

{ i=0; while [ $i -lt 50000 ]; do printf 'let w%d = 1 ' $i; i=$((i + 1)); done; echo; } >"$work/warnings_on_long_line.ddp"
expect warnings_on_long_line 0 'never used'

{ printf 'block b(mode: a0'; i=1; while [ $i -lt 50000 ]; do printf ' | a%d' $i; i=$((i + 1)); done; echo ') { relu }'; } >"$work/many_words.ddp"
expect many_words 0 EMPTY

echo "robustness: $((cases - failures)) of $cases inputs handled"
[ "$failures" -eq 0 ]
