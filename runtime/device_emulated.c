/* device_emulated.c: a GPU emulated on this machine, so that a machine without one
 * runs the whole GPU path, and fails where a GPU would. It is a test instrument, as
 * strict as a real device, never a fast path (`--device emulated`).
 *
 * - The kernels it runs are the GPU module's own (the module the PTX is made from,
 *   compiled for this machine: program->gpu_emulated), checked by the module's hash.
 *   They ask for their block, thread, barrier and shared memory, and round to bf16,
 *   through ddp_gpu_*, defined here. A block's threads run one after another; in a
 *   launch of whole blocks (DDP_LAUNCH_BLOCK) each thread is a coroutine that runs
 *   until it meets a barrier or ends, and all meet there before any goes on, so a
 *   barrier left out shows as wrong sums: shared memory starts each block filled
 *   with NaN. A barrier some threads skip, more than 1024 threads or 48 KB of shared
 *   memory, a launch of no blocks: each is refused as the GPU would refuse it.
 * - Device memory is a reserved range of addresses that is unreadable and unwritable
 *   except while queued work runs; host code that touches it (a copy left out) is
 *   stopped with a message saying so.
 * - Work is queued and runs only at synchronisation points, and then only what the
 *   point needs: the work before it on its stream and, through the events its
 *   stream waits for, on the others. A synchronisation of the whole device runs the
 *   copy and communication streams before the compute stream, each as far as its
 *   waits allow. So each stream runs in its own order and after every event it
 *   waits for, and otherwise as late, or as early, as a GPU may run it: work on two
 *   streams that nothing orders runs in whichever order breaks code that assumed
 *   one. A copy to the host fills its destination with 0xff (NaN) when queued, so a
 *   result read before its synchronisation reads NaN. A copy from pinned memory
 *   reads it when it runs, one from ordinary memory when it is queued, as CUDA's do.
 *   A library given a stream (the stand-in NCCL, through nccl_api.h's
 *   ddp_emulated_stream) queues its work the same way: it runs as that stream's
 *   other work does, device memory open to it then.
 * - Matrix products are a column-major reference taking cuBLAS's arguments, checked
 *   as cuBLAS checks them (a leading dimension too small is refused); convolutions are
 *   the reference of conv_reference.c, checked when queued as cuDNN checks them, and
 *   they fill their workspace with NaN, scratch as cuDNN's is.
 * - A stream being captured keeps its work in a graph instead of the queue; a graph's
 *   launch queues a copy of that work, with the sizes and addresses of its capture.
 *   What CUDA refuses while a stream captures (synchronising, copies from or to
 *   pageable memory on it, events across the capture's edge) is refused here too and
 *   spoils the capture. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#ifndef __x86_64__
#include <ucontext.h>
#endif

#include "bf16.h"
#include "conv.h"
#include "device.h"
#include "nccl_api.h"
#include "runtime.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMULATOR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMULATOR_ASAN 1
#endif
#endif
#ifdef EMULATOR_ASAN
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old);
#endif

/* Defined in every built program's emulated GPU object; absent elsewhere. */
extern const uint64_t ddp_gpu_module_hash __attribute__((weak));

enum { RESERVE = 1ull << 36, ALIGN = 256, STACK = 64 << 10, HUGE_PAGE = 2 << 20 };

typedef enum { W_UPLOAD, W_DOWNLOAD, W_COPY, W_FILL, W_LAUNCH, W_GEMM, W_CONV, W_RECORD, W_WAIT, W_MARK,
               W_HOST } WorkKind;

typedef struct Work {
    WorkKind kind;
    int stream;
    ddp_dptr to, from;          /* device addresses (or host, for the host's side of a copy) */
    void *host;                 /* upload: the source (pinned) or its snapshot; download: the destination */
    bool snapshot;              /* host is ours to free */
    size_t bytes;
    unsigned char byte;
    int64_t kernel, begin, end;
    uint32_t grid, threads, shared;
    ddp_dptr args, scalars;
    union {
        ddp_device_gemm gemm;
        ddp_device_conv conv;   /* a copy: the caller's descriptor may be gone when it runs */
        struct {
            void (*run)(void *arg);
            void *arg;
        } host_work;            /* a library's work on a stream (nccl_api.h) */
    };
    int event;                  /* W_RECORD, W_WAIT; W_MARK: the mark */
    size_t after;               /* W_WAIT: queue position + 1 of the record it waits for; 0: none */
    uint64_t number;            /* of the work ever queued, from 1 */
    bool ran;
} Work;

/* Work kept by a capture, to be queued again by each launch. */
typedef struct Graph {
    Work *work;
    size_t count, cap;
} Graph;

typedef struct Pinned {
    void *p;
    size_t bytes;
} Pinned;

typedef struct Emulator {
    unsigned char *base;        /* the reserved device range */
    size_t used, open_bytes;    /* allocated; readable and writable now */
    Work *work;
    size_t nwork, done, cap;     /* done: the work before it has all run */
    size_t recorded[DDP_EVENTS]; /* queue position + 1 of each event's last record; 0: never */
    /* For event_done from any thread (atomic): work ever queued, and the number of
     * each event's last record queued and of its last record run. */
    uint64_t queued_total, record_queued[DDP_EVENTS], record_ran[DDP_EVENTS];
    ddp_emulated_stream native[DDP_STREAMS];
    size_t *marked;             /* the same for each timing mark */
    double *mark_time;          /* seconds, when each mark's work ran */
    Pinned *pinned;
    int npinned;
    unsigned char *shared;      /* one block's shared memory */
    unsigned char *stacks;      /* one coroutine stack per thread of a block */
    struct Thread *team;        /* a block's threads, as coroutines */
    int capturing;              /* the stream being captured; -1: none */
    bool capture_spoiled;       /* something refused during the capture: it cannot end well */
    Graph capture;              /* the work captured so far */
    Graph graphs[DDP_GRAPHS];
} Emulator;

