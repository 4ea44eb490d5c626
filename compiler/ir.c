/* ir.c: the trained model's layer graph lowered to tensor ops.
 *
 * Each layer becomes a few primitive ops on tensors of a replica's batch: matrix
 * products (dense, and convolutions after im2col), pointwise expressions (bias,
 * activations, dropout, residual sums, batch normalisation's arithmetic), and the
 * window, reduction and copy ops that are neither. Pointwise ops are expressions, not
 * opaque kinds, so autodiff can differentiate any of them and fusion can merge them.
 * The forward pass is lowered twice, for training and for evaluation (dropout off,
 * batchnorm on running statistics); the loss and the metrics follow each; autodiff
 * adds the backward pass and this file the optimizer. */
#include <math.h>
#include <string.h>

#include "ddpc.h"
#include "../runtime/ddp_abi.h"

int64_t dtype_size(DType dt) {
    return dt == DT_U8 ? 1 : dt == DT_BF16 ? 2 : dt == DT_F32 || dt == DT_I32 ? 4 : 8;
}

/* Which weight decay a trainable parameter takes: a normalisation layer's own, a
 * bias's (a vector of a layer that has a kernel), or the kernels'; 0 for statistics. */
int decay_group(const Tensor *t) {
    if (t->kind != T_PARAM)
        return 0;
    if (t->layer && (t->layer->op == L_BATCHNORM || t->layer->op == L_LAYERNORM))
        return DDP_DECAY_NORMS;
    if (t->layer && t->layer->op == L_POSITION_EMBEDDING) /* an offset added, as a bias is (timm's pos_embed) */
        return DDP_DECAY_BIASES;
    return t->shape.rank == 1 ? DDP_DECAY_BIASES : DDP_DECAY_WEIGHTS;
}

/* The memory tables' name for the CONSTANTS region, 16 wide. */
const char *constants_label(const Ir *ir) {
    return ir->trust ? "parameter table " : "decay groups    ";
}

/* The bytes of the CONSTANTS region (ddp_abi.h). */
int64_t constant_bytes(const Ir *ir) {
    return ddp_constants_bytes(ir->param_count, ir->params.len, ir->decay_groups != NULL, ir->trust != NULL);
}

/* What the GRADS region holds besides the gradients, for the memory tables: "" or a
 * parenthesis. */
const char *gradient_extras(const Ir *ir) {
    bool sum = ir->config->accumulate_batches > 1;
    bool wire = ir->config->allreduce_precision == DDP_ALLREDUCE_BF16 && ir->dtype == DT_F32;
    return sum && wire ? "(and their sum over the step's batches, and their bf16 copy for the all-reduce)"
           : sum       ? "(and their sum over the step's batches)"
           : wire      ? "(and their bf16 copy, for the all-reduce)"
                       : "";
}

const char *dtype_name(DType dt) {
    static const char *const names[] = {"f32", "f64", "i32", "i64", "bf16", "u8"};
    return names[dt];
}

const char *op_kind_name(OpKind k) {
    static const char *const names[] = {
        [OP_GEMM] = "gemm", [OP_POINTWISE] = "pointwise", [OP_DROPOUT_MASK] = "dropout_mask", [OP_IM2COL] = "im2col",
        [OP_COL2IM] = "col2im", [OP_CONV] = "conv", [OP_FILTERS_TO_KRSC] = "filters_to_krsc",
        [OP_FILTERS_TO_HWIO] = "filters_to_hwio", [OP_MAXPOOL] = "maxpool", [OP_MAXPOOL_BWD] = "maxpool_bwd",
        [OP_AVGPOOL] = "avgpool", [OP_AVGPOOL_BWD] = "avgpool_bwd", [OP_GAP] = "gap",
        [OP_GAP_BWD] = "gap_bwd",
        [OP_DEPTHWISE] = "depthwise", [OP_DEPTHWISE_DATA] = "depthwise_data", [OP_DEPTHWISE_FILTER] = "depthwise_filter", [OP_BN_STATS] = "bn_stats", [OP_SOFTMAX] = "softmax",
        [OP_SOFTMAX_BWD] = "softmax_bwd", [OP_LAYERNORM] = "layernorm", [OP_LAYERNORM_BWD] = "layernorm_bwd",
        [OP_REDUCE_ROWS] = "reduce_rows", [OP_ROW_PARTIALS] = "row_partials",
        [OP_CONCAT] = "concat", [OP_SPLIT] = "split", [OP_LOSS] = "loss",
        [OP_METRIC] = "metric", [OP_ACCUMULATE] = "accumulate", [OP_FILL] = "fill",
        [OP_FIND_NONFINITE] = "find_nonfinite", [OP_NONFINITE_FLAG] = "nonfinite_flag", [OP_OPTIMIZER] = "optimizer",
        [OP_GRAD_SQUARES] = "grad_squares", [OP_TRUST_RATIO] = "trust_ratio", [OP_CLIP_FACTOR] = "clip_factor",
        [OP_BUCKET_READY] = "bucket_ready", [OP_WAIT_BUCKETS] = "wait_buckets",
        [OP_METRICS_READY] = "metrics_ready",
    };
    return names[k];
}

/* ------------------------------------------------------------ builders */

Tensor *tensor_storage(Tensor *t) {
    return t->base ? t->base : t;
}

Tensor *ir_tensor(Ddpc *c, Ir *ir, const char *name, TensorKind kind, DType dt, bool batched,
                  const Shape *shape) {
    Tensor *t = arena_alloc(c->arena, sizeof *t);
    t->id = ir->tensors.len;
    t->name = name;
    t->kind = kind;
    t->dtype = dt;
    t->batched = batched;
    t->shape = *shape;
    int64_t n = 1;
    for (int i = 0; i < shape->rank; i++)
        n *= shape->dim[i];
    t->per_sample = batched ? n : 0;
    t->elems = batched ? n * ir->batch : n;
    t->slot = -1;
    t->init = -1;
    t->first_use = t->last_use = -1;
    vec_push(c->arena, &ir->tensors, t);
    return t;
}

IrOp *ir_op_new(Ddpc *c, Phase phase, OpKind kind) {
    IrOp *op = arena_alloc(c->arena, sizeof *op);
    op->kind = kind;
    op->phase = phase;
    op->kernel_index = -1;
    op->alpha = 1;
    op->batches = (IrDim){1, 0};
    op->groups = 1;
    return op;
}

IrOp *ir_op(Ddpc *c, Ir *ir, Phase phase, OpKind kind) {
    IrOp *op = ir_op_new(c, phase, kind);
    vec_push(c->arena, &ir->ops[phase], op);
    return op;
}

static void add_in(IrOp *op, Tensor *t) {
    op->in[op->nin++] = t;
}

static void add_out(IrOp *op, Tensor *t) {
    op->out[op->nout++] = t;
}

XExpr *x_load(Ddpc *c, Tensor *t, Bcast bc) {
    XExpr *e = arena_alloc(c->arena, sizeof *e);
    e->kind = X_LOAD;
    e->t = t;
    e->bc = bc;
    if (bc == BC_CHANNEL)
        e->channels = t->elems;
    return e;
}

