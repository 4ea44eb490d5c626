/* program.c: ddp_program_desc, the description of the built program the runtime
 * walks (runtime/ddp_abi.h), emitted as LLVM constants.
 *
 * The program is first made here as a C instance of ddp_program: its tables from the
 * IR, its settings the checked configuration (c->config). The instance is then emitted
 * field by field as the contract's lists say (contract.h): every field is 8 bytes, so
 * a structure, an array of them and a nest of them are one flat sequence of i64,
 * double and pointer fields with no padding, each emitted as an anonymous LLVM struct
 * of exactly those fields; what a pointer points at becomes a private constant. */
#include <stdlib.h>
#include <string.h>

#include "cg.h"
#include "contract.h"
#include "../runtime/fnv.h"
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

/* ---------------------------------------------------------------- emitting */

/* The kernels of one variant (0 the baseline, 1 the wide, 2 the GPU's for the emulated
 * device), in index order; all but the baseline are defined in other objects and
 * declared here. */
static LLVMValueRef functions_table(Emit *e, int variant) {
    static const char *const suffix[] = {"", "_wide", "_gpu"};
    Cg *cg = e->cg;
    Ir *ir = cg->ir;
    Fields f = {0};
    for (int k = 0; k < ir->kernel_ops.len; k++) {
        const char *name = arena_printf(cg->c->arena, "%s%s", kernel_name(cg->c, ir->kernel_ops.items[k], k),
                                        suffix[variant]);
        LLVMValueRef fn = LLVMGetNamedFunction(cg->mod, name);
        if (!fn)
            fn = LLVMAddFunction(cg->mod, name, cg->kernel_type);
        f_ptr(e, &f, fn);
    }
    return f.len ? global_of(e, &f, NULL) : NULL;
}

static void f_struct(Emit *e, Fields *f, const ContractType *t, const char *obj);

/* What a pointer field points at (count elements), as a private constant. */
static LLVMValueRef pointed_at(Emit *e, const ContractField *fd, const char *obj) {
    const char *items = *(const char *const *)(obj + fd->offset);
    int64_t count = *(const int64_t *)(obj + fd->count_offset);
    if (!items || count <= 0)
        return NULL;
    Fields f = {0};
    for (int64_t i = 0; i < count; i++) {
        if (fd->kind == FIELD_REFS)
            f_struct(e, &f, fd->type, items + (size_t)i * fd->type->size);
        else if (fd->kind == FIELD_I64REFS)
            f_i64(e, &f, ((const int64_t *)items)[i]);
        else
            f_str(e, &f, ((const char *const *)items)[i]);
    }
    return global_of(e, &f, NULL);
}

/* The fields of the structure at obj, in the contract's order, onto f. */
static void f_struct(Emit *e, Fields *f, const ContractType *t, const char *obj) {
    for (int i = 0; i < t->nfields; i++) {
        const ContractField *fd = &t->fields[i];
        const char *at = obj + fd->offset;
        switch (fd->kind) {
        case FIELD_I64:
        case FIELD_U64: f_i64(e, f, *(const int64_t *)at); break;
        case FIELD_F64: f_f64(e, f, *(const double *)at); break;
        case FIELD_STR: f_str(e, f, *(const char *const *)at); break;
        case FIELD_I64S:
            for (int k = 0; k < fd->n; k++)
                f_i64(e, f, ((const int64_t *)at)[k]);
            break;
        case FIELD_STRS:
            for (int k = 0; k < fd->n; k++)
                f_str(e, f, ((const char *const *)at)[k]);
            break;
        case FIELD_SUB: f_struct(e, f, fd->type, at); break;
        case FIELD_SUBS:
            for (int k = 0; k < fd->n; k++)
                f_struct(e, f, fd->type, at + (size_t)k * fd->type->size);
            break;
        case FIELD_REFS:
        case FIELD_I64REFS:
        case FIELD_STRREFS: f_ptr(e, f, pointed_at(e, fd, obj)); break;
        case FIELD_FNS: f_ptr(e, f, functions_table(e, fd->n)); break;
        }
    }
}

/* ----------------------------------------------------------------- the tables */

static int64_t abi_dtype(DType dt) {
    static const int64_t map[] = {[DT_F32] = DDP_F32, [DT_F64] = DDP_F64, [DT_I32] = DDP_I32, [DT_I64] = DDP_I64,
                                         [DT_BF16] = DDP_BF16, [DT_U8] = DDP_U8};
    return map[dt];
}

