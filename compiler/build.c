/* build.c: `ddpc build`: the checked program lowered, its kernels generated for the
 * GPU (PTX, kept as data), the emulated GPU and the CPU (a baseline and an AVX2
 * variant of each), each module by a process of its own, and the program's
 * descriptor, then linked with the runtime library by the system's cc into one
 * executable.
 *
 * The executable needs no GPU library to start: the runtime loads the CUDA driver,
 * cuBLAS and NCCL with dlopen only when a GPU run is asked for. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cg.h"

#ifndef DDP_RUNTIME_LIB
#define DDP_RUNTIME_LIB ""
#endif
#ifndef DDP_INSTALL_RUNTIME_LIB
#define DDP_INSTALL_RUNTIME_LIB ""
#endif
#ifndef DDP_RUNTIME_DEPS
#define DDP_RUNTIME_DEPS ""
#endif

/* DDP_RUNTIME, else beside the installed ddpc, else the build tree's. */
static const char *find_runtime(void) {
    return find_installed("DDP_RUNTIME", "../lib/ddp/libddprt.a", DDP_INSTALL_RUNTIME_LIB, DDP_RUNTIME_LIB,
                          false);
}

static bool write_file(const char *path, const char *data, size_t len, const char **why) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        *why = strerror(errno);
        return false;
    }
    bool ok = fwrite(data, 1, len, f) == len;
    ok &= fclose(f) == 0;
    if (!ok)
        *why = strerror(errno);
    return ok;
}

/* Runs argv; true when it exits 0. */
static bool run(char *const argv[]) {
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "ddpc: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return false;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void print_stats(Ddpc *c, FILE *out, Ir *ir, double seconds) {
    int64_t elem = dtype_size(ir->dtype), p = ir->param_count * elem;
    int64_t g = ir->grads_bytes; /* with their bf16 copy under allreduce_precision = bf16 */
    int64_t fixed = p + g + ir->state_vectors * p + ir->stats_count * elem + constant_bytes(ir) + ir->input_bytes;
    int64_t total = fixed + ir->arena_bytes + ir->workspace_bytes;
    int64_t apart = fixed + ir->no_reuse_arena_bytes + ir->no_reuse_workspace_bytes;
    bool bf16 = ir->input->dtype == DT_BF16; /* precision = bf16: activations in bf16, the master copy f32 */
    fprintf(out, "peak memory per replica (batch %lld, %s%s):\n", (long long)ir->batch,
            bf16 ? "bf16 activations, " : "", bf16 ? "f32 parameters" : dtype_name(ir->dtype));
    fprintf(out, "  parameters       %15s bytes\n", fmt_count(c->arena, p));
    const char *extras = gradient_extras(ir);
    fprintf(out, "  gradients        %15s bytes%s%s\n", fmt_count(c->arena, g), *extras ? "  " : "", extras);
    fprintf(out, "  optimizer state  %15s bytes\n", fmt_count(c->arena, ir->state_vectors * p));
    fprintf(out, "  statistics       %15s bytes\n", fmt_count(c->arena, ir->stats_count * elem));
    if (constant_bytes(ir))
        fprintf(out, "  %s %15s bytes\n", constants_label(ir), fmt_count(c->arena, constant_bytes(ir)));
    fprintf(out, "  activations      %15s bytes  (%s without reuse)\n", fmt_count(c->arena, ir->arena_bytes),
            fmt_count(c->arena, ir->no_reuse_arena_bytes));
    fprintf(out, "  workspace        %15s bytes  (%s without reuse)\n", fmt_count(c->arena, ir->workspace_bytes),
            fmt_count(c->arena, ir->no_reuse_workspace_bytes));
    fprintf(out, "  batch            %15s bytes\n", fmt_count(c->arena, ir->input_bytes));
    fprintf(out, "  total            %15s bytes  (%s without reuse)\n", fmt_count(c->arena, total),
            fmt_count(c->arena, apart));
    fprintf(out, "built in %.2f s\n", seconds);
}

static bool generate(Ddpc *c, Ir *ir, Target target, int opt, Cg *cg, const char **error) {
    if (!cg_init(cg, c, ir, target, opt, error))
        return false;
    cg_kernels(cg);
    return true;
}

