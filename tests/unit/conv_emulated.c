/* conv_emulated.c: the emulated device's conv op (device_emulated.c), the device opened
 * on a program of no kernels. For several shapes, the three modes, beta 0 and 1, f32,
 * f64 and TF32 factors: the result computed on the device and copied back is
 * ddp_conv_reference's on host copies, bit for bit (with TF32 factors, bits other than
 * f32's: the flag reaches the device), and reads as NaN (0xff bytes) until the
 * synchronisation. The refusals cuDNN makes when called (an output of the wrong
 * size, beta 2, a tensor past its allocation or on the host, a workspace outside device
 * memory), each with its message, queue nothing. A convolution queued while its stream
 * is captured does not run until the graph is launched, and runs again at each launch. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "conv_test.h"
#include "conv.h"
#include "device.h"

/* The emulated device runs a program's GPU module only when the module's hash is the
 * program's: this test's program has no kernels, and the module is this file. */
enum { MODULE_HASH = 0x636f6e76 };
const uint64_t ddp_gpu_module_hash = MODULE_HASH;
static const ddp_kernel_fn no_kernels[1];
static const ddp_program program = {.gpu_emulated = no_kernels, .gpu_hash = MODULE_HASH};

static ddp_device *dev;

/* A convolution's shape, its output size worked out by hand (the device checks it). */
typedef struct Shape {
    const char *name;
    int n, h, w, c, k, r, s, oh, ow, stride, dilation, pad_before[2], pad_after[2];
    bool f64, tf32;
} Shape;

static const Shape shapes[] = {
    {"3x3 stride 1 same", 2, 5, 6, 3, 4, 3, 3, 5, 6, 1, 1, {1, 1}, {1, 1}, false, false},
    {"3x3 stride 2 asymmetric padding", 1, 6, 7, 2, 3, 3, 3, 3, 3, 2, 1, {0, 1}, {1, 0}, false, false},
    {"3x3 dilation 2", 1, 7, 7, 3, 2, 3, 3, 7, 7, 1, 2, {2, 2}, {2, 2}, false, false},
    {"1x1 stride 2, TF32 factors", 2, 5, 5, 4, 3, 1, 1, 3, 3, 2, 1, {0, 0}, {0, 0}, false, true},
    {"3x3 stride 1 same, f64", 2, 5, 6, 3, 4, 3, 3, 5, 6, 1, 1, {1, 1}, {1, 1}, true, false},
};

static ddp_device_conv make_conv(const Shape *sh, int mode, double beta) {
    return (ddp_device_conv){.mode = mode, .n = sh->n, .h = sh->h, .w = sh->w, .c = sh->c, .k = sh->k, .r = sh->r,
                             .s = sh->s, .oh = sh->oh, .ow = sh->ow, .stride = {sh->stride, sh->stride},
                             .dilation = {sh->dilation, sh->dilation},
                             .pad_before = {sh->pad_before[0], sh->pad_before[1]},
                             .pad_after = {sh->pad_after[0], sh->pad_after[1]}, .beta = beta, .f64 = sh->f64,
                             .tf32 = sh->tf32};
}

/* ------------------------------------------------------------------- tensors */

/* The three tensors (x, filters, y) on the host and on the device. */
typedef struct Tensors {
    void *host[3];
    ddp_dptr device[3];
    size_t bytes[3];
} Tensors;

static uint64_t seed = 0x9e3779b97f4a7c15u; /* the values of every run the same */

/* Random host tensors for c (the written one too, for beta 1 to add to), and device
 * memory for each, allocated in order so that the output comes last. */
static Tensors make_tensors(const ddp_device_conv *c) {
    size_t counts[3] = {(size_t)c->n * c->h * c->w * c->c, (size_t)c->k * c->r * c->s * c->c,
                        (size_t)c->n * c->oh * c->ow * c->k};
    Tensors t = {0};
    for (int which = 0; which < 3; which++) {
        t.bytes[which] = counts[which] * (c->f64 ? 8 : 4);
        t.host[which] = malloc(t.bytes[which]);
        for (size_t i = 0; i < counts[which]; i++) {
            double v = uniform_next(&seed);
            if (c->f64)
                ((double *)t.host[which])[i] = v;
            else
                ((float *)t.host[which])[i] = (float)v;
        }
        CHECK(dev->ops->alloc(dev, t.bytes[which], &t.device[which]));
    }
    return t;
}

