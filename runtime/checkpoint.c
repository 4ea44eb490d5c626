/* checkpoint.c: what a run needs to continue exactly, written at a step boundary and
 * read back by --resume.
 *
 * A checkpoint is one safetensors file, `step-NNNNNNNNNN.safetensors` in the run's
 * checkpoint folder: the model's tensors under their own names (so --load takes a
 * checkpoint too), the optimizer's state ("optimizer.state.K"; ema's moving average of
 * the parameters, its last vector, as "optimizer.average"), every other worker's
 * batch-normalisation statistics ("worker.R.statistics": they differ between workers)
 * and every worker's loss and metric sums of the epoch so far ("worker.R.accumulators"),
 * with metadata strings: where the run is (step, epoch, batch, samples, the last
 * validation), the settings in effect, and the SHA-256 of the tensors' bytes. Random
 * draws are keyed by (seed, step, sample) and the data order by (seed, epoch), so the
 * step and epoch are their whole state.
 *
 * Every worker takes part (the statistics and sums travel to worker 0 over the ring);
 * worker 0 writes (temporary file, fsync, rename, fsync of the folder), removes the
 * oldest beyond `keep` only once the new one is durable, and tells the others whether
 * it succeeded. On resume worker 0 finds the newest checkpoint whose checksum holds,
 * naming any that does not, and sends its bytes to the others. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"
#include "sha256.h"

/* ------------------------------------------------------------ settings text */

/* "prefix.name." or "prefix.name[index].": the prefix of a nested structure's lines. */
static const char *sub_prefix(char *out, size_t len, const char *prefix, const char *name, int64_t index) {
    int n = index < 0 ? snprintf(out, len, "%s%s.", prefix, name)
                      : snprintf(out, len, "%s%s[%lld].", prefix, name, (long long)index);
    return n < (int)len ? out : "(too deep).";
}

