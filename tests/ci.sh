#!/bin/sh
# ci.sh: the whole test run, as the README gives it and as CI runs it on a fresh clone.
# Installs what is missing (what the tests need too: Slurm, munge), then builds two
# trees and runs every test in each:
#   build/       release, gcc: golden, unit, robustness and documentation tests, whole
#                programs training on the real Fashion-MNIST, real Slurm jobs
#   build-asan/  clang with AddressSanitizer and UndefinedBehaviorSanitizer, plus
#                60-second libFuzzer runs over the front end and over what a training
#                program reads (dataset files, safetensors files, Slurm's node lists)
# The second tree runs even when the first failed. The end says, tree by tree, what
# was built, how long the build and the tests took, and which tests passed, failed or
# were skipped; the status is non-zero when anything failed.
set -u
cd "$(dirname "$0")/.." || exit 1
run_started=$(date +%s)
sh .ci/install-deps.sh --tests || { echo "ci: installing what is missing failed"; exit 1; }
jobs=$(nproc 2>/dev/null || echo 2)
summary=""
status=0

# minutes SECONDS: "12 min 5 s"
minutes() { echo "$(($1 / 60)) min $(($1 % 60)) s"; }

# tree DIR WHAT CMAKE_ARGS...: configures, builds and tests DIR, adding a line (or more)
# to the summary
tree() {
    dir=$1 what=$2
    shift 2
    log=$dir/ctest.log
    if ! cmake -S . -B "$dir" -G Ninja "$@"; then
        summary="$summary
ci: $dir ($what): cmake could not configure it; no test ran"
        status=1
        return
    fi
    started=$(date +%s)
    if ! cmake --build "$dir" -j "$jobs"; then
        summary="$summary
ci: $dir ($what): the build failed; no test ran"
        status=1
        return
    fi
    built=$(date +%s)
    ctest --test-dir "$dir" --output-on-failure -j "$jobs" --output-log "$log"
    rc=$?
    tested=$(date +%s)
    [ $rc -ne 0 ] && status=1
    counts=$(grep -E "tests passed, [0-9]+ tests? failed out of" "$log" | tail -n 1)
    skipped=$(sed -n '/The following tests did not run:/,/^$/p' "$log" | sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\).*/\1/p' |
        tr '\n' ' ')
    failed=$(sed -n '/The following tests FAILED:/,/^$/p' "$log" | sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\).*/\1/p' |
        tr '\n' ' ')
    summary="$summary
ci: $dir ($what): ${counts:-ctest exited $rc before counting}
    time:    built in $(minutes $((built - started))), tested in $(minutes $((tested - built)))
    skipped: ${skipped:-none}
    failed:  ${failed:-none}"
}

# One cache of generated code for both trees (compiler/cache.c): a gcc-built and a
# clang-built ddpc make the same code, so the second tree's builds find what the
# first generated
DDP_CACHE_DIR=$(pwd)/build/ddp-cache
export DDP_CACHE_DIR
tree build "release, gcc" -DCMAKE_BUILD_TYPE=Release
tree build-asan "clang, ASan + UBSan, libFuzzer" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DDDP_SANITIZE=ON -DDDP_FUZZ=ON

printf '%s\n' "$summary"
echo "ci: the whole run took $(minutes $(($(date +%s) - run_started)))"
if [ $status -eq 0 ]; then
    echo "ci: all tests passed"
else
    echo "ci: FAILED (see above)"
fi
exit $status
