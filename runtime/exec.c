/* exec.c: the executor: regions, the buffer table, initial parameters, and the walk
 * over a phase's schedule.
 *
 * A kernel step runs the kernel on the live part of its index range, split among the
 * threads (a serial kernel on one); a GEMM step calls BLAS with sizes grown from the
 * live batch; a marker step calls the hook the transport installed. With --profile each
 * step is timed on its own, which the CPU allows since every step has ended when its
 * call returns. With poisoning on, planned memory is NaN before a sequence starts and
 * each value's bytes become NaN again right after its last use, so a plan that let two
 * live values share bytes, or a kernel that read outside a value's life, changes the
 * results. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conv.h"
#include "device.h"
#include "runtime.h"

enum { ALIGN = 64 };

static void *alloc_region(int64_t bytes) {
    size_t size = (size_t)((bytes + ALIGN - 1) / ALIGN * ALIGN);
    if (size == 0)
        size = ALIGN;
    void *p = NULL;
    if (posix_memalign(&p, ALIGN, size) != 0)
        return NULL;
    memset(p, 0, size);
    return p;
}

/* The kernels OpenBLAS took for this CPU (or OPENBLAS_CORETYPE named): the banner
 * says them, since a site's variable can hold a CPU's products to AVX2. */
const char *ddp_blas_core(void) {
    const char *core = openblas_get_corename();
    return core && *core ? core : "unknown";
}

static int default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The CPU's convolutions unless --convolutions says (ddp_gpu_path): its own (the
 * library path, conv_cpu.c), which saves writing and reading back the column
 * matrices, unless the filters are large beside those: the library path turns every
 * filter to KRSC and its gradient back each step, and with many more filter elements
 * than 1/16 of the columns' that costs more than it saves (ResNet-50 at batch 16).
 * bf16 has no OpenBLAS product to take: the generated steps. */
static int cpu_conv_path(const ddp_program *p) {
    if (p->settings.precision == DDP_PRECISION_BF16)
        return DDP_PATH_GENERATED;
    double filters = 0, columns = 0;
    for (int64_t i = 0; i < p->nconvs; i++) {
        const ddp_conv *cv = &p->convs[i];
        if (cv->mode != DDP_CONV_FORWARD)
            continue;
        double taps = (double)cv->filter[1] * (double)cv->filter[2] * (double)cv->image[2];
        double images = (double)cv->n.fixed + (double)cv->n.per_sample * (double)p->settings.batch_per_replica;
        filters += taps * (double)cv->filter[0];
        columns += taps * images * (double)cv->output[0] * (double)cv->output[1];
    }
    return filters * 16 <= columns ? DDP_PATH_LIBRARY : DDP_PATH_GENERATED;
}

/* The constants region: each trainable parameter element's decay group, where the
 * program's optimizer reads them. */
static void fill_constants(ddp_runtime *rt) {
    const ddp_program *p = rt->program;
    const ddp_optimizer *o = &p->settings.optimizer;
    char *constants = rt->region[DDP_REGION_CONSTANTS];
    int32_t *numbers = (int32_t *)(constants + ddp_parameter_numbers_at(p->param_count, o->decay_groups));
    int64_t *spans = (int64_t *)(constants + ddp_parameter_spans_at(p->param_count, o->decay_groups));
    int32_t number = 0;
    for (int64_t i = 0; i < p->nparams; i++) {
        const ddp_param *q = &p->params[i];
        if (q->region != DDP_REGION_PARAMS)
            continue;
        if (o->decay_groups)
            memset(constants + q->offset, (int)q->decay, (size_t)q->count);
        if (o->kind != DDP_OPT_LARS && o->kind != DDP_OPT_LAMB)
            continue;
        for (int64_t e = 0; e < q->count; e++)
            numbers[q->offset + e] = number;
        spans[2 * number] = q->offset;
        spans[2 * number + 1] = q->count;
        number++;
    }
}

/* ddp_open's failure: what it made is freed. */
static ddp_runtime *open_failed(ddp_runtime *rt, const char *why, char *err, size_t errlen) {
    snprintf(err, errlen, "%s", why);
    ddp_close(rt);
    return NULL;
}

