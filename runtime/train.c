/* train.c: the training loop of a train block, top to bottom: for each epoch, the
 * order of its samples, then for each step the next batch, forward, backward, a check
 * that the loss and every gradient are finite, the optimizer; validation when the
 * program asks; the figures of each epoch; the parameters saved at the end.
 *
 * Figures come from the kernels' (sum, count) accumulators, zeroed at each epoch's
 * start, so an epoch's loss is the mean over every sample it trained on. Validation
 * runs the evaluation phase (batch normalisation on running statistics, no dropout)
 * on every validation sample, the last batch kept whatever its size.
 *
 * With several workers (S1) each trains on its shard of every global batch; the
 * gradients (bucket by bucket, by the communication thread while backward runs), and
 * the accumulators behind every figure, are summed over the ring before anyone looks
 * at them, so every worker takes the same decisions (S11, S12); batch normalisation's
 * running statistics are averaged before validation and saving; only worker 0 prints
 * and writes files. With --trace every phase of every step is a span, and worker 0
 * gathers every worker's spans into the file at the end. With --profile the executor
 * times each call of the schedule, this loop each step and its waits for data and
 * for the other workers (profile.c).
 *
 * Checkpoints (checkpoint.c) are written at step boundaries: every N steps or epochs
 * as the program says, and when SIGUSR1, SIGTERM or SIGINT reaches any worker. The
 * signal travels in the step's own all-reduce of the figures, so every worker stops
 * after the same step without another round trip. A resumed run starts at the
 * checkpoint's epoch and batch with its state, and goes on as the uninterrupted run.
 *
 * On a GPU the phases are queued and the host meets the device only where it needs
 * to: the batch goes up as it is ready, and the accumulators, gradients (several
 * workers), statistics and parameters come down (or go back up) where the host reads
 * or changes them; every such crossing is a call of gpu.c, a no-op on the CPU. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "runtime.h"

/* A step as the host remembers it until its figures are read: where it was, and the
 * first samples of its batch (for the message if it turned out not finite). */
typedef struct StepRecord {
    int64_t step, epoch, b, batches; /* step: its number, counted from 1 */
    int64_t ids[4], rows;
    bool pending;
} StepRecord;

/* One pass over a dataset: its steps (global batches), and the batches the loader
 * gives, this worker's shards of them: step b's are batches parts[b] to parts[b + 1] - 1,
 * more than one under accumulate_batches. */
typedef struct Pass {
    int64_t *order;
    int64_t *starts, *sizes;    /* by the loader's batch: its samples' place in order, their count */
    int64_t *parts, *global_sizes; /* by step: its first batch, and its samples over the job */
    int64_t batches;            /* steps */
} Pass;

typedef struct Run {
    ddp_runtime *rt;
    const ddp_config *cfg;
    ddp_report *report;
    ddp_data *train, *validation;
    ddp_loader *train_loader, *validation_loader;
    ddp_epoch_plan plan, validation_plan;
    Pass train_pass, validation_pass;
    int64_t rank, workers;
    ddp_job *job;
    ddp_ring *ring;             /* NULL for one worker */
    ddp_comm *comm;             /* the buckets' all-reduce during backward; NULL for one worker */
    ddp_trace *trace;           /* NULL without --trace */
    ddp_profile *profile;       /* NULL without --profile */
    double global[2 * 64 + 4];  /* the accumulators summed over the workers, then the flags:
                                   non-finite, workers asked to stop, of them by SIGINT, by SIGUSR1 */
    int64_t step;               /* optimizer steps taken */
    StepRecord pending;         /* a GPU alone: the step whose figures are on their way */
    double epoch_rate;          /* samples a second so far this epoch, for the progress lines */
    int64_t samples;            /* trained on, over all workers */
    ddp_figures last_validation;
    bool validated;
    int64_t validated_step;     /* the step after which last_validation was taken */
    char run_dir[2048], checkpoint_dir[2048];
    ddp_text run_settings, program_settings; /* as checkpoints hold them */
    int64_t first_epoch, first_batch; /* where training starts: 0, 0, or a checkpoint's */
    bool resumed_epoch_validated;
    ddp_watch best, stopping, plateau; /* save_best's, early_stopping's and reduce_lr's figures */
    bool stop_early;            /* early stopping's patience ran out: training ends */
    bool sweeping;              /* --find-lr: no progress lines */
    int stopped;                /* the signal the job stopped on after a checkpoint; 0 */
    int test_signal;            /* DDP_TEST_SIGNAL: raised at the start of test_step; 0: none */
    int64_t test_step;
    char stopped_checkpoint[4096];
    double checkpoint_seconds;  /* the last checkpoint's write */
    bool predicting;            /* --predict: each validation batch's outputs gathered */
    ddp_predictions *predictions; /* their file, on worker 0 */
    void *prediction_outputs;   /* this worker's batch of outputs, as the model gives them */
    double *prediction_rows;    /* a global batch of outputs */
} Run;

/* ------------------------------------------------------------------ signals */

/* The first of SIGUSR1, SIGTERM and SIGINT to reach this worker; 0 before. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) {
    if (stop_signal == SIGINT && sig == SIGINT) /* a second Ctrl-C: now */
        ddp_end_by_signal(SIGINT);
    if (!stop_signal)
        stop_signal = sig;
}

/* On while any worker of the process trains (several with several GPUs a worker);
 * off, the signals are handled as they were before (files.c's removal of unfinished
 * files, where that was on). */
static void catch_stop_signals(bool on) {
    static const int stops[] = {SIGUSR1, SIGTERM, SIGINT};
    static struct sigaction before[3];
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static int training;
    pthread_mutex_lock(&lock);
    bool change = on ? training++ == 0 : --training == 0;
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    for (int i = 0; change && i < 3; i++)
        sigaction(stops[i], on ? &sa : &before[i], on ? &before[i] : NULL);
    pthread_mutex_unlock(&lock);
}

/* DDP_TEST_SIGNAL=USR1|TERM|INT@STEP[:RANK]: the tests' signal, raised by this worker
 * (every worker, or RANK's) at the start of step STEP (from 1), so that a stop lands at
 * a known step whatever the machine's speed. */
static void read_test_signal(Run *r) {
    const char *v = getenv("DDP_TEST_SIGNAL");
    char name[8];
    long long step, rank = -1;
    if (!v)
        return;
    int sig = 0;
    if (sscanf(v, "%7[A-Z1]@%lld:%lld", name, &step, &rank) >= 2)
        sig = strcmp(name, "USR1") == 0 ? SIGUSR1 : strcmp(name, "TERM") == 0 ? SIGTERM
            : strcmp(name, "INT") == 0 ? SIGINT : 0;
    if (!sig || step < 1) {
        ddp_error("warning: DDP_TEST_SIGNAL=%s is not USR1|TERM|INT@STEP[:RANK] (a step from 1); no signal raised", v);
        return;
    }
    if (rank < 0 || rank == r->rank) {
        r->test_signal = sig;
        r->test_step = step;
    }
}

static const char *signal_name(int sig) {
    return sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "a signal";
}

static double now_seconds(void) {
    return ddp_now_ms() / 1e3;
}

int ddp_job_failure_status(ddp_job *job) {
    if (ddp_link_lost(job->link, NULL, NULL, 0))
        return ddp_link_lost_status(job->link);
    return ddp_ring_lost(job->ring) >= 0 || ddp_nccl_failed(job->nccl, NULL, 0) ? 3 : 1;
}

static int failure(Run *r, const char *message) {
    ddp_report_interrupt(r->report);
    ddp_error("%s", message);
    snprintf(r->job->why, sizeof r->job->why, "%.1000s", message);
    return ddp_job_failure_status(r->job);
}

/* "step 12 (epoch 1, step 12 of 312), DOING: WHAT", or "after step 12 (...)". */
static void say_at(const Run *r, int64_t step, int64_t epoch, int64_t b, bool after, const char *doing,
                   const char *what, char *out, size_t len) {
    snprintf(out, len, "%sstep %lld (epoch %lld, step %lld of %lld)%s%s: %.800s", after ? "after " : "",
             (long long)step, (long long)epoch + 1, (long long)b + 1, (long long)r->plan.steps, doing ? ", " : "",
             doing ? doing : "", what);
}

/* Where the run is, for messages: during a step, or once its update is done (done_step). */
static void say_where(const Run *r, int64_t epoch, int64_t b, bool done_step, const char *doing, const char *what,
                      char *out, size_t len) {
    say_at(r, r->step + !done_step, epoch, b, done_step, doing, what, out, len);
}

/* Says what failed after the last step into why; false. */
static bool failed_after(const Run *r, const char *doing, const char *err, char *why, size_t len) {
    snprintf(why, len, "after step %lld, %s: %.900s", (long long)r->step, doing, err);
    return false;
}

