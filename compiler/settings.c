/* settings.c: the program as a whole: the trained model expanded, the strategy and
 * train settings evaluated, and the checks that need both: loss against the model's
 * output, dataset against its input, metrics against the loss, one learning rate.
 * Models that can be checked on their own (an input shape, every parameter with a
 * default) are expanded too, and every top-level definition is evaluated, so an
 * unused one still reports its errors. */
#include <string.h>

#include "ddpc.h"
#include "../runtime/ddp_support.h"

static const Param dataset_param = {.name = "dataset", .kind = K_DATASET};

Value spec_setting(const TrainSpec *spec, const char *name) {
    int i;
    if (builtin_param(spec->train_sig, name, &i))
        return spec->train[i];
    if (builtin_param(spec->strategy_sig, name, &i))
        return spec->strategy[i];
    Value none = {.kind = V_NONE};
    return none;
}

static bool is_named(Value v, const char *name) {
    return v.kind == V_OBJECT && strcmp(v.builtin->name, name) == 0;
}

/* ------------------------------------------------------------- outputs */

/* Whether the model's last operation is this activation, as a layer or fused. */
static bool ends_in(Graph *g, const char *activation) {
    GNode *out = g->output;
    if (out->layer && strcmp(out->layer->name, activation) == 0)
        return true;
    return out->attrs.activation && strcmp(out->attrs.activation, activation) == 0;
}

static bool is_classification(Value loss) {
    return is_named(loss, "sparse_categorical_crossentropy") ||
           is_named(loss, "categorical_crossentropy") || is_named(loss, "binary_crossentropy");
}

static void check_loss(Ddpc *c, TrainSpec *spec, Value loss) {
    Graph *g = spec->graph;
    const Shape *out = &g->output->out;
    const char *shape = shape_text(c, out);
    bool categorical = is_named(loss, "sparse_categorical_crossentropy") ||
                       is_named(loss, "categorical_crossentropy");
    if (categorical && (out->rank == 0 || out->dim[out->rank - 1] < 2)) {
        diag_report(c, E_LOSS_MISMATCH, loss.loc,
                    "%s needs one score per class, an output [classes] or [..., classes] with 2 or more, "
                    "but `%s` outputs %s", loss.builtin->name, g->model, shape);
        if (out->rank == 1 && out->dim[0] == 1)
            diag_note(c, loss.loc, "with one output for two classes, use binary_crossentropy");
        return;
    }
    if (!is_classification(loss))
        return;
    bool logits = object_arg(loss, "from_logits").num != 0;
    const char *prob = categorical ? "softmax" : "sigmoid";
    bool ends_prob = ends_in(g, prob);
    if (logits && ends_prob) {
        diag_report(c, W_SOFTMAX_WITH_LOGITS, loss.loc,
                    "`%s` ends in %s, but the loss is told it outputs logits (from_logits = true)",
                    g->model, prob);
        diag_note(c, g->output->loc, "remove the final %s: the loss applies it, more precisely", prob);
    } else if (!logits && !ends_prob) {
        diag_report(c, W_LOGITS_AS_PROBABILITIES, loss.loc,
                    "%s expects probabilities (from_logits = false), but `%s` does not end in %s",
                    loss.builtin->name, g->model, prob);
        diag_note(c, loss.loc, "if the model outputs raw scores, write `from_logits = true`");
    }
}

/* ------------------------------------------------------------ datasets */

/* What a dataset's definition alone says of its samples; rank 0 when unknown. */
static void dataset_facts(Value ds, Shape *shape, int64_t *classes) {
    shape->rank = 0;
    *classes = 0;
    if (is_named(ds, "cifar10")) {
        *shape = (Shape){3, {32, 32, 3}};
        *classes = 10;
    } else if (is_named(ds, "synthetic")) {
        Value s = object_arg(ds, "shape");
        shape->rank = s.len;
        for (int i = 0; i < s.len; i++)
            shape->dim[i] = (int64_t)s.items[i].num;
        *classes = (int64_t)object_arg(ds, "classes").num;
    } else if (is_named(ds, "csv")) {
        *shape = (Shape){1, {object_arg(ds, "features").len}};
    } else if (is_named(ds, "token_file")) {
        *shape = (Shape){1, {(int64_t)object_arg(ds, "window").num}};
    }
}

static const char *dataset_name(Ddpc *c, Value ds) {
    return ds.decl ? arena_printf(c->arena, "`%s`", ds.decl->name)
                   : arena_printf(c->arena, "this %s dataset", ds.builtin->name);
}

