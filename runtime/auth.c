/* auth.c: how two processes of one job prove it to each other before either trusts
 * a byte the other sends.
 *
 * Two ways, chosen at start the same way on every worker (munge first):
 * - munge, inside a Slurm job step where munged answers: each side encodes a
 *   credential over the other's fresh nonce and the job and step ids; the decoder
 *   learns the encoder's uid from munged and accepts only its own user, the same job
 *   step and its own nonce (so a recorded credential cannot be replayed);
 * - a shared secret (DDP_SECRET, which ddprun draws afresh; the ring uses a key the
 *   coordinator draws): each side sends HMAC-SHA-256 of both nonces under the secret.
 * Both are a challenge and a response each way: the acceptor sends a nonce, the
 * connector answers with its own nonce and its proof, the acceptor answers with its
 * proof. libmunge is opened when asked for, so programs run where it is absent. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "runtime.h"
#include "sha256.h"

enum { NONCE = 16, MAX_PROOF = 4096 };

/* libmunge's entry points (munge.h), a context of NULL meaning the defaults. */
typedef int (*munge_encode_fn)(char **cred, void *ctx, const void *buf, int len);
typedef int (*munge_decode_fn)(const char *cred, void *ctx, void **buf, int *len, uid_t *uid, gid_t *gid);
typedef const char *(*munge_strerror_fn)(int e);

static struct {
    munge_encode_fn encode;
    munge_decode_fn decode;
    munge_strerror_fn strerror;
} munge;

bool ddp_random_bytes(void *out, size_t len) {
    for (char *p = out; len;) {
        ssize_t k = getrandom(p, len, 0);
        if (k <= 0)
            return false;
        p += k;
        len -= (size_t)k;
    }
    return true;
}

static bool load_munge(char *why, size_t len);

/* libmunge loaded (once, whichever thread asks first) and munged answering, or false
 * with why. */
static bool munge_works(char *why, size_t len) {
    static pthread_mutex_t loading = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&loading);
    bool loaded = load_munge(why, len);
    pthread_mutex_unlock(&loading);
    if (!loaded)
        return false;
    char *cred = NULL;
    int e = munge.encode(&cred, NULL, "ddp", 3);
    free(cred);
    return e == 0 || ddp_fail(why, len, "munged does not answer: %s", munge.strerror(e));
}

