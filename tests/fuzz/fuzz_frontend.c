/* fuzz_frontend.c: libFuzzer target over the whole front end: lexer, parser, resolver,
 * expansion and settings, on arbitrary bytes. Diagnostics are formatted and written
 * (to /dev/null), so their printing is fuzzed too. Only std/ imports are read. */
#include <stdint.h>
#include <stdio.h>

#include "ddpc.h"

#ifndef DDP_SOURCE_STDLIB
#define DDP_SOURCE_STDLIB "stdlib"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static FILE *sink;
    if (!sink)
        sink = fopen("/dev/null", "w");
    Ddpc *c = ddpc_new();
    c->diag.out = sink;
    c->diag.max_errors = 50;
    c->no_imports = true;
    c->stdlib_dir = DDP_SOURCE_STDLIB;
    Pipeline p = {.path = "fuzz.ddp", .source = (const char *)data, .source_len = size, .upto = UPTO_CHECK};
    if (pipeline_run(c, &p, NULL))
        for (int i = 0; i < c->graphs.len; i++)
            graph_print(c, sink, c->graphs.items[i]);
    ast_dump(c, sink, &c->main_items);
    ddpc_free(c);
    return 0;
}
