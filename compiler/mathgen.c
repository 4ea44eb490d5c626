/* mathgen.c: exp, log, tanh, erf and their kin generated as LLVM IR, and the Philox generator.
 *
 * LLVM 14 cannot lower llvm.exp and friends for NVPTX, and on x86 they become libm
 * calls whose results differ between libraries; generating them here makes every
 * target compute the same values from the same operations.
 *
 *   exp:  x = k ln2 + r (Cody-Waite, |r| <= ln2 / 2), Taylor series of exp(r), times 2^k
 *         applied in two halves so that subnormal results come out right; exp(x + b)
 *         adds a small b to r, never rounding the sum x + b itself.
 *   log:  x = m 2^e with m in [sqrt(2)/2, sqrt(2)), log m = 2 atanh((m - 1) / (m + 1)).
 *   tanh: 1 - 2 / (exp(2|x|) + 1), or expm1(2x) / (expm1(2x) + 2) near 0 (no cancellation).
 *   erf:  2/sqrt(pi) exp(-x^2) sum (2x^2)^n x / (1 3 ... (2n + 1)), a series of positive
 *         terms (no cancellation), in f64; 1 beyond |x| = 6. It serves the normal
 *         distribution (1 + erf(x / sqrt 2)) / 2, gelu's, in f64; in f32, a fit to
 *         erfc (cg_normal_cdf).
 *   expm1, log1p: Kahan's and Goldberg's corrections of exp(x) - 1 and log(1 + x),
 *         u = exp(x) or 1 + x rounded, then the error of that rounding taken back.
 * Each is a private function of the module, inlined by the optimiser. */
#include <math.h>
#include <string.h>

#include "cg.h"

enum { M_EXP32, M_EXP64, M_EXP_SUM32, M_EXP_SUM64, M_LOG32, M_LOG64, M_TANH32, M_TANH64, M_ERF64 };

/* ------------------------------------------------------ function scaffolding */

typedef struct Saved {
    LLVMValueRef fn;
    LLVMBasicBlockRef entry, block;
} Saved;

/* Starts a helper function: the builder moves into it; cg's kernel state is kept. */
static LLVMValueRef helper_begin(Cg *cg, const char *name, LLVMTypeRef ret, LLVMTypeRef *params,
                                 int n, Saved *saved) {
    saved->fn = cg->fn;
    saved->entry = cg->entry;
    saved->block = LLVMGetInsertBlock(cg->b);
    LLVMValueRef f = LLVMAddFunction(cg->mod, name, LLVMFunctionType(ret, params, (unsigned)n, 0));
    LLVMSetLinkage(f, LLVMPrivateLinkage);
    cg->fn = f;
    cg->entry = LLVMAppendBasicBlockInContext(cg->ctx, f, "entry");
    LLVMBasicBlockRef start = LLVMAppendBasicBlockInContext(cg->ctx, f, "start");
    LLVMPositionBuilderAtEnd(cg->b, start);
    return f;
}

static void helper_end(Cg *cg, LLVMValueRef result, Saved *saved) {
    LLVMBuildRet(cg->b, result);
    LLVMBasicBlockRef start = LLVMGetNextBasicBlock(cg->entry);
    LLVMPositionBuilderAtEnd(cg->b, cg->entry);
    LLVMBuildBr(cg->b, start);
    cg->fn = saved->fn;
    cg->entry = saved->entry;
    if (saved->block)
        LLVMPositionBuilderAtEnd(cg->b, saved->block);
}

static LLVMValueRef call1(Cg *cg, LLVMValueRef f, LLVMValueRef x) {
    LLVMTypeRef t = LLVMTypeOf(x);
    LLVMTypeRef ft = LLVMFunctionType(t, &t, 1, 0);
    return LLVMBuildCall2(cg->b, ft, f, &x, 1, "");
}

static LLVMValueRef intrinsic1(Cg *cg, const char *name, LLVMValueRef x) {
    LLVMTypeRef t = LLVMTypeOf(x);
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMValueRef f = LLVMGetIntrinsicDeclaration(cg->mod, id, &t, 1);
    return LLVMBuildCall2(cg->b, LLVMIntrinsicGetType(cg->ctx, id, &t, 1), f, &x, 1, "");
}