/* A span of this worker's compute lane, from begin to now. */
static void span(Run *r, const char *name, double begin) {
    ddp_trace_event e = {name, DDP_LANE_COMPUTE, r->step, -1, 0, begin, ddp_trace_clock(), NULL, 0};
    ddp_trace_span(r->trace, &e);
}

/* A part of the step that is no schedule step, from begin to now, for --profile. */
static void profile_part(Run *r, int part, double begin) {
    if (r->profile)
        ddp_profile_part(r->profile, part, (ddp_trace_clock() - begin) * 1e-6);
}

/* ------------------------------------------------------------------ passes */

static bool pass_alloc(Pass *pass, int64_t samples, int64_t steps, int64_t parts) {
    size_t loads = (size_t)(steps * parts + 1), cuts = (size_t)(steps + 1);
    pass->order = malloc(sizeof(int64_t) * (size_t)(samples + 1));
    pass->starts = malloc(sizeof(int64_t) * loads);
    pass->sizes = malloc(sizeof(int64_t) * loads);
    pass->parts = malloc(sizeof(int64_t) * cuts);
    pass->global_sizes = malloc(sizeof(int64_t) * cuts);
    pass->batches = steps;
    return pass->order && pass->starts && pass->sizes && pass->parts && pass->global_sizes;
}

static void pass_free(Pass *pass) {
    free(pass->order);
    free(pass->starts);
    free(pass->sizes);
    free(pass->parts);
    free(pass->global_sizes);
}

/* Step b of the pass is global batch b of the plan, cut into batches of `part` samples
 * over the job (the last may hold fewer), each of which this worker loads its shard of. */
static void cut_pass(Run *r, Pass *pass, const ddp_epoch_plan *plan, int64_t part) {
    int64_t load = 0;
    for (int64_t b = 0; b < pass->batches; b++) {
        int64_t begin, size, offset, mine;
        ddp_batch_span(plan, b, &begin, &size);
        pass->parts[b] = load;
        pass->global_sizes[b] = size;
        for (int64_t at = 0; at < size; at += part, load++) {
            ddp_shard_range(size - at < part ? size - at : part, r->workers, r->rank, &offset, &mine);
            pass->starts[load] = begin + at + offset;
            pass->sizes[load] = mine;
        }
    }
    pass->parts[pass->batches] = load;
}

/* The most samples a batch of the pass holds on this worker (at least 1): what its
 * loader's buffers are sized for. */
static int64_t largest_shard(const Pass *pass) {
    int64_t most = 1;
    for (int64_t b = 0; b < pass->parts[pass->batches]; b++)
        most = pass->sizes[b] > most ? pass->sizes[b] : most;
    return most;
}

/* ----------------------------------------------------------------- figures */

/* Figures from (sum, count) pairs: the job's, summed over the workers. */
static ddp_figures read_figures(const ddp_program *p, const double *acc) {
    const ddp_settings *s = &p->settings;
    ddp_figures f = {0};
    f.loss = acc[1] > 0 ? acc[0] / acc[1] : NAN;
    f.samples = (int64_t)acc[1];
    for (int64_t i = 0; i < s->nmetrics && i < DDP_MAX_METRICS; i++) {
        const double *pair = acc + 2 * s->metrics[i].pair;
        f.metric[i] = pair[1] > 0 ? pair[0] / pair[1] : NAN;
    }
    return f;
}

/* A region's host mirror made current (a GPU's region downloaded), or the device made
 * to hold the mirror; false with the device's reason. */
static bool region_down(Run *r, int region, char *err, size_t errlen) {
    return ddp_to_host(r->rt, region) || ddp_fail(err, errlen, "%s", r->rt->device_error);
}

static bool region_up(Run *r, int region, char *err, size_t errlen) {
    return ddp_to_device(r->rt, region) || ddp_fail(err, errlen, "%s", r->rt->device_error);
}

/* With the optimizer's ema: the host mirrors of the parameters and their moving
 * average made the device's. */
static bool average_down(Run *r, char *err, size_t len) {
    return !ddp_average(r->rt) || (region_down(r, DDP_REGION_PARAMS, err, len) &&
                                   (ddp_average_moved(r->rt, false) || ddp_fail(err, len, "%s", r->rt->device_error)));
}

/* With ema, the parameters and their moving average trade places on the host mirrors,
 * which must be current, and on the device; a second call trades them back.
 * Validation, the best file and --save see the average, as Keras's use_ema leaves a
 * model; training goes on from the parameters. */
static bool trade_average(Run *r, char *err, size_t len) {
    if (!ddp_average(r->rt))
        return true;
    ddp_trade_average(r->rt);
    return region_up(r, DDP_REGION_PARAMS, err, len) &&
           (ddp_average_moved(r->rt, true) || ddp_fail(err, len, "%s", r->rt->device_error));
}

/* The parameters (ema's average where there is one) and the statistics written to path
 * by this worker, copied from the device; the host mirrors are left as the device's. */
static bool save_parameters(Run *r, const char *path, const ddp_meta *meta, int nmeta, char *err, size_t len) {
    if (!region_down(r, DDP_REGION_PARAMS, err, len) || !region_down(r, DDP_REGION_STATS, err, len) ||
        !ddp_average_moved(r->rt, false))
        return ddp_fail(err, len, "%s", r->rt->device_error);
    ddp_trade_average(r->rt); /* on the host alone: the device keeps the parameters */
    bool saved = ddp_save_params(r->rt, path, meta, nmeta, err, len);
    ddp_trade_average(r->rt);
    return saved;
}

/* The accumulators' host mirror summed over the workers into sums, then the sum of
 * the workers' non-finite flags (nonzero when any is set). */
static bool sum_figures(Run *r, double *sums, char *err, size_t errlen) {
    int64_t n = 2 * r->rt->program->accum_pairs;
    memcpy(sums, ddp_accumulators(r->rt), sizeof(double) * (size_t)n);
    sums[n] = ddp_nonfinite_flag(r->rt);
    sums[n + 1] = stop_signal != 0;
    sums[n + 2] = stop_signal == SIGINT;
    sums[n + 3] = stop_signal == SIGUSR1;
    return !r->ring || ddp_ring_allreduce(r->ring, sums, n + 4, DDP_F64, err, errlen);
}

/* The same from the accumulators as they are now. */
static bool sum_accumulators(Run *r, double *sums, char *err, size_t errlen) {
    return region_down(r, DDP_REGION_ACCUM, err, errlen) && sum_figures(r, sums, err, errlen);
}

/* Batch normalisation's running statistics, the same on every worker: their mean. */
static bool average_statistics(Run *r, char *err, size_t errlen) {
    const ddp_program *p = r->rt->program;
    if (!r->ring || p->stats_count == 0)
        return true;
    void *stats = r->rt->region[DDP_REGION_STATS];
    bool f64 = p->dtype == DDP_F64;
    if (!region_down(r, DDP_REGION_STATS, err, errlen) ||
        !ddp_ring_allreduce(r->ring, stats, p->stats_count, f64 ? DDP_F64 : DDP_F32, err, errlen))
        return false;
    for (int64_t i = 0; i < p->stats_count; i++) {
        if (f64)
            ((double *)stats)[i] /= (double)r->workers;
        else
            ((float *)stats)[i] /= (float)r->workers;
    }
    return region_up(r, DDP_REGION_STATS, err, errlen);
}

bool ddp_parameters_agree(ddp_runtime *rt, ddp_ring *ring, const char *when, const char *hint, char *err,
                          size_t errlen) {
    const ddp_program *p = rt->program;
    uint64_t mine = ddp_fnv1a(rt->region[DDP_REGION_PARAMS], (size_t)(p->param_count * rt->elem_size),
                              DDP_FNV_START);
    if (p->stats_count)
        mine = ddp_fnv1a(rt->region[DDP_REGION_STATS], (size_t)(p->stats_count * rt->elem_size), mine);
    uint64_t first = mine;
    int world = ddp_ring_world(ring), rank = ddp_ring_rank(ring);
    double *differs = calloc((size_t)world, sizeof *differs);
    if (!differs)
        return ddp_fail(err, errlen, "%s: out of memory", when);
    bool ok = ddp_ring_broadcast(ring, &first, sizeof first, 0, err, errlen);
    differs[rank] = first != mine;
    ok = ok && ddp_ring_allreduce(ring, differs, world, DDP_F64, err, errlen);
    char list[256] = "";
    size_t n = 0;
    for (int r = 0; ok && r < world; r++) {
        if (differs[r] == 0)
            continue;
        if (n > sizeof list - 16) { /* enough to go on */
            snprintf(list + n, sizeof list - n, ", ...");
            break;
        }
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%d", n ? ", " : "", r);
    }
    free(differs);
    if (!ok || !list[0])
        return ok;
    if (first != mine)
        ddp_fail(err, errlen, "%s, this worker's parameters (hash %016llx) differ from worker 0's (%016llx): %s", when,
                 (unsigned long long)mine, (unsigned long long)first, hint);
    else
        ddp_fail(err, errlen, "%s, the parameters of rank %s differ from worker 0's: %s", when, list, hint);
    return false;
}

