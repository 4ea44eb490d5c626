/* dropout_mask.c: the generated dropout masks of the linked tests/unit/dropout.ddp
 * against the draws runtime/ddp_abi.h describes, worked out with the runtime's Philox
 * (ddp_philox4): element e of a sample is kept where word e % 4 of the draw with
 * counter {e / 4, sample, sample >> 32, step}, keyed by the seed and the layer
 * (DDP_STREAM_DROPOUT + key), is at least the rate times 2^32. Both CPU variants
 * (baseline and AVX2), over a batch whose sample ids cross 2^32, with a seed whose
 * high half is not 0, on a range that starts and ends inside samples; for both of the
 * model's layers: 13 elements a sample (the last draw's words partly unused, nothing
 * written past the range) and 64 (four bytes a store). A layer's key is the one its
 * first sample matches, and the two layers' keys differ. The share kept is within five
 * standard deviations of 1 - rate. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime.h"

enum { GUARD = 64, PATTERN = 0xa5, KEYS = 1 << 12 };

static const uint64_t SEED = 0x123456789abcdefull;
static const int64_t STEP = 7;

static uint64_t sample_id(int64_t b) {
    return 0xfffffff0ull + (uint64_t)b * 3; /* across 2^32 */
}

/* Whether ddp_abi.h's draw keeps element e of sample `sample` */
static bool kept(uint64_t key, uint64_t sample, int64_t e, double rate) {
    uint32_t k[2] = {(uint32_t)SEED, (uint32_t)(SEED >> 32) ^ (uint32_t)(DDP_STREAM_DROPOUT + key)};
    uint32_t ctr[4] = {(uint32_t)(e / 4), (uint32_t)sample, (uint32_t)(sample >> 32), (uint32_t)STEP}, w[4];
    ddp_philox4(k, ctr, w);
    return w[e % 4] >= (uint32_t)fmin(nearbyint(rate * 4294967296.0), 4294967295.0);
}

static bool sample_matches(const uint8_t *mask, int64_t per_sample, uint64_t key, double rate) {
    for (int64_t e = 0; e < per_sample; e++)
        if (mask[e] != kept(key, sample_id(0), e, rate))
            return false;
    return true;
}

/* The kernel of step s over samples [0, batch) (its whole range, as a step runs it) and
 * then again over indices [first, last) of a fresh mask; returns the layer's key. */
static int64_t check_layer(const ddp_program *p, const ddp_step *s, ddp_kernel_fn fn, const char *variant) {
    int64_t batch = p->settings.batch_per_replica, groups = s->range.per_sample;
    int mask_arg = -1, ids_arg = -1;
    for (int a = 0; a < s->nargs; a++) {
        int64_t dtype = p->buffers[s->args[a]].dtype;
        if (dtype == DDP_U8)
            mask_arg = a;
        else if (dtype == DDP_I64)
            ids_arg = a;
    }
    CHECK(s->nargs == 2 && mask_arg >= 0 && ids_arg >= 0);
    if (mask_arg < 0 || ids_arg < 0)
        return -1;
    int64_t per_sample = p->buffers[s->args[mask_arg]].bytes / batch;
    double rate = per_sample == 13 ? 0.25 : 0.5;
    CHECK(per_sample == 13 || per_sample == 64);
    CHECK(groups == (per_sample + 3) / 4);
    int before = failures;
    uint8_t *mask = malloc((size_t)(batch * per_sample + GUARD));
    uint64_t *ids = malloc(sizeof *ids * (size_t)batch);
    for (int64_t b = 0; b < batch; b++)
        ids[b] = sample_id(b);
    void *args[2];
    args[mask_arg] = mask;
    args[ids_arg] = ids;
    ddp_scalar scalars[DDP_S_COUNT];
    memset(scalars, 0, sizeof scalars);
    scalars[DDP_S_SEED].i = (int64_t)SEED;
    scalars[DDP_S_STEP].i = STEP;
    scalars[DDP_S_LOCAL_BATCH].i = batch;

    memset(mask, PATTERN, (size_t)(batch * per_sample + GUARD));
    fn(args, scalars, 0, groups * batch);
    int64_t key = -1;
    for (int64_t k = 0; k < KEYS && key < 0; k++)
        if (sample_matches(mask, per_sample, (uint64_t)k, rate))
            key = k;
    CHECK(key >= 0);
    int64_t wrong = 0, kept_count = 0;
    for (int64_t b = 0; b < batch && key >= 0; b++)
        for (int64_t e = 0; e < per_sample; e++) {
            uint8_t m = mask[b * per_sample + e];
            wrong += m != kept((uint64_t)key, sample_id(b), e, rate);
            kept_count += m == 1;
        }
    CHECK(wrong == 0);
    for (int g = 0; g < GUARD; g++)
        CHECK(mask[batch * per_sample + g] == PATTERN);
    double n = (double)(batch * per_sample), share = (double)kept_count / n;
    CHECK(fabs(share - (1 - rate)) <= 5 * sqrt(rate * (1 - rate) / n));

    /* a range cut inside samples, as the pool's threads cut it: the same bytes there,
     * none outside */
    uint8_t *part = malloc((size_t)(batch * per_sample + GUARD));
    memset(part, PATTERN, (size_t)(batch * per_sample + GUARD));
    args[mask_arg] = part;
    int64_t first = groups + 1, last = groups * (batch - 1) - 2;
    fn(args, scalars, first, last);
    for (int64_t i = 0; i < batch * per_sample; i++) {
        int64_t group = i / per_sample * groups + i % per_sample / 4; /* the index that draws element i */
        bool inside = group >= first && group < last;
        CHECK(inside ? part[i] == mask[i] : part[i] == PATTERN);
    }
    if (key < 0)
        printf("FAIL the %s kernels' mask of %lld elements a sample, rate %g: no layer key gives its first sample\n",
               variant, (long long)per_sample, rate);
    else
        printf("%s the %s kernels' mask of %lld elements a sample, rate %g (key %lld): %lld of %lld bytes not "
               "ddp_abi.h's, %.4f kept\n",
               failures > before ? "FAIL" : "ok  ", variant, (long long)per_sample, rate, (long long)key,
               (long long)wrong, (long long)(batch * per_sample), share);
    free(part);
    free(mask);
    free(ids);
    return key;
}

int main(void) {
    const ddp_program *p = &ddp_program_desc;
    const ddp_phase *ph = &p->phases[DDP_PHASE_FORWARD];
    const ddp_kernel_fn *variants[2] = {p->cpu_baseline, p->cpu_wide};
    const char *names[2] = {"baseline", "AVX2"};
    for (int v = 0; v < 2; v++) {
        if (v == 1 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
            printf("ok   (the AVX2 kernels are not run: this CPU lacks AVX2)\n");
            continue;
        }
        int64_t keys[2], layers = 0;
        for (int64_t i = 0; i < ph->count; i++) {
            const ddp_step *s = &ph->steps[i];
            if (s->kind == DDP_STEP_KERNEL && strstr(p->kernels[s->index].name, "_dropout_mask") && layers < 2)
                keys[layers++] = check_layer(p, s, variants[v][s->index], names[v]);
        }
        CHECK(layers == 2);
        CHECK(layers < 2 || keys[0] != keys[1]);
    }
    return failures ? 1 : 0;
}
