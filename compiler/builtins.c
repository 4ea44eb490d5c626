/* builtins.c: the signatures of everything built into the language: layers, losses,
 * optimizers, schedules, metrics, datasets, checkpoints, the cluster, and the settings
 * of `strategy` and `train`.
 *
 * One table drives argument matching, kind checking, "did you mean", the defaults the
 * later stages see, and docs/language.md's reference tables, so they cannot disagree. */
#include <string.h>

#include "ddpc.h"
#include "../runtime/ddp_abi.h"

/* Words that cross into the program are listed by the contract's codes, so a word's
 * index is its code (word_code). */
const char *const activation_words[] = {"relu", "relu6", "leaky_relu", "elu", "gelu", "silu", "mish", "hard_swish",
                                        "softplus", "sigmoid", "tanh", "softmax", "identity", NULL};
const char *const init_words[] = {
    [DDP_INIT_GLOROT_UNIFORM] = "glorot_uniform", [DDP_INIT_GLOROT_NORMAL] = "glorot_normal",
    [DDP_INIT_HE_NORMAL] = "he_normal", [DDP_INIT_HE_UNIFORM] = "he_uniform",
    [DDP_INIT_ZEROS] = "zeros", [DDP_INIT_ONES] = "ones", [DDP_INIT_ONES + 1] = NULL};
static const char *const padding_words[] = {"same", "valid", NULL};
const char *const cluster_words[] = {[DDP_CLUSTER_AUTO] = "auto", [DDP_CLUSTER_SLURM] = "slurm",
                                     [DDP_CLUSTER_ENV] = "env", [DDP_CLUSTER_LOCAL] = "local",
                                     [DDP_CLUSTER_LOCAL + 1] = NULL};
const char *const communication_words[] = {[DDP_COMM_AUTO] = "auto", [DDP_COMM_NCCL] = "nccl",
                                           [DDP_COMM_RING] = "ring", [DDP_COMM_RING + 1] = NULL};
const char *const precision_words[] = {[DDP_PRECISION_FP32] = "fp32", [DDP_PRECISION_BF16] = "bf16",
                                       [DDP_PRECISION_FP16] = "fp16", [DDP_PRECISION_TF32] = "tf32",
                                       [DDP_PRECISION_TF32 + 1] = NULL};
const char *const allreduce_words[] = {[DDP_ALLREDUCE_FP32] = "fp32", [DDP_ALLREDUCE_BF16] = "bf16",
                                       [DDP_ALLREDUCE_BF16 + 1] = NULL};
const char *const flip_words[] = {[DDP_FLIP_HORIZONTAL] = "horizontal", [DDP_FLIP_VERTICAL] = "vertical",
                                  [DDP_FLIP_BOTH] = "horizontal_and_vertical", [DDP_FLIP_BOTH + 1] = NULL};
const char *const erase_words[] = {[DDP_ERASE_ZERO] = "zero", [DDP_ERASE_RANDOM] = "random",
                                   [DDP_ERASE_RANDOM + 1] = NULL};
const char *const interpolation_words[] = {[DDP_INTERPOLATION_NEAREST] = "nearest",
                                           [DDP_INTERPOLATION_BILINEAR] = "bilinear",
                                           [DDP_INTERPOLATION_BILINEAR + 1] = NULL};
const char *const policy_words[] = {[DDP_POLICY_IMAGENET] = "imagenet", [DDP_POLICY_CIFAR10] = "cifar10",
                                    [DDP_POLICY_SVHN] = "svhn", [DDP_POLICY_SVHN + 1] = NULL};
const char *const part_words[] = {[0] = "train", [1] = "test", [2] = NULL}; /* ddp_dataset.part */
const char *const token_words[] = {"uint8", "uint16", "uint32", NULL}; /* token_file(type = ...) */
const char *const runtime_scalars[] = {"replicas", "workers", "global_batch", NULL};
const char *const strategy_kinds[] = {"multi_worker_mirrored", NULL};

/* Parameter constructors, so each table row reads like the signature it describes. */
#define REQ(n, k, f) {.name = n, .kind = k, .flags = P_REQUIRED | (f)}
#define OPT(n, k, f) {.name = n, .kind = k, .flags = P_OPTIONAL | (f)}
#define NUM(n, v, f) {.name = n, .kind = K_NUM, .flags = f, .def = DEF_NUM, .def_num = v}
#define INT(n, v, f) {.name = n, .kind = K_INT, .flags = f, .def = DEF_NUM, .def_num = v}
#define PAIR(n, v) {.name = n, .kind = K_INT_PAIR, .flags = P_POSITIVE, .def = DEF_NUM, .def_num = v}
#define BOOL(n, v) {.name = n, .kind = K_BOOL, .def = DEF_BOOL, .def_num = v}
#define WORD(n, w, d) {.name = n, .kind = K_WORD, .words = w, .def = DEF_WORD, .def_word = d}
#define DUR(n, v, u, f) {.name = n, .kind = K_DURATION, .flags = f, .def = DEF_DURATION, .def_num = v, .def_unit = u}
#define LR(n, v) {.name = n, .kind = K_LR, .flags = P_RUNTIME | P_POSITIVE, .def = DEF_NUM, .def_num = v}
#define ACTIVATION WORD("activation", activation_words, "identity")
#define INIT(n, d) WORD(n, init_words, d)