static LLVMValueRef intrinsic2(Cg *cg, const char *name, LLVMValueRef x, LLVMValueRef y) {
    LLVMTypeRef t = LLVMTypeOf(x);
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMValueRef f = LLVMGetIntrinsicDeclaration(cg->mod, id, &t, 1);
    LLVMValueRef args[] = {x, y};
    return LLVMBuildCall2(cg->b, LLVMIntrinsicGetType(cg->ctx, id, &t, 1), f, args, 2, "");
}

LLVMValueRef cg_sqrt(Cg *cg, LLVMValueRef x) {
    return intrinsic1(cg, "llvm.sqrt", x);
}

static LLVMValueRef fma_(Cg *cg, LLVMValueRef x, LLVMValueRef y, LLVMValueRef z) {
    LLVMTypeRef t = LLVMTypeOf(x);
    unsigned id = LLVMLookupIntrinsicID("llvm.fma", 8);
    LLVMValueRef f = LLVMGetIntrinsicDeclaration(cg->mod, id, &t, 1);
    LLVMValueRef args[] = {x, y, z};
    return LLVMBuildCall2(cg->b, LLVMIntrinsicGetType(cg->ctx, id, &t, 1), f, args, 3, "");
}

static LLVMValueRef fabs_(Cg *cg, LLVMValueRef x) {
    return intrinsic1(cg, "llvm.fabs", x);
}

static LLVMValueRef copysign_(Cg *cg, LLVMValueRef mag, LLVMValueRef sign) {
    return intrinsic2(cg, "llvm.copysign", mag, sign);
}

static LLVMValueRef k(Cg *cg, LLVMTypeRef t, double v) {
    (void)cg;
    return LLVMConstReal(t, v);
}

/* c[0] + c[1] x + ... + c[n-1] x^(n-1) by Estrin's scheme: pairs c[i] + c[i+1] x, then
 * pairs of those joined by x^2, then by x^4, ...: about 2 log2 n dependent operations
 * where Horner's rule has 2n, so that a CPU overlaps the terms instead of waiting on
 * each (the generated functions' polynomials are short, their x small). */
static LLVMValueRef polynomial(Cg *cg, LLVMValueRef x, const double *c, int n) {
    LLVMTypeRef t = LLVMTypeOf(x);
    LLVMValueRef v[32], power = x;
    int m = 0;
    for (int i = 0; i < n; i += 2)
        v[m++] = i + 1 < n ? fadd(cg, k(cg, t, c[i]), fmul(cg, x, k(cg, t, c[i + 1]))) : k(cg, t, c[i]);
    while (m > 1) {
        power = fmul(cg, power, power);
        int joined = 0;
        for (int i = 0; i < m; i += 2)
            v[joined++] = i + 1 < m ? fadd(cg, v[i], fmul(cg, power, v[i + 1])) : v[i];
        m = joined;
    }
    return v[0];
}

/* ---------------------------------------------------------------------- exp */

/* 2^j for an integer j (i64 for f64, i32 for f32) within the normal exponent range,
 * built from its bits. */
static LLVMValueRef pow2(Cg *cg, LLVMValueRef j, bool wide) {
    LLVMTypeRef it = wide ? cg->i64 : cg->i32, ft = wide ? cg->f64 : cg->f32;
    LLVMValueRef e = LLVMBuildAdd(cg->b, j, LLVMConstInt(it, wide ? 1023 : 127, 0), "");
    LLVMValueRef bits = LLVMBuildShl(cg->b, e, LLVMConstInt(it, wide ? 52 : 23, 0), "");
    return LLVMBuildBitCast(cg->b, bits, ft, "");
}

/* exp(x + b) for b NULL or small beside x: the reduction x - k ln2 is exact for an x of
 * any size (k ln2_hi has few bits), and b joins the small remainder, so that a sum
 * whose rounding would cost more than the exp's own error is never rounded. */
