/* ast.c: syntax tree nodes, the `--stage=ast` dump, and expressions shown as text.
 *
 * Expression depth is counted as nodes are built: a left-leaning chain such as
 * `1 + 1 + ... + 1` never fills the parser's stack, but later passes recurse over the
 * tree, so the limit is enforced here, once, for all of them. */
#include <string.h>

#include "ddpc.h"

Node *node_new(Ddpc *c, NodeKind kind, Loc loc) {
    Node *n = arena_alloc(c->arena, sizeof *n);
    n->kind = kind;
    n->loc = loc;
    n->depth = 1;
    return n;
}

static int depth_of(const Node *n) {
    return n ? n->depth : 0;
}

Node *node_binary(Ddpc *c, Op op, Node *a, Node *b, Loc loc) {
    int depth = 1 + (depth_of(a) > depth_of(b) ? depth_of(a) : depth_of(b));
    if (depth > MAX_EXPR_DEPTH) {
        bool reported = (a && a->kind == N_ERROR) || (b && b->kind == N_ERROR);
        if (!reported)
            diag_report(c, E_TOO_DEEP, loc,
                        "this expression is nested too deeply (more than %d levels)",
                        MAX_EXPR_DEPTH);
        Node *err = node_new(c, N_ERROR, loc);
        err->depth = MAX_EXPR_DEPTH;
        return err;
    }
    Node *n = node_new(c, N_BINARY, loc);
    n->op = op;
    n->a = a;
    n->b = b;
    n->depth = depth;
    return n;
}

const char *op_text(Op op) {
    static const char *const text[] = {
        [OP_ADD] = "+", [OP_SUB] = "-", [OP_MUL] = "*", [OP_DIV] = "/", [OP_NEG] = "-",
        [OP_EQ] = "==", [OP_NE] = "!=", [OP_LT] = "<", [OP_LE] = "<=", [OP_GT] = ">",
        [OP_GE] = ">=", [OP_AND] = "and", [OP_OR] = "or", [OP_NOT] = "not",
    };
    return text[op];
}

const char *node_kind_name(NodeKind k) {
    static const char *const names[] = {
        [N_IMPORT] = "import", [N_DATASET] = "dataset", [N_MODEL] = "model",
        [N_BLOCK] = "block", [N_STRATEGY] = "strategy", [N_TRAIN] = "train",
        [N_LET] = "let", [N_PARAM] = "param", [N_SETTING] = "setting", [N_BODY] = "body",
        [N_REBIND] = "rebind", [N_IF] = "if", [N_REPEAT] = "repeat", [N_APP] = "apply",
        [N_CHAIN] = "chain", [N_IN] = "in", [N_ARG] = "arg", [N_NUM] = "number",
        [N_STR] = "string", [N_BOOL] = "bool", [N_NAME] = "name", [N_LIST] = "list",
        [N_BINARY] = "binary", [N_UNARY] = "unary", [N_ANNOT_KIND] = "kind",
        [N_ANNOT_WORDS] = "words", [N_ERROR] = "error",
    };
    return names[k];
}

/* ------------------------------------------------------------ AST dump */

static const char *unit_name(int unit) {
    return unit == UNIT_EPOCHS ? "epochs" : unit == UNIT_STEPS ? "steps" : "";
}

static void dump_string(FILE *out, const char *s) {
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(out, "\\%c", *s);
        else if (*s == '\n')
            fputs("\\n", out);
        else if (*s == '\t')
            fputs("\\t", out);
        else
            fputc(*s, out);
    }
    fputc('"', out);
}

static void dump_node(Ddpc *c, FILE *out, Node *n, int indent, const char *role);

static void dump_list(Ddpc *c, FILE *out, NodeList *l, int indent, const char *role) {
    for (int i = 0; i < l->len; i++)
        dump_node(c, out, l->items[i], indent, role);
}

static void dump_node(Ddpc *c, FILE *out, Node *n, int indent, const char *role) {
    if (!n)
        return;
    fprintf(out, "%*s", indent * 2, "");
    if (role)
        fprintf(out, "%s: ", role);
    fprintf(out, "%s", node_kind_name(n->kind));
    if (n->label)
        fprintf(out, " %s:", n->label);
    if (n->name)
        fprintf(out, " %s", n->name);
    switch (n->kind) {
    case N_NUM:
        fprintf(out, " %s%s%s", fmt_number(c->arena, n->num), n->unit ? " " : "", unit_name(n->unit));
        break;
    case N_BOOL:
        fprintf(out, " %s", n->num ? "true" : "false");
        break;
    case N_STR:
    case N_IMPORT:
        fputc(' ', out);
        dump_string(out, n->str);
        break;
    case N_BINARY:
    case N_UNARY:
        fprintf(out, " %s", op_text(n->op));
        break;
    case N_APP:
        if (n->has_parens)
            fprintf(out, " (%d args)", n->list.len);
        break;
    default:
        break;
    }
    if (n->loc.file)
        fprintf(out, "  @%d:%d", n->loc.line, n->loc.col);
    fputc('\n', out);
    indent++;
    switch (n->kind) {
    case N_MODEL:
    case N_BLOCK:
        dump_list(c, out, &n->list, indent, NULL);
        dump_node(c, out, n->b, indent, NULL);
        break;
    case N_PARAM:
        dump_node(c, out, n->b, indent, "kind");
        dump_node(c, out, n->a, indent, "default");
        break;
    case N_TRAIN:
        dump_node(c, out, n->a, indent, "model");
        dump_node(c, out, n->b, indent, "data");
        dump_list(c, out, &n->list, indent, NULL);
        break;
    case N_IF:
        dump_node(c, out, n->a, indent, "cond");
        dump_node(c, out, n->b, indent, "then");
        dump_node(c, out, n->c, indent, "else");
        break;
    case N_REPEAT:
        dump_node(c, out, n->a, indent, "count");
        dump_node(c, out, n->b, indent, NULL);
        break;
    default:
        dump_list(c, out, &n->list, indent, NULL);
        dump_node(c, out, n->a, indent, NULL);
        dump_node(c, out, n->b, indent, NULL);
        dump_node(c, out, n->c, indent, NULL);
        break;
    }
}

