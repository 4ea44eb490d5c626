/* resolve.c: what every name means, decided once, before anything is evaluated.
 *
 * A name is resolved by what its place expects: after `padding =` the words same and
 * valid come first; in a layer's place, layers, blocks and models; elsewhere the
 * enclosing scopes (parameters, lets, repeat indices), then the program's top-level
 * definitions, the run-time scalars and the built-ins. Every body is resolved, even
 * one that is never expanded (an untaken `if`, an unused block), so typos are found
 * everywhere. Calls whose callee is known here have their arguments matched to
 * parameters here; the evaluator only reads the result (Node.res, Node.slots). */
#include <string.h>

#include "ddpc.h"

typedef struct Resolver {
    Ddpc *c;
    Scopes scopes;   /* locals: name -> N_PARAM, N_LET or N_REPEAT */
    bool in_body;    /* `in` means something here */
    Node *owner;     /* the block or model being resolved */
} Resolver;

static const Param expect_dataset = {.name = "dataset", .kind = K_DATASET};
static const char *const kind_names[] = {"int", "number", "bool", "string", "shape", "layer",
                                         "tensor", NULL};
static const Kind kind_values[] = {K_INT, K_NUM, K_BOOL, K_STR, K_SHAPE, K_LAYER, K_TENSOR};

static void resolve_expr(Resolver *r, Node *n, const Param *expect);
static void resolve_body(Resolver *r, Node *body);
static void resolve_layer_app(Resolver *r, Node *app);

static bool is_bare_name(const Node *n) {
    return n && n->kind == N_APP && !n->has_parens && !n->label;
}

/* ------------------------------------------------------------ signatures */

Signature signature_of_builtin(const Builtin *b) {
    Signature s = {b->name, builtin_kind_name(b->kind), b->params, b->nparams, NULL, NULL, {0}};
    if (b->kind == B_SETTINGS)
        s.what = b->name;
    return s;
}

static void check_definable(Ddpc *c, const char *name, Loc loc, const char *what_is_defined) {
    const char *what;
    if (is_reserved_name(name, &what))
        diag_report(c, E_RESERVED_NAME, loc, "`%s` is the name of a built-in %s; choose another name for this %s",
                    name, what, what_is_defined);
}

/* A parameter's annotation becomes the same kind of expectation a builtin declares. */
static void annotate_param(Ddpc *c, Param *p, Node *annot) {
    if (annot->kind == N_LIST) {
        diag_report(c, E_BAD_ANNOTATION, annot->loc,
                    "a shape annotation belongs to a model's `input`, not to `%s`", p->name);
        return;
    }
    NodeList *w = &annot->list;
    if (w->len == 1) {
        for (int k = 0; kind_names[k]; k++)
            if (strcmp(w->items[0]->name, kind_names[k]) == 0) {
                p->kind = kind_values[k];
                if (p->kind == K_SHAPE)
                    p->flags |= P_POSITIVE;
                return;
            }
        diag_report(c, E_BAD_ANNOTATION, annot->loc,
                    "`%s` is not a kind; write int, number, bool, string, shape, layer, tensor, "
                    "or two or more words separated by `|`", w->items[0]->name);
        diag_did_you_mean(c, annot->loc, w->items[0]->name, kind_names, 7);
        return;
    }
    const char **words = arena_alloc(c->arena, sizeof(char *) * (size_t)(w->len + 1));
    Map seen = {0};
    for (int i = 0; i < w->len; i++) {
        if (map_get(&seen, w->items[i]->name))
            diag_report(c, E_REDEFINITION, w->items[i]->loc, "the word `%s` is listed twice",
                        w->items[i]->name);
        map_put(c->arena, &seen, w->items[i]->name, (void *)1);
        words[i] = w->items[i]->name;
    }
    p->kind = K_WORD;
    p->words = words;
}