ddp_runtime *ddp_open(const ddp_program *p, const ddp_options *o, char *err, size_t errlen) {
    if (p->abi_version != DDP_ABI_VERSION) {
        snprintf(err, errlen, "this program was built for runtime version %lld, and this runtime is "
                              "version %d: build it again with the matching ddpc",
                 (long long)p->abi_version, DDP_ABI_VERSION);
        return NULL;
    }
    ddp_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    rt->program = p;
    rt->options = *o;
    rt->elem_size = p->dtype == DDP_F64 ? 8 : 4;
    rt->replicas = rt->workers = 1;
    rt->epochs = p->settings.epochs;
    rt->rate_override = NAN;
    rt->rate_scale = 1;
    rt->cpu_path = cpu_conv_path(p);
    for (int r = 0; r < DDP_REGION_COUNT; r++) {
        rt->region[r] = alloc_region(p->region_bytes[r]);
        if (!rt->region[r]) {
            snprintf(err, errlen, "cannot allocate %lld bytes for the %s", (long long)p->region_bytes[r],
                     r == DDP_REGION_ARENA ? "activations" : "program's memory");
            ddp_close(rt);
            return NULL;
        }
    }
    if (!(rt->buffers = calloc((size_t)p->nbuffers + 1, sizeof(void *))))
        return open_failed(rt, "out of memory for the buffer table", err, errlen);
    fill_constants(rt);
    for (int64_t i = 0; i < p->nbuffers; i++)
        rt->buffers[i] = (char *)rt->region[p->buffers[i].region] + p->buffers[i].offset;
    for (int ph = 0; ph < DDP_PHASE_COUNT; ph++) {
        if (!(rt->step_args[ph] = calloc((size_t)p->phases[ph].count + 1, sizeof(void **))))
            return open_failed(rt, "out of memory for the schedule", err, errlen);
        for (int64_t s = 0; s < p->phases[ph].count; s++) {
            const ddp_step *step = &p->phases[ph].steps[s];
            void **args = calloc((size_t)step->nargs + 1, sizeof(void *));
            if (!args)
                return open_failed(rt, "out of memory for the schedule", err, errlen);
            for (int64_t a = 0; a < step->nargs; a++)
                args[a] = rt->buffers[step->args[a]];
            rt->step_args[ph][s] = args;
        }
    }
    bool wide = !o->baseline_cpu && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    rt->kernels = wide ? p->cpu_wide : p->cpu_baseline;
    rt->wide_cpu = wide;
    int threads = o->threads > 0 ? o->threads : default_threads();
    if (!(rt->pool = ddp_pool_new(threads, "ddp-compute")))
        return open_failed(rt, "cannot start the compute threads: out of memory", err, errlen);
    openblas_set_num_threads(1); /* the pool splits products itself */
    rt->scalars[DDP_S_SEED].i = p->settings.seed;
    return rt;
}

void ddp_close(ddp_runtime *rt) {
    if (!rt)
        return;
    ddp_gpu_detach(rt);
    for (int r = 0; r < DDP_REGION_COUNT; r++)
        free(rt->region[r]);
    for (int ph = 0; ph < DDP_PHASE_COUNT; ph++) {
        for (int64_t s = 0; rt->step_args[ph] && s < rt->program->phases[ph].count; s++)
            free(rt->step_args[ph][s]);
        free(rt->step_args[ph]);
    }
    free(rt->buffers);
    ddp_conv_scratch_free(&rt->conv_scratch);
    ddp_pool_free(rt->pool);
    free(rt);
}

void *ddp_buffer_ptr(ddp_runtime *rt, int64_t slot) {
    return rt->buffers[slot];
}

void ddp_set_batch(ddp_runtime *rt, int64_t local, int64_t global) {
    rt->scalars[DDP_S_LOCAL_BATCH].i = local;
    rt->scalars[DDP_S_GLOBAL_BATCH].i = global;
}

/* --------------------------------------------------------- initial values */

