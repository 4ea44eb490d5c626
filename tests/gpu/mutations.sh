#!/bin/sh
# mutations.sh DDPC SOURCE CHECK CHECK_WITHOUT_BARRIERS CONV_CHECK: faults the CPU path
# cannot see, each caught by the emulated device as a GPU would show it. CHECK is
# kernel_check linked with SOURCE's model, CHECK_WITHOUT_BARRIERS the same model built
# with --no-barriers, CONV_CHECK kernel_check linked with a model with convolutions:
#   - a dropped barrier: the block sums go wrong (shared memory starts as NaN), while
#     the CPU's kernels of that build are the very same as the plain build's;
#   - a wrong leading dimension: the product is refused, as cuBLAS refuses it;
#   - a missing synchronisation: what the host reads is NaN, not the results;
#   - a missing copy: the host touching device memory is stopped, with a message;
#   - a launch beyond the GPU's limits (2048 threads, 64 KB of shared memory a block)
#     is refused, as the driver refuses it;
#   - index launches whose grid's threads are not a multiple of their kernel's
#     channels: a thread's indices fall in several channels, and the values it
#     computed once for its first channel are wrong for the others;
#   - a synchronisation, or a copy from ordinary host memory, while a CUDA graph is
#     being captured is refused, as the driver refuses it;
#   - a library convolution with its padding a row off fails, within all the rounding
#     its sums are allowed.
set -u
ddpc=$1 source=$2 check=$3 unbarred=$4 conv_check=$5
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_failure WHAT PATTERN COMMAND...: COMMAND fails, saying PATTERN
expect_failure() {
    what=$1 pattern=$2
    shift 2
    out=$("$@" 2>&1)
    status=$?
    if [ $status -ne 0 ] && printf '%s\n' "$out" | grep -q -- "$pattern"; then
        echo "ok: $what: status $status: $(printf '%s\n' "$out" | grep -m 1 -- "$pattern" | cut -c1-160)"
    else
        fail "$what: status $status, not saying \"$pattern\":"
        printf '%s\n' "$out" | tail -5
    fi
}

"$check" emulated > /dev/null && echo "ok: the model's kernels agree on the emulated device without a fault" ||
    fail "the model's kernels disagree on the emulated device without a fault"

expect_failure "a dropped barrier" "FAIL ddp_k[0-9]*_[a-z_]*.*differs by" "$unbarred" emulated
cpu=$("$ddpc" emit --stage=llvm "$source" 2>&1)
cpu_unbarred=$("$ddpc" emit --stage=llvm --no-barriers "$source" 2>&1)
[ "$cpu" = "$cpu_unbarred" ] && echo "ok: ... which the CPU cannot see: its kernels are the same in both builds" ||
    fail "the CPU's kernels differ with --no-barriers"
barriers=$("$ddpc" emit --stage=ptx "$source" | grep -c "bar.sync")
left=$("$ddpc" emit --stage=ptx --no-barriers "$source" | grep -c "bar.sync")
[ "$barriers" -gt 0 ] && [ "$left" -eq 0 ] && echo "ok: ... and the PTX's $barriers barriers are gone" ||
    fail "the PTX holds $barriers barriers, $left with --no-barriers"

expect_failure "a wrong leading dimension" "CUBLAS_STATUS_INVALID_VALUE" "$check" emulated --mutate=leading-dimension
expect_failure "a missing synchronisation" "differs by inf" "$check" emulated --mutate=synchronisation
expect_failure "a missing copy" "host code read or wrote device memory" "$check" emulated --mutate=copy
expect_failure "blocks of 2048 threads" "threads a block: at most 1024" "$check" emulated --mutate=threads
"$check" emulated --small-grids > /dev/null && echo "ok: the model's kernels agree with the fewest blocks a launch allows" ||
    fail "the model's kernels disagree with the fewest blocks a launch allows"
expect_failure "a grid's threads not a multiple of a kernel's channels" "FAIL ddp_k[0-9]*_pointwise.*differs by" \
    "$check" emulated --mutate=period
expect_failure "a synchronisation inside a graph's capture" "operation not permitted when stream is capturing" \
    "$check" emulated --mutate=capture-sync
expect_failure "a pageable copy inside a graph's capture" "pageable host memory while stream" \
    "$check" emulated --mutate=capture-pageable
expect_failure "64 KB of shared memory" "bytes of shared memory a block: at most 49152" "$check" emulated \
    --mutate=shared
"$conv_check" emulated > /dev/null && echo "ok: the convolutions' model agrees on the emulated device without a fault" ||
    fail "the convolutions' model disagrees on the emulated device without a fault"
expect_failure "a convolution's padding a row off" "FAIL conv .*differs by" "$conv_check" emulated --mutate=padding
[ $failures -eq 0 ] || exit 1
echo "mutations: every fault caught"
