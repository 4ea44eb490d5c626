/* predict.c: the model's outputs for every sample of an evaluation (--predict), as
 * a NumPy .npy array or a CSV table, one row per sample in the dataset's order.
 *
 * Worker 0 writes the rows as each global batch is gathered to it, so the file is
 * never held in memory; the file replaces its target whole (files.c) once the last
 * row is in, so a run that fails leaves the old file, or none, never part of one.
 * Values keep the program's precision: float32 (bf16 outputs widened exactly) or
 * float64 for an f64 program; a CSV prints each with as many digits as give it back
 * exactly. Also the one-piece .npy writer of --dump-batch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

struct ddp_predictions {
    ddp_replacement file;
    bool csv, f64;
    int64_t elems;              /* per sample */
    int64_t expected, written;  /* rows */
};

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), t = strlen(tail);
    return n > t && strcmp(s + n - t, tail) == 0;
}

bool ddp_predictions_format_known(const char *path) {
    return ends_with(path, ".npy") || ends_with(path, ".csv");
}

/* NumPy's format 1.0: magic, version, header length, then a Python dict literal padded
 * with spaces to a multiple of 64 bytes and ended by a newline; arrays [samples, *dims]
 * of descr ("<f4", "<i4", ...). */
static void npy_header(FILE *f, const char *descr, int64_t samples, const int64_t *dims, int64_t rank) {
    char dict[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,", descr,
                     (long long)samples);
    for (int64_t d = 0; d < rank && d < 8; d++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, " %lld,", (long long)dims[d]);
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    int total = (10 + n + 1 + 63) / 64 * 64; /* magic to newline */
    while (10 + n + 1 < total)
        dict[n++] = ' ';
    dict[n++] = '\n';
    unsigned char lead[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(n & 0xff), (unsigned char)(n >> 8)};
    fwrite(lead, 1, sizeof lead, f);
    fwrite(dict, 1, (size_t)n, f);
}

static void csv_header(FILE *f, int64_t elems) {
    for (int64_t e = 0; e < elems; e++)
        fprintf(f, "%soutput_%lld", e ? "," : "", (long long)e);
    fputc('\n', f);
}

ddp_predictions *ddp_predictions_open(const char *path, const ddp_program *p, int64_t samples, char *err,
                                      size_t len) {
    ddp_predictions *w = calloc(1, sizeof *w);
    if (!w) {
        ddp_fail(err, len, "--predict %s: out of memory", path);
        return NULL;
    }
    *w = (ddp_predictions){.csv = ends_with(path, ".csv"), .f64 = p->dtype == DDP_F64, .elems = p->output_elems,
                           .expected = samples};
    if (!ddp_replace_open(&w->file, path, err, len)) {
        free(w);
        return NULL;
    }
    if (w->csv)
        csv_header(w->file.f, w->elems);
    else
        npy_header(w->file.f, w->f64 ? "<f8" : "<f4", samples, p->output_shape, p->output_rank);
    return w;
}

bool ddp_npy_write(const char *path, const char *descr, int64_t samples, const int64_t *dims, int64_t rank,
                   const void *values, size_t bytes, char *err, size_t len) {
    ddp_replacement file;
    if (!ddp_replace_open(&file, path, err, len))
        return false;
    npy_header(file.f, descr, samples, dims, rank);
    fwrite(values, 1, bytes, file.f);
    return ddp_replace_commit(&file, false, err, len);
}

bool ddp_predictions_add(ddp_predictions *w, const double *rows, int64_t n) {
    FILE *f = w->file.f;
    for (int64_t i = 0; i < n * w->elems; i++) {
        const char *sep = (i + 1) % w->elems ? "," : "\n";
        if (w->csv && w->f64) {
            fprintf(f, "%.17g%s", rows[i], sep);
        } else if (w->csv) {
            fprintf(f, "%.9g%s", (double)(float)rows[i], sep);
        } else if (w->f64) {
            fwrite(&rows[i], sizeof(double), 1, f);
        } else {
            float v = (float)rows[i];
            fwrite(&v, sizeof v, 1, f);
        }
    }
    w->written += n;
    return !ferror(f);
}

bool ddp_predictions_finish(ddp_predictions *w, char *err, size_t len) {
    bool ok = w->written == w->expected ||
              ddp_fail(err, len, "--predict %s: %lld rows gathered for %lld samples, which is a fault of ddp's "
                       "runtime: please report it", w->file.path, (long long)w->written, (long long)w->expected);
    if (ok)
        ok = ddp_replace_commit(&w->file, true, err, len);
    else
        ddp_replace_abandon(&w->file);
    free(w);
    return ok;
}

void ddp_predictions_abandon(ddp_predictions *w) {
    if (!w)
        return;
    ddp_replace_abandon(&w->file);
    free(w);
}
