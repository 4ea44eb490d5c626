/* main.c: the ddpc command.
 *
 *   ddpc check FILE...             exit 0 when clean, 1 with errors, 2 on bad usage
 *   ddpc emit --stage=S FILE       print one stage: tokens, ast, graph, settings, ir,
 *                                  plan, llvm, ptx
 *   ddpc build FILE -o OUT         one executable (or an object file with -c)
 *
 * Each command runs the compiler's passes (pipeline.c) as far as it needs. Diagnostics
 * go to stderr, stages to stdout. Each FILE is a program of its own. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddpc.h"
#include "parser.h"

#ifndef DDP_SOURCE_STDLIB
#define DDP_SOURCE_STDLIB ""
#endif
#ifndef DDP_INSTALL_STDLIB
#define DDP_INSTALL_STDLIB ""
#endif

static const char usage[] =
    "usage: ddpc <command> [options] FILE...\n"
    "\n"
    "commands:\n"
    "  check FILE...          check programs: exit 0 when clean, 1 when a program has errors\n"
    "  build FILE -o OUT      compile a program into one executable (-c: an object file)\n"
    "  emit --stage=S FILE    print a stage of the compiler for one program:\n"
    "                           tokens  the lexer's tokens\n"
    "                           ast     the syntax tree\n"
    "                           graph   every layer after expansion, with shapes, parameters\n"
    "                                   and multiply-accumulates\n"
    "                           settings  the datasets, strategy and train settings in effect,\n"
    "                                   defaults filled in\n"
    "                           ir      the training step as tensor ops: forward, backward,\n"
    "                                   optimizer, evaluation\n"
    "                           plan    the memory plan, parameter layout, gradient buckets\n"
    "                                   and schedule\n"
    "                           llvm    the generated CPU kernels as LLVM IR\n"
    "                           ptx     the generated GPU kernels as PTX\n"
    "\n"
    "options:\n"
    "  -I DIR                 look for imports in DIR too (before the standard library)\n"
    "  -D SETTING=VALUE       override a setting of the program (build, emit)\n"
    "  -o OUT, -c             build: the executable, or an object file with -c\n"
    "  -O0 .. -O3             build: optimisation of the generated code (default -O2)\n"
    "  --stats                build: print the peak memory per replica by kind\n"
    "  --model NAME           emit --stage=graph: the model to show (default: the trained one,\n"
    "                         or every model with an input shape)\n"
    "  --max-errors N         stop after N errors (default 20; 0 means no limit)\n"
    "  --dtype f32|f64        the element type of the generated code (f64 for gradient checks)\n"
    "  --bucket-size BYTES    gradient bucket size (default 25M; 64K at least)\n"
    "  --no-reuse             give every value its own memory (to test the memory plan)\n"
    "  --no-barriers          leave the GPU kernels' barriers out (to see the emulated GPU\n"
    "                         catch it: their block sums go wrong)\n"
    "  -w                     no warnings\n"
    "  -Werror                warnings are errors\n"
    "  -Wno-NAME              turn off the warning NAME (see --list-diagnostics)\n"
    "  --color=WHEN           colour diagnostics: auto (on a terminal), always, never\n"
    "  --list-diagnostics     print every diagnostic ddpc can give, with its name\n"
    "  --list-builtins        print every built-in layer, loss, optimizer, ... and setting\n"
    "  -h, --help             this help\n"
    "  --version              the version\n"
    "\n"
    "environment: DDP_STDLIB overrides the standard library folder; NO_COLOR turns colour off;\n"
    "TMPDIR is where a build writes its temporary files (default /tmp); DDP_CACHE_DIR is the\n"
    "cache of generated code (default ~/.cache/ddp; off: none), DDP_CACHE_SIZE its limit in\n"
    "bytes, or with K, M or G (256M).\n";

typedef enum { STAGE_CHECK, STAGE_TOKENS, STAGE_AST, STAGE_GRAPH, STAGE_SETTINGS, STAGE_IR, STAGE_PLAN,
               STAGE_LLVM, STAGE_PTX } Stage;

typedef struct Options {
    const char *command;
    Stage stage;
    const char *files[256];
    int nfiles;
    const char *include_dirs[64];
    int ninclude_dirs;
    const char *model;
    int max_errors;
    bool warnings_off, werror;
    bool disabled[DIAG_COUNT];
    int color; /* -1 auto, 0 never, 1 always */
    DType dtype;
    int64_t bucket_bytes;
    bool no_reuse, no_barriers;
    BuildOptions build;
    const char *defines[64];
    int ndefines;
} Options;

