/* kernels.c: one generator per kind of op, each emitting the work of one index.
 *
 * Pointwise kernels evaluate their expressions (a DAG: each node once per index) and
 * then store every output, so a kernel may read what it writes. Reductions run one
 * index per output element with an inner loop in a fixed order (along a row, eight
 * interleaved lanes: combine_in_lanes), so sums do not depend on threads. Windows
 * (im2col, pools) gather: each output element reads what it needs, no two indices write
 * the same place, and adjoints (col2im, pool gradients) are gathers too, never
 * scattered additions. Loss, metric and accumulation kernels work per sample; sums of
 * the accumulators are f64.
 *
 * On a GPU the reductions (sums over rows: bias and batch-norm gradients, batch-norm
 * statistics, global average pooling, the loss and metric sums) are launched one block
 * per output (DDP_LAUNCH_BLOCK): the block's threads each sum a strided share of the
 * rows in f64, then a tree over shared memory adds the shares, a barrier between its
 * rounds, and thread 0 stores. The grid is the number of outputs, so it follows the
 * problem and not the GPU, and there are no atomics: the same sums come out every run.
 * A long sum over rows comes in two stages (fuse.c): a first stage, one index per
 * chunk of rows and channel, whose warps read whole rows, and the block reduction
 * over the chunks' sums. Batch-norm statistics are one pass: sums of each value's
 * difference with a shift (its channel's first value) and of its square. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cg.h"
#include "../runtime/ddp_abi.h"

/* ----------------------------------------------------------------- helpers */

static LLVMValueRef load_var(Cg *cg, LLVMValueRef var, LLVMTypeRef t) {
    return LLVMBuildLoad2(cg->b, t, var, "");
}

static void set_var(Cg *cg, LLVMValueRef var, LLVMValueRef v) {
    LLVMBuildStore(cg->b, v, var);
}

/* A tensor element as f64, whatever its type. */
static LLVMValueRef load_f64(Cg *cg, Tensor *t, LLVMValueRef index) {
    return cg_to_f64(cg, cg_load(cg, t, index));
}

/* Stores an f64 value into t (in t's type), adding to what is there if accumulate. */
static void store_f64(Cg *cg, Tensor *t, LLVMValueRef index, LLVMValueRef v, bool accumulate) {
    if (accumulate)
        v = fadd(cg, load_f64(cg, t, index), v);
    cg_store(cg, t, index, cg_from_f64(cg, v, cg_value_type(cg, t->dtype)));
}

/* --------------------------------------------------------------- expressions */

enum { MEMO = 1024 };

typedef struct Memo {
    const XExpr *e[MEMO];
    LLVMValueRef v[MEMO];
    int n;
    int64_t per_sample; /* of the index space: for per-sample loads and dropout draws */
    LLVMValueRef within; /* the index's remainder by period, where a loop counts it */
    LLVMValueRef row;    /* the index's quotient by period, where a loop counts it */
    int64_t period;
} Memo;

/* The sample index i lies in and its element there (for per-sample loads and dropout
 * draws). Inside a CPU row of the period that a sample holds whole, both come from the
 * row and the place in it, without a division per element: the row's per-sample values
 * are then loaded once, and the loop over the row (dropout: ten rounds of Philox per
 * element) vectorises. */
static void sample_place(Cg *cg, LLVMValueRef i, const Memo *m, LLVMValueRef *element, LLVMValueRef *sample) {
    if (m->row && m->per_sample % m->period == 0) {
        LLVMValueRef rows = I(cg, m->per_sample / m->period);
        *element = add(cg, mul(cg, rems(cg, m->row, rows), I(cg, m->period)), m->within);
        *sample = divs(cg, m->row, rows);
        return;
    }
    *element = rems(cg, i, I(cg, m->per_sample));
    *sample = divs(cg, i, I(cg, m->per_sample));
}

static LLVMValueRef gen_expr(Cg *cg, const XExpr *e, LLVMValueRef i, Memo *m) {
    for (int k = 0; k < m->n; k++)
        if (m->e[k] == e)
            return m->v[k];
    LLVMValueRef v = NULL, a = NULL, b = NULL;
    if (e->a)
        a = gen_expr(cg, e->a, i, m);
    if (e->b)
        b = gen_expr(cg, e->b, i, m);
    switch (e->kind) {
    case X_LOAD: {
        LLVMValueRef index = i;
        if (e->bc == BC_CHANNEL && m->within)
            index = e->channels == m->period ? m->within : rems(cg, m->within, I(cg, e->channels));
        else if (e->bc == BC_CHANNEL)
            index = rems(cg, i, I(cg, e->channels));
        else if (e->bc == BC_SAMPLE) {
            LLVMValueRef element; /* unused, and so not generated */
            sample_place(cg, i, m, &element, &index);
        }
        else if (e->bc == BC_SCALAR)
            index = I(cg, 0);
        else if (e->bc == BC_ROW)
            index = m->row && m->period == e->channels ? m->row : divs(cg, i, I(cg, e->channels));
        v = cg_load(cg, e->t, index);
        if (LLVMTypeOf(v) != cg->real)
            v = cg_from_f64(cg, cg_to_f64(cg, v), cg->real);
        break;
    }
    case X_CONST: v = LLVMConstReal(cg->real, e->num); break;
    case X_SCALAR:
        v = e->scalar <= DDP_S_SEED ? cg_scalar_i64(cg, e->scalar) : cg_scalar_f64(cg, e->scalar);
        v = cg_from_f64(cg, cg_to_f64(cg, v), cg->real);
        break;
    case X_NEG: v = LLVMBuildFNeg(cg->b, a, ""); break;
    case X_ADD: v = fadd(cg, a, b); break;
    case X_SUB: v = fsub(cg, a, b); break;
    case X_MUL: v = fmul(cg, a, b); break;
    case X_DIV: v = fdiv(cg, a, b); break;
    case X_MAX: /* a NaN operand wins, so a NaN is never hidden */
        v = sel(cg, LLVMBuildFCmp(cg->b, LLVMRealUGT, a, b, ""), a, b);
        break;
    case X_GT: v = LLVMBuildUIToFP(cg->b, fgt(cg, a, b), cg->real, ""); break;
    case X_WHEN: v = sel(cg, LLVMBuildFCmp(cg->b, LLVMRealUNE, a, LLVMConstReal(cg->real, 0), ""), b, LLVMConstReal(cg->real, 0)); break;
    case X_EXP: v = cg_exp(cg, a); break;
    case X_LOG: v = cg_log(cg, a); break;
    case X_TANH: v = cg_tanh(cg, a); break;
    case X_SIGMOID: v = fdiv(cg, LLVMConstReal(cg->real, 1), fadd(cg, LLVMConstReal(cg->real, 1), cg_exp(cg, LLVMBuildFNeg(cg->b, a, "")))); break;
    case X_SQRT: v = cg_sqrt(cg, a); break;
    case X_EXPM1: v = cg_expm1(cg, a); break;
    case X_LOG1P: v = cg_log1p(cg, a); break;
    case X_NORMAL_CDF: v = cg_normal_cdf(cg, a); break;
    case X_ONE_HOT: { /* a exact in the program's type: token indices up to 2^24 in f32 */
        LLVMValueRef column = m->within && m->period == e->channels ? m->within : rems(cg, i, I(cg, e->channels));
        LLVMValueRef hit = LLVMBuildFCmp(cg->b, LLVMRealOEQ, a, LLVMBuildSIToFP(cg->b, column, cg->real, ""), "");
        v = LLVMBuildUIToFP(cg->b, hit, cg->real, "");
        break;
    }
    }
    if (m->n < MEMO) {
        m->e[m->n] = e;
        m->v[m->n++] = v;
    }
    return v;
}

/* ------------------------------------------- parts that follow the channel alone */

/* The parts of an expression that depend on nothing but the index's channel (loads
 * broadcast per channel, single values, constants, scalars) are the same for all the
 * indices that share a channel: a batch-norm's scale, 1 / sqrt(var + eps) times gamma,
 * is one per channel. Where a thread's indices share one (a sum over rows, a GPU's
 * thread taking every T-th index with T a multiple of the channels), they are computed
 * once, before its loop, into a Memo the body starts from: the same operations on the
 * same values, so the same bits, without a square root and a division per element. */

/* Whether e depends on no more than the index's remainder by `period`. */
static bool channel_only(const XExpr *e, int64_t period) {
    if (!e)
        return true;
    if (e->kind == X_LOAD)
        return e->bc == BC_SCALAR || (e->bc == BC_CHANNEL && period % e->channels == 0);
    return channel_only(e->a, period) && channel_only(e->b, period);
}

static bool memo_has(const Memo *m, const XExpr *e) {
    for (int k = 0; k < m->n; k++)
        if (m->e[k] == e)
            return true;
    return false;
}

/* Collects into roots the largest parts of e that follow the channel alone (the
 * index's remainder by period); `seen` holds the nodes already looked at, e being a
 * DAG. */
static void find_channel_roots(const XExpr *e, int64_t period, Memo *roots, Memo *seen) {
    if (!e || e->kind == X_CONST || memo_has(seen, e) || seen->n == MEMO)
        return;
    seen->e[seen->n++] = e;
    if (channel_only(e, period)) {
        roots->e[roots->n++] = e;
        return;
    }
    find_channel_roots(e->a, period, roots, seen);
    find_channel_roots(e->b, period, roots, seen);
}

/* The largest parts of n expressions that follow the channel alone (values unset). */
static Memo channel_roots(XExpr *const *exprs, int n, int64_t period) {
    Memo roots = {0}, seen = {0};
    for (int k = 0; k < n; k++)
        find_channel_roots(exprs[k], period, &roots, &seen);
    return roots;
}

/* A Memo (in the arena) holding the channel's parts of n expressions, computed at c
 * (an index whose remainder by period is the channel's). */
static Memo *channel_parts(Cg *cg, XExpr *const *exprs, int n, int64_t period, LLVMValueRef c) {
    Memo *m = arena_alloc(cg->c->arena, sizeof *m), roots = channel_roots(exprs, n, period);
    *m = (Memo){0};
    for (int k = 0; k < roots.n; k++)
        gen_expr(cg, roots.e[k], c, m);
    return m;
}

/* Longest period a pointwise kernel asks of its grid: the grid is rounded up to a
 * multiple of period / gcd(period, threads) blocks, which stays small below it. */
enum { MAX_PERIOD = 1 << 16 };

/* period grown to a multiple of e's channel counts; once past MAX_PERIOD it stays
 * (and cannot overflow: it grows from at most MAX_PERIOD by one count at a time). */
static void channel_period(const XExpr *e, int64_t *period) {
    if (!e)
        return;
    bool per_channel = (e->kind == X_LOAD && e->bc == BC_CHANNEL) || e->kind == X_ONE_HOT;
    if (per_channel && *period <= MAX_PERIOD && *period % e->channels != 0)
        *period = *period / ddp_gcd(*period, e->channels) * e->channels;
    channel_period(e->a, period);
    channel_period(e->b, period);
}

/* The period of a pointwise op's channels: the least common multiple of their counts
 * (1 without any, or where it would pass MAX_PERIOD: then nothing is hoisted). */
static int64_t pointwise_period(const IrOp *op) {
    int64_t period = 1;
    for (int k = 0; k < op->nout; k++)
        channel_period(op->expr[k], &period);
    return period > MAX_PERIOD ? 1 : period;
}

/* A GPU thread's prologue: the channel's parts, at its first index. */
static void pointwise_prologue(Cg *cg, IrOp *op, LLVMValueRef first) {
    int64_t period = pointwise_period(op);
    if (period > 1)
        cg->hoisted = channel_parts(cg, op->expr, op->nout, period, rems(cg, first, I(cg, period)));
}

/* n indices' values, then their stores: every index's expressions are computed before
 * any is stored, so an op may read what it writes (element for element), and a GPU
 * thread's loads of its n indices are in flight together. */
static void gen_pointwise_group(Cg *cg, IrOp *op, const LLVMValueRef *i, int n) {
    LLVMValueRef v[INDICES_AT_ONCE][4];
    Memo m; /* an index's values, from what its loop knows: a GPU thread's channel parts, a CPU row's place */
    for (int u = 0; u < n; u++) {
        m = cg->hoisted ? *(const Memo *)cg->hoisted : (Memo){0};
        m.per_sample = op->range.per_sample ? op->range.per_sample : op->range.fixed;
        for (int k = 0; k < op->nout; k++)
            v[u][k] = gen_expr(cg, op->expr[k], i[u], &m);
    }
    for (int u = 0; u < n; u++)
        for (int k = 0; k < op->nout; k++)
            cg_store(cg, op->out[k], i[u], v[u][k]);
}

static void gen_pointwise(Cg *cg, IrOp *op, LLVMValueRef i) {
    gen_pointwise_group(cg, op, &i, 1);
}

/* A CPU's pointwise kernel whose loads follow the channel. An index's channel is its
 * remainder by the period, and a remainder per element keeps LLVM from vectorising
 * the loop. So the range is walked as whole rows of the period, an inner loop counting
 * the place within the row: its loads of per-channel values are contiguous, and it
 * vectorises. The partial rows at the ends of the range take one plain loop. Short
 * periods keep the plain loop: their rows are too short to vectorise. */
enum { CPU_ROWS_MIN_PERIOD = 16 };

static void gen_pointwise_rows(Cg *cg, IrOp *op) {
    int64_t period = pointwise_period(op);
    if (period < CPU_ROWS_MIN_PERIOD) {
        cg_kernel_indices(cg, op, NULL, gen_pointwise, NULL);
        return;
    }
    LLVMValueRef p = I(cg, period);
    LLVMValueRef first_row = divs(cg, add(cg, cg->begin, I(cg, period - 1)), p), last_row = divs(cg, cg->end, p);
    Loop r = cg_loop_begin(cg, first_row, last_row, "row");
    LLVMValueRef row = cg_loop_index(cg, &r), base = mul(cg, row, p);
    Loop j = cg_loop_begin(cg, I(cg, 0), p, "j");
    LLVMValueRef within = cg_loop_index(cg, &j);
    Memo *place = arena_alloc(cg->c->arena, sizeof *place);
    *place = (Memo){.within = within, .row = row, .period = period};
    cg->hoisted = place;
    gen_pointwise(cg, op, add(cg, base, within));
    cg->hoisted = NULL;
    cg_loop_end(cg, &j);
    cg_loop_end(cg, &r);
    /* the ends: [begin, head) before the first whole row, [tail, end) after the last */
    LLVMValueRef head = smin(cg, cg->end, mul(cg, first_row, p));
    LLVMValueRef tail = smax(cg, head, mul(cg, last_row, p));
    LLVMValueRef before = sub(cg, head, cg->begin);
    Loop e = cg_loop_begin(cg, I(cg, 0), add(cg, before, sub(cg, cg->end, tail)), "end");
    LLVMValueRef k = cg_loop_index(cg, &e);
    gen_pointwise(cg, op, sel(cg, lt(cg, k, before), add(cg, cg->begin, k), add(cg, tail, sub(cg, k, before))));
    cg_loop_end(cg, &e);
}

/* ----------------------------------------------------------- dropout masks */

/* Index i: draw g = i % groups of sample i / groups, Philox keyed by the seed and the
 * layer (DDP_STREAM_DROPOUT + key) with counter {g, sample, step}. Its word w keeps
 * element DROPOUT_DRAW g + w of the sample where it is at least rate 2^32, rounded: a
 * share `rate` dropped, to within 2^-33. Where a sample's elements are a multiple of
 * four, index i writes the mask's bytes 4i to 4i + 3 in one 32-bit store. `index` is
 * the sample's place in the batch. */
static void draw_dropout_group(Cg *cg, IrOp *op, LLVMValueRef index, LLVMValueRef group) {
    Tensor *mask = op->out[0];
    int64_t per_sample = mask->per_sample, groups = op->range.per_sample;
    LLVMValueRef i = add(cg, mul(cg, index, I(cg, groups)), group);
    LLVMValueRef sample = cg_load(cg, cg->ir->sample_id, index);
    LLVMValueRef seed = cg_scalar_i64(cg, DDP_S_SEED), step = cg_scalar_i64(cg, DDP_S_STEP), hi32 = I(cg, 32);
    LLVMValueRef stream = LLVMConstInt(cg->i32, (unsigned long long)(DDP_STREAM_DROPOUT + op->key), 0);
    /* one value a declaration: an initialiser list's values come in no set order */
    LLVMValueRef seed_lo = LLVMBuildTrunc(cg->b, seed, cg->i32, "");
    LLVMValueRef seed_hi = LLVMBuildTrunc(cg->b, LLVMBuildLShr(cg->b, seed, hi32, ""), cg->i32, "");
    LLVMValueRef key[2] = {seed_lo, LLVMBuildXor(cg->b, seed_hi, stream, "")};
    LLVMValueRef group_lo = LLVMBuildTrunc(cg->b, group, cg->i32, "");
    LLVMValueRef sample_lo = LLVMBuildTrunc(cg->b, sample, cg->i32, "");
    LLVMValueRef sample_hi = LLVMBuildTrunc(cg->b, LLVMBuildLShr(cg->b, sample, hi32, ""), cg->i32, "");
    LLVMValueRef counter[4] = {group_lo, sample_lo, sample_hi, LLVMBuildTrunc(cg->b, step, cg->i32, "")};
    LLVMValueRef words[DROPOUT_DRAW];
    cg_philox(cg, key, counter, words);
    double scaled = nearbyint(op->rate * 4294967296.0);
    LLVMValueRef least = LLVMConstInt(cg->i32, scaled > 4294967295.0 ? 4294967295u : (unsigned long long)scaled, 0);
    LLVMValueRef keep[DROPOUT_DRAW];
    for (int w = 0; w < DROPOUT_DRAW; w++)
        keep[w] = LLVMBuildZExt(cg->b, LLVMBuildICmp(cg->b, LLVMIntUGE, words[w], least, ""), cg->i8, "");
    LLVMValueRef bytes = cg_tensor_ptr(cg, mask);
    if (per_sample % DROPOUT_DRAW == 0) {
        LLVMValueRef packed = LLVMConstInt(cg->i32, 0, 0);
        for (int w = 0; w < DROPOUT_DRAW; w++)
            packed = LLVMBuildOr(cg->b, packed,
                                 LLVMBuildShl(cg->b, LLVMBuildZExt(cg->b, keep[w], cg->i32, ""),
                                              LLVMConstInt(cg->i32, 8 * (unsigned)w, 0), ""), "");
        LLVMTypeRef word = LLVMPointerType(cg->i32, LLVMGetPointerAddressSpace(LLVMTypeOf(bytes)));
        LLVMValueRef at = LLVMBuildInBoundsGEP2(cg->b, cg->i32, LLVMBuildBitCast(cg->b, bytes, word, ""), &i, 1, "");
        LLVMBuildStore(cg->b, packed, at);
        return;
    }
    LLVMValueRef first = add(cg, mul(cg, index, I(cg, per_sample)), mul(cg, group, I(cg, DROPOUT_DRAW)));
    for (int w = 0; w < DROPOUT_DRAW; w++) {
        If in = cg_if_begin(cg, lt(cg, add(cg, mul(cg, group, I(cg, DROPOUT_DRAW)), I(cg, w)), I(cg, per_sample)));
        cg_store(cg, mask, add(cg, first, I(cg, w)), keep[w]);
        cg_if_end(cg, &in);
    }
}

static void gen_dropout_mask(Cg *cg, IrOp *op, LLVMValueRef i) {
    LLVMValueRef groups = I(cg, op->range.per_sample);
    LLVMValueRef sample = divs(cg, i, groups);
    draw_dropout_group(cg, op, sample, rems(cg, i, groups));
}

/* A CPU's range walked sample by sample: the sample's id and key read once, and the
 * loop over its groups (the draws alone) vectorises, DROPOUT_CPU_DRAWS draws at a time:
 * LLVM's cost model takes 4, whose ten rounds wait on each other's products; 16 keep
 * an AMD EPYC's multipliers busy (a ViT's masks, 39 M elements a step, in 54 ms
 * instead of 110 on one thread; 32 are no faster). */
enum { DROPOUT_CPU_DRAWS = 16 };

static void gen_dropout_mask_cpu(Cg *cg, IrOp *op) {
    LLVMValueRef groups = I(cg, op->range.per_sample);
    LLVMValueRef first_sample = divs(cg, cg->begin, groups);
    Loop s = cg_loop_begin(cg, first_sample, divs(cg, add(cg, cg->end, I(cg, op->range.per_sample - 1)), groups),
                           "sample");
    LLVMValueRef index = cg_loop_index(cg, &s), row = mul(cg, index, groups);
    LLVMValueRef first = sub(cg, smax(cg, cg->begin, row), row);
    LLVMValueRef last = sub(cg, smin(cg, cg->end, add(cg, row, groups)), row);
    Loop g = cg_loop_begin(cg, first, last, "group");
    draw_dropout_group(cg, op, index, cg_loop_index(cg, &g));
    cg_loop_end_vector_width(cg, &g, DROPOUT_CPU_DRAWS);
    cg_loop_end(cg, &s);
}

