/* ir_print.c: `ddpc emit --stage=ir` and `--stage=plan`, as stable text.
 *
 * Tensors are %N, ops #N, numbered in schedule order. A size that grows with the live
 * batch prints as `784n` (784 per sample), a batched shape as [n, 28, 28]. Pointwise
 * bodies print as expressions: %4[c] reads a per-channel vector, keep(0.4, 8) is the
 * dropout draw of layer 8. */
#include <string.h>

#include "ddpc.h"
#include "../runtime/ddp_abi.h"

static const char *kind_names[] = {
    [T_INPUT] = "input", [T_LABEL] = "label", [T_SAMPLE_ID] = "sample_id", [T_PARAM] = "param",
    [T_GRAD] = "grad", [T_STAT] = "stat", [T_ACT] = "act", [T_DACT] = "dact", [T_WORK] = "work",
    [T_ACCUM] = "accum", [T_STATE] = "state", [T_CONST] = "const",
};

static const char *region_names[] = {
    [DDP_REGION_PARAMS] = "params", [DDP_REGION_GRADS] = "grads", [DDP_REGION_STATE] = "state",
    [DDP_REGION_STATS] = "stats", [DDP_REGION_ARENA] = "arena", [DDP_REGION_WORKSPACE] = "workspace",
    [DDP_REGION_INPUT] = "input", [DDP_REGION_ACCUM] = "accum", [DDP_REGION_CONSTANTS] = "constants",
};

static const char *scalar_names[] = {
    [DDP_S_LOCAL_BATCH] = "local_batch", [DDP_S_GLOBAL_BATCH] = "global_batch",
    [DDP_S_STEP] = "step", [DDP_S_EPOCH] = "epoch", [DDP_S_ACCUMULATED] = "accumulated", [DDP_S_SEED] = "seed",
    [DDP_S_LEARNING_RATE] = "learning_rate", [DDP_S_BIAS_CORRECTION1] = "bias_correction1",
    [DDP_S_BIAS_CORRECTION2] = "bias_correction2", [DDP_S_WEIGHT_DECAY] = "weight_decay",
    [DDP_S_EMA_DECAY] = "ema_decay", [DDP_S_EMA_REST] = "ema_rest",
    [DDP_S_BIAS_WEIGHT_DECAY] = "bias_weight_decay", [DDP_S_NORM_WEIGHT_DECAY] = "norm_weight_decay",
};

static const char *dim_text(Ddpc *c, IrDim d) {
    if (!d.per_sample)
        return arena_printf(c->arena, "%lld", (long long)d.fixed);
    if (!d.fixed)
        return arena_printf(c->arena, "%lldn", (long long)d.per_sample);
    return arena_printf(c->arena, "%lld+%lldn", (long long)d.fixed, (long long)d.per_sample);
}

static const char *tensor_shape(Ddpc *c, const Tensor *t) {
    StrBuf sb = {0};
    sb_putc(&sb, '[');
    if (t->batched)
        sb_printf(&sb, "n%s", t->shape.rank ? ", " : "");
    for (int i = 0; i < t->shape.rank; i++)
        sb_printf(&sb, "%s%lld", i ? ", " : "", (long long)t->shape.dim[i]);
    if (!t->batched && t->shape.rank == 0)
        sb_printf(&sb, "%lld", (long long)t->elems);
    sb_putc(&sb, ']');
    const char *s = arena_strdup(c->arena, sb.data);
    sb_free(&sb);
    return s;
}

/* ----------------------------------------------------------- expressions */

static int precedence(XKind k) {
    switch (k) {
    case X_ADD: case X_SUB: return 1;
    case X_MUL: case X_DIV: return 2;
    case X_NEG: return 3;
    default: return 4;
    }
}

