/* fake_cudnn.c: a stand-in for cuDNN 9 (libcudnn.so.9) for tests/unit/cudnn.c, built
 * on cuDNN's own header, so runtime/cudnn.c's copied values are checked against it.
 * It serves the part of the backend graph API that runtime/cudnn.c uses and holds each
 * descriptor to what cuDNN documents: an attribute set on the wrong descriptor, with
 * the wrong type or count, a descriptor referred to before it is finalized, a required
 * attribute missing at finalize, or attributes that disagree (the output's size against
 * what the padding, strides and dilations give; the filters' channels against the
 * image's) return CUDNN_STATUS_BAD_PARAM, with the reason in cudnnGetLastErrorString.
 *
 * Tensors are f32, f64 or bf16; the compute type is the data's, f32 for bf16; alpha
 * and beta are double for f64 and float otherwise. Its engines, numbered as cuDNN
 * numbers them:
 *   0 nondeterministic;  1 tensor cores, f32 and bf16 (f32 factors read as TF32);
 *   2 needs 64 MiB of workspace;  3 needs 4 KiB, with two knobs;  4 needs none;
 *   5 sums in reduced precision, bf16 only.
 * The heuristics offer them in the order 0, 5, 1, 2, 3, 4, so that a bf16 convolution
 * meets the reduced-precision engine before the tensor-core one; enumerating every
 * engine goes by number. Execute runs ddp_conv_reference, taken from the program that
 * loaded the stand-in, on the variant pack's pointers: the test gives host memory as
 * device addresses, and nothing here touches CUDA. Failures on purpose:
 * FAKE_CUDNN_VERSION (the version it reports; 91900 unless set), FAKE_CUDNN_ENGINES (the
 * engines offered, by name, comma-separated: nondeterministic, tensor_cores,
 * large_workspace, small_workspace, no_workspace, reduced_precision),
 * FAKE_CUDNN_HEURISTICS=none (the heuristics offer nothing). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn_graph.h>

#include "conv.h"

enum { MAGIC = 0x66616b65, MAX_ATTRIBUTES = 12, MAX_OWNED = 4, ENGINES = 6 };

/* ------------------------------------------------------------------ engines */

/* The data types an engine runs, a bit each. */
enum { RUNS_F32 = 1, RUNS_F64 = 2, RUNS_BF16 = 4, RUNS_ALL = 7 };

typedef struct Engine {
    const char *name;
    cudnnBackendNumericalNote_t note; /* its one note, or CUDNN_NUMERICAL_NOTE_TYPE_COUNT for none */
    int64_t workspace;
    unsigned runs;
    int nknobs;
    cudnnBackendKnobType_t knob_types[2];
    int64_t knob_values[2];
} Engine;

static const Engine engines[ENGINES] = {
    {"nondeterministic", CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC, 0, RUNS_ALL, 0, {0}, {0}},
    {"tensor_cores", CUDNN_NUMERICAL_NOTE_TENSOR_CORE, 0, RUNS_F32 | RUNS_BF16, 0, {0}, {0}},
    {"large_workspace", CUDNN_NUMERICAL_NOTE_TYPE_COUNT, 64 << 20, RUNS_ALL, 0, {0}, {0}},
    {"small_workspace", CUDNN_NUMERICAL_NOTE_TYPE_COUNT, 4096, RUNS_ALL, 2,
     {CUDNN_KNOB_TYPE_TILE_SIZE, CUDNN_KNOB_TYPE_STAGES}, {2, 3}},
    {"no_workspace", CUDNN_NUMERICAL_NOTE_TYPE_COUNT, 0, RUNS_ALL, 0, {0}, {0}},
    {"reduced_precision", CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION, 0, RUNS_BF16, 0, {0}, {0}},
};

/* The heuristics' ranking: the reduced-precision engine right after the first. */
static const int heuristic_order[ENGINES] = {0, 5, 1, 2, 3, 4};

static bool offered(int engine) {
    const char *list = getenv("FAKE_CUDNN_ENGINES");
    size_t n = strlen(engines[engine].name);
    if (!list)
        return true;
    for (const char *at = list; *at; at += strcspn(at, ",") + (at[strcspn(at, ",")] != 0))
        if (strcspn(at, ",") == n && strncmp(at, engines[engine].name, n) == 0)
            return true;
    return false;
}

/* ----------------------------------------------------------- errors, handles */

static __thread char last_error[1024];