/* ------------------------------------------------------- sums over rows */

/* The live batch's rows of a sum over rows. */
static LLVMValueRef live_rows(Cg *cg, const IrOp *op) {
    return mul(cg, cg_local_batch(cg), I(cg, op->rows_per_sample));
}

/* The partials of a two-stage sum (fuse.c): [sums, chunks, channels] in f64, the
 * first stage's output and the second's last input. */
static Tensor *partials_of(const IrOp *op) {
    return op->kind == OP_ROW_PARTIALS ? op->out[0] : op->in[op->nin - 1];
}

static int64_t chunks_of(const IrOp *op) {
    return partials_of(op)->shape.dim[1];
}

/* Where sum s of chunk k for channel c is among the partials. */
static LLVMValueRef partial_at(Cg *cg, const IrOp *op, int s, LLVMValueRef k, LLVMValueRef c) {
    return add(cg, mul(cg, add(cg, I(cg, s * chunks_of(op)), k), I(cg, op->channels)), c);
}

/* A batch-norm's shift: channel c's value in the first row. Its statistics sum the
 * rows' differences with it, and their squares, in one pass: the differences are of
 * the size of the spread, not of the mean, so the variance taken from the two sums
 * keeps its digits (a value within a few deviations of the mean serves as well as
 * the mean itself, which a single pass cannot know). */
static LLVMValueRef bn_shift(Cg *cg, IrOp *op, LLVMValueRef c) {
    return sel(cg, lt(cg, I(cg, 0), live_rows(cg, op)), load_f64(cg, op->in[0], c), F(cg, 0));
}

/* What a sum over rows adds for each of channel c's rows: the values of its
 * expressions (their parts that follow the channel alone computed once, in `fixed`),
 * or a batch-norm's difference with the shift and its square. */
typedef struct RowTerms {
    LLVMValueRef c, shift;
    int sums;
    const Memo *fixed;
} RowTerms;

static RowTerms row_terms_of(Cg *cg, IrOp *op, LLVMValueRef c, LLVMValueRef shift, int sums) {
    RowTerms t = {.c = c, .shift = shift, .sums = sums};
    if (!shift)
        t.fixed = channel_parts(cg, op->expr, sums, op->channels, c);
    return t;
}

/* The `sums` values a sum over rows adds for the element at index i. */
static void row_terms(Cg *cg, IrOp *op, LLVMValueRef i, const RowTerms *t, LLVMValueRef *terms) {
    if (t->shift) {
        LLVMValueRef d = fsub(cg, load_f64(cg, op->in[0], i), t->shift);
        terms[0] = d;
        terms[1] = fmul(cg, d, d);
        return;
    }
    Memo memo = *t->fixed; /* this row's values */
    memo.per_sample = op->rows_per_sample * op->channels;
    for (int k = 0; k < t->sums; k++)
        terms[k] = cg_to_f64(cg, gen_expr(cg, op->expr[k], i, &memo));
}

/* Rows a first stage's thread reads before it adds any: their loads are in flight
 * together, where a loop that adds each row as it comes waits for every load in turn.
 * The additions keep the rows' order, so the sums are the same. */
enum { ROWS_AT_ONCE = 4 };

/* Adds channel t->c's terms of rows [first, first + n) to acc, all the rows' terms
 * computed before the first addition. */
static void add_rows(Cg *cg, IrOp *op, LLVMValueRef first, int n, const RowTerms *t, LLVMValueRef *acc) {
    LLVMValueRef terms[ROWS_AT_ONCE][4];
    for (int r = 0; r < n; r++)
        row_terms(cg, op, add(cg, mul(cg, add(cg, first, I(cg, r)), I(cg, op->channels)), t->c), t, terms[r]);
    for (int r = 0; r < n; r++)
        for (int k = 0; k < t->sums; k++)
            set_var(cg, acc[k], fadd(cg, load_var(cg, acc[k], cg->f64), terms[r][k]));
}

/* The first stage, index i = chunk * C + c: each sum over the chunk's live rows, in
 * order, ROWS_AT_ONCE rows at a time and then the rest one by one. A chunk past the
 * live rows sums nothing and stores zeros. */
static void gen_row_partials(Cg *cg, IrOp *op, LLVMValueRef i) {
    bool bn = op->code == OP_BN_STATS;
    int sums = (int)partials_of(op)->shape.dim[0];
    LLVMValueRef ch = I(cg, op->channels), c = rems(cg, i, ch), chunk = divs(cg, i, ch);
    LLVMValueRef rows = live_rows(cg, op), lo = mul(cg, chunk, I(cg, op->chunk_rows));
    LLVMValueRef hi = add(cg, lo, I(cg, op->chunk_rows));
    hi = smin(cg, hi, rows);
    hi = smax(cg, hi, lo);
    RowTerms t = row_terms_of(cg, op, c, bn ? bn_shift(cg, op, c) : NULL, sums);
    LLVMValueRef acc[4];
    for (int s = 0; s < sums; s++)
        acc[s] = cg_var(cg, cg->f64, F(cg, 0), "acc");
    LLVMValueRef groups = divs(cg, sub(cg, hi, lo), I(cg, ROWS_AT_ONCE));
    Loop g = cg_loop_begin(cg, I(cg, 0), groups, "rows");
    add_rows(cg, op, add(cg, lo, mul(cg, cg_loop_index(cg, &g), I(cg, ROWS_AT_ONCE))), ROWS_AT_ONCE, &t, acc);
    cg_loop_end(cg, &g);
    Loop l = cg_loop_begin(cg, add(cg, lo, mul(cg, groups, I(cg, ROWS_AT_ONCE))), hi, "row");
    add_rows(cg, op, cg_loop_index(cg, &l), 1, &t, acc);
    cg_loop_end(cg, &l);
    for (int s = 0; s < sums; s++) {
        LLVMValueRef to = partial_at(cg, op, s, chunk, c);
        store_f64(cg, op->out[0], to, load_var(cg, acc[s], cg->f64), false);
    }
}

/* A CPU's sums over rows (a first stage's, or a sum straight over the rows) run rows
 * outer and channels inner. An index per channel walking down its column reads one
 * element a cache line, C apart; a row's channels are contiguous, so the inner loop
 * reads memory in order and LLVM vectorises it. Each channel still adds its rows in
 * order, in f64, into its own accumulator: the same sums, bit for bit. The parts of
 * the terms that follow the channel alone are computed once per channel, into arrays
 * the inner loop reads. The accumulators and those arrays live on the stack of the
 * thread; a sum that would need more than CPU_SUM_STACK keeps the per-channel loop. */
enum { CPU_SUM_STACK = 256 << 10 };

/* Whether a part of the terms is worth an array: something computed, not a load or a
 * value the inner loop has anyway. */
static bool computed_part(const XExpr *e) {
    return e->kind != X_LOAD && e->kind != X_CONST && e->kind != X_SCALAR;
}

/* n values of type t on the stack of the thread running the kernel; stack_at gives
 * element (k, c) of it read as [n / channels][channels]. */
static LLVMValueRef stack_array(Cg *cg, LLVMTypeRef t, int64_t n, const char *name) {
    return cg_var(cg, LLVMArrayType(t, (unsigned)n), NULL, name);
}

static LLVMValueRef stack_at(Cg *cg, LLVMValueRef array, int64_t k, int64_t channels, LLVMValueRef c) {
    LLVMValueRef idx[2] = {I(cg, 0), add(cg, I(cg, k * channels), c)};
    return LLVMBuildInBoundsGEP2(cg->b, LLVMGetAllocatedType(array), array, idx, 2, "");
}

typedef struct CpuSums {
    int sums;
    bool bn;
    LLVMValueRef acc;      /* [sums][C] f64 */
    Memo parts;            /* the channel's computed parts: which nodes (their values in `values`) */
    LLVMValueRef values;   /* [parts.n][C] reals */
} CpuSums;

/* Channels [lo, hi): their parts into the arrays, their accumulators to zero. */
static void cpu_sums_start(Cg *cg, IrOp *op, CpuSums *s, LLVMValueRef lo, LLVMValueRef hi) {
    Loop l = cg_loop_begin(cg, lo, hi, "channel");
    LLVMValueRef c = cg_loop_index(cg, &l);
    for (int k = 0; k < s->sums; k++)
        set_var(cg, stack_at(cg, s->acc, k, op->channels, c), F(cg, 0));
    Memo m = {0};
    for (int k = 0; k < s->parts.n; k++) {
        LLVMValueRef to = stack_at(cg, s->values, k, op->channels, c);
        set_var(cg, to, gen_expr(cg, s->parts.e[k], c, &m));
    }
    cg_loop_end(cg, &l);
}

/* Rows [row_lo, row_hi) of channels [lo, hi) into the accumulators. */
static void cpu_sums_rows(Cg *cg, IrOp *op, CpuSums *s, LLVMValueRef lo, LLVMValueRef hi, LLVMValueRef row_lo,
                          LLVMValueRef row_hi) {
    Loop r = cg_loop_begin(cg, row_lo, row_hi, "row");
    LLVMValueRef base = mul(cg, cg_loop_index(cg, &r), I(cg, op->channels));
    Loop l = cg_loop_begin(cg, lo, hi, "channel");
    LLVMValueRef c = cg_loop_index(cg, &l), terms[4];
    Memo fixed = {.within = c, .period = op->channels};
    for (int k = 0; k < s->parts.n; k++) {
        fixed.e[k] = s->parts.e[k];
        fixed.v[k] = LLVMBuildLoad2(cg->b, cg->real, stack_at(cg, s->values, k, op->channels, c), "");
    }
    fixed.n = s->parts.n;
    RowTerms t = {.c = c, .shift = s->bn ? load_f64(cg, op->in[0], c) : NULL, .sums = s->sums, .fixed = &fixed};
    row_terms(cg, op, add(cg, base, c), &t, terms);
    for (int k = 0; k < s->sums; k++) {
        LLVMValueRef at = stack_at(cg, s->acc, k, op->channels, c);
        set_var(cg, at, fadd(cg, load_var(cg, at, cg->f64), terms[k]));
    }
    cg_loop_end(cg, &l);
    cg_loop_end(cg, &r);
}

/* Whether op is a sum the CPU runs rows outer (within CPU_SUM_STACK), filling s. */
static bool cpu_sums_fit(Cg *cg, IrOp *op, CpuSums *s) {
    bool partials = op->kind == OP_ROW_PARTIALS;
    if (!partials && (op->kind != OP_REDUCE_ROWS || op->chunk_rows))
        return false;
    s->sums = partials ? (int)partials_of(op)->shape.dim[0] : op->nout;
    s->bn = op->code == OP_BN_STATS;
    s->parts = (Memo){0};
    if (!s->bn) {
        Memo roots = channel_roots(op->expr, s->sums, op->channels);
        for (int k = 0; k < roots.n; k++)
            if (computed_part(roots.e[k]))
                s->parts.e[s->parts.n++] = roots.e[k];
    }
    int64_t real = LLVMGetTypeKind(cg->real) == LLVMDoubleTypeKind ? 8 : 4;
    if ((s->sums * 8 + s->parts.n * real) * op->channels > CPU_SUM_STACK)
        return false;
    s->acc = stack_array(cg, cg->f64, s->sums * op->channels, "acc");
    s->values = s->parts.n ? stack_array(cg, cg->real, s->parts.n * op->channels, "parts") : NULL;
    return true;
}

/* The kernel: a first stage's indices chunk * C + c, chunk by chunk (their rows as in
 * gen_row_partials), or a sum's channels over all the live rows. */
static bool gen_row_sums_cpu(Cg *cg, IrOp *op) {
    CpuSums s;
    if (!cpu_sums_fit(cg, op, &s))
        return false;
    bool partials = op->kind == OP_ROW_PARTIALS;
    LLVMValueRef ch = I(cg, op->channels), rows = live_rows(cg, op);
    LLVMValueRef first = partials ? divs(cg, cg->begin, ch) : I(cg, 0);
    LLVMValueRef last = partials ? add(cg, divs(cg, sub(cg, cg->end, I(cg, 1)), ch), I(cg, 1)) : I(cg, 1);
    Loop chunks = cg_loop_begin(cg, first, last, "chunk");
    LLVMValueRef chunk = cg_loop_index(cg, &chunks), base = partials ? mul(cg, chunk, ch) : I(cg, 0);
    LLVMValueRef lo = smax(cg, sub(cg, cg->begin, base), I(cg, 0)), hi = smin(cg, sub(cg, cg->end, base), ch);
    LLVMValueRef row_lo = partials ? mul(cg, chunk, I(cg, op->chunk_rows)) : I(cg, 0), row_hi = rows;
    if (partials)
        row_hi = smax(cg, smin(cg, add(cg, row_lo, I(cg, op->chunk_rows)), rows), row_lo);
    cpu_sums_start(cg, op, &s, lo, hi);
    cpu_sums_rows(cg, op, &s, lo, hi, row_lo, row_hi);
    Loop l = cg_loop_begin(cg, lo, hi, "channel");
    LLVMValueRef c = cg_loop_index(cg, &l);
    for (int k = 0; k < s.sums; k++) {
        LLVMValueRef sum = load_var(cg, stack_at(cg, s.acc, k, op->channels, c), cg->f64);
        if (partials)
            store_f64(cg, op->out[0], partial_at(cg, op, k, chunk, c), sum, false);
        else
            store_f64(cg, op->out[k], c, sum, op->accumulate);
    }
    cg_loop_end(cg, &l);
    cg_loop_end(cg, &chunks);
    return true;
}

/* Adds sum s of chunk k for channel c to acc[s], for each of `sums`. */
static void add_chunk(Cg *cg, IrOp *op, LLVMValueRef k, LLVMValueRef c, int sums, LLVMValueRef *acc) {
    for (int s = 0; s < sums; s++)
        set_var(cg, acc[s], fadd(cg, load_var(cg, acc[s], cg->f64),
                                 load_f64(cg, partials_of(op), partial_at(cg, op, s, k, c))));
}

/* Channel c's sums over rows into acc: the rows', or the chunks' of a first stage. */
static void sum_rows(Cg *cg, IrOp *op, LLVMValueRef c, LLVMValueRef shift, int sums, LLVMValueRef *acc) {
    if (op->chunk_rows) {
        Loop l = cg_loop_begin(cg, I(cg, 0), I(cg, chunks_of(op)), "chunk");
        add_chunk(cg, op, cg_loop_index(cg, &l), c, sums, acc);
        cg_loop_end(cg, &l);
        return;
    }
    RowTerms t = row_terms_of(cg, op, c, shift, sums);
    Loop l = cg_loop_begin(cg, I(cg, 0), live_rows(cg, op), "row");
    add_rows(cg, op, cg_loop_index(cg, &l), 1, &t, acc);
    cg_loop_end(cg, &l);
}

/* One channel: out[k][c] (+)= sum over rows of expr[k](row * C + c), in f64. */
static void gen_reduce_rows(Cg *cg, IrOp *op, LLVMValueRef c) {
    LLVMValueRef acc[4];
    for (int k = 0; k < op->nout; k++)
        acc[k] = cg_var(cg, cg->f64, F(cg, 0), "acc");
    sum_rows(cg, op, c, NULL, op->nout, acc);
    for (int k = 0; k < op->nout; k++)
        store_f64(cg, op->out[k], c, load_var(cg, acc[k], cg->f64), op->accumulate);
}

/* running = momentum running + (1 - momentum) batch, from the batch's statistics as
 * stored (in the program's type), the variance unbiased; a replica with fewer than two
 * samples leaves its running statistics as they are. In the statistics' kernel: a
 * kernel of its own would be a launch for C values. */
static void move_running(Cg *cg, IrOp *op, LLVMValueRef c) {
    LLVMValueRef n = cg_local_batch(cg);
    If f = cg_if_begin(cg, ge(cg, n, I(cg, 2)));
    LLVMValueRef rows = LLVMBuildSIToFP(cg->b, mul(cg, n, I(cg, op->rows_per_sample)), cg->f64, "");
    LLVMValueRef m = F(cg, op->momentum), rest = F(cg, 1 - op->momentum);
    LLVMValueRef mean = load_f64(cg, op->out[0], c);
    LLVMValueRef var = fmul(cg, load_f64(cg, op->out[1], c), fdiv(cg, rows, fsub(cg, rows, F(cg, 1))));
    store_f64(cg, op->out[2], c, fadd(cg, fmul(cg, m, load_f64(cg, op->out[2], c)), fmul(cg, rest, mean)), false);
    store_f64(cg, op->out[3], c, fadd(cg, fmul(cg, m, load_f64(cg, op->out[3], c)), fmul(cg, rest, var)), false);
    cg_if_end(cg, &f);
}

/* A batch-norm's mean and (biased) variance for channel c from the sums of its rows'
 * differences with the shift and of their squares; both 0 for an empty batch. A
 * variance that rounding took below 0 is 0; a NaN stays, for the non-finite check. */
static void store_moments(Cg *cg, IrOp *op, LLVMValueRef c, LLVMValueRef shift, LLVMValueRef *sums) {
    LLVMValueRef count = LLVMBuildSIToFP(cg->b, live_rows(cg, op), cg->f64, "");
    LLVMValueRef nonzero = fgt(cg, count, F(cg, 0));
    LLVMValueRef offset = fdiv(cg, sums[0], count);
    LLVMValueRef var = fsub(cg, fdiv(cg, sums[1], count), fmul(cg, offset, offset));
    var = sel(cg, LLVMBuildFCmp(cg->b, LLVMRealOLT, var, F(cg, 0), ""), F(cg, 0), var);
    store_f64(cg, op->out[0], c, sel(cg, nonzero, fadd(cg, shift, offset), F(cg, 0)), false);
    store_f64(cg, op->out[1], c, sel(cg, nonzero, var, F(cg, 0)), false);
    move_running(cg, op, c);
}

/* --------------------------------------------------------- block reductions */

/* The block's threads, and its slots of shared memory as f64. */
typedef struct Block {
    LLVMValueRef thread;        /* i64 */
    int64_t threads;
    LLVMValueRef shared;        /* double* */
} Block;

static Block block_of(Cg *cg, const IrOp *op) {
    Block k = {cg_gpu_thread(cg), kernel_launch(op).threads, NULL};
    k.shared = LLVMBuildBitCast(cg->b, cg_gpu_shared(cg), LLVMPointerType(cg->f64, 0), "shared");
    return k;
}

static LLVMValueRef shared_at(Cg *cg, Block *k, LLVMValueRef i) {
    return LLVMBuildInBoundsGEP2(cg->b, cg->f64, k->shared, &i, 1, "");
}

/* Calls visit(row) for the rows of [0, rows) this thread shares: tid, tid + T, ... */
typedef void (*RowVisit)(Cg *cg, IrOp *op, LLVMValueRef row, void *arg);

static void strided_rows(Cg *cg, IrOp *op, Block *k, LLVMValueRef rows, RowVisit visit, void *arg) {
    LLVMValueRef t = I(cg, k->threads);
    Loop l = cg_loop_begin(cg, I(cg, 0), divs(cg, add(cg, rows, I(cg, k->threads - 1)), t), "round");
    LLVMValueRef row = add(cg, mul(cg, cg_loop_index(cg, &l), t), k->thread);
    If f = cg_if_begin(cg, lt(cg, row, rows));
    visit(cg, op, row, arg);
    cg_if_end(cg, &f);
    cg_loop_end(cg, &l);
}

typedef LLVMValueRef (*Combine)(Cg *cg, LLVMValueRef a, LLVMValueRef b);

static LLVMValueRef smaller(Cg *cg, LLVMValueRef a, LLVMValueRef b) {
    return sel(cg, fcmp(cg, LLVMRealOLT, b, a), b, a);
}

/* term(j) for j in [0, n) combined from init on a CPU in eight interleaved lanes (lane
 * i takes j = i, i + 8, ... below n rounded down to eights), the lanes in a fixed
 * tree, then the last n % 8 terms in order: the order is the code's, the same for
 * every target and thread count, and eight independent chains are what a CPU's vector
 * unit adds at once, where one chain in order waits on each addition. */
enum { CPU_LANES = 8 };
typedef LLVMValueRef (*LaneTerm)(Cg *cg, LLVMValueRef j, void *arg);

/* A LaneTerm's argument for element base + j of a tensor (tensor_row_term) */
typedef struct TensorRow {
    Tensor *t;
    LLVMValueRef base;
} TensorRow;

static LLVMValueRef tensor_row_term(Cg *cg, LLVMValueRef j, void *arg) {
    TensorRow *row = arg;
    return load_f64(cg, row->t, add(cg, row->base, j));
}