static void expr_to(Ddpc *c, StrBuf *sb, const XExpr *e, int min) {
    static const char *const fn[] = {[X_MAX] = "max", [X_EXP] = "exp", [X_LOG] = "log",
                                     [X_TANH] = "tanh", [X_SQRT] = "sqrt", [X_SIGMOID] = "sigmoid",
                                     [X_EXPM1] = "expm1", [X_LOG1P] = "log1p", [X_NORMAL_CDF] = "phi",
                                     [X_GT] = "gt", [X_WHEN] = "when"};
    int prec = precedence(e->kind);
    bool parens = prec < min;
    if (parens)
        sb_putc(sb, '(');
    switch (e->kind) {
    case X_LOAD:
        sb_printf(sb, "%%%d%s", e->t->id,
                  e->bc == BC_CHANNEL ? "[c]" : e->bc == BC_SAMPLE ? "[s]" : e->bc == BC_SCALAR ? "[0]"
                  : e->bc == BC_ROW ? "[r]" : "");
        break;
    case X_ONE_HOT:
        sb_printf(sb, "one_hot(");
        expr_to(c, sb, e->a, 0);
        sb_printf(sb, ", %lld)", (long long)e->channels);
        break;
    case X_CONST:
        sb_printf(sb, "%s", fmt_number(c->arena, e->num));
        break;
    case X_SCALAR:
        sb_printf(sb, "%s", scalar_names[e->scalar]);
        break;
    case X_NEG:
        sb_putc(sb, '-');
        expr_to(c, sb, e->a, 3);
        break;
    case X_ADD: case X_SUB: case X_MUL: case X_DIV: {
        static const char ops[] = {[X_ADD] = '+', [X_SUB] = '-', [X_MUL] = '*', [X_DIV] = '/'};
        expr_to(c, sb, e->a, prec);
        sb_printf(sb, " %c ", ops[e->kind]);
        expr_to(c, sb, e->b, prec + 1);
        break;
    }
    default:
        sb_printf(sb, "%s(", fn[e->kind]);
        expr_to(c, sb, e->a, 0);
        if (e->b) {
            sb_printf(sb, ", ");
            expr_to(c, sb, e->b, 0);
        }
        sb_putc(sb, ')');
        break;
    }
    if (parens)
        sb_putc(sb, ')');
}

static const char *expr_string(Ddpc *c, const XExpr *e) {
    StrBuf sb = {0};
    expr_to(c, &sb, e, 0);
    const char *s = arena_strdup(c->arena, sb.data);
    sb_free(&sb);
    return s;
}

/* -------------------------------------------------------------------- ops */

static void tensor_list(StrBuf *sb, Tensor *const *ts, int n) {
    for (int i = 0; i < n; i++)
        sb_printf(sb, "%s%%%d", i ? ", " : "", ts[i]->id);
}