XExpr *x_const(Ddpc *c, double v) {
    XExpr *e = arena_alloc(c->arena, sizeof *e);
    e->kind = X_CONST;
    e->num = v;
    return e;
}

XExpr *x_scalar(Ddpc *c, int slot) {
    XExpr *e = arena_alloc(c->arena, sizeof *e);
    e->kind = X_SCALAR;
    e->scalar = slot;
    return e;
}

XExpr *x_unary(Ddpc *c, XKind k, XExpr *a) {
    XExpr *e = arena_alloc(c->arena, sizeof *e);
    e->kind = k;
    e->a = a;
    return e;
}

XExpr *x_rewrite_loads(Ddpc *c, XExpr *e, XExpr *(*replace)(XExpr *load, void *arg), void *arg) {
    if (!e)
        return NULL;
    if (e->kind == X_LOAD) {
        XExpr *r = replace(e, arg);
        return r ? r : e;
    }
    XExpr *a = x_rewrite_loads(c, e->a, replace, arg), *b = x_rewrite_loads(c, e->b, replace, arg);
    if (a == e->a && b == e->b)
        return e;
    XExpr *copy = arena_alloc(c->arena, sizeof *copy);
    *copy = *e;
    copy->a = a;
    copy->b = b;
    return copy;
}

int x_size(const XExpr *e) {
    return e ? 1 + x_size(e->a) + x_size(e->b) : 0;
}

XExpr *x_binary(Ddpc *c, XKind k, XExpr *a, XExpr *b) {
    XExpr *e = arena_alloc(c->arena, sizeof *e);
    e->kind = k;
    e->a = a;
    e->b = b;
    return e;
}

static IrDim dim_fixed(int64_t v) {
    return (IrDim){v, 0};
}

static IrDim dim_batched(int64_t per_sample) {
    return (IrDim){0, per_sample};
}

/* The index range of a kernel over every element of t. */
static IrDim range_of(const Tensor *t) {
    return t->batched ? dim_batched(t->per_sample) : dim_fixed(t->elems);
}

/* A pointwise op writing one tensor. */
static IrOp *pointwise(Ddpc *c, Ir *ir, Phase ph, Tensor *out, XExpr *e) {
    IrOp *op = ir_op(c, ir, ph, OP_POINTWISE);
    add_out(op, out);
    op->expr[0] = e;
    op->range = range_of(out);
    return op;
}

/* ------------------------------------------------------------ lowering */

typedef struct LayerParams {
    Tensor *weight, *bias, *running_mean, *running_var;
    Tensor *proj_weight[4], *proj_bias[4]; /* attention's query, key, value and output projections */
} LayerParams;

typedef struct Lower {
    Ddpc *c;
    Ir *ir;
    Phase phase;
    Tensor **value;        /* by GNode id: the tensor holding its output */
    LayerParams *params;   /* by GNode id, made once, shared by both passes */
    int64_t dropout_keys;
} Lower;

static const char *dotted(Ddpc *c, const char *path, const char *what) {
    char *s = arena_printf(c->arena, "%s.%s", path, what);
    for (char *p = s; *p; p++)
        if (*p == '/')
            *p = '.';
    return s;
}

static Shape shape_of(int rank, const int64_t *dims) {
    Shape s = {rank, {0}};
    memcpy(s.dim, dims, sizeof(int64_t) * (size_t)rank);
    return s;
}

static Tensor *param(Lower *L, GNode *n, const char *what, TensorKind kind, Shape s,
                     const char *layout, int64_t init) {
    Tensor *t = ir_tensor(L->c, L->ir, dotted(L->c, n->name, what), kind, L->ir->dtype, false, &s);
    t->layer = n;
    t->layout = layout;
    t->init = init;
    vec_push(L->c->arena, kind == T_PARAM ? &L->ir->params : &L->ir->stats, t);
    return t;
}

static Tensor *activation(Lower *L, GNode *n, const char *suffix, const Shape *s) {
    const char *name = L->phase == PH_EVAL
                           ? arena_printf(L->c->arena, "eval:%s%s", n->name, suffix)
                           : arena_printf(L->c->arena, "%s%s", n->name, suffix);
    Tensor *t = ir_tensor(L->c, L->ir, name, T_ACT, L->ir->dtype, true, s);
    t->layer = n;
    return t;
}

static Tensor *view(Lower *L, GNode *n, Tensor *base, const Shape *s) {
    Tensor *t = activation(L, n, "", s);
    t->base = tensor_storage(base);
    return t;
}

/* a > 0 ? 1 : 0, and its complement */
static XExpr *positive(Ddpc *c, XExpr *a) {
    return x_binary(c, X_GT, a, x_const(c, 0));
}

static XExpr *not_positive(Ddpc *c, XExpr *a) {
    return x_binary(c, X_SUB, x_const(c, 1), positive(c, a));
}

/* min(x, top) as -max(-x, -top): exact, a NaN kept, and at x = top the slope 0 (a tie
 * goes to max's second operand), as PyTorch's hardtanh has it */
static XExpr *at_most(Ddpc *c, XExpr *x, double top) {
    return x_unary(c, X_NEG, x_binary(c, X_MAX, x_unary(c, X_NEG, x), x_const(c, -top)));
}

/* min(max(x, 0), 6) */
static XExpr *relu6(Ddpc *c, XExpr *x) {
    return at_most(c, x_binary(c, X_MAX, x, x_const(c, 0)), 6);
}

/* log(1 + exp(x)) as max(x, 0) + log1p(exp(-|x|)): exp never overflows, so neither
 * the value nor its derivative becomes infinite over infinite */
static XExpr *softplus(Ddpc *c, XExpr *x) {
    XExpr *abs = x_binary(c, X_MAX, x, x_unary(c, X_NEG, x));
    return x_binary(c, X_ADD, x_binary(c, X_MAX, x, x_const(c, 0)),
                    x_unary(c, X_LOG1P, x_unary(c, X_EXP, x_unary(c, X_NEG, abs))));
}

/* act(z + bias): the activation is applied as an expression, so autodiff and fusion
 * see through it. slope: leaky_relu's negative slope, elu's alpha. */
static XExpr *activate(Ddpc *c, const char *act, double slope, XExpr *x) {
    if (!act)
        return x;
    if (strcmp(act, "relu") == 0)
        return x_binary(c, X_MAX, x, x_const(c, 0));
    if (strcmp(act, "leaky_relu") == 0) /* slope < 1: the larger of x and slope x; at 0, slope (PyTorch's) */
        return x_binary(c, X_MAX, x, x_binary(c, X_MUL, x_const(c, slope), x));
    if (strcmp(act, "elu") == 0) /* exp(x) for x > 0 is thrown away, infinite or not */
        return x_binary(c, X_ADD, x_binary(c, X_WHEN, positive(c, x), x),
                        x_binary(c, X_WHEN, not_positive(c, x),
                                 x_binary(c, X_MUL, x_const(c, slope), x_unary(c, X_EXPM1, x))));
    if (strcmp(act, "softplus") == 0)
        return softplus(c, x);
    if (strcmp(act, "mish") == 0) /* Misra, 2019 */
        return x_binary(c, X_MUL, x, x_unary(c, X_TANH, softplus(c, x)));
    if (strcmp(act, "relu6") == 0) /* MobileNetV2's */
        return relu6(c, x);
    if (strcmp(act, "hard_swish") == 0) /* MobileNetV3's */
        return x_binary(c, X_MUL, x, x_binary(c, X_DIV, relu6(c, x_binary(c, X_ADD, x, x_const(c, 3))), x_const(c, 6)));
    if (strcmp(act, "sigmoid") == 0)
        return x_unary(c, X_SIGMOID, x);
    if (strcmp(act, "silu") == 0) /* x * sigmoid(x), the swish of Ramachandran et al. */
        return x_binary(c, X_MUL, x, x_unary(c, X_SIGMOID, x));
    if (strcmp(act, "tanh") == 0)
        return x_unary(c, X_TANH, x);
    if (strcmp(act, "gelu") == 0) /* x * Phi(x), Phi the standard normal's distribution */
        return x_binary(c, X_MUL, x, x_unary(c, X_NORMAL_CDF, x));
    return x; /* identity; softmax as an activation is lowered as its own op */
}

