/* ddpc.h: the compiler's internal interfaces, one section per source file.
 *
 * The front end is a straight pipeline: source text -> tokens (lexer.re) -> AST
 * (parser.y, parse.c) -> names resolved (resolve.c) -> constants folded, models
 * expanded into a layer graph with shapes (eval.c, expand.c, shape.c) -> settings
 * checked (settings.c). Everything the compiler allocates lives in one arena that is
 * freed once at the end, so no pass frees anything on its own. */
#ifndef DDPC_H
#define DDPC_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define DDP_VERSION "0.1.0"
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))

typedef struct Ddpc Ddpc;
typedef struct Node Node;
typedef struct Builtin Builtin;
typedef struct ddp_settings ddp_settings; /* runtime/ddp_abi.h: the program's configuration */
typedef struct GNode GNode;
typedef struct Graph Graph;
typedef struct Value Value;
typedef struct IrOp IrOp;

/* ---------------------------------------------------------------- util.c */

typedef struct Arena Arena;
Arena *arena_new(void);
void arena_free(Arena *a);
void *arena_alloc(Arena *a, size_t size); /* zeroed; aborts when memory runs out */
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_strdup(Arena *a, const char *s);
char *arena_printf(Arena *a, const char *fmt, ...) PRINTF_LIKE(2, 3);
void *arena_grow(Arena *a, void *items, int *cap, size_t elem_size);

/* A growable array whose storage lives in the arena. */
#define VEC(T) struct { T *items; int len, cap; }
#define vec_push(arena, v, x)                                                        \
    do {                                                                             \
        if ((v)->len == (v)->cap)                                                    \
            (v)->items = arena_grow((arena), (v)->items, &(v)->cap, sizeof *(v)->items); \
        (v)->items[(v)->len++] = (x);                                                \
    } while (0)

/* A string-keyed hash map (keys are not copied: they live in the arena). */
typedef struct Map {
    const char **keys;
    void **vals;
    int cap, len;
} Map;
void *map_get(const Map *m, const char *key);
void map_put(Arena *a, Map *m, const char *key, void *val);

/* A growable string in plain heap memory, for building output. */
typedef struct StrBuf {
    char *data;
    size_t len, cap;
} StrBuf;
void sb_printf(StrBuf *sb, const char *fmt, ...) PRINTF_LIKE(2, 3);
void sb_putc(StrBuf *sb, char c);
void sb_free(StrBuf *sb);

/* Nested scopes over one map: binding a name shadows its outer binding until the
 * scope that bound it is popped. Values are the caller's (a Node for the resolver, a
 * Value for the evaluator). */
typedef struct ScopeEntry {
    const char *name;
    void *prev;
} ScopeEntry;
typedef struct Scopes {
    Map map;
    VEC(ScopeEntry) undo;
    VEC(int) marks;
} Scopes;
void scopes_push(Arena *a, Scopes *s);
void scopes_pop(Arena *a, Scopes *s);
void scopes_bind(Arena *a, Scopes *s, const char *name, void *val);
void *scopes_get(const Scopes *s, const char *name);
/* The names bound in the innermost scope: s->undo.items[from .. s->undo.len). */
int scopes_innermost(const Scopes *s);

int edit_distance(const char *a, const char *b, int limit);
const char *fmt_number(Arena *a, double v);
/* Thousands separators: 3274634 -> "3,274,634" (into the arena). */
const char *fmt_count(Arena *a, int64_t n);

/* -------------------------------------------------------------- source.c */

typedef struct SourceFile {
    const char *path;     /* as the user named it, or as found on the search path */
    const char *realpath; /* for recognising a file imported twice */
    char *text;           /* NUL-terminated copy of the file */
    size_t len;
    bool imported;        /* a library file: no strategy or train allowed */
} SourceFile;

/* A place in the source: the offset gives the line back for the caret display. */
typedef struct Loc {
    SourceFile *file;
    uint32_t off, len;
    int line, col;
} Loc;

enum { MAX_SOURCE_BYTES = 64 << 20 };
SourceFile *source_load(Ddpc *c, const char *path, bool imported, const char **why);
SourceFile *source_from_memory(Ddpc *c, const char *name, const char *data, size_t len);
const char *source_find_import(Ddpc *c, SourceFile *from, const char *name);
/* An installed file or folder: $env, else `relative` beside the running executable,
 * else the install path, else the source tree's; NULL when none exists. */
const char *find_installed(const char *env, const char *relative, const char *install_path,
                           const char *tree_path, bool folder);

/* ---------------------------------------------------------------- diag.c */

typedef enum { SEV_ERROR, SEV_WARNING, SEV_NOTE } Severity;

typedef enum {
#define DIAG(id, sev, name, summary) id,
#include "diagnostics.def"
#undef DIAG
    DIAG_COUNT
} DiagId;

typedef struct DiagInfo {
    Severity sev;
    const char *name, *summary;
} DiagInfo;
extern const DiagInfo diag_catalogue[DIAG_COUNT];

/* While a block is being expanded, errors inside it also say where it was used. */
typedef struct ExpansionFrame {
    const char *what; /* "basic(128, stride = 2)" */
    Loc at;
    struct ExpansionFrame *outer;
} ExpansionFrame;

typedef struct Diag {
    FILE *out;
    int errors, warnings, max_errors;
    bool color, warnings_off, warnings_as_errors, quiet;
    bool stopped;        /* the error limit was reached */
    bool last_shown;     /* whether the last error or warning was printed (for its notes) */
    bool disabled[DIAG_COUNT];
    Map seen;            /* "file:off:id:message" of everything printed, to skip repeats */
    ExpansionFrame *expansion;
    VEC(ExpansionFrame) pending_frames; /* of the last error, printed after its notes */
    bool stop_reported;
    Loc last_loc;        /* of the last error or warning: its notes skip the source line */
    int hits[DIAG_COUNT];
} Diag;

