/* profile.c: --profile, where a training step's time goes: each schedule step's time
 * (a kernel or a library call, on the CPU by the clock around it, on a GPU by events
 * recorded around it), the parts that are no schedule step (waiting for the batch,
 * summing over the workers), and each step's wall time, the rest of which is the
 * host's other work. The first steps are warm-up (caches, the threads' first wake-up,
 * a GPU's first launches) and are left out.
 *
 * At the end the averages per step become a table, by share of the step, by layer in
 * schedule order, and by the most expensive calls; worker 0 prints it, and each worker
 * writes its figures into the run folder as JSON (worker 0 the table too). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* The phases a training step runs; evaluation is not profiled. */
enum { TRAINING_PHASES = DDP_PHASE_OPTIMIZER + 1, TOP_CALLS = 15 };

struct ddp_profile {
    const ddp_program *program;
    double *seconds[TRAINING_PHASES];   /* by schedule step, summed over the profiled steps */
    bool *ran[TRAINING_PHASES];         /* by schedule step: timed at least once (not the other path's) */
    double parts[DDP_PROFILE_PARTS];
    double wall;                        /* the profiled steps' wall time */
    int64_t ended;                      /* training steps ended, warm-up included */
    int64_t local_batch;                /* the most samples a profiled step held */
};

/* The schedule steps of a training step, over its phases. */
static int64_t training_steps(const ddp_program *p) {
    int64_t steps = 0;
    for (int ph = 0; ph < TRAINING_PHASES; ph++)
        steps += p->phases[ph].count;
    return steps;
}

ddp_profile *ddp_profile_new(const ddp_program *p) {
    ddp_profile *pf = calloc(1, sizeof *pf);
    double *seconds = calloc((size_t)training_steps(p) + 1, sizeof *seconds); /* every phase's, one after another */
    bool *ran = calloc((size_t)training_steps(p) + 1, sizeof *ran);
    if (!pf || !seconds || !ran) {
        free(pf);
        free(seconds);
        free(ran);
        return NULL;
    }
    pf->program = p;
    for (int ph = 0; ph < TRAINING_PHASES; ph++) {
        pf->seconds[ph] = seconds;
        pf->ran[ph] = ran;
        seconds += p->phases[ph].count;
        ran += p->phases[ph].count;
    }
    return pf;
}

void ddp_profile_free(ddp_profile *pf) {
    if (pf) {
        free(pf->seconds[0]);
        free(pf->ran[0]);
    }
    free(pf);
}

/* A kernel or a library call, not a marker. */
static bool is_call(const ddp_step *s) {
    return s->kind == DDP_STEP_KERNEL || s->kind == DDP_STEP_GEMM || s->kind == DDP_STEP_CONV;
}

static bool warming_up(const ddp_profile *pf) {
    return pf->ended < DDP_PROFILE_WARMUP_STEPS;
}

void ddp_profile_step(ddp_profile *pf, int phase, int64_t step, double seconds) {
    if (!pf || warming_up(pf) || phase < 0 || phase >= TRAINING_PHASES || step < 0 ||
        step >= pf->program->phases[phase].count)
        return;
    const ddp_step *s = &pf->program->phases[phase].steps[step];
    if (is_call(s)) {
        pf->seconds[phase][step] += seconds;
        pf->ran[phase][step] = true;
    }
    else if (s->kind == DDP_STEP_WAIT_BUCKETS) /* the wait for the all-reduces backward started */
        pf->parts[DDP_PROFILE_COMMUNICATION] += seconds;
}

void ddp_profile_part(ddp_profile *pf, int part, double seconds) {
    if (pf && !warming_up(pf) && part >= 0 && part < DDP_PROFILE_PARTS)
        pf->parts[part] += seconds;
}

void ddp_profile_local_batch(ddp_profile *pf, int64_t samples) {
    if (pf && !warming_up(pf) && samples > pf->local_batch)
        pf->local_batch = samples;
}

