/* cluster.c: who this process is in the job (S2): its rank, the world size, its
 * place on its node, the hosts, and the coordinator's address, from the first of
 * these that is there: the command line's flags, the DDP_* variables (ddprun's, or a
 * user's), Slurm's job step, or one worker alone. The program's `cluster` setting can
 * insist on one source; `auto` takes them in that order.
 *
 * Slurm counts only inside a job step: a batch script that forgot srun sees its job's
 * variables but no step (no SLURM_STEP_*), and runs as one worker with a warning
 * instead of waiting for tasks that never start. A step's environment must be whole:
 * one that lacks any variable the placement needs is refused, naming each missing one,
 * never guessed (a missing SLURM_NODEID would put a task on the first node). Every
 * refusal names the variable and its value. Ports (S2): the coordinator (rank 0) listens on port_base
 * and every other worker's end of the ring on port_base + its local rank; port_base
 * is pinned by the program or --port-base, else derived from the job and step ids so
 * jobs sharing a node differ. Where each worker really is comes from the rendezvous,
 * so tasks may be placed on nodes in any order. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"

/* A variable holding a whole number from lo up: 1 read, 0 absent, -1 malformed. */
static int env_number(const char *name, int64_t lo, int64_t *out) {
    const char *v = getenv(name);
    if (!v)
        return 0;
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (!*v || *end || errno || n < lo)
        return -1;
    *out = n;
    return 1;
}

/* Reads a required or optional number; false with a message when it is malformed or
 * (required) absent. */
static bool read_number(const char *name, int64_t lo, bool required, int64_t *out, char *err, size_t len) {
    int got = env_number(name, lo, out);
    if (got < 0)
        return ddp_fail(err, len, "%s is `%s`, not a whole number from %lld up", name, getenv(name), (long long)lo);
    if (got == 0 && required)
        return ddp_fail(err, len, "%s is not set", name);
    return true;
}

/* "host:port" into its parts. */
static bool split_address(const char *what, const char *address, char *host, size_t hostlen, int64_t *port,
                          char *err, size_t len) {
    const char *colon = strrchr(address, ':');
    char *end;
    long p = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == address || !colon[1] || *end || p < 1 || p > 65535)
        return ddp_fail(err, len, "%s is `%s`, not HOST:PORT (a port from 1 to 65535)", what, address);
    if ((size_t)(colon - address) >= hostlen)
        return ddp_fail(err, len, "%s names a host of %zu characters (`%.40s...`); host names longer than %zu are "
                                  "refused, not cut", what, (size_t)(colon - address), address, hostlen - 1);
    memcpy(host, address, (size_t)(colon - address));
    host[colon - address] = 0;
    *port = p;
    return true;
}

/* ------------------------------------------------------------------ Slurm */

/* Any of a job step's own variables: srun sets them all, a batch script none. */
static bool in_slurm_step(void) {
    return getenv("SLURM_STEP_ID") || getenv("SLURM_STEP_NUM_TASKS") || getenv("SLURM_STEP_NODELIST") ||
           getenv("SLURM_STEP_TASKS_PER_NODE");
}

/* What a task of a step needs, every one named when missing. */
static bool whole_step_environment(char *err, size_t len) {
    static const char *const needed[] = {"SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID",
                                         "SLURM_NODEID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE"};
    char missing[512] = "";
    int n = 0;
    for (size_t i = 0; i < sizeof needed / sizeof *needed; i++)
        if (!getenv(needed[i])) {
            size_t used = strlen(missing);
            snprintf(missing + used, sizeof missing - used, "%s%s", n ? ", " : "", needed[i]);
            n++;
        }
    if (n == 0)
        return true;
    return ddp_fail(err, len, "Slurm's job-step environment is incomplete: %s %s not set, though other "
                              "variables of a step are; start the program with srun, which sets them all",
                    missing, n == 1 ? "is" : "are");
}

/* A port base in [lo, hi] leaving room for every task of a node, from the job and
 * step ids: the same on every task of the step, different for most other steps. */
