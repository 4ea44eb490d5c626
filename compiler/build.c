/* build.c: `ddpc build`: the checked program lowered, its kernels generated for the
 * GPU (PTX, kept as data) and the CPU (a baseline and an AVX2 variant of each, in one
 * object with the program's descriptor), then linked with the runtime library by the
 * system's cc into one executable.
 *
 * The executable needs no GPU library to start: the runtime loads the CUDA driver,
 * cuBLAS and NCCL with dlopen only when a GPU run is asked for. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
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
#ifndef DDP_BLAS_LIBS
#define DDP_BLAS_LIBS ""
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
    int64_t total = 2 * p + ir->state_vectors * p + ir->stats_count * elem + ir->arena_bytes +
                    ir->workspace_bytes + ir->input_bytes;
    int64_t apart = 2 * p + ir->state_vectors * p + ir->stats_count * elem + ir->no_reuse_arena_bytes +
                    ir->no_reuse_workspace_bytes + ir->input_bytes;
    fprintf(out, "peak memory per replica (batch %lld, %s):\n", (long long)ir->batch, dtype_name(ir->dtype));
    fprintf(out, "  parameters       %15s bytes\n", fmt_count(c->arena, p));
    fprintf(out, "  gradients        %15s bytes\n", fmt_count(c->arena, p));
    fprintf(out, "  optimizer state  %15s bytes\n", fmt_count(c->arena, ir->state_vectors * p));
    fprintf(out, "  statistics       %15s bytes\n", fmt_count(c->arena, ir->stats_count * elem));
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
    if (!generate(c, ir, ptx ? TARGET_GPU : TARGET_CPU_BASE, opt, &cg, &error)) {
        fprintf(stderr, "ddpc: %s\n", error);
        return false;
    }
    bool ok = true;
    if (ptx) {
        char *text;
        size_t len;
        ok = cg_emit(&cg, opt, &text, &len, &error);
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

int build_program(Ddpc *c, Ir *ir, const BuildOptions *o, const char *source) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const char *error = NULL;
    /* the GPU kernels first: their PTX becomes data of the CPU object */
    Cg gpu;
    char *ptx = NULL;
    size_t ptx_len = 0;
    if (!generate(c, ir, TARGET_GPU, o->opt_level, &gpu, &error) ||
        !cg_emit(&gpu, o->opt_level, &ptx, &ptx_len, &error)) {
        fprintf(stderr, "ddpc: %s\n", error);
        cg_dispose(&gpu);
        return 1;
    }
    cg_dispose(&gpu);

    Cg cpu;
    if (!generate(c, ir, TARGET_CPU_BASE, o->opt_level, &cpu, &error)) {
        fprintf(stderr, "ddpc: %s\n", error);
        return 1;
    }
    cpu.target = TARGET_CPU_WIDE;
    int nkernels = cg_kernels(&cpu);
    cpu.target = TARGET_CPU_BASE;
    cg_program(&cpu, source, ptx, program_hash(c, ir), nkernels);
    char *obj;
    size_t obj_len;
    if (!cg_emit(&cpu, o->opt_level, &obj, &obj_len, &error)) {
        fprintf(stderr, "ddpc: %s\n", error);
        cg_dispose(&cpu);
        return 1;
    }
    cg_dispose(&cpu);

    const char *why = NULL;
    if (o->object_only) {
        if (!write_file(o->output, obj, obj_len, &why)) {
            fprintf(stderr, "ddpc: cannot write %s: %s\n", o->output, why);
            return 1;
        }
    } else {
        const char *runtime = find_runtime();
        if (!runtime) {
            fprintf(stderr, "ddpc: the runtime library libddprt.a was not found (set DDP_RUNTIME "
                            "to its path)\n");
            return 1;
        }
        char tmp[] = "/tmp/ddp-build-XXXXXX.o";
        int fd = mkstemps(tmp, 2);
        if (fd < 0 || close(fd) != 0 || !write_file(tmp, obj, obj_len, &why)) {
            fprintf(stderr, "ddpc: cannot write a temporary object file: %s\n", why ? why : strerror(errno));
            return 1;
        }
        const char *cc = getenv("CC") && *getenv("CC") ? getenv("CC") : "cc";
        char *argv[64];
        int n = 0;
        argv[n++] = (char *)cc;
        argv[n++] = "-o";
        argv[n++] = (char *)o->output;
        argv[n++] = tmp;
        argv[n++] = (char *)runtime;
        char *libs = arena_strdup(c->arena, DDP_BLAS_LIBS);
        for (char *tok = strtok(libs, ";"); tok && n < 56; tok = strtok(NULL, ";"))
            argv[n++] = tok;
        argv[n++] = "-lpthread";
        argv[n++] = "-ldl";
        argv[n++] = "-lm";
        argv[n] = NULL;
        bool linked = run(argv);
        unlink(tmp);
        if (!linked) {
            fprintf(stderr, "ddpc: linking %s with %s failed\n", o->output, cc);
            return 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (o->stats)
        print_stats(c, stdout, ir, (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
