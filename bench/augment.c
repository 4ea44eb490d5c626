/* augment.c: how fast the loader assembles training batches from an image dataset,
 * as it is and with each of a dataset's preprocessing steps, in one thread; then the
 * loader itself (its threads, and the copy of each batch out) with 1 .. --threads.
 *
 * bench_augment INPUTS.npy LABELS.npy [--batch N] [--seconds S] [--threads T]
 *
 * INPUTS holds images [N, h, w, c] (any dtype the npy reader takes; CIFAR-10's uint8
 * [N, 32, 32, 3] in bench/augment.sh). For each variant (scaled only; normalised; scaled,
 * cropped with padding 4 and flipped; all three; a random resized crop to 7/8 of the
 * sides, flipped and normalised; normalised, cropped, flipped, then mixed by mixup or
 * cutmix, with one-hot labels of 10 classes; normalised, cropped, flipped and
 * coloured, random_color(0.4, 0.4, 0.4, 0.1), or trivial_augment(interpolation =
 * bilinear), RGB images alone) it assembles f32 batches of --batch
 * (128) samples drawn at random, as ddp_data_batch does for a training step, for
 * about --seconds (1) after one warm-up batch, and prints samples per second, the
 * median over the batches. Each variant's batch is also checked: normalised values
 * must be ((x / 255) - mean) / std of some value x of the file or of the padding (x in
 * [0, 255], not whole, where resized, mixed or coloured). The
 * loader's passes (all four steps, the samples shuffled, each pass's batches as a
 * training epoch has them) print samples per second, the median over the passes, and
 * the ratio to one thread; each pass's last batch is checked against ddp_data_batch. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "measure.h"
#include "runtime.h"

enum { MAX_BATCHES = 100000 };

static const ddp_channel cifar_channels[] = {{0.4914, 0.2470}, {0.4822, 0.2435}, {0.4465, 0.2616}};
static const ddp_augment crop_and_flip[] = {{.kind = DDP_AUGMENT_CROP, .padding = 4},
                                            {.kind = DDP_AUGMENT_FLIP, .mode = DDP_FLIP_HORIZONTAL},
                                            {.kind = DDP_AUGMENT_MIXUP, .alpha = 0.2},
                                            {.kind = DDP_AUGMENT_CUTMIX, .alpha = 1}};
static const ddp_augment crop_flip_color[] = {{.kind = DDP_AUGMENT_CROP, .padding = 4},
                                              {.kind = DDP_AUGMENT_FLIP, .mode = DDP_FLIP_HORIZONTAL},
                                              {.kind = DDP_AUGMENT_COLOR, .brightness = 0.4, .contrast = 0.4,
                                               .saturation = 0.4, .hue = 0.1}};
static const ddp_augment crop_flip_trivial[] = {{.kind = DDP_AUGMENT_CROP, .padding = 4},
                                                {.kind = DDP_AUGMENT_FLIP, .mode = DDP_FLIP_HORIZONTAL},
                                                {.kind = DDP_AUGMENT_TRIVIAL, .size = 31,
                                                 .mode = DDP_INTERPOLATION_BILINEAR}};

/* Whether every value of the batch is an 8-bit value (or zero) scaled and normalised;
 * resized or mixed values (between) lie between them. */
static bool values_plausible(const float *x, int64_t n, int64_t channels, const ddp_dataset *spec, bool between) {
    for (int64_t e = 0; e < n; e++) {
        double v = x[e];
        if (spec->nnormalize) {
            const ddp_channel *c = &spec->normalize[e % channels % spec->nnormalize];
            v = v * c->std + c->mean;
        }
        double byte = v * 255;
        if (!(byte > -0.01 && byte < 255.01) || (!between && fabs(byte - round(byte)) > 1e-3))
            return false;
    }
    return true;
}

/* Samples per second of the loader on t threads, passes over d in batches of `batch`
 * (the median pass, after one warm-up), the last batch of each compared with
 * ddp_data_batch's; -1 where they differ or the loader cannot start. */
