/* fuse.c: chains of pointwise ops become one kernel; sums over the same rows become
 * one pass, and a long one two stages.
 *
 * A pointwise op P merges into a later pointwise op Q over the same index range when
 * the ops between them neither read what P writes nor write what P reads: Q's loads of
 * P's outputs become P's expressions, and an output of P is still stored only if some
 * other op reads it. Reductions over rows (bias and batchnorm gradients) that follow
 * one another over the same rows become one op with several outputs. A kernel computes
 * every expression of an index before storing any, so an op may read what it writes.
 *
 * A sum over many rows (a bias or batch-norm gradient, batch-norm statistics) then
 * runs in two stages: an OP_ROW_PARTIALS sums fixed chunks of rows apart, one index per
 * (chunk, channel), and the op itself adds up its chunks' sums in order. The rows are
 * [rows, channels] with the channels adjacent, so on a GPU a warp's 32 indices read
 * one row's 32 neighbouring channels together, where one block per channel striding
 * over the rows would read one element of each 32-byte segment it fetches; and the
 * chunks give every channel, even of a layer with few, thousands of threads. The
 * chunks are fixed by the shapes, never by the device: the same sums in the same order
 * wherever it runs. */
#include <string.h>

#include "ddpc.h"

enum { FUSE_WINDOW = 8, MAX_OUTPUTS = 4 };

/* Two stages from SPLIT_ROWS rows at a full batch; chunks of at least CHUNK_ROWS rows,
 * more where that keeps the first stage near PARTIAL_INDICES indices: about what a
 * large GPU holds at once (an H100's or H200's 132 multiprocessors take 2048 threads
 * each), so that its reads are many enough in flight to keep its memory busy. */
enum { SPLIT_ROWS = 1024, CHUNK_ROWS = 32, PARTIAL_INDICES = 1 << 18 };

/* ------------------------------------------------------------- reads */

typedef struct Access {
    Tensor *t;
    bool full;  /* every access of it is element-for-element (BC_FULL) */
} Access;

static void expr_reads(const XExpr *e, Tensor **out, bool *full, int *n, int cap) {
    if (!e)
        return;
    if (e->kind == X_LOAD && *n < cap) {
        out[*n] = tensor_storage(e->t);
        full[(*n)++] = e->bc == BC_FULL;
    }
    expr_reads(e->a, out, full, n, cap);
    expr_reads(e->b, out, full, n, cap);
}

enum { MAX_READS = 256 };

/* Everything an op reads (storage tensors), with whether each read is full. */
static int op_reads(const IrOp *op, Tensor **out, bool *full) {
    int n = 0;
    for (int k = 0; k < op->nin && n < MAX_READS; k++) {
        out[n] = tensor_storage(op->in[k]);
        full[n++] = false;
    }
    for (int k = 0; k < MAX_OUTPUTS; k++)
        expr_reads(op->expr[k], out, full, &n, MAX_READS);
    if (op->accumulate && n < MAX_READS) {
        out[n] = tensor_storage(op->out[0]);
        full[n++] = op->kind == OP_POINTWISE;
    }
    return n;
}

static bool op_reads_tensor(const IrOp *op, const Tensor *t) {
    Tensor *r[MAX_READS];
    bool f[MAX_READS];
    int n = op_reads(op, r, f);
    for (int i = 0; i < n; i++)
        if (r[i] == tensor_storage((Tensor *)t))
            return true;
    return false;
}

static bool op_writes_tensor(const IrOp *op, const Tensor *t) {
    for (int k = 0; k < op->nout; k++)
        if (tensor_storage(op->out[k]) == tensor_storage((Tensor *)t))
            return true;
    return false;
}

/* Adds delta to the reader count of everything op reads (each tensor once). */
static void adjust_readers(const IrOp *op, int *readers, int delta) {
    Tensor *r[MAX_READS];
    bool f[MAX_READS];
    int n = op_reads(op, r, f);
    for (int k = 0; k < n; k++) {
        bool seen = false;
        for (int j = 0; j < k; j++)
            seen |= r[j] == r[k];
        if (!seen)
            readers[r[k]->id] += delta;
    }
}

/* How many ops, in every phase, read each tensor's storage. */
static void count_readers(Ir *ir, int *readers) {
    memset(readers, 0, sizeof(int) * (size_t)ir->tensors.len);
    for (int ph = 0; ph < PH_COUNT; ph++)
        for (int i = 0; i < ir->ops[ph].len; i++)
            adjust_readers(ir->ops[ph].items[i], readers, 1);
}