Signature *signature_of_decl(Ddpc *c, Node *decl) {
    if (decl->sig)
        return decl->sig;
    Signature *s = arena_alloc(c->arena, sizeof *s);
    decl->sig = s;
    s->name = decl->name;
    s->what = decl->kind == N_MODEL ? "model" : "block";
    s->decl = decl;
    Param *params = arena_alloc(c->arena, sizeof(Param) * (size_t)(decl->list.len + 1));
    for (int i = 0; i < decl->list.len; i++) {
        Node *pn = decl->list.items[i];
        if (strcmp(pn->name, "input") == 0) {
            if (decl->kind == N_BLOCK) {
                diag_report(c, E_MISPLACED_INPUT, pn->loc,
                            "a block takes the current value as its input; `input` belongs to models");
                continue;
            }
            if (!pn->b || pn->b->kind != N_LIST || pn->a) {
                diag_report(c, E_MISPLACED_INPUT, pn->loc,
                            "a model's `input` is declared with its shape, as in `input: [28, 28]`");
                continue;
            }
            s->input = pn;
            continue;
        }
        Param *first = map_get(&s->index, pn->name);
        if (first) {
            diag_report(c, E_REDEFINITION, pn->loc, "%s has two parameters named `%s`",
                        decl->name, pn->name);
            diag_note(c, first->decl->loc, "the first is here");
        }
        check_definable(c, pn->name, pn->loc, "parameter");
        Param *p = &params[s->nparams++];
        if (!first)
            map_put(c->arena, &s->index, pn->name, p);
        p->name = pn->name;
        p->kind = K_ANY;
        p->decl = pn;
        p->def_expr = pn->a;
        p->flags = pn->a ? 0 : P_REQUIRED;
        if (pn->b)
            annotate_param(c, p, pn->b);
    }
    s->params = params;
    return s;
}

/* ------------------------------------------------------------ arguments */

static const char *param_names(Ddpc *c, const Signature *sig) {
    StrBuf sb = {0};
    if (sig->input)
        sb_printf(&sb, "input%s", sig->nparams ? ", " : "");
    for (int i = 0; i < sig->nparams; i++)
        sb_printf(&sb, "%s%s", i ? ", " : "", sig->params[i].name);
    const char *s = arena_strdup(c->arena, sb.data ? sb.data : "");
    sb_free(&sb);
    return s;
}

/* Returns the parameter suggested instead, if any: a misspelt argument is not also
 * reported as missing. */
static const char *unknown_argument(Ddpc *c, const Signature *sig, Node *a, bool settings) {
    if (settings)
        diag_report(c, E_UNKNOWN_ARGUMENT, a->loc, "%s has no setting `%s`", sig->what, a->name);
    else
        diag_report(c, E_UNKNOWN_ARGUMENT, a->loc, "%s has no parameter `%s`", sig->name, a->name);
    const char *names[64];
    int n = 0;
    if (sig->input)
        names[n++] = "input";
    for (int i = 0; i < sig->nparams && n < 64; i++)
        names[n++] = sig->params[i].name;
    const char *s = suggest(a->name, names, n);
    if (s)
        diag_note(c, a->loc, "did you mean `%s`?", s);
    else if (sig->nparams == 0)
        diag_note(c, a->loc, "%s takes no arguments", sig->name);
    else
        diag_note(c, a->loc, "%s: %s", settings ? "its settings are" : "its parameters are",
                  param_names(c, sig));
    return s;
}

