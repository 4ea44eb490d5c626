/* llvm.c: LLVM modules, target machines, and the small builder the kernel generators
 * are written with: loops, conditionals, typed loads and stores through the buffer
 * table, run-time scalars, and a GPU thread's place in its launch.
 *
 * The GPU module is made target-neutral: a kernel asks for its block, its thread, a
 * barrier or its block's shared memory through the ddp_gpu_* functions. It is then
 * lowered twice from that one module (cg_emit_ptx, cg_emit_emulated): to PTX, where ddp_gpu_* become the
 * special registers, bar.sync and dynamic shared memory; and to a host object for the
 * emulated device, where the runtime's emulator defines them. Both carry the hash of
 * the module's text, so the runtime can check they came from the same module.
 *
 * A kernel's function has two blocks up front: `entry`, which gathers the allocas and
 * the buffer pointers a kernel loads from the table (so they are loaded once, outside
 * every loop), and `start`, where the work begins. The entry block is closed with a
 * branch to start when the kernel ends. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/DebugInfo.h>
#include <llvm-c/Support.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "cg.h"
#include "../runtime/ddp_abi.h"
#include "../runtime/fnv.h"

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
    /* The optimizer's loop reads and writes up to five flat vectors (parameters,
     * gradients, two moments, ema's average) that never overlap; LLVM checks that at
     * run time before vectorising, but gives up past 8 checks by default, and the loop
     * then runs 5 times slower. */
    const char *const options[] = {"ddpc", "-runtime-memory-check-threshold=16"};
    LLVMParseCommandLineOptions(2, options, NULL);
}

static LLVMTargetMachineRef target_machine(Target target, int opt_level) {
    LLVMTargetRef t;
    char *msg = NULL;
    if (LLVMGetTargetFromTriple(targets[target].triple, &t, &msg)) {
        LLVMDisposeMessage(msg);
        return NULL;
    }
    LLVMCodeGenOptLevel level = opt_level <= 0 ? LLVMCodeGenLevelNone
                                : opt_level == 1 ? LLVMCodeGenLevelLess
                                : opt_level == 2 ? LLVMCodeGenLevelDefault : LLVMCodeGenLevelAggressive;
    return LLVMCreateTargetMachine(t, targets[target].triple, targets[target].cpu, targets[target].features, level,
                                   target == TARGET_GPU ? LLVMRelocDefault : LLVMRelocPIC, LLVMCodeModelDefault);
}

static void set_target(LLVMModuleRef m, LLVMTargetMachineRef tm, const char *triple) {
    LLVMSetTarget(m, triple);
    LLVMTargetDataRef layout = LLVMCreateTargetDataLayout(tm);
    char *rep = LLVMCopyStringRepOfTargetData(layout);
    LLVMSetDataLayout(m, rep);
    LLVMDisposeMessage(rep);
    LLVMDisposeTargetData(layout);
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
    cg->opt_level = opt_level;
    cg->tm = target_machine(target, opt_level);
    if (target != TARGET_GPU) /* the GPU module stays neutral until it is lowered */
        set_target(cg->mod, cg->tm, targets[target].triple);

    cg->void_t = LLVMVoidTypeInContext(cg->ctx);
    cg->i1 = LLVMInt1TypeInContext(cg->ctx);
    cg->i8 = LLVMInt8TypeInContext(cg->ctx);
    cg->i16 = LLVMInt16TypeInContext(cg->ctx);
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
    case DT_BF16: return cg->i16;
    case DT_U8: return cg->i8;
    }
    return cg->f32;
}

LLVMTypeRef cg_value_type(Cg *cg, DType dt) {
    return dt == DT_BF16 ? cg->f32 : cg_elem_type(cg, dt);
}

