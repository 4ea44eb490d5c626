/* autodiff.c: reverse-mode differentiation of the forward ops into the backward pass.
 *
 * The forward ops are visited last to first. Each adds the ops that turn its output's
 * gradient into its inputs' gradients. Pointwise ops are differentiated symbolically,
 * so every activation, dropout and normalisation expression gets its exact derivative;
 * the derivative's loads of values that pointwise ops computed are replaced by those
 * ops' expressions, so the backward pass recomputes cheap values (and regenerates
 * dropout masks from the counter-based generator) instead of keeping them.
 *
 * A value read by several ops gets one contribution from each: the first written
 * (by the last reader, since the walk goes backward) overwrites, the rest accumulate.
 * A gradient that only passes through (`x + y`) becomes the same tensor when nothing
 * else contributes to it. Only values a parameter depends on get gradients. */
#include <string.h>

#include "ddpc.h"
#include "../runtime/ddp_abi.h"

enum { MAX_REMAT_NODES = 400 };

typedef struct Diff {
    Ddpc *c;
    Ir *ir;
} Diff;

/* A value needs a gradient when a parameter flows into it; a view shares its base's. */
static bool requires(const Tensor *t) {
    return t->needs_grad || (t->base && t->base->needs_grad);
}

/* ----------------------------------------------------- gradient tensors */

static Tensor *grad_of(Diff *d, Tensor *t) {
    if (t->grad)
        return t->grad;
    Ddpc *c = d->c;
    if (t->base) {
        Tensor *base_grad = grad_of(d, t->base);
        Tensor *g = ir_tensor(c, d->ir, arena_printf(c->arena, "d:%s", t->name), T_DACT, t->dtype,
                              t->batched, &t->shape);
        g->base = tensor_storage(base_grad);
        t->grad = g;
        return g;
    }
    TensorKind kind = t->kind == T_PARAM ? T_GRAD : T_DACT;
    Tensor *g = ir_tensor(c, d->ir, arena_printf(c->arena, "d:%s", t->name), kind, t->dtype,
                          t->batched, &t->shape);
    g->layer = t->layer;
    t->grad = g;
    return g;
}

/* Whether the next contribution to t's gradient adds to an earlier one; marks it. */
static bool accumulates(Diff *d, Tensor *t) {
    Tensor *g = tensor_storage(grad_of(d, t));
    bool acc = g->written;
    g->written = true;
    return acc;
}

/* -------------------------------------------------- symbolic derivatives */

static bool is_const(const XExpr *e, double v) {
    return e && e->kind == X_CONST && e->num == v;
}

static XExpr *mul(Ddpc *c, XExpr *a, XExpr *b) {
    if (!a || !b)
        return NULL;
    if (is_const(a, 1))
        return b;
    if (is_const(b, 1))
        return a;
    return x_binary(c, X_MUL, a, b);
}

static XExpr *add(Ddpc *c, XExpr *a, XExpr *b) {
    if (!a)
        return b;
    if (!b)
        return a;
    return x_binary(c, X_ADD, a, b);
}

static XExpr *neg(Ddpc *c, XExpr *a) {
    return a ? x_unary(c, X_NEG, a) : NULL;
}

