/* program.c: ddp_program_desc, the description of the built program the runtime
 * walks (runtime/ddp_abi.h), emitted as LLVM constants.
 *
 * Every field of the ABI's structures is 8 bytes, so a structure, an array of them
 * and a nest of them are all one flat sequence of i64, double and pointer fields with
 * no padding: each is emitted as an anonymous LLVM struct of exactly those fields, in
 * the header's order. */
#include <stdlib.h>
#include <string.h>

#include "cg.h"
#include "../runtime/ddp_abi.h"

typedef VEC(LLVMValueRef) Fields;

typedef struct Emit {
    Cg *cg;
    int globals;
} Emit;

static void f_i64(Emit *e, Fields *f, int64_t v) {
    vec_push(e->cg->c->arena, f, LLVMConstInt(e->cg->i64, (unsigned long long)v, 1));
}

static void f_f64(Emit *e, Fields *f, double v) {
    vec_push(e->cg->c->arena, f, LLVMConstReal(e->cg->f64, v));
}

static void f_ptr(Emit *e, Fields *f, LLVMValueRef p) {
    vec_push(e->cg->c->arena, f, p ? LLVMConstBitCast(p, e->cg->ptr) : LLVMConstNull(e->cg->ptr));
}

/* A private constant holding the fields; its address. */
static LLVMValueRef global_of(Emit *e, Fields *f, const char *name) {
    Cg *cg = e->cg;
    LLVMValueRef init = LLVMConstStructInContext(cg->ctx, f->items, (unsigned)f->len, 0);
    LLVMValueRef g = LLVMAddGlobal(cg->mod, LLVMTypeOf(init),
                                   name ? name : arena_printf(cg->c->arena, "ddp_data_%d", e->globals++));
    LLVMSetInitializer(g, init);
    LLVMSetGlobalConstant(g, 1);
    LLVMSetLinkage(g, name ? LLVMExternalLinkage : LLVMPrivateLinkage);
    return g;
}

static LLVMValueRef string_of(Emit *e, const char *s) {
    if (!s)
        return NULL;
    Cg *cg = e->cg;
    LLVMValueRef init = LLVMConstStringInContext(cg->ctx, s, (unsigned)strlen(s), 0);
    LLVMValueRef g = LLVMAddGlobal(cg->mod, LLVMTypeOf(init), arena_printf(cg->c->arena, "ddp_str_%d", e->globals++));
    LLVMSetInitializer(g, init);
    LLVMSetGlobalConstant(g, 1);
    LLVMSetLinkage(g, LLVMPrivateLinkage);
    return g;
}

static void f_str(Emit *e, Fields *f, const char *s) {
    f_ptr(e, f, string_of(e, s));
}

/* ------------------------------------------------------ run-time expressions */

static void rt_code(Emit *e, Fields *code, int *count, const RtExpr *x) {
    static const int64_t ops[] = {[OP_ADD] = DDP_RT_ADD, [OP_SUB] = DDP_RT_SUB, [OP_MUL] = DDP_RT_MUL,
                                  [OP_DIV] = DDP_RT_DIV};
    static const int64_t scalars[] = {DDP_RT_REPLICAS, DDP_RT_WORKERS, DDP_RT_GLOBAL_BATCH};
    switch (x->kind) {
    case RT_CONST: f_i64(e, code, DDP_RT_CONST); f_f64(e, code, x->num); break;
    case RT_SCALAR: f_i64(e, code, scalars[x->scalar]); f_f64(e, code, 0); break;
    case RT_NEG: rt_code(e, code, count, x->a); f_i64(e, code, DDP_RT_NEG); f_f64(e, code, 0); break;
    case RT_BINARY:
        rt_code(e, code, count, x->a);
        rt_code(e, code, count, x->b);
        f_i64(e, code, ops[x->op]);
        f_f64(e, code, 0);
        break;
    }
    (*count)++;
}

