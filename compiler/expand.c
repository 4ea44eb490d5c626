/* expand.c: a model expanded into its layer graph: every block and model used as a
 * layer inlined, every `if` decided, every `repeat` unrolled, every shape inferred.
 *
 * A body is a pipeline over the current value. Each built-in layer applied becomes one
 * GNode named by its path: the model, then each enclosing block instance, then its
 * label or an automatic name (`conv2d_1`, `conv2d_2`, ... counted per instance). Inside
 * a repeat, a label gets the iteration number (`b_1`, `b_2`). Expansion is bounded: a
 * block that uses itself is an error, and so is a model that takes more than
 * MAX_EXPANSION_STEPS steps or MAX_LAYERS layers to expand. */
#include <string.h>

#include "ddpc.h"

static const Value poison = {.kind = V_POISON};

/* A model or block being expanded: where names are made and locals live. */
typedef struct Instance {
    const char *path;
    Node *decl;
    Map counters;            /* layer kind -> int*: the next automatic name */
    VEC(int) repeat_iters;   /* 1-based iteration of each enclosing repeat */
    Env env;
    struct Instance *outer;
} Instance;

typedef struct Expander {
    Graph *g;
    Instance *inst;
    Map names;               /* full name -> GNode, to find duplicates */
    VEC(Node *) active;      /* blocks and models being expanded, outermost first */
    bool aborted;            /* a limit was passed: wind down quietly */
} Expander;

static Value exec_body(Ddpc *c, Env *env, Node *body, Value cur);

static bool over_budget(Ddpc *c, Loc at) {
    Expander *ex = c->expander;
    if (ex->aborted || c->diag.stopped)
        return true;
    if (++c->expansion_steps <= MAX_EXPANSION_STEPS && ex->g->nodes.len < MAX_LAYERS)
        return false;
    if (ex->g->nodes.len >= MAX_LAYERS)
        diag_report(c, E_EXPANSION_TOO_LARGE, at,
                    "expanding `%s` makes more than %d layers; ddp stops there",
                    ex->g->model, MAX_LAYERS);
    else
        diag_report(c, E_EXPANSION_TOO_LARGE, at,
                    "expanding `%s` takes more than %d steps; ddp stops there", ex->g->model,
                    MAX_EXPANSION_STEPS);
    ex->aborted = true;
    return true;
}

/* ---------------------------------------------------------------- names */

static const char *instance_name(Ddpc *c, Node *app, const char *kind) {
    Instance *in = c->expander->inst;
    StrBuf sb = {0};
    if (app->label) {
        sb_printf(&sb, "%s", app->label);
        for (int i = 0; i < in->repeat_iters.len; i++)
            sb_printf(&sb, "_%d", in->repeat_iters.items[i]);
    } else {
        int *n = map_get(&in->counters, kind);
        if (!n) {
            n = arena_alloc(c->arena, sizeof *n);
            map_put(c->arena, &in->counters, kind, n);
        }
        sb_printf(&sb, "%s_%d", kind, ++*n);
    }
    const char *name = arena_printf(c->arena, "%s/%s", in->path, sb.data);
    sb_free(&sb);
    return name;
}

static bool claim_name(Ddpc *c, const char *name, Loc at) {
    GNode *prev = map_get(&c->expander->names, name);
    if (prev) {
        diag_report(c, E_DUPLICATE_NAME, at, "two layers are named `%s`", name);
        diag_note(c, prev->loc, "the first is here");
        return false;
    }
    return true;
}

static GNode *add_node(Ddpc *c, const char *name, LayerOp op, Loc loc) {
    Graph *g = c->expander->g;
    GNode *n = arena_alloc(c->arena, sizeof *n);
    n->id = g->nodes.len;
    n->name = name;
    n->op = op;
    n->loc = loc;
    vec_push(c->arena, &g->nodes, n);
    map_put(c->arena, &c->expander->names, name, n);
    return n;
}

/* ------------------------------------------------------- built-in layers */

