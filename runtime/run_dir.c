/* run_dir.c: where a run keeps what it writes, and whether it continues an earlier one.
 *
 * A run's folder is --run-dir, or runs/MODEL-JOBID inside a Slurm job (so a requeued
 * job, which keeps its id, finds its own), or runs/MODEL-YYYYMMDD-HHMMSS elsewhere
 * (worker 0's clock, told to the others). It holds the checkpoints (the program's
 * relative checkpoint folder is taken inside it), metrics.jsonl and settings.txt.
 *
 * Worker 0 decides, the others are told: --resume continues from the run folder's
 * newest checkpoint, or (no --run-dir, none there) from the newest run of the same
 * model under runs/, whose folder the run then keeps; a requeued job
 * (SLURM_RESTART_COUNT) resumes by itself; a new run refuses a folder that already
 * holds checkpoints rather than mix two runs. With --check the same decision is made
 * and the checkpoint read, but no folder is made: only that it could be is checked. */
#include <dirent.h>
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"

extern char **environ;

/* mkdir -p; false with errno. */
static bool make_folders(const char *path) {
    char partial[2048];
    snprintf(partial, sizeof partial, "%s", path);
    for (char *p = partial + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(partial, 0777) != 0 && errno != EEXIST)
            return false;
        *p = '/';
    }
    return mkdir(partial, 0777) == 0 || errno == EEXIST;
}

/* Whether make_folders(path) could succeed, touching nothing: the path, or the nearest
 * folder above it that exists, is a folder this process may write in; false with errno. */
static bool folders_makeable(const char *path) {
    char at[2048];
    struct stat st;
    snprintf(at, sizeof at, "%s", path);
    while (stat(at, &st) != 0) {
        if (errno != ENOENT)
            return false;
        char *slash = strrchr(at, '/');
        if (!slash)
            snprintf(at, sizeof at, ".");
        else
            slash[slash == at] = 0; /* "/x" becomes "/" */
    }
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return false;
    }
    return access(at, W_OK | X_OK) == 0;
}

/* The checkpoint folder of a run folder: the program's own when absolute, else inside;
 * false when the path is too long. */
static bool checkpoint_folder(const ddp_program *p, const char *run_dir, char *out, size_t len) {
    const char *dir = p->settings.checkpoint_dir ? p->settings.checkpoint_dir : "checkpoints";
    int n = dir[0] == '/' ? snprintf(out, len, "%s", dir) : snprintf(out, len, "%s/%s", run_dir, dir);
    return n < (int)len;
}

/* The newest run of this model under runs/ whose checkpoint folder holds one (by its
 * newest checkpoint's time); false if none. */
static bool newest_run(const ddp_program *p, char *out, size_t len) {
    DIR *d = opendir("runs");
    if (!d)
        return false;
    size_t prefix = strlen(p->name);
    double best = -1;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, p->name, prefix) != 0 || e->d_name[prefix] != '-')
            continue;
        char run[2048], ckpt[2048];
        struct stat st;
        snprintf(run, sizeof run, "runs/%s", e->d_name);
        if (!checkpoint_folder(p, run, ckpt, sizeof ckpt) || !ddp_checkpoint_exists(ckpt) || stat(ckpt, &st) != 0)
            continue;
        double when = (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9;
        if (when > best) {
            best = when;
            snprintf(out, len, "%s", run);
        }
    }
    closedir(d);
    return best >= 0;
}

/* A new run's folder name. Outside Slurm two runs may start in the same second (a
 * sweep's runs started together): each takes the first name of runs/MODEL-STAMP,
 * runs/MODEL-STAMP-2, ... that it makes itself (claim: mkdir, which one process alone
 * succeeds in), or with --check the first that is not there; false with errno. */
static bool new_run_name(const ddp_config *cfg, const ddp_program *p, bool claim, char *out, size_t len) {
    if (cfg->cluster.job > 0) {
        snprintf(out, len, "runs/%s-%lld", p->name, (long long)cfg->cluster.job);
        return true;
    }
    time_t now = time(NULL);
    struct tm tm;
    char stamp[32];
    localtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    if (claim && !make_folders("runs"))
        return false;
    for (int k = 1; k < 1000; k++) {
        if (k == 1)
            snprintf(out, len, "runs/%s-%s", p->name, stamp);
        else
            snprintf(out, len, "runs/%s-%s-%d", p->name, stamp, k);
        struct stat st;
        if (claim ? mkdir(out, 0777) == 0 : stat(out, &st) != 0)
            return true;
        if (claim && errno != EEXIST)
            return false;
    }
    errno = EEXIST;
    return false;
}