void ddp_profile_end_step(ddp_profile *pf, double step_seconds) {
    if (!pf)
        return;
    if (!warming_up(pf))
        pf->wall += step_seconds;
    pf->ended++;
}

/* ------------------------------------------------------------ the averages */

enum { SHARE_FORWARD, SHARE_BACKWARD, SHARE_OPTIMIZER, SHARE_COMMUNICATION, SHARE_DATA, SHARE_OTHER, SHARES };
static const char *const share_names[SHARES] = {"forward", "backward", "optimizer", "communication", "data",
                                                "other"};
static const char *const phase_names[TRAINING_PHASES] = {"forward", "backward", "optimizer"};

/* The steps without a layer: the optimizer's kernels over the flat vectors, and any
 * other that works on the whole model at once. */
static const char whole_model[] = "(whole model)";

/* A kernel or library call of the schedule, with its time per step. */
typedef struct Call {
    int phase;
    int64_t step;
    double ms;
} Call;

typedef struct Layer {
    const char *name;
    double ms[TRAINING_PHASES];
} Layer;

/* Everything the table and the JSON say, in ms per profiled step. */
typedef struct Summary {
    int64_t steps, local_batch;
    double step_ms;             /* the step's wall time, or what was measured if more */
    double share[SHARES];
    Layer *layers;
    int64_t nlayers;
    Call *calls;                /* most expensive first */
    int64_t ncalls;
} Summary;

static double percent(const Summary *s, double ms) {
    return s->step_ms > 0 ? 100 * ms / s->step_ms : 0;
}

/* The layer named so in the list, added at its end when new. */
static Layer *layer_named(Summary *s, const char *name) {
    for (int64_t i = 0; i < s->nlayers; i++)
        if (strcmp(s->layers[i].name, name) == 0)
            return &s->layers[i];
    Layer *l = &s->layers[s->nlayers++];
    *l = (Layer){name, {0}};
    return l;
}

static int by_cost(const void *a, const void *b) {
    const Call *x = a, *y = b;
    if (x->ms != y->ms)
        return x->ms < y->ms ? 1 : -1;
    return x->phase != y->phase ? x->phase - y->phase : (x->step > y->step) - (x->step < y->step);
}

/* The calls and layers, in schedule order, then the calls by cost; the layerless
 * calls' row last. */
static void gather_calls(const ddp_profile *pf, Summary *s, double scale) {
    const ddp_program *p = pf->program;
    for (int ph = 0; ph < TRAINING_PHASES; ph++) {
        for (int64_t i = 0; i < p->phases[ph].count; i++) {
            const ddp_step *st = &p->phases[ph].steps[i];
            if (!is_call(st) || !pf->ran[ph][i]) /* a call of the path not taken is none */
                continue;
            double ms = pf->seconds[ph][i] * scale;
            s->calls[s->ncalls++] = (Call){ph, i, ms};
            s->share[SHARE_FORWARD + ph] += ms;
            if (st->layer && st->layer[0])
                layer_named(s, st->layer)->ms[ph] += ms;
        }
    }
    Layer *rest = layer_named(s, whole_model);
    for (int64_t k = 0; k < s->ncalls; k++) {
        const ddp_step *st = &p->phases[s->calls[k].phase].steps[s->calls[k].step];
        if (!st->layer || !st->layer[0])
            rest->ms[s->calls[k].phase] += s->calls[k].ms;
    }
    if (rest->ms[0] + rest->ms[1] + rest->ms[2] == 0)
        s->nlayers--;
    qsort(s->calls, (size_t)s->ncalls, sizeof *s->calls, by_cost);
}

