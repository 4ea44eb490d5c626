/* cluster.c: the cluster resolver with the environment set here: a Slurm step of
 * several nodes, the DDP_* variables, flags over both, a batch script without a step,
 * ports pinned and derived, and inconsistent values, each refused naming the variable.
 *
 *   unit_cluster           run the checks (Slurm's and DDP_* variables cleared first)
 *   unit_cluster --print   print this process's resolution as one line, for
 *                          tests/cluster/srun.sh under a real srun */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime.h"

static ddp_settings settings(int64_t cluster, int64_t port_base) {
    ddp_settings s = {0};
    s.cluster = cluster;
    s.port_base = port_base;
    s.port_range[0] = 10000;
    s.port_range[1] = 20000;
    return s;
}

static const char *const variables[] = {
    "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
    "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "DDP_RANK", "DDP_WORLD_SIZE", "DDP_LOCAL_RANK",
    "DDP_LOCAL_WORLD_SIZE", "DDP_COORDINATOR"};

static void clear(void) {
    for (size_t i = 0; i < sizeof variables / sizeof *variables; i++)
        unsetenv(variables[i]);
}

/* task `rank` of a step on n[9-10], 3 tasks on n9 and 1 on n10 */
static void slurm_task(const char *rank, const char *local, const char *node) {
    clear();
    setenv("SLURM_JOB_ID", "4242", 1);
    setenv("SLURM_STEP_ID", "3", 1);
    setenv("SLURM_STEP_NUM_TASKS", "4", 1);
    setenv("SLURM_PROCID", rank, 1);
    setenv("SLURM_LOCALID", local, 1);
    setenv("SLURM_NODEID", node, 1);
    setenv("SLURM_STEP_NODELIST", "n[9-10]", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "3,1", 1);
}

/* c is freed first, so one struct serves many resolutions */
static bool resolves(int64_t cluster, const ddp_cluster_flags *f, ddp_cluster *c) {
    ddp_settings s = settings(cluster, -1);
    ddp_cluster_free(c);
    char err[512];
    bool ok = ddp_cluster_resolve(&s, f, c, err, sizeof err);
    if (!ok)
        fprintf(stderr, "refused: %s\n", err);
    return ok;
}

static void refused(int64_t cluster, const char *reason) {
    ddp_settings s = settings(cluster, -1);
    ddp_cluster c;
    char err[512] = "";
    bool ok = ddp_cluster_resolve(&s, NULL, &c, err, sizeof err);
    ddp_cluster_free(&c);
    if (ok || !strstr(err, reason))
        fprintf(stderr, "%s (wanted a refusal with `%s`)\n", ok ? "accepted" : err, reason);
    CHECK(!ok && strstr(err, reason));
}

