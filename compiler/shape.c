/* shape.c: the shape rule of every built-in layer, with its parameter count and its
 * multiply-accumulate count.
 *
 * Shapes are per sample, channels last: a convolution takes [height, width, channels].
 * Padding follows two conventions: `same` is TensorFlow's (output = ceil(input /
 * stride), the odd pixel of padding at the end), an integer pads every side by that
 * much as PyTorch does, `valid` pads nothing. Multiply-accumulates count the products
 * of dense layers and convolutions, the figure torchvision's model tables quote. */
#include <string.h>

#include "ddpc.h"

#define LIMIT ((int64_t)1 << 53)

typedef struct Rule {
    Ddpc *c;
    LayerCall *call;
    LayerResult *res;
} Rule;

static Value arg(Rule *r, const char *name) {
    int i = 0;
    builtin_param(r->call->layer, name, &i);
    return r->call->args[i];
}

static Loc arg_loc(Rule *r, const char *name) {
    int i = 0;
    builtin_param(r->call->layer, name, &i);
    Node *n = r->call->arg_nodes ? r->call->arg_nodes[i] : NULL;
    return n ? expr_span(n) : r->call->loc;
}

static bool too_large(Rule *r, const char *what) {
    diag_report(r->c, E_TENSOR_TOO_LARGE, r->call->loc,
                "%s of `%s` is beyond 2^53, more than any machine can hold", what, r->call->name);
    return false;
}

/* a * b, false when the product passes 2^53 */
static bool mul(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_mul_overflow(a, b, out) && *out <= LIMIT;
}

static bool mul3(int64_t a, int64_t b, int64_t c, int64_t *out) {
    return mul(a, b, out) && mul(*out, c, out);
}

int64_t shape_count(const Shape *s) {
    int64_t n = 1;
    for (int i = 0; i < s->rank; i++)
        if (!mul(n, s->dim[i], &n))
            return -1;
    return n;
}

static const char *input_text(Rule *r) {
    return shape_text(r->c, &r->call->in[0]);
}

static bool wrong_rank(Rule *r, const char *needs) {
    diag_report(r->c, E_WRONG_RANK, r->call->loc, "%s needs %s per sample, but its input is %s",
                r->call->layer->name, needs, input_text(r));
    return false;
}

static void set_shape(Shape *s, int rank, const int64_t *dims) {
    s->rank = rank;
    memcpy(s->dim, dims, sizeof(int64_t) * (size_t)rank);
}

/* ---------------------------------------------------------------- dense */

/* Keras's Dense: over the last axis, each position of the others on its own (a
 * transformer's feed-forward on every token). */
static bool dense_rule(Rule *r) {
    Shape *in = &r->call->in[0];
    LayerAttrs *a = &r->res->attrs;
    a->units = (int64_t)arg(r, "units").num;
    a->bias = arg(r, "bias").num != 0;
    int64_t n = in->dim[in->rank - 1], positions = shape_count(in) / n;
    r->res->out = *in;
    r->res->out.dim[in->rank - 1] = a->units;
    if (!mul3(positions, n, a->units, &r->res->macs) || !mul(n + a->bias, a->units, &r->res->params))
        return too_large(r, "the size");
    return true;
}

/* --------------------------------------------------- convolution, pooling */

/* Output size and padding along one axis; false when the window does not fit. */
static bool window_axis(Rule *r, int axis, int64_t in, int64_t k, int64_t s, int64_t d,
                        Value padding, int64_t *out, int64_t *before, int64_t *after) {
    int64_t span = (k - 1) * d + 1;
    if (padding.kind == V_WORD && strcmp(padding.str, "same") == 0) {
        *out = (in + s - 1) / s;
        int64_t total = (*out - 1) * s + span - in;
        if (total < 0)
            total = 0;
        *before = total / 2;
        *after = total - *before;
        return true;
    }
    int64_t p[2] = {0, 0};
    if (padding.kind != V_WORD)
        value_pair(padding, p);
    *before = *after = p[axis];
    if (in + 2 * p[axis] < span) {
        LayerOp op = r->call->layer->kind == B_LAYER ? r->call->layer->op : L_NONE;
        const char *what = op == L_CONV2D || op == L_DEPTHWISE_CONV2D ? "kernel" : "window";
        diag_report(r->c, E_INPUT_TOO_SMALL, r->call->loc,
                    "the %s of `%s` spans %lld %s, more than its input %s gives with padding %lld",
                    what, r->call->name, (long long)span, axis == 0 ? "rows" : "columns",
                    input_text(r), (long long)p[axis]);
        return false;
    }
    *out = (in + 2 * p[axis] - span) / s + 1;
    return true;
}