/* Element e of parameter p: a draw keyed by the seed, the parameter's name (key) and e. */
static double initial_value(const ddp_param *p, uint64_t seed, uint64_t key, int64_t e) {
    uint32_t w[4];
    ddp_draw(seed, DDP_STREAM_INIT, key, (uint32_t)e, (uint32_t)(e >> 32), w);
    double u = ddp_uniform53(w);
    double fan_in = (double)p->fan_in, fan_out = (double)p->fan_out;
    switch (p->init) {
    case DDP_INIT_ZEROS: return 0;
    case DDP_INIT_ONES: return 1;
    case DDP_INIT_GLOROT_UNIFORM: return (2 * u - 1) * sqrt(6 / (fan_in + fan_out));
    case DDP_INIT_HE_UNIFORM: return (2 * u - 1) * sqrt(6 / fan_in);
    default: {
        double std = p->init == DDP_INIT_HE_NORMAL ? sqrt(2 / fan_in) : sqrt(2 / (fan_in + fan_out));
        return ddp_normal(w) * std;
    }
    }
}

void ddp_init_params(ddp_runtime *rt, uint64_t seed) {
    const ddp_program *prog = rt->program;
    for (int64_t i = 0; i < prog->nparams; i++) {
        const ddp_param *p = &prog->params[i];
        char *base = rt->region[p->region];
        uint64_t key = ddp_fnv1a(p->name, strlen(p->name), DDP_FNV_START);
        for (int64_t e = 0; e < p->count; e++) {
            double v = initial_value(p, seed, key, e);
            if (prog->dtype == DDP_F64)
                ((double *)base)[p->offset + e] = v;
            else
                ((float *)base)[p->offset + e] = (float)v;
        }
    }
    memset(rt->region[DDP_REGION_STATE], 0, (size_t)prog->region_bytes[DDP_REGION_STATE]);
}

char *ddp_average(ddp_runtime *rt) {
    const ddp_optimizer *o = &rt->program->settings.optimizer;
    if (!(o->ema > 0))
        return NULL;
    return (char *)rt->region[DDP_REGION_STATE] + (o->state_vectors - 1) * rt->program->param_count * rt->elem_size;
}

void ddp_start_average(ddp_runtime *rt) {
    char *average = ddp_average(rt);
    if (average)
        memcpy(average, rt->region[DDP_REGION_PARAMS], (size_t)(rt->program->param_count * rt->elem_size));
}

void ddp_trade_average(ddp_runtime *rt) {
    char *average = ddp_average(rt), *params = rt->region[DDP_REGION_PARAMS], held[4096];
    size_t bytes = (size_t)(rt->program->param_count * rt->elem_size);
    for (size_t at = 0; average && at < bytes; at += sizeof held) {
        size_t n = bytes - at < sizeof held ? bytes - at : sizeof held;
        memcpy(held, params + at, n);
        memcpy(params + at, average + at, n);
        memcpy(average + at, held, n);
    }
}

/* --------------------------------------------------------------- the walk */

static int64_t live(const ddp_runtime *rt, ddp_dim d) {
    return d.fixed + d.per_sample * rt->scalars[DDP_S_LOCAL_BATCH].i;
}

/* One matrix product C = op(A) op(B) (+ beta C), row-major, cut into pieces of C's
 * rows or columns, whichever it has more of; each piece is a single-threaded BLAS call,
 * and the pool's threads share the pieces out, so they are the only ones computing. A
 * piece's size follows from the product's alone (at most GEMM_PIECES of them, multiples
 * of 16, at least GEMM_MIN_PIECE): OpenBLAS's sums of an element depend on where its
 * block starts on some CPUs (AMD's Zen), so pieces cut by the threads would give other
 * bits on other thread counts. Each piece packs the other factor anew, which pieces
 * smaller than GEMM_MIN_PIECE would not pay back (a 64 x 256 x 784 product in four
 * calls instead of one: 11% slower on one thread). */
typedef struct GemmCall {
    ddp_runtime *rt;
    const ddp_gemm *g;
    int64_t m, n, k;
    int64_t ld[3];        /* a, b, c */
    int64_t groups;       /* a batched product: its groups (the items are batches x groups) */
    bool by_rows;
    int64_t piece;
    bool small;           /* a batched f32 product by ddp_small_sgemm */
} GemmCall;

enum { GEMM_PIECES = 32, GEMM_MIN_PIECE = 128, GEMM_MIN_PARALLEL_MACS = 1 << 18 };

