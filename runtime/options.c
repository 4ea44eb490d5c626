/* options.c: the run's settings: the program's, the command line's over them, the
 * machine's threads, and a refusal of whatever this runtime cannot honour yet.
 *
 * Every flag has a --flag=value form too. Bad usage exits with status 2 and a line
 * saying what was wrong and how to get help. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"

static const char usage[] =
    "usage: %s [OPTION]...\n"
    "Trains the model `%s` (built from %s) on this machine's CPU.\n"
    "Flags override the program's settings; the banner shows what is in effect.\n"
    "\n"
    "  --epochs N            epochs to train (0: none; with --save, the initial parameters)\n"
    "  --steps-per-epoch N   steps in each epoch (default: every global batch)\n"
    "  --seed N              seed of initial parameters, shuffling and dropout\n"
    "  --lr X                the learning rate (a schedule's peak)\n"
    "  --device D            auto, cpu, gpu or emulated (default auto: the GPU where one is usable)\n"
    "  --threads N           compute threads (default: this process's CPUs)\n"
    "  --loader-threads N    threads assembling each batch (default: 1 on the CPU; on a\n"
    "                        GPU this process's CPUs but one, at most 8)\n"
    "  --convolutions K      generated (im2col and products) or library (cuDNN on a GPU,\n"
    "                        the CPU's own by tiles on the CPU); default: cuDNN where\n"
    "                        usable, the CPU's own unless its filters are large\n"
    "  --conv-search S       how cuDNN's engine for each convolution is chosen: heuristic\n"
    "                        (default: the first its heuristics rank, so a run repeats\n"
    "                        exactly) or timed (the fastest of their first 8, timed at the\n"
    "                        start, as PyTorch's cudnn.benchmark: runs may differ in the\n"
    "                        last bits)\n"
    "  --no-cuda-graphs      on a GPU, queue every kernel each step instead of replaying\n"
    "                        each phase captured as a CUDA graph\n"
    "  --data-root DIR       where relative dataset paths start (default: the working folder)\n"
    "  --metrics FILE        write one JSON object per epoch to FILE\n"
    "  --save FILE           write the final parameters to FILE (safetensors)\n"
    "  --load FILE           start from the parameters in FILE instead of the seed's\n"
    "  --run-dir DIR         the run's folder: checkpoints, metrics.jsonl, settings.txt\n"
    "                        (default runs/MODEL-JOBID, or runs/MODEL-DATE-TIME outside Slurm)\n"
    "  --resume [PATH]       continue from the newest valid checkpoint of the run (or of\n"
    "                        PATH, a checkpoint or a folder of them)\n"
    "  --resume-changed      resume even when the program or its settings changed\n"
    "  --requeue-on-signal   after a checkpoint written on a signal, requeue the Slurm job\n"
    "  --evaluate            only evaluate on the validation dataset\n"
    "  --predict FILE        evaluate, and write the model's outputs for every validation\n"
    "                        sample to FILE (.npy or .csv), in the dataset's order\n"
    "  --predict-inputs X    with --predict: the samples of the .npy file X (or the files\n"
    "                        of a pattern) instead, without labels, preprocessed as the\n"
    "                        validation data are\n"
    "  --synthetic           train on random samples of the model's shapes instead of the\n"
    "                        program's datasets (to measure speed without reading files)\n"
    "  --check               read and check all that the run needs (datasets, --load, the\n"
    "                        files it writes, the job's other workers), print the banner\n"
    "                        and stop before the first step: nothing is trained or written\n"
    "  --data-stats          print the mean and standard deviation of the training inputs\n"
    "                        (the validation ones with --evaluate) after the dataset's\n"
    "                        scale, per channel of images [h, w, c] and per feature of\n"
    "                        tables, as the dataset's mean and std take them; nothing is\n"
    "                        trained\n"
    "  --dump-batch FILE     write the first training batch as the model receives it\n"
    "                        (scaled, normalised and augmented as in epoch 1) to FILE, a\n"
    "                        .npy of float32, and its labels beside it (FILE-labels.npy);\n"
    "                        nothing is trained\n"
    "  --find-lr FILE        the learning-rate range test: from the initial parameters (or\n"
    "                        --load's), train --find-lr-steps steps (100) at rates rising\n"
    "                        geometrically over --find-lr-range LOW,HIGH (1e-7,10), until\n"
    "                        the loss diverges; print the rate where the smoothed loss\n"
    "                        falls fastest and write every step to FILE (.csv); nothing\n"
    "                        is saved\n"
    "  --log-every N         steps between progress lines when stdout is not a terminal\n"
    "  --rank N, --world-size N, --local-rank N, --local-world-size N, --coordinator HOST:PORT\n"
    "                        this worker's place in the job (default: DDP_* variables,\n"
    "                        then Slurm's job step, then one worker alone)\n"
    "  --port-base N         the coordinator's port (local worker i listens on N + i)\n"
    "  --rendezvous-timeout S  seconds to wait for every worker to start (default 300)\n"
    "  --peer-timeout S      seconds a silent worker is given before it counts as lost (60)\n"
    "  --interface NAME      the network interface whose address the other workers use\n"
    "                        (default: the one that reaches the coordinator)\n"
    "  --trace FILE          write a Chrome trace of every worker's steps to FILE\n"
    "  --profile             time every kernel and library call of the training steps; at\n"
    "                        the end, print where a step's time goes (by part, layer and\n"
    "                        call) and write it to profile.txt and profile.json in the run folder\n"
    "  --baseline-cpu        run the baseline x86-64 kernels (and OpenBLAS for every product)\n"
    "                        even where AVX2 and FMA are present\n"
    "  --help                this text\n"
    "\n"
    "SIGUSR1 or SIGTERM stops every worker at the same step and writes a checkpoint;\n"
    "so does SIGINT (a second one ends the program at once).\n"
    "\n"
    "Exit status: 0 done, 1 a run-time error (data, files, numbers), 2 bad usage,\n"
    "3 another worker of the job was lost (it died, froze or failed), 4 stopped by\n"
    "SIGUSR1 or SIGTERM with a checkpoint written, 130 the same after SIGINT.\n";

/* Prints why, and keeps it for the other workers of the job (ddp_main tells them). */
__attribute__((format(printf, 2, 3))) static int bad_usage(ddp_config *cfg, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cfg->usage_error, sizeof cfg->usage_error, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s\nRun `%s --help` for the options.\n", cfg->prog, cfg->usage_error, cfg->prog);
    return 2;
}