/* A number or a run-time value as a ddp_rt_expr. */
static void f_rt(Emit *e, Fields *f, Value v) {
    Fields code = {0};
    int count = 0;
    if (v.kind == V_RUNTIME) {
        rt_code(e, &code, &count, v.rt);
    } else {
        f_i64(e, &code, DDP_RT_CONST);
        f_f64(e, &code, v.kind == V_NUM ? v.num : 0);
        count = 1;
    }
    f_ptr(e, f, global_of(e, &code, NULL));
    f_i64(e, f, count);
}

static void f_duration(Emit *e, Fields *f, Value v) {
    bool set = v.kind == V_DURATION;
    f_i64(e, f, set ? (int64_t)v.num : 0);
    f_i64(e, f, !set ? 0 : v.unit == UNIT_EPOCHS ? DDP_UNIT_EPOCHS : DDP_UNIT_STEPS);
}

/* ---------------------------------------------------------------- settings */

static void f_schedule(Emit *e, Fields *f, Value lr) {
    static const char *const kinds[] = {"constant", "step", "cosine", "linear"};
    if (lr.kind == V_OBJECT) {
        int kind = 0;
        for (int i = 0; i < 4; i++)
            if (strcmp(lr.builtin->name, kinds[i]) == 0)
                kind = i;
        f_i64(e, f, kind);
        f_rt(e, f, lr.args[0]);
        f_rt(e, f, object_arg(lr, "drop"));
        f_rt(e, f, object_arg(lr, "final"));
        f_duration(e, f, kind == DDP_SCHEDULE_STEP ? object_arg(lr, "every") : object_arg(lr, "warmup"));
        return;
    }
    Value none = {.kind = V_NONE};
    f_i64(e, f, DDP_SCHEDULE_CONSTANT);
    f_rt(e, f, lr);
    f_rt(e, f, none);
    f_rt(e, f, none);
    f_duration(e, f, none);
}

static void f_dataset(Emit *e, Fields *f, Value ds) {
    static const char *const kinds[] = {"idx", "cifar10", "npy", "csv", "synthetic"};
    if (ds.kind != V_OBJECT) { /* none: kind -1, every other field empty */
        f_str(e, f, "");
        f_i64(e, f, -1);
        f_ptr(e, f, NULL);
        f_ptr(e, f, NULL);
        f_f64(e, f, 1);
        f_i64(e, f, 0);
        f_i64(e, f, 0);
        f_ptr(e, f, NULL);
        f_i64(e, f, 0);
        f_ptr(e, f, NULL);
        f_i64(e, f, 0);
        f_i64(e, f, 0);
        return;
    }
    int kind = 0;
    for (int i = 0; i < 5; i++)
        if (strcmp(ds.builtin->name, kinds[i]) == 0)
            kind = i;
    f_str(e, f, ds.decl ? ds.decl->name : "");
    f_i64(e, f, kind);
    const char *paths[5][2] = {{"images", "labels"}, {"dir", NULL}, {"inputs", "labels"}, {"path", NULL}, {NULL, NULL}};
    for (int i = 0; i < 2; i++) {
        Value p = paths[kind][i] ? object_arg(ds, paths[kind][i]) : (Value){.kind = V_NONE};
        f_str(e, f, p.kind == V_STR ? p.str : NULL);
    }
    Value scale = object_arg(ds, "scale");
    f_f64(e, f, scale.kind == V_NUM ? scale.num : 1);
    Value part = object_arg(ds, "part");
    f_i64(e, f, part.kind == V_WORD && strcmp(part.str, "test") == 0);
    Value header = object_arg(ds, "header");
    f_i64(e, f, header.kind == V_BOOL ? (int64_t)header.num : 0);
    Value features = object_arg(ds, "features");
    if (features.kind == V_LIST) {
        Fields names = {0};
        for (int i = 0; i < features.len; i++)
            f_str(e, &names, features.items[i].str);
        f_ptr(e, f, global_of(e, &names, NULL));
        f_i64(e, f, features.len);
    } else {
        f_ptr(e, f, NULL);
        f_i64(e, f, 0);
    }
    Value target = object_arg(ds, "target");
    f_str(e, f, target.kind == V_STR ? target.str : NULL);
    Value classes = object_arg(ds, "classes"), samples = object_arg(ds, "samples");
    f_i64(e, f, classes.kind == V_NUM ? (int64_t)classes.num : 0);
    f_i64(e, f, samples.kind == V_NUM ? (int64_t)samples.num : 0);
}

