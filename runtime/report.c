/* report.c: what a run tells its user, from worker 0 only: the banner of settings in
 * effect, progress (a bar on a terminal, a plain line every N steps in a log file, so
 * logs hold no carriage returns), a line per epoch, the summary, and one JSON object
 * per epoch in the run folder's metrics.jsonl (and the --metrics file). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "device.h"
#include "runtime.h"

struct ddp_report {
    const ddp_config *cfg;
    const ddp_program *program;
    bool quiet;                 /* a worker other than 0 */
    FILE *metrics;              /* --metrics */
    FILE *run_metrics;          /* the run folder's metrics.jsonl */
    ddp_events *events;         /* the run folder's TensorBoard events */
    bool bar_open;              /* a progress bar is on the current line */
    double last_bar;            /* when the bar was last drawn */
};

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

ddp_report *ddp_report_open(const ddp_config *cfg, const ddp_program *p, bool quiet, char *err, size_t errlen) {
    ddp_report *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->cfg = cfg;
    r->program = p;
    r->quiet = quiet;
    /* the files written at the end, tried now: a bad path costs no training */
    const char *at_end[][2] = {{"--save", cfg->save_path},
                               {"--trace", cfg->trace_path},
                               {"--predict", cfg->predict_path},
                               {"--metrics", cfg->check ? cfg->metrics_path : NULL}}; /* else opened below */
    for (size_t i = 0; i < sizeof at_end / sizeof *at_end && !quiet; i++) {
        char why[1024];
        if (at_end[i][1] && !ddp_replace_possible(at_end[i][1], why, sizeof why)) {
            snprintf(err, errlen, "%s %s (checked before the run, which would write it at its end)", at_end[i][0],
                     why);
            free(r);
            return NULL;
        }
    }
    if (cfg->metrics_path && !quiet && !cfg->check) {
        r->metrics = fopen(cfg->metrics_path, "w");
        if (!r->metrics) {
            snprintf(err, errlen, "%s: cannot write the metrics file: %s", cfg->metrics_path, strerror(errno));
            free(r);
            return NULL;
        }
    }
    return r;
}

void ddp_report_close(ddp_report *r) {
    if (!r)
        return;
    if (r->metrics)
        fclose(r->metrics);
    if (r->run_metrics)
        fclose(r->run_metrics);
    ddp_events_close(r->events);
    free(r);
}

void ddp_report_interrupt(ddp_report *r) {
    if (r && r->bar_open) {
        fputc('\n', stdout);
        fflush(stdout);
        r->bar_open = false;
    }
}

/* ------------------------------------------------------------- formatting */

/* 60000 as "60,000", in one of a few rotating buffers so a line may use several. */
static const char *grouped(int64_t v) {
    static char bufs[4][32];
    static int next;
    char *out = bufs[next++ % 4], digits[32];
    int n = snprintf(digits, sizeof digits, "%lld", (long long)(v < 0 ? -v : v)), k = 0;
    if (v < 0)
        out[k++] = '-';
    for (int i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0)
            out[k++] = ',';
        out[k++] = digits[i];
    }
    out[k] = 0;
    return out;
}

/* "1 step", "937 steps" */
static const char *counted(int64_t n, const char *word) {
    static char bufs[4][64];
    static int next;
    char *out = bufs[next++ % 4];
    snprintf(out, sizeof bufs[0], "%s %s%s", grouped(n), word, n == 1 ? "" : "s");
    return out;
}

static const char *duration_text(double s) {
    static char buf[32];
    if (s < 60)
        snprintf(buf, sizeof buf, "%.1f s", s);
    else if (s < 3600)
        snprintf(buf, sizeof buf, "%dm %02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(buf, sizeof buf, "%dh %02dm", (int)s / 3600, (int)s / 60 % 60);
    return buf;
}

static const char *bytes_text(int64_t b) {
    static char buf[32];
    if (b < 1 << 20)
        snprintf(buf, sizeof buf, "%.1f KiB", (double)b / 1024);
    else if (b < 1ll << 30)
        snprintf(buf, sizeof buf, "%.1f MiB", (double)b / (1 << 20));
    else
        snprintf(buf, sizeof buf, "%.2f GiB", (double)b / (1 << 30));
    return buf;
}

/* " loss 0.4567  accuracy 0.8345", the validation's with prefix "val_". */
static void figures_text(char *out, size_t len, const ddp_program *p, const ddp_figures *f, const char *prefix) {
    size_t n = (size_t)snprintf(out, len, "  %sloss %.4f", prefix, f->loss);
    for (int64_t i = 0; i < p->settings.nmetrics && i < DDP_MAX_METRICS && n < len; i++)
        if (p->settings.metrics[i].kind != DDP_METRIC_LOSS)
            n += (size_t)snprintf(out + n, len - n, "  %s%s %.4f", prefix, p->settings.metrics[i].name, f->metric[i]);
}

/* The validation figure save_best, early_stopping or reduce_lr watches, as the
 * progress lines name it: "val_loss", "val_accuracy". */
const char *ddp_watched_name(const ddp_program *p, int64_t which) {
    static char name[80];
    snprintf(name, sizeof name, "val_%s", which <= 0 ? "loss" : p->settings.metrics[which - 1].name);
    return name;
}

/* " by more than 0.001", a min_delta, or "" for 0. */
static const char *margin_text(double min_delta) {
    static char text[64];
    text[0] = 0;
    if (min_delta > 0)
        snprintf(text, sizeof text, " by more than %g", min_delta);
    return text;
}

/* ----------------------------------------------------------------- banner */

/* "; normalised: mean [0.49, 0.48, 0.45], std [0.25, 0.24, 0.26]" (up to four
 * channels; beyond, their count), or "". */
static void describe_normalization(const ddp_dataset *spec, char *out, size_t len) {
    enum { SHOWN = 4 };
    int64_t n = spec->nnormalize;
    out[0] = 0;
    if (!n)
        return;
    if (n > SHOWN) {
        snprintf(out, len, "; normalised: %lld means and stds, one per value of the last axis", (long long)n);
        return;
    }
    size_t at = (size_t)snprintf(out, len, "; normalised: mean [");
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t i = 0; i < n && at < len; i++) {
            const ddp_channel *c = &spec->normalize[i];
            at += (size_t)snprintf(out + at, len - at, "%s%.6g", i ? ", " : "", pass ? c->std : c->mean);
        }
        if (at < len)
            at += (size_t)snprintf(out + at, len - at, pass ? "]" : "], std [");
    }
}