/* Whether an augmentation makes images of its size from larger ones: random_crop with
 * a size, random_resized_crop. */
static bool makes_size(Value a) {
    return is_named(a, "random_resized_crop") || (is_named(a, "random_crop") && object_arg(a, "size").kind != V_NONE);
}

/* The window [height, width] that the dataset's first augmentation cuts from its images
 * where it makes their size (in training at a random place, resized or not; in
 * validation at the centre); false where it has none. Such a crop comes first in the
 * list (check_augments sees to it). */
static bool crop_window(Value ds, int64_t size[2]) {
    Value list = object_arg(ds, "augment");
    if (list.kind != V_LIST || list.len == 0 || !makes_size(list.items[0]))
        return false;
    value_pair(object_arg(list.items[0], "size"), size);
    return true;
}

/* A crop to a size makes the model input's height and width, before anything else. */
static void check_crop_size(Ddpc *c, TrainSpec *spec, Value a, int i) {
    const Shape *in = &spec->graph->input;
    const char *name = a.builtin->name;
    int64_t size[2];
    value_pair(object_arg(a, "size"), size);
    if (i > 0)
        diag_report(c, E_AUGMENT_MISMATCH, a.loc, "%s(size = ...) comes first in the list: it makes the "
                    "images the model's size, and the augmentations after it change those", name);
    else if (size[0] != in->dim[0] || size[1] != in->dim[1])
        diag_report(c, E_AUGMENT_MISMATCH, a.loc, "%s(size = [%lld, %lld]) makes images of %lld x %lld "
                    "pixels, but `%s` takes %s images: the size is the model input's height and width", name,
                    (long long)size[0], (long long)size[1], (long long)size[0], (long long)size[1],
                    spec->graph->model, shape_text(c, in));
}

/* Whether an augmentation mixes samples and their labels: random_mixup, random_cutmix. */
static bool mixes(Value a) {
    return is_named(a, "random_mixup") || is_named(a, "random_cutmix");
}

/* A mixing augmentation comes after the others (it mixes the samples they made) and
 * mixes labels, so the loss must take them as rows: not class indices. */
static void check_mixing(Ddpc *c, Value list, int i, Value loss) {
    Value a = list.items[i];
    if (i + 1 < list.len && !mixes(list.items[i + 1])) {
        diag_report(c, E_AUGMENT_MISMATCH, list.items[i + 1].loc, "%s comes after %s, which mixes the samples "
                    "the augmentations before it made", list.items[i + 1].builtin->name, a.builtin->name);
        diag_note(c, a.loc, "put random_mixup and random_cutmix last in the list");
    }
    if (is_named(loss, "sparse_categorical_crossentropy")) {
        diag_report(c, E_AUGMENT_MISMATCH, a.loc, "%s mixes the labels of two samples, but "
                    "sparse_categorical_crossentropy takes one class index per sample", a.builtin->name);
        diag_note(c, loss.loc, "use categorical_crossentropy: the same labels, made one-hot rows, then mixed");
    }
}

/* random_color changes grey or RGB images ([h, w], [h, w, 1] or [h, w, 3]), and the
 * saturation and hue of RGB ones alone; something must change, and a hue turns by at
 * most half the circle. */
/* The channels of the model's images, reported unless 1 or 3 (grey or RGB, all the
 * colour and auto augmentations change): 0 then. */
static int64_t grey_or_rgb(Ddpc *c, TrainSpec *spec, Value a) {
    const Shape *in = &spec->graph->input;
    int64_t channels = in->rank == 3 ? in->dim[2] : 1;
    if (channels == 1 || channels == 3)
        return channels;
    diag_report(c, E_AUGMENT_MISMATCH, a.loc, "%s changes grey or RGB images, of 1 or 3 channels, but `%s` takes %s",
                a.builtin->name, spec->graph->model, shape_text(c, in));
    return 0;
}