static LLVMValueRef make_exp(Cg *cg, bool wide, bool split) {
    LLVMTypeRef t = wide ? cg->f64 : cg->f32;
    LLVMTypeRef params[] = {t, t};
    const char *name = split ? (wide ? "ddp_exp_sum_f64" : "ddp_exp_sum_f32")
                             : (wide ? "ddp_exp_f64" : "ddp_exp_f32");
    Saved s;
    LLVMValueRef f = helper_begin(cg, name, t, params, split ? 2 : 1, &s);
    LLVMValueRef x = LLVMGetParam(f, 0), b = split ? LLVMGetParam(f, 1) : NULL;
    LLVMValueRef whole = b ? fadd(cg, x, b) : x;
    double hi = wide ? 709.782712893384 : 88.72283905206835;
    double lo = wide ? -745.1332191019412 : -103.97208404541016;
    LLVMValueRef kf = fmul(cg, whole, k(cg, t, 1.4426950408889634));
    kf = fadd(cg, kf, sel(cg, fcmp(cg, LLVMRealOGE, whole, k(cg, t, 0)), k(cg, t, 0.5), k(cg, t, -0.5)));
    /* clamp before converting, so the integer is defined for any x */
    kf = sel(cg, fcmp(cg, LLVMRealOGT, kf, k(cg, t, 2000)), k(cg, t, 2000), kf);
    kf = sel(cg, fcmp(cg, LLVMRealOLT, kf, k(cg, t, -2000)), k(cg, t, -2000), kf);
    /* i32 for f32 (|k| <= 2000 fits), so that a loop of f32 exps vectorises: AVX2 has
     * no conversion of floats to 64-bit integers */
    LLVMTypeRef kt = wide ? cg->i64 : cg->i32;
    LLVMValueRef ki = LLVMBuildFPToSI(cg->b, kf, kt, "");
    kf = LLVMBuildSIToFP(cg->b, ki, t, "");
    double ln2_hi = wide ? 6.93147180369123816490e-01 : 0.693145751953125;
    double ln2_lo = wide ? 1.90821492927058770002e-10 : 1.428606765330187045e-06;
    LLVMValueRef r = fsub(cg, fsub(cg, x, fmul(cg, kf, k(cg, t, ln2_hi))), fmul(cg, kf, k(cg, t, ln2_lo)));
    if (b)
        r = fadd(cg, r, b);
    double c[16];
    int n = wide ? 14 : 8;
    c[0] = 1;
    for (int i = 1; i < n; i++)
        c[i] = c[i - 1] / i;
    LLVMValueRef p = polynomial(cg, r, c, n);
    LLVMValueRef half = LLVMBuildSDiv(cg->b, ki, LLVMConstInt(kt, 2, 0), "");
    LLVMValueRef rest = LLVMBuildSub(cg->b, ki, half, "");
    LLVMValueRef y = fmul(cg, fmul(cg, p, pow2(cg, half, wide)), pow2(cg, rest, wide));
    y = sel(cg, fcmp(cg, LLVMRealOGT, whole, k(cg, t, hi)), k(cg, t, INFINITY), y);
    y = sel(cg, fcmp(cg, LLVMRealOLT, whole, k(cg, t, lo)), k(cg, t, 0), y);
    y = sel(cg, fcmp(cg, LLVMRealUNO, whole, whole), whole, y);
    helper_end(cg, y, &s);
    return f;
}

LLVMValueRef cg_exp(Cg *cg, LLVMValueRef x) {
    bool wide = LLVMTypeOf(x) == cg->f64;
    int id = wide ? M_EXP64 : M_EXP32;
    if (!cg->math[id])
        cg->math[id] = make_exp(cg, wide, false);
    return call1(cg, cg->math[id], x);
}

/* exp(x + b), x exact and b small beside it */
static LLVMValueRef exp_sum(Cg *cg, LLVMValueRef x, LLVMValueRef b) {
    bool wide = LLVMTypeOf(x) == cg->f64;
    int id = wide ? M_EXP_SUM64 : M_EXP_SUM32;
    if (!cg->math[id])
        cg->math[id] = make_exp(cg, wide, true);
    LLVMTypeRef t = LLVMTypeOf(x);
    LLVMTypeRef params[] = {t, t};
    LLVMValueRef args[] = {x, b};
    return LLVMBuildCall2(cg->b, LLVMFunctionType(t, params, 2, 0), cg->math[id], args, 2, "");
}