static void describe_data(const ddp_program *p, const ddp_data *d, char *out, size_t len) {
    char shape[96];
    if (d->spec->kind == DDP_DATA_SYNTHETIC) {
        ddp_shape_text(shape, sizeof shape, p->input_shape, (int)(p->input_rank));
        snprintf(out, len, "%s: %s synthetic samples of %s, %lld classes", d->spec->name, grouped(d->samples),
                 shape, (long long)d->spec->classes);
        return;
    }
    ddp_shape_text(shape, sizeof shape, d->shape, (int)(d->rank));
    int n = snprintf(out, len, "%s: %s samples of %s from %s", d->spec->name, grouped(d->samples), shape, d->where);
    if (d->nshards && n >= 0 && (size_t)n < len)
        n += snprintf(out + n, len - (size_t)n, " (%s)", counted(d->nshards, "file"));
    int64_t mapped, in_memory;
    ddp_data_held(d, &mapped, &in_memory);
    int64_t ahead = ddp_data_asked_ahead(d);
    if (mapped && n >= 0 && (size_t)n < len)
        n += snprintf(out + n, len - (size_t)n, "; %s mapped (one copy for the node's workers", bytes_text(mapped));
    if (mapped && ahead && n >= 0 && (size_t)n < len) /* bytes_text's buffer is one: a call each */
        n += snprintf(out + n, len - (size_t)n, "; %s past half the memory, read a few batches ahead of the loader",
                      ahead == mapped ? "all" : bytes_text(ahead));
    if (mapped && n >= 0 && (size_t)n < len)
        n += snprintf(out + n, len - (size_t)n, ")");
    if (n >= 0 && (size_t)n < len)
        n += snprintf(out + n, len - (size_t)n, "%s %s in memory", mapped ? "," : ";", bytes_text(in_memory));
    if (n >= 0 && (size_t)n < len)
        describe_normalization(d->spec, out + n, len - (size_t)n);
}

/* "; augmented: random_crop(padding = 4), random_flip(horizontal)", or "". */
static void describe_augments(const ddp_dataset *spec, char *out, size_t len) {
    static const char *const modes[] = {"horizontal", "vertical", "horizontal_and_vertical"};
    static const char *const interpolations[] = {"nearest", "bilinear"};
    static const char *const policies[] = {"imagenet", "cifar10", "svhn"};
    size_t n = 0;
    out[0] = 0;
    for (int64_t i = 0; i < spec->naugment && n < len; i++) {
        const ddp_augment *a = &spec->augment[i];
        const char *sep = i ? ", " : "; augmented: ";
        if (a->kind == DDP_AUGMENT_FLIP)
            n += (size_t)snprintf(out + n, len - n, "%srandom_flip(%s)", sep, modes[a->mode]);
        else if (a->kind == DDP_AUGMENT_CROP && a->height && a->padding)
            n += (size_t)snprintf(out + n, len - n, "%srandom_crop(size = [%lld, %lld], padding = %lld)", sep,
                                  (long long)a->height, (long long)a->width, (long long)a->padding);
        else if (a->kind == DDP_AUGMENT_CROP && a->height)
            n += (size_t)snprintf(out + n, len - n, "%srandom_crop(size = [%lld, %lld])", sep, (long long)a->height,
                                  (long long)a->width);
        else if (a->kind == DDP_AUGMENT_CROP)
            n += (size_t)snprintf(out + n, len - n, "%srandom_crop(padding = %lld)", sep, (long long)a->padding);
        else if (a->kind == DDP_AUGMENT_RESIZED_CROP)
            n += (size_t)snprintf(out + n, len - n, "%srandom_resized_crop(size = [%lld, %lld], scale = [%g, %g], "
                                  "ratio = [%g, %g])", sep, (long long)a->height, (long long)a->width, a->scale_min,
                                  a->scale_max, a->ratio_min, a->ratio_max);
        else if (a->kind == DDP_AUGMENT_COLOR)
            n += (size_t)snprintf(out + n, len - n, "%srandom_color(brightness = %g, contrast = %g, saturation = %g, "
                                  "hue = %g)", sep, a->brightness, a->contrast, a->saturation, a->hue);
        else if (a->kind == DDP_AUGMENT_TRIVIAL)
            n += (size_t)snprintf(out + n, len - n, "%strivial_augment(bins = %lld, interpolation = %s)", sep,
                                  (long long)a->size, interpolations[a->mode]);
        else if (a->kind == DDP_AUGMENT_RAND)
            n += (size_t)snprintf(out + n, len - n, "%srand_augment(ops = %lld, magnitude = %lld, bins = %lld, "
                                  "interpolation = %s)", sep, (long long)a->ops, (long long)a->strength,
                                  (long long)a->size, interpolations[a->mode]);
        else if (a->kind == DDP_AUGMENT_AUTO)
            n += (size_t)snprintf(out + n, len - n, "%sauto_augment(policy = %s, interpolation = %s)", sep,
                                  policies[a->policy], interpolations[a->mode]);
        else if (a->kind == DDP_AUGMENT_GRAYSCALE)
            n += (size_t)snprintf(out + n, len - n, "%srandom_grayscale(probability = %g)", sep, a->probability);
        else if (a->kind == DDP_AUGMENT_ERASING)
            n += (size_t)snprintf(out + n, len - n, "%srandom_erasing(probability = %g, scale = [%g, %g], ratio = "
                                  "[%g, %g], value = %s)", sep, a->probability, a->scale_min, a->scale_max,
                                  a->ratio_min, a->ratio_max, a->mode == DDP_ERASE_RANDOM ? "random" : "zero");
        else if (a->kind == DDP_AUGMENT_MIXUP || a->kind == DDP_AUGMENT_CUTMIX)
            n += (size_t)snprintf(out + n, len - n, "%srandom_%s(alpha = %g)", sep,
                                  a->kind == DDP_AUGMENT_MIXUP ? "mixup" : "cutmix", a->alpha);
        else
            n += (size_t)snprintf(out + n, len - n, "%srandom_cutout(size = %lld)", sep, (long long)a->size);
    }
}

