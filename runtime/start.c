/* start.c: a built program's start, in an order the user cannot get wrong (S4): the
 * command line read over the program's settings; this worker's place in the job; a
 * refusal of what this runtime cannot honour; with several workers the link to the
 * coordinator (so a worker that fails from here on tells the others at once); the
 * datasets read and checked; the executor prepared with parameters from the seed or
 * a saved file; the rendezvous (same program, same settings, same data sizes on every
 * worker), the ring, and a check that every worker holds the same parameters (S5);
 * then the training loop. The device is chosen before the data are read: the GPU
 * visible to this task, the CPU, or the emulated GPU.
 *
 * Exit status: 0 done, 1 a run-time error (data, files, numbers, a job that cannot
 * form), 2 bad usage, 3 another worker of the job was lost, 4 stopped by SIGUSR1 or
 * SIGTERM after a checkpoint, 130 the same after SIGINT. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device.h"
#include "runtime.h"

static int fail(ddp_job *job, const char *message) {
    ddp_error("%s", message);
    snprintf(job->why, sizeof job->why, "%.1000s", message);
    return 1;
}

/* A dataset read and checked against the program, or false with the message printed. */
static bool open_dataset(const ddp_config *cfg, const ddp_program *p, const ddp_dataset *spec, ddp_data *d,
                         ddp_job *job) {
    char err[2048];
    if (ddp_data_open(spec, cfg->data_root, d, err, sizeof err) && ddp_data_fits(d, p, err, sizeof err))
        return true;
    ddp_data_free(d);
    fail(job, err);
    return false;
}
/* --synthetic: random samples for the model's input and output, enough for the run's
 * epochs (at least 65536, or steps_per_epoch global batches). */
static const ddp_dataset *synthetic_like(const ddp_program *p, const ddp_config *cfg, ddp_dataset *d) {
    int64_t batches = cfg->steps_per_epoch > 0 ? cfg->steps_per_epoch : 0;
    int64_t samples = batches * p->settings.batch_per_replica * cfg->cluster.world;
    memset(d, 0, sizeof *d);
    d->name = "synthetic";
    d->kind = DDP_DATA_SYNTHETIC;
    d->scale = 1;
    d->classes = p->output_elems > 1 ? p->output_elems : 2;
    d->samples = samples > 65536 ? samples : 65536;
    return d;
}

/* ----------------------------------------------------------------- devices */

/* Variables that say this task was given GPUs: inside such a job, not using one is an
 * error, not a silent CPU run. */
static const char *gpus_given(void) {
    static const char *const vars[] = {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v && strcmp(v, "NoDevFiles") != 0)
            return vars[i];
    }
    return NULL;
}

/* Which GPU of those visible: the only one, or the local rank's when there is one per
 * task of the node (S4); -1 with why not. */
static int gpu_ordinal(const ddp_cluster *c, int visible, char *err, size_t len) {
    if (visible == 1)
        return 0;
    if (visible >= c->local_world)
        return (int)c->local_rank;
    ddp_fail(err, len, "this task sees %d GPUs, but %lld tasks of the job share its node: give each task its own "
                       "GPU (srun --gpus-per-task=1), or let every task see one GPU per task of the node",
             visible, (long long)c->local_world);
    return -1;
}

/* The device this worker trains on: *dev NULL for the CPU; false with why. */
/* No GPU can be used, where one was asked for (--device gpu) or given (a job's GPUs). */
static bool unusable(const ddp_config *cfg, const char *given, const char *why, char *err, size_t len) {
    if (cfg->device == DDP_DEVICE_GPU)
        return ddp_fail(err, len, "--device gpu: no usable GPU: %s", why);
    return ddp_fail(err, len, "this task was given GPUs (%s=%s), but none is usable: %s. Pass --device cpu to train "
                              "on the CPU instead", given, getenv(given), why);
}

