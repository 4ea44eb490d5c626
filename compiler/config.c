/* config.c: the checked program's configuration as one typed structure: the
 * contract's ddp_settings (runtime/ddp_abi.h), every default filled in, every choice
 * (loss, optimizer, schedule, metric, dataset kind, cluster, communication,
 * precision) as the contract's code. It is the last stage that reads settings and
 * the arguments of built-ins by name; the lowering, code generation and the program's
 * description read c->config, and the runtime reads the copy emitted into the program. */
#include <string.h>

#include "ddpc.h"
#include "../runtime/ddp_abi.h"

/* ---------------------------------------------------------------- values */

static double num_arg(Value obj, const char *name, double otherwise) {
    Value v = object_arg(obj, name);
    return v.kind == V_NUM || v.kind == V_BOOL ? v.num : otherwise;
}

static const char *str_arg(Value obj, const char *name) {
    Value v = object_arg(obj, name);
    return v.kind == V_STR ? v.str : NULL;
}

static ddp_duration duration_of(Value v) {
    if (v.kind != V_DURATION)
        return (ddp_duration){.value = 0, .unit = 0};
    return (ddp_duration){.value = (int64_t)v.num, .unit = v.unit == UNIT_EPOCHS ? DDP_UNIT_EPOCHS : DDP_UNIT_STEPS};
}

static int count_instrs(const RtExpr *x) {
    return x->kind == RT_CONST || x->kind == RT_SCALAR ? 1
           : x->kind == RT_NEG                        ? 1 + count_instrs(x->a)
                                                      : 1 + count_instrs(x->a) + count_instrs(x->b);
}

/* x in postfix order into code from *at */
static void rt_code(const RtExpr *x, ddp_rt_instr *code, int *at) {
    static const int64_t ops[] = {[OP_ADD] = DDP_RT_ADD, [OP_SUB] = DDP_RT_SUB, [OP_MUL] = DDP_RT_MUL,
                                  [OP_DIV] = DDP_RT_DIV};
    static const int64_t scalars[] = {[RT_REPLICAS] = DDP_RT_REPLICAS, [RT_WORKERS] = DDP_RT_WORKERS,
                                      [RT_GLOBAL_BATCH] = DDP_RT_GLOBAL_BATCH};
    switch (x->kind) {
    case RT_CONST: code[(*at)++] = (ddp_rt_instr){.op = DDP_RT_CONST, .value = x->num}; break;
    case RT_SCALAR: code[(*at)++] = (ddp_rt_instr){.op = scalars[x->scalar]}; break;
    case RT_NEG:
        rt_code(x->a, code, at);
        code[(*at)++] = (ddp_rt_instr){.op = DDP_RT_NEG};
        break;
    case RT_BINARY:
        rt_code(x->a, code, at);
        rt_code(x->b, code, at);
        code[(*at)++] = (ddp_rt_instr){.op = ops[x->op]};
        break;
    }
}

/* A number, or an expression of replicas, workers and global_batch, as a program of
 * the runtime's stack machine; a missing value is 0. */
static ddp_rt_expr rt_expr_of(Ddpc *c, Value v) {
    int n = v.kind == V_RUNTIME ? count_instrs(v.rt) : 1, at = 0;
    ddp_rt_instr *code = arena_alloc(c->arena, sizeof *code * (size_t)n);
    if (v.kind == V_RUNTIME)
        rt_code(v.rt, code, &at);
    else
        code[0] = (ddp_rt_instr){.op = DDP_RT_CONST, .value = v.kind == V_NUM ? v.num : 0};
    return (ddp_rt_expr){.code = code, .count = n};
}

/* ------------------------------------------------------------- the parts */

static ddp_schedule schedule_of(Ddpc *c, Value lr) {
    Value none = {.kind = V_NONE};
    if (lr.kind != V_OBJECT)
        return (ddp_schedule){.kind = DDP_SCHEDULE_CONSTANT, .rate = rt_expr_of(c, lr), .drop = rt_expr_of(c, none),
                              .final = rt_expr_of(c, none)};
    ddp_schedule s = {.kind = lr.builtin->code, .rate = rt_expr_of(c, lr.args[0]),
                      .drop = rt_expr_of(c, object_arg(lr, "drop")), .final = rt_expr_of(c, object_arg(lr, "final")),
                      .period = duration_of(object_arg(lr, "every")), .warmup = duration_of(object_arg(lr, "warmup"))};
    Value milestones = object_arg(lr, "milestones");
    if (milestones.kind == V_LIST) {
        int64_t *at = arena_alloc(c->arena, sizeof *at * (size_t)milestones.len);
        for (int i = 0; i < milestones.len; i++)
            at[i] = duration_of(milestones.items[i]).value;
        s.milestones = at;
        s.nmilestones = milestones.len;
        s.milestone_unit = duration_of(milestones.items[0]).unit;
    }
    return s;
}