/* The optimizer and its figures as this job uses them: expressions of replicas,
 * workers or global_batch evaluated for this job, as ddp_prepare_step does. */
static void describe_rate(const ddp_config *cfg, const ddp_program *p, const ddp_runtime *rt, char *out,
                          size_t len) {
    static const char *const optimizers[] = {"sgd", "adam", "adamw", "lars", "lamb"};
    static const char *const schedules[] = {"constant", "step", "cosine", "linear", "multistep"};
    const ddp_optimizer *o = &p->settings.optimizer;
    double replicas = rt->replicas, workers = rt->workers;
    double global = (double)ddp_step_samples(p, rt->replicas);
    double rate = isnan(cfg->learning_rate) ? ddp_rt_eval(&o->learning_rate.rate, replicas, workers, global)
                                            : cfg->learning_rate;
    double decay = ddp_rt_eval(&o->weight_decay, replicas, workers, global);
    double biases = ddp_rt_eval(&o->bias_weight_decay, replicas, workers, global);
    double norms = ddp_rt_eval(&o->norm_weight_decay, replicas, workers, global);
    int n = snprintf(out, len, "%s", optimizers[o->kind]);
    if (o->kind == DDP_OPT_LARS)
        n += snprintf(out + n, len - (size_t)n, " (trust coefficient %g%s", o->trust_coefficient,
                      o->momentum > 0 ? ", " : ")");
    if ((o->kind == DDP_OPT_SGD || o->kind == DDP_OPT_LARS) && o->momentum > 0)
        n += snprintf(out + n, len - (size_t)n, "%smomentum %g%s)", o->kind == DDP_OPT_SGD ? " (" : "", o->momentum,
                      o->nesterov ? ", nesterov" : "");
    n += snprintf(out + n, len - (size_t)n, ", learning rate %g", rate);
    if (o->learning_rate.kind != DDP_SCHEDULE_CONSTANT)
        n += snprintf(out + n, len - (size_t)n, " (%s schedule's peak)", schedules[o->learning_rate.kind]);
    if (!isnan(cfg->learning_rate))
        n += snprintf(out + n, len - (size_t)n, " from --lr");
    if (decay != 0 || biases != 0 || norms != 0)
        n += snprintf(out + n, len - (size_t)n, ", weight decay %g", decay);
    if (biases != decay || norms != decay)
        n += snprintf(out + n, len - (size_t)n, " (biases %g, normalisations %g)", biases, norms);
    if (o->clip_norm > 0)
        n += snprintf(out + n, len - (size_t)n, ", gradient norm clipped to %g", o->clip_norm);
    if (o->ema > 0)
        snprintf(out + n, len - (size_t)n, ", parameters' moving average %g%s (validated and saved)", o->ema,
                 o->ema_warmup ? " warmed up" : "");
}