static void check_color(Ddpc *c, TrainSpec *spec, Value a) {
    const Shape *in = &spec->graph->input;
    int64_t channels = grey_or_rgb(c, spec, a);
    if (!channels)
        return;
    static const char *const spreads[] = {"brightness", "contrast", "saturation", "hue"};
    bool changes = false;
    for (int k = 0; k < 4; k++) {
        Value v = object_arg(a, spreads[k]);
        if (v.kind != V_NUM)
            return; /* a wrong argument, already reported */
        changes |= v.num > 0;
        if (k >= 2 && v.num > 0 && channels == 1)
            diag_report(c, E_AUGMENT_MISMATCH, v.loc, "random_color(%s = %s) changes the colours of RGB images, "
                        "but `%s` takes grey ones, %s: give only brightness and contrast", spreads[k],
                        value_text(c, v), spec->graph->model, shape_text(c, in));
        if (k == 3 && v.num > 0.5)
            diag_report(c, E_OUT_OF_RANGE, v.loc, "`hue` of random_color must be at most 0.5 (half the colour "
                        "circle either way), not %s", value_text(c, v));
    }
    if (!changes)
        diag_report(c, E_OUT_OF_RANGE, a.loc, "random_color changes nothing: give brightness, contrast, "
                    "saturation or hue above 0 (0.4, 0.4, 0.4 and 0.1 are usual)");
}

/* trivial_augment, rand_augment and auto_augment change grey or RGB images, with at
 * least two magnitudes; rand_augment's strength is one of them, and its operations a
 * sample at most DDP_MOST_IMAGE_OPS. */
static void check_auto_augment(Ddpc *c, TrainSpec *spec, Value a) {
    const char *name = a.builtin->name;
    grey_or_rgb(c, spec, a);
    Value bins = object_arg(a, "bins"), strength = object_arg(a, "magnitude"), ops = object_arg(a, "ops");
    if (bins.kind == V_NUM && bins.num < 2)
        diag_report(c, E_OUT_OF_RANGE, bins.loc, "`bins` of %s must be 2 or more (31 in torchvision's), not %s",
                    name, value_text(c, bins));
    if (bins.kind == V_NUM && strength.kind == V_NUM && strength.num >= bins.num)
        diag_report(c, E_OUT_OF_RANGE, strength.loc, "`magnitude` of rand_augment picks one of its %s bins, from 0 "
                    "to %lld, not %s", value_text(c, bins), (long long)bins.num - 1, value_text(c, strength));
    if (ops.kind == V_NUM && ops.num > DDP_MOST_IMAGE_OPS)
        diag_report(c, E_OUT_OF_RANGE, ops.loc, "`ops` of rand_augment must be at most %d, not %s",
                    DDP_MOST_IMAGE_OPS, value_text(c, ops));
}

/* Augmentations change images, [h, w] or [h, w, channels] (random_mixup any sample); a
 * crop must keep some of the image at every place it can be cut, and a cutout must
 * leave some of it. */
static void check_augments(Ddpc *c, TrainSpec *spec, Value ds, Value loss) {
    Value list = object_arg(ds, "augment");
    const Shape *in = &spec->graph->input;
    for (int i = 0; list.kind == V_LIST && i < list.len; i++) {
        Value a = list.items[i];
        if (mixes(a))
            check_mixing(c, list, i, loss);
        if (is_named(a, "random_mixup"))
            continue;
        if (in->rank != 2 && in->rank != 3) {
            diag_report(c, E_AUGMENT_MISMATCH, a.loc, "%s changes images, [height, width] or "
                        "[height, width, channels], but `%s` takes %s", a.builtin->name,
                        spec->graph->model, shape_text(c, in));
            return;
        }
        int64_t padding = (int64_t)object_arg(a, "padding").num;
        int64_t side = in->dim[0] < in->dim[1] ? in->dim[0] : in->dim[1];
        if (makes_size(a))
            check_crop_size(c, spec, a, i);
        if (is_named(a, "random_color"))
            check_color(c, spec, a);
        if (is_named(a, "trivial_augment") || is_named(a, "rand_augment") || is_named(a, "auto_augment"))
            check_auto_augment(c, spec, a);
        if (is_named(a, "random_grayscale") && !(in->rank == 3 && in->dim[2] == 3))
            diag_report(c, E_AUGMENT_MISMATCH, a.loc, "random_grayscale makes RGB images grey, [height, width, 3], "
                        "but `%s` takes %s", spec->graph->model, shape_text(c, in));
        if (is_named(a, "random_crop") && padding >= side) {
            diag_report(c, E_AUGMENT_MISMATCH, a.loc, "random_crop(padding = %lld) could cut a crop wholly "
                        "out of the padding of `%s`'s %s images", (long long)padding, spec->graph->model,
                        shape_text(c, in));
            diag_note(c, a.loc, "the padding must be less than the image's height and width (%lld here)",
                      (long long)side);
        }
        int64_t size = (int64_t)object_arg(a, "size").num;
        if (is_named(a, "random_cutout") && size >= side)
            diag_report(c, E_AUGMENT_MISMATCH, a.loc, "random_cutout(size = %lld) could erase the whole of `%s`'s "
                        "%s images: the size must be less than their height and width (%lld)", (long long)size,
                        spec->graph->model, shape_text(c, in), (long long)side);
    }
}

