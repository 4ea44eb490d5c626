/* forward.c: the generated CPU forward pass of cnn.ddp (model m) or attention.ddp
 * (model t), whichever this is linked with, against plain loops.
 *
 * The references below compute the same networks the textbook way, one output element
 * at a time, from the parameters the runtime initialised (found by name in the
 * program's parameter table). Every output must agree to 1e-5 relative, in f32, for
 * the baseline kernels and the AVX2 kernels alike. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

static const float *param(ddp_runtime *rt, const char *name) {
    const ddp_program *p = rt->program;
    for (int64_t i = 0; i < p->nparams; i++)
        if (strcmp(p->params[i].name, name) == 0)
            return (const float *)rt->region[p->params[i].region] + p->params[i].offset;
    fprintf(stderr, "forward: no parameter %s\n", name);
    exit(2);
}

/* NHWC convolution, HWIO weights; pad_* before (top, left) and after (bottom, right). */
static void conv(const float *x, int h, int w, int c, const float *wt, const float *b, int f, int kh, int kw,
                 int sh, int sw, int pt, int pl, int oh, int ow, float *y) {
    for (int i = 0; i < oh; i++)
        for (int j = 0; j < ow; j++)
            for (int o = 0; o < f; o++) {
                double acc = b[o];
                for (int u = 0; u < kh; u++)
                    for (int v = 0; v < kw; v++) {
                        int ih = i * sh - pt + u, iw = j * sw - pl + v;
                        if (ih < 0 || ih >= h || iw < 0 || iw >= w)
                            continue;
                        for (int ci = 0; ci < c; ci++)
                            acc += (double)x[(ih * w + iw) * c + ci] * wt[((u * kw + v) * c + ci) * f + o];
                    }
                y[(i * ow + j) * f + o] = (float)acc;
            }
}

/* max or average over the window's elements inside the image */
static void pool(const float *x, int h, int w, int c, int k, int s, int pt, int pl, int oh, int ow, bool max,
                 float *y) {
    for (int i = 0; i < oh; i++)
        for (int j = 0; j < ow; j++)
            for (int ci = 0; ci < c; ci++) {
                double acc = max ? -INFINITY : 0;
                int count = 0;
                for (int u = 0; u < k; u++)
                    for (int v = 0; v < k; v++) {
                        int ih = i * s - pt + u, iw = j * s - pl + v;
                        if (ih < 0 || ih >= h || iw < 0 || iw >= w)
                            continue;
                        double e = x[(ih * w + iw) * c + ci];
                        acc = max ? fmax(acc, e) : acc + e;
                        count++;
                    }
                y[(i * ow + j) * c + ci] = (float)(max ? acc : acc / count);
            }
}

/* Depthwise, stride 1, HWCM weights: output channel ch m + q sums channel ch's window
 * (dilation dh, dw; pt, pl padding before). */
static void depthwise(const float *x, int h, int w, int c, const float *wt, const float *b, int m, int kh, int kw,
                      int dh, int dw, int pt, int pl, float *y) {
    for (int i = 0; i < h; i++)
        for (int j = 0; j < w; j++)
            for (int ch = 0; ch < c; ch++)
                for (int q = 0; q < m; q++) {
                    double acc = b[ch * m + q];
                    for (int u = 0; u < kh; u++)
                        for (int v = 0; v < kw; v++) {
                            int ih = i - pt + u * dh, iw = j - pl + v * dw;
                            if (ih >= 0 && ih < h && iw >= 0 && iw < w)
                                acc += (double)x[(ih * w + iw) * c + ch] * wt[((u * kw + v) * c + ch) * m + q];
                        }
                    y[((i * w + j) * c + ch) * m + q] = (float)(acc > 0 ? acc : 0);
                }
}

/* Each pixel's channels less their mean, over sqrt(their biased variance + eps), then
 * scaled and shifted per channel (PyTorch's LayerNorm(c), Keras's LayerNormalization). */
static void layernorm(float *x, int pixels, int c, const float *scale, const float *shift, double eps) {
    for (int p = 0; p < pixels; p++, x += c) {
        double mean = 0, var = 0;
        for (int k = 0; k < c; k++)
            mean += x[k];
        mean /= c;
        for (int k = 0; k < c; k++)
            var += (x[k] - mean) * (x[k] - mean);
        var /= c;
        for (int k = 0; k < c; k++)
            x[k] = (float)((x[k] - mean) / sqrt(var + eps) * scale[k] + shift[k]);
    }
}