/* ----------------------------------------------------------- the builtins */

/* A coroutine's saved place. On x86-64 a switch saves the callee-saved registers on
 * the stack it leaves and takes the other's stack pointer: a few instructions, where
 * swapcontext makes a system call for the signal mask at every barrier of every
 * thread. Elsewhere, ucontext. */
#ifdef __x86_64__
typedef struct Context {
    void *sp;
} Context;

void ddp_emulator_switch(Context *from, Context *to);
__asm__(".text\n"
        ".globl ddp_emulator_switch\n"
        ".type ddp_emulator_switch, @function\n"
        "ddp_emulator_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq (%rsi), %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size ddp_emulator_switch, .-ddp_emulator_switch\n");

/* A stack whose first switch "returns" into entry as if it had been called. */
static void context_start(Context *c, unsigned char *stack, size_t size, void (*entry)(void)) {
    uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = NULL;               /* entry's own return address: it never returns */
    *--sp = (void *)entry;
    for (int r = 0; r < 6; r++) /* rbp, rbx, r12..r15 */
        *--sp = NULL;
    c->sp = sp;
}

static void context_switch(Context *from, Context *to) {
    ddp_emulator_switch(from, to);
}
#else
typedef ucontext_t Context;

static void context_start(Context *c, unsigned char *stack, size_t size, void (*entry)(void)) {
    getcontext(c);
    c->uc_stack.ss_sp = stack;
    c->uc_stack.ss_size = size;
    c->uc_link = NULL;
    makecontext(c, entry, 0);
}

static void context_switch(Context *from, Context *to) {
    swapcontext(from, to);
}
#endif

typedef struct Thread {
    Context context;
    int state;                  /* RUNNING, AT_BARRIER or DONE */
} Thread;
enum { RUNNING, AT_BARRIER, DONE };

/* The launch being run, and the thread within it, as the kernels' builtins see them:
 * each host thread's own, as a process with several emulated GPUs runs each from one. */
static __thread struct {
    ddp_kernel_fn fn;
    void *const *args;
    const ddp_scalar *scalars;
    int64_t begin, end;
    uint32_t block, grid, threads, thread;
    unsigned char *shared;
    bool cooperative;           /* each thread a coroutine: barriers allowed */
    Thread *team;
    Context scheduler;
    const char *kernel_name;
    bool barrier_misuse;
#ifdef EMULATOR_ASAN
    void *fake_stack;
    const void *scheduler_bottom;
    size_t scheduler_size;
#endif
} cur;

uint32_t ddp_gpu_block(void) {
    return cur.block;
}

uint32_t ddp_gpu_blocks(void) {
    return cur.grid;
}

uint32_t ddp_gpu_threads(void) {
    return cur.threads;
}

uint32_t ddp_gpu_thread(void) {
    return cur.thread;
}

void *ddp_gpu_shared(void) {
    return cur.shared;
}

/* A GPU's cvt.rn.bf16.f32: to nearest, ties to even (a NaN stays NaN). */
uint16_t ddp_gpu_bf16(float x) {
    return ddp_bf16_from_float(x);
}

static void switch_to_scheduler(void) {
#ifdef EMULATOR_ASAN
    __sanitizer_start_switch_fiber(&cur.fake_stack, cur.scheduler_bottom, cur.scheduler_size);
#endif
    context_switch(&cur.team[cur.thread].context, &cur.scheduler);
#ifdef EMULATOR_ASAN
    __sanitizer_finish_switch_fiber(cur.fake_stack, NULL, NULL);
#endif
}

void ddp_gpu_barrier(void) {
    if (!cur.cooperative) { /* an index launch has no block to meet */
        cur.barrier_misuse = true;
        return;
    }
    cur.team[cur.thread].state = AT_BARRIER;
    switch_to_scheduler();
}

static void thread_main(void) {
#ifdef EMULATOR_ASAN
    __sanitizer_finish_switch_fiber(NULL, &cur.scheduler_bottom, &cur.scheduler_size);
#endif
    cur.fn(cur.args, cur.scalars, cur.begin, cur.end);
    cur.team[cur.thread].state = DONE;
    switch_to_scheduler();
}

/* ------------------------------------------------------------- memory */

static Emulator *emulator(ddp_device *d) {
    return d->state;
}

/* Device memory readable and writable while queued work runs, and only then. In whole
 * huge pages: each copy and synchronisation opens and closes all of it, and the kernel
 * then changes one entry for 2 MB instead of 512 (ResNet-50's check spent nine tenths
 * of its time there). */