/* A bias directly before batchnorm is subtracted away again by its mean. */
static void warn_bias_before_batchnorm(Ddpc *c, GNode *bn) {
    GNode *prev = bn->inputs[0];
    if ((prev->op == L_CONV2D || prev->op == L_DEPTHWISE_CONV2D || prev->op == L_DENSE) && prev->attrs.bias &&
        !prev->attrs.activation && prev->uses == 1) {
        diag_report(c, W_BIAS_BEFORE_BATCHNORM, prev->loc,
                    "the bias of `%s` is cancelled by the batchnorm that follows it", prev->name);
        diag_note(c, prev->loc, "give it `bias = false`");
    }
}

static Value apply_builtin(Ddpc *c, Env *env, Value cur, Node *app, const Builtin *b,
                           Node **slots) {
    Signature sig = signature_of_builtin(b);
    Value *args = eval_args(c, env, &sig, slots, b->name, app->loc);
    if (cur.kind != V_TENSOR)
        return poison;
    int nin = 1;
    for (int i = 0; i < sig.nparams; i++) {
        if (args[i].kind == V_POISON)
            return poison;
        if (sig.params[i].flags & P_VARIADIC)
            nin += args[i].len;
    }
    Shape *shapes = arena_alloc(c->arena, sizeof(Shape) * (size_t)nin);
    GNode **inputs = arena_alloc(c->arena, sizeof(GNode *) * (size_t)nin);
    inputs[0] = cur.tensor;
    for (int i = 0, k = 1; i < sig.nparams; i++)
        if (sig.params[i].flags & P_VARIADIC)
            for (int j = 0; j < args[i].len; j++)
                inputs[k++] = args[i].items[j].tensor;
    for (int i = 0; i < nin; i++)
        shapes[i] = inputs[i]->out;
    const char *name = instance_name(c, app, b->name);
    LayerCall call = {b, args, slots, shapes, inputs, nin, app->loc, name};
    LayerResult res;
    if (!shape_infer(c, &call, &res) || !claim_name(c, name, app->label ? app->label_loc : app->loc))
        return poison;
    GNode *n = add_node(c, name, b->op, app->loc);
    n->layer = b;
    n->inputs = inputs;
    n->ninputs = nin;
    n->out = res.out;
    n->params = res.params;
    n->nontrainable = res.nontrainable;
    n->macs = res.macs;
    n->attrs = res.attrs;
    for (int i = 0; i < nin; i++)
        inputs[i]->uses++;
    if (b->op == L_BATCHNORM)
        warn_bias_before_batchnorm(c, n);
    Value v = {.kind = V_TENSOR, .tensor = n, .loc = app->loc};
    return v;
}

/* --------------------------------------------------- blocks and models */

/* Binds a block's or model's parameters: arguments evaluated where they were written,
 * defaults where they were declared (after the parameters before them). */
static void bind_params(Ddpc *c, Env *caller, Instance *inst, Signature *sig, Node **slots) {
    for (int i = 0; i < sig->nparams; i++) {
        const Param *p = &sig->params[i];
        Value v;
        if (slots && slots[i])
            v = eval_arg(c, caller, slots[i], p, sig->name);
        else if (p->def_expr)
            v = eval_arg(c, &inst->env, p->def_expr, p, sig->name);
        else
            v = poison; /* missing, reported when the arguments were matched */
        env_bind(c, &inst->env, p->name, v);
    }
}

static void report_recursion(Ddpc *c, Node *app, Node *decl) {
    Expander *ex = c->expander;
    StrBuf sb = {0};
    bool in_cycle = false;
    for (int i = 0; i < ex->active.len; i++) {
        in_cycle |= ex->active.items[i] == decl;
        if (in_cycle)
            sb_printf(&sb, "%s -> ", ex->active.items[i]->name);
    }
    sb_printf(&sb, "%s", decl->name);
    diag_report(c, E_RECURSION, app->loc, "`%s` uses itself (%s); a model must be finite",
                decl->name, sb.data);
    sb_free(&sb);
}

