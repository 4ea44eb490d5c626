/* trace.c: --trace FILE, a Chrome trace (chrome://tracing, Perfetto) of what each
 * worker did when: its forward, backward and optimizer spans and its waits for data
 * on one lane, its buckets' all-reduces on another, so the overlap of communication
 * with backward can be seen and measured. Each data wait carries the global indices
 * of the samples the batch held, which the tests use to check the shards.
 *
 * Spans are kept in memory (from the compute thread and the communication thread,
 * hence the lock) and written at the end: every worker turns its own into JSON, on
 * the coordinator's clock, and worker 0 gathers them into one file, one process per
 * rank. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime.h"

enum { MAX_SPANS = 1 << 22 };

typedef struct Span {
    const char *name;
    int lane;
    int64_t step, index, bytes;
    double begin, end;          /* us */
    int64_t first_sample, samples; /* into the sample list */
} Span;

struct ddp_trace {
    pthread_mutex_t lock;
    Span *spans;
    int64_t count, cap, dropped;
    int64_t *samples;
    int64_t nsamples, capsamples;
};

static const char *const lanes[] = {"compute", "communication"};

double ddp_trace_clock(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

ddp_trace *ddp_trace_new(void) {
    ddp_trace *t = calloc(1, sizeof *t);
    if (t)
        pthread_mutex_init(&t->lock, NULL);
    return t;
}

void ddp_trace_free(ddp_trace *t) {
    if (!t)
        return;
    pthread_mutex_destroy(&t->lock);
    free(t->spans);
    free(t->samples);
    free(t);
}

static bool grow(void **p, int64_t *cap, int64_t need, size_t size) {
    if (need <= *cap)
        return true;
    int64_t n = *cap ? *cap * 2 : 1024;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, (size_t)n * size);
    if (!q)
        return false;
    *p = q;
    *cap = n;
    return true;
}

void ddp_trace_span(ddp_trace *t, const ddp_trace_event *e) {
    if (!t)
        return;
    pthread_mutex_lock(&t->lock);
    Span s = {e->name, e->lane, e->step, e->index, e->bytes, e->begin, e->end, t->nsamples, 0};
    if (t->count >= MAX_SPANS || !grow((void **)&t->spans, &t->cap, t->count + 1, sizeof *t->spans)) {
        t->dropped++;
    } else {
        if (e->nsamples > 0 && grow((void **)&t->samples, &t->capsamples, t->nsamples + e->nsamples, sizeof(int64_t))) {
            memcpy(t->samples + t->nsamples, e->sample_ids, sizeof(int64_t) * (size_t)e->nsamples);
            t->nsamples += e->nsamples;
            s.samples = e->nsamples;
        }
        t->spans[t->count++] = s;
    }
    pthread_mutex_unlock(&t->lock);
}

/* ------------------------------------------------------------------ JSON */

/* A JSON string's body: the host names and labels are the job's own, but quoted. */
static void put_string(ddp_text *t, const char *s) {
    ddp_text_printf(t, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            ddp_text_printf(t, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            ddp_text_printf(t, "\\u%04x", *s);
        else
            ddp_text_printf(t, "%c", *s);
    }
    ddp_text_printf(t, "\"");
}

char *ddp_trace_json(ddp_trace *t, int rank, const char *host, double offset_ms, uint64_t ring_bytes,
                     size_t *len) {
    ddp_text out = {0};
    char label[512];
    snprintf(label, sizeof label, "rank %d on %s", rank, host);
    ddp_text_printf(&out, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":", rank);
    put_string(&out, label);
    ddp_text_printf(&out, "}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"sort_index\":%d}}", rank,
        rank);
    for (int lane = 0; lane < 2; lane++)
        ddp_text_printf(&out, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}", rank,
            lane, lanes[lane]);
    pthread_mutex_lock(&t->lock);
    double shift = offset_ms * 1000, last = 0;
    for (int64_t i = 0; i < t->count; i++) {
        const Span *s = &t->spans[i];
        ddp_text_printf(&out, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
            "\"args\":{\"step\":%lld", s->name, lanes[s->lane], rank, s->lane, s->begin - shift, s->end - s->begin,
            (long long)s->step);
        if (s->index >= 0)
            ddp_text_printf(&out, ",\"bucket\":%lld,\"bytes\":%lld", (long long)s->index, (long long)s->bytes);
        if (s->samples > 0 || strcmp(s->name, "data wait") == 0) {
            ddp_text_printf(&out, ",\"samples\":[");
            for (int64_t k = 0; k < s->samples; k++)
                ddp_text_printf(&out, "%s%lld", k ? "," : "", (long long)t->samples[s->first_sample + k]);
            ddp_text_printf(&out, "]");
        }
        ddp_text_printf(&out, "}}");
        last = s->end > last ? s->end : last;
    }
    ddp_text_printf(&out, ",\n{\"name\":\"ring bytes sent\",\"ph\":\"C\",\"pid\":%d,\"ts\":%.3f,\"args\":{\"bytes\":%llu}}",
        rank, last - shift, (unsigned long long)ring_bytes);
    if (t->dropped)
        ddp_text_printf(&out, ",\n{\"name\":\"spans not recorded (the trace is full)\",\"ph\":\"C\",\"pid\":%d,\"ts\":%.3f,"
            "\"args\":{\"spans\":%lld}}", rank, last - shift, (long long)t->dropped);
    pthread_mutex_unlock(&t->lock);
    if (out.failed) {
        free(out.s);
        return NULL;
    }
    *len = out.len;
    return out.s;
}

bool ddp_trace_write(const char *path, char *const *parts, const size_t *lens, int n, char *err, size_t errlen) {
    ddp_replacement w;
    char why[4400];
    if (!ddp_replace_open(&w, path, why, sizeof why))
        return ddp_fail(err, errlen, "--trace %s", why);
    fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", w.f);
    for (int i = 0; i < n; i++) {
        if (i)
            fputs(",\n", w.f);
        fwrite(parts[i], 1, lens[i], w.f);
    }
    fputs("\n]}\n", w.f);
    return ddp_replace_commit(&w, false, why, sizeof why) || ddp_fail(err, errlen, "--trace %s", why);
}