static double loader_rate(const ddp_data *d, const ddp_program *p, int64_t batch, int threads, double seconds,
                          float *x, void *y, int64_t *ids, float *want) {
    int64_t n = d->samples, batches = n / batch, per = d->shape[0] * d->shape[1] * d->shape[2];
    int64_t *order = malloc(sizeof(int64_t) * (size_t)n), *starts = malloc(sizeof(int64_t) * (size_t)batches);
    int64_t *sizes = malloc(sizeof(int64_t) * (size_t)batches);
    double *took = malloc(sizeof(double) * MAX_BATCHES);
    ddp_loader *l = ddp_loader_new(d, p, batch, threads);
    double rate = -1;
    if (!order || !starts || !sizes || !took || !l || batches < 1)
        goto done;
    for (int64_t b = 0; b < batches; b++)
        starts[b] = b * batch, sizes[b] = batch;
    int passes = 0;
    bool same = true;
    for (double start = now_seconds(); passes < MAX_BATCHES && (passes < MIN_REPS + 1 || now_seconds() - start < seconds);
         passes++) {
        ddp_draw_key key = {1, passes};
        ddp_epoch_order(1, passes, true, n, order);
        double t = now_seconds();
        ddp_loader_begin(l, order, starts, sizes, batches, &key);
        while (ddp_loader_next(l, x, y, ids) > 0)
            continue;
        took[passes] = now_seconds() - t;
        ddp_data_batch(d, p, order + starts[batches - 1], batch, &key, want, y, ids);
        same &= memcmp(x, want, sizeof(float) * (size_t)(per * batch)) == 0;
    }
    rate = same ? (double)(batches * batch) / median(took + 1, passes - 1) : -1;
done:
    ddp_loader_free(l);
    free(order), free(starts), free(sizes), free(took);
    return rate;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_augment INPUTS.npy LABELS.npy [--batch N] [--seconds S]\n");
        return 2;
    }
    int64_t batch = 128;
    double seconds = 1;
    int threads = 1;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--batch") == 0)
            batch = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--seconds") == 0)
            seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[i + 1]);
    }
    if (batch < 1 || threads < 1) {
        fprintf(stderr, "bench_augment: --batch and --threads must be positive\n");
        return 2;
    }
    ddp_dataset spec = {.name = "images", .kind = DDP_DATA_NPY, .path = {argv[1], argv[2]}, .scale = 1.0 / 255};
    ddp_data d;
    char err[1024];
    if (!ddp_data_open(&spec, ".", &d, err, sizeof err)) {
        fprintf(stderr, "bench_augment: %s\n", err);
        return 1;
    }
    if (d.rank != 3 || d.samples < 1) {
        fprintf(stderr, "bench_augment: %s holds no images [N, h, w, c]\n", argv[1]);
        return 1;
    }
    ddp_program p = {.name = "bench", .dtype = DDP_F32, .input_rank = 3, .input_slot = -1,
                     .label_dtype = DDP_I32, .label_positions = 1, .output_elems = 1 << 30};
    p.settings.loss = DDP_LOSS_SPARSE_CATEGORICAL;
    memcpy(p.input_shape, d.shape, sizeof(int64_t) * 3);
    int64_t per = d.shape[0] * d.shape[1] * d.shape[2];
    float *x = malloc(sizeof(float) * (size_t)(per * batch)), *want = malloc(sizeof(float) * (size_t)(per * batch));
    float *y = malloc(sizeof(float) * 10 * (size_t)batch); /* class indices, or one-hot rows of 10 */
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)batch), *ids = malloc(sizeof(int64_t) * (size_t)batch);
    double *took = malloc(sizeof(double) * MAX_BATCHES);
    if (!x || !want || !y || !rows || !ids || !took) {
        fprintf(stderr, "bench_augment: out of memory\n");
        return 1;
    }
    bool cifar = d.shape[2] == 3;
    printf("%lld samples of [%lld, %lld, %lld], batches of %lld, one thread\n", (long long)d.samples,
           (long long)d.shape[0], (long long)d.shape[1], (long long)d.shape[2], (long long)batch);
    printf("%-36s %14s\n", "variant", "samples/s");
    static const char *const names[] = {"scaled", "scaled, normalised", "scaled, cropped and flipped",
                                        "scaled, normalised, cropped, flipped", "resized crop, flipped, normalised",
                                        "normalised, cropped, flipped, mixed", "normalised, cropped, flipped, coloured",
                                        "normalised, cropped, flipped, trivial"};
    int64_t side_h = d.shape[0] * 7 / 8, side_w = d.shape[1] * 7 / 8;
    ddp_augment resized_and_flip[] = {{.kind = DDP_AUGMENT_RESIZED_CROP, .height = side_h ? side_h : 1,
                                       .width = side_w ? side_w : 1, .scale_min = 0.08, .scale_max = 1,
                                       .ratio_min = 3.0 / 4, .ratio_max = 4.0 / 3},
                                      {.kind = DDP_AUGMENT_FLIP, .mode = DDP_FLIP_HORIZONTAL}};
    int status = 0;
    srand(1);
    for (int v = 0; v < (cifar ? 8 : 6); v++) {
        bool resized = v == 4, mixed = v == 5, colored = v == 6, trivial = v == 7;
        spec.normalize = (v & 1 || v >= 4) && cifar ? cifar_channels : NULL;
        spec.nnormalize = (v & 1 || v >= 4) && cifar ? 3 : 0;
        spec.augment = resized ? resized_and_flip : colored ? crop_flip_color : trivial ? crop_flip_trivial
                       : v & 2 || mixed ? crop_and_flip : NULL;
        spec.naugment = mixed ? 4 : colored || trivial ? 3 : v & 2 || resized ? 2 : 0;
        p.settings.loss = mixed ? DDP_LOSS_CATEGORICAL : DDP_LOSS_SPARSE_CATEGORICAL;
        p.label_dtype = mixed ? DDP_F32 : DDP_I32;
        p.output_elems = mixed ? 10 : 1 << 30;
        p.input_shape[0] = resized ? resized_and_flip[0].height : d.shape[0];
        p.input_shape[1] = resized ? resized_and_flip[0].width : d.shape[1];
        int64_t per_row = p.input_shape[0] * p.input_shape[1] * d.shape[2];
        ddp_draw_key key = {1, 0};
        int n = 0;
        for (double start = now_seconds(); n < MAX_BATCHES && (n < MIN_REPS + 1 || now_seconds() - start < seconds); n++) {
            for (int64_t r = 0; r < batch; r++)
                rows[r] = rand() % d.samples;
            double t = now_seconds();
            ddp_data_batch(&d, &p, rows, batch, &key, x, y, ids);
            took[n] = now_seconds() - t;
            key.epoch++;
        }
        if (!values_plausible(x, per_row * batch, d.shape[2], &spec, v >= 4)) {
            fprintf(stderr, "bench_augment: %s: a value of the last batch is no scaled byte\n", names[v]);
            status = 1;
        }
        printf("%-36s %14.0f\n", names[v], (double)batch / median(took + 1, n - 1));
    }
    memcpy(p.input_shape, d.shape, sizeof(int64_t) * 3);
    spec.normalize = cifar ? cifar_channels : NULL;
    spec.nnormalize = cifar ? 3 : 0;
    spec.augment = crop_and_flip;
    spec.naugment = 2;
    p.settings.loss = DDP_LOSS_SPARSE_CATEGORICAL;
    p.label_dtype = DDP_I32;
    p.output_elems = 1 << 30;
    printf("\nthe loader, all four steps, passes of %lld batches\n%-8s %14s %8s\n", (long long)(d.samples / batch),
           "threads", "samples/s", "ratio");
    double one = 0;
    for (int t = 1; t <= threads; t++) {
        double rate = loader_rate(&d, &p, batch, t, seconds, x, y, ids, want);
        if (rate < 0) {
            fprintf(stderr, "bench_augment: the loader on %d threads made other batches than ddp_data_batch\n", t);
            status = 1;
            break;
        }
        one = t == 1 ? rate : one;
        printf("%-8d %14.0f %8.2f\n", t, rate, rate / one);
    }
    free(x), free(want), free(y), free(rows), free(ids), free(took);
    ddp_data_free(&d);
    return status;
}