static Value apply_decl(Ddpc *c, Env *caller, Value cur, Node *app, Node *decl, Node **slots) {
    Expander *ex = c->expander;
    for (int i = 0; i < ex->active.len; i++)
        if (ex->active.items[i] == decl) {
            report_recursion(c, app, decl);
            return poison;
        }
    if (cur.kind != V_TENSOR)
        return poison;
    if (c->nesting >= MAX_NESTING) {
        diag_report(c, E_EXPANSION_TOO_LARGE, app->loc,
                    "blocks are nested more than %d deep here", MAX_NESTING);
        ex->aborted = true;
        return poison;
    }
    Signature *sig = signature_of_decl(c, decl);
    Instance inst = {0};
    inst.path = instance_name(c, app, decl->name);
    inst.decl = decl;
    inst.outer = ex->inst;
    scopes_push(c->arena, &inst.env.scopes);
    bind_params(c, caller, &inst, sig, slots);
    env_bind(c, &inst.env, "in", cur);

    ExpansionFrame frame = {expr_text(c, app), app->loc, c->diag.expansion};
    c->diag.expansion = &frame;
    vec_push(c->arena, &ex->active, decl);
    ex->inst = &inst;
    c->nesting++;
    Value out = exec_body(c, &inst.env, decl->b, cur);
    c->nesting--;
    ex->inst = inst.outer;
    ex->active.len--;
    c->diag.expansion = frame.outer;
    return out;
}

/* A layer-valued local (a parameter `act: layer`, or a let bound to one). */
static Value apply_local(Ddpc *c, Env *env, Value cur, Node *app) {
    Value *v = env_lookup(env, app->name);
    if (!v || v->kind == V_POISON)
        return poison;
    if (v->kind == V_TENSOR) {
        if (app->has_parens || app->label) {
            diag_report(c, E_ARGS_TO_VALUE, app->loc,
                        "`%s` is a value of the model; it takes no arguments or label", app->name);
            return poison;
        }
        return *v; /* naming a value makes it the current one */
    }
    if (v->kind != V_LAYER) {
        diag_report(c, E_NOT_A_LAYER, app->loc, "`%s` is %s, not a layer", app->name,
                    value_describe(c, *v));
        return poison;
    }
    if (v->builtin) {
        Signature sig = signature_of_builtin(v->builtin);
        Node **slots = match_args(c, &sig, &app->list, app->loc, false);
        return apply_builtin(c, env, cur, app, v->builtin, slots);
    }
    Node **slots = match_args(c, signature_of_decl(c, v->decl), &app->list, app->loc, false);
    return apply_decl(c, env, cur, app, v->decl, slots);
}

Value expand_apply(Ddpc *c, Env *env, Value cur, Node *app) {
    if (!c->expander || over_budget(c, app->loc))
        return poison;
    switch (app->res) {
    case RES_BUILTIN:
        return apply_builtin(c, env, cur, app, app->builtin, app->slots);
    case RES_GLOBAL:
        return apply_decl(c, env, cur, app, app->decl, app->slots);
    case RES_LOCAL:
        return apply_local(c, env, cur, app);
    default:
        return poison;
    }
}

/* ------------------------------------------------------------ statements */

/* `in`, a layer applied to the current value, or a chain `a -> b -> c`. */
static Value exec_chain(Ddpc *c, Env *env, Node *n, Value cur) {
    if (n->kind == N_IN)
        return *env_lookup(env, "in");
    if (n->kind == N_APP)
        return expand_apply(c, env, cur, n);
    Value head = exec_chain(c, env, n->a, cur);
    return expand_apply(c, env, head, n->b);
}

static bool condition(Ddpc *c, Env *env, Node *cond, bool *out) {
    Value v = eval_expr(c, env, cond);
    if (v.kind == V_POISON)
        return false;
    if (v.kind != V_BOOL) {
        diag_report(c, E_WRONG_KIND, cond->loc, "an `if` condition is true or false, not %s",
                    value_describe(c, v));
        return false;
    }
    *out = v.num != 0;
    return true;
}