/* ------------------------------------------------------------------ batches */

/* The loader's next batch into the input buffers (and on its way to a GPU); the wait
 * for it is traced with the samples it held. False with the device's reason. */
static bool next_batch(Run *r, ddp_loader *loader, int64_t global_size, const char *name, char *err,
                       size_t errlen) {
    ddp_runtime *rt = r->rt;
    const ddp_program *p = rt->program;
    double begin = ddp_trace_clock();
    if (!ddp_batch_writable(rt))
        return ddp_fail(err, errlen, "%s", rt->device_error);
    int64_t *ids = ddp_buffer_ptr(rt, p->sample_id_slot);
    int64_t rows = ddp_loader_next(loader, ddp_buffer_ptr(rt, p->input_slot), ddp_buffer_ptr(rt, p->label_slot), ids);
    ddp_set_batch(rt, rows, global_size);
    ddp_trace_event e = {name, DDP_LANE_COMPUTE, r->step, -1, 0, begin, ddp_trace_clock(), ids, rows};
    ddp_trace_span(r->trace, &e);
    return ddp_batch_uploaded(rt) || ddp_fail(err, errlen, "%s", rt->device_error);
}

/* --predict: the outputs of validation batch b, every worker's rows in their places
 * in the global batch (the validation order is the file's), summed to worker 0, which
 * writes them. A value plus the other workers' zeros is itself, so the rows are exact. */
static bool gather_predictions(Run *r, int64_t b, char *err, size_t errlen) {
    ddp_runtime *rt = r->rt;
    const ddp_program *p = rt->program;
    int64_t rows = rt->scalars[DDP_S_LOCAL_BATCH].i, elems = p->output_elems, begin, size;
    ddp_batch_span(&r->validation_plan, b, &begin, &size);
    void *out = r->prediction_outputs;
    if (!ddp_eval_outputs(rt, rows, out))
        return ddp_fail(err, errlen, "%s", rt->device_error);
    const int64_t *ids = ddp_buffer_ptr(rt, p->sample_id_slot);
    int64_t dtype = p->buffers[p->eval_output_slot].dtype;
    double *gathered = r->prediction_rows;
    memset(gathered, 0, sizeof(double) * (size_t)(size * elems));
    for (int64_t i = 0; i < rows; i++) {
        double *row = gathered + (ids[i] - begin) * elems;
        for (int64_t e = 0; e < elems; e++) {
            int64_t at = i * elems + e;
            row[e] = dtype == DDP_F64    ? ((const double *)out)[at]
                     : dtype == DDP_BF16 ? ddp_bf16_to_float(((const uint16_t *)out)[at])
                                         : ((const float *)out)[at];
        }
    }
    if (r->ring && !ddp_ring_allreduce(r->ring, gathered, size * elems, DDP_F64, err, errlen))
        return false;
    return !r->predictions || ddp_predictions_add(r->predictions, gathered, size) ||
           ddp_fail(err, errlen, "--predict %s: cannot write: %s", r->cfg->predict_path, strerror(errno));
}

/* Every validation sample through the evaluation phase, each worker its shard, with
 * ema's average in place of the parameters where there is one. The training figures
 * of the epoch so far (the accumulators and r->global) are left as they were. */
static bool validate(Run *r, char *err, size_t errlen) {
    ddp_runtime *rt = r->rt;
    int64_t pairs = rt->program->accum_pairs;
    double saved[2 * 64], sums[2 * 64 + 4];
    if (!average_statistics(r, err, errlen) || !region_down(r, DDP_REGION_ACCUM, err, errlen) ||
        !average_down(r, err, errlen) || !trade_average(r, err, errlen))
        return false;
    memcpy(saved, ddp_accumulators(rt), sizeof(double) * (size_t)(2 * pairs));
    ddp_zero_accumulators(rt);
    Pass *pass = &r->validation_pass;
    double begin = ddp_trace_clock();
    ddp_loader_begin(r->validation_loader, pass->order, pass->starts, pass->sizes, pass->batches, NULL);
    bool ok = true;
    for (int64_t b = 0; ok && b < pass->batches; b++)
        ok = next_batch(r, r->validation_loader, pass->global_sizes[b], "validation data wait", err, errlen) &&
             (ddp_run_phase(rt, DDP_PHASE_EVAL) || ddp_fail(err, errlen, "%s", rt->device_error)) &&
             (!r->predicting || gather_predictions(r, b, err, errlen));
    ok = ok && sum_accumulators(r, sums, err, errlen);
    span(r, "validation", begin);
    r->last_validation = read_figures(rt->program, sums);
    r->validated = ok;
    r->validated_step = r->step;
    memcpy(ddp_accumulators(rt), saved, sizeof(double) * (size_t)(2 * pairs));
    /* traded back after a failure too, so that a save after it writes the average, not
     * the parameters in its place; the host mirrors still hold what the device holds,
     * since validation writes neither */
    char spare[1024];
    bool back = trade_average(r, ok ? err : spare, ok ? errlen : sizeof spare);
    return ok && back && region_up(r, DDP_REGION_ACCUM, err, errlen);
}

/* ----------------------------------------------------------------- a step */

/* The parameter whose gradient holds element i of the flat vector. */
static const char *param_at(const ddp_program *p, int64_t i) {
    for (int64_t k = 0; k < p->nparams; k++) {
        const ddp_param *q = &p->params[k];
        if (q->region == DDP_REGION_PARAMS && i >= q->offset && i < q->offset + q->count)
            return q->name;
    }
    return "?";
}

/* A loss or gradient that is not finite stops the run before the update spoils the
 * parameters: the optimizer kernel skips it once the step's flag is set (and every
 * later step's: the flag stays), and the host stops when it reads the flag. The
 * message names the step, the tensor and the batch's first samples. */
static bool finite_step(Run *r, const StepRecord *rec, char *why, size_t len) {
    const ddp_program *p = r->rt->program;
    double loss = r->global[0], flag = r->global[2 * p->accum_pairs], mine = ddp_nonfinite_flag(r->rt);
    if (isfinite(loss) && flag == 0)
        return true;
    say_at(r, rec->step, rec->epoch, rec->b, false, NULL, "", why, len);
    int n = (int)strlen(why);
    if (!isfinite(loss) || mine < 1 || mine > (double)p->param_count)
        n += snprintf(why + n, len - (size_t)n, "the loss is %s", isnan(loss) ? "NaN" : "infinite");
    else
        n += snprintf(why + n, len - (size_t)n, "the gradient of `%s` holds a NaN or an infinity",
                      param_at(p, (int64_t)mine - 1));
    n += snprintf(why + n, len - (size_t)n, "; training stopped before this step's update. The batch held samples");
    for (int64_t i = 0; i < rec->rows && i < 4 && n < (int)len; i++)
        n += snprintf(why + n, len - (size_t)n, "%s %lld", i ? "," : "", (long long)rec->ids[i]);
    if (n < (int)len)
        snprintf(why + n, len - (size_t)n, "%s of %s. Lower the learning rate, or check those samples",
                 rec->rows > 4 ? ", ..." : "", r->train->spec->name);
    return false;
}

/* A step's figures, now in r->global: checked, then its progress line. */
static bool step_figures(Run *r, const StepRecord *rec, char *why, size_t len) {
    if (!finite_step(r, rec, why, len))
        return false;
    ddp_figures running = read_figures(r->rt->program, r->global);
    if (!r->sweeping)
        ddp_report_step(r->report, rec->epoch + 1, rec->b + 1, rec->batches, rec->step, &running, r->epoch_rate,
                    r->rt->scalars[DDP_S_LEARNING_RATE].f);
    return true;
}

/* A GPU alone does not wait for a step's figures: they come down while the next step
 * runs, and are read once that one is queued. These are the figures of the step
 * before, if any are on their way. */
static bool take_pending(Run *r, char *why, size_t len) {
    StepRecord *rec = &r->pending;
    if (!rec->pending)
        return true;
    rec->pending = false;
    char err[1024];
    if (!ddp_accumulators_arrived(r->rt) || !sum_figures(r, r->global, err, sizeof err)) {
        say_at(r, rec->step, rec->epoch, rec->b, true, "reading the loss and metrics", r->rt->device_error, why,
               len);
        return false;
    }
    return step_figures(r, rec, why, len);
}

/* After a step's optimizer: its figures read now (the CPU; several workers, whose
 * figures were summed before the update and whose flags are the same), or sent for
 * (a GPU alone). */
