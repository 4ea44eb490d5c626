/* conv_test.h: what the convolution tests (conv_cpu.c, conv_emulated.c) share: the
 * modes' names, which of x, filters and y a mode writes, and a fixed sequence of
 * uniform values to fill tensors with. */
#ifndef DDP_TEST_CONV_TEST_H
#define DDP_TEST_CONV_TEST_H

#include <stdint.h>

#include "device.h"

static const char *const mode_names[] = {"forward", "backward data", "backward filter"};

/* 0 x, 1 filters, 2 y: the tensor the mode writes */
static inline int written_by(const ddp_device_conv *c) {
    return c->mode == DDP_CONV_FORWARD ? 2 : c->mode == DDP_CONV_BACKWARD_DATA ? 0 : 1;
}

/* The next value in [-1, 1) of the sequence *state (the same for the same start). */
static inline double uniform_next(uint64_t *state) {
    *state = *state * 6364136223846793005u + 1442695040888963407u;
    return (double)(*state >> 11) / (double)(1ull << 52) - 1;
}

#endif