/* Worker 0's decision, false with why. */
static bool decide(const ddp_config *cfg, const ddp_program *p, ddp_run_place *place, char *err, size_t len) {
    if (cfg->run_dir)
        snprintf(place->run_dir, sizeof place->run_dir, "%s", cfg->run_dir);
    else if (!new_run_name(cfg, p, !cfg->check && !cfg->resume, place->run_dir, sizeof place->run_dir))
        return ddp_fail(err, len, "cannot make a run folder under runs/: %s", strerror(errno));
    if (!checkpoint_folder(p, place->run_dir, place->checkpoint_dir, sizeof place->checkpoint_dir))
        return ddp_fail(err, len, "the run folder's path is too long: %s", place->run_dir);
    bool here = ddp_checkpoint_exists(place->checkpoint_dir);
    const char *restarts = getenv("SLURM_RESTART_COUNT");
    bool requeued = cfg->cluster.job > 0 && restarts && atoi(restarts) > 0;
    if (cfg->resume && cfg->resume_path) {
        snprintf(place->resume_from, sizeof place->resume_from, "%s", cfg->resume_path);
    } else if ((cfg->resume || requeued) && here) {
        snprintf(place->resume_from, sizeof place->resume_from, "%s", place->checkpoint_dir);
        if (!cfg->resume)
            snprintf(place->note, sizeof place->note, "the job was requeued (SLURM_RESTART_COUNT=%s): resuming",
                     restarts);
    } else if (cfg->resume && !cfg->run_dir && newest_run(p, place->run_dir, sizeof place->run_dir) &&
               checkpoint_folder(p, place->run_dir, place->checkpoint_dir, sizeof place->checkpoint_dir)) {
        snprintf(place->resume_from, sizeof place->resume_from, "%s", place->checkpoint_dir);
    } else if (cfg->resume) {
        return ddp_fail(err, len, "--resume: no checkpoint in %s%s: give the checkpoint or its folder "
                                  "(--resume PATH), or the run's folder (--run-dir)", place->checkpoint_dir,
                        cfg->run_dir ? "" : ", nor in any run of this model under runs/");
    } else if (here) {
        return ddp_fail(err, len, "%s already holds checkpoints of another run: pass --resume to continue it, or "
                                  "--run-dir for a new folder", place->checkpoint_dir);
    }
    place->resume = place->resume_from[0] != 0;
    bool (*make)(const char *) = cfg->check ? folders_makeable : make_folders;
    if (!make(place->run_dir))
        return ddp_fail(err, len, "cannot make the run folder %s: %s", place->run_dir, strerror(errno));
    if (!make(place->checkpoint_dir))
        return ddp_fail(err, len, "cannot make the checkpoint folder %s: %s", place->checkpoint_dir, strerror(errno));
    return true;
}

bool ddp_run_place_find(const ddp_config *cfg, const ddp_program *p, ddp_ring *ring, ddp_run_place *place, char *err,
                        size_t len) {
    memset(place, 0, sizeof *place);
    int rank = ring ? ddp_ring_rank(ring) : 0;
    char why[1024] = "";
    bool ok = rank != 0 || decide(cfg, p, place, why, sizeof why);
    place->refused = !ok;
    if (ring && !ddp_ring_broadcast(ring, place, sizeof *place, 0, err, len))
        return false;
    if (rank == 0 && !ok)
        return ddp_fail(err, len, "%s", why);
    return !place->refused || ddp_fail(err, len, "worker 0 refused the run folder (it says why)");
}

bool ddp_requeue_job(const ddp_cluster *c, char *err, size_t len) {
    if (c->job <= 0)
        return ddp_fail(err, len, "--requeue-on-signal: not in a Slurm job (no SLURM_JOB_ID)");
    char id[32];
    snprintf(id, sizeof id, "%lld", (long long)c->job);
    char *argv[] = {"scontrol", "requeue", id, NULL};
    pid_t pid;
    int status = 0, spawned = posix_spawnp(&pid, "scontrol", NULL, NULL, argv, environ);
    if (spawned != 0)
        return ddp_fail(err, len, "--requeue-on-signal: cannot run scontrol: %s", strerror(spawned));
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        continue;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return ddp_fail(err, len, "--requeue-on-signal: `scontrol requeue %s` failed (status %d): is the job "
                                  "requeueable (sbatch --requeue)?", id, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return true;
}