/* bf16 is the top half of an f32: widening is a shift. */
LLVMValueRef cg_bf16_to_f32(Cg *cg, LLVMValueRef bits) {
    LLVMValueRef wide = LLVMBuildShl(cg->b, LLVMBuildZExt(cg->b, bits, cg->i32, ""), LLVMConstInt(cg->i32, 16, 0), "");
    return LLVMBuildBitCast(cg->b, wide, cg->f32, "");
}

/* Round to nearest, ties to even, on the bits: adding 0x7fff plus the kept part's
 * lowest bit carries exactly when the dropped half is above a tie, or a tie with an
 * odd kept part (a carry into the exponent is the right rounding, up to infinity).
 * A NaN keeps its sign and top payload and is made quiet, as cvt.rn.bf16.f32 does. */
LLVMValueRef cg_bf16_from_f32(Cg *cg, LLVMValueRef v) {
    LLVMValueRef bits = LLVMBuildBitCast(cg->b, v, cg->i32, "");
    LLVMValueRef sixteen = LLVMConstInt(cg->i32, 16, 0);
    LLVMValueRef high = LLVMBuildLShr(cg->b, bits, sixteen, "");
    LLVMValueRef odd = LLVMBuildAnd(cg->b, high, LLVMConstInt(cg->i32, 1, 0), "");
    LLVMValueRef bias = LLVMBuildAdd(cg->b, odd, LLVMConstInt(cg->i32, 0x7fff, 0), "");
    LLVMValueRef rounded = LLVMBuildLShr(cg->b, LLVMBuildAdd(cg->b, bits, bias, ""), sixteen, "");
    LLVMValueRef quiet = LLVMBuildOr(cg->b, high, LLVMConstInt(cg->i32, 0x40, 0), "");
    LLVMValueRef nan = LLVMBuildFCmp(cg->b, LLVMRealUNO, v, v, "");
    return LLVMBuildTrunc(cg->b, LLVMBuildSelect(cg->b, nan, quiet, rounded, ""), cg->i16, "");
}

/* Positions the builder in the entry block for one instruction, then back. */
static LLVMValueRef in_entry(Cg *cg, LLVMValueRef (*make)(Cg *, void *), void *arg) {
    LLVMBasicBlockRef here = LLVMGetInsertBlock(cg->b);
    LLVMPositionBuilderAtEnd(cg->b, cg->entry);
    LLVMValueRef v = make(cg, arg);
    LLVMPositionBuilderAtEnd(cg->b, here);
    return v;
}

static LLVMValueRef load_scalar(Cg *cg, void *arg) {
    LLVMValueRef idx = cg_i64(cg, *(int *)arg);
    return LLVMBuildLoad2(cg->b, cg->i64, LLVMBuildInBoundsGEP2(cg->b, cg->i64, cg->scalars, &idx, 1, ""), "");
}

/* A scalar is loaded once, in the entry block: no kernel writes the scalars, but a
 * load inside a loop whose stores LLVM cannot tell apart from them would stay there
 * and keep the loop from being vectorised. */
LLVMValueRef cg_scalar_i64(Cg *cg, int slot) {
    if (!cg->scalar[slot])
        cg->scalar[slot] = in_entry(cg, load_scalar, &slot);
    return cg->scalar[slot];
}

LLVMValueRef cg_scalar_f64(Cg *cg, int slot) {
    return LLVMBuildBitCast(cg->b, cg_scalar_i64(cg, slot), cg->f64, "");
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
    memset(cg->scalar, 0, sizeof cg->scalar);
    cg->entry = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "entry");
    LLVMBasicBlockRef start = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "start");
    LLVMPositionBuilderAtEnd(cg->b, start);
    return cg->fn;
}

