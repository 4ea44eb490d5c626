/* contract.h: the contract's structures (runtime/ddp_abi.h) described field by field,
 * made from the same lists as their C definitions, so that program.c emits any of
 * them from a C instance in the order the runtime reads it. */
#ifndef DDP_CONTRACT_H
#define DDP_CONTRACT_H

#include "../runtime/ddp_abi.h"

typedef enum {
    FIELD_I64, FIELD_U64, FIELD_F64, FIELD_STR, /* one value */
    FIELD_I64S, FIELD_STRS,                     /* a fixed array of n */
    FIELD_SUB, FIELD_SUBS,                      /* one or n structures inside */
    FIELD_REFS, FIELD_I64REFS, FIELD_STRREFS,   /* a pointer to count elements */
    FIELD_FNS,                                  /* the kernels' functions, baseline or wide */
} FieldKind;

typedef struct ContractType ContractType;

typedef struct ContractField {
    const char *name;
    FieldKind kind;
    size_t offset;
    int n;                     /* arrays: their length; FIELD_FNS: 1 for the wide variant */
    const ContractType *type;  /* structures: theirs */
    size_t count_offset;       /* pointers: where the element count is */
} ContractField;

struct ContractType {
    const char *name;
    size_t size;
    const ContractField *fields;
    int nfields;
};

#define CONTRACT_TYPES(X)                                                                                    \
    X(ddp_dim) X(ddp_kernel) X(ddp_buffer) X(ddp_step) X(ddp_gemm) X(ddp_conv) X(ddp_phase) X(ddp_bucket) X(ddp_param)   \
    X(ddp_rt_instr) X(ddp_rt_expr) X(ddp_duration) X(ddp_schedule) X(ddp_optimizer) X(ddp_metric)            \
    X(ddp_augment) X(ddp_channel) X(ddp_dataset) X(ddp_settings) X(ddp_program)
#define CONTRACT_EXTERN(T) extern const ContractType contract_##T;
CONTRACT_TYPES(CONTRACT_EXTERN)
#undef CONTRACT_EXTERN

#endif