static ddp_dim abi_dim(IrDim d) {
    return (ddp_dim){.fixed = d.fixed, .per_sample = d.per_sample};
}

#define NEW_ARRAY(c, type, n) ((type *)arena_alloc((c)->arena, sizeof(type) * (size_t)((n) > 0 ? (n) : 1)))

static const ddp_param *params_table(Ddpc *c, Ir *ir) {
    ddp_param *out = NEW_ARRAY(c, ddp_param, ir->params.len + ir->stats.len), *p = out;
    TensorList *lists[2] = {&ir->params, &ir->stats};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < lists[l]->len; i++, p++) {
            Tensor *t = lists[l]->items[i];
            *p = (ddp_param){.name = t->name, .region = l == 0 ? DDP_REGION_PARAMS : DDP_REGION_STATS,
                             .offset = t->flat, .count = t->elems, .rank = t->shape.rank, .layout = t->layout,
                             .init = t->init, .fan_in = t->fan_in, .fan_out = t->fan_out,
                             .decay = decay_group(t)};
            for (int d = 0; d < 4 && d < t->shape.rank; d++)
                p->shape[d] = t->shape.dim[d];
        }
    return out;
}

static const ddp_buffer *buffers_table(Ddpc *c, Ir *ir) {
    ddp_buffer *out = NEW_ARRAY(c, ddp_buffer, ir->slots.len);
    for (int i = 0; i < ir->slots.len; i++) {
        Tensor *t = ir->slots.items[i];
        bool planned = t->region == DDP_REGION_ARENA || t->region == DDP_REGION_WORKSPACE;
        out[i] = (ddp_buffer){.name = t->name, .region = t->region, .offset = t->offset,
                              .bytes = t->elems * dtype_size(t->dtype), .dtype = abi_dtype(t->dtype),
                              .sequence = planned ? t->uses_mask : 0, .first_step = planned ? t->first_use : 0,
                              .last_step = planned ? t->last_use : 0};
    }
    return out;
}

/* Kernels of one index on the CPU: the sums into the accumulators, the flag and the
 * gradients' scale. */
static bool serial(const IrOp *op) {
    return op->kind == OP_ACCUMULATE || op->kind == OP_NONFINITE_FLAG || op->kind == OP_CLIP_FACTOR;
}

static const ddp_kernel *kernels_table(Ddpc *c, Ir *ir) {
    ddp_kernel *out = NEW_ARRAY(c, ddp_kernel, ir->kernel_ops.len);
    for (int k = 0; k < ir->kernel_ops.len; k++) {
        IrOp *op = ir->kernel_ops.items[k];
        GpuLaunch g = kernel_launch(op);
        out[k] = (ddp_kernel){.name = kernel_name(c, op, k), .flags = serial(op) ? DDP_KERNEL_SERIAL : 0,
                              .launch = g.kind, .threads = g.threads, .shared_bytes = g.shared_bytes,
                              .per_thread = g.per_thread, .period = g.period};
    }
    return out;
}

/* The ops of a kind over every phase, in order, each numbered by its place there
 * (kernel_index: the steps name GEMMs and convolutions by these numbers). */
static int64_t ops_of_kind(Ddpc *c, Ir *ir, OpKind kind, IrOp ***out) {
    int n = 0;
    for (int ph = 0; ph < PH_COUNT; ph++)
        for (int i = 0; i < ir->ops[ph].len; i++)
            n += ir->ops[ph].items[i]->kind == kind;
    *out = NEW_ARRAY(c, IrOp *, n);
    n = 0;
    for (int ph = 0; ph < PH_COUNT; ph++)
        for (int i = 0; i < ir->ops[ph].len; i++)
            if (ir->ops[ph].items[i]->kind == kind) {
                ir->ops[ph].items[i]->kernel_index = n;
                (*out)[n++] = ir->ops[ph].items[i];
            }
    return n;
}

