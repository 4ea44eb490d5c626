/* graph_print.c: `ddpc emit --stage=graph`, the layer graph as a stable text table.
 *
 * One row per layer instance after expansion: its number, full name, layer, the rows
 * it reads, input and output shapes per sample, parameters, multiply-accumulates per
 * sample, and the settled attributes (explicit padding, activation). Columns are as
 * wide as their widest cell, so the text depends on the program only. */
#include <string.h>

#include "ddpc.h"
#include "../runtime/ddp_abi.h"

enum { COLS = 8 };

static const char *pair_text(Ddpc *c, const int64_t v[2]) {
    if (v[0] == v[1])
        return arena_printf(c->arena, "%lld", (long long)v[0]);
    return arena_printf(c->arena, "%lldx%lld", (long long)v[0], (long long)v[1]);
}

static const char *details(Ddpc *c, GNode *n) {
    const LayerAttrs *a = &n->attrs;
    StrBuf sb = {0};
    switch (n->op) {
    case L_CONV2D:
        sb_printf(&sb, "%lld filters, ", (long long)a->units);
        /* fall through */
    case L_DEPTHWISE_CONV2D:
    case L_MAXPOOL:
    case L_AVGPOOL:
        if (n->op == L_DEPTHWISE_CONV2D && a->units != n->inputs[0]->out.dim[2])
            sb_printf(&sb, "multiplier %lld, ", (long long)(a->units / n->inputs[0]->out.dim[2]));
        sb_printf(&sb, "%s %lldx%lld, stride %s", n->op == L_MAXPOOL || n->op == L_AVGPOOL ? "window" : "kernel",
                  (long long)a->kernel[0], (long long)a->kernel[1], pair_text(c, a->stride));
        if (a->dilation[0] != 1 || a->dilation[1] != 1)
            sb_printf(&sb, ", dilation %s", pair_text(c, a->dilation));
        sb_printf(&sb, ", pad %lld,%lld,%lld,%lld", (long long)a->pad[0], (long long)a->pad[1],
                  (long long)a->pad[2], (long long)a->pad[3]);
        if (a->padding)
            sb_printf(&sb, " (%s)", a->padding);
        break;
    case L_DENSE:
        sb_printf(&sb, "%lld unit%s", (long long)a->units, a->units == 1 ? "" : "s");
        break;
    case L_BATCHNORM:
        sb_printf(&sb, "momentum %s, epsilon %s", fmt_number(c->arena, a->momentum),
                  fmt_number(c->arena, a->epsilon));
        break;
    case L_LEAKY_RELU:
    case L_ELU:
        sb_printf(&sb, "%s %s", n->op == L_ELU ? "alpha" : "negative slope", fmt_number(c->arena, a->slope));
        break;
    case L_LAYERNORM:
        sb_printf(&sb, "epsilon %s", fmt_number(c->arena, a->epsilon));
        break;
    case L_ATTENTION:
        sb_printf(&sb, "%lld head%s, key_dim %lld%s", (long long)a->heads, a->heads == 1 ? "" : "s",
                  (long long)a->key_dim, a->causal ? ", causal" : "");
        break;
    case L_EMBEDDING:
        sb_printf(&sb, "vocab %lld, %lld unit%s", (long long)a->vocab, (long long)a->units, a->units == 1 ? "" : "s");
        if (a->init != DDP_INIT_GLOROT_UNIFORM)
            sb_printf(&sb, ", init %s", init_words[a->init]);
        break;
    case L_DROPOUT:
        sb_printf(&sb, "rate %s", fmt_number(c->arena, a->rate));
        break;
    case L_SOFTMAX:
    case L_CONCAT:
        sb_printf(&sb, "axis %d", a->axis);
        break;
    default:
        break;
    }
    if (n->op == L_CONV2D || n->op == L_DEPTHWISE_CONV2D || n->op == L_DENSE || n->op == L_ATTENTION) {
        if (!a->bias)
            sb_printf(&sb, ", no bias");
        if (a->activation)
            sb_printf(&sb, ", %s", a->activation);
        if (a->init != DDP_INIT_GLOROT_UNIFORM)
            sb_printf(&sb, ", init %s", init_words[a->init]);
        if (a->bias && a->bias_init != DDP_INIT_ZEROS)
            sb_printf(&sb, ", bias_init %s", init_words[a->bias_init]);
    }
    const char *s = arena_strdup(c->arena, sb.data ? sb.data : "");
    sb_free(&sb);
    return s;
}

/* 4087156736 -> "4.09 G" */
static const char *approx(Ddpc *c, double x) {
    if (x >= 1e9)
        return arena_printf(c->arena, "%.2f G", x / 1e9);
    if (x >= 1e6)
        return arena_printf(c->arena, "%.2f M", x / 1e6);
    if (x >= 1e3)
        return arena_printf(c->arena, "%.2f k", x / 1e3);
    return arena_printf(c->arena, "%.0f", x);
}

void graph_print(Ddpc *c, FILE *out, Graph *g) {
    int rows = g->nodes.len + 1;
    const char ***cells = arena_alloc(c->arena, sizeof(char **) * (size_t)rows);
    static const char *const head[COLS] = {"#", "name", "layer", "from", "input", "output", "params", "MACs"};
    cells[0] = (const char **)head;
    for (int i = 0; i < g->nodes.len; i++) {
        GNode *n = g->nodes.items[i];
        const char **row = arena_alloc(c->arena, sizeof(char *) * COLS);
        StrBuf from = {0}, in = {0};
        for (int k = 0; k < n->ninputs; k++) {
            sb_printf(&from, "%s%d", k ? "," : "", n->inputs[k]->id);
            sb_printf(&in, "%s%s", k ? " + " : "", shape_text(c, &n->inputs[k]->out));
        }
        row[0] = arena_printf(c->arena, "%d", n->id);
        row[1] = n->name;
        row[2] = n->layer ? n->layer->name : "input";
        row[3] = n->ninputs ? arena_strdup(c->arena, from.data) : "-";
        row[4] = n->ninputs ? arena_strdup(c->arena, in.data) : "-";
        row[5] = shape_text(c, &n->out);
        row[6] = fmt_count(c->arena, n->params + n->nontrainable);
        row[7] = fmt_count(c->arena, n->macs);
        sb_free(&from);
        sb_free(&in);
        cells[i + 1] = row;
    }
    int width[COLS] = {0};
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < COLS; k++) {
            int w = (int)strlen(cells[r][k]);
            if (w > width[k])
                width[k] = w;
        }
    fprintf(out, "model %s: input %s, output %s\n", g->model, shape_text(c, &g->input),
            shape_text(c, &g->output->out));
    for (int r = 0; r < rows; r++) {
        StrBuf line = {0};
        for (int k = 0; k < COLS; k++) {
            bool numeric = k == 0 || k >= 6;
            sb_printf(&line, numeric ? "%*s  " : "%-*s  ", width[k], cells[r][k]);
        }
        sb_printf(&line, "%s", r ? details(c, g->nodes.items[r - 1]) : "details");
        while (line.len && line.data[line.len - 1] == ' ')
            line.data[--line.len] = '\0';
        fprintf(out, "%s\n", line.data);
        sb_free(&line);
    }
    fprintf(out, "total: %s parameters (%s trainable, %s non-trainable), %s multiply-accumulates "
                 "per sample (%s)\n",
            fmt_count(c->arena, g->params + g->nontrainable), fmt_count(c->arena, g->params),
            fmt_count(c->arena, g->nontrainable), fmt_count(c->arena, g->macs),
            approx(c, (double)g->macs));
}