static int bad_usage(const char *fmt, const char *arg) {
    fprintf(stderr, "ddpc: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nRun `ddpc --help` for the commands and options.\n");
    return 2;
}

static void list_diagnostics(void) {
    static const char *const sev[] = {"error", "warning", "note"};
    for (int i = 0; i < DIAG_COUNT; i++)
        printf("| `%s` | %s | %s |\n", diag_catalogue[i].name, sev[diag_catalogue[i].sev],
               diag_catalogue[i].summary);
}

/* A parameter as the reference documents it: `name`, `name = default`. */
static void print_param(Ddpc *c, const Param *p) {
    printf("%s%s", p->name, p->flags & P_VARIADIC ? "..." : "");
    if (p->flags & P_REQUIRED)
        return;
    Value v = param_default(c, p, (Loc){0});
    if (v.kind == V_NONE)
        printf(" = none");
    else
        printf(" = %s", value_text(c, v));
}

/* The built-ins and settings as markdown table rows, the source of docs/language.md's
 * reference tables (tests/docs.sh checks that they agree). */
static void list_builtins(void) {
    Ddpc *c = ddpc_new();
    const Builtin *settings[] = {&strategy_settings, &train_settings};
    for (int i = 0; i < builtin_count + 2; i++) {
        const Builtin *b = i < builtin_count ? &builtins[i] : settings[i - builtin_count];
        if (i < builtin_count) {
            printf("| %s | `%s", builtin_kind_name(b->kind), b->name);
            if (b->nparams)
                putchar('(');
            for (int k = 0; k < b->nparams; k++) {
                printf("%s", k ? ", " : "");
                print_param(c, &b->params[k]);
            }
            printf("%s` | %s |\n", b->nparams ? ")" : "", b->summary);
            continue;
        }
        for (int k = 0; k < b->nparams; k++) {
            printf("| %s | `", b->name);
            print_param(c, &b->params[k]);
            printf("` | %s |\n", kind_describe(&b->params[k]));
        }
    }
    ddpc_free(c);
}

/* DDP_STDLIB, else beside the installed binary, else the source tree it was built from. */
static const char *find_stdlib(void) {
    return find_installed("DDP_STDLIB", "../share/ddp/stdlib", DDP_INSTALL_STDLIB, DDP_SOURCE_STDLIB, true);
}