static int word_index(Value v, const char *const *words) {
    for (int i = 0; words[i]; i++)
        if (v.kind == V_WORD && strcmp(v.str, words[i]) == 0)
            return i;
    return 0;
}

static void f_settings(Emit *e, Fields *f, Ir *ir) {
    TrainSpec *spec = ir->spec;
    static const char *const clusters[] = {"auto", "slurm", "env", "local", NULL};
    static const char *const comms[] = {"auto", "nccl", "ring", NULL};
    static const char *const precisions[] = {"fp32", "bf16", "fp16", NULL};
    Value cluster = spec_setting(spec, "cluster");
    f_i64(e, f, cluster.kind == V_OBJECT ? DDP_CLUSTER_SLURM : word_index(cluster, clusters));
    Value base = object_arg(cluster, "port_base"), range = object_arg(cluster, "port_range");
    f_i64(e, f, base.kind == V_NUM ? (int64_t)base.num : -1);
    f_i64(e, f, range.kind == V_LIST ? (int64_t)range.items[0].num : 10000);
    f_i64(e, f, range.kind == V_LIST ? (int64_t)range.items[1].num : 20000);
    f_i64(e, f, word_index(spec_setting(spec, "communication"), comms));
    const char *ints[] = {"batch_per_replica", "gpus_per_worker", "seed"};
    for (int i = 0; i < 3; i++)
        f_i64(e, f, (int64_t)spec_setting(spec, ints[i]).num);
    f_i64(e, f, (int64_t)spec_setting(spec, "shuffle").num);
    f_i64(e, f, (int64_t)spec_setting(spec, "drop_remainder").num);
    f_i64(e, f, word_index(spec_setting(spec, "precision"), precisions));
    f_i64(e, f, (int64_t)spec_setting(spec, "epochs").num);
    Value steps = spec_setting(spec, "steps_per_epoch");
    f_i64(e, f, steps.kind == V_NUM ? (int64_t)steps.num : -1);
    f_duration(e, f, spec_setting(spec, "validate_every"));
    Value ck = spec_setting(spec, "checkpoint");
    Value dir = object_arg(ck, "dir");
    f_str(e, f, dir.kind == V_STR ? dir.str : NULL);
    f_duration(e, f, object_arg(ck, "every"));
    Value keep = object_arg(ck, "keep");
    f_i64(e, f, keep.kind == V_NUM ? (int64_t)keep.num : 0);
    f_dataset(e, f, spec->dataset);
    f_dataset(e, f, spec_setting(spec, "validation"));
    static const char *const losses[] = {"sparse_categorical_crossentropy", "categorical_crossentropy",
                                         "binary_crossentropy", "mean_squared_error"};
    Value loss = spec_setting(spec, "loss");
    int lk = 0;
    for (int i = 0; i < 4; i++)
        if (strcmp(loss.builtin->name, losses[i]) == 0)
            lk = i;
    f_i64(e, f, lk);
    f_i64(e, f, object_arg(loss, "from_logits").kind == V_BOOL ? (int64_t)object_arg(loss, "from_logits").num : 0);
    f_f64(e, f, object_arg(loss, "label_smoothing").kind == V_NUM ? object_arg(loss, "label_smoothing").num : 0);
    /* metrics: the loss's own pair first */
    Fields metrics = {0};
    Value ms = spec_setting(spec, "metrics");
    static const char *const mkinds[] = {"loss", "accuracy", "top_k_accuracy", "mae"};
    for (int i = 0; i < ms.len; i++) {
        const char *name = ms.items[i].builtin->name;
        int kind = 0;
        for (int k = 0; k < 4; k++)
            if (strcmp(name, mkinds[k]) == 0)
                kind = k;
        f_str(e, &metrics, name);
        f_i64(e, &metrics, kind);
        f_i64(e, &metrics, kind == DDP_METRIC_LOSS ? 0 : 1 + i);
    }
    f_ptr(e, f, metrics.len ? global_of(e, &metrics, NULL) : NULL);
    f_i64(e, f, ms.len);
    /* the optimizer, carrying the learning rate in effect */
    Value opt = spec_setting(spec, "optimizer");
    static const char *const opts[] = {"sgd", "adam", "adamw"};
    int ok = 0;
    for (int i = 0; i < 3; i++)
        if (strcmp(opt.builtin->name, opts[i]) == 0)
            ok = i;
    f_i64(e, f, ok);
    f_schedule(e, f, object_arg(opt, "learning_rate"));
    f_rt(e, f, object_arg(opt, "weight_decay"));
    f_f64(e, f, object_arg(opt, "momentum").kind == V_NUM ? object_arg(opt, "momentum").num : 0);
    f_f64(e, f, object_arg(opt, "beta1").kind == V_NUM ? object_arg(opt, "beta1").num : 0);
    f_f64(e, f, object_arg(opt, "beta2").kind == V_NUM ? object_arg(opt, "beta2").num : 0);
    f_f64(e, f, object_arg(opt, "epsilon").kind == V_NUM ? object_arg(opt, "epsilon").num : 0);
    f_i64(e, f, object_arg(opt, "nesterov").kind == V_BOOL ? (int64_t)object_arg(opt, "nesterov").num : 0);
    f_i64(e, f, ir->state_vectors);
}

