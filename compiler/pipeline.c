/* pipeline.c: the compiler's passes, in the order they run, in one place
 * (pipeline_run). Each pass is a file of its own:
 *
 *   parse          parse.c      the source and its imports (grammar/: re2c, Lemon)
 *   -D             here         settings from the command line replace the source's
 *   resolve        resolve.c    every name bound, every call's arguments matched
 *   settings       settings.c   the strategy's and train's settings evaluated
 *   expand         expand.c     the trained model, and every other that can stand
 *                               alone, layer by layer with shapes (shape.c)
 *   check          settings.c   the settings against the expanded model
 *   configuration  config.c     the checked configuration, typed: the contract's
 *                               ddp_settings, all that the passes below read
 *   lower          ir.c         the forward pass, loss and metrics as tensor ops
 *   autodiff       autodiff.c   the backward pass
 *   update         ir.c         the optimizer's step, the evaluation pass
 *   fuse           fuse.c       pointwise chains and row reductions into kernels
 *   plan           plan.c       flat vectors, gradient buckets, the memory plan
 *   code           build.c      the kernels for the CPU and the GPU (kernels.c, llvm.c),
 *                               the program's description (program.c)
 *   link           build.c      with the runtime library, into one executable
 *
 * ddpc's commands, the fuzzer and the tests run them up to the stage they need. */
#include <stdlib.h>
#include <string.h>

#include "ddpc.h"

Ddpc *ddpc_new(void) {
    Ddpc *c = calloc(1, sizeof *c);
    if (!c) {
        fprintf(stderr, "ddpc: out of memory\n");
        exit(3);
    }
    c->arena = arena_new();
    c->diag.out = stderr;
    c->diag.max_errors = 20;
    return c;
}

void ddpc_free(Ddpc *c) {
    if (!c)
        return;
    arena_free(c->arena);
    free(c);
}

/* The settings block a -D setting belongs in: the strategy's for a strategy setting
 * when there is a strategy, else the train block. */
static Node *settings_block(Ddpc *c, const char *name) {
    Node *strategy = NULL, *train = NULL;
    for (int i = 0; i < c->main_items.len; i++) {
        Node *n = c->main_items.items[i];
        if (n->kind == N_STRATEGY && !strategy) {
            strategy = n;
            for (int k = 0; k < n->list.len; k++)
                if (n->list.items[k]->kind == N_TRAIN && !train)
                    train = n->list.items[k];
        }
        if (n->kind == N_TRAIN && !train)
            train = n;
    }
    if (strategy && builtin_param(&strategy_settings, name, NULL))
        return strategy;
    return train;
}

/* -D name=value: the value is parsed as an expression of its own pseudo-file, so an
 * error in it points there, then replaces (or adds) the setting. */
static void apply_defines(Ddpc *c) {
    for (int i = 0; i < c->defines.len; i++) {
        const char *d = c->defines.items[i];
        const char *eq = strchr(d, '=');
        Loc none = {0};
        if (!eq || eq == d) {
            diag_report(c, E_UNKNOWN_ARGUMENT, none, "-D takes setting=value, not `%s`", d);
            continue;
        }
        const char *name = arena_strndup(c->arena, d, (size_t)(eq - d));
        if (!builtin_param(&toplevel_train_settings, name, NULL)) {
            diag_report(c, E_UNKNOWN_ARGUMENT, none, "-D %s: there is no setting `%s`", d, name);
            const char *names[64];
            int n = 0;
            for (int k = 0; k < toplevel_train_settings.nparams && n < 64; k++)
                names[n++] = toplevel_train_settings.params[k].name;
            diag_did_you_mean(c, none, name, names, n);
            continue;
        }
        Node *block = settings_block(c, name);
        if (!block) {
            diag_report(c, E_MISSING_SETTING, none, "-D %s: the program has no strategy or train block", d);
            continue;
        }
        const char *text = arena_printf(c->arena, "let %s = %s", name, eq + 1);
        SourceFile *f = source_from_memory(c, arena_printf(c->arena, "-D %s", name), text, strlen(text));
        f->imported = true;
        TokenList toks = {0};
        lex_file(c, f, &toks);
        NodeList items = {0};
        parse_tokens(c, f, &toks, &items);
        if (items.len != 1 || items.items[0]->kind != N_LET)
            continue;
        Node *value = items.items[0]->a;
        bool replaced = false;
        for (int k = 0; k < block->list.len; k++)
            if (block->list.items[k]->kind == N_SETTING && strcmp(block->list.items[k]->name, name) == 0) {
                block->list.items[k]->a = value;
                replaced = true;
            }
        if (!replaced) {
            Node *s = node_new(c, N_SETTING, value->loc);
            s->name = name;
            s->a = value;
            vec_push(c->arena, &block->list, s);
        }
    }
}

/* The front end, after parsing: a lost line or a missing import would make later
 * passes report errors that are not there (its names unknown, its settings missing),
 * so they run only on a program that parsed completely. */
static bool check_parsed(Ddpc *c, int errors_before) {
    if (c->diag.errors == errors_before)
        apply_defines(c);
    c->syntax_errors = c->diag.errors > errors_before;
    if (!c->syntax_errors && !c->import_failed && !c->diag.stopped) {
        resolve_program(c);
        settings_evaluate(c);
        expand_program(c);
        settings_check(c); /* and the configuration, c->config */
    }
    diag_flush(c);
    return c->diag.errors == errors_before;
}

bool pipeline_run(Ddpc *c, const Pipeline *p, Ir **ir) {
    int before = c->diag.errors;
    if (ir)
        *ir = NULL;
    if (p->source) {
        parse_program_from_memory(c, p->path, p->source, p->source_len);
    } else if (!parse_program(c, p->path) && !c->main_file) {
        diag_flush(c);
        return false;
    }
    if (!check_parsed(c, before))
        return false;
    if (p->upto == UPTO_CHECK)
        return true;
    if (!c->config) {
        fprintf(stderr, "ddpc: %s trains no model; there is no training step to %s\n", p->path,
                p->upto == UPTO_LINK ? "build" : "show");
        return false;
    }
    Ir *lowered = ir_lower(c, c->spec->graph, c->config, p->dtype, p->bucket_bytes, p->no_reuse);
    lowered->no_barriers = p->no_barriers;
    autodiff(c, lowered);
    ir_lower_update(c, lowered);
    mixed_precision(c, lowered);
    fuse(c, lowered);
    plan(c, lowered);
    if (ir)
        *ir = lowered;
    if (p->upto == UPTO_PLAN)
        return true;
    return build_program(c, lowered, p->build, p->path) == 0; /* code generation and link */
}