static bool after_step(Run *r, const StepRecord *rec, char *why, size_t len) {
    ddp_runtime *rt = r->rt;
    char err[1024];
    if (r->ring) {
        if (!region_down(r, DDP_REGION_ACCUM, err, sizeof err)) {
            say_at(r, rec->step, rec->epoch, rec->b, true, "reading the non-finite flag", err, why, len);
            return false;
        }
        r->global[2 * rt->program->accum_pairs] = ddp_nonfinite_flag(rt);
        return step_figures(r, rec, why, len);
    }
    if (rt->gpu) {
        if (!take_pending(r, why, len))
            return false;
        if (!ddp_accumulators_send(rt)) {
            say_at(r, rec->step, rec->epoch, rec->b, true, "reading the loss and metrics", rt->device_error, why,
                   len);
            return false;
        }
        r->pending = *rec;
        r->pending.pending = true;
        return true;
    }
    if (!sum_accumulators(r, r->global, err, sizeof err)) {
        say_at(r, rec->step, rec->epoch, rec->b, true, "summing the loss and metrics", err, why, len);
        return false;
    }
    return step_figures(r, rec, why, len);
}

/* A GPU's buckets through the ring: each handed to the communication thread as its
 * copy arrives in the pinned mirror, while the device goes on with backward; the sums
 * go back up behind backward, before the optimizer. */
static bool hand_buckets(Run *r, char *err, size_t len) {
    int64_t bucket;
    int got;
    while ((got = ddp_gpu_next_bucket(r->rt, &bucket)) == 1)
        ddp_comm_bucket_ready(r->comm, bucket);
    if (got < 0) {
        ddp_comm_wait(r->comm, err, len); /* the thread is done with the mirror before it is left */
        return ddp_fail(err, len, "%s", r->rt->device_error);
    }
    return ddp_comm_wait(r->comm, err, len) && region_up(r, DDP_REGION_GRADS, err, len);
}

/* The gradients summed over the job: through NCCL on the device (the optimizer waits
 * for it there), the buckets the communication thread took during backward, or (a
 * program without buckets) the whole vector now. */
static bool sum_gradients(Run *r, char *err, size_t len) {
    const ddp_program *p = r->rt->program;
    if (r->job->nccl)
        return true;
    if (r->comm && r->rt->gpu)
        return hand_buckets(r, err, len);
    if (r->comm)
        return ddp_comm_wait(r->comm, err, len);
    return !r->ring || (region_down(r, DDP_REGION_GRADS, err, len) &&
                        ddp_ring_allreduce(r->ring, (char *)r->rt->region[DDP_REGION_GRADS] + ddp_wire_offset(p, 0),
                                           p->param_count, ddp_wire_dtype(p), err, len) &&
                        region_up(r, DDP_REGION_GRADS, err, len));
}

/* A phase run (on a GPU: queued); false saying where when the device failed. */
static bool run_phase(Run *r, int phase, int64_t epoch, int64_t b, const char *doing, char *why, size_t len) {
    if (ddp_run_phase(r->rt, phase))
        return true;
    say_where(r, epoch, b, false, doing, r->rt->device_error, why, len);
    return false;
}

/* Batch `part` of step b (0, or more under accumulate_batches) through forward and
 * backward. Its gradients, the step's earlier batches' added in, go on to the
 * all-reduce once it is the step's last; until then the markers hold them back. The
 * step's record is made at its first batch. */
static bool forward_backward(Run *r, int64_t epoch, int64_t b, int64_t part, bool last, StepRecord *rec, char *why,
                             size_t len) {
    ddp_runtime *rt = r->rt;
    const ddp_program *p = rt->program;
    char lost[768];
    double t = ddp_trace_clock();
    if (!next_batch(r, r->train_loader, r->train_pass.global_sizes[b], "data wait", lost, sizeof lost)) {
        say_where(r, epoch, b, false, "reading the batch", lost, why, len);
        return false;
    }
    profile_part(r, DDP_PROFILE_DATA, t);
    ddp_profile_local_batch(r->profile, rt->scalars[DDP_S_LOCAL_BATCH].i);
    if (part == 0) {
        *rec = (StepRecord){r->step + 1, epoch, b, r->train_pass.batches, {0}, rt->scalars[DDP_S_LOCAL_BATCH].i, false};
        const int64_t *ids = ddp_buffer_ptr(rt, p->sample_id_slot);
        for (int64_t i = 0; i < rec->rows && i < 4; i++)
            rec->ids[i] = ddp_entry_sample(ids[i], r->train->samples);
    }
    rt->scalars[DDP_S_EPOCH].i = epoch;
    rt->scalars[DDP_S_ACCUMULATED].i = part;
    rt->holding_gradients = !last;
    ddp_prepare_step(rt, r->step, r->plan.steps);
    t = ddp_trace_clock();
    if (!run_phase(r, DDP_PHASE_FORWARD, epoch, b, "forward", why, len))
        return false;
    span(r, "forward", t);
    if (r->comm && last)
        ddp_comm_begin_step(r->comm, r->step);
    t = ddp_trace_clock();
    bool ran = run_phase(r, DDP_PHASE_BACKWARD, epoch, b, "backward", why, len);
    rt->holding_gradients = false;
    if (ran)
        span(r, "backward", t);
    return ran;
}

static bool train_step(Run *r, int64_t epoch, int64_t b, char *why, size_t len) {
    const Pass *pass = &r->train_pass;
    int64_t global = pass->global_sizes[b], parts = pass->parts[b + 1] - pass->parts[b];
    if (r->test_signal && r->step + 1 == r->test_step)
        raise(r->test_signal);
    ddp_link_at_step(r->job->link, r->step + 1);
    StepRecord rec;
    for (int64_t part = 0; part < parts; part++)
        if (!forward_backward(r, epoch, b, part, part + 1 == parts, &rec, why, len))
            return false;
    char lost[768];
    double t = ddp_trace_clock();
    bool summed = sum_gradients(r, lost, sizeof lost);
    span(r, "gradient wait", t);
    profile_part(r, DDP_PROFILE_COMMUNICATION, t);
    if (!summed) {
        say_where(r, epoch, b, false, "summing the gradients", lost, why, len);
        return false;
    }
    /* several workers: a loss that is not finite on any stops all of them before the
     * update, so that every worker's flag is then its gradients' alone, the same */
    if (r->ring) {
        t = ddp_trace_clock();
        if (!sum_accumulators(r, r->global, lost, sizeof lost)) {
            say_where(r, epoch, b, false, "summing the loss and metrics", lost, why, len);
            return false;
        }
        profile_part(r, DDP_PROFILE_COMMUNICATION, t);
        if (!isfinite(r->global[0])) {
            finite_step(r, &rec, why, len); /* says so */
            return false;
        }
    }
    t = ddp_trace_clock();
    if (!run_phase(r, DDP_PHASE_OPTIMIZER, epoch, b, "the optimizer", why, len))
        return false;
    span(r, "optimizer", t);
    r->step++;
    r->samples += global;
    return after_step(r, &rec, why, len);
}

/* ------------------------------------------------------------------ epochs */

static bool validation_due(const Run *r, int64_t epoch, bool epoch_end) {
    ddp_duration every = r->rt->program->settings.validate_every;
    if (!r->validation || every.value <= 0)
        return false;
    if (every.unit == DDP_UNIT_STEPS)
        return !epoch_end && r->step % every.value == 0;
    return epoch_end && ((epoch + 1) % every.value == 0 || epoch + 1 == r->cfg->epochs);
}

/* ---------------------------------------------------------- watched figures */

/* Validation figure `which`: 0 the loss, 1 + i metric i. */
static double watched_value(const ddp_figures *f, int64_t which) {
    return which == 0 ? f->loss : f->metric[which - 1];
}

/* Whether v improves on w's best by more than margin: higher accuracies, lower losses
 * and errors. The first number does; NaN never does. */
static bool improves(const ddp_program *p, int64_t which, const ddp_watch *w, double v, double margin) {
    int64_t kind = which == 0 ? DDP_METRIC_LOSS : p->settings.metrics[which - 1].kind;
    bool higher = kind == DDP_METRIC_ACCURACY || kind == DDP_METRIC_TOP_K;
    if (isnan(v) || isnan(w->best))
        return !isnan(v);
    return higher ? v > w->best + margin : v < w->best - margin;
}

/* save_best's figure improved: worker 0 writes the parameters to best.safetensors in
 * the run folder (beside it, then renamed over it), and every worker learns whether
 * it could. The statistics are the job's: the validation averaged them. */