Node **match_args(Ddpc *c, const Signature *sig, NodeList *args, Loc at, bool settings) {
    int n = sig->nparams;
    Node **slots = arena_alloc(c->arena, sizeof(Node *) * (size_t)(n + 1)); /* [n]: a model's input */
    int variadic = -1;
    for (int i = 0; i < n; i++)
        if (sig->params[i].flags & P_VARIADIC)
            variadic = i;
    int pos = 0;
    bool named_seen = false, too_many = false;
    Map suggested = {0};
    for (int k = 0; k < args->len; k++) {
        Node *a = args->items[k];
        if (!a->name) {
            if (named_seen) {
                diag_report(c, E_POSITIONAL_AFTER_NAMED, a->loc,
                            "a positional argument cannot follow named ones");
                continue;
            }
            if (variadic >= 0 && pos >= variadic) {
                if (!slots[variadic])
                    slots[variadic] = node_new(c, N_LIST, a->loc);
                vec_push(c->arena, &slots[variadic]->list, a->a);
                continue;
            }
            if (pos >= n) {
                if (!too_many) {
                    if (n == 0)
                        diag_report(c, E_TOO_MANY_ARGUMENTS, a->loc, "%s takes no arguments",
                                    sig->name);
                    else
                        diag_report(c, E_TOO_MANY_ARGUMENTS, a->loc,
                                    "%s takes at most %d argument%s (%s)", sig->name, n,
                                    n == 1 ? "" : "s", param_names(c, sig));
                }
                too_many = true;
                continue;
            }
            slots[pos++] = a->a;
            continue;
        }
        named_seen = true;
        int idx = -1;
        if (sig->input && strcmp(a->name, "input") == 0)
            idx = n;
        else if (sig->index.len) { /* a block's parameters: there may be many */
            const Param *p = map_get(&sig->index, a->name);
            idx = p ? (int)(p - sig->params) : -1;
        } else {
            for (int i = 0; i < n; i++)
                if (strcmp(sig->params[i].name, a->name) == 0)
                    idx = i;
        }
        if (idx < 0) {
            const char *instead = unknown_argument(c, sig, a, settings);
            if (instead)
                map_put(c->arena, &suggested, instead, (void *)1);
            continue;
        }
        if (slots[idx]) {
            diag_report(c, E_DUPLICATE_ARGUMENT, a->loc, "`%s` is given twice", a->name);
            diag_note(c, slots[idx]->loc, "first given here");
            continue;
        }
        if (idx == variadic && a->a->kind != N_LIST) {
            slots[idx] = node_new(c, N_LIST, a->a->loc);
            vec_push(c->arena, &slots[idx]->list, a->a);
        } else {
            slots[idx] = a->a;
        }
    }
    for (int i = 0; i < n; i++) {
        const Param *p = &sig->params[i];
        if (slots[i] || !(p->flags & P_REQUIRED) || map_get(&suggested, p->name) ||
            (settings && map_get(&c->misplaced, p->name)))
            continue;
        if (settings)
            diag_report(c, E_MISSING_SETTING, at, "%s needs the setting `%s` (%s)", sig->what,
                        p->name, kind_describe(p));
        else
            diag_report(c, E_MISSING_ARGUMENT, at, "%s needs `%s` (%s)", sig->name, p->name,
                        kind_describe(p));
    }
    return slots;
}

/* Resolves each argument against the parameter it was matched to. */
const Param model_input = {.name = "input", .kind = K_SHAPE, .flags = P_POSITIVE};

static void resolve_slots(Resolver *r, const Signature *sig, Node **slots) {
    if (sig->input && slots[sig->nparams])
        resolve_expr(r, slots[sig->nparams], &model_input);
    for (int i = 0; i < sig->nparams; i++) {
        if (!slots[i])
            continue;
        if (sig->params[i].flags & P_VARIADIC)
            for (int k = 0; k < slots[i]->list.len; k++)
                resolve_expr(r, slots[i]->list.items[k], &sig->params[i]);
        else
            resolve_expr(r, slots[i], &sig->params[i]);
    }
}

/* The arguments of a callee known only when expanding: resolved without expectation. */
static void resolve_args_unmatched(Resolver *r, Node *app) {
    for (int i = 0; i < app->list.len; i++)
        resolve_expr(r, app->list.items[i]->a, NULL);
}

/* ---------------------------------------------------------------- names */

typedef enum { WANT_VALUE, WANT_LAYER, WANT_MODEL } Want;

static bool builtin_wanted(const Builtin *b, const Param *expect, Want want) {
    if (want != WANT_VALUE)
        return want == WANT_LAYER && b->kind == B_LAYER;
    if (!expect)
        return b->kind != B_LAYER;
    if (expect->kind == K_LAYER || expect->kind == K_ANY)
        return true;
    BuiltinKind takes;
    return kind_takes_builtins(expect->kind, &takes) && b->kind == takes;
}

static bool decl_wanted(const Node *d, const Param *expect, Want want) {
    if (want == WANT_MODEL)
        return d->kind == N_MODEL;
    if (want == WANT_LAYER)
        return d->kind == N_MODEL || d->kind == N_BLOCK;
    if (expect && expect->kind == K_DATASET)
        return d->kind == N_DATASET;
    return d->kind == N_LET || d->kind == N_DATASET;
}