/* The generated code of a stage (--stage=llvm, --stage=ptx). */
bool build_emit_code(Ddpc *c, Ir *ir, bool ptx, int opt, FILE *out) {
    Cg cg;
    const char *error = NULL;
    if (!cg_assign_kernels(c, ir, &error) || !generate(c, ir, ptx ? TARGET_GPU : TARGET_CPU_BASE, opt, &cg, &error)) {
        fprintf(stderr, "ddpc: %s\n", error);
        return false;
    }
    bool ok = true;
    if (ptx) {
        char *text;
        size_t len;
        cg.opt_level = opt;
        ok = cg_emit_ptx(&cg, &text, &len, &error);
        if (ok)
            fputs(text, out);
    } else {
        fputs(cg_module_text(&cg), out);
    }
    if (!ok)
        fprintf(stderr, "ddpc: %s\n", error);
    cg_dispose(&cg);
    return ok;
}

/* ------------------------------------------------------- parallel modules */

/* The modules built by child processes, each into a temporary file, while this
 * process builds the baseline CPU module: the PTX (which the program's descriptor
 * holds, so it is asked for first), the emulated device's object of the same kernels,
 * and the wide CPU variant. Processes, not threads: each has its own LLVM context and
 * its own arena. No module waits for another, so on two cores a build takes about
 * half the sum of their times, and on more cores the longest one's. */
typedef enum { MODULE_PTX, MODULE_EMULATED, MODULE_WIDE, CHILD_MODULES } ChildModule;

typedef struct Child {
    pid_t pid;
    ChildModule module;
    const char *path;
} Child;

/* A build's temporary files, in $TMPDIR (else /tmp: a cluster's login node may give
 * each user a TMPDIR of their own, or a /tmp too small for ResNet-50's objects), are
 * removed however the build ends: done, failed, or stopped by SIGINT, SIGTERM or
 * SIGHUP (a Ctrl-C during a build leaves none behind: the handler ends the children,
 * unlinks the files, all of which a handler may do, and ends the process by the same
 * signal). Each is registered before it exists, so none can be made and missed. */
enum { TEMPS = 8 };
static char temp_paths[TEMPS][PATH_MAX];
static volatile sig_atomic_t ntemps;
static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};
static struct sigaction before_build[3];

static const char *temp_dir(void) {
    const char *dir = getenv("TMPDIR");
    return dir && *dir ? dir : "/tmp";
}

static void remove_temps(void) {
    for (int i = 0; i < ntemps; i++)
        unlink(temp_paths[i]);
}

/* The children writing modules, which a stop ends before their files go (else one
 * could write its file again after). */
static volatile sig_atomic_t child_pids[CHILD_MODULES];

static void on_stop_signal(int sig) {
    for (int i = 0; i < CHILD_MODULES; i++)
        if (child_pids[i] > 0) {
            kill(child_pids[i], SIGKILL);
            waitpid(child_pids[i], NULL, 0);
        }
    remove_temps();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Handlers that remove the files (on), or those before the build again (off). */
static void temps_guarded(bool on) {
    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; i++)
        sigaction(stop_signals[i], on ? &sa : &before_build[i], on ? &before_build[i] : NULL);
}

/* A new empty temporary file: its path, or NULL with the message printed. A build
 * makes five. */
static const char *new_temp(void) {
    char *path = temp_paths[ntemps];
    errno = ENAMETOOLONG;
    if (ntemps < TEMPS && snprintf(path, PATH_MAX, "%s/ddp-build-XXXXXX", temp_dir()) < PATH_MAX) {
        ntemps++;
        int fd = mkstemp(path);
        if (fd >= 0 && close(fd) == 0)
            return path;
    }
    fprintf(stderr, "ddpc: cannot make a temporary file in %s%s: %s\n", temp_dir(),
            getenv("TMPDIR") && *getenv("TMPDIR") ? " (TMPDIR)" : "", strerror(errno));
    return NULL;
}

static bool child_output(Cg *cg, ChildModule module, int opt, char **out, size_t *len, const char **error) {
    cg->opt_level = opt;
    switch (module) {
    case MODULE_PTX: return cg_emit_ptx(cg, out, len, error);
    case MODULE_EMULATED: return cg_emit_emulated(cg, out, len, error);
    default: return cg_emit(cg, opt, out, len, error);
    }
}

/* A child started on the module, or false with the message printed. The stop
 * signals wait while it starts, so none comes before the parent knows the child (to
 * end it) or before the child has the default handlers (the parent removes the
 * files). */