/* The averages over the profiled steps; false when out of memory. */
static bool summarize(const ddp_profile *pf, Summary *s) {
    int64_t steps = training_steps(pf->program);
    *s = (Summary){.steps = pf->ended - DDP_PROFILE_WARMUP_STEPS, .local_batch = pf->local_batch};
    s->layers = calloc((size_t)steps + 1, sizeof *s->layers);
    s->calls = calloc((size_t)steps + 1, sizeof *s->calls);
    if (!s->layers || !s->calls)
        return false;
    double scale = 1e3 / (double)s->steps, measured = 0;
    gather_calls(pf, s, scale);
    s->share[SHARE_COMMUNICATION] = pf->parts[DDP_PROFILE_COMMUNICATION] * scale;
    s->share[SHARE_DATA] = pf->parts[DDP_PROFILE_DATA] * scale;
    for (int k = 0; k < SHARE_OTHER; k++)
        measured += s->share[k];
    /* on a GPU a step's calls may end after the host has moved on to the next step */
    s->step_ms = pf->wall * scale > measured ? pf->wall * scale : measured;
    s->share[SHARE_OTHER] = s->step_ms - measured;
    return true;
}

static void summary_free(Summary *s) {
    free(s->layers);
    free(s->calls);
}

/* A call's name: the kernel's symbol, "gemm MxNxK" at the largest batch profiled, or
 * "conv forward|data|filter NxHxWxC RxS -> K". */
static const char *call_name(const ddp_profile *pf, int64_t local_batch, const Call *c, char *buf, size_t len) {
    const ddp_program *p = pf->program;
    const ddp_step *st = &p->phases[c->phase].steps[c->step];
    if (st->kind == DDP_STEP_KERNEL)
        return p->kernels[st->index].name;
    if (st->kind == DDP_STEP_CONV) {
        static const char *const modes[] = {"forward", "data", "filter"};
        const ddp_conv *cv = &p->convs[st->index];
        snprintf(buf, len, "conv %s %lldx%lldx%lldx%lld %lldx%lld -> %lld", modes[cv->mode % 3],
                 (long long)(cv->n.fixed + cv->n.per_sample * local_batch), (long long)cv->image[0],
                 (long long)cv->image[1], (long long)cv->image[2], (long long)cv->filter[1], (long long)cv->filter[2],
                 (long long)cv->filter[0]);
        return buf;
    }
    const ddp_gemm *g = &p->gemms[st->index];
    long long items = (long long)((g->batches.fixed + g->batches.per_sample * local_batch) * g->groups);
    int n = snprintf(buf, len, "gemm %lldx%lldx%lld", (long long)(g->m.fixed + g->m.per_sample * local_batch),
                     (long long)(g->n.fixed + g->n.per_sample * local_batch),
                     (long long)(g->k.fixed + g->k.per_sample * local_batch));
    if (items != 1 && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, " x%lld", items); /* a batched product: how many */
    return buf;
}

static const char *call_layer(const ddp_profile *pf, const Call *c) {
    const char *layer = pf->program->phases[c->phase].steps[c->step].layer;
    return layer && layer[0] ? layer : whole_model;
}

/* --------------------------------------------------------------- the table */

typedef struct Source {
    int64_t rank, workers;
    const char *device;
} Source;

static int text_width(const char *s, int at_least) {
    int n = (int)strlen(s);
    return n > at_least ? n : at_least;
}

static void table_heading(ddp_text *t, const ddp_profile *pf, const Summary *s, const Source *src) {
    ddp_text_printf(t, "profile of `%s`", pf->program->name);
    if (src->workers > 1)
        ddp_text_printf(t, ", worker %lld of %lld", (long long)src->rank, (long long)src->workers);
    int64_t batches = pf->program->settings.accumulate_batches;
    ddp_text_printf(t, " (%s): %lld step%s averaged after %d warm-up step%s, %lld samples a %s on this worker",
                    src->device, (long long)s->steps, s->steps == 1 ? "" : "s", DDP_PROFILE_WARMUP_STEPS,
                    DDP_PROFILE_WARMUP_STEPS == 1 ? "" : "s", (long long)s->local_batch, batches > 1 ? "batch" : "step");
    if (batches > 1) /* accumulate_batches: the times are a step's, its calls each batch's */
        ddp_text_printf(t, ", %lld batches a step", (long long)batches);
    ddp_text_printf(t, "\n");
    ddp_text_printf(t, "\n  a step           %9.3f ms  100.0%%\n", s->step_ms);
    for (int k = 0; k < SHARES; k++)
        ddp_text_printf(t, "    %-14s %9.3f ms  %5.1f%%\n", share_names[k], s->share[k], percent(s, s->share[k]));
}