/* "did you mean" over every name that could stand in this place. */
static void suggest_name(Resolver *r, Loc loc, const char *name, const Param *expect, Want want) {
    Ddpc *c = r->c;
    if (!c->diag.last_shown)
        return;
    VEC(const char *) cands = {0};
    if (want != WANT_MODEL)
        for (int i = 0; i < r->scopes.map.cap; i++)
            if (r->scopes.map.keys[i] && r->scopes.map.vals[i])
                vec_push(c->arena, &cands, r->scopes.map.keys[i]);
    for (int i = 0; i < c->globals.cap; i++)
        if (c->globals.keys[i] && decl_wanted(c->globals.vals[i], expect, want))
            vec_push(c->arena, &cands, c->globals.keys[i]);
    for (int i = 0; i < builtin_count; i++)
        if (builtin_wanted(&builtins[i], expect, want))
            vec_push(c->arena, &cands, builtins[i].name);
    if (want == WANT_VALUE)
        for (int i = 0; runtime_scalars[i]; i++)
            vec_push(c->arena, &cands, runtime_scalars[i]);
    diag_did_you_mean(c, loc, name, cands.items, cands.len);
}

/* A name in a value's place (N_APP without parentheses, or N_NAME). */
static void resolve_name(Resolver *r, Node *n, const Param *expect) {
    Ddpc *c = r->c;
    const char *name = n->name;
    const char *const *words = expect ? expect->words : NULL;
    if (words && word_in(words, name)) {
        n->res = RES_WORD;
        return;
    }
    if (strcmp(name, "none") == 0) {
        if (expect && expect->def == DEF_NONE && !expect->def_expr && !(expect->flags & P_REQUIRED)) {
            n->res = RES_NONE_WORD;
            return;
        }
        n->res = RES_ERROR;
        if (expect)
            diag_report(c, E_WRONG_KIND, n->loc, "`%s` cannot be none: it takes %s", expect->name,
                        kind_describe(expect));
        else
            diag_report(c, E_UNKNOWN_NAME, n->loc, "`none` stands only for a setting or argument whose default is none");
        return;
    }
    Node *local = scopes_get(&r->scopes, name);
    if (local) {
        n->res = RES_LOCAL;
        n->decl = local;
        local->used = true;
        return;
    }
    Node *global = map_get(&c->globals, name);
    if (global) {
        n->res = RES_GLOBAL;
        n->decl = global;
        global->used = true;
        return;
    }
    for (int i = 0; runtime_scalars[i]; i++)
        if (strcmp(runtime_scalars[i], name) == 0) {
            n->res = RES_RUNTIME;
            n->runtime = i;
            return;
        }
    const Builtin *b = builtin_find(name);
    if (b) {
        n->res = RES_BUILTIN;
        n->builtin = b;
        return;
    }
    n->res = RES_ERROR;
    if (words && (expect->kind == K_WORD || expect->kind == K_PADDING || expect->kind == K_CLUSTER)) {
        diag_report(c, E_UNKNOWN_WORD, n->loc, "`%s` is not a value of `%s`, which takes %s", name,
                    expect->name, kind_describe(expect));
        diag_did_you_mean(c, n->loc, name, words, word_count(words));
        return;
    }
    diag_report(c, E_UNKNOWN_NAME, n->loc, "unknown name `%s`", name);
    suggest_name(r, n->loc, name, expect, WANT_VALUE);
}

static const char *decl_what(const Node *d) {
    switch (d->kind) {
    case N_MODEL: return "a model";
    case N_BLOCK: return "a block";
    case N_DATASET: return "a dataset";
    case N_LET: return "a constant";
    case N_PARAM: return "a parameter";
    case N_REPEAT: return "a repeat index";
    default: return "a value";
    }
}