/* ---------------------------------------------------------------------- log */

static LLVMValueRef make_log(Cg *cg, bool wide) {
    LLVMTypeRef t = wide ? cg->f64 : cg->f32, it = wide ? cg->i64 : cg->i32;
    Saved s;
    LLVMValueRef f = helper_begin(cg, wide ? "ddp_log_f64" : "ddp_log_f32", t, &t, 1, &s);
    LLVMValueRef x = LLVMGetParam(f, 0);
    int mant = wide ? 52 : 23, bias = wide ? 1023 : 127;
    /* subnormals scaled up first */
    LLVMValueRef tiny = fcmp(cg, LLVMRealOLT, x, k(cg, t, wide ? 2.2250738585072014e-308 : 1.1754943508222875e-38));
    LLVMValueRef xs = sel(cg, tiny, fmul(cg, x, k(cg, t, wide ? 18014398509481984.0 : 16777216.0)), x);
    LLVMValueRef adj = sel(cg, tiny, LLVMConstInt(it, (unsigned long long)(wide ? -54 : -24), 1),
                               LLVMConstInt(it, 0, 0));
    LLVMValueRef bits = LLVMBuildBitCast(cg->b, xs, it, "");
    LLVMValueRef e = LLVMBuildSub(cg->b, LLVMBuildLShr(cg->b, bits, LLVMConstInt(it, (unsigned)mant, 0), ""),
                                  LLVMConstInt(it, (unsigned)bias, 0), "");
    e = LLVMBuildAdd(cg->b, e, adj, "");
    unsigned long long mask = wide ? 0x000fffffffffffffull : 0x007fffffull;
    unsigned long long one = wide ? 0x3ff0000000000000ull : 0x3f800000ull;
    LLVMValueRef mbits = LLVMBuildOr(cg->b, LLVMBuildAnd(cg->b, bits, LLVMConstInt(it, mask, 0), ""),
                                     LLVMConstInt(it, one, 0), "");
    LLVMValueRef m = LLVMBuildBitCast(cg->b, mbits, t, "");
    LLVMValueRef big = fcmp(cg, LLVMRealOGT, m, k(cg, t, 1.4142135623730951));
    m = sel(cg, big, fmul(cg, m, k(cg, t, 0.5)), m);
    e = LLVMBuildAdd(cg->b, e, LLVMBuildZExt(cg->b, big, it, ""), "");
    LLVMValueRef ef = LLVMBuildSIToFP(cg->b, e, t, "");
    LLVMValueRef sv = fdiv(cg, fsub(cg, m, k(cg, t, 1)), fadd(cg, m, k(cg, t, 1)));
    LLVMValueRef z = fmul(cg, sv, sv);
    double c[12];
    int n = wide ? 11 : 6;
    for (int i = 0; i < n; i++)
        c[i] = 1.0 / (2 * i + 1);
    LLVMValueRef logm = fmul(cg, fmul(cg, k(cg, t, 2), sv), polynomial(cg, z, c, n));
    double ln2_hi = wide ? 6.93147180369123816490e-01 : 0.693145751953125;
    double ln2_lo = wide ? 1.90821492927058770002e-10 : 1.428606765330187045e-06;
    LLVMValueRef y = fadd(cg, fmul(cg, ef, k(cg, t, ln2_hi)), fadd(cg, logm, fmul(cg, ef, k(cg, t, ln2_lo))));
    y = sel(cg, fcmp(cg, LLVMRealOEQ, x, k(cg, t, 0)), k(cg, t, -INFINITY), y);
    y = sel(cg, fcmp(cg, LLVMRealOEQ, x, k(cg, t, INFINITY)), x, y);
    y = sel(cg, fcmp(cg, LLVMRealULT, x, k(cg, t, 0)), k(cg, t, NAN), y);
    helper_end(cg, y, &s);
    return f;
}

