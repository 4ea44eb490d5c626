/* cudnn.c: convolutions through cuDNN 9's backend graph API, the library loaded when
 * a GPU run asks for it (a program starts without it; a machine without it falls back
 * to the program's own kernels). The few types and values used are cuDNN's own, copied
 * from cudnn_graph.h of cuDNN 9 (the stand-in tests/gpu/fake_cudnn.c is built on that
 * header, so a value copied wrong fails unit/cudnn).
 *
 * A plan is one convolution's operation graph and the first engine configuration
 * that suits a training run: deterministic (the same bits every step and on every
 * worker), f32 products kept in f32 unless precision = tf32 (an engine noted as using
 * tensor cores reads f32 factors as TF32), inputs never converted down, sums never
 * formed in less than f32, a plan that finalizes, and a workspace within what the
 * caller has. Under precision = bf16 the tensors are bf16 and the compute type f32:
 * tensor cores are what such a convolution is for, and their sums are f32. Also here: the search for
 * CUDA's libraries in the places cuBLAS is searched, for every library loaded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <glob.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conv.h"
#include "runtime.h"

/* cudnn_graph.h (cuDNN 9) */
enum { CUDNN_NEEDED = 90000, CUDNN_SUCCESS = 0 };
enum { DATA_FLOAT = 0, DATA_DOUBLE = 1, DATA_BFLOAT16 = 9, CROSS_CORRELATION = 1, HEUR_MODE_A = 3 };
enum { NOTE_TENSOR_CORE = 0, NOTE_DOWN_CONVERT_INPUTS = 1, NOTE_REDUCED_PRECISION_REDUCTION = 2,
       NOTE_NONDETERMINISTIC = 4, NOTE_TYPE_COUNT = 10, KNOB_TYPE_COUNTS = 44 };
enum { /* cudnnBackendDescriptorType_t */
    DESC_CONVOLUTION = 1, DESC_ENGINE = 2, DESC_ENGINECFG = 3, DESC_ENGINEHEUR = 4, DESC_EXECUTION_PLAN = 5,
    DESC_KNOB_CHOICE = 7, DESC_OPERATION_GRAPH = 15, DESC_VARIANT_PACK = 16, DESC_TENSOR = 17,
};
enum { /* cudnnBackendAttributeType_t */
    TYPE_HANDLE = 0, TYPE_DATA_TYPE = 1, TYPE_INT64 = 3, TYPE_FLOAT = 4, TYPE_DOUBLE = 5, TYPE_VOID_PTR = 6,
    TYPE_CONVOLUTION_MODE = 7, TYPE_HEUR_MODE = 8, TYPE_KNOB_TYPE = 9, TYPE_NUMERICAL_NOTE = 11,
    TYPE_BACKEND_DESCRIPTOR = 15,
};
enum { /* cudnnBackendAttributeName_t */
    CONVOLUTION_COMP_TYPE = 100, CONVOLUTION_CONV_MODE = 101, CONVOLUTION_DILATIONS = 102,
    CONVOLUTION_FILTER_STRIDES = 103, CONVOLUTION_POST_PADDINGS = 104, CONVOLUTION_PRE_PADDINGS = 105,
    CONVOLUTION_SPATIAL_DIMS = 106,
    ENGINEHEUR_MODE = 200, ENGINEHEUR_OPERATION_GRAPH = 201, ENGINEHEUR_RESULTS = 202,
    ENGINECFG_ENGINE = 300, ENGINECFG_KNOB_CHOICES = 302,
    EXECUTION_PLAN_HANDLE = 400, EXECUTION_PLAN_ENGINE_CONFIG = 401, EXECUTION_PLAN_WORKSPACE_SIZE = 402,
    KNOB_CHOICE_KNOB_TYPE = 600, KNOB_CHOICE_KNOB_VALUE = 601,
    OPERATIONGRAPH_HANDLE = 800, OPERATIONGRAPH_OPS = 801, OPERATIONGRAPH_ENGINE_GLOBAL_COUNT = 802,
    TENSOR_BYTE_ALIGNMENT = 900, TENSOR_DATA_TYPE = 901, TENSOR_DIMENSIONS = 902, TENSOR_STRIDES = 903,
    TENSOR_UNIQUE_ID = 906,
    VARIANT_PACK_UNIQUE_IDS = 1000, VARIANT_PACK_DATA_POINTERS = 1001, VARIANT_PACK_WORKSPACE = 1003,
    ENGINE_OPERATION_GRAPH = 1300, ENGINE_GLOBAL_INDEX = 1301, ENGINE_NUMERICAL_NOTE = 1303,
};

/* One operation descriptor per mode, each with its own attribute names. */
typedef struct OperationKind {
    int descriptor;
    int alpha, beta, conv, w, x, y; /* the backward modes' x, y are dx, dy; the filter's w is dw */
    const char *name;
} OperationKind;

static const OperationKind operation_kinds[] = {
    [DDP_CONV_FORWARD] = {10, 700, 701, 702, 703, 704, 705, "forward"},
    [DDP_CONV_BACKWARD_DATA] = {12, 706, 707, 708, 709, 710, 711, "backward data"},
    [DDP_CONV_BACKWARD_FILTER] = {11, 712, 713, 714, 715, 716, 717, "backward filter"},
};

/* The tensors' unique ids in every graph, and their order in a variant pack. */
enum { UID_X = 1, UID_FILTERS = 2, UID_Y = 3 };

