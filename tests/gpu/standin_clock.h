/* standin_clock.h: the monotonic clock and the sleep that the stand-in NCCL
 * (fake_nccl.c) and its test (tests/unit/nccl_standin.c) both time their waits with. */
#ifndef DDP_STANDIN_CLOCK_H
#define DDP_STANDIN_CLOCK_H

#include <errno.h>
#include <time.h>

static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The whole time, a signal or not. */
static inline void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

#endif