/* mean and std: one number, or one per value of the model input's last axis. */
static void check_normalization(Ddpc *c, TrainSpec *spec, Value ds) {
    const Shape *in = &spec->graph->input;
    int64_t last = in->rank ? in->dim[in->rank - 1] : 1;
    static const char *const names[] = {"mean", "std"};
    for (int i = 0; i < 2; i++) {
        Value v = object_arg(ds, names[i]);
        if (v.kind == V_LIST && v.len != 1 && v.len != last)
            diag_report(c, E_DATA_MISMATCH, v.loc, "`%s` of %s has %d values, but `%s` takes %s, whose last axis "
                        "has %lld: give one number, or one per value of that axis (an image's channels, a table's "
                        "features)", names[i], dataset_name(c, ds), v.len, spec->graph->model, shape_text(c, in),
                        (long long)last);
    }
}

static bool looks_up_tokens(const Graph *g) {
    for (int i = 0; i < g->nodes.len; i++)
        if (g->nodes.items[i]->op == L_EMBEDDING)
            return true;
    return false;
}

/* Token indices are read as they are: scaled, normalised or augmented they would be
 * other tokens. */
static void check_indices_as_read(Ddpc *c, TrainSpec *spec, Value ds) {
    static const char *const changes[] = {"scale", "mean", "std", "augment"};
    for (int i = 0; i < 4 && looks_up_tokens(spec->graph); i++) {
        Value v = object_arg(ds, changes[i]);
        if (v.kind == V_NONE || (i == 0 && v.num == 1))
            continue;
        diag_report(c, E_DATA_MISMATCH, v.loc.file ? v.loc : ds.loc, "`%s` changes the inputs of %s, but `%s` "
                    "looks them up as token indices, which must be read as they are", changes[i],
                    dataset_name(c, ds), spec->graph->model);
        return;
    }
}

/* trained: the dataset trained on (else the validation one) */
static void check_dataset(Ddpc *c, TrainSpec *spec, Value ds, Value loss, bool trained) {
    if (ds.kind != V_OBJECT)
        return;
    Graph *g = spec->graph;
    Shape shape;
    int64_t classes;
    dataset_facts(ds, &shape, &classes);
    int64_t window[2];
    if (shape.rank >= 2 && crop_window(ds, window) && shape.dim[0] >= window[0] && shape.dim[1] >= window[1])
        shape.dim[0] = window[0], shape.dim[1] = window[1]; /* what the model receives */
    if (shape.rank && (shape.rank != g->input.rank ||
                       memcmp(shape.dim, g->input.dim, sizeof(int64_t) * (size_t)shape.rank))) {
        diag_report(c, E_DATA_MISMATCH, ds.loc, "%s gives samples of shape %s, but `%s` takes %s",
                    dataset_name(c, ds), shape_text(c, &shape), g->model,
                    shape_text(c, &g->input));
        if (trained)
            diag_note(c, ds.loc, "to train `%s` on them, give it their shape: `train %s(input = %s, ...) on ...`",
                      g->model, g->model, shape_text(c, &shape));
    }
    bool categorical = is_named(loss, "sparse_categorical_crossentropy") ||
                       is_named(loss, "categorical_crossentropy");
    const Shape *out = &g->output->out;
    if (classes && categorical && out->rank && out->dim[out->rank - 1] != classes)
        diag_report(c, E_DATA_MISMATCH, ds.loc, "%s has %lld classes, but `%s` outputs %s",
                    dataset_name(c, ds), (long long)classes, g->model, shape_text(c, out));
    /* a file of tokens labels each position with the token after it */
    if (is_named(ds, "token_file") && (!categorical || out->rank != 2)) {
        diag_report(c, E_DATA_MISMATCH, ds.loc, "%s labels each of its %s tokens with the one after it, but `%s` "
                    "outputs %s%s", dataset_name(c, ds), fmt_number(c->arena, object_arg(ds, "window").num),
                    g->model, shape_text(c, out), categorical ? "" : arena_printf(c->arena, " for %s",
                    loss.kind == V_OBJECT ? loss.builtin->name : "its loss"));
        diag_note(c, ds.loc, "a language model outputs [tokens, vocab] scores, with sparse_categorical_crossentropy");
    }
    /* a class at each position needs labels of that shape: npy files, tokens, or synthetic ones */
    if (categorical && out->rank > 1 && !is_named(ds, "npy") && !is_named(ds, "token_file") &&
        !is_named(ds, "synthetic")) {
        Shape positions = *out;
        positions.rank--;
        diag_report(c, E_DATA_MISMATCH, ds.loc, "%s gives one class a sample, but `%s` outputs %s, a class at "
                    "each position of %s", dataset_name(c, ds), g->model, shape_text(c, out),
                    shape_text(c, &positions));
        if (g->output->op == L_DENSE) /* Keras's Dense: the last axis alone */
            diag_note(c, g->output->loc, "dense works on the last axis, each position apart; add `flatten` or "
                                         "`global_avgpool` before it");
    }
    check_normalization(c, spec, ds);
    check_indices_as_read(c, spec, ds);
    Value augment = object_arg(ds, "augment");
    bool cropped = crop_window(ds, window); /* validation takes its centre */
    if (trained || cropped)
        check_augments(c, spec, ds, loss);
    if (!trained && augment.kind == V_LIST && augment.len > cropped && !(ds.decl && ds.decl == spec->dataset.decl)) {
        const char *crop = cropped ? augment.items[0].builtin->name : "";
        diag_report(c, W_AUGMENT_IN_VALIDATION, ds.loc, "%s is augmented, but it is only validated on, "
                    "and validation reads samples as they are%s%s%s", dataset_name(c, ds),
                    cropped ? " (but for " : "", crop, cropped ? "(size = ...), which cuts their centre)" : "");
        if (cropped)
            diag_note(c, augment.loc, "keep only %s(size = ...) here, or train on this dataset", crop);
        else
            diag_note(c, augment.loc, "remove `augment` here, or train on this dataset");
    }
}