static const Param dense_params[] = {
    REQ("units", K_INT, P_POSITIVE), ACTIVATION, BOOL("bias", 1),
    INIT("init", "glorot_uniform"), INIT("bias_init", "zeros"),
};
static const Param conv2d_params[] = {
    REQ("filters", K_INT, P_POSITIVE), REQ("kernel", K_INT_PAIR, P_POSITIVE),
    PAIR("stride", 1),
    {.name = "padding", .kind = K_PADDING, .flags = P_NONNEG, .words = padding_words,
     .def = DEF_WORD, .def_word = "valid"},
    PAIR("dilation", 1), BOOL("bias", 1), ACTIVATION,
    INIT("init", "glorot_uniform"), INIT("bias_init", "zeros"),
};
static const Param depthwise_params[] = {
    REQ("kernel", K_INT_PAIR, P_POSITIVE),
    PAIR("stride", 1),
    {.name = "padding", .kind = K_PADDING, .flags = P_NONNEG, .words = padding_words,
     .def = DEF_WORD, .def_word = "valid"},
    PAIR("dilation", 1), INT("multiplier", 1, P_POSITIVE), BOOL("bias", 1), ACTIVATION,
    INIT("init", "glorot_uniform"), INIT("bias_init", "zeros"),
};
/* stride defaults to the window size: no default value in the table. */
static const Param pool_params[] = {
    PAIR("size", 2), OPT("stride", K_INT_PAIR, P_POSITIVE),
    {.name = "padding", .kind = K_PADDING, .flags = P_NONNEG, .words = padding_words,
     .def = DEF_WORD, .def_word = "valid"},
};
static const Param batchnorm_params[] = {
    NUM("momentum", 0.99, P_FRACTION), NUM("epsilon", 1e-3, P_POSITIVE),
};
static const Param layernorm_params[] = {NUM("epsilon", 1e-3, P_POSITIVE)};
/* key_dim defaults to the channels over heads (Keras's MultiHeadAttention asks for it) */
static const Param attention_params[] = {
    REQ("heads", K_INT, P_POSITIVE), OPT("key_dim", K_INT, P_POSITIVE), BOOL("causal", 0),
    NUM("dropout", 0, P_FRACTION), BOOL("bias", 1),
    INIT("init", "glorot_uniform"), INIT("bias_init", "zeros"),
};
static const Param position_embedding_params[] = {INIT("init", "glorot_uniform")};
static const Param embedding_params[] = {
    REQ("vocab", K_INT, P_POSITIVE), REQ("units", K_INT, P_POSITIVE), INIT("init", "glorot_uniform"),
};
static const Param dropout_params[] = {REQ("rate", K_NUM, P_FRACTION)};
static const Param reshape_params[] = {REQ("shape", K_SHAPE, P_POSITIVE | P_INFER)};
static const Param add_params[] = {REQ("values", K_TENSOR, P_VARIADIC)};
static const Param concat_params[] = {REQ("values", K_TENSOR, P_VARIADIC), INT("axis", -1, 0)};
static const Param softmax_params[] = {INT("axis", -1, 0)};
/* an activation's one number: its slope below zero (activation = leaky_relu: 0.01, PyTorch's) */
static const Param leaky_relu_params[] = {NUM("negative_slope", 0.01, P_FRACTION)};
static const Param elu_params[] = {NUM("alpha", 1, P_POSITIVE)};

static const Param from_logits[] = {BOOL("from_logits", 0)};
static const Param cce_params[] = {BOOL("from_logits", 0), NUM("label_smoothing", 0, P_FRACTION)};

/* torchvision's --bias-weight-decay and --norm-weight-decay: where not set, weight_decay */
#define DECAYS OPT("bias_weight_decay", K_NUM, P_NONNEG | P_RUNTIME), OPT("norm_weight_decay", K_NUM, P_NONNEG | P_RUNTIME)

/* What every optimizer ends with: clipping and the moving average */
#define UPDATE_EXTRAS \
    OPT("clip_norm", K_NUM, P_POSITIVE), OPT("ema", K_NUM, P_POSITIVE | P_FRACTION), BOOL("ema_warmup", 0)
/* Adam's and its kin's */
#define ADAM_PARAMS(epsilon, decay)                                                                            \
    LR("learning_rate", 0.001), NUM("beta1", 0.9, P_FRACTION), NUM("beta2", 0.999, P_FRACTION),                 \
        NUM("epsilon", epsilon, P_POSITIVE), NUM("weight_decay", decay, P_NONNEG | P_RUNTIME), DECAYS, UPDATE_EXTRAS

