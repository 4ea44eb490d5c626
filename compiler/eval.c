/* eval.c: values: constant folding, run-time scalar expressions, and checking each
 * argument against what its parameter expects.
 *
 * Everything a program computes at compile time is a Value. A value that depends on
 * `replicas`, `workers` or `global_batch` stays symbolic (an RtExpr the runtime will
 * evaluate at start-up) and is accepted only where a parameter allows it. A value
 * that failed to compute is poison: it is never reported twice. */
#include <math.h>
#include <string.h>

#include "ddpc.h"

static const Value poison = {.kind = V_POISON};

/* A whole number that a double holds exactly (|v| <= 2^53): larger ones are not
 * counts of anything a machine has. */
bool is_integer(double v) {
    return isfinite(v) && v == floor(v) && fabs(v) <= 9007199254740992.0;
}

/* ------------------------------------------------------------------ env */

void env_bind(Ddpc *c, Env *env, const char *name, Value v) {
    Value *slot = arena_alloc(c->arena, sizeof *slot);
    *slot = v;
    scopes_bind(c->arena, &env->scopes, name, slot);
}

Value *env_lookup(Env *env, const char *name) {
    return scopes_get(&env->scopes, name);
}

/* --------------------------------------------------------------- describe */

const char *shape_text(Ddpc *c, const Shape *s) {
    StrBuf sb = {0};
    sb_putc(&sb, '[');
    for (int i = 0; i < s->rank; i++)
        sb_printf(&sb, "%s%lld", i ? ", " : "", (long long)s->dim[i]);
    sb_putc(&sb, ']');
    const char *t = arena_strdup(c->arena, sb.data);
    sb_free(&sb);
    return t;
}

static void rt_to(Ddpc *c, StrBuf *sb, const RtExpr *e, int min_prec) {
    switch (e->kind) {
    case RT_CONST:
        sb_printf(sb, "%s", fmt_number(c->arena, e->num));
        break;
    case RT_SCALAR:
        sb_printf(sb, "%s", runtime_scalars[e->scalar]);
        break;
    case RT_NEG:
        sb_putc(sb, '-');
        rt_to(c, sb, e->a, 3);
        break;
    case RT_BINARY: {
        int prec = e->op == OP_ADD || e->op == OP_SUB ? 1 : 2;
        if (prec < min_prec)
            sb_putc(sb, '(');
        rt_to(c, sb, e->a, prec);
        sb_printf(sb, " %s ", op_text(e->op));
        rt_to(c, sb, e->b, prec + 1);
        if (prec < min_prec)
            sb_putc(sb, ')');
        break;
    }
    }
}

const char *rt_text(Ddpc *c, const RtExpr *e) {
    StrBuf sb = {0};
    rt_to(c, &sb, e, 0);
    const char *t = arena_strdup(c->arena, sb.data);
    sb_free(&sb);
    return t;
}

const char *value_text(Ddpc *c, Value v) {
    switch (v.kind) {
    case V_NUM: return fmt_number(c->arena, v.num);
    case V_BOOL: return v.num ? "true" : "false";
    case V_STR: return arena_printf(c->arena, "\"%s\"", v.str);
    case V_WORD: return v.str;
    case V_DURATION:
        return arena_printf(c->arena, "%s %s", fmt_number(c->arena, v.num),
                            v.unit == UNIT_EPOCHS ? "epochs" : "steps");
    case V_RUNTIME: return rt_text(c, v.rt);
    case V_LIST: {
        StrBuf sb = {0};
        sb_putc(&sb, '[');
        for (int i = 0; i < v.len; i++)
            sb_printf(&sb, "%s%s", i ? ", " : "", value_text(c, v.items[i]));
        sb_putc(&sb, ']');
        const char *t = arena_strdup(c->arena, sb.data);
        sb_free(&sb);
        return t;
    }
    case V_TENSOR: return "a tensor";
    case V_LAYER: return v.builtin ? v.builtin->name : v.decl->name;
    case V_OBJECT: return v.decl ? v.decl->name : object_text(c, v);
    case V_NONE: return "none";
    case V_POISON: return "?";
    }
    return "?";
}

