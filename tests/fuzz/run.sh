#!/bin/sh
# run.sh FUZZER TESTS_DIR SECONDS: a short fuzzing run seeded from the golden cases,
# the samples and the standard library. Any crash, leak, hang (10 s per input) or
# sanitizer report fails it; the input that caused it is left in the work folder.
set -eu
fuzzer=$1 tests=$2 seconds=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-fuzz.XXXXXX")
mkdir -p "$work/corpus" "$work/seeds"
i=0
for f in "$tests"/golden/*/*.ddp "$tests"/../samples/*.ddp "$tests"/../stdlib/*.ddp; do
    i=$((i + 1))
    cp "$f" "$work/seeds/$i.ddp"
done
cd "$work"
if "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
        -dict="$tests/fuzz/ddp.dict" -print_final_stats=1 corpus seeds; then
    rm -rf "$work"
else
    echo "fuzzing found a failure; inputs kept in $work" >&2
    exit 1
fi