static int64_t derived_port(int64_t job, int64_t step, int64_t lo, int64_t hi, int64_t room) {
    uint64_t span = (uint64_t)(hi - lo + 1 > room ? hi - lo + 1 - room + 1 : 1);
    uint64_t h = (uint64_t)job * 0x9E3779B97F4A7C15ull ^ ((uint64_t)step + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    return lo + (int64_t)(h % span);
}

static bool from_slurm(const ddp_settings *s, ddp_cluster *c, char *err, size_t len) {
    int64_t step = 0, job = 0, node = 0, sum = 0, busiest = 0;
    ddp_hostlist hosts;
    int64_t *tasks = NULL;
    int nodes = 0;
    const char *list = getenv("SLURM_STEP_NODELIST"), *per_node = getenv("SLURM_STEP_TASKS_PER_NODE");
    char why[400];
    if (!whole_step_environment(err, len) || !read_number("SLURM_PROCID", 0, true, &c->rank, err, len) ||
        !read_number("SLURM_STEP_NUM_TASKS", 1, true, &c->world, err, len) ||
        !read_number("SLURM_LOCALID", 0, true, &c->local_rank, err, len) ||
        !read_number("SLURM_NODEID", 0, true, &node, err, len) ||
        !read_number("SLURM_STEP_ID", 0, true, &step, err, len) ||
        !read_number("SLURM_JOB_ID", 0, false, &job, err, len))
        return false;
    if (!ddp_hostlist_parse(list, &hosts, why, sizeof why))
        return ddp_fail(err, len, "SLURM_STEP_NODELIST: %s", why);
    bool ok = ddp_tasks_per_node_parse(per_node, &tasks, &nodes, why, sizeof why) ||
              ddp_fail(err, len, "SLURM_STEP_TASKS_PER_NODE: %s", why);

    for (int i = 0; ok && i < nodes; i++) {
        sum += tasks[i];
        busiest = tasks[i] > busiest ? tasks[i] : busiest;
    }
    if (ok && nodes != hosts.count)
        ok = ddp_fail(err, len, "SLURM_STEP_NODELIST `%s` names %d hosts, but SLURM_STEP_TASKS_PER_NODE `%s` counts %d",
                  list, hosts.count, per_node, nodes);
    else if (ok && sum != c->world)
        ok = ddp_fail(err, len, "SLURM_STEP_TASKS_PER_NODE `%s` adds up to %lld tasks, but SLURM_STEP_NUM_TASKS is %lld",
                  per_node, (long long)sum, (long long)c->world);
    else if (ok && c->rank >= c->world)
        ok = ddp_fail(err, len, "SLURM_PROCID is %lld, but the step has %lld tasks", (long long)c->rank,
                  (long long)c->world);
    else if (ok && node >= nodes)
        ok = ddp_fail(err, len, "SLURM_NODEID is %lld, but the step has %d nodes", (long long)node, nodes);
    else if (ok && c->local_rank >= tasks[node])
        ok = ddp_fail(err, len, "SLURM_LOCALID is %lld, but node %s runs %lld tasks of the step",
                  (long long)c->local_rank, hosts.names[node], (long long)tasks[node]);
    if (ok) {
        c->local_world = tasks[node];
        c->node = node;
        c->nodes = nodes;
        snprintf(c->host, sizeof c->host, "%s", hosts.names[node]);
        snprintf(c->coordinator, sizeof c->coordinator, "%s", hosts.names[0]);
        c->port_base = s->port_base >= 0 ? s->port_base
                                         : derived_port(job, step, s->port_range[0], s->port_range[1], busiest);
        c->source = "slurm";
        c->job = job;
        c->step = step;
        c->hosts = hosts;
        c->tasks = tasks;
        return true;
    }
    free(tasks);
    ddp_hostlist_free(&hosts);
    return false;
}

/* --------------------------------------------------- variables and flags */

/* The DDP_* variables, as ddprun sets them or a user does. */
static bool from_variables(ddp_cluster *c, char *err, size_t len) {
    if (!read_number("DDP_WORLD_SIZE", 1, true, &c->world, err, len) ||
        !read_number("DDP_RANK", 0, true, &c->rank, err, len))
        return false;
    c->local_rank = c->rank;
    c->local_world = c->world;
    if (!read_number("DDP_LOCAL_RANK", 0, false, &c->local_rank, err, len) ||
        !read_number("DDP_LOCAL_WORLD_SIZE", 1, false, &c->local_world, err, len))
        return false;
    const char *coordinator = getenv("DDP_COORDINATOR");
    if (coordinator && !split_address("DDP_COORDINATOR", coordinator, c->coordinator, sizeof c->coordinator,
                                      &c->port_base, err, len))
        return false;
    if (!coordinator && c->world > 1)
        return ddp_fail(err, len, "DDP_COORDINATOR is not set: with DDP_WORLD_SIZE %lld, every worker needs the "
                              "coordinator's HOST:PORT", (long long)c->world);
    c->source = "env";
    return true;
}

static bool from_flags(const ddp_cluster_flags *f, ddp_cluster *c, char *err, size_t len) {
    if (f->rank < 0)
        return ddp_fail(err, len, "--world-size %lld needs --rank", (long long)f->world);
    c->rank = f->rank;
    c->world = f->world;
    c->local_rank = f->local_rank >= 0 ? f->local_rank : f->rank;
    c->local_world = f->local_world >= 0 ? f->local_world : f->world;
    if (f->coordinator && !split_address("--coordinator", f->coordinator, c->coordinator, sizeof c->coordinator,
                                         &c->port_base, err, len))
        return false;
    if (!f->coordinator && c->world > 1)
        return ddp_fail(err, len, "--world-size %lld needs --coordinator HOST:PORT", (long long)c->world);
    c->source = "flags";
    return true;
}

/* Where a source's world size was given, for messages. */
static const char *world_given_by(const ddp_cluster *c) {
    return strcmp(c->source, "env") == 0     ? "DDP_WORLD_SIZE"
           : strcmp(c->source, "slurm") == 0 ? "SLURM_STEP_NUM_TASKS"
           : strcmp(c->source, "flags") == 0 ? "--world-size"
                                             : c->source;
}

/* The checks every source must pass. A world larger than any host list Slurm names
 * is refused here, rather than as memory the coordinator cannot find for it. */
static bool consistent(const ddp_cluster *c, char *err, size_t len) {
    enum { MAX_WORLD = 1 << 20 };
    if (c->world > MAX_WORLD)
        return ddp_fail(err, len, "%s is %lld: a world of more workers than ddp runs, %d", world_given_by(c),
                        (long long)c->world, MAX_WORLD);
    if (c->rank >= c->world)
        return ddp_fail(err, len, "rank %lld from %s is not below the world size %lld", (long long)c->rank, c->source,
                    (long long)c->world);
    if (c->local_rank >= c->local_world || c->local_world > c->world)
        return ddp_fail(err, len, "local rank %lld of %lld local workers (from %s) does not fit a world of %lld",
                    (long long)c->local_rank, (long long)c->local_world, c->source, (long long)c->world);
    if (c->port_base + c->local_world - 1 > 65535)
        return ddp_fail(err, len, "ports %lld to %lld do not all exist: pick a lower port base",
                    (long long)c->port_base, (long long)(c->port_base + c->local_world - 1));
    return true;
}

void ddp_cluster_free(ddp_cluster *c) {
    ddp_hostlist_free(&c->hosts);
    free(c->tasks);
    c->tasks = NULL;
}

int ddp_cluster_ring_port(const ddp_cluster *c) {
    return (int)(c->port_base + c->local_rank);
}

bool ddp_cluster_outside_job(const ddp_settings *s, const ddp_cluster_flags *f) {
    return !(f && f->world > 0) && ((s->cluster == DDP_CLUSTER_SLURM && !in_slurm_step()) ||
                                    (s->cluster == DDP_CLUSTER_ENV && !getenv("DDP_WORLD_SIZE")));
}

bool ddp_cluster_resolve(const ddp_settings *s, const ddp_cluster_flags *f, ddp_cluster *c, char *err,
                         size_t errlen) {
    memset(c, 0, sizeof *c);
    c->world = c->local_world = c->nodes = 1;
    c->source = "local";
    c->port_base = s->port_base >= 0 ? s->port_base : s->port_range[0];
    if (gethostname(c->host, sizeof c->host) != 0)
        snprintf(c->host, sizeof c->host, "localhost");
    snprintf(c->coordinator, sizeof c->coordinator, "%s", c->host);
    int64_t kind = s->cluster;
    bool ok = true;
    if (f && f->world > 0 && kind != DDP_CLUSTER_LOCAL)
        ok = from_flags(f, c, err, errlen);
    else if (kind == DDP_CLUSTER_ENV || (kind == DDP_CLUSTER_AUTO && getenv("DDP_WORLD_SIZE"))) {
        ok = from_variables(c, err, errlen);
        if (!ok && kind == DDP_CLUSTER_ENV && !getenv("DDP_WORLD_SIZE"))
            return ddp_fail(err, errlen, "the program says cluster = env, but DDP_WORLD_SIZE is not set: set "
                                     "DDP_RANK, DDP_WORLD_SIZE and DDP_COORDINATOR, or launch with ddprun");
    }
    else if (kind == DDP_CLUSTER_SLURM || (kind == DDP_CLUSTER_AUTO && in_slurm_step())) {
        if (!in_slurm_step())
            return ddp_fail(err, errlen, "the program says cluster = slurm, but this process is not a task of a "
                                     "Slurm job step: start it with srun, or build it with cluster = auto");
        ok = from_slurm(s, c, err, errlen);
    } else if (kind == DDP_CLUSTER_AUTO && getenv("SLURM_JOB_ID")) {
        snprintf(c->warning, sizeof c->warning,
                 "this is Slurm job %s, but not a task of a job step: training with one worker; start the "
                 "program with srun to use the job's tasks", getenv("SLURM_JOB_ID"));
    }
    if (f && f->port_base > 0)
        c->port_base = f->port_base;
    if (ok && consistent(c, err, errlen))
        return true;
    ddp_cluster_free(c);
    return false;
}