/* ------------------------------------------------------------- metrics */

static void check_metrics(Ddpc *c, TrainSpec *spec, Value metrics, Value loss) {
    if (metrics.kind != V_LIST || loss.kind != V_OBJECT)
        return;
    const Shape *out = &spec->graph->output->out;
    for (int i = 0; i < metrics.len; i++) {
        Value m = metrics.items[i];
        bool top_k = is_named(m, "top_k_accuracy");
        if ((top_k || is_named(m, "accuracy")) && !is_classification(loss)) {
            diag_report(c, E_METRIC_MISMATCH, m.loc,
                        "%s counts right classes, but %s is not a classification loss",
                        m.builtin->name, loss.builtin->name);
            diag_note(c, m.loc, "for regression, use mae");
            continue;
        }
        int64_t k = top_k ? (int64_t)object_arg(m, "k").num : 0;
        if (top_k && out->rank == 1 && k >= out->dim[0])
            diag_report(c, E_METRIC_MISMATCH, m.loc,
                        "top_k_accuracy with k = %lld is always 1 for a model with %lld outputs",
                        (long long)k, (long long)out->dim[0]);
    }
}

/* save_best, early_stopping and reduce_lr watch a validation figure: the loss, or one of the
 * metrics the run measures. */
static void check_watched(Ddpc *c, TrainSpec *spec, const char *setting, Value metric, Loc at) {
    Value validation = spec_setting(spec, "validation"), metrics = spec_setting(spec, "metrics");
    if (metric.kind != V_OBJECT || metrics.kind != V_LIST)
        return;
    if (validation.kind == V_NONE) {
        diag_report(c, E_NO_VALIDATION, at, "`%s` watches the validation figures, but this train block has no "
                    "`validation` dataset", setting);
        diag_note(c, at, "add `validation = ...` (a dataset the model is not trained on)");
        return;
    }
    if (config_watched_figure(metric, metrics) < 0) {
        diag_report(c, E_METRIC_MISMATCH, metric.loc, "`%s` watches %s, which is not among the run's metrics",
                    setting, value_text(c, metric));
        diag_note(c, metrics.loc, "add it to `metrics`");
    }
}

/* ----------------------------------------------------------------- train */

static void check_learning_rate(Ddpc *c, TrainSpec *spec) {
    Value opt = spec_setting(spec, "optimizer");
    Value lr = spec_setting(spec, "learning_rate");
    int i;
    if (opt.kind != V_OBJECT || lr.kind == V_NONE || lr.kind == V_POISON ||
        !builtin_param(opt.builtin, "learning_rate", &i) || !opt.slots || !opt.slots[i])
        return;
    int j;
    builtin_param(spec->train_sig, "learning_rate", &j);
    diag_report(c, E_LEARNING_RATE_TWICE, expr_span(spec->node->slots[j]),
                "the learning rate is given twice: here and in the optimizer");
    diag_note(c, expr_span(opt.slots[i]), "the optimizer's is here; keep one of them");
}

