/* precision.c: precision = bf16 on the lowered IR, between autodiff and fusion: which
 * tensors are stored in bfloat16, which stay f32, and the bf16 copies a product
 * makes of an f32 operand.
 *
 * Stored in bf16: the batch's inputs (but token indices), activations and their
 * gradients, a convolution's columns and KRSC filters, and the filters' gradient as a
 * convolution writes it. Kept f32: the master copy (parameters, their gradients, the optimizer's
 * state), statistics, labels, per-channel sums and every other scratch, softmax's
 * output and the values of the model's last layer (its product and the output), with
 * their gradients, so that softmax, the loss and the metrics read f32 logits. A
 * convolution's three tensors are bf16 whatever their place, as the library needs. Whatever a kernel reads it computes in f32 or wider; a store
 * into bf16 rounds to nearest even (llvm.c).
 *
 * A product (a GEMM, a convolution) reads two bf16 operands and sums in f32, as
 * cuBLAS and cuDNN do with bf16 inputs. A GEMM operand that is f32 (a weight, the
 * output's gradient) is read through a bf16 copy made in the same phase just before
 * its first product, so the copy lives no longer than the phase. */
#include <string.h>

#include "ddpc.h"
#include "../runtime/ddp_abi.h"

/* A batch's values: a per-channel gradient (of a batch-norm's mean or variance) is a
 * sum over the batch's rows, and stays f32 with the other sums. */
static bool bf16_kind(const Tensor *t) {
    return t->batched && (t->kind == T_INPUT || t->kind == T_ACT || t->kind == T_DACT);
}

static void keep_f32(bool *keep, Tensor *t) {
    if (t) {
        keep[tensor_storage(t)->id] = true;
        if (t->grad)
            keep[tensor_storage(t->grad)->id] = true;
    }
}

/* Token indices an embedding reads stay f32, exact to 2^24 (bf16 holds integers
 * exactly only to 256). */
static void keep_indices_f32(bool *keep, const XExpr *e) {
    if (!e)
        return;
    if (e->kind == X_ONE_HOT && e->a->kind == X_LOAD)
        keep_f32(keep, e->a->t);
    keep_indices_f32(keep, e->a);
    keep_indices_f32(keep, e->b);
}

/* What the loss, metrics and softmax read or write stays f32, and so does the last
 * layer's product: the logits cost little and keep their digits. */
static bool *f32_tensors(Ddpc *c, Ir *ir) {
    bool *keep = arena_alloc(c->arena, (size_t)ir->tensors.len);
    memset(keep, 0, (size_t)ir->tensors.len);
    for (int i = 0; i < ir->tensors.len; i++) {
        Tensor *t = ir->tensors.items[i];
        if (t->kind == T_ACT && t->layer && t->layer == ir->output->layer)
            keep_f32(keep, t);
    }
    for (int ph = 0; ph < PH_COUNT; ph++)
        for (int i = 0; i < ir->ops[ph].len; i++) {
            IrOp *op = ir->ops[ph].items[i];
            if (op->kind == OP_LOSS || op->kind == OP_METRIC)
                keep_f32(keep, op->in[0]);
            if (op->kind == OP_LOSS && op->nout > 1)
                keep_f32(keep, op->out[1]);
            if (op->kind == OP_SOFTMAX)
                keep_f32(keep, op->out[0]);
            for (int k = 0; k < op->nout && op->kind == OP_POINTWISE; k++)
                keep_indices_f32(keep, op->expr[k]);
        }
    return keep;
}

static void set_bf16(Tensor *t) {
    tensor_storage(t)->dtype = DT_BF16;
}

/* Tensors a product reads or writes that a kernel of the schedule makes for it. */
static void product_tensors_bf16(Ir *ir) {
    for (int ph = 0; ph < PH_COUNT; ph++)
        for (int i = 0; i < ir->ops[ph].len; i++) {
            IrOp *op = ir->ops[ph].items[i];
            if (op->kind == OP_IM2COL || op->kind == OP_FILTERS_TO_KRSC)
                set_bf16(op->out[0]);
            if (op->kind == OP_CONV) {
                set_bf16(op->in[0]);
                set_bf16(op->in[1]);
                set_bf16(op->out[0]);
            }
        }
}

/* The bf16 copy of t for products of one path in the phase being rebuilt: made the
 * first time, cast into just before the product that asks. */
static Tensor *bf16_copy(Ddpc *c, Ir *ir, Tensor **copies, Phase ph, IrOp *product, Tensor *t) {
    Tensor *s = tensor_storage(t);
    Tensor **slot = &copies[s->id * 3 + product->path];
    if (*slot)
        return *slot;
    Tensor *copy = ir_tensor(c, ir, arena_printf(c->arena, "%s:bf16", t->name), T_WORK, DT_BF16, t->batched,
                             &t->shape);
    copy->layer = product->layer;
    IrOp *cast = ir_op(c, ir, ph, OP_POINTWISE);
    cast->out[cast->nout++] = copy;
    cast->expr[0] = x_load(c, t, BC_FULL);
    cast->range = t->batched ? (IrDim){0, t->per_sample} : (IrDim){t->elems, 0};
    cast->layer = product->layer;
    cast->path = product->path;
    copy->producer = cast;
    *slot = copy;
    return copy;
}

static void gemm_operands_bf16(Ddpc *c, Ir *ir) {
    int ntensors = ir->tensors.len; /* the copies made below are bf16, never looked up in the table */
    for (int ph = 0; ph < PH_COUNT; ph++) {
        Tensor **copies = arena_alloc(c->arena, sizeof(Tensor *) * (size_t)ntensors * 3);
        memset(copies, 0, sizeof(Tensor *) * (size_t)ntensors * 3);
        OpList old = ir->ops[ph];
        ir->ops[ph] = (OpList){0};
        for (int i = 0; i < old.len; i++) {
            IrOp *op = old.items[i];
            if (op->kind == OP_GEMM)
                for (int k = 0; k < 2; k++)
                    if (tensor_storage(op->in[k])->dtype != DT_BF16)
                        op->in[k] = bf16_copy(c, ir, copies, (Phase)ph, op, op->in[k]);
            vec_push(c->arena, &ir->ops[ph], op);
        }
    }
}

void mixed_precision(Ddpc *c, Ir *ir) {
    if (ir->config->precision != DDP_PRECISION_BF16 || ir->dtype != DT_F32)
        return;
    bool *keep = f32_tensors(c, ir);
    for (int i = 0; i < ir->tensors.len; i++) {
        Tensor *t = ir->tensors.items[i];
        if (!t->base && bf16_kind(t) && t->dtype == DT_F32 && !keep[t->id])
            t->dtype = DT_BF16;
    }
    product_tensors_bf16(ir);
    for (int i = 0; i < ir->tensors.len; i++) { /* a view is read as its storage is */
        Tensor *t = ir->tensors.items[i];
        if (t->base)
            t->dtype = tensor_storage(t)->dtype;
    }
    gemm_operands_bf16(c, ir);
}
