/* measure.h: the method bench_allreduce (allreduce.c) and mpi_allreduce.c share, so
 * ddp's ring and MPI are timed and checked the same way: repetition counts, medians,
 * and a fill pattern whose sums are exact (bench_augment and bench_prefetch take its
 * clock and medians too). Header-only, since mpi_allreduce.c is built with mpicc and nothing of
 * ddp; inline, so a file that takes part of it compiles without warnings. */
#ifndef DDP_BENCH_MEASURE_H
#define DDP_BENCH_MEASURE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

enum {
    WARMUP = 2,
    MIN_REPS = 5,
    MAX_REPS = 200,
    PERIOD = 1021 /* of the fill pattern: a prime, so no chunk boundary lines up with it */
};

static inline int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Seconds on the monotonic clock. */
static inline double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Sorts v. */
static inline double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Repetitions filling about budget seconds when one takes sample seconds. */
static inline int reps_for(double sample, double budget) {
    double reps = sample > 0 ? ceil(budget / sample) : MAX_REPS;
    return reps < MIN_REPS ? MIN_REPS : reps > MAX_REPS ? MAX_REPS : (int)reps;
}

/* The value worker `rank` puts at a position whose index modulo PERIOD is phase;
 * small whole numbers, so every sum is exact in f32 whatever its order. */
static inline int pattern(int phase, int rank) {
    return (phase + 37 * rank) % PERIOD;
}

static inline void fill(float *data, int64_t count, int rank) {
    for (int64_t i = 0, phase = 0; i < count; i++, phase = phase + 1 == PERIOD ? 0 : phase + 1)
        data[i] = (float)pattern((int)phase, rank);
}

/* The sum over `world` workers at each phase of the pattern. */
static inline void pattern_sums(float sums[PERIOD], int world) {
    for (int phase = 0; phase < PERIOD; phase++) {
        sums[phase] = 0;
        for (int w = 0; w < world; w++)
            sums[phase] += (float)pattern(phase, w);
    }
}

/* The first element that is not the sum over the workers, or -1. */
static inline int64_t first_wrong(const float *data, int64_t count, const float *sums) {
    for (int64_t i = 0, phase = 0; i < count; i++, phase = phase + 1 == PERIOD ? 0 : phase + 1)
        if (data[i] != sums[phase])
            return i;
    return -1;
}

#endif