static bool load_munge(char *why, size_t len) {
    if (!munge.encode) {
        void *lib = dlopen("libmunge.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!lib)
            return ddp_fail(why, len, "libmunge.so.2 is not installed");
        munge.encode = (munge_encode_fn)dlsym(lib, "munge_encode");
        munge.decode = (munge_decode_fn)dlsym(lib, "munge_decode");
        munge.strerror = (munge_strerror_fn)dlsym(lib, "munge_strerror");
        if (!munge.encode || !munge.decode || !munge.strerror) {
            munge.encode = NULL;
            return ddp_fail(why, len, "libmunge.so.2 lacks munge_encode");
        }
    }
    return true;
}

bool ddp_auth_init(ddp_auth *a, const ddp_cluster *c, char *err, size_t errlen) {
    memset(a, 0, sizeof *a);
    const char *secret = getenv("DDP_SECRET");
    char why[256] = "";
    if (strcmp(c->source, "slurm") == 0 && munge_works(why, sizeof why)) {
        a->munge = true;
        snprintf(a->scope, sizeof a->scope, "slurm job %lld step %lld", (long long)c->job, (long long)c->step);
        return true;
    }
    if (!secret || !*secret) {
        if (why[0])
            return ddp_fail(err, errlen, "the job's workers cannot prove to each other that they belong to it: "
                                         "munge cannot be used (%s) and DDP_SECRET is not set. Export the same "
                                         "random DDP_SECRET to every task (srun passes it on)", why);
        return ddp_fail(err, errlen, "DDP_SECRET is not set: workers started without Slurm prove to each other "
                                     "that they belong to one job with a shared secret. Export the same random "
                                     "DDP_SECRET to every worker, or start them with ddprun, which draws one");
    }
    ddp_sha256_digest(secret, strlen(secret), a->key);
    /* two jobs started by hand with one secret still refuse each other's workers */
    snprintf(a->scope, sizeof a->scope, "secret port %lld world %lld", (long long)c->port_base, (long long)c->world);
    return true;
}

void ddp_auth_with_key(ddp_auth *a, const unsigned char key[32], const char *scope) {
    memset(a, 0, sizeof *a);
    memcpy(a->key, key, sizeof a->key);
    snprintf(a->scope, sizeof a->scope, "%s", scope);
}

/* ------------------------------------------------------------------ proofs */

/* What a side proves: its role, the scope, the nonce it answers and its own. */
static void statement(const ddp_auth *a, const char *role, const unsigned char *answered,
                      const unsigned char *own, unsigned char *out, size_t *len) {
    size_t n = 0, r = strlen(role), s = strlen(a->scope);
    memcpy(out + n, role, r), n += r;
    out[n++] = 0;
    memcpy(out + n, a->scope, s), n += s;
    out[n++] = 0;
    memcpy(out + n, answered, NONCE), n += NONCE;
    memcpy(out + n, own, NONCE), n += NONCE;
    *len = n;
}

/* The proof of a statement into a frame's payload: a MAC, or a munge credential. */
static bool make_proof(const ddp_auth *a, const unsigned char *st, size_t len, char *out, size_t *outlen,
                       char *err, size_t errlen) {
    if (!a->munge) {
        const void *parts[] = {st};
        ddp_hmac_sha256(a->key, sizeof a->key, parts, &len, 1, (unsigned char *)out);
        *outlen = 32;
        return true;
    }
    char *cred = NULL;
    int e = munge.encode(&cred, NULL, st, (int)len);
    if (e != 0 || strlen(cred) >= MAX_PROOF) {
        free(cred);
        return ddp_fail(err, errlen, "munge could not encode a credential: %s", munge.strerror(e));
    }
    *outlen = strlen(cred);
    memcpy(out, cred, *outlen);
    free(cred);
    return true;
}

static bool check_proof(const ddp_auth *a, const unsigned char *st, size_t len, const char *proof, size_t plen,
                        char *err, size_t errlen) {
    if (!a->munge) {
        unsigned char want[32];
        const void *parts[] = {st};
        ddp_hmac_sha256(a->key, sizeof a->key, parts, &len, 1, want);
        return (plen == 32 && ddp_equal_secret(want, proof, 32)) ||
               ddp_fail(err, errlen, "its proof does not match %s", strcmp(a->scope, "ring") == 0
                        ? "the key the coordinator drew for this job's ring" : "this job's secret (DDP_SECRET differs)");
    }
    void *payload = NULL;
    int got = 0;
    uid_t uid;
    gid_t gid;
    char cred[MAX_PROOF + 1];
    memcpy(cred, proof, plen);
    cred[plen] = 0;
    int e = munge.decode(cred, NULL, &payload, &got, &uid, &gid);
    bool same = e == 0 && (size_t)got == len && memcmp(payload, st, len) == 0;
    free(payload);
    if (e != 0)
        return ddp_fail(err, errlen, "munge refused its credential: %s", munge.strerror(e));
    if (uid != geteuid())
        return ddp_fail(err, errlen, "its credential is user %u's, not this job's user %u", (unsigned)uid,
                        (unsigned)geteuid());
    return same || ddp_fail(err, errlen, "its credential is for another job step or another challenge");
}

/* ---------------------------------------------------------- the handshake */

static bool receive(int fd, int type, ddp_frame *f, size_t least, double deadline, char *err, size_t errlen) {
    if (!ddp_frame_recv(fd, f, MAX_PROOF + 64, deadline, err, errlen))
        return false;
    if (f->type == type && f->len >= least)
        return true;
    ddp_frame_free(f);
    return ddp_fail(err, errlen, "it sent an unexpected message");
}

bool ddp_auth_accept(const ddp_auth *a, int fd, double deadline, char *err, size_t errlen) {
    unsigned char mine[NONCE + 1], st[512];
    char proof[MAX_PROOF];
    size_t len, plen;
    ddp_frame f;
    mine[0] = a->munge;
    if (!ddp_random_bytes(mine + 1, NONCE))
        return ddp_fail(err, errlen, "cannot draw a nonce");
    if (!ddp_frame_send(fd, DDP_MSG_CHALLENGE, mine, sizeof mine, deadline))
        return ddp_fail(err, errlen, "it left before the challenge");
    if (!receive(fd, DDP_MSG_PROOF, &f, NONCE, deadline, err, errlen))
        return false;
    statement(a, "connector", mine + 1, (unsigned char *)f.data, st, &len);
    bool ok = f.len - NONCE <= MAX_PROOF &&
              check_proof(a, st, len, f.data + NONCE, f.len - NONCE, err, errlen);
    if (ok) {
        statement(a, "acceptor", (unsigned char *)f.data, mine + 1, st, &len);
        ok = make_proof(a, st, len, proof, &plen, err, errlen);
    }
    ddp_frame_free(&f);
    return ok && (ddp_frame_send(fd, DDP_MSG_PROOF, proof, plen, deadline) ||
                  ddp_fail(err, errlen, "it left before the proof"));
}

bool ddp_auth_connect(const ddp_auth *a, int fd, double deadline, char *err, size_t errlen) {
    unsigned char mine[NONCE], st[512];
    char answer[NONCE + MAX_PROOF];
    size_t len, plen;
    ddp_frame f;
    if (!receive(fd, DDP_MSG_CHALLENGE, &f, NONCE + 1, deadline, err, errlen))
        return false;
    unsigned char theirs[NONCE];
    memcpy(theirs, f.data + 1, NONCE);
    bool their_munge = f.data[0] != 0;
    ddp_frame_free(&f);
    if (their_munge != a->munge)
        return ddp_fail(err, errlen, "it proves itself with %s and this worker with %s: start every worker "
                                     "the same way (all under srun, or all with the same DDP_SECRET)",
                        their_munge ? "munge" : "a secret", a->munge ? "munge" : "a secret");
    if (!ddp_random_bytes(mine, NONCE))
        return ddp_fail(err, errlen, "cannot draw a nonce");
    memcpy(answer, mine, NONCE);
    statement(a, "connector", theirs, mine, st, &len);
    if (!make_proof(a, st, len, answer + NONCE, &plen, err, errlen))
        return false;
    if (!ddp_frame_send(fd, DDP_MSG_PROOF, answer, NONCE + plen, deadline))
        return ddp_fail(err, errlen, "it closed the connection during the handshake");
    char why[256];
    if (!receive(fd, DDP_MSG_PROOF, &f, 1, deadline, why, sizeof why))
        return ddp_fail(err, errlen, "it did not accept this worker's proof (%s)", why);
    statement(a, "acceptor", mine, theirs, st, &len);
    bool ok = f.len <= MAX_PROOF && check_proof(a, st, len, f.data, f.len, err, errlen);
    ddp_frame_free(&f);
    return ok;
}