/* A call in a value's place: a loss, optimizer, schedule, metric, dataset, ... */
static void resolve_call(Resolver *r, Node *n, const Param *expect) {
    Ddpc *c = r->c;
    Node *local = scopes_get(&r->scopes, n->name);
    Node *global = local ? NULL : map_get(&c->globals, n->name);
    const Builtin *b = builtin_find(n->name);
    if (local || (global && (global->kind == N_LET || global->kind == N_DATASET))) {
        Node *d = local ? local : global;
        d->used = true;
        diag_report(c, E_ARGS_TO_VALUE, n->loc, "`%s` is %s; it takes no arguments", n->name,
                    decl_what(d));
        n->res = RES_ERROR;
        resolve_args_unmatched(r, n);
        return;
    }
    if (global || (b && b->kind == B_LAYER)) {
        diag_report(c, E_LAYER_AS_VALUE, n->loc,
                    "`%s(...)` is a %s applied to nothing; apply it to a value with `->`",
                    n->name, global ? (global->kind == N_MODEL ? "model" : "block") : "layer");
        n->res = RES_ERROR;
        resolve_args_unmatched(r, n);
        return;
    }
    if (!b) {
        for (int i = 0; runtime_scalars[i]; i++)
            if (strcmp(runtime_scalars[i], n->name) == 0) {
                diag_report(c, E_ARGS_TO_VALUE, n->loc, "`%s` is a run-time scalar; it takes no arguments",
                            n->name);
                n->res = RES_ERROR;
                return;
            }
        diag_report(c, E_UNKNOWN_NAME, n->loc, "unknown name `%s`", n->name);
        suggest_name(r, n->loc, n->name, expect, WANT_VALUE);
        n->res = RES_ERROR;
        resolve_args_unmatched(r, n);
        return;
    }
    n->res = RES_BUILTIN;
    n->builtin = b;
    Signature sig = signature_of_builtin(b);
    n->slots = match_args(c, &sig, &n->list, n->loc, false);
    resolve_slots(r, &sig, n->slots);
}

/* The parameter a bare name stands for, when that parameter takes words: then the
 * other side of `==` is resolved among those words (`if stem == cifar`). */
static const Param *words_param_of(Resolver *r, Node *n) {
    if (!is_bare_name(n) || !r->owner)
        return NULL;
    Node *local = scopes_get(&r->scopes, n->name);
    if (!local || local->kind != N_PARAM)
        return NULL;
    Signature *sig = signature_of_decl(r->c, r->owner);
    for (int i = 0; i < sig->nparams; i++)
        if (sig->params[i].decl == local && sig->params[i].words)
            return &sig->params[i];
    return NULL;
}

static void resolve_expr(Resolver *r, Node *n, const Param *expect) {
    if (!n)
        return;
    switch (n->kind) {
    case N_IN:
        if (!r->in_body)
            diag_report(r->c, E_IN_OUTSIDE, n->loc,
                        "`in` is the input of a model or block, and there is none here");
        break;
    case N_APP:
        if (n->has_parens)
            resolve_call(r, n, expect);
        else
            resolve_name(r, n, expect);
        break;
    case N_LIST:
        for (int i = 0; i < n->list.len; i++)
            resolve_expr(r, n->list.items[i], expect && (expect->kind == K_METRICS || expect->kind == K_AUGMENTS) ? expect : NULL);
        break;
    case N_BINARY:
        if (n->op == OP_EQ || n->op == OP_NE) {
            const Param *pa = words_param_of(r, n->a), *pb = words_param_of(r, n->b);
            resolve_expr(r, n->a, pb);
            resolve_expr(r, n->b, pa);
        } else {
            resolve_expr(r, n->a, NULL);
            resolve_expr(r, n->b, NULL);
        }
        break;
    case N_UNARY:
        resolve_expr(r, n->a, NULL);
        break;
    case N_CHAIN:
        resolve_expr(r, n->a, NULL);
        resolve_layer_app(r, n->b);
        break;
    default:
        break;
    }
}

/* ----------------------------------------------------------- statements */