static void op_line(Ddpc *c, FILE *out, const IrOp *op) {
    StrBuf sb = {0};
    sb_printf(&sb, "  #%-4d %-14s ", op->id, op_kind_name(op->kind));
    switch (op->kind) {
    case OP_ROW_PARTIALS:
        sb_printf(&sb, "%%%d = ", op->out[0]->id);
        if (op->code == OP_BN_STATS)
            sb_printf(&sb, "moments of %%%d", op->in[0]->id);
        for (int k = 0; k < (int)(sizeof op->expr / sizeof op->expr[0]) && op->expr[k]; k++)
            sb_printf(&sb, "%s%s", k ? "; " : "", expr_string(c, op->expr[k]));
        sb_printf(&sb, "   (chunks of %lld rows of %lldn, %lld channels)", (long long)op->chunk_rows,
                  (long long)op->rows_per_sample, (long long)op->channels);
        break;
    case OP_REDUCE_ROWS:
        if (op->chunk_rows) {
            tensor_list(&sb, op->out, op->nout);
            sb_printf(&sb, " %s= the chunks' sums of %%%d", op->accumulate ? "+" : "", op->in[0]->id);
            break;
        }
        /* fall through */
    case OP_POINTWISE:
        for (int k = 0; k < op->nout; k++) {
            if (k)
                sb_printf(&sb, "\n  %-19s", "");
            sb_printf(&sb, "%%%d %s= %s", op->out[k]->id,
                      op->accumulate && op->kind == OP_REDUCE_ROWS ? "+" : "",
                      expr_string(c, op->expr[k]));
        }
        if (op->kind == OP_REDUCE_ROWS)
            sb_printf(&sb, "   (sum over %lldn rows of %lld channels)",
                      (long long)op->rows_per_sample, (long long)op->channels);
        break;
    case OP_GEMM:
        sb_printf(&sb, "%%%d %s= %%%d%s x %%%d%s   m %s, n %s, k %s", op->out[0]->id,
                  op->accumulate ? "+" : "", op->in[0]->id, op->ta ? "^T" : "", op->in[1]->id,
                  op->tb ? "^T" : "", dim_text(c, op->m), dim_text(c, op->n), dim_text(c, op->k));
        if (op->alpha != 1)
            sb_printf(&sb, ", alpha %.9g", op->alpha);
        if (op->groups != 1 || op->batches.fixed != 1 || op->batches.per_sample)
            sb_printf(&sb, ", %s x %lld products, ld %lld %lld %lld, strides %lld %lld %lld, %lld %lld %lld",
                      dim_text(c, op->batches), (long long)op->groups, (long long)op->ld[0], (long long)op->ld[1],
                      (long long)op->ld[2], (long long)op->batch_stride[0], (long long)op->batch_stride[1],
                      (long long)op->batch_stride[2], (long long)op->group_stride[0], (long long)op->group_stride[1],
                      (long long)op->group_stride[2]);
        break;
    case OP_BUCKET_READY:
        sb_printf(&sb, "bucket %lld", (long long)op->bucket);
        break;
    case OP_WAIT_BUCKETS:
    case OP_METRICS_READY:
        break;
    default:
        tensor_list(&sb, op->out, op->nout);
        sb_printf(&sb, " %s= %s(", op->accumulate ? "+" : "", op_kind_name(op->kind));
        tensor_list(&sb, op->in, op->nin);
        sb_putc(&sb, ')');
        if (op->kind == OP_CONV)
            sb_printf(&sb, "   %s", op->code == DDP_CONV_FORWARD         ? "forward"
                                     : op->code == DDP_CONV_BACKWARD_DATA ? "backward data"
                                                                          : "backward filter");
        if (op->kind == OP_IM2COL || op->kind == OP_COL2IM || op->kind == OP_MAXPOOL ||
            op->kind == OP_MAXPOOL_BWD || op->kind == OP_AVGPOOL || op->kind == OP_AVGPOOL_BWD || op->kind == OP_CONV ||
            op->kind == OP_DEPTHWISE || op->kind == OP_DEPTHWISE_DATA || op->kind == OP_DEPTHWISE_FILTER)
            sb_printf(&sb, "   %lldx%lld, stride %lldx%lld, pad %lld,%lld,%lld,%lld",
                      (long long)op->kernel[0], (long long)op->kernel[1], (long long)op->stride[0],
                      (long long)op->stride[1], (long long)op->pad[0], (long long)op->pad[1],
                      (long long)op->pad[2], (long long)op->pad[3]);
        if (op->what)
            sb_printf(&sb, "   %s%s", op->what, op->from_logits ? ", from logits" : "");
        if (op->kind == OP_SOFTMAX && op->causal)
            sb_printf(&sb, "   causal");
        if (op->kind == OP_DROPOUT_MASK)
            sb_printf(&sb, "   rate %s, key %lld", fmt_number(c->arena, op->rate), (long long)op->key);
        if (op->kind == OP_BN_STATS)
            sb_printf(&sb, "   momentum %s", fmt_number(c->arena, op->momentum));
        if (op->kind == OP_LAYERNORM || op->kind == OP_LAYERNORM_BWD)
            sb_printf(&sb, "   rows of %lld, epsilon %s", (long long)op->axis_len, fmt_number(c->arena, op->epsilon));
        if (op->kind == OP_CONCAT || op->kind == OP_SPLIT)
            sb_printf(&sb, "   columns %lld..%lld of %lld", (long long)op->concat_offset,
                      (long long)(op->concat_offset + op->concat_width), (long long)op->axis_len);
        break;
    }
    if (op->kind != OP_BUCKET_READY && op->kind != OP_WAIT_BUCKETS && op->kind != OP_METRICS_READY &&
        op->kind != OP_GEMM && op->kind != OP_CONV)
        sb_printf(&sb, "   [range %s]", dim_text(c, op->range));
    if (op->path)
        sb_printf(&sb, "   (%s)", op->path == DDP_PATH_GENERATED ? "generated" : "library");
    while (sb.len && sb.data[sb.len - 1] == ' ')
        sb.data[--sb.len] = '\0';
    fprintf(out, "%s\n", sb.data);
    sb_free(&sb);
}

static const char *const phase_names[] = {"forward", "backward", "optimizer", "evaluation"};

static void header(Ddpc *c, FILE *out, const char *what, Ir *ir) {
    fprintf(out, "%s %s: batch %lld per replica (n live), %s, %s parameters, %s statistics\n",
            what, ir->graph->model, (long long)ir->batch, dtype_name(ir->dtype),
            fmt_count(c->arena, ir->param_count), fmt_count(c->arena, ir->stats_count));
}

void ir_print(Ddpc *c, FILE *out, Ir *ir) {
    header(c, out, "ir", ir);
    fprintf(out, "tensors:\n");
    for (int i = 0; i < ir->tensors.len; i++) {
        Tensor *t = ir->tensors.items[i];
        Tensor *st = tensor_storage(t);
        if (st->uses_mask == 0 && t->kind != T_PARAM && t->kind != T_GRAD && t->kind != T_STAT)
            continue; /* fused away */
        fprintf(out, "  %%%-4d %-9s %-18s %s", t->id, kind_names[t->kind], tensor_shape(c, t),
                dtype_name(t->dtype));
        fprintf(out, "  %s", t->name);
        if (t->base)
            fprintf(out, "  (view of %%%d)", t->base->id);
        if (t->init >= 0)
            fprintf(out, "  init %s", init_words[t->init]);
        fputc('\n', out);
    }
    for (int ph = 0; ph < PH_COUNT; ph++) {
        fprintf(out, "%s:\n", phase_names[ph]);
        for (int i = 0; i < ir->ops[ph].len; i++)
            op_line(c, out, ir->ops[ph].items[i]);
    }
}