static bool save_best(Run *r, char *err, size_t len) {
    char path[2200], why[1024] = "", step[32], value[32], figure[80];
    int32_t saved = 1;
    snprintf(path, sizeof path, "%s/best.safetensors", r->run_dir);
    if (r->rank == 0) {
        const ddp_program *p = r->rt->program;
        snprintf(step, sizeof step, "%lld", (long long)r->best.step);
        snprintf(value, sizeof value, "%.17g", r->best.best);
        snprintf(figure, sizeof figure, "%s", ddp_watched_name(p, p->settings.save_best));
        ddp_meta meta[] = {{"step", step}, {"figure", figure}, {"value", value}};
        saved = save_parameters(r, path, meta, 3, why, sizeof why);
    }
    if (r->ring && !ddp_ring_broadcast(r->ring, &saved, sizeof saved, 0, err, len))
        return false;
    if (!saved)
        return ddp_fail(err, len, "saving the best parameters: %s",
                        r->rank == 0 ? why : "worker 0 could not write them (it says why)");
    ddp_report_best(r->report, r->best.best, r->best.step, path);
    return true;
}

/* reduce_lr's plateau: the rate times factor from the next step on, down to min_lr
 * (the schedule's rate of the last step times the reductions), and a new count. */
static void reduce_rate(Run *r) {
    const ddp_settings *s = &r->rt->program->settings;
    double *scale = &r->rt->rate_scale, rate = r->rt->scalars[DDP_S_LEARNING_RATE].f / *scale;
    double lower = *scale * s->reduce_lr_factor, floor = rate > 0 ? s->reduce_lr_min / rate : 0;
    if (lower < floor)
        lower = floor;
    ddp_watch waited = r->plateau;
    r->plateau.since = 0;
    if (lower >= *scale)
        return; /* at min_lr already */
    *scale = lower;
    ddp_report_rate_reduced(r->report, &waited, rate * lower);
}

/* Figure `which` of the last validation against w: its new best when it improves by
 * more than margin (then true), else one more validation since the best. */
static bool watch_figure(Run *r, int64_t which, ddp_watch *w, double margin) {
    double v = watched_value(&r->last_validation, which);
    bool better = improves(r->rt->program, which, w, v, margin);
    *w = better ? (ddp_watch){v, r->step, 0} : (ddp_watch){w->best, w->step, w->since + 1};
    return better;
}

/* After a validation and its report: save_best's parameters written if its figure
 * improved, and early stopping's count of validations without improvement. */
static bool watch_validation(Run *r, char *err, size_t len) {
    const ddp_settings *s = &r->rt->program->settings;
    if (s->save_best >= 0 && watch_figure(r, s->save_best, &r->best, 0) && !save_best(r, err, len))
        return false;
    if (s->early_stopping >= 0) {
        watch_figure(r, s->early_stopping, &r->stopping, s->early_stopping_min_delta);
        r->stop_early = r->stopping.since >= s->early_stopping_patience;
    }
    if (s->reduce_lr >= 0) {
        watch_figure(r, s->reduce_lr, &r->plateau, s->reduce_lr_min_delta);
        if (r->plateau.since >= s->reduce_lr_patience)
            reduce_rate(r);
    }
    return true;
}

/* ------------------------------------------------------------- checkpoints */

/* Whether the job stops after this step: with several workers, as the step's
 * all-reduce carried the workers' signals (the same answer on every one); alone, its
 * own signal. The signal to name. */
static int stop_agreed(const Run *r) {
    int64_t n = 2 * r->rt->program->accum_pairs;
    if (!r->ring)
        return stop_signal;
    if (r->global[n + 1] == 0)
        return 0;
    return r->global[n + 2] > 0 ? SIGINT : r->global[n + 3] > 0 ? SIGUSR1 : SIGTERM;
}

static bool checkpoint_due(const Run *r, int unit, int64_t count) {
    const ddp_settings *s = &r->rt->program->settings;
    return s->checkpoint_dir && s->checkpoint_every.unit == unit && count % s->checkpoint_every.value == 0;
}

/* A checkpoint of the run after its last step, now at batch `batch` of `epoch`. */
static bool checkpoint_now(Run *r, int64_t epoch, int64_t batch, bool epoch_validated, const char *reason,
                           char *path, size_t pathlen, char *why, size_t len) {
    const ddp_settings *s = &r->rt->program->settings;
    char err[1024];
    int regions[] = {DDP_REGION_PARAMS, DDP_REGION_STATE, DDP_REGION_STATS, DDP_REGION_ACCUM};
    for (size_t i = 0; i < sizeof regions / sizeof *regions; i++)
        if (!region_down(r, regions[i], err, sizeof err))
            return failed_after(r, "copying the state from the GPU for a checkpoint", err, why, len);
    ddp_checkpoint c = {r->checkpoint_dir, s->checkpoint_dir ? s->checkpoint_keep : 3, reason, r->run_settings.s,
                        r->program_settings.s,
                        {r->step, epoch, batch, r->samples, r->validated_step, r->validated, epoch_validated,
                         r->last_validation, r->best, r->stopping, r->plateau, r->rt->rate_scale}};
    double begin = ddp_trace_clock();
    bool ok = ddp_checkpoint_save(r->rt, r->ring, &c, path, pathlen, err, sizeof err);
    span(r, "checkpoint", begin);
    r->checkpoint_seconds = (ddp_trace_clock() - begin) / 1e6;
    return ok || failed_after(r, "writing a checkpoint", err, why, len);
}

/* After step b of an epoch (and its validation): a checkpoint when one is due or the
 * job was asked to stop, which then stops it. */
static bool checkpoint_after_step(Run *r, int64_t epoch, int64_t b, bool epoch_validated, char *why, size_t len) {
    int stop = stop_agreed(r);
    if (!stop && !checkpoint_due(r, DDP_UNIT_STEPS, r->step))
        return true;
    char reason[64], path[4096];
    snprintf(reason, sizeof reason, "%s", stop ? signal_name(stop) : "periodic");
    if (!take_pending(r, why, len) ||
        !checkpoint_now(r, epoch, b + 1, epoch_validated, reason, path, sizeof path, why, len))
        return false;
    if (stop) {
        r->stopped = stop;
        snprintf(r->stopped_checkpoint, sizeof r->stopped_checkpoint, "%s", path);
    }
    return true;
}

/* ------------------------------------------------------------------ epochs */

/* The epoch's order, and its batches from `first` on handed to the loader with the
 * epoch's draws (*augment, which must outlive the pass); its figures zeroed when it
 * starts at its beginning (else they are a checkpoint's sums of the epoch so far). */
static void begin_pass(Run *r, int64_t epoch, int64_t first, ddp_draw_key *augment) {
    Pass *pass = &r->train_pass;
    ddp_training_order(r->rt->program, r->cfg->seed, epoch, r->train->samples, pass->order);
    *augment = (ddp_draw_key){r->cfg->seed, epoch};
    int64_t load = pass->parts[first];
    ddp_loader_begin(r->train_loader, pass->order, pass->starts + load, pass->sizes + load,
                     pass->parts[pass->batches] - load, augment);
    if (first == 0)
        ddp_zero_accumulators(r->rt);
}

/* An epoch from batch `first` (0, or a checkpoint's place in it). */
static bool run_epoch(Run *r, int64_t epoch, int64_t first, char *why, size_t len) {
    ddp_runtime *rt = r->rt;
    double start = now_seconds(), training = 0;
    int64_t trained = 0;
    const ddp_figures *epoch_validation = first > 0 && r->resumed_epoch_validated ? &r->last_validation : NULL;
    bool cut_short = false;
    char err[1024];
    Pass *pass = &r->train_pass;
    ddp_draw_key augment;
    begin_pass(r, epoch, first, &augment);
    r->epoch_rate = 0;
    for (int64_t b = first; b < pass->batches; b++) {
        double t = now_seconds();
        if (!train_step(r, epoch, b, why, len))
            return false;
        double took = now_seconds() - t;
        training += took;
        ddp_profile_end_step(r->profile, took);
        trained += pass->global_sizes[b];
        r->epoch_rate = training > 0 ? (double)trained / training : 0;
        bool validating = validation_due(r, epoch, false);
        if ((validating || b + 1 == pass->batches) && !take_pending(r, why, len))
            return false;
        if (validating) {
            if (!validate(r, err, sizeof err)) {
                say_where(r, epoch, b, true, "validating", err, why, len);
                return false;
            }
            epoch_validation = &r->last_validation;
            ddp_report_validation(r->report, r->step, &r->last_validation);
            if (!watch_validation(r, err, sizeof err)) {
                say_where(r, epoch, b, true, "after validating", err, why, len);
                return false;
            }
        }
        if (!checkpoint_after_step(r, epoch, b, epoch_validation != NULL, why, len))
            return false;
        if (r->stopped)
            return true;
        if (r->stop_early) { /* the epoch ends here: its figures so far, no checkpoint of a whole epoch */
            cut_short = b + 1 < pass->batches;
            break;
        }
    }
    bool last = epoch + 1 == r->cfg->epochs || r->stop_early;
    ddp_figures figures = read_figures(rt->program, r->global);
    /* a run ends with figures for its final parameters, whatever the schedule */
    bool final = last && r->validation && !(r->validated && r->validated_step == r->step);
    bool at_end = validation_due(r, epoch, true) || final;
    if (at_end) {
        if (!validate(r, err, sizeof err)) {
            snprintf(why, len, "the end of epoch %lld, validating: %.900s", (long long)epoch + 1, err);
            return false;
        }
        epoch_validation = &r->last_validation;
    }
    /* before the epoch's figures and checkpoint: none of them from changed data */
    if (!ddp_data_files_unchanged(err, sizeof err)) {
        snprintf(why, len, "the end of epoch %lld: %.900s", (long long)epoch + 1, err);
        return false;
    }
    ddp_epoch_result e = {epoch + 1, r->step, figures, epoch_validation, at_end,
                          rt->scalars[DDP_S_LEARNING_RATE].f, training > 0 ? (double)trained / training : 0,
                          now_seconds() - start};
    ddp_report_epoch(r->report, &e);
    if (at_end && !watch_validation(r, err, sizeof err)) {
        snprintf(why, len, "the end of epoch %lld: %.900s", (long long)epoch + 1, err);
        return false;
    }
    if (r->stop_early)
        ddp_report_stopped_early(r->report, &r->stopping, epoch + 1);
    char path[4096], reason[64];
    snprintf(reason, sizeof reason, "periodic");
    return cut_short || !checkpoint_due(r, DDP_UNIT_EPOCHS, epoch + 1) ||
           checkpoint_now(r, epoch + 1, 0, false, reason, path, sizeof path, why, len);
}