/* Operand i's leading dimension: its own, or the packed one (0) of the live sizes. */
static int64_t gemm_ld(const ddp_gemm *g, int i, int64_t m, int64_t n, int64_t k) {
    if (g->ld[i])
        return g->ld[i];
    return i == 0 ? (g->transpose_a ? m : k) : i == 1 ? (g->transpose_b ? k : n) : n;
}

static void blas_gemm(const GemmCall *c, int64_t m, int64_t n, const char *a, const char *b, char *out) {
    const ddp_gemm *g = c->g;
    enum CBLAS_TRANSPOSE ta = g->transpose_a ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = g->transpose_b ? CblasTrans : CblasNoTrans;
    blasint lda = (blasint)c->ld[0], ldb = (blasint)c->ld[1], ldc = (blasint)c->ld[2];
    if (c->small)
        ddp_small_sgemm(g->transpose_a, g->transpose_b, m, n, c->k, (float)g->alpha, (const float *)a, lda,
                        (const float *)b, ldb, (float)g->beta, (float *)out, ldc);
    else if (c->rt->program->dtype == DDP_F64)
        cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)c->k, g->alpha, (const double *)a, lda,
                    (const double *)b, ldb, g->beta, (double *)out, ldc);
    else
        cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)c->k, (float)g->alpha,
                    (const float *)a, lda, (const float *)b, ldb, (float)g->beta, (float *)out, ldc);
}

static void gemm_piece(const GemmCall *c, int64_t lo, int64_t hi) {
    const ddp_gemm *g = c->g;
    int64_t es = c->rt->elem_size;
    char *a = c->rt->buffers[g->a], *b = c->rt->buffers[g->b], *out = c->rt->buffers[g->c];
    int64_t m = c->m, n = c->n;
    if (c->by_rows) {
        a += (g->transpose_a ? lo : lo * c->ld[0]) * es;
        out += lo * c->ld[2] * es;
        m = hi - lo;
    } else {
        b += (g->transpose_b ? lo * c->ld[1] : lo) * es;
        out += lo * es;
        n = hi - lo;
    }
    blas_gemm(c, m, n, a, b, out);
}

static void gemm_pieces(void *ctx, int64_t first, int64_t last) {
    GemmCall *c = ctx;
    int64_t dim = c->by_rows ? c->m : c->n;
    for (int64_t i = first; i < last; i++)
        gemm_piece(c, i * c->piece, (i + 1) * c->piece < dim ? (i + 1) * c->piece : dim);
}

/* Products first to last of a batched GEMM, each whole on one thread: the same sums
 * on any number of threads. */
static void gemm_items(void *ctx, int64_t first, int64_t last) {
    GemmCall *c = ctx;
    const ddp_gemm *g = c->g;
    int64_t es = c->rt->elem_size;
    for (int64_t i = first; i < last; i++) {
        int64_t at[3];
        for (int o = 0; o < 3; o++)
            at[o] = ((i / c->groups) * g->batch_stride[o] + (i % c->groups) * g->group_stride[o]) * es;
        blas_gemm(c, c->m, c->n, c->rt->buffers[g->a] + at[0], c->rt->buffers[g->b] + at[1],
                  c->rt->buffers[g->c] + at[2]);
    }
}

ddp_device_gemm ddp_gemm_at(const ddp_runtime *rt, const ddp_gemm *g, int64_t group, ddp_dptr a, ddp_dptr b,
                            ddp_dptr c) {
    const ddp_program *p = rt->program;
    int64_t m = live(rt, g->m), n = live(rt, g->n), k = live(rt, g->k);
    a += (ddp_dptr)(group * g->group_stride[0] * (int64_t)ddp_dtype_size(p->buffers[g->a].dtype));
    b += (ddp_dptr)(group * g->group_stride[1] * (int64_t)ddp_dtype_size(p->buffers[g->b].dtype));
    c += (ddp_dptr)(group * g->group_stride[2] * (int64_t)ddp_dtype_size(p->buffers[g->c].dtype));
    /* row-major C = A B is column-major C^T = B^T A^T: the factors swap */
    return (ddp_device_gemm){.transa = g->transpose_b, .transb = g->transpose_a, .m = (int)n, .n = (int)m,
                             .k = (int)k, .alpha = g->alpha, .beta = g->beta, .a = b, .b = a, .c = c,
                             .lda = (int)gemm_ld(g, 1, m, n, k), .ldb = (int)gemm_ld(g, 0, m, n, k),
                             .ldc = (int)gemm_ld(g, 2, m, n, k), .batch = (int)live(rt, g->batches),
                             .stride_a = g->batch_stride[1], .stride_b = g->batch_stride[0],
                             .stride_c = g->batch_stride[2], .f64 = p->dtype == DDP_F64,
                             .bf16 = p->buffers[g->a].dtype == DDP_BF16,
                             .c_bf16 = p->buffers[g->c].dtype == DDP_BF16};
}

