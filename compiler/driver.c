/* driver.c: the front end as one call: parse (with imports), resolve, check.
 * Used by ddpc's commands, by the fuzzer, and by anything that embeds the compiler. */
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

/* After parsing: a lost line or a missing import would make later passes report
 * errors that are not there (its names unknown, its settings missing), so they run
 * only on a program that parsed completely. */
static bool check_parsed(Ddpc *c, int errors_before) {
    if (c->diag.errors == errors_before)
        apply_defines(c);
    c->syntax_errors = c->diag.errors > errors_before;
    if (!c->syntax_errors && !c->import_failed && !c->diag.stopped) {
        resolve_program(c);
        check_program(c);
    }
    diag_flush(c);
    return c->diag.errors == errors_before;
}

bool ddpc_check_file(Ddpc *c, const char *path) {
    int before = c->diag.errors;
    if (!parse_program(c, path) && !c->main_file) {
        diag_flush(c);
        return false;
    }
    return check_parsed(c, before);
}

bool ddpc_check_memory(Ddpc *c, const char *name, const char *data, size_t len) {
    int before = c->diag.errors;
    parse_program_from_memory(c, name, data, len);
    return check_parsed(c, before);
}