static const Param sgd_params[] = {
    LR("learning_rate", 0.01), NUM("momentum", 0, P_FRACTION), BOOL("nesterov", 0),
    NUM("weight_decay", 0, P_NONNEG | P_RUNTIME), DECAYS, UPDATE_EXTRAS,
};
static const Param adam_params[] = {ADAM_PARAMS(1e-7, 0)};
static const Param adamw_params[] = {ADAM_PARAMS(1e-7, 0.01)};
/* timm's Lars (after NVIDIA's LARC and MLPerf's): SGD with each parameter's step scaled */
static const Param lars_params[] = {
    LR("learning_rate", 0.1), NUM("momentum", 0.9, P_FRACTION), BOOL("nesterov", 0),
    NUM("weight_decay", 0, P_NONNEG | P_RUNTIME), DECAYS, NUM("trust_coefficient", 0.001, P_POSITIVE),
    NUM("epsilon", 1e-8, P_NONNEG), UPDATE_EXTRAS,
};
/* timm's Lamb, its weight decay decoupled as adamw's */
static const Param lamb_params[] = {ADAM_PARAMS(1e-6, 0.01)};

static const Param constant_params[] = {REQ("lr", K_NUM, P_RUNTIME | P_POSITIVE)};
static const Param step_params[] = {
    REQ("lr", K_NUM, P_RUNTIME | P_POSITIVE), NUM("drop", 0.1, P_POSITIVE | P_RUNTIME),
    DUR("every", 30, UNIT_EPOCHS, P_POSITIVE), DUR("warmup", 0, UNIT_EPOCHS, P_NONNEG),
};
static const Param multistep_params[] = {
    REQ("lr", K_NUM, P_RUNTIME | P_POSITIVE), REQ("milestones", K_DURATIONS, P_POSITIVE),
    NUM("drop", 0.1, P_POSITIVE | P_RUNTIME), DUR("warmup", 0, UNIT_EPOCHS, P_NONNEG),
};
static const Param cosine_params[] = {
    REQ("peak", K_NUM, P_RUNTIME | P_POSITIVE), DUR("warmup", 0, UNIT_EPOCHS, P_NONNEG),
    NUM("final", 0, P_NONNEG | P_RUNTIME),
};
static const Param linear_params[] = {
    REQ("peak", K_NUM, P_RUNTIME | P_POSITIVE), DUR("warmup", 0, UNIT_STEPS, P_NONNEG),
    NUM("final", 0, P_NONNEG | P_RUNTIME),
};

static const Param top_k_params[] = {INT("k", 5, P_POSITIVE)};

static const Param random_flip_params[] = {WORD("mode", flip_words, "horizontal")};
static const Param random_crop_params[] = {INT("padding", 0, P_NONNEG), OPT("size", K_INT_PAIR, P_POSITIVE)};
static const Param random_cutout_params[] = {REQ("size", K_INT, P_POSITIVE)};
/* torchvision's RandomResizedCrop defaults */
static const double default_crop_scale[] = {0.08, 1}, default_crop_ratio[] = {3.0 / 4, 4.0 / 3};
static const Param random_resized_crop_params[] = {
    REQ("size", K_INT_PAIR, P_POSITIVE),
    {.name = "scale", .kind = K_NUM_RANGE, .flags = P_UNIT, .def = DEF_LIST, .def_list = default_crop_scale,
     .def_list_len = 2},
    {.name = "ratio", .kind = K_NUM_RANGE, .flags = P_POSITIVE, .def = DEF_LIST, .def_list = default_crop_ratio,
     .def_list_len = 2},
};

/* torchvision's ColorJitter: each 0 (unchanged) by default */
static const Param random_color_params[] = {
    NUM("brightness", 0, P_NONNEG), NUM("contrast", 0, P_NONNEG), NUM("saturation", 0, P_NONNEG),
    NUM("hue", 0, P_NONNEG),
};

/* torchvision's RandomGrayscale and RandomErasing defaults */
static const Param random_grayscale_params[] = {NUM("probability", 0.1, P_UNIT)};
static const double default_erase_scale[] = {0.02, 0.33}, default_erase_ratio[] = {0.3, 3.3};
static const Param random_erasing_params[] = {
    NUM("probability", 0.5, P_UNIT),
    {.name = "scale", .kind = K_NUM_RANGE, .flags = P_UNIT, .def = DEF_LIST, .def_list = default_erase_scale,
     .def_list_len = 2},
    {.name = "ratio", .kind = K_NUM_RANGE, .flags = P_POSITIVE, .def = DEF_LIST, .def_list = default_erase_ratio,
     .def_list_len = 2},
    WORD("value", erase_words, "zero"),
};

/* torchvision's TrivialAugmentWide */
static const Param trivial_augment_params[] = {INT("bins", 31, P_POSITIVE),
                                               WORD("interpolation", interpolation_words, "nearest")};

/* torchvision's RandAugment */
static const Param rand_augment_params[] = {INT("ops", 2, P_POSITIVE), INT("magnitude", 9, P_NONNEG),
                                            INT("bins", 31, P_POSITIVE),
                                            WORD("interpolation", interpolation_words, "nearest")};

/* torchvision's AutoAugment */
static const Param auto_augment_params[] = {WORD("policy", policy_words, "imagenet"),
                                            WORD("interpolation", interpolation_words, "nearest")};