static void free_tensors(Tensors *t) {
    for (int which = 0; which < 3; which++)
        free(t->host[which]);
}

static void point_at(ddp_device_conv *c, const Tensors *t) {
    c->x = t->device[0], c->filters = t->device[1], c->y = t->device[2];
}

static bool upload_all(const Tensors *t) {
    bool ok = true;
    for (int which = 0; which < 3; which++)
        ok = ok && dev->ops->upload(dev, DDP_STREAM_COMPUTE, t->device[which], t->host[which], t->bytes[which]);
    return ok;
}

static bool all_bytes(const void *p, size_t bytes, unsigned char byte) {
    for (size_t i = 0; i < bytes; i++)
        if (((const unsigned char *)p)[i] != byte)
            return false;
    return true;
}

/* The written tensor copied back: NaN until the synchronisation, then the device's. */
static bool download_written(const Tensors *t, int written, void *to) {
    bool ok = dev->ops->download(dev, DDP_STREAM_COMPUTE, to, t->device[written], t->bytes[written]);
    CHECK(ok && all_bytes(to, t->bytes[written], 0xff));
    return ok && dev->ops->synchronize(dev);
}

/* --------------------------------------------------------------- the results */

/* Whether the device's result differs from the reference's with f32 factors: the
 * descriptor's TF32 flag reached the device's convolution. */
static bool differs_without_tf32(const ddp_device_conv *c, const Tensors *t, const void *got) {
    ddp_device_conv plain = *c;
    int written = written_by(c);
    void *tensors[3] = {t->host[0], t->host[1], t->host[2]};
    tensors[written] = malloc(t->bytes[written]);
    memcpy(tensors[written], t->host[written], t->bytes[written]);
    plain.tf32 = false;
    ddp_conv_reference(&plain, tensors[0], tensors[1], tensors[2]);
    bool differs = memcmp(got, tensors[written], t->bytes[written]) != 0;
    free(tensors[written]);
    return differs;
}

static void check_mode(const Shape *sh, int mode, double beta) {
    ddp_device_conv c = make_conv(sh, mode, beta);
    Tensors t = make_tensors(&c);
    int written = written_by(&c);
    void *got = malloc(t.bytes[written]);
    point_at(&c, &t);
    bool ok = upload_all(&t) && dev->ops->conv(dev, DDP_STREAM_COMPUTE, &c) && download_written(&t, written, got);
    if (!ok)
        fprintf(stderr, "%s, %s, beta %g: %s\n", sh->name, mode_names[mode], beta, dev->error);
    if (c.tf32)
        CHECK(differs_without_tf32(&c, &t, got));
    ddp_conv_reference(&c, t.host[0], t.host[1], t.host[2]);
    bool same = ok && memcmp(got, t.host[written], t.bytes[written]) == 0;
    CHECK(same);
    printf("%s %s, %s, beta %g\n", same ? "ok  " : "FAIL", sh->name, mode_names[mode], beta);
    free(got);
    free_tensors(&t);
}

/* Captured, the convolution (beta 1, adding to an output of zeros) waits for the
 * graph; each launch adds it once more, as the reference run as often. */