static LLVMValueRef combine_in_lanes(Cg *cg, LLVMValueRef n, LaneTerm term, void *arg, Combine combine,
                                     LLVMValueRef init) {
    LLVMValueRef lane[CPU_LANES];
    for (int i = 0; i < CPU_LANES; i++)
        lane[i] = cg_var(cg, cg->f64, init, "lane");
    LLVMValueRef full = LLVMBuildAnd(cg->b, n, I(cg, -CPU_LANES), "");
    Loop l = cg_loop_begin_step(cg, I(cg, 0), full, I(cg, CPU_LANES), "j");
    for (int i = 0; i < CPU_LANES; i++) {
        LLVMValueRef sofar = load_var(cg, lane[i], cg->f64);
        set_var(cg, lane[i], combine(cg, sofar, term(cg, add(cg, cg_loop_index(cg, &l), I(cg, i)), arg)));
    }
    cg_loop_end(cg, &l);
    LLVMValueRef v[CPU_LANES];
    for (int i = 0; i < CPU_LANES; i++)
        v[i] = load_var(cg, lane[i], cg->f64);
    for (int width = CPU_LANES / 2; width > 0; width /= 2)
        for (int i = 0; i < width; i++)
            v[i] = combine(cg, v[i], v[i + width]);
    LLVMValueRef acc = cg_var(cg, cg->f64, v[0], "acc");
    Loop tail = cg_loop_begin(cg, full, n, "j");
    LLVMValueRef sofar = load_var(cg, acc, cg->f64);
    set_var(cg, acc, combine(cg, sofar, term(cg, cg_loop_index(cg, &tail), arg)));
    cg_loop_end(cg, &tail);
    return load_var(cg, acc, cg->f64);
}

/* Every thread's part combined, in slot `slot` of shared memory: each stores its part,
 * then log2 T rounds halve the live slots, a barrier after each; every thread gets the
 * result, and a last barrier lets the slot be used again. */
static LLVMValueRef block_combine(Cg *cg, Block *k, LLVMValueRef part, int slot, Combine combine) {
    LLVMValueRef base = I(cg, (int64_t)slot * k->threads);
    LLVMBuildStore(cg->b, part, shared_at(cg, k, add(cg, base, k->thread)));
    cg_gpu_barrier(cg);
    for (int64_t half = k->threads / 2; half > 0; half /= 2) {
        If f = cg_if_begin(cg, lt(cg, k->thread, I(cg, half)));
        LLVMValueRef mine = shared_at(cg, k, add(cg, base, k->thread));
        LLVMValueRef other = shared_at(cg, k, add(cg, base, add(cg, k->thread, I(cg, half))));
        LLVMValueRef own = LLVMBuildLoad2(cg->b, cg->f64, mine, "");
        LLVMBuildStore(cg->b, combine(cg, own, LLVMBuildLoad2(cg->b, cg->f64, other, "")), mine);
        cg_if_end(cg, &f);
        cg_gpu_barrier(cg);
    }
    LLVMValueRef total = LLVMBuildLoad2(cg->b, cg->f64, shared_at(cg, k, base), "total");
    cg_gpu_barrier(cg);
    return total;
}

static LLVMValueRef block_sum(Cg *cg, Block *k, LLVMValueRef part, int slot) {
    return block_combine(cg, k, part, slot, fadd);
}

/* What thread 0 alone does (the stores of a block's results). */
static If first_thread(Cg *cg, Block *k) {
    return cg_if_begin(cg, eq(cg, k->thread, I(cg, 0)));
}

typedef struct RowSums {
    LLVMValueRef acc[4];
    RowTerms terms;
} RowSums;

static void row_visit(Cg *cg, IrOp *op, LLVMValueRef row, void *arg) {
    RowSums *s = arg;
    add_rows(cg, op, row, 1, &s->terms, s->acc);
}

static void chunk_visit(Cg *cg, IrOp *op, LLVMValueRef chunk, void *arg) {
    RowSums *s = arg;
    add_chunk(cg, op, chunk, s->terms.c, s->terms.sums, s->acc);
}

/* Channel c's sums over rows, the block's threads sharing the rows (or the chunks of a
 * first stage): the totals, in every thread. */
static void block_sum_rows(Cg *cg, IrOp *op, Block *k, LLVMValueRef c, LLVMValueRef shift, int sums,
                           LLVMValueRef *total) {
    RowSums s = {.terms = {.c = c, .shift = shift, .sums = sums}};
    for (int o = 0; o < sums; o++)
        s.acc[o] = cg_var(cg, cg->f64, F(cg, 0), "acc");
    if (op->chunk_rows) {
        strided_rows(cg, op, k, I(cg, chunks_of(op)), chunk_visit, &s);
    } else {
        s.terms = row_terms_of(cg, op, c, shift, sums);
        strided_rows(cg, op, k, live_rows(cg, op), row_visit, &s);
    }
    for (int o = 0; o < sums; o++)
        total[o] = block_sum(cg, k, load_var(cg, s.acc[o], cg->f64), o);
}

/* One channel c per block: out[k][c] (+)= the sum over rows of expr[k](row * C + c). */
static void block_reduce_rows(Cg *cg, IrOp *op, LLVMValueRef c) {
    Block k = block_of(cg, op);
    LLVMValueRef total[4];
    block_sum_rows(cg, op, &k, c, NULL, op->nout, total);
    If f = first_thread(cg, &k);
    for (int o = 0; o < op->nout; o++)
        store_f64(cg, op->out[o], c, total[o], op->accumulate);
    cg_if_end(cg, &f);
}

/* One channel c per block: mean and (biased) variance over every row of the live batch. */
static void block_bn_stats(Cg *cg, IrOp *op, LLVMValueRef c) {
    Block k = block_of(cg, op);
    LLVMValueRef shift = bn_shift(cg, op, c), total[2];
    block_sum_rows(cg, op, &k, c, shift, 2, total);
    If f = first_thread(cg, &k);
    store_moments(cg, op, c, shift, total);
    cg_if_end(cg, &f);
}

typedef struct PixelSum {
    LLVMValueRef acc, s, ch;
    int64_t hw, c;
} PixelSum;

static void pixel_visit(Cg *cg, IrOp *op, LLVMValueRef p, void *arg) {
    PixelSum *a = arg;
    LLVMValueRef idx = add(cg, mul(cg, add(cg, mul(cg, a->s, I(cg, a->hw)), p), I(cg, a->c)), a->ch);
    set_var(cg, a->acc, fadd(cg, load_var(cg, a->acc, cg->f64), load_f64(cg, op->in[0], idx)));
}

/* A global average pool's pixels (or tokens) a sample: every position but the channel's. */
static int64_t gap_pixels(const Tensor *x) {
    return x->per_sample / x->shape.dim[x->shape.rank - 1];
}

/* Global average pooling, one output (sample, channel) per block: the mean of its pixels. */
static void block_gap(Cg *cg, IrOp *op, LLVMValueRef i) {
    Block k = block_of(cg, op);
    Tensor *x = op->in[0];
    PixelSum a = {cg_var(cg, cg->f64, F(cg, 0), "acc"), NULL, NULL, gap_pixels(x), x->shape.dim[x->shape.rank - 1]};
    a.s = divs(cg, i, I(cg, a.c));
    a.ch = rems(cg, i, I(cg, a.c));
    strided_rows(cg, op, &k, I(cg, a.hw), pixel_visit, &a);
    LLVMValueRef total = block_sum(cg, &k, load_var(cg, a.acc, cg->f64), 0);
    If f = first_thread(cg, &k);
    store_f64(cg, op->out[0], i, fdiv(cg, total, F(cg, (double)a.hw)), false);
    cg_if_end(cg, &f);
}

typedef struct SampleSum {
    LLVMValueRef acc;
    Tensor *values;
} SampleSum;

/* The values a per-sample vector holds for n samples: one a sample, or one a row of
 * classes, each its share of the sample's. */
static LLVMValueRef value_rows(Cg *cg, const Tensor *values, LLVMValueRef n) {
    return values->per_sample == 1 ? n : mul(cg, n, I(cg, values->per_sample));
}

static void sample_visit(Cg *cg, IrOp *op, LLVMValueRef s, void *arg) {
    (void)op;
    SampleSum *a = arg;
    set_var(cg, a->acc, fadd(cg, load_var(cg, a->acc, cg->f64), load_f64(cg, a->values, s)));
}

/* The loss and metric sums, all in one block: each per-sample vector's sum over the live
 * batch, and the batch's size, added to its pair of the accumulators. */
static void block_accumulate(Cg *cg, IrOp *op, LLVMValueRef i) {
    (void)i;
    Block k = block_of(cg, op);
    LLVMValueRef n = cg_local_batch(cg);
    for (int in = 0; in < op->nin; in++) {
        SampleSum a = {cg_var(cg, cg->f64, F(cg, 0), "sum"), op->in[in]};
        set_var(cg, a.acc, F(cg, 0));
        strided_rows(cg, op, &k, value_rows(cg, op->in[in], n), sample_visit, &a);
        LLVMValueRef total = block_sum(cg, &k, load_var(cg, a.acc, cg->f64), 0);
        If f = first_thread(cg, &k);
        LLVMValueRef at = I(cg, 2 * op->pair[in]);
        store_f64(cg, op->out[0], at, total, true);
        LLVMValueRef count_at = add(cg, at, I(cg, 1));
        store_f64(cg, op->out[0], count_at, LLVMBuildSIToFP(cg->b, n, cg->f64, ""), true);
        cg_if_end(cg, &f);
    }
}

/* ------------------------------------------------------------------ windows */

/* The geometry of a window op: input [H, W, C], output [OH, OW, C or filters]. */
typedef struct Geo {
    int64_t h, w, c, oh, ow;
} Geo;

/* The image of an im2col is its input, of pools their input; their results give OH, OW. */
static Geo window_geometry(IrOp *op) {
    GNode *n = op->layer;
    Tensor *x = NULL;
    switch (op->kind) {
    case OP_IM2COL: case OP_MAXPOOL: case OP_AVGPOOL: case OP_DEPTHWISE: case OP_DEPTHWISE_FILTER: x = op->in[0]; break;
    case OP_COL2IM: case OP_AVGPOOL_BWD: case OP_DEPTHWISE_DATA: x = op->out[0]; break;
    case OP_MAXPOOL_BWD: x = op->in[0]; break;
    default: break;
    }
    Geo g = {x->shape.dim[0], x->shape.dim[1], x->shape.dim[2], n->out.dim[0], n->out.dim[1]};
    return g;
}

/* Input coordinate of a window position: oh * stride - pad_before + k * dilation. */
static LLVMValueRef window_coord(Cg *cg, LLVMValueRef o, LLVMValueRef kpos, int64_t stride, int64_t pad,
                                 int64_t dil) {
    return add(cg, sub(cg, mul(cg, o, I(cg, stride)), I(cg, pad)), mul(cg, kpos, I(cg, dil)));
}

static LLVMValueRef in_range(Cg *cg, LLVMValueRef v, int64_t hi) {
    return and_(cg, ge(cg, v, I(cg, 0)), lt(cg, v, I(cg, hi)));
}

/* One row of the column matrix: output position (s, oh, ow), all of its window's
 * channels, each kernel offset's channels copied as one contiguous run. */
static void gen_im2col(Cg *cg, IrOp *op, LLVMValueRef row) {
    Geo g = window_geometry(op);
    int64_t kw = op->kernel[1], kk = op->kernel[0] * kw * g.c;
    LLVMValueRef s = divs(cg, row, I(cg, g.oh * g.ow)), rest = rems(cg, row, I(cg, g.oh * g.ow));
    LLVMValueRef oh = divs(cg, rest, I(cg, g.ow)), ow = rems(cg, rest, I(cg, g.ow));
    LLVMValueRef base = mul(cg, row, I(cg, kk));
    Loop lh = cg_loop_begin(cg, I(cg, 0), I(cg, op->kernel[0]), "kh");
    LLVMValueRef kh = cg_loop_index(cg, &lh);
    LLVMValueRef ih = window_coord(cg, oh, kh, op->stride[0], op->pad[0], op->dilation[0]);
    Loop lw = cg_loop_begin(cg, I(cg, 0), I(cg, kw), "kw");
    LLVMValueRef kwi = cg_loop_index(cg, &lw);
    LLVMValueRef iw = window_coord(cg, ow, kwi, op->stride[1], op->pad[2], op->dilation[1]);
    LLVMValueRef inside = and_(cg, in_range(cg, ih, g.h), in_range(cg, iw, g.w));
    LLVMValueRef dst = add(cg, base, mul(cg, add(cg, mul(cg, kh, I(cg, kw)), kwi), I(cg, g.c)));
    LLVMValueRef src = mul(cg, add(cg, mul(cg, add(cg, mul(cg, s, I(cg, g.h)), ih), I(cg, g.w)), iw), I(cg, g.c));
    src = sel(cg, inside, src, I(cg, 0));
    Loop lc = cg_loop_begin(cg, I(cg, 0), I(cg, g.c), "c");
    LLVMValueRef c = cg_loop_index(cg, &lc);
    LLVMValueRef v = cg_load(cg, op->in[0], add(cg, src, c));
    LLVMValueRef to = add(cg, dst, c);
    cg_store(cg, op->out[0], to, sel(cg, inside, v, LLVMConstNull(LLVMTypeOf(v))));
    cg_loop_end(cg, &lc);
    cg_loop_end(cg, &lw);
    cg_loop_end(cg, &lh);
}

/* Filters between the program's layout, HWIO ([R, S, C, K]), and a convolution
 * library's, KRSC: one index per element read, in the order it is stored, which the
 * index writes to its place in the other layout. Both are (r, s, c) runs with k
 * outermost in KRSC and innermost in HWIO, so an element's (r, s, c) position is the
 * same number in both. A GPU's warp so reads 32 neighbouring elements at once and
 * scatters its writes, which the cache gathers up; reading in the written order would
 * take a 32-byte segment for each element. */
static void gen_filters_to_krsc(Cg *cg, IrOp *op, LLVMValueRef i) {
    int64_t k = op->in[0]->shape.dim[3], rsc = op->in[0]->elems / k;
    LLVMValueRef filter = rems(cg, i, I(cg, k)), at = divs(cg, i, I(cg, k));
    LLVMValueRef to = add(cg, mul(cg, filter, I(cg, rsc)), at);
    cg_store(cg, op->out[0], to, cg_load(cg, op->in[0], i));
}

static void gen_filters_to_hwio(Cg *cg, IrOp *op, LLVMValueRef i) {
    int64_t k = op->out[0]->shape.dim[3], rsc = op->out[0]->elems / k;
    LLVMValueRef filter = divs(cg, i, I(cg, rsc)), at = rems(cg, i, I(cg, rsc));
    LLVMValueRef to = add(cg, mul(cg, at, I(cg, k)), filter), v = cg_load(cg, op->in[0], i);
    if (op->accumulate)
        v = fadd(cg, cg_load(cg, op->out[0], to), v);
    cg_store(cg, op->out[0], to, v);
}

/* Calls visit for every output window position (oh, ow) whose window covers input
 * (ih, iw) through kernel offset (kh, kw): oh = (ih + pad - kh dil) / stride exactly. */
typedef void (*WindowVisit)(Cg *cg, IrOp *op, LLVMValueRef oh, LLVMValueRef ow, LLVMValueRef kh,
                            LLVMValueRef kw, void *arg);

static void covering_windows(Cg *cg, IrOp *op, Geo g, LLVMValueRef ih, LLVMValueRef iw, WindowVisit visit,
                             void *arg) {
    Loop lh = cg_loop_begin(cg, I(cg, 0), I(cg, op->kernel[0]), "kh");
    LLVMValueRef kh = cg_loop_index(cg, &lh);
    LLVMValueRef nh = sub(cg, add(cg, ih, I(cg, op->pad[0])), mul(cg, kh, I(cg, op->dilation[0])));
    Loop lw = cg_loop_begin(cg, I(cg, 0), I(cg, op->kernel[1]), "kw");
    LLVMValueRef kw = cg_loop_index(cg, &lw);
    LLVMValueRef nw = sub(cg, add(cg, iw, I(cg, op->pad[2])), mul(cg, kw, I(cg, op->dilation[1])));
    LLVMValueRef oh = divs(cg, nh, I(cg, op->stride[0])), ow = divs(cg, nw, I(cg, op->stride[1]));
    LLVMValueRef ok = and_(cg, and_(cg, ge(cg, nh, I(cg, 0)), eq(cg, rems(cg, nh, I(cg, op->stride[0])), I(cg, 0))),
                           and_(cg, ge(cg, nw, I(cg, 0)), eq(cg, rems(cg, nw, I(cg, op->stride[1])), I(cg, 0))));
    ok = and_(cg, ok, and_(cg, lt(cg, oh, I(cg, g.oh)), lt(cg, ow, I(cg, g.ow))));
    If f = cg_if_begin(cg, ok);
    visit(cg, op, oh, ow, kh, kw, arg);
    cg_if_end(cg, &f);
    cg_loop_end(cg, &lw);
    cg_loop_end(cg, &lh);
}

/* The pixel (s, h, w) of an [n, H, W, C] image indexed by pixel = (s H + h) W + w. */
static void pixel_coords(Cg *cg, LLVMValueRef pixel, int64_t h, int64_t w, LLVMValueRef *s, LLVMValueRef *ph,
                         LLVMValueRef *pw) {
    *pw = rems(cg, pixel, I(cg, w));
    LLVMValueRef p = divs(cg, pixel, I(cg, w));
    *ph = rems(cg, p, I(cg, h));
    *s = divs(cg, p, I(cg, h));
}

/* Window kernels run one index per pixel with the channels as their inner loop: the
 * channels are contiguous, so that loop is the one the vectorizer widens. */
typedef struct Channels {
    Loop loop;
    LLVMValueRef c;
} Channels;

static Channels channels_begin(Cg *cg, int64_t count) {
    Channels ch = {cg_loop_begin(cg, I(cg, 0), I(cg, count), "c"), NULL};
    ch.c = cg_loop_index(cg, &ch.loop);
    return ch;
}

static void channels_end(Cg *cg, Channels *ch) {
    cg_loop_end(cg, &ch->loop);
}

/* A gradient pixel that only gets sums added starts from zero, unless it accumulates. */
static void zero_pixel_unless_accumulating(Cg *cg, IrOp *op, LLVMValueRef pixel, int64_t channels) {
    if (op->accumulate)
        return;
    Channels ch = channels_begin(cg, channels);
    store_f64(cg, op->out[0], add(cg, mul(cg, pixel, I(cg, channels)), ch.c), F(cg, 0), false);
    channels_end(cg, &ch);
}

/* An input pixel (s, ih, iw) whose gradient the windows covering it add up to. */
typedef struct PoolBwd {
    LLVMValueRef s, pixel;
    Geo g;
} PoolBwd;

/* The pixel's channels zeroed (unless they accumulate), then visit for each window
 * covering it. */
static void gradient_from_windows(Cg *cg, IrOp *op, LLVMValueRef pixel, WindowVisit visit) {
    Geo g = window_geometry(op);
    PoolBwd a = {NULL, pixel, g};
    LLVMValueRef ih, iw;
    pixel_coords(cg, pixel, g.h, g.w, &a.s, &ih, &iw);
    zero_pixel_unless_accumulating(cg, op, pixel, g.c);
    covering_windows(cg, op, g, ih, iw, visit, &a);
}

/* the window (oh, ow) covers this pixel through offset (kh, kw): add its channels */
static void col2im_visit(Cg *cg, IrOp *op, LLVMValueRef oh, LLVMValueRef ow, LLVMValueRef kh,
                         LLVMValueRef kw, void *arg) {
    PoolBwd *a = arg;
    int64_t kk = op->kernel[0] * op->kernel[1] * a->g.c;
    LLVMValueRef row = add(cg, mul(cg, add(cg, mul(cg, a->s, I(cg, a->g.oh)), oh), I(cg, a->g.ow)), ow);
    LLVMValueRef col = mul(cg, add(cg, mul(cg, kh, I(cg, op->kernel[1])), kw), I(cg, a->g.c));
    LLVMValueRef from = add(cg, mul(cg, row, I(cg, kk)), col);
    LLVMValueRef to = mul(cg, a->pixel, I(cg, a->g.c));
    Channels ch = channels_begin(cg, a->g.c);
    LLVMValueRef at = add(cg, to, ch.c);
    store_f64(cg, op->out[0], at, load_f64(cg, op->in[0], add(cg, from, ch.c)), true);
    channels_end(cg, &ch);
}

/* One pixel (s, ih, iw) of the image: every window covering it adds its channels. */
static void gen_col2im(Cg *cg, IrOp *op, LLVMValueRef pixel) {
    gradient_from_windows(cg, op, pixel, col2im_visit);
}

/* The flat index of channel c of pixel (s, h, w) of an [n, H, W, C] image. */
static LLVMValueRef image_index(Cg *cg, Geo g, LLVMValueRef s, LLVMValueRef h, LLVMValueRef w, LLVMValueRef c) {
    return add(cg, mul(cg, add(cg, mul(cg, add(cg, mul(cg, s, I(cg, g.h)), h), I(cg, g.w)), w), I(cg, g.c)), c);
}