void diag_report(Ddpc *c, DiagId id, Loc loc, const char *fmt, ...) PRINTF_LIKE(4, 5);
void diag_note(Ddpc *c, Loc loc, const char *fmt, ...) PRINTF_LIKE(3, 4);
/* Prints what is still pending (the expansion notes of the last error). */
void diag_flush(Ddpc *c);
/* "did you mean" over a list of candidates; NULL when none is close. */
const char *suggest(const char *name, const char *const *candidates, int n);
void diag_did_you_mean(Ddpc *c, Loc loc, const char *name, const char *const *candidates, int n);
DiagId diag_by_name(const char *name); /* DIAG_COUNT when unknown */

/* --------------------------------------------------------- lexer.re (lexer.c) */

enum { UNIT_NONE, UNIT_EPOCHS, UNIT_STEPS };

typedef struct Token {
    int kind;          /* TK_* from the generated parser.h */
    Loc loc;
    const char *text;  /* points into the source */
    double num;        /* TK_NUMBER, TK_DURATION */
    int unit;          /* TK_DURATION */
    const char *str;   /* TK_STRING (escapes decoded), TK_NAME (copied) */
} Token;

typedef VEC(Token) TokenList;
void lex_file(Ddpc *c, SourceFile *f, TokenList *out);
const char *token_kind_name(int kind); /* "NAME", "LPAREN", ... for --stage=tokens */
const char *token_shown(int kind);     /* "a name", "`(`", ... for messages */
const char *token_describe(Ddpc *c, const Token *t); /* for "unexpected X" */

/* ------------------------------------------------------------------ ast.c */

typedef enum {
    /* top-level items */
    N_IMPORT,   /* str */
    N_DATASET,  /* name = a */
    N_MODEL,    /* name(list: params) { b } */
    N_BLOCK,    /* name(list: params) { b } */
    N_STRATEGY, /* name { list: settings and train } */
    N_TRAIN,    /* train a (N_APP) on b { list: settings } */
    N_LET,      /* let name = a (top level or statement) */
    N_PARAM,    /* name [: b (annotation)] [= a] */
    N_SETTING,  /* name = a */
    /* statements */
    N_BODY,     /* list: statements */
    N_REBIND,   /* name = a */
    N_IF,       /* if a { b } else c (N_BODY or N_IF) */
    N_REPEAT,   /* repeat a [as name] { b } */
    /* expressions; N_APP, N_CHAIN and N_IN are also statements */
    N_APP,      /* [label:] name[(list: args)]: a layer applied, or a call */
    N_CHAIN,    /* a -> b (b is an N_APP) */
    N_IN,       /* in */
    N_ARG,      /* [name =] a */
    N_NUM,      /* num, integral, unit */
    N_STR,      /* str */
    N_BOOL,     /* num (0 or 1) */
    N_NAME,     /* name */
    N_LIST,     /* [list] */
    N_BINARY,   /* a op b */
    N_UNARY,    /* op a */
    N_ANNOT_KIND,  /* a parameter's kind: name is int, number, bool, string, shape, layer */
    N_ANNOT_WORDS, /* a parameter's words: list of N_NAME */
    N_ERROR,    /* where the parser recovered */
} NodeKind;

typedef enum {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_NEG,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_AND, OP_OR, OP_NOT,
} Op;

/* What a name stands for, decided by resolve.c. */
typedef enum {
    RES_NONE,
    RES_LOCAL,   /* a parameter, let, repeat index or `in` of an enclosing scope */
    RES_GLOBAL,  /* decl: a model, block, dataset or top-level let */
    RES_BUILTIN, /* builtin */
    RES_WORD,    /* an enumerated word, the name itself */
    RES_NONE_WORD, /* `none`, where the parameter's default is none: as if left out */
    RES_RUNTIME, /* replicas, workers, global_batch */
    RES_ERROR,   /* already reported */
} Res;

typedef VEC(Node *) NodeList;

struct Node {
    NodeKind kind;
    Loc loc;            /* the token that best names the node */
    const char *name;
    Node *a, *b, *c;
    NodeList list;
    double num;
    bool integral;
    bool has_parens;    /* N_APP: written with (...) */
    int unit;
    Op op;
    const char *str;
    const char *label;  /* N_APP: `label: layer` */
    Loc label_loc;
    int depth;          /* expression nesting, bounded by the parser */
    uint32_t end;       /* offset just past a closing `)` or `]`, when it has one */
    /* filled by resolve.c */
    Res res;
    Node *decl;
    const Builtin *builtin;
    int runtime;        /* RES_RUNTIME: which scalar */
    Node **slots;       /* N_APP with a known callee: the argument for each parameter */
    bool used;          /* N_LET, N_PARAM: referenced somewhere */
    int scope_depth;    /* N_LET: how deep the scope that binds it is */
    struct Signature *sig; /* N_MODEL, N_BLOCK: their parameters, made once */
    Value *value;       /* N_LET, N_DATASET at top level: evaluated once */
    bool evaluating;    /* ... and being evaluated (a cycle if met again) */
};

Node *node_new(Ddpc *c, NodeKind kind, Loc loc);
Node *node_binary(Ddpc *c, Op op, Node *a, Node *b, Loc loc);
void ast_dump(Ddpc *c, FILE *out, NodeList *items);
const char *op_text(Op op);
const char *node_kind_name(NodeKind k);
/* The expression as source-like text, for messages: "0.001 * replicas". */
const char *expr_text(Ddpc *c, const Node *n);
/* The whole extent of an expression in its line(s), for a caret with ~~~ under it. */
Loc expr_span(const Node *n);

/* ---------------------------------------------------------------- parse.c */

enum { MAX_EXPR_DEPTH = 200, PARSER_STACK = 600 };

/* Parses a file and, transitively, its imports; items of all files are appended to
 * c->items in order (imports first), the main file's own to c->main_items. */
bool parse_program(Ddpc *c, const char *path);
bool parse_program_from_memory(Ddpc *c, const char *name, const char *data, size_t len);
/* Parses one file's tokens into items (used by the above and by the tests). */
void parse_tokens(Ddpc *c, SourceFile *f, TokenList *toks, NodeList *items);