/* d e / d (t loaded as bc); NULL for zero. */
static XExpr *derive(Ddpc *c, XExpr *e, Tensor *t, Bcast bc) {
    if (!e)
        return NULL;
    XExpr *da, *db;
    switch (e->kind) {
    case X_LOAD:
        return e->t == t && e->bc == bc ? x_const(c, 1) : NULL;
    case X_CONST: case X_SCALAR: case X_GT: case X_ONE_HOT:
        return NULL;
    case X_WHEN:
        db = derive(c, e->b, t, bc);
        return db ? x_binary(c, X_WHEN, e->a, db) : NULL;
    case X_NEG:
        return neg(c, derive(c, e->a, t, bc));
    case X_ADD:
        return add(c, derive(c, e->a, t, bc), derive(c, e->b, t, bc));
    case X_SUB:
        return add(c, derive(c, e->a, t, bc), neg(c, derive(c, e->b, t, bc)));
    case X_MUL:
        return add(c, mul(c, derive(c, e->a, t, bc), e->b), mul(c, e->a, derive(c, e->b, t, bc)));
    case X_DIV:
        da = derive(c, e->a, t, bc);
        db = derive(c, e->b, t, bc);
        return add(c, da ? x_binary(c, X_DIV, da, e->b) : NULL,
                   db ? neg(c, x_binary(c, X_DIV, mul(c, e->a, db), x_binary(c, X_MUL, e->b, e->b)))
                      : NULL);
    case X_MAX: { /* a tie goes to the second operand: relu = max(x, 0) has 0 at 0 */
        XExpr *pick_a = x_binary(c, X_GT, e->a, e->b);
        da = derive(c, e->a, t, bc);
        db = derive(c, e->b, t, bc);
        return add(c, mul(c, pick_a, da),
                   db ? mul(c, x_binary(c, X_SUB, x_const(c, 1), pick_a), db) : NULL);
    }
    case X_EXP:
        return mul(c, e, derive(c, e->a, t, bc));
    case X_LOG:
        da = derive(c, e->a, t, bc);
        return da ? x_binary(c, X_DIV, da, e->a) : NULL;
    case X_SIGMOID:
        return mul(c, x_binary(c, X_MUL, e, x_binary(c, X_SUB, x_const(c, 1), e)), derive(c, e->a, t, bc));
    case X_TANH:
        return mul(c, x_binary(c, X_SUB, x_const(c, 1), x_binary(c, X_MUL, e, e)),
                   derive(c, e->a, t, bc));
    case X_NORMAL_CDF: /* exp(-a^2 / 2) / sqrt(2 pi) */
        return mul(c, x_binary(c, X_MUL, x_const(c, 0.3989422804014327),
                               x_unary(c, X_EXP, x_binary(c, X_MUL, x_const(c, -0.5), x_binary(c, X_MUL, e->a, e->a)))),
                   derive(c, e->a, t, bc));
    case X_EXPM1:
        return mul(c, x_unary(c, X_EXP, e->a), derive(c, e->a, t, bc));
    case X_LOG1P:
        da = derive(c, e->a, t, bc);
        return da ? x_binary(c, X_DIV, da, x_binary(c, X_ADD, x_const(c, 1), e->a)) : NULL;
    case X_SQRT:
        da = derive(c, e->a, t, bc);
        return da ? x_binary(c, X_DIV, mul(c, x_const(c, 0.5), da), e) : NULL;
    }
    return NULL;
}

/* Loads of values made by forward pointwise ops become those ops' expressions. */

typedef struct Remat {
    Ddpc *c;
    int budget;             /* expression nodes still allowed */
} Remat;

/* A load of a forward pointwise value, recomputed from its own expression while the
 * budget lasts (so backward need not keep it). A value kept anyway, which a
 * convolution or a product reads, is loaded instead: one load, where recomputing it
 * reads all of its inputs (a residual block's output would unfold into the blocks
 * before it), and in bf16 the very value forward's next ops read. */
static XExpr *remat_load(XExpr *load, void *arg) {
    Remat *r = arg;
    IrOp *p = load->t->producer;
    if (load->bc != BC_FULL || !p || p->kind != OP_POINTWISE || p->phase != PH_FORWARD || p->nout != 1 ||
        load->t->base || load->t->stored)
        return NULL;
    int size = x_size(p->expr[0]);
    if (size > r->budget)
        return NULL;
    r->budget -= size;
    return x_rewrite_loads(r->c, p->expr[0], remat_load, r);
}

static XExpr *remat(Ddpc *c, XExpr *e, int *budget) {
    Remat r = {c, *budget};
    XExpr *out = x_rewrite_loads(c, e, remat_load, &r);
    *budget = r.budget;
    return out;
}

/* ------------------------------------------------------------ the rules */

static IrOp *op_for(Diff *d, OpKind kind, IrOp *fwd) {
    IrOp *op = ir_op(d->c, d->ir, PH_BACKWARD, kind);
    op->layer = fwd->layer;
    op->path = fwd->path;
    return op;
}

/* A backward op of the given kind that starts as a copy of forward op fwd (its
 * window, axes, tensors), to be rewired by the caller. */
static IrOp *adjoint_copy(Diff *d, OpKind kind, IrOp *fwd) {
    IrOp *op = op_for(d, kind, fwd);
    *op = *fwd;
    op->phase = PH_BACKWARD;
    op->kind = kind;
    return op;
}

/* A contribution dy * deriv to t's gradient, a pointwise op or, for a per-channel
 * value, a sum over rows. */