/* An N_APP in a layer's place: a statement, or the right of `->`. */
static void resolve_layer_app(Resolver *r, Node *app) {
    Ddpc *c = r->c;
    if (app->label)
        check_definable(c, app->label, app->label_loc, "label");
    Node *local = scopes_get(&r->scopes, app->name);
    if (local) {
        local->used = true;
        app->res = RES_LOCAL;
        app->decl = local;
        resolve_args_unmatched(r, app);
        return;
    }
    Node *global = map_get(&c->globals, app->name);
    if (global) {
        global->used = true;
        if (global->kind != N_MODEL && global->kind != N_BLOCK) {
            diag_report(c, E_NOT_A_LAYER, app->loc, "`%s` is %s, not a layer", app->name,
                        decl_what(global));
            app->res = RES_ERROR;
            resolve_args_unmatched(r, app);
            return;
        }
        app->res = RES_GLOBAL;
        app->decl = global;
        Signature *sig = signature_of_decl(c, global);
        app->slots = match_args(c, sig, &app->list, app->loc, false);
        resolve_slots(r, sig, app->slots);
        Node *input = sig->input ? app->slots[sig->nparams] : NULL;
        if (input) {
            diag_report(c, E_MISPLACED_INPUT, expr_span(input),
                        "as a layer, `%s` takes the current value: `input` is for a model trained directly",
                        app->name);
            app->slots[sig->nparams] = NULL;
        }
        return;
    }
    const Builtin *b = builtin_find(app->name);
    if (b && b->kind == B_LAYER) {
        app->res = RES_BUILTIN;
        app->builtin = b;
        Signature sig = signature_of_builtin(b);
        app->slots = match_args(c, &sig, &app->list, app->loc, false);
        resolve_slots(r, &sig, app->slots);
        return;
    }
    app->res = RES_ERROR;
    if (b) {
        diag_report(c, E_NOT_A_LAYER, app->loc, "`%s` is %s %s, not a layer", app->name,
                    builtin_kind_article(b->kind), builtin_kind_name(b->kind));
    } else if (word_in(runtime_scalars, app->name)) {
        diag_report(c, E_NOT_A_LAYER, app->loc, "`%s` is a run-time scalar, not a layer",
                    app->name);
    } else {
        diag_report(c, E_UNKNOWN_NAME, app->loc, "unknown layer `%s`", app->name);
        suggest_name(r, app->loc, app->name, NULL, WANT_LAYER);
    }
    resolve_args_unmatched(r, app);
}

static void resolve_statement_chain(Resolver *r, Node *n) {
    if (n->kind == N_CHAIN) {
        resolve_statement_chain(r, n->a);
        resolve_layer_app(r, n->b);
    } else if (n->kind == N_APP) {
        resolve_layer_app(r, n);
    }
}

static bool bound_in_innermost(Resolver *r, const char *name) {
    Node *n = scopes_get(&r->scopes, name);
    return n && n->kind == N_LET && n->scope_depth == r->scopes.marks.len;
}

static void resolve_let(Resolver *r, Node *n) {
    resolve_expr(r, n->a, NULL);
    check_definable(r->c, n->name, n->loc, "name");
    if (bound_in_innermost(r, n->name)) {
        Node *prev = scopes_get(&r->scopes, n->name);
        diag_report(r->c, E_REDEFINITION, n->loc,
                    "`%s` is already bound in this scope; to change it, write `%s = ...`",
                    n->name, n->name);
        diag_note(r->c, prev->loc, "bound here");
    }
    n->scope_depth = r->scopes.marks.len;
    scopes_bind(r->c->arena, &r->scopes, n->name, n);
}

static void resolve_rebind(Resolver *r, Node *n) {
    Ddpc *c = r->c;
    resolve_expr(r, n->a, NULL);
    Node *local = scopes_get(&r->scopes, n->name);
    if (local && local->kind != N_REPEAT) {
        n->decl = local;
        return;
    }
    if (local)
        diag_report(c, E_NOT_BOUND, n->loc, "`%s` is a repeat index and cannot be rebound",
                    n->name);
    else if (map_get(&c->globals, n->name))
        diag_report(c, E_NOT_BOUND, n->loc, "`%s` is a top-level definition and cannot be rebound",
                    n->name);
    else
        diag_report(c, E_NOT_BOUND, n->loc, "`%s` is not bound here", n->name);
    diag_note(c, n->loc, "to bind a new name, write `let %s = ...`", n->name);
}

static void resolve_statement(Resolver *r, Node *n) {
    switch (n->kind) {
    case N_APP:
    case N_CHAIN:
        resolve_statement_chain(r, n);
        break;
    case N_LET:
        resolve_let(r, n);
        break;
    case N_REBIND:
        resolve_rebind(r, n);
        break;
    case N_IF:
        resolve_expr(r, n->a, NULL);
        resolve_body(r, n->b);
        if (n->c && n->c->kind == N_IF)
            resolve_statement(r, n->c);
        else if (n->c)
            resolve_body(r, n->c);
        break;
    case N_REPEAT:
        resolve_expr(r, n->a, NULL);
        scopes_push(r->c->arena, &r->scopes);
        if (n->name) {
            check_definable(r->c, n->name, n->label_loc, "repeat index");
            scopes_bind(r->c->arena, &r->scopes, n->name, n);
        }
        resolve_body(r, n->b);
        scopes_pop(r->c->arena, &r->scopes);
        break;
    default:
        break;
    }
}