/* Called from the generated parser. */
typedef struct ParseState {
    Ddpc *c;
    SourceFile *file;
    NodeList *items;
    bool failed;   /* the parser gave up: stop feeding tokens */
    bool overflow; /* ... because its stack is full */
    const TokenList *toks; /* the file's tokens, for notes that look back */
} ParseState;
void parse_syntax_error(ParseState *ps, const Token *t, const int *expected, int nexpected);

/* ------------------------------------------------------------ builtins.c */

/* What an argument or setting expects. */
typedef enum {
    K_ANY,        /* user block parameter without a kind: anything */
    K_INT,        /* integer */
    K_NUM,        /* number */
    K_BOOL,
    K_STR,
    K_WORD,       /* one of param->words */
    K_DURATION,   /* `5 epochs`, `500 steps` */
    K_DURATIONS,  /* [30 epochs, 60 epochs]: ascending, in one unit */
    K_SHAPE,      /* [d, ...]: positive integers (reshape allows one -1) */
    K_INT_PAIR,   /* n or [h, w] */
    K_PADDING,    /* same, valid, n or [h, w] */
    K_TENSOR,     /* a value of the model (add, concat) */
    K_LAYER,      /* a layer, block or model (user block parameters `: layer`) */
    K_LR,         /* a number or a schedule */
    K_LOSS, K_OPTIMIZER, K_METRICS, K_AUGMENTS, K_DATASET, K_CHECKPOINT, K_CLUSTER,
    K_METRIC,     /* one metric */
    K_EARLY_STOPPING, K_ON_PLATEAU,
    K_STR_LIST,   /* ["a", "b"] */
    K_NUMS,       /* a number or a list of numbers, made a list */
    K_INT_RANGE,  /* [lo, hi] of integers */
    K_NUM_RANGE,  /* [lo, hi] of numbers */
} Kind;

enum {
    P_REQUIRED = 1 << 0,
    P_RUNTIME = 1 << 1,  /* may depend on replicas, workers, global_batch */
    P_POSITIVE = 1 << 2, /* > 0 */
    P_NONNEG = 1 << 3,   /* >= 0 */
    P_FRACTION = 1 << 4, /* 0 <= x < 1 */
    P_VARIADIC = 1 << 5, /* takes all remaining positional arguments */
    P_UNIT = 1 << 6,     /* 0 < x <= 1 */
    P_OPTIONAL = 1 << 7, /* no default: absent means "none" */
    P_INFER = 1 << 8,    /* K_SHAPE: one axis may be -1, inferred */
};

typedef enum { DEF_NONE, DEF_NUM, DEF_BOOL, DEF_WORD, DEF_DURATION, DEF_STR, DEF_LIST } DefaultKind;

typedef struct Param {
    const char *name;
    Kind kind;
    int flags;
    const char *const *words; /* K_WORD, K_PADDING, K_CLUSTER: the words accepted */
    DefaultKind def;
    double def_num;
    const char *def_word;     /* DEF_WORD; DEF_STR */
    int def_unit;             /* DEF_DURATION */
    const double *def_list;   /* DEF_LIST of numbers */
    int def_list_len;
    Node *def_expr;           /* a block or model parameter's default expression */
    Node *decl;               /* ... and its N_PARAM */
} Param;

typedef enum {
    B_LAYER, B_LOSS, B_OPTIMIZER, B_SCHEDULE, B_METRIC, B_AUGMENT, B_DATASET,
    B_CHECKPOINT, B_CLUSTER, B_SETTINGS, B_EARLY_STOPPING, B_ON_PLATEAU,
} BuiltinKind;

typedef enum {
    L_INPUT, L_DENSE, L_CONV2D, L_DEPTHWISE_CONV2D, L_MAXPOOL, L_AVGPOOL, L_GLOBAL_AVGPOOL,
    L_BATCHNORM, L_LAYERNORM, L_ATTENTION, L_POSITION_EMBEDDING, L_EMBEDDING, L_DROPOUT, L_FLATTEN, L_RESHAPE, L_ADD, L_CONCAT,
    L_RELU, L_RELU6, L_LEAKY_RELU, L_ELU, L_GELU, L_SILU, L_MISH, L_HARD_SWISH, L_SOFTPLUS, L_SIGMOID, L_TANH,
    L_SOFTMAX, L_IDENTITY,
    L_NONE,
} LayerOp;

struct Builtin {
    const char *name;
    BuiltinKind kind;
    const Param *params;
    int nparams;
    LayerOp op;
    int64_t code;           /* its value in the contract: DDP_LOSS_*, DDP_OPT_*, DDP_DATA_*, ... */
    const char *summary;
};

extern const Builtin builtins[];
extern const int builtin_count;
extern const Builtin strategy_settings, train_settings, toplevel_train_settings;
extern const char *const activation_words[], *const init_words[];
extern const char *const token_words[]; /* token_file(type = ...): word i is 2^i bytes a token */
/* lists whose index is the contract's code (ddp_cluster_kind, ddp_comm_kind, ...) */
extern const char *const cluster_words[], *const communication_words[], *const precision_words[],
    *const allreduce_words[], *const part_words[], *const flip_words[],
    *const erase_words[], *const interpolation_words[], *const policy_words[];
extern const char *const runtime_scalars[];
enum { RT_REPLICAS, RT_WORKERS, RT_GLOBAL_BATCH, RT_COUNT };
extern const char *const strategy_kinds[];

const Builtin *builtin_find(const char *name);
const Builtin *builtin_of(BuiltinKind kind, int64_t code);
int word_code(const char *const *words, const char *w);
const Param *builtin_param(const Builtin *b, const char *name, int *index);
const char *builtin_kind_name(BuiltinKind k);
const char *builtin_kind_article(BuiltinKind k); /* "a" or "an" */
/* The built-ins a parameter of kind k takes, one object of them (K_LOSS: the losses) or
 * a list (K_METRICS, K_AUGMENTS); false for kinds that take none. */