static void cnn(ddp_runtime *rt, const float *x, float *out) {
    float a[11 * 11 * 4], b[6 * 6 * 4], bd[6 * 6 * 8], c2[3 * 4 * 6], d[2 * 3 * 6];
    /* c1: 3x3 same: pad 1 each side */
    conv(x, 11, 11, 3, param(rt, "m.c1.weight"), param(rt, "m.c1.bias"), 4, 3, 3, 1, 1, 1, 1, 11, 11, a);
    for (int i = 0; i < 11 * 11 * 4; i++)
        a[i] = a[i] > 0 ? a[i] : 0;
    /* maxpool 2, stride 2, same on 11: out 6, padding 1 in all, none before */
    pool(a, 11, 11, 4, 2, 2, 0, 0, 6, 6, true, b);
    /* dw: 3x3, multiplier 2, dilation 1x2, same: spans 3 and 5, padding 1 and 2 before */
    depthwise(b, 6, 6, 4, param(rt, "m.dw.weight"), param(rt, "m.dw.bias"), 2, 3, 3, 1, 2, 1, 2, bd);
    /* c2: kernel 3x2, stride 2, padding 1: out (6 + 2 - 3) / 2 + 1 = 3, (6 + 2 - 2) / 2 + 1 = 4 */
    conv(bd, 6, 6, 8, param(rt, "m.c2.weight"), param(rt, "m.c2.bias"), 6, 3, 2, 2, 2, 1, 1, 3, 4, c2);
    for (int i = 0; i < 3 * 4 * 6; i++)
        c2[i] = tanhf(c2[i]);
    layernorm(c2, 3 * 4, 6, param(rt, "m.ln.weight"), param(rt, "m.ln.bias"), 0.01);
    /* avgpool 2 stride 1: 3x4 -> 2x3 */
    pool(c2, 3, 4, 6, 2, 1, 0, 0, 2, 3, false, d);
    const float *w = param(rt, "m.fc.weight"), *bias = param(rt, "m.fc.bias");
    for (int o = 0; o < 5; o++) {
        double acc = bias[o];
        for (int i = 0; i < 36; i++)
            acc += (double)d[i] * w[i * 5 + o];
        out[o] = (float)(1 / (1 + exp(-acc)));
    }
}

/* x [t, k] w [k, u] + b, each row apart */
static void dense(const float *x, int t, int k, const float *w, const float *b, int u, float *y) {
    for (int i = 0; i < t; i++)
        for (int o = 0; o < u; o++) {
            double acc = b ? b[o] : 0;
            for (int j = 0; j < k; j++)
                acc += (double)x[i * k + j] * w[j * u + o];
            y[i * u + o] = (float)acc;
        }
}

/* layer.part.what, as the program names its parameters */
static const float *part(ddp_runtime *rt, const char *layer, const char *part, const char *what) {
    char name[64];
    snprintf(name, sizeof name, "%s.%s.%s", layer, part, what);
    return param(rt, name);
}

/* Keras's MultiHeadAttention(num_heads = heads, key_dim = dk) on x [t, c] as query,
 * key and value: per head softmax(q k^T / sqrt(dk)) v, the heads side by side, then
 * the output projection; causal: query i sees keys 0..i (use_causal_mask). */
static void attention(ddp_runtime *rt, const char *layer, const float *x, int t, int c, int heads, int dk,
                      bool causal, float *y) {
    enum { MAX_T = 8, MAX_W = 16 };
    float q[MAX_T * MAX_W], k[MAX_T * MAX_W], v[MAX_T * MAX_W], o[MAX_T * MAX_W];
    int width = heads * dk;
    dense(x, t, c, part(rt, layer, "query", "weight"), part(rt, layer, "query", "bias"), width, q);
    dense(x, t, c, part(rt, layer, "key", "weight"), part(rt, layer, "key", "bias"), width, k);
    dense(x, t, c, part(rt, layer, "value", "weight"), part(rt, layer, "value", "bias"), width, v);
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < t; i++) {
            double score[MAX_T], max = -INFINITY, sum = 0;
            int keys = causal ? i + 1 : t;
            for (int j = 0; j < keys; j++) {
                double dot = 0;
                for (int d = 0; d < dk; d++)
                    dot += (double)q[i * width + h * dk + d] * k[j * width + h * dk + d];
                score[j] = dot / sqrt(dk);
                max = fmax(max, score[j]);
            }
            for (int j = 0; j < keys; j++)
                sum += score[j] = exp(score[j] - max);
            for (int d = 0; d < dk; d++) {
                double acc = 0;
                for (int j = 0; j < keys; j++)
                    acc += score[j] / sum * v[j * width + h * dk + d];
                o[i * width + h * dk + d] = (float)acc;
            }
        }
    dense(o, t, width, part(rt, layer, "output", "weight"), part(rt, layer, "output", "bias"), c, y);
}