static void warn_unused_lets(Resolver *r) {
    for (int i = scopes_innermost(&r->scopes); i < r->scopes.undo.len; i++) {
        Node *n = scopes_get(&r->scopes, r->scopes.undo.items[i].name);
        if (n && n->kind == N_LET && !n->used)
            diag_report(r->c, W_UNUSED_BINDING, n->loc, "`%s` is bound but never used", n->name);
    }
}

static void resolve_body(Resolver *r, Node *body) {
    scopes_push(r->c->arena, &r->scopes);
    for (int i = 0; i < body->list.len; i++)
        resolve_statement(r, body->list.items[i]);
    warn_unused_lets(r);
    scopes_pop(r->c->arena, &r->scopes);
}

/* A model or block: its input shape, parameter defaults (each may use the parameters
 * before it), then its body. */
static void resolve_decl(Resolver *r, Node *decl) {
    Signature *sig = signature_of_decl(r->c, decl);
    r->owner = decl;
    r->scopes = (Scopes){0};
    r->in_body = false;
    if (sig->input)
        resolve_expr(r, sig->input->b, NULL);
    scopes_push(r->c->arena, &r->scopes);
    for (int i = 0; i < sig->nparams; i++) {
        resolve_expr(r, sig->params[i].def_expr, &sig->params[i]);
        scopes_bind(r->c->arena, &r->scopes, sig->params[i].name, sig->params[i].decl);
    }
    r->in_body = true;
    resolve_body(r, decl->b);
    scopes_pop(r->c->arena, &r->scopes);
    r->owner = NULL;
    r->in_body = false;
}

/* ------------------------------------------------------ strategy and train */

/* Settings that belong to the other block are reported, not matched; their names are
 * kept so that the other block does not also call them missing. */
static NodeList placed_settings(Resolver *r, NodeList *list, const Builtin *own,
                                const Builtin *other, const char *other_place, bool report) {
    NodeList kept = {0};
    for (int i = 0; i < list->len; i++) {
        Node *s = list->items[i];
        if (s->kind == N_TRAIN)
            continue;
        if (!builtin_param(own, s->name, NULL) && other && builtin_param(other, s->name, NULL)) {
            if (report) {
                diag_report(r->c, E_MISPLACED_SETTING, s->loc, "`%s` is a %s setting; move it to %s",
                            s->name, other->name, other_place);
                map_put(r->c->arena, &r->c->misplaced, s->name, (void *)1);
            }
            continue;
        }
        vec_push(r->c->arena, &kept, s);
    }
    return kept;
}

static void resolve_settings(Resolver *r, Node *n, const Builtin *own, const Builtin *other,
                             const char *other_place) {
    NodeList kept = placed_settings(r, &n->list, own, other, other_place, false);
    Signature sig = signature_of_builtin(own);
    n->slots = match_args(r->c, &sig, &kept, n->loc, true);
    resolve_slots(r, &sig, n->slots);
}

static void resolve_train(Resolver *r, Node *n, bool in_strategy) {
    Ddpc *c = r->c;
    if (c->train) {
        diag_report(c, E_MORE_THAN_ONE, n->loc, "a program trains one model, and this is a second train");
        diag_note(c, c->train->loc, "the first train is here");
        return;
    }
    if (!in_strategy && c->strategy) {
        diag_report(c, E_MISPLACED_SETTING, n->loc,
                    "this program has a strategy block; train belongs inside it");
        diag_note(c, c->strategy->loc, "the strategy is here");
        return;
    }
    c->train = n;
    Node *m = n->a;
    Node *decl = map_get(&c->globals, m->name);
    if (decl && decl->kind == N_MODEL) {
        decl->used = true;
        m->res = RES_GLOBAL;
        m->decl = decl;
        Signature *sig = signature_of_decl(c, decl);
        m->slots = match_args(c, sig, &m->list, m->loc, false);
        resolve_slots(r, sig, m->slots);
    } else {
        m->res = RES_ERROR;
        if (decl)
            diag_report(c, E_NOT_A_MODEL, m->loc, "`%s` is %s; train needs a model", m->name,
                        decl_what(decl));
        else if (builtin_find(m->name))
            diag_report(c, E_NOT_A_MODEL, m->loc, "`%s` is a built-in %s; train needs a model",
                        m->name, builtin_kind_name(builtin_find(m->name)->kind));
        else {
            diag_report(c, E_UNKNOWN_NAME, m->loc, "unknown model `%s`", m->name);
            suggest_name(r, m->loc, m->name, NULL, WANT_MODEL);
        }
        resolve_args_unmatched(r, m);
    }
    resolve_expr(r, n->b, &expect_dataset);
    for (int i = 0; i < n->list.len; i++)
        if (n->list.items[i]->kind == N_TRAIN)
            diag_report(c, E_MISPLACED_SETTING, n->list.items[i]->loc, "train blocks do not nest");
    if (in_strategy)
        resolve_settings(r, n, &train_settings, &strategy_settings, "the strategy block");
    else
        resolve_settings(r, n, &toplevel_train_settings, NULL, NULL);
}