/* ------------------------------------------------------------- merging */

static bool same_range(const IrOp *a, const IrOp *b) {
    return a->range.fixed == b->range.fixed && a->range.per_sample == b->range.per_sample;
}

/* A load of what p writes, element for element: p's expression for it. */
static XExpr *produced_by(XExpr *load, void *arg) {
    const IrOp *p = arg;
    if (load->bc == BC_FULL)
        for (int k = 0; k < p->nout; k++)
            if (tensor_storage(load->t) == tensor_storage(p->out[k]) && load->t->elems == p->out[k]->elems)
                return p->expr[k];
    return NULL;
}

static XExpr *substitute(Ddpc *c, XExpr *e, const IrOp *p) {
    return x_rewrite_loads(c, e, produced_by, (void *)p);
}

/* Whether every access q makes to what p writes, and p to what q writes, is
 * element-for-element: then one pass over the indices does both. */
static bool elementwise_compatible(const IrOp *p, const IrOp *q) {
    const IrOp *pair[2][2] = {{p, q}, {q, p}};
    for (int s = 0; s < 2; s++) {
        const IrOp *writer = pair[s][0], *reader = pair[s][1];
        Tensor *r[MAX_READS];
        bool f[MAX_READS];
        int n = op_reads(reader, r, f);
        for (int i = 0; i < n; i++)
            if (!f[i] && op_writes_tensor(writer, r[i]))
                return false;
    }
    return true;
}

/* Q absorbs P: P's outputs that other ops still read stay stored. The caller has
 * taken p's and q's reads out of the counts. */
static bool merge_pointwise(Ddpc *c, IrOp *p, IrOp *q, const int *readers) {
    if (!elementwise_compatible(p, q))
        return false;
    Tensor *outs[2 * MAX_OUTPUTS];
    XExpr *exprs[2 * MAX_OUTPUTS];
    int n = 0;
    for (int k = 0; k < p->nout; k++) {
        Tensor *t = tensor_storage(p->out[k]);
        int others = readers[t->id]; /* p's and q's own reads are not counted now */
        bool kept = others > 0 || (t->kind != T_ACT && t->kind != T_DACT && t->kind != T_WORK);
        /* q overwriting it makes p's store dead */
        for (int j = 0; j < q->nout; j++)
            if (tensor_storage(q->out[j]) == t)
                kept = false;
        if (kept) {
            outs[n] = p->out[k];
            exprs[n++] = p->expr[k];
        }
    }
    for (int k = 0; k < q->nout; k++) {
        outs[n] = q->out[k];
        exprs[n++] = substitute(c, q->expr[k], p);
    }
    if (n > MAX_OUTPUTS)
        return false;
    q->nout = n;
    for (int k = 0; k < n; k++) {
        q->out[k] = outs[k];
        q->expr[k] = exprs[k];
    }
    if (!q->layer)
        q->layer = p->layer;
    return true;
}

static bool merge_reductions(IrOp *p, IrOp *q) {
    if (p->accumulate || q->accumulate || p->nout + q->nout > MAX_OUTPUTS ||
        p->channels != q->channels || p->rows_per_sample != q->rows_per_sample ||
        p->in[0]->per_sample != q->in[0]->per_sample)
        return false;
    for (int k = 0; k < q->nout; k++) {
        p->out[p->nout] = q->out[k];
        p->expr[p->nout++] = q->expr[k];
    }
    for (int k = 0; k < q->nin; k++) {
        bool seen = false;
        for (int j = 0; j < p->nin; j++)
            seen |= p->in[j] == q->in[k];
        if (!seen && p->nin < 8)
            p->in[p->nin++] = q->in[k];
    }
    return true;
}

/* Whether p can move down past op: op neither reads nor writes what p writes, nor
 * writes what p reads. */
static bool independent(const IrOp *p, const IrOp *op) {
    if (op->kind == OP_BUCKET_READY || op->kind == OP_WAIT_BUCKETS || op->kind == OP_METRICS_READY)
        return false;
    for (int k = 0; k < p->nout; k++)
        if (op_reads_tensor(op, p->out[k]) || op_writes_tensor(op, p->out[k]))
            return false;
    Tensor *r[MAX_READS];
    bool f[MAX_READS];
    int n = op_reads(p, r, f);
    for (int i = 0; i < n; i++)
        if (op_writes_tensor(op, r[i]))
            return false;
    return true;
}