bool kind_takes_builtins(Kind k, BuiltinKind *out);
const char *kind_describe(const Param *p);    /* "a positive integer", ... */
bool is_reserved_name(const char *name, const char **what);
bool word_in(const char *const *words, const char *w);
int word_count(const char *const *words);
const char *words_list(Ddpc *c, const char *const *words, const char *conj); /* "a, b or c" */

/* ---------------------------------------------------------- resolve.c */

/* Declares every top-level item, resolves every name in every body, matches the
 * arguments of every call whose callee is known. */
void resolve_program(Ddpc *c);

/* The formal parameters of a callee, whatever it is: a builtin's table, or the
 * parameters of a block or model made into the same form (`input` left out). */
typedef struct Signature {
    const char *name;
    const char *what;       /* "layer", "block", "model", "loss", "strategy", ... */
    const Param *params;
    int nparams;
    Node *decl;             /* blocks and models */
    Node *input;            /* models: the `input: [...]` parameter, if any */
    Map index;              /* blocks and models: name -> Param */
} Signature;
/* A model's input shape, declared `input: [...]` and given `input = [...]` where the
 * model is trained; match_args puts that argument after the parameters' slots. */
extern const Param model_input;
Signature signature_of_builtin(const Builtin *b);
Signature *signature_of_decl(Ddpc *c, Node *decl);
/* Matches N_ARG (or N_SETTING) nodes against the signature. The result has one entry
 * per parameter: the argument's expression, NULL for a default, and for a variadic
 * parameter an N_LIST of the expressions. Reports every mismatch at its place. */
Node **match_args(Ddpc *c, const Signature *sig, NodeList *args, Loc at, bool settings);

/* ------------------------------------------------------------- eval.c */

enum { MAX_RANK = 8 };
typedef struct Shape {
    int rank;
    int64_t dim[MAX_RANK];
} Shape;

typedef enum {
    V_POISON,   /* an error was reported already: stay quiet */
    V_NONE,     /* an optional setting left out */
    V_NUM, V_BOOL, V_STR, V_WORD, V_LIST, V_DURATION,
    V_RUNTIME,  /* a number known at start-up only: rt */
    V_TENSOR,   /* a value of the model being expanded */
    V_LAYER,    /* a layer, block or model used as a value */
    V_OBJECT,   /* a loss, optimizer, schedule, metric, dataset, checkpoint, cluster */
} ValueKind;

typedef struct RtExpr RtExpr;

struct Value {
    ValueKind kind;
    double num;           /* V_NUM, V_DURATION, V_BOOL (0 or 1) */
    int unit;             /* V_DURATION */
    const char *str;      /* V_STR, V_WORD */
    Value *items;         /* V_LIST */
    int len;
    RtExpr *rt;           /* V_RUNTIME */
    GNode *tensor;        /* V_TENSOR */
    const Builtin *builtin; /* V_LAYER (a built-in layer), V_OBJECT */
    Node *decl;           /* V_LAYER (a block or model); V_OBJECT of a dataset definition */
    Value *args;          /* V_OBJECT: one per parameter, defaults filled in */
    Node **slots;         /* V_OBJECT: the arguments written (NULL where defaulted) */
    Loc loc;              /* where it was written */
};

/* A number known at start-up only, folded as far as constants allow. */
struct RtExpr {
    enum { RT_CONST, RT_SCALAR, RT_BINARY, RT_NEG } kind;
    double num;
    int scalar;
    Op op;
    RtExpr *a, *b;
};
const char *rt_text(Ddpc *c, const RtExpr *e);

/* Local bindings while expanding: name -> Value*, in nested scopes. */
typedef struct Env {
    Scopes scopes;
} Env;
void env_bind(Ddpc *c, Env *env, const char *name, Value v);
Value *env_lookup(Env *env, const char *name);

Value eval_expr(Ddpc *c, Env *env, Node *n);
/* Evaluates an argument and checks it against what the parameter expects. */
Value eval_arg(Ddpc *c, Env *env, Node *arg, const Param *p, const char *owner);
/* Checks an evaluated value against what the parameter expects; poison on mismatch. */
Value check_value(Ddpc *c, Value v, const Param *p, const char *owner, Loc loc);
/* The arguments of a call, defaults filled in, one per parameter. */
Value *eval_args(Ddpc *c, Env *env, const Signature *sig, Node **slots, const char *owner, Loc at);
Value param_default(Ddpc *c, const Param *p, Loc at);
/* An argument of a loss, optimizer, dataset, ... by name; V_NONE when it has none. */
Value object_arg(Value obj, const char *name);
/* An integer or a pair [a, b] (K_INT_PAIR's values) as two integers. */
void value_pair(Value v, int64_t out[2]);
bool is_integer(double v);
const char *value_describe(Ddpc *c, Value v); /* "the number 2.5", "a tensor [7, 7, 64]" */
const char *value_text(Ddpc *c, Value v);     /* "same", "[2, 2]", "0.001 * replicas" */
/* An object with every argument: "adam(learning_rate = 0.001, beta1 = 0.9, ...)". */
const char *object_text(Ddpc *c, Value v);
const char *shape_text(Ddpc *c, const Shape *s);
Value global_value(Ddpc *c, Node *decl);      /* a top-level let or dataset, evaluated once */

/* ------------------------------------------------------------ shape.c */

/* Layer attributes after checking, in explicit form for the later stages. */
typedef struct LayerAttrs {
    int64_t units;            /* dense units, conv filters, embedding's values a token */
    int64_t vocab;            /* embedding: the token indices it takes, 0 to vocab - 1 */
    int64_t kernel[2], stride[2], dilation[2];
    int64_t pad[4];           /* top, bottom, left, right */
    const char *padding;      /* "same", "valid" or NULL for explicit */
    const char *activation;   /* NULL: identity */
    int64_t init, bias_init;  /* ddp_init: an index of init_words */
    bool bias;
    double rate, momentum, epsilon;
    double slope;             /* the activation's number: leaky_relu's negative_slope, elu's alpha */
    int axis;                 /* softmax, concat: non-negative */
    int64_t heads, key_dim;   /* attention */
    bool causal;              /* attention: each token attends to itself and those before it */
    Shape target;             /* reshape */
} LayerAttrs;