static ddp_dptr host_address(void *p) {
    return (ddp_dptr)(uintptr_t)p;
}

/* Fills C with zeros, the product of an empty batch (with beta 0), or NaN (which the
 * non-finite check refuses), packed or not. */
static void fill_product(ddp_runtime *rt, const GemmCall *c, int byte) {
    const ddp_gemm *g = c->g;
    int64_t es = ddp_dtype_size(rt->program->buffers[g->c].dtype), items = live(rt, g->batches) * g->groups;
    for (int64_t i = 0; i < items; i++)
        for (int64_t r = 0; r < c->m; r++)
            memset(rt->buffers[g->c] + ((i / g->groups) * g->batch_stride[2] + (i % g->groups) * g->group_stride[2] +
                                        r * c->ld[2]) * es,
                   byte, (size_t)(c->n * es));
}

/* ----------------------------------------------------------- one-hot rows */

/* An embedding's product (ddp_gemm.one_hot): A's row r is 1 in the column equal to
 * index r, as the one-hot kernel compares them (an index that is no column, a row of
 * zeros). Forward, C's row r is alpha times B's row index r: the product's one term,
 * the same value as the product, read in O(n) instead of O(k n). Transposed, the
 * table's gradient, row v of C is alpha times the sum of B's rows whose index is v,
 * in the order of the rows: each range of C's rows scans the indices, so no two
 * threads write one row and the sums do not depend on the threads. */
typedef struct OneHot {
    const GemmCall *c;
    const char *indices;
    bool wide_indices; /* f64 */
    int64_t es;
} OneHot;

enum { ONE_HOT_PIECES = 16 };

static int64_t hot_column(const OneHot *h, int64_t r, int64_t columns) {
    double v = h->wide_indices ? ((const double *)h->indices)[r] : ((const float *)h->indices)[r];
    return v >= 0 && v < (double)columns && v == (double)(int64_t)v ? (int64_t)v : -1;
}

/* dst = alpha src (src NULL: zeros), or dst += alpha src with add, n elements of es bytes */
static void scaled_row(char *dst, const char *src, int64_t n, double alpha, bool add, int64_t es) {
    if (es == 8)
        for (int64_t j = 0; j < n; j++) {
            double s = src ? alpha * ((const double *)src)[j] : 0;
            ((double *)dst)[j] = add ? ((double *)dst)[j] + s : s;
        }
    else
        for (int64_t j = 0; j < n; j++) {
            float s = src ? (float)alpha * ((const float *)src)[j] : 0;
            ((float *)dst)[j] = add ? ((float *)dst)[j] + s : s;
        }
}

static void gather_rows(void *ctx, int64_t first, int64_t last) {
    const OneHot *h = ctx;
    const GemmCall *c = h->c;
    const char *b = c->rt->buffers[c->g->b];
    char *out = c->rt->buffers[c->g->c];
    for (int64_t r = first; r < last; r++) {
        int64_t v = hot_column(h, r, c->k);
        scaled_row(out + r * c->ld[2] * h->es, v < 0 ? NULL : b + v * c->ld[1] * h->es, c->n, c->g->alpha, false,
                   h->es);
    }
}