/* Returns -1 when parsing went fine, else the exit status. */
static int parse_options(int argc, char **argv, Options *o) {
    o->max_errors = 20;
    o->color = -1;
    o->bucket_bytes = 25 << 20;
    o->build.opt_level = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage, stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("ddpc %s\n", DDP_VERSION);
            return 0;
        } else if (strcmp(a, "--list-diagnostics") == 0) {
            list_diagnostics();
            return 0;
        } else if (strcmp(a, "--list-builtins") == 0) {
            list_builtins();
            return 0;
        } else if (strcmp(a, "-I") == 0 || strncmp(a, "-I", 2) == 0) {
            const char *dir = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : NULL);
            if (!dir)
                return bad_usage("-I needs a folder", "");
            if (o->ninclude_dirs == 64)
                return bad_usage("too many -I folders (at most 64)", "");
            o->include_dirs[o->ninclude_dirs++] = dir;
        } else if (strncmp(a, "--stage=", 8) == 0) {
            const char *s = a + 8;
            if (strcmp(s, "tokens") == 0) o->stage = STAGE_TOKENS;
            else if (strcmp(s, "ast") == 0) o->stage = STAGE_AST;
            else if (strcmp(s, "graph") == 0) o->stage = STAGE_GRAPH;
            else if (strcmp(s, "settings") == 0) o->stage = STAGE_SETTINGS;
            else if (strcmp(s, "ir") == 0) o->stage = STAGE_IR;
            else if (strcmp(s, "plan") == 0) o->stage = STAGE_PLAN;
            else if (strcmp(s, "llvm") == 0) o->stage = STAGE_LLVM;
            else if (strcmp(s, "ptx") == 0) o->stage = STAGE_PTX;
            else return bad_usage("unknown stage `%s`; the stages are tokens, ast, graph, settings, ir, "
                                  "plan, llvm and ptx", s);
        } else if (strcmp(a, "-o") == 0) {
            if (i + 1 >= argc)
                return bad_usage("-o needs a file name%s", "");
            o->build.output = argv[++i];
        } else if (a[0] == '-' && a[1] == 'O' && a[2] >= '0' && a[2] <= '3' && !a[3]) {
            o->build.opt_level = a[2] - '0';
        } else if (strcmp(a, "--stats") == 0) {
            o->build.stats = true;
        } else if (strcmp(a, "-c") == 0) {
            o->build.object_only = true;
        } else if (strcmp(a, "-D") == 0 || strncmp(a, "-D", 2) == 0) {
            const char *d = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : NULL);
            if (!d || !strchr(d, '='))
                return bad_usage("-D takes setting=value, such as -D batch_per_replica=16%s", "");
            if (o->ndefines == 64)
                return bad_usage("too many -D settings (at most 64)%s", "");
            o->defines[o->ndefines++] = d;
        } else if (strncmp(a, "--dtype=", 8) == 0 || strcmp(a, "--dtype") == 0) {
            const char *v = a[7] == '=' ? a + 8 : (i + 1 < argc ? argv[++i] : "");
            if (strcmp(v, "f32") == 0) o->dtype = DT_F32;
            else if (strcmp(v, "f64") == 0) o->dtype = DT_F64;
            else return bad_usage("--dtype takes f32 or f64, not `%s`", v);
        } else if (strncmp(a, "--bucket-size=", 14) == 0 || strcmp(a, "--bucket-size") == 0) {
            const char *v = a[13] == '=' ? a + 14 : (i + 1 < argc ? argv[++i] : "");
            char *end;
            long long n = strtoll(v, &end, 10);
            if (*end == 'K' || *end == 'k') n <<= 10, end++;
            else if (*end == 'M' || *end == 'm') n <<= 20, end++;
            if (!*v || *end || n < 65536 || n > (1ll << 32))
                return bad_usage("--bucket-size takes bytes from 64K to 4G (e.g. 25M), not `%s`", v);
            o->bucket_bytes = n;
        } else if (strcmp(a, "--no-reuse") == 0) {
            o->no_reuse = true;
        } else if (strcmp(a, "--no-barriers") == 0) {
            o->no_barriers = true;
        } else if (strcmp(a, "--model") == 0 || strncmp(a, "--model=", 8) == 0) {
            o->model = a[7] == '=' ? a + 8 : (i + 1 < argc ? argv[++i] : NULL);
            if (!o->model || !*o->model)
                return bad_usage("--model needs a model's name", "");
        } else if (strncmp(a, "--max-errors=", 13) == 0 || strcmp(a, "--max-errors") == 0) {
            const char *v = a[12] == '=' ? a + 13 : (i + 1 < argc ? argv[++i] : NULL);
            char *end;
            long n = v ? strtol(v, &end, 10) : -1;
            if (!v || *end || n < 0 || n > 1000000)
                return bad_usage("--max-errors needs a number from 0 to 1000000, not `%s`", v ? v : "");
            o->max_errors = (int)n;
        } else if (strcmp(a, "-w") == 0) {
            o->warnings_off = true;
        } else if (strcmp(a, "-Werror") == 0) {
            o->werror = true;
        } else if (strncmp(a, "-Wno-", 5) == 0) {
            DiagId id = diag_by_name(a + 5);
            if (id == DIAG_COUNT || diag_catalogue[id].sev != SEV_WARNING)
                return bad_usage("`%s` names no warning (see --list-diagnostics)", a + 5);
            o->disabled[id] = true;
        } else if (strncmp(a, "--color=", 8) == 0) {
            const char *w = a + 8;
            if (strcmp(w, "auto") == 0) o->color = -1;
            else if (strcmp(w, "always") == 0) o->color = 1;
            else if (strcmp(w, "never") == 0) o->color = 0;
            else return bad_usage("--color takes auto, always or never, not `%s`", w);
        } else if (a[0] == '-' && a[1]) {
            return bad_usage("unknown option `%s`", a);
        } else if (!o->command) {
            o->command = a;
        } else {
            if (o->nfiles == 256)
                return bad_usage("too many files (at most 256)", "");
            o->files[o->nfiles++] = a;
        }
    }
    if (!o->command)
        return bad_usage("no command given%s", "");
    bool build = strcmp(o->command, "build") == 0;
    if (strcmp(o->command, "check") != 0 && strcmp(o->command, "emit") != 0 && !build)
        return bad_usage("unknown command `%s`; the commands are check, emit and build", o->command);
    if (build && o->nfiles != 1)
        return bad_usage("build takes one file%s", "");
    if (build && !o->build.output)
        return bad_usage("build needs -o OUTPUT%s", "");
    if (!build && (o->build.output || o->build.stats || o->build.object_only))
        return bad_usage("-o, -c and --stats belong to build%s", "");
    if (o->nfiles == 0)
        return bad_usage("%s needs a .ddp file", o->command);
    if (strcmp(o->command, "emit") == 0 && o->stage == STAGE_CHECK)
        return bad_usage("emit needs --stage=tokens, ast, graph, settings, ir or plan%s", "");
    if (strcmp(o->command, "emit") == 0 && o->nfiles != 1)
        return bad_usage("emit takes one file%s", "");
    if (strcmp(o->command, "check") == 0 && o->stage != STAGE_CHECK)
        return bad_usage("--stage belongs to emit%s", "");
    return -1;
}