static void open_memory(Emulator *e) {
    size_t bytes = (e->used + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
    if (bytes && mprotect(e->base, bytes, PROT_READ | PROT_WRITE) == 0)
        e->open_bytes = bytes;
}

static void close_memory(Emulator *e) {
    if (e->open_bytes)
        mprotect(e->base, e->open_bytes, PROT_NONE);
    e->open_bytes = 0;
}

/* The device's range, reserved unreadable, starting on a huge page and asking for them
 * (where the kernel gives none, only the opening and closing is slower). */
static unsigned char *reserve_device_range(void) {
    unsigned char *at = mmap(NULL, RESERVE + HUGE_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (at == MAP_FAILED)
        return NULL;
    size_t head = (size_t)(-(uintptr_t)at & (HUGE_PAGE - 1));
    if (head)
        munmap(at, head);
    munmap(at + head + RESERVE, HUGE_PAGE - head);
#ifdef MADV_HUGEPAGE
    madvise(at + head, RESERVE, MADV_HUGEPAGE);
#endif
    return at + head;
}

/* Every open device's reserved range, for the fault handler (a slot is free at 0). */
enum { MAX_DEVICES = 64 };
static const unsigned char *device_ranges[MAX_DEVICES];

static bool in_device_range(const unsigned char *at) {
    for (int i = 0; i < MAX_DEVICES; i++) {
        const unsigned char *lo = __atomic_load_n(&device_ranges[i], __ATOMIC_ACQUIRE);
        if (lo && at >= lo && at < lo + RESERVE)
            return true;
    }
    return false;
}

static bool claim_range(const unsigned char *base) {
    for (int i = 0; i < MAX_DEVICES; i++) {
        const unsigned char *none = NULL;
        if (__atomic_compare_exchange_n(&device_ranges[i], &none, base, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return true;
    }
    return false;
}

static void release_range(const unsigned char *base) {
    for (int i = 0; i < MAX_DEVICES; i++) {
        const unsigned char *mine = base;
        if (__atomic_compare_exchange_n(&device_ranges[i], &mine, NULL, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return;
    }
}

/* Host code that touched device memory: the bug is a copy left out. */
static void on_segv(int sig, siginfo_t *info, void *context) {
    (void)context;
    const unsigned char *at = info->si_addr;
    if (in_device_range(at)) {
        static const char msg[] = "ddp emulated GPU: host code read or wrote device memory (a copy to or from the "
                                  "device is missing, or a result was used before its synchronisation)\n";
        (void)!write(2, msg, sizeof msg - 1);
        _exit(70);
    }
    signal(sig, SIG_DFL); /* not ours: the default action, when the access repeats */
}

static bool pinned(Emulator *e, const void *p, size_t bytes) {
    for (int i = 0; i < e->npinned; i++)
        if ((const char *)p >= (const char *)e->pinned[i].p &&
            (const char *)p + bytes <= (const char *)e->pinned[i].p + e->pinned[i].bytes)
            return true;
    return false;
}

/* Whether [p, p + bytes) lies in allocated device memory. */
static bool on_device(Emulator *e, ddp_dptr p, size_t bytes) {
    const unsigned char *a = (const unsigned char *)(uintptr_t)p;
    return a >= e->base && a + bytes <= e->base + e->used && a + bytes >= a;
}

/* --------------------------------------------------------------- the queue */

static bool append(ddp_device *d, Work **list, size_t *count, size_t *cap, Work w) {
    if (*count == *cap) {
        size_t grown_cap = *cap ? 2 * *cap : 256;
        Work *grown = realloc(*list, grown_cap * sizeof *grown);
        if (!grown)
            return ddp_device_fail(d, "out of memory for the emulated device's queue");
        *list = grown, *cap = grown_cap;
    }
    (*list)[(*count)++] = w;
    return true;
}

/* Work for the queue, or for the capture when its stream is being captured. A wait
 * waits for the event's record queued last before it, as cuStreamWaitEvent does. */
static bool enqueue(ddp_device *d, Work w) {
    Emulator *e = emulator(d);
    if (e->capturing == w.stream)
        return append(d, &e->capture.work, &e->capture.count, &e->capture.cap, w);
    w.number = e->queued_total + 1;
    w.after = w.kind == W_WAIT ? e->recorded[w.event] : 0;
    w.ran = false;
    if (!append(d, &e->work, &e->nwork, &e->cap, w))
        return false;
    e->queued_total++;
    if (w.kind == W_RECORD) {
        e->recorded[w.event] = e->nwork;
        __atomic_store_n(&e->record_queued[w.event], w.number, __ATOMIC_RELEASE);
    }
    return true;
}

/* What CUDA refuses while `stream` (or, stream -1, any stream) is being captured:
 * refused, and the capture spoiled, as cudaErrorStreamCaptureUnsupported. */
static bool refused_in_capture(ddp_device *d, int stream, const char *what) {
    Emulator *e = emulator(d);
    if (e->capturing < 0 || (stream >= 0 && stream != e->capturing))
        return false;
    e->capture_spoiled = true;
    ddp_device_fail(d, "%s while stream %d is being captured into a CUDA graph: operation not permitted when "
                       "stream is capturing", what, e->capturing);
    return true;
}

static bool run_launch(ddp_device *d, const Work *w);
static bool run_gemm(ddp_device *d, const ddp_device_gemm *g);
static void run_conv(const ddp_device_conv *c);

static bool run_work(ddp_device *d, Work *w) {
    void *to = (void *)(uintptr_t)w->to;
    const void *from = (const void *)(uintptr_t)w->from;
    switch (w->kind) {
    case W_UPLOAD: memcpy(to, w->host, w->bytes); break;
    case W_DOWNLOAD: memcpy(w->host, from, w->bytes); break;
    case W_COPY: memmove(to, from, w->bytes); break;
    case W_FILL: memset(to, w->byte, w->bytes); break;
    case W_LAUNCH: return run_launch(d, w);
    case W_GEMM: return run_gemm(d, &w->gemm);
    case W_CONV: run_conv(&w->conv); break;
    case W_MARK: emulator(d)->mark_time[w->event] = ddp_trace_clock() / 1e6; break;
    case W_HOST: w->host_work.run(w->host_work.arg); break;
    case W_RECORD: case W_WAIT: break;
    }
    return true;
}

static bool run_one(ddp_device *d, size_t i) {
    Emulator *e = emulator(d);
    Work *w = &e->work[i];
    bool ok = run_work(d, w);
    w->ran = true;
    if (w->kind == W_RECORD && w->number > __atomic_load_n(&e->record_ran[w->event], __ATOMIC_ACQUIRE))
        __atomic_store_n(&e->record_ran[w->event], w->number, __ATOMIC_RELEASE);
    if (w->snapshot)
        free(w->host);
    w->snapshot = false;
    return ok;
}

/* Runs the work at queue position i once what it follows has run: the work queued
 * before it on its stream, and for each wait among them the record it waits for,
 * with what that follows in turn. Nothing else: the other streams' work waits. */
static bool run_through(ddp_device *d, size_t i) {
    Emulator *e = emulator(d);
    int stream = e->work[i].stream;
    for (size_t j = e->done; j <= i; j++) {
        Work *w = &e->work[j];
        if (w->ran || w->stream != stream)
            continue;
        if (w->kind == W_WAIT && w->after && !e->work[w->after - 1].ran && !run_through(d, w->after - 1))
            return false;
        if (!run_one(d, j))
            return false;
    }
    return true;
}

/* Runs the work at queue position upto - 1 and what it follows (run_through); upto 0:
 * nothing. The queue starts over once all of it has run. */
static bool run_until(ddp_device *d, size_t upto) {
    Emulator *e = emulator(d);
    open_memory(e);
    bool ok = upto == 0 || e->work[upto - 1].ran || run_through(d, upto - 1);
    close_memory(e);
    while (e->done < e->nwork && e->work[e->done].ran)
        e->done++;
    if (e->done == e->nwork) { /* everything ran: the queue starts over */
        e->done = e->nwork = 0;
        for (int i = 0; i < DDP_EVENTS; i++)
            e->recorded[i] = 0;
        if (e->marked)
            memset(e->marked, 0, DDP_MARKS * sizeof *e->marked);
    }
    return ok;
}

/* ------------------------------------------------------------ launches */

static bool run_block(ddp_device *d, const Work *w, Emulator *e) {
    memset(cur.shared, 0xff, w->shared); /* NaN: what a block finds there is garbage */
    if (!cur.cooperative) {
        for (uint32_t t = 0; t < w->threads; t++) {
            cur.thread = t;
            cur.fn(cur.args, cur.scalars, cur.begin, cur.end);
        }
        if (cur.barrier_misuse)
            return ddp_device_fail(d, "kernel %s met a barrier, but it was launched as an index launch, without "
                                      "a block's cooperation", cur.kernel_name);
        return true;
    }
    for (uint32_t t = 0; t < w->threads; t++) {
        Thread *th = &cur.team[t];
        context_start(&th->context, e->stacks + (size_t)t * STACK, STACK, thread_main);
        th->state = RUNNING;
    }
    for (;;) {
        int at_barrier = 0, done = 0;
        for (uint32_t t = 0; t < w->threads; t++) {
            if (cur.team[t].state == DONE) {
                done++;
                continue;
            }
            cur.thread = t;
            cur.team[t].state = RUNNING;
#ifdef EMULATOR_ASAN
            __sanitizer_start_switch_fiber(&cur.fake_stack, e->stacks + (size_t)t * STACK, STACK);
#endif
            context_switch(&cur.scheduler, &cur.team[t].context);
#ifdef EMULATOR_ASAN
            __sanitizer_finish_switch_fiber(cur.fake_stack, NULL, NULL);
#endif
            if (cur.team[t].state == AT_BARRIER)
                at_barrier++;
            else
                done++;
        }
        if (done == (int)w->threads)
            return true;
        if (at_barrier != (int)w->threads)
            return ddp_device_fail(d, "kernel %s, block %u: %d of its %u threads wait at a barrier the others never "
                                      "reach (the GPU would hang or go wrong)", cur.kernel_name, cur.block,
                                   at_barrier, w->threads);
    }
}

static bool run_launch(ddp_device *d, const Work *w) {
    Emulator *e = emulator(d);
    const ddp_program *p = d->program;
    cur.fn = p->gpu_emulated[w->kernel];
    cur.args = (void *const *)(uintptr_t)w->args;
    cur.scalars = (const ddp_scalar *)(uintptr_t)w->scalars;
    cur.begin = w->begin, cur.end = w->end;
    cur.grid = w->grid, cur.threads = w->threads;
    cur.shared = e->shared;
    cur.kernel_name = p->kernels[w->kernel].name;
    cur.cooperative = p->kernels[w->kernel].launch == DDP_LAUNCH_BLOCK;
    cur.barrier_misuse = false;
    cur.team = e->team;
    bool ok = true;
    for (uint32_t b = 0; ok && b < w->grid; b++) {
        cur.block = b;
        ok = run_block(d, w, e);
    }
    cur.team = NULL;
    return ok;
}

static bool launch(ddp_device *d, int stream, int64_t k, uint32_t grid, uint32_t threads, uint32_t shared,
                   ddp_dptr args, ddp_dptr scalars, int64_t begin, int64_t end) {
    const ddp_program *p = d->program;
    if (k < 0 || k >= p->nkernels || !p->gpu_emulated || !p->gpu_emulated[k])
        return ddp_device_fail(d, "no kernel %lld in the program's GPU module", (long long)k);
    const char *name = p->kernels[k].name;
    if (grid == 0 || threads == 0)
        return ddp_device_fail(d, "kernel %s launched with %u blocks of %u threads: the GPU refuses a launch of "
                                  "nothing (invalid argument)", name, grid, threads);
    if (threads > DDP_MAX_BLOCK_THREADS)
        return ddp_device_fail(d, "kernel %s launched with %u threads a block: at most %d (invalid argument)", name,
                               threads, DDP_MAX_BLOCK_THREADS);
    if (shared > DDP_MAX_SHARED_BYTES)
        return ddp_device_fail(d, "kernel %s asks for %u bytes of shared memory a block: at most %d without "
                                  "opting in (too many resources requested for launch)", name, shared,
                               DDP_MAX_SHARED_BYTES);
    Emulator *e = emulator(d);
    if (!on_device(e, args, sizeof(void *)) || !on_device(e, scalars, sizeof(ddp_scalar) * DDP_S_COUNT))
        return ddp_device_fail(d, "kernel %s launched with host addresses for its arguments or scalars: they must "
                                  "be in device memory", name);
    Work w = {.kind = W_LAUNCH, .stream = stream, .kernel = k, .grid = grid, .threads = threads, .shared = shared,
              .args = args, .scalars = scalars, .begin = begin, .end = end};
    return enqueue(d, w);
}

/* ----------------------------------------------------------------- GEMM */

float ddp_tf32_round(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    if ((bits & 0x7f800000u) != 0x7f800000u) /* finite: a carry into the exponent is the right rounding */
        bits = (bits + 0x1000u) & 0xffffe000u;
    memcpy(&x, &bits, 4);
    return x;
}

/* cuBLAS's column-major gemm, with its argument checks. */
static bool run_gemm(ddp_device *d, const ddp_device_gemm *g) {
    int rows_a = g->transa ? g->k : g->m, rows_b = g->transb ? g->n : g->k;
    if (g->m < 0 || g->n < 0 || g->k < 0 || g->lda < (rows_a > 1 ? rows_a : 1) ||
        g->ldb < (rows_b > 1 ? rows_b : 1) || g->ldc < (g->m > 1 ? g->m : 1))
        return ddp_device_fail(d, "gemm(%s, %s, m %d, n %d, k %d, lda %d, ldb %d, ldc %d): CUBLAS_STATUS_INVALID_VALUE "
                                  "(a leading dimension is smaller than its operand's rows)",
                               g->transa ? "T" : "N", g->transb ? "T" : "N", g->m, g->n, g->k, g->lda, g->ldb, g->ldc);
    Emulator *e = emulator(d);
    size_t width = g->f64 ? 8 : g->bf16 ? 2 : 4, width_c = g->f64 ? 8 : g->c_bf16 ? 2 : 4;
    size_t span_a = (size_t)g->lda * (size_t)((g->transa ? g->m : g->k) - 1) + (size_t)rows_a;
    size_t span_b = (size_t)g->ldb * (size_t)((g->transb ? g->k : g->n) - 1) + (size_t)rows_b;
    size_t span_c = (size_t)g->ldc * (size_t)(g->n - 1) + (size_t)g->m;
    if (g->batch > 1) { /* the last product's operands end furthest on */
        if (g->stride_a < 0 || g->stride_b < 0 || g->stride_c < 0)
            return ddp_device_fail(d, "gemmStridedBatched: a negative stride: CUBLAS_STATUS_INVALID_VALUE");
        span_a += (size_t)g->stride_a * (size_t)(g->batch - 1);
        span_b += (size_t)g->stride_b * (size_t)(g->batch - 1);
        span_c += (size_t)g->stride_c * (size_t)(g->batch - 1);
    }
    if (g->m && g->n && ((g->k && (!on_device(e, g->a, span_a * width) || !on_device(e, g->b, span_b * width))) ||
                         !on_device(e, g->c, span_c * width_c)))
        return ddp_device_fail(d, "gemm: an operand lies outside device memory (m %d, n %d, k %d)", g->m, g->n, g->k);
    if (!ddp_gemm_reference(g, d->program->settings.precision == DDP_PRECISION_TF32))
        return ddp_device_fail(d, "gemm: no memory for the emulated product (m %d, n %d, k %d)", g->m, g->n, g->k);
    return true;
}

static bool gemm(ddp_device *d, int stream, const ddp_device_gemm *g) {
    Work w = {.kind = W_GEMM, .stream = stream, .gemm = *g};
    return enqueue(d, w);
}

/* --------------------------------------------------------- copies, events */

static bool check_range(ddp_device *d, ddp_dptr p, size_t bytes, const char *what) {
    if (bytes == 0 || on_device(emulator(d), p, bytes))
        return true;
    return ddp_device_fail(d, "%s: %zu bytes at %#llx are not device memory (a host address, or past an "
                              "allocation)", what, bytes, (unsigned long long)p);
}

static bool upload(ddp_device *d, int stream, ddp_dptr to, const void *from, size_t bytes) {
    if (!check_range(d, to, bytes, "a copy to the device"))
        return false;
    Emulator *e = emulator(d);
    if (!pinned(e, from, bytes) && refused_in_capture(d, stream, "a copy from pageable host memory"))
        return false;
    Work w = {.kind = W_UPLOAD, .stream = stream, .to = to, .bytes = bytes, .host = (void *)from};
    if (!pinned(e, from, bytes)) { /* ordinary memory is copied at once, as CUDA stages it */
        w.host = malloc(bytes ? bytes : 1);
        if (!w.host)
            return ddp_device_fail(d, "out of memory staging a copy to the device");
        memcpy(w.host, from, bytes);
        w.snapshot = true;
    }
    return enqueue(d, w);
}

/* A copy from pinned memory still queued reads it when it runs; a copy to the host
 * queued after it lands after it on a GPU, so before the destination is poisoned
 * below, the earlier copies take what they will read. */
static bool keep_pending_sources(ddp_device *d, const void *to, size_t bytes) {
    Emulator *e = emulator(d);
    const char *lo = to, *hi = lo + bytes;
    for (size_t i = e->done; i < e->nwork; i++) {
        Work *w = &e->work[i];
        const char *src = w->host;
        if (w->ran || w->kind != W_UPLOAD || w->snapshot || src >= hi || src + w->bytes <= lo)
            continue;
        void *copy = malloc(w->bytes ? w->bytes : 1);
        if (!copy)
            return ddp_device_fail(d, "out of memory staging a copy to the device");
        memcpy(copy, src, w->bytes);
        w->host = copy;
        w->snapshot = true;
    }
    return true;
}

static bool download(ddp_device *d, int stream, void *to, ddp_dptr from, size_t bytes) {
    if (!check_range(d, from, bytes, "a copy to the host") || !keep_pending_sources(d, to, bytes))
        return false;
    if (!pinned(emulator(d), to, bytes) && refused_in_capture(d, stream, "a copy to pageable host memory"))
        return false;
    memset(to, 0xff, bytes); /* what is read before the synchronisation is NaN */
    Work w = {.kind = W_DOWNLOAD, .stream = stream, .from = from, .bytes = bytes, .host = to};
    return enqueue(d, w);
}

static bool copy(ddp_device *d, int stream, ddp_dptr to, ddp_dptr from, size_t bytes) {
    if (!check_range(d, to, bytes, "a copy on the device") || !check_range(d, from, bytes, "a copy on the device"))
        return false;
    Work w = {.kind = W_COPY, .stream = stream, .to = to, .from = from, .bytes = bytes};
    return enqueue(d, w);
}

static bool fill(ddp_device *d, int stream, ddp_dptr to, unsigned char byte, size_t bytes) {
    if (!check_range(d, to, bytes, "a fill"))
        return false;
    Work w = {.kind = W_FILL, .stream = stream, .to = to, .bytes = bytes, .byte = byte};
    return enqueue(d, w);
}

static bool record(ddp_device *d, int stream, int event) {
    if (event < 0 || event >= DDP_EVENTS)
        return ddp_device_fail(d, "no event %d", event);
    if (refused_in_capture(d, stream, "an event recorded"))
        return false;
    Work w = {.kind = W_RECORD, .stream = stream, .event = event};
    return enqueue(d, w);
}

static bool wait_event(ddp_device *d, int stream, int event) {
    if (refused_in_capture(d, stream, "a wait for an event recorded outside the capture"))
        return false;
    Work w = {.kind = W_WAIT, .stream = stream, .event = event};
    return enqueue(d, w);
}

static bool synchronize_event(ddp_device *d, int event) {
    Emulator *e = emulator(d);
    if (event < 0 || event >= DDP_EVENTS)
        return ddp_device_fail(d, "no event %d", event);
    if (refused_in_capture(d, -1, "an event synchronisation"))
        return false;
    return e->recorded[event] == 0 || run_until(d, e->recorded[event]);
}

/* Everything: the copy and communication streams first, each as far as its waits
 * allow, then the compute stream. */
static bool synchronize(ddp_device *d) {
    Emulator *e = emulator(d);
    if (refused_in_capture(d, -1, "a device synchronisation"))
        return false;
    static const int order[] = {DDP_STREAM_UPLOAD, DDP_STREAM_COMM, DDP_STREAM_COMPUTE};
    _Static_assert(sizeof order / sizeof *order == DDP_STREAMS, "every stream, in the order they run");
    for (size_t k = 0; k < DDP_STREAMS; k++) {
        size_t last = 0;
        for (size_t i = e->done; i < e->nwork; i++)
            if (e->work[i].stream == order[k])
                last = i + 1;
        if (!run_until(d, last))
            return false;
    }
    return true;
}

static int event_done(ddp_device *d, int event) {
    Emulator *e = emulator(d);
    if (event < 0 || event >= DDP_EVENTS)
        return -1;
    return __atomic_load_n(&e->record_ran[event], __ATOMIC_ACQUIRE) >=
           __atomic_load_n(&e->record_queued[event], __ATOMIC_ACQUIRE);
}

/* ------------------------------------------------------- native streams */

/* A library's work (the stand-in NCCL's collectives) queued on an emulated stream:
 * refused while the stream is captured, as nothing here replays it. */
static int native_enqueue(ddp_emulated_stream *s, void (*run)(void *arg), void *arg) {
    ddp_device *d = s->device;
    if (refused_in_capture(d, s->stream, "a library's work queued"))
        return -1;
    Work w = {.kind = W_HOST, .stream = s->stream, .host_work = {run, arg}};
    return enqueue(d, w) ? 0 : -1;
}

static int native_on_device(ddp_emulated_stream *s, const void *p, size_t bytes) {
    return on_device(emulator(s->device), (ddp_dptr)(uintptr_t)p, bytes);
}

static void *native_stream(ddp_device *d, int stream) {
    return stream >= 0 && stream < DDP_STREAMS ? &emulator(d)->native[stream] : NULL;
}

/* ----------------------------------------------------------- convolutions */

/* The workspace is the library's scratch: cuDNN leaves what it likes there, so the
 * stand-in leaves NaN, and a value kept there, or judged there, shows. */
static void run_conv(const ddp_device_conv *c) {
    if (c->workspace && c->workspace_bytes)
        memset((void *)(uintptr_t)c->workspace, 0xff, c->workspace_bytes);
    ddp_conv_reference(c, (void *)(uintptr_t)c->x, (void *)(uintptr_t)c->filters, (void *)(uintptr_t)c->y);
}

/* The bytes of the convolution's image, filters and output, in that order. */
static void conv_extents(const ddp_device_conv *c, size_t bytes[3]) {
    const int dims[3][4] = {{c->n, c->h, c->w, c->c}, {c->k, c->r, c->s, c->c}, {c->n, c->oh, c->ow, c->k}};
    for (int t = 0; t < 3; t++) {
        bytes[t] = c->f64 ? 8 : c->bf16 ? 2 : 4;
        for (int i = 0; i < 4; i++)
            bytes[t] *= (size_t)dims[t][i];
    }
}

/* cuDNN's checks, made when the call is made, as cuDNN makes them: the descriptor,
 * then every tensor's whole extent and the workspace in device memory. */
/* DDP_EMULATED_CONV_ENGINES=none: the emulated cuDNN has no engine for any
 * convolution, as cuDNN may have none for a shape (the runtime then gives the library
 * up at the start; with --convolutions library the run fails, saying so). */
static bool conv(ddp_device *d, int stream, const ddp_device_conv *c) {
    char why[512], what[96];
    if (!ddp_conv_check(c, why, sizeof why))
        return ddp_device_fail(d, "%s", why);
    const char *engines = getenv("DDP_EMULATED_CONV_ENGINES");
    if (engines && strcmp(engines, "none") == 0)
        return ddp_device_fail(d, "convolution: the emulated cuDNN has no engine for it (DDP_EMULATED_CONV_ENGINES=none)");
    static const char *const names[4] = {"image", "filters", "output", "workspace"};
    const ddp_dptr at[4] = {c->x, c->filters, c->y, c->workspace};
    size_t bytes[4] = {0, 0, 0, c->workspace_bytes};
    conv_extents(c, bytes);
    for (int t = 0; t < 4; t++) {
        snprintf(what, sizeof what, "convolution: CUDNN_STATUS_BAD_PARAM: its %s", names[t]);
        if (!check_range(d, at[t], bytes[t], what))
            return false;
    }
    if (c->planning) /* its output is never read: the reference's minutes for a large model spared */
        return true;
    Work w = {.kind = W_CONV, .stream = stream, .conv = *c};
    return enqueue(d, w);
}

/* ------------------------------------------------------------- timing */

static bool mark(ddp_device *d, int stream, int i) {
    Emulator *e = emulator(d);
    if (i < 0 || i >= DDP_MARKS)
        return ddp_device_fail(d, "no timing mark %d", i);
    if (!e->marked && (!(e->marked = calloc(DDP_MARKS, sizeof *e->marked)) ||
                       !(e->mark_time = calloc(DDP_MARKS, sizeof *e->mark_time))))
        return ddp_device_fail(d, "out of memory for timing marks");
    if (refused_in_capture(d, stream, "a timing mark"))
        return false;
    Work w = {.kind = W_MARK, .stream = stream, .event = i};
    if (!enqueue(d, w))
        return false;
    e->marked[i] = e->nwork;
    return true;
}

static bool elapsed(ddp_device *d, int from, int to, double *seconds) {
    Emulator *e = emulator(d);
    if (from < 0 || to < 0 || from >= DDP_MARKS || to >= DDP_MARKS || !e->marked)
        return ddp_device_fail(d, "no timing marks %d, %d", from, to);
    if (refused_in_capture(d, -1, "waiting for a timing mark") || (e->marked[to] && !run_until(d, e->marked[to])))
        return false;
    *seconds = e->mark_time[to] - e->mark_time[from];
    return true;
}

/* --------------------------------------------------------------- graphs */

static void free_graph(Graph *g) {
    free(g->work);
    *g = (Graph){0};
}

static bool capture_begin(ddp_device *d, int stream) {
    Emulator *e = emulator(d);
    if (e->capturing >= 0)
        return ddp_device_fail(d, "stream %d: a capture begun while stream %d is being captured", stream,
                               e->capturing);
    e->capturing = stream;
    e->capture_spoiled = false;
    free_graph(&e->capture);
    return true;
}

static bool capture_end(ddp_device *d, int stream, int graph) {
    Emulator *e = emulator(d);
    if (e->capturing != stream || graph < 0 || graph >= DDP_GRAPHS)
        return ddp_device_fail(d, "stream %d: the end of a capture never begun (graph %d)", stream, graph);
    e->capturing = -1;
    if (e->capture_spoiled) {
        free_graph(&e->capture);
        return ddp_device_fail(d, "the capture failed: an operation it cannot hold was queued "
                                  "(cudaErrorStreamCaptureInvalidated)");
    }
    free_graph(&e->graphs[graph]);
    e->graphs[graph] = e->capture;
    e->capture = (Graph){0};
    return true;
}

/* The captured work queued again as it was; a copy to the host poisons its
 * destination now, as when it was first queued. */
static bool graph_launch(ddp_device *d, int stream, int graph) {
    Emulator *e = emulator(d);
    if (graph < 0 || graph >= DDP_GRAPHS || !e->graphs[graph].work)
        return ddp_device_fail(d, "graph %d launched, never captured", graph);
    if (refused_in_capture(d, stream, "a graph launched"))
        return false;
    const Graph *g = &e->graphs[graph];
    for (size_t i = 0; i < g->count; i++) {
        Work w = g->work[i];
        w.stream = stream;
        if (w.kind == W_DOWNLOAD)
            memset(w.host, 0xff, w.bytes);
        if (!enqueue(d, w))
            return false;
    }
    return true;
}

/* --------------------------------------------------------- allocations */

static bool alloc(ddp_device *d, size_t bytes, ddp_dptr *p) {
    Emulator *e = emulator(d);
    size_t at = (e->used + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    if (bytes > RESERVE - at)
        return ddp_device_fail(d, "out of device memory: %zu bytes asked, %zu left", bytes, (size_t)RESERVE - at);
    e->used = at + (bytes ? bytes : 1);
    *p = (ddp_dptr)(uintptr_t)(e->base + at);
    return true;
}

static void *host_alloc(ddp_device *d, size_t bytes) {
    Emulator *e = emulator(d);
    Pinned *grown = realloc(e->pinned, sizeof *grown * (size_t)(e->npinned + 1));
    if (!grown)
        return NULL;
    e->pinned = grown;
    void *p = calloc(1, bytes ? bytes : 1);
    if (p)
        e->pinned[e->npinned++] = (Pinned){p, bytes};
    return p;
}

static void host_free(ddp_device *d, void *p) {
    Emulator *e = emulator(d);
    for (int i = 0; i < e->npinned; i++)
        if (e->pinned[i].p == p) {
            e->pinned[i] = e->pinned[--e->npinned];
            break;
        }
    free(p);
}

static void close_device(ddp_device *d) {
    Emulator *e = emulator(d);
    if (!e)
        return;
    for (size_t i = e->done; i < e->nwork; i++)
        if (e->work[i].snapshot)
            free(e->work[i].host);
    free(e->work);
    free(e->marked);
    free(e->mark_time);
    free_graph(&e->capture);
    for (int g = 0; g < DDP_GRAPHS; g++)
        free_graph(&e->graphs[g]);
    for (int i = 0; i < e->npinned; i++)
        free(e->pinned[i].p);
    free(e->pinned);
    if (e->base)
        munmap(e->base, RESERVE);
    if (e->stacks)
        munmap(e->stacks, (size_t)DDP_MAX_BLOCK_THREADS * STACK);
    free(e->shared);
    free(e->team);
    if (e->base)
        release_range(e->base);
    free(e);
}

static const ddp_device_backend emulated_backend = {
    "emulated", close_device, alloc, host_alloc, host_free, upload, download, copy, fill, launch, gemm,
    record, wait_event, synchronize_event, synchronize, capture_begin, capture_end, graph_launch,
    mark, elapsed, conv, native_stream, event_done, true,
};

bool ddp_device_open_emulated(const ddp_program *p, ddp_device **out, char *err, size_t len) {
    *out = NULL;
    if (!&ddp_gpu_module_hash || !p->gpu_emulated)
        return ddp_fail(err, len, "--device emulated: this program holds no GPU code for the emulated device; "
                                  "build it again with this ddpc");
    if (ddp_gpu_module_hash != p->gpu_hash)
        return ddp_fail(err, len, "--device emulated: the emulated kernels (GPU module %016llx) are not those of "
                                  "the program's PTX (%016llx): the program is damaged; build it again",
                        (unsigned long long)ddp_gpu_module_hash, (unsigned long long)p->gpu_hash);
    ddp_device *d = calloc(1, sizeof *d);
    Emulator *e = calloc(1, sizeof *e);
    if (!d || !e) {
        free(d);
        free(e);
        return ddp_fail(err, len, "out of memory");
    }
    d->ops = &emulated_backend;
    d->program = p;
    d->state = e;
    e->capturing = -1;
    for (int s = 0; s < DDP_STREAMS; s++)
        e->native[s] = (ddp_emulated_stream){DDP_EMULATED_STREAM_MAGIC, d, s, native_enqueue, native_on_device};
    e->base = reserve_device_range();
    e->stacks = mmap(NULL, (size_t)DDP_MAX_BLOCK_THREADS * STACK, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    e->shared = malloc(DDP_MAX_SHARED_BYTES);
    e->team = calloc(DDP_MAX_BLOCK_THREADS, sizeof *e->team);
    if (!e->base || e->stacks == MAP_FAILED || !e->shared || !e->team) {
        if (e->stacks == MAP_FAILED)
            e->stacks = NULL;
        close_device(d);
        free(d);
        return ddp_fail(err, len, "--device emulated: cannot reserve the emulated device's memory");
    }
    if (!claim_range(e->base)) {
        close_device(d);
        free(d);
        return ddp_fail(err, len, "--device emulated: more than %d emulated devices at once", MAX_DEVICES);
    }
    struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    snprintf(d->info.name, sizeof d->info.name, "ddp emulated GPU (the GPU module on this CPU)");
    snprintf(d->info.uuid, sizeof d->info.uuid, "EMU-%016llx", (unsigned long long)p->gpu_hash);
    snprintf(d->info.bus, sizeof d->info.bus, "none");
    snprintf(d->convolutions, sizeof d->convolutions, "the emulated device's reference convolution");
    d->info.free_bytes = d->info.total_bytes = (int64_t)RESERVE;
    *out = d;
    return true;
}