LLVMValueRef cg_log(Cg *cg, LLVMValueRef x) {
    bool wide = LLVMTypeOf(x) == cg->f64;
    int id = wide ? M_LOG64 : M_LOG32;
    if (!cg->math[id])
        cg->math[id] = make_log(cg, wide);
    return call1(cg, cg->math[id], x);
}

/* ------------------------------------------------------------ expm1, log1p */

/* exp(x) - 1 = (u - 1) x / log(u), u = exp(x): the rounding of u cancels out (Kahan);
 * x itself where u rounds to 1, -1 where u - 1 does, u where it is infinite. */
LLVMValueRef cg_expm1(Cg *cg, LLVMValueRef x) {
    LLVMTypeRef t = LLVMTypeOf(x);
    LLVMValueRef u = cg_exp(cg, x), um1 = fsub(cg, u, k(cg, t, 1));
    LLVMValueRef y = fdiv(cg, fmul(cg, um1, x), cg_log(cg, u));
    y = sel(cg, fcmp(cg, LLVMRealOEQ, um1, k(cg, t, -1)), um1, y);
    y = sel(cg, fcmp(cg, LLVMRealOEQ, u, k(cg, t, INFINITY)), u, y);
    return sel(cg, fcmp(cg, LLVMRealOEQ, u, k(cg, t, 1)), x, y);
}

/* log(1 + x) = log(u) x / (u - 1), u = 1 + x rounded (Goldberg); x where u is 1, u
 * where it is infinite. */
LLVMValueRef cg_log1p(Cg *cg, LLVMValueRef x) {
    LLVMTypeRef t = LLVMTypeOf(x);
    LLVMValueRef u = fadd(cg, k(cg, t, 1), x);
    LLVMValueRef y = fmul(cg, cg_log(cg, u), fdiv(cg, x, fsub(cg, u, k(cg, t, 1))));
    y = sel(cg, fcmp(cg, LLVMRealOEQ, u, k(cg, t, INFINITY)), u, y);
    return sel(cg, fcmp(cg, LLVMRealOEQ, u, k(cg, t, 1)), x, y);
}

/* --------------------------------------------------------------------- tanh */

static LLVMValueRef make_tanh(Cg *cg, bool wide) {
    LLVMTypeRef t = wide ? cg->f64 : cg->f32;
    Saved s;
    LLVMValueRef f = helper_begin(cg, wide ? "ddp_tanh_f64" : "ddp_tanh_f32", t, &t, 1, &s);
    LLVMValueRef x = LLVMGetParam(f, 0);
    LLVMValueRef a = fabs_(cg, x);
    LLVMValueRef y2 = fmul(cg, a, k(cg, t, 2));
    /* expm1(2a) for 2a <= 1.1: its Taylor series without the leading 1 */
    double c[20];
    int n = wide ? 18 : 10;
    c[0] = 1;
    for (int i = 1; i < n; i++)
        c[i] = c[i - 1] / (i + 1);
    LLVMValueRef em1 = fmul(cg, y2, polynomial(cg, y2, c, n));
    LLVMValueRef small = fdiv(cg, em1, fadd(cg, em1, k(cg, t, 2)));
    LLVMValueRef e = cg_exp(cg, y2);
    LLVMValueRef large = fsub(cg, k(cg, t, 1), fdiv(cg, k(cg, t, 2), fadd(cg, e, k(cg, t, 1))));
    LLVMValueRef r = sel(cg, fcmp(cg, LLVMRealOGE, a, k(cg, t, 0.55)), large, small);
    r = sel(cg, fcmp(cg, LLVMRealOGT, a, k(cg, t, wide ? 19.1 : 9.1)), k(cg, t, 1), r);
    r = sel(cg, fcmp(cg, LLVMRealUNO, x, x), x, copysign_(cg, r, x));
    helper_end(cg, r, &s);
    return f;
}

LLVMValueRef cg_tanh(Cg *cg, LLVMValueRef x) {
    bool wide = LLVMTypeOf(x) == cg->f64;
    int id = wide ? M_TANH64 : M_TANH32;
    if (!cg->math[id])
        cg->math[id] = make_tanh(cg, wide);
    return call1(cg, cg->math[id], x);
}