static bool window_rule(Rule *r, int64_t kernel[2], int64_t stride[2], int64_t dil[2],
                        Value padding, int64_t channels_out) {
    Shape *in = &r->call->in[0];
    if (in->rank != 3) {
        wrong_rank(r, "[height, width, channels]");
        if (in->rank == 2)
            diag_note(r->c, r->call->loc, "add `reshape([%lld, %lld, 1])` before it",
                      (long long)in->dim[0], (long long)in->dim[1]);
        return false;
    }
    LayerAttrs *a = &r->res->attrs;
    int64_t out[2];
    for (int axis = 0; axis < 2; axis++)
        if (!window_axis(r, axis, in->dim[axis], kernel[axis], stride[axis], dil[axis], padding,
                         &out[axis], &a->pad[2 * axis], &a->pad[2 * axis + 1]))
            return false;
    memcpy(a->kernel, kernel, sizeof a->kernel);
    memcpy(a->stride, stride, sizeof a->stride);
    memcpy(a->dilation, dil, sizeof a->dilation);
    a->padding = padding.kind == V_WORD ? padding.str : NULL;
    int64_t dims[3] = {out[0], out[1], channels_out};
    set_shape(&r->res->out, 3, dims);
    return true;
}

static bool conv2d_rule(Rule *r) {
    LayerAttrs *a = &r->res->attrs;
    int64_t k[2], s[2], d[2];
    value_pair(arg(r, "kernel"), k);
    value_pair(arg(r, "stride"), s);
    value_pair(arg(r, "dilation"), d);
    a->units = (int64_t)arg(r, "filters").num;
    a->bias = arg(r, "bias").num != 0;
    if (!window_rule(r, k, s, d, arg(r, "padding"), a->units))
        return false;
    int64_t cin = r->call->in[0].dim[2], per_output, weights;
    if (!mul3(k[0], k[1], cin, &per_output) || !mul(per_output, a->units, &weights) ||
        !mul3(r->res->out.dim[0], r->res->out.dim[1], weights, &r->res->macs))
        return too_large(r, "the work");
    r->res->params = weights + (a->bias ? a->units : 0);
    return true;
}

/* multiplier filters of its own for each channel: PyTorch's Conv2d(c, c m, groups = c),
 * Keras's DepthwiseConv2D(depth_multiplier = m) */
static bool depthwise_rule(Rule *r) {
    LayerAttrs *a = &r->res->attrs;
    int64_t k[2], s[2], d[2], m = (int64_t)arg(r, "multiplier").num;
    value_pair(arg(r, "kernel"), k);
    value_pair(arg(r, "stride"), s);
    value_pair(arg(r, "dilation"), d);
    a->bias = arg(r, "bias").num != 0;
    int64_t cin = r->call->in[0].rank == 3 ? r->call->in[0].dim[2] : 0;
    if (!mul(cin, m, &a->units))
        return too_large(r, "the output");
    if (!window_rule(r, k, s, d, arg(r, "padding"), a->units))
        return false;
    int64_t weights;
    if (!mul3(k[0], k[1], a->units, &weights) || !mul3(r->res->out.dim[0], r->res->out.dim[1], weights, &r->res->macs))
        return too_large(r, "the work");
    r->res->params = weights + (a->bias ? a->units : 0);
    return true;
}

static bool pool_rule(Rule *r) {
    int64_t k[2], s[2], d[2] = {1, 1};
    value_pair(arg(r, "size"), k);
    Value stride = arg(r, "stride");
    value_pair(stride.kind == V_NONE ? arg(r, "size") : stride, s);
    Value padding = arg(r, "padding");
    if (padding.kind != V_WORD) {
        int64_t p[2];
        value_pair(padding, p);
        for (int axis = 0; axis < 2; axis++)
            if (2 * p[axis] > k[axis]) {
                diag_report(r->c, E_OUT_OF_RANGE, arg_loc(r, "padding"),
                            "the padding of `%s` is at most half its window (%lld), not %lld",
                            r->call->name, (long long)(k[axis] / 2), (long long)p[axis]);
                return false;
            }
    }
    return window_rule(r, k, s, d, padding, r->call->in[0].rank == 3 ? r->call->in[0].dim[2] : 0);
}

