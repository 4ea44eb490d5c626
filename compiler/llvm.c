/* llvm.c: LLVM modules, target machines, and the small builder the kernel generators
 * are written with: loops, conditionals, typed loads and stores through the buffer
 * table, run-time scalars.
 *
 * A kernel's function has two blocks up front: `entry`, which gathers the allocas and
 * the buffer pointers a kernel loads from the table (so they are loaded once, outside
 * every loop), and `start`, where the work begins. The entry block is closed with a
 * branch to start when the kernel ends. */
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "cg.h"
#include "../runtime/ddp_abi.h"

static const struct {
    const char *triple, *cpu, *features;
} targets[TARGET_COUNT] = {
    [TARGET_CPU_BASE] = {"x86_64-pc-linux-gnu", "x86-64", ""},
    [TARGET_CPU_WIDE] = {"x86_64-pc-linux-gnu", "x86-64-v3", "+avx2,+fma"},
    [TARGET_GPU] = {"nvptx64-nvidia-cuda", "sm_80", "+ptx75"},
};

static void init_llvm_targets(void) {
    static bool done;
    if (done)
        return;
    done = true;
    LLVMInitializeX86TargetInfo();
    LLVMInitializeX86Target();
    LLVMInitializeX86TargetMC();
    LLVMInitializeX86AsmPrinter();
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
}

bool cg_init(Cg *cg, Ddpc *c, Ir *ir, Target target, int opt_level, const char **error) {
    memset(cg, 0, sizeof *cg);
    init_llvm_targets();
    cg->c = c;
    cg->ir = ir;
    cg->target = target;
    cg->ctx = LLVMContextCreate();
    cg->mod = LLVMModuleCreateWithNameInContext(ir->graph->model, cg->ctx);
    cg->b = LLVMCreateBuilderInContext(cg->ctx);
    LLVMTargetRef t;
    char *msg = NULL;
    if (LLVMGetTargetFromTriple(targets[target].triple, &t, &msg)) {
        *error = arena_printf(c->arena, "LLVM has no target %s: %s", targets[target].triple, msg);
        LLVMDisposeMessage(msg);
        return false;
    }
    LLVMCodeGenOptLevel level = opt_level <= 0 ? LLVMCodeGenLevelNone
                                : opt_level == 1 ? LLVMCodeGenLevelLess
                                : opt_level == 2 ? LLVMCodeGenLevelDefault : LLVMCodeGenLevelAggressive;
    cg->tm = LLVMCreateTargetMachine(t, targets[target].triple, targets[target].cpu,
                                     targets[target].features, level,
                                     target == TARGET_GPU ? LLVMRelocDefault : LLVMRelocPIC,
                                     LLVMCodeModelDefault);
    LLVMSetTarget(cg->mod, targets[target].triple);
    LLVMTargetDataRef layout = LLVMCreateTargetDataLayout(cg->tm);
    char *rep = LLVMCopyStringRepOfTargetData(layout);
    LLVMSetDataLayout(cg->mod, rep);
    LLVMDisposeMessage(rep);
    LLVMDisposeTargetData(layout);

    cg->void_t = LLVMVoidTypeInContext(cg->ctx);
    cg->i1 = LLVMInt1TypeInContext(cg->ctx);
    cg->i8 = LLVMInt8TypeInContext(cg->ctx);
    cg->i32 = LLVMInt32TypeInContext(cg->ctx);
    cg->i64 = LLVMInt64TypeInContext(cg->ctx);
    cg->f32 = LLVMFloatTypeInContext(cg->ctx);
    cg->f64 = LLVMDoubleTypeInContext(cg->ctx);
    cg->real = ir->dtype == DT_F64 ? cg->f64 : cg->f32;
    cg->ptr = LLVMPointerType(cg->i8, 0);
    LLVMTypeRef params[] = {LLVMPointerType(cg->ptr, 0), LLVMPointerType(cg->i64, 0), cg->i64,
                            cg->i64};
    cg->kernel_type = LLVMFunctionType(cg->void_t, params, 4, 0);
    if (target == TARGET_GPU) {
        /* denormals kept, as on the CPU; NVVMReflect reads this */
        LLVMAddModuleFlag(cg->mod, LLVMModuleFlagBehaviorOverride, "nvvm-reflect-ftz", 16,
                          LLVMValueAsMetadata(LLVMConstInt(cg->i32, 0, 0)));
    }
    return true;
}