/* Calls visit with the flat input index of every element of window (oh, ow) of
 * sample s, channel c that lies inside the image (padding has none), and its tap,
 * kh * kernel width + kw. */
typedef void (*ElementVisit)(Cg *cg, IrOp *op, LLVMValueRef idx, LLVMValueRef tap, void *arg);

static void window_elements(Cg *cg, IrOp *op, Geo g, LLVMValueRef s, LLVMValueRef oh, LLVMValueRef ow,
                            LLVMValueRef c, ElementVisit visit, void *arg) {
    bool padded = op->pad[0] || op->pad[1] || op->pad[2] || op->pad[3];
    Loop lh = cg_loop_begin(cg, I(cg, 0), I(cg, op->kernel[0]), "wh");
    LLVMValueRef kh = cg_loop_index(cg, &lh);
    LLVMValueRef ih = window_coord(cg, oh, kh, op->stride[0], op->pad[0], op->dilation[0]);
    Loop lw = cg_loop_begin(cg, I(cg, 0), I(cg, op->kernel[1]), "ww");
    LLVMValueRef kw = cg_loop_index(cg, &lw);
    LLVMValueRef iw = window_coord(cg, ow, kw, op->stride[1], op->pad[2], op->dilation[1]);
    If f;
    if (padded) /* without padding every window lies inside the image */
        f = cg_if_begin(cg, and_(cg, in_range(cg, ih, g.h), in_range(cg, iw, g.w)));
    LLVMValueRef pixel = image_index(cg, g, s, ih, iw, c);
    visit(cg, op, pixel, add(cg, mul(cg, kh, I(cg, op->kernel[1])), kw), arg);
    if (padded)
        cg_if_end(cg, &f);
    cg_loop_end(cg, &lw);
    cg_loop_end(cg, &lh);
}

typedef struct Argmax {
    LLVMValueRef best, where;
} Argmax;

static void argmax_visit(Cg *cg, IrOp *op, LLVMValueRef idx, LLVMValueRef tap, void *arg) {
    Argmax *a = arg;
    (void)tap;
    LLVMValueRef v = load_f64(cg, op->in[0], idx);
    LLVMValueRef cur = load_var(cg, a->best, cg->f64);
    LLVMValueRef first = lt(cg, load_var(cg, a->where, cg->i64), I(cg, 0));
    LLVMValueRef cur_nan = fcmp(cg, LLVMRealUNO, cur, cur);
    LLVMValueRef better = LLVMBuildOr(cg->b, first, and_(cg, LLVMBuildNot(cg->b, cur_nan, ""),
                                                          fcmp(cg, LLVMRealUGT, v, cur)), "");
    set_var(cg, a->best, sel(cg, better, v, cur));
    set_var(cg, a->where, sel(cg, better, idx, load_var(cg, a->where, cg->i64)));
}

/* The first largest element of window (oh, ow) of sample s, channel c, as its flat
 * input index; a NaN counts as largest. */
static LLVMValueRef window_argmax(Cg *cg, IrOp *op, Geo g, LLVMValueRef s, LLVMValueRef oh, LLVMValueRef ow,
                                  LLVMValueRef c, LLVMValueRef *best_value) {
    LLVMValueRef best = cg_var(cg, cg->f64, F(cg, -INFINITY), "best");
    Argmax a = {best, cg_var(cg, cg->i64, I(cg, -1), "where")};
    window_elements(cg, op, g, s, oh, ow, c, argmax_visit, &a);
    if (best_value)
        *best_value = load_var(cg, a.best, cg->f64);
    return load_var(cg, a.where, cg->i64);
}

/* One output pixel (s, oh, ow), all channels. */
static void gen_maxpool(Cg *cg, IrOp *op, LLVMValueRef pixel) {
    Geo g = window_geometry(op);
    LLVMValueRef s, oh, ow, best;
    pixel_coords(cg, pixel, g.oh, g.ow, &s, &oh, &ow);
    Channels ch = channels_begin(cg, g.c);
    window_argmax(cg, op, g, s, oh, ow, ch.c, &best);
    store_f64(cg, op->out[0], add(cg, mul(cg, pixel, I(cg, g.c)), ch.c), best, false);
    channels_end(cg, &ch);
}

/* the flat index of channel c of output pixel (s, oh, ow) */
static LLVMValueRef output_index(Cg *cg, PoolBwd *a, LLVMValueRef oh, LLVMValueRef ow, LLVMValueRef c) {
    LLVMValueRef o = add(cg, mul(cg, add(cg, mul(cg, a->s, I(cg, a->g.oh)), oh), I(cg, a->g.ow)), ow);
    return add(cg, mul(cg, o, I(cg, a->g.c)), c);
}

/* the window's gradient goes to its largest element */
static void maxpool_bwd_visit(Cg *cg, IrOp *op, LLVMValueRef oh, LLVMValueRef ow, LLVMValueRef kh,
                              LLVMValueRef kw, void *arg) {
    PoolBwd *a = arg;
    (void)kh;
    (void)kw;
    Channels ch = channels_begin(cg, a->g.c);
    LLVMValueRef here = add(cg, mul(cg, a->pixel, I(cg, a->g.c)), ch.c);
    LLVMValueRef where = window_argmax(cg, op, a->g, a->s, oh, ow, ch.c, NULL);
    LLVMValueRef grad = load_f64(cg, op->in[1], output_index(cg, a, oh, ow, ch.c));
    store_f64(cg, op->out[0], here, sel(cg, eq(cg, where, here), grad, F(cg, 0)), true);
    channels_end(cg, &ch);
}

/* A window's largest element and its gradient, spread over the window's elements. */
typedef struct Spread {
    LLVMValueRef where, grad;
} Spread;

static void spread_visit(Cg *cg, IrOp *op, LLVMValueRef idx, LLVMValueRef tap, void *arg) {
    Spread *a = arg;
    (void)tap;
    LLVMValueRef v = sel(cg, eq(cg, a->where, idx), a->grad, F(cg, 0));
    /* 0 + v: what adding v to a pixel zeroed first gives (-0 becomes +0), the bits of
     * the pixel-by-pixel way */
    store_f64(cg, op->out[0], idx, op->accumulate ? v : fadd(cg, F(cg, 0), v), op->accumulate);
}

/* One window (s, oh, ow) of a pooling whose windows tile its input (ir_windows_tile):
 * its largest element found once, not once for each of its pixels, and every pixel
 * of the window written. */
static void gen_maxpool_bwd_by_window(Cg *cg, IrOp *op, Geo g, LLVMValueRef window) {
    PoolBwd a = {NULL, window, g};
    LLVMValueRef oh, ow;
    pixel_coords(cg, window, g.oh, g.ow, &a.s, &oh, &ow);
    Channels ch = channels_begin(cg, g.c);
    LLVMValueRef where = window_argmax(cg, op, g, a.s, oh, ow, ch.c, NULL);
    Spread s = {where, load_f64(cg, op->in[1], output_index(cg, &a, oh, ow, ch.c))};
    window_elements(cg, op, g, a.s, oh, ow, ch.c, spread_visit, &s);
    channels_end(cg, &ch);
}

static void gen_maxpool_bwd(Cg *cg, IrOp *op, LLVMValueRef pixel) {
    Geo g = window_geometry(op);
    if (ir_windows_tile(op, g.h, g.w, g.oh, g.ow)) {
        gen_maxpool_bwd_by_window(cg, op, g, pixel);
        return;
    }
    PoolBwd a = {NULL, pixel, g};
    LLVMValueRef ih, iw;
    pixel_coords(cg, pixel, g.h, g.w, &a.s, &ih, &iw);
    zero_pixel_unless_accumulating(cg, op, pixel, g.c);
    if (op->stride[0] >= op->kernel[0] && op->stride[1] >= op->kernel[1]) {
        /* windows do not overlap: at most one covers this pixel */
        LLVMValueRef nh = add(cg, ih, I(cg, op->pad[0])), nw = add(cg, iw, I(cg, op->pad[2]));
        LLVMValueRef oh = divs(cg, nh, I(cg, op->stride[0])), ow = divs(cg, nw, I(cg, op->stride[1]));
        LLVMValueRef ok = and_(cg, lt(cg, sub(cg, nh, mul(cg, oh, I(cg, op->stride[0]))), I(cg, op->kernel[0])),
                               lt(cg, sub(cg, nw, mul(cg, ow, I(cg, op->stride[1]))), I(cg, op->kernel[1])));
        ok = and_(cg, ok, and_(cg, lt(cg, oh, I(cg, g.oh)), lt(cg, ow, I(cg, g.ow))));
        If f = cg_if_begin(cg, ok);
        maxpool_bwd_visit(cg, op, oh, ow, NULL, NULL, &a);
        cg_if_end(cg, &f);
    } else {
        covering_windows(cg, op, g, ih, iw, maxpool_bwd_visit, &a);
    }
}

/* The number of input positions (not padding) in window (oh, ow). */
static LLVMValueRef window_count(Cg *cg, IrOp *op, Geo g, LLVMValueRef oh, LLVMValueRef ow) {
    LLVMValueRef counts[2];
    LLVMValueRef o[2] = {oh, ow};
    int64_t size[2] = {g.h, g.w}, pad[2] = {op->pad[0], op->pad[2]};
    for (int a = 0; a < 2; a++) {
        LLVMValueRef lo = sub(cg, mul(cg, o[a], I(cg, op->stride[a])), I(cg, pad[a]));
        LLVMValueRef hi = add(cg, lo, I(cg, op->kernel[a]));
        lo = smax(cg, lo, I(cg, 0));
        hi = smin(cg, I(cg, size[a]), hi);
        counts[a] = sub(cg, hi, lo);
    }
    return LLVMBuildSIToFP(cg->b, mul(cg, counts[0], counts[1]), cg->f64, "");
}

static void sum_visit(Cg *cg, IrOp *op, LLVMValueRef idx, LLVMValueRef tap, void *arg) {
    LLVMValueRef acc = arg;
    (void)tap;
    set_var(cg, acc, fadd(cg, load_var(cg, acc, cg->f64), load_f64(cg, op->in[0], idx)));
}

/* One output pixel (s, oh, ow), all channels. */
static void gen_avgpool(Cg *cg, IrOp *op, LLVMValueRef pixel) {
    Geo g = window_geometry(op);
    LLVMValueRef s, oh, ow;
    pixel_coords(cg, pixel, g.oh, g.ow, &s, &oh, &ow);
    LLVMValueRef count = window_count(cg, op, g, oh, ow);
    Channels ch = channels_begin(cg, g.c);
    LLVMValueRef acc = cg_var(cg, cg->f64, F(cg, 0), "acc");
    window_elements(cg, op, g, s, oh, ow, ch.c, sum_visit, acc);
    LLVMValueRef to = add(cg, mul(cg, pixel, I(cg, g.c)), ch.c);
    store_f64(cg, op->out[0], to, fdiv(cg, load_var(cg, acc, cg->f64), count), false);
    channels_end(cg, &ch);
}

/* the window's gradient is shared equally by its elements */
static void avgpool_bwd_visit(Cg *cg, IrOp *op, LLVMValueRef oh, LLVMValueRef ow, LLVMValueRef kh,
                              LLVMValueRef kw, void *arg) {
    PoolBwd *a = arg;
    (void)kh;
    (void)kw;
    LLVMValueRef count = window_count(cg, op, a->g, oh, ow);
    Channels ch = channels_begin(cg, a->g.c);
    LLVMValueRef v = fdiv(cg, load_f64(cg, op->in[0], output_index(cg, a, oh, ow, ch.c)), count);
    store_f64(cg, op->out[0], add(cg, mul(cg, a->pixel, I(cg, a->g.c)), ch.c), v, true);
    channels_end(cg, &ch);
}

static void gen_avgpool_bwd(Cg *cg, IrOp *op, LLVMValueRef pixel) {
    gradient_from_windows(cg, op, pixel, avgpool_bwd_visit);
}

/* global average pool: i over [n, C] */
static void gen_gap(Cg *cg, IrOp *op, LLVMValueRef i) {
    Tensor *x = op->in[0];
    int64_t hw = gap_pixels(x), c = x->shape.dim[x->shape.rank - 1];
    LLVMValueRef s = divs(cg, i, I(cg, c)), ch = rems(cg, i, I(cg, c));
    LLVMValueRef acc = cg_var(cg, cg->f64, F(cg, 0), "acc");
    Loop l = cg_loop_begin(cg, I(cg, 0), I(cg, hw), "p");
    LLVMValueRef idx = add(cg, mul(cg, add(cg, mul(cg, s, I(cg, hw)), cg_loop_index(cg, &l)), I(cg, c)), ch);
    set_var(cg, acc, fadd(cg, load_var(cg, acc, cg->f64), load_f64(cg, x, idx)));
    cg_loop_end(cg, &l);
    store_f64(cg, op->out[0], i, fdiv(cg, load_var(cg, acc, cg->f64), F(cg, (double)hw)), false);
}

static void gen_gap_bwd(Cg *cg, IrOp *op, LLVMValueRef i) {
    Tensor *dx = op->out[0];
    int64_t hw = gap_pixels(dx), c = dx->shape.dim[dx->shape.rank - 1];
    LLVMValueRef s = divs(cg, i, I(cg, hw * c)), ch = rems(cg, i, I(cg, c));
    LLVMValueRef v = fdiv(cg, load_f64(cg, op->in[0], add(cg, mul(cg, s, I(cg, c)), ch)), F(cg, (double)hw));
    store_f64(cg, dx, i, v, op->accumulate);
}

/* --------------------------------------------------------------- depthwise */

/* Channel ch of the image feeds outputs o = ch m .. ch m + m - 1 (m: op->channels), each
 * with filter w[tap][o] ([kh, kw, c, m] flat: tap * c m + o). */

typedef struct Depthwise {
    LLVMValueRef acc, o;
    int64_t outputs;             /* c m */
} Depthwise;

static void depthwise_visit(Cg *cg, IrOp *op, LLVMValueRef idx, LLVMValueRef tap, void *arg) {
    Depthwise *a = arg;
    LLVMValueRef w = load_f64(cg, op->in[1], add(cg, mul(cg, tap, I(cg, a->outputs)), a->o));
    set_var(cg, a->acc, fadd(cg, load_var(cg, a->acc, cg->f64), fmul(cg, load_f64(cg, op->in[0], idx), w)));
}

/* A CPU's pixel: the window's taps in turn, each adding into the c m sums (f64, on the
 * stack) a run of contiguous channels, which vectorises; the same sums in the same
 * order as a GPU's thread makes output by output. The sums a kernel keeps on the
 * stack are at most STACK_SUMS (64 KB, well within any thread's stack); past that,
 * the way of a GPU's thread. */
enum { STACK_SUMS = 8192 };
typedef struct TapSums {
    LLVMValueRef sums;
    int64_t outputs;
} TapSums;

static LLVMValueRef sum_at(Cg *cg, LLVMValueRef sums, LLVMValueRef i) {
    return LLVMBuildInBoundsGEP2(cg->b, cg->f64, sums, &i, 1, "");
}

static void tap_visit(Cg *cg, IrOp *op, LLVMValueRef idx, LLVMValueRef tap, void *arg) {
    TapSums *a = arg;
    int64_t m = op->channels;
    Channels ch = channels_begin(cg, a->outputs);
    LLVMValueRef x = load_f64(cg, op->in[0], add(cg, idx, m == 1 ? ch.c : divs(cg, ch.c, I(cg, m))));
    LLVMValueRef w = load_f64(cg, op->in[1], add(cg, mul(cg, tap, I(cg, a->outputs)), ch.c));
    LLVMValueRef at = sum_at(cg, a->sums, ch.c);
    LLVMBuildStore(cg->b, fadd(cg, LLVMBuildLoad2(cg->b, cg->f64, at, ""), fmul(cg, x, w)), at);
    channels_end(cg, &ch);
}

static void depthwise_pixel_cpu(Cg *cg, IrOp *op, Geo g, LLVMValueRef pixel, LLVMValueRef s, LLVMValueRef oh,
                                LLVMValueRef ow) {
    TapSums a = {NULL, g.c * op->channels};
    a.sums = LLVMBuildBitCast(cg->b, cg_var(cg, LLVMArrayType(cg->f64, (unsigned)a.outputs), NULL, "sums"),
                              LLVMPointerType(cg->f64, 0), "");
    Channels zero = channels_begin(cg, a.outputs);
    LLVMBuildStore(cg->b, F(cg, 0), sum_at(cg, a.sums, zero.c));
    channels_end(cg, &zero);
    window_elements(cg, op, g, s, oh, ow, I(cg, 0), tap_visit, &a);
    Channels ch = channels_begin(cg, a.outputs);
    LLVMValueRef to = add(cg, mul(cg, pixel, I(cg, a.outputs)), ch.c);
    store_f64(cg, op->out[0], to, LLVMBuildLoad2(cg->b, cg->f64, sum_at(cg, a.sums, ch.c), ""), false);
    channels_end(cg, &ch);
}

/* One output pixel (s, oh, ow), all c m outputs: each sums its window of its channel. */
static void gen_depthwise(Cg *cg, IrOp *op, LLVMValueRef pixel) {
    Geo g = window_geometry(op);
    int64_t m = op->channels, f = g.c * m;
    LLVMValueRef s, oh, ow;
    pixel_coords(cg, pixel, g.oh, g.ow, &s, &oh, &ow);
    if (cg->target != TARGET_GPU && f <= STACK_SUMS) {
        depthwise_pixel_cpu(cg, op, g, pixel, s, oh, ow);
        return;
    }
    Channels ch = channels_begin(cg, f);
    Depthwise a = {cg_var(cg, cg->f64, F(cg, 0), "acc"), ch.c, f};
    window_elements(cg, op, g, s, oh, ow, m == 1 ? ch.c : divs(cg, ch.c, I(cg, m)), depthwise_visit, &a);
    LLVMValueRef to = add(cg, mul(cg, pixel, I(cg, f)), ch.c);
    store_f64(cg, op->out[0], to, load_var(cg, a.acc, cg->f64), false);
    channels_end(cg, &ch);
}

/* the window (oh, ow) covers this pixel through tap (kh, kw): each channel gets its m
 * outputs' gradients through their filters' weights there */
static void depthwise_data_visit(Cg *cg, IrOp *op, LLVMValueRef oh, LLVMValueRef ow, LLVMValueRef kh,
                                 LLVMValueRef kw, void *arg) {
    PoolBwd *a = arg;
    int64_t m = op->channels, f = a->g.c * m;
    LLVMValueRef tap = add(cg, mul(cg, kh, I(cg, op->kernel[1])), kw);
    LLVMValueRef out = mul(cg, add(cg, mul(cg, add(cg, mul(cg, a->s, I(cg, a->g.oh)), oh), I(cg, a->g.ow)), ow),
                           I(cg, f));
    Channels ch = channels_begin(cg, a->g.c);
    LLVMValueRef acc = cg_var(cg, cg->f64, F(cg, 0), "acc");
    Loop lj = cg_loop_begin(cg, I(cg, 0), I(cg, m), "j");
    LLVMValueRef o = add(cg, mul(cg, ch.c, I(cg, m)), cg_loop_index(cg, &lj));
    LLVMValueRef term = fmul(cg, load_f64(cg, op->in[0], add(cg, out, o)),
                             load_f64(cg, op->in[1], add(cg, mul(cg, tap, I(cg, f)), o)));
    set_var(cg, acc, fadd(cg, load_var(cg, acc, cg->f64), term));
    cg_loop_end(cg, &lj);
    LLVMValueRef to = add(cg, mul(cg, a->pixel, I(cg, a->g.c)), ch.c);
    store_f64(cg, op->out[0], to, load_var(cg, acc, cg->f64), true);
    channels_end(cg, &ch);
}

/* One input pixel (s, ih, iw), all channels: every window covering it adds. */
static void gen_depthwise_data(Cg *cg, IrOp *op, LLVMValueRef pixel) {
    gradient_from_windows(cg, op, pixel, depthwise_data_visit);
}

/* Filter element e = tap * c m + o: the sum over every output pixel (row) of the live
 * batch of x at its window's tap, channel o / m, times dy there. */
typedef struct FilterSum {
    Geo g;
    int64_t outputs;
    LLVMValueRef o, ch, kh, kw, acc;
} FilterSum;

static FilterSum filter_sum_of(Cg *cg, IrOp *op, LLVMValueRef e) {
    FilterSum a = {.g = window_geometry(op)};
    a.outputs = a.g.c * op->channels;
    LLVMValueRef tap = divs(cg, e, I(cg, a.outputs));
    a.o = rems(cg, e, I(cg, a.outputs));
    a.ch = divs(cg, a.o, I(cg, op->channels));
    a.kh = divs(cg, tap, I(cg, op->kernel[1]));
    a.kw = rems(cg, tap, I(cg, op->kernel[1]));
    a.acc = cg_var(cg, cg->f64, F(cg, 0), "acc");
    return a;
}