/* ---------------------------------------------------------------- the run */

/* A dataset's epochs: their plan (global batches, the last dropped or kept), this
 * worker's shards of them, and a loader with buffers for the largest shard. */
static bool prepare_pass(Run *r, const ddp_data *d, bool drop_remainder, int64_t steps_per_epoch, int64_t parts,
                         ddp_epoch_plan *plan, Pass *pass, ddp_loader **loader, char *err, size_t len) {
    int64_t part = r->rt->program->settings.batch_per_replica * r->rt->replicas;
    char why[512];
    if (!ddp_plan_epoch(d->samples, part * parts, drop_remainder, steps_per_epoch, plan, why, sizeof why))
        return ddp_fail(err, len, "%s: %s", d->spec->name, why);
    if (!pass_alloc(pass, d->samples, plan->steps, parts))
        return ddp_fail(err, len, "out of memory");
    cut_pass(r, pass, plan, part);
    if (!(*loader = ddp_loader_new(d, r->rt->program, largest_shard(pass), r->cfg->loader_threads)))
        return ddp_fail(err, len, "cannot start the loader threads of %s", d->spec->name);
    return true;
}

/* Validation passes over every sample in the file's order, the last batch kept. */
static bool prepare_validation(Run *r, char *err, size_t len) {
    if (!prepare_pass(r, r->validation, false, -1, 1, &r->validation_plan, &r->validation_pass,
                      &r->validation_loader, err, len))
        return false;
    ddp_epoch_order(0, 0, false, r->validation->samples, r->validation_pass.order);
    return true;
}

static bool prepare_training(Run *r, char *err, size_t len) {
    const ddp_settings *s = &r->rt->program->settings;
    return prepare_pass(r, r->train, s->drop_remainder, r->cfg->steps_per_epoch, s->accumulate_batches, &r->plan,
                        &r->train_pass, &r->train_loader, err, len);
}

/* --predict: worker 0 begins the file (every worker learns whether it could), and
 * every worker a buffer for a global batch of outputs. */
static bool start_predictions(Run *r, char *err, size_t len) {
    const ddp_program *p = r->rt->program;
    int64_t global = p->settings.batch_per_replica * r->rt->replicas;
    r->predicting = true;
    r->prediction_rows = malloc(sizeof(double) * (size_t)(global * p->output_elems));
    r->prediction_outputs = malloc(sizeof(double) * (size_t)(p->settings.batch_per_replica * p->output_elems));
    if (!r->prediction_rows || !r->prediction_outputs)
        return ddp_fail(err, len, "--predict: out of memory for a batch of outputs");
    char why[1024] = "";
    int32_t opened = 1;
    if (r->rank == 0) {
        r->predictions = ddp_predictions_open(r->cfg->predict_path, p, r->validation->samples, why, sizeof why);
        opened = r->predictions != NULL;
    }
    if (r->ring && !ddp_ring_broadcast(r->ring, &opened, sizeof opened, 0, err, len))
        return false;
    if (!opened)
        return ddp_fail(err, len, "%s", r->rank == 0 ? why : "worker 0 cannot write the predictions (it says why)");
    return true;
}

static int evaluate_only(Run *r) {
    double start = now_seconds();
    char err[1024];
    bool ok = (!r->cfg->predict_path || start_predictions(r, err, sizeof err)) && validate(r, err, sizeof err);
    if (ok && r->predictions) {
        ok = ddp_predictions_finish(r->predictions, err, sizeof err);
        r->predictions = NULL;
    }
    ddp_predictions_abandon(r->predictions);
    free(r->prediction_rows);
    free(r->prediction_outputs);
    if (!ok) {
        char why[1200];
        snprintf(why, sizeof why, "evaluating: %s", err);
        return failure(r, why);
    }
    ddp_report_evaluation(r->report, r->validation, &r->last_validation, now_seconds() - start);
    return 0;
}



/* What every worker does at the end, whoever was given --save (all must run the same
 * collectives): the running statistics made the job's (a validation does that too),
 * the parameters compared, and worker 0 saves. */
static bool finish_training(Run *r, char *why, size_t len) {
    char err[1024];
    bool validating = r->cfg->epochs == 0 && r->validation;
    if (validating ? !validate(r, err, sizeof err) : !average_statistics(r, err, sizeof err))
        return failed_after(r, validating ? "validating" : "averaging the running statistics", err, why, len);
    if (!region_down(r, DDP_REGION_PARAMS, err, sizeof err) || !region_down(r, DDP_REGION_STATS, err, sizeof err))
        return failed_after(r, "copying the parameters from the GPU", err, why, len);
    if (r->ring && !ddp_parameters_agree(r->rt, r->ring, "after training", "the workers' updates were not the "
                                         "same, which is a fault of ddp's runtime: please report it", err, sizeof err))
        return failed_after(r, "comparing the parameters", err, why, len);
    if (r->cfg->save_path && r->rank == 0 && !save_parameters(r, r->cfg->save_path, NULL, 0, err, sizeof err))
        return failed_after(r, "saving", err, why, len);
    return true;
}

/* The job stopped on a signal after a checkpoint: said, the Slurm job requeued if asked;
 * status 4, or 130 for SIGINT. */
static int stopped(Run *r) {
    char err[1024];
    if (r->rank == 0) {
        ddp_report_interrupt(r->report);
        ddp_error("%s%s: stopped after step %lld; checkpoint %s (written in %.1f s). Continue with --resume",
                  signal_name(r->stopped), stop_signal ? "" : " to another worker", (long long)r->step,
                  r->stopped_checkpoint, r->checkpoint_seconds);
        if (r->cfg->requeue_on_signal) {
            if (ddp_requeue_job(&r->cfg->cluster, err, sizeof err))
                ddp_error("job %lld requeued: it resumes from the checkpoint when it runs again",
                          (long long)r->cfg->cluster.job);
            else
                ddp_error("%s", err);
        }
    } else {
        ddp_log_only("%s%s: stopped after step %lld\n", signal_name(r->stopped), stop_signal ? "" : " to another worker",
                     (long long)r->step);
    }
    return r->stopped == SIGINT ? 130 : 4;
}

static int train_all(Run *r) {
    char why[1024], err[1024];
    double start = now_seconds();
    int64_t samples_before = r->samples, epochs = r->first_epoch + (r->first_batch > 0); /* begun */
    if (r->stop_early) /* resumed after early stopping ended the run's training */
        ddp_report_stopped_early(r->report, &r->stopping, epochs);
    for (int64_t epoch = r->first_epoch; epoch < r->cfg->epochs && !r->stop_early; epoch++) {
        if (run_epoch(r, epoch, epoch == r->first_epoch ? r->first_batch : 0, why, sizeof why)) {
            if (r->stopped)
                return stopped(r);
            epochs = epoch + 1;
            continue;
        }
        /* the update of the failed step never ran, so worker 0 holds the job's last
         * parameters, whatever went wrong elsewhere */
        if (r->cfg->save_path && r->rank == 0 && save_parameters(r, r->cfg->save_path, NULL, 0, err, sizeof err))
            snprintf(why + strlen(why), sizeof why - strlen(why), ". The parameters from before it are in %s%s",
                     r->cfg->save_path, r->ring && r->rt->program->stats_count ? " (with worker 0's own "
                     "batch-normalisation statistics)" : "");
        return failure(r, why);
    }
    if (!finish_training(r, why, sizeof why))
        return failure(r, why);
    ddp_report_summary(r->report, r->stop_early ? epochs : r->cfg->epochs, r->step, r->samples,
                       r->samples - samples_before, now_seconds() - start, r->validated ? &r->last_validation : NULL,
                       r->cfg->save_path);
    return 0;
}