static void contribute(Diff *d, IrOp *fwd, Tensor *t, Bcast bc, Tensor *dy, XExpr *deriv) {
    Ddpc *c = d->c;
    int budget = MAX_REMAT_NODES;
    deriv = remat(c, deriv, &budget);
    XExpr *term = mul(c, x_load(c, dy, BC_FULL), deriv);
    if (bc == BC_CHANNEL) {
        IrOp *op = op_for(d, OP_REDUCE_ROWS, fwd);
        op->accumulate = accumulates(d, t);
        op->in[op->nin++] = dy;
        op->out[op->nout++] = grad_of(d, t);
        op->expr[0] = term;
        op->channels = t->elems;
        op->rows_per_sample = dy->per_sample / t->elems;
        op->range = (IrDim){t->elems, 0};
        return;
    }
    /* a pure pass-through to a value nothing else reads: share the gradient */
    if (term->kind == X_LOAD && !t->grad && t->consumers == 1 && !t->base && !dy->base &&
        t->elems == dy->elems) {
        t->grad = dy;
        tensor_storage(dy)->written = true;
        return;
    }
    bool acc = accumulates(d, t);
    Tensor *g = grad_of(d, t);
    if (acc)
        term = x_binary(c, X_ADD, x_load(c, g, BC_FULL), term);
    IrOp *op = op_for(d, OP_POINTWISE, fwd);
    op->out[op->nout++] = g;
    op->expr[0] = term;
    op->range = g->batched ? (IrDim){0, g->per_sample} : (IrDim){g->elems, 0};
}

typedef struct LoadRef {
    Tensor *t;
    Bcast bc;
} LoadRef;

static void collect_loads(XExpr *e, LoadRef *refs, int *n, int cap) {
    if (!e)
        return;
    if (e->kind == X_LOAD) {
        for (int i = 0; i < *n; i++)
            if (refs[i].t == e->t && refs[i].bc == e->bc)
                return;
        if (*n < cap)
            refs[(*n)++] = (LoadRef){e->t, e->bc};
        return;
    }
    collect_loads(e->a, refs, n, cap);
    collect_loads(e->b, refs, n, cap);
}

/* Structural equality of expressions, to reuse a gradient already computed. */
static bool x_equal(const XExpr *a, const XExpr *b) {
    if (a == b)
        return true;
    if (!a || !b || a->kind != b->kind || a->t != b->t || a->bc != b->bc || a->num != b->num ||
        a->scalar != b->scalar)
        return false;
    return x_equal(a->a, b->a) && x_equal(a->b, b->b);
}

static void backward_pointwise(Diff *d, IrOp *op) {
    Tensor *y = op->out[0];
    if (!y->grad)
        return;
    LoadRef refs[16];
    int n = 0;
    collect_loads(op->expr[0], refs, &n, 16);
    /* full-size inputs first: a bias's gradient is then the sum of the rows of the
     * gradient its sibling just stored (z + b: dz and db have one derivative) */
    XExpr *full_deriv[16];
    Tensor *full_grad[16];
    int nfull = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            if (!requires(refs[i].t) || (refs[i].bc == BC_FULL) != (pass == 0))
                continue;
            XExpr *deriv = derive(d->c, op->expr[0], refs[i].t, refs[i].bc);
            if (!deriv)
                continue;
            Tensor *dy = y->grad;
            if (pass == 1)
                for (int k = 0; k < nfull; k++)
                    if (full_grad[k] && x_equal(full_deriv[k], deriv)) {
                        dy = full_grad[k];
                        deriv = x_const(d->c, 1);
                        break;
                    }
            bool fresh = pass == 0 && !refs[i].t->grad;
            contribute(d, op, refs[i].t, refs[i].bc, dy, deriv);
            if (pass == 0 && nfull < 16) {
                full_deriv[nfull] = deriv;
                full_grad[nfull++] = fresh ? refs[i].t->grad : NULL;
            }
        }
}

/* The im2col that made a forward GEMM's columns, made again for the backward pass:
 * columns are cheap to rebuild and large to keep. */
static Tensor *columns_again(Diff *d, IrOp *gemm) {
    Tensor *col = gemm->in[0];
    IrOp *im2col = col->producer;
    if (!im2col || im2col->kind != OP_IM2COL)
        return col;
    Tensor *again = ir_tensor(d->c, d->ir, arena_printf(d->c->arena, "%s'", col->name), T_WORK,
                              col->dtype, true, &col->shape);
    again->layer = col->layer;
    IrOp *op = adjoint_copy(d, OP_IM2COL, im2col);
    op->out[0] = again;
    return again;
}