void ddp_report_banner(ddp_report *r, const ddp_runtime *rt, const ddp_data *train, const ddp_data *validation,
                       const ddp_epoch_plan *plan) {
    if (r->quiet)
        return;
    const ddp_config *cfg = r->cfg;
    const ddp_program *p = r->program;
    const ddp_settings *s = &p->settings;
    char line[2048];
    const char *doing = cfg->predict_inputs[0] ? "predicting with" : cfg->evaluate ? "evaluating" : "training";
    ddp_say("%s: %s `%s` from %s (program %016llx)\n", cfg->prog, cfg->check ? "checking" : doing, p->name,
            p->source, (unsigned long long)p->hash);
    const ddp_device_info *gpu = ddp_gpu_info(rt);
    /* precision = tf32 changes the f32 products of a GPU only */
    bool tf32 = s->precision == DDP_PRECISION_TF32 && p->dtype == DDP_F32;
    bool bf16 = ddp_input_dtype(p) == DDP_BF16;
    if (gpu)
        ddp_say("  device      %s: %s, %s (bus %s), %.1f GiB free%s%s\n", strcmp(ddp_gpu_backend(rt), "cuda") == 0 ? "gpu"
               : ddp_gpu_backend(rt), gpu->name, gpu->uuid, gpu->bus, (double)gpu->free_bytes / (1 << 30),
               tf32 ? ", TF32 products" : bf16 ? ", bf16 activations and products, f32 master weights" : "",
               gpu->driver_version ? "" : " (a test instrument: correct, not fast)");
    else
        ddp_say("  device      cpu, %d thread%s (%s), %s kernels, OpenBLAS %s products%s\n", ddp_pool_threads(rt->pool),
                ddp_pool_threads(rt->pool) == 1 ? "" : "s", cfg->threads_from,
               rt->kernels == p->cpu_wide ? "AVX2" : "baseline x86-64", ddp_blas_core(),
               tf32 ? ", f32 products (tf32 is for a GPU's tensor cores)" : "");
    if (p->nconvs)
        ddp_say("  convolution %s%s\n", ddp_gpu_convolutions(rt),
                ddp_gpu_times_engines(rt) ? ", each engine the fastest of the first 8 timed (--conv-search timed)" : "");
    if (gpu)
        ddp_say("  graphs      %s\n", rt->options.no_graphs ? "none (--no-cuda-graphs): every call queued each step"
                                    : rt->profile ? "none for training (--profile times every call)"
                                    : rt->options.step_graph ? "the training step one CUDA graph from its second full "
                                                               "batch on"
                                    : ddp_gpu_buckets_summed(rt) ? "forward, the optimizer and validation each a CUDA graph "
                                                                   "from its second full batch on; backward call by call "
                                                                   "(its buckets' sums start during it)"
                                                                 : "each phase a CUDA graph from its second full batch on");
    const ddp_cluster *c = &cfg->cluster;
    if (c->world == 1)
        ddp_say("  cluster     %s: one worker on %s\n", c->source, c->host);
    else if (rt->workers < rt->replicas) /* several GPUs a worker: c is replica 0's place */
        ddp_say("  cluster     %s: %d worker%s x %d GPUs on %lld node%s, this one replica %lld (worker %lld) on %s, "
               "coordinator %s:%lld, proven by %s\n", c->source, rt->workers, rt->workers == 1 ? "" : "s",
               rt->replicas / rt->workers,
               (long long)c->nodes, c->nodes == 1 ? "" : "s", (long long)c->rank,
               (long long)c->rank / (rt->replicas / rt->workers), c->host, c->coordinator, (long long)c->port_base,
               cfg->proven_by);
    else
        ddp_say("  cluster     %s: %lld workers on %lld node%s, this one rank %lld on %s, coordinator %s:%lld, "
               "proven by %s\n", c->source, (long long)c->world, (long long)c->nodes, c->nodes == 1 ? "" : "s",
               (long long)c->rank, c->host, c->coordinator, (long long)c->port_base, cfg->proven_by);
    if (c->world > 1 || cfg->nccl)
        ddp_say("  gradients   summed by %s%s\n", cfg->communication,
               ddp_wire_dtype(p) == DDP_BF16 ? "; in bf16 (allreduce_precision = bf16: half the bytes, each sum "
                                               "rounded to bf16)" : "");
    if (train && !cfg->evaluate) {
        char augments[512];
        describe_data(p, train, line, sizeof line);
        describe_augments(train->spec, augments, sizeof augments);
        ddp_say("  data        %s%s\n", line, augments);
    }
    if (cfg->loader_threads > 1)
        ddp_say("  loader      %d threads assemble each batch\n", cfg->loader_threads);
    if (validation) {
        describe_data(p, validation, line, sizeof line);
        ddp_say(validation->unlabelled ? "  inputs      %s, no labels" : "  validation  %s", line);
        if (!cfg->evaluate)
            ddp_say(", every %lld %s%s", (long long)s->validate_every.value,
                   s->validate_every.unit == DDP_UNIT_STEPS ? "step" : "epoch", s->validate_every.value == 1 ? "" : "s");
        ddp_say("\n");
    }
    ddp_say("  batch       %lld per replica x %d replica%s", (long long)s->batch_per_replica, rt->replicas,
            rt->replicas == 1 ? "" : "s");
    if (s->accumulate_batches > 1)
        ddp_say(" x %lld accumulated", (long long)s->accumulate_batches);
    ddp_say(" = %lld global", (long long)ddp_step_samples(p, rt->replicas));
    if (plan && !cfg->evaluate)
        ddp_say("; %s per epoch, %s dropped per epoch", counted(plan->steps, "step"), counted(plan->dropped, "sample"));
    ddp_say("\n");
    int64_t memory = 0;
    for (int i = 0; i < DDP_REGION_COUNT; i++)
        memory += p->region_bytes[i];
    ddp_say("  model       %s parameters, %s planned memory\n", grouped(p->param_count), bytes_text(memory));
    if (!cfg->evaluate) {
        describe_rate(cfg, p, rt, line, sizeof line);
        ddp_say("  run         %s, %s, seed %llu, shuffle %s", counted(cfg->epochs, "epoch"), line,
                (unsigned long long)cfg->seed, s->shuffle ? "on" : "off");
        if (s->augment_repeats > 1)
            ddp_say(", each sample %lld times in a row, augmented apart", (long long)s->augment_repeats);
        ddp_say("\n");
    }
    if (cfg->load_path) {
        ddp_say("  parameters  from %s\n", cfg->load_path);
    } else if (cfg->evaluate) {
        /* legitimate (a baseline, or checking the validation data), but never silent */
        ddp_say("  parameters  the initial ones, drawn from seed %llu (no --load)\n", (unsigned long long)cfg->seed);
        fprintf(stderr, "warning: %s without --load evaluates the initial parameters (drawn from seed %llu), "
                        "not trained ones: give --load FILE to evaluate saved parameters\n",
                cfg->predict_path ? "--predict" : "--evaluate", (unsigned long long)cfg->seed);
    }
    if (cfg->predict_path) {
        char shape[256];
        ddp_shape_text(shape, sizeof shape, p->output_shape, (int)p->output_rank);
        ddp_say("  predict     %s: one row of %s per %s sample, %s\n", cfg->predict_path, shape,
                cfg->predict_inputs[0] ? "input" : "validation", p->dtype == DDP_F64 ? "float64" : "float32");
    }
    fflush(stdout);
}