static bool global_avgpool_rule(Rule *r) {
    Shape *in = &r->call->in[0];
    if (in->rank < 2)
        return wrong_rank(r, "[height, width, channels] or [tokens, channels]");
    int64_t c = in->dim[in->rank - 1];
    set_shape(&r->res->out, 1, &c);
    return true;
}

/* ----------------------------------------------------- shape-preserving */

static bool batchnorm_rule(Rule *r) {
    Shape *in = &r->call->in[0];
    int64_t channels = in->dim[in->rank - 1];
    r->res->out = *in;
    r->res->params = 2 * channels;       /* scale and shift */
    r->res->nontrainable = 2 * channels; /* running mean and variance */
    r->res->attrs.momentum = arg(r, "momentum").num;
    r->res->attrs.epsilon = arg(r, "epsilon").num;
    return true;
}

static bool layernorm_rule(Rule *r) {
    Shape *in = &r->call->in[0];
    r->res->out = *in;
    r->res->params = 2 * in->dim[in->rank - 1]; /* scale and shift */
    r->res->attrs.epsilon = arg(r, "epsilon").num;
    return true;
}

/* Multi-head self-attention (Keras's MultiHeadAttention(heads, key_dim) called on
 * one value): queries, keys and values [tokens, heads * key_dim] from the input, then
 * for each head softmax(q k^T / sqrt(key_dim)) v, the heads' results side by side
 * projected back to the input's channels. */
static bool attention_rule(Rule *r) {
    Shape *in = &r->call->in[0];
    if (in->rank != 2)
        return wrong_rank(r, "[tokens, channels]");
    LayerAttrs *a = &r->res->attrs;
    int64_t t = in->dim[0], c = in->dim[1];
    a->heads = (int64_t)arg(r, "heads").num;
    a->bias = arg(r, "bias").num != 0;
    a->causal = arg(r, "causal").num != 0;
    a->rate = arg(r, "dropout").num;
    Value key_dim = arg(r, "key_dim");
    if (key_dim.kind == V_NONE && c % a->heads) {
        diag_report(r->c, E_SHAPE_MISMATCH, arg_loc(r, "heads"),
                    "%s splits its %lld channels among heads, but %lld heads do not divide them",
                    r->call->layer->name, (long long)c, (long long)a->heads);
        diag_note(r->c, r->call->loc, "set key_dim, each head's channels");
        return false;
    }
    a->key_dim = key_dim.kind == V_NONE ? c / a->heads : (int64_t)key_dim.num;
    /* four projections, c x width each, biases of width (query, key, value) and c (output);
     * the scores and the weighted values: t x t x key_dim a head each */
    int64_t width, weights, projections, scores;
    r->res->out = *in;
    if (!mul(a->heads, a->key_dim, &width) || !mul3(4, c, width, &weights) || !mul(t, weights, &projections) ||
        !mul3(2 * t, t, width, &scores) || !mul(projections + scores, 1, &r->res->macs))
        return too_large(r, "the size");
    r->res->params = weights + (a->bias ? 3 * width + c : 0);
    return true;
}

static bool position_embedding_rule(Rule *r) {
    r->res->out = r->call->in[0];
    r->res->params = shape_count(&r->call->in[0]);
    return true;
}

/* The value an embedding reads must be token indices: the model's input, or a reshape
 * of it, never a computed value (whose gradient the lookup could not pass back). */
static bool reads_model_input(const GNode *n) {
    while (n->op == L_RESHAPE || n->op == L_FLATTEN)
        n = n->inputs[0];
    return n->op == L_INPUT;
}