const char *object_text(Ddpc *c, Value v) {
    const Builtin *b = v.builtin;
    StrBuf sb = {0};
    sb_printf(&sb, "%s", b->name);
    int shown = 0;
    for (int i = 0; i < b->nparams; i++) {
        if (v.args[i].kind == V_NONE)
            continue;
        sb_printf(&sb, "%s%s = %s", shown++ ? ", " : "(", b->params[i].name,
                  value_text(c, v.args[i]));
    }
    if (shown)
        sb_putc(&sb, ')');
    const char *t = arena_strdup(c->arena, sb.data);
    sb_free(&sb);
    return t;
}

const char *value_describe(Ddpc *c, Value v) {
    switch (v.kind) {
    case V_NUM: return arena_printf(c->arena, "the number %s", value_text(c, v));
    case V_BOOL: return value_text(c, v);
    case V_STR: return arena_printf(c->arena, "the string %s", value_text(c, v));
    case V_WORD: return arena_printf(c->arena, "the word `%s`", v.str);
    case V_DURATION: return arena_printf(c->arena, "the duration %s", value_text(c, v));
    case V_RUNTIME: return arena_printf(c->arena, "the run-time value %s", value_text(c, v));
    case V_LIST: return arena_printf(c->arena, "the list %s", value_text(c, v));
    case V_TENSOR: return arena_printf(c->arena, "a value of shape %s", shape_text(c, &v.tensor->out));
    case V_LAYER:
        return arena_printf(c->arena, "the %s `%s`",
                            v.builtin ? "layer" : v.decl->kind == N_MODEL ? "model" : "block",
                            value_text(c, v));
    case V_OBJECT:
        return arena_printf(c->arena, "the %s `%s`", builtin_kind_name(v.builtin->kind),
                            v.decl ? v.decl->name : v.builtin->name);
    case V_NONE: return "nothing";
    case V_POISON: return "?";
    }
    return "?";
}

/* ----------------------------------------------------------- arithmetic */

static RtExpr *rt_of(Ddpc *c, Value v) {
    if (v.kind == V_RUNTIME)
        return v.rt;
    RtExpr *e = arena_alloc(c->arena, sizeof *e);
    e->kind = RT_CONST;
    e->num = v.num;
    return e;
}

static Value runtime_value(Ddpc *c, RtExpr *e, Loc loc) {
    Value v = {.kind = V_RUNTIME, .rt = e, .loc = loc};
    (void)c;
    return v;
}

static Value number(double x, Loc loc) {
    Value v = {.kind = V_NUM, .num = x, .loc = loc};
    return v;
}

static Value boolean(bool b, Loc loc) {
    Value v = {.kind = V_BOOL, .num = b, .loc = loc};
    return v;
}

static bool is_numeric(Value v) {
    return v.kind == V_NUM || v.kind == V_RUNTIME;
}

static Value bad_operands(Ddpc *c, Node *n, Value a, Value b) {
    if (n->kind == N_UNARY)
        diag_report(c, E_BAD_OPERAND, n->loc, "`%s` does not apply to %s", op_text(n->op),
                    value_describe(c, a));
    else
        diag_report(c, E_BAD_OPERAND, n->loc, "`%s` does not apply to %s and %s", op_text(n->op),
                    value_describe(c, a), value_describe(c, b));
    return poison;
}