static void resolve_strategy(Resolver *r, Node *n) {
    Ddpc *c = r->c;
    if (n != c->strategy)
        return; /* a second strategy, reported when declared */
    if (!word_in(strategy_kinds, n->name)) {
        diag_report(c, E_UNKNOWN_WORD, n->loc, "unknown strategy `%s`; ddp has %s", n->name,
                    words_list(c, strategy_kinds, " and "));
        diag_did_you_mean(c, n->loc, n->name, strategy_kinds, word_count(strategy_kinds));
    }
    placed_settings(r, &n->list, &strategy_settings, &train_settings, "the train block", true);
    for (int i = 0; i < n->list.len; i++)
        if (n->list.items[i]->kind == N_TRAIN)
            placed_settings(r, &n->list.items[i]->list, &train_settings, &strategy_settings,
                            "the strategy block", true);
    resolve_settings(r, n, &strategy_settings, &train_settings, "the train block");
    for (int i = 0; i < n->list.len; i++)
        if (n->list.items[i]->kind == N_TRAIN)
            resolve_train(r, n->list.items[i], true);
}

/* --------------------------------------------------------------- program */

static void declare(Ddpc *c, Node *n) {
    check_definable(c, n->name, n->loc, n->kind == N_LET ? "constant" : node_kind_name(n->kind));
    Node *prev = map_get(&c->globals, n->name);
    if (prev) {
        diag_report(c, E_REDEFINITION, n->loc, "`%s` is defined twice", n->name);
        diag_note(c, prev->loc, "the first definition is here");
        return;
    }
    map_put(c->arena, &c->globals, n->name, n);
}

void resolve_program(Ddpc *c) {
    NodeList *items = &c->items;
    for (int i = 0; i < items->len; i++) {
        Node *n = items->items[i];
        if (n->kind == N_DATASET || n->kind == N_MODEL || n->kind == N_BLOCK || n->kind == N_LET)
            declare(c, n);
        if (n->kind == N_STRATEGY && c->strategy) {
            diag_report(c, E_MORE_THAN_ONE, n->loc, "a program has one strategy, and this is a second");
            diag_note(c, c->strategy->loc, "the first strategy is here");
        } else if (n->kind == N_STRATEGY) {
            c->strategy = n;
        }
    }
    Resolver r = {.c = c};
    for (int i = 0; i < items->len && !c->diag.stopped; i++) {
        Node *n = items->items[i];
        r.scopes = (Scopes){0};
        r.in_body = false;
        switch (n->kind) {
        case N_DATASET:
            resolve_expr(&r, n->a, &expect_dataset);
            break;
        case N_LET:
            resolve_expr(&r, n->a, NULL);
            break;
        case N_MODEL:
        case N_BLOCK:
            resolve_decl(&r, n);
            break;
        case N_STRATEGY:
            resolve_strategy(&r, n);
            break;
        case N_TRAIN:
            resolve_train(&r, n, false);
            break;
        default:
            break;
        }
    }
    for (int i = 0; i < c->main_items.len; i++) {
        Node *n = c->main_items.items[i];
        if (n->kind == N_LET && !n->used)
            diag_report(c, W_UNUSED_BINDING, n->loc, "`%s` is defined but never used", n->name);
    }
}