/* torchvision's and timm's usual mixup and CutMix */
static const Param random_mixup_params[] = {NUM("alpha", 0.2, P_POSITIVE)};
static const Param random_cutmix_params[] = {NUM("alpha", 1, P_POSITIVE)};

/* mean, std: every file dataset's normalisation, after scale; augment: the image
 * datasets' (a list of augmentations) */
#define NORMALIZE OPT("mean", K_NUMS, 0), OPT("std", K_NUMS, P_POSITIVE)
#define AUGMENT OPT("augment", K_AUGMENTS, 0)
static const Param idx_params[] = {
    REQ("images", K_STR, 0), REQ("labels", K_STR, 0), NUM("scale", 1, P_POSITIVE), NORMALIZE, AUGMENT,
};
static const Param cifar10_params[] = {
    REQ("dir", K_STR, 0), WORD("part", part_words, "train"), NUM("scale", 1, P_POSITIVE), NORMALIZE, AUGMENT,
};
static const Param npy_params[] = {
    REQ("inputs", K_STR, 0), REQ("labels", K_STR, 0), NUM("scale", 1, P_POSITIVE), NORMALIZE, AUGMENT,
};
static const Param csv_params[] = {
    REQ("path", K_STR, 0), BOOL("header", 1), REQ("features", K_STR_LIST, 0),
    REQ("target", K_STR, 0), NUM("scale", 1, P_POSITIVE), NORMALIZE,
};
static const Param tokens_params[] = {
    REQ("path", K_STR, 0), REQ("window", K_INT, P_POSITIVE), WORD("type", token_words, "uint16"),
};
static const Param synthetic_params[] = {
    REQ("shape", K_SHAPE, P_POSITIVE), REQ("classes", K_INT, P_POSITIVE),
    REQ("samples", K_INT, P_POSITIVE),
};

static const Param checkpoint_params[] = {
    REQ("dir", K_STR, 0), DUR("every", 1, UNIT_EPOCHS, P_POSITIVE), INT("keep", 3, P_POSITIVE),
};
static const Param early_stopping_params[] = {
    {.name = "metric", .kind = K_METRIC, .def = DEF_WORD, .def_word = "loss"},
    INT("patience", 3, P_POSITIVE), NUM("min_delta", 0, P_NONNEG),
};
/* Keras's ReduceLROnPlateau and PyTorch's defaults */
static const Param on_plateau_params[] = {
    {.name = "metric", .kind = K_METRIC, .def = DEF_WORD, .def_word = "loss"},
    NUM("factor", 0.1, P_FRACTION | P_POSITIVE), INT("patience", 10, P_POSITIVE), NUM("min_delta", 0, P_NONNEG),
    NUM("min_lr", 0, P_NONNEG),
};
static const double default_port_range[] = {10000, 20000};
static const Param slurm_params[] = {
    OPT("port_base", K_INT, P_POSITIVE),
    {.name = "port_range", .kind = K_INT_RANGE, .flags = P_POSITIVE, .def = DEF_LIST,
     .def_list = default_port_range, .def_list_len = 2},
};

#define STRATEGY_SETTINGS                                                               \
    {.name = "cluster", .kind = K_CLUSTER, .words = cluster_words, .def = DEF_WORD,      \
     .def_word = "auto"},                                                               \
    WORD("communication", communication_words, "auto"),                                 \
    REQ("batch_per_replica", K_INT, P_POSITIVE), INT("gpus_per_worker", 1, P_POSITIVE), \
    INT("seed", 0, P_NONNEG), BOOL("shuffle", 1), INT("augment_repeats", 1, P_POSITIVE), BOOL("drop_remainder", 1), \
    INT("accumulate_batches", 1, P_POSITIVE),                                            \
    WORD("precision", precision_words, "fp32"), WORD("allreduce_precision", allreduce_words, "fp32")
#define TRAIN_SETTINGS                                                                  \
    REQ("loss", K_LOSS, 0), REQ("optimizer", K_OPTIMIZER, 0),                           \
    {.name = "metrics", .kind = K_METRICS, .def = DEF_WORD, .def_word = "loss"},        \
    REQ("epochs", K_INT, P_POSITIVE), OPT("learning_rate", K_LR, P_RUNTIME | P_POSITIVE), \
    OPT("steps_per_epoch", K_INT, P_POSITIVE), OPT("validation", K_DATASET, 0),         \
    DUR("validate_every", 1, UNIT_EPOCHS, P_POSITIVE), OPT("checkpoint", K_CHECKPOINT, 0),     \
    OPT("save_best", K_METRIC, 0), OPT("early_stopping", K_EARLY_STOPPING, 0),            \
    OPT("reduce_lr", K_ON_PLATEAU, 0)

static const Param strategy_params[] = {STRATEGY_SETTINGS};
static const Param train_params[] = {TRAIN_SETTINGS};
static const Param toplevel_train_params[] = {TRAIN_SETTINGS, STRATEGY_SETTINGS};