static bool parse_int(const char *s, int64_t lo, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || isspace((unsigned char)*s))
        return false;
    *out = v;
    return true;
}

static bool parse_rate(const char *s, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (!*s || *end || !isfinite(v) || v <= 0)
        return false;
    *out = v;
    return true;
}

/* ---------------------------------------------------------------- threads */

static int64_t env_count(const char *name) {
    const char *v = getenv(name);
    int64_t n;
    return v && parse_int(v, 1, &n) ? n : 0;
}

/* The CPUs this process may run on, limited by Slurm's cpus-per-task; when every CPU
 * of the machine is allowed (nothing bound the process), shared with the machine's
 * other workers. */
static int default_threads(char *from, size_t len) {
    cpu_set_t set;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)online;
    int n = allowed > 0 ? allowed : 1;
    snprintf(from, len, "%d allowed CPUs", n);
    int64_t per_task = env_count("SLURM_CPUS_PER_TASK");
    if (per_task > 0 && per_task < n) {
        n = (int)per_task;
        snprintf(from, len, "SLURM_CPUS_PER_TASK");
    }
    int64_t local = env_count("DDP_LOCAL_WORLD_SIZE");
    if (!local)
        local = env_count("SLURM_STEP_NUM_TASKS") == 1 ? 1 : env_count("SLURM_NTASKS_PER_NODE");
    if (local > 1 && allowed == online && n == allowed) {
        n = n / (int)local > 0 ? n / (int)local : 1;
        snprintf(from, len, "%d CPUs shared by %lld workers", allowed, (long long)local);
    }
    return n;
}

/* ------------------------------------------------------------------ flags */

typedef enum { F_EPOCHS, F_STEPS, F_SEED, F_LR, F_DEVICE, F_THREADS, F_ROOT, F_METRICS, F_SAVE, F_LOAD,
               F_EVALUATE, F_PREDICT, F_PREDICT_INPUTS, F_SYNTHETIC, F_LOG_EVERY, F_BASELINE, F_RANK, F_WORLD,
               F_LOCAL_RANK, F_LOCAL_WORLD, F_COORDINATOR, F_PORT_BASE, F_RENDEZVOUS_TIMEOUT, F_PEER_TIMEOUT,
               F_INTERFACE, F_TRACE, F_PROFILE, F_RUN_DIR, F_RESUME, F_RESUME_CHANGED, F_REQUEUE, F_NO_GRAPHS,
               F_CONVOLUTIONS, F_CONV_SEARCH, F_CHECK, F_DATA_STATS, F_DUMP_BATCH, F_FIND_LR, F_FIND_LR_STEPS,
               F_FIND_LR_RANGE, F_LOADER_THREADS, F_HELP } Flag;

