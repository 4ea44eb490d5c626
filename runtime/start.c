/* start.c: a built program's start: the command line read over the program's
 * settings, a refusal of what this runtime cannot honour, the datasets read and
 * checked before anything else starts, the executor prepared with parameters from the
 * seed or a saved file, then the training loop.
 *
 * Exit status: 0 done, 1 a run-time error (data, files, numbers), 2 bad usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

static int fail(const char *prog, const char *message) {
    fprintf(stderr, "%s: %s\n", prog, message);
    return 1;
}

/* A dataset read and checked against the program, or false with the message printed. */
static bool open_dataset(const ddp_config *cfg, const ddp_program *p, const ddp_dataset *spec, ddp_data *d) {
    char err[2048];
    if (ddp_data_open(spec, cfg->data_root, d, err, sizeof err) && ddp_data_fits(d, p, err, sizeof err))
        return true;
    ddp_data_free(d);
    fail(cfg->prog, err);
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

/* The ring of every worker of the job; NULL with a message in err. */
static ddp_ring *join_ring(const ddp_config *cfg, const ddp_program *p, char *err, size_t errlen) {
    int64_t world = cfg->cluster.world;
    const char **hosts = calloc((size_t)world, sizeof *hosts);
    int *ports = calloc((size_t)world, sizeof *ports);
    ddp_ring *ring = NULL;
    if (!hosts || !ports)
        ddp_fail(err, errlen, "out of memory");
    else if (ddp_cluster_peers(&cfg->cluster, hosts, ports, err, errlen)) {
        ddp_ring_peers peers = {(int)cfg->cluster.rank, (int)world, hosts, ports, p->hash,
                                (int)cfg->rendezvous_timeout, (int)cfg->peer_timeout};
        ring = ddp_ring_connect(&peers, err, errlen);
    }
    free(hosts);
    free(ports);
    return ring;
}

/* S5: every worker starts from worker 0's parameters, bit for bit. */
static bool same_parameters(ddp_runtime *rt, ddp_ring *ring, char *err, size_t errlen) {
    const ddp_program *p = rt->program;
    uint64_t h = 1469598103934665603ull, theirs;
    const unsigned char *bytes = rt->region[DDP_REGION_PARAMS];
    for (int64_t i = 0; i < p->param_count * rt->elem_size; i++)
        h = (h ^ bytes[i]) * 1099511628211ull;
    theirs = h;
    if (!ddp_ring_broadcast(ring, &theirs, sizeof theirs, 0, err, errlen))
        return false;
    if (theirs != h)
        return ddp_fail(err, errlen, "the initial parameters differ from worker 0's (hash %016llx, worker 0 has "
                                     "%016llx): every worker needs the same seed and --load file",
                        (unsigned long long)h, (unsigned long long)theirs);
    return true;
}

int ddp_main(const ddp_program *p, int argc, char **argv) {
    ddp_config cfg;
    int status = ddp_parse_args(&cfg, p, argc, argv);
    if (status >= 0)
        return status;
    char err[2048], note[1024];
    if (!ddp_cluster_resolve(&p->settings, &cfg.cluster_flags, &cfg.cluster, err, sizeof err))
        return fail(cfg.prog, err);
    ddp_data train = {0}, validation = {0};
    ddp_runtime *rt = NULL;
    ddp_report *report = NULL;
    ddp_ring *ring = NULL;
    status = 1;
    if (!ddp_check_supported(&cfg, p, err, sizeof err)) {
        fail(cfg.prog, err);
        goto done;
    }
    if (cfg.cluster.warning[0])
        fprintf(stderr, "%s: warning: %s\n", cfg.prog, cfg.cluster.warning);
    bool has_validation = p->settings.validation.kind >= 0 && !cfg.synthetic;
    ddp_dataset noise;
    const ddp_dataset *train_spec = cfg.synthetic ? synthetic_like(p, &cfg, &noise) : &p->settings.train;
    if ((!cfg.evaluate && !open_dataset(&cfg, p, train_spec, &train)) ||
        (has_validation && !open_dataset(&cfg, p, &p->settings.validation, &validation)))
        goto done;
    if (!(rt = ddp_open(p, &cfg.exec, err, sizeof err))) {
        fail(cfg.prog, err);
        goto done;
    }
    rt->epochs = cfg.epochs;
    rt->rate_override = cfg.learning_rate;
    rt->replicas = rt->workers = (int)cfg.cluster.world;
    rt->scalars[DDP_S_SEED].i = (int64_t)cfg.seed;
    ddp_init_params(rt, cfg.seed);
    if (cfg.load_path && !ddp_load_params(rt, cfg.load_path, note, sizeof note, err, sizeof err)) {
        fail(cfg.prog, err);
        goto done;
    }
    if (cfg.cluster.world > 1 && (!(ring = join_ring(&cfg, p, err, sizeof err)) ||
                                  !same_parameters(rt, ring, err, sizeof err))) {
        fail(cfg.prog, err);
        status = ddp_ring_lost(ring) >= 0 ? 3 : 1;
        goto done;
    }
    if (!(report = ddp_report_open(&cfg, p, cfg.cluster.rank != 0, err, sizeof err))) {
        fail(cfg.prog, err);
        goto done;
    }
    if (cfg.load_path && note[0] && cfg.cluster.rank == 0)
        printf("note: %s\n", note);
    status = ddp_run(rt, &cfg, cfg.evaluate ? NULL : &train, has_validation ? &validation : NULL, report, ring);
done:
    ddp_report_close(report);
    ddp_ring_close(ring);
    ddp_close(rt);
    ddp_data_free(&train);
    ddp_data_free(&validation);
    ddp_cluster_free(&cfg.cluster);
    return status;
}