static Value arithmetic(Ddpc *c, Node *n, Value a, Value b) {
    Loc loc = n->loc;
    /* durations scale by numbers and add to durations of the same unit */
    if (a.kind == V_DURATION || b.kind == V_DURATION) {
        Value d = a.kind == V_DURATION ? a : b, other = a.kind == V_DURATION ? b : a;
        double x;
        if (other.kind == V_DURATION && other.unit == d.unit && (n->op == OP_ADD || n->op == OP_SUB))
            x = n->op == OP_ADD ? a.num + b.num : a.num - b.num;
        else if (other.kind == V_NUM && n->op == OP_MUL)
            x = a.num * b.num;
        else if (other.kind == V_NUM && n->op == OP_DIV && a.kind == V_DURATION && b.num != 0)
            x = a.num / b.num;
        else
            return bad_operands(c, n, a, b);
        Value v = {.kind = V_DURATION, .num = x, .unit = d.unit, .loc = loc};
        return v;
    }
    if (!is_numeric(a) || !is_numeric(b))
        return bad_operands(c, n, a, b);
    if (n->op == OP_DIV && b.kind == V_NUM && b.num == 0) {
        diag_report(c, E_DIVISION_BY_ZERO, loc, "division by zero");
        return poison;
    }
    if (a.kind == V_RUNTIME || b.kind == V_RUNTIME) {
        RtExpr *e = arena_alloc(c->arena, sizeof *e);
        e->kind = RT_BINARY;
        e->op = n->op;
        e->a = rt_of(c, a);
        e->b = rt_of(c, b);
        return runtime_value(c, e, loc);
    }
    double x = n->op == OP_ADD ? a.num + b.num
               : n->op == OP_SUB ? a.num - b.num
               : n->op == OP_MUL ? a.num * b.num : a.num / b.num;
    if (!isfinite(x)) {
        diag_report(c, E_NUMBER_RANGE, loc, "the result of `%s` is too large", op_text(n->op));
        return poison;
    }
    return number(x, loc);
}

static Value comparison(Ddpc *c, Node *n, Value a, Value b) {
    if (a.kind == V_RUNTIME || b.kind == V_RUNTIME) {
        Value r = a.kind == V_RUNTIME ? a : b;
        diag_report(c, E_RUNTIME_SCALAR, n->loc,
                    "this comparison must be decided when compiling, but %s is known only at start-up",
                    value_text(c, r));
        return poison;
    }
    bool ordered = n->op != OP_EQ && n->op != OP_NE;
    int cmp;
    if (a.kind == V_NUM && b.kind == V_NUM)
        cmp = a.num < b.num ? -1 : a.num > b.num;
    else if (a.kind == V_DURATION && b.kind == V_DURATION && a.unit == b.unit)
        cmp = a.num < b.num ? -1 : a.num > b.num;
    else if (!ordered && a.kind == b.kind && (a.kind == V_WORD || a.kind == V_STR))
        cmp = strcmp(a.str, b.str);
    else if (!ordered && a.kind == V_BOOL && b.kind == V_BOOL)
        cmp = a.num != b.num;
    else
        return bad_operands(c, n, a, b);
    bool r = n->op == OP_EQ ? cmp == 0 : n->op == OP_NE ? cmp != 0 : n->op == OP_LT ? cmp < 0
             : n->op == OP_LE ? cmp <= 0 : n->op == OP_GT ? cmp > 0 : cmp >= 0;
    return boolean(r, n->loc);
}

static Value eval_binary(Ddpc *c, Env *env, Node *n) {
    Value a = eval_expr(c, env, n->a);
    if (a.kind == V_POISON)
        return poison;
    if (n->op == OP_AND || n->op == OP_OR) {
        if (a.kind != V_BOOL)
            return bad_operands(c, n, a, eval_expr(c, env, n->b));
        /* short-circuit, so `stride != 1 and ...` guards what follows */
        if ((n->op == OP_AND) != (a.num != 0))
            return a;
        Value b = eval_expr(c, env, n->b);
        if (b.kind == V_POISON)
            return poison;
        return b.kind == V_BOOL ? b : bad_operands(c, n, a, b);
    }
    Value b = eval_expr(c, env, n->b);
    if (b.kind == V_POISON)
        return poison;
    switch (n->op) {
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV:
        return arithmetic(c, n, a, b);
    default:
        return comparison(c, n, a, b);
    }
}