static void table_layers(ddp_text *t, const Summary *s) {
    int w = text_width("layer", 0);
    for (int64_t i = 0; i < s->nlayers; i++)
        w = text_width(s->layers[i].name, w);
    ddp_text_printf(t, "\n  %-*s  %12s %12s %12s %12s  %6s\n", w, "layer", "forward ms", "backward ms", "optimizer ms",
                    "total ms", "% step");
    for (int64_t i = 0; i < s->nlayers; i++) {
        const Layer *l = &s->layers[i];
        double total = l->ms[0] + l->ms[1] + l->ms[2];
        ddp_text_printf(t, "  %-*s  %12.3f %12.3f %12.3f %12.3f  %5.1f%%\n", w, l->name, l->ms[0], l->ms[1], l->ms[2],
                        total, percent(s, total));
    }
}

static void table_calls(ddp_text *t, const ddp_profile *pf, const Summary *s) {
    int64_t shown = s->ncalls < TOP_CALLS ? s->ncalls : TOP_CALLS;
    char name[128], title[64];
    snprintf(title, sizeof title, "the %lld most expensive calls", (long long)shown);
    int wn = text_width(title, 0), wl = text_width("layer", 0);
    for (int64_t i = 0; i < shown; i++) {
        wn = text_width(call_name(pf, s->local_batch, &s->calls[i], name, sizeof name), wn);
        wl = text_width(call_layer(pf, &s->calls[i]), wl);
    }
    ddp_text_printf(t, "\n  %-*s  %-9s  %-*s  %10s  %6s\n", wn, title, "phase", wl, "layer", "ms", "% step");
    for (int64_t i = 0; i < shown; i++) {
        const Call *c = &s->calls[i];
        ddp_text_printf(t, "  %-*s  %-9s  %-*s  %10.3f  %5.1f%%\n", wn,
                        call_name(pf, s->local_batch, c, name, sizeof name), phase_names[c->phase], wl,
                        call_layer(pf, c), c->ms, percent(s, c->ms));
    }
}

/* ---------------------------------------------------------------- the JSON */