static const struct {
    const char *name;
    Flag flag;
    bool value;
} flags[] = {
    {"--epochs", F_EPOCHS, true},       {"--steps-per-epoch", F_STEPS, true}, {"--seed", F_SEED, true},
    {"--lr", F_LR, true},               {"--device", F_DEVICE, true},         {"--threads", F_THREADS, true},
    {"--data-root", F_ROOT, true},      {"--metrics", F_METRICS, true},       {"--save", F_SAVE, true},
    {"--load", F_LOAD, true},           {"--evaluate", F_EVALUATE, false},    {"--synthetic", F_SYNTHETIC, false},
    {"--predict-inputs", F_PREDICT_INPUTS, true}, {"--predict", F_PREDICT, true},
    {"--log-every", F_LOG_EVERY, true},
    {"--baseline-cpu", F_BASELINE, false}, {"--rank", F_RANK, true},         {"--world-size", F_WORLD, true},
    {"--local-rank", F_LOCAL_RANK, true}, {"--local-world-size", F_LOCAL_WORLD, true},
    {"--coordinator", F_COORDINATOR, true}, {"--port-base", F_PORT_BASE, true},
    {"--rendezvous-timeout", F_RENDEZVOUS_TIMEOUT, true}, {"--peer-timeout", F_PEER_TIMEOUT, true},
    {"--interface", F_INTERFACE, true}, {"--trace", F_TRACE, true},   {"--profile", F_PROFILE, false},
    {"--run-dir", F_RUN_DIR, true},     {"--resume-changed", F_RESUME_CHANGED, false},
    {"--resume", F_RESUME, true},       {"--requeue-on-signal", F_REQUEUE, false},
    {"--no-cuda-graphs", F_NO_GRAPHS, false}, {"--convolutions", F_CONVOLUTIONS, true},
    {"--conv-search", F_CONV_SEARCH, true}, {"--check", F_CHECK, false}, {"--data-stats", F_DATA_STATS, false},
    {"--dump-batch", F_DUMP_BATCH, true}, {"--find-lr-steps", F_FIND_LR_STEPS, true},
    {"--find-lr-range", F_FIND_LR_RANGE, true}, {"--find-lr", F_FIND_LR, true},
    {"--loader-threads", F_LOADER_THREADS, true},
    {"--help", F_HELP, false},          {"-h", F_HELP, false},
};

/* The flag an argument names, with "--flag=value" split; -1 if none. */
static int find_flag(const char *arg, const char **inline_value) {
    *inline_value = NULL;
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        size_t n = strlen(flags[i].name);
        if (strncmp(arg, flags[i].name, n) != 0)
            continue;
        if (arg[n] == 0)
            return (int)i;
        if (arg[n] == '=' && flags[i].value) {
            *inline_value = arg + n + 1;
            return (int)i;
        }
    }
    return -1;
}

/* An integer flag's value, from lo to hi, into out: -1 to go on, or 2 after saying
 * what it wants. */
static int int_flag(ddp_config *cfg, const char *name, const char *v, int64_t lo, int64_t hi,
                    const char *wants, int64_t *out) {
    int64_t n;
    if (parse_int(v, lo, &n) && n <= hi) {
        *out = n;
        return -1;
    }
    return bad_usage(cfg, "%s wants %s, not `%s`", name, wants, v);
}

/* --predict-inputs: the path made absolute, since --data-root moves the program's
 * datasets, not the command line's files. */
static int predict_inputs(ddp_config *cfg, const char *v) {
    char here[2048];
    bool fits = v[0] == '/' ? snprintf(cfg->predict_inputs, sizeof cfg->predict_inputs, "%s", v) <
                                  (int)sizeof cfg->predict_inputs
                            : getcwd(here, sizeof here) &&
                                  snprintf(cfg->predict_inputs, sizeof cfg->predict_inputs, "%s/%s", here, v) <
                                      (int)sizeof cfg->predict_inputs;
    if (!*v || !fits)
        return bad_usage(cfg, "--predict-inputs wants the path of a .npy file of inputs, or a pattern of several");
    return -1;
}