/* ----------------------------------------------------------------- program */

static int64_t abi_dtype(DType dt) {
    static const int64_t map[] = {[DT_F32] = DDP_F32, [DT_F64] = DDP_F64, [DT_I32] = DDP_I32, [DT_I64] = DDP_I64};
    return map[dt];
}

static int64_t abi_init(const char *init) {
    static const char *const names[] = {"zeros", "ones", "glorot_uniform", "glorot_normal", "he_normal", "he_uniform"};
    for (int i = 0; i < 6; i++)
        if (init && strcmp(init, names[i]) == 0)
            return i;
    return DDP_INIT_ZEROS;
}

static void f_dim(Emit *e, Fields *f, IrDim d) {
    f_i64(e, f, d.fixed);
    f_i64(e, f, d.per_sample);
}

static LLVMValueRef params_table(Emit *e, Ir *ir) {
    Fields f = {0};
    TensorList *lists[2] = {&ir->params, &ir->stats};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < lists[l]->len; i++) {
            Tensor *p = lists[l]->items[i];
            f_str(e, &f, p->name);
            f_i64(e, &f, l == 0 ? DDP_REGION_PARAMS : DDP_REGION_STATS);
            f_i64(e, &f, p->flat);
            f_i64(e, &f, p->elems);
            f_i64(e, &f, p->shape.rank);
            for (int d = 0; d < 4; d++)
                f_i64(e, &f, d < p->shape.rank ? p->shape.dim[d] : 0);
            f_str(e, &f, p->layout);
            f_i64(e, &f, abi_init(p->init));
            f_i64(e, &f, p->fan_in);
            f_i64(e, &f, p->fan_out);
        }
    return f.len ? global_of(e, &f, NULL) : NULL;
}

static LLVMValueRef buffers_table(Emit *e, Ir *ir) {
    Fields f = {0};
    for (int i = 0; i < ir->slots.len; i++) {
        Tensor *t = ir->slots.items[i];
        f_str(e, &f, t->name);
        f_i64(e, &f, t->region);
        f_i64(e, &f, t->offset);
        f_i64(e, &f, t->elems * dtype_size(t->dtype));
        f_i64(e, &f, abi_dtype(t->dtype));
        bool planned = t->region == DDP_REGION_ARENA || t->region == DDP_REGION_WORKSPACE;
        f_i64(e, &f, planned ? t->uses_mask : 0);
        f_i64(e, &f, planned ? t->first_use : 0);
        f_i64(e, &f, planned ? t->last_use : 0);
    }
    return global_of(e, &f, NULL);
}