void cg_dispose(Cg *cg) {
    if (cg->b)
        LLVMDisposeBuilder(cg->b);
    if (cg->tm)
        LLVMDisposeTargetMachine(cg->tm);
    if (cg->mod)
        LLVMDisposeModule(cg->mod);
    if (cg->ctx)
        LLVMContextDispose(cg->ctx);
    memset(cg, 0, sizeof *cg);
}

char *cg_module_text(Cg *cg) {
    char *s = LLVMPrintModuleToString(cg->mod);
    char *copy = arena_strdup(cg->c->arena, s);
    LLVMDisposeMessage(s);
    return copy;
}

bool cg_emit(Cg *cg, int opt_level, char **out, size_t *len, const char **error) {
    char *msg = NULL;
    if (LLVMVerifyModule(cg->mod, LLVMReturnStatusAction, &msg)) {
        *error = arena_printf(cg->c->arena, "generated code failed verification: %s", msg);
        LLVMDisposeMessage(msg);
        return false;
    }
    LLVMDisposeMessage(msg);
    if (opt_level > 0) {
        LLVMPassBuilderOptionsRef options = LLVMCreatePassBuilderOptions();
        const char *pipeline = opt_level == 1 ? "default<O1>" : opt_level == 2 ? "default<O2>" : "default<O3>";
        LLVMErrorRef err = LLVMRunPasses(cg->mod, pipeline, cg->tm, options);
        LLVMDisposePassBuilderOptions(options);
        if (err) {
            char *m = LLVMGetErrorMessage(err);
            *error = arena_printf(cg->c->arena, "optimising the generated code failed: %s", m);
            LLVMDisposeErrorMessage(m);
            return false;
        }
    }
    LLVMMemoryBufferRef buf;
    LLVMCodeGenFileType type = cg->target == TARGET_GPU ? LLVMAssemblyFile : LLVMObjectFile;
    if (LLVMTargetMachineEmitToMemoryBuffer(cg->tm, cg->mod, type, &msg, &buf)) {
        *error = arena_printf(cg->c->arena, "LLVM could not emit the %s code: %s",
                              cg->target == TARGET_GPU ? "GPU" : "CPU", msg);
        LLVMDisposeMessage(msg);
        return false;
    }
    *len = LLVMGetBufferSize(buf);
    *out = arena_alloc(cg->c->arena, *len + 1);
    memcpy(*out, LLVMGetBufferStart(buf), *len);
    (*out)[*len] = '\0';
    LLVMDisposeMemoryBuffer(buf);
    return true;
}

/* ----------------------------------------------------------------- values */

LLVMValueRef cg_i64(Cg *cg, int64_t v) {
    return LLVMConstInt(cg->i64, (unsigned long long)v, 1);
}

LLVMTypeRef cg_elem_type(Cg *cg, DType dt) {
    switch (dt) {
    case DT_F32: return cg->f32;
    case DT_F64: return cg->f64;
    case DT_I32: return cg->i32;
    case DT_I64: return cg->i64;
    }
    return cg->f32;
}

static LLVMValueRef scalar_address(Cg *cg, int slot) {
    LLVMValueRef idx = cg_i64(cg, slot);
    return LLVMBuildInBoundsGEP2(cg->b, cg->i64, cg->scalars, &idx, 1, "");
}

LLVMValueRef cg_scalar_i64(Cg *cg, int slot) {
    return LLVMBuildLoad2(cg->b, cg->i64, scalar_address(cg, slot), "");
}

LLVMValueRef cg_scalar_f64(Cg *cg, int slot) {
    LLVMValueRef p = LLVMBuildBitCast(cg->b, scalar_address(cg, slot), LLVMPointerType(cg->f64, 0), "");
    return LLVMBuildLoad2(cg->b, cg->f64, p, "");
}

LLVMValueRef cg_local_batch(Cg *cg) {
    return cg_scalar_i64(cg, DDP_S_LOCAL_BATCH);
}

LLVMValueRef cg_to_f64(Cg *cg, LLVMValueRef v) {
    LLVMTypeRef t = LLVMTypeOf(v);
    if (t == cg->f64)
        return v;
    if (t == cg->f32)
        return LLVMBuildFPExt(cg->b, v, cg->f64, "");
    return LLVMBuildSIToFP(cg->b, v, cg->f64, "");
}

