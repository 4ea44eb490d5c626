#!/bin/sh
# run.sh frontend|inputs FUZZER TESTS_DIR SECONDS: a short fuzzing run. The front end's
# is seeded from the golden cases, the samples and the standard library, with the
# language's dictionary; the inputs' (fuzz_inputs.c) from one well-formed file of each
# kind (input_seeds.py). Any crash, leak, hang or sanitizer report fails it; the input
# that caused it is left in the work folder. A hang is 10 s on one input of the front
# end; 30 s on one of the inputs, since a node list of 2^20 long names, which is
# accepted, takes 4 s under ASan on an idle core.
set -eu
target=$1 fuzzer=$2 tests=$3 seconds=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-fuzz.XXXXXX")
mkdir -p "$work/corpus" "$work/seeds" "$work/tmp"
set --
case $target in
frontend)
    i=0
    for f in "$tests"/golden/*/*.ddp "$tests"/../samples/*.ddp "$tests"/../stdlib/*.ddp; do
        i=$((i + 1))
        cp "$f" "$work/seeds/$i.ddp"
    done
    set -- -dict="$tests/fuzz/ddp.dict" -max_len=16384 -timeout=10 ;;
inputs)
    python3 "$tests/fuzz/input_seeds.py" "$work/seeds"
    set -- -max_len=8192 -timeout=30 ;;
*)
    echo "run.sh: no fuzzing target \`$target\` (frontend or inputs)" >&2
    exit 2 ;;
esac
cd "$work"
# the files a target writes go below the work folder, and go with it
if TMPDIR=$work/tmp "$fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
        "$@" corpus seeds; then
    rm -rf "$work"
else
    echo "fuzzing found a failure; inputs kept in $work" >&2
    exit 1
fi