static void remove_at(OpList *ops, int i) {
    memmove(&ops->items[i], &ops->items[i + 1], sizeof(IrOp *) * (size_t)(ops->len - i - 1));
    ops->len--;
}

/* Each op tries to merge into one of the next few that it can reach: past ops that
 * do not touch what it reads or writes. */
static void fuse_phase(Ddpc *c, OpList *ops, int *readers) {
    int i = 0;
    while (i < ops->len) {
        IrOp *p = ops->items[i];
        bool merged = false;
        for (int j = i + 1; !merged && j < ops->len && j <= i + FUSE_WINDOW; j++) {
            IrOp *q = ops->items[j];
            bool pointwise = p->kind == OP_POINTWISE && q->kind == OP_POINTWISE && same_range(p, q);
            bool sums = p->kind == OP_REDUCE_ROWS && q->kind == OP_REDUCE_ROWS && j == i + 1;
            if (pointwise || sums) {
                adjust_readers(p, readers, -1);
                adjust_readers(q, readers, -1);
                merged = pointwise ? merge_pointwise(c, p, q, readers) : merge_reductions(p, q);
                if (merged) {
                    adjust_readers(sums ? p : q, readers, 1);
                    remove_at(ops, sums ? j : i);
                } else {
                    adjust_readers(p, readers, 1);
                    adjust_readers(q, readers, 1);
                }
            }
            if (!merged && !independent(p, q))
                break;
        }
        if (!merged)
            i++;
    }
}

/* ------------------------------------------------- sums computing their terms */

/* A value cheap enough to compute twice: a batch-norm's masked gradient, say, whose
 * channel's parts a sum computes once per thread. */
enum { MAX_RECOMPUTED_NODES = 48 };

/* The first element-for-element load in e of a tensor shaped as t: what a sum that
 * computes its terms reads for its rows. */
static Tensor *rows_like(const XExpr *e, const Tensor *t) {
    if (!e)
        return NULL;
    if (e->kind == X_LOAD && e->bc == BC_FULL && e->t->elems == t->elems && e->t->per_sample == t->per_sample)
        return e->t;
    Tensor *r = rows_like(e->a, t);
    return r ? r : rows_like(e->b, t);
}

/* Whether every load of t in e is element for element, of t's size. */
static bool loads_whole(const XExpr *e, const Tensor *t) {
    if (!e)
        return true;
    if (e->kind == X_LOAD && tensor_storage(e->t) == t)
        return e->bc == BC_FULL && e->t->elems == t->elems;
    return loads_whole(e->a, t) && loads_whole(e->b, t);
}

/* Whether q is a sum over rows that reads t only as its rows (in[0]) and element for
 * element in its expressions. */
static bool sums_rows_of(const IrOp *q, const Tensor *t) {
    if (q->kind != OP_REDUCE_ROWS || q->accumulate || op_writes_tensor(q, t))
        return false;
    for (int k = 1; k < q->nin; k++)
        if (tensor_storage(q->in[k]) == t)
            return false;
    for (int e = 0; e < q->nout; e++)
        if (!loads_whole(q->expr[e], t))
            return false;
    return true;
}

/* Whether an op among ops[from, to) writes what p reads. */
static bool inputs_written(const OpList *ops, int from, int to, const IrOp *p) {
    Tensor *r[MAX_READS];
    bool f[MAX_READS];
    int n = op_reads(p, r, f);
    for (int j = from; j < to; j++)
        for (int i = 0; i < n; i++)
            if (op_writes_tensor(ops->items[j], r[i]))
                return true;
    return false;
}

/* Output k of pointwise op p (at i) computed again by the sums over rows that read it,
 * instead of stored: when they are all its readers, close after p, read it as rows,
 * and come before anything writes p's inputs. */
static bool sums_compute(Ddpc *c, OpList *ops, int i, int k, int *readers) {
    IrOp *p = ops->items[i];
    Tensor *t = tensor_storage(p->out[k]);
    if (t != p->out[k] || (t->kind != T_ACT && t->kind != T_DACT && t->kind != T_WORK) ||
        x_size(p->expr[k]) > MAX_RECOMPUTED_NODES)
        return false;
    Tensor *rows = rows_like(p->expr[k], t);
    IrOp *sums[FUSE_WINDOW];
    int n = 0;
    for (int j = i + 1; j < ops->len && j <= i + FUSE_WINDOW && n < readers[t->id]; j++) {
        IrOp *q = ops->items[j];
        if (op_reads_tensor(q, t)) {
            if (!sums_rows_of(q, t) || inputs_written(ops, i + 1, j, p))
                return false;
            sums[n++] = q;
        }
        if (op_writes_tensor(q, t)) /* what reads t later reads another value */
            break;
    }
    if (!rows || n == 0 || n != readers[t->id])
        return false;
    for (int s = 0; s < n; s++) {
        adjust_readers(sums[s], readers, -1);
        for (int e = 0; e < sums[s]->nout; e++)
            sums[s]->expr[e] = substitute(c, sums[s]->expr[e], p);
        if (tensor_storage(sums[s]->in[0]) == t)
            sums[s]->in[0] = rows;
        adjust_readers(sums[s], readers, 1);
    }
    return true;
}