static void check_capture(void) {
    ddp_device_conv c = make_conv(&shapes[0], DDP_CONV_FORWARD, 1);
    Tensors t = make_tensors(&c);
    void *got = malloc(t.bytes[2]);
    point_at(&c, &t);
    memset(t.host[2], 0, t.bytes[2]);
    bool ok = upload_all(&t) && dev->ops->synchronize(dev) && dev->ops->capture_begin(dev, DDP_STREAM_COMPUTE) &&
              dev->ops->conv(dev, DDP_STREAM_COMPUTE, &c) && dev->ops->capture_end(dev, DDP_STREAM_COMPUTE, 0) &&
              download_written(&t, 2, got);
    CHECK(ok && all_bytes(got, t.bytes[2], 0));
    for (int launch = 0; ok && launch < 2; launch++) {
        ok = dev->ops->graph_launch(dev, DDP_STREAM_COMPUTE, 0) && download_written(&t, 2, got);
        ddp_conv_reference(&c, t.host[0], t.host[1], t.host[2]);
        CHECK(ok && memcmp(got, t.host[2], t.bytes[2]) == 0);
    }
    if (!ok)
        fprintf(stderr, "the captured convolution: %s\n", dev->error);
    printf("%s a captured convolution runs at each launch of its graph, and only then\n", ok ? "ok  " : "FAIL");
    free(got);
    free_tensors(&t);
}

/* ---------------------------------------------------------------- refusals */

static void expect_refused(const char *what, const ddp_device_conv *c, const char *text) {
    bool refused = !dev->ops->conv(dev, DDP_STREAM_COMPUTE, c);
    bool said = refused && strstr(dev->error, "CUDNN_STATUS_BAD_PARAM") && strstr(dev->error, text);
    if (!said)
        fprintf(stderr, "%s: want a refusal saying \"%s\", got %s\n", what, text, refused ? dev->error : "none");
    CHECK(said);
    printf("%s %s: %s\n", said ? "ok  " : "FAIL", what, refused ? dev->error : "not refused");
}

/* Each refusal queues nothing: the output, filled before, is unchanged after. */
static void check_refusals(void) {
    ddp_device_conv c = make_conv(&shapes[0], DDP_CONV_FORWARD, 0), bad;
    Tensors t = make_tensors(&c);
    ddp_dptr short_output;
    float host_workspace[16];
    void *got = malloc(t.bytes[2]);
    point_at(&c, &t);
    CHECK(upload_all(&t) && dev->ops->fill(dev, DDP_STREAM_COMPUTE, t.device[2], 0x7f, t.bytes[2]));
    bad = c, bad.oh += 1;
    expect_refused("an output one row taller than the shape gives", &bad, "the output 6x6 does not follow");
    bad = c, bad.beta = 2;
    expect_refused("beta 2", &bad, "beta 2");
    bad = c, bad.pad_before[1] = -1, bad.pad_after[1] = 3;
    expect_refused("negative padding", &bad, "padding 1+1, -1+3");
    CHECK(dev->ops->alloc(dev, t.bytes[2] - 4, &short_output)); /* the last allocation: nothing after it */
    bad = c, bad.y = short_output;
    expect_refused("an output past its allocation", &bad, "its output: 960 bytes at");
    bad = c, bad.x = (ddp_dptr)(uintptr_t)t.host[0];
    expect_refused("an image in host memory", &bad, "its image");
    bad = c, bad.workspace = (ddp_dptr)(uintptr_t)host_workspace, bad.workspace_bytes = sizeof host_workspace;
    expect_refused("a workspace in host memory", &bad, "its workspace: 64 bytes at");
    CHECK(download_written(&t, 2, got) && all_bytes(got, t.bytes[2], 0x7f));
    free(got);
    free_tensors(&t);
}

int main(void) {
    char err[1024];
    if (!ddp_device_open_emulated(&program, &dev, err, sizeof err)) {
        fprintf(stderr, "the emulated device does not open: %s\n", err);
        return 1;
    }
    CHECK(dev->ops->conv != NULL);
    CHECK(strstr(dev->convolutions, "reference convolution") != NULL);
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int mode = 0; mode < 3; mode++)
            for (int beta = 0; beta < 2; beta++)
                check_mode(&shapes[i], mode, beta);
    check_capture();
    check_refusals();
    ddp_device_close(dev);
    if (failures)
        fprintf(stderr, "%d checks failed\n", failures);
    return failures ? 1 : 0;
}