/* A group's weight decay: its own where set, else weight_decay's. */
static ddp_rt_expr group_decay(Ddpc *c, Value opt, const char *name, int64_t *groups) {
    Value v = object_arg(opt, name);
    if (v.kind != V_NONE)
        *groups = 1;
    return rt_expr_of(c, v.kind != V_NONE ? v : object_arg(opt, "weight_decay"));
}

static ddp_optimizer optimizer_of(Ddpc *c, Value opt) {
    ddp_optimizer o = {.kind = opt.builtin->code,
                       .learning_rate = schedule_of(c, object_arg(opt, "learning_rate")),
                       .weight_decay = rt_expr_of(c, object_arg(opt, "weight_decay")),
                       .momentum = num_arg(opt, "momentum", 0),
                       .beta1 = num_arg(opt, "beta1", 0),
                       .beta2 = num_arg(opt, "beta2", 0),
                       .epsilon = num_arg(opt, "epsilon", 0),
                       .trust_coefficient = num_arg(opt, "trust_coefficient", 0),
                       .nesterov = (int64_t)num_arg(opt, "nesterov", 0),
                       .clip_norm = num_arg(opt, "clip_norm", 0),
                       .ema = num_arg(opt, "ema", 0),
                       .ema_warmup = num_arg(opt, "ema_warmup", 0) != 0};
    /* sgd and lars keep a velocity only with momentum; adam, adamw and lamb two moments;
     * ema its average after them */
    bool adam = o.kind == DDP_OPT_ADAM || o.kind == DDP_OPT_ADAMW || o.kind == DDP_OPT_LAMB;
    o.state_vectors = (adam ? 2 : o.momentum > 0 ? 1 : 0) + (o.ema > 0);
    o.bias_weight_decay = group_decay(c, opt, "bias_weight_decay", &o.decay_groups);
    o.norm_weight_decay = group_decay(c, opt, "norm_weight_decay", &o.decay_groups);
    return o;
}

/* A range [low, high] of an object, or [0, 0] where it has none. */
static void range_arg(Value obj, const char *name, double out[2]) {
    Value v = object_arg(obj, name);
    bool given = v.kind == V_LIST && v.len == 2;
    out[0] = given ? v.items[0].num : 0;
    out[1] = given ? v.items[1].num : 0;
}

/* The dataset's augmentations, in the order they apply. */
static void augments_of(Ddpc *c, Value list, ddp_dataset *d) {
    if (list.kind != V_LIST)
        return;
    ddp_augment *a = arena_alloc(c->arena, sizeof *a * (size_t)(list.len + 1));
    for (int i = 0; i < list.len; i++) {
        Value mode = object_arg(list.items[i], "mode"), size = object_arg(list.items[i], "size");
        Value value = object_arg(list.items[i], "value"), resampling = object_arg(list.items[i], "interpolation");
        Value policy = object_arg(list.items[i], "policy");
        int64_t kind = list.items[i].builtin->code;
        bool window = kind == DDP_AUGMENT_CROP || kind == DDP_AUGMENT_RESIZED_CROP; /* size: a window's */
        const char *sizes = window ? "" : kind == DDP_AUGMENT_TRIVIAL || kind == DDP_AUGMENT_RAND ? "bins" : "size";
        int64_t hw[2] = {0, 0};
        double scale[2], ratio[2];
        if (window && size.kind != V_NONE)
            value_pair(size, hw);
        range_arg(list.items[i], "scale", scale);
        range_arg(list.items[i], "ratio", ratio);
        a[i] = (ddp_augment){.kind = kind,
                             .mode = mode.kind == V_WORD ? word_code(flip_words, mode.str)
                                     : value.kind == V_WORD ? word_code(erase_words, value.str)
                                     : resampling.kind == V_WORD ? word_code(interpolation_words, resampling.str)
                                                                 : 0,
                             .padding = (int64_t)num_arg(list.items[i], "padding", 0),
                             .size = (int64_t)num_arg(list.items[i], sizes, 0),
                             .height = hw[0],
                             .width = hw[1],
                             .scale_min = scale[0],
                             .scale_max = scale[1],
                             .ratio_min = ratio[0],
                             .ratio_max = ratio[1],
                             .alpha = num_arg(list.items[i], "alpha", 0),
                             .brightness = num_arg(list.items[i], "brightness", 0),
                             .contrast = num_arg(list.items[i], "contrast", 0),
                             .saturation = num_arg(list.items[i], "saturation", 0),
                             .hue = num_arg(list.items[i], "hue", 0),
                             .probability = num_arg(list.items[i], "probability", 0),
                             .ops = (int64_t)num_arg(list.items[i], "ops", 0),
                             .strength = (int64_t)num_arg(list.items[i], "magnitude", 0),
                             .policy = policy.kind == V_WORD ? word_code(policy_words, policy.str) : 0};
    }
    d->augment = a;
    d->naugment = list.len;
}