static bool choose_device(ddp_config *cfg, const ddp_program *p, ddp_device **dev, char *err, size_t len) {
    *dev = NULL;
    if (cfg->device == DDP_DEVICE_CPU)
        return true;
    if (cfg->device == DDP_DEVICE_EMULATED)
        return ddp_device_open_emulated(p, dev, err, len);
    char why[1024];
    int visible = ddp_cuda_device_count(why, sizeof why);
    const char *given = gpus_given();
    if (visible <= 0) {
        if (cfg->device == DDP_DEVICE_AUTO && !given) {
            cfg->device = DDP_DEVICE_CPU;
            return true;
        }
        return unusable(cfg, given, visible == 0 ? "the CUDA driver sees no GPU" : why, err, len);
    }
    int ordinal = gpu_ordinal(&cfg->cluster, visible, err, len);
    if (ordinal < 0)
        return false;
    if (!ddp_device_open_cuda(p, ordinal, dev, why, sizeof why)) {
        if (cfg->device == DDP_DEVICE_AUTO && !given) { /* said, not silent */
            ddp_error("a GPU is visible but cannot be used: %s; training on the CPU (--device gpu makes this an "
                      "error)", why);
            cfg->device = DDP_DEVICE_CPU;
            return true;
        }
        return unusable(cfg, given, why, err, len);
    }
    cfg->device = DDP_DEVICE_GPU;
    return true;
}

/* The GPU, said: on stderr by every worker of a job (each its own), in the banner by
 * worker 0; the plan's memory checked against what the device has free. */
static bool attach_device(ddp_runtime *rt, ddp_device *dev, const ddp_config *cfg, char *err, size_t len) {
    const ddp_program *p = rt->program;
    int64_t needed = 0;
    for (int r = 0; r < DDP_REGION_COUNT; r++)
        needed += p->region_bytes[r];
    needed += p->region_bytes[DDP_REGION_INPUT]; /* the next batch's staging */
    const ddp_device_info *info = &dev->info;
    if (info->free_bytes > 0 && needed > info->free_bytes) {
        ddp_fail(err, len, "%s (%s) has %.2f GiB free, but the program's memory plan needs %.2f GiB: lower "
                           "batch_per_replica, or free the GPU", info->name, info->uuid,
                 (double)info->free_bytes / (1 << 30), (double)needed / (1 << 30));
        ddp_device_close(dev);
        return false;
    }
    if (cfg->cluster.world > 1)
        ddp_error("training on %s %s, %s (bus %s)", dev->ops->name, info->name, info->uuid, info->bus);
    return ddp_gpu_attach(rt, dev, err, len);
}

/* ------------------------------------------------------------------ the job */

/* What must be the same on every worker, as "setting NAME VALUE" lines the
 * coordinator compares (flags that change the collectives or the numbers). */
static int join_text(char *out, size_t len, const ddp_config *cfg, const ddp_program *p, const ddp_data *train,
                     const ddp_data *validation, int port, const char *address) {
    static const char *const devices[] = {[DDP_DEVICE_AUTO] = "auto", [DDP_DEVICE_CPU] = "cpu",
                                          [DDP_DEVICE_GPU] = "gpu", [DDP_DEVICE_EMULATED] = "emulated"};
    char rate[64] = "the program's";
    if (!isnan(cfg->learning_rate))
        snprintf(rate, sizeof rate, "%.17g", cfg->learning_rate);
    return snprintf(out, len,
                    "rank %lld\nport %d\naddress %s\nsetting program %016llx\nsetting epochs %lld\n"
                    "setting steps_per_epoch %lld\nsetting seed %llu\nsetting learning_rate %s\n"
                    "setting evaluate %s\nsetting synthetic %s\nsetting load %s\nsetting trace %s\nsetting resume %s\n"
                    "setting peer_timeout %lld\nsetting train_samples %lld\nsetting validation_samples %lld\n"
                    "setting device %s",
                    (long long)cfg->cluster.rank, port, address, (unsigned long long)p->hash, (long long)cfg->epochs,
                    (long long)cfg->steps_per_epoch, (unsigned long long)cfg->seed, rate,
                    cfg->evaluate ? "yes" : "no", cfg->synthetic ? "yes" : "no", cfg->load_path ? "yes" : "no",
                    cfg->trace_path ? "yes" : "no", cfg->resume ? "yes" : "no", (long long)cfg->peer_timeout, (long long)train->samples,
                    (long long)validation->samples, devices[cfg->device]);
}

/* Joins the rendezvous and forms the ring of every worker of the job; false with
 * *lost set when another worker's loss stopped it. */