void cg_kernel_end(Cg *cg) {
    LLVMBuildRetVoid(cg->b);
    LLVMBasicBlockRef start = LLVMGetNextBasicBlock(cg->entry);
    LLVMPositionBuilderAtEnd(cg->b, cg->entry);
    LLVMBuildBr(cg->b, start);
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

/* An f64 as an f32 rounded to odd: toward zero, the last bit set when inexact. Rounding
 * that to bf16 (16 bits shorter) to nearest even is the same as rounding the f64 there
 * directly, where rounding to nearest twice could land on a tie that was not one. */
static LLVMValueRef f32_round_to_odd(Cg *cg, LLVMValueRef v) {
    LLVMValueRef f = LLVMBuildFPTrunc(cg->b, v, cg->f32, "");
    LLVMValueRef back = LLVMBuildFPExt(cg->b, f, cg->f64, "");
    LLVMValueRef bits = LLVMBuildBitCast(cg->b, f, cg->i32, "");
    LLVMValueRef positive = LLVMBuildFCmp(cg->b, LLVMRealOGT, v, LLVMConstReal(cg->f64, 0), "");
    LLVMValueRef above = LLVMBuildFCmp(cg->b, LLVMRealOGT, back, v, "");
    LLVMValueRef away = LLVMBuildSelect(cg->b, positive, above, LLVMBuildFCmp(cg->b, LLVMRealOLT, back, v, ""),
                                        ""); /* f keeps v's sign */
    LLVMValueRef toward_zero = LLVMBuildSelect(cg->b, away, LLVMBuildSub(cg->b, bits, LLVMConstInt(cg->i32, 1, 0), ""),
                                               bits, "");
    LLVMValueRef odd = LLVMBuildOr(cg->b, toward_zero, LLVMConstInt(cg->i32, 1, 0), "");
    LLVMValueRef inexact = LLVMBuildFCmp(cg->b, LLVMRealONE, back, v, "");
    return LLVMBuildBitCast(cg->b, LLVMBuildSelect(cg->b, inexact, odd, bits, ""), cg->f32, "");
}

LLVMValueRef cg_load(Cg *cg, Tensor *t, LLVMValueRef index) {
    LLVMTypeRef et = cg_elem_type(cg, t->dtype);
    LLVMValueRef p = LLVMBuildInBoundsGEP2(cg->b, et, cg_tensor_ptr(cg, t), &index, 1, "");
    LLVMValueRef v = LLVMBuildLoad2(cg->b, et, p, "");
    return t->dtype == DT_BF16 ? cg_bf16_to_f32(cg, v) : v;
}

static LLVMValueRef cg_gpu_bf16(Cg *cg, LLVMValueRef v);

void cg_store(Cg *cg, Tensor *t, LLVMValueRef index, LLVMValueRef v) {
    LLVMTypeRef et = cg_elem_type(cg, t->dtype);
    if (t->dtype == DT_BF16) {
        if (LLVMTypeOf(v) == cg->f64)
            v = f32_round_to_odd(cg, v);
        v = cg->target == TARGET_GPU ? cg_gpu_bf16(cg, v) : cg_bf16_from_f32(cg, v);
    } else if (LLVMTypeOf(v) != et)
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
    return cg_loop_begin_step(cg, lo, hi, cg_i64(cg, 1), name);
}

Loop cg_loop_begin_step(Cg *cg, LLVMValueRef lo, LLVMValueRef hi, LLVMValueRef step, const char *name) {
    Loop l;
    l.step = step;
    l.type = LLVMTypeOf(lo);
    l.var = cg_var(cg, l.type, NULL, name);
    LLVMBuildStore(cg->b, lo, l.var);
    l.hi = hi;
    l.cond = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "cond");
    l.body = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "body");
    l.next = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "next");
    l.exit = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "exit");
    LLVMBuildBr(cg->b, l.cond);
    LLVMPositionBuilderAtEnd(cg->b, l.cond);
    LLVMValueRef i = LLVMBuildLoad2(cg->b, l.type, l.var, "");
    LLVMBuildCondBr(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLT, i, hi, ""), l.body, l.exit);
    LLVMPositionBuilderAtEnd(cg->b, l.body);
    return l;
}