/* -------------------------------------------------------------- --find-lr */

/* Whether the step that failed did so for a loss or gradient no longer finite (the
 * sweep's end), not for a fault. */
static bool diverged(const Run *r) {
    return !isfinite(r->global[0]) || r->global[2 * r->rt->program->accum_pairs] != 0;
}

/* --find-lr: the learning-rate range test (Smith, 2017; fastai's and PyTorch
 * Lightning's lr_find). From the initial parameters, steps at rates rising
 * geometrically over the range (epoch after epoch of the training data), each step's
 * own loss (the job's) smoothed by an exponential mean (0.98, bias-corrected), until
 * the last rate or the smoothed loss passes 4 times its lowest or is no longer
 * finite. Worker 0 writes every step to the file and says where the smoothed loss
 * fell fastest; nothing is saved. */
static int find_learning_rate(Run *r) {
    const ddp_config *cfg = r->cfg;
    int64_t steps = cfg->find_lr_steps, taken = 0, epoch = -1, b = 0;
    ddp_lr_sweep s = {cfg->find_lr_path, calloc((size_t)steps, sizeof(double)), calloc((size_t)steps, sizeof(double)),
                      calloc((size_t)steps, sizeof(double)), 0, "the last rate was reached"};
    FILE *out = r->rank == 0 ? fopen(cfg->find_lr_path, "w") : NULL;
    char why[1024];
    int status = 0;
    if (!s.rate || !s.loss || !s.smoothed)
        status = failure(r, "--find-lr: out of memory");
    else if (r->rank == 0 && !out) {
        snprintf(why, sizeof why, "--find-lr %s: cannot write: %s", cfg->find_lr_path, strerror(errno));
        status = failure(r, why);
    }
    r->rt->sweep[0] = cfg->find_lr_range[0];
    r->rt->sweep[1] = cfg->find_lr_range[1];
    r->rt->sweep_steps = steps;
    r->sweeping = true;
    ddp_draw_key augment;
    double mean = 0, lowest = INFINITY, before[2] = {0, 0};
    for (; status == 0 && taken < steps; taken++, b++) {
        if (epoch < 0 || b == r->train_pass.batches) {
            begin_pass(r, ++epoch, 0, &augment);
            b = 0;
            before[0] = before[1] = 0;
        }
        if (!train_step(r, epoch, b, why, sizeof why) || !take_pending(r, why, sizeof why)) {
            if (!diverged(r))
                status = failure(r, why);
            s.ended = "the loss was no longer finite";
            break;
        }
        s.rate[taken] = r->rt->scalars[DDP_S_LEARNING_RATE].f;
        s.loss[taken] = (r->global[0] - before[0]) / (r->global[1] - before[1]);
        before[0] = r->global[0], before[1] = r->global[1];
        mean = 0.98 * mean + 0.02 * s.loss[taken];
        s.smoothed[taken] = mean / (1 - pow(0.98, (double)(taken + 1)));
        s.steps = taken + 1;
        ddp_report_sweep_step(r->report, &s);
        lowest = s.smoothed[taken] < lowest ? s.smoothed[taken] : lowest;
        if (s.smoothed[taken] > 4 * lowest) {
            s.ended = "the smoothed loss passed 4 times its lowest";
            break;
        }
    }
    if (out) {
        bool written = status != 0 || ddp_report_lr_sweep(r->report, &s, out, why, sizeof why);
        if (fclose(out) != 0 && written) {
            snprintf(why, sizeof why, "--find-lr %s: cannot write: %s", cfg->find_lr_path, strerror(errno));
            written = false;
        }
        if (!written)
            status = failure(r, why);
    }
    free(s.rate), free(s.loss), free(s.smoothed);
    return status;
}

/* ---------------------------------------------------------- run folder */

/* The run's settings in effect that a resume must find the same, as "key value" lines. */
static ddp_text run_settings_text(const Run *r) {
    ddp_text t = {0};
    const ddp_config *cfg = r->cfg;
    ddp_text_printf(&t, "epochs %lld\nsteps_per_epoch %lld\nseed %llu\n", (long long)cfg->epochs,
                    (long long)r->plan.steps, (unsigned long long)cfg->seed);
    if (isnan(cfg->learning_rate))
        ddp_text_printf(&t, "learning_rate program\n");
    else
        ddp_text_printf(&t, "learning_rate %.17g\n", cfg->learning_rate);
    ddp_text_printf(&t, "global_batch %lld\ndevice %s\nsynthetic %s\ntrain_samples %lld\nvalidation_samples %lld\n",
                    (long long)r->plan.global_batch, ddp_gpu_backend(r->rt), cfg->synthetic ? "yes" : "no",
                    (long long)r->train->samples, (long long)(r->validation ? r->validation->samples : 0));
    return t;
}

/* The run folder's log opened (each worker's) and its settings.txt written (worker 0). */
static bool begin_run_folder(Run *r, char *err, size_t len) {
    const ddp_program *p = r->rt->program;
    char log[2200], why[2400];
    if (r->rank == 0)
        snprintf(log, sizeof log, "%s/log.txt", r->run_dir);
    else
        snprintf(log, sizeof log, "%s/log.rank%lld.txt", r->run_dir, (long long)r->rank);
    if (!ddp_log_open(log, why, sizeof why)) {
        if (r->rank == 0)
            return ddp_fail(err, len, "%s", why);
        ddp_error("warning: %s (is the run folder on a file system this node shares?); this worker keeps no log", why);
    }
    if (r->rank != 0) /* worker 0's log is what it prints */
        ddp_log_only("rank %lld of %lld on %s: training `%s` (program %016llx)\n", (long long)r->rank,
                     (long long)r->workers, r->cfg->cluster.host, p->name, (unsigned long long)p->hash);
    if (r->rank != 0)
        return true;
    char path[2200];
    ddp_text t = {0};
    ddp_text_printf(&t, "program %016llx\nmodel %s\nsource %s\nworkers %lld\n%s%s", (unsigned long long)p->hash,
                    p->name, p->source, (long long)r->workers, r->run_settings.s, r->program_settings.s);
    snprintf(path, sizeof path, "%s/settings.txt", r->run_dir);
    bool ok = !t.failed && ddp_write_text(path, t.s, err, len);
    free(t.s);
    return ok;
}

/* The run's folder found (or made), its settings written, and the checkpoint it
 * continues, if any, taken by every worker. With --check, the folder found and the
 * checkpoint taken the same way, but nothing made or written. */
static bool start_run(Run *r, char *said, size_t saidlen, char *err, size_t len) {
    const ddp_program *p = r->rt->program;
    ddp_run_place place;
    said[0] = 0;
    r->run_settings = run_settings_text(r);
    r->program_settings = ddp_settings_text(&p->settings);
    if (r->run_settings.failed || r->program_settings.failed)
        return ddp_fail(err, len, "out of memory");
    if (!ddp_run_place_find(r->cfg, p, r->ring, &place, err, len))
        return false;
    snprintf(r->run_dir, sizeof r->run_dir, "%s", place.run_dir);
    snprintf(r->checkpoint_dir, sizeof r->checkpoint_dir, "%s", place.checkpoint_dir);
    if (!r->cfg->check && !begin_run_folder(r, err, len))
        return false;
    if (!place.resume)
        return true;
    ddp_checkpoint c = {r->checkpoint_dir, 0, "", r->run_settings.s, r->program_settings.s, {0}};
    ddp_progress g;
    char found[2800];
    if (!ddp_checkpoint_resume(r->rt, r->ring, &c, place.resume_from, r->cfg->resume_changed, &g, found,
                               sizeof found, err, len))
        return false;
    r->step = g.step;
    r->samples = g.samples;
    r->validated = g.validated;
    r->validated_step = g.validated_step;
    r->last_validation = g.last_validation;
    r->first_epoch = g.epoch;
    r->first_batch = g.batch;
    r->resumed_epoch_validated = g.epoch_validated;
    r->best = g.best;
    r->stopping = g.stopping;
    r->plateau = g.plateau;
    r->rt->rate_scale = g.rate_scale;
    r->stop_early = p->settings.early_stopping >= 0 && r->stopping.since >= p->settings.early_stopping_patience;
    if (r->step > 0) /* the last step's learning rate, for an epoch line before any step of this run */
        ddp_prepare_step(r->rt, r->step - 1, r->plan.steps);
    snprintf(said, saidlen, "%s%s%s", place.note, place.note[0] ? " " : "", found);
    /* the figures of the epoch so far, as the last step left them */
    int regions[] = {DDP_REGION_PARAMS, DDP_REGION_STATE, DDP_REGION_STATS, DDP_REGION_ACCUM};
    for (size_t i = 0; i < sizeof regions / sizeof *regions; i++)
        if (!region_up(r, regions[i], err, len))
            return false;
    return sum_figures(r, r->global, err, len);
}