/* A listed structure as "prefix.field value" lines, every field of the contract. */
#define TEXT_I64(T, name) ddp_text_printf(t, "%s" #name " %lld\n", prefix, (long long)v->name);
#define TEXT_U64(T, name) ddp_text_printf(t, "%s" #name " %llu\n", prefix, (unsigned long long)v->name);
#define TEXT_F64(T, name) ddp_text_printf(t, "%s" #name " %.17g\n", prefix, v->name);
#define TEXT_STR(T, name) ddp_text_printf(t, "%s" #name " %s\n", prefix, v->name ? v->name : "none");
#define TEXT_I64S(T, name, n)                                                                                        \
    for (int i = 0; i < (n); i++)                                                                                    \
        ddp_text_printf(t, "%s" #name "[%d] %lld\n", prefix, i, (long long)v->name[i]);
#define TEXT_STRS(T, name, n)                                                                                        \
    for (int i = 0; i < (n); i++)                                                                                    \
        ddp_text_printf(t, "%s" #name "[%d] %s\n", prefix, i, v->name[i] ? v->name[i] : "none");
#define TEXT_SUB(T, type, name)                                                                                      \
    {                                                                                                                \
        char sub[256];                                                                                               \
        text_##type(t, sub_prefix(sub, sizeof sub, prefix, #name, -1), &v->name);                                    \
    }
#define TEXT_REFS(T, type, name, count)                                                                              \
    for (int64_t i = 0; i < v->count; i++) {                                                                         \
        char sub[256];                                                                                               \
        text_##type(t, sub_prefix(sub, sizeof sub, prefix, #name, i), &v->name[i]);                                  \
    }
#define TEXT_I64REFS(T, name, count)                                                                                 \
    for (int64_t i = 0; i < v->count; i++)                                                                           \
        ddp_text_printf(t, "%s" #name "[%lld] %lld\n", prefix, (long long)i, (long long)v->name[i]);
#define TEXT_STRREFS(T, name, count)                                                                                 \
    for (int64_t i = 0; i < v->count; i++)                                                                           \
        ddp_text_printf(t, "%s" #name "[%lld] %s\n", prefix, (long long)i, v->name[i]);
#define TEXT_FOR(T)                                                                                                  \
    static void text_##T(ddp_text *t, const char *prefix, const T *v) {                                              \
        DDP_FIELDS_##T(TEXT, T)                                                                                      \
    }
TEXT_FOR(ddp_duration)
TEXT_FOR(ddp_rt_instr)
TEXT_FOR(ddp_rt_expr)
TEXT_FOR(ddp_schedule)
TEXT_FOR(ddp_optimizer)
TEXT_FOR(ddp_metric)
TEXT_FOR(ddp_augment)
TEXT_FOR(ddp_channel)
TEXT_FOR(ddp_dataset)
TEXT_FOR(ddp_settings)

ddp_text ddp_settings_text(const ddp_settings *s) {
    ddp_text t = {0};
    text_ddp_settings(&t, "program.", s);
    return t;
}

/* ------------------------------------------------------------------ files */

/* The step of a checkpoint's file name, or -1 for any other name. */
static int64_t checkpoint_step(const char *name) {
    long long step;
    int end = 0;
    if (sscanf(name, "step-%lld.safetensors%n", &step, &end) == 1 && name[end] == 0 && step >= 0)
        return step;
    return -1;
}

typedef struct Found {
    int64_t step;
    char path[4096];
} Found;

static int newest_first(const void *a, const void *b) {
    int64_t x = ((const Found *)a)->step, y = ((const Found *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The checkpoints in dir, newest first (*found malloc'd); -1 when the folder cannot be
 * read (ENOENT: it is not there). */
static int list_checkpoints(const char *dir, Found **found) {
    *found = NULL;
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int64_t step = checkpoint_step(e->d_name);
        if (step < 0)
            continue;
        if (n == cap) {
            Found *grown = realloc(*found, sizeof **found * (size_t)(cap = cap ? 2 * cap : 16));
            if (!grown)
                break;
            *found = grown;
        }
        (*found)[n].step = step;
        snprintf((*found)[n++].path, sizeof (*found)->path, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    if (n)
        qsort(*found, (size_t)n, sizeof **found, newest_first);
    return n;
}

bool ddp_checkpoint_exists(const char *dir) {
    Found *found;
    int n = list_checkpoints(dir, &found);
    free(found);
    return n > 0;
}

/* Removes the checkpoints beyond the newest keep, and what a crash left half-written. */
static void prune(const char *dir, int64_t keep) {
    Found *found;
    int n = list_checkpoints(dir, &found);
    for (int i = (int)keep; i < n; i++) {
        unlink(found[i].path);
        ddp_crash_point("during-pruning");
    }
    free(found);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[4096];
        if (strncmp(e->d_name, "step-", 5) == 0 && strstr(e->d_name, ".safetensors.tmp-")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    if (d)
        closedir(d);
    char any[4096];
    snprintf(any, sizeof any, "%s/.", dir);
    ddp_sync_folder(any);
}

static void hex_digest(const void *data, size_t len, char out[65]) {
    unsigned char d[32];
    ddp_sha256_digest(data, len, d);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* ------------------------------------------------------------------ write */

/* Every worker's statistics (as f64) and accumulators at worker 0: world rows of
 * stats_count + 2 * accum_pairs values, rank r's row its own (a sum with zeros
 * elsewhere, which changes no bit). NULL with err. */
static double *gather_workers(ddp_runtime *rt, ddp_ring *ring, int64_t *row, char *err, size_t errlen) {
    const ddp_program *p = rt->program;
    int world = ring ? ddp_ring_world(ring) : 1, rank = ring ? ddp_ring_rank(ring) : 0;
    *row = p->stats_count + 2 * p->accum_pairs;
    double *all = calloc((size_t)(world * *row) + 1, sizeof *all);
    if (!all) {
        ddp_fail(err, errlen, "out of memory");
        return NULL;
    }
    double *mine = all + rank * *row;
    for (int64_t i = 0; i < p->stats_count; i++)
        mine[i] = p->dtype == DDP_F64 ? ((double *)rt->region[DDP_REGION_STATS])[i]
                                      : ((float *)rt->region[DDP_REGION_STATS])[i];
    memcpy(mine + p->stats_count, ddp_accumulators(rt), sizeof(double) * (size_t)(2 * p->accum_pairs));
    if (ring && !ddp_ring_allreduce(ring, all, world * *row, DDP_F64, err, errlen)) {
        free(all);
        return NULL;
    }
    return all;
}

/* The metadata of a checkpoint: its settings and progress as strings. */
typedef struct Meta {
    ddp_meta items[40];
    char values[40][64];
    int n;
} Meta;

static void meta_number(Meta *m, const char *key, long long v) {
    snprintf(m->values[m->n], sizeof m->values[0], "%lld", v);
    m->items[m->n] = (ddp_meta){key, m->values[m->n]};
    m->n++;
}

static void meta_text(Meta *m, const char *key, const char *v) {
    m->items[m->n++] = (ddp_meta){key, v};
}

/* The figures as "%.17g" numbers joined by spaces: loss, then each metric. */
static void figures_text(const ddp_figures *f, int64_t nmetrics, char *out, size_t len) {
    int n = snprintf(out, len, "%.17g", f->loss);
    for (int64_t i = 0; i < nmetrics && i < DDP_MAX_METRICS && n < (int)len; i++)
        n += snprintf(out + n, len - (size_t)n, " %.17g", f->metric[i]);
}

static void figures_read(const char *text, int64_t nmetrics, ddp_figures *f) {
    char *end;
    f->loss = strtod(text, &end);
    for (int64_t i = 0; i < nmetrics && i < DDP_MAX_METRICS; i++)
        f->metric[i] = strtod(end, &end);
}

/* A watched figure as "best step since" (best "nan" before any validation); a
 * checkpoint without one (written before save_best and early_stopping existed) reads
 * as none yet. */
static void watch_text(const ddp_watch *w, char *out, size_t len) {
    snprintf(out, len, "%.17g %lld %lld", w->best, (long long)w->step, (long long)w->since);
}

static void watch_read(const char *text, ddp_watch *w) {
    long long step, since;
    double best;
    if (text && sscanf(text, "%lf %lld %lld", &best, &step, &since) == 3)
        *w = (ddp_watch){best, step, since};
}

void ddp_state_name(const ddp_program *p, int64_t v, char *out, size_t len) {
    const ddp_optimizer *o = &p->settings.optimizer;
    if (o->ema > 0 && v == o->state_vectors - 1)
        snprintf(out, len, "optimizer.average");
    else
        snprintf(out, len, "optimizer.state.%lld", (long long)v);
}

/* The tensors of a checkpoint: the model's, the optimizer's state, the other workers'
 * statistics, every worker's sums. The arrays point into rt and workers. */
typedef char TensorName[48];

static ddp_tensor_out *checkpoint_tensors(ddp_runtime *rt, int world, const double *workers, int64_t row,
                                          void *stats_copy, TensorName *names, int64_t *n) {
    const ddp_program *p = rt->program;
    int64_t model;
    ddp_tensor_out *base = ddp_param_tensors(rt, &model);
    int64_t extra = p->settings.optimizer.state_vectors + 2 * world;
    ddp_tensor_out *t = base ? realloc(base, sizeof *t * (size_t)(model + extra)) : NULL;
    if (!t) {
        free(base);
        return NULL;
    }
    int64_t k = model;
    for (int64_t v = 0; v < p->settings.optimizer.state_vectors; v++) {
        ddp_state_name(p, v, names[k], sizeof *names);
        t[k] = (ddp_tensor_out){names[k], ddp_dtype_name(p), 1, {p->param_count},
                                  (char *)rt->region[DDP_REGION_STATE] + v * p->param_count * rt->elem_size,
                                  p->param_count * rt->elem_size};
        k++;
    }
    for (int r = 0; r < world; r++) {
        if (r > 0 && p->stats_count) {
            snprintf(names[k], sizeof *names, "worker.%d.statistics", r);
            char *dst = (char *)stats_copy + (size_t)(r * p->stats_count * rt->elem_size);
            for (int64_t i = 0; i < p->stats_count; i++) {
                double v = workers[r * row + i];
                if (p->dtype == DDP_F64)
                    ((double *)dst)[i] = v;
                else
                    ((float *)dst)[i] = (float)v;
            }
            t[k] = (ddp_tensor_out){names[k], ddp_dtype_name(p), 1, {p->stats_count}, dst,
                                    p->stats_count * rt->elem_size};
            k++;
        }
        snprintf(names[k], sizeof *names, "worker.%d.accumulators", r);
        t[k] = (ddp_tensor_out){names[k], "F64", 1, {2 * p->accum_pairs}, workers + r * row + p->stats_count,
                                (int64_t)sizeof(double) * 2 * p->accum_pairs};
        k++;
    }
    *n = k;
    return t;
}

/* The SHA-256 of the tensors' bytes, in the order the file holds them. */
static void tensors_digest(const ddp_tensor_out *t, int64_t n, char out[65]) {
    ddp_sha256 s;
    unsigned char d[32];
    ddp_sha256_init(&s);
    for (int64_t i = 0; i < n; i++)
        ddp_sha256_update(&s, t[i].data, (size_t)t[i].bytes);
    ddp_sha256_final(&s, d);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static bool write_checkpoint(ddp_runtime *rt, const ddp_checkpoint *c, int world, const double *workers,
                             int64_t row, char *path, size_t pathlen, char *err, size_t errlen) {
    const ddp_program *p = rt->program;
    void *stats_copy = calloc((size_t)(world * p->stats_count) + 1, (size_t)rt->elem_size);
    TensorName *names = calloc((size_t)(p->nparams + p->settings.optimizer.state_vectors + 2 * world), sizeof *names);
    int64_t n = 0;
    ddp_tensor_out *t = stats_copy && names ? checkpoint_tensors(rt, world, workers, row, stats_copy, names, &n)
                                            : NULL;
    ddp_text layouts = ddp_layouts_text(p);
    if (!t || layouts.failed) {
        free(names);
        free(stats_copy);
        free(t);
        free(layouts.s);
        return ddp_fail(err, errlen, "out of memory");
    }
    const ddp_progress *g = &c->progress;
    char hash[32], digest[65], validation[1024];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)p->hash);
    tensors_digest(t, n, digest);
    figures_text(&g->last_validation, p->settings.nmetrics, validation, sizeof validation);
    Meta m = {.n = 0};
    meta_text(&m, "format", "ddp-checkpoint");
    meta_text(&m, "version", "1");
    meta_text(&m, "model", p->name);
    meta_text(&m, "program_hash", hash);
    meta_text(&m, "layouts", layouts.s ? layouts.s : "");
    meta_number(&m, "step", g->step);
    meta_number(&m, "epoch", g->epoch);
    meta_number(&m, "batch", g->batch);
    meta_number(&m, "samples", g->samples);
    meta_number(&m, "validated", g->validated);
    meta_number(&m, "validated_step", g->validated_step);
    meta_number(&m, "epoch_validated", g->epoch_validated);
    meta_text(&m, "last_validation", validation);
    char best[96], stopping[96], plateau[96], scale[32];
    watch_text(&g->best, best, sizeof best);
    watch_text(&g->stopping, stopping, sizeof stopping);
    watch_text(&g->plateau, plateau, sizeof plateau);
    snprintf(scale, sizeof scale, "%.17g", g->rate_scale);
    meta_text(&m, "save_best", best);
    meta_text(&m, "early_stopping", stopping);
    meta_text(&m, "reduce_lr", plateau);
    meta_text(&m, "lr_scale", scale);
    meta_number(&m, "workers", world);
    meta_text(&m, "reason", c->reason);
    meta_text(&m, "run", c->run_settings);
    meta_text(&m, "settings", c->program_settings);
    meta_text(&m, "data_sha256", digest);
    snprintf(path, pathlen, "%s/step-%010lld.safetensors", c->dir, (long long)g->step);
    bool ok = ddp_tensors_write(path, m.items, m.n, t, n, true, err, errlen);
    free(names);
    free(stats_copy);
    free(t);
    free(layouts.s);
    if (ok)
        prune(c->dir, c->keep);
    return ok;
}

bool ddp_checkpoint_save(ddp_runtime *rt, ddp_ring *ring, const ddp_checkpoint *c, char *path, size_t pathlen,
                         char *err, size_t errlen) {
    int world = ring ? ddp_ring_world(ring) : 1, rank = ring ? ddp_ring_rank(ring) : 0;
    int64_t row;
    double *workers = gather_workers(rt, ring, &row, err, errlen);
    if (!workers)
        return false;
    char why[1024] = "";
    bool ok = rank != 0 || write_checkpoint(rt, c, world, workers, row, path, pathlen, why, sizeof why);
    free(workers);
    /* everyone learns whether it is written, so that all go on or all stop */
    double written = ok;
    if (ring && !ddp_ring_broadcast(ring, &written, sizeof written, 0, err, errlen))
        return false;
    if (rank == 0 && !ok)
        return ddp_fail(err, errlen, "%s", why);
    if (written == 0)
        return ddp_fail(err, errlen, "worker 0 could not write the checkpoint (it says why)");
    if (rank != 0)
        snprintf(path, pathlen, "%s/step-%010lld.safetensors", c->dir, (long long)c->progress.step);
    return true;
}

/* ------------------------------------------------------------------- read */

/* The file's tensors are those it was written with: false with what is wrong. */
static bool verify(const ddp_tensor_file *f, const char *path, char *err, size_t errlen) {
    const char *format = ddp_tensors_meta(f, "format"), *want = ddp_tensors_meta(f, "data_sha256");
    if (!format || strcmp(format, "ddp-checkpoint") != 0)
        return ddp_fail(err, errlen, "%s is not a ddp checkpoint (its metadata has no format \"ddp-checkpoint\")",
                        path);
    char got[65];
    hex_digest(f->data, f->data_len, got);
    if (!want || strcmp(want, got) != 0)
        return ddp_fail(err, errlen, "%s is damaged: its tensors' SHA-256 is %.12s..., and it was written with "
                                     "%.12s...", path, got, want ? want : "none");
    return true;
}

/* Worker 0: the newest checkpoint of where (a folder, or one file) that reads and
 * verifies, in *bytes; damaged ones are named in skipped. */
static bool find_checkpoint(const char *where, unsigned char **bytes, size_t *len, char *path, size_t pathlen,
                            char *skipped, size_t skippedlen, char *err, size_t errlen) {
    Found *found = NULL, one;
    int n = list_checkpoints(where, &found);
    if (n < 0 && errno == ENOTDIR) {
        snprintf(one.path, sizeof one.path, "%s", where);
        found = &one;
        n = 1;
    } else if (n < 0) {
        return ddp_fail(err, errlen, "--resume: cannot read %s: %s", where, strerror(errno));
    } else if (n == 0) {
        free(found);
        return ddp_fail(err, errlen, "--resume: %s holds no checkpoint (step-*.safetensors)", where);
    }
    skipped[0] = 0;
    bool ok = false;
    for (int i = 0; i < n && !ok; i++) {
        ddp_tensor_file f;
        char why[1024];
        ok = ddp_tensors_read(found[i].path, &f, why, sizeof why) && verify(&f, found[i].path, why, sizeof why);
        if (ok) {
            *bytes = f.bytes;
            *len = f.len;
            f.bytes = NULL;
            snprintf(path, pathlen, "%s", found[i].path);
        } else if (n == 1 || i + 1 == n) {
            ddp_fail(err, errlen, "--resume: %s%s%s", why, skipped[0] ? "; and before it: " : "", skipped);
        } else {
            size_t used = strlen(skipped);
            snprintf(skipped + used, skippedlen - used, "%s%s", used ? "; " : "", why);
        }
        ddp_tensors_free(&f);
    }
    if (found != &one)
        free(found);
    return ok;
}

/* Worker 0's checkpoint on every worker: its bytes (NULL on worker 0 when it failed,
 * the others told so). */
static bool share_checkpoint(ddp_ring *ring, int rank, bool found, unsigned char **bytes, size_t *len, char *err,
                             size_t errlen) {
    double size = found ? (double)*len : -1;
    if (!ddp_ring_broadcast(ring, &size, sizeof size, 0, err, errlen))
        return false;
    if (size < 0)
        return rank == 0 || ddp_fail(err, errlen, "worker 0 found no checkpoint to resume from (it says why)");
    if (rank != 0) {
        *len = (size_t)size;
        if (!(*bytes = malloc(*len + 1)))
            return ddp_fail(err, errlen, "out of memory for the checkpoint's %zu bytes", *len);
    }
    return ddp_ring_broadcast(ring, *bytes, *len, 0, err, errlen);
}

/* "key value" lines of text as a lookup: the value of key, or "" (in out). */
static void line_value(const char *text, const char *key, char *out, size_t len) {
    size_t k = strlen(key);
    out[0] = 0;
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, key, k) == 0 && line[k] == ' ') {
            const char *end = strchr(line, '\n');
            size_t n = end ? (size_t)(end - line - (ptrdiff_t)k - 1) : strlen(line + k + 1);
            snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), line + k + 1);
            return;
        }
    }
}

/* A replica's share of a step from a settings text: "32", or "32 x 4 accumulated". */
static void replica_batch(const char *settings, char *out, size_t len) {
    char batch[24], batches[24];
    line_value(settings, "program.batch_per_replica", batch, sizeof batch);
    line_value(settings, "program.accumulate_batches", batches, sizeof batches);
    bool one = !batches[0] || strcmp(batches, "1") == 0; /* a checkpoint from before the setting too */
    snprintf(out, len, "%s%s%s%s", batch, one ? "" : " x ", one ? "" : batches, one ? "" : " accumulated");
}

/* Settings that may differ without changing the run: where the job listens, and
 * the checkpoints' own cadence. */
static bool free_to_differ(const char *key) {
    static const char *const free_keys[] = {"program.cluster ", "program.port_base ", "program.port_range",
                                            "program.communication ", "program.checkpoint_", "program.epochs ",
                                            "program.steps_per_epoch ", "program.seed ",
                                            "program.batch_per_replica ", "program.accumulate_batches "};
    for (size_t i = 0; i < sizeof free_keys / sizeof *free_keys; i++)
        if (strncmp(key, free_keys[i], strlen(free_keys[i])) == 0)
            return true;
    return false;
}

/* Each line of then that now differs on (or lacks), appended to out as "key then -> now",
 * separated by "; ". */
static int differences(const char *then, const char *now, bool program, char *out, size_t len) {
    int count = 0;
    size_t used = strlen(out);
    for (const char *line = then; line && *line;) {
        const char *end = strchr(line, '\n'), *space = strchr(line, ' ');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        if (space && space < line + n && !(program && free_to_differ(line))) {
            char key[256], was[512], is[512];
            snprintf(key, sizeof key, "%.*s", (int)(space - line), line);
            snprintf(was, sizeof was, "%.*s", (int)(line + n - space - 1), space + 1);
            line_value(now, key, is, sizeof is);
            if (strcmp(was, is) != 0 && used < len) {
                used += (size_t)snprintf(out + used, len - used, "%s%s %s -> %s", used ? "; " : "", key, was,
                                         is[0] ? is : "(none)");
                count++;
            }
        }
        line = end ? end + 1 : NULL;
    }
    return count;
}

/* A tensor of the checkpoint by name, of count elements; NULL with err. */
static const ddp_tensor_in *tensor_of(const ddp_tensor_file *f, const char *name, int64_t count, const char *path,
                                      char *err, size_t errlen) {
    const ddp_tensor_in *e = ddp_tensors_find(f, name);
    int size = e && (strcmp(e->dtype, "F64") == 0) ? 8 : e && strcmp(e->dtype, "F32") == 0 ? 4 : 0;
    if (!e || !size || e->end - e->begin != count * size) {
        ddp_fail(err, errlen, "%s: %s `%s` of %lld values: it is not a checkpoint of this program", path,
                 e ? "has no F32 or F64 tensor" : "lacks the tensor", name, (long long)count);
        return NULL;
    }
    return e;
}

/* The checkpoint's state into this worker's regions (host mirrors) and *g. */
static bool apply(ddp_runtime *rt, const ddp_tensor_file *f, const char *path, int rank, int world, int saved_world,
                  ddp_progress *g, char *err, size_t errlen) {
    const ddp_program *p = rt->program;
    bool f64 = p->dtype == DDP_F64;
    char name[64];
    for (int64_t i = 0; i < p->nparams; i++) {
        const ddp_param *q = &p->params[i];
        const ddp_tensor_in *e = tensor_of(f, q->name, q->count, path, err, errlen);
        if (!e)
            return false;
        ddp_tensor_values(f, e, f64, (char *)rt->region[q->region] + q->offset * rt->elem_size, q->count);
    }
    for (int64_t v = 0; v < p->settings.optimizer.state_vectors; v++) {
        ddp_state_name(p, v, name, sizeof name);
        const ddp_tensor_in *e = tensor_of(f, name, p->param_count, path, err, errlen);
        if (!e)
            return false;
        ddp_tensor_values(f, e, f64, (char *)rt->region[DDP_REGION_STATE] + v * p->param_count * rt->elem_size,
                          p->param_count);
    }
    /* statistics: this worker's own; with another worker count, the mean of all saved */
    double *mean = calloc((size_t)p->stats_count + 1, sizeof *mean), *one = calloc((size_t)p->stats_count + 1,
                                                                                   sizeof *one);
    bool ok = mean && one;
    for (int r = 0; ok && p->stats_count && r < saved_world; r++) {
        if (world == saved_world && r != rank)
            continue;
        const ddp_tensor_in *e = NULL;
        if (r == 0) {
            for (int64_t i = 0; i < p->nparams; i++) /* worker 0's are the model's own */
                if (p->params[i].region == DDP_REGION_STATS) {
                    e = ddp_tensors_find(f, p->params[i].name);
                    ddp_tensor_values(f, e, true, one + p->params[i].offset, p->params[i].count);
                }
        } else {
            snprintf(name, sizeof name, "worker.%d.statistics", r);
            ok = (e = tensor_of(f, name, p->stats_count, path, err, errlen)) != NULL;
            if (ok)
                ddp_tensor_values(f, e, true, one, p->stats_count);
        }
        for (int64_t i = 0; ok && i < p->stats_count; i++)
            mean[i] += world == saved_world ? one[i] : one[i] / saved_world;
    }
    for (int64_t i = 0; ok && i < p->stats_count; i++) {
        if (f64)
            ((double *)rt->region[DDP_REGION_STATS])[i] = mean[i];
        else
            ((float *)rt->region[DDP_REGION_STATS])[i] = (float)mean[i];
    }
    free(mean);
    free(one);
    /* the epoch's sums: this worker's own; with another worker count, all on worker 0 */
    double *acc = ddp_accumulators(rt);
    memset(acc, 0, sizeof(double) * (size_t)(2 * p->accum_pairs));
    for (int r = 0; ok && r < saved_world; r++) {
        if (world == saved_world ? r != rank : rank != 0)
            continue;
        snprintf(name, sizeof name, "worker.%d.accumulators", r);
        const ddp_tensor_in *e = tensor_of(f, name, 2 * p->accum_pairs, path, err, errlen);
        double *sums = e ? malloc(sizeof(double) * (size_t)(2 * p->accum_pairs + 1)) : NULL;
        ok = sums != NULL;
        if (ok) {
            ddp_tensor_values(f, e, true, sums, 2 * p->accum_pairs);
            for (int64_t i = 0; i < 2 * p->accum_pairs; i++)
                acc[i] += sums[i];
        }
        free(sums);
    }
    if (!ok)
        return false;
    long long step = 0, epoch = 0, batch = 0, samples = 0, validated = 0, validated_step = 0, epoch_validated = 0;
    const char *v;
    ok = (v = ddp_tensors_meta(f, "step")) && sscanf(v, "%lld", &step) == 1 &&
         (v = ddp_tensors_meta(f, "epoch")) && sscanf(v, "%lld", &epoch) == 1 &&
         (v = ddp_tensors_meta(f, "batch")) && sscanf(v, "%lld", &batch) == 1 &&
         (v = ddp_tensors_meta(f, "samples")) && sscanf(v, "%lld", &samples) == 1 &&
         (v = ddp_tensors_meta(f, "validated")) && sscanf(v, "%lld", &validated) == 1 &&
         (v = ddp_tensors_meta(f, "validated_step")) && sscanf(v, "%lld", &validated_step) == 1 &&
         (v = ddp_tensors_meta(f, "epoch_validated")) && sscanf(v, "%lld", &epoch_validated) == 1 &&
         (v = ddp_tensors_meta(f, "last_validation"));
    if (!ok)
        return ddp_fail(err, errlen, "%s: its metadata lacks where the run was (step, epoch, batch, ...)", path);
    *g = (ddp_progress){step, epoch, batch, samples, validated_step, validated != 0, epoch_validated != 0, {.loss = 0},
                        {NAN, 0, 0}, {NAN, 0, 0}, {NAN, 0, 0}, 1};
    figures_read(v, p->settings.nmetrics, &g->last_validation);
    watch_read(ddp_tensors_meta(f, "save_best"), &g->best);
    watch_read(ddp_tensors_meta(f, "early_stopping"), &g->stopping);
    watch_read(ddp_tensors_meta(f, "reduce_lr"), &g->plateau);
    if ((v = ddp_tensors_meta(f, "lr_scale")))
        g->rate_scale = strtod(v, NULL);
    return true;
}

bool ddp_checkpoint_resume(ddp_runtime *rt, ddp_ring *ring, const ddp_checkpoint *c, const char *where,
                           bool allow_changed, ddp_progress *g, char *said, size_t saidlen, char *err,
                           size_t errlen) {
    int world = ring ? ddp_ring_world(ring) : 1, rank = ring ? ddp_ring_rank(ring) : 0;
    unsigned char *bytes = NULL;
    size_t len = 0;
    char path[4096] = "", skipped[2048] = "";
    bool found = rank != 0 || find_checkpoint(where, &bytes, &len, path, sizeof path, skipped, sizeof skipped, err,
                                              errlen);
    char ignored[1024];
    if (ring && !share_checkpoint(ring, rank, found, &bytes, &len, rank == 0 && !found ? ignored : err,
                                  rank == 0 && !found ? sizeof ignored : errlen))
        found = false;
    if (!found) {
        free(bytes);
        return false;
    }
    if (ring && !ddp_ring_broadcast(ring, path, sizeof path, 0, err, errlen)) { /* every worker names the file */
        free(bytes);
        return false;
    }
    ddp_tensor_file f;
    if (!ddp_tensors_parse(&f, bytes, len, path, err, errlen)) {
        ddp_tensors_free(&f);
        return false;
    }
    const char *then_run = ddp_tensors_meta(&f, "run"), *then_program = ddp_tensors_meta(&f, "settings"),
               *workers = ddp_tensors_meta(&f, "workers"), *hash = ddp_tensors_meta(&f, "program_hash");
    int saved_world = workers ? atoi(workers) : 0;
    if (!then_run || !then_program || !hash || saved_world < 1) {
        ddp_tensors_free(&f);
        return ddp_fail(err, errlen, "%s: its metadata lacks the settings it was written with", path);
    }
    /* what changed: the run's settings, the program's, and its hash where the
     * per-replica batch and the batches a step (which change the whole plan) did not */
    char diff[2048] = "", mine[32], bpr_then[80], bpr_now[80];
    int n = differences(then_run, c->run_settings, false, diff, sizeof diff);
    n += differences(then_program, c->program_settings, true, diff, sizeof diff);
    replica_batch(then_program, bpr_then, sizeof bpr_then);
    replica_batch(c->program_settings, bpr_now, sizeof bpr_now);
    snprintf(mine, sizeof mine, "%016llx", (unsigned long long)rt->program->hash);
    if (strcmp(hash, mine) != 0 && strcmp(bpr_then, bpr_now) == 0) {
        size_t used = strlen(diff);
        snprintf(diff + used, sizeof diff - used, "%sprogram %s -> %s", n ? "; " : "", hash, mine);
        n++;
    }
    if (n && !allow_changed) {
        ddp_tensors_free(&f);
        return ddp_fail(err, errlen, "--resume: %s was written by another program or with other settings: %s. "
                                     "Resume with what it was written with, or pass --resume-changed to continue "
                                     "with these changes", path, diff);
    }
    bool ok = apply(rt, &f, path, rank, world, saved_world, g, err, errlen);
    ddp_tensors_free(&f);
    if (!ok)
        return false;
    int k = snprintf(said, saidlen, "%s at step %lld", path, (long long)g->step);
    if (skipped[0] && k < (int)saidlen)
        k += snprintf(said + k, saidlen - (size_t)k, " (skipped: %s)", skipped);
    if (n && k < (int)saidlen)
        k += snprintf(said + k, saidlen - (size_t)k, "; changed: %s", diff);
    if (saved_world != world && k < (int)saidlen)
        snprintf(said + k, saidlen - (size_t)k, "; written by %d worker%s, resumed by %d: per-replica batch %s -> "
                 "%s, each worker's batch-normalisation statistics the mean of the %d saved, the epoch's figures so "
                 "far summed on worker 0, any setting of `replicas` or `workers` evaluated anew", saved_world,
                 saved_world == 1 ? "" : "s", world, bpr_then, bpr_now, saved_world);
    return true;
}
