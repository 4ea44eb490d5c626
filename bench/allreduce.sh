#!/bin/sh
# allreduce.sh [BUILD_DIR]: the ring all-reduce between local workers, beside
# OpenMPI's MPI_Allreduce for the same sizes and worker counts, measured in this run.
#
# First bench_allreduce's tables (see bench/allreduce.c: per size the median time,
# algbw = bytes / time, busbw = algbw * 2(n-1)/n as NCCL defines it for all-reduce,
# and a memcpy of the same size as the machine's reference). Then, where mpicc and
# mpirun are on PATH, bench/mpi_allreduce.c measures MPI_Allreduce the same way over
# OpenMPI's shared memory (btl vader) and over TCP on the loopback (btl tcp), and the
# last table gives ring busbw / MPI busbw for each: above 1 the ring is faster. The
# TCP column is the like-for-like one (the ring is TCP too); shared memory is what
# MPI does on one machine at its best.
#
# WORKERS (2,4,8), MIN_BYTES (1K), MAX_BYTES (256M) and BENCH_SECONDS (0.5, of timed
# repetitions per size) change what is measured.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build}")
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
workers=${WORKERS:-2,4,8} min=${MIN_BYTES:-1K} max=${MAX_BYTES:-256M} seconds=${BENCH_SECONDS:-0.5}

cmake --build "$build" --target bench_allreduce >/dev/null
# the tables as they come, the JSON lines kept for the comparison
{ "$build/bench_allreduce" --workers "$workers" --min "$min" --max "$max" --seconds "$seconds" --json ||
    touch "$work/failed"; } | tee "$work/ring.out" | grep -v '^{'
[ ! -e "$work/failed" ] || { echo "allreduce.sh: bench_allreduce failed" >&2; exit 1; }

# "WORKERS BYTES BUSBW" from JSON lines, and the transport first for MPI's
sed -n 's/.*"workers": \([0-9]*\), "bytes": \([0-9]*\),.*"busbw_gbps": \([^,}]*\).*/\1 \2 \3/p' \
    "$work/ring.out" >"$work/ring.txt"
sizes=$(awk '!seen[$2]++ { printf "%s%s", n++ ? "," : "", $2 }' "$work/ring.txt")

if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
    echo "OpenMPI not installed: skipped"
    exit 0
fi
mpicc -O2 -o "$work/mpi_allreduce" "$root/bench/mpi_allreduce.c" -lm
as_root=""
[ "$(id -u)" -ne 0 ] || as_root=--allow-run-as-root
version=$(mpirun --version 2>/dev/null | sed -n '1s/.*) //p')
echo "MPI_Allreduce of OpenMPI ${version:-?}, the same sizes and worker counts"
: >"$work/mpi.out"
for n in $(echo "$workers" | tr , ' '); do
    for transport in shm tcp; do
        # pml ob1, so that the btl asked for is the one used (not UCX)
        case $transport in
        shm) btl="--mca btl self,vader" ;;
        tcp) btl="--mca btl self,tcp --mca btl_tcp_if_include lo" ;;
        esac
        echo "  $n workers, $transport"
        # shellcheck disable=SC2086 # the options are words
        mpirun $as_root --oversubscribe --bind-to none -np "$n" --mca pml ob1 $btl \
            "$work/mpi_allreduce" --sizes "$sizes" --seconds "$seconds" --label "$transport" \
            >>"$work/mpi.out" || echo "allreduce.sh: mpirun failed ($n workers, $transport)" >&2
    done
done
sed -n 's/.*"transport": "\([a-z]*\)", "workers": \([0-9]*\), "bytes": \([0-9]*\),.*"busbw_gbps": \([^,}]*\).*/\1 \2 \3 \4/p' \
    "$work/mpi.out" >"$work/mpi.txt"

echo
echo "busbw GB/s, ring against MPI (ratio = ring / MPI: above 1 the ring is faster)"
awk 'function size(b, u) {
         for (u = 0; b >= 1024 && b % 1024 == 0 && u < 4; u++) b /= 1024
         return b substr(" KMGT", u + 1, u ? 1 : 0)
     }
     function ratio(a, b) { return b == "" || b + 0 == 0 ? "-" : sprintf("%.2f", a / b) }
     function shown(x) { return x == "" ? "-" : sprintf("%.3f", x) }
     FILENAME == ARGV[1] { mpi[$1, $2, $3] = $4; next }
     FNR == 1 { printf "%7s %8s %10s %10s %7s %10s %7s\n", "workers", "size", "ring", "mpi shm", "ratio",
                       "mpi tcp", "ratio" }
     { shm = mpi["shm", $1, $2]; tcp = mpi["tcp", $1, $2]
       printf "%7d %8s %10.3f %10s %7s %10s %7s\n", $1, size($2), $3, shown(shm), ratio($3, shm), shown(tcp),
              ratio($3, tcp) }' "$work/mpi.txt" "$work/ring.txt"
