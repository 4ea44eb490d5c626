/* tensorboard.c: TensorBoard event files, encoded by hand so a built program needs no
 * library: `events.out.tfevents.SECONDS.HOST` in the run folder, a TFRecord file of
 * Event protocol buffers.
 *
 * A record is its length (8 bytes, little-endian), the masked CRC-32C of those 8
 * bytes, the data, and the masked CRC-32C of the data; a masked CRC is
 * ((crc >> 15) | (crc << 17)) + 0xa282ead8. The first Event says file_version
 * "brain.Event:2"; each scalar is an Event {wall_time, step, summary {value {tag,
 * simple_value}}}. A resumed run starts a new file whose second Event is a SessionLog
 * START at the checkpoint's step, so TensorBoard drops the points the stopped run
 * wrote after it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"

struct ddp_events {
    FILE *f;
};

/* CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), bit by bit: records are few. */
static uint32_t crc32c(const unsigned char *data, size_t len) {
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < len; i++) {
        crc ^= data[i];
        for (int k = 0; k < 8; k++)
            crc = crc & 1 ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
    }
    return ~crc;
}

uint32_t ddp_masked_crc32c(const void *data, size_t len) {
    uint32_t crc = crc32c(data, len);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* ------------------------------------------------------- protocol buffers */

typedef struct Proto {
    unsigned char b[512];
    size_t n;
} Proto;

static void put_byte(Proto *p, unsigned char c) {
    if (p->n < sizeof p->b)
        p->b[p->n++] = c;
}

static void put_varint(Proto *p, uint64_t v) {
    for (; v >= 0x80; v >>= 7)
        put_byte(p, (unsigned char)(v | 0x80));
    put_byte(p, (unsigned char)v);
}

static void put_bytes(Proto *p, int field, const void *data, size_t len) {
    put_varint(p, (uint64_t)field << 3 | 2);
    put_varint(p, len);
    for (size_t i = 0; i < len; i++)
        put_byte(p, ((const unsigned char *)data)[i]);
}

static void put_fixed(Proto *p, int field, const void *value, int bytes) {
    put_varint(p, (uint64_t)field << 3 | (bytes == 8 ? 1 : 5));
    for (int i = 0; i < bytes; i++) /* little-endian, as x86-64 holds it */
        put_byte(p, ((const unsigned char *)value)[i]);
}

/* Event {wall_time = 1, step = 2, then the caller's field (already encoded)}. */
static Proto event(int64_t step, int field, const Proto *inner) {
    Proto e = {.n = 0};
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    double wall = (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
    put_fixed(&e, 1, &wall, 8);
    put_varint(&e, 2 << 3 | 0);
    put_varint(&e, (uint64_t)step);
    put_bytes(&e, field, inner->b, inner->n);
    return e;
}

static bool write_record(ddp_events *ev, const Proto *data) {
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)data->n >> (8 * i));
    uint32_t crcs[2] = {ddp_masked_crc32c(len, 8), ddp_masked_crc32c(data->b, data->n)};
    return fwrite(len, 1, 8, ev->f) == 8 && fwrite(&crcs[0], 4, 1, ev->f) == 1 &&
           fwrite(data->b, 1, data->n, ev->f) == data->n && fwrite(&crcs[1], 4, 1, ev->f) == 1;
}

/* ------------------------------------------------------------------ files */

ddp_events *ddp_events_open(const char *dir, int64_t resumed_step, char *err, size_t len) {
    char host[256] = "localhost", path[4096];
    gethostname(host, sizeof host - 1);
    snprintf(path, sizeof path, "%s/events.out.tfevents.%lld.%s", dir, (long long)time(NULL), host);
    ddp_events *ev = calloc(1, sizeof *ev);
    if (!ev || !(ev->f = fopen(path, "ab"))) {
        free(ev);
        ddp_fail(err, len, "%s: cannot write: %s", path, strerror(errno));
        return NULL;
    }
    Proto version = {.n = 0}, first;
    const char *v = "brain.Event:2";
    /* file_version is a plain field (3) of the Event, not a message */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    double wall = (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
    put_fixed(&version, 1, &wall, 8);
    put_bytes(&version, 3, v, strlen(v));
    bool ok = write_record(ev, &version);
    if (ok && resumed_step >= 0) {
        Proto start = {.n = 0};
        put_varint(&start, 1 << 3 | 0);
        put_varint(&start, 1); /* SessionLog.START */
        first = event(resumed_step, 7, &start); /* session_log */
        ok = write_record(ev, &first);
    }
    if (!ok || fflush(ev->f) != 0) {
        ddp_events_close(ev);
        ddp_fail(err, len, "%s: cannot write: %s", path, strerror(errno));
        return NULL;
    }
    return ev;
}

void ddp_events_scalar(ddp_events *ev, int64_t step, const char *tag, double value) {
    if (!ev)
        return;
    Proto one = {.n = 0}, summary = {.n = 0};
    float f = (float)value;
    put_bytes(&one, 1, tag, strlen(tag));
    put_fixed(&one, 2, &f, 4);
    put_bytes(&summary, 1, one.b, one.n);
    Proto e = event(step, 5, &summary);
    write_record(ev, &e);
}

void ddp_events_flush(ddp_events *ev) {
    if (ev)
        fflush(ev->f);
}

void ddp_events_close(ddp_events *ev) {
    if (!ev)
        return;
    fclose(ev->f);
    free(ev);
}
