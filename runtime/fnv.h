/* fnv.h: FNV-1a, the one 64-bit hash of the project: the compiler's maps and program
 * hash, the runtime's parameter keys and checks, the tests' comparisons. */
#ifndef DDP_FNV_H
#define DDP_FNV_H

#include <stddef.h>
#include <stdint.h>

#define DDP_FNV_START 1469598103934665603ull

/* FNV-1a over len bytes, continuing from h (DDP_FNV_START for a fresh hash). */
static inline uint64_t ddp_fnv1a(const void *data, size_t len, uint64_t h) {
    for (const unsigned char *c = data; len--; c++)
        h = (h ^ *c) * 1099511628211ull;
    return h;
}

#endif