#define N(a) (int)(sizeof(a) / sizeof((a)[0]))
#define LAYER(name, params, op, doc) {name, B_LAYER, params, N(params), op, 0, doc}
#define LAYER0(name, op, doc) {name, B_LAYER, NULL, 0, op, 0, doc}
/* code: the entry's value in the contract (DDP_LOSS_*, DDP_OPT_*, ...) */
#define OTHER(name, kind, code, params, doc) {name, kind, params, N(params), L_NONE, code, doc}
#define OTHER0(name, kind, code, doc) {name, kind, NULL, 0, L_NONE, code, doc}

const Builtin builtins[] = {
    LAYER("dense", dense_params, L_DENSE, "fully connected over the last axis: [..., n] -> [..., units]"),
    LAYER("conv2d", conv2d_params, L_CONV2D, "2-D convolution: [h, w, c] -> [h', w', filters]"),
    LAYER("depthwise_conv2d", depthwise_params, L_DEPTHWISE_CONV2D,
          "each channel convolved with its own multiplier filters: [h, w, c] -> [h', w', c * multiplier]"),
    LAYER("maxpool", pool_params, L_MAXPOOL, "2-D max pooling: [h, w, c] -> [h', w', c]; stride none is the window size"),
    LAYER("avgpool", pool_params, L_AVGPOOL, "2-D average pooling: [h, w, c] -> [h', w', c]; stride none is the window size"),
    LAYER0("global_avgpool", L_GLOBAL_AVGPOOL, "mean over every axis but the last: [h, w, c] -> [c], [tokens, c] -> [c]"),
    LAYER("batchnorm", batchnorm_params, L_BATCHNORM, "batch normalisation over the last axis"),
    LAYER("layernorm", layernorm_params, L_LAYERNORM, "layer normalisation over the last axis, each sample on its own"),
    LAYER("attention", attention_params, L_ATTENTION,
          "multi-head self-attention, with its query, key, value and output projections: [tokens, c] -> [tokens, c]"),
    LAYER("position_embedding", position_embedding_params, L_POSITION_EMBEDDING,
          "a learned value for every position added: [tokens, c] -> [tokens, c]"),
    LAYER("embedding", embedding_params, L_EMBEDDING,
          "a learned vector of units values for each token index 0 .. vocab - 1: [tokens] -> [tokens, units]"),
    LAYER("dropout", dropout_params, L_DROPOUT, "zeroes a fraction of values in training"),
    LAYER0("flatten", L_FLATTEN, "[d1, d2, ...] -> [d1 * d2 * ...]"),
    LAYER("reshape", reshape_params, L_RESHAPE, "same values, another shape"),
    LAYER("add", add_params, L_ADD, "sum of the current value and others of the same shape"),
    LAYER("concat", concat_params, L_CONCAT, "the current value and others joined along an axis"),
    LAYER0("relu", L_RELU, "max(x, 0)"),
    LAYER0("relu6", L_RELU6, "min(max(x, 0), 6) (MobileNetV2)"),
    LAYER("leaky_relu", leaky_relu_params, L_LEAKY_RELU, "x above 0, negative_slope x below"),
    LAYER("elu", elu_params, L_ELU, "x above 0, alpha (exp(x) - 1) below"),
    LAYER0("gelu", L_GELU, "x * Phi(x)"),
    LAYER0("silu", L_SILU, "x * sigmoid(x) (swish)"),
    LAYER0("mish", L_MISH, "x * tanh(softplus(x))"),
    LAYER0("hard_swish", L_HARD_SWISH, "x * min(max(x + 3, 0), 6) / 6 (MobileNetV3)"),
    LAYER0("softplus", L_SOFTPLUS, "log(1 + exp(x))"),
    LAYER0("sigmoid", L_SIGMOID, "1 / (1 + exp(-x))"),
    LAYER0("tanh", L_TANH, "hyperbolic tangent"),
    LAYER("softmax", softmax_params, L_SOFTMAX, "exp(x) / sum(exp(x)) along an axis"),
    LAYER0("identity", L_IDENTITY, "x"),

    OTHER("sparse_categorical_crossentropy", B_LOSS, DDP_LOSS_SPARSE_CATEGORICAL, cce_params, "class index labels"),
    OTHER("categorical_crossentropy", B_LOSS, DDP_LOSS_CATEGORICAL, cce_params, "one-hot labels"),
    OTHER("binary_crossentropy", B_LOSS, DDP_LOSS_BINARY, from_logits, "0/1 labels per output"),
    OTHER0("mean_squared_error", B_LOSS, DDP_LOSS_MSE, "squared error per output"),

    OTHER("sgd", B_OPTIMIZER, DDP_OPT_SGD, sgd_params, "stochastic gradient descent with momentum"),
    OTHER("adam", B_OPTIMIZER, DDP_OPT_ADAM, adam_params, "Adam; weight decay added to the gradient"),
    OTHER("adamw", B_OPTIMIZER, DDP_OPT_ADAMW, adamw_params, "Adam with decoupled weight decay"),
    OTHER("lars", B_OPTIMIZER, DDP_OPT_LARS, lars_params,
          "SGD whose step for each parameter with weight decay is scaled by trust_coefficient x its norm / (its "
          "gradient's + weight_decay x its norm) (LARS, for large global batches)"),
    OTHER("lamb", B_OPTIMIZER, DDP_OPT_LAMB, lamb_params,
          "adamw whose step for each parameter with weight decay is scaled by its norm / the step's (LAMB, for large "
          "global batches)"),

    OTHER("constant", B_SCHEDULE, DDP_SCHEDULE_CONSTANT, constant_params, "the same rate throughout"),
    OTHER("step", B_SCHEDULE, DDP_SCHEDULE_STEP, step_params, "multiplied by drop every period, after a linear warm-up"),
    OTHER("cosine", B_SCHEDULE, DDP_SCHEDULE_COSINE, cosine_params, "linear warm-up, then cosine decay to final"),
    OTHER("linear", B_SCHEDULE, DDP_SCHEDULE_LINEAR, linear_params, "linear warm-up, then linear decay to final"),
    OTHER("multistep", B_SCHEDULE, DDP_SCHEDULE_MULTISTEP, multistep_params,
          "multiplied by drop at each milestone, after a linear warm-up"),

    OTHER0("accuracy", B_METRIC, DDP_METRIC_ACCURACY, "fraction of samples whose top class is right"),
    OTHER("top_k_accuracy", B_METRIC, DDP_METRIC_TOP_K, top_k_params, "fraction whose class is among the top k"),
    OTHER0("loss", B_METRIC, DDP_METRIC_LOSS, "the training loss"),
    OTHER0("mae", B_METRIC, DDP_METRIC_MAE, "mean absolute error"),

    OTHER("random_flip", B_AUGMENT, DDP_AUGMENT_FLIP, random_flip_params,
          "mirrors a training sample with probability 1/2 along each axis mode names"),
    OTHER("random_crop", B_AUGMENT, DDP_AUGMENT_CROP, random_crop_params,
          "a training sample padded with zeros, cropped back to its size (or to size, from larger images: "
          "the centre in validation) at a random place"),
    OTHER("random_cutout", B_AUGMENT, DDP_AUGMENT_CUTOUT, random_cutout_params,
          "a size x size square of a training sample, centred at a random place, set to zero"),
    OTHER("random_resized_crop", B_AUGMENT, DDP_AUGMENT_RESIZED_CROP, random_resized_crop_params,
          "a window of a training sample, of a random share (scale) of its area and shape (ratio, width / "
          "height) at a random place, resized to size (the centre in validation)"),
    OTHER("random_color", B_AUGMENT, DDP_AUGMENT_COLOR, random_color_params,
          "a training image's brightness, contrast and saturation scaled by factors drawn from [1 - x, 1 + x] and "
          "its hue turned by a shift drawn from [-hue, hue], in a random order (ColorJitter)"),
    OTHER("random_grayscale", B_AUGMENT, DDP_AUGMENT_GRAYSCALE, random_grayscale_params,
          "a training image made grey (each pixel 0.2989 R + 0.587 G + 0.114 B) with the probability"),
    OTHER("random_erasing", B_AUGMENT, DDP_AUGMENT_ERASING, random_erasing_params,
          "with the probability, a box of a training sample, of a random share (scale) of its area and shape "
          "(ratio) at a random place, set to the normalised zero or to random normal values (RandomErasing)"),
    OTHER("trivial_augment", B_AUGMENT, DDP_AUGMENT_TRIVIAL, trivial_augment_params,
          "one of fourteen changes of a training image (shears, translations, a rotation, colour, contrast, "
          "sharpness, posterize, solarize, autocontrast, equalize or none) at a random strength "
          "(TrivialAugmentWide)"),
    OTHER("rand_augment", B_AUGMENT, DDP_AUGMENT_RAND, rand_augment_params,
          "ops of trivial_augment's changes in a row, each drawn, at one strength: magnitude of bins "
          "(RandAugment)"),
    OTHER("auto_augment", B_AUGMENT, DDP_AUGMENT_AUTO, auto_augment_params,
          "one of the 25 pairs of changes of the policy learned on imagenet, cifar10 or svhn, each step with its "
          "probability (AutoAugment)"),
    OTHER("random_mixup", B_AUGMENT, DDP_AUGMENT_MIXUP, random_mixup_params,
          "a training sample and its labels mixed with another sample drawn at random, in a share drawn from "
          "Beta(alpha, alpha) (mixup)"),
    OTHER("random_cutmix", B_AUGMENT, DDP_AUGMENT_CUTMIX, random_cutmix_params,
          "a box of a training sample replaced by the same box of another drawn at random, the labels mixed by "
          "its area (CutMix)"),

    OTHER("idx", B_DATASET, DDP_DATA_IDX, idx_params, "MNIST-family IDX files, plain or .gz"),
    OTHER("cifar10", B_DATASET, DDP_DATA_CIFAR10, cifar10_params, "CIFAR-10 binary batches"),
    OTHER("npy", B_DATASET, DDP_DATA_NPY, npy_params, "NumPy .npy arrays"),
    OTHER("csv", B_DATASET, DDP_DATA_CSV, csv_params, "numeric CSV columns"),
    OTHER("token_file", B_DATASET, DDP_DATA_TOKENS, tokens_params,
          "a flat file of token indices: windows of them, each token's label the one after it"),
    OTHER("synthetic", B_DATASET, DDP_DATA_SYNTHETIC, synthetic_params, "random samples, for benchmarks"),

    OTHER("checkpoint", B_CHECKPOINT, 0, checkpoint_params, "periodic checkpoints in a folder"),
    OTHER("early_stopping", B_EARLY_STOPPING, 0, early_stopping_params,
          "training ends once a validation figure has not improved by more than min_delta for patience validations"),
    OTHER("on_plateau", B_ON_PLATEAU, 0, on_plateau_params,
          "the learning rate times factor (down to min_lr) each time a validation figure has not improved by more "
          "than min_delta for patience validations"),
    OTHER("slurm", B_CLUSTER, DDP_CLUSTER_SLURM, slurm_params, "the cluster from Slurm's environment"),
};
const int builtin_count = N(builtins);

