/* parse.c: drives the generated parser over a file's tokens, reports syntax errors,
 * and loads imports.
 *
 * Each file is lexed completely, then fed to the Lemon parser token by token. The
 * parser recovers from a syntax error at the next item, statement or setting, so one
 * run can report several. Imports are parsed depth first, each file once (by real
 * path); their items come before the importing file's in c->items. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "ddpc.h"
#include "parser.h"

void *ddp_parseAlloc(void *(*alloc)(size_t), ParseState *ps);
void ddp_parse(void *parser, int kind, Token *tok);
void ddp_parseFree(void *parser, void (*dealloc)(void *));

/* Groups of tokens that read better as one word in "expected ..." lists. */
static const int expression_starters[] = {TK_NAME, TK_NUMBER, TK_DURATION, TK_STRING, TK_TRUE,
                                          TK_FALSE, TK_IN, TK_LPAREN, TK_LBRACKET, TK_MINUS,
                                          TK_NOT};
static const int statement_starters[] = {TK_NAME, TK_IN, TK_LET, TK_IF, TK_REPEAT};
static const int item_starters[] = {TK_IMPORT, TK_DATASET, TK_MODEL, TK_BLOCK, TK_STRATEGY,
                                    TK_TRAIN, TK_LET};
static const int binary_operators[] = {TK_ARROW, TK_OR, TK_AND, TK_EQ, TK_NE, TK_LT, TK_LE,
                                       TK_GT, TK_GE, TK_PLUS, TK_MINUS, TK_STAR, TK_SLASH};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static bool has_all(const bool *set, const int *group, int n) {
    for (int i = 0; i < n; i++)
        if (!set[group[i]])
            return false;
    return true;
}

static void take_group(bool *set, const int *group, int n) {
    for (int i = 0; i < n; i++)
        set[group[i]] = false;
}

/* "expected `)` or `,`", or NULL when the list would be too long to help. */
static const char *expected_text(Ddpc *c, const int *expected, int n) {
    bool set[256] = {0};
    for (int i = 0; i < n; i++)
        if (expected[i] > 0 && expected[i] < 256)
            set[expected[i]] = true;
    const char *words[16];
    int nwords = 0;
    if (has_all(set, item_starters, COUNT(item_starters))) {
        take_group(set, item_starters, COUNT(item_starters));
        set[0] = false;
        words[nwords++] = "a declaration (import, dataset, model, block, strategy, train or let)";
    }
    if (has_all(set, statement_starters, COUNT(statement_starters))) {
        take_group(set, statement_starters, COUNT(statement_starters));
        words[nwords++] = "a statement";
    }
    if (has_all(set, expression_starters, COUNT(expression_starters))) {
        take_group(set, expression_starters, COUNT(expression_starters));
        words[nwords++] = "an expression";
    }
    if (has_all(set, binary_operators, COUNT(binary_operators))) {
        take_group(set, binary_operators, COUNT(binary_operators));
        set[TK_ARROW] = false;
        words[nwords++] = "an operator";
    }
    /* keywords that fall back to names are not worth naming where a name is expected */
    for (int i = 0; i < n; i++)
        if (expected[i] == TK_NAME)
            set[TK_TRAIN] = set[TK_ON] = set[TK_AS] = false;
    for (int k = 0; k < 256; k++)
        if (set[k]) {
            if (nwords == COUNT(words))
                return NULL;
            words[nwords++] = token_shown(k);
        }
    if (nwords == 0 || nwords > 5)
        return NULL;
    StrBuf sb = {0};
    for (int i = 0; i < nwords; i++)
        sb_printf(&sb, "%s%s", i == 0 ? "" : i == nwords - 1 ? " or " : ", ", words[i]);
    const char *text = arena_strdup(c->arena, sb.data);
    sb_free(&sb);
    return text;
}

/* The `{` among the first n tokens that was never closed, or NULL. Where a `}` stands
 * at the indentation of an outer brace's line rather than its own, the braces opened
 * in between are the ones left open (so a `}` missing inside a block is found there,
 * not at the model around it); else the innermost still open. */
static const Token *unclosed_brace(const Token *tok, int n) {
    enum { DEPTH = 256 };
    int open[DEPTH], depth = 0, line = 0, indent = 0;
    int *indent_of = malloc(sizeof(int) * (size_t)(n + 1)); /* the indentation of each token's line */
    if (!indent_of)
        return NULL;
    for (int i = 0; i < n; i++) {
        if (i == 0 || tok[i].loc.line != line)
            line = tok[i].loc.line, indent = tok[i].loc.col;
        indent_of[i] = indent;
    }
    const Token *suspect = NULL;
    for (int i = 0; i < n; i++) {
        if (tok[i].kind == TK_LBRACE && depth < DEPTH) {
            open[depth++] = i;
        } else if (tok[i].kind == TK_RBRACE && depth > 0) {
            int at = depth - 1;
            if (indent_of[open[at]] != indent_of[i] && indent_of[i] == tok[i].loc.col)
                for (int k = at - 1; k >= 0; k--)
                    if (indent_of[open[k]] == indent_of[i]) {
                        if (!suspect)
                            suspect = &tok[open[at]];
                        at = k;
                        break;
                    }
            depth = at;
        }
    }
    free(indent_of);
    if (suspect)
        return suspect;
    return depth > 0 ? &tok[open[depth - 1]] : NULL;
}