void ast_dump(Ddpc *c, FILE *out, NodeList *items) {
    for (int i = 0; i < items->len; i++) {
        Node *n = items->items[i];
        if (i > 0 && n->loc.file != items->items[i - 1]->loc.file)
            fputc('\n', out);
        if (i == 0 || n->loc.file != items->items[i - 1]->loc.file)
            fprintf(out, "file %s\n", n->loc.file ? n->loc.file->path : "?");
        dump_node(c, out, n, 1, NULL);
    }
}

/* ------------------------------------------------------ expression spans */

static void span_of(const Node *n, uint32_t *start, uint32_t *end) {
    if (!n || !n->loc.file)
        return;
    uint32_t s = n->loc.off, e = n->loc.off + n->loc.len;
    if (n->kind == N_APP && n->label)
        s = n->label_loc.off;
    if (n->end > e)
        e = n->end;
    if (s < *start)
        *start = s;
    if (e > *end)
        *end = e;
    if (n->kind == N_BINARY || n->kind == N_UNARY || n->kind == N_CHAIN) {
        span_of(n->a, start, end);
        span_of(n->b, start, end);
    }
}

Loc expr_span(const Node *n) {
    Loc loc = n->loc;
    if (!loc.file)
        return loc;
    uint32_t start = loc.off, end = loc.off + loc.len;
    span_of(n, &start, &end);
    /* the caret stays on the first line; the column moves back to the start */
    const char *text = loc.file->text;
    for (uint32_t i = start; i < loc.off; i++)
        if (text[i] == '\n')
            return loc;
    for (uint32_t i = start; i < loc.off; i++)
        if (((unsigned char)text[i] & 0xc0) != 0x80)
            loc.col--;
    loc.off = start;
    loc.len = end - start;
    return loc;
}

/* ------------------------------------------------- expressions as text */

static int precedence(const Node *n) {
    if (n->kind == N_CHAIN)
        return 1;
    if (n->kind == N_UNARY)
        return n->op == OP_NOT ? 4 : 8;
    if (n->kind != N_BINARY)
        return 9;
    switch (n->op) {
    case OP_OR: return 2;
    case OP_AND: return 3;
    case OP_ADD: case OP_SUB: return 6;
    case OP_MUL: case OP_DIV: return 7;
    default: return 5;
    }
}

static void expr_to(Ddpc *c, StrBuf *sb, const Node *n, int min_prec);

static void args_to(Ddpc *c, StrBuf *sb, const NodeList *l) {
    for (int i = 0; i < l->len; i++) {
        const Node *a = l->items[i];
        if (i)
            sb_printf(sb, ", ");
        if (a->kind == N_ARG && a->name)
            sb_printf(sb, "%s = ", a->name);
        expr_to(c, sb, a->kind == N_ARG ? a->a : a, 0);
    }
}

static void expr_to(Ddpc *c, StrBuf *sb, const Node *n, int min_prec) {
    if (!n)
        return;
    int prec = precedence(n);
    bool parens = prec < min_prec;
    if (parens)
        sb_putc(sb, '(');
    switch (n->kind) {
    case N_NUM:
        sb_printf(sb, "%s%s%s", fmt_number(c->arena, n->num), n->unit ? " " : "",
                  unit_name(n->unit));
        break;
    case N_STR:
        sb_printf(sb, "\"%s\"", n->str);
        break;
    case N_BOOL:
        sb_printf(sb, "%s", n->num ? "true" : "false");
        break;
    case N_NAME:
        sb_printf(sb, "%s", n->name);
        break;
    case N_IN:
        sb_printf(sb, "in");
        break;
    case N_APP:
        if (n->label)
            sb_printf(sb, "%s: ", n->label);
        sb_printf(sb, "%s", n->name);
        if (n->has_parens) {
            sb_putc(sb, '(');
            args_to(c, sb, &n->list);
            sb_putc(sb, ')');
        }
        break;
    case N_LIST:
        sb_putc(sb, '[');
        args_to(c, sb, &n->list);
        sb_putc(sb, ']');
        break;
    case N_CHAIN:
        expr_to(c, sb, n->a, prec);
        sb_printf(sb, " -> ");
        expr_to(c, sb, n->b, prec + 1);
        break;
    case N_BINARY:
        expr_to(c, sb, n->a, prec);
        sb_printf(sb, " %s ", op_text(n->op));
        expr_to(c, sb, n->b, prec + 1);
        break;
    case N_UNARY:
        sb_printf(sb, "%s", n->op == OP_NOT ? "not " : "-");
        expr_to(c, sb, n->a, prec);
        break;
    default:
        sb_printf(sb, "...");
        break;
    }
    if (parens)
        sb_putc(sb, ')');
}

const char *expr_text(Ddpc *c, const Node *n) {
    StrBuf sb = {0};
    expr_to(c, &sb, n, 0);
    const char *s = arena_strdup(c->arena, sb.data ? sb.data : "");
    sb_free(&sb);
    return s;
}