static void add_rows_by_index(void *ctx, int64_t first, int64_t last) {
    const OneHot *h = ctx;
    const GemmCall *c = h->c;
    int64_t share = (c->m + ONE_HOT_PIECES - 1) / ONE_HOT_PIECES;
    int64_t lo = first * share, hi = last * share < c->m ? last * share : c->m;
    const char *b = c->rt->buffers[c->g->b];
    char *out = c->rt->buffers[c->g->c];
    for (int64_t v = lo; v < hi; v++)
        scaled_row(out + v * c->ld[2] * h->es, NULL, c->n, 1, false, h->es);
    for (int64_t r = 0; r < c->k; r++) {
        int64_t v = hot_column(h, r, c->m);
        if (v >= lo && v < hi)
            scaled_row(out + v * c->ld[2] * h->es, b + r * c->ld[1] * h->es, c->n, 1, true, h->es);
    }
    if (c->g->alpha != 1)
        for (int64_t v = lo; v < hi; v++)
            scaled_row(out + v * c->ld[2] * h->es, out + v * c->ld[2] * h->es, c->n, c->g->alpha, false, h->es);
}

/* The product by its one-hot rows, where it has them (f32 or f64, one product, B not
 * transposed, C overwritten); false to multiply. */
static bool one_hot_product(ddp_runtime *rt, const GemmCall *c, int64_t items) {
    const ddp_gemm *g = c->g;
    const ddp_program *p = rt->program;
    if (!g->one_hot || items != 1 || g->transpose_b || g->beta != 0)
        return false;
    int64_t slot = g->one_hot - 1, it = p->buffers[slot].dtype;
    bool program_type = p->buffers[g->a].dtype == p->dtype && p->buffers[g->b].dtype == p->dtype &&
                        p->buffers[g->c].dtype == p->dtype && p->dtype != DDP_BF16;
    if (!program_type || (it != DDP_F32 && it != DDP_F64))
        return false;
    OneHot h = {c, rt->buffers[slot], it == DDP_F64, rt->elem_size};
    if (g->transpose_a)
        ddp_pool_for(rt->pool, add_rows_by_index, &h, 0, ONE_HOT_PIECES, 2);
    else
        ddp_pool_for(rt->pool, gather_rows, &h, 0, c->m, 2 * GEMM_MIN_PIECE);
    return true;
}

static void run_gemm(ddp_runtime *rt, const ddp_gemm *g) {
    GemmCall c = {rt, g, live(rt, g->m), live(rt, g->n), live(rt, g->k), {0}, g->groups, false, 0, false};
    for (int o = 0; o < 3; o++)
        c.ld[o] = gemm_ld(g, o, c.m, c.n, c.k);
    int64_t items = live(rt, g->batches) * g->groups;
    if (c.m == 0 || c.n == 0 || items == 0)
        return;
    if (c.k == 0) { /* an empty batch: the product is zero */
        if (g->beta == 0)
            fill_product(rt, &c, 0);
        return;
    }
    if (rt->program->buffers[g->a].dtype == DDP_BF16) { /* BLAS has no bf16: the reference, in double */
        for (int64_t j = 0; j < g->groups; j++) {
            ddp_device_gemm r = ddp_gemm_at(rt, g, j, host_address(rt->buffers[g->a]),
                                            host_address(rt->buffers[g->b]), host_address(rt->buffers[g->c]));
            if (!ddp_gemm_reference(&r, false)) {
                fill_product(rt, &c, 0xff);
                return;
            }
        }
        return;
    }
    if (one_hot_product(rt, &c, items))
        return;
    if (items > 1) {
        c.small = rt->wide_cpu && rt->program->dtype != DDP_F64 && ddp_small_gemm_fits(c.m, c.n, c.k);
        bool big = c.m * c.n * c.k * items >= GEMM_MIN_PARALLEL_MACS;
        ddp_pool_for(rt->pool, gemm_items, &c, 0, items, big ? 2 : items + 1);
        return;
    }
    c.by_rows = c.m >= c.n;
    int64_t dim = c.by_rows ? c.m : c.n, share = (dim + GEMM_PIECES - 1) / GEMM_PIECES;
    c.piece = ((share > GEMM_MIN_PIECE ? share : GEMM_MIN_PIECE) + 15) & ~(int64_t)15;
    int64_t pieces = (dim + c.piece - 1) / c.piece;
    bool big = c.m * c.n * c.k >= GEMM_MIN_PARALLEL_MACS;
    ddp_pool_for(rt->pool, gemm_pieces, &c, 0, pieces, big ? 2 : pieces + 1);
}