/* ---------------------------------------------------------------------- erf */

static LLVMValueRef make_erf64(Cg *cg) {
    LLVMTypeRef t = cg->f64;
    Saved s;
    LLVMValueRef f = helper_begin(cg, "ddp_erf_f64", t, &t, 1, &s);
    LLVMValueRef x = LLVMGetParam(f, 0);
    LLVMValueRef a = fabs_(cg, x);
    LLVMValueRef a6 = sel(cg, fcmp(cg, LLVMRealOLT, a, k(cg, t, 6)), a, k(cg, t, 6));
    LLVMValueRef two_a2 = fmul(cg, k(cg, t, 2), fmul(cg, a6, a6));
    LLVMValueRef term = cg_var(cg, t, a6, "term");
    LLVMValueRef sum = cg_var(cg, t, a6, "sum");
    Loop l = cg_loop_begin(cg, cg_i64(cg, 1), cg_i64(cg, 300), "n");
    {
        LLVMValueRef n = LLVMBuildSIToFP(cg->b, cg_loop_index(cg, &l), t, "");
        LLVMValueRef tv = fmul(cg, LLVMBuildLoad2(cg->b, t, term, ""),
                               fdiv(cg, two_a2, fadd(cg, fmul(cg, n, k(cg, t, 2)), k(cg, t, 1))));
        LLVMBuildStore(cg->b, tv, term);
        LLVMValueRef sv = fadd(cg, LLVMBuildLoad2(cg->b, t, sum, ""), tv);
        LLVMBuildStore(cg->b, sv, sum);
        /* done once a term no longer changes the sum */
        LLVMBasicBlockRef more = LLVMAppendBasicBlockInContext(cg->ctx, cg->fn, "more");
        LLVMValueRef done = fcmp(cg, LLVMRealOLE, tv, fmul(cg, sv, k(cg, t, 1e-17)));
        LLVMBuildCondBr(cg->b, done, l.exit, more);
        LLVMPositionBuilderAtEnd(cg->b, more);
    }
    cg_loop_end(cg, &l);
    LLVMValueRef r = fmul(cg, fmul(cg, LLVMBuildLoad2(cg->b, t, sum, ""),
                                   cg_exp(cg, LLVMBuildFNeg(cg->b, fmul(cg, a6, a6), ""))),
                          k(cg, t, 1.1283791670955126));
    r = sel(cg, fcmp(cg, LLVMRealOGE, a, k(cg, t, 6)), k(cg, t, 1), r);
    r = sel(cg, fcmp(cg, LLVMRealUNO, x, x), x, copysign_(cg, r, x));
    helper_end(cg, r, &s);
    return f;
}

static LLVMValueRef erf64(Cg *cg, LLVMValueRef x) {
    if (!cg->math[M_ERF64])
        cg->math[M_ERF64] = make_erf64(cg);
    return call1(cg, cg->math[M_ERF64], x);
}

/* The Chebyshev fit of Numerical Recipes (section 6.2) to erfc(z) = t exp(-z^2 + c(t)),
 * t = 1 / (1 + |z| / 2), for z >= 0 (2 minus it below): within 1.2e-7 of erfc relative
 * to itself at every z, one exp and no loop. */
static const double erfc_fit[] = {-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                                  0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277};

/* Phi(x) = erfc(-x / sqrt 2) / 2 for x of either width: (1 + erf) would cancel to a
 * few bits in f32 where erf is near -1 (gelu below -4), erfc keeps its relative
 * precision in the tail. For f64, the series. For f32, the fit in f32 itself (eight
 * lanes where AVX2 holds four doubles): the one term that f32 cannot carry is z^2 =
 * x^2 / 2, up to 98 where an error of half its last place, 4e-6, would move the result
 * by as much, so x^2 is split exactly into hi + lo (lo by a fused multiply-add) and
 * one exp takes -hi and c(t) - lo unsummed (exp_sum): within 7 of f32's steps of the
 * exact gelu wherever it is a normal number (tests/train/activations.py holds it to
 * 2e-6 relative). Phi is taken as 0 below -14 (where it is at most 5 of f32's least
 * subnormals, 1.4e-45) and as 1 above 14 (f32's rounding of it). Where a CPU has no
 * fused multiply-add (the baseline x86-64 code) it is libm's fmaf, as exact. */