static bool form_ring(ddp_job *job, ddp_config *cfg, const ddp_program *p, const ddp_data *train,
                      const ddp_data *validation, bool *lost, char *err, size_t errlen) {
    const ddp_cluster *c = &cfg->cluster;
    char address[64] = "", text[4096], why[1024];
    int port = c->rank == 0 ? 0 : ddp_cluster_ring_port(c), listener = -1;
    if (cfg->interface && !ddp_interface_address(cfg->interface, address, sizeof address, err, errlen))
        return false;
    if (c->rank != 0 && (listener = ddp_listen(port, why, sizeof why)) < 0)
        return ddp_fail(err, errlen, "the ring cannot listen: %s", why);
    join_text(text, sizeof text, cfg, p, train, validation, port, address);
    ddp_table table;
    bool ok = ddp_link_join(job->link, text, &table, (int)cfg->rendezvous_timeout, lost, err, errlen);
    int world = (int)c->world;
    const char **addresses = calloc((size_t)world, sizeof *addresses), **hosts = calloc((size_t)world, sizeof *hosts);
    int *ports = calloc((size_t)world, sizeof *ports);
    if (ok && (!addresses || !hosts || !ports))
        ok = ddp_fail(err, errlen, "out of memory");
    int64_t nodes = 0; /* without Slurm, the machines are known only now */
    for (int r = 0; ok && r < world; r++) {
        addresses[r] = table.peers[r].address;
        hosts[r] = table.peers[r].host;
        ports[r] = table.peers[r].port;
        int first = 0;
        while (strcmp(table.peers[first].host, hosts[r]) != 0)
            first++;
        nodes += first == r;
    }
    if (ok && !c->tasks)
        cfg->cluster.nodes = nodes;
    if (ok) {
        ddp_ring_peers peers = {(int)c->rank, world, addresses, ports, hosts, p->hash, table.key, listener,
                                ddp_now_ms() + (double)cfg->rendezvous_timeout * 1000, 0, job->link,
                                (int)cfg->peer_timeout};
        ok = (job->ring = ddp_ring_connect(&peers, err, errlen)) != NULL;
        *lost = !ok && ddp_link_lost(job->link, NULL, NULL, 0);
    }
    if (listener >= 0)
        close(listener);
    free(addresses);
    free(hosts);
    free(ports);
    ddp_table_free(&table);
    return ok;
}

/* One worker's end: its goodbye, or the failure the others are told. */
static void leave_job(ddp_job *job, int status) {
    if (status == 0 || status == 3 || status == 4 || status == 130) /* 4, 130: every worker stopped alike */
        ddp_link_close(job->link);
    else
        ddp_link_abort(job->link, job->why[0] ? job->why : "it stopped with an error");
    ddp_ring_close(job->ring);
    ddp_trace_free(job->trace);
}

/* Connects to the job's coordinator (worker 0 starts it), first of all, so that a
 * worker that fails afterwards tells the others at once; false with why it could not. */
static bool join_job(ddp_job *job, ddp_config *cfg, char *err, size_t errlen) {
    const ddp_cluster *c = &cfg->cluster;
    ddp_auth auth;
    ddp_link_config lc = {c, &auth, (int)cfg->rendezvous_timeout, (int)cfg->peer_timeout};
    if (!ddp_auth_init(&auth, c, err, errlen) || !(job->link = ddp_link_open(&lc, err, errlen)))
        return false;
    cfg->proven_by = auth.munge ? "munge" : "a shared secret";
    return true;
}

/* A command line refused: the other workers are told why, where this worker can tell
 * where its job is (they would otherwise wait for it until the rendezvous timeout). */
static int refuse_usage(const ddp_program *p, ddp_config *cfg) {
    char err[2048], why[700];
    ddp_job job = {0};
    if (ddp_cluster_resolve(&p->settings, &cfg->cluster_flags, &cfg->cluster, err, sizeof err) &&
        cfg->cluster.world > 1) {
        ddp_set_identity(cfg->prog, cfg->cluster.rank, cfg->cluster.host, true);
        if (join_job(&job, cfg, err, sizeof err)) {
            snprintf(why, sizeof why, "its command line was refused: %s", cfg->usage_error);
            ddp_link_abort(job.link, why);
        }
    }
    ddp_cluster_free(&cfg->cluster);
    return 2;
}