void plan_print(Ddpc *c, FILE *out, Ir *ir) {
    header(c, out, "plan", ir);
    int64_t elem = dtype_size(ir->dtype);
    int64_t pbytes = ir->param_count * elem;
    fprintf(out, "memory per replica, bytes:\n");
    fprintf(out, "  parameters       %15s\n", fmt_count(c->arena, pbytes));
    const char *extras = gradient_extras(ir);
    fprintf(out, "  gradients        %15s%s%s\n", fmt_count(c->arena, ir->grads_bytes), *extras ? "   " : "", extras);
    fprintf(out, "  optimizer state  %15s   (%d vector%s)\n",
            fmt_count(c->arena, pbytes * ir->state_vectors), ir->state_vectors,
            ir->state_vectors == 1 ? "" : "s");
    fprintf(out, "  statistics       %15s\n", fmt_count(c->arena, ir->stats_count * elem));
    if (constant_bytes(ir))
        fprintf(out, "  %s %15s\n", constants_label(ir), fmt_count(c->arena, constant_bytes(ir)));
    fprintf(out, "  activations      %15s   (without reuse: %s)\n",
            fmt_count(c->arena, ir->arena_bytes), fmt_count(c->arena, ir->no_reuse_arena_bytes));
    fprintf(out, "  workspace        %15s   (without reuse: %s)\n",
            fmt_count(c->arena, ir->workspace_bytes), fmt_count(c->arena, ir->no_reuse_workspace_bytes));
    fprintf(out, "  batch            %15s\n", fmt_count(c->arena, ir->input_bytes));
    fprintf(out, "parameters (in the order backward completes their gradients):\n");
    for (int i = 0; i < ir->params.len; i++) {
        Tensor *p = ir->params.items[i];
        static const char *const groups[] = {[DDP_DECAY_WEIGHTS] = "", [DDP_DECAY_BIASES] = " decay=biases",
                                             [DDP_DECAY_NORMS] = " decay=norms"};
        fprintf(out, "  [%lld, %lld)  %s %s %s %s%s\n", (long long)p->flat, (long long)(p->flat + p->elems), p->name,
                tensor_shape(c, p), p->layout, init_words[p->init], ir->decay_groups ? groups[decay_group(p)] : "");
    }
    for (int i = 0; i < ir->stats.len; i++) {
        Tensor *p = ir->stats.items[i];
        fprintf(out, "  stats [%lld, %lld)  %s %s %s %s\n", (long long)p->flat,
                (long long)(p->flat + p->elems), p->name, tensor_shape(c, p), p->layout, init_words[p->init]);
    }
    fprintf(out, "gradient buckets (%s bytes each at least):\n", fmt_count(c->arena, ir->bucket_bytes));
    for (int i = 0; i < ir->buckets.len; i++)
        fprintf(out, "  bucket %d: gradients [%lld, %lld), %s bytes\n", i,
                (long long)ir->buckets.items[i].begin, (long long)ir->buckets.items[i].end,
                fmt_count(c->arena, (ir->buckets.items[i].end - ir->buckets.items[i].begin) * elem));
    fprintf(out, "buffers:\n");
    for (int i = 0; i < ir->slots.len; i++) {
        Tensor *t = ir->slots.items[i];
        fprintf(out, "  slot %-4d %%%-4d %-9s %12s +%-12s", i, t->id, region_names[t->region],
                fmt_count(c->arena, t->elems * dtype_size(t->dtype)),
                fmt_count(c->arena, t->offset));
        if (t->region == DDP_REGION_ARENA || t->region == DDP_REGION_WORKSPACE)
            fprintf(out, " live %d..%d%s", t->first_use, t->last_use,
                    t->uses_mask == 2 ? " (evaluation)" : "");
        fprintf(out, "  %s\n", t->name);
    }
    fprintf(out, "schedule:\n");
    for (int ph = 0; ph < PH_COUNT; ph++) {
        fprintf(out, "  %s:", phase_names[ph]);
        for (int i = 0; i < ir->ops[ph].len; i++) {
            IrOp *op = ir->ops[ph].items[i];
            if (op->kind == OP_BUCKET_READY)
                fprintf(out, " [bucket %lld ready]", (long long)op->bucket);
            else if (op->kind == OP_WAIT_BUCKETS)
                fprintf(out, " [wait for buckets]");
            else if (op->kind == OP_METRICS_READY)
                fprintf(out, " [metrics ready]");
            else
                fprintf(out, " #%d", op->id);
        }
        fputc('\n', out);
    }
}