static Value eval_unary(Ddpc *c, Env *env, Node *n) {
    Value a = eval_expr(c, env, n->a);
    if (a.kind == V_POISON)
        return poison;
    if (n->op == OP_NOT)
        return a.kind == V_BOOL ? boolean(!a.num, n->loc) : bad_operands(c, n, a, a);
    if (a.kind == V_NUM)
        return number(-a.num, n->loc);
    if (a.kind == V_RUNTIME) {
        RtExpr *e = arena_alloc(c->arena, sizeof *e);
        e->kind = RT_NEG;
        e->a = a.rt;
        return runtime_value(c, e, n->loc);
    }
    return bad_operands(c, n, a, a);
}

/* ------------------------------------------------------------- objects */

Value object_arg(Value obj, const char *name) {
    int i;
    if (obj.kind == V_OBJECT && builtin_param(obj.builtin, name, &i))
        return obj.args[i];
    Value none = {.kind = V_NONE};
    return none;
}

void value_pair(Value v, int64_t out[2]) {
    if (v.kind == V_LIST) {
        out[0] = (int64_t)v.items[0].num;
        out[1] = (int64_t)v.items[1].num;
    } else {
        out[0] = out[1] = (int64_t)v.num;
    }
}

Value param_default(Ddpc *c, const Param *p, Loc at) {
    Value v = {.loc = at};
    switch (p->def) {
    case DEF_NUM: v.kind = V_NUM; v.num = p->def_num; break;
    case DEF_BOOL: v.kind = V_BOOL; v.num = p->def_num; break;
    case DEF_WORD: v.kind = V_WORD; v.str = p->def_word; break;
    case DEF_STR: v.kind = V_STR; v.str = p->def_word; break;
    case DEF_DURATION: v.kind = V_DURATION; v.num = p->def_num; v.unit = p->def_unit; break;
    case DEF_LIST:
        v.kind = V_LIST;
        v.len = p->def_list_len;
        v.items = arena_alloc(c->arena, sizeof(Value) * (size_t)(v.len + 1));
        for (int i = 0; i < v.len; i++)
            v.items[i] = number(p->def_list[i], at);
        break;
    case DEF_NONE: v.kind = V_NONE; break;
    }
    if (p->kind == K_METRIC && p->def == DEF_WORD) /* early_stopping(metric = loss) */
        return (Value){.kind = V_OBJECT, .builtin = builtin_find(p->def_word), .loc = at};
    if (p->kind == K_METRICS && p->def == DEF_WORD) { /* metrics = [loss] */
        Value metric = {.kind = V_OBJECT, .builtin = builtin_find(p->def_word), .loc = at};
        v.kind = V_LIST;
        v.len = 1;
        v.items = arena_alloc(c->arena, sizeof(Value));
        v.items[0] = metric;
    }
    return v;
}

Value *eval_args(Ddpc *c, Env *env, const Signature *sig, Node **slots, const char *owner, Loc at) {
    Value *args = arena_alloc(c->arena, sizeof(Value) * (size_t)(sig->nparams + 1));
    for (int i = 0; i < sig->nparams; i++) {
        const Param *p = &sig->params[i];
        if (slots && slots[i] && (p->flags & P_VARIADIC)) {
            Node *l = slots[i];
            Value list = {.kind = V_LIST, .len = l->list.len, .loc = l->loc};
            list.items = arena_alloc(c->arena, sizeof(Value) * (size_t)(l->list.len + 1));
            for (int k = 0; k < l->list.len; k++) {
                list.items[k] = eval_arg(c, env, l->list.items[k], p, owner);
                if (list.items[k].kind == V_POISON)
                    list.kind = V_POISON;
            }
            args[i] = list;
        } else if (slots && slots[i]) {
            args[i] = eval_arg(c, env, slots[i], p, owner);
        } else if (p->flags & P_REQUIRED) {
            args[i] = poison; /* reported when the arguments were matched */
        } else {
            args[i] = param_default(c, p, at);
        }
    }
    return args;
}