static void transformer(ddp_runtime *rt, const float *x, float *out) {
    float a[6 * 5], b[6 * 8], c[6 * 8], d[6 * 8];
    const float *pos = param(rt, "t.pos.weight");
    for (int i = 0; i < 6 * 5; i++)
        a[i] = x[i] + pos[i];
    dense(a, 6, 5, param(rt, "t.proj.weight"), param(rt, "t.proj.bias"), 8, b);
    for (int i = 0; i < 6 * 8; i++)
        b[i] = tanhf(b[i]);
    attention(rt, "t.attn", b, 6, 8, 2, 3, false, d);
    attention(rt, "t.causal", d, 6, 8, 4, 2, true, c);
    layernorm(c, 6, 8, param(rt, "t.ln.weight"), param(rt, "t.ln.bias"), 0.01);
    float mean[8];
    for (int ch = 0; ch < 8; ch++) {
        double acc = 0;
        for (int i = 0; i < 6; i++)
            acc += c[i * 8 + ch];
        mean[ch] = (float)(acc / 6);
    }
    dense(mean, 1, 8, param(rt, "t.fc.weight"), param(rt, "t.fc.bias"), 4, out);
    for (int o = 0; o < 4; o++)
        out[o] = (float)(1 / (1 + exp(-(double)out[o])));
}

typedef struct Reference {
    const char *model, *output; /* the model's name and its output's buffer */
    int64_t inputs, outputs;    /* a sample's */
    void (*forward)(ddp_runtime *rt, const float *x, float *out);
} Reference;

static const Reference references[] = {
    {"m", "eval:m/fc", 11 * 11 * 3, 5, cnn},
    {"t", "eval:t/fc", 6 * 5, 4, transformer},
};

static int run(const Reference *r, bool baseline) {
    const ddp_program *p = &ddp_program_desc;
    ddp_options o = {.threads = 2, .baseline_cpu = baseline};
    char err[256];
    ddp_runtime *rt = ddp_open(p, &o, err, sizeof err);
    if (!rt) {
        fprintf(stderr, "forward: %s\n", err);
        return 2;
    }
    ddp_init_params(rt, 42);
    float *params = rt->region[DDP_REGION_PARAMS];
    for (int64_t i = 0; i < p->param_count; i++) /* biases away from zero */
        params[i] += 0.05f * (float)sin((double)i);
    int64_t batch = p->settings.batch_per_replica, per = r->inputs;
    float *x = ddp_buffer_ptr(rt, p->input_slot);
    for (int64_t i = 0; i < batch * per; i++)
        x[i] = (float)sin(0.37 * (double)i) * 2;
    ddp_set_batch(rt, batch, batch);
    ddp_run_phase(rt, DDP_PHASE_EVAL);
    const float *y = NULL;
    for (int64_t i = 0; i < p->nbuffers; i++)
        if (strcmp(p->buffers[i].name, r->output) == 0)
            y = ddp_buffer_ptr(rt, i);
    if (!y) {
        fprintf(stderr, "forward: the output buffer %s is not in the program\n", r->output);
        return 2;
    }
    double worst = 0;
    for (int64_t s = 0; s < batch; s++) {
        float ref[8];
        r->forward(rt, x + s * per, ref);
        for (int k = 0; k < r->outputs; k++) {
            double err = fabs((double)y[s * r->outputs + k] - ref[k]) / fmax(fabs(ref[k]), 1e-3);
            if (err > worst)
                worst = err;
        }
    }
    bool ok = worst <= 1e-5;
    printf("forward of %s (%s kernels): largest relative difference %.2e: %s\n", r->model,
           baseline ? "baseline" : "selected", worst, ok ? "ok" : "FAIL");
    ddp_close(rt);
    return ok ? 0 : 1;
}

int main(void) {
    for (size_t i = 0; i < sizeof references / sizeof references[0]; i++)
        if (strcmp(references[i].model, ddp_program_desc.name) == 0) {
            int a = run(&references[i], true), b = run(&references[i], false);
            return a > b ? a : b;
        }
    fprintf(stderr, "forward: no reference for model %s\n", ddp_program_desc.name);
    return 2;
}
