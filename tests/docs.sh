#!/bin/sh
# docs.sh DDPC [--update]: the documentation agrees with the compiler.
#  - The reference tables of docs/language.md (built-ins, settings) and
#    docs/diagnostics.md (the catalogue) are the compiler's own listings
#    (--list-builtins, --list-diagnostics); --update rewrites them.
#  - Every ```ddp example in docs/ and README.md checks clean: exit 0, no diagnostic;
#    so does the example in each standard library file's header (its first run of
#    comment lines indented `#   `).
set -u
ddpc=$(realpath "$1")
mode=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-docs.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0

# regenerate FILE SECTION TABLE: FILE with the lines between `<!-- SECTION:begin` and
# `<!-- SECTION:end` replaced by TABLE, written to stdout.
regenerate() {
    awk -v section="$2" -v table="$3" '
        index($0, "<!-- " section ":begin") == 1 {
            print
            while ((getline line < table) > 0) print line
            skip = 1
            next
        }
        index($0, "<!-- " section ":end") == 1 { skip = 0 }
        !skip { print }' "$1"
}

# check_tables FILE SECTION TABLE...: compares (or with --update, rewrites) FILE's
# generated sections.
check_tables() {
    file=$1
    shift
    cp "$file" "$work/doc"
    while [ $# -gt 0 ]; do
        regenerate "$work/doc" "$1" "$2" >"$work/doc.new"
        mv "$work/doc.new" "$work/doc"
        shift 2
    done
    if [ "$mode" = "--update" ]; then
        cp "$work/doc" "$file"
    elif ! diff -u "$file" "$work/doc"; then
        echo "FAIL $file: its tables differ from the compiler's (tests/docs.sh DDPC --update)"
        failures=$((failures + 1))
    else
        echo "ok   $file: tables agree with the compiler"
    fi
}

"$ddpc" --list-builtins >"$work/all"
{ echo '| kind | signature | meaning |'; echo '|---|---|---|';
  grep -v -E '^\| (strategy|train) \|' "$work/all"; } >"$work/builtins"
{ echo '| where | setting | takes |'; echo '|---|---|---|';
  grep -E '^\| (strategy|train) \|' "$work/all"; } >"$work/settings"
{ echo '| name | kind | meaning |'; echo '|---|---|---|';
  "$ddpc" --list-diagnostics; } >"$work/diagnostics"
check_tables "$root/docs/language.md" builtins "$work/builtins" settings "$work/settings"
check_tables "$root/docs/diagnostics.md" catalogue "$work/diagnostics"

# every ```ddp block, each a program of its own
for doc in "$root"/docs/*.md "$root/README.md"; do
    [ -f "$doc" ] || continue
    awk -v out="$work/$(basename "$doc" .md)" '
        /^```ddp$/ { n++; file = out "." n ".ddp"; inside = 1; next }
        /^```/ { inside = 0; next }
        inside { print > file }' "$doc"
done
for lib in "$root"/stdlib/*.ddp; do
    awk '/^#   / { sub(/^#   /, ""); print; seen = 1; next } seen { exit }' "$lib" > "$work/stdlib_$(basename "$lib")"
    [ -s "$work/stdlib_$(basename "$lib")" ] || rm "$work/stdlib_$(basename "$lib")"
done
for example in "$work"/*.ddp; do
    [ -f "$example" ] || continue
    if DDP_STDLIB="$root/stdlib" "$ddpc" check "$example" >"$work/out" 2>&1 && [ ! -s "$work/out" ]; then
        echo "ok   example $(basename "$example")"
    else
        echo "FAIL example $(basename "$example") does not check clean:"
        cat "$example" "$work/out"
        failures=$((failures + 1))
    fi
done
[ "$failures" -eq 0 ]