/* Every GEMM of every phase, numbered in that order (the steps name them by number). */
static const ddp_gemm *gemms_table(Ddpc *c, Ir *ir, int64_t *count) {
    IrOp **ops = NULL;
    *count = ops_of_kind(c, ir, OP_GEMM, &ops);
    ddp_gemm *out = NEW_ARRAY(c, ddp_gemm, *count);
    for (int64_t i = 0; i < *count; i++) {
        const IrOp *op = ops[i];
        out[i] = (ddp_gemm){.a = tensor_storage(op->in[0])->slot, .b = tensor_storage(op->in[1])->slot,
                            .c = tensor_storage(op->out[0])->slot, .transpose_a = op->ta, .transpose_b = op->tb,
                            .m = abi_dim(op->m), .n = abi_dim(op->n), .k = abi_dim(op->k),
                            .alpha = op->alpha, .beta = op->accumulate ? 1 : 0, .batches = abi_dim(op->batches),
                            .groups = op->groups};
        if (op->in[0]->one_hot_of)
            out[i].one_hot = 1 + tensor_storage(op->in[0]->one_hot_of)->slot;
        for (int o = 0; o < 3; o++) {
            out[i].ld[o] = op->ld[o];
            out[i].batch_stride[o] = op->batch_stride[o];
            out[i].group_stride[o] = op->group_stride[o];
        }
    }
    return out;
}

/* A step's layer as its parameters name it: "block1.conv1"; "" for none. */
static const char *layer_name(Ddpc *c, const GNode *n) {
    if (!n || !n->name)
        return "";
    char *s = arena_printf(c->arena, "%s", n->name);
    for (char *p = s; *p; p++)
        if (*p == '/')
            *p = '.';
    return s;
}

/* Every library convolution of every phase, numbered in that order. */
static const ddp_conv *convs_table(Ddpc *c, Ir *ir, int64_t *count) {
    IrOp **ops = NULL;
    *count = ops_of_kind(c, ir, OP_CONV, &ops);
    ddp_conv *out = NEW_ARRAY(c, ddp_conv, *count);
    for (int64_t i = 0; i < *count; i++) {
        const IrOp *op = ops[i];
        /* the image is x (forward, backward filter) or x's gradient; the output y or dy */
        Tensor *image = op->code == DDP_CONV_BACKWARD_DATA ? op->out[0] : op->in[0];
        Tensor *filters = op->code == DDP_CONV_BACKWARD_FILTER ? op->out[0] : op->in[1];
        Tensor *output = op->code == DDP_CONV_FORWARD ? op->out[0] : op->code == DDP_CONV_BACKWARD_DATA
                                                                         ? op->in[0] : op->in[1];
        out[i] = (ddp_conv){
            .mode = op->code, .x = tensor_storage(image)->slot, .filters = tensor_storage(filters)->slot,
            .y = tensor_storage(output)->slot, .workspace = tensor_storage(op->out[1])->slot,
            .n = {0, 1}, .image = {image->shape.dim[0], image->shape.dim[1], image->shape.dim[2]},
            .filter = {filters->shape.dim[0], filters->shape.dim[1], filters->shape.dim[2]},
            .output = {output->shape.dim[0], output->shape.dim[1]}, .stride = {op->stride[0], op->stride[1]},
            .dilation = {op->dilation[0], op->dilation[1]}, .pad_before = {op->pad[0], op->pad[2]},
            .pad_after = {op->pad[1], op->pad[3]}, .beta = op->accumulate ? 1 : 0};
    }
    return out;
}

static ddp_phase phase_steps(Ddpc *c, Ir *ir, Phase ph) {
    ddp_step *steps = NEW_ARRAY(c, ddp_step, ir->ops[ph].len);
    int count = 0;
    for (int i = 0; i < ir->ops[ph].len; i++) {
        IrOp *op = ir->ops[ph].items[i];
        ddp_step *s = &steps[count];
        switch (op->kind) {
        case OP_GEMM: *s = (ddp_step){.kind = DDP_STEP_GEMM, .index = op->kernel_index}; break;
        case OP_CONV: *s = (ddp_step){.kind = DDP_STEP_CONV, .index = op->kernel_index}; break;
        case OP_BUCKET_READY: *s = (ddp_step){.kind = DDP_STEP_BUCKET_READY, .index = op->bucket}; break;
        case OP_WAIT_BUCKETS: *s = (ddp_step){.kind = DDP_STEP_WAIT_BUCKETS}; break;
        case OP_METRICS_READY: *s = (ddp_step){.kind = DDP_STEP_METRICS_READY}; break;
        default: {
            if (op->kernel_index < 0)
                continue;
            Tensor *args[256];
            int n = op_arguments(ir, op, args, 256);
            int64_t *slots = NEW_ARRAY(c, int64_t, n);
            for (int k = 0; k < n; k++)
                slots[k] = args[k]->slot;
            *s = (ddp_step){.kind = DDP_STEP_KERNEL, .index = op->kernel_index, .range = abi_dim(op->range),
                            .args = slots, .nargs = n};
        }
        }
        s->layer = layer_name(c, op->layer);
        s->path = op->path;
        count++;
    }
    return (ddp_phase){.steps = steps, .count = count};
}