static Value exec_repeat(Ddpc *c, Env *env, Node *n, Value cur) {
    Value count = eval_expr(c, env, n->a);
    if (count.kind == V_POISON)
        return poison;
    if (count.kind == V_RUNTIME) {
        diag_report(c, E_RUNTIME_SCALAR, n->a->loc,
                    "a repeat count must be known when compiling, but %s is known only at start-up",
                    value_text(c, count));
        return poison;
    }
    if (count.kind != V_NUM || !is_integer(count.num)) {
        diag_report(c, E_WRONG_KIND, n->a->loc, "a repeat count is a whole number, not %s",
                    value_describe(c, count));
        return poison;
    }
    if (count.num < 0) {
        diag_report(c, E_OUT_OF_RANGE, n->a->loc, "a repeat count cannot be negative (%s)",
                    value_text(c, count));
        return poison;
    }
    if (count.num > MAX_REPEAT) {
        diag_report(c, E_EXPANSION_TOO_LARGE, n->a->loc,
                    "repeat %s is more than the %d repetitions ddp allows", value_text(c, count),
                    MAX_REPEAT);
        return poison;
    }
    if (count.num == 0)
        diag_report(c, W_EMPTY_REPEAT, n->loc, "this repeat runs zero times");
    Instance *inst = c->expander->inst;
    vec_push(c->arena, &inst->repeat_iters, 0);
    int slot = inst->repeat_iters.len - 1;
    for (int i = 0; i < (int)count.num && !c->expander->aborted; i++) {
        if (over_budget(c, n->loc))
            break;
        inst->repeat_iters.items[slot] = i + 1;
        scopes_push(c->arena, &env->scopes);
        if (n->name) {
            Value index = {.kind = V_NUM, .num = i, .loc = n->label_loc};
            env_bind(c, env, n->name, index);
        }
        cur = exec_body(c, env, n->b, cur);
        scopes_pop(c->arena, &env->scopes);
    }
    inst->repeat_iters.len--;
    return cur;
}

static Value exec_statement(Ddpc *c, Env *env, Node *n, Value cur) {
    switch (n->kind) {
    case N_APP:
    case N_CHAIN:
    case N_IN:
        return exec_chain(c, env, n, cur);
    case N_LET:
        env_bind(c, env, n->name, eval_expr(c, env, n->a));
        return cur;
    case N_REBIND: {
        Value v = eval_expr(c, env, n->a);
        Value *slot = n->decl ? env_lookup(env, n->name) : NULL;
        if (slot)
            *slot = v;
        return cur;
    }
    case N_IF: {
        bool taken;
        if (!condition(c, env, n->a, &taken))
            return poison;
        if (taken)
            return exec_body(c, env, n->b, cur);
        if (n->c && n->c->kind == N_IF)
            return exec_statement(c, env, n->c, cur);
        return n->c ? exec_body(c, env, n->c, cur) : cur;
    }
    case N_REPEAT:
        return exec_repeat(c, env, n, cur);
    default:
        return cur;
    }
}

static Value exec_body(Ddpc *c, Env *env, Node *body, Value cur) {
    scopes_push(c->arena, &env->scopes);
    for (int i = 0; i < body->list.len; i++) {
        Node *n = body->list.items[i];
        if (over_budget(c, n->loc))
            break;
        cur = exec_statement(c, env, n, cur);
    }
    scopes_pop(c->arena, &env->scopes);
    return cur;
}

/* -------------------------------------------------------------- models */

/* Layers whose output never reaches the model's output; only the last of each dead
 * branch is reported. */
static void warn_unused_layers(Ddpc *c, Graph *g) {
    bool *live = arena_alloc(c->arena, (size_t)g->nodes.len + 1);
    GNode **stack = arena_alloc(c->arena, sizeof(GNode *) * (size_t)(g->nodes.len + 1));
    int top = 0;
    stack[top++] = g->output;
    live[g->output->id] = true;
    while (top > 0) {
        GNode *n = stack[--top];
        for (int i = 0; i < n->ninputs; i++)
            if (!live[n->inputs[i]->id]) {
                live[n->inputs[i]->id] = true;
                stack[top++] = n->inputs[i];
            }
    }
    for (int i = 1; i < g->nodes.len; i++) {
        GNode *n = g->nodes.items[i];
        if (!live[i] && n->uses == 0)
            diag_report(c, W_UNUSED_LAYER, n->loc, "the output of `%s` never reaches the model's output",
                        n->name);
    }
}