/* Keras's Embedding: [...] indices -> [..., units]. */
static bool embedding_rule(Rule *r) {
    Shape *in = &r->call->in[0];
    LayerAttrs *a = &r->res->attrs;
    a->vocab = (int64_t)arg(r, "vocab").num;
    a->units = (int64_t)arg(r, "units").num;
    if (!reads_model_input(r->call->inputs[0])) {
        diag_report(r->c, E_EMBEDDING_INPUT, r->call->loc,
                    "embedding looks up token indices, but its input is computed by `%s`",
                    r->call->inputs[0]->name);
        diag_note(r->c, r->call->loc, "apply embedding to the model's input (`in`), whose values are the indices");
        return false;
    }
    if (in->rank == MAX_RANK)
        return wrong_rank(r, "fewer than 8 axes");
    r->res->out = *in;
    r->res->out.dim[r->res->out.rank++] = a->units;
    if (!mul(a->vocab, a->units, &r->res->params))
        return too_large(r, "the size");
    return true;
}

static bool dropout_rule(Rule *r) {
    r->res->out = r->call->in[0];
    r->res->attrs.rate = arg(r, "rate").num;
    return true;
}

static bool normalize_axis(Rule *r, int rank, int *axis) {
    Value v = arg(r, "axis");
    int64_t a = (int64_t)v.num;
    if (a < -rank || a >= rank) {
        diag_report(r->c, E_AXIS_RANGE, arg_loc(r, "axis"),
                    "`%s` has no axis %lld: its input %s has axes 0 to %d (or -1 to -%d)",
                    r->call->name, (long long)a, input_text(r), rank - 1, rank);
        return false;
    }
    *axis = (int)(a < 0 ? a + rank : a);
    return true;
}

static bool softmax_rule(Rule *r) {
    r->res->out = r->call->in[0];
    return normalize_axis(r, r->call->in[0].rank, &r->res->attrs.axis);
}

/* An activation layer's number (leaky_relu's negative_slope, elu's alpha), or, for
 * dense's and conv2d's activation = word, that layer's default. */
static double activation_slope(Rule *r, const char *act) {
    const Builtin *b = r->call->layer;
    if (b->kind == B_LAYER && b->nparams == 1 && b->params[0].kind == K_NUM && !act)
        return arg(r, b->params[0].name).num;
    const Builtin *named = act ? builtin_find(act) : NULL;
    return named && named->nparams == 1 && named->params[0].kind == K_NUM ? named->params[0].def_num : 0;
}

static bool elementwise_rule(Rule *r) {
    r->res->out = r->call->in[0];
    r->res->attrs.slope = activation_slope(r, NULL);
    return true;
}

/* --------------------------------------------------------- reshaping */

static bool flatten_rule(Rule *r) {
    int64_t n = shape_count(&r->call->in[0]);
    set_shape(&r->res->out, 1, &n);
    return true;
}

static bool reshape_rule(Rule *r) {
    Value target = arg(r, "shape");
    int64_t have = shape_count(&r->call->in[0]), known = 1;
    int infer = -1;
    Shape *out = &r->res->out;
    out->rank = target.len;
    for (int i = 0; i < target.len; i++) {
        out->dim[i] = (int64_t)target.items[i].num;
        if (out->dim[i] == -1)
            infer = i;
        else if (!mul(known, out->dim[i], &known))
            return too_large(r, "the target shape");
    }
    if (infer >= 0 && known > 0 && have % known == 0)
        out->dim[infer] = have / known;
    if ((infer >= 0 && (have % known != 0)) || (infer < 0 && known != have)) {
        if (infer >= 0)
            diag_report(r->c, E_RESHAPE_SIZE, arg_loc(r, "shape"),
                        "reshape cannot turn %s (%s values) into %s: %s is not a multiple of %s",
                        input_text(r), fmt_count(r->c->arena, have), value_text(r->c, target),
                        fmt_count(r->c->arena, have), fmt_count(r->c->arena, known));
        else
            diag_report(r->c, E_RESHAPE_SIZE, arg_loc(r, "shape"),
                        "reshape cannot turn %s (%s values) into %s (%s values)", input_text(r),
                        fmt_count(r->c->arena, have), value_text(r->c, target),
                        fmt_count(r->c->arena, known));
        return false;
    }
    r->res->attrs.target = *out;
    return true;
}

/* ------------------------------------------------------------ merging */