static void filter_row_visit(Cg *cg, IrOp *op, LLVMValueRef row, void *arg) {
    FilterSum *a = arg;
    LLVMValueRef s, oh, ow;
    pixel_coords(cg, row, a->g.oh, a->g.ow, &s, &oh, &ow);
    LLVMValueRef ih = window_coord(cg, oh, a->kh, op->stride[0], op->pad[0], op->dilation[0]);
    LLVMValueRef iw = window_coord(cg, ow, a->kw, op->stride[1], op->pad[2], op->dilation[1]);
    If inside = cg_if_begin(cg, and_(cg, in_range(cg, ih, a->g.h), in_range(cg, iw, a->g.w)));
    LLVMValueRef term = fmul(cg, load_f64(cg, op->in[0], image_index(cg, a->g, s, ih, iw, a->ch)),
                             load_f64(cg, op->in[1], add(cg, mul(cg, row, I(cg, a->outputs)), a->o)));
    set_var(cg, a->acc, fadd(cg, load_var(cg, a->acc, cg->f64), term));
    cg_if_end(cg, &inside);
}

/* On the CPU an index of a filter element sweeping x and dy alone would read them
 * once for each of the taps x c m elements. Instead, of each run of taps x B indices,
 * the first sums every tap of B neighbouring outputs (B the largest of 16, 8, 4, 2 and
 * 1 that divides c m) in one sweep, the rest doing nothing: B x taps sums in f64 on
 * the stack, each over the rows in order, as a GPU's block sums them apart. The runs
 * lie evenly over the index range, so the pool's threads share them. A kernel of
 * more than STACK_SUMS taps sums each element apart, by the rows in the same order. */
static void gen_depthwise_filter(Cg *cg, IrOp *op, LLVMValueRef e) {
    Geo g = window_geometry(op);
    int64_t m = op->channels, f = g.c * m, kw = op->kernel[1], taps = op->kernel[0] * kw, width = 16;
    while (f % width || (width > 1 && taps * width > STACK_SUMS))
        width /= 2;
    if (taps > STACK_SUMS) {
        FilterSum a = filter_sum_of(cg, op, e);
        Loop rows = cg_loop_begin(cg, I(cg, 0), live_rows(cg, op), "row");
        filter_row_visit(cg, op, cg_loop_index(cg, &rows), &a);
        cg_loop_end(cg, &rows);
        store_f64(cg, op->out[0], e, load_var(cg, a.acc, cg->f64), op->accumulate);
        return;
    }
    If leads = cg_if_begin(cg, eq(cg, rems(cg, e, I(cg, taps * width)), I(cg, 0)));
    LLVMValueRef o0 = mul(cg, divs(cg, e, I(cg, taps * width)), I(cg, width));
    LLVMValueRef sums = LLVMBuildBitCast(cg->b, cg_var(cg, LLVMArrayType(cg->f64, (unsigned)(taps * width)), NULL, "sums"),
                                         LLVMPointerType(cg->f64, 0), "");
    Loop zero = cg_loop_begin(cg, I(cg, 0), I(cg, taps * width), "t");
    LLVMValueRef z = cg_loop_index(cg, &zero);
    LLVMBuildStore(cg->b, F(cg, 0), LLVMBuildInBoundsGEP2(cg->b, cg->f64, sums, &z, 1, ""));
    cg_loop_end(cg, &zero);
    Loop ls = cg_loop_begin(cg, I(cg, 0), cg_local_batch(cg), "s");
    LLVMValueRef s = cg_loop_index(cg, &ls);
    Loop loh = cg_loop_begin(cg, I(cg, 0), I(cg, g.oh), "oh");
    LLVMValueRef oh = cg_loop_index(cg, &loh);
    Loop lkh = cg_loop_begin(cg, I(cg, 0), I(cg, op->kernel[0]), "kh");
    LLVMValueRef kh = cg_loop_index(cg, &lkh);
    LLVMValueRef ih = window_coord(cg, oh, kh, op->stride[0], op->pad[0], op->dilation[0]);
    If row_inside = cg_if_begin(cg, in_range(cg, ih, g.h));
    Loop low = cg_loop_begin(cg, I(cg, 0), I(cg, g.ow), "ow");
    LLVMValueRef ow = cg_loop_index(cg, &low);
    LLVMValueRef dy = add(cg, mul(cg, add(cg, mul(cg, add(cg, mul(cg, s, I(cg, g.oh)), oh), I(cg, g.ow)), ow), I(cg, f)), o0);
    Loop lkw = cg_loop_begin(cg, I(cg, 0), I(cg, kw), "kw");
    LLVMValueRef kwi = cg_loop_index(cg, &lkw);
    LLVMValueRef iw = window_coord(cg, ow, kwi, op->stride[1], op->pad[2], op->dilation[1]);
    If inside = cg_if_begin(cg, in_range(cg, iw, g.w));
    LLVMValueRef x = image_index(cg, g, s, ih, iw, I(cg, 0));
    LLVMValueRef tap = add(cg, mul(cg, kh, I(cg, kw)), kwi);
    Loop lj = cg_loop_begin(cg, I(cg, 0), I(cg, width), "j");
    LLVMValueRef j = cg_loop_index(cg, &lj), o = add(cg, o0, j);
    LLVMValueRef slot = add(cg, mul(cg, tap, I(cg, width)), j);
    LLVMValueRef at = LLVMBuildInBoundsGEP2(cg->b, cg->f64, sums, &slot, 1, "");
    LLVMValueRef term = fmul(cg, load_f64(cg, op->in[0], add(cg, x, m == 1 ? o : divs(cg, o, I(cg, m)))),
                             load_f64(cg, op->in[1], add(cg, dy, j)));
    LLVMBuildStore(cg->b, fadd(cg, LLVMBuildLoad2(cg->b, cg->f64, at, ""), term), at);
    cg_loop_end(cg, &lj);
    cg_if_end(cg, &inside);
    cg_loop_end(cg, &lkw);
    cg_loop_end(cg, &low);
    cg_if_end(cg, &row_inside);
    cg_loop_end(cg, &lkh);
    cg_loop_end(cg, &loh);
    cg_loop_end(cg, &ls);
    Loop lt = cg_loop_begin(cg, I(cg, 0), I(cg, taps * width), "t");
    LLVMValueRef t = cg_loop_index(cg, &lt);
    LLVMValueRef to = add(cg, add(cg, mul(cg, divs(cg, t, I(cg, width)), I(cg, f)), o0), rems(cg, t, I(cg, width)));
    store_f64(cg, op->out[0], to, LLVMBuildLoad2(cg->b, cg->f64, LLVMBuildInBoundsGEP2(cg->b, cg->f64, sums, &t, 1, ""), ""),
              op->accumulate);
    cg_loop_end(cg, &lt);
    cg_if_end(cg, &leads);
}

/* One filter element per block on a GPU, the rows shared among its threads. */
static void block_depthwise_filter(Cg *cg, IrOp *op, LLVMValueRef e) {
    Block k = block_of(cg, op);
    FilterSum a = filter_sum_of(cg, op, e);
    strided_rows(cg, op, &k, live_rows(cg, op), filter_row_visit, &a);
    LLVMValueRef total = block_sum(cg, &k, load_var(cg, a.acc, cg->f64), 0);
    If f = first_thread(cg, &k);
    store_f64(cg, op->out[0], e, total, op->accumulate);
    cg_if_end(cg, &f);
}

/* ----------------------------------------------------------- normalisation */

/* One channel c: mean and (biased) variance over every row of the live batch. */
static void gen_bn_stats(Cg *cg, IrOp *op, LLVMValueRef c) {
    LLVMValueRef shift = bn_shift(cg, op, c);
    LLVMValueRef acc[2];
    acc[0] = cg_var(cg, cg->f64, F(cg, 0), "sum");
    acc[1] = cg_var(cg, cg->f64, F(cg, 0), "squares");
    sum_rows(cg, op, c, shift, 2, acc);
    LLVMValueRef total[2];
    for (int i = 0; i < 2; i++)
        total[i] = load_var(cg, acc[i], cg->f64);
    store_moments(cg, op, c, shift, total);
}

/* ------------------------------------------------------------------- rows */

/* row r of [outer, len, inner] (softmax's axis, layernorm's last): elements base + j * inner */
static LLVMValueRef row_base(Cg *cg, IrOp *op, LLVMValueRef r) {
    LLVMValueRef o = divs(cg, r, I(cg, op->axis_inner)), in = rems(cg, r, I(cg, op->axis_inner));
    return add(cg, mul(cg, o, I(cg, op->axis_len * op->axis_inner)), in);
}

static LLVMValueRef element(Cg *cg, IrOp *op, LLVMValueRef base, LLVMValueRef j) {
    return add(cg, base, mul(cg, j, I(cg, op->axis_inner)));
}

/* --------------------------------------------------------------- layernorm */

/* A row of layernorm (or softmax) is walked by one thread on the CPU (k NULL: its
 * elements in order, its sums in lanes) or, on a GPU, by a block (k: thread t takes
 * elements t, t + T, ...; its sums are added across the block in a fixed order), so a
 * warp reads consecutive elements. */

typedef LLVMValueRef (*RowTerm)(Cg *cg, IrOp *op, LLVMValueRef idx, void *arg);
typedef void (*RowStore)(Cg *cg, IrOp *op, LLVMValueRef idx, void *arg);

typedef struct RowWalk {
    LLVMValueRef base;           /* the row's first element */
    RowTerm term;                /* summed (or combined) ... */
    LLVMValueRef acc;
    RowStore store;              /* ... or called on each element */
    void *arg;
    Combine combine;             /* NULL: the sum */
} RowWalk;

static void walk_element(Cg *cg, IrOp *op, LLVMValueRef j, void *arg) {
    RowWalk *w = arg;
    LLVMValueRef idx = element(cg, op, w->base, j);
    if (w->store) {
        w->store(cg, op, idx, w->arg);
        return;
    }
    LLVMValueRef sofar = load_var(cg, w->acc, cg->f64);
    set_var(cg, w->acc, (w->combine ? w->combine : fadd)(cg, sofar, w->term(cg, op, idx, w->arg)));
}

typedef struct RowLane {
    IrOp *op;
    RowWalk *walk;
} RowLane;

static LLVMValueRef row_lane_term(Cg *cg, LLVMValueRef j, void *arg) {
    RowLane *r = arg;
    return r->walk->term(cg, r->op, element(cg, r->op, r->walk->base, j), r->walk->arg);
}

static void walk_row(Cg *cg, IrOp *op, Block *k, RowWalk *w) {
    if (k) {
        strided_rows(cg, op, k, I(cg, op->axis_len), walk_element, w);
        return;
    }
    if (!w->store) {
        RowLane r = {op, w};
        Combine combine = w->combine ? w->combine : fadd;
        LLVMValueRef init = load_var(cg, w->acc, cg->f64);
        set_var(cg, w->acc, combine_in_lanes(cg, I(cg, op->axis_len), row_lane_term, &r, combine, init));
        return;
    }
    Loop l = cg_loop_begin(cg, I(cg, 0), I(cg, op->axis_len), "j");
    walk_element(cg, op, cg_loop_index(cg, &l), w);
    cg_loop_end(cg, &l);
}

/* term(each element's index) over the row combined from init, in f64 (the elements in
 * order on a CPU; each thread's share, then the shares in a fixed order, on a GPU); in
 * every thread of a block. */
static LLVMValueRef row_combined(Cg *cg, IrOp *op, Block *k, LLVMValueRef base, RowTerm term, void *arg,
                                 Combine combine, double init) {
    RowWalk w = {base, term, cg_var(cg, cg->f64, F(cg, init), "acc"), NULL, arg, combine};
    walk_row(cg, op, k, &w);
    LLVMValueRef part = load_var(cg, w.acc, cg->f64);
    return k ? block_combine(cg, k, part, 0, combine) : part;
}

/* The sum over the row of term(each element's index). */
static LLVMValueRef row_total(Cg *cg, IrOp *op, Block *k, LLVMValueRef base, RowTerm term, void *arg) {
    return row_combined(cg, op, k, base, term, arg, fadd, 0);
}

static void each_element(Cg *cg, IrOp *op, Block *k, LLVMValueRef base, RowStore store, void *arg) {
    RowWalk w = {base, NULL, NULL, store, arg, NULL};
    walk_row(cg, op, k, &w);
}

static LLVMValueRef x_term(Cg *cg, IrOp *op, LLVMValueRef idx, void *arg) {
    (void)arg;
    return load_f64(cg, op->in[0], idx);
}

/* (x - mean)^2: the variance from the mean, as PyTorch sums it (not E[x^2] - mean^2) */
static LLVMValueRef centred_square(Cg *cg, IrOp *op, LLVMValueRef idx, void *arg) {
    LLVMValueRef d = fsub(cg, load_f64(cg, op->in[0], idx), *(LLVMValueRef *)arg);
    return fmul(cg, d, d);
}

typedef struct RowMoments {
    LLVMValueRef mean, rstd;     /* rstd: 1 / sqrt(biased variance + epsilon) */
    LLVMValueRef mean_g, mean_gn; /* backward: the means of g and of g n */
} RowMoments;

static RowMoments row_moments(Cg *cg, IrOp *op, Block *k, LLVMValueRef base) {
    LLVMValueRef len = F(cg, (double)op->axis_len);
    RowMoments m = {0};
    m.mean = fdiv(cg, row_total(cg, op, k, base, x_term, NULL), len);
    LLVMValueRef var = fdiv(cg, row_total(cg, op, k, base, centred_square, &m.mean), len);
    m.rstd = fdiv(cg, F(cg, 1), cg_sqrt(cg, fadd(cg, var, F(cg, op->epsilon))));
    return m;
}

static LLVMValueRef normalised(Cg *cg, IrOp *op, LLVMValueRef idx, const RowMoments *m) {
    return fmul(cg, fsub(cg, load_f64(cg, op->in[0], idx), m->mean), m->rstd);
}

static void store_normalised(Cg *cg, IrOp *op, LLVMValueRef idx, void *arg) {
    store_f64(cg, op->out[0], idx, normalised(cg, op, idx, arg), false);
}

static void layernorm_row(Cg *cg, IrOp *op, Block *k, LLVMValueRef r) {
    LLVMValueRef base = row_base(cg, op, r);
    RowMoments m = row_moments(cg, op, k, base);
    each_element(cg, op, k, base, store_normalised, &m);
}

static LLVMValueRef dy_term(Cg *cg, IrOp *op, LLVMValueRef idx, void *arg) {
    (void)arg;
    return load_f64(cg, op->in[1], idx);
}

static LLVMValueRef dy_normalised(Cg *cg, IrOp *op, LLVMValueRef idx, void *arg) {
    return fmul(cg, load_f64(cg, op->in[1], idx), normalised(cg, op, idx, arg));
}

/* with n = (x - mean) rstd and g its gradient: dx = rstd (g - mean(g) - n mean(g n)) */
static void store_input_grad(Cg *cg, IrOp *op, LLVMValueRef idx, void *arg) {
    RowMoments *m = arg;
    LLVMValueRef g = fsub(cg, fsub(cg, load_f64(cg, op->in[1], idx), m->mean_g),
                          fmul(cg, normalised(cg, op, idx, m), m->mean_gn));
    store_f64(cg, op->out[0], idx, fmul(cg, m->rstd, g), op->accumulate);
}

static void layernorm_bwd_row(Cg *cg, IrOp *op, Block *k, LLVMValueRef r) {
    LLVMValueRef base = row_base(cg, op, r);
    RowMoments m = row_moments(cg, op, k, base);
    LLVMValueRef len = F(cg, (double)op->axis_len);
    m.mean_g = fdiv(cg, row_total(cg, op, k, base, dy_term, NULL), len);
    m.mean_gn = fdiv(cg, row_total(cg, op, k, base, dy_normalised, &m), len);
    each_element(cg, op, k, base, store_input_grad, &m);
}


/* ----------------------------------------------------------------- softmax */

/* A softmax row walks as a layernorm row: one CPU thread, or a GPU block whose warps
 * read consecutive elements (attention's rows of keys are many and long). */

static LLVMValueRef larger(Cg *cg, LLVMValueRef a, LLVMValueRef b) {
    return sel(cg, fcmp(cg, LLVMRealUGT, b, a), b, a);
}

typedef struct SoftmaxRow {
    LLVMValueRef base, last;     /* causal: the last element not left out */
    LLVMValueRef max, scale;
} SoftmaxRow;

/* A causal row's elements past its query's place: the keys after the query */
static LLVMValueRef left_out(Cg *cg, IrOp *op, LLVMValueRef idx, const SoftmaxRow *row) {
    (void)op;
    return LLVMBuildICmp(cg->b, LLVMIntSGT, idx, row->last, "");
}

static LLVMValueRef masked_x(Cg *cg, IrOp *op, LLVMValueRef idx, void *arg) {
    LLVMValueRef x = load_f64(cg, op->in[0], idx);
    return op->causal ? sel(cg, left_out(cg, op, idx, arg), F(cg, -INFINITY), x) : x;
}

/* exp(z[at] - max) in the program's precision, as PyTorch's f32 softmax (eight f32
 * lanes where AVX2 holds four doubles) */
static LLVMValueRef shifted_exp(Cg *cg, Tensor *z, LLVMValueRef at, LLVMValueRef max) {
    return cg_to_f64(cg, cg_exp(cg, cg_from_f64(cg, fsub(cg, load_f64(cg, z, at), max), cg->real)));
}

/* shifted_exp, 0 left out */
static LLVMValueRef softmax_exp(Cg *cg, IrOp *op, LLVMValueRef idx, void *arg) {
    SoftmaxRow *row = arg;
    LLVMValueRef e = shifted_exp(cg, op->in[0], idx, row->max);
    return op->causal ? sel(cg, left_out(cg, op, idx, row), F(cg, 0), e) : e;
}

static void store_exp(Cg *cg, IrOp *op, LLVMValueRef idx, void *row) {
    store_f64(cg, op->out[0], idx, softmax_exp(cg, op, idx, row), false);
}

static LLVMValueRef out_term(Cg *cg, IrOp *op, LLVMValueRef idx, void *arg) {
    (void)arg;
    return load_f64(cg, op->out[0], idx);
}

static void store_scaled(Cg *cg, IrOp *op, LLVMValueRef idx, void *arg) {
    SoftmaxRow *row = arg;
    store_f64(cg, op->out[0], idx, fmul(cg, out_term(cg, op, idx, NULL), row->scale), false);
}

/* A causal row on a CPU walks only its live keys, the first live = r % len + 1 (half
 * the row on average), and writes zeros after them. */
static void causal_softmax_row_cpu(Cg *cg, IrOp *op, LLVMValueRef r, LLVMValueRef base) {
    TensorRow x = {op->in[0], base}, y = {op->out[0], base};
    LLVMValueRef live = add(cg, rems(cg, r, I(cg, op->axis_len)), I(cg, 1));
    LLVMValueRef max = combine_in_lanes(cg, live, tensor_row_term, &x, larger, F(cg, -INFINITY));
    Loop e = cg_loop_begin(cg, I(cg, 0), live, "j");
    LLVMValueRef at = add(cg, base, cg_loop_index(cg, &e));
    store_f64(cg, op->out[0], at, shifted_exp(cg, op->in[0], at, max), false);
    cg_loop_end(cg, &e);
    LLVMValueRef scale = fdiv(cg, F(cg, 1), combine_in_lanes(cg, live, tensor_row_term, &y, fadd, F(cg, 0)));
    Loop s = cg_loop_begin(cg, I(cg, 0), live, "j");
    at = add(cg, base, cg_loop_index(cg, &s));
    store_f64(cg, op->out[0], at, fmul(cg, load_f64(cg, op->out[0], at), scale), false);
    cg_loop_end(cg, &s);
    Loop z = cg_loop_begin(cg, live, I(cg, op->axis_len), "j");
    store_f64(cg, op->out[0], add(cg, base, cg_loop_index(cg, &z)), F(cg, 0), false);
    cg_loop_end(cg, &z);
}

/* The row's max; each exp made once and kept in the output, in a walk of its own (no
 * sum in it, so a CPU's compiler vectorises the exps; a GPU thread reads back its own
 * elements); their sum in f64; the output scaled by 1 / sum. The output is f32 or f64
 * (precision.c keeps a softmax's f32 under bf16), so an exp is rounded once before
 * its scaling. A causal row (attention's, inner 1) leaves out the keys after its
 * query, r % len: they count as -infinity, so their weights are 0 (and so their
 * gradients). */
static void softmax_row(Cg *cg, IrOp *op, Block *k, LLVMValueRef r) {
    SoftmaxRow row = {.base = row_base(cg, op, r)};
    if (op->causal && !k) {
        causal_softmax_row_cpu(cg, op, r, row.base);
        return;
    }
    if (op->causal)
        row.last = add(cg, row.base, rems(cg, r, I(cg, op->axis_len)));
    row.max = row_combined(cg, op, k, row.base, masked_x, &row, larger, -INFINITY);
    each_element(cg, op, k, row.base, store_exp, &row);
    row.scale = fdiv(cg, F(cg, 1), row_total(cg, op, k, row.base, out_term, NULL));
    each_element(cg, op, k, row.base, store_scaled, &row);
}