static void test_slurm(void) {
    ddp_cluster c0 = {0}, c3 = {0};
    slurm_task("0", "0", "0");
    CHECK(resolves(DDP_CLUSTER_AUTO, NULL, &c0));
    CHECK(strcmp(c0.source, "slurm") == 0 && c0.rank == 0 && c0.world == 4 && c0.local_world == 3 &&
          c0.nodes == 2 && strcmp(c0.host, "n9") == 0 && strcmp(c0.coordinator, "n9") == 0);
    CHECK(c0.port_base >= 10000 && c0.port_base + 2 <= 20000);
    slurm_task("3", "0", "1");
    CHECK(resolves(DDP_CLUSTER_SLURM, NULL, &c3));
    CHECK(c3.rank == 3 && c3.local_rank == 0 && c3.local_world == 1 && strcmp(c3.host, "n10") == 0 &&
          strcmp(c3.coordinator, "n9") == 0 && c3.port_base == c0.port_base);
    setenv("SLURM_STEP_ID", "4", 1); /* the next step of the job lands elsewhere */
    CHECK(resolves(DDP_CLUSTER_SLURM, NULL, &c3) && c3.port_base != c0.port_base);

    /* a ring port per local rank; the ids kept for munge's scope */
    char err[256];
    CHECK(ddp_cluster_ring_port(&c3) == c3.port_base && c3.job > 0 && c3.step == 4);
    ddp_cluster_free(&c3);

    ddp_settings pinned = settings(DDP_CLUSTER_AUTO, 12345);
    CHECK(ddp_cluster_resolve(&pinned, NULL, &c3, err, sizeof err) && c3.port_base == 12345);
    ddp_cluster_free(&c3);
    slurm_task("2", "0", "1"); /* rank 2 as node n10's first task: any order will do */
    CHECK(resolves(DDP_CLUSTER_AUTO, NULL, &c3) && c3.rank == 2 && strcmp(c3.host, "n10") == 0 &&
          ddp_cluster_ring_port(&c3) == c3.port_base);
    ddp_cluster_free(&c3);

    slurm_task("4", "0", "1");
    refused(DDP_CLUSTER_AUTO, "SLURM_PROCID is 4, but the step has 4 tasks");
    slurm_task("1", "3", "0");
    refused(DDP_CLUSTER_AUTO, "SLURM_LOCALID is 3, but node n9 runs 3 tasks");
    slurm_task("1", "1", "2");
    refused(DDP_CLUSTER_AUTO, "SLURM_NODEID is 2, but the step has 2 nodes");
    slurm_task("1", "1", "0");
    setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3)", 1);
    refused(DDP_CLUSTER_AUTO, "names 2 hosts, but SLURM_STEP_TASKS_PER_NODE `2(x3)` counts 3");
    setenv("SLURM_STEP_TASKS_PER_NODE", "3,x", 1);
    refused(DDP_CLUSTER_AUTO, "SLURM_STEP_TASKS_PER_NODE: the tasks per node `3,x` are malformed");
    setenv("SLURM_STEP_TASKS_PER_NODE", "2(X2),1", 1);
    refused(DDP_CLUSTER_AUTO, "SLURM_STEP_TASKS_PER_NODE: the tasks per node `2(X2),1` are malformed");
    slurm_task("one", "1", "0");
    refused(DDP_CLUSTER_AUTO, "SLURM_PROCID is `one`");
    slurm_task("1", "1", "0");
    setenv("SLURM_STEP_NODELIST", "", 1);
    refused(DDP_CLUSTER_AUTO, "SLURM_STEP_NODELIST: the host list `` names no host");
    setenv("SLURM_STEP_NODELIST", "n[9-10", 1);
    refused(DDP_CLUSTER_AUTO, "SLURM_STEP_NODELIST: the host list `n[9-10` is malformed");

    /* a step's environment with a piece missing is refused, never guessed: without
     * SLURM_NODEID, rank 3 would land on the first node */
    slurm_task("3", "0", "1");
    unsetenv("SLURM_NODEID");
    refused(DDP_CLUSTER_AUTO, "SLURM_NODEID is not set, though other variables of a step are");
    slurm_task("0", "0", "0");
    unsetenv("SLURM_STEP_NUM_TASKS");
    refused(DDP_CLUSTER_AUTO, "SLURM_STEP_NUM_TASKS is not set");
    unsetenv("SLURM_STEP_NODELIST");
    unsetenv("SLURM_LOCALID");
    refused(DDP_CLUSTER_AUTO,
            "SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_STEP_NODELIST are not set, though other variables");
    clear();
    setenv("SLURM_STEP_NODELIST", "n1", 1); /* no SLURM_STEP_ID: still part of a step */
    refused(DDP_CLUSTER_AUTO, "SLURM_STEP_ID, SLURM_STEP_NUM_TASKS, SLURM_PROCID");

    /* host names longer than the runtime keeps are refused, not cut */
    char longest[300];
    memset(longest, 'h', sizeof longest - 1);
    longest[sizeof longest - 1] = 0;
    slurm_task("0", "0", "0");
    setenv("SLURM_STEP_NODELIST", longest, 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "4", 1);
    setenv("SLURM_STEP_NUM_TASKS", "4", 1);
    refused(DDP_CLUSTER_AUTO, "is malformed: a host name is longer than 255 characters");
    setenv("DDP_WORLD_SIZE", "2", 1);
    setenv("DDP_RANK", "1", 1);
    char address[320];
    snprintf(address, sizeof address, "%s:15000", longest);
    setenv("DDP_COORDINATOR", address, 1);
    refused(DDP_CLUSTER_AUTO, "DDP_COORDINATOR names a host of 299 characters");
    unsetenv("DDP_WORLD_SIZE");
    unsetenv("DDP_RANK");
    unsetenv("DDP_COORDINATOR");
    longest[255] = 0; /* 255 fit */
    setenv("SLURM_STEP_NODELIST", longest, 1);
    CHECK(resolves(DDP_CLUSTER_AUTO, NULL, &c0) && strlen(c0.host) == 255);

    /* TensorFlow's SlurmClusterResolver cases: three nodes of one task each, by name */
    clear();
    setenv("SLURM_JOB_ID", "9", 1);
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_STEP_NUM_TASKS", "3", 1);
    setenv("SLURM_PROCID", "1", 1);
    setenv("SLURM_LOCALID", "0", 1);
    setenv("SLURM_NODEID", "1", 1);
    setenv("SLURM_STEP_NODELIST", "t02n13,t02n41,t02n43", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "1(x3)", 1);
    CHECK(resolves(DDP_CLUSTER_AUTO, NULL, &c0) && c0.nodes == 3 && strcmp(c0.host, "t02n41") == 0 &&
          strcmp(c0.coordinator, "t02n13") == 0 && c0.local_world == 1);
    /* ... and two tasks on each of two nodes, from a bracketed list */
    setenv("SLURM_STEP_NUM_TASKS", "4", 1);
    setenv("SLURM_PROCID", "3", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_STEP_NODELIST", "t02n[13,41]", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2)", 1);
    CHECK(resolves(DDP_CLUSTER_AUTO, NULL, &c0) && strcmp(c0.host, "t02n41") == 0 && c0.local_rank == 1 &&
          c0.local_world == 2);

    /* a batch script: the job's variables and its task's (sbatch sets SLURM_PROCID,
     * SLURM_LOCALID and SLURM_NODEID there too), but none of a step's */
    clear();
    setenv("SLURM_JOB_ID", "77", 1);
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_LOCALID", "0", 1);
    setenv("SLURM_NODEID", "0", 1);
    CHECK(resolves(DDP_CLUSTER_AUTO, NULL, &c0) && strcmp(c0.source, "local") == 0 && c0.world == 1 &&
          strstr(c0.warning, "Slurm job 77, but not a task of a job step"));
    refused(DDP_CLUSTER_SLURM, "not a task of a Slurm job step");
    ddp_cluster_free(&c0);
    ddp_cluster_free(&c3);
}

