/* train_dump.c: trains the linked model a few steps on fixed data and writes its
 * parameters, statistics, accumulators and the last evaluation's outputs to a file,
 * for comparisons of builds.
 *
 *   train_dump OUT [--poison] [--steps N] [--partial] [--emulated]
 *
 * --poison fills planned memory with NaN outside each value's life; --partial makes
 * the last batch smaller than the planned one; --emulated runs on the emulated GPU,
 * each batch going up as the runtime sends it, while the step before runs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "runtime.h"

static void check(bool ok, ddp_runtime *rt, const char *doing) {
    if (ok)
        return;
    fprintf(stderr, "train_dump: %s: %s\n", doing, rt->device_error);
    exit(2);
}

int main(int argc, char **argv) {
    const ddp_program *p = &ddp_program_desc;
    if (argc < 2) {
        fprintf(stderr, "usage: train_dump OUT [--poison] [--steps N] [--partial]\n");
        return 2;
    }
    ddp_options o = {.threads = 2};
    int steps = 4;
    bool partial = false, emulated = false;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--poison") == 0)
            o.poison = true;
        else if (strcmp(argv[i], "--partial") == 0)
            partial = true;
        else if (strcmp(argv[i], "--emulated") == 0)
            emulated = true;
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = atoi(argv[++i]);
    }
    char err[256];
    ddp_runtime *rt = ddp_open(p, &o, err, sizeof err);
    if (!rt) {
        fprintf(stderr, "train_dump: %s\n", err);
        return 2;
    }
    ddp_device *dev = NULL;
    if (emulated && (!ddp_device_open_emulated(p, &dev, err, sizeof err) || !ddp_gpu_attach(rt, dev, err, sizeof err))) {
        fprintf(stderr, "train_dump: %s\n", err);
        return 2;
    }
    ddp_init_params(rt, (uint64_t)p->settings.seed);
    check(ddp_to_device(rt, DDP_REGION_PARAMS) && ddp_to_device(rt, DDP_REGION_STATS), rt, "copying to the device");
    int64_t batch = p->settings.batch_per_replica, per = 1;
    for (int d = 0; d < p->input_rank; d++)
        per *= p->input_shape[d];
    ddp_zero_accumulators(rt);
    for (int s = 0; s < steps; s++) {
        int64_t n = partial && s == steps - 1 ? batch / 2 + 1 : batch;
        check(ddp_batch_writable(rt), rt, "waiting for the last batch's upload");
        for (int64_t i = 0; i < n * per; i++) {
            double v = sin(0.1 * (double)(i + s * 977)) * 1.5;
            if (p->dtype == DDP_F64)
                ((double *)ddp_buffer_ptr(rt, p->input_slot))[i] = v;
            else
                ((float *)ddp_buffer_ptr(rt, p->input_slot))[i] = (float)v;
        }
        for (int64_t r = 0; r < n; r++) {
            ((int32_t *)ddp_buffer_ptr(rt, p->label_slot))[r] = (int32_t)((r * 7 + s) % p->output_elems);
            ((int64_t *)ddp_buffer_ptr(rt, p->sample_id_slot))[r] = s * batch + r;
        }
        ddp_set_batch(rt, n, n);
        check(ddp_batch_uploaded(rt), rt, "uploading a batch");
        ddp_prepare_step(rt, s, steps);
        check(ddp_train_step(rt) && ddp_run_phase(rt, DDP_PHASE_EVAL), rt, "running a step");
    }
    FILE *f = fopen(argv[1], "wb");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    int regions[] = {DDP_REGION_PARAMS, DDP_REGION_STATS, DDP_REGION_STATE, DDP_REGION_ACCUM};
    for (int i = 0; i < 4; i++) {
        check(ddp_to_host(rt, regions[i]), rt, "copying from the device");
        fwrite(rt->region[regions[i]], 1, (size_t)p->region_bytes[regions[i]], f);
    }
    int64_t rows = partial ? batch / 2 + 1 : batch, bytes = rows * p->output_elems * 8;
    void *outputs = malloc((size_t)bytes); /* room for any dtype */
    check(outputs && ddp_eval_outputs(rt, rows, outputs), rt, "copying the evaluation's outputs");
    fwrite(outputs, 1, (size_t)(rows * p->output_elems * ddp_dtype_size(p->buffers[p->eval_output_slot].dtype)), f);
    free(outputs);
    fclose(f);
    double n, loss = ddp_accumulator(rt, 0, &n);
    printf("train_dump: %d steps, mean loss %.6f, %s\n", steps, loss / n, o.poison ? "poisoned" : "plain");
    ddp_close(rt);
    return isfinite(loss) ? 0 : 1;
}