int ddp_main(const ddp_program *p, int argc, char **argv) {
    ddp_config cfg;
    int status = ddp_parse_args(&cfg, p, argc, argv);
    if (status == 2)
        return refuse_usage(p, &cfg);
    if (status >= 0)
        return status;
    char err[2048], note[1024];
    ddp_job job = {0};
    ddp_set_identity(cfg.prog, 0, "", false);
    if (!ddp_cluster_resolve(&p->settings, &cfg.cluster_flags, &cfg.cluster, err, sizeof err))
        return fail(&job, err);
    const ddp_cluster *c = &cfg.cluster;
    ddp_set_identity(cfg.prog, c->rank, c->host, c->world > 1);
    ddp_data train = {0}, validation = {0};
    ddp_runtime *rt = NULL;
    ddp_report *report = NULL;
    ddp_device *device = NULL; /* chosen early (a missing GPU before the data are read), the runtime's later */
    status = 1;
    if (c->warning[0])
        ddp_error("warning: %s", c->warning);
    if (c->world > 1 && !join_job(&job, &cfg, err, sizeof err)) {
        fail(&job, err);
        goto done;
    }
    if (!ddp_check_supported(&cfg, p, err, sizeof err) || !choose_device(&cfg, p, &device, err, sizeof err)) {
        fail(&job, err);
        goto done;
    }
    if (cfg.trace_path && !(job.trace = ddp_trace_new())) {
        fail(&job, "out of memory");
        goto done;
    }
    bool has_validation = p->settings.validation.kind >= 0 && !cfg.synthetic;
    ddp_dataset noise;
    const ddp_dataset *train_spec = cfg.synthetic ? synthetic_like(p, &cfg, &noise) : &p->settings.train;
    if ((!cfg.evaluate && !open_dataset(&cfg, p, train_spec, &train, &job)) ||
        (has_validation && !open_dataset(&cfg, p, &p->settings.validation, &validation, &job)))
        goto done;
    cfg.exec.step_graph = c->world == 1; /* several: the gradients are summed between backward and optimizer */
    if (!(rt = ddp_open(p, &cfg.exec, err, sizeof err))) {
        fail(&job, err);
        goto done;
    }
    ddp_device *attaching = device;
    device = NULL; /* the runtime's now, even if attaching fails */
    if (attaching && !attach_device(rt, attaching, &cfg, err, sizeof err)) {
        fail(&job, err);
        goto done;
    }
    rt->epochs = cfg.epochs;
    rt->rate_override = cfg.learning_rate;
    rt->replicas = rt->workers = (int)c->world;
    rt->scalars[DDP_S_SEED].i = (int64_t)cfg.seed;
    ddp_init_params(rt, cfg.seed);
    if (cfg.load_path && !ddp_load_params(rt, cfg.load_path, note, sizeof note, err, sizeof err)) {
        fail(&job, err);
        goto done;
    }
    if (!ddp_to_device(rt, DDP_REGION_PARAMS) || !ddp_to_device(rt, DDP_REGION_STATS) ||
        !ddp_to_device(rt, DDP_REGION_STATE)) {
        fail(&job, rt->device_error);
        goto done;
    }
    bool lost = false;
    if (c->world > 1 && (!form_ring(&job, &cfg, p, &train, &validation, &lost, err, sizeof err) ||
                         !ddp_parameters_agree(rt, job.ring, "at the start", "every worker needs the same seed "
                                               "and --load file", err, sizeof err))) {
        fail(&job, err);
        status = lost || ddp_ring_lost(job.ring) >= 0 ? 3 : 1;
        goto done;
    }
    if (!(report = ddp_report_open(&cfg, p, c->rank != 0, err, sizeof err))) {
        fail(&job, err);
        goto done;
    }
    if (cfg.load_path && note[0] && c->rank == 0)
        printf("note: %s\n", note);
    status = ddp_run(rt, &cfg, cfg.evaluate ? NULL : &train, has_validation ? &validation : NULL, report, &job);
done:
    leave_job(&job, status);
    ddp_report_close(report);
    ddp_device_close(device);
    ddp_close(rt);
    ddp_data_free(&train);
    ddp_data_free(&validation);
    ddp_cluster_free(&cfg.cluster);
    return status;
}