const Builtin strategy_settings = OTHER("strategy", B_SETTINGS, 0, strategy_params, "strategy settings");
const Builtin train_settings = OTHER("train", B_SETTINGS, 0, train_params, "train settings");
const Builtin toplevel_train_settings =
    OTHER("train", B_SETTINGS, 0, toplevel_train_params, "train settings without a strategy");

const Builtin *builtin_find(const char *name) {
    for (int i = 0; i < builtin_count; i++)
        if (strcmp(builtins[i].name, name) == 0)
            return &builtins[i];
    return NULL;
}

/* The builtin of a kind whose contract code is code (the loss DDP_LOSS_MSE, ...). */
const Builtin *builtin_of(BuiltinKind kind, int64_t code) {
    for (int i = 0; i < builtin_count; i++)
        if (builtins[i].kind == kind && builtins[i].code == code)
            return &builtins[i];
    return NULL;
}

/* A word's index in its list, which for the lists above is its contract code; -1 if
 * it is not there. */
int word_code(const char *const *words, const char *w) {
    for (int i = 0; w && words[i]; i++)
        if (strcmp(words[i], w) == 0)
            return i;
    return -1;
}

const Param *builtin_param(const Builtin *b, const char *name, int *index) {
    for (int i = 0; i < b->nparams; i++)
        if (strcmp(b->params[i].name, name) == 0) {
            if (index)
                *index = i;
            return &b->params[i];
        }
    return NULL;
}