LLVMValueRef cg_from_f64(Cg *cg, LLVMValueRef v, LLVMTypeRef to) {
    return to == cg->f64 ? v : LLVMBuildFPTrunc(cg->b, v, to, "");
}

/* ---------------------------------------------------------------- kernels */

LLVMValueRef cg_kernel_begin(Cg *cg, const char *name) {
    cg->fn = LLVMAddFunction(cg->mod, name, cg->kernel_type);
    cg->bufs = LLVMGetParam(cg->fn, 0);
    cg->scalars = LLVMGetParam(cg->fn, 1);
    cg->begin = LLVMGetParam(cg->fn, 2);
    cg->end = LLVMGetParam(cg->fn, 3);
    cg->arg_ptr = arena_alloc(cg->c->arena, sizeof(LLVMValueRef) * (size_t)(cg->nargs + 1));
    cg->entry = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "entry");
    LLVMBasicBlockRef start = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "start");
    LLVMPositionBuilderAtEnd(cg->b, start);
    if (cg->target == TARGET_GPU) {
        LLVMSetFunctionCallConv(cg->fn, 71); /* PTX_Kernel */
        LLVMMetadataRef md[] = {LLVMValueAsMetadata(cg->fn),
                             LLVMMDStringInContext2(cg->ctx, "kernel", 6),
                             LLVMValueAsMetadata(LLVMConstInt(cg->i32, 1, 0))};
        LLVMAddNamedMetadataOperand(cg->mod, "nvvm.annotations",
                                    LLVMMetadataAsValue(cg->ctx, LLVMMDNodeInContext2(cg->ctx, md, 3)));
    }
    return cg->fn;
}

void cg_kernel_end(Cg *cg) {
    LLVMBuildRetVoid(cg->b);
    LLVMBasicBlockRef start = LLVMGetNextBasicBlock(cg->entry);
    LLVMPositionBuilderAtEnd(cg->b, cg->entry);
    LLVMBuildBr(cg->b, start);
}

/* Positions the builder in the entry block for one instruction, then back. */
static LLVMValueRef in_entry(Cg *cg, LLVMValueRef (*make)(Cg *, void *), void *arg) {
    LLVMBasicBlockRef here = LLVMGetInsertBlock(cg->b);
    LLVMPositionBuilderAtEnd(cg->b, cg->entry);
    LLVMValueRef v = make(cg, arg);
    LLVMPositionBuilderAtEnd(cg->b, here);
    return v;
}

static LLVMValueRef load_arg(Cg *cg, void *arg) {
    int k = *(int *)arg;
    LLVMValueRef idx = cg_i64(cg, k);
    LLVMValueRef p = LLVMBuildInBoundsGEP2(cg->b, cg->ptr, cg->bufs, &idx, 1, "");
    return LLVMBuildLoad2(cg->b, cg->ptr, p, "");
}

LLVMValueRef cg_tensor_ptr(Cg *cg, Tensor *t) {
    Tensor *s = tensor_storage(t);
    int k = 0;
    while (k < cg->nargs && cg->args[k] != s)
        k++;
    if (k == cg->nargs) {
        fprintf(stderr, "ddpc: internal error: tensor %%%d is not an argument of its kernel\n", s->id);
        abort();
    }
    if (!cg->arg_ptr[k])
        cg->arg_ptr[k] = in_entry(cg, load_arg, &k);
    return LLVMBuildBitCast(cg->b, cg->arg_ptr[k], LLVMPointerType(cg_elem_type(cg, t->dtype), 0), "");
}

LLVMValueRef cg_load(Cg *cg, Tensor *t, LLVMValueRef index) {
    LLVMTypeRef et = cg_elem_type(cg, t->dtype);
    LLVMValueRef p = LLVMBuildInBoundsGEP2(cg->b, et, cg_tensor_ptr(cg, t), &index, 1, "");
    return LLVMBuildLoad2(cg->b, et, p, "");
}

void cg_store(Cg *cg, Tensor *t, LLVMValueRef index, LLVMValueRef v) {
    LLVMTypeRef et = cg_elem_type(cg, t->dtype);
    if (LLVMTypeOf(v) != et)
        v = et == cg->f32 || et == cg->f64 ? (LLVMTypeOf(v) == cg->f64 && et == cg->f32
                                                  ? LLVMBuildFPTrunc(cg->b, v, et, "")
                                                  : LLVMBuildFPExt(cg->b, v, et, ""))
                                           : v;
    LLVMValueRef p = LLVMBuildInBoundsGEP2(cg->b, et, cg_tensor_ptr(cg, t), &index, 1, "");
    LLVMBuildStore(cg->b, v, p);
}