/* --------------------------------------------------------------- progress */

/* "  ETA 12.0 s" for the epoch's remaining steps, then ", run 6m 02s" while epochs
 * follow, at sps (the whole job's samples a second: the steps' global batches); "" before
 * a rate is known. Validations are not counted. */
static void eta_text(const ddp_report *r, int64_t epoch, int64_t step, int64_t steps, double sps, char *out,
                     size_t len) {
    double global = (double)ddp_step_samples(r->program, r->cfg->cluster.world);
    int64_t later = r->cfg->epochs - epoch;
    out[0] = 0;
    if (!(sps > 0))
        return;
    double epoch_left = (double)(steps - step) * global / sps, run_left = epoch_left + (double)(later * steps) * global / sps;
    int n = snprintf(out, len, "  ETA %s", duration_text(epoch_left));
    if (later > 0 && n > 0 && (size_t)n < len)
        snprintf(out + n, len - (size_t)n, ", run %s", duration_text(run_left));
}

static void draw_bar(ddp_report *r, int64_t epoch, int64_t step, int64_t steps, const ddp_figures *f, double sps) {
    enum { WIDTH = 24 };
    char bar[WIDTH + 1], figs[512], eta[96];
    int filled = (int)(WIDTH * step / (steps > 0 ? steps : 1));
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < filled ? '=' : i == filled ? '>' : ' ';
    bar[WIDTH] = 0;
    figures_text(figs, sizeof figs, r->program, f, "");
    eta_text(r, epoch, step, steps, sps, eta, sizeof eta);
    printf("\r\033[Kepoch %lld/%lld [%s] %lld/%lld%s  %.0f samples/s%s", (long long)epoch, (long long)r->cfg->epochs,
           bar, (long long)step, (long long)steps, figs, sps, eta);
    fflush(stdout);
    r->bar_open = true;
}

/* TensorBoard's scalars of figures: "train/loss", "val/accuracy", ... */
static void event_figures(ddp_report *r, int64_t step, const char *prefix, const ddp_figures *f) {
    const ddp_program *p = r->program;
    char tag[96];
    snprintf(tag, sizeof tag, "%s/loss", prefix);
    ddp_events_scalar(r->events, step, tag, f->loss);
    for (int64_t i = 0; i < p->settings.nmetrics && i < DDP_MAX_METRICS; i++)
        if (p->settings.metrics[i].kind != DDP_METRIC_LOSS) {
            snprintf(tag, sizeof tag, "%s/%s", prefix, p->settings.metrics[i].name);
            ddp_events_scalar(r->events, step, tag, f->metric[i]);
        }
    ddp_events_flush(r->events);
}

void ddp_report_step(ddp_report *r, int64_t epoch, int64_t step, int64_t steps, int64_t global_step,
                     const ddp_figures *running, double samples_per_sec, double learning_rate) {
    if (r->quiet)
        return;
    if (global_step % r->cfg->log_every == 0 || step == steps || step == 1) {
        ddp_events_scalar(r->events, global_step, "learning_rate", learning_rate);
        if (samples_per_sec > 0)
            ddp_events_scalar(r->events, global_step, "samples_per_sec", samples_per_sec);
        event_figures(r, global_step, "train", running);
    }
    bool line_due = step % r->cfg->log_every == 0 || step == 1;
    char figs[512], eta[96], line[900];
    if (line_due) {
        figures_text(figs, sizeof figs, r->program, running, "");
        eta_text(r, epoch, step, steps, samples_per_sec, eta, sizeof eta);
        snprintf(line, sizeof line, "epoch %lld/%lld  step %lld/%lld%s  %.0f samples/s%s\n", (long long)epoch,
                 (long long)r->cfg->epochs, (long long)step, (long long)steps, figs, samples_per_sec, eta);
    }
    if (r->cfg->progress_bar) {
        double t = now_seconds();
        if (t - r->last_bar >= 0.1 || step == steps) {
            r->last_bar = t;
            draw_bar(r, epoch, step, steps, running, samples_per_sec);
        }
        if (line_due) /* the log holds plain lines, whatever the terminal shows */
            ddp_log_only("%s", line);
        return;
    }
    if (line_due)
        ddp_say("%s", line);
}