static bool spawn_module(Ddpc *c, Ir *ir, ChildModule module, int opt, Child *child) {
    child->module = module;
    if (!(child->path = new_temp()))
        return false;
    fflush(NULL);
    sigset_t stops, before;
    sigemptyset(&stops);
    for (int i = 0; i < 3; i++)
        sigaddset(&stops, stop_signals[i]);
    sigprocmask(SIG_BLOCK, &stops, &before);
    child->pid = fork();
    if (child->pid != 0) {
        int error = errno;
        if (child->pid > 0)
            child_pids[module] = child->pid;
        sigprocmask(SIG_SETMASK, &before, NULL);
        if (child->pid < 0)
            fprintf(stderr, "ddpc: cannot start the code generators: %s\n", strerror(error));
        return child->pid > 0;
    }
    for (int i = 0; i < 3; i++)
        signal(stop_signals[i], SIG_DFL);
    sigprocmask(SIG_SETMASK, &before, NULL);
    Cg cg;
    const char *error = NULL, *why = NULL;
    char *out;
    size_t len;
    bool ok = generate(c, ir, module == MODULE_WIDE ? TARGET_CPU_WIDE : TARGET_GPU, opt, &cg, &error) &&
              child_output(&cg, module, opt, &out, &len, &error) && write_file(child->path, out, len, &why);
    if (!ok)
        fprintf(stderr, "ddpc: %s\n", error ? error : why);
    _exit(ok ? 0 : 1);
}

/* Whether the child ended well. */
static bool await_child(Child *child) {
    int status;
    while (waitpid(child->pid, &status, 0) < 0)
        if (errno != EINTR)
            return false;
    child->pid = child_pids[child->module] = 0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* The PTX a child wrote, read into the arena; NULL when it failed. */
static char *await_ptx(Ddpc *c, Child *child, size_t *len) {
    const char *why;
    SourceFile *f = await_child(child) ? source_load(c, child->path, true, &why) : NULL;
    if (!f)
        return NULL;
    *len = f->len;
    return f->text;
}

/* A child still running when the build failed is stopped. */
static void discard(Child *child) {
    if (child->pid > 0) {
        kill(child->pid, SIGKILL);
        waitpid(child->pid, NULL, 0);
        child->pid = child_pids[child->module] = 0;
    }
}

/* The fastest linker there is: lld, then gold, then cc's own. */
static const char *linker_flag(void) {
    static const char *const linkers[][2] = {{"/usr/bin/ld.lld", "-fuse-ld=lld"},
                                             {"/usr/bin/ld.gold", "-fuse-ld=gold"}};
    for (int i = 0; i < 2; i++)
        if (access(linkers[i][0], X_OK) == 0)
            return linkers[i][1];
    return NULL;
}

/* The objects of a build: the baseline's kernels, the descriptor, the wide kernels and
 * the emulated device's. */
enum { OBJECTS = 4 };

static bool link_executable(Ddpc *c, const BuildOptions *o, char *const objects[OBJECTS]) {
    const char *runtime = find_runtime();
    if (!runtime) {
        fprintf(stderr, "ddpc: the runtime library libddprt.a was not found (set DDP_RUNTIME to its path)\n");
        return false;
    }
    const char *cc = getenv("CC") && *getenv("CC") ? getenv("CC") : "cc";
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)cc;
    if (linker_flag())
        argv[n++] = (char *)linker_flag();
    argv[n++] = "-o";
    argv[n++] = (char *)o->output;
    for (int i = 0; i < OBJECTS; i++)
        argv[n++] = objects[i];
    argv[n++] = (char *)runtime;
    char *libs = arena_strdup(c->arena, DDP_RUNTIME_DEPS);
    for (char *tok = strtok(libs, "|"); tok && n < 56; tok = strtok(NULL, "|"))
        argv[n++] = tok;
    argv[n++] = "-lpthread";
    argv[n++] = "-ldl";
    argv[n++] = "-lm";
    argv[n] = NULL;
    if (!run(argv)) {
        fprintf(stderr, "ddpc: linking %s with %s failed\n", o->output, cc);
        return false;
    }
    return true;
}

/* -c: the objects as one relocatable object. */
static bool combine_objects(const char *output, char *const objects[OBJECTS]) {
    char *argv[OBJECTS + 5] = {"ld", "-r", "-o", (char *)output};
    for (int i = 0; i < OBJECTS; i++)
        argv[4 + i] = objects[i];
    if (!run(argv)) {
        fprintf(stderr, "ddpc: combining the objects into %s with ld -r failed\n", output);
        return false;
    }
    return true;
}