/* The bias and activation after a matrix product, as one pointwise op; a softmax
 * activation is its own op after it. */
static Tensor *activation_op(Lower *L, GNode *n, Tensor *z, const char *act, Tensor *bias) {
    Ddpc *c = L->c;
    bool softmax = act && strcmp(act, "softmax") == 0;
    const char *elementwise = softmax ? NULL : act;
    Tensor *y = z;
    if (bias || elementwise) {
        y = activation(L, n, softmax ? ":a" : "", &z->shape);
        XExpr *e = x_load(c, z, BC_FULL);
        if (bias)
            e = x_binary(c, X_ADD, e, x_load(c, bias, BC_CHANNEL));
        pointwise(c, L->ir, L->phase, y, activate(c, elementwise, n->attrs.slope, e))->layer = n;
    }
    if (softmax) {
        Tensor *s = activation(L, n, "", &z->shape);
        IrOp *op = ir_op(c, L->ir, L->phase, OP_SOFTMAX);
        add_in(op, y);
        add_out(op, s);
        op->axis_outer = y->per_sample / y->shape.dim[y->shape.rank - 1];
        op->axis_len = y->shape.dim[y->shape.rank - 1];
        op->axis_inner = 1;
        op->range = dim_batched(op->axis_outer);
        op->layer = n;
        y = s;
    }
    return y;
}

/* z [..., u] = x [..., k] w [k, u]: one product, a row for every position of every sample. */
static void product_over_last_axis(Lower *L, GNode *n, Tensor *x, Tensor *w, Tensor *z) {
    int64_t k = w->shape.dim[0];
    IrOp *op = ir_op(L->c, L->ir, L->phase, OP_GEMM);
    add_in(op, x);
    add_in(op, w);
    add_out(op, z);
    op->m = dim_batched(x->per_sample / k);
    op->n = dim_fixed(w->shape.dim[1]);
    op->k = dim_fixed(k);
    op->layer = n;
}

/* Layer n's weight [in, out], read as a dense layer's: fan-in in, fan-out out. */
static Tensor *matrix_weight(Lower *L, GNode *n, const char *name, int64_t in, int64_t out, int64_t init) {
    int64_t wd[2] = {in, out};
    Tensor *w = param(L, n, name, T_PARAM, shape_of(2, wd), "IO", init);
    w->fan_in = in;
    w->fan_out = out;
    return w;
}

static void lower_dense(Lower *L, GNode *n) {
    Tensor *x = L->value[n->inputs[0]->id];
    int64_t k = x->shape.dim[x->shape.rank - 1], u = n->attrs.units;
    LayerParams *p = &L->params[n->id];
    if (!p->weight) {
        p->weight = matrix_weight(L, n, "weight", k, u, n->attrs.init);
        if (n->attrs.bias)
            p->bias = param(L, n, "bias", T_PARAM, shape_of(1, &u), "C", n->attrs.bias_init);
    }
    bool more = p->bias || n->attrs.activation;
    Tensor *z = activation(L, n, more ? ":z" : "", &n->out);
    product_over_last_axis(L, n, x, p->weight, z);
    L->value[n->id] = activation_op(L, n, z, n->attrs.activation, p->bias);
}

/* x in training with a share `rate` of its values zeroed at random, the rest scaled by
 * 1 / (1 - rate), into a tensor named by suffix. The mask, keyed by layer n's place in
 * the graph and the same on every worker, is drawn into a tensor of bytes that the
 * backward pass reads again: a Philox draw gives four elements their draws, where
 * drawing each element's as the pointwise kernels read it would take a draw each,
 * twice. */
static Tensor *dropped(Lower *L, GNode *n, Tensor *x, double rate, const char *suffix) {
    Ddpc *c = L->c;
    Tensor *mask = ir_tensor(c, L->ir, arena_printf(c->arena, "%s%s:keep", n->name, suffix), T_ACT, DT_U8,
                             x->batched, &x->shape);
    mask->layer = n;
    IrOp *draw = ir_op(c, L->ir, L->phase, OP_DROPOUT_MASK);
    add_out(draw, mask);
    draw->rate = rate;
    draw->key = n->id;
    draw->range = dim_batched((mask->per_sample + DROPOUT_DRAW - 1) / DROPOUT_DRAW);
    draw->layer = n;
    Tensor *y = activation(L, n, suffix, &x->shape);
    XExpr *e = x_binary(c, X_MUL, x_load(c, x, BC_FULL),
                        x_binary(c, X_MUL, x_load(c, mask, BC_FULL), x_const(c, 1 / (1 - rate))));
    pointwise(c, L->ir, L->phase, y, e)->layer = n;
    return y;
}

/* ------------------------------------------------------------- embedding */

/* A token's vector as the product of its one-hot row and the table [vocab, units]:
 * forward a GEMM, and backward, the table's gradient one^T dy, a GEMM that sums each
 * token's rows in a fixed order (a scatter-add's atomics would not), on a GPU on its
 * tensor cores. It costs vocab x units per token, what the language model's output
 * layer costs anyway (T5X's one-hot embedding on TPUs). The CPU's runtime gathers the
 * rows instead, and adds the gradient's rows up by token in order (ddp_gemm.one_hot). */
static void lower_embedding(Lower *L, GNode *n) {
    Ddpc *c = L->c;
    Tensor *x = L->value[n->inputs[0]->id];
    int64_t vocab = n->attrs.vocab;
    LayerParams *p = &L->params[n->id];
    if (!p->weight)
        p->weight = matrix_weight(L, n, "weight", vocab, n->attrs.units, n->attrs.init);
    Shape hot_shape = n->out;
    hot_shape.dim[hot_shape.rank - 1] = vocab;
    Tensor *hot = activation(L, n, ":one_hot", &hot_shape);
    if (x->kind == T_INPUT) /* the input region: live through the whole step */
        hot->one_hot_of = x;
    XExpr *e = arena_alloc(c->arena, sizeof *e);
    e->kind = X_ONE_HOT;
    e->channels = vocab;
    e->a = x_load(c, x, BC_ROW);
    e->a->channels = vocab;
    pointwise(c, L->ir, L->phase, hot, e)->layer = n;
    Tensor *y = activation(L, n, "", &n->out);
    product_over_last_axis(L, n, hot, p->weight, y);
    L->value[n->id] = y;
}