/* An index as the i64 the kernels' bodies take: a 32-bit loop's widened. */
static LLVMValueRef widened(Cg *cg, LLVMValueRef i) {
    return LLVMTypeOf(i) == cg->i64 ? i : LLVMBuildZExt(cg->b, i, cg->i64, "");
}

LLVMValueRef cg_loop_index(Cg *cg, Loop *l) {
    return widened(cg, LLVMBuildLoad2(cg->b, l->type, l->var, ""));
}

static LLVMValueRef loop_latch(Cg *cg, Loop *l) {
    LLVMBuildBr(cg->b, l->next);
    LLVMPositionBuilderAtEnd(cg->b, l->next);
    LLVMValueRef i = LLVMBuildLoad2(cg->b, l->type, l->var, "");
    LLVMBuildStore(cg->b, LLVMBuildAdd(cg->b, i, l->step, ""), l->var);
    LLVMValueRef back = LLVMBuildBr(cg->b, l->cond);
    LLVMPositionBuilderAtEnd(cg->b, l->exit);
    return back;
}

void cg_loop_end(Cg *cg, Loop *l) {
    loop_latch(cg, l);
}

/* The loop's `llvm.loop` node: its first operand itself (made through a temporary
 * node: the C API has no distinct ones), then the vector width asked for. */
void cg_loop_end_vector_width(Cg *cg, Loop *l, int width) {
    LLVMValueRef back = loop_latch(cg, l);
    const char *name = "llvm.loop.vectorize.width";
    LLVMMetadataRef property[2] = {LLVMMDStringInContext2(cg->ctx, name, strlen(name)),
                                   LLVMValueAsMetadata(LLVMConstInt(cg->i32, (unsigned)width, false))};
    LLVMMetadataRef self = LLVMTemporaryMDNode(cg->ctx, NULL, 0);
    LLVMMetadataRef operands[2] = {self, LLVMMDNodeInContext2(cg->ctx, property, 2)};
    LLVMMetadataRef id = LLVMMDNodeInContext2(cg->ctx, operands, 2);
    LLVMMetadataReplaceAllUsesWith(self, id);
    LLVMSetMetadata(back, LLVMGetMDKindIDInContext(cg->ctx, "llvm.loop", 9), LLVMMetadataAsValue(cg->ctx, id));
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

/* ------------------------------------------------------------- the GPU */

/* The GPU's builtins, as the neutral module declares them. */
static const char *const gpu_builtins[] = {"ddp_gpu_block", "ddp_gpu_blocks", "ddp_gpu_threads",
                                           "ddp_gpu_thread", "ddp_gpu_barrier", "ddp_gpu_shared",
                                           "ddp_gpu_bf16"};
enum { GPU_BLOCK, GPU_BLOCKS, GPU_THREADS, GPU_THREAD, GPU_BARRIER, GPU_SHARED, GPU_BF16, GPU_BUILTINS };

static LLVMTypeRef builtin_type(LLVMContextRef ctx, int which) {
    if (which == GPU_BF16) { /* i16 (float): an f32 rounded to bf16's bits */
        LLVMTypeRef f32 = LLVMFloatTypeInContext(ctx);
        return LLVMFunctionType(LLVMInt16TypeInContext(ctx), &f32, 1, 0);
    }
    LLVMTypeRef ret = which == GPU_BARRIER  ? LLVMVoidTypeInContext(ctx)
                      : which == GPU_SHARED ? LLVMPointerType(LLVMInt8TypeInContext(ctx), 0)
                                            : LLVMInt32TypeInContext(ctx);
    return LLVMFunctionType(ret, NULL, 0, 0);
}

static LLVMValueRef call_builtin_with(Cg *cg, int which, LLVMValueRef *args, unsigned nargs) {
    LLVMTypeRef type = builtin_type(cg->ctx, which);
    LLVMValueRef f = LLVMGetNamedFunction(cg->mod, gpu_builtins[which]);
    if (!f) {
        f = LLVMAddFunction(cg->mod, gpu_builtins[which], type);
        if (which == GPU_BF16) /* a value of its argument alone: LLVM may move it, or share it */
            LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex,
                                    LLVMCreateEnumAttribute(cg->ctx, LLVMGetEnumAttributeKindForName("readnone", 8), 0));
    }
    return LLVMBuildCall2(cg->b, type, f, args, nargs, "");
}