typedef struct LayerCall {
    const Builtin *layer;
    Value *args;              /* one per parameter, defaults filled in */
    Node **arg_nodes;         /* the argument expressions, NULL for defaults */
    Shape *in;                /* input shapes: the current value, then tensor arguments */
    GNode **inputs;
    int nin;
    Loc loc;
    const char *name;         /* full name, for messages */
} LayerCall;

typedef struct LayerResult {
    Shape out;
    int64_t params, nontrainable, macs;
    LayerAttrs attrs;
} LayerResult;

bool shape_infer(Ddpc *c, LayerCall *call, LayerResult *res);
int64_t shape_count(const Shape *s);

/* ----------------------------------------------------------- expand.c */

struct GNode {
    int id;
    const char *name;         /* full path: model/label/... */
    const Builtin *layer;     /* NULL for the input */
    LayerOp op;
    GNode **inputs;
    int ninputs;
    Shape out;
    int64_t params, nontrainable, macs;
    LayerAttrs attrs;
    Loc loc;
    int uses;
};

struct Graph {
    const char *model;        /* the instance name */
    Node *decl;
    Shape input;
    VEC(GNode *) nodes;
    GNode *output;
    int64_t params, nontrainable, macs;
};

enum { MAX_EXPANSION_STEPS = 1000000, MAX_REPEAT = 100000, MAX_LAYERS = 100000, MAX_NESTING = 500 };

/* Expands a model on its own input shape. app: the N_APP naming it with arguments
 * (`train resnet50(classes = 10) on ...`), or NULL for its defaults. NULL when the
 * model cannot be expanded (errors reported). */
Graph *expand_model(Ddpc *c, Node *model, Node *app, Loc at);
/* The trained model into c->spec->graph, and every model that can stand on its own
 * (an input shape, a default for every parameter) into c->graphs. */
void expand_program(Ddpc *c);
/* Applies a layer, block or model (app) to the current value; used by `->`. */
Value expand_apply(Ddpc *c, Env *env, Value cur, Node *app);

/* ------------------------------------------------------- graph_print.c */

void graph_print(Ddpc *c, FILE *out, Graph *g);

/* ---------------------------------------------------------- settings.c */

/* The checked training job: the model's graph and every setting's value, defaults
 * filled in. Without a strategy block, strategy settings come from train itself. */
typedef struct TrainSpec {
    Node *node;
    Graph *graph;
    Value dataset;
    const Builtin *train_sig, *strategy_sig;
    Value *train, *strategy; /* one per parameter of train_sig, strategy_sig */
} TrainSpec;

Value spec_setting(const TrainSpec *spec, const char *name);

/* ------------------------------------------------------------- config.c */

/* The checked configuration as the contract's ddp_settings, codes for every choice;
 * what every later stage reads instead of the settings' values. */
const ddp_settings *config_build(Ddpc *c, const TrainSpec *spec);
/* The validation figure a metric names for save_best and early_stopping: 0 the loss
 * (always measured), 1 + i the i-th of metrics; -1 when metrics lacks it. */
int64_t config_watched_figure(Value metric, Value metrics);

/* ----------------------------------------------------------- settings.c */

/* The strategy's and train's settings evaluated (before the model is expanded). */
void settings_evaluate(Ddpc *c);
/* The settings against the expanded model; then c->config (config.c). */
void settings_check(Ddpc *c);
/* `ddpc emit --stage=settings`: the datasets, strategy and train settings in effect. */
void settings_print(Ddpc *c, FILE *out);

/* ---------------------------------------------------------------- ir.c */

/* The tensor-op IR: the trained model's layer graph lowered to buffers and the ops
 * on them, for a replica's batch of batch_per_replica samples. Every size that grows
 * with the batch is kept as (fixed, per_sample), since kernels run on the live batch,
 * which the last batch of an epoch (or a worker's share of it) may make smaller. */

/* DT_BF16: bfloat16 storage (precision = bf16), read and computed as f32; DT_U8: codes. */
typedef enum { DT_F32, DT_F64, DT_I32, DT_I64, DT_BF16, DT_U8 } DType;

typedef enum {
    T_INPUT,      /* the batch's samples */
    T_LABEL,      /* the batch's labels */
    T_SAMPLE_ID,  /* each sample's index in the dataset: the key of its random draws */
    T_PARAM,      /* a trainable parameter, in the flat parameter vector */
    T_GRAD,       /* its gradient, at the same place of the flat gradient vector */
    T_STAT,       /* a non-trainable value (running statistics), in the stats vector */
    T_ACT,        /* a value computed in the forward pass */
    T_DACT,       /* the gradient of an activation */
    T_WORK,       /* scratch: im2col columns, per-channel statistics */
    T_ACCUM,      /* loss and metric sums (f64) */
    T_STATE,      /* the optimizer's state vectors, whole */
    T_CONST,      /* values the runtime derives from the program (the parameters' decay groups) */
} TensorKind;

typedef struct Tensor Tensor;
struct Tensor {
    int id;
    const char *name;
    TensorKind kind;
    DType dtype;
    bool batched;        /* its first axis is the batch */
    Shape shape;         /* per sample when batched, else whole */
    int64_t per_sample;  /* elements per sample (batched) */
    int64_t elems;       /* elements for a full batch */
    Tensor *base;        /* a view (reshape, flatten) shares its base's storage */
    Tensor *grad;        /* autodiff: the gradient of this value */
    Tensor *one_hot_of;  /* an embedding's one-hot rows: of these indices (the model's input) */
    GNode *layer;        /* the layer it belongs to, if any */
    /* parameters and statistics */
    int64_t flat;        /* offset in its flat vector, in elements */
    const char *layout;  /* "HWIO", "IO", "C" */
    int64_t init;        /* ddp_init (an index of init_words); -1 for what is not a parameter */
    int64_t fan_in, fan_out;
    /* the memory plan */
    int first_use, last_use; /* positions in the train (or eval) schedule */
    int uses_mask;           /* 1: used in training, 2: in evaluation */
    int64_t offset;          /* bytes into the arena (or its region) */
    int slot;                /* index in the buffer table, -1 until used by an op */
    int region;              /* ddp_region */
    int consumers;           /* ops that read it (for fusion and gradient aliasing) */
    bool needs_grad;         /* autodiff: a parameter depends on it */
    bool written;            /* autodiff: a gradient already holds a contribution */
    bool stored;             /* autodiff: a forward op other than a pointwise one reads it,
                                so it is kept in memory whatever backward reads */
    bool scratch;            /* a library's scratch (a convolution's workspace): the plan
                                grows it into the room nothing else holds meanwhile */
    IrOp *producer;          /* the forward op that writes it */
};