/* mean and std, each one number or one per value of the last axis (the checker saw to
 * it), as pairs: none when neither is given. */
static void normalize_of(Ddpc *c, Value ds, ddp_dataset *d) {
    Value mean = object_arg(ds, "mean"), std = object_arg(ds, "std");
    int n = mean.kind == V_LIST ? mean.len : 0;
    if (std.kind == V_LIST && std.len > n)
        n = std.len;
    ddp_channel *ch = arena_alloc(c->arena, sizeof *ch * (size_t)(n + 1));
    for (int i = 0; i < n; i++)
        ch[i] = (ddp_channel){.mean = mean.kind == V_LIST ? mean.items[mean.len == 1 ? 0 : i].num : 0,
                              .std = std.kind == V_LIST ? std.items[std.len == 1 ? 0 : i].num : 1};
    d->normalize = ch;
    d->nnormalize = n;
}

static ddp_dataset dataset_of(Ddpc *c, Value ds) {
    ddp_dataset d = {.name = "", .kind = -1, .scale = 1};
    if (ds.kind != V_OBJECT)
        return d;
    static const char *const paths[][2] = {[DDP_DATA_IDX] = {"images", "labels"}, [DDP_DATA_CIFAR10] = {"dir", NULL},
                                           [DDP_DATA_NPY] = {"inputs", "labels"}, [DDP_DATA_CSV] = {"path", NULL},
                                           [DDP_DATA_TOKENS] = {"path", NULL},
                                           [DDP_DATA_SYNTHETIC] = {NULL, NULL}};
    d.name = ds.decl ? ds.decl->name : "";
    d.kind = ds.builtin->code;
    for (int i = 0; i < 2; i++)
        d.path[i] = paths[d.kind][i] ? str_arg(ds, paths[d.kind][i]) : NULL;
    d.scale = num_arg(ds, "scale", 1);
    Value part = object_arg(ds, "part");
    d.part = part.kind == V_WORD ? word_code(part_words, part.str) : 0;
    d.header = (int64_t)num_arg(ds, "header", 0);
    Value features = object_arg(ds, "features");
    if (features.kind == V_LIST) {
        const char **names = arena_alloc(c->arena, sizeof *names * (size_t)(features.len + 1));
        for (int i = 0; i < features.len; i++)
            names[i] = features.items[i].str;
        d.features = names;
        d.nfeatures = features.len;
    }
    d.target = str_arg(ds, "target");
    d.classes = (int64_t)num_arg(ds, "classes", 0);
    d.window = (int64_t)num_arg(ds, "window", 0);
    Value type = object_arg(ds, "type");
    d.token_bytes = type.kind == V_WORD ? (int64_t)1 << word_code(token_words, type.str) : 0;
    d.samples = (int64_t)num_arg(ds, "samples", 0);
    normalize_of(c, ds, &d);
    augments_of(c, object_arg(ds, "augment"), &d);
    return d;
}

/* The metrics; each pair of accumulators after the loss's own (pair 0). */
static void metrics_of(Ddpc *c, Value ms, ddp_settings *s) {
    ddp_metric *m = arena_alloc(c->arena, sizeof *m * (size_t)(ms.len + 1));
    for (int i = 0; i < ms.len; i++) {
        const Builtin *b = ms.items[i].builtin;
        m[i] = (ddp_metric){.name = b->name, .kind = b->code, .k = (int64_t)num_arg(ms.items[i], "k", 0),
                            .pair = b->code == DDP_METRIC_LOSS ? 0 : 1 + i};
    }
    s->metrics = m;
    s->nmetrics = ms.len;
}