static LLVMValueRef y_dy(Cg *cg, IrOp *op, LLVMValueRef idx, void *arg) {
    (void)arg;
    return fmul(cg, load_f64(cg, op->in[0], idx), load_f64(cg, op->in[1], idx));
}

static void store_softmax_grad(Cg *cg, IrOp *op, LLVMValueRef idx, void *dot) {
    LLVMValueRef g = fsub(cg, load_f64(cg, op->in[1], idx), *(LLVMValueRef *)dot);
    store_f64(cg, op->out[0], idx, fmul(cg, load_f64(cg, op->in[0], idx), g), op->accumulate);
}

/* y = softmax(x): dx = y (dy - sum(dy y)) */
static void softmax_bwd_row(Cg *cg, IrOp *op, Block *k, LLVMValueRef r) {
    LLVMValueRef base = row_base(cg, op, r);
    LLVMValueRef dot = row_total(cg, op, k, base, y_dy, NULL);
    each_element(cg, op, k, base, store_softmax_grad, &dot);
}

/* Row r of a layernorm or softmax, forward or backward: a CPU thread's (k NULL) or a
 * GPU block's. */
static void row_op(Cg *cg, IrOp *op, Block *k, LLVMValueRef r) {
    switch (op->kind) {
    case OP_LAYERNORM: layernorm_row(cg, op, k, r); break;
    case OP_LAYERNORM_BWD: layernorm_bwd_row(cg, op, k, r); break;
    case OP_SOFTMAX: softmax_row(cg, op, k, r); break;
    default: softmax_bwd_row(cg, op, k, r); break;
    }
}

static void gen_row(Cg *cg, IrOp *op, LLVMValueRef r) {
    row_op(cg, op, NULL, r);
}

static void block_row(Cg *cg, IrOp *op, LLVMValueRef r) {
    Block k = block_of(cg, op);
    row_op(cg, op, &k, r);
}

/* ------------------------------------------------------------------- concat */

/* i over the part [outer, width, inner]: its place in the whole [outer, len, inner] */
static LLVMValueRef concat_index(Cg *cg, IrOp *op, LLVMValueRef i) {
    int64_t part = op->concat_width * op->axis_inner;
    LLVMValueRef o = divs(cg, i, I(cg, part)), rest = rems(cg, i, I(cg, part));
    LLVMValueRef j = divs(cg, rest, I(cg, op->axis_inner)), in = rems(cg, rest, I(cg, op->axis_inner));
    return add(cg, add(cg, mul(cg, o, I(cg, op->axis_len * op->axis_inner)),
                       mul(cg, add(cg, j, I(cg, op->concat_offset)), I(cg, op->axis_inner))), in);
}

static void gen_concat(Cg *cg, IrOp *op, LLVMValueRef i) {
    LLVMValueRef to = concat_index(cg, op, i);
    cg_store(cg, op->out[0], to, cg_load(cg, op->in[0], i));
}

static void gen_split(Cg *cg, IrOp *op, LLVMValueRef i) {
    store_f64(cg, op->out[0], i, load_f64(cg, op->in[0], concat_index(cg, op, i)), op->accumulate);
}

/* ------------------------------------------------------------------- losses */

static bool is_loss(Cg *cg, int64_t loss) {
    return cg->ir->config->loss == loss;
}

/* The class of sample s: its label, or the first largest target for one-hot rows. */
static LLVMValueRef target_class(Cg *cg, IrOp *op, LLVMValueRef s, int64_t k) {
    Tensor *label = op->in[1];
    if (label->dtype == DT_I32)
        return LLVMBuildSExt(cg->b, cg_load(cg, label, s), cg->i64, "");
    LLVMValueRef best = cg_var(cg, cg->f64, F(cg, -INFINITY), "tbest");
    LLVMValueRef where = cg_var(cg, cg->i64, I(cg, 0), "twhere");
    Loop l = cg_loop_begin(cg, I(cg, 0), I(cg, k), "j");
    LLVMValueRef j = cg_loop_index(cg, &l);
    LLVMValueRef v = load_f64(cg, label, add(cg, mul(cg, s, I(cg, k)), j));
    LLVMValueRef better = fgt(cg, v, load_var(cg, best, cg->f64));
    set_var(cg, best, sel(cg, better, v, load_var(cg, best, cg->f64)));
    set_var(cg, where, sel(cg, better, j, load_var(cg, where, cg->i64)));
    cg_loop_end(cg, &l);
    return load_var(cg, where, cg->i64);
}

/* The row's largest value and log-sum-exp. With exps (the row's gradient, written
 * next) the exponentials are stored there first, a loop without a sum that
 * vectorises, and summed from there (in lanes, as the max): one exponential a value.
 * Each exponential is shifted_exp, as the softmax's; the sum is in f64. */
typedef struct LseRow {
    Tensor *z, *exps;
    LLVMValueRef row, max;
} LseRow;

static LLVMValueRef exp_term(Cg *cg, LLVMValueRef j, void *arg) {
    LseRow *r = arg;
    LLVMValueRef at = add(cg, r->row, j);
    return r->exps ? load_f64(cg, r->exps, at) : shifted_exp(cg, r->z, at, r->max);
}

static void row_lse(Cg *cg, Tensor *z, LLVMValueRef row, int64_t k, Tensor *exps, LLVMValueRef *max,
                    LLVMValueRef *lse, LLVMValueRef *sum_of_exps) {
    TensorRow logits = {z, row};
    LseRow r = {z, exps, row, NULL};
    r.max = *max = combine_in_lanes(cg, I(cg, k), tensor_row_term, &logits, larger, F(cg, -INFINITY));
    if (exps) {
        Loop le = cg_loop_begin(cg, I(cg, 0), I(cg, k), "j");
        LLVMValueRef at = add(cg, row, cg_loop_index(cg, &le));
        store_f64(cg, exps, at, shifted_exp(cg, z, at, *max), false);
        cg_loop_end(cg, &le);
    }
    *sum_of_exps = combine_in_lanes(cg, I(cg, k), exp_term, &r, fadd, F(cg, 0));
    *lse = fadd(cg, cg_log(cg, *sum_of_exps), *max);
}

static LLVMValueRef row_sum(Cg *cg, Tensor *z, LLVMValueRef row, int64_t k) {
    LLVMValueRef sum = cg_var(cg, cg->f64, F(cg, 0), "rsum");
    Loop l = cg_loop_begin(cg, I(cg, 0), I(cg, k), "j");
    set_var(cg, sum, fadd(cg, load_var(cg, sum, cg->f64), load_f64(cg, z, add(cg, row, cg_loop_index(cg, &l)))));
    cg_loop_end(cg, &l);
    return load_var(cg, sum, cg->f64);
}

static LLVMValueRef clip(Cg *cg, LLVMValueRef v, double lo, double hi) {
    v = sel(cg, LLVMBuildFCmp(cg->b, LLVMRealOLT, v, F(cg, lo), ""), F(cg, lo), v);
    return sel(cg, fgt(cg, v, F(cg, hi)), F(cg, hi), v);
}

/* The smoothed target of one-hot row element j: t (1 - eps) + eps / k. */
static LLVMValueRef smoothed(Cg *cg, IrOp *op, LLVMValueRef t, int64_t k) {
    if (op->smoothing == 0)
        return t;
    return fadd(cg, fmul(cg, t, F(cg, 1 - op->smoothing)), F(cg, op->smoothing / (double)k));
}

static const double clip_eps = 1e-7; /* Keras' epsilon for probabilities */

/* A row's share of its sample's value: 1 / the rows of classes a sample holds (a
 * language model's positions), whose mean is the sample's loss or metric. */
static LLVMValueRef row_share(Cg *cg, IrOp *op, LLVMValueRef v) {
    int64_t rows = op->out[0]->per_sample;
    return rows == 1 ? v : fmul(cg, v, F(cg, 1.0 / (double)rows));
}

/* Row s of the output (a sample, or one of its positions): its share of the sample's
 * loss, and if training the row's gradient, over the live global batch (the loss is
 * the sum over samples divided by it, S10). */
static void gen_loss(Cg *cg, IrOp *op, LLVMValueRef s) {
    Tensor *z = op->in[0], *label = op->in[1], *dz = op->nout > 1 ? op->out[1] : NULL;
    int64_t k = op->channels;
    LLVMValueRef row = mul(cg, s, I(cg, k));
    LLVMValueRef global = LLVMBuildSIToFP(cg->b, cg_scalar_i64(cg, DDP_S_GLOBAL_BATCH), cg->f64, "");
    LLVMValueRef inv_n = row_share(cg, op, fdiv(cg, F(cg, 1), global));
    LLVMValueRef loss;
    if (is_loss(cg, DDP_LOSS_SPARSE_CATEGORICAL) || is_loss(cg, DDP_LOSS_CATEGORICAL)) {
        bool sparse = label->dtype == DT_I32;
        LLVMValueRef y = sparse ? target_class(cg, op, s, k) : NULL;
        LLVMValueRef valid = sparse ? in_range(cg, y, k) : LLVMConstInt(cg->i1, 1, 0);
        LLVMValueRef ysafe = sparse ? sel(cg, valid, y, I(cg, 0)) : NULL;
        LLVMValueRef total_t = F(cg, 1); /* the sum of the targets: 1 for a class index */
        if (!sparse) {
            LLVMValueRef tt = cg_var(cg, cg->f64, F(cg, 0), "tt");
            Loop l = cg_loop_begin(cg, I(cg, 0), I(cg, k), "j");
            LLVMValueRef t = smoothed(cg, op, load_f64(cg, label, add(cg, row, cg_loop_index(cg, &l))), k);
            set_var(cg, tt, fadd(cg, load_var(cg, tt, cg->f64), t));
            cg_loop_end(cg, &l);
            total_t = load_var(cg, tt, cg->f64);
        }
        LLVMValueRef lacc = cg_var(cg, cg->f64, F(cg, 0), "loss");
        if (op->from_logits) {
            LLVMValueRef mx, lse, sum;
            row_lse(cg, z, row, k, dz, &mx, &lse, &sum);
            LLVMValueRef inv_sum = fdiv(cg, F(cg, 1), sum);
            /* the loss, a sum in order (for a class index, its one term: lse - z_y);
             * then the gradient, a loop of its own without a sum, which vectorises */
            bool one_term = sparse && op->smoothing == 0;
            if (one_term)
                set_var(cg, lacc, fsub(cg, lse, load_f64(cg, z, add(cg, row, ysafe))));
            for (int pass = one_term; pass < 1 + (dz != NULL); pass++) {
                Loop l = cg_loop_begin(cg, I(cg, 0), I(cg, k), "j");
                LLVMValueRef j = cg_loop_index(cg, &l);
                LLVMValueRef zj = load_f64(cg, z, add(cg, row, j));
                LLVMValueRef t = sparse ? LLVMBuildUIToFP(cg->b, eq(cg, j, ysafe), cg->f64, "")
                                        : smoothed(cg, op, load_f64(cg, label, add(cg, row, j)), k);
                if (sparse && op->smoothing != 0)
                    t = smoothed(cg, op, t, k);
                if (pass == 0) {
                    set_var(cg, lacc, fsub(cg, load_var(cg, lacc, cg->f64), fmul(cg, t, fsub(cg, zj, lse))));
                } else {
                    LLVMValueRef p = fmul(cg, load_f64(cg, dz, add(cg, row, j)), inv_sum);
                    LLVMValueRef to = add(cg, row, j);
                    store_f64(cg, dz, to, fmul(cg, fsub(cg, fmul(cg, p, total_t), t), inv_n), false);
                }
                cg_loop_end(cg, &l);
            }
        } else {
            LLVMValueRef total = row_sum(cg, z, row, k);
            Loop l = cg_loop_begin(cg, I(cg, 0), I(cg, k), "j");
            LLVMValueRef j = cg_loop_index(cg, &l);
            LLVMValueRef zj = load_f64(cg, z, add(cg, row, j));
            LLVMValueRef t = sparse ? LLVMBuildUIToFP(cg->b, eq(cg, j, ysafe), cg->f64, "")
                                    : load_f64(cg, label, add(cg, row, j));
            t = smoothed(cg, op, t, k);
            LLVMValueRef p = fdiv(cg, zj, total);
            LLVMValueRef pc = clip(cg, p, clip_eps, 1 - clip_eps);
            set_var(cg, lacc, fsub(cg, load_var(cg, lacc, cg->f64), fmul(cg, t, cg_log(cg, pc))));
            if (dz) {
                /* d/dz_j of -sum t_i log(z_i / S): -t_j / z_j + T / S, where unclipped */
                LLVMValueRef g = fadd(cg, LLVMBuildFNeg(cg->b, fdiv(cg, t, zj), ""), fdiv(cg, total_t, total));
                LLVMValueRef unclipped = LLVMBuildFCmp(cg->b, LLVMRealOEQ, p, pc, "");
                g = sel(cg, LLVMBuildOr(cg->b, unclipped, LLVMBuildFCmp(cg->b, LLVMRealOEQ, t, F(cg, 0), ""), ""), g,
                        fdiv(cg, total_t, total));
                LLVMValueRef to = add(cg, row, j);
                store_f64(cg, dz, to, fmul(cg, g, inv_n), false);
            }
            cg_loop_end(cg, &l);
        }
        loss = sel(cg, valid, load_var(cg, lacc, cg->f64), F(cg, NAN));
    } else {
        /* binary cross-entropy and mean squared error: the mean over the row's elements */
        LLVMValueRef lacc = cg_var(cg, cg->f64, F(cg, 0), "loss");
        LLVMValueRef inv_k = F(cg, 1.0 / (double)k);
        Loop l = cg_loop_begin(cg, I(cg, 0), I(cg, k), "j");
        LLVMValueRef idx = add(cg, row, cg_loop_index(cg, &l));
        LLVMValueRef zj = load_f64(cg, z, idx), t = load_f64(cg, label, idx);
        LLVMValueRef le, g;
        if (is_loss(cg, DDP_LOSS_MSE)) {
            LLVMValueRef d = fsub(cg, zj, t);
            le = fmul(cg, d, d);
            g = fmul(cg, F(cg, 2), d);
        } else if (op->from_logits) {
            LLVMValueRef az = sel(cg, fgt(cg, zj, F(cg, 0)), zj, LLVMBuildFNeg(cg->b, zj, ""));
            LLVMValueRef relu = sel(cg, fgt(cg, zj, F(cg, 0)), zj, F(cg, 0));
            le = fadd(cg, fsub(cg, relu, fmul(cg, zj, t)),
                      cg_log(cg, fadd(cg, F(cg, 1), cg_exp(cg, LLVMBuildFNeg(cg->b, az, "")))));
            LLVMValueRef sig = fdiv(cg, F(cg, 1), fadd(cg, F(cg, 1), cg_exp(cg, LLVMBuildFNeg(cg->b, zj, ""))));
            g = fsub(cg, sig, t);
        } else {
            LLVMValueRef p = clip(cg, zj, clip_eps, 1 - clip_eps);
            le = LLVMBuildFNeg(cg->b, fadd(cg, fmul(cg, t, cg_log(cg, p)),
                                           fmul(cg, fsub(cg, F(cg, 1), t), cg_log(cg, fsub(cg, F(cg, 1), p)))), "");
            g = fdiv(cg, fsub(cg, p, t), fmul(cg, p, fsub(cg, F(cg, 1), p)));
            g = sel(cg, LLVMBuildFCmp(cg->b, LLVMRealOEQ, p, zj, ""), g, F(cg, 0));
        }
        set_var(cg, lacc, fadd(cg, load_var(cg, lacc, cg->f64), le));
        if (dz)
            store_f64(cg, dz, idx, fmul(cg, fmul(cg, g, inv_k), inv_n), false);
        cg_loop_end(cg, &l);
        loss = fmul(cg, load_var(cg, lacc, cg->f64), inv_k);
    }
    store_f64(cg, op->out[0], s, row_share(cg, op, loss), false);
}

/* ------------------------------------------------------------------ metrics */

/* The first largest of a row (ties to the lowest index). */
static LLVMValueRef row_argmax(Cg *cg, Tensor *z, LLVMValueRef row, int64_t k) {
    LLVMValueRef best = cg_var(cg, cg->f64, F(cg, -INFINITY), "abest");
    LLVMValueRef where = cg_var(cg, cg->i64, I(cg, 0), "awhere");
    Loop l = cg_loop_begin(cg, I(cg, 0), I(cg, k), "j");
    LLVMValueRef j = cg_loop_index(cg, &l);
    LLVMValueRef v = load_f64(cg, z, add(cg, row, j));
    LLVMValueRef better = fgt(cg, v, load_var(cg, best, cg->f64));
    set_var(cg, best, sel(cg, better, v, load_var(cg, best, cg->f64)));
    set_var(cg, where, sel(cg, better, j, load_var(cg, where, cg->i64)));
    cg_loop_end(cg, &l);
    return load_var(cg, where, cg->i64);
}

/* Row s's value of the metric (a sample's, or a position's), its share stored. */
static void gen_metric(Cg *cg, IrOp *op, LLVMValueRef s) {
    Tensor *z = op->in[0], *label = op->in[1];
    int64_t k = op->channels;
    LLVMValueRef row = mul(cg, s, I(cg, k));
    LLVMValueRef value;
    if (op->code == DDP_METRIC_MAE || (op->code == DDP_METRIC_ACCURACY && is_loss(cg, DDP_LOSS_BINARY))) {
        bool mae = op->code == DDP_METRIC_MAE;
        LLVMValueRef acc = cg_var(cg, cg->f64, F(cg, 0), "acc");
        Loop l = cg_loop_begin(cg, I(cg, 0), I(cg, k), "j");
        LLVMValueRef idx = add(cg, row, cg_loop_index(cg, &l));
        LLVMValueRef zj = load_f64(cg, z, idx), t = load_f64(cg, label, idx);
        LLVMValueRef v;
        if (mae) {
            LLVMValueRef d = fsub(cg, zj, t);
            v = sel(cg, fgt(cg, d, F(cg, 0)), d, LLVMBuildFNeg(cg->b, d, ""));
        } else {
            LLVMValueRef predicted = fgt(cg, zj, F(cg, op->from_logits ? 0 : 0.5));
            LLVMValueRef actual = fgt(cg, t, F(cg, 0.5));
            v = LLVMBuildUIToFP(cg->b, LLVMBuildICmp(cg->b, LLVMIntEQ, predicted, actual, ""), cg->f64, "");
        }
        set_var(cg, acc, fadd(cg, load_var(cg, acc, cg->f64), v));
        cg_loop_end(cg, &l);
        value = fdiv(cg, load_var(cg, acc, cg->f64), F(cg, (double)k));
    } else if (op->code == DDP_METRIC_ACCURACY) {
        LLVMValueRef y = target_class(cg, op, s, k);
        value = LLVMBuildUIToFP(cg->b, eq(cg, row_argmax(cg, z, row, k), y), cg->f64, "");
    } else { /* top_k_accuracy: the label's rank, ties to the lower index */
        LLVMValueRef y = target_class(cg, op, s, k);
        LLVMValueRef valid = in_range(cg, y, k);
        LLVMValueRef zy = load_f64(cg, z, add(cg, row, sel(cg, valid, y, I(cg, 0))));
        LLVMValueRef rank = cg_var(cg, cg->i64, I(cg, 0), "rank");
        Loop l = cg_loop_begin(cg, I(cg, 0), I(cg, k), "j");
        LLVMValueRef j = cg_loop_index(cg, &l);
        LLVMValueRef zj = load_f64(cg, z, add(cg, row, j));
        LLVMValueRef above = fgt(cg, zj, zy);
        LLVMValueRef tied = and_(cg, LLVMBuildFCmp(cg->b, LLVMRealOEQ, zj, zy, ""), lt(cg, j, y));
        LLVMValueRef ahead = LLVMBuildOr(cg->b, above, tied, "");
        set_var(cg, rank, add(cg, load_var(cg, rank, cg->i64), LLVMBuildZExt(cg->b, ahead, cg->i64, "")));
        cg_loop_end(cg, &l);
        value = LLVMBuildUIToFP(cg->b, and_(cg, valid, lt(cg, load_var(cg, rank, cg->i64), I(cg, op->k_top))),
                                cg->f64, "");
    }
    store_f64(cg, op->out[0], s, row_share(cg, op, value), false);
}

/* Adds each per-sample vector's sum over the live batch, and the batch's size, to its
 * pair of the accumulators. Runs as one call: the order of the sum is fixed. */