static void fill_nan(void *p, int64_t bytes) {
    uint32_t nan = 0x7fc00000u; /* a NaN as f32, and read as f64 too */
    uint32_t *w = p;
    for (int64_t i = 0; i < bytes / 4; i++)
        w[i] = nan;
}

static void poison_sequence_start(ddp_runtime *rt) {
    const ddp_program *p = rt->program;
    fill_nan(rt->region[DDP_REGION_ARENA], p->region_bytes[DDP_REGION_ARENA]);
    fill_nan(rt->region[DDP_REGION_WORKSPACE], p->region_bytes[DDP_REGION_WORKSPACE]);
}

static void poison_after(ddp_runtime *rt, int64_t sequence, int64_t position) {
    const ddp_program *p = rt->program;
    for (int64_t i = 0; i < p->nbuffers; i++) {
        const ddp_buffer *b = &p->buffers[i];
        if (b->sequence == sequence && b->last_step == position)
            fill_nan(rt->buffers[i], b->bytes);
    }
}

/* The phase's position in its sequence, for poisoning. */
static void sequence_of(const ddp_program *p, int phase, int64_t *sequence, int64_t *first) {
    *sequence = phase == DDP_PHASE_EVAL ? 2 : 1;
    *first = 0;
    for (int ph = 0; ph < phase && phase != DDP_PHASE_EVAL; ph++)
        *first += p->phases[ph].count;
}

/* The tensor a convolution step writes. */
static int64_t written_by(const ddp_conv *cv) {
    return cv->mode == DDP_CONV_FORWARD ? cv->y : cv->mode == DDP_CONV_BACKWARD_DATA ? cv->x : cv->filters;
}

/* Step i of a phase on the CPU: done when it returns (the pool waits for its threads). */
static void run_step(ddp_runtime *rt, int phase, int64_t i) {
    const ddp_program *p = rt->program;
    const ddp_step *s = &p->phases[phase].steps[i];
    switch (s->kind) {
    case DDP_STEP_KERNEL: {
        const ddp_kernel *k = &p->kernels[s->index];
        void *const *args = rt->step_args[phase][i];
        int64_t end = live(rt, s->range);
        /* an index of a reduction sums a run of values, the block's on a GPU */
        int64_t work = k->launch == DDP_LAUNCH_BLOCK ? k->threads * k->per_thread : 1;
        if (k->flags & DDP_KERNEL_SERIAL)
            rt->kernels[s->index](args, rt->scalars, 0, end);
        else
            ddp_pool_run(rt->pool, rt->kernels[s->index], args, rt->scalars, 0, end, work);
        break;
    }
    case DDP_STEP_GEMM:
        run_gemm(rt, &p->gemms[s->index]);
        break;
    case DDP_STEP_CONV: {
        const ddp_conv *cv = &p->convs[s->index];
        ddp_device_conv d = ddp_conv_at(rt, cv);
        void *x = rt->buffers[cv->x], *filters = rt->buffers[cv->filters], *y = rt->buffers[cv->y];
        if (d.bf16 || rt->options.reference_convolutions) /* no bf16 in OpenBLAS; the checks: the reference */
            ddp_conv_reference(&d, x, filters, y);
        else if (!ddp_conv_cpu(rt->pool, &rt->conv_scratch, &d, x, filters, y, rt->wide_cpu))
            fill_nan(rt->buffers[written_by(cv)], p->buffers[written_by(cv)].bytes); /* no memory: refused as NaN */
        break;
    }
    case DDP_STEP_BUCKET_READY:
        if (rt->hooks.bucket_ready && !rt->holding_gradients)
            rt->hooks.bucket_ready(rt->hooks.ctx, s->index);
        break;
    case DDP_STEP_WAIT_BUCKETS:
        if (rt->hooks.wait_buckets)
            rt->hooks.wait_buckets(rt->hooks.ctx);
        break;
    case DDP_STEP_METRICS_READY:
        if (rt->hooks.metrics_ready)
            rt->hooks.metrics_ready(rt->hooks.ctx);
        break;
    }
}

bool ddp_path_runs(int64_t step_path, int path) {
    return step_path == DDP_PATH_ALL || step_path == path;
}