/* Pointwise expressions: the bodies of elementwise kernels, a DAG per output. */
typedef enum {
    X_LOAD,      /* t[index], broadcast as bc */
    X_CONST,     /* num */
    X_SCALAR,    /* a run-time scalar (ddp_scalar_slot), as a number */
    X_NEG, X_ADD, X_SUB, X_MUL, X_DIV, X_MAX,
    X_EXP, X_LOG, X_TANH, X_SQRT,
    X_EXPM1,     /* exp(a) - 1, and log(1 + a): exact where a is small (elu, softplus) */
    X_LOG1P,
    X_NORMAL_CDF, /* Phi(a) = (1 + erf(a / sqrt 2)) / 2, the sum made in f64: exact in gelu's left tail */
    X_SIGMOID,   /* 1 / (1 + exp(-a)), whose derivative s (1 - s) stays finite where exp(-a) does not */
    X_GT,        /* a > b ? 1 : 0 */
    X_WHEN,      /* a != 0 ? b : 0, whatever b is there (a NaN too) */
    X_ONE_HOT,   /* 1 where a equals the index's remainder by channels (its column), else 0 */
} XKind;

typedef enum {
    BC_FULL,     /* t[i] */
    BC_CHANNEL,  /* t[i % channels]: a per-channel vector (bias, batchnorm) */
    BC_SAMPLE,   /* t[i / per_sample]: one value per sample */
    BC_SCALAR,   /* t[0] */
    BC_ROW,      /* t[i / channels]: one value per row of channels (a token's index) */
} Bcast;

typedef struct XExpr XExpr;
struct XExpr {
    XKind kind;
    Tensor *t;           /* X_LOAD */
    Bcast bc;
    int64_t channels;    /* BC_CHANNEL, BC_ROW, X_ONE_HOT */
    double num;          /* X_CONST */
    int scalar;          /* X_SCALAR */
    XExpr *a, *b;
};

typedef enum {
    OP_GEMM,          /* out = op(in0) op(in1) (+ out) */
    OP_POINTWISE,     /* out[k][i] = expr[k](i) */
    OP_DROPOUT_MASK,  /* -> out u8: 1 where dropout keeps the element, else 0 (rate, key); an index
                         per DROPOUT_DRAW elements of a sample, one Philox draw for them */
    OP_IM2COL,        /* in0 [n, h, w, c] -> out [n * oh * ow, kh * kw * c] */
    OP_COL2IM,        /* the adjoint: columns added back into an image */
    OP_CONV,          /* a library convolution (code: ddp_conv_mode); in x|dy, filters (KRSC)|dy; out y|dx|dfilters, workspace */
    OP_FILTERS_TO_KRSC, /* HWIO filters -> KRSC, the layout of a library convolution */
    OP_FILTERS_TO_HWIO, /* KRSC filter gradients -> HWIO (+ out) */
    OP_MAXPOOL, OP_MAXPOOL_BWD, OP_AVGPOOL, OP_AVGPOOL_BWD,
    OP_GAP, OP_GAP_BWD,             /* global average pool and its adjoint */
    OP_DEPTHWISE,     /* in x [n, h, w, c], filters [kh, kw, c, m] -> out [n, oh, ow, c m]: each channel
                         convolved with its own m filters (channels: m) */
    OP_DEPTHWISE_DATA,   /* in dy, filters -> out dx */
    OP_DEPTHWISE_FILTER, /* in x, dy -> out the filters' gradient: a sum over every output pixel */
    OP_BN_STATS,      /* in0 [rows, c] -> out mean, var [c]: the batch's per channel; out running
                         mean, var [c]: moved towards them */
    OP_SOFTMAX, OP_SOFTMAX_BWD,
    OP_LAYERNORM,     /* in0 [rows, len] -> out: each row less its mean, over its standard deviation */
    OP_LAYERNORM_BWD, /* in0 x, in1 the normalised rows' gradient -> out x's */
    OP_REDUCE_ROWS,   /* in0 [rows, c] -> out [c]: column sums (bias gradients) */
    OP_ROW_PARTIALS,  /* the first stage of a REDUCE_ROWS or BN_STATS (code): out [sums, chunks, c], each
                         chunk of chunk_rows rows summed apart; the op it feeds adds up the chunks */
    OP_CONCAT, OP_SPLIT,
    OP_LOSS,          /* output, labels -> each sample's loss, and the output's gradient */
    OP_METRIC,        /* output, labels -> each sample's value of the metric */
    OP_ACCUMULATE,    /* per-sample values -> (sum, count) pairs of the accumulators */
    OP_FILL,          /* out = 0 */
    OP_FIND_NONFINITE, /* grads -> out [chunks]: each chunk's first NaN or infinity, + 1 (0: none) */
    OP_NONFINITE_FLAG, /* chunks, accumulators -> the step's non-finite flag (ir->nonfinite) */
    OP_GRAD_SQUARES,  /* grads -> out [chunks]: each chunk's sum of squares, in f64 */
    OP_TRUST_RATIO,   /* lars: params, grads, spans -> out [parameters]: each one's step scale, in f64 */
    OP_CLIP_FACTOR,   /* chunks -> ir->clip: the gradients' scale, min(1, clip_norm / (norm + 1e-6)) */
    OP_OPTIMIZER,     /* params, grads, state -> updated, over a range of the flat vector */
    OP_BUCKET_READY,  /* marker: a gradient bucket is final */
    OP_WAIT_BUCKETS,  /* marker: all-reduce of every bucket is done */
    OP_METRICS_READY, /* marker: this batch's sums are final */
} OpKind;