/* A loss, optimizer, schedule, metric, dataset, ... written as a call or a bare name. */
static Value eval_object(Ddpc *c, Env *env, Node *n) {
    const Builtin *b = n->builtin;
    Signature sig = signature_of_builtin(b);
    Node **slots = n->slots;
    if (!slots) {
        NodeList none = {0};
        slots = match_args(c, &sig, &none, n->loc, false);
        n->slots = slots;
    }
    Value v = {.kind = V_OBJECT, .builtin = b, .slots = slots, .loc = n->loc};
    v.args = eval_args(c, env, &sig, slots, b->name, n->loc);
    /* each argument may be left out, but not both */
    if (strcmp(b->name, "random_crop") == 0 && object_arg(v, "padding").kind == V_NUM &&
        object_arg(v, "padding").num == 0 && object_arg(v, "size").kind == V_NONE)
        diag_report(c, E_MISSING_ARGUMENT, n->loc, "random_crop needs `padding`, `size` or both: `padding = 4` "
                    "moves the image by up to 4 pixels each way, `size = [224, 224]` cuts windows of that size from "
                    "larger images");
    return v;
}

/* ---------------------------------------------------------- expressions */

static Value eval_name(Ddpc *c, Env *env, Node *n) {
    switch (n->res) {
    case RES_WORD: {
        Value v = {.kind = V_WORD, .str = n->name, .loc = n->loc};
        return v;
    }
    case RES_NONE_WORD: {
        Value v = {.kind = V_NONE, .loc = n->loc};
        return v;
    }
    case RES_LOCAL: {
        Value *v = env ? env_lookup(env, n->name) : NULL;
        if (!v)
            return poison; /* a parameter whose argument failed */
        Value r = *v;
        r.loc = n->loc;
        return r;
    }
    case RES_GLOBAL: {
        Node *d = n->decl;
        if (d->kind == N_MODEL || d->kind == N_BLOCK) {
            Value v = {.kind = V_LAYER, .decl = d, .loc = n->loc};
            return v;
        }
        Value v = global_value(c, d);
        if (v.kind != V_POISON)
            v.loc = n->loc;
        return v;
    }
    case RES_RUNTIME: {
        RtExpr *e = arena_alloc(c->arena, sizeof *e);
        e->kind = RT_SCALAR;
        e->scalar = n->runtime;
        return runtime_value(c, e, n->loc);
    }
    case RES_BUILTIN:
        if (n->builtin->kind == B_LAYER) {
            Value v = {.kind = V_LAYER, .builtin = n->builtin, .loc = n->loc};
            return v;
        }
        return eval_object(c, env, n);
    default:
        return poison;
    }
}

Value eval_expr(Ddpc *c, Env *env, Node *n) {
    if (!n || c->diag.stopped)
        return poison;
    switch (n->kind) {
    case N_NUM:
        if (n->unit) {
            Value v = {.kind = V_DURATION, .num = n->num, .unit = n->unit, .loc = n->loc};
            return v;
        }
        return number(n->num, n->loc);
    case N_STR: {
        Value v = {.kind = V_STR, .str = n->str, .loc = n->loc};
        return v;
    }
    case N_BOOL:
        return boolean(n->num != 0, n->loc);
    case N_LIST: {
        Value v = {.kind = V_LIST, .len = n->list.len, .loc = n->loc};
        v.items = arena_alloc(c->arena, sizeof(Value) * (size_t)(n->list.len + 1));
        for (int i = 0; i < n->list.len; i++) {
            v.items[i] = eval_expr(c, env, n->list.items[i]);
            if (v.items[i].kind == V_POISON)
                return poison;
        }
        return v;
    }
    case N_APP:
        if (n->res == RES_BUILTIN && n->has_parens)
            return eval_object(c, env, n);
        return eval_name(c, env, n);
    case N_IN: {
        Value *v = env ? env_lookup(env, "in") : NULL;
        return v ? *v : poison;
    }
    case N_BINARY:
        return eval_binary(c, env, n);
    case N_UNARY:
        return eval_unary(c, env, n);
    case N_CHAIN: {
        Value head = eval_expr(c, env, n->a);
        if (head.kind == V_POISON)
            return poison;
        if (head.kind != V_TENSOR) {
            diag_report(c, E_BAD_OPERAND, n->loc,
                        "`->` applies a layer to a value of the model, not to %s",
                        value_describe(c, head));
            return poison;
        }
        return expand_apply(c, env, head, n->b);
    }
    default:
        return poison;
    }
}

