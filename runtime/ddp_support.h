/* ddp_support.h: what this version of the runtime can honour, in one table read by
 * both sides: `ddpc check` and `ddpc build` warn at the setting that asks for
 * something missing here, and a built program refuses it when it starts (status 1),
 * so the two never disagree. Both read the features a program asks for from the same
 * structure, the contract's ddp_settings (the compiler's typed configuration, the
 * runtime's copy of it), with ddp_features_asked; the table says which of them work
 * and what to do instead. Work that adds a feature flips its `supported`. */
#ifndef DDP_SUPPORT_H
#define DDP_SUPPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "ddp_abi.h"

enum ddp_feature {
    DDP_FEATURE_BF16,            /* precision = bf16 */
    DDP_FEATURE_FP16,            /* precision = fp16 */
    DDP_FEATURE_NCCL,            /* communication = nccl */
    DDP_FEATURE_GPUS_PER_WORKER, /* gpus_per_worker > 1 */
    DDP_FEATURE_CHECKPOINT,      /* checkpoint(...) */
    DDP_FEATURE_COUNT
};

typedef struct ddp_feature_support {
    const char *setting;         /* the setting that asks for it */
    bool supported;
    const char *refusal;         /* why not, and what to do instead */
} ddp_feature_support;

static const ddp_feature_support ddp_features[DDP_FEATURE_COUNT] = {
    [DDP_FEATURE_BF16] = {"precision", true, "precision = bf16 is not supported by this runtime"},
    [DDP_FEATURE_FP16] = {"precision", false,
                          "precision = fp16 is not in this version of the runtime (fp32, tf32 and bf16 are): set "
                          "precision = bf16 on a GPU, which needs no loss scaling, or fp32"},
    [DDP_FEATURE_NCCL] = {"communication", true, "communication = nccl is not supported by this runtime"},
    [DDP_FEATURE_GPUS_PER_WORKER] = {"gpus_per_worker", true, "gpus_per_worker > 1 is not supported by this runtime"},
    [DDP_FEATURE_CHECKPOINT] = {"checkpoint", true, "checkpoint(...) is not supported by this runtime"},
};

/* Which features the settings ask for. */
static inline void ddp_features_asked(const ddp_settings *s, bool asked[DDP_FEATURE_COUNT]) {
    asked[DDP_FEATURE_BF16] = s->precision == DDP_PRECISION_BF16;
    asked[DDP_FEATURE_FP16] = s->precision == DDP_PRECISION_FP16;
    asked[DDP_FEATURE_NCCL] = s->communication == DDP_COMM_NCCL;
    asked[DDP_FEATURE_GPUS_PER_WORKER] = s->gpus_per_worker > 1;
    asked[DDP_FEATURE_CHECKPOINT] = s->checkpoint_dir != NULL;
}

#endif