/* cuDNN's entry points this file uses. */
#define CUDNN_CALLS(X)                                                                                       \
    X(size_t, cudnnGetVersion, (void))                                                                       \
    X(const char *, cudnnGetErrorString, (int))                                                              \
    X(int, cudnnCreate, (void **))                                                                           \
    X(int, cudnnDestroy, (void *))                                                                           \
    X(int, cudnnSetStream, (void *, void *))                                                                 \
    X(int, cudnnBackendCreateDescriptor, (int, void **))                                                     \
    X(int, cudnnBackendDestroyDescriptor, (void *))                                                          \
    X(int, cudnnBackendFinalize, (void *))                                                                   \
    X(int, cudnnBackendSetAttribute, (void *, int, int, int64_t, const void *))                              \
    X(int, cudnnBackendGetAttribute, (void *, int, int, int64_t, int64_t *, void *))                         \
    X(int, cudnnBackendExecute, (void *, void *, void *))

#define DECLARE(result, name, args) result(*name) args;
static struct {
    CUDNN_CALLS(DECLARE)
    void (*last_error)(char *, size_t); /* cudnnGetLastErrorString, where the library has it */
    void *library;
    char loaded[1200];                  /* "PATH (cuDNN 9.1.0)" */
} dnn;
#undef DECLARE

struct ddp_cudnn {
    void *handle;
};

enum { PLAN_DESCRIPTORS = 12 };

struct ddp_cudnn_plan {
    void *plan;
    void *descriptors[PLAN_DESCRIPTORS]; /* what the plan refers to, destroyed with it */
    int ndescriptors;
    size_t workspace;
    int64_t alignment[3];               /* x, filters, y: what the plan assumed of the pointers */
    ddp_device_conv shape;
    char name[192];
};

/* ------------------------------------------------------- finding CUDA's libraries */

typedef struct Search {
    const char *name, *wheel;
    char *path, *tried;
    size_t path_len, tried_len;
    void *library;
} Search;

static bool already_tried(const Search *s, const char *place) {
    size_t n = strlen(place);
    for (const char *at = s->tried; *at; at += strcspn(at, ",") + (at[strcspn(at, ",")] ? 2 : 0))
        if (strncmp(at, place, n) == 0 && (at[n] == ',' || at[n] == 0))
            return true;
    return false;
}

static void note_tried(Search *s, const char *place) {
    size_t used = strlen(s->tried);
    if (!already_tried(s, place) && used + 1 < s->tried_len)
        snprintf(s->tried + used, s->tried_len - used, "%s%s", used ? ", " : "", place);
}

static bool try_folder(Search *s, const char *folder) {
    char file[1024];
    if (s->library || !*folder || snprintf(file, sizeof file, "%s/%s", folder, s->name) >= (int)sizeof file)
        return s->library != NULL;
    note_tried(s, folder);
    if ((s->library = dlopen(file, RTLD_NOW | RTLD_LOCAL)))
        snprintf(s->path, s->path_len, "%s", file);
    return s->library != NULL;
}

/* Each folder of a colon-separated list. */
static bool try_folders(Search *s, const char *list) {
    for (const char *at = list; at && *at && !s->library; at += strcspn(at, ":") + (at[strcspn(at, ":")] != 0)) {
        char folder[1024];
        snprintf(folder, sizeof folder, "%.*s", (int)strcspn(at, ":"), at);
        try_folder(s, folder);
    }
    return s->library != NULL;
}

/* The library's Python wheel below a prefix: lib/python3.X/{site,dist}-packages/nvidia/WHEEL/lib. */
static bool try_wheels(Search *s, const char *prefix) {
    char pattern[1024];
    glob_t found;
    if (s->library || !prefix || !*prefix)
        return s->library != NULL;
    snprintf(pattern, sizeof pattern, "%s/lib/python3*/*-packages/nvidia/%s/lib", prefix, s->wheel);
    if (glob(pattern, 0, NULL, &found) != 0)
        return false;
    for (size_t i = 0; i < found.gl_pathc; i++)
        try_folder(s, found.gl_pathv[i]);
    globfree(&found);
    return s->library != NULL;
}

/* The Python environments whose bin folder is on PATH. */
static bool try_environments_on_path(Search *s) {
    const char *path = getenv("PATH");
    for (const char *at = path; at && *at && !s->library; at += strcspn(at, ":") + (at[strcspn(at, ":")] != 0)) {
        size_t n = strcspn(at, ":");
        char prefix[1024];
        if (n > 4 && n < sizeof prefix && strncmp(at + n - 4, "/bin", 4) == 0) {
            snprintf(prefix, sizeof prefix, "%.*s", (int)(n - 4), at);
            try_wheels(s, prefix);
        }
    }
    return s->library != NULL;
}

static bool try_cuda_homes(Search *s) {
    const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    const char *below[] = {"lib64", "targets/x86_64-linux/lib"};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2 && homes[i] && *homes[i]; j++) {
            char folder[1024];
            snprintf(folder, sizeof folder, "%s/%s", homes[i], below[j]);
            if (try_folder(s, folder))
                return true;
        }
    return false;
}

void *ddp_cuda_library_open(const char *name, const char *wheel, char *path, size_t path_len, char *tried,
                            size_t tried_len) {
    Search s = {name, wheel, path, tried, path_len, tried_len, NULL};
    const char *only = getenv("DDP_CUDA_LIBRARY_PATH");
    if (only)
        return try_folders(&s, only) ? s.library : NULL;
    if (try_cuda_homes(&s) || try_folders(&s, getenv("LD_LIBRARY_PATH")) || try_wheels(&s, getenv("VIRTUAL_ENV")) ||
        try_wheels(&s, getenv("CONDA_PREFIX")) || try_wheels(&s, "/usr/local") || try_wheels(&s, "/usr") ||
        try_environments_on_path(&s))
        return s.library;
    /* last, the loader's own search: its cache, and the program's RUNPATH */
    note_tried(&s, "the loader's search");
    if ((s.library = dlopen(name, RTLD_NOW | RTLD_LOCAL)))
        snprintf(path, path_len, "%s", name);
    return s.library;
}

/* ---------------------------------------------------------------- the library */

