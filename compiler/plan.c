/* plan.c: where every value lives, and when gradients are ready to be summed.
 *
 * The flat parameter vector is laid out in the order the backward pass finishes each
 * parameter's gradient, so the gradient vector can be cut into contiguous buckets
 * that become final one after the other; a BUCKET_READY marker follows the op that
 * completes each, and the transport may start summing it while backward goes on.
 *
 * Activations, their gradients and workspaces are placed by liveness over the whole
 * training step (forward, loss, backward): a value occupies its bytes from its first
 * use to its last, views share their base's bytes, and two values share bytes only
 * when their lifetimes do not overlap. Evaluation is planned into the same regions
 * on its own, since it never runs during a training step; its model outputs live to
 * the phase's end, for the runtime to read. */
#include <stdlib.h>
#include <string.h>

#include "ddpc.h"
#include "../runtime/ddp_abi.h"

enum { ALIGN = 64 };

static int64_t align_up(int64_t n) {
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

static int64_t bytes_of(const Tensor *t) {
    return t->elems * dtype_size(t->dtype);
}

/* Every tensor an op touches, as storage, written into out (at most cap). */
static void expr_tensors(const XExpr *e, Tensor **out, int *n, int cap) {
    if (!e)
        return;
    if (e->kind == X_LOAD && *n < cap)
        out[(*n)++] = tensor_storage(e->t);
    expr_tensors(e->a, out, n, cap);
    expr_tensors(e->b, out, n, cap);
}

static int op_tensors(const IrOp *op, Tensor **out, int cap) {
    int n = 0;
    for (int k = 0; k < op->nin && n < cap; k++)
        out[n++] = tensor_storage(op->in[k]);
    for (int k = 0; k < op->nout && n < cap; k++)
        out[n++] = tensor_storage(op->out[k]);
    for (int k = 0; k < 4; k++)
        expr_tensors(op->expr[k], out, &n, cap);
    return n;
}

enum { MAX_TOUCHED = 256 };

/* ---------------------------------------------------- flat vectors, buckets */

typedef struct Ready {
    Tensor *param;
    int at;       /* the backward op that finishes its gradient, -1 if none does */
    int order;
} Ready;

static int by_readiness(const void *a, const void *b) {
    const Ready *x = a, *y = b;
    int ax = x->at < 0 ? 1 << 30 : x->at, ay = y->at < 0 ? 1 << 30 : y->at;
    return ax != ay ? (ax < ay ? -1 : 1) : x->order - y->order;
}

static void lay_out_vectors(Ddpc *c, Ir *ir) {
    OpList *bwd = &ir->ops[PH_BACKWARD];
    int np = ir->params.len;
    Ready *ready = arena_alloc(c->arena, sizeof(Ready) * (size_t)(np + 1));
    for (int i = 0; i < np; i++) {
        ready[i] = (Ready){ir->params.items[i], -1, i};
        Tensor *g = tensor_storage(ir->params.items[i]->grad);
        for (int k = 0; k < bwd->len; k++)
            for (int o = 0; o < bwd->items[k]->nout; o++)
                if (tensor_storage(bwd->items[k]->out[o]) == g)
                    ready[i].at = k;
    }
    qsort(ready, (size_t)np, sizeof(Ready), by_readiness);
    int64_t offset = 0;
    for (int i = 0; i < np; i++) {
        Tensor *p = ready[i].param;
        ir->params.items[i] = p;
        p->flat = offset;
        p->grad->flat = offset;
        offset += p->elems;
    }
    ir->param_count = offset;
    offset = 0;
    for (int i = 0; i < ir->stats.len; i++) {
        ir->stats.items[i]->flat = offset;
        offset += ir->stats.items[i]->elems;
    }
    ir->stats_count = offset;
    Tensor *whole[] = {ir->all_params, ir->all_grads,    ir->states[0],          ir->states[1],
                       ir->states[2],    ir->decay_groups, ir->parameter_numbers};
    for (int i = 0; i < 7; i++)
        if (whole[i])
            whole[i]->elems = ir->param_count;
    int64_t chunks = (ir->param_count + NONFINITE_CHUNK - 1) / NONFINITE_CHUNK;
    for (int i = 0; i < ir->ops[PH_OPTIMIZER].len; i++) {
        IrOp *op = ir->ops[PH_OPTIMIZER].items[i];
        if (op->kind == OP_OPTIMIZER)
            op->range = (IrDim){ir->param_count, 0};
        if (op->kind == OP_FIND_NONFINITE || op->kind == OP_GRAD_SQUARES) {
            op->range = (IrDim){chunks, 0};
            op->out[0]->elems = chunks;
        }
    }

    /* buckets: consecutive parameters until the size is reached; each is ready when its
     * last gradient is */
    VEC(int) ready_at = {0};
    int64_t elem = dtype_size(ir->dtype), begin = 0, size = 0;
    int at = -1;
    for (int i = 0; i < np; i++) {
        size += ready[i].param->elems * elem;
        if (ready[i].at > at)
            at = ready[i].at;
        if (size >= ir->bucket_bytes || i == np - 1) {
            int64_t end = ready[i].param->flat + ready[i].param->elems;
            vec_push(c->arena, &ir->buckets, ((Bucket){begin, end}));
            vec_push(c->arena, &ready_at, at);
            begin = end;
            size = 0;
        }
    }
    /* the markers, after the ops that complete them (walking backward to keep the
     * positions of the ones not yet inserted) */
    for (int b = ir->buckets.len - 1; b >= 0; b--) {
        IrOp *marker = arena_alloc(c->arena, sizeof *marker);
        marker->kind = OP_BUCKET_READY;
        marker->phase = PH_BACKWARD;
        marker->bucket = b;
        marker->kernel_index = -1;
        vec_push(c->arena, bwd, marker);
        int pos = ready_at.items[b] + 1;
        memmove(&bwd->items[pos + 1], &bwd->items[pos],
                sizeof(IrOp *) * (size_t)(bwd->len - 1 - pos));
        bwd->items[pos] = marker;
    }
}

/* An op made for the plan, placed at pos of a phase's list. */
static IrOp *insert_pointwise(Ddpc *c, Ir *ir, Phase ph, int pos, Tensor *out, Tensor *in) {
    IrOp *op = ir_op(c, ir, ph, OP_POINTWISE); /* appended; moved to pos below */
    op->out[op->nout++] = out;
    op->expr[0] = x_load(c, in, BC_FULL);
    op->range = (IrDim){out->elems, 0};
    OpList *ops = &ir->ops[ph];
    memmove(&ops->items[pos + 1], &ops->items[pos], sizeof(IrOp *) * (size_t)(ops->len - 1 - pos));
    ops->items[pos] = op;
    return op;
}

static int position_of(const OpList *ops, OpKind kind, int64_t bucket) {
    for (int i = 0; i < ops->len; i++)
        if (ops->items[i]->kind == kind && (kind != OP_BUCKET_READY || ops->items[i]->bucket == bucket))
            return i;
    return 0;
}

/* Bucket b of a vector in the GRADS region: its elements from `at` on (in its type's
 * units), the bucket's slice of them. */
static Tensor *bucket_slice(Ddpc *c, Ir *ir, int b, const char *what, DType dtype, int64_t at) {
    Bucket k = ir->buckets.items[b];
    Shape s = {1, {k.end - k.begin}};
    Tensor *t = ir_tensor(c, ir, arena_printf(c->arena, "%s[%d]", what, b), T_GRAD, dtype, false, &s);
    t->flat = at + k.begin;
    return t;
}

/* accumulate_batches (ddp_abi.h's DDP_S_ACCUMULATED): a step sums the gradients of
 * several batches. Just before its marker each bucket of gradients becomes the step's
 * sum so far, its batch's plus the earlier batches' (none on the step's first batch,
 * whatever the sum's bytes hold then), a sum kept in the GRADS region after the
 * gradients for the next batch. On the step's last batch the marker hands the whole
 * sum to the all-reduce; before it the runtime holds the markers back and runs no
 * optimizer. */
static void gradient_sum(Ddpc *c, Ir *ir) {
    ir->grads_bytes = ir->param_count * dtype_size(ir->dtype);
    if (ir->config->accumulate_batches <= 1)
        return;
    for (int b = 0; b < ir->buckets.len; b++) {
        Tensor *grads = bucket_slice(c, ir, b, "grads", ir->dtype, 0);
        Tensor *sum = bucket_slice(c, ir, b, "grads:sum", ir->dtype, ir->param_count);
        IrOp *op = insert_pointwise(c, ir, PH_BACKWARD, position_of(&ir->ops[PH_BACKWARD], OP_BUCKET_READY, b), grads,
                                    grads);
        op->expr[0] = x_binary(c, X_ADD, op->expr[0],
                               x_binary(c, X_WHEN, x_scalar(c, DDP_S_ACCUMULATED), x_load(c, sum, BC_FULL)));
        op->out[op->nout] = sum;
        op->expr[op->nout++] = op->expr[0]; /* every value is computed before any is stored */
    }
    ir->grads_bytes *= 2;
}

/* allreduce_precision = bf16 (ddp_abi.h): each bucket rounded into its bf16 copy just
 * before its marker, the sums widened back into the gradients after the wait. The
 * copy sits in the GRADS region after the f32 gradients (and their sum), element e at
 * flat (those bytes) / 2 + e, as ddp_wire_offset says. */
static void gradient_wire(Ddpc *c, Ir *ir) {
    if (ir->config->allreduce_precision != DDP_ALLREDUCE_BF16 || ir->dtype != DT_F32)
        return;
    int64_t at = ir->grads_bytes / dtype_size(DT_BF16);
    ir->grads_bytes += ir->param_count * dtype_size(DT_BF16);
    for (int b = 0; b < ir->buckets.len; b++) {
        Tensor *grads = bucket_slice(c, ir, b, "grads", ir->dtype, 0);
        Tensor *wire = bucket_slice(c, ir, b, "grads:bf16", DT_BF16, at);
        insert_pointwise(c, ir, PH_BACKWARD, position_of(&ir->ops[PH_BACKWARD], OP_BUCKET_READY, b), wire, grads);
        insert_pointwise(c, ir, PH_OPTIMIZER, position_of(&ir->ops[PH_OPTIMIZER], OP_WAIT_BUCKETS, -1) + 1, grads,
                         wire);
    }
}

/* ------------------------------------------------------------ liveness */

static bool in_arena(const Tensor *t) {
    return t->kind == T_ACT || t->kind == T_DACT || t->kind == T_WORK;
}

/* first and last positions of every planned tensor over a sequence of phases; mask
 * says which sequence (1 training, 2 evaluation) uses it */
static void liveness(Ir *ir, const Phase *phases, int nphases, int mask) {
    int pos = 0;
    for (int p = 0; p < nphases; p++) {
        OpList *ops = &ir->ops[phases[p]];
        for (int i = 0; i < ops->len; i++, pos++) {
            Tensor *touched[MAX_TOUCHED];
            int n = op_tensors(ops->items[i], touched, MAX_TOUCHED);
            for (int k = 0; k < n; k++) {
                Tensor *t = touched[k];
                if (!(t->uses_mask & mask))
                    t->first_use = pos;
                t->last_use = pos;
                t->uses_mask |= mask;
            }
        }
    }
}

/* --------------------------------------------------------------- placing */

static int by_size(const void *a, const void *b) {
    const Tensor *x = *(Tensor *const *)a, *y = *(Tensor *const *)b;
    int64_t bx = bytes_of(x), by = bytes_of(y);
    return bx != by ? (bx > by ? -1 : 1) : x->id - y->id;
}

static int by_offset(const void *a, const void *b) {
    const Tensor *x = *(Tensor *const *)a, *y = *(Tensor *const *)b;
    return x->offset != y->offset ? (x->offset < y->offset ? -1 : 1) : x->id - y->id;
}

static bool live_together(const Tensor *a, const Tensor *b) {
    return !(a->last_use < b->first_use || b->last_use < a->first_use);
}

/* Greedy placement, largest first, at the lowest offset free for the whole of its
 * lifetime: among the placed tensors alive at the same time, in offset order, the
 * first gap large enough. Returns the peak. */
static int64_t place(Ddpc *c, Tensor **ts, int n, bool no_reuse) {
    qsort(ts, (size_t)n, sizeof(Tensor *), by_size);
    Tensor **alive = arena_alloc(c->arena, sizeof(Tensor *) * (size_t)(n + 1));
    int64_t peak = 0;
    for (int i = 0; i < n; i++) {
        Tensor *t = ts[i];
        int64_t size = align_up(bytes_of(t)), at = 0;
        if (no_reuse) {
            at = peak;
        } else {
            int m = 0;
            for (int j = 0; j < i; j++)
                if (live_together(ts[j], t))
                    alive[m++] = ts[j];
            qsort(alive, (size_t)m, sizeof(Tensor *), by_offset);
            for (int j = 0; j < m && at + size > alive[j]->offset; j++) {
                int64_t end = alive[j]->offset + align_up(bytes_of(alive[j]));
                if (end > at)
                    at = end;
            }
        }
        t->offset = at;
        if (at + size > peak)
            peak = at + size;
    }
    return peak;
}

static int64_t place_kind(Ddpc *c, Ir *ir, bool eval, bool workspace, bool no_reuse) {
    VEC(Tensor *) ts = {0};
    for (int i = 0; i < ir->tensors.len; i++) {
        Tensor *t = ir->tensors.items[i];
        if (t->base || !in_arena(t) || t->uses_mask != (eval ? 2 : 1) ||
            (t->kind == T_WORK) != workspace)
            continue;
        t->region = workspace ? DDP_REGION_WORKSPACE : DDP_REGION_ARENA;
        vec_push(c->arena, &ts, t);
    }
    return place(c, ts.items, ts.len, no_reuse);
}

/* A library's scratch (a convolution's workspace) placed again once everything else
 * has its place and the workspace region its size: into the largest gap that nothing
 * else alive meanwhile holds, and grown to fill it. Those bytes are the region's
 * anyway, and cuDNN's fastest engines for small images (a filter's gradient summed in
 * parts) want more than the generated path's columns, which is all the scratch was
 * sized for. Scratch is alive for one op, so one never waits on another; if one did
 * find no gap, it would go above everything, the region growing. */
static void give_scratch_room(Ddpc *c, Ir *ir, int mask) {
    VEC(Tensor *) ts = {0};
    for (int i = 0; i < ir->tensors.len; i++) {
        Tensor *t = ir->tensors.items[i];
        if (!t->base && t->kind == T_WORK && t->uses_mask == mask)
            vec_push(c->arena, &ts, t);
    }
    qsort(ts.items, (size_t)ts.len, sizeof(Tensor *), by_size);
    Tensor **alive = arena_alloc(c->arena, sizeof(Tensor *) * (size_t)(ts.len + 1));
    for (int i = 0; i < ts.len; i++) {
        Tensor *t = ts.items[i];
        if (!t->scratch)
            continue;
        int m = 0;
        for (int j = 0; j < ts.len; j++) /* the others, and the scratch placed again before it */
            if (live_together(ts.items[j], t) && (!ts.items[j]->scratch || j < i))
                alive[m++] = ts.items[j];
        qsort(alive, (size_t)m, sizeof(Tensor *), by_offset);
        int64_t need = align_up(bytes_of(t)), best_at = -1, best = 0, at = 0;
        for (int j = 0; j <= m; j++) {
            int64_t next = j < m ? alive[j]->offset : ir->workspace_bytes;
            if (next - at >= need && next - at > best)
                best_at = at, best = next - at;
            if (j < m && alive[j]->offset + align_up(bytes_of(alive[j])) > at)
                at = alive[j]->offset + align_up(bytes_of(alive[j]));
        }
        if (best_at < 0) { /* then at + need is past the region's end */
            best_at = at, best = need;
            ir->workspace_bytes = at + need;
        }
        t->offset = best_at;
        t->elems = t->shape.dim[0] = best / dtype_size(t->dtype);
    }
}

static void place_small_regions(Ir *ir) {
    Tensor *inputs[] = {ir->input, ir->label, ir->sample_id};
    int64_t offset = 0;
    for (int i = 0; i < 3; i++) {
        inputs[i]->region = DDP_REGION_INPUT;
        inputs[i]->offset = offset;
        offset += align_up(bytes_of(inputs[i]));
    }
    ir->input_bytes = offset;
    ir->accum->region = DDP_REGION_ACCUM;
    ir->nonfinite->region = DDP_REGION_ACCUM;
    ir->nonfinite->offset = bytes_of(ir->accum);
    ir->accum_bytes = bytes_of(ir->accum) + bytes_of(ir->nonfinite);
    for (int i = 0; i < ir->tensors.len; i++) {
        Tensor *t = ir->tensors.items[i];
        int64_t elem = dtype_size(t->dtype);
        if (t->kind == T_PARAM)
            t->region = DDP_REGION_PARAMS, t->offset = t->flat * elem;
        else if (t->kind == T_GRAD)
            t->region = DDP_REGION_GRADS, t->offset = t->flat * elem;
        else if (t->kind == T_STAT)
            t->region = DDP_REGION_STATS, t->offset = t->flat * elem;
    }
    for (int i = 0; i < 3; i++)
        if (ir->states[i]) {
            ir->states[i]->region = DDP_REGION_STATE;
            ir->states[i]->offset = i * ir->param_count * dtype_size(ir->dtype);
        }
    if (ir->decay_groups)
        ir->decay_groups->region = DDP_REGION_CONSTANTS, ir->decay_groups->offset = 0;
    if (ir->trust) {
        bool groups = ir->decay_groups != NULL;
        ir->parameter_numbers->region = DDP_REGION_CONSTANTS;
        ir->parameter_numbers->offset = ddp_parameter_numbers_at(ir->param_count, groups);
        ir->parameter_spans->region = DDP_REGION_CONSTANTS;
        ir->parameter_spans->offset = ddp_parameter_spans_at(ir->param_count, groups);
    }
}

/* The buffer table: the batch's and the accumulators' first (the runtime fills and
 * reads them), then one slot per storage tensor an op touches, in order of use. */
static void assign_slots(Ddpc *c, Ir *ir) {
    Tensor *fixed[] = {ir->input, ir->label, ir->sample_id, ir->accum};
    for (int i = 0; i < 4; i++) {
        fixed[i]->slot = ir->slots.len;
        vec_push(c->arena, &ir->slots, fixed[i]);
    }
    for (int ph = 0; ph < PH_COUNT; ph++)
        for (int i = 0; i < ir->ops[ph].len; i++) {
            Tensor *touched[MAX_TOUCHED];
            int n = op_tensors(ir->ops[ph].items[i], touched, MAX_TOUCHED);
            for (int k = 0; k < n; k++)
                if (touched[k]->slot < 0) {
                    touched[k]->slot = ir->slots.len;
                    vec_push(c->arena, &ir->slots, touched[k]);
                }
        }
    for (int i = 0; i < ir->tensors.len; i++) {
        Tensor *t = ir->tensors.items[i];
        if (t->base)
            t->slot = t->base->slot;
    }
}

void plan(Ddpc *c, Ir *ir) {
    lay_out_vectors(c, ir);
    gradient_sum(c, ir);
    gradient_wire(c, ir);
    static const Phase train[] = {PH_FORWARD, PH_BACKWARD, PH_OPTIMIZER};
    static const Phase eval[] = {PH_EVAL};
    liveness(ir, train, 3, 1);
    liveness(ir, eval, 1, 2);
    /* the runtime reads the outputs once the evaluation phase is done (--predict):
     * they live past its last op, so nothing takes or poisons their bytes */
    Tensor *kept = tensor_storage(ir->eval_output);
    if (in_arena(kept))
        kept->last_use = ir->ops[PH_EVAL].len;
    ir->arena_bytes = place_kind(c, ir, false, false, ir->no_reuse);
    ir->workspace_bytes = place_kind(c, ir, false, true, ir->no_reuse);
    int64_t eval_arena = place_kind(c, ir, true, false, ir->no_reuse);
    int64_t eval_work = place_kind(c, ir, true, true, ir->no_reuse);
    if (eval_arena > ir->arena_bytes)
        ir->arena_bytes = eval_arena;
    if (eval_work > ir->workspace_bytes)
        ir->workspace_bytes = eval_work;
    /* what keeping every value apart would take, for comparison */
    for (int i = 0; i < ir->tensors.len; i++) {
        Tensor *t = ir->tensors.items[i];
        if (!t->base && in_arena(t) && t->uses_mask == 1) {
            if (t->kind == T_WORK)
                ir->no_reuse_workspace_bytes += align_up(bytes_of(t));
            else
                ir->no_reuse_arena_bytes += align_up(bytes_of(t));
        }
    }
    for (int mask = 1; !ir->no_reuse && mask <= 2; mask++)
        give_scratch_room(c, ir, mask);
    place_small_regions(ir);
    assign_slots(c, ir);
    int id = 0;
    for (int ph = 0; ph < PH_COUNT; ph++)
        for (int i = 0; i < ir->ops[ph].len; i++)
            ir->ops[ph].items[i]->id = id++;
}