/* A trace travels through the coordinator's store in chunks, so no frame nears the
 * wire's limit and heartbeats pass between them. */
enum { TRACE_CHUNK = 16 << 20 };

static bool put_trace(Run *r, const char *json, size_t n, char *err, size_t len) {
    char key[64], count[32];
    size_t chunks = (n + TRACE_CHUNK - 1) / TRACE_CHUNK;
    for (size_t i = 0; i < chunks; i++) {
        size_t at = i * TRACE_CHUNK, size = n - at < TRACE_CHUNK ? n - at : TRACE_CHUNK;
        snprintf(key, sizeof key, "trace/%lld/%zu", (long long)r->rank, i);
        if (!ddp_link_set(r->job->link, key, json + at, size, err, len))
            return false;
    }
    snprintf(key, sizeof key, "trace/%lld", (long long)r->rank); /* last: the chunks are there */
    return ddp_link_set(r->job->link, key, count, (size_t)snprintf(count, sizeof count, "%zu", chunks), err, len);
}

/* Worker `rank`'s trace (malloc'd), or NULL with err. */
static char *get_trace(Run *r, int rank, size_t *n, char *err, size_t len) {
    char key[64];
    ddp_frame f;
    int timeout = (int)r->cfg->rendezvous_timeout;
    snprintf(key, sizeof key, "trace/%d", rank);
    if (!ddp_link_get(r->job->link, key, &f, timeout, err, len))
        return NULL;
    long long chunks = atoll(f.data);
    ddp_frame_free(&f);
    char *json = malloc(1);
    *n = 0;
    for (long long i = 0; json && i < chunks; i++) {
        snprintf(key, sizeof key, "trace/%d/%lld", rank, i);
        if (!ddp_link_get(r->job->link, key, &f, timeout, err, len)) {
            free(json);
            return NULL;
        }
        char *grown = realloc(json, *n + f.len + 1);
        if (grown) {
            memcpy(grown + *n, f.data, f.len);
            *n += f.len;
        } else {
            free(json);
        }
        json = grown;
        ddp_frame_free(&f);
    }
    if (!json)
        ddp_fail(err, len, "--trace: out of memory");
    return json;
}

/* Every worker's spans into one file, written by worker 0. */
static bool write_trace(Run *r, char *err, size_t len) {
    const ddp_cluster *c = &r->cfg->cluster;
    size_t n;
    char *mine = ddp_trace_json(r->trace, (int)r->rank, c->host, ddp_link_clock_offset(r->job->link),
                                r->ring ? ddp_ring_bytes_sent(r->ring) : 0, &n);
    if (!mine)
        return ddp_fail(err, len, "--trace: out of memory");
    if (r->rank != 0) {
        bool ok = put_trace(r, mine, n, err, len);
        free(mine);
        return ok;
    }
    int world = (int)r->workers;
    char **parts = calloc((size_t)world, sizeof *parts);
    size_t *lens = calloc((size_t)world, sizeof *lens);
    bool ok = parts && lens;
    if (ok) {
        parts[0] = mine, lens[0] = n;
    }
    for (int k = 1; ok && k < world; k++)
        ok = (parts[k] = get_trace(r, k, &lens[k], err, len)) != NULL;
    ok = ok ? ddp_trace_write(r->cfg->trace_path, parts, lens, world, err, len) : ok;
    for (int k = 0; parts && k < world; k++)
        free(parts[k]);
    if (!parts)
        free(mine);
    free(parts);
    free(lens);
    return ok;
}

/* --profile: every step timed from now on (the executor times the schedule's). */
static bool start_profile(Run *r, char *err, size_t len) {
    if (!r->cfg->profile || r->cfg->evaluate)
        return true;
    if (!(r->profile = ddp_profile_new(r->rt->program)))
        return ddp_fail(err, len, "--profile: out of memory");
    r->rt->profile = r->profile;
    return true;
}

/* The profile of a run that trained to its end or stopped on a signal; status 1 when
 * its files cannot be written. */
static int report_profile(Run *r, int status) {
    char err[1024], why[1200];
    if (!r->profile || (status != 0 && !r->stopped))
        return status;
    ddp_report_interrupt(r->report);
    if (ddp_profile_report(r->profile, r->rank, r->workers, ddp_gpu_backend(r->rt), r->run_dir, err, sizeof err))
        return status;
    snprintf(why, sizeof why, "after the last step, writing the profile: %s", err);
    return failure(r, why);
}

/* With several workers the gradients are summed during backward: by NCCL on the GPU,
 * or bucket by bucket by a communication thread over the ring (a GPU's buckets staged
 * through pinned memory; a program without buckets sums the whole vector after). */
static bool start_comm(Run *r, char *err, size_t len) {
    ddp_runtime *rt = r->rt;
    const ddp_program *p = rt->program;
    if (r->job->nccl)
        return ddp_gpu_sum_with_nccl(rt, r->job->nccl);
    if (!r->ring || p->nbuckets == 0)
        return true;
    if (rt->gpu) {
        int staged = ddp_gpu_stage_buckets(rt, err, len);
        if (staged <= 0)
            return staged == 0; /* 0: more buckets than events, the whole vector after backward */
    }
    r->comm = ddp_comm_start(r->ring, rt->region[DDP_REGION_GRADS], p, r->trace);
    if (!r->comm)
        return ddp_fail(err, len, "cannot start the communication thread");
    if (!rt->gpu) /* the executor's markers call the thread; a GPU's are gpu.c's */
        rt->hooks = (ddp_hooks){r->comm, ddp_comm_bucket_ready, ddp_comm_wait_hook, NULL};
    return true;
}

int ddp_run(ddp_runtime *rt, const ddp_config *cfg, ddp_data *train, ddp_data *validation, ddp_report *report,
            ddp_job *job) {
    Run r = {.rt = rt, .cfg = cfg, .report = report, .train = train, .validation = validation,
             .rank = cfg->cluster.rank, .workers = cfg->cluster.world, .job = job, .ring = job->ring,
             .trace = job->trace, .best = {NAN, 0, 0}, .stopping = {NAN, 0, 0}, .plateau = {NAN, 0, 0}};
    char err[1024], resumed[4096] = ""; /* an evaluation resumes nothing */
    int status;
    if (rt->program->accum_pairs > 64 || rt->program->settings.nmetrics > DDP_MAX_METRICS)
        status = failure(&r, "the program has more metrics than this runtime can hold");
    else if ((validation && !prepare_validation(&r, err, sizeof err)) ||
             (!cfg->evaluate && !prepare_training(&r, err, sizeof err)) || !start_comm(&r, err, sizeof err) ||
             !start_profile(&r, err, sizeof err))
        status = failure(&r, err);
    else if (!cfg->evaluate && !cfg->find_lr_path && !start_run(&r, resumed, sizeof resumed, err, sizeof err))
        status = failure(&r, err);
    else {
        ddp_report_banner(report, rt, train, validation, cfg->evaluate ? NULL : &r.plan);
        ddp_run_start start = {r.run_dir, r.checkpoint_dir, resumed, r.first_epoch, r.first_batch, r.step,
                               r.plan.steps};
        if (cfg->check) {
            ddp_report_checked(report, cfg->evaluate ? NULL : &start, r.workers);
            status = 0;
        } else if (cfg->evaluate) {
            status = evaluate_only(&r);
        } else if (cfg->find_lr_path) {
            status = find_learning_rate(&r);
        } else if (!ddp_report_run(report, &start, err, sizeof err)) {
            status = failure(&r, err);
        } else {
            catch_stop_signals(true);
            read_test_signal(&r);
            status = report_profile(&r, train_all(&r));
            catch_stop_signals(false);
        }
        if (status == 0 && r.trace && !cfg->check && !write_trace(&r, err, sizeof err)) {
            char why[1200];
            snprintf(why, sizeof why, "after the last step, gathering the trace: %s", err);
            status = failure(&r, why);
        }
    }
    ddp_comm_stop(r.comm);
    rt->hooks = (ddp_hooks){0};
    rt->profile = NULL;
    ddp_profile_free(r.profile);
    ddp_loader_free(r.train_loader);
    ddp_loader_free(r.validation_loader);
    pass_free(&r.train_pass);
    pass_free(&r.validation_pass);
    free(r.run_settings.s);
    free(r.program_settings.s);
    ddp_log_close();
    return status;
}