void ddp_predict_spec(const ddp_config *cfg, const ddp_program *p, ddp_dataset *out) {
    const ddp_settings *s = &p->settings;
    *out = s->validation.kind >= 0 ? s->validation : s->train;
    out->name = "--predict-inputs";
    out->kind = DDP_DATA_NPY;
    out->path[0] = cfg->predict_inputs;
    out->path[1] = NULL;
    out->augment = NULL;
    out->naugment = 0;
}

static int apply_flag(ddp_config *cfg, Flag f, const char *name, const char *v) {
    int64_t n = 0;
    int status;
    switch (f) {
    case F_EPOCHS:
        return int_flag(cfg, name, v, 0, INT64_MAX, "a whole number of epochs (0 or more)", &cfg->epochs);
    case F_STEPS:
        return int_flag(cfg, name, v, 1, INT64_MAX, "a positive whole number", &cfg->steps_per_epoch);
    case F_LOG_EVERY:
        return int_flag(cfg, name, v, 1, INT64_MAX, "a positive number of steps", &cfg->log_every);
    case F_SEED:
        status = int_flag(cfg, name, v, 0, INT64_MAX, "a non-negative whole number", &n);
        cfg->seed = (uint64_t)n;
        return status;
    case F_THREADS:
        status = int_flag(cfg, name, v, 1, 4096, "a number of threads from 1 to 4096", &n);
        cfg->exec.threads = (int)n;
        snprintf(cfg->threads_from, sizeof cfg->threads_from, "--threads");
        return status;
    case F_LOADER_THREADS:
        status = int_flag(cfg, name, v, 1, 256, "a number of threads from 1 to 256", &n);
        cfg->loader_threads = (int)n;
        return status;
    case F_RANK:
        return int_flag(cfg, name, v, 0, INT32_MAX, "a rank (0 or more)", &cfg->cluster_flags.rank);
    case F_WORLD:
        return int_flag(cfg, name, v, 1, INT32_MAX, "a number of workers", &cfg->cluster_flags.world);
    case F_LOCAL_RANK:
        return int_flag(cfg, name, v, 0, INT32_MAX, "a rank on this machine", &cfg->cluster_flags.local_rank);
    case F_LOCAL_WORLD:
        return int_flag(cfg, name, v, 1, INT32_MAX, "a number of workers", &cfg->cluster_flags.local_world);
    case F_PORT_BASE:
        return int_flag(cfg, name, v, 1, 65535, "a port from 1 to 65535", &cfg->cluster_flags.port_base);
    case F_RENDEZVOUS_TIMEOUT:
        return int_flag(cfg, name, v, 1, 86400, "a number of seconds", &cfg->rendezvous_timeout);
    case F_PEER_TIMEOUT:
        return int_flag(cfg, name, v, 1, 86400, "a number of seconds", &cfg->peer_timeout);
    case F_COORDINATOR: cfg->cluster_flags.coordinator = v; return -1;
    case F_INTERFACE: cfg->interface = v; return -1;
    case F_TRACE: cfg->trace_path = v; return -1;
    case F_PROFILE: cfg->profile = true; return -1;
    case F_RUN_DIR: cfg->run_dir = v; return -1;
    case F_RESUME:
        cfg->resume = true;
        cfg->resume_path = *v ? v : NULL;
        return -1;
    case F_RESUME_CHANGED: cfg->resume_changed = true; return -1;
    case F_REQUEUE: cfg->requeue_on_signal = true; return -1;
    case F_LR:
        if (!parse_rate(v, &cfg->learning_rate))
            return bad_usage(cfg, "%s wants a positive number, not `%s`", name, v);
        return -1;
    case F_DEVICE:
        if (strcmp(v, "cpu") == 0)
            cfg->device = DDP_DEVICE_CPU;
        else if (strcmp(v, "gpu") == 0)
            cfg->device = DDP_DEVICE_GPU;
        else if (strcmp(v, "auto") == 0)
            cfg->device = DDP_DEVICE_AUTO;
        else if (strcmp(v, "emulated") == 0)
            cfg->device = DDP_DEVICE_EMULATED;
        else
            return bad_usage(cfg, "%s is auto, cpu, gpu or emulated, not `%s`", name, v);
        return -1;
    case F_ROOT: cfg->data_root = v; return -1;
    case F_METRICS: cfg->metrics_path = v; return -1;
    case F_SAVE: cfg->save_path = v; return -1;
    case F_LOAD: cfg->load_path = v; return -1;
    case F_EVALUATE: cfg->evaluate = true; return -1;
    case F_PREDICT:
        if (!ddp_predictions_format_known(v))
            return bad_usage(cfg, "--predict %s: the file's name ends in .npy (a NumPy array) or .csv", v);
        cfg->predict_path = v;
        cfg->evaluate = true;
        return -1;
    case F_PREDICT_INPUTS: return predict_inputs(cfg, v);
    case F_SYNTHETIC: cfg->synthetic = true; return -1;
    case F_CHECK: cfg->check = true; return -1;
    case F_DATA_STATS: cfg->data_stats = true; return -1;
    case F_DUMP_BATCH:
        if (strlen(v) < 5 || strcmp(v + strlen(v) - 4, ".npy") != 0)
            return bad_usage(cfg, "--dump-batch %s: the file's name ends in .npy (a NumPy array)", v);
        cfg->dump_path = v;
        return -1;
    case F_FIND_LR:
        if (strlen(v) < 5 || strcmp(v + strlen(v) - 4, ".csv") != 0)
            return bad_usage(cfg, "--find-lr %s: the file's name ends in .csv", v);
        cfg->find_lr_path = v;
        return -1;
    case F_FIND_LR_STEPS:
        return int_flag(cfg, name, v, 2, 1000000, "a number of steps from 2 on", &cfg->find_lr_steps);
    case F_FIND_LR_RANGE: {
        char low[64], high[64];
        const char *comma = strchr(v, ',');
        if (!comma || comma - v >= (int)sizeof low || strlen(comma + 1) >= sizeof high)
            return bad_usage(cfg, "--find-lr-range wants LOW,HIGH, two learning rates, not `%s`", v);
        snprintf(low, sizeof low, "%.*s", (int)(comma - v), v);
        snprintf(high, sizeof high, "%s", comma + 1);
        if (!parse_rate(low, &cfg->find_lr_range[0]) || !parse_rate(high, &cfg->find_lr_range[1]) ||
            cfg->find_lr_range[0] >= cfg->find_lr_range[1])
            return bad_usage(cfg, "--find-lr-range wants LOW,HIGH, two positive rates, the first the lower, "
                                  "not `%s`", v);
        return -1;
    }
    case F_BASELINE: cfg->exec.baseline_cpu = true; return -1;
    case F_NO_GRAPHS: cfg->exec.no_graphs = true; return -1;
    case F_CONVOLUTIONS:
        if (strcmp(v, "generated") != 0 && strcmp(v, "library") != 0)
            return bad_usage(cfg, "--convolutions %s: generated or library", v);
        cfg->exec.convolutions = strcmp(v, "library") == 0 ? DDP_PATH_LIBRARY : DDP_PATH_GENERATED;
        return -1;
    case F_CONV_SEARCH:
        if (strcmp(v, "heuristic") != 0 && strcmp(v, "timed") != 0)
            return bad_usage(cfg, "--conv-search %s: heuristic or timed", v);
        cfg->exec.timed_conv_search = strcmp(v, "timed") == 0;
        return -1;
    case F_HELP: return 0;
    }
    return -1;
}