/* One adjoint product of forward product fwd: the gradient of its operand `of` (0: A,
 * 1: B) = alpha op(x) op(y), each operand laid out as fwd's operand named by its
 * number (0: A, 1: B, 2: C or its gradient). */
typedef struct Factor {
    Tensor *t;
    int as;
    bool transposed;
} Factor;

static void adjoint_gemm(Diff *d, IrOp *fwd, Factor x, Factor y, int of, IrDim m, IrDim n, IrDim k) {
    Tensor *t = fwd->in[of];
    IrOp *g = op_for(d, OP_GEMM, fwd);
    g->accumulate = accumulates(d, t);
    g->in[g->nin++] = x.t;
    g->in[g->nin++] = y.t;
    g->out[g->nout++] = grad_of(d, t);
    g->ta = x.transposed;
    g->tb = y.transposed;
    g->m = m;
    g->n = n;
    g->k = k;
    g->alpha = fwd->alpha;
    g->batches = fwd->batches;
    g->groups = fwd->groups;
    int as[3] = {x.as, y.as, of};
    for (int o = 0; o < 3; o++) {
        g->ld[o] = fwd->ld[as[o]];
        g->batch_stride[o] = fwd->batch_stride[as[o]];
        g->group_stride[o] = fwd->group_stride[as[o]];
    }
}

/* C = alpha op(A) op(B): d op(A) = alpha dC op(B)^T, d op(B) = alpha op(A)^T dC, each
 * turned back when its factor was transposed (dA = alpha op(B) dC^T, dB = alpha dC^T op(A)). */
static void backward_gemm(Diff *d, IrOp *op) {
    Tensor *a = op->in[0], *b = op->in[1], *cc = op->out[0];
    if (!cc->grad)
        return;
    Factor dc = {cc->grad, 2, false}, dc_t = {cc->grad, 2, true};
    if (requires(a)) {
        if (!op->ta)
            adjoint_gemm(d, op, dc, (Factor){b, 1, !op->tb}, 0, op->m, op->k, op->n);
        else
            adjoint_gemm(d, op, (Factor){b, 1, op->tb}, dc_t, 0, op->k, op->m, op->n);
    }
    if (requires(b)) {
        Tensor *cols = columns_again(d, op);
        if (!op->tb)
            adjoint_gemm(d, op, (Factor){cols, 0, !op->ta}, dc, 1, op->k, op->n, op->m);
        else
            adjoint_gemm(d, op, dc_t, (Factor){cols, 0, op->ta}, 1, op->n, op->k, op->m);
    }
}

/* Ops whose adjoint reads the output's gradient (and perhaps the input) and writes
 * the input's: im2col, the pools, softmax, layernorm, concat. */
static void backward_simple(Diff *d, IrOp *op, OpKind kind) {
    Tensor *x = op->in[0], *y = op->out[0];
    if (!y->grad || !requires(x))
        return;
    IrOp *b = adjoint_copy(d, kind, op);
    b->nin = 0;
    b->nout = 0;
    if (kind == OP_MAXPOOL_BWD || kind == OP_LAYERNORM_BWD)
        b->in[b->nin++] = x;
    if (kind == OP_SOFTMAX_BWD)
        b->in[b->nin++] = y;
    b->in[b->nin++] = y->grad;
    b->accumulate = accumulates(d, x);
    b->out[b->nout++] = grad_of(d, x);
    b->range = (IrDim){0, x->per_sample};
    if (kind == OP_SOFTMAX_BWD || kind == OP_SPLIT || kind == OP_LAYERNORM_BWD)
        b->range = op->range;
    if (kind == OP_COL2IM || kind == OP_MAXPOOL_BWD || kind == OP_AVGPOOL_BWD) /* one index per pixel */
        b->range = (IrDim){0, x->per_sample / x->shape.dim[x->shape.rank - 1]};
    if (kind == OP_MAXPOOL_BWD &&
        ir_windows_tile(b, x->shape.dim[0], x->shape.dim[1], y->shape.dim[0], y->shape.dim[1])) /* per window */
        b->range = (IrDim){0, y->per_sample / y->shape.dim[y->shape.rank - 1]};
}

