/* prefetch.c: how fast the loader reads a mapped dataset whose pages are not in the
 * page cache (a dataset larger than memory, or read for the first time from a parallel
 * file system), asking for the samples of the batches ahead (ddp_data_prefetch) or
 * faulting each page in as a batch touches it (the reference, what a dataset read ahead
 * whole at its opening would do once it no longer fits).
 *
 * bench_prefetch INPUTS.npy LABELS.npy [--batch N] [--passes P]
 *
 * Each pass drops the file's pages (unmapped from this process, then dropped from the
 * page cache) and reads every sample once in a shuffled order, in batches of --batch
 * (128) on one loader thread, as a training epoch does; the two ways alternate, --passes
 * (3) times each. It prints samples per second of each, the median over its passes,
 * and their ratio (above 1: asking ahead is faster). Each pass's last batch is checked
 * against ddp_data_batch's: asking ahead changes when the bytes come, never which. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "data_read.h"
#include "measure.h"
#include "runtime.h"

enum { MAX_PASSES = 50 };

/* The mapped file's pages out of this process and of the page cache. */
static void drop_pages(const ddp_data *d, int fd) {
    madvise(d->mapping, d->mapping_len, MADV_DONTNEED);
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
}

/* Samples per second of one pass over d in batches of `batch`, asking ahead or not;
 * -1 where its last batch is not ddp_data_batch's. */
static double pass_rate(ddp_data *d, const ddp_program *p, ddp_loader *l, int64_t batch, bool ask, int fd,
                        int64_t pass, int64_t *order, int64_t *starts, int64_t *sizes, float *x, void *y,
                        int64_t *ids, float *want) {
    int64_t n = d->samples, batches = (n + batch - 1) / batch;
    ddp_epoch_order(1, pass, true, n, order);
    for (int64_t b = 0; b < batches; b++)
        starts[b] = b * batch, sizes[b] = n - b * batch < batch ? n - b * batch : batch;
    d->read_ahead = !ask; /* as the file was opened: read ahead whole, so nothing asked for */
    drop_pages(d, fd);
    double t = now_seconds();
    ddp_loader_begin(l, order, starts, sizes, batches, NULL);
    while (ddp_loader_next(l, x, y, ids) > 0)
        continue;
    double rate = (double)n / (now_seconds() - t);
    ddp_data_batch(d, p, order + starts[batches - 1], sizes[batches - 1], NULL, want, y, ids);
    return memcmp(x, want, sizeof(float) * (size_t)(d->elems * sizes[batches - 1])) == 0 ? rate : -1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_prefetch INPUTS.npy LABELS.npy [--batch N] [--passes P]\n");
        return 2;
    }
    int64_t batch = 128;
    int passes = 3;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--batch") == 0)
            batch = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--passes") == 0)
            passes = atoi(argv[i + 1]);
    }
    if (batch < 1 || passes < 1 || passes > MAX_PASSES) {
        fprintf(stderr, "bench_prefetch: --batch must be positive, --passes from 1 to %d\n", MAX_PASSES);
        return 2;
    }
    ddp_dataset spec = {.name = "images", .kind = DDP_DATA_NPY, .path = {argv[1], argv[2]}, .scale = 1.0 / 255};
    ddp_data d;
    char err[1024];
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0 || !ddp_data_open(&spec, ".", &d, err, sizeof err)) {
        fprintf(stderr, "bench_prefetch: %s\n", fd < 0 ? "cannot open the inputs" : err);
        return 1;
    }
    if (!d.mapping || d.nshards || d.rank < 1 || d.rank > 3) {
        fprintf(stderr, "bench_prefetch: %s is not one mapped file of samples of 1 to 3 axes\n", argv[1]);
        return 1;
    }
    ddp_program p = {.name = "bench", .dtype = DDP_F32, .input_rank = d.rank, .input_slot = -1,
                     .label_dtype = DDP_I32, .label_positions = 1, .output_elems = 1 << 30};
    p.settings.loss = DDP_LOSS_SPARSE_CATEGORICAL;
    memcpy(p.input_shape, d.shape, sizeof(int64_t) * (size_t)d.rank);
    int64_t n = d.samples, batches = (n + batch - 1) / batch;
    int64_t *order = malloc(sizeof(int64_t) * (size_t)n), *starts = malloc(sizeof(int64_t) * (size_t)batches);
    int64_t *sizes = malloc(sizeof(int64_t) * (size_t)batches), *ids = malloc(sizeof(int64_t) * (size_t)batch);
    float *x = malloc(sizeof(float) * (size_t)(d.elems * batch)), *want = malloc(sizeof(float) * (size_t)(d.elems * batch));
    void *y = malloc(sizeof(int32_t) * (size_t)batch);
    ddp_loader *l = ddp_loader_new(&d, &p, batch, 1);
    if (!order || !starts || !sizes || !ids || !x || !want || !y || !l) {
        fprintf(stderr, "bench_prefetch: out of memory\n");
        return 1;
    }
    printf("%lld samples of %lld bytes (%.0f MiB), batches of %lld, one loader thread, pages dropped each pass\n",
           (long long)n, (long long)(d.elems * data_elem_size[d.elem]),
           (double)n * (double)(d.elems * data_elem_size[d.elem]) / (1 << 20), (long long)batch);
    double asked[MAX_PASSES], faulted[MAX_PASSES];
    for (int i = 0; i < passes; i++) {
        faulted[i] = pass_rate(&d, &p, l, batch, false, fd, 2 * i, order, starts, sizes, x, y, ids, want);
        asked[i] = pass_rate(&d, &p, l, batch, true, fd, 2 * i + 1, order, starts, sizes, x, y, ids, want);
        if (faulted[i] < 0 || asked[i] < 0) {
            fprintf(stderr, "bench_prefetch: the loader's last batch of a pass is not ddp_data_batch's\n");
            return 1;
        }
    }
    double a = median(asked, passes), f = median(faulted, passes);
    printf("%-40s %12s\n%-40s %12.0f\n%-40s %12.0f\nratio %.2f\n", "way", "samples/s", "faulted in (reference)", f,
           "asked for, batches ahead", a, a / f);
    ddp_loader_free(l);
    free(order), free(starts), free(sizes), free(ids), free(x), free(want), free(y);
    ddp_data_free(&d);
    close(fd);
    return 0;
}