bool kind_takes_builtins(Kind k, BuiltinKind *out) {
    static const struct {
        Kind kind;
        BuiltinKind builtins;
    } takes[] = {
        {K_LOSS, B_LOSS}, {K_OPTIMIZER, B_OPTIMIZER}, {K_DATASET, B_DATASET}, {K_CHECKPOINT, B_CHECKPOINT},
        {K_METRIC, B_METRIC}, {K_METRICS, B_METRIC}, {K_AUGMENTS, B_AUGMENT}, {K_EARLY_STOPPING, B_EARLY_STOPPING},
        {K_ON_PLATEAU, B_ON_PLATEAU}, {K_LR, B_SCHEDULE}, {K_CLUSTER, B_CLUSTER},
    };
    for (size_t i = 0; i < sizeof takes / sizeof takes[0]; i++)
        if (takes[i].kind == k) {
            *out = takes[i].builtins;
            return true;
        }
    return false;
}

/* "a layer", "an optimizer" */
const char *builtin_kind_article(BuiltinKind k) {
    return k == B_OPTIMIZER ? "an" : "a";
}

const char *builtin_kind_name(BuiltinKind k) {
    static const char *const names[] = {
        [B_LAYER] = "layer", [B_LOSS] = "loss", [B_OPTIMIZER] = "optimizer",
        [B_SCHEDULE] = "schedule", [B_METRIC] = "metric", [B_AUGMENT] = "augmentation", [B_DATASET] = "dataset",
        [B_CHECKPOINT] = "checkpoint", [B_CLUSTER] = "cluster", [B_SETTINGS] = "settings",
        [B_EARLY_STOPPING] = "early stopping", [B_ON_PLATEAU] = "learning rate reduction",
    };
    return names[k];
}

bool word_in(const char *const *words, const char *w) {
    for (; words && *words; words++)
        if (strcmp(*words, w) == 0)
            return true;
    return false;
}

int word_count(const char *const *words) {
    int n = 0;
    while (words && words[n])
        n++;
    return n;
}

const char *words_list(Ddpc *c, const char *const *words, const char *conj) {
    StrBuf sb = {0};
    int n = word_count(words);
    for (int i = 0; i < n; i++)
        sb_printf(&sb, "%s%s", i == 0 ? "" : i == n - 1 ? conj : ", ", words[i]);
    const char *s = arena_strdup(c->arena, sb.data ? sb.data : "");
    sb_free(&sb);
    return s;
}