/* ema_warmup warms up an average: without ema there is none. */
static void check_ema_warmup(Ddpc *c, TrainSpec *spec) {
    Value opt = spec_setting(spec, "optimizer"), warmup = object_arg(opt, "ema_warmup");
    if (warmup.kind == V_BOOL && warmup.num != 0 && object_arg(opt, "ema").kind != V_NUM)
        diag_report(c, E_OUT_OF_RANGE, warmup.loc, "ema_warmup warms up the parameters' moving average, but %s has "
                    "no ema: give one too (ema = 0.9999, say)", opt.builtin->name);
}

/* Ports are 16-bit: a base or range beyond 65535 could never be listened on. */
static void check_ports(Ddpc *c, Value cluster) {
    Value base = object_arg(cluster, "port_base"), range = object_arg(cluster, "port_range");
    if (base.kind == V_NUM && base.num > 65535)
        diag_report(c, E_OUT_OF_RANGE, base.loc, "a port is at most 65535, not %s",
                    value_text(c, base));
    if (range.kind == V_LIST && range.items[1].num > 65535)
        diag_report(c, E_OUT_OF_RANGE, range.items[1].loc, "a port is at most 65535, not %s",
                    value_text(c, range.items[1]));
}

/* A learning rate written in train is the optimizer's: the optimizer then carries the
 * one rate in effect (a number, a run-time expression or a schedule). */
static void use_one_learning_rate(TrainSpec *spec) {
    Value opt = spec_setting(spec, "optimizer");
    Value lr = spec_setting(spec, "learning_rate");
    int i;
    if (opt.kind == V_OBJECT && lr.kind != V_NONE && lr.kind != V_POISON &&
        builtin_param(opt.builtin, "learning_rate", &i))
        opt.args[i] = lr;
}

/* What the configuration asks of the runtime that this version of it lacks: the table
 * of runtime/ddp_support.h, read the same way a built program reads it when it starts. */
static void check_runtime_support(Ddpc *c, const TrainSpec *spec, const ddp_settings *config) {
    bool asked[DDP_FEATURE_COUNT];
    ddp_features_asked(config, asked);
    for (int f = 0; f < DDP_FEATURE_COUNT; f++)
        if (asked[f] && !ddp_features[f].supported)
            diag_report(c, W_UNSUPPORTED_SETTING, spec_setting(spec, ddp_features[f].setting).loc,
                        "%s (a program built with it refuses to start)", ddp_features[f].refusal);
}

/* The train block's settings and dataset, evaluated (the model is expanded next). */
static void evaluate_train(Ddpc *c, Node *t) {
    TrainSpec *spec = arena_alloc(c->arena, sizeof *spec);
    c->spec = spec;
    spec->node = t;
    spec->train_sig = c->strategy ? &train_settings : &toplevel_train_settings;
    Signature sig = signature_of_builtin(spec->train_sig);
    spec->train = eval_args(c, NULL, &sig, t->slots, "the train block", t->loc);
    if (c->strategy) {
        spec->strategy_sig = &strategy_settings;
        spec->strategy = c->strategy_values;
    } else {
        spec->strategy_sig = spec->train_sig;
        spec->strategy = spec->train;
        check_ports(c, spec_setting(spec, "cluster"));
    }
    spec->dataset = eval_arg(c, NULL, t->b, &dataset_param, "train");
}

void settings_evaluate(Ddpc *c) {
    if (c->diag.stopped)
        return;
    if (c->strategy) {
        Signature sig = signature_of_builtin(&strategy_settings);
        c->strategy_values = eval_args(c, NULL, &sig, c->strategy->slots, "the strategy block",
                                       c->strategy->loc);
        int cluster;
        builtin_param(&strategy_settings, "cluster", &cluster);
        check_ports(c, c->strategy_values[cluster]);
    }
    if (c->train)
        evaluate_train(c, c->train);
}

/* ------------------------------------------------------------ repeats */