static const char *operand_name(Rule *r, int i) {
    Node *list = r->call->arg_nodes ? r->call->arg_nodes[0] : NULL;
    if (!list || i - 1 >= list->list.len)
        return "the other value";
    return arena_printf(r->c->arena, "`%s`", expr_text(r->c, list->list.items[i - 1]));
}

static Loc operand_loc(Rule *r, int i) {
    Node *list = r->call->arg_nodes ? r->call->arg_nodes[0] : NULL;
    return list && i - 1 < list->list.len ? list->list.items[i - 1]->loc : r->call->loc;
}

static bool add_rule(Rule *r) {
    Shape *first = &r->call->in[0];
    for (int i = 1; i < r->call->nin; i++) {
        Shape *s = &r->call->in[i];
        if (s->rank != first->rank || memcmp(s->dim, first->dim, sizeof(int64_t) * (size_t)s->rank)) {
            diag_report(r->c, E_SHAPE_MISMATCH, operand_loc(r, i),
                        "add needs values of one shape, but the current value is %s and %s is %s",
                        shape_text(r->c, first), operand_name(r, i), shape_text(r->c, s));
            return false;
        }
    }
    r->res->out = *first;
    return true;
}

static bool concat_rule(Rule *r) {
    Shape *first = &r->call->in[0];
    int axis;
    if (!normalize_axis(r, first->rank, &axis))
        return false;
    r->res->attrs.axis = axis;
    Shape out = *first;
    for (int i = 1; i < r->call->nin; i++) {
        Shape *s = &r->call->in[i];
        bool fits = s->rank == first->rank;
        for (int d = 0; fits && d < s->rank; d++)
            fits = d == axis || s->dim[d] == first->dim[d];
        if (!fits) {
            diag_report(r->c, E_SHAPE_MISMATCH, operand_loc(r, i),
                        "concat along axis %d needs the other axes equal, but the current value "
                        "is %s and %s is %s", axis, shape_text(r->c, first), operand_name(r, i),
                        shape_text(r->c, s));
            return false;
        }
        out.dim[axis] += s->dim[axis];
    }
    r->res->out = out;
    return true;
}

/* ------------------------------------------------------------- driver */

bool shape_infer(Ddpc *c, LayerCall *call, LayerResult *res) {
    Rule r = {c, call, res};
    memset(res, 0, sizeof *res);
    LayerAttrs *a = &res->attrs;
    const Builtin *b = call->layer;
    int i;
    if (builtin_param(b, "activation", &i)) {
        const char *act = call->args[i].str;
        a->activation = strcmp(act, "identity") == 0 ? NULL : act;
        a->slope = activation_slope(&r, a->activation);
    }
    if (builtin_param(b, "init", &i))
        a->init = word_code(init_words, call->args[i].str);
    if (builtin_param(b, "bias_init", &i))
        a->bias_init = word_code(init_words, call->args[i].str);
    bool ok;
    switch (b->op) {
    case L_DENSE: ok = dense_rule(&r); break;
    case L_CONV2D: ok = conv2d_rule(&r); break;
    case L_DEPTHWISE_CONV2D: ok = depthwise_rule(&r); break;
    case L_MAXPOOL: case L_AVGPOOL: ok = pool_rule(&r); break;
    case L_GLOBAL_AVGPOOL: ok = global_avgpool_rule(&r); break;
    case L_BATCHNORM: ok = batchnorm_rule(&r); break;
    case L_LAYERNORM: ok = layernorm_rule(&r); break;
    case L_ATTENTION: ok = attention_rule(&r); break;
    case L_POSITION_EMBEDDING: ok = position_embedding_rule(&r); break;
    case L_EMBEDDING: ok = embedding_rule(&r); break;
    case L_DROPOUT: ok = dropout_rule(&r); break;
    case L_FLATTEN: ok = flatten_rule(&r); break;
    case L_RESHAPE: ok = reshape_rule(&r); break;
    case L_ADD: ok = add_rule(&r); break;
    case L_CONCAT: ok = concat_rule(&r); break;
    case L_SOFTMAX: ok = softmax_rule(&r); break;
    default: ok = elementwise_rule(&r); break;
    }
    if (ok && shape_count(&res->out) < 0)
        ok = too_large(&r, "the output");
    return ok;
}