/* ------------------------------------------------------------- attention */

/* x [..., k] -> x w [..., u] + bias, named by suffix. */
static Tensor *projection(Lower *L, GNode *n, Tensor *x, Tensor *w, Tensor *bias, const char *suffix) {
    Shape s = x->shape;
    s.dim[s.rank - 1] = w->shape.dim[1];
    Tensor *z = activation(L, n, arena_printf(L->c->arena, "%s%s", suffix, bias ? ":z" : ""), &s);
    product_over_last_axis(L, n, x, w, z);
    if (!bias)
        return z;
    Tensor *y = activation(L, n, suffix, &s);
    pointwise(L->c, L->ir, L->phase, y,
              x_binary(L->c, X_ADD, x_load(L->c, z, BC_FULL), x_load(L->c, bias, BC_CHANNEL)))->layer = n;
    return y;
}

/* out = alpha op(a) op(b) for every sample and head: a batched product on [tokens,
 * width] values whose head j is the key_dim columns from j key_dim (q, k, v and the
 * heads' results), or [heads, tokens, tokens] ones (scores, weights). */
typedef struct HeadOperand {
    Tensor *t;
    bool transposed;
} HeadOperand;

static void per_head_product(Lower *L, GNode *n, HeadOperand a, HeadOperand b, Tensor *out, double alpha) {
    int64_t t = n->out.dim[0], dk = n->attrs.key_dim, heads = n->attrs.heads;
    IrOp *op = ir_op(L->c, L->ir, L->phase, OP_GEMM);
    add_in(op, a.t);
    add_in(op, b.t);
    add_out(op, out);
    op->ta = a.transposed;
    op->tb = b.transposed;
    Tensor *operands[3] = {a.t, b.t, out};
    for (int o = 0; o < 3; o++) {
        bool scores = operands[o]->shape.rank == 3; /* [heads, t, t] */
        op->ld[o] = scores ? t : heads * dk;
        op->batch_stride[o] = operands[o]->per_sample;
        op->group_stride[o] = scores ? t * t : dk;
    }
    op->m = dim_fixed(t); /* op(a) is m x k: q t x dk, or the weights t x t */
    op->k = dim_fixed(a.t->shape.rank == 3 ? t : dk);
    op->n = dim_fixed(out->shape.rank == 3 ? t : dk);
    op->alpha = alpha;
    op->batches = dim_batched(1);
    op->groups = heads;
    op->layer = n;
}

/* Self-attention: q, k, v by three projections; each head's scores q k^T / sqrt(key_dim)
 * ([heads, t, t] a sample), a softmax over the keys, the weights times v into the
 * head's columns of [t, heads key_dim], and the output projection. */
static void lower_attention(Lower *L, GNode *n) {
    Ddpc *c = L->c;
    Tensor *x = L->value[n->inputs[0]->id];
    const LayerAttrs *a = &n->attrs;
    int64_t t = x->shape.dim[0], ch = x->shape.dim[1], width = a->heads * a->key_dim;
    LayerParams *p = &L->params[n->id];
    static const char *const which[4] = {"query", "key", "value", "output"};
    if (!p->proj_weight[0])
        for (int i = 0; i < 4; i++) {
            int64_t bd = i < 3 ? width : ch;
            p->proj_weight[i] = matrix_weight(L, n, arena_printf(c->arena, "%s.weight", which[i]), i < 3 ? ch : width,
                                              bd, a->init);
            if (a->bias)
                p->proj_bias[i] = param(L, n, arena_printf(c->arena, "%s.bias", which[i]), T_PARAM, shape_of(1, &bd),
                                        "C", a->bias_init);
        }
    Tensor *qkv[3];
    for (int i = 0; i < 3; i++)
        qkv[i] = projection(L, n, x, p->proj_weight[i], p->proj_bias[i], arena_printf(c->arena, ":%s", which[i]));
    int64_t sd[3] = {a->heads, t, t};
    Shape scores_shape = shape_of(3, sd);
    Tensor *scores = activation(L, n, ":scores", &scores_shape);
    per_head_product(L, n, (HeadOperand){qkv[0], false}, (HeadOperand){qkv[1], true}, scores,
                     1 / sqrt((double)a->key_dim));
    Tensor *weights = activation(L, n, ":weights", &scores_shape);
    IrOp *op = ir_op(c, L->ir, L->phase, OP_SOFTMAX);
    add_in(op, scores);
    add_out(op, weights);
    op->axis_outer = a->heads * t;
    op->axis_len = t;
    op->axis_inner = 1;
    op->causal = a->causal; /* row r is query r % t of its head */
    op->range = dim_batched(op->axis_outer);
    op->layer = n;
    if (L->phase != PH_EVAL && a->rate > 0) /* Keras's dropout: on the attention weights */
        weights = dropped(L, n, weights, a->rate, ":dropped");
    int64_t hd[2] = {t, width};
    Shape heads_shape = shape_of(2, hd);
    Tensor *heads = activation(L, n, ":heads", &heads_shape);
    per_head_product(L, n, (HeadOperand){weights, false}, (HeadOperand){qkv[2], false}, heads, 1);
    L->value[n->id] = projection(L, n, heads, p->proj_weight[3], p->proj_bias[3], "");
}

/* A learned [tokens, c] value added to every sample (ViT's position embedding). */
static void lower_position_embedding(Lower *L, GNode *n) {
    Tensor *x = L->value[n->inputs[0]->id];
    LayerParams *p = &L->params[n->id];
    if (!p->weight) {
        p->weight = param(L, n, "weight", T_PARAM, n->out, n->out.rank == 2 ? "TC" : "", n->attrs.init);
        p->weight->fan_in = n->out.rank == 2 ? n->out.dim[0] : x->per_sample;
        p->weight->fan_out = n->out.dim[n->out.rank - 1];
    }
    Tensor *y = activation(L, n, "", &n->out);
    XExpr *e = x_binary(L->c, X_ADD, x_load(L->c, x, BC_FULL), x_load(L->c, p->weight, BC_CHANNEL));
    pointwise(L->c, L->ir, L->phase, y, e)->layer = n;
    L->value[n->id] = y;
}

bool ir_windows_tile(const IrOp *op, int64_t h, int64_t w, int64_t oh, int64_t ow) {
    return op->kernel[0] == op->stride[0] && op->kernel[1] == op->stride[1] && op->dilation[0] == 1 &&
           op->dilation[1] == 1 && !op->pad[0] && !op->pad[1] && !op->pad[2] && !op->pad[3] &&
           h == oh * op->kernel[0] && w == ow * op->kernel[1];
}

static void window_attrs(IrOp *op, const GNode *n) {
    memcpy(op->kernel, n->attrs.kernel, sizeof op->kernel);
    memcpy(op->stride, n->attrs.stride, sizeof op->stride);
    memcpy(op->dilation, n->attrs.dilation, sizeof op->dilation);
    memcpy(op->pad, n->attrs.pad, sizeof op->pad);
    op->layer = (GNode *)n;
}