static cudnnStatus_t refuse(cudnnStatus_t status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cudnnStatus_t refuse(cudnnStatus_t status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

void cudnnGetLastErrorString(char *message, size_t max_size) {
    snprintf(message, max_size, "%s", last_error);
    last_error[0] = 0;
}

const char *cudnnGetErrorString(cudnnStatus_t status) {
    switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER: return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
    case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN: return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE: return "CUDNN_STATUS_NOT_SUPPORTED_SHAPE";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return "CUDNN_STATUS_INTERNAL_ERROR";
    }
}

size_t cudnnGetVersion(void) {
    const char *v = getenv("FAKE_CUDNN_VERSION");
    return v ? (size_t)strtoul(v, NULL, 10) : 91900;
}

struct cudnnContext {
    unsigned magic;
    cudaStream_t stream;
};

static bool valid_handle(cudnnHandle_t h) {
    return h && h->magic == MAGIC;
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle) {
    if (!handle)
        return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnCreate: no place for the handle");
    if (!(*handle = calloc(1, sizeof **handle)))
        return refuse(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "cudnnCreate: out of memory");
    (*handle)->magic = MAGIC;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
    if (!valid_handle(handle))
        return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnDestroy: not a handle");
    handle->magic = 0;
    free(handle);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
    if (!valid_handle(handle))
        return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: not a handle");
    handle->stream = stream;
    return CUDNN_STATUS_SUCCESS;
}

/* -------------------------------------------------------------- descriptors */

typedef struct Attribute {
    cudnnBackendAttributeName_t name;
    cudnnBackendAttributeType_t type;
    int64_t count;
    void *values;
} Attribute;

typedef struct Descriptor Descriptor;
struct Descriptor {
    unsigned magic;
    cudnnBackendDescriptorType_t type;
    bool finalized;
    Attribute attributes[MAX_ATTRIBUTES];
    int nattributes;
    Descriptor *owned[MAX_OWNED]; /* made here for it: a heuristic configuration's engine and knobs */
    int nowned;
    /* what finalizing found */
    ddp_device_conv conv;         /* an operation's, graph's, plan's */
    int64_t uids[3], alignment[3];  /* x, filters, y */
    int engine;                   /* an engine's, configuration's, plan's */
};

/* What a descriptor type accepts: each attribute, its types (a bit each), its count. */
typedef struct Rule {
    cudnnBackendAttributeName_t name;
    const char *label;
    unsigned types;
    int64_t min, max;
    bool required;
    int kind; /* what a descriptor it holds must be: a descriptor type, ANY_OPERATION, or NOT_A_DESCRIPTOR */
} Rule;

enum { NOT_A_DESCRIPTOR = -1, ANY_OPERATION = -2 };
#define ONE(type) (1u << (type))
#define RULE(name, types, min, max, required) {name, #name, types, min, max, required, NOT_A_DESCRIPTOR}
#define HOLDS(name, min, max, required, kind) {name, #name, ONE(CUDNN_TYPE_BACKEND_DESCRIPTOR), min, max, required, kind}
/* The operation rules in one order: alpha, beta, convolution, filters, image, output. */
#define OPERATION_RULES(OP, W, X, Y)                                                                         \
    RULE(CUDNN_ATTR_OPERATION_CONVOLUTION_##OP##_ALPHA, ONE(CUDNN_TYPE_FLOAT) | ONE(CUDNN_TYPE_DOUBLE), 1, 1, true), \
    RULE(CUDNN_ATTR_OPERATION_CONVOLUTION_##OP##_BETA, ONE(CUDNN_TYPE_FLOAT) | ONE(CUDNN_TYPE_DOUBLE), 1, 1, true), \
    HOLDS(CUDNN_ATTR_OPERATION_CONVOLUTION_##OP##_CONV_DESC, 1, 1, true, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR),    \
    HOLDS(CUDNN_ATTR_OPERATION_CONVOLUTION_##OP##_##W, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR),               \
    HOLDS(CUDNN_ATTR_OPERATION_CONVOLUTION_##OP##_##X, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR),               \
    HOLDS(CUDNN_ATTR_OPERATION_CONVOLUTION_##OP##_##Y, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR)
enum { RULE_ALPHA, RULE_BETA, RULE_CONV, RULE_W, RULE_X, RULE_Y };

static const Rule tensor_rules[] = {
    RULE(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, ONE(CUDNN_TYPE_INT64), 1, 1, true),
    RULE(CUDNN_ATTR_TENSOR_DATA_TYPE, ONE(CUDNN_TYPE_DATA_TYPE), 1, 1, true),
    RULE(CUDNN_ATTR_TENSOR_DIMENSIONS, ONE(CUDNN_TYPE_INT64), 1, CUDNN_DIM_MAX, true),
    RULE(CUDNN_ATTR_TENSOR_STRIDES, ONE(CUDNN_TYPE_INT64), 1, CUDNN_DIM_MAX, true),
    RULE(CUDNN_ATTR_TENSOR_UNIQUE_ID, ONE(CUDNN_TYPE_INT64), 1, 1, true),
    RULE(CUDNN_ATTR_TENSOR_IS_VIRTUAL, ONE(CUDNN_TYPE_BOOLEAN), 1, 1, false),
    RULE(CUDNN_ATTR_TENSOR_IS_BY_VALUE, ONE(CUDNN_TYPE_BOOLEAN), 1, 1, false),
};
static const Rule convolution_rules[] = {
    RULE(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, ONE(CUDNN_TYPE_DATA_TYPE), 1, 1, true),
    RULE(CUDNN_ATTR_CONVOLUTION_CONV_MODE, ONE(CUDNN_TYPE_CONVOLUTION_MODE), 1, 1, true),
    RULE(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, ONE(CUDNN_TYPE_INT64), 1, 1, true),
    RULE(CUDNN_ATTR_CONVOLUTION_DILATIONS, ONE(CUDNN_TYPE_INT64), 1, CUDNN_DIM_MAX, true),
    RULE(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, ONE(CUDNN_TYPE_INT64), 1, CUDNN_DIM_MAX, true),
    RULE(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, ONE(CUDNN_TYPE_INT64), 1, CUDNN_DIM_MAX, true),
    RULE(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, ONE(CUDNN_TYPE_INT64), 1, CUDNN_DIM_MAX, true),
};
static const Rule forward_rules[] = {OPERATION_RULES(FORWARD, W, X, Y)};
static const Rule backward_data_rules[] = {OPERATION_RULES(BWD_DATA, W, DX, DY)};
static const Rule backward_filter_rules[] = {OPERATION_RULES(BWD_FILTER, DW, X, DY)};
static const Rule graph_rules[] = {
    HOLDS(CUDNN_ATTR_OPERATIONGRAPH_OPS, 1, 64, true, ANY_OPERATION),
    RULE(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, ONE(CUDNN_TYPE_HANDLE), 1, 1, true),
};
static const Rule heuristics_rules[] = {
    HOLDS(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, 1, 1, true, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR),
    RULE(CUDNN_ATTR_ENGINEHEUR_MODE, ONE(CUDNN_TYPE_HEUR_MODE), 1, 1, true),
    RULE(CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET, ONE(CUDNN_TYPE_INT32), 1, 1, false),
};
static const Rule engine_rules[] = {
    HOLDS(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, 1, 1, true, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR),
    RULE(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, ONE(CUDNN_TYPE_INT64), 1, 1, true),
};
static const Rule config_rules[] = {
    HOLDS(CUDNN_ATTR_ENGINECFG_ENGINE, 1, 1, true, CUDNN_BACKEND_ENGINE_DESCRIPTOR),
    HOLDS(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, 0, CUDNN_KNOB_TYPE_COUNTS, false, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR),
};
static const Rule knob_rules[] = {
    RULE(CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, ONE(CUDNN_TYPE_KNOB_TYPE), 1, 1, true),
    RULE(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, ONE(CUDNN_TYPE_INT64), 1, 1, true),
};
static const Rule plan_rules[] = {
    RULE(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, ONE(CUDNN_TYPE_HANDLE), 1, 1, true),
    HOLDS(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, 1, 1, true, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR),
};
static const Rule pack_rules[] = {
    RULE(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, ONE(CUDNN_TYPE_INT64), 1, 64, true),
    RULE(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, ONE(CUDNN_TYPE_VOID_PTR), 1, 64, true),
    RULE(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, ONE(CUDNN_TYPE_VOID_PTR), 1, 1, true),
    RULE(CUDNN_ATTR_VARIANT_PACK_INTERMEDIATES, ONE(CUDNN_TYPE_VOID_PTR), 0, 64, false),
};

static cudnnStatus_t finalize_tensor(Descriptor *d);
static cudnnStatus_t finalize_convolution(Descriptor *d);
static cudnnStatus_t finalize_operation(Descriptor *d);
static cudnnStatus_t finalize_graph(Descriptor *d);
static cudnnStatus_t finalize_heuristics(Descriptor *d);
static cudnnStatus_t finalize_engine(Descriptor *d);
static cudnnStatus_t finalize_config(Descriptor *d);
static cudnnStatus_t finalize_nothing_more(Descriptor *d);
static cudnnStatus_t finalize_plan(Descriptor *d);
static cudnnStatus_t finalize_pack(Descriptor *d);

typedef struct Kind {
    cudnnBackendDescriptorType_t type;
    const char *label;
    const Rule *rules;
    int nrules;
    cudnnStatus_t (*finalize)(Descriptor *d);
    int mode;                 /* an operation's ddp_conv_mode */
} Kind;

#define KIND(type, rules, finalize, mode) {type, #type, rules, sizeof rules / sizeof *rules, finalize, mode}
static const Kind kinds[] = {
    KIND(CUDNN_BACKEND_TENSOR_DESCRIPTOR, tensor_rules, finalize_tensor, -1),
    KIND(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, convolution_rules, finalize_convolution, -1),
    KIND(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, forward_rules, finalize_operation,
         DDP_CONV_FORWARD),
    KIND(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, backward_data_rules, finalize_operation,
         DDP_CONV_BACKWARD_DATA),
    KIND(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, backward_filter_rules, finalize_operation,
         DDP_CONV_BACKWARD_FILTER),
    KIND(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, graph_rules, finalize_graph, -1),
    KIND(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, heuristics_rules, finalize_heuristics, -1),
    KIND(CUDNN_BACKEND_ENGINE_DESCRIPTOR, engine_rules, finalize_engine, -1),
    KIND(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, config_rules, finalize_config, -1),
    KIND(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, knob_rules, finalize_nothing_more, -1),
    KIND(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, plan_rules, finalize_plan, -1),
    KIND(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, pack_rules, finalize_pack, -1),
};

static const Kind *kind_of(cudnnBackendDescriptorType_t type) {
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
        if (kinds[i].type == type)
            return &kinds[i];
    return NULL;
}

static const Rule *rule_of(const Kind *k, cudnnBackendAttributeName_t name) {
    for (int i = 0; i < k->nrules; i++)
        if (k->rules[i].name == name)
            return &k->rules[i];
    return NULL;
}

static size_t element_size(cudnnBackendAttributeType_t type) {
    switch (type) {
    case CUDNN_TYPE_HANDLE: return sizeof(cudnnHandle_t);
    case CUDNN_TYPE_DATA_TYPE: return sizeof(cudnnDataType_t);
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_INT64: return sizeof(int64_t);
    case CUDNN_TYPE_FLOAT: return sizeof(float);
    case CUDNN_TYPE_DOUBLE: return sizeof(double);
    case CUDNN_TYPE_VOID_PTR: return sizeof(void *);
    case CUDNN_TYPE_CONVOLUTION_MODE: return sizeof(cudnnConvolutionMode_t);
    case CUDNN_TYPE_HEUR_MODE: return sizeof(cudnnBackendHeurMode_t);
    case CUDNN_TYPE_KNOB_TYPE: return sizeof(cudnnBackendKnobType_t);
    case CUDNN_TYPE_NUMERICAL_NOTE: return sizeof(cudnnBackendNumericalNote_t);
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(cudnnBackendDescriptor_t);
    case CUDNN_TYPE_INT32: return sizeof(int32_t);
    default: return 0;
    }
}

static bool valid(const Descriptor *d) {
    return d && d->magic == MAGIC;
}

static Attribute *find(Descriptor *d, cudnnBackendAttributeName_t name) {
    for (int i = 0; i < d->nattributes; i++)
        if (d->attributes[i].name == name)
            return &d->attributes[i];
    return NULL;
}

/* Values of attributes finalize has found present and of their type. */
static int64_t int64_at(Descriptor *d, cudnnBackendAttributeName_t name, int64_t i) {
    return ((int64_t *)find(d, name)->values)[i];
}

static int enum_of(Descriptor *d, cudnnBackendAttributeName_t name) {
    int v;
    memcpy(&v, find(d, name)->values, sizeof v);
    return v;
}

static Descriptor *held(Descriptor *d, cudnnBackendAttributeName_t name, int64_t i) {
    return ((Descriptor **)find(d, name)->values)[i];
}

static double scalar(Descriptor *d, cudnnBackendAttributeName_t name) {
    Attribute *a = find(d, name);
    return a->type == CUDNN_TYPE_DOUBLE ? *(double *)a->values : *(float *)a->values;
}

static cudnnStatus_t check_held(const Rule *rule, int64_t count, const void *values) {
    for (int64_t i = 0; i < count; i++) {
        Descriptor *h = ((Descriptor *const *)values)[i];
        const Kind *k = valid(h) ? kind_of(h->type) : NULL;
        if (!k)
            return refuse(CUDNN_STATUS_BAD_PARAM, "%s: element %lld is not a descriptor", rule->label, (long long)i);
        if (!h->finalized)
            return refuse(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "%s: the %s given is not finalized", rule->label,
                          k->label);
        bool fits = rule->kind == ANY_OPERATION ? k->mode >= 0 : (int)h->type == rule->kind;
        if (!fits)
            return refuse(CUDNN_STATUS_BAD_PARAM, "%s: a %s cannot go here", rule->label, k->label);
    }
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t *descriptor) {
    if (!descriptor)
        return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnBackendCreateDescriptor: no place for it");
    if (!kind_of(type))
        return refuse(CUDNN_STATUS_NOT_SUPPORTED, "descriptor type %d: the stand-in does not have it", (int)type);
    Descriptor *d = calloc(1, sizeof *d);
    if (!d)
        return refuse(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "out of memory");
    d->magic = MAGIC;
    d->type = type;
    *descriptor = d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
    Descriptor *d = descriptor;
    if (!valid(d))
        return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendDestroyDescriptor: not a descriptor");
    for (int i = 0; i < d->nattributes; i++)
        free(d->attributes[i].values);
    for (int i = 0; i < d->nowned; i++)
        cudnnBackendDestroyDescriptor(d->owned[i]);
    d->magic = 0;
    free(d);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count, const void *values) {
    Descriptor *d = descriptor;
    if (!valid(d))
        return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: not a descriptor");
    const Kind *k = kind_of(d->type);
    const Rule *rule = rule_of(k, name);
    if (d->finalized)
        return refuse(CUDNN_STATUS_BAD_PARAM, "%s: finalized, and no longer set", k->label);
    if (!rule)
        return refuse(CUDNN_STATUS_BAD_PARAM, "attribute %d is not one of a %s", (int)name, k->label);
    if (!(rule->types & ONE(type)))
        return refuse(CUDNN_STATUS_BAD_PARAM, "%s: attribute type %d is not its type", rule->label, (int)type);
    if (count < rule->min || count > rule->max)
        return refuse(CUDNN_STATUS_BAD_PARAM, "%s: %lld elements, where %lld to %lld are allowed", rule->label,
                      (long long)count, (long long)rule->min, (long long)rule->max);
    if (count && !values)
        return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: no values", rule->label);
    cudnnStatus_t status = type == CUDNN_TYPE_BACKEND_DESCRIPTOR ? check_held(rule, count, values)
                                                                 : CUDNN_STATUS_SUCCESS;
    if (status != CUDNN_STATUS_SUCCESS)
        return status;
    Attribute *a = find(d, name);
    if (!a)
        a = &d->attributes[d->nattributes++];
    free(a->values);
    size_t bytes = (size_t)count * element_size(type);
    *a = (Attribute){name, type, count, malloc(bytes ? bytes : 1)};
    memcpy(a->values, values ? values : "", bytes);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
    Descriptor *d = descriptor;
    if (!valid(d))
        return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: not a descriptor");
    const Kind *k = kind_of(d->type);
    if (d->finalized)
        return refuse(CUDNN_STATUS_BAD_PARAM, "%s: finalized twice", k->label);
    for (int i = 0; i < k->nrules; i++)
        if (k->rules[i].required && !find(d, k->rules[i].name))
            return refuse(CUDNN_STATUS_BAD_PARAM, "%s: %s is required and was not set", k->label, k->rules[i].label);
    cudnnStatus_t status = k->finalize(d);
    d->finalized = status == CUDNN_STATUS_SUCCESS;
    return status;
}

/* ------------------------------------------------------------ finalizing each */

static cudnnStatus_t finalize_nothing_more(Descriptor *d) {
    (void)d;
    return CUDNN_STATUS_SUCCESS;
}

/* The stand-in runs dense channels-last tensors of f32, f64 or bf16, 4-d, as the
 * runtime describes them: dims {n, c, h, w}, strides {h*w*c, 1, w*c, c}. */
static cudnnStatus_t finalize_tensor(Descriptor *d) {
    Attribute *dims = find(d, CUDNN_ATTR_TENSOR_DIMENSIONS), *strides = find(d, CUDNN_ATTR_TENSOR_STRIDES);
    int64_t alignment = int64_at(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 0);
    int type = enum_of(d, CUDNN_ATTR_TENSOR_DATA_TYPE);
    Attribute *is_virtual = find(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL);
    if (dims->count != strides->count)
        return refuse(CUDNN_STATUS_BAD_PARAM, "tensor: %lld dimensions and %lld strides", (long long)dims->count,
                      (long long)strides->count);
    if (alignment <= 0 || (alignment & (alignment - 1)))
        return refuse(CUDNN_STATUS_BAD_PARAM, "tensor: byte alignment %lld is not a power of two",
                      (long long)alignment);
    for (int64_t i = 0; i < dims->count; i++)
        if (((int64_t *)dims->values)[i] < 1 || ((int64_t *)strides->values)[i] < 1)
            return refuse(CUDNN_STATUS_BAD_PARAM, "tensor: dimension %lld is %lld with stride %lld", (long long)i,
                          (long long)((int64_t *)dims->values)[i], (long long)((int64_t *)strides->values)[i]);
    if (type != CUDNN_DATA_FLOAT && type != CUDNN_DATA_DOUBLE && type != CUDNN_DATA_BFLOAT16)
        return refuse(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, "tensor: data type %d (the stand-in has f32, f64, bf16)",
                      type);
    if (is_virtual && *(bool *)is_virtual->values)
        return refuse(CUDNN_STATUS_NOT_SUPPORTED, "tensor: virtual tensors are not in the stand-in");
    if (dims->count != 4)
        return refuse(CUDNN_STATUS_NOT_SUPPORTED_SHAPE, "tensor: %lld dimensions (the stand-in has 4)",
                      (long long)dims->count);
    const int64_t *n = dims->values, *s = strides->values;
    if (s[0] != n[2] * n[3] * n[1] || s[1] != 1 || s[2] != n[3] * n[1] || s[3] != n[1])
        return refuse(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, "tensor: strides {%lld, %lld, %lld, %lld} are not the dense "
                      "channels-last ones of dims {%lld, %lld, %lld, %lld}", (long long)s[0], (long long)s[1],
                      (long long)s[2], (long long)s[3], (long long)n[0], (long long)n[1], (long long)n[2],
                      (long long)n[3]);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_convolution(Descriptor *d) {
    static const cudnnBackendAttributeName_t per_dim[] = {
        CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
        CUDNN_ATTR_CONVOLUTION_POST_PADDINGS};
    static const char *const names[] = {"dilations", "filter strides", "pre-paddings", "post-paddings"};
    int64_t spatial = int64_at(d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 0);
    int type = enum_of(d, CUDNN_ATTR_CONVOLUTION_COMP_TYPE);
    for (int i = 0; i < 4; i++) {
        Attribute *a = find(d, per_dim[i]);
        if (a->count != spatial)
            return refuse(CUDNN_STATUS_BAD_PARAM, "convolution: %lld %s for %lld spatial dimensions",
                          (long long)a->count, names[i], (long long)spatial);
        for (int64_t j = 0; j < a->count; j++)
            if (((int64_t *)a->values)[j] < (i < 2 ? 1 : 0))
                return refuse(CUDNN_STATUS_BAD_PARAM, "convolution: %s[%lld] is %lld", names[i], (long long)j,
                              (long long)((int64_t *)a->values)[j]);
    }
    if (spatial != 2)
        return refuse(CUDNN_STATUS_NOT_SUPPORTED, "convolution: %lld spatial dimensions (the stand-in has 2)",
                      (long long)spatial);
    if (enum_of(d, CUDNN_ATTR_CONVOLUTION_CONV_MODE) != CUDNN_CROSS_CORRELATION)
        return refuse(CUDNN_STATUS_NOT_SUPPORTED, "convolution: the stand-in has CUDNN_CROSS_CORRELATION only");
    if (type != CUDNN_DATA_FLOAT && type != CUDNN_DATA_DOUBLE)
        return refuse(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, "convolution: compute type %d (the stand-in has f32, f64)",
                      type);
    return CUDNN_STATUS_SUCCESS;
}

/* The four dims of a finalized tensor, and its data type. */
static const int64_t *dims_of(Descriptor *t) {
    return find(t, CUDNN_ATTR_TENSOR_DIMENSIONS)->values;
}

/* The convolution the operation describes, checked for agreement: the tensors'
 * types and the compute type (the data's; f32 for bf16, whose sums are f32), the
 * filters' channels, the output's batch, channels and size. */
static cudnnStatus_t describe_convolution(Descriptor *op, const Rule *rules, Descriptor *conv, Descriptor *t[3]) {
    const int64_t *x = dims_of(t[0]), *w = dims_of(t[1]), *y = dims_of(t[2]);
    int type = enum_of(t[0], CUDNN_ATTR_TENSOR_DATA_TYPE);
    int compute = type == CUDNN_DATA_BFLOAT16 ? CUDNN_DATA_FLOAT : type;
    if (enum_of(t[1], CUDNN_ATTR_TENSOR_DATA_TYPE) != type || enum_of(t[2], CUDNN_ATTR_TENSOR_DATA_TYPE) != type)
        return refuse(CUDNN_STATUS_BAD_PARAM, "%s: the tensors' data types differ", rules[RULE_X].label);
    if (enum_of(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE) != compute)
        return refuse(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, "%s: compute type %d for data of type %d",
                      rules[RULE_CONV].label, enum_of(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE), type);
    if (w[1] != x[1])
        return refuse(CUDNN_STATUS_BAD_PARAM, "%s: the filters have %lld channels and the image %lld",
                      rules[RULE_W].label, (long long)w[1], (long long)x[1]);
    if (y[0] != x[0] || y[1] != w[0])
        return refuse(CUDNN_STATUS_BAD_PARAM, "%s: the output is %lld images of %lld channels, for %lld images and "
                      "%lld filters", rules[RULE_Y].label, (long long)y[0], (long long)y[1], (long long)x[0],
                      (long long)w[0]);
    ddp_device_conv *c = &op->conv;
    *c = (ddp_device_conv){.mode = kind_of(op->type)->mode, .n = (int)x[0], .c = (int)x[1], .h = (int)x[2],
                           .w = (int)x[3], .k = (int)w[0], .r = (int)w[2], .s = (int)w[3], .oh = (int)y[2],
                           .ow = (int)y[3], .f64 = type == CUDNN_DATA_DOUBLE, .bf16 = type == CUDNN_DATA_BFLOAT16};
    for (int i = 0; i < 2; i++) {
        c->dilation[i] = (int)int64_at(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, i);
        c->stride[i] = (int)int64_at(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, i);
        c->pad_before[i] = (int)int64_at(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, i);
        c->pad_after[i] = (int)int64_at(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, i);
        int64_t reach = (w[2 + i] - 1) * c->dilation[i] + 1, size = x[2 + i] + c->pad_before[i] + c->pad_after[i];
        int64_t want = size >= reach ? (size - reach) / c->stride[i] + 1 : 0;
        if (y[2 + i] != want)
            return refuse(CUDNN_STATUS_BAD_PARAM, "%s: the output's %s is %lld, and the image's %lld with filters of "
                          "%lld, dilation %d, stride %d, padding %d + %d give %lld", rules[RULE_Y].label,
                          i ? "width" : "height", (long long)y[2 + i], (long long)x[2 + i], (long long)w[2 + i],
                          c->dilation[i], c->stride[i], c->pad_before[i], c->pad_after[i], (long long)want);
    }
    return CUDNN_STATUS_SUCCESS;
}

/* Alpha and beta in the compute type's precision: double for f64, float otherwise. */
static cudnnStatus_t check_scalars(Descriptor *d, const Rule *rules) {
    cudnnBackendAttributeType_t want = d->conv.f64 ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
    for (int i = RULE_ALPHA; i <= RULE_BETA; i++)
        if (find(d, rules[i].name)->type != want)
            return refuse(CUDNN_STATUS_BAD_PARAM, "%s: of type %d, and a %s convolution's is %d", rules[i].label,
                          (int)find(d, rules[i].name)->type, d->conv.f64 ? "f64" : d->conv.bf16 ? "bf16" : "f32",
                          (int)want);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_operation(Descriptor *d) {
    const Rule *rules = kind_of(d->type)->rules;
    Descriptor *t[3] = {held(d, rules[RULE_X].name, 0), held(d, rules[RULE_W].name, 0), held(d, rules[RULE_Y].name, 0)};
    double alpha = scalar(d, rules[RULE_ALPHA].name), beta = scalar(d, rules[RULE_BETA].name);
    cudnnStatus_t status = describe_convolution(d, rules, held(d, rules[RULE_CONV].name, 0), t);
    if (status == CUDNN_STATUS_SUCCESS)
        status = check_scalars(d, rules);
    if (status != CUDNN_STATUS_SUCCESS)
        return status;
    if (alpha != 1 || (beta != 0 && beta != 1))
        return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: alpha %g, beta %g (the stand-in has alpha 1, beta 0 or 1)",
                      rules[RULE_ALPHA].label, alpha, beta);
    d->conv.beta = beta;
    for (int i = 0; i < 3; i++) {
        d->uids[i] = int64_at(t[i], CUDNN_ATTR_TENSOR_UNIQUE_ID, 0);
        d->alignment[i] = int64_at(t[i], CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 0);
    }
    if (d->uids[0] == d->uids[1] || d->uids[1] == d->uids[2] || d->uids[0] == d->uids[2])
        return refuse(CUDNN_STATUS_BAD_PARAM, "%s: the tensors' unique ids %lld, %lld, %lld repeat",
                      rules[RULE_X].label, (long long)d->uids[0], (long long)d->uids[1], (long long)d->uids[2]);
    return CUDNN_STATUS_SUCCESS;
}

/* What a graph, an engine, a configuration or a plan learns from the one before. */
static void inherit(Descriptor *d, const Descriptor *from) {
    d->conv = from->conv;
    memcpy(d->uids, from->uids, sizeof d->uids);
    memcpy(d->alignment, from->alignment, sizeof d->alignment);
    d->engine = from->engine;
}

static cudnnStatus_t finalize_graph(Descriptor *d) {
    Attribute *ops = find(d, CUDNN_ATTR_OPERATIONGRAPH_OPS);
    if (ops->count != 1)
        return refuse(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN, "operation graph: %lld operations (the stand-in runs "
                      "one convolution)", (long long)ops->count);
    if (!valid_handle(*(cudnnHandle_t *)find(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE)->values))
        return refuse(CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_OPERATIONGRAPH_HANDLE: not a handle");
    inherit(d, held(d, CUDNN_ATTR_OPERATIONGRAPH_OPS, 0));
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_heuristics(Descriptor *d) {
    int mode = enum_of(d, CUDNN_ATTR_ENGINEHEUR_MODE);
    if (mode < 0 || mode >= CUDNN_HEUR_MODES_COUNT)
        return refuse(CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_ENGINEHEUR_MODE: %d is no mode", mode);
    inherit(d, held(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, 0));
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_engine(Descriptor *d) {
    int64_t index = int64_at(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, 0);
    if (index < 0 || index >= ENGINES)
        return refuse(CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_ENGINE_GLOBAL_INDEX: %lld, of %d engines", (long long)index,
                      ENGINES);
    if (!offered((int)index))
        return refuse(CUDNN_STATUS_NOT_SUPPORTED, "engine %lld is left out by FAKE_CUDNN_ENGINES", (long long)index);
    inherit(d, held(d, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, 0));
    d->engine = (int)index;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_config(Descriptor *d) {
    Descriptor *engine = held(d, CUDNN_ATTR_ENGINECFG_ENGINE, 0);
    Attribute *knobs = find(d, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES);
    const Engine *e = &engines[engine->engine];
    for (int64_t i = 0; knobs && i < knobs->count; i++) {
        int type = enum_of(((Descriptor **)knobs->values)[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE);
        bool known = false;
        for (int j = 0; j < e->nknobs; j++)
            known |= (int)e->knob_types[j] == type;
        if (!known)
            return refuse(CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_ENGINECFG_KNOB_CHOICES: engine %d has no knob %d",
                          engine->engine, type);
    }
    inherit(d, engine);
    return CUDNN_STATUS_SUCCESS;
}

/* The engine runs the graph, or says why not: engine 1 runs no f64, engine 5 bf16
 * only. The tensor-core engine reads f32 factors as TF32 (bf16 ones exactly). */
static cudnnStatus_t finalize_plan(Descriptor *d) {
    Descriptor *config = held(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, 0);
    const ddp_device_conv *c = &config->conv;
    if (!valid_handle(*(cudnnHandle_t *)find(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE)->values))
        return refuse(CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE: not a handle");
    if (!(engines[config->engine].runs & (c->f64 ? RUNS_F64 : c->bf16 ? RUNS_BF16 : RUNS_F32)))
        return refuse(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, "engine %d does not run %s data", config->engine,
                      c->f64 ? "f64" : c->bf16 ? "bf16" : "f32");
    inherit(d, config);
    d->conv.tf32 = !d->conv.bf16 && engines[d->engine].note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_pack(Descriptor *d) {
    int64_t uids = find(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)->count;
    int64_t pointers = find(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->count;
    if (uids != pointers)
        return refuse(CUDNN_STATUS_BAD_PARAM, "variant pack: %lld unique ids and %lld data pointers", (long long)uids,
                      (long long)pointers);
    return CUDNN_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------ queries */

/* A descriptor the caller made, filled here: set and finalized as the caller would. */
static cudnnStatus_t fill_engine(Descriptor *engine, Descriptor *graph, int64_t index) {
    cudnnStatus_t status =
        cudnnBackendSetAttribute(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendSetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index);
    return status == CUDNN_STATUS_SUCCESS ? cudnnBackendFinalize(engine) : status;
}

static cudnnStatus_t fill_knob(Descriptor *knob, cudnnBackendKnobType_t type, int64_t value) {
    cudnnStatus_t status =
        cudnnBackendSetAttribute(knob, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &type);
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendSetAttribute(knob, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &value);
    return status == CUDNN_STATUS_SUCCESS ? cudnnBackendFinalize(knob) : status;
}

static Descriptor *make(cudnnBackendDescriptorType_t type, Descriptor *owner) {
    cudnnBackendDescriptor_t d = NULL;
    if (owner->nowned == MAX_OWNED || cudnnBackendCreateDescriptor(type, &d) != CUDNN_STATUS_SUCCESS)
        return NULL;
    owner->owned[owner->nowned++] = d;
    return d;
}

/* A configuration of the heuristics: the engine with its knobs, made for it. */
static cudnnStatus_t fill_heuristic_config(Descriptor *config, Descriptor *graph, int index) {
    const Engine *e = &engines[index];
    Descriptor *engine = make(CUDNN_BACKEND_ENGINE_DESCRIPTOR, config), *knobs[2] = {NULL, NULL};
    cudnnStatus_t status = engine ? fill_engine(engine, graph, index) : CUDNN_STATUS_INTERNAL_ERROR;
    for (int i = 0; i < e->nknobs && status == CUDNN_STATUS_SUCCESS; i++) {
        knobs[i] = make(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, config);
        status = knobs[i] ? fill_knob(knobs[i], e->knob_types[i], e->knob_values[i]) : CUDNN_STATUS_INTERNAL_ERROR;
    }
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendSetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                          &engine);
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendSetAttribute(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                          e->nknobs, knobs);
    return status == CUDNN_STATUS_SUCCESS ? cudnnBackendFinalize(config) : status;
}

/* Descriptors handed back must be the caller's own, made for the kind, unfinalized. */
static cudnnStatus_t check_blank(void *const *values, int64_t count, cudnnBackendDescriptorType_t type,
                                 const char *what) {
    for (int64_t i = 0; i < count; i++) {
        const Descriptor *d = values[i];
        if (!valid(d) || d->type != type || d->finalized)
            return refuse(CUDNN_STATUS_BAD_PARAM, "%s: element %lld is not a new %s", what, (long long)i,
                          kind_of(type)->label);
    }
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t heuristic_results(Descriptor *heur, int64_t requested, int64_t *count, void **configs) {
    int chosen[ENGINES], n = 0;
    const char *heuristics = getenv("FAKE_CUDNN_HEURISTICS");
    for (int i = 0; i < ENGINES && !(heuristics && strcmp(heuristics, "none") == 0); i++)
        if (offered(heuristic_order[i]))
            chosen[n++] = heuristic_order[i];
    *count = n;
    int64_t filled = requested < n ? requested : n;
    cudnnStatus_t status = check_blank(configs, filled, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                                       "CUDNN_ATTR_ENGINEHEUR_RESULTS");
    Descriptor *graph = held(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, 0);
    for (int64_t i = 0; i < filled && status == CUDNN_STATUS_SUCCESS; i++)
        status = fill_heuristic_config(configs[i], graph, chosen[i]);
    return status;
}

static cudnnStatus_t copy_engine(Descriptor *config, int64_t requested, int64_t *count, void **values) {
    Descriptor *engine = held(config, CUDNN_ATTR_ENGINECFG_ENGINE, 0);
    cudnnStatus_t status = requested < 1 ? refuse(CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_ENGINECFG_ENGINE: no room")
                                         : check_blank(values, 1, CUDNN_BACKEND_ENGINE_DESCRIPTOR,
                                                       "CUDNN_ATTR_ENGINECFG_ENGINE");
    *count = 1;
    return status == CUDNN_STATUS_SUCCESS
               ? fill_engine(values[0], held(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, 0), engine->engine)
               : status;
}

static cudnnStatus_t copy_knobs(Descriptor *config, int64_t requested, int64_t *count, void **values) {
    Attribute *knobs = find(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES);
    int64_t n = knobs ? knobs->count : 0, filled = requested < n ? requested : n;
    cudnnStatus_t status = check_blank(values, filled, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR,
                                       "CUDNN_ATTR_ENGINECFG_KNOB_CHOICES");
    *count = n;
    for (int64_t i = 0; i < filled && status == CUDNN_STATUS_SUCCESS; i++) {
        Descriptor *knob = ((Descriptor **)knobs->values)[i];
        status = fill_knob(values[i], enum_of(knob, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE),
                           int64_at(knob, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, 0));
    }
    return status;
}

/* Values computed for the asking: one int64, or the engine's notes. */
static cudnnStatus_t computed(Descriptor *d, cudnnBackendAttributeName_t name, int64_t requested, int64_t *count,
                              void *values) {
    const Engine *e = &engines[d->engine];
    int64_t value;
    if (name == CUDNN_ATTR_ENGINE_NUMERICAL_NOTE) {
        *count = e->note == CUDNN_NUMERICAL_NOTE_TYPE_COUNT ? 0 : 1;
        if (*count && requested >= 1)
            *(cudnnBackendNumericalNote_t *)values = e->note;
        return CUDNN_STATUS_SUCCESS;
    }
    if (name == CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE) {
        *count = 0;
        return CUDNN_STATUS_SUCCESS;
    }
    if (name == CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT)
        value = ENGINES;
    else /* a configuration's or a plan's workspace */
        value = e->workspace;
    *count = 1;
    if (requested >= 1)
        *(int64_t *)values = value;
    return CUDNN_STATUS_SUCCESS;
}

/* The type each queried attribute answers in, and who answers it. */
static const struct Query {
    cudnnBackendDescriptorType_t on;
    cudnnBackendAttributeName_t name;
    cudnnBackendAttributeType_t type;
} queries[] = {
    {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64},
    {CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR},
    {CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR},
    {CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR},
    {CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64},
    {CUDNN_BACKEND_ENGINE_DESCRIPTOR, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE},
    {CUDNN_BACKEND_ENGINE_DESCRIPTOR, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE},
    {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64},
};

static cudnnStatus_t stored(Descriptor *d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                            int64_t requested, int64_t *count, void *values) {
    Attribute *a = find(d, name);
    if (!a)
        return refuse(CUDNN_STATUS_BAD_PARAM, "%s: attribute %d is not one the stand-in gives",
                      kind_of(d->type)->label, (int)name);
    if (a->type != type)
        return refuse(CUDNN_STATUS_BAD_PARAM, "%s: attribute %d is of type %d, not %d", kind_of(d->type)->label,
                      (int)name, (int)a->type, (int)type);
    *count = a->count;
    if (values)
        memcpy(values, a->values, (size_t)(requested < a->count ? requested : a->count) * element_size(type));
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested, int64_t *count,
                                       void *values) {
    Descriptor *d = descriptor;
    int64_t ignored;
    if (!valid(d))
        return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute: not a descriptor");
    if (!d->finalized)
        return refuse(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "%s: asked for attribute %d before it is finalized",
                      kind_of(d->type)->label, (int)name);
    if (requested < 0 || (requested > 0 && !values))
        return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "attribute %d: %lld elements asked for, and no room",
                      (int)name, (long long)requested);
    count = count ? count : &ignored;
    for (size_t i = 0; i < sizeof queries / sizeof *queries; i++) {
        if (queries[i].on != d->type || queries[i].name != name)
            continue;
        if (queries[i].type != type)
            return refuse(CUDNN_STATUS_BAD_PARAM, "attribute %d: type %d asked for, and it is of type %d", (int)name,
                          (int)type, (int)queries[i].type);
        if (name == CUDNN_ATTR_ENGINEHEUR_RESULTS)
            return heuristic_results(d, requested, count, values);
        if (name == CUDNN_ATTR_ENGINECFG_ENGINE)
            return copy_engine(d, requested, count, values);
        if (name == CUDNN_ATTR_ENGINECFG_KNOB_CHOICES)
            return copy_knobs(d, requested, count, values);
        return computed(d, name, requested, count, values);
    }
    return stored(d, name, type, requested, count, values);
}

/* ---------------------------------------------------------------- execution */

static const void *pointer_of(Descriptor *pack, int64_t uid) {
    Attribute *uids = find(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
    for (int64_t i = 0; i < uids->count; i++)
        if (((int64_t *)uids->values)[i] == uid)
            return ((void **)find(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->values)[i];
    return NULL;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan_descriptor,
                                  cudnnBackendDescriptor_t pack_descriptor) {
    Descriptor *plan = plan_descriptor, *pack = pack_descriptor;
    void *tensors[3];
    if (!valid_handle(handle))
        return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: not a handle");
    if (!valid(plan) || plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !plan->finalized ||
        !valid(pack) || pack->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR || !pack->finalized)
        return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: wants a finalized plan and variant pack");
    if (*(cudnnHandle_t *)find(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE)->values != handle)
        return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the plan was made for another handle");
    for (int i = 0; i < 3; i++) {
        if (!(tensors[i] = (void *)pointer_of(pack, plan->uids[i])))
            return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "variant pack: no data pointer for uid %lld",
                          (long long)plan->uids[i]);
        if ((uintptr_t)tensors[i] % (uintptr_t)plan->alignment[i])
            return refuse(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, "variant pack: uid %lld at %p is not aligned to "
                          "%lld bytes", (long long)plan->uids[i], tensors[i], (long long)plan->alignment[i]);
    }
    void *workspace = *(void **)find(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE)->values;
    int64_t needed = engines[plan->engine].workspace;
    if (needed > 0 && !workspace)
        return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "variant pack: engine %d needs %lld bytes of workspace, "
                      "and none was given", plan->engine, (long long)needed);
    void (*reference)(const ddp_device_conv *, void *, void *, void *);
    *(void **)&reference = dlsym(RTLD_DEFAULT, "ddp_conv_reference");
    if (!reference)
        return refuse(CUDNN_STATUS_EXECUTION_FAILED, "the stand-in runs ddp_conv_reference, and the program that "
                      "loaded it does not export it (link it with -rdynamic)");
    if (needed > 0) /* as a kernel would use it: a workspace too small shows */
        memset(workspace, 0xa5, (size_t)needed);
    reference(&plan->conv, tensors[0], tensors[1], tensors[2]);
    return CUDNN_STATUS_SUCCESS;
}
