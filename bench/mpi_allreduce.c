/* mpi_allreduce.c: OpenMPI's MPI_Allreduce on f32 buffers, measured the way
 * bench_allreduce measures ddp's ring, so bench/allreduce.sh can set one beside the
 * other (it compiles this with mpicc and starts it with mpirun).
 *
 * mpi_allreduce --sizes BYTES,... [--seconds S] [--label TEXT]
 *
 * For each size: every rank fills its buffer with known values, all meet at a
 * barrier, the in-place MPI_Allreduce (MPI_SUM) alone is timed, and the sum is
 * checked (a wrong value aborts the job). After 2 warm-ups, about S seconds of
 * repetitions (5 to 200); a repetition's time is the slowest rank's, and the median
 * over repetitions is reported. The method, limits and fill pattern are
 * bench/measure.h's, the same as bench_allreduce's.
 *
 * How to read it: rank 0 prints one JSON line per size, with the label (which
 * transport mpirun was told to use), the time, algbw (bytes / time) and busbw
 * (algbw * 2(n-1)/n, NCCL's bus bandwidth), in 10^9 bytes per second. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "measure.h"

enum { MAX_SIZES = 32 };

static void check(const float *data, long long count, const float *sums) {
    int64_t i = first_wrong(data, count, sums);
    if (i >= 0) {
        fprintf(stderr, "mpi_allreduce: MPI_Allreduce of %lld values gave a wrong sum: value %lld is %g, it "
                        "should be %g\n", count, (long long)i, (double)data[i], (double)sums[i % PERIOD]);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

/* One repetition's time on this rank. */
static double timed_allreduce(float *data, long long count, const float *sums, int rank) {
    fill(data, count, rank);
    MPI_Barrier(MPI_COMM_WORLD);
    double begin = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, data, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double seconds = MPI_Wtime() - begin;
    check(data, count, sums);
    return seconds;
}

/* The median of the slowest rank's times (on rank 0) and the repetitions. */
static double measure_size(float *data, long long count, const float *sums, double budget, int rank, int world,
                           int *reps) {
    double warm = 0, total, times[MAX_REPS], slowest[MAX_REPS];
    for (int k = 0; k < WARMUP; k++)
        warm = timed_allreduce(data, count, sums, rank);
    MPI_Allreduce(&warm, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); /* the same count on every rank */
    *reps = reps_for(total / world, budget);
    for (int k = 0; k < *reps; k++)
        times[k] = timed_allreduce(data, count, sums, rank);
    MPI_Reduce(times, slowest, *reps, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    return rank == 0 ? median(slowest, *reps) : 0;
}

static void usage(void) {
    fprintf(stderr, "usage: mpi_allreduce --sizes BYTES,... [--seconds S] [--label TEXT]\n");
    exit(2);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, world, size_count = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    long long sizes[MAX_SIZES];
    double budget = 0.5;
    const char *label = "mpi";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--seconds") == 0) {
            budget = atof(argv[i + 1]);
        } else if (strcmp(argv[i], "--label") == 0) {
            label = argv[i + 1];
        } else if (strcmp(argv[i], "--sizes") == 0) {
            for (char *p = argv[i + 1], *end; *p && size_count < MAX_SIZES; p = *end ? end + 1 : end) {
                sizes[size_count] = strtoll(p, &end, 10);
                if (end == p || sizes[size_count++] < (long long)sizeof(float))
                    usage();
            }
        } else {
            usage();
        }
    }
    if (size_count == 0 || !(budget > 0))
        usage();
    float sums[PERIOD];
    pattern_sums(sums, world);
    long long largest = 0;
    for (int s = 0; s < size_count; s++)
        largest = sizes[s] > largest ? sizes[s] : largest;
    float *data = malloc((size_t)largest);
    if (!data) {
        fprintf(stderr, "mpi_allreduce: out of memory for %lld bytes\n", largest);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int s = 0; s < size_count; s++) {
        long long bytes = sizes[s] - sizes[s] % (long long)sizeof(float);
        int reps;
        double seconds = measure_size(data, bytes / (long long)sizeof(float), sums, budget, rank, world, &reps);
        double algbw = (double)bytes / seconds / 1e9;
        if (rank == 0)
            printf("{\"bench\": \"mpi_allreduce\", \"transport\": \"%s\", \"workers\": %d, \"bytes\": %lld, "
                   "\"reps\": %d, \"seconds\": %.9g, \"algbw_gbps\": %.6g, \"busbw_gbps\": %.6g}\n",
                   label, world, bytes, reps, seconds, algbw, algbw * 2.0 * (world - 1) / world);
        fflush(stdout);
    }
    free(data);
    MPI_Finalize();
    return 0;
}