static LLVMValueRef call_builtin(Cg *cg, int which) {
    return call_builtin_with(cg, which, NULL, 0);
}

LLVMValueRef cg_gpu_block(Cg *cg) {
    return LLVMBuildZExt(cg->b, call_builtin(cg, GPU_BLOCK), cg->i64, "block");
}

LLVMValueRef cg_gpu_blocks(Cg *cg) {
    return LLVMBuildZExt(cg->b, call_builtin(cg, GPU_BLOCKS), cg->i64, "blocks");
}

LLVMValueRef cg_gpu_threads(Cg *cg) {
    return LLVMBuildZExt(cg->b, call_builtin(cg, GPU_THREADS), cg->i64, "threads");
}

LLVMValueRef cg_gpu_thread(Cg *cg) {
    return LLVMBuildZExt(cg->b, call_builtin(cg, GPU_THREAD), cg->i64, "thread");
}

void cg_gpu_barrier(Cg *cg) {
    if (!cg->ir->no_barriers)
        call_builtin(cg, GPU_BARRIER);
}

LLVMValueRef cg_gpu_shared(Cg *cg) {
    return call_builtin(cg, GPU_SHARED);
}

/* f32 to bf16 on the GPU: one cvt.rn.bf16.f32 (an sm_80 instruction), where the bit
 * arithmetic of cg_bf16_from_f32 takes seven; the emulated device's is
 * ddp_bf16_from_float, the same rounding. */
static LLVMValueRef cg_gpu_bf16(Cg *cg, LLVMValueRef v) {
    return call_builtin_with(cg, GPU_BF16, &v, 1);
}

/* In the PTX copy: each builtin defined, inline, with what the GPU has. */
static void define_builtins_for_ptx(LLVMModuleRef m, LLVMContextRef ctx) {
    static const char *const registers[] = {[GPU_BLOCK] = "llvm.nvvm.read.ptx.sreg.ctaid.x",
                                            [GPU_BLOCKS] = "llvm.nvvm.read.ptx.sreg.nctaid.x",
                                            [GPU_THREADS] = "llvm.nvvm.read.ptx.sreg.ntid.x",
                                            [GPU_THREAD] = "llvm.nvvm.read.ptx.sreg.tid.x"};
    LLVMBuilderRef b = LLVMCreateBuilderInContext(ctx);
    LLVMTypeRef i8 = LLVMInt8TypeInContext(ctx);
    unsigned inline_kind = LLVMGetEnumAttributeKindForName("alwaysinline", 12);
    for (int w = 0; w < GPU_BUILTINS; w++) {
        LLVMValueRef f = LLVMGetNamedFunction(m, gpu_builtins[w]);
        if (!f)
            continue;
        LLVMTypeRef type = builtin_type(ctx, w);
        LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlockInContext(ctx, f, "entry"));
        if (w == GPU_BF16) {
            static const char cvt[] = "cvt.rn.bf16.f32 $0, $1;", constraints[] = "=h,f";
            LLVMValueRef convert = LLVMGetInlineAsm(type, (char *)cvt, sizeof cvt - 1, (char *)constraints,
                                                    sizeof constraints - 1, 0, 0, LLVMInlineAsmDialectATT, 0);
            LLVMValueRef x = LLVMGetParam(f, 0);
            LLVMBuildRet(b, LLVMBuildCall2(b, type, convert, &x, 1, ""));
        } else if (w == GPU_SHARED) {
            /* the launch's dynamic shared memory, as a generic pointer */
            LLVMTypeRef bytes = LLVMArrayType(i8, 0);
            LLVMValueRef shared = LLVMAddGlobalInAddressSpace(m, bytes, "ddp_gpu_shared_memory", 3);
            LLVMSetAlignment(shared, 16);
            LLVMValueRef p = LLVMBuildBitCast(b, shared, LLVMPointerType(i8, 3), "");
            LLVMBuildRet(b, LLVMBuildAddrSpaceCast(b, p, LLVMPointerType(i8, 0), ""));
        } else {
            const char *name = w == GPU_BARRIER ? "llvm.nvvm.barrier0" : registers[w];
            LLVMValueRef intrinsic = LLVMGetNamedFunction(m, name);
            if (!intrinsic)
                intrinsic = LLVMAddFunction(m, name, type);
            LLVMValueRef v = LLVMBuildCall2(b, type, intrinsic, NULL, 0, "");
            if (w == GPU_BARRIER)
                LLVMBuildRetVoid(b);
            else
                LLVMBuildRet(b, v);
        }
        LLVMSetLinkage(f, LLVMInternalLinkage);
        LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(ctx, inline_kind, 0));
    }
    LLVMDisposeBuilder(b);
}