/* A CPU module's object, written to a new temporary file: its path, or NULL with the
 * message printed. */
static const char *emit_object(Cg *cg, int opt_level) {
    char *obj;
    size_t len;
    const char *error = NULL, *why = NULL, *path = NULL;
    if (!cg_emit(cg, opt_level, &obj, &len, &error))
        fprintf(stderr, "ddpc: %s\n", error);
    else if ((path = new_temp()) && !write_file(path, obj, len, &why)) {
        fprintf(stderr, "ddpc: cannot write a temporary object file: %s\n", why);
        path = NULL;
    }
    return path;
}

/* Whether the output can be written: not a folder, in a folder that is there and
 * may be written. Checked before code generation (ResNet-50's takes seconds), so a
 * mistyped -o is said at once, in ddpc's words rather than the linker's. */
static bool output_writable(const char *output) {
    struct stat st;
    if (stat(output, &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "ddpc: -o %s is a folder; give the path of the file to write\n", output);
        return false;
    }
    char folder[PATH_MAX];
    const char *slash = strrchr(output, '/');
    int len = !slash ? 1 : slash == output ? 1 : (int)(slash - output);
    snprintf(folder, sizeof folder, "%.*s", len, !slash ? "." : output);
    const char *why = stat(folder, &st) != 0           ? "is not there"
                      : !S_ISDIR(st.st_mode)             ? "is not a folder"
                      : access(folder, W_OK | X_OK) != 0 ? "may not be written"
                                                         : NULL;
    if (why)
        fprintf(stderr, "ddpc: cannot write %s: the folder %s %s\n", output, folder, why);
    return !why;
}

/* The baseline's kernels are emitted while the children work; the descriptor, which
 * holds the PTX, is a module of its own, made once the PTX is there (a few
 * milliseconds), so no module waits for another. */
int build_program(Ddpc *c, Ir *ir, const BuildOptions *o, const char *source) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t hash = program_hash(c, ir);
    Child child[CHILD_MODULES] = {0};
    const char *base = NULL, *descriptor = NULL, *error = NULL;
    int status = 1;
    if (!output_writable(o->output))
        return 1;
    cache_check_settings();
    if (!cg_assign_kernels(c, ir, &error)) {
        fprintf(stderr, "ddpc: %s\n", error);
        return 1;
    }
    temps_guarded(true);
    for (int m = 0; m < CHILD_MODULES; m++)
        if (!spawn_module(c, ir, (ChildModule)m, o->opt_level, &child[m]))
            goto done;
    Cg cg;
    bool ok = generate(c, ir, TARGET_CPU_BASE, o->opt_level, &cg, &error);
    if (!ok)
        fprintf(stderr, "ddpc: %s\n", error);
    else
        base = emit_object(&cg, o->opt_level);
    cg_dispose(&cg);
    if (!base)
        goto done;
    size_t ptx_len;
    char *ptx = await_ptx(c, &child[MODULE_PTX], &ptx_len);
    if (!ptx) {
        fprintf(stderr, "ddpc: generating the GPU code failed\n");
        goto done;
    }
    unsigned long long gpu_hash = 0; /* the PTX's first line names its module */
    sscanf(ptx, "// ddp gpu module %llx", &gpu_hash);
    if (!cg_init(&cg, c, ir, TARGET_CPU_BASE, o->opt_level, &error)) {
        fprintf(stderr, "ddpc: %s\n", error);
        goto done;
    }
    cg_program(&cg, source, ptx, hash, gpu_hash);
    cg.uncached = true;
    descriptor = emit_object(&cg, o->opt_level);
    cg_dispose(&cg);
    if (!descriptor)
        goto done;
    for (int m = MODULE_EMULATED; m <= MODULE_WIDE; m++)
        if (!await_child(&child[m])) {
            fprintf(stderr, "ddpc: generating the %s code failed\n", m == MODULE_WIDE ? "AVX2" : "emulated GPU's");
            goto done;
        }
    char *objects[OBJECTS] = {(char *)base, (char *)descriptor, (char *)child[MODULE_WIDE].path,
                              (char *)child[MODULE_EMULATED].path};
    if (o->object_only ? !combine_objects(o->output, objects) : !link_executable(c, o, objects))
        goto done;
    status = 0;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (o->stats)
        print_stats(c, stdout, ir, (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
done:
    for (int m = 0; m < CHILD_MODULES; m++)
        discard(&child[m]);
    remove_temps();
    ntemps = 0;
    temps_guarded(false);
    return status;
}