static LLVMValueRef kernels_table(Emit *e, Ir *ir) {
    Fields f = {0};
    for (int k = 0; k < ir->kernel_ops.len; k++) {
        IrOp *op = ir->kernel_ops.items[k];
        f_str(e, &f, kernel_name(e->cg->c, op, k));
        f_i64(e, &f, op->kind == OP_ACCUMULATE ? DDP_KERNEL_SERIAL : 0);
    }
    return f.len ? global_of(e, &f, NULL) : NULL;
}

/* The kernels of one variant, in index order; the wide ones are defined in another
 * object and declared here. */
static LLVMValueRef functions_table(Emit *e, Ir *ir, bool wide) {
    Cg *cg = e->cg;
    Fields f = {0};
    for (int k = 0; k < ir->kernel_ops.len; k++) {
        const char *name = kernel_name(cg->c, ir->kernel_ops.items[k], k);
        if (wide)
            name = arena_printf(cg->c->arena, "%s_wide", name);
        LLVMValueRef fn = LLVMGetNamedFunction(cg->mod, name);
        if (!fn)
            fn = LLVMAddFunction(cg->mod, name, cg->kernel_type);
        f_ptr(e, &f, fn);
    }
    return f.len ? global_of(e, &f, NULL) : NULL;
}

static LLVMValueRef gemms_table(Emit *e, Ir *ir, int *count) {
    Fields f = {0};
    for (int ph = 0; ph < PH_COUNT; ph++)
        for (int i = 0; i < ir->ops[ph].len; i++) {
            IrOp *op = ir->ops[ph].items[i];
            if (op->kind != OP_GEMM)
                continue;
            op->kernel_index = (*count)++;
            f_i64(e, &f, (op->in[0]->base ? op->in[0]->base : op->in[0])->slot);
            f_i64(e, &f, (op->in[1]->base ? op->in[1]->base : op->in[1])->slot);
            f_i64(e, &f, (op->out[0]->base ? op->out[0]->base : op->out[0])->slot);
            f_i64(e, &f, op->ta);
            f_i64(e, &f, op->tb);
            f_dim(e, &f, op->m);
            f_dim(e, &f, op->n);
            f_dim(e, &f, op->k);
            f_f64(e, &f, op->accumulate ? 1 : 0);
        }
    return *count ? global_of(e, &f, NULL) : NULL;
}

/* A step: kind, index, the index range and the buffers of a kernel launch. */
static void f_step(Emit *e, Fields *f, int64_t kind, int64_t index, IrDim range, LLVMValueRef args,
                   int64_t nargs) {
    f_i64(e, f, kind);
    f_i64(e, f, index);
    f_dim(e, f, range);
    f_ptr(e, f, args);
    f_i64(e, f, nargs);
}

static void phase_steps(Emit *e, Fields *out, Ir *ir, Phase ph) {
    Fields f = {0};
    int count = 0;
    IrDim none = {0, 0};
    for (int i = 0; i < ir->ops[ph].len; i++) {
        IrOp *op = ir->ops[ph].items[i];
        switch (op->kind) {
        case OP_GEMM: f_step(e, &f, DDP_STEP_GEMM, op->kernel_index, none, NULL, 0); break;
        case OP_BUCKET_READY: f_step(e, &f, DDP_STEP_BUCKET_READY, op->bucket, none, NULL, 0); break;
        case OP_WAIT_BUCKETS: f_step(e, &f, DDP_STEP_WAIT_BUCKETS, 0, none, NULL, 0); break;
        case OP_METRICS_READY: f_step(e, &f, DDP_STEP_METRICS_READY, 0, none, NULL, 0); break;
        default: {
            if (op->kernel_index < 0)
                continue;
            Tensor *args[256];
            int n = op_arguments(ir, op, args, 256);
            Fields slots = {0};
            for (int k = 0; k < n; k++)
                f_i64(e, &slots, args[k]->slot);
            f_step(e, &f, DDP_STEP_KERNEL, op->kernel_index, op->range, global_of(e, &slots, NULL), n);
        }
        }
        count++;
    }
    f_ptr(e, out, count ? global_of(e, &f, NULL) : NULL);
    f_i64(e, out, count);
}