int64_t config_watched_figure(Value metric, Value metrics) {
    if (metric.kind != V_OBJECT)
        return -1;
    if (metric.builtin->code == DDP_METRIC_LOSS)
        return 0;
    for (int i = 0; metrics.kind == V_LIST && i < metrics.len; i++)
        if (metrics.items[i].builtin == metric.builtin &&
            num_arg(metrics.items[i], "k", 0) == num_arg(metric, "k", 0))
            return 1 + i;
    return -1;
}

static int64_t word_setting(const TrainSpec *spec, const char *name, const char *const *words) {
    Value v = spec_setting(spec, name);
    int code = v.kind == V_WORD ? word_code(words, v.str) : -1;
    return code < 0 ? 0 : code;
}

static int64_t int_setting(const TrainSpec *spec, const char *name, int64_t otherwise) {
    Value v = spec_setting(spec, name);
    return v.kind == V_NUM || v.kind == V_BOOL ? (int64_t)v.num : otherwise;
}

/* ----------------------------------------------------------------- build */

const ddp_settings *config_build(Ddpc *c, const TrainSpec *spec) {
    ddp_settings *s = arena_alloc(c->arena, sizeof *s);
    Value cluster = spec_setting(spec, "cluster");
    s->cluster = cluster.kind == V_OBJECT ? cluster.builtin->code : word_setting(spec, "cluster", cluster_words);
    s->port_base = (int64_t)num_arg(cluster, "port_base", -1);
    Value range = object_arg(cluster, "port_range");
    s->port_range[0] = range.kind == V_LIST ? (int64_t)range.items[0].num : 10000;
    s->port_range[1] = range.kind == V_LIST ? (int64_t)range.items[1].num : 20000;
    s->communication = word_setting(spec, "communication", communication_words);
    s->batch_per_replica = int_setting(spec, "batch_per_replica", 1);
    s->gpus_per_worker = int_setting(spec, "gpus_per_worker", 1);
    s->seed = int_setting(spec, "seed", 0);
    s->shuffle = int_setting(spec, "shuffle", 1);
    s->augment_repeats = int_setting(spec, "augment_repeats", 1);
    s->drop_remainder = int_setting(spec, "drop_remainder", 1);
    s->accumulate_batches = int_setting(spec, "accumulate_batches", 1);
    s->precision = word_setting(spec, "precision", precision_words);
    s->allreduce_precision = word_setting(spec, "allreduce_precision", allreduce_words);
    s->epochs = int_setting(spec, "epochs", 1);
    s->steps_per_epoch = int_setting(spec, "steps_per_epoch", -1);
    s->validate_every = duration_of(spec_setting(spec, "validate_every"));
    Value checkpoint = spec_setting(spec, "checkpoint");
    s->checkpoint_dir = str_arg(checkpoint, "dir");
    s->checkpoint_every = duration_of(object_arg(checkpoint, "every"));
    s->checkpoint_keep = (int64_t)num_arg(checkpoint, "keep", 0);
    Value metrics = spec_setting(spec, "metrics"), stopping = spec_setting(spec, "early_stopping");
    s->save_best = config_watched_figure(spec_setting(spec, "save_best"), metrics);
    s->early_stopping = config_watched_figure(object_arg(stopping, "metric"), metrics);
    s->early_stopping_patience = (int64_t)num_arg(stopping, "patience", 0);
    s->early_stopping_min_delta = num_arg(stopping, "min_delta", 0);
    Value plateau = spec_setting(spec, "reduce_lr");
    s->reduce_lr = config_watched_figure(object_arg(plateau, "metric"), metrics);
    s->reduce_lr_factor = num_arg(plateau, "factor", 1);
    s->reduce_lr_patience = (int64_t)num_arg(plateau, "patience", 0);
    s->reduce_lr_min_delta = num_arg(plateau, "min_delta", 0);
    s->reduce_lr_min = num_arg(plateau, "min_lr", 0);
    s->train = dataset_of(c, spec->dataset);
    s->validation = dataset_of(c, spec_setting(spec, "validation"));
    Value loss = spec_setting(spec, "loss");
    s->loss = loss.builtin->code;
    s->from_logits = (int64_t)num_arg(loss, "from_logits", 0);
    s->label_smoothing = num_arg(loss, "label_smoothing", 0);
    metrics_of(c, spec_setting(spec, "metrics"), s);
    s->optimizer = optimizer_of(c, spec_setting(spec, "optimizer")); /* the learning rate in effect */
    return s;
}