typedef enum { PH_FORWARD, PH_BACKWARD, PH_OPTIMIZER, PH_EVAL, PH_COUNT } Phase;

typedef struct IrDim {
    int64_t fixed, per_sample;
} IrDim;

struct IrOp {
    int id;
    OpKind kind;
    Phase phase;
    Tensor *in[8];
    int nin;
    Tensor *out[4];
    int nout;
    bool accumulate;          /* add into out[0] instead of overwriting it */
    int path;                 /* ddp_path: a convolution's generated ops, or its library call's */
    GNode *layer;
    XExpr *expr[4];           /* OP_POINTWISE: one per output */
    IrDim range;              /* the kernel's index range */
    /* OP_GEMM: out = alpha op(in0) op(in1), or batches x groups such products (attention:
     * a batch a sample, a group a head), product (i, j) of each operand from element
     * i batch_stride + j group_stride */
    bool ta, tb;
    IrDim m, n, k;
    double alpha;             /* 1 (ir_op_new) */
    IrDim batches;            /* 1 (ir_op_new) */
    int64_t groups;           /* 1 (ir_op_new) */
    int64_t ld[3], batch_stride[3], group_stride[3]; /* in0, in1, out; ld 0: packed */
    /* windows, axes, kinds */
    int64_t kernel[2], stride[2], dilation[2], pad[4];
    int64_t rows_per_sample, channels, axis_outer, axis_len, axis_inner;
    int64_t chunk_rows;       /* a sum over rows in two stages (OP_ROW_PARTIALS): rows per chunk; 0: one */
    int64_t concat_offset, concat_width; /* OP_CONCAT/OP_SPLIT: this input's columns */
    double momentum, epsilon;
    bool causal;              /* OP_SOFTMAX: element j of row r left out past r % axis_len (inner 1) */
    double rate;              /* OP_DROPOUT_MASK: the share of elements dropped, */
    int64_t key;              /* ... and the layer's key in the random stream */
    int64_t code;             /* OP_LOSS, OP_METRIC, OP_OPTIMIZER: which, as the contract's code */
    const char *what;         /* ... and its name, for the printed stages */
    bool from_logits;
    double smoothing;
    int64_t k_top;            /* top_k_accuracy */
    int64_t bucket;           /* OP_BUCKET_READY */
    int64_t begin, end;       /* OP_OPTIMIZER: the range of the flat vectors */
    int pair[8];              /* OP_ACCUMULATE: the accumulator pair of each input */
    int kernel_index;         /* after codegen: the kernel that runs it */
};

enum { DROPOUT_DRAW = 4 };     /* elements of a dropout mask per Philox draw: its four words */
enum { NONFINITE_CHUNK = 4096 }; /* gradient elements per index of OP_FIND_NONFINITE and OP_GRAD_SQUARES */

typedef struct Bucket {
    int64_t begin, end;       /* elements of the flat gradient vector */
} Bucket;

typedef VEC(Tensor *) TensorList;
typedef VEC(IrOp *) OpList;

typedef struct Ir {
    Graph *graph;
    const ddp_settings *config; /* the program's configuration (config.c) */
    DType dtype;
    int64_t batch;            /* batch_per_replica */
    TensorList tensors;
    OpList ops[PH_COUNT];
    Tensor *input, *label, *sample_id, *output;
    Tensor *eval_output;        /* the model's output in evaluation: kept to the phase's end */
    Tensor *accum;            /* [2 * (1 + metrics)]: loss (sum, count), then each metric */
    int64_t loss_rows;        /* rows of classes a categorical loss takes apart in a sample's output, else 1 */
    /* [1] f64, beside the accumulators: 0 while every summed gradient and the loss are
     * finite; else 1 + the index of the first gradient element that is not, or 1 +
     * param_count for the loss. Once set it stays set, and the optimizer skips. */
    Tensor *nonfinite;
    Tensor *clip;             /* [1] f64 with clip_norm: the scale the optimizer gives the gradients; else NULL */
    TensorList params;        /* in the order of the flat vector */
    TensorList stats;
    int64_t param_count, stats_count;
    int state_vectors;        /* optimizer state: flat vectors of param_count each */
    VEC(Bucket) buckets;
    int64_t bucket_bytes;
    int64_t grads_bytes;      /* the GRADS region: the gradients, and their bf16 copy (allreduce_precision) */
    Tensor *all_params, *all_grads, *states[3]; /* the flat vectors, for the optimizer */
    Tensor *decay_groups;     /* each parameter element's ddp_decay_group, where the groups' decays differ */
    Tensor *parameter_numbers, *parameter_spans, *trust; /* lars: each element's parameter, each parameter's
                                                            (first, count), its step's scale (f64) */
    /* the memory plan */
    int64_t arena_bytes, workspace_bytes;                 /* peaks, planned */
    int64_t no_reuse_arena_bytes, no_reuse_workspace_bytes; /* each tensor apart */
    int64_t input_bytes, accum_bytes;
    bool no_reuse;            /* place every tensor apart (the poison test's reference) */
    bool no_barriers;         /* GPU kernels without their barriers (the emulated device's test) */
    TensorList slots;         /* the buffer table: storage tensors in slot order */
    OpList kernel_ops;        /* one op per generated kernel (cg_assign_kernels) */
    struct Lower *lowering;   /* ir.c's state between its two steps */
} Ir;

/* Lowers the trained model in two steps around autodiff (pipeline.c runs them): its
 * forward pass, loss and metrics; then, once backward is there, the optimizer's step
 * and the evaluation pass. */
Ir *ir_lower(Ddpc *c, Graph *g, const ddp_settings *config, DType dtype, int64_t bucket_bytes, bool no_reuse);
void ir_lower_update(Ddpc *c, Ir *ir);
Tensor *ir_tensor(Ddpc *c, Ir *ir, const char *name, TensorKind kind, DType dt, bool batched,
                  const Shape *shape);