static void gen_accumulate(Cg *cg, IrOp *op, LLVMValueRef i) {
    (void)i;
    LLVMValueRef n = cg_local_batch(cg);
    for (int k = 0; k < op->nin; k++) {
        LLVMValueRef sum = cg_var(cg, cg->f64, F(cg, 0), "sum");
        Loop l = cg_loop_begin(cg, I(cg, 0), value_rows(cg, op->in[k], n), "s");
        set_var(cg, sum, fadd(cg, load_var(cg, sum, cg->f64), load_f64(cg, op->in[k], cg_loop_index(cg, &l))));
        cg_loop_end(cg, &l);
        LLVMValueRef at = I(cg, 2 * op->pair[k]);
        store_f64(cg, op->out[0], at, load_var(cg, sum, cg->f64), true);
        LLVMValueRef count_at = add(cg, at, I(cg, 1));
        store_f64(cg, op->out[0], count_at, LLVMBuildSIToFP(cg->b, n, cg->f64, ""), true);
    }
}

/* ------------------------------------------------------------- non-finite */

/* 1 + i where element i of t is NaN or infinite (x - x is NaN exactly then), else 0. */
static LLVMValueRef nonfinite_mark(Cg *cg, Tensor *t, LLVMValueRef i) {
    LLVMValueRef v = cg_load(cg, t, i);
    LLVMValueRef bad = LLVMBuildFCmp(cg->b, LLVMRealUNO, LLVMBuildFSub(cg->b, v, v, ""), v, "");
    return sel(cg, bad, LLVMBuildSIToFP(cg->b, add(cg, i, I(cg, 1)), cg->f64, ""), F(cg, 0));
}

/* Chunk c's gradient elements: out[c] = the first mark that is set, or 0. A first
 * pass only asks whether any is set, testing the exponent's bits (all ones: NaN or
 * infinite) and or-ing the answers, integer work the CPU does many elements at a
 * time; the rare chunk that has one is walked again for the first. */
static void gen_find_nonfinite(Cg *cg, IrOp *op, LLVMValueRef c) {
    Tensor *g = op->in[0];
    LLVMValueRef lo = mul(cg, c, I(cg, NONFINITE_CHUNK)), end = add(cg, lo, I(cg, NONFINITE_CHUNK));
    LLVMValueRef hi = smin(cg, end, I(cg, g->elems));
    bool wide = g->dtype == DT_F64;
    LLVMTypeRef bits_t = wide ? cg->i64 : cg->i32;
    LLVMValueRef exponent = LLVMConstInt(bits_t, wide ? 0x7ff0000000000000ull : 0x7f800000ull, 0);
    LLVMValueRef any = cg_var(cg, cg->i32, LLVMConstInt(cg->i32, 0, 0), "any");
    set_var(cg, any, LLVMConstInt(cg->i32, 0, 0)); /* each chunk afresh */
    Loop scan = cg_loop_begin(cg, lo, hi, "j");
    LLVMValueRef bits = LLVMBuildBitCast(cg->b, cg_load(cg, g, cg_loop_index(cg, &scan)), bits_t, "");
    LLVMValueRef bad = LLVMBuildICmp(cg->b, LLVMIntEQ, LLVMBuildAnd(cg->b, bits, exponent, ""), exponent, "");
    LLVMValueRef before = load_var(cg, any, cg->i32);
    set_var(cg, any, LLVMBuildOr(cg->b, before, LLVMBuildZExt(cg->b, bad, cg->i32, ""), ""));
    cg_loop_end(cg, &scan);
    LLVMValueRef first = cg_var(cg, cg->f64, F(cg, 0), "first");
    set_var(cg, first, F(cg, 0));
    If found = cg_if_begin(cg, LLVMBuildICmp(cg->b, LLVMIntNE, load_var(cg, any, cg->i32),
                                             LLVMConstInt(cg->i32, 0, 0), ""));
    Loop l = cg_loop_begin(cg, lo, hi, "j");
    LLVMValueRef seen = load_var(cg, first, cg->f64);
    LLVMValueRef mark = nonfinite_mark(cg, g, cg_loop_index(cg, &l));
    set_var(cg, first, sel(cg, fcmp(cg, LLVMRealOEQ, seen, F(cg, 0)), mark, seen));
    cg_loop_end(cg, &l);
    cg_if_end(cg, &found);
    store_f64(cg, op->out[0], c, load_var(cg, first, cg->f64), false);
}

/* The flag from the chunks' first marks (found: the smallest) and the loss's sum; a
 * flag already set stays as it is. */
static void set_nonfinite_flag(Cg *cg, IrOp *op, LLVMValueRef found) {
    LLVMValueRef loss = load_f64(cg, op->in[1], I(cg, 0));
    LLVMValueRef loss_bad = LLVMBuildFCmp(cg->b, LLVMRealUNO, fsub(cg, loss, loss), loss, "");
    LLVMValueRef mark = sel(cg, fcmp(cg, LLVMRealONE, found, F(cg, 0)), found,
                            sel(cg, loss_bad, F(cg, (double)cg->ir->param_count + 1), F(cg, 0)));
    LLVMValueRef old = load_f64(cg, op->out[0], I(cg, 0));
    store_f64(cg, op->out[0], I(cg, 0), sel(cg, fcmp(cg, LLVMRealONE, old, F(cg, 0)), old, mark), false);
}

static void gen_nonfinite_flag(Cg *cg, IrOp *op, LLVMValueRef i) {
    (void)i;
    LLVMValueRef first = cg_var(cg, cg->f64, F(cg, 0), "first");
    Loop l = cg_loop_begin(cg, I(cg, 0), I(cg, op->in[0]->elems), "c");
    LLVMValueRef seen = load_var(cg, first, cg->f64);
    LLVMValueRef part = load_f64(cg, op->in[0], cg_loop_index(cg, &l));
    set_var(cg, first, sel(cg, fcmp(cg, LLVMRealOEQ, seen, F(cg, 0)), part, seen));
    cg_loop_end(cg, &l);
    set_nonfinite_flag(cg, op, load_var(cg, first, cg->f64));
}

/* On a GPU, the smallest set mark of a block's share: unset marks count as infinity. */
typedef struct Marks {
    LLVMValueRef least;
    Tensor *t;
    LLVMValueRef base;          /* the index of the share's row 0 */
    bool from_values;           /* t holds values to test, not marks */
} Marks;

static void mark_visit(Cg *cg, IrOp *op, LLVMValueRef row, void *arg) {
    (void)op;
    Marks *m = arg;
    LLVMValueRef i = add(cg, m->base, row);
    LLVMValueRef mark = m->from_values ? nonfinite_mark(cg, m->t, i) : load_f64(cg, m->t, i);
    LLVMValueRef v = sel(cg, fcmp(cg, LLVMRealOEQ, mark, F(cg, 0)), F(cg, INFINITY), mark);
    set_var(cg, m->least, smaller(cg, load_var(cg, m->least, cg->f64), v));
}

static LLVMValueRef least_mark(Cg *cg, IrOp *op, Block *k, Marks *m, LLVMValueRef rows) {
    strided_rows(cg, op, k, rows, mark_visit, m);
    LLVMValueRef least = block_combine(cg, k, load_var(cg, m->least, cg->f64), 0, smaller);
    return sel(cg, fcmp(cg, LLVMRealOEQ, least, F(cg, INFINITY)), F(cg, 0), least);
}

/* Chunk c of the gradients (OP_FIND_NONFINITE, OP_GRAD_SQUARES): its elements from
 * *lo on. */
static LLVMValueRef chunk_rows(Cg *cg, Tensor *g, LLVMValueRef c, LLVMValueRef *lo) {
    *lo = mul(cg, c, I(cg, NONFINITE_CHUNK));
    return smin(cg, sub(cg, I(cg, g->elems), *lo), I(cg, NONFINITE_CHUNK));
}

/* Thread 0 stores a block's result v at index i of the op's output. */
static void block_store(Cg *cg, IrOp *op, Block *k, LLVMValueRef i, LLVMValueRef v) {
    If f = first_thread(cg, k);
    store_f64(cg, op->out[0], i, v, false);
    cg_if_end(cg, &f);
}

static void block_find_nonfinite(Cg *cg, IrOp *op, LLVMValueRef c) {
    Block k = block_of(cg, op);
    LLVMValueRef lo, rows = chunk_rows(cg, op->in[0], c, &lo);
    Marks m = {cg_var(cg, cg->f64, F(cg, INFINITY), "least"), op->in[0], lo, true};
    block_store(cg, op, &k, c, least_mark(cg, op, &k, &m, rows));
}

static void block_nonfinite_flag(Cg *cg, IrOp *op, LLVMValueRef i) {
    (void)i;
    Block k = block_of(cg, op);
    Marks m = {cg_var(cg, cg->f64, F(cg, INFINITY), "least"), op->in[0], I(cg, 0), false};
    LLVMValueRef first = least_mark(cg, op, &k, &m, I(cg, op->in[0]->elems));
    If f = first_thread(cg, &k);
    set_nonfinite_flag(cg, op, first);
    cg_if_end(cg, &f);
}

/* ------------------------------------------------ the optimizer's scalars */

/* A constant and a run-time scalar in the program's float type, or another. */
static LLVMValueRef R(Cg *cg, double v) {
    return LLVMConstReal(cg->real, v);
}

static LLVMValueRef scalar_as(Cg *cg, int slot, LLVMTypeRef type) {
    return cg_from_f64(cg, cg_scalar_f64(cg, slot), type);
}

static LLVMValueRef scalar_real(Cg *cg, int slot) {
    return scalar_as(cg, slot, cg->real);
}

/* Element i's weight decay in type: its group's (ddp_decay_group) where the groups
 * differ, as a sum of the three decays each times 1 or 0, which is exact: selects
 * would be moved before the scalars' conversion from f64, into the loop. */
static LLVMValueRef element_decay(Cg *cg, LLVMValueRef i, LLVMTypeRef type) {
    LLVMValueRef wd = scalar_as(cg, DDP_S_WEIGHT_DECAY, type);
    if (!cg->ir->decay_groups)
        return wd;
    LLVMValueRef group = cg_load(cg, cg->ir->decay_groups, i), sum = NULL;
    static const int slots[] = {[DDP_DECAY_WEIGHTS] = DDP_S_WEIGHT_DECAY, [DDP_DECAY_BIASES] = DDP_S_BIAS_WEIGHT_DECAY,
                                [DDP_DECAY_NORMS] = DDP_S_NORM_WEIGHT_DECAY};
    for (int g = DDP_DECAY_WEIGHTS; g <= DDP_DECAY_NORMS; g++) {
        LLVMValueRef is = LLVMBuildICmp(cg->b, LLVMIntEQ, group, LLVMConstInt(cg->i8, (unsigned long long)g, 0), "");
        LLVMValueRef part = fmul(cg, LLVMBuildUIToFP(cg->b, is, type, ""), scalar_as(cg, slots[g], type));
        sum = sum ? fadd(cg, sum, part) : part;
    }
    return sum;
}

/* ------------------------------------------------------------ clip_norm */

/* Term j (of one or two) of a sum of squares at element `index`, in f64: a tensor's
 * element, or a value made from several (lars's and lamb's). */
typedef LLVMValueRef (*Term)(Cg *cg, IrOp *op, int j, LLVMValueRef index);

static LLVMValueRef input_term(Cg *cg, IrOp *op, int j, LLVMValueRef index) {
    (void)j;
    return load_f64(cg, op->in[0], index);
}

/* The four running sums of squares of each term (acc[j][k] takes the elements 4q + k
 * of a run of quads from `at` on): a fixed order, the same bits every step and any
 * thread count. */
static void add_quads(Cg *cg, IrOp *op, Term term, int n, LLVMValueRef at, LLVMValueRef quads, LLVMValueRef acc[2][4]) {
    Loop q = cg_loop_begin(cg, I(cg, 0), quads, "q");
    LLVMValueRef base = add(cg, at, mul(cg, cg_loop_index(cg, &q), I(cg, 4)));
    for (int j = 0; j < n; j++)
        for (int k = 0; k < 4; k++) {
            LLVMValueRef v = term(cg, op, j, add(cg, base, I(cg, k)));
            set_var(cg, acc[j][k], fadd(cg, load_var(cg, acc[j][k], cg->f64), fmul(cg, v, v)));
        }
    cg_loop_end(cg, &q);
}

/* The rest of a span after its quads, into each term's first sum. */
static void add_tail(Cg *cg, IrOp *op, Term term, int n, LLVMValueRef from, LLVMValueRef to, LLVMValueRef acc[2][4]) {
    Loop t = cg_loop_begin(cg, from, to, "t");
    for (int j = 0; j < n; j++) {
        LLVMValueRef v = term(cg, op, j, cg_loop_index(cg, &t));
        set_var(cg, acc[j][0], fadd(cg, load_var(cg, acc[j][0], cg->f64), fmul(cg, v, v)));
    }
    cg_loop_end(cg, &t);
}

/* A CPU's runs of terms that cost more than a load (lamb's steps): each run of
 * TERMS_AT_ONCE made into a buffer by a loop that vectorises, then squared and added
 * from it in the very order of add_quads and add_tail over the whole span. */
enum { TERMS_AT_ONCE = 256 };

static LLVMValueRef buffered_term(Cg *cg, IrOp *op, int j, LLVMValueRef k) {
    (void)op;
    LLVMValueRef at[] = {I(cg, 0), k};
    LLVMValueRef p = LLVMBuildInBoundsGEP2(cg->b, LLVMArrayType(cg->f64, TERMS_AT_ONCE), cg->terms[j], at, 2, "");
    return LLVMBuildLoad2(cg->b, cg->f64, p, "");
}

/* The sums of squares of n terms over elements [lo, lo + count), in f64, into sums:
 * for each, four sums of every fourth element, so that the additions overlap, then
 * added pairwise. */
static void sums_of_squares(Cg *cg, IrOp *op, Term term, int n, bool buffered, LLVMValueRef lo, LLVMValueRef count,
                            LLVMValueRef *sums) {
    LLVMValueRef acc[2][4];
    for (int j = 0; j < n; j++)
        for (int k = 0; k < 4; k++) {
            acc[j][k] = cg_var(cg, cg->f64, F(cg, 0), "squares");
            set_var(cg, acc[j][k], F(cg, 0)); /* each index afresh */
        }
    if (!buffered) {
        LLVMValueRef quads = divs(cg, count, I(cg, 4));
        add_quads(cg, op, term, n, lo, quads, acc);
        LLVMValueRef rest = add(cg, lo, mul(cg, quads, I(cg, 4)));
        add_tail(cg, op, term, n, rest, add(cg, lo, count), acc);
    } else {
        for (int j = 0; j < n; j++)
            cg->terms[j] = cg_var(cg, LLVMArrayType(cg->f64, TERMS_AT_ONCE), NULL, "terms");
        Loop r = cg_loop_begin(cg, I(cg, 0), divs(cg, add(cg, count, I(cg, TERMS_AT_ONCE - 1)), I(cg, TERMS_AT_ONCE)),
                               "run");
        LLVMValueRef base = mul(cg, cg_loop_index(cg, &r), I(cg, TERMS_AT_ONCE));
        LLVMValueRef len = smin(cg, I(cg, TERMS_AT_ONCE), sub(cg, count, base));
        Loop e = cg_loop_begin(cg, I(cg, 0), len, "e");
        LLVMValueRef k = cg_loop_index(cg, &e);
        for (int j = 0; j < n; j++) {
            LLVMValueRef at[] = {I(cg, 0), k};
            LLVMValueRef v = term(cg, op, j, add(cg, lo, add(cg, base, k)));
            LLVMBuildStore(cg->b, v,
                           LLVMBuildInBoundsGEP2(cg->b, LLVMArrayType(cg->f64, TERMS_AT_ONCE), cg->terms[j], at, 2,
                                                 ""));
        }
        cg_loop_end(cg, &e);
        LLVMValueRef quads = divs(cg, len, I(cg, 4)); /* whole in every run but the last */
        add_quads(cg, op, buffered_term, n, I(cg, 0), quads, acc);
        add_tail(cg, op, buffered_term, n, mul(cg, quads, I(cg, 4)), len, acc);
        cg_loop_end(cg, &r);
    }
    for (int j = 0; j < n; j++)
        sums[j] = fadd(cg, fadd(cg, load_var(cg, acc[j][0], cg->f64), load_var(cg, acc[j][1], cg->f64)),
                       fadd(cg, load_var(cg, acc[j][2], cg->f64), load_var(cg, acc[j][3], cg->f64)));
}

/* Chunk c's sum of squared gradient elements. */
static void gen_grad_squares(Cg *cg, IrOp *op, LLVMValueRef c) {
    LLVMValueRef lo, n = chunk_rows(cg, op->in[0], c, &lo), sum;
    sums_of_squares(cg, op, input_term, 1, false, lo, n, &sum);
    store_f64(cg, op->out[0], c, sum, false);
}

/* The gradients' scale from their squares' sum: clip_norm / (norm + 1e-6) where that
 * is below 1 (PyTorch's clip_grad_norm_), else 1. */
static void store_clip_factor(Cg *cg, IrOp *op, LLVMValueRef squares) {
    LLVMValueRef norm = cg_sqrt(cg, squares);
    LLVMValueRef scale = fdiv(cg, F(cg, cg->ir->config->optimizer.clip_norm), fadd(cg, norm, F(cg, 1e-6)));
    store_f64(cg, op->out[0], I(cg, 0), sel(cg, fcmp(cg, LLVMRealOLT, scale, F(cg, 1)), scale, F(cg, 1)), false);
}

static void gen_clip_factor(Cg *cg, IrOp *op, LLVMValueRef i) {
    (void)i;
    LLVMValueRef sum = cg_var(cg, cg->f64, F(cg, 0), "sum");
    Loop l = cg_loop_begin(cg, I(cg, 0), I(cg, op->in[0]->elems), "c");
    set_var(cg, sum, fadd(cg, load_var(cg, sum, cg->f64), load_f64(cg, op->in[0], cg_loop_index(cg, &l))));
    cg_loop_end(cg, &l);
    store_clip_factor(cg, op, load_var(cg, sum, cg->f64));
}

/* On a GPU, a block's share of squares (of gradient elements, or of chunks' sums), of
 * one or two terms at once. */
typedef struct Squares {
    LLVMValueRef sum[2];
    Term term;
    int n;
    LLVMValueRef base;
    bool square;                /* the terms are values to square, not sums */
} Squares;

static void squares_visit(Cg *cg, IrOp *op, LLVMValueRef row, void *arg) {
    Squares *s = arg;
    for (int j = 0; j < s->n; j++) {
        LLVMValueRef v = s->term(cg, op, j, add(cg, s->base, row));
        set_var(cg, s->sum[j], fadd(cg, load_var(cg, s->sum[j], cg->f64), s->square ? fmul(cg, v, v) : v));
    }
}

/* The block's sums over rows [0, rows) of n terms from base on, squared or not, into
 * sums (shared-memory slot j for term j). */
static void block_sums_of(Cg *cg, IrOp *op, Block *k, Term term, int n, LLVMValueRef base, LLVMValueRef rows,
                          bool square, LLVMValueRef *sums) {
    Squares s = {{NULL, NULL}, term, n, base, square};
    for (int j = 0; j < n; j++)
        s.sum[j] = cg_var(cg, cg->f64, F(cg, 0), "sum");
    strided_rows(cg, op, k, rows, squares_visit, &s);
    for (int j = 0; j < n; j++)
        sums[j] = block_sum(cg, k, load_var(cg, s.sum[j], cg->f64), j);
}

/* The block's sum over rows [0, rows) of the op's input from base on, squared or not. */
static LLVMValueRef block_squares(Cg *cg, IrOp *op, Block *k, LLVMValueRef base, LLVMValueRef rows, bool square) {
    LLVMValueRef sum;
    block_sums_of(cg, op, k, input_term, 1, base, rows, square, &sum);
    return sum;
}

static void block_grad_squares(Cg *cg, IrOp *op, LLVMValueRef c) {
    Block k = block_of(cg, op);
    LLVMValueRef lo, rows = chunk_rows(cg, op->in[0], c, &lo);
    block_store(cg, op, &k, c, block_squares(cg, op, &k, lo, rows, true));
}

static void block_clip_factor(Cg *cg, IrOp *op, LLVMValueRef i) {
    (void)i;
    Block k = block_of(cg, op);
    LLVMValueRef sum = block_squares(cg, op, &k, I(cg, 0), I(cg, op->in[0]->elems), false);
    If f = first_thread(cg, &k);
    store_clip_factor(cg, op, sum);
    cg_if_end(cg, &f);
}

/* ------------------------------------------------------------ lars, lamb */

/* Parameter t's span in the flat vectors: its first element and its count. */
static LLVMValueRef parameter_span(Cg *cg, LLVMValueRef t, LLVMValueRef *count) {
    Tensor *spans = cg->ir->parameter_spans;
    *count = cg_load(cg, spans, add(cg, mul(cg, t, I(cg, 2)), I(cg, 1)));
    return cg_load(cg, spans, mul(cg, t, I(cg, 2)));
}

static LLVMValueRef adam_step(Cg *cg, LLVMValueRef i, LLVMValueRef p, LLVMValueRef g, LLVMValueRef wd,
                              LLVMValueRef *m, LLVMValueRef *v);