/* The token indices the model's inputs may hold: the smallest vocab of the embeddings
 * (which read nothing but the input), 0 where none does. */
static int64_t input_vocab(const Graph *g) {
    int64_t vocab = 0;
    for (int i = 0; i < g->nodes.len; i++) {
        const GNode *n = g->nodes.items[i];
        if (n->op == L_EMBEDDING && (!vocab || n->attrs.vocab < vocab))
            vocab = n->attrs.vocab;
    }
    return vocab;
}

/* The built program as a C instance of the contract's ddp_program. */
static ddp_program program_instance(Ddpc *c, Ir *ir, const char *source, const char *ptx, uint64_t hash,
                                    uint64_t gpu_hash) {
    ddp_program p = {.abi_version = DDP_ABI_VERSION, .hash = hash, .name = ir->graph->model, .source = source,
                     .dtype = abi_dtype(ir->dtype), .input_rank = ir->graph->input.rank,
                     .output_elems = ir->output->per_sample, .label_dtype = abi_dtype(ir->label->dtype),
                     .label_positions = ir->loss_rows,
                     .input_vocab = input_vocab(ir->graph),
                     .param_count = ir->param_count, .stats_count = ir->stats_count, .ptx = ptx, .gpu_hash = gpu_hash,
                     .settings = *c->config};
    for (int i = 0; i < ir->graph->input.rank && i < 8; i++)
        p.input_shape[i] = ir->graph->input.dim[i];
    const Shape *out = &ir->graph->output->out;
    p.output_rank = out->rank;
    for (int i = 0; i < out->rank && i < 8; i++)
        p.output_shape[i] = out->dim[i];
    int64_t elem = dtype_size(ir->dtype);
    int64_t regions[DDP_REGION_COUNT] = {
        [DDP_REGION_PARAMS] = ir->param_count * elem, [DDP_REGION_GRADS] = ir->grads_bytes,
        [DDP_REGION_STATE] = c->config->optimizer.state_vectors * ir->param_count * elem,
        [DDP_REGION_STATS] = ir->stats_count * elem, [DDP_REGION_ARENA] = ir->arena_bytes,
        [DDP_REGION_WORKSPACE] = ir->workspace_bytes, [DDP_REGION_INPUT] = ir->input_bytes,
        [DDP_REGION_ACCUM] = ir->accum_bytes, [DDP_REGION_CONSTANTS] = constant_bytes(ir),
    };
    memcpy(p.region_bytes, regions, sizeof regions);
    p.params = params_table(c, ir);
    p.nparams = ir->params.len + ir->stats.len;
    p.buffers = buffers_table(c, ir);
    p.nbuffers = ir->slots.len;
    p.input_slot = ir->input->slot;
    p.label_slot = ir->label->slot;
    p.sample_id_slot = ir->sample_id->slot;
    p.accum_slot = ir->accum->slot;
    p.eval_output_slot = ir->eval_output->slot;
    p.kernels = kernels_table(c, ir);
    p.nkernels = ir->kernel_ops.len;
    p.gemms = gemms_table(c, ir, &p.ngemms);
    p.convs = convs_table(c, ir, &p.nconvs);
    for (int ph = 0; ph < PH_COUNT; ph++)
        p.phases[ph] = phase_steps(c, ir, (Phase)ph);
    ddp_bucket *buckets = NEW_ARRAY(c, ddp_bucket, ir->buckets.len);
    for (int i = 0; i < ir->buckets.len; i++)
        buckets[i] = (ddp_bucket){.begin = ir->buckets.items[i].begin, .end = ir->buckets.items[i].end};
    p.buckets = buckets;
    p.nbuckets = ir->buckets.len;
    p.accum_pairs = ir->accum->elems / 2;
    p.nonfinite_slot = ir->nonfinite->slot;
    return p;
}

void cg_program(Cg *cg, const char *source, const char *ptx, uint64_t hash, uint64_t gpu_hash) {
    Emit e = {cg, 0};
    ddp_program p = program_instance(cg->c, cg->ir, source, ptx, hash, gpu_hash);
    Fields f = {0};
    f_struct(&e, &f, &contract_ddp_program, (const char *)&p);
    global_of(&e, &f, "ddp_program_desc");
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
    uint64_t h = ddp_fnv1a(text, len, DDP_FNV_START);
    free(text);
    return h;
}