/* Top-level lets and datasets are evaluated once, on first use; meeting one again
 * while it is being evaluated means the definitions form a cycle. */
Value global_value(Ddpc *c, Node *decl) {
    if (decl->value)
        return *decl->value;
    if (decl->evaluating) {
        diag_report(c, E_CYCLE, decl->loc, "the definition of `%s` depends on itself", decl->name);
        return poison;
    }
    if (c->nesting >= MAX_NESTING) {
        /* reported once: every definition further down the chain would say it again */
        if (!c->too_deep_reported)
            diag_report(c, E_TOO_DEEP, decl->loc,
                        "`%s` depends on a chain of more than %d definitions", decl->name,
                        MAX_NESTING);
        c->too_deep_reported = true;
        decl->value = arena_alloc(c->arena, sizeof(Value));
        *decl->value = poison;
        return poison;
    }
    c->nesting++;
    decl->evaluating = true;
    Value v;
    if (decl->kind == N_DATASET) {
        static const Param dataset = {.name = "dataset", .kind = K_DATASET};
        v = eval_arg(c, NULL, decl->a, &dataset, decl->name);
        if (v.kind == V_OBJECT)
            v.decl = decl;
    } else {
        v = eval_expr(c, NULL, decl->a);
    }
    decl->evaluating = false;
    c->nesting--;
    decl->value = arena_alloc(c->arena, sizeof(Value));
    *decl->value = v;
    return v;
}

/* ------------------------------------------------------ checking a value */

typedef struct Check {
    Ddpc *c;
    const Param *p;
    const char *owner;
    Loc loc;
} Check;

static Value wrong_kind(Check *k, Value v) {
    if (k->owner)
        diag_report(k->c, E_WRONG_KIND, k->loc, "`%s` of %s expects %s, not %s", k->p->name,
                    k->owner, kind_describe(k->p), value_describe(k->c, v));
    else
        diag_report(k->c, E_WRONG_KIND, k->loc, "`%s` expects %s, not %s", k->p->name,
                    kind_describe(k->p), value_describe(k->c, v));
    if (v.kind == V_NUM && k->p->kind == K_DURATION)
        diag_note(k->c, k->loc, "give a unit: `%s epochs` or `%s steps`", value_text(k->c, v),
                  value_text(k->c, v));
    return poison;
}

static Value out_of_range(Check *k, Value v, const char *need) {
    diag_report(k->c, E_OUT_OF_RANGE, k->loc, "`%s` of %s must be %s, not %s", k->p->name,
                k->owner ? k->owner : "this", need, value_text(k->c, v));
    return poison;
}

/* Range checks shared by numbers, integers, durations and their lists. */
static bool in_range(Check *k, Value v) {
    int f = k->p->flags;
    if ((f & P_POSITIVE) && !(v.num > 0))
        return out_of_range(k, v, "positive"), false;
    if ((f & P_NONNEG) && !(v.num >= 0))
        return out_of_range(k, v, "zero or more"), false;
    if ((f & P_FRACTION) && !(v.num >= 0 && v.num < 1))
        return out_of_range(k, v, "from 0 up to, not including, 1"), false;
    if ((f & P_UNIT) && !(v.num > 0 && v.num <= 1))
        return out_of_range(k, v, "above 0 and at most 1"), false;
    return true;
}

static bool check_int(Value v) {
    return v.kind == V_NUM && is_integer(v.num);
}

static Value check_int_list(Check *k, Value v, int want_len, bool allow_infer) {
    if (v.kind != V_LIST || (want_len && v.len != want_len) || v.len == 0)
        return wrong_kind(k, v);
    int inferred = 0;
    for (int i = 0; i < v.len; i++) {
        Value e = v.items[i];
        if (!check_int(e))
            return wrong_kind(k, v);
        if (allow_infer && e.num == -1) {
            if (++inferred > 1) {
                diag_report(k->c, E_OUT_OF_RANGE, e.loc, "only one axis of a shape can be -1");
                return poison;
            }
            continue;
        }
        if (!in_range(k, e))
            return poison;
    }
    return v;
}