/* A depthwise convolution's adjoints: x's gradient one index per input pixel (every
 * window covering it), the filters' one index per filter element (a sum over every
 * output pixel of the batch). */
static void backward_depthwise(Diff *d, IrOp *op) {
    Tensor *x = op->in[0], *w = op->in[1], *y = op->out[0];
    if (!y->grad)
        return;
    if (requires(x)) {
        IrOp *b = adjoint_copy(d, OP_DEPTHWISE_DATA, op);
        b->in[0] = y->grad;
        b->in[1] = w;
        b->accumulate = accumulates(d, x);
        b->out[0] = grad_of(d, x);
        b->range = (IrDim){0, x->per_sample / x->shape.dim[2]};
    }
    IrOp *f = adjoint_copy(d, OP_DEPTHWISE_FILTER, op);
    f->in[0] = x;
    f->in[1] = y->grad;
    f->accumulate = accumulates(d, w);
    f->out[0] = grad_of(d, w);
    f->range = (IrDim){w->elems, 0};
}

/* A library convolution's adjoints, on the library path: x's gradient from y's and
 * forward's KRSC filters (kept till then: a copy made again would be the same bytes,
 * for a kernel launch more), the filters' gradient from x and y's (KRSC, turned HWIO
 * into the parameter's gradient). The generated path (this layer's im2col and
 * product, visited next) writes the same gradients, so each path must find them as
 * they are now: whether a contribution overwrites or adds is decided for both alike. */
static void backward_conv(Diff *d, IrOp *op) {
    Ddpc *c = d->c;
    Tensor *x = op->in[0], *krsc = op->in[1], *y = op->out[0];
    Tensor *w = krsc->producer->in[0];
    if (!y->grad)
        return;
    Tensor *x_grad = requires(x) ? tensor_storage(grad_of(d, x)) : NULL;
    Tensor *w_grad = tensor_storage(grad_of(d, w));
    bool x_written = x_grad && x_grad->written, w_written = w_grad->written;
    if (x_grad) {
        IrOp *b = adjoint_copy(d, OP_CONV, op);
        b->code = DDP_CONV_BACKWARD_DATA;
        b->in[0] = y->grad;
        b->accumulate = accumulates(d, x);
        b->out[0] = grad_of(d, x);
        b->out[1] = ir_conv_workspace(c, d->ir, op->layer, "data_workspace");
    }
    Tensor *krsc_grad = ir_tensor(c, d->ir, arena_printf(c->arena, "d:%s", krsc->name), T_WORK, krsc->dtype, false,
                                  &krsc->shape);
    IrOp *f = adjoint_copy(d, OP_CONV, op);
    f->code = DDP_CONV_BACKWARD_FILTER;
    f->in[1] = y->grad;
    f->out[0] = krsc_grad;
    f->out[1] = ir_conv_workspace(c, d->ir, op->layer, "filter_workspace");
    f->accumulate = false;
    IrOp *back = op_for(d, OP_FILTERS_TO_HWIO, op);
    back->in[back->nin++] = krsc_grad;
    back->accumulate = accumulates(d, w);
    back->out[back->nout++] = grad_of(d, w);
    back->range = (IrDim){w->elems, 0};
    if (x_grad)
        x_grad->written = x_written;
    w_grad->written = w_written;
}

/* mean and var of x, per channel: dx += (dmean + 2 dvar (x - mean)) / rows. */
static void backward_bn_stats(Diff *d, IrOp *op) {
    Ddpc *c = d->c;
    Tensor *x = op->in[0], *mean = op->out[0], *var = op->out[1];
    if (!requires(x) || (!mean->grad && !var->grad))
        return;
    int64_t rows_per_sample = x->per_sample / op->channels;
    XExpr *sum = NULL;
    if (mean->grad)
        sum = x_load(c, mean->grad, BC_CHANNEL);
    if (var->grad)
        sum = add(c, sum, x_binary(c, X_MUL, x_binary(c, X_MUL, x_const(c, 2), x_load(c, var->grad, BC_CHANNEL)),
                                   x_binary(c, X_SUB, x_load(c, x, BC_FULL), x_load(c, mean, BC_CHANNEL))));
    XExpr *rows = x_binary(c, X_MUL, x_scalar(c, DDP_S_LOCAL_BATCH), x_const(c, (double)rows_per_sample));
    XExpr *term = x_binary(c, X_DIV, sum, rows);
    bool acc = accumulates(d, x);
    Tensor *g = grad_of(d, x);
    if (acc)
        term = x_binary(c, X_ADD, x_load(c, g, BC_FULL), term);
    IrOp *b = op_for(d, OP_POINTWISE, op);
    b->out[b->nout++] = g;
    b->expr[0] = term;
    b->range = (IrDim){0, x->per_sample};
}