/* Whether f is one of the program's kernels (and not a helper or a builtin). */
static bool is_kernel(Cg *cg, LLVMValueRef f) {
    size_t len;
    const char *name = LLVMGetValueName2(f, &len);
    for (int k = 0; k < cg->ir->kernel_ops.len; k++)
        if (strcmp(name, kernel_name(cg->c, cg->ir->kernel_ops.items[k], k)) == 0)
            return true;
    return false;
}

/* Runs the optimisation pipeline on m and emits it for tm, or takes what that gave
 * before from the cache (cache.c). */
static bool emit_module(Cg *cg, LLVMModuleRef m, LLVMTargetMachineRef tm, LLVMCodeGenFileType type, const char *what,
                        char **out, size_t *len, const char **error) {
    char entry[PATH_MAX];
    bool cached = !cg->uncached && cache_entry(m, tm, cg->opt_level, type, entry);
    if (cached && (*out = cache_get(cg->c, entry, len)))
        return true;
    char *msg = NULL;
    if (LLVMVerifyModule(m, LLVMReturnStatusAction, &msg)) {
        *error = arena_printf(cg->c->arena, "generated %s code failed verification: %s", what, msg);
        LLVMDisposeMessage(msg);
        return false;
    }
    LLVMDisposeMessage(msg);
    if (cg->opt_level > 0) {
        LLVMPassBuilderOptionsRef options = LLVMCreatePassBuilderOptions();
        const char *pipeline = cg->opt_level == 1   ? "default<O1>"
                               : cg->opt_level == 2 ? "default<O2>" : "default<O3>";
        LLVMErrorRef err = LLVMRunPasses(m, pipeline, tm, options);
        LLVMDisposePassBuilderOptions(options);
        if (err) {
            char *e = LLVMGetErrorMessage(err);
            *error = arena_printf(cg->c->arena, "optimising the generated %s code failed: %s", what, e);
            LLVMDisposeErrorMessage(e);
            return false;
        }
    }
    LLVMMemoryBufferRef buf;
    if (LLVMTargetMachineEmitToMemoryBuffer(tm, m, type, &msg, &buf)) {
        *error = arena_printf(cg->c->arena, "LLVM could not emit the %s code: %s", what, msg);
        LLVMDisposeMessage(msg);
        return false;
    }
    *len = LLVMGetBufferSize(buf);
    *out = arena_alloc(cg->c->arena, *len + 1);
    memcpy(*out, LLVMGetBufferStart(buf), *len);
    (*out)[*len] = '\0';
    LLVMDisposeMemoryBuffer(buf);
    if (cached)
        cache_put(entry, *out, *len);
    return true;
}