static void test_variables_and_flags(void) {
    ddp_cluster c = {0};
    slurm_task("0", "0", "0"); /* DDP_* come before Slurm */
    setenv("DDP_WORLD_SIZE", "2", 1);
    setenv("DDP_RANK", "1", 1);
    setenv("DDP_COORDINATOR", "10.0.0.5:15000", 1);
    CHECK(resolves(DDP_CLUSTER_AUTO, NULL, &c));
    CHECK(strcmp(c.source, "env") == 0 && c.rank == 1 && c.world == 2 && c.local_rank == 1 && c.local_world == 2 &&
          strcmp(c.coordinator, "10.0.0.5") == 0 && c.port_base == 15000);
    ddp_cluster_flags f = {0, 3, -1, -1, "head:16000", 0}; /* flags come before both */
    CHECK(resolves(DDP_CLUSTER_AUTO, &f, &c));
    CHECK(strcmp(c.source, "flags") == 0 && c.rank == 0 && c.world == 3 && strcmp(c.coordinator, "head") == 0 &&
          c.port_base == 16000);
    f.port_base = 17000;
    CHECK(resolves(DDP_CLUSTER_AUTO, &f, &c) && c.port_base == 17000);
    CHECK(resolves(DDP_CLUSTER_LOCAL, &f, &c) && strcmp(c.source, "local") == 0 && c.world == 1);

    setenv("DDP_COORDINATOR", "10.0.0.5", 1);
    refused(DDP_CLUSTER_AUTO, "DDP_COORDINATOR is `10.0.0.5`, not HOST:PORT");
    setenv("DDP_COORDINATOR", "h:70000", 1);
    refused(DDP_CLUSTER_AUTO, "not HOST:PORT");
    unsetenv("DDP_COORDINATOR");
    refused(DDP_CLUSTER_ENV, "DDP_COORDINATOR is not set");
    setenv("DDP_COORDINATOR", "h:1", 1);
    setenv("DDP_LOCAL_RANK", "2", 1);
    setenv("DDP_LOCAL_WORLD_SIZE", "2", 1);
    refused(DDP_CLUSTER_ENV, "local rank 2 of 2 local workers");
    /* sizes past what any job holds are refused, not met with overflowing ports or an
     * allocation for every worker */
    setenv("DDP_LOCAL_RANK", "0", 1);
    setenv("DDP_WORLD_SIZE", "9223372036854775807", 1);
    setenv("DDP_LOCAL_WORLD_SIZE", "9223372036854775807", 1);
    refused(DDP_CLUSTER_ENV, "DDP_WORLD_SIZE is 9223372036854775807: a world of more workers than ddp runs, 1048576");
    setenv("DDP_WORLD_SIZE", "1048576", 1);
    setenv("DDP_LOCAL_WORLD_SIZE", "1", 1);
    CHECK(resolves(DDP_CLUSTER_ENV, NULL, &c) && c.world == 1048576);
    ddp_cluster_free(&c);
    setenv("DDP_LOCAL_WORLD_SIZE", "65536", 1);
    refused(DDP_CLUSTER_ENV, "ports 1 to 65536 do not all exist");
    ddp_cluster_flags huge = {0, 1 << 21, -1, -1, "head:16000", 0};
    char err[256] = "";
    CHECK(!ddp_cluster_resolve(&(ddp_settings){.port_base = -1, .port_range = {10000, 20000}}, &huge, &c, err,
                               sizeof err) &&
          strstr(err, "--world-size is 2097152: a world of more workers"));
    clear();
    refused(DDP_CLUSTER_ENV, "cluster = env, but DDP_WORLD_SIZE is not set");
    CHECK(resolves(DDP_CLUSTER_AUTO, NULL, &c) && strcmp(c.source, "local") == 0 && c.world == 1 &&
          c.warning[0] == 0);
    ddp_cluster_free(&c);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--print") == 0) {
        ddp_settings s = settings(DDP_CLUSTER_AUTO, -1);
        ddp_cluster c;
        char err[512];
        if (!ddp_cluster_resolve(&s, NULL, &c, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        printf("%s rank %lld world %lld local %lld/%lld node %lld/%lld host %s coordinator %s:%lld\n", c.source,
               (long long)c.rank, (long long)c.world, (long long)c.local_rank, (long long)c.local_world,
               (long long)c.node, (long long)c.nodes, c.host, c.coordinator, (long long)c.port_base);
        ddp_cluster_free(&c);
        return 0;
    }
    test_slurm();
    test_variables_and_flags();
    printf("unit_cluster: %s (%d failed checks)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