LLVMValueRef cg_normal_cdf(Cg *cg, LLVMValueRef x) {
    if (LLVMTypeOf(x) == cg->f64) {
        LLVMValueRef e = erf64(cg, fmul(cg, x, k(cg, cg->f64, 0.7071067811865476)));
        return fmul(cg, fadd(cg, k(cg, cg->f64, 1), e), k(cg, cg->f64, 0.5));
    }
    LLVMTypeRef t = cg->f32;
    LLVMValueRef xc = sel(cg, fcmp(cg, LLVMRealOLT, x, k(cg, t, -14)), k(cg, t, -14), x);
    xc = sel(cg, fcmp(cg, LLVMRealOGT, xc, k(cg, t, 14)), k(cg, t, 14), xc);
    LLVMValueRef tt = fdiv(cg, k(cg, t, 1), fadd(cg, k(cg, t, 1), fmul(cg, fabs_(cg, xc), k(cg, t, 0.35355339059327373))));
    LLVMValueRef square = fmul(cg, xc, xc);
    LLVMValueRef hi = fmul(cg, square, k(cg, t, 0.5));
    LLVMValueRef lo = fmul(cg, fma_(cg, xc, xc, LLVMBuildFNeg(cg->b, square, "")), k(cg, t, 0.5));
    LLVMValueRef fit = fsub(cg, polynomial(cg, tt, erfc_fit, 10), lo);
    LLVMValueRef tail = fmul(cg, tt, exp_sum(cg, LLVMBuildFNeg(cg->b, hi, ""), fit));
    LLVMValueRef erfc = sel(cg, fcmp(cg, LLVMRealOLE, xc, k(cg, t, 0)), tail, fsub(cg, k(cg, t, 2), tail));
    LLVMValueRef phi = fmul(cg, erfc, k(cg, t, 0.5));
    return sel(cg, fcmp(cg, LLVMRealOLT, x, k(cg, t, -14)), k(cg, t, 0), phi);
}

/* ------------------------------------------------------------------- philox */

static LLVMValueRef mul_hi_lo(Cg *cg, uint32_t m, LLVMValueRef x, LLVMValueRef *lo) {
    LLVMValueRef p = LLVMBuildMul(cg->b, LLVMBuildZExt(cg->b, x, cg->i64, ""),
                                  LLVMConstInt(cg->i64, m, 0), "");
    *lo = LLVMBuildTrunc(cg->b, p, cg->i32, "");
    return LLVMBuildTrunc(cg->b, LLVMBuildLShr(cg->b, p, LLVMConstInt(cg->i64, 32, 0), ""), cg->i32, "");
}

/* Emitted where it is used: a loop of draws vectorises (a dropout mask's groups, on a
 * CPU's row, several draws at a time). */
void cg_philox(Cg *cg, const LLVMValueRef key[2], const LLVMValueRef counter[4], LLVMValueRef words[4]) {
    LLVMValueRef k0 = key[0], k1 = key[1];
    LLVMValueRef c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 = LLVMBuildAdd(cg->b, k0, LLVMConstInt(cg->i32, 0x9E3779B9u, 0), "");
            k1 = LLVMBuildAdd(cg->b, k1, LLVMConstInt(cg->i32, 0xBB67AE85u, 0), "");
        }
        LLVMValueRef lo0, lo1;
        LLVMValueRef hi0 = mul_hi_lo(cg, 0xD2511F53u, c0, &lo0);
        LLVMValueRef hi1 = mul_hi_lo(cg, 0xCD9E8D57u, c2, &lo1);
        LLVMValueRef n0 = LLVMBuildXor(cg->b, LLVMBuildXor(cg->b, hi1, c1, ""), k0, "");
        LLVMValueRef n2 = LLVMBuildXor(cg->b, LLVMBuildXor(cg->b, hi0, c3, ""), k1, "");
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    words[0] = c0, words[1] = c1, words[2] = c2, words[3] = c3;
}