/* Element i's gradient as the optimizer takes it: clip_norm's scale applied. */
static LLVMValueRef optimizer_gradient(Cg *cg, LLVMValueRef i) {
    LLVMValueRef g = cg_load(cg, cg->ir->all_grads, i);
    return cg->grad_scale ? fmul(cg, g, cg->grad_scale) : g;
}

/* The two terms of a trust ratio at element i: the parameter, and what its norm is
 * held against: lars's gradient, lamb's whole step (Adam's, with its weight decay, the
 * moments made as the optimizer will make them, not stored). */
static LLVMValueRef trust_term(Cg *cg, IrOp *op, int j, LLVMValueRef i) {
    (void)op;
    Ir *ir = cg->ir;
    if (j == 0)
        return load_f64(cg, ir->all_params, i);
    LLVMValueRef g = optimizer_gradient(cg, i), m, v;
    if (ir->config->optimizer.kind == DDP_OPT_LARS)
        return cg_to_f64(cg, g);
    LLVMValueRef p = cg_load(cg, ir->all_params, i);
    return cg_to_f64(cg, adam_step(cg, i, p, g, element_decay(cg, i, cg->real), &m, &v));
}

/* Parameter t's step scale from its terms' sums of squares, where its weight decay wd
 * (its group's), |w| and |u| are all nonzero, else 1: lars's (timm's Lars, after
 * NVIDIA's LARC) trust_coefficient |w| / (|g| + wd |w| + epsilon), lamb's (timm's
 * Lamb) |w| / |step|. */
static void store_trust(Cg *cg, IrOp *op, LLVMValueRef t, LLVMValueRef first, LLVMValueRef w2, LLVMValueRef u2) {
    const ddp_optimizer *o = &cg->ir->config->optimizer;
    LLVMValueRef w = cg_sqrt(cg, w2), u = cg_sqrt(cg, u2), wd = element_decay(cg, first, cg->f64);
    LLVMValueRef ratio = o->kind == DDP_OPT_LAMB
                             ? fdiv(cg, w, u)
                             : fdiv(cg, fmul(cg, F(cg, o->trust_coefficient), w),
                                    fadd(cg, fadd(cg, u, fmul(cg, wd, w)), F(cg, o->epsilon)));
    LLVMValueRef adapt = and_(cg, fcmp(cg, LLVMRealONE, wd, F(cg, 0)),
                              and_(cg, fgt(cg, w, F(cg, 0)), fgt(cg, u, F(cg, 0))));
    store_f64(cg, op->out[0], t, sel(cg, adapt, ratio, F(cg, 1)), false);
}

static void gen_trust_ratio(Cg *cg, IrOp *op, LLVMValueRef t) {
    LLVMValueRef count, first = parameter_span(cg, t, &count), sums[2];
    bool steps = cg->ir->config->optimizer.kind == DDP_OPT_LAMB; /* terms dearer than loads */
    sums_of_squares(cg, op, trust_term, 2, steps, first, count, sums);
    store_trust(cg, op, t, first, sums[0], sums[1]);
}

static void block_trust_ratio(Cg *cg, IrOp *op, LLVMValueRef t) {
    Block k = block_of(cg, op);
    LLVMValueRef count, first = parameter_span(cg, t, &count), sums[2];
    block_sums_of(cg, op, &k, trust_term, 2, first, count, true, sums);
    If f = first_thread(cg, &k);
    store_trust(cg, op, t, first, sums[0], sums[1]);
    cg_if_end(cg, &f);
}

/* ---------------------------------------------------------------- optimizer */

/* Adam's step at element i for gradient g: mhat / (sqrt(vhat) + epsilon), the weight
 * decay added to the gradient (adam) or to the step (adamw, lamb); the new moments
 * into m and v, for the caller to store or not. */
static LLVMValueRef adam_step(Cg *cg, LLVMValueRef i, LLVMValueRef p, LLVMValueRef g, LLVMValueRef wd,
                              LLVMValueRef *m, LLVMValueRef *v) {
    Ir *ir = cg->ir;
    const ddp_optimizer *o = &ir->config->optimizer;
    bool decoupled = o->kind != DDP_OPT_ADAM;
    LLVMValueRef b1 = R(cg, o->beta1), b2 = R(cg, o->beta2);
    LLVMValueRef gw = decoupled ? g : fadd(cg, g, fmul(cg, wd, p));
    *m = fadd(cg, fmul(cg, b1, cg_load(cg, ir->states[0], i)), fmul(cg, fsub(cg, R(cg, 1), b1), gw));
    *v = fadd(cg, fmul(cg, b2, cg_load(cg, ir->states[1], i)), fmul(cg, fsub(cg, R(cg, 1), b2), fmul(cg, gw, gw)));
    LLVMValueRef mhat = fdiv(cg, *m, scalar_real(cg, DDP_S_BIAS_CORRECTION1));
    LLVMValueRef vhat = fdiv(cg, *v, scalar_real(cg, DDP_S_BIAS_CORRECTION2));
    LLVMValueRef upd = fdiv(cg, mhat, fadd(cg, cg_sqrt(cg, vhat), R(cg, o->epsilon)));
    return decoupled ? fadd(cg, upd, fmul(cg, wd, p)) : upd;
}

/* Element i's trust ratio (lars, lamb): its parameter's. */
static LLVMValueRef element_trust(Cg *cg, LLVMValueRef i) {
    if (cg->trust) /* the CPU's walk by parameter loaded it */
        return cg->trust;
    LLVMValueRef t = LLVMBuildSExt(cg->b, cg_load(cg, cg->ir->parameter_numbers, i), cg->i64, "");
    return cg_from_f64(cg, load_f64(cg, cg->ir->trust, t), cg->real);
}

/* One element of the flat vectors, after every worker's gradients are summed, in the
 * program's float type as PyTorch and TensorFlow do it (f32 division and square root
 * are several times cheaper than f64's, and this kernel runs over every parameter). */
static void gen_optimizer(Cg *cg, IrOp *op, LLVMValueRef i) {
    Ir *ir = cg->ir;
    LLVMValueRef p = cg_load(cg, ir->all_params, i), g = optimizer_gradient(cg, i);
    LLVMValueRef lr = scalar_real(cg, DDP_S_LEARNING_RATE), wd = element_decay(cg, i, cg->real);
    const ddp_optimizer *o = &ir->config->optimizer;
    LLVMValueRef average = o->ema > 0 ? cg_load(cg, ir->states[ir->state_vectors - 1], i) : NULL;
    LLVMValueRef upd;
    if (op->code == DDP_OPT_SGD || op->code == DDP_OPT_LARS) {
        LLVMValueRef gw = fadd(cg, g, fmul(cg, wd, p));
        if (op->code == DDP_OPT_LARS)
            gw = fmul(cg, gw, element_trust(cg, i));
        upd = gw;
        if (o->momentum > 0) { /* its velocity the first state vector */
            LLVMValueRef mu = R(cg, o->momentum);
            LLVMValueRef v = fadd(cg, fmul(cg, mu, cg_load(cg, ir->states[0], i)), gw);
            cg_store(cg, ir->states[0], i, v);
            upd = o->nesterov ? fadd(cg, gw, fmul(cg, mu, v)) : v;
        }
    } else {
        LLVMValueRef m, v;
        upd = adam_step(cg, i, p, g, wd, &m, &v);
        cg_store(cg, ir->states[0], i, m);
        cg_store(cg, ir->states[1], i, v);
        if (op->code == DDP_OPT_LAMB)
            upd = fmul(cg, upd, element_trust(cg, i));
    }
    LLVMValueRef next = fsub(cg, p, fmul(cg, lr, upd));
    cg_store(cg, ir->all_params, i, next);
    if (average) /* Keras's use_ema: ema x average + (1 - ema) x the new parameter, ema warmed up or not */
        cg_store(cg, ir->states[ir->state_vectors - 1], i,
                 fadd(cg, fmul(cg, scalar_real(cg, DDP_S_EMA_DECAY), average),
                      fmul(cg, scalar_real(cg, DDP_S_EMA_REST), next)));
}

/* The CPU's optimizer under lars and lamb: its range walked parameter by parameter, the
 * trust ratio loaded once for each run of its elements, so that the loop over them
 * vectorises as adamw's does (a ratio fetched through each element's parameter number
 * is a gather, which keeps the loop scalar: several times slower). */
static void gen_optimizer_by_parameter(Cg *cg, IrOp *op) {
    Ir *ir = cg->ir;
    If some = cg_if_begin(cg, lt(cg, cg->begin, cg->end));
    LLVMValueRef first = LLVMBuildSExt(cg->b, cg_load(cg, ir->parameter_numbers, cg->begin), cg->i64, "");
    LLVMValueRef last = LLVMBuildSExt(cg->b, cg_load(cg, ir->parameter_numbers, sub(cg, cg->end, I(cg, 1))), cg->i64,
                                      "");
    Loop params = cg_loop_begin(cg, first, add(cg, last, I(cg, 1)), "parameter");
    LLVMValueRef t = cg_loop_index(cg, &params), count, lo = parameter_span(cg, t, &count);
    LLVMValueRef hi = smin(cg, cg->end, add(cg, lo, count));
    cg->trust = cg_from_f64(cg, load_f64(cg, ir->trust, t), cg->real);
    Loop elements = cg_loop_begin(cg, smax(cg, cg->begin, lo), hi, "i");
    gen_optimizer(cg, op, cg_loop_index(cg, &elements));
    cg_loop_end(cg, &elements);
    cg->trust = NULL;
    cg_loop_end(cg, &params);
    cg_if_end(cg, &some);
}

/* ------------------------------------------------------------------- driver */

bool op_has_kernel(const IrOp *op) {
    return op->kind != OP_GEMM && op->kind != OP_CONV && op->kind != OP_BUCKET_READY && op->kind != OP_WAIT_BUCKETS &&
           op->kind != OP_METRICS_READY && op->kind != OP_FILL;
}

/* The longest run a block of a reduction adds up: what its thread count is sized for. */
static int64_t reduced_length(const IrOp *op) {
    switch (op->kind) {
    case OP_REDUCE_ROWS: case OP_BN_STATS: /* rows at a full batch, or a first stage's chunks */
        return op->chunk_rows ? chunks_of(op) : op->in[0]->elems / op->channels;
    case OP_GAP: return gap_pixels(op->in[0]);
    case OP_ACCUMULATE: return op->in[0]->elems;
    case OP_FIND_NONFINITE: case OP_GRAD_SQUARES: return NONFINITE_CHUNK;
    case OP_TRUST_RATIO: return op->channels; /* the largest parameter */
    case OP_LAYERNORM: case OP_LAYERNORM_BWD: case OP_SOFTMAX: case OP_SOFTMAX_BWD: return op->axis_len;
    case OP_DEPTHWISE_FILTER: return op->in[1]->elems / op->in[1]->shape.dim[op->in[1]->shape.rank - 1]; /* rows */
    case OP_NONFINITE_FLAG: case OP_CLIP_FACTOR: return op->in[0]->elems;
    default: return 0;
    }
}

/* Shared memory a block uses: a slot of one f64 per thread for each sum it forms at once. */
static int64_t reduced_slots(const IrOp *op) {
    return op->kind == OP_REDUCE_ROWS ? op->nout : op->kind == OP_BN_STATS || op->kind == OP_TRUST_RATIO ? 2 : 1;
}

/* An index launch's blocks: 256 threads, the grid's threads a multiple of the
 * kernel's period (runtime/gpu.c sizes the grid). */
enum { INDEX_THREADS = 256, MAX_REDUCE_THREADS = 256 };

GpuLaunch kernel_launch(const IrOp *op) {
    int64_t length = reduced_length(op);
    if (length == 0)
        return (GpuLaunch){.kind = DDP_LAUNCH_INDEX, .threads = INDEX_THREADS, .shared_bytes = 0, .per_thread = 0,
                           .period = op->kind == OP_POINTWISE ? pointwise_period(op) : 1};
    int64_t threads = 32; /* a warp at least; no more than the rows to share */
    while (threads < MAX_REDUCE_THREADS && threads < length)
        threads *= 2;
    return (GpuLaunch){.kind = DDP_LAUNCH_BLOCK, .threads = threads,
                       .shared_bytes = reduced_slots(op) * threads * (int64_t)sizeof(double),
                       .per_thread = (length + threads - 1) / threads, .period = 1};
}

const char *kernel_name(Ddpc *c, const IrOp *op, int index) {
    return arena_printf(c->arena, "ddp_k%d_%s", index, op_kind_name(op->kind));
}

static IndexBody body_of(OpKind kind) {
    switch (kind) {
    case OP_POINTWISE: return gen_pointwise;
    case OP_DROPOUT_MASK: return gen_dropout_mask;
    case OP_REDUCE_ROWS: return gen_reduce_rows;
    case OP_ROW_PARTIALS: return gen_row_partials;
    case OP_IM2COL: return gen_im2col;
    case OP_COL2IM: return gen_col2im;
    case OP_FILTERS_TO_KRSC: return gen_filters_to_krsc;
    case OP_FILTERS_TO_HWIO: return gen_filters_to_hwio;
    case OP_MAXPOOL: return gen_maxpool;
    case OP_MAXPOOL_BWD: return gen_maxpool_bwd;
    case OP_AVGPOOL: return gen_avgpool;
    case OP_AVGPOOL_BWD: return gen_avgpool_bwd;
    case OP_GAP: return gen_gap;
    case OP_GAP_BWD: return gen_gap_bwd;
    case OP_DEPTHWISE: return gen_depthwise;
    case OP_DEPTHWISE_DATA: return gen_depthwise_data;
    case OP_DEPTHWISE_FILTER: return gen_depthwise_filter;
    case OP_BN_STATS: return gen_bn_stats;
    case OP_SOFTMAX: case OP_SOFTMAX_BWD: case OP_LAYERNORM: case OP_LAYERNORM_BWD: return gen_row;
    case OP_CONCAT: return gen_concat;
    case OP_SPLIT: return gen_split;
    case OP_LOSS: return gen_loss;
    case OP_METRIC: return gen_metric;
    case OP_ACCUMULATE: return gen_accumulate;
    case OP_FIND_NONFINITE: return gen_find_nonfinite;
    case OP_NONFINITE_FLAG: return gen_nonfinite_flag;
    case OP_GRAD_SQUARES: return gen_grad_squares;
    case OP_TRUST_RATIO: return gen_trust_ratio;
    case OP_CLIP_FACTOR: return gen_clip_factor;
    case OP_OPTIMIZER: return gen_optimizer;
    default: return NULL;
    }
}

/* The GPU's body for a kernel launched one block per index. */
static IndexBody block_body_of(OpKind kind) {
    switch (kind) {
    case OP_REDUCE_ROWS: return block_reduce_rows;
    case OP_BN_STATS: return block_bn_stats;
    case OP_GAP: return block_gap;
    case OP_ACCUMULATE: return block_accumulate;
    case OP_FIND_NONFINITE: return block_find_nonfinite;
    case OP_NONFINITE_FLAG: return block_nonfinite_flag;
    case OP_GRAD_SQUARES: return block_grad_squares;
    case OP_TRUST_RATIO: return block_trust_ratio;
    case OP_CLIP_FACTOR: return block_clip_factor;
    case OP_LAYERNORM: case OP_LAYERNORM_BWD: case OP_SOFTMAX: case OP_SOFTMAX_BWD: return block_row;
    case OP_DEPTHWISE_FILTER: return block_depthwise_filter;
    default: return NULL;
    }
}

/* ------------------------------------------------------------- arguments */

static void add_argument(Tensor *t, Tensor **out, int *n, int cap) {
    Tensor *s = tensor_storage(t);
    for (int i = 0; i < *n; i++)
        if (out[i] == s)
            return;
    if (*n < cap)
        out[(*n)++] = s;
}

static void expr_arguments(const XExpr *e, Tensor **out, int *n, int cap) {
    if (!e)
        return;
    if (e->kind == X_LOAD)
        add_argument(e->t, out, n, cap);
    expr_arguments(e->a, out, n, cap);
    expr_arguments(e->b, out, n, cap);
}

int op_arguments(Ir *ir, const IrOp *op, Tensor **out, int cap) {
    int n = 0;
    for (int k = 0; k < op->nin; k++)
        add_argument(op->in[k], out, &n, cap);
    for (int k = 0; k < op->nout; k++)
        add_argument(op->out[k], out, &n, cap);
    for (int k = 0; k < 4; k++)
        expr_arguments(op->expr[k], out, &n, cap);
    if (op->kind == OP_DROPOUT_MASK)
        add_argument(ir->sample_id, out, &n, cap);
    return n;
}

enum { MAX_ARGS = 256 };

static LLVMValueRef generate_kernel(Cg *cg, IrOp *op, const char *name) {
    Tensor *args[MAX_ARGS];
    cg->nargs = op_arguments(cg->ir, op, args, MAX_ARGS);
    cg->args = args;
    LLVMValueRef fn = cg_kernel_begin(cg, name);
    if (cg->target == TARGET_CPU_WIDE) { /* the same code, for AVX2 and FMA */
        LLVMAttributeRef cpu = LLVMCreateStringAttribute(cg->ctx, "target-cpu", 10, "x86-64-v3", 9);
        LLVMAttributeRef features = LLVMCreateStringAttribute(cg->ctx, "target-features", 15, "+avx2,+fma", 10);
        LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex, cpu);
        LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex, features);
    }
    /* the optimizer does nothing once a gradient or the loss was not finite */
    If update = {0};
    if (op->kind == OP_OPTIMIZER)
        update = cg_if_begin(cg, fcmp(cg, LLVMRealOEQ, load_f64(cg, cg->ir->nonfinite, I(cg, 0)), F(cg, 0)));
    if ((op->kind == OP_OPTIMIZER || op->kind == OP_TRUST_RATIO) && cg->ir->clip) /* once: stores could alias it */
        cg->grad_scale = cg_from_f64(cg, load_f64(cg, cg->ir->clip, I(cg, 0)), cg->real);
    if (cg->target == TARGET_GPU && kernel_launch(op).kind == DDP_LAUNCH_BLOCK)
        cg_kernel_blocks(cg, op, block_body_of(op->kind));
    else if (cg->target != TARGET_GPU && op->kind == OP_POINTWISE)
        gen_pointwise_rows(cg, op);
    else if (cg->target != TARGET_GPU && op->kind == OP_DROPOUT_MASK)
        gen_dropout_mask_cpu(cg, op);
    else if (cg->target != TARGET_GPU && op->kind == OP_OPTIMIZER && cg->ir->trust)
        gen_optimizer_by_parameter(cg, op);
    else if (cg->target == TARGET_GPU || !gen_row_sums_cpu(cg, op))
        cg_kernel_indices(cg, op, op->kind == OP_POINTWISE ? pointwise_prologue : NULL, body_of(op->kind),
                          op->kind == OP_POINTWISE ? gen_pointwise_group : NULL);
    if (op->kind == OP_OPTIMIZER)
        cg_if_end(cg, &update);
    cg_kernel_end(cg);
    cg->hoisted = NULL;
    cg->grad_scale = NULL;
    cg->args = NULL;
    cg->nargs = 0;
    return fn;
}

bool cg_assign_kernels(Ddpc *c, Ir *ir, const char **error) {
    Cg cg;
    if (!cg_init(&cg, c, ir, TARGET_CPU_BASE, 0, error))
        return false;
    Map seen = {0}; /* the code of a kernel, its buffers as arguments, and the width of
                       its GPU indices -> its index + 1 */
    for (int ph = 0; ph < PH_COUNT; ph++)
        for (int i = 0; i < ir->ops[ph].len; i++) {
            IrOp *op = ir->ops[ph].items[i];
            op->kernel_index = -1;
            if (!op_has_kernel(op))
                continue;
            LLVMValueRef fn = generate_kernel(&cg, op, "ddp_candidate");
            char *text = LLVMPrintValueToString(fn);
            const char *key = arena_printf(c->arena, "%s%s", text, cg_indices_fit_32(&cg, op) ? "" : "\n64-bit");
            LLVMDisposeMessage(text);
            LLVMDeleteFunction(fn);
            intptr_t known = (intptr_t)map_get(&seen, key);
            if (known) {
                op->kernel_index = (int)known - 1;
                continue;
            }
            op->kernel_index = ir->kernel_ops.len;
            vec_push(c->arena, &ir->kernel_ops, op);
            map_put(c->arena, &seen, key, (void *)(intptr_t)ir->kernel_ops.len);
        }
    cg_dispose(&cg);
    return true;
}

int cg_kernels(Cg *cg) {
    Ir *ir = cg->ir;
    for (int k = 0; k < ir->kernel_ops.len; k++) {
        IrOp *op = ir->kernel_ops.items[k];
        const char *name = kernel_name(cg->c, op, k);
        if (cg->target == TARGET_CPU_WIDE)
            name = arena_printf(cg->c->arena, "%s_wide", name);
        generate_kernel(cg, op, name);
    }
    return ir->kernel_ops.len;
}