bool cg_emit(Cg *cg, int opt_level, char **out, size_t *len, const char **error) {
    cg->opt_level = opt_level;
    return emit_module(cg, cg->mod, cg->tm, LLVMObjectFile, "CPU", out, len, error);
}

/* The hash of the GPU module's text, which the PTX and the emulated device's object
 * both carry. */
static uint64_t gpu_module_hash(Cg *cg) {
    char *text = LLVMPrintModuleToString(cg->mod);
    uint64_t hash = ddp_fnv1a(text, strlen(text), DDP_FNV_START);
    LLVMDisposeMessage(text);
    return hash;
}

bool cg_emit_ptx(Cg *cg, char **ptx, size_t *ptx_len, const char **error) {
    uint64_t hash = gpu_module_hash(cg);
    /* the builtins defined with the GPU's registers; kernels with the kernel calling
     * convention, annotated as kernels */
    LLVMModuleRef device = LLVMCloneModule(cg->mod);
    set_target(device, cg->tm, targets[TARGET_GPU].triple);
    define_builtins_for_ptx(device, cg->ctx);
    for (LLVMValueRef f = LLVMGetFirstFunction(device); f; f = LLVMGetNextFunction(f)) {
        if (!is_kernel(cg, f))
            continue;
        LLVMSetFunctionCallConv(f, 71); /* PTX_Kernel */
        LLVMMetadataRef md[] = {LLVMValueAsMetadata(f), LLVMMDStringInContext2(cg->ctx, "kernel", 6),
                                LLVMValueAsMetadata(LLVMConstInt(cg->i32, 1, 0))};
        LLVMAddNamedMetadataOperand(device, "nvvm.annotations",
                                    LLVMMetadataAsValue(cg->ctx, LLVMMDNodeInContext2(cg->ctx, md, 3)));
    }
    char *code;
    size_t code_len;
    bool ok = emit_module(cg, device, cg->tm, LLVMAssemblyFile, "GPU", &code, &code_len, error);
    LLVMDisposeModule(device);
    if (!ok)
        return false;
    char header[64];
    int n = snprintf(header, sizeof header, "// ddp gpu module %016llx\n", (unsigned long long)hash);
    *ptx_len = (size_t)n + code_len;
    *ptx = arena_alloc(cg->c->arena, *ptx_len + 1);
    memcpy(*ptx, header, (size_t)n);
    memcpy(*ptx + n, code, code_len + 1);
    return true;
}

/* The emulated device's object is not optimised, whatever the build's level: no
 * operation carries fast-math flags, so its results are the same bits at every level;
 * the emulator's coroutines, copies and checks take nearly all of its time (a
 * training step of fashion.ddp 4% slower, a ViT's kernel check 2%); and it was a
 * quarter of a build's work (ResNet-50 on two cores: 10.8 s -> 8.1 s). */
bool cg_emit_emulated(Cg *cg, char **obj, size_t *obj_len, const char **error) {
    /* the same module, kernels renamed, the builtins left to the emulator */
    uint64_t hash = gpu_module_hash(cg);
    cg->opt_level = 0;
    LLVMTargetMachineRef host_tm = target_machine(TARGET_CPU_BASE, 0);
    LLVMModuleRef host = LLVMCloneModule(cg->mod);
    set_target(host, host_tm, targets[TARGET_CPU_BASE].triple);
    for (LLVMValueRef f = LLVMGetFirstFunction(host); f; f = LLVMGetNextFunction(f))
        if (is_kernel(cg, f)) {
            size_t len;
            const char *name = LLVMGetValueName2(f, &len);
            const char *renamed = arena_printf(cg->c->arena, "%s_gpu", name);
            LLVMSetValueName2(f, renamed, strlen(renamed));
        }
    LLVMValueRef stamp = LLVMAddGlobal(host, cg->i64, "ddp_gpu_module_hash");
    LLVMSetInitializer(stamp, LLVMConstInt(cg->i64, hash, 0));
    LLVMSetGlobalConstant(stamp, 1);
    bool ok = emit_module(cg, host, host_tm, LLVMObjectFile, "emulated GPU", obj, obj_len, error);
    LLVMDisposeModule(host);
    LLVMDisposeTargetMachine(host_tm);
    return ok;
}