/* Names are the program's identifiers; anything else in them is escaped all the same. */
static void json_string(ddp_text *t, const char *s) {
    ddp_text_printf(t, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        ddp_text_printf(t, *c < 0x20 || *c == '"' || *c == '\\' ? "\\u%04x" : "%c", *c);
    ddp_text_printf(t, "\"");
}

static void json_layers(ddp_text *t, const Summary *s) {
    ddp_text_printf(t, "  \"layers\": [");
    for (int64_t i = 0; i < s->nlayers; i++) {
        const Layer *l = &s->layers[i];
        double total = l->ms[0] + l->ms[1] + l->ms[2];
        ddp_text_printf(t, "%s\n    {\"layer\": ", i ? "," : "");
        json_string(t, l->name);
        ddp_text_printf(t, ", \"forward_ms\": %.6f, \"backward_ms\": %.6f, \"optimizer_ms\": %.6f, \"total_ms\": %.6f, "
                        "\"percent\": %.4f}", l->ms[0], l->ms[1], l->ms[2], total, percent(s, total));
    }
    ddp_text_printf(t, "\n  ],\n");
}

static void json_calls(ddp_text *t, const ddp_profile *pf, const Summary *s) {
    char name[128];
    ddp_text_printf(t, "  \"calls\": [");
    for (int64_t i = 0; i < s->ncalls; i++) {
        const Call *c = &s->calls[i];
        const ddp_step *st = &pf->program->phases[c->phase].steps[c->step];
        ddp_text_printf(t, "%s\n    {\"name\": ", i ? "," : "");
        json_string(t, call_name(pf, s->local_batch, c, name, sizeof name));
        ddp_text_printf(t, ", \"kind\": \"%s\", \"phase\": \"%s\", \"step\": %lld, \"layer\": ",
                        st->kind == DDP_STEP_GEMM ? "gemm" : st->kind == DDP_STEP_CONV ? "conv" : "kernel",
                        phase_names[c->phase], (long long)c->step);
        json_string(t, call_layer(pf, c));
        ddp_text_printf(t, ", \"ms\": %.6f, \"percent\": %.4f}", c->ms, percent(s, c->ms));
    }
    ddp_text_printf(t, "\n  ]\n");
}

static void json_profile(ddp_text *t, const ddp_profile *pf, const Summary *s, const Source *src) {
    ddp_text_printf(t, "{\n  \"version\": 1,\n  \"model\": ");
    json_string(t, pf->program->name);
    ddp_text_printf(t, ",\n  \"rank\": %lld,\n  \"workers\": %lld,\n  \"device\": ", (long long)src->rank,
                    (long long)src->workers);
    json_string(t, src->device);
    ddp_text_printf(t, ",\n  \"steps\": %lld,\n  \"warmup_steps\": %d,\n  \"local_batch\": %lld,\n"
                    "  \"step_ms\": %.6f,\n  \"shares\": {", (long long)s->steps, DDP_PROFILE_WARMUP_STEPS,
                    (long long)s->local_batch, s->step_ms);
    for (int k = 0; k < SHARES; k++)
        ddp_text_printf(t, "%s\n    \"%s\": {\"ms\": %.6f, \"percent\": %.4f}", k ? "," : "", share_names[k],
                        s->share[k], percent(s, s->share[k]));
    ddp_text_printf(t, "\n  },\n");
    json_layers(t, s);
    json_calls(t, pf, s);
    ddp_text_printf(t, "}\n");
}

/* ----------------------------------------------------------------- the end */

static bool write_file(const char *dir, const char *name, const ddp_text *t, char *err, size_t len) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (t->failed)
        return ddp_fail(err, len, "--profile: %s: out of memory", path);
    return ddp_write_text(path, t->s ? t->s : "", err, len);
}

bool ddp_profile_report(ddp_profile *pf, int64_t rank, int64_t workers, const char *device, const char *run_dir,
                        char *err, size_t len) {
    if (pf->ended <= DDP_PROFILE_WARMUP_STEPS) {
        if (rank == 0)
            ddp_say("profile: nothing to report: the run took %lld step%s, and the first %d %s warm-up\n",
                    (long long)pf->ended, pf->ended == 1 ? "" : "s", DDP_PROFILE_WARMUP_STEPS,
                    DDP_PROFILE_WARMUP_STEPS == 1 ? "is" : "are");
        return true;
    }
    Summary s;
    Source src = {rank, workers, device};
    if (!summarize(pf, &s)) {
        summary_free(&s);
        return ddp_fail(err, len, "--profile: out of memory");
    }
    ddp_text table = {0}, json = {0};
    json_profile(&json, pf, &s, &src);
    char name[64];
    snprintf(name, sizeof name, rank == 0 ? "profile.json" : "profile.rank%lld.json", (long long)rank);
    bool ok = write_file(run_dir, name, &json, err, len);
    if (ok && rank == 0) {
        table_heading(&table, pf, &s, &src);
        table_layers(&table, &s);
        table_calls(&table, pf, &s);
        ok = write_file(run_dir, "profile.txt", &table, err, len);
        if (ok)
            ddp_say("\n%s\n", table.s);
    }
    free(table.s);
    free(json.s);
    summary_free(&s);
    return ok;
}