typedef struct VarArgs {
    LLVMTypeRef type;
    const char *name;
} VarArgs;

static LLVMValueRef make_alloca(Cg *cg, void *arg) {
    VarArgs *a = arg;
    return LLVMBuildAlloca(cg->b, a->type, a->name);
}

LLVMValueRef cg_var(Cg *cg, LLVMTypeRef type, LLVMValueRef init, const char *name) {
    VarArgs a = {type, name};
    LLVMValueRef v = in_entry(cg, make_alloca, &a);
    if (init)
        LLVMBuildStore(cg->b, init, v);
    return v;
}

Loop cg_loop_begin(Cg *cg, LLVMValueRef lo, LLVMValueRef hi, const char *name) {
    Loop l;
    l.var = cg_var(cg, cg->i64, NULL, name);
    LLVMBuildStore(cg->b, lo, l.var);
    l.hi = hi;
    l.cond = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "cond");
    l.body = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "body");
    l.next = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "next");
    l.exit = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "exit");
    LLVMBuildBr(cg->b, l.cond);
    LLVMPositionBuilderAtEnd(cg->b, l.cond);
    LLVMValueRef i = LLVMBuildLoad2(cg->b, cg->i64, l.var, "");
    LLVMBuildCondBr(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLT, i, hi, ""), l.body, l.exit);
    LLVMPositionBuilderAtEnd(cg->b, l.body);
    return l;
}

LLVMValueRef cg_loop_index(Cg *cg, Loop *l) {
    return LLVMBuildLoad2(cg->b, cg->i64, l->var, "");
}

void cg_loop_end(Cg *cg, Loop *l) {
    LLVMBuildBr(cg->b, l->next);
    LLVMPositionBuilderAtEnd(cg->b, l->next);
    LLVMValueRef i = LLVMBuildLoad2(cg->b, cg->i64, l->var, "");
    LLVMBuildStore(cg->b, LLVMBuildAdd(cg->b, i, cg_i64(cg, 1), ""), l->var);
    LLVMBuildBr(cg->b, l->cond);
    LLVMPositionBuilderAtEnd(cg->b, l->exit);
}

If cg_if_begin(Cg *cg, LLVMValueRef cond) {
    If f;
    f.then = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "then");
    f.done = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "done");
    LLVMBuildCondBr(cg->b, cond, f.then, f.done);
    LLVMPositionBuilderAtEnd(cg->b, f.then);
    return f;
}

void cg_if_end(Cg *cg, If *f) {
    LLVMBuildBr(cg->b, f->done);
    LLVMPositionBuilderAtEnd(cg->b, f->done);
}

static LLVMValueRef sreg(Cg *cg, const char *name) {
    LLVMValueRef f = LLVMGetNamedFunction(cg->mod, name);
    LLVMTypeRef type = LLVMFunctionType(cg->i32, NULL, 0, 0);
    if (!f)
        f = LLVMAddFunction(cg->mod, name, type);
    return LLVMBuildZExt(cg->b, LLVMBuildCall2(cg->b, type, f, NULL, 0, ""), cg->i64, "");
}

void cg_kernel_indices(Cg *cg, IrOp *op, IndexBody body) {
    if (cg->target != TARGET_GPU) {
        Loop l = cg_loop_begin(cg, cg->begin, cg->end, "i");
        body(cg, op, cg_loop_index(cg, &l));
        cg_loop_end(cg, &l);
        return;
    }
    LLVMValueRef block = sreg(cg, "llvm.nvvm.read.ptx.sreg.ctaid.x");
    LLVMValueRef width = sreg(cg, "llvm.nvvm.read.ptx.sreg.ntid.x");
    LLVMValueRef thread = sreg(cg, "llvm.nvvm.read.ptx.sreg.tid.x");
    LLVMValueRef i = LLVMBuildAdd(cg->b, cg->begin,
                                  LLVMBuildAdd(cg->b, LLVMBuildMul(cg->b, block, width, ""), thread, ""), "i");
    If f = cg_if_begin(cg, LLVMBuildICmp(cg->b, LLVMIntSLT, i, cg->end, ""));
    body(cg, op, i);
    cg_if_end(cg, &f);
}