void parse_syntax_error(ParseState *ps, const Token *t, const int *expected, int nexpected) {
    Ddpc *c = ps->c;
    const char *exp = expected_text(c, expected, nexpected);
    const char *found = token_describe(c, t);
    if (exp)
        diag_report(c, E_SYNTAX, t->loc, "expected %s, found %s", exp, found);
    else
        diag_report(c, E_SYNTAX, t->loc, "unexpected %s", found);
    bool eq_expected = false, brace_expected = false;
    for (int i = 0; i < nexpected; i++) {
        eq_expected |= expected[i] == TK_EQ;
        brace_expected |= expected[i] == TK_RBRACE;
    }
    if (t->kind == TK_ASSIGN && eq_expected)
        diag_note(c, t->loc, "to compare two values, write `==`");
    else if (t->kind == 0)
        diag_note(c, t->loc, "the file ends inside an unfinished construct");
    /* Where a `}` would do, at the end or at a line that starts in the first column
     * (the next top-level item, most likely), a brace left open is the likely cause. */
    const Token *brace = NULL;
    if (ps->toks && brace_expected && (t->kind == 0 || t->loc.col == 1))
        brace = unclosed_brace(ps->toks->items, (int)(t - ps->toks->items));
    if (brace)
        diag_note(c, brace->loc, "this `{` is never closed");
}

void parse_tokens(Ddpc *c, SourceFile *f, TokenList *toks, NodeList *items) {
    ParseState ps = {c, f, items, false, false, toks};
    void *parser = ddp_parseAlloc(malloc, &ps);
    if (!parser) {
        fprintf(stderr, "ddpc: out of memory\n");
        exit(3);
    }
    for (int i = 0; i < toks->len; i++) {
        Token *t = &toks->items[i];
        ddp_parse(parser, t->kind, t);
        if (ps.overflow) {
            diag_report(c, E_TOO_DEEP, t->loc,
                        "this is nested too deeply for the parser (more than %d levels)",
                        PARSER_STACK);
            diag_note(c, t->loc, "the rest of %s is not checked", f->path);
        }
        if (ps.failed || t->kind == 0 || c->diag.stopped)
            break;
    }
    ddp_parseFree(parser, free);
}

/* --------------------------------------------------------------- imports */

static SourceFile *find_loaded(Ddpc *c, const char *realpath) {
    for (int i = 0; i < c->files.len; i++)
        if (strcmp(c->files.items[i]->realpath, realpath) == 0)
            return c->files.items[i];
    return NULL;
}

/* Standard library module names, for "did you mean" on a missing std/ import. */
static void note_stdlib_modules(Ddpc *c, Loc loc, const char *name) {
    if (!c->stdlib_dir || strncmp(name, "std/", 4) != 0)
        return;
    DIR *d = opendir(c->stdlib_dir);
    if (!d)
        return;
    const char *names[256];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < 256;) {
        size_t len = strlen(e->d_name);
        if (len > 4 && strcmp(e->d_name + len - 4, ".ddp") == 0)
            names[n++] = arena_printf(c->arena, "std/%.*s", (int)(len - 4), e->d_name);
    }
    closedir(d);
    diag_did_you_mean(c, loc, name, names, n);
}

static void parse_file(Ddpc *c, SourceFile *f);

static void load_import(Ddpc *c, SourceFile *from, Node *imp) {
    const char *path = NULL;
    if (!c->no_imports || strncmp(imp->str, "std/", 4) == 0)
        path = source_find_import(c, from, imp->str);
    if (!path) {
        c->import_failed = true;
        diag_report(c, E_IMPORT_NOT_FOUND, imp->loc, "cannot find the import \"%s\"", imp->str);
        if (strncmp(imp->str, "std/", 4) == 0)
            diag_note(c, imp->loc, "std/ names a file of the standard library (%s)",
                      c->stdlib_dir ? c->stdlib_dir : "not found");
        else
            diag_note(c, imp->loc, "searched beside %s%s", from->path,
                      c->ninclude_dirs ? " and in the -I folders" : "");
        note_stdlib_modules(c, imp->loc, imp->str);
        return;
    }
    const char *why = NULL;
    char real[4096];
    if (realpath(path, real) && find_loaded(c, real))
        return; /* already imported, or being imported (a cycle is harmless) */
    SourceFile *g = source_load(c, path, true, &why);
    if (!g) {
        c->import_failed = true;
        diag_report(c, E_CANNOT_READ, imp->loc, "cannot read %s: %s", path, why);
        return;
    }
    parse_file(c, g);
}

static void parse_file(Ddpc *c, SourceFile *f) {
    TokenList toks = {0};
    lex_file(c, f, &toks);
    NodeList items = {0};
    parse_tokens(c, f, &toks, &items);
    for (int i = 0; i < items.len; i++)
        if (items.items[i]->kind == N_IMPORT)
            load_import(c, f, items.items[i]);
    for (int i = 0; i < items.len; i++) {
        Node *n = items.items[i];
        if (f->imported && (n->kind == N_STRATEGY || n->kind == N_TRAIN)) {
            diag_report(c, E_LIBRARY_TRAIN, n->loc,
                        "%s belongs in the program being built, not in an imported file",
                        n->kind == N_TRAIN ? "train" : "a strategy");
            continue;
        }
        vec_push(c->arena, &c->items, n);
        if (!f->imported)
            vec_push(c->arena, &c->main_items, n);
    }
}

bool parse_program(Ddpc *c, const char *path) {
    const char *why = NULL;
    SourceFile *f = source_load(c, path, false, &why);
    if (!f) {
        Loc none = {0};
        diag_report(c, E_CANNOT_READ, none, "cannot read %s: %s", path, why);
        return false;
    }
    c->main_file = f;
    parse_file(c, f);
    return c->diag.errors == 0;
}

bool parse_program_from_memory(Ddpc *c, const char *name, const char *data, size_t len) {
    SourceFile *f = source_from_memory(c, name, data, len);
    c->main_file = f;
    parse_file(c, f);
    return c->diag.errors == 0;
}