int ddp_parse_args(ddp_config *cfg, const ddp_program *p, int argc, char **argv) {
    memset(cfg, 0, sizeof *cfg);
    const ddp_settings *s = &p->settings;
    cfg->prog = argc > 0 ? argv[0] : p->name;
    cfg->epochs = s->epochs;
    cfg->steps_per_epoch = s->steps_per_epoch;
    cfg->seed = (uint64_t)s->seed;
    cfg->learning_rate = NAN;
    cfg->log_every = 100;
    cfg->rendezvous_timeout = 300;
    cfg->peer_timeout = 60;
    cfg->cluster_flags = (ddp_cluster_flags){-1, 0, -1, -1, NULL, 0};
    cfg->progress_bar = isatty(STDOUT_FILENO);
    for (int i = 1; i < argc; i++) {
        const char *value;
        int k = find_flag(argv[i], &value);
        if (k < 0)
            return bad_usage(cfg, "unknown option `%s`%s", argv[i],
                             argv[i][0] == '-' ? "" : " (this program takes no file arguments)");
        if (flags[k].flag == F_RESUME && !value) /* its path is optional */
            value = i + 1 < argc && argv[i + 1][0] != '-' ? argv[++i] : "";
        if (flags[k].value && !value) {
            if (i + 1 >= argc)
                return bad_usage(cfg, "%s needs a value", flags[k].name);
            value = argv[++i];
        }
        int status = apply_flag(cfg, flags[k].flag, flags[k].name, value);
        if (flags[k].flag == F_HELP) {
            printf(usage, cfg->prog, p->name, p->source);
            return 0;
        }
        if (status >= 0)
            return status;
    }
    if (cfg->exec.threads == 0)
        cfg->exec.threads = default_threads(cfg->threads_from, sizeof cfg->threads_from);
    if (cfg->cluster_flags.world == 0 && cfg->cluster_flags.rank >= 0)
        return bad_usage(cfg, "--rank needs --world-size");
    const char *evaluating = cfg->predict_path ? "--predict" : "--evaluate";
    if (cfg->evaluate && (cfg->resume || cfg->run_dir))
        return bad_usage(cfg, "%s does not go with %s: evaluation trains nothing and keeps no run folder "
                              "(give a checkpoint to --load instead)",
                         evaluating, cfg->resume ? "--resume" : "--run-dir");
    if (cfg->resume_changed && !cfg->resume)
        return bad_usage(cfg, "--resume-changed goes with --resume");
    if (cfg->evaluate && cfg->profile)
        return bad_usage(cfg, "%s and --profile do not go together: the profile is of training steps", evaluating);
    if (cfg->evaluate && cfg->synthetic)
        return bad_usage(cfg, "%s and --synthetic do not go together: evaluation reads the validation data",
                         evaluating);
    if (cfg->find_lr_path) {
        const char *other = cfg->evaluate ? evaluating : cfg->resume ? "--resume" : cfg->save_path ? "--save"
                            : cfg->check ? "--check" : cfg->data_stats ? "--data-stats"
                            : cfg->dump_path ? "--dump-batch" : !isnan(cfg->learning_rate) ? "--lr"
                            : cfg->profile ? "--profile" : NULL;
        if (other)
            return bad_usage(cfg, "--find-lr sweeps the learning rate from the initial parameters and saves "
                                  "nothing: it does not go with %s", other);
        if (!cfg->find_lr_steps)
            cfg->find_lr_steps = 100;
        if (cfg->find_lr_range[0] == 0) /* fastai's and PyTorch Lightning's range */
            cfg->find_lr_range[0] = 1e-7, cfg->find_lr_range[1] = 10;
    } else if (cfg->find_lr_steps || cfg->find_lr_range[0] > 0) {
        return bad_usage(cfg, "%s goes with --find-lr FILE", cfg->find_lr_steps ? "--find-lr-steps"
                                                                                 : "--find-lr-range");
    }
    if (cfg->dump_path && (cfg->data_stats || cfg->evaluate))
        return bad_usage(cfg, "--dump-batch writes a training batch: it does not go with %s",
                         cfg->data_stats ? "--data-stats" : evaluating);
    if (cfg->data_stats && cfg->synthetic)
        return bad_usage(cfg, "--data-stats and --synthetic do not go together: the statistics are of the "
                              "program's datasets");
    if (cfg->data_stats && cfg->evaluate && s->validation.kind < 0)
        return bad_usage(cfg, "--data-stats --evaluate: the program has no validation dataset");
    if (cfg->predict_inputs[0] && !cfg->predict_path)
        return bad_usage(cfg, "--predict-inputs goes with --predict FILE, the file the outputs go to");
    if (cfg->evaluate && s->validation.kind < 0 && !cfg->predict_inputs[0])
        return bad_usage(cfg, "%s needs a validation dataset, and the program's train block has "
                              "none: add `validation = DATASET`%s", evaluating,
                         cfg->predict_path ? ", or give --predict-inputs" : "");
    return -1;
}

/* ----------------------------------------------------------- capabilities */

static bool refuse(char *err, size_t len, const char *what) {
    snprintf(err, len, "%s", what);
    return false;
}

bool ddp_check_supported(const ddp_config *cfg, const ddp_program *p, char *err, size_t errlen) {
    const ddp_settings *s = &p->settings;
    (void)cfg;
    /* the features the settings ask for, by ddp_support.h's table (ddpc warns of the same) */
    bool asked[DDP_FEATURE_COUNT];
    ddp_features_asked(s, asked);
    for (int f = 0; f < DDP_FEATURE_COUNT; f++)
        if (asked[f] && !ddp_features[f].supported)
            return refuse(err, errlen, ddp_features[f].refusal);
    return true;
}