/* augment_repeats shows each sample several times, for its augmentations to differ. */
static void check_repeats(Ddpc *c, TrainSpec *spec) {
    Value repeats = spec_setting(spec, "augment_repeats"), augment = object_arg(spec->dataset, "augment");
    if (repeats.kind != V_NUM || repeats.num <= 1 || spec->dataset.kind != V_OBJECT ||
        (augment.kind == V_LIST && augment.len > 0) || augment.kind == V_OBJECT)
        return;
    diag_report(c, W_REPEATS_WITHOUT_AUGMENT, repeats.loc, "augment_repeats = %g shows each sample %g times in a row "
                "for its augmentations to differ, but %s has none: the copies are the same sample", repeats.num,
                repeats.num, dataset_name(c, spec->dataset));
    diag_note(c, spec->dataset.loc, "give it `augment = [...]`, or leave augment_repeats at 1");
}

/* ------------------------------------------------------------ decay groups */

/* A group's own weight decay on a model without parameters of that group: a mistake,
 * or a program written for another model. */
static void check_decay_groups(Ddpc *c, TrainSpec *spec) {
    Value opt = spec_setting(spec, "optimizer");
    Value biases = object_arg(opt, "bias_weight_decay"), norms = object_arg(opt, "norm_weight_decay");
    bool has_biases = false, has_norms = false;
    for (int i = 0; i < spec->graph->nodes.len; i++) {
        const GNode *n = spec->graph->nodes.items[i];
        has_biases |= (n->op == L_DENSE || n->op == L_CONV2D || n->op == L_DEPTHWISE_CONV2D) && n->attrs.bias;
        has_norms |= n->op == L_BATCHNORM || n->op == L_LAYERNORM;
    }
    if (biases.kind != V_NONE && biases.kind != V_POISON && !has_biases)
        diag_report(c, W_DECAY_GROUP_EMPTY, biases.loc, "`%s` has no biases (its dense and convolution layers all have "
                    "bias = false): bias_weight_decay changes nothing", spec->graph->model);
    if (norms.kind != V_NONE && norms.kind != V_POISON && !has_norms)
        diag_report(c, W_DECAY_GROUP_EMPTY, norms.loc,
                    "`%s` has no batchnorm or layernorm: norm_weight_decay changes nothing", spec->graph->model);
}

/* lars and lamb adapt the step of a parameter with weight decay alone (timm's rule,
 * which keeps biases and normalisations out by their decay of 0): with every decay 0
 * they are sgd and adamw. */
static void check_trust_decay(Ddpc *c, TrainSpec *spec) {
    Value opt = spec_setting(spec, "optimizer");
    if (opt.kind != V_OBJECT || opt.builtin->kind != B_OPTIMIZER ||
        (opt.builtin->code != DDP_OPT_LARS && opt.builtin->code != DDP_OPT_LAMB))
        return;
    static const char *const decays[] = {"weight_decay", "bias_weight_decay", "norm_weight_decay"};
    for (int i = 0; i < 3; i++) {
        Value v = object_arg(opt, decays[i]);
        if (v.kind != V_NONE && (v.kind != V_NUM || v.num != 0))
            return; /* a decay that is not 0, or not known until the job starts */
    }
    Value momentum = object_arg(opt, "momentum");
    const char *as = opt.builtin->code == DDP_OPT_LAMB ? "adamw" : momentum.num > 0 ? "sgd with momentum" : "sgd";
    diag_report(c, W_TRUST_WITHOUT_DECAY, opt.loc, "%s with every weight decay 0 adapts no parameter's step: it "
                "trains as %s", opt.builtin->name, as);
    diag_note(c, opt.loc, "give it `weight_decay = ...` (with `bias_weight_decay = 0, norm_weight_decay = 0` "
              "to keep biases and normalisations out, as usual)");
}

/* ------------------------------------------------------------ schedules */

/* A duration of the schedule in epochs that the run never reaches: a typo, or a
 * schedule written for a longer run. */
static void check_past_end(Ddpc *c, Value schedule, Value at, const char *what, const char *effect, Value epochs) {
    if (at.kind != V_DURATION || at.unit != UNIT_EPOCHS || at.num < epochs.num)
        return;
    diag_report(c, W_SCHEDULE_PAST_END, at.loc.file ? at.loc : schedule.loc,
                "%s's %s %s is at or past the run's end, after %g epoch%s: %s", schedule.builtin->name, what,
                value_text(c, at), epochs.num, epochs.num == 1 ? "" : "s", effect);
}