/* ---------------------------------------------------------------- driver */

static void mark_needs_grad(Ir *ir) {
    for (int i = 0; i < ir->params.len; i++)
        ir->params.items[i]->needs_grad = true;
    OpList *ops = &ir->ops[PH_FORWARD];
    for (int i = 0; i < ops->len; i++) {
        IrOp *op = ops->items[i];
        if (op->kind == OP_LOSS || op->kind == OP_METRIC || op->kind == OP_ACCUMULATE)
            continue;
        bool any = false;
        for (int k = 0; k < op->nin; k++)
            any |= requires(op->in[k]);
        if (op->kind == OP_POINTWISE) {
            LoadRef refs[16];
            int n = 0;
            collect_loads(op->expr[0], refs, &n, 16);
            for (int k = 0; k < n; k++)
                any |= requires(refs[k].t);
        }
        int differentiable = op->kind == OP_BN_STATS ? 2 : op->nout; /* not the running statistics */
        for (int k = 0; k < differentiable; k++)
            op->out[k]->needs_grad |= any;
    }
    for (int i = 0; i < ir->tensors.len; i++) {
        Tensor *t = ir->tensors.items[i];
        if (t->base && requires(t))
            t->needs_grad = t->base->needs_grad = true;
    }
}

/* Readers of each tensor in the forward pass, which of them are stored whatever
 * backward reads, and each tensor's producer. */
static void count_forward_uses(Ir *ir) {
    OpList *ops = &ir->ops[PH_FORWARD];
    for (int i = 0; i < ops->len; i++) {
        IrOp *op = ops->items[i];
        LoadRef refs[16];
        int n = 0;
        if (op->kind == OP_POINTWISE)
            collect_loads(op->expr[0], refs, &n, 16);
        for (int k = 0; k < op->nin; k++) {
            refs[n++] = (LoadRef){op->in[k], BC_FULL};
            if (op->kind != OP_POINTWISE)
                tensor_storage(op->in[k])->stored = true;
        }
        for (int k = 0; k < n; k++)
            refs[k].t->consumers++;
        for (int k = 0; k < op->nout; k++)
            if (!op->out[k]->producer)
                op->out[k]->producer = op;
    }
}

void autodiff(Ddpc *c, Ir *ir) {
    Diff d = {c, ir};
    count_forward_uses(ir);
    mark_needs_grad(ir);
    tensor_storage(ir->output->grad)->written = true;
    OpList *fwd = &ir->ops[PH_FORWARD];
    for (int i = fwd->len - 1; i >= 0; i--) {
        IrOp *op = fwd->items[i];
        switch (op->kind) {
        case OP_GEMM: backward_gemm(&d, op); break;
        case OP_POINTWISE: backward_pointwise(&d, op); break;
        case OP_IM2COL: backward_simple(&d, op, OP_COL2IM); break;
        case OP_CONV: backward_conv(&d, op); break;
        case OP_DEPTHWISE: backward_depthwise(&d, op); break;
        case OP_MAXPOOL: backward_simple(&d, op, OP_MAXPOOL_BWD); break;
        case OP_AVGPOOL: backward_simple(&d, op, OP_AVGPOOL_BWD); break;
        case OP_GAP: backward_simple(&d, op, OP_GAP_BWD); break;
        case OP_SOFTMAX: backward_simple(&d, op, OP_SOFTMAX_BWD); break;
        case OP_LAYERNORM: backward_simple(&d, op, OP_LAYERNORM_BWD); break;
        case OP_CONCAT: backward_simple(&d, op, OP_SPLIT); break;
        case OP_BN_STATS: backward_bn_stats(&d, op); break;
        default: break;
        }
    }
    /* every parameter has a gradient slot, zero where nothing reaches it */
    for (int i = 0; i < ir->params.len; i++)
        grad_of(&d, ir->params.items[i]);
}