IrOp *ir_op(Ddpc *c, Ir *ir, Phase phase, OpKind kind);   /* appended to its phase */
IrOp *ir_op_new(Ddpc *c, Phase phase, OpKind kind);        /* in no phase yet */
/* A library convolution's pieces (its path DDP_PATH_LIBRARY): the filters w (HWIO)
 * turned KRSC into a work tensor, and the scratch a convolution of `layer` may use. */
Tensor *ir_filters_krsc(Ddpc *c, Ir *ir, Phase phase, Tensor *w, GNode *layer);
Tensor *ir_conv_workspace(Ddpc *c, Ir *ir, GNode *layer, const char *what);
/* A window op's windows tile its [h, w] input, every pixel in exactly one window: as
 * wide as their stride, no padding, oh x ow of them covering it. */
bool ir_windows_tile(const IrOp *op, int64_t h, int64_t w, int64_t oh, int64_t ow);
/* The tensor whose memory t uses: itself, or the one a view (reshape, flatten) shares. */
Tensor *tensor_storage(Tensor *t);
XExpr *x_load(Ddpc *c, Tensor *t, Bcast bc);
XExpr *x_const(Ddpc *c, double v);
XExpr *x_scalar(Ddpc *c, int slot);
XExpr *x_unary(Ddpc *c, XKind k, XExpr *a);
XExpr *x_binary(Ddpc *c, XKind k, XExpr *a, XExpr *b);
/* e with every load that replace maps to an expression (non-NULL) replaced by it; the
 * nodes above a replacement are copied, the rest shared. */
XExpr *x_rewrite_loads(Ddpc *c, XExpr *e, XExpr *(*replace)(XExpr *load, void *arg), void *arg);
/* The nodes of e counted as a tree (a node shared twice counts twice): what computing
 * it again would cost. */
int x_size(const XExpr *e);
int64_t dtype_size(DType dt);
int decay_group(const Tensor *t);
int64_t constant_bytes(const Ir *ir);
const char *constants_label(const Ir *ir);
const char *gradient_extras(const Ir *ir);
const char *dtype_name(DType dt);
const char *op_kind_name(OpKind k);

/* ---------------------------------------------------------- autodiff.c */

void autodiff(Ddpc *c, Ir *ir);

/* -------------------------------------------------------------- fuse.c */

void fuse(Ddpc *c, Ir *ir);
/* precision = bf16 (precision.c): which tensors are stored in bfloat16, and the bf16
 * copies a product makes of its f32 operands. Runs between autodiff and fusion. */
void mixed_precision(Ddpc *c, Ir *ir);

/* -------------------------------------------------------------- plan.c */

/* Lays out the flat vectors, cuts the gradient into buckets, places every activation,
 * gradient and workspace in the arena by liveness (or each apart with no_reuse). */
void plan(Ddpc *c, Ir *ir);

/* ---------------------------------------------------------- ir_print.c */

void ir_print(Ddpc *c, FILE *out, Ir *ir);
void plan_print(Ddpc *c, FILE *out, Ir *ir);

/* ------------------------------------------------------------- build.c */

typedef struct BuildOptions {
    const char *output;
    int opt_level;
    bool stats, object_only;
} BuildOptions;

/* Generates, compiles and links the program; prints --stats. Returns the exit status. */
int build_program(Ddpc *c, Ir *ir, const BuildOptions *o, const char *source);
/* --stage=llvm (the CPU module, unoptimised) or --stage=ptx (the GPU module). */
bool build_emit_code(Ddpc *c, Ir *ir, bool ptx, int opt, FILE *out);

/* ----------------------------------------------------------- pipeline.c */

/* One compilation: its arena, diagnostics, files and what each pass found. */
struct Ddpc {
    Arena *arena;
    Diag diag;
    const char **include_dirs;
    int ninclude_dirs;
    const char *stdlib_dir;
    bool no_imports;          /* read std/ imports only (the fuzzer) */
    VEC(SourceFile *) files;
    NodeList items;           /* every top-level item of every file, imports first */
    NodeList main_items;      /* the items of the file being checked */
    SourceFile *main_file;
    bool syntax_errors;       /* later passes would be fooled by the lost lines: skipped */
    bool import_failed;       /* names from it would be unknown: stop after parsing */
    Value *strategy_values;   /* the strategy block's settings, when there is one */
    Map globals;              /* name -> declaring item */
    Map misplaced;            /* settings written in the other block */
    Node *strategy, *train;
    TrainSpec *spec;
    const ddp_settings *config; /* the trained program's configuration (config.c), once checked */
    VEC(Graph *) graphs;      /* every model expanded, the trained one first */
    const char *only_model;   /* --model */
    int expansion_steps;
    int nesting;              /* blocks within blocks, definitions within definitions */
    bool too_deep_reported;
    struct Expander *expander; /* expand.c's state while a model is expanded */
    VEC(const char *) defines; /* -D setting=value, applied after parsing */
};

Ddpc *ddpc_new(void);
void ddpc_free(Ddpc *c);

/* How far pipeline_run goes: the checked program (and c->config), the planned IR, or
 * the linked executable. */
typedef enum { UPTO_CHECK, UPTO_PLAN, UPTO_LINK } Upto;
typedef struct Pipeline {
    const char *path;          /* the program's file, or its name when source is given */
    const char *source;        /* NULL: read path */
    size_t source_len;
    Upto upto;
    DType dtype;               /* the rest: UPTO_PLAN and UPTO_LINK */
    int64_t bucket_bytes;
    bool no_reuse;
    bool no_barriers;
    const BuildOptions *build; /* UPTO_LINK */
} Pipeline;
/* Runs the compiler's passes in order up to p->upto (the list is in pipeline.c); true
 * when none reported an error. *ir, if asked for, is the planned IR. */
bool pipeline_run(Ddpc *c, const Pipeline *p, Ir **ir);

#endif
