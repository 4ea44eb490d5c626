/* test_device.h: the device a GPU test names on its command line: `emulated`, or
 * `gpu` (the first CUDA device this process sees). */
#ifndef DDP_TEST_DEVICE_H
#define DDP_TEST_DEVICE_H

#include <stdio.h>
#include <string.h>

#include "device.h"

/* The device, or NULL with why there is none (a test then skips `gpu`, fails
 * `emulated`). */
static ddp_device *open_test_device(const ddp_program *p, const char *kind, char *why, size_t len) {
    ddp_device *d = NULL;
    if (strcmp(kind, "emulated") == 0)
        return ddp_device_open_emulated(p, &d, why, len) ? d : NULL;
    int count = ddp_cuda_device_count(why, len);
    if (count <= 0) {
        if (count == 0)
            snprintf(why, len, "the CUDA driver sees no GPU");
        return NULL;
    }
    return ddp_device_open_cuda(p, 0, &d, why, len) ? d : NULL;
}

#endif
