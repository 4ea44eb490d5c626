/* driver.c: the front end as one call: parse (with imports), resolve, check.
 * Used by ddpc's commands, by the fuzzer, and by anything that embeds the compiler. */
#include <stdlib.h>

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

/* After parsing: a lost line or a missing import would make later passes report
 * errors that are not there (its names unknown, its settings missing), so they run
 * only on a program that parsed completely. */
static bool check_parsed(Ddpc *c, int errors_before) {
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