Tensor *ir_filters_krsc(Ddpc *c, Ir *ir, Phase phase, Tensor *w, GNode *layer) {
    int64_t krsc[4] = {w->shape.dim[3], w->shape.dim[0], w->shape.dim[1], w->shape.dim[2]};
    Tensor *t = ir_tensor(c, ir, arena_printf(c->arena, "%s:krsc", w->name), T_WORK, w->dtype, false,
                          &(Shape){4, {krsc[0], krsc[1], krsc[2], krsc[3]}});
    t->layer = layer;
    IrOp *op = ir_op(c, ir, phase, OP_FILTERS_TO_KRSC);
    add_in(op, w);
    add_out(op, t);
    op->range = dim_fixed(t->elems);
    op->layer = layer;
    op->path = DDP_PATH_LIBRARY;
    return t;
}

/* As much scratch as the generated path's columns take (at least 64 Ki elements):
 * what a convolution library may use instead of them, at least (the plan grows it,
 * give_scratch_room). */
Tensor *ir_conv_workspace(Ddpc *c, Ir *ir, GNode *layer, const char *what) {
    const LayerAttrs *a = &layer->attrs;
    GNode *in = layer->inputs[0];
    int64_t columns = layer->out.dim[0] * layer->out.dim[1] * a->kernel[0] * a->kernel[1] * in->out.dim[2];
    int64_t elems = columns * ir->batch > (1 << 16) ? columns * ir->batch : 1 << 16;
    Tensor *t = ir_tensor(c, ir, arena_printf(c->arena, "%s:%s", layer->name, what), T_WORK, ir->dtype, false,
                          &(Shape){1, {elems}});
    t->layer = layer;
    t->scratch = true;
    return t;
}

/* The library's convolution beside the generated one (im2col and a product): the
 * runtime runs one or the other (ddp_path), the same values coming out of both. */
static void library_conv2d(Lower *L, GNode *n, Tensor *x, Tensor *w, Tensor *z) {
    Tensor *krsc = ir_filters_krsc(L->c, L->ir, L->phase, w, n);
    IrOp *op = ir_op(L->c, L->ir, L->phase, OP_CONV);
    add_in(op, x);
    add_in(op, krsc);
    add_out(op, z);
    add_out(op, ir_conv_workspace(L->c, L->ir, n, L->phase == PH_EVAL ? "eval:workspace" : "workspace"));
    window_attrs(op, n);
    op->code = DDP_CONV_FORWARD;
    op->path = DDP_PATH_LIBRARY;
}

static void lower_conv2d(Lower *L, GNode *n) {
    Ddpc *c = L->c;
    Tensor *x = L->value[n->inputs[0]->id];
    const LayerAttrs *a = &n->attrs;
    int64_t cin = x->shape.dim[2], f = a->units, kk = a->kernel[0] * a->kernel[1] * cin;
    int64_t rows = n->out.dim[0] * n->out.dim[1];
    LayerParams *p = &L->params[n->id];
    if (!p->weight) {
        int64_t wd[4] = {a->kernel[0], a->kernel[1], cin, f};
        p->weight = param(L, n, "weight", T_PARAM, shape_of(4, wd), "HWIO", a->init);
        p->weight->fan_in = kk;
        p->weight->fan_out = a->kernel[0] * a->kernel[1] * f;
        if (a->bias)
            p->bias = param(L, n, "bias", T_PARAM, shape_of(1, &f), "C", a->bias_init);
    }
    /* a 1x1 convolution with stride 1 and no padding reads its input as the columns */
    bool pointwise_conv = a->kernel[0] == 1 && a->kernel[1] == 1 && a->stride[0] == 1 &&
                          a->stride[1] == 1 && !a->pad[0] && !a->pad[1] && !a->pad[2] && !a->pad[3];
    Tensor *col = x;
    if (!pointwise_conv) {
        int64_t cd[2] = {rows, kk};
        Shape cs = shape_of(2, cd);
        col = activation(L, n, ":col", &cs);
        col->kind = T_WORK;
        IrOp *op = ir_op(c, L->ir, L->phase, OP_IM2COL);
        add_in(op, x);
        add_out(op, col);
        window_attrs(op, n);
        op->path = DDP_PATH_GENERATED;
        op->rows_per_sample = rows;
        op->channels = cin;
        op->range = dim_batched(rows); /* one index per row of the column matrix */
    }
    bool more = p->bias || a->activation;
    Tensor *z = activation(L, n, more ? ":z" : "", &n->out);
    IrOp *op = ir_op(c, L->ir, L->phase, OP_GEMM);
    add_in(op, col);
    add_in(op, p->weight);
    add_out(op, z);
    op->m = dim_batched(rows);
    op->n = dim_fixed(f);
    op->k = dim_fixed(kk);
    op->layer = n;
    op->path = DDP_PATH_GENERATED;
    library_conv2d(L, n, x, p->weight, z);
    L->value[n->id] = activation_op(L, n, z, a->activation, p->bias);
}

/* A depthwise convolution: one op of the program's own on every path (channel ch's
 * filters read channel ch alone: there is no product to hand a library), then the
 * bias and activation as a convolution's. */
static void lower_depthwise(Lower *L, GNode *n) {
    Ddpc *c = L->c;
    Tensor *x = L->value[n->inputs[0]->id];
    const LayerAttrs *a = &n->attrs;
    int64_t cin = x->shape.dim[2], f = a->units, taps = a->kernel[0] * a->kernel[1];
    LayerParams *p = &L->params[n->id];
    if (!p->weight) {
        int64_t wd[4] = {a->kernel[0], a->kernel[1], cin, f / cin};
        p->weight = param(L, n, "weight", T_PARAM, shape_of(4, wd), "HWCM", a->init);
        p->weight->fan_in = taps;               /* an output reads one channel's window */
        p->weight->fan_out = taps * (f / cin); /* an input feeds its channel's filters */
        if (a->bias)
            p->bias = param(L, n, "bias", T_PARAM, shape_of(1, &f), "C", a->bias_init);
    }
    Tensor *z = activation(L, n, p->bias || a->activation ? ":z" : "", &n->out);
    IrOp *op = ir_op(c, L->ir, L->phase, OP_DEPTHWISE);
    add_in(op, x);
    add_in(op, p->weight);
    add_out(op, z);
    window_attrs(op, n);
    op->channels = f / cin;
    op->rows_per_sample = n->out.dim[0] * n->out.dim[1];
    op->range = dim_batched(op->rows_per_sample); /* one index per output pixel */
    L->value[n->id] = activation_op(L, n, z, a->activation, p->bias);
}

static void lower_pool(Lower *L, GNode *n) {
    Tensor *x = L->value[n->inputs[0]->id];
    Tensor *y = activation(L, n, "", &n->out);
    OpKind kind = n->op == L_MAXPOOL ? OP_MAXPOOL : n->op == L_AVGPOOL ? OP_AVGPOOL : OP_GAP;
    IrOp *op = ir_op(L->c, L->ir, L->phase, kind);
    add_in(op, x);
    add_out(op, y);
    window_attrs(op, n);
    op->channels = x->shape.dim[x->shape.rank - 1];
    op->range = range_of(y);
    if (kind != OP_GAP) /* one index per output pixel, channels inside */
        op->range.per_sample /= op->channels;
    L->value[n->id] = y;
}