/* A list of numbers, of want_len of them (0: any number but none); a wrong item is
 * the one named. */
static Value check_num_list(Check *k, Value v, int want_len) {
    if (v.kind != V_LIST || (want_len && v.len != want_len) || v.len == 0)
        return wrong_kind(k, v);
    Loc whole = k->loc;
    for (int i = 0; i < v.len; i++) {
        k->loc = v.items[i].loc;
        if (v.items[i].kind != V_NUM)
            return wrong_kind(k, v.items[i]);
        if (!in_range(k, v.items[i]))
            return poison;
    }
    k->loc = whole;
    return v;
}

/* A range [low, high] checked as a list, whose low is not above its high. */
static Value ordered_range(Check *k, Value r) {
    if (r.kind == V_LIST && r.items[0].num > r.items[1].num)
        return out_of_range(k, r, "a range [low, high] with low <= high");
    return r;
}

static bool is_object_of(Value v, BuiltinKind kind) {
    return v.kind == V_OBJECT && v.builtin->kind == kind;
}

/* [v], where one value stands for a list of it. */
static Value list_of_one(Ddpc *c, Value v) {
    Value l = {.kind = V_LIST, .len = 1, .loc = v.loc};
    l.items = arena_alloc(c->arena, sizeof(Value));
    l.items[0] = v;
    return l;
}

/* A list of built-ins of one kind (metrics, augmentations); one needs no list. */
static Value check_builtin_list(Ddpc *c, Check *k, Value v, BuiltinKind kind) {
    if (is_object_of(v, kind))
        return list_of_one(c, v);
    if (v.kind != V_LIST)
        return wrong_kind(k, v);
    for (int i = 0; i < v.len; i++)
        if (!is_object_of(v.items[i], kind)) {
            k->loc = v.items[i].loc;
            return wrong_kind(k, v.items[i]);
        }
    return v;
}