static void check_schedule(Ddpc *c, TrainSpec *spec) {
    Value lr = object_arg(spec_setting(spec, "optimizer"), "learning_rate"), epochs = spec_setting(spec, "epochs");
    if (lr.kind != V_OBJECT || lr.builtin->kind != B_SCHEDULE || epochs.kind != V_NUM)
        return;
    check_past_end(c, lr, object_arg(lr, "warmup"), "warm-up of", "the rate never leaves it", epochs);
    check_past_end(c, lr, object_arg(lr, "every"), "period of", "the rate never drops", epochs);
    Value milestones = object_arg(lr, "milestones");
    for (int i = 0; milestones.kind == V_LIST && i < milestones.len; i++)
        check_past_end(c, lr, milestones.items[i], "milestone", "the rate never drops there", epochs);
}

/* The settings against the trained model, once it is expanded; then the configuration. */
static void check_train(Ddpc *c, TrainSpec *spec) {
    check_learning_rate(c, spec);
    check_ema_warmup(c, spec);
    check_repeats(c, spec);
    use_one_learning_rate(spec);
    check_schedule(c, spec);
    if (!spec->graph)
        return;
    check_decay_groups(c, spec);
    check_trust_decay(c, spec);
    Value loss = spec_setting(spec, "loss");
    if (loss.kind == V_OBJECT)
        check_loss(c, spec, loss);
    check_dataset(c, spec, spec->dataset, loss, true);
    Value validation = spec_setting(spec, "validation");
    check_dataset(c, spec, validation, loss, false);
    if (validation.kind == V_OBJECT && validation.decl && validation.decl == spec->dataset.decl)
        diag_report(c, W_VALIDATION_IS_TRAINING, validation.loc,
                    "validation on the training dataset measures memory, not generalisation");
    check_metrics(c, spec, spec_setting(spec, "metrics"), loss);
    Value best = spec_setting(spec, "save_best"), stopping = spec_setting(spec, "early_stopping");
    check_watched(c, spec, "save_best", best, best.loc);
    check_watched(c, spec, "early_stopping", object_arg(stopping, "metric"), stopping.loc);
    Value plateau = spec_setting(spec, "reduce_lr");
    check_watched(c, spec, "reduce_lr", object_arg(plateau, "metric"), plateau.loc);
    if (c->diag.errors)
        return;
    c->config = config_build(c, spec);
    check_runtime_support(c, spec, c->config);
}

void settings_check(Ddpc *c) {
    if (c->diag.stopped)
        return;
    if (c->spec)
        check_train(c, c->spec);
    for (int i = 0; i < c->items.len && !c->diag.stopped; i++) {
        Node *n = c->items.items[i];
        if (n->kind == N_LET || n->kind == N_DATASET)
            global_value(c, n);
    }
}

/* ------------------------------------------------------------- printing */

static void print_settings(Ddpc *c, FILE *out, const Builtin *sig, const Value *values,
                           const char *only_kind) {
    int width = 0;
    for (int i = 0; i < sig->nparams; i++)
        if (!only_kind || builtin_param(only_kind[0] == 's' ? &strategy_settings : &train_settings,
                                        sig->params[i].name, NULL))
            width = (int)strlen(sig->params[i].name) > width ? (int)strlen(sig->params[i].name) : width;
    for (int i = 0; i < sig->nparams; i++) {
        const char *name = sig->params[i].name;
        if (only_kind && !builtin_param(only_kind[0] == 's' ? &strategy_settings : &train_settings,
                                        name, NULL))
            continue;
        fprintf(out, "    %-*s = %s\n", width, name, value_text(c, values[i]));
    }
}

void settings_print(Ddpc *c, FILE *out) {
    for (int i = 0; i < c->items.len; i++) {
        Node *n = c->items.items[i];
        if (n->kind == N_DATASET && n->value && n->value->kind == V_OBJECT)
            fprintf(out, "dataset %s = %s\n", n->name, object_text(c, *n->value));
    }
    TrainSpec *spec = c->spec;
    if (!spec) {
        if (c->strategy_values) {
            fprintf(out, "strategy %s\n", c->strategy->name);
            print_settings(c, out, &strategy_settings, c->strategy_values, NULL);
        }
        return;
    }
    if (c->strategy) {
        fprintf(out, "strategy %s\n", c->strategy->name);
        print_settings(c, out, &strategy_settings, c->strategy_values, NULL);
    } else {
        fprintf(out, "strategy (none: train's own settings and the defaults)\n");
        print_settings(c, out, spec->train_sig, spec->train, "strategy");
    }
    Node *m = spec->node->a;
    fprintf(out, "train %s on %s\n", m->has_parens ? expr_text(c, m) : m->name,
            value_text(c, spec->dataset));
    print_settings(c, out, spec->train_sig, spec->train, c->strategy ? NULL : "train");
}