/* ------------------------------------------------------------ epoch lines */

static void json_number(FILE *f, const char *key, double v) {
    if (isfinite(v))
        fprintf(f, ", \"%s\": %.17g", key, v);
    else
        fprintf(f, ", \"%s\": null", key);
}

/* The value of the program's metric called name, NAN if it has none. */
static double metric_named(const ddp_program *p, const ddp_figures *f, const char *name) {
    for (int64_t i = 0; f && i < p->settings.nmetrics && i < DDP_MAX_METRICS; i++)
        if (strcmp(p->settings.metrics[i].name, name) == 0)
            return f->metric[i];
    return NAN;
}

/* One object: the fixed keys always (null when missing), then the program's other
 * metrics and their validation twins. */
static void json_line(FILE *f, const ddp_program *p, const ddp_figures *train, const ddp_figures *v, int64_t epoch,
                      int64_t step, double lr, double sps, double seconds) {
    if (epoch > 0)
        fprintf(f, "{\"epoch\": %lld, \"step\": %lld", (long long)epoch, (long long)step);
    else
        fprintf(f, "{\"epoch\": null, \"step\": null");
    json_number(f, "loss", train ? train->loss : NAN);
    json_number(f, "accuracy", metric_named(p, train, "accuracy"));
    json_number(f, "val_loss", v ? v->loss : NAN);
    json_number(f, "val_accuracy", metric_named(p, v, "accuracy"));
    json_number(f, "lr", lr);
    json_number(f, "samples_per_sec", sps);
    json_number(f, "seconds", seconds);
    for (int64_t i = 0; i < p->settings.nmetrics && i < DDP_MAX_METRICS; i++) {
        const char *name = p->settings.metrics[i].name;
        if (strcmp(name, "loss") == 0 || strcmp(name, "accuracy") == 0)
            continue;
        char key[80];
        json_number(f, name, train ? train->metric[i] : NAN);
        snprintf(key, sizeof key, "val_%s", name);
        json_number(f, key, v ? v->metric[i] : NAN);
    }
    fprintf(f, "}\n");
    fflush(f);
}

static void write_json(ddp_report *r, const ddp_figures *train, const ddp_figures *v, int64_t epoch, int64_t step,
                       double lr, double sps, double seconds) {
    FILE *files[] = {r->metrics, r->run_metrics};
    for (int i = 0; i < 2; i++)
        if (files[i])
            json_line(files[i], r->program, train, v, epoch, step, lr, sps, seconds);
}

/* metrics.jsonl as it was up to step: the lines of later steps (written after the
 * checkpoint the run resumes from) dropped. */
static bool trim_metrics(const char *path, int64_t step, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    ddp_text kept = {0};
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "\"step\": ");
        long long s = at ? atoll(at + 8) : 0;
        if (s <= step)
            ddp_text_printf(&kept, "%s", line);
    }
    fclose(f);
    bool ok = !kept.failed && ddp_write_text(path, kept.s ? kept.s : "", err, errlen);
    free(kept.s);
    return ok;
}

/* The banner's lines of the run folder (made by --check's run or not) and any resume. */
static void say_run_start(const ddp_report *r, const ddp_run_start *start, bool checking) {
    const ddp_settings *s = &r->program->settings;
    struct stat st;
    ddp_say("  run folder  %s%s: ", start->run_dir,
            checking && stat(start->run_dir, &st) != 0 ? " (made when the run starts)" : "");
    if (s->checkpoint_dir)
        ddp_say("checkpoints every %lld %s%s in %s, the newest %lld kept\n", (long long)s->checkpoint_every.value,
               s->checkpoint_every.unit == DDP_UNIT_STEPS ? "step" : "epoch", s->checkpoint_every.value == 1 ? "" : "s",
               start->checkpoint_dir, (long long)s->checkpoint_keep);
    else
        ddp_say("a checkpoint in %s only on SIGUSR1, SIGTERM or SIGINT\n", start->checkpoint_dir);
    if (s->save_best >= 0)
        ddp_say("  best        the parameters of the best %s in %s/best.safetensors\n",
                ddp_watched_name(r->program, s->save_best), start->run_dir);
    if (s->early_stopping >= 0)
        ddp_say("  early stop  after %s in a row without %s improving%s\n",
                counted(s->early_stopping_patience, "validation"), ddp_watched_name(r->program, s->early_stopping),
                margin_text(s->early_stopping_min_delta));
    if (s->reduce_lr >= 0)
        ddp_say("  reduce lr   times %g after %s in a row without %s improving%s (down to %g)\n", s->reduce_lr_factor,
                counted(s->reduce_lr_patience, "validation"), ddp_watched_name(r->program, s->reduce_lr),
                margin_text(s->reduce_lr_min_delta), s->reduce_lr_min);
    const char *label = checking ? "resumes" : "resumed";
    if (start->resumed[0] && start->batch >= start->steps) /* stopped after an epoch's last step, before its end */
        ddp_say("  %-11s %s: the end of epoch %lld (its validation and figures) next\n", label, start->resumed,
                (long long)start->epoch + 1);
    else if (start->resumed[0])
        ddp_say("  %-11s %s: epoch %lld, step %lld of %lld next\n", label, start->resumed, (long long)start->epoch + 1,
                (long long)start->batch + 1, (long long)start->steps);
}