Value check_value(Ddpc *c, Value v, const Param *p, const char *owner, Loc loc) {
    Check k = {c, p, owner, loc};
    if (v.kind == V_POISON || (v.kind == V_NONE && p->def == DEF_NONE && !p->def_expr))
        return v;
    if (v.kind == V_RUNTIME && !(p->flags & P_RUNTIME)) {
        diag_report(c, E_RUNTIME_SCALAR, loc,
                    "`%s`%s%s must be known when compiling, but %s is known only at start-up",
                    p->name, owner ? " of " : "", owner ? owner : "", value_text(c, v));
        diag_note(c, loc, "replicas, workers and global_batch may appear in learning rates, "
                          "schedules and weight decay");
        return poison;
    }
    switch (p->kind) {
    case K_ANY:
        return v;
    case K_INT:
        if (!check_int(v))
            return wrong_kind(&k, v);
        return in_range(&k, v) ? v : poison;
    case K_NUM:
        if (v.kind == V_RUNTIME)
            return v;
        if (v.kind != V_NUM)
            return wrong_kind(&k, v);
        return in_range(&k, v) ? v : poison;
    case K_BOOL:
        return v.kind == V_BOOL ? v : wrong_kind(&k, v);
    case K_STR:
        return v.kind == V_STR ? v : wrong_kind(&k, v);
    case K_WORD:
        if (v.kind == V_LAYER && v.builtin && word_in(p->words, v.builtin->name)) {
            Value w = {.kind = V_WORD, .str = v.builtin->name, .loc = v.loc};
            return w;
        }
        if (v.kind != V_WORD)
            return wrong_kind(&k, v);
        if (!word_in(p->words, v.str)) {
            diag_report(c, E_UNKNOWN_WORD, loc, "`%s` is not a value of `%s`, which takes %s",
                        v.str, p->name, kind_describe(p));
            return poison;
        }
        return v;
    case K_DURATION:
        if (v.kind != V_DURATION)
            return wrong_kind(&k, v);
        if (!is_integer(v.num))
            return out_of_range(&k, v, "a whole number of epochs or steps");
        return in_range(&k, v) ? v : poison;
    case K_DURATIONS: {
        Param one = *p;
        one.kind = K_DURATION;
        if (v.kind == V_DURATION) /* one milestone needs no list */
            return check_value(c, v, &one, owner, loc).kind == V_POISON ? poison : list_of_one(c, v);
        if (v.kind != V_LIST || v.len == 0)
            return wrong_kind(&k, v);
        for (int i = 0; i < v.len; i++) {
            if (check_value(c, v.items[i], &one, owner, v.items[i].loc).kind == V_POISON)
                return poison;
            if (i > 0 && v.items[i].unit != v.items[0].unit)
                return out_of_range(&k, v, "in one unit, epochs or steps");
            if (i > 0 && !(v.items[i].num > v.items[i - 1].num))
                return out_of_range(&k, v, "ascending");
        }
        return v;
    }
    case K_SHAPE: {
        Value r = check_int_list(&k, v, 0, p->flags & P_INFER);
        if (r.kind == V_LIST && r.len > MAX_RANK) {
            diag_report(c, E_OUT_OF_RANGE, loc, "a shape has at most %d axes, and this has %d",
                        MAX_RANK, r.len);
            return poison;
        }
        return r;
    }
    case K_INT_PAIR:
        if (v.kind == V_NUM) {
            if (!check_int(v))
                return wrong_kind(&k, v);
            return in_range(&k, v) ? v : poison;
        }
        return check_int_list(&k, v, 2, false);
    case K_PADDING:
        if (v.kind == V_WORD) {
            Param words = *p;
            words.kind = K_WORD;
            return check_value(c, v, &words, owner, loc);
        }
        if (v.kind == V_NUM) {
            if (!check_int(v))
                return wrong_kind(&k, v);
            return in_range(&k, v) ? v : poison;
        }
        return check_int_list(&k, v, 2, false);
    case K_TENSOR:
        return v.kind == V_TENSOR ? v : wrong_kind(&k, v);
    case K_LAYER:
        return v.kind == V_LAYER ? v : wrong_kind(&k, v);
    case K_LR:
        if (v.kind == V_RUNTIME || is_object_of(v, B_SCHEDULE))
            return v;
        if (v.kind != V_NUM)
            return wrong_kind(&k, v);
        return in_range(&k, v) ? v : poison;
    case K_LOSS: case K_OPTIMIZER: case K_DATASET: case K_CHECKPOINT: case K_METRIC: case K_EARLY_STOPPING:
    case K_ON_PLATEAU: {
        BuiltinKind b;
        kind_takes_builtins(p->kind, &b);
        return is_object_of(v, b) ? v : wrong_kind(&k, v);
    }
    case K_METRICS:
        return check_builtin_list(c, &k, v, B_METRIC);
    case K_AUGMENTS:
        return check_builtin_list(c, &k, v, B_AUGMENT);
    case K_CLUSTER:
        if (is_object_of(v, B_CLUSTER))
            return v;
        if (v.kind == V_WORD && word_in(p->words, v.str))
            return v;
        return wrong_kind(&k, v);
    case K_NUMS:
        if (v.kind == V_NUM)
            return in_range(&k, v) ? list_of_one(c, v) : poison;
        return check_num_list(&k, v, 0);
    case K_STR_LIST:
        if (v.kind != V_LIST || v.len == 0)
            return wrong_kind(&k, v);
        for (int i = 0; i < v.len; i++)
            if (v.items[i].kind != V_STR)
                return wrong_kind(&k, v);
        return v;
    case K_INT_RANGE:
        return ordered_range(&k, check_int_list(&k, v, 2, false));
    case K_NUM_RANGE:
        return ordered_range(&k, check_num_list(&k, v, 2));
    }
    return v;
}

Value eval_arg(Ddpc *c, Env *env, Node *arg, const Param *p, const char *owner) {
    Value v = eval_expr(c, env, arg);
    return check_value(c, v, p, owner, expr_span(arg));
}
