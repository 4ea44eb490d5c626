#!/bin/sh
# run.sh frontend|inputs|wire FUZZER TESTS_DIR SECONDS: a short fuzzing run. The front
# end's is seeded from the golden cases, the samples and the standard library, with the
# language's dictionary; the inputs' (fuzz_inputs.c) from one well-formed file of each
# kind (input_seeds.py); the network's (fuzz_wire.c) from one exchange of each role.
# Any crash, leak, hang or sanitizer report fails it; the input that caused it is left
# in the work folder. A hang is 10 s on one input of the front end or the network; 30 s
# on one of the inputs, since a node list of 2^20 long names, which is accepted, takes
# 4 s under ASan on an idle core.
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
wire)
    # one well-formed exchange of each role: a proof, a challenge and a proof, frames
    # of a rendezvous (fuzz_wire.c)
    python3 - "$work/seeds" <<'SEEDS'
import struct, sys
frame = lambda kind, body: struct.pack("<IHHII", 0x77504444, 1, kind, len(body), 0) + body
seeds = [b"\0" + frame(2, bytes(48)), b"\1" + frame(1, bytes(17)) + frame(2, bytes(32)),
         b"\2" + frame(3, b"rank 1\nport 29500\naddress 10.0.0.2") + frame(4, b"setting program 0123abcd\n")]
for i, seed in enumerate(seeds):
    open("%s/%d" % (sys.argv[1], i), "wb").write(seed)
SEEDS
    set -- -max_len=8192 -timeout=10 ;;
*)
    echo "run.sh: no fuzzing target \`$target\` (frontend, inputs or wire)" >&2
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