/* Sums over rows compute the terms a pointwise op would store for them alone (a
 * batch-norm's gradient masked by its ReLU, read by the sums of the batch-norm's
 * gradients), reading its inputs instead; the op, no longer read there, may then merge
 * into the pointwise op after the sums (a second fuse_phase): one pass fewer over the
 * rows, and one value fewer stored and read. */
static bool sums_compute_terms(Ddpc *c, OpList *ops, int *readers) {
    bool any = false;
    for (int i = 0; i < ops->len; i++) {
        IrOp *p = ops->items[i];
        if (p->kind != OP_POINTWISE || p->accumulate)
            continue;
        for (int k = 0; k < p->nout; k++)
            any |= sums_compute(c, ops, i, k, readers);
    }
    return any;
}

/* ------------------------------------------------------------- two stages */

/* The rows of a sum over rows at a full batch. */
static int64_t summed_rows(const IrOp *op) {
    return op->in[0]->elems / op->channels;
}

/* op's first stage: the same sums over chunks of rows into a new work tensor, which op
 * then reads instead of the rows (a batch-norm's x it still reads, for its shift). */
static IrOp *first_stage(Ddpc *c, Ir *ir, IrOp *op) {
    int64_t rows = summed_rows(op), ch = op->channels;
    int64_t chunk = (rows * ch + PARTIAL_INDICES - 1) / PARTIAL_INDICES;
    if (chunk < CHUNK_ROWS)
        chunk = CHUNK_ROWS;
    int64_t chunks = (rows + chunk - 1) / chunk;
    int sums = op->kind == OP_BN_STATS ? 2 : op->nout;
    IrOp *p = ir_op_new(c, op->phase, OP_ROW_PARTIALS);
    Shape shape = {3, {sums, chunks, ch}};
    Tensor *partials = ir_tensor(c, ir, arena_printf(c->arena, "%s:partials", op->out[0]->name), T_WORK, DT_F64,
                                 false, &shape);
    p->code = op->kind;
    p->nin = op->nin;
    memcpy(p->in, op->in, sizeof p->in);
    memcpy(p->expr, op->expr, sizeof p->expr);
    p->out[p->nout++] = partials;
    p->channels = ch;
    p->rows_per_sample = op->in[0]->per_sample / ch;
    p->chunk_rows = chunk;
    p->range = (IrDim){chunks * ch, 0};
    p->layer = op->layer;
    p->path = op->path;
    if (op->kind == OP_REDUCE_ROWS) {
        memset(op->expr, 0, sizeof op->expr);
        op->nin = 0;
    } else {
        op->nin = 1;
    }
    op->in[op->nin++] = partials;
    op->rows_per_sample = p->rows_per_sample;
    op->chunk_rows = chunk;
    return p;
}

static void split_long_sums(Ddpc *c, Ir *ir, OpList *ops) {
    OpList split = {0};
    for (int i = 0; i < ops->len; i++) {
        IrOp *op = ops->items[i];
        if ((op->kind == OP_REDUCE_ROWS || op->kind == OP_BN_STATS) && summed_rows(op) >= SPLIT_ROWS)
            vec_push(c->arena, &split, first_stage(c, ir, op));
        vec_push(c->arena, &split, op);
    }
    *ops = split;
}

void fuse(Ddpc *c, Ir *ir) {
    int *readers = arena_alloc(c->arena, sizeof(int) * (size_t)(ir->tensors.len + 1));
    count_readers(ir, readers);
    for (int ph = 0; ph < PH_COUNT; ph++) {
        fuse_phase(c, &ir->ops[ph], readers);
        if (sums_compute_terms(c, &ir->ops[ph], readers))
            fuse_phase(c, &ir->ops[ph], readers);
        split_long_sums(c, ir, &ir->ops[ph]);
    }
}