static Ddpc *new_compiler(const Options *o) {
    Ddpc *c = ddpc_new();
    c->include_dirs = (const char **)o->include_dirs;
    c->ninclude_dirs = o->ninclude_dirs;
    c->stdlib_dir = find_stdlib();
    c->only_model = o->model;
    for (int i = 0; i < o->ndefines; i++)
        vec_push(c->arena, &c->defines, o->defines[i]);
    c->diag.max_errors = o->max_errors;
    c->diag.warnings_off = o->warnings_off;
    c->diag.warnings_as_errors = o->werror;
    memcpy(c->diag.disabled, o->disabled, sizeof c->diag.disabled);
    const char *term = getenv("TERM");
    c->diag.color = o->color == 1 ||
                    (o->color == -1 && isatty(2) && !getenv("NO_COLOR") && term && strcmp(term, "dumb") != 0);
    return c;
}

static void print_tokens(Ddpc *c, TokenList *toks) {
    for (int i = 0; i < toks->len; i++) {
        Token *t = &toks->items[i];
        printf("%d:%d %s", t->loc.line, t->loc.col, token_kind_name(t->kind));
        if (t->kind == TK_STRING)
            printf(" %.*s", (int)t->loc.len, t->text);
        else if (t->kind != 0 && t->loc.len)
            printf(" %.*s", (int)t->loc.len, t->text);
        if (t->kind == TK_NUMBER || t->kind == TK_DURATION)
            printf(" = %s%s", fmt_number(c->arena, t->num),
                   t->unit == UNIT_EPOCHS ? " epochs" : t->unit == UNIT_STEPS ? " steps" : "");
        putchar('\n');
    }
}