ddp_device_conv ddp_conv_at(const ddp_runtime *rt, const ddp_conv *cv) {
    const ddp_program *p = rt->program;
    return (ddp_device_conv){
        .mode = (int)cv->mode, .n = (int)live(rt, cv->n), .h = (int)cv->image[0], .w = (int)cv->image[1],
        .c = (int)cv->image[2], .k = (int)cv->filter[0], .r = (int)cv->filter[1], .s = (int)cv->filter[2],
        .oh = (int)cv->output[0], .ow = (int)cv->output[1], .stride = {(int)cv->stride[0], (int)cv->stride[1]},
        .dilation = {(int)cv->dilation[0], (int)cv->dilation[1]},
        .pad_before = {(int)cv->pad_before[0], (int)cv->pad_before[1]},
        .pad_after = {(int)cv->pad_after[0], (int)cv->pad_after[1]}, .beta = cv->beta,
        .workspace_bytes = (size_t)p->buffers[cv->workspace].bytes, .f64 = p->dtype == DDP_F64,
        .tf32 = p->dtype != DDP_F64 && p->settings.precision == DDP_PRECISION_TF32,
        .bf16 = p->buffers[cv->x].dtype == DDP_BF16};
}

static void run_step_profiled(ddp_runtime *rt, int phase, int64_t i) {
    double begin = ddp_trace_clock();
    run_step(rt, phase, i);
    ddp_profile_step(rt->profile, phase, i, (ddp_trace_clock() - begin) * 1e-6);
}

bool ddp_run_steps(ddp_runtime *rt, int phase, int64_t first, int64_t count) {
    const ddp_program *p = rt->program;
    const ddp_phase *ph = &p->phases[phase];
    int64_t sequence, position;
    sequence_of(p, phase, &sequence, &position);
    position += first;
    if (rt->gpu)
        return ddp_gpu_run_steps(rt, phase, first, count, sequence, position);
    if (rt->options.poison && first == 0 && (phase == DDP_PHASE_FORWARD || phase == DDP_PHASE_EVAL))
        poison_sequence_start(rt);
    int path = ddp_gpu_path(rt);
    for (int64_t i = first; i < first + count && i < ph->count; i++, position++) {
        bool ours = ddp_path_runs(ph->steps[i].path, path); /* not the other path's */
        if (ours && rt->profile)
            run_step_profiled(rt, phase, i);
        else if (ours)
            run_step(rt, phase, i);
        if (rt->options.poison)
            poison_after(rt, sequence, position);
    }
    return true;
}

bool ddp_run_phase(ddp_runtime *rt, int phase) {
    return ddp_run_steps(rt, phase, 0, rt->program->phases[phase].count);
}

bool ddp_train_step(ddp_runtime *rt) {
    return ddp_run_phase(rt, DDP_PHASE_FORWARD) && ddp_run_phase(rt, DDP_PHASE_BACKWARD) &&
           ddp_run_phase(rt, DDP_PHASE_OPTIMIZER);
}

void ddp_zero_accumulators(ddp_runtime *rt) {
    memset(rt->region[DDP_REGION_ACCUM], 0, (size_t)rt->program->region_bytes[DDP_REGION_ACCUM]);
    if (rt->gpu)
        ddp_gpu_zero(rt, DDP_REGION_ACCUM);
}

double *ddp_accumulators(ddp_runtime *rt) {
    return rt->buffers[rt->program->accum_slot];
}

bool ddp_eval_outputs(ddp_runtime *rt, int64_t rows, void *host) {
    const ddp_program *p = rt->program;
    const ddp_buffer *b = &p->buffers[p->eval_output_slot];
    int64_t bytes = rows * p->output_elems * ddp_dtype_size(b->dtype);
    if (rt->gpu) /* the arena has no host mirror there */
        return ddp_gpu_exchange(rt, (int)b->region, b->offset, bytes, host, false);
    memcpy(host, rt->buffers[p->eval_output_slot], (size_t)bytes);
    return true;
}

double ddp_nonfinite_flag(const ddp_runtime *rt) {
    return *(const double *)rt->buffers[rt->program->nonfinite_slot];
}

double ddp_accumulator(ddp_runtime *rt, int pair, double *count) {
    double *acc = rt->buffers[rt->program->accum_slot];
    if (count)
        *count = acc[2 * pair + 1];
    return acc[2 * pair];
}