/* A normalisation's scale (from 1) and shift (from 0) per channel, made by the first
 * phase lowered. */
static LayerParams *scale_and_shift(Lower *L, GNode *n, int64_t ch) {
    LayerParams *p = &L->params[n->id];
    if (!p->weight) {
        Shape cs = shape_of(1, &ch);
        p->weight = param(L, n, "weight", T_PARAM, cs, "C", DDP_INIT_ONES);
        p->bias = param(L, n, "bias", T_PARAM, cs, "C", DDP_INIT_ZEROS);
    }
    return p;
}

/* Batch normalisation in training: statistics of this batch, their running averages
 * updated, then (x - mean) / sqrt(var + eps) * weight + bias as one expression. In
 * evaluation the running statistics take the batch's place. */
static void lower_batchnorm(Lower *L, GNode *n) {
    Ddpc *c = L->c;
    Tensor *x = L->value[n->inputs[0]->id];
    int64_t ch = x->shape.dim[x->shape.rank - 1];
    LayerParams *p = scale_and_shift(L, n, ch);
    if (!p->running_mean) {
        Shape cs = shape_of(1, &ch);
        p->running_mean = param(L, n, "running_mean", T_STAT, cs, "C", DDP_INIT_ZEROS);
        p->running_var = param(L, n, "running_var", T_STAT, cs, "C", DDP_INIT_ONES);
    }
    Tensor *mean = p->running_mean, *var = p->running_var;
    if (L->phase == PH_FORWARD) {
        Shape cs = shape_of(1, &ch);
        mean = ir_tensor(c, L->ir, arena_printf(c->arena, "%s:mean", n->name), T_WORK,
                         L->ir->dtype, false, &cs);
        var = ir_tensor(c, L->ir, arena_printf(c->arena, "%s:var", n->name), T_WORK,
                        L->ir->dtype, false, &cs);
        IrOp *op = ir_op(c, L->ir, L->phase, OP_BN_STATS);
        add_in(op, x);
        add_out(op, mean);
        add_out(op, var);
        add_out(op, p->running_mean);
        add_out(op, p->running_var);
        op->channels = ch;
        op->rows_per_sample = x->per_sample / ch;
        op->momentum = n->attrs.momentum;
        op->range = dim_fixed(ch);
        op->layer = n;
    }
    Tensor *y = activation(L, n, "", &n->out);
    XExpr *centred = x_binary(c, X_SUB, x_load(c, x, BC_FULL), x_load(c, mean, BC_CHANNEL));
    XExpr *scale = x_binary(c, X_DIV, x_load(c, p->weight, BC_CHANNEL),
                            x_unary(c, X_SQRT, x_binary(c, X_ADD, x_load(c, var, BC_CHANNEL),
                                                        x_const(c, n->attrs.epsilon))));
    XExpr *e = x_binary(c, X_ADD, x_binary(c, X_MUL, centred, scale),
                        x_load(c, p->bias, BC_CHANNEL));
    pointwise(c, L->ir, L->phase, y, e)->layer = n;
    L->value[n->id] = y;
}

/* Layer normalisation: each row of the last axis (a sample's features, a pixel's
 * channels) less its mean, over sqrt(its variance + eps), by one op whose adjoint
 * knows the row; the scale and shift per channel after it, as one expression, so
 * autodiff and fusion treat them as batchnorm's. The same in training and evaluation. */
static void lower_layernorm(Lower *L, GNode *n) {
    Ddpc *c = L->c;
    Tensor *x = L->value[n->inputs[0]->id];
    int64_t ch = x->shape.dim[x->shape.rank - 1];
    LayerParams *p = scale_and_shift(L, n, ch);
    Tensor *normalised = activation(L, n, ":normalised", &n->out);
    IrOp *op = ir_op(c, L->ir, L->phase, OP_LAYERNORM);
    add_in(op, x);
    add_out(op, normalised);
    op->axis_outer = x->per_sample / ch;
    op->axis_len = ch;
    op->axis_inner = 1;
    op->epsilon = n->attrs.epsilon;
    op->range = dim_batched(op->axis_outer);
    op->layer = n;
    Tensor *y = activation(L, n, "", &n->out);
    XExpr *scaled = x_binary(c, X_MUL, x_load(c, normalised, BC_FULL), x_load(c, p->weight, BC_CHANNEL));
    XExpr *e = x_binary(c, X_ADD, scaled, x_load(c, p->bias, BC_CHANNEL));
    pointwise(c, L->ir, L->phase, y, e)->layer = n;
    L->value[n->id] = y;
}

static void lower_dropout(Lower *L, GNode *n) {
    Tensor *x = L->value[n->inputs[0]->id];
    L->value[n->id] = L->phase == PH_EVAL || n->attrs.rate == 0 ? view(L, n, x, &n->out)
                                                                 : dropped(L, n, x, n->attrs.rate, "");
}

static void lower_add(Lower *L, GNode *n) {
    Ddpc *c = L->c;
    XExpr *e = x_load(c, L->value[n->inputs[0]->id], BC_FULL);
    for (int i = 1; i < n->ninputs; i++)
        e = x_binary(c, X_ADD, e, x_load(c, L->value[n->inputs[i]->id], BC_FULL));
    Tensor *y = activation(L, n, "", &n->out);
    pointwise(c, L->ir, L->phase, y, e)->layer = n;
    L->value[n->id] = y;
}

/* The output seen as [outer, axis, inner]: concat and softmax work along one axis. */
static void axis_split(const Shape *s, int axis, int64_t *outer, int64_t *len, int64_t *inner) {
    *outer = *inner = 1;
    for (int i = 0; i < axis; i++)
        *outer *= s->dim[i];
    *len = s->dim[axis];
    for (int i = axis + 1; i < s->rank; i++)
        *inner *= s->dim[i];
}

static void lower_concat(Lower *L, GNode *n) {
    Tensor *y = activation(L, n, "", &n->out);
    int axis = n->attrs.axis;
    int64_t offset = 0;
    for (int i = 0; i < n->ninputs; i++) {
        Tensor *x = L->value[n->inputs[i]->id];
        IrOp *op = ir_op(L->c, L->ir, L->phase, OP_CONCAT);
        add_in(op, x);
        add_out(op, y);
        int64_t outer, len, inner;
        axis_split(&n->out, axis, &outer, &len, &inner);
        op->axis_outer = outer;
        op->axis_len = len;
        op->axis_inner = inner;
        op->concat_offset = offset;
        op->concat_width = x->shape.dim[axis];
        op->range = range_of(x);
        op->layer = n;
        offset += x->shape.dim[axis];
    }
    L->value[n->id] = y;
}

static void lower_softmax(Lower *L, GNode *n) {
    Tensor *x = L->value[n->inputs[0]->id];
    Tensor *y = activation(L, n, "", &n->out);
    IrOp *op = ir_op(L->c, L->ir, L->phase, OP_SOFTMAX);
    add_in(op, x);
    add_out(op, y);
    axis_split(&n->out, n->attrs.axis, &op->axis_outer, &op->axis_len, &op->axis_inner);
    op->range = dim_batched(op->axis_outer * op->axis_inner);
    op->layer = n;
    L->value[n->id] = y;
}