/* The passes for path, as far as upto. */
static bool run_passes(Ddpc *c, const Options *o, const char *path, Upto upto, Ir **ir) {
    Pipeline p = {.path = path, .upto = upto, .dtype = o->dtype, .bucket_bytes = o->bucket_bytes,
                  .no_reuse = o->no_reuse, .no_barriers = o->no_barriers, .build = &o->build};
    return pipeline_run(c, &p, ir);
}

static int emit(const Options *o) {
    Ddpc *c = new_compiler(o);
    int status = 0;
    const char *path = o->files[0];
    if (o->stage == STAGE_TOKENS) {
        const char *why;
        SourceFile *f = source_load(c, path, false, &why);
        if (!f) {
            Loc none = {0};
            diag_report(c, E_CANNOT_READ, none, "cannot read %s: %s", path, why);
        } else {
            TokenList toks = {0};
            lex_file(c, f, &toks);
            print_tokens(c, &toks);
        }
    } else if (o->stage == STAGE_AST) {
        if (parse_program(c, path) || c->main_file)
            ast_dump(c, stdout, &c->main_items);
    } else if (o->stage == STAGE_SETTINGS) {
        if (run_passes(c, o, path, UPTO_CHECK, NULL))
            settings_print(c, stdout);
    } else if (o->stage == STAGE_IR || o->stage == STAGE_PLAN || o->stage == STAGE_LLVM ||
               o->stage == STAGE_PTX) {
        Ir *ir;
        if (!run_passes(c, o, path, UPTO_PLAN, &ir))
            status = 1;
        else if (o->stage == STAGE_IR)
            ir_print(c, stdout, ir);
        else if (o->stage == STAGE_PLAN)
            plan_print(c, stdout, ir);
        else if (!build_emit_code(c, ir, o->stage == STAGE_PTX, o->build.opt_level, stdout))
            status = 1;
    } else if (run_passes(c, o, path, UPTO_CHECK, NULL)) {
        /* the trained model's graph, or the one asked for, or every model that can be
         * shown on its own */
        int shown = 0;
        for (int i = 0; i < c->graphs.len; i++) {
            Graph *g = c->graphs.items[i];
            if (o->model ? strcmp(g->model, o->model) != 0 : c->spec && g != c->spec->graph)
                continue;
            if (shown++)
                putchar('\n');
            graph_print(c, stdout, g);
            if (o->model)
                break;
        }
        if (!shown) {
            if (o->model)
                fprintf(stderr, "ddpc: %s has no model `%s` that can be shown: it needs an input "
                                "shape and a default for every parameter\n", path, o->model);
            else
                fprintf(stderr, "ddpc: %s trains no model and has none with an input shape and "
                                "defaults to show\n", path);
            status = 1;
        }
    }
    if (c->diag.errors)
        status = 1;
    ddpc_free(c);
    return status;
}

static int build(const Options *o) {
    Ddpc *c = new_compiler(o);
    int status = run_passes(c, o, o->files[0], UPTO_LINK, NULL) ? 0 : 1;
    ddpc_free(c);
    return status;
}

static int check(const Options *o) {
    int status = 0;
    for (int i = 0; i < o->nfiles; i++) {
        Ddpc *c = new_compiler(o);
        if (!run_passes(c, o, o->files[i], UPTO_CHECK, NULL))
            status = 1;
        ddpc_free(c);
    }
    return status;
}

int main(int argc, char **argv) {
    /* diagnostics are written a character at a time; a line at a time is one write */
    static char stderr_buffer[1 << 16];
    setvbuf(stderr, stderr_buffer, _IOLBF, sizeof stderr_buffer);
    Options o = {0};
    int status = parse_options(argc, argv, &o);
    if (status >= 0)
        return status;
    fflush(stdout);
    if (strcmp(o.command, "build") == 0)
        return build(&o);
    return strcmp(o.command, "emit") == 0 ? emit(&o) : check(&o);
}