void cg_program(Cg *cg, const char *source, const char *ptx, uint64_t hash, int nkernels) {
    Emit em = {cg, 0};
    Emit *e = &em;
    Ir *ir = cg->ir;
    Fields f = {0};
    f_i64(e, &f, DDP_ABI_VERSION);
    f_i64(e, &f, (int64_t)hash);
    f_str(e, &f, ir->graph->model);
    f_str(e, &f, source);
    f_i64(e, &f, abi_dtype(ir->dtype));
    f_i64(e, &f, ir->graph->input.rank);
    for (int i = 0; i < 8; i++)
        f_i64(e, &f, i < ir->graph->input.rank ? ir->graph->input.dim[i] : 0);
    f_i64(e, &f, ir->output->per_sample);
    f_i64(e, &f, abi_dtype(ir->label->dtype));
    f_i64(e, &f, ir->param_count);
    f_i64(e, &f, ir->stats_count);
    int64_t elem = dtype_size(ir->dtype);
    int64_t regions[DDP_REGION_COUNT] = {
        [DDP_REGION_PARAMS] = ir->param_count * elem, [DDP_REGION_GRADS] = ir->param_count * elem,
        [DDP_REGION_STATE] = ir->state_vectors * ir->param_count * elem,
        [DDP_REGION_STATS] = ir->stats_count * elem, [DDP_REGION_ARENA] = ir->arena_bytes,
        [DDP_REGION_WORKSPACE] = ir->workspace_bytes, [DDP_REGION_INPUT] = ir->input_bytes,
        [DDP_REGION_ACCUM] = ir->accum_bytes,
    };
    for (int i = 0; i < DDP_REGION_COUNT; i++)
        f_i64(e, &f, regions[i]);
    f_ptr(e, &f, params_table(e, ir));
    f_i64(e, &f, ir->params.len + ir->stats.len);
    f_ptr(e, &f, buffers_table(e, ir));
    f_i64(e, &f, ir->slots.len);
    f_i64(e, &f, ir->input->slot);
    f_i64(e, &f, ir->label->slot);
    f_i64(e, &f, ir->sample_id->slot);
    f_i64(e, &f, ir->accum->slot);
    f_ptr(e, &f, kernels_table(e, ir));
    f_i64(e, &f, nkernels);
    f_ptr(e, &f, functions_table(e, ir, false));
    f_ptr(e, &f, functions_table(e, ir, true));
    int ngemms = 0;
    f_ptr(e, &f, gemms_table(e, ir, &ngemms));
    f_i64(e, &f, ngemms);
    for (int ph = 0; ph < PH_COUNT; ph++)
        phase_steps(e, &f, ir, (Phase)ph);
    Fields buckets = {0};
    for (int i = 0; i < ir->buckets.len; i++) {
        f_i64(e, &buckets, ir->buckets.items[i].begin);
        f_i64(e, &buckets, ir->buckets.items[i].end);
    }
    f_ptr(e, &f, buckets.len ? global_of(e, &buckets, NULL) : NULL);
    f_i64(e, &f, ir->buckets.len);
    f_i64(e, &f, ir->accum->elems / 2);
    f_str(e, &f, ptx);
    f_settings(e, &f, ir);
    global_of(e, &f, "ddp_program_desc");
}

/* ------------------------------------------------------------------- hash */

uint64_t program_hash(Ddpc *c, Ir *ir) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ir_print(c, f, ir);
    plan_print(c, f, ir);
    settings_print(c, f);
    fclose(f);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)text[i]) * 1099511628211ull;
    free(text);
    return h;
}