static void lower_activation(Lower *L, GNode *n) {
    Tensor *x = L->value[n->inputs[0]->id];
    Tensor *y = activation(L, n, "", &n->out);
    pointwise(L->c, L->ir, L->phase, y, activate(L->c, n->layer->name, n->attrs.slope, x_load(L->c, x, BC_FULL)))
        ->layer = n;
    L->value[n->id] = y;
}

static void lower_node(Lower *L, GNode *n) {
    switch (n->op) {
    case L_INPUT: L->value[n->id] = L->ir->input; break;
    case L_DENSE: lower_dense(L, n); break;
    case L_CONV2D: lower_conv2d(L, n); break;
    case L_DEPTHWISE_CONV2D: lower_depthwise(L, n); break;
    case L_MAXPOOL: case L_AVGPOOL: case L_GLOBAL_AVGPOOL: lower_pool(L, n); break;
    case L_BATCHNORM: lower_batchnorm(L, n); break;
    case L_LAYERNORM: lower_layernorm(L, n); break;
    case L_ATTENTION: lower_attention(L, n); break;
    case L_POSITION_EMBEDDING: lower_position_embedding(L, n); break;
    case L_EMBEDDING: lower_embedding(L, n); break;
    case L_DROPOUT: lower_dropout(L, n); break;
    case L_FLATTEN: case L_RESHAPE: case L_IDENTITY:
        L->value[n->id] = view(L, n, L->value[n->inputs[0]->id], &n->out);
        break;
    case L_ADD: lower_add(L, n); break;
    case L_CONCAT: lower_concat(L, n); break;
    case L_SOFTMAX: lower_softmax(L, n); break;
    case L_RELU: case L_RELU6: case L_LEAKY_RELU: case L_ELU: case L_GELU: case L_SILU: case L_MISH: case L_HARD_SWISH:
    case L_SOFTPLUS: case L_SIGMOID: case L_TANH: lower_activation(L, n); break;
    case L_NONE: break;
    }
}

/* ------------------------------------------------------- loss, metrics */

/* Per-sample values, summed in a fixed order by one accumulate op, so the sums do not
 * depend on threads; a later all-reduce of (sum, count) gives exact global figures. */
static Tensor *per_sample(Lower *L, const char *what, int64_t rows) {
    Shape shape = {rows > 1, {rows}};
    const char *name = arena_printf(L->c->arena, "%s%s", L->phase == PH_EVAL ? "eval:" : "", what);
    Tensor *t = ir_tensor(L->c, L->ir, name, T_WORK, DT_F64, true, &shape);
    t->per_sample = rows;
    t->elems = L->ir->batch * rows;
    return t;
}

static bool categorical_loss(const ddp_settings *config) {
    return config->loss == DDP_LOSS_SPARSE_CATEGORICAL || config->loss == DDP_LOSS_CATEGORICAL;
}

/* The rows of classes in a sample's output that a categorical loss or metric takes
 * apart: one for [classes], one a position for [tokens, classes] (a language model's
 * next token at every position); its value for the sample is their mean, as Keras's
 * and PyTorch's mean over every token when samples are of one length. */
static int64_t class_rows(const Ir *ir) {
    const Shape *s = &ir->graph->output->out;
    return categorical_loss(ir->config) ? ir->output->per_sample / s->dim[s->rank - 1] : 1;
}

/* A loss or metric op over out's rows of channels each; a kernel index a row. */
static void set_rows(IrOp *op, const Tensor *out, int64_t rows) {
    op->channels = out->per_sample / rows;
    op->range = dim_batched(rows);
}

static void lower_loss_and_metrics(Lower *L, Tensor *out, Tensor *dout) {
    Ddpc *c = L->c;
    Ir *ir = L->ir;
    const ddp_settings *config = ir->config;
    IrOp *op = ir_op(c, ir, L->phase, OP_LOSS);
    add_in(op, out);
    add_in(op, ir->label);
    int64_t rows = ir->loss_rows = class_rows(ir);
    add_out(op, per_sample(L, "loss", rows));
    if (dout)
        add_out(op, dout);
    op->code = config->loss;
    op->what = builtin_of(B_LOSS, config->loss)->name;
    op->from_logits = config->from_logits != 0;
    op->smoothing = config->label_smoothing;
    set_rows(op, out, rows);
    IrOp *acc = ir_op(c, ir, L->phase, OP_ACCUMULATE);
    add_in(acc, op->out[0]);
    acc->pair[0] = 0;
    add_out(acc, ir->accum);
    acc->range = dim_fixed(1);
    for (int m = 0; m < config->nmetrics; m++) {
        const ddp_metric *metric = &config->metrics[m];
        if (metric->kind == DDP_METRIC_LOSS)
            continue; /* the loss's own pair */
        IrOp *mo = ir_op(c, ir, L->phase, OP_METRIC);
        add_in(mo, out);
        add_in(mo, ir->label);
        bool per_class = metric->kind == DDP_METRIC_ACCURACY || metric->kind == DDP_METRIC_TOP_K;
        int64_t metric_rows = per_class ? rows : 1; /* binary accuracy and mae: a mean over the whole output */
        add_out(mo, per_sample(L, metric->name, metric_rows));
        mo->code = metric->kind;
        mo->what = metric->name;
        mo->from_logits = op->from_logits;
        mo->k_top = metric->k;
        set_rows(mo, out, metric_rows);
        if (acc->nin < 8) {
            acc->pair[acc->nin] = (int)metric->pair;
            add_in(acc, mo->out[0]);
        }
        /* the accumulate op goes last */
        OpList *ops = &ir->ops[L->phase];
        ops->items[ops->len - 2] = mo;
        ops->items[ops->len - 1] = acc;
    }
    ir_op(c, ir, L->phase, OP_METRICS_READY);
}

/* The labels a loss reads: class indices for the sparse loss, else one value per
 * output (one-hot rows, 0/1 targets, regression targets). */
static Tensor *label_tensor(Ddpc *c, Ir *ir, const Shape *out) {
    if (ir->config->loss == DDP_LOSS_SPARSE_CATEGORICAL) {
        Shape none = {0, {0}}, positions = *out;
        positions.rank--;
        Tensor *t = ir_tensor(c, ir, "label", T_LABEL, DT_I32, true, positions.rank ? &positions : &none);
        t->per_sample = shape_count(&positions);
        t->elems = ir->batch * t->per_sample;
        return t;
    }
    return ir_tensor(c, ir, "label", T_LABEL, ir->dtype, true, out);
}

/* --------------------------------------------------------------- build */

static void lower_pass(Lower *L, Phase ph) {
    Graph *g = L->ir->graph;
    L->phase = ph;
    for (int i = 0; i < g->nodes.len; i++)
        lower_node(L, g->nodes.items[i]);
}