static const char *builtins_of_kind(BuiltinKind k) {
    switch (k) {
    case B_LOSS:
        return "sparse_categorical_crossentropy, categorical_crossentropy, binary_crossentropy "
               "or mean_squared_error";
    case B_OPTIMIZER:
        return "sgd, adam or adamw";
    case B_SCHEDULE:
        return "constant, step, cosine or linear";
    case B_METRIC:
        return "accuracy, top_k_accuracy, loss or mae";
    case B_AUGMENT:
        return "random_flip, random_crop, random_cutout, random_resized_crop, random_color, random_grayscale, "
               "random_erasing, trivial_augment, rand_augment, auto_augment, random_mixup or random_cutmix";
    default:
        return "";
    }
}

const char *kind_describe(const Param *p) {
    static char buf[256];
    switch (p->kind) {
    case K_ANY: return "a value";
    case K_INT:
        return p->flags & P_POSITIVE ? "a positive integer"
               : p->flags & P_NONNEG ? "a non-negative integer" : "an integer";
    case K_NUM:
        return p->flags & P_FRACTION ? "a number from 0 up to, not including, 1"
               : p->flags & P_POSITIVE ? "a positive number"
               : p->flags & P_NONNEG ? "a non-negative number" : "a number";
    case K_BOOL: return "true or false";
    case K_STR: return "a string";
    case K_WORD: {
        int n = 0;
        n += snprintf(buf + n, sizeof buf - (size_t)n, "one of");
        for (int i = 0; p->words[i]; i++)
            n += snprintf(buf + n, sizeof buf - (size_t)n, "%s %s", i ? "," : "", p->words[i]);
        return buf;
    }
    case K_DURATION: return "a duration such as `5 epochs` or `500 steps`";
    case K_DURATIONS: return "a duration or an ascending list of them in one unit, such as [30 epochs, 60 epochs]";
    case K_SHAPE: return "a shape such as [28, 28, 1]";
    case K_INT_PAIR: return "a positive integer or a pair [height, width]";
    case K_PADDING: return "same, valid, a non-negative integer or a pair [height, width]";
    case K_TENSOR: return "a value of the model";
    case K_LAYER: return "a layer, block or model";
    case K_LR:
        snprintf(buf, sizeof buf, "a positive number or a schedule (%s)", builtins_of_kind(B_SCHEDULE));
        return buf;
    case K_LOSS:
        snprintf(buf, sizeof buf, "a loss: %s", builtins_of_kind(B_LOSS));
        return buf;
    case K_OPTIMIZER:
        snprintf(buf, sizeof buf, "an optimizer: %s", builtins_of_kind(B_OPTIMIZER));
        return buf;
    case K_METRICS:
        snprintf(buf, sizeof buf, "a list of metrics: %s", builtins_of_kind(B_METRIC));
        return buf;
    case K_AUGMENTS:
        snprintf(buf, sizeof buf, "a list of augmentations: %s", builtins_of_kind(B_AUGMENT));
        return buf;
    case K_DATASET: return "a dataset";
    case K_CHECKPOINT: return "checkpoint(dir, every = ..., keep = ...)";
    case K_METRIC:
        snprintf(buf, sizeof buf, "a metric: %s", builtins_of_kind(B_METRIC));
        return buf;
    case K_EARLY_STOPPING: return "early_stopping(metric = ..., patience = ..., min_delta = ...)";
    case K_ON_PLATEAU: return "on_plateau(metric = ..., factor = ..., patience = ..., min_delta = ..., min_lr = ...)";
    case K_CLUSTER: return "auto, slurm, env, local or slurm(port_base = ...)";
    case K_STR_LIST: return "a list of strings";
    case K_NUMS:
        return p->flags & P_POSITIVE ? "a positive number or a list of them" : "a number or a list of numbers";
    case K_INT_RANGE: return "a range [low, high] of positive integers";
    case K_NUM_RANGE:
        return p->flags & P_UNIT ? "a range [low, high] of numbers above 0, at most 1"
                                 : "a range [low, high] of positive numbers";
    }
    return "?";
}

/* Names a program may not define: built-ins, settings, run-time scalars and the words
 * of the built-in enumerations, so that resolving a name by what is expected can never
 * pick between the user's meaning and the language's. */
bool is_reserved_name(const char *name, const char **what) {
    if (builtin_find(name)) {
        *what = builtin_kind_name(builtin_find(name)->kind);
        return true;
    }
    if (builtin_param(&toplevel_train_settings, name, NULL)) {
        *what = "setting";
        return true;
    }
    if (word_in(runtime_scalars, name)) {
        *what = "run-time scalar";
        return true;
    }
    if (strcmp(name, "none") == 0) {
        *what = "word";
        return true;
    }
    const char *const *word_sets[] = {padding_words, init_words, cluster_words,
                                      communication_words, precision_words, allreduce_words, strategy_kinds};
    for (size_t i = 0; i < sizeof word_sets / sizeof word_sets[0]; i++)
        if (word_in(word_sets[i], name)) {
            *what = "word";
            return true;
        }
    return false;
}