Graph *expand_model(Ddpc *c, Node *model, Node *app, Loc at) {
    Signature *sig = signature_of_decl(c, model);
    if (!sig->input) {
        diag_report(c, E_NO_INPUT_SHAPE, at, "`%s` has no input shape", model->name);
        diag_note(c, model->loc, "declare it as `model %s(input: [...], ...)`", model->name);
        return NULL;
    }
    /* the shape given where the model is trained, else its declared one */
    Node *given = app && app->slots ? app->slots[sig->nparams] : NULL, *input = given ? given : sig->input->b;
    Value shape = eval_arg(c, NULL, input, &model_input, model->name);
    if (shape.kind == V_POISON)
        return NULL;

    Shape in_shape = {shape.len, {0}};
    for (int i = 0; i < shape.len; i++)
        in_shape.dim[i] = (int64_t)shape.items[i].num;
    if (shape_count(&in_shape) < 0) {
        diag_report(c, E_TENSOR_TOO_LARGE, expr_span(input),
                    "the input %s of `%s` holds more than 2^53 values", shape_text(c, &in_shape),
                    model->name);
        return NULL;
    }
    Graph *g = arena_alloc(c->arena, sizeof *g);
    g->model = model->name;
    g->decl = model;
    g->input.rank = shape.len;
    for (int i = 0; i < shape.len; i++)
        g->input.dim[i] = (int64_t)shape.items[i].num;
    Expander ex = {0};
    ex.g = g;
    Expander *outer = c->expander;
    c->expander = &ex;

    Instance root = {0};
    root.path = model->name;
    root.decl = model;
    ex.inst = &root;
    GNode *in = add_node(c, arena_printf(c->arena, "%s/input", model->name), L_INPUT, sig->input->loc);
    in->out = g->input;
    scopes_push(c->arena, &root.env.scopes);
    bind_params(c, NULL, &root, sig, app ? app->slots : NULL);
    Value cur = {.kind = V_TENSOR, .tensor = in, .loc = sig->input->loc};
    env_bind(c, &root.env, "in", cur);
    vec_push(c->arena, &ex.active, model);
    Value out = exec_body(c, &root.env, model->b, cur);
    c->expander = outer;

    if (out.kind != V_TENSOR || ex.aborted)
        return NULL;
    g->output = out.tensor;
    g->output->uses++;
    warn_unused_layers(c, g);
    for (int i = 0; i < g->nodes.len; i++) {
        g->params += g->nodes.items[i]->params;
        g->nontrainable += g->nodes.items[i]->nontrainable;
        g->macs += g->nodes.items[i]->macs;
    }
    return g;
}

/* ------------------------------------------------------------- program */

/* A model that can be checked on its own: an input shape, a default for everything. */
static bool standalone(Ddpc *c, Node *model) {
    Signature *sig = signature_of_decl(c, model);
    if (!sig->input)
        return false;
    for (int i = 0; i < sig->nparams; i++)
        if (sig->params[i].flags & P_REQUIRED)
            return false;
    return true;
}

void expand_program(Ddpc *c) {
    if (c->diag.stopped)
        return;
    TrainSpec *spec = c->spec;
    Node *m = c->train ? c->train->a : NULL;
    if (spec && m->res == RES_GLOBAL && (spec->graph = expand_model(c, m->decl, m, m->loc)))
        vec_push(c->arena, &c->graphs, spec->graph);
    /* every other model that can be shown on its own, for emit --stage=graph and its checks */
    Node *trained = spec && spec->graph && !m->has_parens ? spec->graph->decl : NULL;
    for (int i = 0; i < c->main_items.len && !c->diag.stopped; i++) {
        Node *n = c->main_items.items[i];
        if (n->kind != N_MODEL || n == trained || !standalone(c, n))
            continue;
        if (c->only_model && strcmp(c->only_model, n->name) != 0)
            continue;
        Graph *g = expand_model(c, n, NULL, n->loc);
        if (g)
            vec_push(c->arena, &c->graphs, g);
    }
}