/* cuDNN 9 numbers its versions MAJOR * 10000 + MINOR * 100 + PATCH, cuDNN 8 and older
 * MAJOR * 1000 + MINOR * 100 + PATCH. */
static void version_text(size_t v, char *text, size_t len) {
    size_t major_unit = v >= 90000 ? 10000 : 1000;
    snprintf(text, len, "%zu.%zu.%zu", v / major_unit, v % major_unit / 100, v % 100);
}

void *ddp_cuda_library_chosen(const char *chosen, const char *what, const char *name, const char *wheel, char *path,
                              size_t path_len, char *tried, size_t tried_len, char *err, size_t len) {
    const char *file = getenv(chosen);
    void *library;
    err[0] = 0;
    if (file && *file) {
        if (!(library = dlopen(file, RTLD_NOW | RTLD_LOCAL)))
            ddp_fail(err, len, "%s, %s=%s, cannot be loaded: %s", what, chosen, file, dlerror());
        snprintf(path, path_len, "%s", file);
        return library;
    }
    return ddp_cuda_library_open(name, wheel, path, path_len, tried, tried_len);
}

static void *open_cudnn_file(char *path, size_t path_len, char *err, size_t len) {
    char tried[2048] = "";
    void *library = ddp_cuda_library_chosen("DDP_CUDNN_LIBRARY", "cuDNN", "libcudnn.so.9", "cudnn", path, path_len,
                                            tried, sizeof tried, err, len);
    if (!library && !err[0])
        ddp_fail(err, len, "cuDNN 9 (libcudnn.so.9) not found; searched: %.1500s. Install cuDNN 9, or `pip install "
                           "nvidia-cudnn-cu12`, or name its folder in DDP_CUDA_LIBRARY_PATH", tried);
    return library;
}