bool ddp_report_run(ddp_report *r, const ddp_run_start *s, char *err, size_t errlen) {
    if (r->quiet)
        return true;
    char path[2200];
    bool resumed = s->resumed[0];
    snprintf(path, sizeof path, "%s/metrics.jsonl", s->run_dir);
    if (resumed && !trim_metrics(path, s->step, err, errlen))
        return false;
    if (!(r->run_metrics = fopen(path, resumed ? "a" : "w")))
        return ddp_fail(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    if (!(r->events = ddp_events_open(s->run_dir, resumed ? s->step + 1 : -1, err, errlen))) /* drops step + 1 on */
        return false;
    say_run_start(r, s, false);
    fflush(stdout);
    return true;
}

void ddp_report_validation(ddp_report *r, int64_t step, const ddp_figures *v) {
    if (r->quiet)
        return;
    event_figures(r, step, "val", v);
    ddp_report_interrupt(r);
    char figs[512];
    figures_text(figs, sizeof figs, r->program, v, "val_");
    ddp_say("step %lld: validation%s\n", (long long)step, figs);
    fflush(stdout);
}

void ddp_report_epoch(ddp_report *r, const ddp_epoch_result *e) {
    if (r->quiet)
        return;
    ddp_report_interrupt(r);
    char figs[512], vfigs[512] = "";
    figures_text(figs, sizeof figs, r->program, &e->train, "");
    if (e->validation)
        figures_text(vfigs, sizeof vfigs, r->program, e->validation, "val_");
    ddp_say("epoch %lld/%lld%s%s  lr %g  %s  %.0f samples/s\n", (long long)e->epoch, (long long)r->cfg->epochs, figs,
           vfigs, e->learning_rate, duration_text(e->seconds), e->samples_per_sec);
    fflush(stdout);
    write_json(r, &e->train, e->validation, e->epoch, e->step, e->learning_rate, e->samples_per_sec, e->seconds);
    if (e->validation && e->validated_at_end) /* a validation in mid-epoch was written then */
        event_figures(r, e->step, "val", e->validation);
}

void ddp_report_evaluation(ddp_report *r, const ddp_data *validation, const ddp_figures *v, double seconds) {
    if (r->quiet)
        return;
    if (validation->unlabelled) { /* no figures: the labels the loss saw were none */
        ddp_say("predictions for %s samples written to %s  %s\n", grouped(v->samples), r->cfg->predict_path,
                duration_text(seconds));
        fflush(stdout);
        return;
    }
    char figs[512];
    figures_text(figs, sizeof figs, r->program, v, "val_");
    ddp_say("evaluation on %s (%s samples)%s  %s\n", validation->spec->name, grouped(v->samples), figs,
           duration_text(seconds));
    if (r->cfg->predict_path)
        ddp_say("predictions written to %s\n", r->cfg->predict_path);
    fflush(stdout);
    write_json(r, NULL, v, 0, 0, NAN, seconds > 0 ? (double)v->samples / seconds : NAN, seconds);
}

void ddp_report_checked(ddp_report *r, const ddp_run_start *s, int64_t workers) {
    if (r->quiet)
        return;
    if (s)
        say_run_start(r, s, true);
    ddp_say("checked: the datasets, the parameters%s and the files to write are usable%s; nothing was "
            "trained or written (run again without --check)\n", s && s->resumed[0] ? ", the checkpoint" : "",
            workers > 1 ? ", and every worker of the job agrees" : "");
    fflush(stdout);
}

void ddp_report_best(ddp_report *r, double value, int64_t step, const char *path) {
    if (r->quiet)
        return;
    ddp_report_interrupt(r);
    ddp_say("best %s so far: %.4f after step %lld, parameters saved to %s\n",
            ddp_watched_name(r->program, r->program->settings.save_best), value, (long long)step, path);
}

void ddp_report_rate_reduced(ddp_report *r, const ddp_watch *w, double rate) {
    if (r->quiet)
        return;
    const ddp_settings *s = &r->program->settings;
    ddp_report_interrupt(r);
    ddp_say("reduce_lr: %s has not improved%s on %.4f (after step %lld) in the last %s; the learning rate is now %g\n",
            ddp_watched_name(r->program, s->reduce_lr), margin_text(s->reduce_lr_min_delta), w->best,
            (long long)w->step, counted(w->since, "validation"), rate);
}

void ddp_report_stopped_early(ddp_report *r, const ddp_watch *w, int64_t epoch) {
    if (r->quiet)
        return;
    const ddp_settings *s = &r->program->settings;
    ddp_report_interrupt(r);
    ddp_say("early stopping: %s has not improved%s on %.4f (after step %lld) for %s; training ends with epoch "
            "%lld of %lld\n", ddp_watched_name(r->program, s->early_stopping), margin_text(s->early_stopping_min_delta),
            w->best, (long long)w->step, counted(w->since, "validation"), (long long)epoch, (long long)r->cfg->epochs);
}

/* The step before the smoothed loss's lowest where it falls fastest against the log of
 * the rate, past the first tenth of the steps, whose smoothing has too few losses yet
 * (fastai's "steep" suggestion); -1 where it never falls. */
static int64_t steepest_step(const ddp_lr_sweep *s, int64_t planned, int64_t *lowest) {
    int64_t skip = planned / 10 > 1 ? planned / 10 : 1;
    *lowest = 0;
    for (int64_t k = 1; k < s->steps; k++)
        if (s->smoothed[k] < s->smoothed[*lowest])
            *lowest = k;
    int64_t best = -1;
    double fastest = 0;
    for (int64_t k = skip; k <= *lowest; k++) {
        double slope = (s->smoothed[k] - s->smoothed[k - 1]) / (log(s->rate[k]) - log(s->rate[k - 1]));
        if (slope < fastest)
            fastest = slope, best = k;
    }
    return best;
}

void ddp_report_sweep_step(ddp_report *r, const ddp_lr_sweep *s) {
    if (r->quiet || s->steps == 0)
        return;
    int64_t k = s->steps - 1, total = r->cfg->find_lr_steps, tenth = total / 10 > 0 ? total / 10 : 1;
    double t = now_seconds();
    bool bar = r->cfg->progress_bar;
    if (bar ? t - r->last_bar < 0.1 && s->steps < total : s->steps != 1 && s->steps % tenth != 0)
        return;
    char line[256];
    snprintf(line, sizeof line, "learning-rate range test: step %lld/%lld  learning rate %.3g  loss %.4f  smoothed %.4f",
             (long long)s->steps, (long long)total, s->rate[k], s->loss[k], s->smoothed[k]);
    if (!bar) {
        ddp_say("%s\n", line);
        return;
    }
    r->last_bar = t;
    printf("\r\033[K%s", line);
    fflush(stdout);
    r->bar_open = true;
}

bool ddp_report_lr_sweep(ddp_report *r, const ddp_lr_sweep *s, FILE *out, char *err, size_t errlen) {
    fprintf(out, "step,learning_rate,loss,smoothed_loss\n");
    for (int64_t k = 0; k < s->steps; k++)
        fprintf(out, "%lld,%.9g,%.9g,%.9g\n", (long long)k + 1, s->rate[k], s->loss[k], s->smoothed[k]);
    if (ferror(out))
        return ddp_fail(err, errlen, "--find-lr %s: cannot write: %s", s->path, strerror(errno));
    if (r->quiet)
        return true;
    ddp_report_interrupt(r);
    ddp_say("learning-rate range test: %lld of %s, rates %.3g to %.3g (%s)\n", (long long)s->steps,
            counted(r->cfg->find_lr_steps, "step"), s->steps ? s->rate[0] : 0, s->steps ? s->rate[s->steps - 1] : 0,
            s->ended);
    int64_t lowest, steep = steepest_step(s, r->cfg->find_lr_steps, &lowest), shown = 12, previous = -1;
    ddp_say("  %6s %14s %12s %12s\n", "step", "learning rate", "loss", "smoothed");
    for (int64_t i = 0; i < shown && s->steps; i++) { /* a dozen steps spread over the sweep */
        int64_t k = i * (s->steps - 1) / (shown - 1);
        if (k != previous)
            ddp_say("  %6lld %14.4g %12.4f %12.4f\n", (long long)k + 1, s->rate[k], s->loss[k], s->smoothed[k]);
        previous = k;
    }
    if (steep < 0)
        ddp_say("the smoothed loss never fell: try rates higher than %.3g (--find-lr-range)\n",
                s->steps ? s->rate[s->steps - 1] : 0);
    else
        ddp_say("suggested learning rate: %.3g, where the smoothed loss falls fastest (at step %lld); it is "
                "lowest at %.3g (a tenth of that: %.3g)\n", s->rate[steep], (long long)steep + 1, s->rate[lowest],
                s->rate[lowest] / 10);
    ddp_say("every step in %s\n", s->path);
    fflush(stdout);
    return true;
}

void ddp_report_summary(ddp_report *r, int64_t epochs, int64_t steps, int64_t samples, int64_t session_samples,
                        double seconds, const ddp_figures *last_validation, const char *saved_to) {
    if (r->quiet)
        return;
    ddp_report_interrupt(r);
    char figs[512] = "";
    if (last_validation)
        figures_text(figs, sizeof figs, r->program, last_validation, "val_");
    ddp_say("done: %s, %s, %s in %s (%.0f samples/s)%s%s\n", counted(epochs, "epoch"), counted(steps, "step"),
           counted(samples, "sample"), duration_text(seconds),
           seconds > 0 ? (double)session_samples / seconds : 0.0, last_validation ? ";" : "", figs + (figs[0] ? 1 : 0));
    if (saved_to)
        ddp_say("parameters saved to %s\n", saved_to);
    fflush(stdout);
}