Ir *ir_lower(Ddpc *c, Graph *g, const ddp_settings *config, DType dtype, int64_t bucket_bytes, bool no_reuse) {
    Ir *ir = arena_alloc(c->arena, sizeof *ir);
    ir->graph = g;
    ir->config = config;
    ir->dtype = dtype;
    ir->batch = config->batch_per_replica;
    ir->bucket_bytes = bucket_bytes;
    ir->no_reuse = no_reuse;

    ir->input = ir_tensor(c, ir, "input", T_INPUT, dtype, true, &g->input);
    Shape none = {0, {0}};
    ir->sample_id = ir_tensor(c, ir, "sample_id", T_SAMPLE_ID, DT_I64, true, &none);
    ir->sample_id->per_sample = 1;
    ir->sample_id->elems = ir->batch;
    ir->label = label_tensor(c, ir, &g->output->out);
    int64_t acc = 2 * (1 + config->nmetrics); /* the loss's pair, then each metric's */
    Shape as = shape_of(1, &acc);
    ir->accum = ir_tensor(c, ir, "accumulators", T_ACCUM, DT_F64, false, &as);

    Lower *L = arena_alloc(c->arena, sizeof *L);
    *L = (Lower){c, ir, PH_FORWARD, NULL, NULL, 0};
    L->value = arena_alloc(c->arena, sizeof(Tensor *) * (size_t)g->nodes.len);
    L->params = arena_alloc(c->arena, sizeof(LayerParams) * (size_t)g->nodes.len);
    ir->lowering = L;
    lower_pass(L, PH_FORWARD);
    ir->output = L->value[g->output->id];
    Tensor *dout = ir_tensor(c, ir, arena_printf(c->arena, "d:%s", g->output->name), T_DACT,
                             dtype, true, &ir->output->shape);
    ir->output->grad = dout;
    lower_loss_and_metrics(L, ir->output, dout);
    return ir;
}

/* What an update reads beside the flat vectors, where the program has it: clip_norm's
 * scale and the decay groups. */
static void add_update_constants(IrOp *op, const Ir *ir) {
    if (ir->clip)
        add_in(op, ir->clip);
    if (ir->decay_groups)
        add_in(op, ir->decay_groups);
}

/* lars, lamb: each parameter's step scale from its norm and its gradient's (lamb: its
 * step's, Adam's moments read), one index per parameter (its span read from the constants; its threads on a GPU as many as the
 * largest parameter can use), before the optimizer, which reads its element's. */
static void lower_trust_ratio(Ddpc *c, Ir *ir, bool moments) {
    Shape flat = {0, {0}}, spans = {1, {2 * (int64_t)ir->params.len}}, each = {1, {ir->params.len}};
    ir->parameter_numbers = ir_tensor(c, ir, "parameter_numbers", T_CONST, DT_I32, false, &flat);
    ir->parameter_spans = ir_tensor(c, ir, "parameter_spans", T_CONST, DT_I64, false, &spans);
    ir->trust = ir_tensor(c, ir, "trust", T_WORK, DT_F64, false, &each);
    IrOp *op = ir_op(c, ir, PH_OPTIMIZER, OP_TRUST_RATIO);
    add_in(op, ir->all_params);
    add_in(op, ir->all_grads);
    add_in(op, ir->parameter_spans);
    add_update_constants(op, ir);
    for (int i = 0; moments && i < 2; i++) /* lamb's: the step it is held against is Adam's */
        add_in(op, ir->states[i]);
    add_out(op, ir->trust);
    op->range = dim_fixed(ir->params.len);
    for (int i = 0; i < ir->params.len; i++)
        if (ir->params.items[i]->elems > op->channels)
            op->channels = ir->params.items[i]->elems; /* the longest sum, for a GPU block's threads */
}

void ir_lower_update(Ddpc *c, Ir *ir) {
    Lower *L = ir->lowering;
    const ddp_optimizer *o = &ir->config->optimizer;
    DType dtype = ir->dtype;
    Shape flat = {0, {0}}, one = {1, {1}};
    ir->all_params = ir_tensor(c, ir, "params", T_PARAM, dtype, false, &flat);
    ir->all_grads = ir_tensor(c, ir, "grads", T_GRAD, dtype, false, &flat);
    /* once every bucket is summed: the non-finite rule on the device, so that no one
     * waits for it (the flag is read with the figures), then the optimizer, which
     * updates the flat vectors in one pass unless the flag is set */
    ir_op(c, ir, PH_OPTIMIZER, OP_WAIT_BUCKETS);
    IrOp *find = ir_op(c, ir, PH_OPTIMIZER, OP_FIND_NONFINITE);
    add_in(find, ir->all_grads);
    add_out(find, ir_tensor(c, ir, "nonfinite_chunks", T_WORK, DT_F64, false, &flat));
    IrOp *flag = ir_op(c, ir, PH_OPTIMIZER, OP_NONFINITE_FLAG);
    add_in(flag, find->out[0]);
    add_in(flag, ir->accum);
    ir->nonfinite = ir_tensor(c, ir, "nonfinite", T_ACCUM, DT_F64, false, &one);
    add_out(flag, ir->nonfinite);
    flag->range = dim_fixed(1);
    if (o->clip_norm > 0) { /* the summed gradients' global norm, as PyTorch's clip_grad_norm_ takes it */
        IrOp *squares = ir_op(c, ir, PH_OPTIMIZER, OP_GRAD_SQUARES);
        add_in(squares, ir->all_grads);
        add_out(squares, ir_tensor(c, ir, "grad_squares", T_WORK, DT_F64, false, &flat));
        IrOp *factor = ir_op(c, ir, PH_OPTIMIZER, OP_CLIP_FACTOR);
        add_in(factor, squares->out[0]);
        ir->clip = ir_tensor(c, ir, "clip", T_WORK, DT_F64, false, &one);
        add_out(factor, ir->clip);
        factor->range = dim_fixed(1);
    }
    if (o->decay_groups)
        ir->decay_groups = ir_tensor(c, ir, "decay_groups", T_CONST, DT_U8, false, &flat);
    ir->state_vectors = (int)o->state_vectors;
    for (int i = 0; i < ir->state_vectors; i++) {
        bool average = o->ema > 0 && i == ir->state_vectors - 1; /* ema's, after the optimizer's own */
        ir->states[i] = ir_tensor(c, ir, average ? "average" : arena_printf(c->arena, "state%d", i), T_STATE, dtype,
                                  false, &flat);
    }
    if (o->kind == DDP_OPT_LARS || o->kind == DDP_OPT_LAMB)
        lower_trust_ratio(c, ir, o->kind == DDP_OPT_LAMB);
    IrOp *op = ir_op(c, ir, PH_OPTIMIZER, OP_OPTIMIZER);
    op->code = o->kind;
    op->what = builtin_of(B_OPTIMIZER, o->kind)->name;
    add_out(op, ir->all_params);
    add_in(op, ir->all_grads);
    add_in(op, ir->nonfinite);
    add_update_constants(op, ir);
    if (ir->trust) { /* with the spans, which a CPU walks by */
        add_in(op, ir->parameter_numbers);
        add_in(op, ir->parameter_spans);
        add_in(op, ir->trust);
    }
    for (int i = 0; i < ir->state_vectors; i++)
        add_out(op, ir->states[i]);

    lower_pass(L, PH_EVAL);
    ir->eval_output = L->value[ir->graph->output->id];
    lower_loss_and_metrics(L, ir->eval_output, NULL);
}