static bool open_cudnn(char *err, size_t len) {
    if (dnn.library)
        return true;
    char path[1024], version[32];
    void *library = open_cudnn_file(path, sizeof path, err, len);
    if (!library)
        return false;
#define RESOLVE(result, name, args)                                                                          \
    if (!(*(void **)&dnn.name = dlsym(library, #name))) {                                                    \
        dlclose(library);                                                                                    \
        return ddp_fail(err, len, "%s is not cuDNN 9: it lacks %s", path, #name);                            \
    }
    CUDNN_CALLS(RESOLVE)
#undef RESOLVE
    *(void **)&dnn.last_error = dlsym(library, "cudnnGetLastErrorString");
    size_t v = dnn.cudnnGetVersion();
    version_text(v, version, sizeof version);
    if (v < CUDNN_NEEDED) {
        dlclose(library);
        return ddp_fail(err, len, "%s is cuDNN %s, and the backend graph API the runtime uses needs cuDNN 9.0 or "
                                  "newer", path, version);
    }
    snprintf(dnn.loaded, sizeof dnn.loaded, "%s (cuDNN %s)", path, version);
    dnn.library = library;
    return true;
}

const char *ddp_cudnn_library(void) {
    return dnn.loaded;
}

/* "CUDNN_STATUS_BAD_PARAM (2000): cuDNN's last message" */
static void describe(int status, char *text, size_t len) {
    const char *name = dnn.cudnnGetErrorString(status);
    char last[768] = "";
    if (dnn.last_error)
        dnn.last_error(last, sizeof last);
    snprintf(text, len, "%s (%d)%s%s", name ? name : "status", status, last[0] ? ": " : "", last);
}

static bool fail_status(int status, char *err, size_t len, const char *what) {
    char text[1024];
    describe(status, text, sizeof text);
    return ddp_fail(err, len, "cuDNN, %s: %s", what, text);
}

/* Loaded once, whichever thread asks first. */
static bool load_cudnn(char *err, size_t len) {
    static pthread_mutex_t loading = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&loading);
    bool ok = open_cudnn(err, len);
    pthread_mutex_unlock(&loading);
    return ok;
}

ddp_cudnn *ddp_cudnn_open(void *cuda_stream, char *err, size_t len) {
    if (!load_cudnn(err, len))
        return NULL;
    ddp_cudnn *h = calloc(1, sizeof *h);
    if (!h) {
        ddp_fail(err, len, "out of memory");
        return NULL;
    }
    int status = dnn.cudnnCreate(&h->handle);
    if (status != CUDNN_SUCCESS || (status = dnn.cudnnSetStream(h->handle, cuda_stream)) != CUDNN_SUCCESS) {
        fail_status(status, err, len, h->handle ? "binding its handle to the stream" : "creating its handle");
        ddp_cudnn_close(h);
        return NULL;
    }
    return h;
}

void ddp_cudnn_close(ddp_cudnn *h) {
    if (!h)
        return;
    if (h->handle)
        dnn.cudnnDestroy(h->handle);
    free(h);
}

/* --------------------------------------------------------------- descriptors */

/* Descriptors made one after another, the first failure kept and the later steps
 * skipped, every descriptor held until the maker keeps or drops them. */
typedef struct Maker {
    void *made[PLAN_DESCRIPTORS];
    int nmade;
    bool failed;
    char *err;
    size_t len;
} Maker;

static void *create(Maker *m, int type, const char *what) {
    void *d = NULL;
    int status;
    if (m->failed)
        return NULL;
    if (m->nmade == PLAN_DESCRIPTORS)
        m->failed = !ddp_fail(m->err, m->len, "cuDNN: more descriptors than a plan holds, at %s", what);
    else if ((status = dnn.cudnnBackendCreateDescriptor(type, &d)) != CUDNN_SUCCESS)
        m->failed = !fail_status(status, m->err, m->len, what);
    else
        m->made[m->nmade++] = d;
    return d;
}

static void set(Maker *m, void *d, int attribute, int type, int64_t count, const void *values, const char *what) {
    int status;
    if (!m->failed && (status = dnn.cudnnBackendSetAttribute(d, attribute, type, count, values)) != CUDNN_SUCCESS) {
        char where[160];
        snprintf(where, sizeof where, "%s, attribute %d", what, attribute);
        m->failed = !fail_status(status, m->err, m->len, where);
    }
}

static void finalize(Maker *m, void *d, const char *what) {
    int status;
    if (!m->failed && (status = dnn.cudnnBackendFinalize(d)) != CUDNN_SUCCESS)
        m->failed = !fail_status(status, m->err, m->len, what);
}

static void drop_all(Maker *m) {
    for (int i = 0; i < m->nmade; i++)
        dnn.cudnnBackendDestroyDescriptor(m->made[i]);
    m->nmade = 0;
}

/* The tensors' type, and the type the products are summed in: f32 for bf16 data. */
static int data_type(const ddp_device_conv *c) {
    return c->f64 ? DATA_DOUBLE : c->bf16 ? DATA_BFLOAT16 : DATA_FLOAT;
}

static int compute_type(const ddp_device_conv *c) {
    return c->f64 ? DATA_DOUBLE : DATA_FLOAT;
}

/* "f64", "bf16", "f32": the tensors' type in messages. */
static const char *type_name(const ddp_device_conv *c) {
    return c->f64 ? "f64" : c->bf16 ? "bf16" : "f32";
}

/* The largest power of two, up to 16, that divides the address: what cuDNN may
 * assume of a tensor's pointer. */
static int64_t alignment_of(ddp_dptr p) {
    int64_t a = 16;
    while (a > 1 && p % (ddp_dptr)a != 0)
        a /= 2;
    return a;
}

/* A channels-last 4-d tensor as cuDNN describes it: dims in NCHW order {n, c, h, w}
 * (filters {k, c, r, s}), strides those of NHWC (KRSC). */
static void *tensor(Maker *m, const ddp_device_conv *c, int64_t uid, const int64_t nchw[4], int64_t alignment,
                    const char *what) {
    int64_t ch = nchw[1], h = nchw[2], w = nchw[3];
    int64_t strides[4] = {h * w * ch, 1, w * ch, ch};
    int type = data_type(c);
    void *t = create(m, DESC_TENSOR, what);
    set(m, t, TENSOR_DATA_TYPE, TYPE_DATA_TYPE, 1, &type, what);
    set(m, t, TENSOR_DIMENSIONS, TYPE_INT64, 4, nchw, what);
    set(m, t, TENSOR_STRIDES, TYPE_INT64, 4, strides, what);
    set(m, t, TENSOR_UNIQUE_ID, TYPE_INT64, 1, &uid, what);
    set(m, t, TENSOR_BYTE_ALIGNMENT, TYPE_INT64, 1, &alignment, what);
    finalize(m, t, what);
    return t;
}

static void *convolution(Maker *m, const ddp_device_conv *c) {
    const char *what = "the convolution descriptor";
    int64_t spatial = 2, dilations[2] = {c->dilation[0], c->dilation[1]}, strides[2] = {c->stride[0], c->stride[1]};
    int64_t before[2] = {c->pad_before[0], c->pad_before[1]}, after[2] = {c->pad_after[0], c->pad_after[1]};
    int type = compute_type(c), mode = CROSS_CORRELATION;
    void *d = create(m, DESC_CONVOLUTION, what);
    set(m, d, CONVOLUTION_COMP_TYPE, TYPE_DATA_TYPE, 1, &type, what);
    set(m, d, CONVOLUTION_CONV_MODE, TYPE_CONVOLUTION_MODE, 1, &mode, what);
    set(m, d, CONVOLUTION_SPATIAL_DIMS, TYPE_INT64, 1, &spatial, what);
    set(m, d, CONVOLUTION_DILATIONS, TYPE_INT64, 2, dilations, what);
    set(m, d, CONVOLUTION_FILTER_STRIDES, TYPE_INT64, 2, strides, what);
    set(m, d, CONVOLUTION_PRE_PADDINGS, TYPE_INT64, 2, before, what);
    set(m, d, CONVOLUTION_POST_PADDINGS, TYPE_INT64, 2, after, what);
    finalize(m, d, what);
    return d;
}

/* The mode's operation on the three tensors, alpha 1 and beta c->beta, in the
 * compute type's precision (f32 for bf16 tensors). */
static void *operation(Maker *m, const ddp_device_conv *c, void *const tensors[3], void *conv) {
    const OperationKind *kind = &operation_kinds[c->mode];
    float alpha32 = 1, beta32 = (float)c->beta;
    double alpha64 = 1, beta64 = c->beta;
    int scalar = c->f64 ? TYPE_DOUBLE : TYPE_FLOAT;
    void *op = create(m, kind->descriptor, kind->name);
    set(m, op, kind->alpha, scalar, 1, c->f64 ? (void *)&alpha64 : (void *)&alpha32, kind->name);
    set(m, op, kind->beta, scalar, 1, c->f64 ? (void *)&beta64 : (void *)&beta32, kind->name);
    set(m, op, kind->conv, TYPE_BACKEND_DESCRIPTOR, 1, &conv, kind->name);
    set(m, op, kind->x, TYPE_BACKEND_DESCRIPTOR, 1, &tensors[0], kind->name);
    set(m, op, kind->w, TYPE_BACKEND_DESCRIPTOR, 1, &tensors[1], kind->name);
    set(m, op, kind->y, TYPE_BACKEND_DESCRIPTOR, 1, &tensors[2], kind->name);
    finalize(m, op, kind->name);
    return op;
}

/* The graph of the one operation, with its tensors and the convolution descriptor. */
static void *operation_graph(Maker *m, ddp_cudnn *h, const ddp_device_conv *c, const int64_t alignment[3]) {
    int64_t x_dims[4] = {c->n, c->c, c->h, c->w}, w_dims[4] = {c->k, c->c, c->r, c->s};
    int64_t y_dims[4] = {c->n, c->k, c->oh, c->ow};
    void *tensors[3] = {tensor(m, c, UID_X, x_dims, alignment[0], "the image's tensor"),
                        tensor(m, c, UID_FILTERS, w_dims, alignment[1], "the filters' tensor"),
                        tensor(m, c, UID_Y, y_dims, alignment[2], "the output's tensor")};
    void *op = operation(m, c, tensors, convolution(m, c));
    void *graph = create(m, DESC_OPERATION_GRAPH, "the operation graph");
    set(m, graph, OPERATIONGRAPH_OPS, TYPE_BACKEND_DESCRIPTOR, 1, &op, "the operation graph");
    set(m, graph, OPERATIONGRAPH_HANDLE, TYPE_HANDLE, 1, &h->handle, "the operation graph");
    finalize(m, graph, "the operation graph");
    return graph;
}

/* ------------------------------------------------------------- choosing an engine */

/* One engine configuration on trial: its engine's number and notes, and the plan made
 * of it when it passes. */
typedef struct Trial {
    void *config, *plan;
    int64_t engine;
    int notes[NOTE_TYPE_COUNT];
    int64_t nnotes;
    int64_t workspace;
} Trial;

static bool has_note(const Trial *t, int note) {
    for (int64_t i = 0; i < t->nnotes; i++)
        if (t->notes[i] == note)
            return true;
    return false;
}

/* Why the engine's numbers rule it out for c, or NULL. Tensor cores read f32 factors
 * as TF32, which only precision = tf32 accepts; bf16 factors they read exactly, so a
 * bf16 convolution takes them, as long as they sum in f32. */
static const char *numerics_refused(const Trial *t, const ddp_device_conv *c) {
    if (has_note(t, NOTE_NONDETERMINISTIC))
        return "nondeterministic";
    if (!c->f64 && !c->tf32 && !c->bf16 && has_note(t, NOTE_TENSOR_CORE))
        return "tensor cores (TF32 products, and precision is not tf32)";
    if (has_note(t, NOTE_DOWN_CONVERT_INPUTS))
        return "converts its inputs down";
    if (has_note(t, NOTE_REDUCED_PRECISION_REDUCTION))
        return c->bf16 ? "sums in reduced precision (bf16 convolutions sum in f32)" : "sums in reduced precision";
    return NULL;
}

/* The engine of a configuration: its number and numerical notes. */
static int read_engine(Trial *t) {
    void *engine = NULL;
    int64_t count;
    int status = dnn.cudnnBackendCreateDescriptor(DESC_ENGINE, &engine);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendGetAttribute(t->config, ENGINECFG_ENGINE, TYPE_BACKEND_DESCRIPTOR, 1, &count, &engine);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendGetAttribute(engine, ENGINE_GLOBAL_INDEX, TYPE_INT64, 1, &count, &t->engine);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendGetAttribute(engine, ENGINE_NUMERICAL_NOTE, TYPE_NUMERICAL_NOTE, NOTE_TYPE_COUNT,
                                              &t->nnotes, t->notes);
    if (engine)
        dnn.cudnnBackendDestroyDescriptor(engine);
    return status;
}

/* The configuration's plan, and what it needs of workspace. */
static int make_plan(Trial *t, ddp_cudnn *h) {
    int64_t count;
    int status = dnn.cudnnBackendCreateDescriptor(DESC_EXECUTION_PLAN, &t->plan);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendSetAttribute(t->plan, EXECUTION_PLAN_HANDLE, TYPE_HANDLE, 1, &h->handle);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendSetAttribute(t->plan, EXECUTION_PLAN_ENGINE_CONFIG, TYPE_BACKEND_DESCRIPTOR, 1,
                                              &t->config);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendFinalize(t->plan);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendGetAttribute(t->plan, EXECUTION_PLAN_WORKSPACE_SIZE, TYPE_INT64, 1, &count,
                                              &t->workspace);
    if (status != CUDNN_SUCCESS && t->plan) {
        dnn.cudnnBackendDestroyDescriptor(t->plan);
        t->plan = NULL;
    }
    return status;
}

/* Whether the trial's configuration serves c; when not, why, into rejected. */
static bool try_config(Trial *t, ddp_cudnn *h, const ddp_device_conv *c, ddp_text *rejected) {
    char text[1024];
    int status = read_engine(t);
    const char *refused = status == CUDNN_SUCCESS ? numerics_refused(t, c) : NULL;
    if (status != CUDNN_SUCCESS) {
        describe(status, text, sizeof text);
        ddp_text_printf(rejected, "; a configuration whose engine cannot be read: %s", text);
    } else if (refused)
        ddp_text_printf(rejected, "; engine %lld: %s", (long long)t->engine, refused);
    else if ((status = make_plan(t, h)) != CUDNN_SUCCESS) {
        describe(status, text, sizeof text);
        ddp_text_printf(rejected, "; engine %lld: finalize failed: %s", (long long)t->engine, text);
    } else if (t->workspace < 0 || (uint64_t)t->workspace > c->workspace_bytes) {
        ddp_text_printf(rejected, "; engine %lld: workspace %lld > %zu bytes", (long long)t->engine,
                        (long long)t->workspace, c->workspace_bytes);
        dnn.cudnnBackendDestroyDescriptor(t->plan);
        t->plan = NULL;
    }
    return t->plan != NULL;
}

/* The heuristics' configurations for the graph, best first; *count of them (none when
 * the heuristics fail: the caller then tries every engine). */
static void **heuristic_configs(void *graph, int64_t *count, ddp_text *rejected) {
    void *heur = NULL, **configs = NULL;
    int mode = HEUR_MODE_A, status = dnn.cudnnBackendCreateDescriptor(DESC_ENGINEHEUR, &heur);
    int64_t offered = 0;
    *count = 0;
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendSetAttribute(heur, ENGINEHEUR_OPERATION_GRAPH, TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendSetAttribute(heur, ENGINEHEUR_MODE, TYPE_HEUR_MODE, 1, &mode);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendFinalize(heur);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendGetAttribute(heur, ENGINEHEUR_RESULTS, TYPE_BACKEND_DESCRIPTOR, 0, &offered, NULL);
    if (status == CUDNN_SUCCESS && offered > 0 && (configs = calloc((size_t)offered, sizeof *configs))) {
        for (int64_t i = 0; i < offered && status == CUDNN_SUCCESS; i++)
            status = dnn.cudnnBackendCreateDescriptor(DESC_ENGINECFG, &configs[i]);
        if (status == CUDNN_SUCCESS)
            status = dnn.cudnnBackendGetAttribute(heur, ENGINEHEUR_RESULTS, TYPE_BACKEND_DESCRIPTOR, offered, count,
                                                  configs);
    }
    if (status != CUDNN_SUCCESS) {
        char text[1024];
        describe(status, text, sizeof text);
        ddp_text_printf(rejected, "; the heuristics failed: %s", text);
        *count = 0;
    }
    for (int64_t i = *count; configs && i < offered; i++)
        if (configs[i])
            dnn.cudnnBackendDestroyDescriptor(configs[i]);
    if (heur)
        dnn.cudnnBackendDestroyDescriptor(heur);
    return configs;
}

/* The heuristics' configurations that serve c, best first, at most `most` of them,
 * into trials (each with its plan); how many. */
static int serving_configs(ddp_cudnn *h, const ddp_device_conv *c, void *graph, Trial *trials, int most,
                           ddp_text *rejected) {
    int64_t count;
    void **configs = heuristic_configs(graph, &count, rejected);
    int n = 0;
    for (int64_t i = 0; i < count; i++) {
        Trial trial = {.config = configs[i]};
        if (n < most && try_config(&trial, h, c, rejected)) {
            trials[n++] = trial; /* the configuration lives on in the plan */
            continue;
        }
        dnn.cudnnBackendDestroyDescriptor(configs[i]);
    }
    free(configs);
    if (n == 0 && count == 0)
        ddp_text_printf(rejected, "; the heuristics offered no configuration");
    return n;
}

/* Engine number `index` with its default knobs, as a configuration; NULL with why
 * when it does not run the graph. */
static void *engine_config(void *graph, int64_t index, void **engine, ddp_text *rejected) {
    void *config = NULL;
    int status = dnn.cudnnBackendCreateDescriptor(DESC_ENGINE, engine);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendSetAttribute(*engine, ENGINE_OPERATION_GRAPH, TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendSetAttribute(*engine, ENGINE_GLOBAL_INDEX, TYPE_INT64, 1, &index);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendFinalize(*engine);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendCreateDescriptor(DESC_ENGINECFG, &config);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendSetAttribute(config, ENGINECFG_ENGINE, TYPE_BACKEND_DESCRIPTOR, 1, engine);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendFinalize(config);
    if (status == CUDNN_SUCCESS)
        return config;
    char text[1024];
    describe(status, text, sizeof text);
    ddp_text_printf(rejected, "; engine %lld: not supported: %s", (long long)index, text);
    if (config)
        dnn.cudnnBackendDestroyDescriptor(config);
    if (*engine)
        dnn.cudnnBackendDestroyDescriptor(*engine);
    *engine = NULL;
    return NULL;
}

/* Every engine in turn, when the heuristics offered nothing that serves. */
static bool choose_by_enumeration(ddp_cudnn *h, const ddp_device_conv *c, void *graph, Trial *t, void **engine,
                                  ddp_text *rejected) {
    int64_t engines = 0, count;
    int status = dnn.cudnnBackendGetAttribute(graph, OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, TYPE_INT64, 1, &count,
                                              &engines);
    if (status != CUDNN_SUCCESS) {
        char text[1024];
        describe(status, text, sizeof text);
        ddp_text_printf(rejected, "; the engines cannot be counted: %s", text);
        return false;
    }
    ddp_text_printf(rejected, "; of all %lld engines", (long long)engines);
    for (int64_t i = 0; i < engines; i++) {
        *t = (Trial){.config = engine_config(graph, i, engine, rejected)};
        if (t->config && try_config(t, h, c, rejected))
            return true;
        if (t->config)
            dnn.cudnnBackendDestroyDescriptor(t->config);
        if (*engine)
            dnn.cudnnBackendDestroyDescriptor(*engine);
        *engine = NULL;
    }
    return false;
}

/* "engine 12, tensor cores, knobs 2=3 14=1" */
static void name_plan(ddp_cudnn_plan *p, const Trial *t) {
    void *knobs[KNOB_TYPE_COUNTS] = {0};
    int64_t count = 0, got;
    int used = snprintf(p->name, sizeof p->name, "engine %lld%s", (long long)t->engine,
                        has_note(t, NOTE_TENSOR_CORE) ? ", tensor cores" : "");
    int status = CUDNN_SUCCESS;
    for (int i = 0; i < KNOB_TYPE_COUNTS && status == CUDNN_SUCCESS; i++)
        status = dnn.cudnnBackendCreateDescriptor(DESC_KNOB_CHOICE, &knobs[i]);
    if (status == CUDNN_SUCCESS)
        status = dnn.cudnnBackendGetAttribute(t->config, ENGINECFG_KNOB_CHOICES, TYPE_BACKEND_DESCRIPTOR,
                                              KNOB_TYPE_COUNTS, &count, knobs);
    for (int64_t i = 0; status == CUDNN_SUCCESS && i < count && used < (int)sizeof p->name; i++) {
        int type = 0;
        int64_t value = 0;
        if (dnn.cudnnBackendGetAttribute(knobs[i], KNOB_CHOICE_KNOB_TYPE, TYPE_KNOB_TYPE, 1, &got, &type) ||
            dnn.cudnnBackendGetAttribute(knobs[i], KNOB_CHOICE_KNOB_VALUE, TYPE_INT64, 1, &got, &value))
            break;
        used += snprintf(p->name + used, sizeof p->name - (size_t)used, "%s%d=%lld", i ? " " : ", knobs ", type,
                         (long long)value);
    }
    for (int i = 0; i < KNOB_TYPE_COUNTS; i++)
        if (knobs[i])
            dnn.cudnnBackendDestroyDescriptor(knobs[i]);
}

/* ------------------------------------------------------------ choosing by time */

/* How many of the heuristics' serving configurations a timed choice runs. */
enum { TIMED_CONFIGS = 8 };

static void drop_trial(Trial *t) {
    dnn.cudnnBackendDestroyDescriptor(t->plan);
    dnn.cudnnBackendDestroyDescriptor(t->config);
}

/* Which of n trials runs c fastest by `time` (the first of equals), p giving the shape
 * and alignment they were made for; -1 when the timer failed (why in err). */
static int fastest(ddp_cudnn *h, const ddp_device_conv *c, const ddp_cudnn_plan *p, Trial *trials, int n,
                   const ddp_cudnn_timing *timing, double *best_seconds, char *err, size_t len) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        ddp_cudnn_plan view = *p;
        view.plan = trials[i].plan, view.workspace = (size_t)trials[i].workspace;
        name_plan(&view, &trials[i]);
        double seconds;
        if (!timing->time(timing->ctx, h, &view, c, &seconds, err, len))
            return -1;
        if (best < 0 || seconds < *best_seconds)
            best = i, *best_seconds = seconds;
    }
    return best;
}

/* The fastest of the first TIMED_CONFIGS configurations that serve, into t (a lone one
 * untimed); false with none, or with the timer's failure in err (*failed). */
static bool choose_by_timing(ddp_cudnn *h, const ddp_device_conv *c, const ddp_cudnn_plan *p, void *graph,
                             const ddp_cudnn_timing *timing, Trial *t, int *timed, double *seconds,
                             ddp_text *rejected, bool *failed, char *err, size_t len) {
    Trial trials[TIMED_CONFIGS];
    int n = serving_configs(h, c, graph, trials, TIMED_CONFIGS, rejected);
    int best = n > 1 ? fastest(h, c, p, trials, n, timing, seconds, err, len) : 0;
    *failed = n > 1 && best < 0;
    for (int i = 0; i < n; i++)
        if (i != best)
            drop_trial(&trials[i]);
    if (n > 0 && best >= 0)
        *t = trials[best], *timed = n > 1 ? n : 0;
    return n > 0 && best >= 0;
}

/* ---------------------------------------------------------------- plans and runs */

/* Whether the fields the plan was made for match (the pointers and the workspace's
 * size aside: the pointers are checked for alignment, the workspace against the
 * plan's need), field by field: a descriptor's padding bytes may hold anything. */
static bool same_shape(const ddp_device_conv *a, const ddp_device_conv *b) {
    return memcmp(a, b, offsetof(ddp_device_conv, beta)) == 0 && a->beta == b->beta && a->f64 == b->f64 &&
           a->tf32 == b->tf32 && a->bf16 == b->bf16;
}

/* Shared with the emulated device, which refuses what cuDNN refuses. */
bool ddp_conv_check(const ddp_device_conv *c, char *err, size_t len) {
    int reach_h = (c->r - 1) * c->dilation[0] + 1, reach_w = (c->s - 1) * c->dilation[1] + 1;
    int padded_h = c->h + c->pad_before[0] + c->pad_after[0], padded_w = c->w + c->pad_before[1] + c->pad_after[1];
    if (c->mode < DDP_CONV_FORWARD || c->mode > DDP_CONV_BACKWARD_FILTER || (c->beta != 0 && c->beta != 1))
        return ddp_fail(err, len, "convolution: CUDNN_STATUS_BAD_PARAM: mode %d, beta %g (modes 0-2 and beta 0 or 1 "
                                  "only)", c->mode, c->beta);
    if (c->n < 1 || c->h < 1 || c->w < 1 || c->c < 1 || c->k < 1 || c->r < 1 || c->s < 1 || c->oh < 1 || c->ow < 1)
        return ddp_fail(err, len, "convolution: CUDNN_STATUS_BAD_PARAM: an empty tensor (image %dx%dx%dx%d, filters "
                                  "%dx%dx%dx%d, output %dx%d)", c->n, c->h, c->w, c->c, c->k, c->r, c->s, c->c, c->oh,
                        c->ow);
    /* a padded image smaller than the filters' reach has no output, whatever the
     * division below would round to */
    if (c->stride[0] < 1 || c->stride[1] < 1 || c->dilation[0] < 1 || c->dilation[1] < 1 || c->pad_before[0] < 0 ||
        c->pad_before[1] < 0 || c->pad_after[0] < 0 || c->pad_after[1] < 0 || padded_h < reach_h ||
        padded_w < reach_w || c->oh != (padded_h - reach_h) / c->stride[0] + 1 ||
        c->ow != (padded_w - reach_w) / c->stride[1] + 1)
        return ddp_fail(err, len, "convolution: CUDNN_STATUS_BAD_PARAM: the output %dx%d does not follow from the "
                                  "image %dx%d, filters %dx%d, strides %d,%d, dilations %d,%d, padding %d+%d, %d+%d",
                        c->oh, c->ow, c->h, c->w, c->r, c->s, c->stride[0], c->stride[1], c->dilation[0],
                        c->dilation[1], c->pad_before[0], c->pad_after[0], c->pad_before[1], c->pad_after[1]);
    return true;
}

void ddp_cudnn_plan_free(ddp_cudnn_plan *p) {
    if (!p)
        return;
    if (p->plan)
        dnn.cudnnBackendDestroyDescriptor(p->plan);
    for (int i = p->ndescriptors - 1; i >= 0; i--)
        dnn.cudnnBackendDestroyDescriptor(p->descriptors[i]);
    free(p);
}

/* The chosen configuration (and its engine, when enumerated) kept with the graph's
 * descriptors, which it refers to. */
static void keep(ddp_cudnn_plan *p, Maker *m, const Trial *t, void *engine) {
    memcpy(p->descriptors, m->made, (size_t)m->nmade * sizeof *m->made);
    p->ndescriptors = m->nmade;
    if (engine)
        p->descriptors[p->ndescriptors++] = engine;
    p->descriptors[p->ndescriptors++] = t->config;
    p->plan = t->plan;
    p->workspace = (size_t)t->workspace;
    m->nmade = 0;
}

bool ddp_cudnn_plan_conv(ddp_cudnn *h, const ddp_device_conv *c, const ddp_cudnn_timing *timing,
                         ddp_cudnn_plan **out, char *err, size_t len) {
    *out = NULL;
    if (!ddp_conv_check(c, err, len))
        return false;
    ddp_cudnn_plan *p = calloc(1, sizeof *p);
    if (!p)
        return ddp_fail(err, len, "out of memory");
    p->shape = *c;
    p->alignment[0] = alignment_of(c->x), p->alignment[1] = alignment_of(c->filters);
    p->alignment[2] = alignment_of(c->y);
    Maker m = {.err = err, .len = len};
    void *graph = operation_graph(&m, h, c, p->alignment), *engine = NULL;
    Trial t = {0};
    ddp_text rejected = {0};
    int timed = 0;
    double seconds = 0;
    bool failed = false, found = false;
    if (!m.failed)
        found = timing ? choose_by_timing(h, c, p, graph, timing, &t, &timed, &seconds, &rejected, &failed, err,
                                                  len)
                       : serving_configs(h, c, graph, &t, 1, &rejected) == 1;
    if (!m.failed && !found && !failed)
        found = choose_by_enumeration(h, c, graph, &t, &engine, &rejected);
    if (found) {
        keep(p, &m, &t, engine);
        name_plan(p, &t);
        if (timed) {
            size_t used = strlen(p->name);
            snprintf(p->name + used, sizeof p->name - used, ", the fastest of %d timed (%.3f ms)", timed,
                     seconds * 1e3);
        }
        *out = p;
    } else if (!m.failed && !failed)
        ddp_fail(err, len, "cuDNN has no engine for this %s convolution (%s, image %dx%dx%dx%d, filters %dx%dx%dx%d, "
                           "workspace %zu bytes): %s", operation_kinds[c->mode].name, type_name(c), c->n,
                 c->h, c->w, c->c, c->k, c->r, c->s, c->c, c->workspace_bytes,
                 rejected.s ? rejected.s + 2 : "nothing was offered");
    free(rejected.s);
    drop_all(&m);
    if (!found)
        ddp_cudnn_plan_free(p);
    return found;
}

const char *ddp_cudnn_plan_name(const ddp_cudnn_plan *p) {
    return p->name;
}

size_t ddp_cudnn_plan_workspace(const ddp_cudnn_plan *p) {
    return p->workspace;
}

/* Whether c's pointers and workspace fit what the plan assumed. */
static bool runnable(const ddp_cudnn_plan *p, const ddp_device_conv *c, char *err, size_t len) {
    const ddp_dptr pointers[3] = {c->x, c->filters, c->y};
    const char *names[3] = {"image", "filters", "output"};
    if (!same_shape(&p->shape, c))
        return ddp_fail(err, len, "cuDNN: a run whose convolution is not the one its plan (%s) was made for",
                        p->name);
    for (int i = 0; i < 3; i++)
        if (pointers[i] % (ddp_dptr)p->alignment[i] != 0)
            return ddp_fail(err, len, "cuDNN: the %s at 0x%llx is not aligned to the %lld bytes its plan assumed",
                            names[i], (unsigned long long)pointers[i], (long long)p->alignment[i]);
    if (p->workspace > 0 && (!c->workspace || c->workspace_bytes < p->workspace))
        return ddp_fail(err, len, "cuDNN: the plan (%s) needs %zu bytes of workspace, and the run has %zu",
                        p->name, p->workspace, c->workspace ? c->workspace_bytes : 0);
    return true;
}

bool ddp_cudnn_run(ddp_cudnn *h, const ddp_cudnn_plan *p, const ddp_device_conv *c, char *err, size_t len) {
    if (!runnable(p, c, err, len))
        return false;
    const char *what = "the variant pack";
    int64_t uids[3] = {UID_X, UID_FILTERS, UID_Y};
    void *pointers[3] = {(void *)(uintptr_t)c->x, (void *)(uintptr_t)c->filters, (void *)(uintptr_t)c->y};
    void *workspace = (void *)(uintptr_t)c->workspace;
    Maker m = {.err = err, .len = len};
    void *pack = create(&m, DESC_VARIANT_PACK, what);
    set(&m, pack, VARIANT_PACK_UNIQUE_IDS, TYPE_INT64, 3, uids, what);
    set(&m, pack, VARIANT_PACK_DATA_POINTERS, TYPE_VOID_PTR, 3, pointers, what);
    set(&m, pack, VARIANT_PACK_WORKSPACE, TYPE_VOID_PTR, 1, &workspace, what);
    finalize(&m, pack, what);
    int status = m.failed ? CUDNN_SUCCESS : dnn.cudnnBackendExecute(h->handle, p->plan, pack);
    if (status != CUDNN_SUCCESS) {
        char where[256];
        snprintf(where, sizeof where, "running the %s convolution (%s)", operation_kinds[c->mode].name, p->name);
        m.failed = !fail_status(status, err, len, where);
    }
    drop_all(&m);
    return !m.failed;
}