void cg_kernel_blocks(Cg *cg, IrOp *op, IndexBody body) {
    LLVMValueRef i = LLVMBuildAdd(cg->b, cg->begin, cg_gpu_block(cg), "i");
    If f = cg_if_begin(cg, LLVMBuildICmp(cg->b, LLVMIntSLT, i, cg->end, ""));
    body(cg, op, i);
    cg_if_end(cg, &f);
}

/* Indices below this are counted in 32 bits by a GPU thread, with room for its
 * stride (a grid's threads stay far below 2^30): an element's address is then one
 * wide multiply-add from its tensor's base, where 64-bit indices take a pair of
 * additions for the index and another for each address. */
enum { INDEX32_LIMIT = 1 << 30 };

/* Not a sum's first stage: its time goes to a loop over rows inside each index, whose
 * 64-bit addresses would only be widened again from a narrowed index (a few
 * instructions more in that loop). */
bool cg_indices_fit_32(const Cg *cg, const IrOp *op) {
    return op->kind != OP_ROW_PARTIALS && op->range.fixed + op->range.per_sample * cg->ir->batch <= INDEX32_LIMIT;
}

void cg_kernel_indices(Cg *cg, IrOp *op, IndexBody prologue, IndexBody body, IndexGroupBody group) {
    if (cg->target != TARGET_GPU) {
        Loop l = cg_loop_begin(cg, cg->begin, cg->end, "i");
        body(cg, op, cg_loop_index(cg, &l));
        cg_loop_end(cg, &l);
        return;
    }
    /* the thread's indices: begin + block * width + thread, and on by the grid's threads */
    LLVMValueRef width = cg_gpu_threads(cg);
    LLVMValueRef first = add(cg, cg->begin, add(cg, mul(cg, cg_gpu_block(cg), width), cg_gpu_thread(cg)));
    if (prologue)
        prologue(cg, op, first);
    LLVMValueRef end = cg->end, stride = mul(cg, cg_gpu_blocks(cg), width);
    if (cg_indices_fit_32(cg, op)) {
        first = LLVMBuildTrunc(cg->b, first, cg->i32, "");
        end = LLVMBuildTrunc(cg->b, end, cg->i32, "");
        stride = LLVMBuildTrunc(cg->b, stride, cg->i32, "");
    }
    LLVMTypeRef type = LLVMTypeOf(first);
    if (group) { /* whole groups: i, i + T, ... i + (n - 1) T all below the end */
        LLVMValueRef last = mul(cg, stride, LLVMConstInt(type, INDICES_AT_ONCE - 1, 0));
        LLVMValueRef group_end = sub(cg, end, last);
        Loop g = cg_loop_begin_step(cg, first, group_end, mul(cg, stride, LLVMConstInt(type, INDICES_AT_ONCE, 0)),
                                    "group");
        LLVMValueRef at = LLVMBuildLoad2(cg->b, type, g.var, ""), i[INDICES_AT_ONCE];
        for (int u = 0; u < INDICES_AT_ONCE; u++, at = add(cg, at, stride))
            i[u] = widened(cg, at);
        group(cg, op, i, INDICES_AT_ONCE);
        cg_loop_end(cg, &g);
        first = LLVMBuildLoad2(cg->b, type, g.var, ""); /* the first index no group took */
    }
    Loop l = cg_loop_begin_step(cg, first, end, stride, "i");
    body(cg, op, cg_loop_index(cg, &l));
    cg_loop_end(cg, &l);
}
