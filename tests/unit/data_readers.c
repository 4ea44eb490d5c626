/* data_readers.c: the dataset readers against files written here, in a fresh temporary
 * folder: good files of every format (IDX plain and gzip, CIFAR-10 batches, .npy in C
 * and Fortran order, either byte order, versions 1 to 3, CSV with quotes and CRLF)
 * whose values are checked exactly, and broken ones of every kind, each of which must
 * be refused with a message that names the file and says what is wrong. Then the checks
 * against a model (ddp_data_fits, on a ddp_program made by hand) and batches in f32 and
 * f64, scaled, one-hot and synthetic. Every .npy input dtype with every label dtype
 * and label shape ([N] and [N, 1]), at CIFAR's 3,072 values a sample: arrays of
 * different sizes, so a reader that mixed up their counts reads past one (which the
 * sanitizers and valgrind catch, whatever order a compiler evaluates arguments in).
 * Then .npy datasets of several files, given as two patterns. Last, an uncompressed
 * file is mapped (opening it costs no memory of the process's own), one changed in
 * place while mapped is found, and one cut short while mapped ends the worker with a
 * line naming it. */
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "bf16.h"
#include "runtime.h"

static bool verbose; /* --verbose: print every message checked */
static char root[] = "/tmp/ddp_data_readers_XXXXXX";
static char created[256][64]; /* below root, removed at the end, last first */
static int ncreated;

/* ------------------------------------------------------------ writing files */

static void remember(const char *name) {
    if (ncreated < 256)
        snprintf(created[ncreated++], sizeof created[0], "%s", name);
}

static const char *path_of(const char *name) {
    static char path[4][256];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", root, name);
    return p;
}

static void write_file(const char *name, const void *data, size_t len) {
    FILE *f = fopen(path_of(name), "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path_of(name));
        exit(2);
    }
    remember(name);
}

static void write_gzip(const char *name, const void *data, size_t len) {
    gzFile f = gzopen(path_of(name), "wb");
    if (!f || gzwrite(f, data, (unsigned)len) != (int)len || gzclose(f) != Z_OK) {
        fprintf(stderr, "cannot write %s\n", path_of(name));
        exit(2);
    }
    remember(name);
}

static void make_folder(const char *name) {
    if (mkdir(path_of(name), 0700) != 0) {
        perror(path_of(name));
        exit(2);
    }
    remember(name);
}

static void write_text(const char *name, const char *text) {
    write_file(name, text, strlen(text));
}

/* A file being built; every file here fits. */
typedef struct bytes {
    unsigned char data[1 << 16];
    size_t len;
} bytes;

static void put(bytes *b, const void *p, size_t n) {
    if (n) /* p may be NULL then */
        memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void put_be32(bytes *b, uint32_t v) {
    unsigned char c[4] = {v >> 24, v >> 16 & 0xff, v >> 8 & 0xff, v & 0xff};
    put(b, c, 4);
}

/* values of width bytes, host order, written big-endian */
static void put_big_endian(bytes *b, const void *values, size_t count, int width) {
    const unsigned char *v = values;
    for (size_t i = 0; i < count; i++)
        for (int k = width - 1; k >= 0; k--)
            put(b, v + i * (size_t)width + (size_t)k, 1);
}

/* An IDX file: type byte, dims, then count values of width bytes (host order). */
static bytes *idx(int type, int rank, const uint32_t *dims, const void *values, size_t count, int width) {
    static bytes b;
    b.len = 0;
    unsigned char magic[4] = {0, 0, (unsigned char)type, (unsigned char)rank};
    put(&b, magic, 4);
    for (int i = 0; i < rank; i++)
        put_be32(&b, dims[i]);
    put_big_endian(&b, values, count, width);
    return &b;
}

/* An .npy file of the given version and header dict; the values as given. */
static bytes *npy(int version, const char *dict, const void *values, size_t len) {
    static bytes b;
    b.len = 0;
    put(&b, "\x93NUMPY", 6);
    unsigned char v[2] = {(unsigned char)version, 0};
    put(&b, v, 2);
    size_t prefix = version == 1 ? 10 : 12, header = strlen(dict) + 1;
    size_t padded = (prefix + header + 63) / 64 * 64 - prefix;
    unsigned char n[4] = {padded & 0xff, padded >> 8 & 0xff, padded >> 16 & 0xff, padded >> 24};
    put(&b, n, version == 1 ? 2 : 4);
    put(&b, dict, strlen(dict));
    while (b.len < prefix + padded - 1)
        put(&b, " ", 1);
    put(&b, "\n", 1);
    put(&b, values, len);
    return &b;
}

/* ------------------------------------------------------------- opening */

static ddp_dataset dataset(int kind, const char *name, const char *path0, const char *path1) {
    return (ddp_dataset){.name = name, .kind = kind, .path = {path0, path1}, .scale = 1};
}

/* Opened, and every input checked as one worker checks them. */
static bool open_checked(const ddp_dataset *spec, ddp_data *d, char *err, size_t errlen) {
    if (!ddp_data_open(spec, root, d, err, errlen))
        return false;
    if (ddp_data_check_inputs(d, NULL, 0, 1, err, errlen))
        return true;
    ddp_data_free(d);
    return false;
}

static bool open_ok(const ddp_dataset *spec, ddp_data *d) {
    char err[1024] = "";
    bool ok = open_checked(spec, d, err, sizeof err);
    if (!ok)
        fprintf(stderr, "unexpected failure: %s\n", err);
    CHECK(ok);
    return ok;
}

static bool contains_all(const char *text, va_list ap) {
    bool all = true;
    for (const char *phrase; (phrase = va_arg(ap, const char *));)
        if (!strstr(text, phrase)) {
            fprintf(stderr, "  message lacks \"%s\"\n", phrase);
            all = false;
        }
    return all;
}

/* The message of a failure must contain every phrase (a NULL ends them). */
static void check_message(int line, bool ok, const char *err, ...) {
    va_list ap;
    va_start(ap, err);
    if (verbose && !ok)
        printf("%s\n", err);
    if (ok) {
        fprintf(stderr, "%s:%d: expected a failure\n", __FILE__, line);
        failures++;
    } else if (!contains_all(err, ap) || strchr(err, '\n')) {
        fprintf(stderr, "%s:%d: message: %s\n", __FILE__, line, err);
        failures++;
    }
    va_end(ap);
}

#define OPEN_FAILS(spec, ...)                                                                                \
    do {                                                                                                     \
        ddp_data d_;                                                                                         \
        char err_[1024] = "";                                                                                \
        bool ok_ = open_checked(spec, &d_, err_, sizeof err_);                                               \
        check_message(__LINE__, ok_, err_, __VA_ARGS__, NULL);                                               \
        CHECK(d_.inputs == NULL && d_.labels == NULL && d_.samples == 0);                                    \
        ddp_data_free(&d_);                                                                                  \
    } while (0)

#define FITS_FAILS(d, p, ...)                                                                                \
    do {                                                                                                     \
        char err_[1024] = "";                                                                                \
        bool ok_ = ddp_data_fits(d, p, err_, sizeof err_);                                                   \
        check_message(__LINE__, ok_, err_, __VA_ARGS__, NULL);                                               \
    } while (0)

static bool fits(const ddp_data *d, const ddp_program *p) {
    char err[1024] = "";
    bool ok = ddp_data_fits(d, p, err, sizeof err);
    if (!ok)
        fprintf(stderr, "unexpected misfit: %s\n", err);
    return ok;
}

/* ------------------------------------------------------------------ IDX */

static const uint32_t image_dims[] = {3, 2, 2}, label_dims[] = {3};
static const uint8_t image_values[12] = {0, 1, 2, 3, 10, 11, 12, 13, 200, 201, 202, 255};
static const uint8_t label_values[3] = {2, 0, 1};

static void write_idx_pair(const char *images, const char *labels) {
    bytes *b = idx(0x08, 3, image_dims, image_values, 12, 1);
    write_file(images, b->data, b->len);
    b = idx(0x08, 1, label_dims, label_values, 3, 1);
    write_file(labels, b->data, b->len);
}

static void test_idx_plain(void) {
    write_idx_pair("img.idx", "lbl.idx");
    ddp_dataset spec = dataset(DDP_DATA_IDX, "tiny", "img.idx", "lbl.idx");
    ddp_data d;
    if (!open_ok(&spec, &d))
        return;
    CHECK(d.samples == 3 && d.rank == 2 && d.shape[0] == 2 && d.shape[1] == 2 && d.elems == 4);
    CHECK(d.elem == DDP_ELEM_U8 && memcmp(d.inputs, image_values, 12) == 0);
    CHECK(d.label_elems == 1 && d.integral_labels);
    CHECK(d.labels[0] == 2 && d.labels[1] == 0 && d.labels[2] == 1);
    CHECK(strcmp(d.where, path_of("img.idx")) == 0 && strcmp(d.label_where, path_of("lbl.idx")) == 0);
    ddp_data_free(&d);
    CHECK(d.inputs == NULL && d.samples == 0);
}

static void test_idx_gzip(void) {
    static const uint32_t dims[] = {2, 3}, ldims[] = {2, 2};
    static const int16_t values[6] = {-300, 1000, 0, -1, 32767, -32768};
    static const int32_t labels[4] = {5, -7, 1 << 20, 0};
    bytes *b = idx(0x0B, 2, dims, values, 6, 2);
    write_gzip("img16.gz", b->data, b->len);
    b = idx(0x0C, 2, ldims, labels, 4, 4);
    write_gzip("lbl32.gz", b->data, b->len);
    ddp_dataset spec = dataset(DDP_DATA_IDX, "gz", "img16.gz", path_of("lbl32.gz")); /* absolute too */
    ddp_data d;
    if (!open_ok(&spec, &d))
        return;
    CHECK(d.samples == 2 && d.rank == 1 && d.shape[0] == 3 && d.elem == DDP_ELEM_I16);
    CHECK(memcmp(d.inputs, values, sizeof values) == 0);
    CHECK(d.label_elems == 2 && d.labels[0] == 5 && d.labels[1] == -7 && d.labels[2] == 1 << 20);
    ddp_data_free(&d);

    static const float floats[4] = {0.5f, -1.25f, 3e10f, 0};
    static const double doubles[2] = {0.25, 1.0};
    static const uint32_t fdims[] = {2, 2}, ddims[] = {2};
    b = idx(0x0D, 2, fdims, floats, 4, 4);
    write_gzip("f32.gz", b->data, b->len);
    b = idx(0x0E, 1, ddims, doubles, 2, 8);
    write_file("f64.idx", b->data, b->len);
    spec = dataset(DDP_DATA_IDX, "floats", "f32.gz", "f64.idx");
    if (!open_ok(&spec, &d))
        return;
    CHECK(d.elem == DDP_ELEM_F32 && memcmp(d.inputs, floats, sizeof floats) == 0);
    CHECK(d.labels[0] == 0.25 && d.labels[1] == 1.0 && !d.integral_labels);
    ddp_data_free(&d);
}

static void test_idx_broken(void) {
    ddp_dataset spec = dataset(DDP_DATA_IDX, "fashion_train", "missing.gz", "lbl.idx");
    OPEN_FAILS(&spec, "missing.gz: no such file", "the dataset `fashion_train`, images", "--data-root");

    write_file("empty.idx", "", 0);
    spec.path[0] = "empty.idx";
    OPEN_FAILS(&spec, "empty.idx: the file is empty");

    bytes *b = idx(0x08, 3, image_dims, image_values, 12, 1);
    write_file("short.idx", b->data, b->len - 8);
    spec.path[0] = "short.idx";
    OPEN_FAILS(&spec,
               "short.idx: truncated: the header promises 3 images of 2x2 (28 bytes) but the file has 20 "
               "bytes",
               "download it again");

    write_file("long.idx", b->data, b->len);
    FILE *f = fopen(path_of("long.idx"), "ab");
    fputs("junk", f);
    fclose(f);
    spec.path[0] = "long.idx";
    OPEN_FAILS(&spec, "long.idx: 4 bytes too many");

    write_gzip("cut.gz", b->data, b->len);
    FILE *g = fopen(path_of("cut.gz"), "rb");
    unsigned char whole[256];
    size_t n = fread(whole, 1, sizeof whole, g);
    fclose(g);
    write_file("cut.gz", whole, n - 6); /* the stream's trailer cut off */
    spec.path[0] = "cut.gz";
    OPEN_FAILS(&spec, "cut.gz: the gzip stream ends early");
    whole[n - 6] ^= 0xff; /* the CRC no longer matches */
    write_file("crc.gz", whole, n);
    spec.path[0] = "crc.gz";
    OPEN_FAILS(&spec, "crc.gz: the gzip data is damaged (");

    unsigned char bad[32];
    memcpy(bad, b->data, 28);
    bad[0] = 1;
    write_file("magic.idx", bad, 28);
    spec.path[0] = "magic.idx";
    OPEN_FAILS(&spec, "magic.idx: not an IDX file");

    memcpy(bad, b->data, 28);
    bad[2] = 0x07;
    write_file("type.idx", bad, 28);
    spec.path[0] = "type.idx";
    OPEN_FAILS(&spec, "type.idx: unknown IDX element type 0x07");

    static const uint32_t four[] = {4};
    static const uint8_t four_labels[4] = {0, 1, 2, 3};
    b = idx(0x08, 1, four, four_labels, 4, 1);
    write_file("four.idx", b->data, b->len);
    spec = dataset(DDP_DATA_IDX, "pair", "img.idx", "four.idx");
    OPEN_FAILS(&spec, "four.idx: holds 4 labels but", "img.idx holds 3 images");

    static const uint32_t cube[] = {3, 1, 1};
    b = idx(0x08, 3, cube, label_values, 3, 1);
    write_file("cube.idx", b->data, b->len);
    spec.path[1] = "cube.idx";
    OPEN_FAILS(&spec, "cube.idx: IDX rank 3", "labels");

    static const float nan_images[4] = {1, 2, NAN, 4};
    static const uint32_t nan_dims[] = {2, 2}, two[] = {2};
    b = idx(0x0D, 2, nan_dims, nan_images, 4, 4);
    write_file("nan.idx", b->data, b->len);
    b = idx(0x08, 1, two, label_values, 2, 1);
    write_file("two.idx", b->data, b->len);
    spec = dataset(DDP_DATA_IDX, "nan", "nan.idx", "two.idx");
    OPEN_FAILS(&spec, "nan.idx: sample 1 holds NaN (element 0)");
    static const double inf_labels[4] = {0, 1, 2, -INFINITY};
    b = idx(0x0E, 2, nan_dims, inf_labels, 4, 8);
    write_file("inf.idx", b->data, b->len);
    spec = dataset(DDP_DATA_IDX, "inf", "f32.gz", "inf.idx");
    OPEN_FAILS(&spec, "inf.idx: the label of sample 1 holds -inf (value 1)");
}

/* ------------------------------------------------------------- CIFAR-10 */

enum { RECORD = 3073 };

/* Record r of a batch: label, then the planes with a value that tells pixel and channel. */
static void cifar_record(unsigned char *rec, int label, int seed) {
    rec[0] = (unsigned char)label;
    for (int c = 0; c < 3; c++)
        for (int p = 0; p < 1024; p++)
            rec[1 + c * 1024 + p] = (unsigned char)(seed * 31 + c * 7 + p);
}

static void write_cifar_batch(const char *name, int records, int first_seed) {
    static unsigned char data[4 * RECORD];
    for (int r = 0; r < records; r++)
        cifar_record(data + r * RECORD, (first_seed + r) % 10, first_seed + r);
    write_file(name, data, (size_t)records * RECORD);
}

static void test_cifar10(void) {
    make_folder("cifar");
    static const char *const names[] = {"cifar/data_batch_1.bin", "cifar/data_batch_2.bin",
                                        "cifar/data_batch_3.bin", "cifar/data_batch_4.bin",
                                        "cifar/data_batch_5.bin"};
    for (int i = 0; i < 5; i++)
        write_cifar_batch(names[i], i == 0 ? 2 : 1, i == 0 ? 0 : i + 1); /* seeds 0..5 */
    write_cifar_batch("cifar/test_batch.bin", 3, 20);
    ddp_dataset spec = dataset(DDP_DATA_CIFAR10, "cifar_train", "cifar", NULL);
    ddp_data d;
    if (open_ok(&spec, &d)) {
        CHECK(d.samples == 6 && d.rank == 3 && d.shape[0] == 32 && d.shape[1] == 32 && d.shape[2] == 3);
        CHECK(d.elem == DDP_ELEM_U8 && d.elems == 3072 && d.label_elems == 1);
        bool transposed = true;
        for (int s = 0; s < 6; s++) {
            CHECK(d.labels[s] == s % 10);
            const unsigned char *image = (const unsigned char *)d.inputs + s * 3072;
            for (int p = 0; p < 1024; p++)
                for (int c = 0; c < 3; c++)
                    transposed &= image[p * 3 + c] == (unsigned char)(s * 31 + c * 7 + p);
        }
        CHECK(transposed);
        ddp_data_free(&d);
    }
    spec.part = 1;
    if (open_ok(&spec, &d)) {
        CHECK(d.samples == 3 && d.labels[2] == 2);
        ddp_data_free(&d);
    }

    static unsigned char data[2 * RECORD + 5];
    cifar_record(data, 1, 0);
    cifar_record(data + RECORD, 10, 1);
    write_file("cifar/test_batch.bin", data, RECORD + 5);
    OPEN_FAILS(&spec, "cifar/test_batch.bin: 3078 bytes is not a whole number of 3073-byte records");
    write_file("cifar/test_batch.bin", data, 2 * RECORD);
    OPEN_FAILS(&spec, "cifar/test_batch.bin: record 1 has the label 10, but CIFAR-10 labels are 0..9");

    unlink(path_of("cifar/data_batch_3.bin"));
    spec.part = 0;
    OPEN_FAILS(&spec, "cifar/data_batch_3.bin: no such file", "in the folder", "cifar_train");
    spec.path[0] = "no_cifar";
    OPEN_FAILS(&spec, "no_cifar: no such folder");
}

/* ------------------------------------------------------------------ npy */

static void test_npy_good(void) {
    static const float inputs[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11.5f};
    static const int64_t labels[3] = {1, 0, 2};
    bytes *b =
        npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2, 2), }", inputs, sizeof inputs);
    write_file("x.npy", b->data, b->len);
    b = npy(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", labels, sizeof labels);
    write_file("y.npy", b->data, b->len);
    ddp_dataset spec = dataset(DDP_DATA_NPY, "arrays", "x.npy", "y.npy");
    ddp_data d;
    if (open_ok(&spec, &d)) {
        CHECK(d.samples == 3 && d.rank == 2 && d.shape[0] == 2 && d.shape[1] == 2 && d.elem == DDP_ELEM_F32);
        CHECK(memcmp(d.inputs, inputs, sizeof inputs) == 0 && d.labels[2] == 2 && d.integral_labels);
        ddp_data_free(&d);
    }

    /* (2, 3, 4) in Fortran order: element [i][j][k] stored at i + 2 j + 6 k */
    int16_t fortran[24], c_order[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++) {
                c_order[i * 12 + j * 4 + k] = (int16_t)(100 * i + 10 * j + k);
                fortran[i + 2 * j + 6 * k] = (int16_t)(100 * i + 10 * j + k);
            }
    b = npy(1, "{'descr': '<i2', 'fortran_order': True, 'shape': (2, 3, 4), }", fortran, sizeof fortran);
    write_file("fortran.npy", b->data, b->len);
    /* labels (2, 2) in Fortran order, big-endian f8, v2 header */
    static const double label_f[4] = {0.5, 1.5, 2.5, 3.5}; /* [[0.5, 2.5], [1.5, 3.5]] */
    static bytes tmp;
    put_big_endian(&tmp, label_f, 4, 8);
    b = npy(2, "{'descr': '>f8', 'fortran_order': True, 'shape': (2, 2), }", tmp.data, tmp.len);
    write_file("yf.npy", b->data, b->len);
    spec = dataset(DDP_DATA_NPY, "fortran", "fortran.npy", "yf.npy");
    if (open_ok(&spec, &d)) {
        CHECK(d.samples == 2 && d.rank == 2 && d.shape[0] == 3 && d.shape[1] == 4 && d.elem == DDP_ELEM_I16);
        CHECK(memcmp(d.inputs, c_order, sizeof c_order) == 0);
        CHECK(d.label_elems == 2 && !d.integral_labels);
        CHECK(d.labels[0] == 0.5 && d.labels[1] == 2.5 && d.labels[2] == 1.5 && d.labels[3] == 3.5);
        ddp_data_free(&d);
    }

    static const float big[3] = {1.5f, -2, 1e-3f};
    tmp.len = 0;
    put_big_endian(&tmp, big, 3, 4);
    b = npy(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }", tmp.data, tmp.len);
    write_file("big.npy", b->data, b->len);
    static const uint8_t bools[3] = {1, 0, 1};
    b = npy(2, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", bools, 3);
    write_file("bools.npy", b->data, b->len);
    spec = dataset(DDP_DATA_NPY, "big", "big.npy", "bools.npy");
    if (open_ok(&spec, &d)) {
        CHECK(d.rank == 0 && d.elems == 1 && memcmp(d.inputs, big, sizeof big) == 0);
        CHECK(d.labels[0] == 1 && d.labels[1] == 0 && d.integral_labels);
        ddp_data_free(&d);
    }

    static const uint16_t halves[3] = {0x3c00, 0xc000, 0x0001}; /* 1, -2, 2^-24 */
    b = npy(3, "{'descr': '<f2', 'fortran_order': False, 'shape': (3, 1), }", halves, sizeof halves);
    write_file("half.npy", b->data, b->len);
    spec = dataset(DDP_DATA_NPY, "half", "half.npy", "bools.npy");
    if (open_ok(&spec, &d)) {
        CHECK(d.elem == DDP_ELEM_F16 && d.elems == 1);
        ddp_program p = {.name = "m",
                         .dtype = DDP_F64,
                         .input_rank = 1,
                         .input_shape = {1},
                         .output_elems = 2,
                         .label_dtype = DDP_I32,
                         .label_positions = 1};
        double x[3];
        int32_t y[3];
        int64_t ids[3], rows[3] = {0, 1, 2};
        ddp_data_batch(&d, &p, rows, 3, NULL, x, y, ids);
        CHECK(x[0] == 1 && x[1] == -2 && x[2] == ldexp(1, -24));
        ddp_data_free(&d);
    }
}

static void test_npy_broken(void) {
    static const float inputs[6] = {1, 2, 3, 4, NAN, 6};
    write_text("notnpy.npy", "PK\x03\x04 not numpy at all");
    ddp_dataset spec = dataset(DDP_DATA_NPY, "broken", "notnpy.npy", "y.npy");
    OPEN_FAILS(&spec, "notnpy.npy: not a NumPy .npy file");

    bytes *b = npy(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }", inputs, 24);
    write_file("complex.npy", b->data, b->len);
    spec.path[0] = "complex.npy";
    OPEN_FAILS(&spec, "complex.npy: unsupported dtype '<c8'");

    b = npy(1, "{'descr': '|O', 'fortran_order': False, 'shape': (3,), }", inputs, 24);
    write_file("object.npy", b->data, b->len);
    spec.path[0] = "object.npy";
    OPEN_FAILS(&spec, "object.npy: the array holds Python objects (dtype '|O')");

    b = npy(1, "{'descr': [('x', '<f4'), ('y', '<f4')], 'fortran_order': False, 'shape': (3,), }", inputs,
            24);
    write_file("struct.npy", b->data, b->len);
    spec.path[0] = "struct.npy";
    OPEN_FAILS(&spec, "struct.npy: the array has the structured dtype [('x', '<f4'), ('y', '<f4')]");

    b = npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", inputs, 20);
    write_file("short.npy", b->data, b->len);
    spec.path[0] = "short.npy";
    OPEN_FAILS(&spec, "short.npy: truncated: the header promises (3, 2) of f32 (24 bytes of values) but the "
                      "file has 20");

    b = npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", inputs, 24);
    write_file("nan.npy", b->data, b->len);
    spec.path[0] = "nan.npy";
    OPEN_FAILS(&spec, "nan.npy: sample 2 holds NaN (element 0)");

    b = npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 1), }", inputs, 16);
    write_file("four.npy", b->data, b->len);
    spec.path[0] = "four.npy";
    OPEN_FAILS(&spec, "y.npy: holds 3 labels (shape (3,)) but", "four.npy holds 4 samples (shape (4, 1))");

    b = npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2}", inputs, 24);
    write_file("header.npy", b->data, b->len);
    spec.path[0] = "header.npy";
    OPEN_FAILS(&spec, "header.npy: the .npy header is not a dict", "(near \"(3, 2}\")");
    b = npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", inputs, 24);
    b->data[6] = 4;
    write_file("version.npy", b->data, b->len);
    spec.path[0] = "version.npy";
    OPEN_FAILS(&spec, "version.npy: npy format version 4.0 is not supported");

    b = npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 1, 1), }", inputs, 12);
    write_file("y3.npy", b->data, b->len);
    spec = dataset(DDP_DATA_NPY, "broken", "x.npy", "y3.npy");
    OPEN_FAILS(&spec, "y3.npy: the labels have the shape (3, 1, 1)");
}

/* ------------------------------------------------------- .npy dtypes */

static ddp_program model(int64_t dtype, int64_t loss, int64_t outputs, int rank, const int64_t *shape);

static const struct {
    const char *descr;
    int elem, width;
    bool is_float, is_bool;
} npy_dtypes[] = {
    {"|u1", DDP_ELEM_U8, 1, false, false},  {"|i1", DDP_ELEM_I8, 1, false, false},
    {"<u2", DDP_ELEM_U16, 2, false, false}, {"<i2", DDP_ELEM_I16, 2, false, false},
    {"<u4", DDP_ELEM_U32, 4, false, false}, {"<i4", DDP_ELEM_I32, 4, false, false},
    {"<u8", DDP_ELEM_U64, 8, false, false}, {"<i8", DDP_ELEM_I64, 8, false, false},
    {"<f2", DDP_ELEM_F16, 2, true, false},  {"<f4", DDP_ELEM_F32, 4, true, false},
    {"<f8", DDP_ELEM_F64, 8, true, false},  {"|b1", DDP_ELEM_U8, 1, false, true},
};
enum { NPY_DTYPES = sizeof npy_dtypes / sizeof npy_dtypes[0], CIFAR_VALUES = 3072, NPY_SAMPLES = 6 };

/* A whole number below 2048 in IEEE half precision (exact there). */
static uint16_t half_of(int v) {
    if (v == 0)
        return 0;
    int exponent = 0;
    while ((v >> exponent) > 1)
        exponent++;
    return (uint16_t)((exponent + 15) << 10 | (((v << 10) >> exponent) & 0x3ff));
}

/* v (a small whole number) as one little-endian element of dtype d */
static void put_element(unsigned char *to, int d, int v) {
    if (npy_dtypes[d].descr[1] == 'f') {
        if (npy_dtypes[d].width == 2) {
            uint16_t h = half_of(v);
            memcpy(to, &h, 2);
        } else if (npy_dtypes[d].width == 4) {
            float f = (float)v;
            memcpy(to, &f, 4);
        } else {
            double f = v;
            memcpy(to, &f, 8);
        }
        return;
    }
    for (int i = 0; i < npy_dtypes[d].width; i++)
        to[i] = (unsigned char)((uint64_t)v >> (8 * i) & 0xff);
}

/* An .npy file of count elements of dtype d, value(i) each, with the shape text given. */
static void write_npy_of(const char *name, int d, const char *shape, int64_t count, int (*value)(int64_t, bool)) {
    char dict[160];
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", npy_dtypes[d].descr,
             shape);
    size_t header = strlen(dict) + 1, padded = (10 + header + 63) / 64 * 64 - 10;
    size_t width = (size_t)npy_dtypes[d].width, len = 10 + padded + (size_t)count * width;
    unsigned char *b = calloc(len, 1);
    if (!b) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)(padded & 0xff);
    b[9] = (unsigned char)(padded >> 8);
    memset(b + 10, ' ', padded);
    memcpy(b + 10, dict, strlen(dict));
    b[10 + padded - 1] = '\n';
    for (int64_t i = 0; i < count; i++)
        put_element(b + 10 + padded + (size_t)i * width, d, value(i, npy_dtypes[d].is_bool));
    write_file(name, b, len);
    free(b);
}

static int input_value(int64_t i, bool is_bool) {
    int64_t s = i / CIFAR_VALUES, k = i % CIFAR_VALUES;
    return is_bool ? (int)((s + k) % 2) : (int)((s * 7 + k) % 100);
}

static int label_value(int64_t s, bool is_bool) {
    return (int)(is_bool ? s % 2 : s % 10);
}

static void test_npy_dtypes(void) {
    char name[64], labels[64];
    for (int d = 0; d < NPY_DTYPES; d++) {
        snprintf(name, sizeof name, "x%d.npy", d);
        write_npy_of(name, d, "(6, 32, 32, 3)", (int64_t)NPY_SAMPLES * CIFAR_VALUES, input_value);
        snprintf(name, sizeof name, "y%d.npy", d);
        write_npy_of(name, d, "(6,)", NPY_SAMPLES, label_value);
        snprintf(name, sizeof name, "y%d_col.npy", d);
        write_npy_of(name, d, "(6, 1)", NPY_SAMPLES, label_value);
    }
    static const int64_t cifar[] = {32, 32, 3};
    ddp_program p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 10, 3, cifar);
    static float x[NPY_SAMPLES * CIFAR_VALUES];
    int64_t rows[NPY_SAMPLES] = {5, 0, 3, 1, 4, 2}, ids[NPY_SAMPLES];
    int32_t classes[NPY_SAMPLES];
    int opened = 0;
    for (int in = 0; in < NPY_DTYPES; in++)
        for (int out = 0; out < NPY_DTYPES; out++)
            for (int column = 0; column < 2; column++) {
                snprintf(name, sizeof name, "x%d.npy", in);
                snprintf(labels, sizeof labels, column ? "y%d_col.npy" : "y%d.npy", out);
                ddp_dataset spec = dataset(DDP_DATA_NPY, "arrays", name, labels);
                ddp_data data;
                if (!open_ok(&spec, &data)) {
                    fprintf(stderr, "  inputs %s, labels %s %s\n", npy_dtypes[in].descr, npy_dtypes[out].descr,
                            column ? "(N, 1)" : "(N,)");
                    continue;
                }
                opened++;
                bool labels_right = data.label_elems == 1 && data.integral_labels;
                for (int s = 0; s < NPY_SAMPLES; s++)
                    labels_right &= data.labels[s] == label_value(s, npy_dtypes[out].is_bool);
                bool shape_right = data.samples == NPY_SAMPLES && data.elems == CIFAR_VALUES &&
                                   data.elem == npy_dtypes[in].elem && data.rank == 3;
                bool batch_right = fits(&data, &p);
                if (batch_right) {
                    ddp_data_batch(&data, &p, rows, NPY_SAMPLES, NULL, x, classes, ids);
                    for (int r = 0; r < NPY_SAMPLES; r++) {
                        batch_right &= classes[r] == label_value(rows[r], npy_dtypes[out].is_bool);
                        for (int k = 0; k < CIFAR_VALUES; k += 97)
                            batch_right &= x[r * CIFAR_VALUES + k] ==
                                           (float)input_value(rows[r] * CIFAR_VALUES + k, npy_dtypes[in].is_bool);
                    }
                }
                if (!labels_right || !shape_right || !batch_right)
                    fprintf(stderr, "inputs %s, labels %s %s: labels %s, shape %s, batch %s\n", npy_dtypes[in].descr,
                            npy_dtypes[out].descr, column ? "(N, 1)" : "(N,)", labels_right ? "ok" : "WRONG",
                            shape_right ? "ok" : "WRONG", batch_right ? "ok" : "WRONG");
                CHECK(labels_right && shape_right && batch_right);
                ddp_data_free(&data);
            }
    printf(".npy: %d input dtypes x %d label dtypes x 2 label shapes at %d values a sample: %d opened and batched\n",
           NPY_DTYPES, NPY_DTYPES, CIFAR_VALUES, opened);
}

/* Every byte at every place of [256, 3] samples (sample s: s, 255 - s, s ^ 0x5a), as
 * u1 and i1, scaled by 1/255 and normalised with CIFAR-10's pairs or not: each value
 * of a batch in f32, f64 and bf16 is the conversion and normalisation written out here
 * (x * scale in double, rounded to the type, then (that - mean) / std in double, rounded
 * to the type; bf16 rounded once more from the f32 result). */
static int byte_of(int64_t i, bool is_bool) {
    (void)is_bool;
    int64_t s = i / 3, c = i % 3;
    return (int)(c == 0 ? s : c == 1 ? 255 - s : s ^ 0x5a);
}

/* An .npy dataset of bytes scaled to [0, 1], and normalised by pairs if normalised. */
static ddp_dataset byte_dataset(const char *name, const char *inputs, const char *labels, const ddp_channel *pairs,
                                bool normalised) {
    ddp_dataset spec = dataset(DDP_DATA_NPY, name, inputs, labels);
    spec.scale = 1.0 / 255;
    spec.normalize = normalised ? pairs : NULL;
    spec.nnormalize = normalised ? 3 : 0;
    return spec;
}

static void test_byte_values(void) {
    static const ddp_channel cifar[] = {{0.4914, 0.2470}, {0.4822, 0.2435}, {0.4465, 0.2616}};
    static const int64_t place[] = {3};
    static float x32[256 * 3];
    static double x64[256 * 3], hot[256 * 10];
    static uint16_t x16[256 * 3];
    int64_t rows[256], ids[256];
    int32_t classes[256];
    for (int s = 0; s < 256; s++)
        rows[s] = (s * 37) % 256;
    write_npy_of("bytes_y.npy", 0, "(256,)", 256, label_value);
    for (int d = 0; d < 2; d++) {
        char name[32];
        snprintf(name, sizeof name, "bytes%d.npy", d);
        write_npy_of(name, d, "(256, 3)", 256 * 3, byte_of);
        for (int normalised = 0; normalised < 2; normalised++) {
            ddp_dataset spec = byte_dataset("bytes", name, "bytes_y.npy", cifar, normalised);
            ddp_data data;
            if (!open_ok(&spec, &data))
                continue;
            ddp_program p32 = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 10, 1, place);
            ddp_program p64 = model(DDP_F64, DDP_LOSS_CATEGORICAL, 10, 1, place);
            ddp_program p16 = model(DDP_BF16, DDP_LOSS_SPARSE_CATEGORICAL, 10, 1, place);
            ddp_data_batch(&data, &p32, rows, 256, NULL, x32, classes, ids);
            ddp_data_batch(&data, &p64, rows, 256, NULL, x64, hot, ids);
            ddp_data_batch(&data, &p16, rows, 256, NULL, x16, classes, ids);
            int wrong = 0;
            for (int r = 0; r < 256; r++)
                for (int c = 0; c < 3; c++) {
                    int byte = byte_of(rows[r] * 3 + c, false), v = d ? (int8_t)byte : byte;
                    float f = (float)(v * spec.scale);
                    double g = v * spec.scale;
                    if (normalised) {
                        f = (float)(((double)f - cifar[c].mean) / cifar[c].std);
                        g = (g - cifar[c].mean) / cifar[c].std;
                    }
                    wrong += x32[r * 3 + c] != f || x64[r * 3 + c] != g || x16[r * 3 + c] != ddp_bf16_from_float(f);
                }
            if (wrong)
                fprintf(stderr, "%s %s: %d of 768 values wrong\n", npy_dtypes[d].descr,
                        normalised ? "normalised" : "scaled", wrong);
            CHECK(wrong == 0);
            ddp_data_free(&data);
        }
    }
}

/* random_crop(size = [4, 5], padding = 1) on [6, 8, 3] byte images: validation takes
 * each sample's centre (rows 1.., columns 1..), training one of the 5 x 6 places of the
 * image padded by one pixel, each window exactly the sample's values (scaled and
 * normalised as any, through the byte table or not, in f32, f64 and bf16) and the
 * padding the normalised zero; every place comes about, and a flip after the crop
 * mirrors the window. Samples smaller than the window, or of other pixels than the
 * model's, are refused with both shapes. */
enum { CROP_H0 = 6, CROP_W0 = 8, CROP_H = 4, CROP_W = 5, CROP_PAD = 1, CROP_N = 40 };

static int crop_byte(int64_t i, bool is_bool) {
    (void)is_bool;
    return (int)((i * 7 + 3) % 251);
}

/* Sample s's value at (y, x, c) of the window placed at (oy, ox), as the batch holds it
 * in f32 (or f64). */
static double crop_expected(int64_t s, int64_t oy, int64_t ox, int y, int x, int c, const ddp_dataset *spec,
                            bool f64) {
    int64_t sy = oy + y, sx = ox + x;
    bool inside = sy >= 0 && sy < CROP_H0 && sx >= 0 && sx < CROP_W0;
    int byte = inside ? crop_byte(((s * CROP_H0 + sy) * CROP_W0 + sx) * 3 + c, false) : 0;
    double g = byte * spec->scale;
    float f = (float)g;
    if (spec->nnormalize) {
        g = (g - spec->normalize[c].mean) / spec->normalize[c].std;
        f = (float)(((double)f - spec->normalize[c].mean) / spec->normalize[c].std);
    }
    return f64 ? g : f;
}

static bool window_is(const float *row, int64_t s, int64_t oy, int64_t ox, bool mirrored, const ddp_dataset *spec) {
    for (int y = 0; y < CROP_H; y++)
        for (int x = 0; x < CROP_W; x++)
            for (int c = 0; c < 3; c++)
                if (row[(y * CROP_W + x) * 3 + c] !=
                    (float)crop_expected(s, oy, ox, y, mirrored ? CROP_W - 1 - x : x, c, spec, false))
                    return false;
    return true;
}

/* Files name_x.npy (samples of crop_byte images of shape, values in all) and
 * name_y.npy, as a byte dataset whose augmentations are list's first. */
static ddp_dataset window_dataset(const char *name, const char *shape, int64_t values, int64_t samples,
                                  const ddp_channel *pairs, bool normalised, ddp_augment *list) {
    static char x[4][64], y[4][64];
    static int next;
    char *xs = x[next % 4], *ys = y[next++ % 4];
    char dims[64];
    snprintf(xs, sizeof x[0], "%s_x.npy", name);
    snprintf(ys, sizeof y[0], "%s_y.npy", name);
    snprintf(dims, sizeof dims, "(%lld,)", (long long)samples);
    write_npy_of(xs, 0, shape, values, crop_byte);
    write_npy_of(ys, 0, dims, samples, label_value);
    ddp_dataset spec = byte_dataset(name, xs, ys, pairs, normalised);
    spec.augment = list;
    spec.naugment = 1;
    return spec;
}

static void test_crop_windows(void) {
    static const ddp_channel pairs[] = {{0.5, 0.25}, {0.4, 0.3}, {0.1, 2}};
    static const int64_t window[] = {CROP_H, CROP_W, 3}, other_pixels[] = {CROP_H, CROP_W, 2},
                         tall[] = {CROP_H0 + 1, CROP_W, 3};
    static float x32[CROP_N * CROP_H * CROP_W * 3];
    static double x64[CROP_N * CROP_H * CROP_W * 3];
    static uint16_t x16[CROP_N * CROP_H * CROP_W * 3];
    int64_t rows[CROP_N], ids[CROP_N];
    int32_t y[CROP_N];
    for (int s = 0; s < CROP_N; s++)
        rows[s] = s;
    for (int normalised = 0; normalised < 2; normalised++) {
        ddp_augment list[2] = {{.kind = DDP_AUGMENT_CROP, .padding = CROP_PAD, .height = CROP_H, .width = CROP_W},
                               {.kind = DDP_AUGMENT_FLIP, .mode = DDP_FLIP_HORIZONTAL}};
        ddp_dataset spec = window_dataset("crop", "(40, 6, 8, 3)", CROP_N * CROP_H0 * CROP_W0 * 3, CROP_N, pairs,
                                          normalised, list);
        ddp_data d;
        if (!open_ok(&spec, &d))
            continue;
        static const int64_t types[3] = {DDP_F32, DDP_F64, DDP_BF16};
        void *batches[3] = {x32, x64, x16};
        ddp_program p32 = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 10, 3, window);
        char err[1024];
        CHECK(ddp_data_fits(&d, &p32, err, sizeof err));
        ddp_program narrow = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 10, 3, other_pixels);
        FITS_FAILS(&d, &narrow, "crop_x.npy: its samples are [6, 8, 3], but random_crop(size = [4, 5]) cuts the "
                                "model `net`'s [4, 5, 2] from each", "of 2 values");
        list[0].height = CROP_H0 + 1;
        ddp_program taller = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 10, 3, tall);
        FITS_FAILS(&d, &taller, "at least 7 x 5 pixels of 3 values");
        list[0].height = CROP_H;
        /* validation: the centre, in every element type */
        for (int t = 0; t < 3; t++) {
            ddp_program p = model(types[t], DDP_LOSS_SPARSE_CATEGORICAL, 10, 3, window);
            ddp_data_batch(&d, &p, rows, CROP_N, NULL, batches[t], y, ids);
        }
        int wrong = 0, per = CROP_H * CROP_W * 3;
        for (int s = 0; s < CROP_N; s++) {
            wrong += !window_is(x32 + s * per, s, 1, 1, false, &spec);
            for (int i = 0; i < per; i++)
                wrong += x64[s * per + i] != crop_expected(s, 1, 1, i / 3 / CROP_W, i / 3 % CROP_W, i % 3, &spec, true) ||
                         x16[s * per + i] != ddp_bf16_from_float(x32[s * per + i]);
        }
        CHECK(wrong == 0);
        /* training: one of the places each time, all of them over the epochs */
        int seen[CROP_H0 + 2 * CROP_PAD - CROP_H + 1][CROP_W0 + 2 * CROP_PAD - CROP_W + 1] = {{0}};
        int unmatched = 0, places = 0, mirrored = 0;
        for (int epoch = 0; epoch < 20; epoch++) {
            spec.naugment = 1 + (epoch % 2); /* odd epochs flip after the crop */
            ddp_data_batch(&d, &p32, rows, CROP_N, &(ddp_draw_key){7, epoch}, x32, y, ids);
            for (int s = 0; s < CROP_N; s++) {
                int found = 0;
                for (int oy = -CROP_PAD; oy <= CROP_H0 + CROP_PAD - CROP_H; oy++)
                    for (int ox = -CROP_PAD; ox <= CROP_W0 + CROP_PAD - CROP_W; ox++)
                        for (int m = 0; m < 1 + (epoch % 2); m++)
                            if (window_is(x32 + s * per, s, oy, ox, m, &spec)) {
                                found++;
                                mirrored += m;
                                seen[oy + CROP_PAD][ox + CROP_PAD]++;
                            }
                unmatched += found != 1;
            }
        }
        for (int oy = 0; oy < CROP_H0 + 2 * CROP_PAD - CROP_H + 1; oy++)
            for (int ox = 0; ox < CROP_W0 + 2 * CROP_PAD - CROP_W + 1; ox++)
                places += seen[oy][ox] > 0;
        CHECK(unmatched == 0 && places == 30 && mirrored > 100);
        ddp_data_free(&d);
    }
}

/* random_resized_crop(size = [6, 8]) on [12, 16, 3] byte images. Its windows, drawn
 * from the key and the sample alone, lie in the image, have the scale's share of its
 * area and the ratio's shape (up to whole pixels), come in many sizes and places, and
 * fall back to the centre when no try fits. Each training sample is its window resized
 * as a direct double sum of the antialiased bilinear filter's weights, written here
 * from its definition (within float rounding), then normalised; the same in f64 and
 * bf16; the whole image at its own size is the image, bit for bit; a flip after it
 * mirrors it; validation cuts the centre 6 x 8 exactly; smaller samples are refused. */
enum { RRC_H0 = 12, RRC_W0 = 16, RRC_H = 6, RRC_W = 8, RRC_N = 40 };

/* The filter's weight of input k of a window of len pixels for output i of n. */
static double rrc_weight(int64_t k, int64_t i, int64_t len, int64_t n) {
    double scale = (double)len / (double)n, support = scale > 1 ? scale : 1, centre = (i + 0.5) * scale, total = 0;
    for (int64_t j = 0; j < len; j++) {
        double d = fabs((j + 0.5 - centre) / support);
        total += d < 1 ? 1 - d : 0;
    }
    double d = fabs((k + 0.5 - centre) / support);
    return (d < 1 ? 1 - d : 0) / total;
}

/* Sample s's window resized to RRC_H x RRC_W, value (y, x, c), scaled and normalised. */
static double rrc_expected(int64_t s, const int64_t win[4], int y, int x, int c, const ddp_dataset *spec) {
    double v = 0;
    for (int64_t sy = 0; sy < win[2]; sy++)
        for (int64_t sx = 0; sx < win[3]; sx++) {
            double w = rrc_weight(sy, y, win[2], RRC_H) * rrc_weight(sx, x, win[3], RRC_W);
            if (w != 0)
                v += w * crop_byte(((s * RRC_H0 + win[0] + sy) * RRC_W0 + win[1] + sx) * 3 + c, false) * spec->scale;
        }
    return spec->nnormalize ? (v - spec->normalize[c].mean) / spec->normalize[c].std : v;
}

static void test_resized_windows(void) {
    ddp_augment a = {.kind = DDP_AUGMENT_RESIZED_CROP, .height = RRC_H, .width = RRC_W, .scale_min = 0.08,
                     .scale_max = 1, .ratio_min = 3.0 / 4, .ratio_max = 4.0 / 3};
    int bad = 0, unlike = 0, draws = 0, sizes[RRC_H0 + 1][RRC_W0 + 1] = {{0}}, kinds = 0;
    double share = 0;
    for (int64_t s = 0; s < 500; s++)
        for (int64_t epoch = 0; epoch < 4; epoch++) {
            int64_t w[4], again[4], next[4];
            ddp_resized_window(&a, RRC_H0, RRC_W0, &(ddp_draw_key){5, epoch}, s, w);
            ddp_resized_window(&a, RRC_H0, RRC_W0, &(ddp_draw_key){5, epoch}, s, again);
            ddp_resized_window(&a, RRC_H0, RRC_W0, &(ddp_draw_key){5, epoch + 1}, s, next);
            bad += memcmp(w, again, sizeof w) != 0 || w[2] < 1 || w[3] < 1 || w[0] < 0 || w[1] < 0 ||
                   w[0] + w[2] > RRC_H0 || w[1] + w[3] > RRC_W0 ||
                   (w[3] + 0.5) / (w[2] - 0.5) < a.ratio_min || (w[3] - 0.5) / (w[2] + 0.5) > a.ratio_max;
            unlike += memcmp(w, next, sizeof w) != 0;
            share += (double)(w[2] * w[3]) / (RRC_H0 * RRC_W0);
            draws++;
            kinds += !sizes[w[2]][w[3]]++;
        }
    share /= draws;
    if (verbose || bad || share < 0.42 || share > 0.50) /* 0.459 by simulation: small windows fit more often */
        fprintf(stderr, "resized windows: %d bad, %d of %d unlike the next epoch's, mean share %.3f, %d sizes\n", bad,
                unlike, draws, share, kinds);
    CHECK(bad == 0 && unlike > draws * 9 / 10 && share > 0.42 && share < 0.50 && kinds > 40);
    /* no try fits a window twice as wide as high of the whole area: the centre, 8 x 16 */
    a.scale_min = a.scale_max = 1;
    a.ratio_min = a.ratio_max = 2;
    int64_t w[4];
    ddp_resized_window(&a, RRC_H0, RRC_W0, &(ddp_draw_key){5, 0}, 3, w);
    CHECK(w[0] == 2 && w[1] == 0 && w[2] == 8 && w[3] == 16);
    /* nor a hundred times (a row of the whole width), nor a hundredth (a whole column) */
    a.ratio_min = a.ratio_max = 100;
    ddp_resized_window(&a, RRC_H0, RRC_W0, &(ddp_draw_key){5, 0}, 3, w);
    CHECK(w[0] == 5 && w[1] == 0 && w[2] == 1 && w[3] == 16);
    a.ratio_min = a.ratio_max = 0.01;
    ddp_resized_window(&a, RRC_H0, RRC_W0, &(ddp_draw_key){5, 0}, 3, w);
    CHECK(w[0] == 0 && w[1] == 7 && w[2] == 12 && w[3] == 1);
}

static void test_resized_crops(void) {
    static const ddp_channel pairs[] = {{0.5, 0.25}, {0.4, 0.3}, {0.1, 2}};
    static const int64_t window[] = {RRC_H, RRC_W, 3}, whole[] = {RRC_H0, RRC_W0, 3}, big[] = {RRC_H0 + 1, 4, 3};
    enum { PER = RRC_H * RRC_W * 3, WHOLE = RRC_H0 * RRC_W0 * 3 };
    static float x32[RRC_N * WHOLE], plain[RRC_N * WHOLE], flipped[RRC_N * PER];
    static double x64[RRC_N * PER];
    static uint16_t x16[RRC_N * PER];
    int64_t rows[RRC_N], ids[RRC_N];
    int32_t y[RRC_N];
    for (int s = 0; s < RRC_N; s++)
        rows[s] = (s * 7) % RRC_N;
    ddp_augment list[2] = {{.kind = DDP_AUGMENT_RESIZED_CROP, .height = RRC_H, .width = RRC_W, .scale_min = 0.08,
                            .scale_max = 1, .ratio_min = 3.0 / 4, .ratio_max = 4.0 / 3},
                           {.kind = DDP_AUGMENT_FLIP, .mode = DDP_FLIP_HORIZONTAL}};
    ddp_dataset spec = window_dataset("rrc", "(40, 12, 16, 3)", RRC_N * WHOLE, RRC_N, pairs, true, list);
    ddp_data d;
    if (!open_ok(&spec, &d))
        return;
    char err[1024];
    ddp_program p32 = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 10, 3, window);
    ddp_program p64 = model(DDP_F64, DDP_LOSS_SPARSE_CATEGORICAL, 10, 3, window);
    ddp_program p16 = model(DDP_BF16, DDP_LOSS_SPARSE_CATEGORICAL, 10, 3, window);
    CHECK(ddp_data_fits(&d, &p32, err, sizeof err));
    list[0].height = RRC_H0 + 1, list[0].width = 4;
    ddp_program taller = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 10, 3, big);
    FITS_FAILS(&d, &taller, "rrc_x.npy: its samples are [12, 16, 3], but random_resized_crop(size = [13, 4]) cuts",
               "at least 13 x 4 pixels of 3 values");
    list[0].height = RRC_H, list[0].width = RRC_W;
    /* training: each sample its window, resized */
    double worst = 0;
    int wrong = 0, mirrored = 0;
    for (int64_t epoch = 0; epoch < 3; epoch++) {
        ddp_draw_key key = {11, epoch};
        ddp_data_batch(&d, &p32, rows, RRC_N, &key, x32, y, ids);
        ddp_data_batch(&d, &p64, rows, RRC_N, &key, x64, y, ids);
        ddp_data_batch(&d, &p16, rows, RRC_N, &key, x16, y, ids);
        spec.naugment = 2;
        ddp_data_batch(&d, &p32, rows, RRC_N, &key, flipped, y, ids);
        spec.naugment = 1;
        for (int r = 0; r < RRC_N; r++) {
            int64_t win[4];
            ddp_resized_window(&list[0], RRC_H0, RRC_W0, &key, rows[r], win);
            bool same = true, mirror = true;
            for (int i = 0; i < PER; i++) {
                int yy = i / 3 / RRC_W, xx = i / 3 % RRC_W, c = i % 3;
                double e = rrc_expected(rows[r], win, yy, xx, c, &spec), got = x32[r * PER + i];
                worst = fabs(got - e) > worst ? fabs(got - e) : worst;
                wrong += x64[r * PER + i] != got || x16[r * PER + i] != ddp_bf16_from_float(x32[r * PER + i]);
                same &= flipped[r * PER + i] == got;
                mirror &= flipped[r * PER + i] == x32[r * PER + (yy * RRC_W + RRC_W - 1 - xx) * 3 + c];
            }
            wrong += !same && !mirror;
            mirrored += mirror && !same;
        }
    }
    if (verbose || worst > 1e-5 || wrong)
        fprintf(stderr, "resized crops: %d wrong, worst difference from the double sum %.3g\n", wrong, worst);
    CHECK(wrong == 0 && worst <= 1e-5 && mirrored > 20);
    /* validation: the centre, exactly (scaled to f32, then normalised) */
    ddp_data_batch(&d, &p32, rows, RRC_N, NULL, x32, y, ids);
    int off_centre = 0;
    for (int r = 0; r < RRC_N; r++)
        for (int i = 0; i < PER; i++) {
            int yy = (RRC_H0 - RRC_H) / 2 + i / 3 / RRC_W, xx = (RRC_W0 - RRC_W) / 2 + i / 3 % RRC_W, c = i % 3;
            float f = (float)(crop_byte(((rows[r] * RRC_H0 + yy) * RRC_W0 + xx) * 3 + c, false) * spec.scale);
            off_centre += x32[r * PER + i] != (float)(((double)f - pairs[c].mean) / pairs[c].std);
        }
    CHECK(off_centre == 0);
    /* the whole image at its own size: the image, through the byte table's very values */
    list[0].height = RRC_H0, list[0].width = RRC_W0;
    list[0].scale_min = list[0].scale_max = 1;
    list[0].ratio_min = list[0].ratio_max = (double)RRC_W0 / RRC_H0;
    ddp_program own = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 10, 3, whole);
    ddp_data_batch(&d, &own, rows, RRC_N, &(ddp_draw_key){11, 0}, x32, y, ids);
    spec.naugment = 0;
    ddp_data_batch(&d, &own, rows, RRC_N, NULL, plain, y, ids);
    CHECK(memcmp(x32, plain, sizeof plain) == 0);
    ddp_data_free(&d);
}

/* ddp_data_stats over the 40 crop_byte images of [12, 16, 3] (rrc_x.npy): every one,
 * per channel and as one number, then a random 10 of them (the first 10 of the
 * seed's order), each against sums made here. */
static void test_data_stats(void) {
    ddp_dataset spec = byte_dataset("stats", "rrc_x.npy", "rrc_y.npy", NULL, false);
    ddp_data d;
    if (!open_ok(&spec, &d))
        return;
    int64_t order[RRC_N], used = 0;
    ddp_epoch_order(3, 0, true, RRC_N, order);
    int wrong = 0;
    for (int most = RRC_N; most >= 10; most -= 30)
        for (int64_t places = 1; places <= 3; places += 2) {
            double mean[3], std[3], sum[3] = {0}, squares[3] = {0};
            CHECK(ddp_data_stats(&d, places, most, 3, mean, std, &used) && used == most);
            int64_t count = most * RRC_H0 * RRC_W0 * 3 / places;
            for (int pass = 0; pass < 2; pass++)
                for (int i = 0; i < most; i++)
                    for (int e = 0; e < RRC_H0 * RRC_W0 * 3; e++) {
                        int64_t s = most == RRC_N ? i : order[i];
                        double v = crop_byte(s * RRC_H0 * RRC_W0 * 3 + e, false) * spec.scale, *to = pass ? squares : sum;
                        to[e % places] += pass ? (v - sum[e % places] / count) * (v - sum[e % places] / count) : v;
                    }
            for (int64_t c = 0; c < places; c++)
                wrong += fabs(mean[c] - sum[c] / count) > 1e-12 || fabs(std[c] - sqrt(squares[c] / count)) > 1e-12;
        }
    CHECK(wrong == 0);
    ddp_data_free(&d);
}

/* ------------------------------------------------------------------ CSV */

static void test_csv_good(void) {
    write_text("good.csv", "a,b,\"c,d\",label,name\r\n"
                           "1, 2 ,3,0,\"plain\"\r\n"
                           "\"-4.5\",5,\"6e2\",1,\"say \"\"hi\"\", then\r\nleave\"\r\n"
                           "7,8,9,2,x");
    static const char *const features[] = {"c,d", "a"};
    ddp_dataset spec = dataset(DDP_DATA_CSV, "table", "good.csv", NULL);
    spec.header = 1;
    spec.features = features;
    spec.nfeatures = 2;
    spec.target = "label";
    ddp_data d;
    if (open_ok(&spec, &d)) {
        const double *x = d.inputs;
        CHECK(d.samples == 3 && d.rank == 1 && d.shape[0] == 2 && d.elem == DDP_ELEM_F64);
        CHECK(x[0] == 3 && x[1] == 1 && x[2] == 600 && x[3] == -4.5 && x[4] == 9 && x[5] == 7);
        CHECK(d.labels[0] == 0 && d.labels[1] == 1 && d.labels[2] == 2 && d.integral_labels);
        ddp_data_free(&d);
    }

    write_text("plain.csv", "1,2,3,0.5\n4,5,6,1.5\n\n\n");
    static const char *const numbers[] = {"2", "0"};
    spec = dataset(DDP_DATA_CSV, "numbered", "plain.csv", NULL);
    spec.features = numbers;
    spec.nfeatures = 2;
    spec.target = "3";
    if (open_ok(&spec, &d)) {
        const double *x = d.inputs;
        CHECK(d.samples == 2 && x[0] == 3 && x[1] == 1 && x[2] == 6 && x[3] == 4);
        CHECK(d.labels[1] == 1.5 && !d.integral_labels);
        ddp_data_free(&d);
    }
}

static void test_csv_broken(void) {
    static const char *const features[] = {"sepal_length", "sepal_width"};
    ddp_dataset spec = dataset(DDP_DATA_CSV, "iris", "bad.csv", NULL);
    spec.header = 1;
    spec.features = features;
    spec.nfeatures = 2;
    spec.target = "species";
    write_text("bad.csv", "sepal_length,sepal_width,species\n5.1,3.5,0\n4.9,x1,1\n");
    OPEN_FAILS(&spec, "bad.csv:3:5: the cell of column `sepal_width` is \"x1\", not a number");
    write_text("bad.csv", "note,sepal_length,sepal_width,species\r\n,5.1,3.5,0\r\n\"é\",5.1,  nan ,1\r\n");
    OPEN_FAILS(&spec, "bad.csv:3:9: the cell of column `sepal_width` is \"nan \", not a finite number");
    write_text("bad.csv", "sepal_length,sepal_width,species\n5.1,,0\n");
    OPEN_FAILS(&spec, "bad.csv:2:5: the cell of column `sepal_width` is empty");
    write_text("bad.csv", "sepal_length,sepal_width,species\n5.1,3.5,0\n4.9,3.0\n");
    OPEN_FAILS(&spec, "bad.csv:3: the row has 2 fields, but the header has 3");
    write_text("bad.csv", "sepal_length,sepal_width,species\n5.1,\"3.5,0\n");
    OPEN_FAILS(&spec, "bad.csv:2:5: a quoted field is not closed");
    write_text("bad.csv", "sepal_length,sepal_width,species\n");
    OPEN_FAILS(&spec, "bad.csv: has a header but no rows of data");
    write_text("bad.csv", "sepal_length,sepal_width,species\n5.1,\"3.5\"x,0\n");
    OPEN_FAILS(&spec, "bad.csv:2:10: text after the closing quote of a field");
    write_text("bad.csv", "sepal_length,sepal_width,species\n5.1,\"3.5\n4\",0\n");
    OPEN_FAILS(&spec, "bad.csv:2:5: the cell of column `sepal_width` is \"3.5?4\", not a number");

    write_text("cols.csv", "sepal_length,sepal_wdth,species\n5.1,3.5,0\n");
    spec.path[0] = "cols.csv";
    OPEN_FAILS(&spec, "cols.csv: the header has no column `sepal_width` (a feature of the dataset `iris`)",
               "its columns are sepal_length, sepal_wdth, species", "did you mean `sepal_wdth`?");

    spec.header = 0;
    OPEN_FAILS(&spec, "cols.csv: without a header, features and target are column numbers",
               "\"sepal_length\"");
    static const char *const far[] = {"0", "7"};
    spec.features = far;
    spec.target = "2";
    OPEN_FAILS(&spec, "cols.csv: column 7 (a feature) is past the end: the first row has 3 fields");
}

/* ---------------------------------------------------- against a model */

/* random_mixup and random_cutmix: each training row is its sample as the augmentations
 * before them make it, mixed with another sample made the same way, in the share
 * ddp_mix_draw gives (every value, or a box of pixels), and its one-hot label row is
 * mixed in the same share; the shares follow Beta(alpha, alpha); validation mixes
 * nothing. */
enum { MIX_N = 40, MIX_H = 6, MIX_W = 8, MIX_PER = MIX_H * MIX_W * 3 };

static void test_mixing(void) {
    static const ddp_channel pairs[] = {{0.5, 0.25}, {0.4, 0.3}, {0.1, 2}};
    static const int64_t shape[] = {MIX_H, MIX_W, 3};
    static float x[MIX_N * MIX_PER], own[MIX_PER], other[MIX_PER], y[MIX_N * 10], y_own[10], y_other[10];
    int64_t rows[MIX_N], ids[MIX_N];
    for (int s = 0; s < MIX_N; s++)
        rows[s] = (s * 7) % MIX_N;
    ddp_augment list[3] = {{.kind = DDP_AUGMENT_FLIP, .mode = DDP_FLIP_HORIZONTAL},
                           {.kind = DDP_AUGMENT_MIXUP, .alpha = 0.4},
                           {.kind = DDP_AUGMENT_CUTMIX, .alpha = 1}};
    ddp_dataset spec = window_dataset("mix", "(40, 6, 8, 3)", MIX_N * MIX_PER, MIX_N, pairs, true, list);
    ddp_data d;
    if (!open_ok(&spec, &d))
        return;
    ddp_program p = model(DDP_F32, DDP_LOSS_CATEGORICAL, 10, 3, shape);
    int wrong = 0, cut = 0, mixed = 0;
    for (int64_t epoch = 0; epoch < 2; epoch++) {
        ddp_draw_key key = {5, epoch};
        spec.naugment = 3;
        ddp_data_batch(&d, &p, rows, MIX_N, &key, x, y, ids);
        for (int r = 0; r < MIX_N; r++) {
            ddp_mix mix;
            ddp_mix_draw(&spec, &p, MIX_N, &key, rows[r], &mix);
            spec.naugment = 1; /* the samples as the flip leaves them */
            ddp_data_batch(&d, &p, &rows[r], 1, &key, own, y_own, ids);
            ddp_data_batch(&d, &p, &mix.partner, 1, &key, other, y_other, ids);
            spec.naugment = 3;
            cut += mix.cut;
            mixed += mix.partner != rows[r] && mix.share < 1;
            int64_t box = (mix.box[2] - mix.box[0]) * (mix.box[3] - mix.box[1]);
            wrong += mix.partner < 0 || mix.partner >= MIX_N || mix.share < 0 || mix.share > 1 ||
                     (mix.cut && mix.share != 1 - (double)box / (MIX_H * MIX_W));
            for (int i = 0; i < MIX_PER; i++) {
                int yy = i / 3 / MIX_W, xx = i / 3 % MIX_W;
                bool in_box = mix.cut && yy >= mix.box[0] && yy < mix.box[2] && xx >= mix.box[1] && xx < mix.box[3];
                float want = mix.cut ? (in_box ? other[i] : own[i])
                                     : (float)(mix.share * own[i] + (1 - mix.share) * other[i]);
                wrong += x[r * MIX_PER + i] != want;
            }
            for (int j = 0; j < 10; j++)
                wrong += y[r * 10 + j] != (float)(mix.share * y_own[j] + (1 - mix.share) * y_other[j]);
        }
    }
    if (verbose || wrong)
        fprintf(stderr, "mixing: %d wrong, %d of %d cut\n", wrong, cut, 2 * MIX_N);
    CHECK(wrong == 0 && cut > 20 && cut < 60 && mixed > 60);
    /* validation: the samples as they are, their labels one-hot */
    ddp_data_batch(&d, &p, rows, MIX_N, NULL, x, y, ids);
    int not_hot = 0;
    for (int r = 0; r < MIX_N; r++)
        for (int j = 0; j < 10; j++)
            not_hot += y[r * 10 + j] != (float)(j == rows[r] % 10);
    CHECK(not_hot == 0);
    ddp_data_free(&d);
    /* the shares: Beta(alpha, alpha), of mean 1/2 and variance 1 / (4 (2 alpha + 1)) */
    static const double alphas[] = {0.2, 0.4, 1, 2};
    for (size_t k = 0; k < sizeof alphas / sizeof alphas[0]; k++) {
        ddp_augment one = {.kind = DDP_AUGMENT_MIXUP, .alpha = alphas[k]};
        ddp_dataset mixup = {.augment = &one, .naugment = 1};
        double sum = 0, squares = 0, below = 0;
        enum { DRAWS = 20000 };
        for (int64_t s = 0; s < DRAWS; s++) {
            ddp_mix mix;
            ddp_mix_draw(&mixup, &p, 1000000, &(ddp_draw_key){9, 3}, s, &mix);
            sum += mix.share;
            squares += mix.share * mix.share;
            below += mix.share < 0.25;
        }
        double mean = sum / DRAWS, var = squares / DRAWS - mean * mean, want = 1 / (4 * (2 * alphas[k] + 1));
        if (verbose || fabs(mean - 0.5) > 0.01 || fabs(var - want) > 0.05 * want)
            fprintf(stderr, "Beta(%g, %g): mean %.4f, variance %.4f (want %.4f), below 1/4 %.3f\n", alphas[k],
                    alphas[k], mean, var, want, below / DRAWS);
        CHECK(fabs(mean - 0.5) <= 0.01 && fabs(var - want) <= 0.05 * want);
        if (alphas[k] == 1) /* uniform */
            CHECK(fabs(below / DRAWS - 0.25) < 0.01);
    }
}

static ddp_program model(int64_t dtype, int64_t loss, int64_t outputs, int rank, const int64_t *shape) {
    ddp_program p = {.name = "net", .dtype = dtype, .input_rank = rank, .output_elems = outputs,
                     .label_positions = 1};
    p.label_dtype = loss == DDP_LOSS_SPARSE_CATEGORICAL ? DDP_I32 : dtype;
    p.settings.loss = loss;
    memcpy(p.input_shape, shape, (size_t)rank * sizeof *shape);
    return p;
}

static void test_fits_and_batches(void) {
    ddp_dataset spec = dataset(DDP_DATA_IDX, "tiny", "img.idx", "lbl.idx");
    spec.scale = 0.5;
    ddp_data d;
    if (!open_ok(&spec, &d))
        return;
    static const int64_t square[] = {2, 2}, flat[] = {4}, five[] = {5};
    ddp_program p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 3, 2, square);
    CHECK(fits(&d, &p));
    p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 3, 1, flat); /* the model reshapes */
    CHECK(fits(&d, &p));
    p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 3, 1, five);
    FITS_FAILS(&d, &p,
               "img.idx: its samples are [2, 2] (4 values), but the model `net` takes [5] (5 values)");
    p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 2, 2, square);
    FITS_FAILS(&d, &p, "lbl.idx: sample 0 has the label 2, but the model `net` has 2 outputs");
    p = model(DDP_F64, DDP_LOSS_BINARY, 1, 2, square);
    FITS_FAILS(&d, &p, "lbl.idx: sample 0 has the label 2, but binary_crossentropy needs targets in [0, 1]");
    p = model(DDP_F64, DDP_LOSS_MSE, 2, 2, square);
    FITS_FAILS(&d, &p, "lbl.idx: its labels have 1 value per sample, but the model `net` has 2 outputs");

    int64_t rows[2] = {2, 0}, ids[2];
    p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 3, 2, square);
    float x32[8];
    int32_t classes[2];
    ddp_data_batch(&d, &p, rows, 2, NULL, x32, classes, ids);
    CHECK(x32[0] == 100 && x32[3] == 127.5f && x32[4] == 0 && x32[7] == 1.5f);
    CHECK(classes[0] == 1 && classes[1] == 2 && ids[0] == 2 && ids[1] == 0);

    p = model(DDP_F64, DDP_LOSS_CATEGORICAL, 3, 2, square);
    CHECK(fits(&d, &p));
    double x64[8], hot[6];
    ddp_data_batch(&d, &p, rows, 2, NULL, x64, hot, ids);
    CHECK(x64[1] == 100.5 && x64[6] == 1);
    CHECK(hot[0] == 0 && hot[1] == 1 && hot[2] == 0 && hot[3] == 0 && hot[4] == 0 && hot[5] == 1);
    p = model(DDP_F64, DDP_LOSS_CATEGORICAL, 2, 2, square);
    FITS_FAILS(&d, &p, "lbl.idx: sample 0 has the label 2", "class indices run 0..1");

    /* normalised after scale, each value by the pair of its place on the last axis: in
     * f32, f64, and bf16 rounded once from the f32 result (259 -> 260) */
    static const ddp_channel pairs[] = {{.mean = 10, .std = 4}, {.mean = -2, .std = 0.5}};
    spec.normalize = pairs;
    spec.nnormalize = 2;
    p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 3, 2, square);
    ddp_data_batch(&d, &p, rows, 2, NULL, x32, classes, ids);
    CHECK(x32[0] == 22.5f && x32[1] == 205 && x32[3] == 259 && x32[4] == -2.5f && x32[7] == 7);
    p = model(DDP_F64, DDP_LOSS_CATEGORICAL, 3, 2, square);
    ddp_data_batch(&d, &p, rows, 2, NULL, x64, hot, ids);
    CHECK(x64[1] == 205 && x64[6] == -2.25);
    p = model(DDP_BF16, DDP_LOSS_SPARSE_CATEGORICAL, 3, 2, square);
    uint16_t x16[8];
    ddp_data_batch(&d, &p, rows, 2, NULL, x16, classes, ids);
    CHECK(ddp_bf16_to_float(x16[0]) == 22.5f && ddp_bf16_to_float(x16[3]) == 260 &&
          ddp_bf16_to_float(x16[4]) == -2.5f && ddp_bf16_to_float(x16[7]) == 7);
    spec.nnormalize = 0;
    ddp_data_free(&d);

    /* labels of two values, copied */
    spec = dataset(DDP_DATA_IDX, "pairs", "img16.gz", "lbl32.gz");
    if (!open_ok(&spec, &d))
        return;
    static const int64_t three[] = {3};
    p = model(DDP_F32, DDP_LOSS_MSE, 2, 1, three);
    CHECK(fits(&d, &p));
    float x[6], y[4];
    int64_t both[2] = {1, 0};
    ddp_data_batch(&d, &p, both, 2, NULL, x, y, ids);
    CHECK(x[0] == -1 && x[1] == 32767 && x[3] == -300 && y[0] == 1 << 20 && y[1] == 0 && y[2] == 5 &&
          y[3] == -7);
    p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 2, 1, three);
    FITS_FAILS(&d, &p,
               "lbl32.gz: holds 2 values per label, but sparse_categorical_crossentropy wants one class");
    p = model(DDP_F32, DDP_LOSS_CATEGORICAL, 3, 1, three);
    FITS_FAILS(&d, &p, "lbl32.gz: its labels have 2 values per sample, but the model `net` has 3 outputs");
    ddp_data_free(&d);
}

static void test_synthetic(void) {
    ddp_dataset spec = {
        .name = "noise", .kind = DDP_DATA_SYNTHETIC, .scale = 1, .classes = 4, .samples = 1000};
    ddp_data d;
    if (!open_ok(&spec, &d))
        return;
    CHECK(d.samples == 1000 && d.inputs == NULL && d.labels == NULL && d.label_elems == 1 &&
          d.integral_labels);
    static const int64_t shape[] = {3, 5};
    ddp_program p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 4, 2, shape);
    CHECK(fits(&d, &p));
    p.output_elems = 3;
    FITS_FAILS(&d, &p,
               "the synthetic dataset `noise`: it has 4 classes (0..3), but the model `net` has 3 outputs");
    p = model(DDP_F64, DDP_LOSS_BINARY, 1, 2, shape);
    FITS_FAILS(&d, &p, "it has 4 classes (0..3), but binary_crossentropy needs targets in [0, 1]");

    p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 4, 2, shape);
    enum { N = 64, PER = 15 };
    int64_t rows[N];
    for (int r = 0; r < N; r++)
        rows[r] = (r * 37) % 1000;
    static float a[N * PER], b[N * PER];
    int32_t ya[N], yb[N];
    int64_t ids[N];
    ddp_data_batch(&d, &p, rows, N, NULL, a, ya, ids);
    ddp_data_batch(&d, &p, rows, N, NULL, b, yb, ids);
    CHECK(memcmp(a, b, sizeof a) == 0 && memcmp(ya, yb, sizeof ya) == 0);
    bool in_range = true, seen[4] = {0};
    for (int i = 0; i < N * PER; i++)
        in_range &= a[i] >= -1 && a[i] < 1;
    for (int r = 0; r < N; r++) {
        in_range &= ya[r] >= 0 && ya[r] < 4;
        if (ya[r] >= 0 && ya[r] < 4)
            seen[ya[r]] = true;
    }
    CHECK(in_range && seen[0] && seen[1] && seen[2] && seen[3]);
    /* element 7 from the sample's SplitMix64 sequence, written out here */
    uint32_t w[4];
    ddp_draw(0, DDP_STREAM_DATA, (uint64_t)rows[5], 0, 0, w);
    uint64_t z = ((uint64_t)w[0] << 32 | w[1]) + 8 * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    double element7 = 2 * ((double)(z >> 40) / 16777216.0) - 1;
    CHECK(a[5 * PER + 7] == (float)element7);
    /* the f32 batches' own code, the AVX2 one where this CPU runs it: every element
     * the double of ddp_synthetic_element rounded, over runs that end mid-vector */
    for (int avx2 = 0; avx2 <= __builtin_cpu_supports("avx2"); avx2++)
        for (int64_t sample = 0; sample < 50; sample++) {
            static float row[1003];
            int64_t per = 1003 - sample % 8;
            uint64_t seed = ddp_synthetic_seed(sample * 7919);
            ddp_synthetic_floats(seed, per, row, avx2);
            bool same = true;
            for (int64_t e = 0; e < per; e++)
                same &= row[e] == (float)ddp_synthetic_element(seed, e);
            CHECK(same);
        }
    ddp_draw(0, DDP_STREAM_DATA + 1, (uint64_t)rows[5], 0, 0, w);
    CHECK(ya[5] == (int32_t)floor(ddp_uniform53(w) * 4));

    p = model(DDP_F64, DDP_LOSS_CATEGORICAL, 4, 2, shape);
    static double x64[2 * PER], hot[8];
    ddp_data_batch(&d, &p, rows + 5, 2, NULL, x64, hot, ids);
    CHECK(x64[7] == element7);
    CHECK(hot[ya[5]] == 1 && hot[0] + hot[1] + hot[2] + hot[3] == 1 && hot[4 + ya[6]] == 1);
    ddp_data_free(&d);
}

/* ------------------------------------------------------------ several files */

/* Inputs f32 [3], value 10 * sample + element over the whole dataset; the labels the
 * sample's index. */
static void write_shard(const char *inputs, const char *labels, int first, int samples, bool gzip) {
    float values[16 * 3];
    int64_t classes[16];
    for (int i = 0; i < samples; i++) {
        classes[i] = first + i;
        for (int e = 0; e < 3; e++)
            values[i * 3 + e] = (float)(10 * (first + i) + e);
    }
    char dict[128];
    snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, 3), }", samples);
    bytes *b = npy(1, dict, values, (size_t)samples * 3 * sizeof *values);
    (gzip ? write_gzip : write_file)(inputs, b->data, b->len);
    snprintf(dict, sizeof dict, "{'descr': '<i8', 'fortran_order': False, 'shape': (%d,), }", samples);
    b = npy(1, dict, classes, (size_t)samples * sizeof *classes);
    write_file(labels, b->data, b->len);
}

/* A folder of two pairs of files, x-1/y-1 and x-2/y-2, whose second inputs ("x") or
 * labels ("y") file is the given one instead; the dataset of their patterns. */
static ddp_dataset second_pair_odd(const char *folder, const char *which, const char *dict, const void *values,
                                   size_t len) {
    static char x[3][64], y[3][64], odd[64], pattern_x[64], pattern_y[64];
    make_folder(folder);
    for (int i = 1; i <= 2; i++) {
        snprintf(x[i], sizeof x[i], "%s/x-%d.npy", folder, i);
        snprintf(y[i], sizeof y[i], "%s/y-%d.npy", folder, i);
    }
    write_shard(x[1], y[1], 0, 2, false);
    write_shard(x[2], y[2], 2, 2, false);
    snprintf(odd, sizeof odd, "%s/%s-2.npy", folder, which);
    bytes *b = npy(1, dict, values, len);
    write_file(odd, b->data, b->len);
    snprintf(pattern_x, sizeof pattern_x, "%s/x-*.npy", folder);
    snprintf(pattern_y, sizeof pattern_y, "%s/y-*.npy", folder);
    return dataset(DDP_DATA_NPY, folder, pattern_x, pattern_y);
}

/* Three pairs of files of 2, 3 and 1 samples (the middle one gzip, so read where the
 * others are mapped), named so that the order by bytes is not the order written. */
static void test_npy_patterns(void) {
    make_folder("parts");
    write_shard("parts/x-b.npy", "parts/y-b.npy", 2, 3, true);
    write_shard("parts/x-a.npy", "parts/y-a.npy", 0, 2, false);
    write_shard("parts/x-c.npy", "parts/y-c.npy", 5, 1, false);
    ddp_dataset spec = dataset(DDP_DATA_NPY, "parts", "parts/x-*.npy", "parts/y-?.npy");
    ddp_data d;
    if (open_ok(&spec, &d)) {
        CHECK(d.samples == 6 && d.nshards == 3 && d.rank == 1 && d.shape[0] == 3 && d.elem == DDP_ELEM_F32);
        static const int64_t shape[] = {3}, rows[] = {5, 0, 2, 4, 1, 3};
        ddp_program p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 8, 1, shape);
        CHECK(fits(&d, &p));
        float x[6 * 3];
        int32_t y[6];
        int64_t ids[6];
        ddp_data_batch(&d, &p, rows, 6, NULL, x, y, ids);
        bool right = true;
        for (int r = 0; r < 6; r++)
            for (int e = 0; e < 3; e++)
                right &= x[r * 3 + e] == (float)(10 * rows[r] + e) && y[r] == rows[r];
        CHECK(right);
        p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 4, 1, shape); /* sample 4: its file's third */
        FITS_FAILS(&d, &p, "parts/y-b.npy: sample 2 has the label 4, but the model `net` has 4 outputs");
        ddp_data_free(&d);
    }
    spec.path[1] = "parts/y-[ab].npy";
    OPEN_FAILS(&spec, "parts/y-[ab].npy: 2 files match the labels' pattern but 3 match the inputs'",
               "parts/x-*.npy");
    spec.path[1] = "parts/z-*.npy";
    OPEN_FAILS(&spec, "parts/z-*.npy: no file matches this pattern (the dataset `parts`, labels)");
    spec.path[1] = "parts/y-a.npy";
    OPEN_FAILS(&spec, "parts/x-*.npy: the inputs or the labels are given as a pattern of several files and "
                      "the other as one file; give both as patterns");

    float wide[4] = {0}, bad[6] = {1, 2, 3, 4, NAN, 6};
    int64_t pairs[4] = {0, 1, 1, 0};
    spec = second_pair_odd("odd", "x", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", wide,
                           sizeof wide);
    OPEN_FAILS(&spec, "odd/x-2.npy: its samples are [2] of f32, but those of", "odd/x-1.npy",
               "are [3] of f32; every file of a dataset holds samples of one shape and type");
    spec = second_pair_odd("lab", "y", "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2), }", pairs,
                           sizeof pairs);
    OPEN_FAILS(&spec, "lab/y-2.npy: holds labels of 2 values, but the first file of the pattern", "lab/y-*.npy",
               "holds labels of 1; every file of a dataset holds labels of one shape");
    spec = second_pair_odd("nan", "x", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", bad,
                           sizeof bad);
    OPEN_FAILS(&spec, "nan/x-2.npy: sample 1 holds NaN (element 1)");
}

/* --------------------------------------------------- inputs checked in parts */

/* part of parts checked against the program p (NULL: none): passes, or fails with a
 * message holding `says` */
static void check_part_against(int line, const ddp_data *d, const ddp_program *p, int64_t part, int64_t parts,
                               const char *says) {
    char err[1024] = "";
    bool ok = ddp_data_check_inputs(d, p, part, parts, err, sizeof err);
    if (says)
        check_message(line, ok, err, says, NULL);
    else if (!ok) {
        fprintf(stderr, "%s:%d: part %lld of %lld: unexpected failure: %s\n", __FILE__, line, (long long)part,
                (long long)parts, err);
        failures++;
    }
}

static void check_part(int line, const ddp_data *d, int64_t part, int64_t parts, const char *says) {
    check_part_against(line, d, NULL, part, parts, says);
}

/* The workers of a job check a part of the inputs each (ddp_shard_range's), which
 * together are all of them: a bad value is found by the worker whose part holds it,
 * named by its file and its index there, across the files of a pattern, and in every
 * type with infinities (integers have none, whatever their bits). */
static void test_check_parts(void) {
    make_folder("check");
    static float seven[7 * 2] = {0};
    seven[4 * 2 + 1] = NAN;
    seven[6 * 2] = -INFINITY;
    bytes *b = npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (7, 2), }", seven, sizeof seven);
    write_file("check/seven.npy", b->data, b->len);
    ddp_dataset spec = dataset(DDP_DATA_NPY, "seven", "check/seven.npy", "");
    ddp_data d;
    char err[1024];
    if (ddp_data_open(&spec, root, &d, err, sizeof err)) { /* parts of 3, 2 and 2 samples */
        check_part(__LINE__, &d, 0, 3, NULL);
        check_part(__LINE__, &d, 1, 3, "check/seven.npy: sample 4 holds NaN (element 1)");
        check_part(__LINE__, &d, 2, 3, "check/seven.npy: sample 6 holds -inf (element 0)");
        check_part(__LINE__, &d, 0, 1, "check/seven.npy: sample 4 holds NaN (element 1)");
        for (int64_t part = 0; part < 20; part++) /* more workers than samples: parts of 0 or 1 */
            check_part(__LINE__, &d, part, 20, part == 4 ? "sample 4 holds NaN" : part == 6 ? "sample 6" : NULL);
        ddp_data_free(&d);
    } else {
        fprintf(stderr, "unexpected failure: %s\n", err);
        failures++;
    }

    /* two files of 3 and 4 samples; the dataset's sample 4 is the second file's 1 */
    static float first[3 * 2], second[4 * 2];
    second[1 * 2] = NAN;
    b = npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", first, sizeof first);
    write_file("check/x-1.npy", b->data, b->len);
    b = npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 2), }", second, sizeof second);
    write_gzip("check/x-2.npy", b->data, b->len);
    spec = dataset(DDP_DATA_NPY, "split", "check/x-*.npy", "");
    if (ddp_data_open(&spec, root, &d, err, sizeof err)) {
        CHECK(d.nshards == 2 && d.samples == 7);
        check_part(__LINE__, &d, 0, 2, NULL); /* samples 0..3: the first file and the second's 0 */
        check_part(__LINE__, &d, 1, 2, "check/x-2.npy: sample 1 holds NaN (element 0)");
        check_part(__LINE__, &d, 1, 3, "check/x-2.npy: sample 1 holds NaN (element 0)");
        check_part(__LINE__, &d, 2, 3, NULL);
        ddp_data_free(&d);
    } else {
        fprintf(stderr, "unexpected failure: %s\n", err);
        failures++;
    }

    /* samples of 2000 values: f64, f16 and integers */
    enum { PER = 2000 };
    static double wide[3 * PER];
    wide[2 * PER + 1000] = INFINITY;
    b = npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 2000), }", wide, sizeof wide);
    write_file("check/f8.npy", b->data, b->len);
    static uint16_t half[3 * PER];
    half[2 * PER + 1999] = 0x7e00; /* a NaN */
    half[2 * PER + 1998] = 0x7bff; /* the largest finite half */
    b = npy(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (3, 2000), }", half, sizeof half);
    write_file("check/f2.npy", b->data, b->len);
    static int32_t whole[3 * PER];
    for (int i = 0; i < 3 * PER; i++)
        whole[i] = i % 2 ? 0x7f800000 : -1; /* the bits of inf and NaN are plain numbers here */
    b = npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 2000), }", whole, sizeof whole);
    write_file("check/i4.npy", b->data, b->len);
    static const struct {
        const char *file, *says;
    } typed[] = {{"check/f8.npy", "check/f8.npy: sample 2 holds inf (element 1000)"},
                 {"check/f2.npy", "check/f2.npy: sample 2 holds NaN (element 1999)"},
                 {"check/i4.npy", NULL}};
    for (size_t i = 0; i < sizeof typed / sizeof *typed; i++) {
        spec = dataset(DDP_DATA_NPY, "typed", typed[i].file, "");
        if (!ddp_data_open(&spec, root, &d, err, sizeof err)) {
            fprintf(stderr, "unexpected failure: %s\n", err);
            failures++;
            continue;
        }
        check_part(__LINE__, &d, 0, 1, typed[i].says);
        check_part(__LINE__, &d, 0, 3, NULL); /* sample 0 alone */
        ddp_data_free(&d);
    }
}

/* The token indices an embedding looks up and a token file's tokens are checked in
 * parts too: each worker reads the tokens its samples read (inputs, and labels one
 * further, the file's last token the last sample's label alone), and one that finds a
 * token past the bounds names the whole file's largest, as one worker would. */
static void test_check_token_parts(void) {
    enum { WINDOW = 4, SAMPLES = 5, TOKENS = WINDOW * SAMPLES + 1 };
    uint16_t tokens[TOKENS];
    for (int i = 0; i < TOKENS; i++)
        tokens[i] = (uint16_t)(i * 7 % 300);
    ddp_dataset spec = dataset(DDP_DATA_TOKENS, "corpus", "parts_of/tokens.bin", "");
    spec.token_bytes = 2;
    spec.window = WINDOW;
    /* a model of [4] token indices, an embedding of 300, a class of 300 at each place */
    static const int64_t four[] = {WINDOW};
    ddp_program lm = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, WINDOW * 300, 1, four);
    lm.label_positions = WINDOW;
    lm.output_rank = 2;
    lm.output_shape[0] = WINDOW;
    lm.output_shape[1] = 300;
    lm.input_vocab = 300;
    ddp_program no_embedding = lm;
    no_embedding.input_vocab = 0;
    const char *vocab = "parts_of/tokens.bin: holds the token 350, but the model `net` looks tokens up in an "
                        "embedding of token indices 0..299; give the embedding a vocab of at least 351";
    /* parts of 2: samples 0..2 read tokens 0..12, samples 3 and 4 tokens 12..20 */
    const struct {
        int at[2];
        uint16_t token[2];
        const ddp_program *p;
        const char *says[2];
    } cases[] = {
        {{-1, -1}, {0, 0}, &lm, {NULL, NULL}},
        {{14, -1}, {350, 0}, &lm, {NULL, "holds the token 350, but the model `net` looks tokens up"}},
        {{3, 14}, {350, 300}, &lm, {vocab, vocab}}, /* the largest, wherever it lies */
        {{12, -1}, {300, 0}, &lm, {"holds the token 300", "holds the token 300"}}, /* in both parts */
        {{20, -1}, {300, 0}, &lm, {NULL, "holds the token 300, but the model `net` looks tokens up"}},
        {{20, -1}, {300, 0}, &no_embedding,
         {NULL, "parts_of/tokens.bin: it holds the token 300, but the model `net` outputs [4, 300], so class "
                "indices run 0..299; give its last layer one unit per class"}},
    };
    make_folder("parts_of");
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        uint16_t file[TOKENS];
        memcpy(file, tokens, sizeof file);
        for (int k = 0; k < 2; k++)
            if (cases[c].at[k] >= 0)
                file[cases[c].at[k]] = cases[c].token[k];
        write_file("parts_of/tokens.bin", file, sizeof file);
        ddp_data d;
        char err[1024];
        if (!ddp_data_open(&spec, root, &d, err, sizeof err) || !fits(&d, cases[c].p)) {
            fprintf(stderr, "case %zu: unexpected failure: %s\n", c, err);
            failures++;
            continue;
        }
        for (int part = 0; part < 2; part++)
            check_part_against(__LINE__, &d, cases[c].p, part, 2, cases[c].says[part]);
        check_part_against(__LINE__, &d, cases[c].p, 0, 1, cases[c].says[0] ? cases[c].says[0] : cases[c].says[1]);
        check_part(__LINE__, &d, 0, 1, NULL); /* without a model: no bounds */
        ddp_data_free(&d);
    }

    /* an embedding's indices in a .npy, samples of 3: sample 3 holds 7.5 */
    static const float indices[5 * 3] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 7.5f, 1, 2, 3, 4};
    bytes *b = npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (5, 3), }", indices, sizeof indices);
    write_file("parts_of/indices.npy", b->data, b->len);
    static const int64_t three[] = {3};
    ddp_program embed = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 10, 1, three);
    embed.input_vocab = 10;
    spec = dataset(DDP_DATA_NPY, "indices", "parts_of/indices.npy", "");
    ddp_data d;
    char err[1024];
    if (!ddp_data_open(&spec, root, &d, err, sizeof err)) {
        fprintf(stderr, "unexpected failure: %s\n", err);
        failures++;
        return;
    }
    const char *says = "parts_of/indices.npy: sample 3 holds 7.5 at position 1, but the model `net` looks it up in an "
                       "embedding of token indices 0..9";
    check_part_against(__LINE__, &d, &embed, 0, 2, NULL);
    check_part_against(__LINE__, &d, &embed, 1, 2, says);
    check_part_against(__LINE__, &d, &embed, 0, 1, says);
    embed.input_vocab = 0;
    check_part_against(__LINE__, &d, &embed, 0, 1, NULL);
    ddp_data_free(&d);
}

/* ------------------------------------------------------------- mapped files */

/* This process's resident anonymous memory (malloc'd, not a file's pages), in bytes. */
static long long anonymous_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %lld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

enum { BIG_SAMPLES = 2048, BIG_PER = 1024 }; /* 8 MiB of f32 */

/* A large .npy of inputs (value of element e of sample i: i + e / 1024) and labels. */
static void write_big_npy(const char *inputs, const char *labels, bool big_endian) {
    static float values[BIG_SAMPLES * BIG_PER];
    for (int i = 0; i < BIG_SAMPLES; i++)
        for (int e = 0; e < BIG_PER; e++)
            values[i * BIG_PER + e] = (float)i + (float)e / BIG_PER;
    char dict[128];
    snprintf(dict, sizeof dict, "{'descr': '%cf4', 'fortran_order': False, 'shape': (%d, %d), }",
             big_endian ? '>' : '<', BIG_SAMPLES, BIG_PER);
    static unsigned char file[128 + sizeof values];
    bytes *head = npy(1, dict, NULL, 0); /* the header alone; the values are too many for a bytes */
    memcpy(file, head->data, head->len);
    memcpy(file + head->len, values, sizeof values);
    if (big_endian)
        for (size_t at = head->len; at < head->len + sizeof values; at += 4) {
            unsigned char *v = file + at, t0 = v[0], t1 = v[1];
            v[0] = v[3], v[1] = v[2], v[2] = t1, v[3] = t0;
        }
    write_file(inputs, file, head->len + sizeof values);
    static uint8_t classes[BIG_SAMPLES];
    for (int i = 0; i < BIG_SAMPLES; i++)
        classes[i] = (uint8_t)(i % 10);
    bytes *b = npy(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2048,), }", classes, sizeof classes);
    write_file(labels, b->data, b->len);
}

/* Opens the dataset and reads a batch of its last rows: the anonymous memory opening it
 * took, or -1 on a failure. */
static long long open_and_read(const ddp_dataset *spec, ddp_data *d) {
    long long before = anonymous_bytes();
    if (!open_ok(spec, d))
        return -1;
    long long grown = anonymous_bytes() - before;
    static const int64_t shape[] = {BIG_PER}, rows[] = {BIG_SAMPLES - 1, 7};
    ddp_program p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 10, 1, shape);
    static float x[2 * BIG_PER];
    int32_t y[2];
    int64_t ids[2];
    CHECK(fits(d, &p));
    ddp_data_batch(d, &p, rows, 2, NULL, x, y, ids);
    CHECK(x[0] == BIG_SAMPLES - 1 && x[BIG_PER - 1] == BIG_SAMPLES - 1 + 1023.0f / 1024);
    CHECK(x[BIG_PER + 512] == 7.5f && y[0] == (BIG_SAMPLES - 1) % 10 && y[1] == 7);
    return grown;
}

/* An uncompressed file is mapped, not read: opening it leaves the process's own memory
 * as it was (the page cache holds the file, once for every worker of the machine); the
 * same values in the other byte order must be rewritten, so are read, and cost their
 * size (as a gzip file's do, which the tests above read). */
static void test_mapped_npy(void) {
    write_big_npy("wide.npy", "wide_y.npy", false);
    write_big_npy("wide_be.npy", "wide_y2.npy", true);
    ddp_dataset spec = dataset(DDP_DATA_NPY, "wide", "wide.npy", "wide_y.npy");
    ddp_data d;
    int64_t held[2][2], values = BIG_SAMPLES * BIG_PER * 4, labels = BIG_SAMPLES * 8;
    long long mapped = open_and_read(&spec, &d);
    ddp_data_held(&d, &held[0][0], &held[0][1]);
    ddp_data_free(&d);
    spec.path[0] = "wide_be.npy";
    long long read = open_and_read(&spec, &d);
    ddp_data_held(&d, &held[1][0], &held[1][1]);
    ddp_data_free(&d);
    CHECK(held[0][0] == values && held[0][1] == labels); /* as the banner says them */
    CHECK(held[1][0] == 0 && held[1][1] == values + labels);
    if (verbose)
        printf("opening 8 MiB of inputs: %lld KiB mapped, %lld KiB read\n", mapped / 1024, read / 1024);
    /* the mapped open holds no copy (its growth may even be negative: AddressSanitizer
     * hands freed blocks back as it likes); a failed open (-1) is counted by open_ok */
    CHECK(mapped < 2 << 20);
    CHECK(read >= 8 << 20);
}

/* A mapped dataset too large to be read ahead whole (read_ahead cleared here, as
 * data_map.c leaves it for a file past half the memory) has the samples the loader asks
 * for read in the background. With the file's pages dropped from the page cache and a
 * pass of batches 4 MiB apart in the file, the loader assembles two batches and asks for
 * the two after them: their samples come in though no batch is taken, where those of
 * the fifth stay out; a dataset read ahead whole asks for nothing. ddp_data_asked_ahead
 * counts the bytes of the first kind only. (The pages that share
 * a large folio with the header, which the reader mapped, stay in the page cache: the
 * batches lie past them.) */
enum { FAR_SAMPLES = 512, FAR_PER = 65536, FAR_BATCH = 4, FAR_APART = 64 }; /* 32 MiB, samples of 16 pages */

/* Whether every page of sample s's inputs is in the page cache. */
static bool sample_resident(const ddp_data *d, int64_t s) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = (uintptr_t)d->inputs + (uintptr_t)(s * FAR_PER);
    uintptr_t first = start & ~(page - 1), end = start + FAR_PER;
    unsigned char in[64];
    size_t pages = (end - first + page - 1) / page;
    if (pages > sizeof in || mincore((void *)first, end - first, in) != 0)
        return false;
    for (size_t i = 0; i < pages; i++)
        if (!(in[i] & 1))
            return false;
    return true;
}

static bool batch_resident(const ddp_data *d, const int64_t *rows) {
    for (int r = 0; r < FAR_BATCH; r++)
        if (!sample_resident(d, rows[r]))
            return false;
    return true;
}

/* Drops the file's pages from the page cache until none of its samples past the first
 * 4 MiB is there (a read ahead asked for as it was opened may still be coming in);
 * false after 10 s. */
static bool drop_pages(const ddp_data *d, const char *name) {
    int fd = open(path_of(name), O_RDONLY);
    bool out = false;
    for (int tries = 0; fd >= 0 && !out && tries < 1000; tries++) {
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        out = true;
        for (int64_t s = FAR_APART; s < FAR_SAMPLES && out; s++)
            out = !sample_resident(d, s);
        if (!out)
            usleep(10000);
    }
    if (fd >= 0)
        close(fd);
    return out;
}

/* Waits up to 10 s for the batch's samples to come in. */
static bool comes_in(const ddp_data *d, const int64_t *rows) {
    for (int tries = 0; tries < 1000 && !batch_resident(d, rows); tries++)
        usleep(10000);
    return batch_resident(d, rows);
}

static void write_far_npy(void) {
    bytes *head = npy(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (512, 65536), }", NULL, 0);
    size_t len = head->len + (size_t)FAR_SAMPLES * FAR_PER;
    unsigned char *file = malloc(len);
    if (!file)
        exit(2);
    memcpy(file, head->data, head->len);
    for (size_t at = head->len; at < len; at++)
        file[at] = (unsigned char)(at % 251);
    write_file("far_x.npy", file, len);
    free(file);
    write_npy_of("far_y.npy", 0, "(512,)", FAR_SAMPLES, label_value);
}

static void test_prefetch(void) {
    write_far_npy();
    ddp_dataset spec = dataset(DDP_DATA_NPY, "far", "far_x.npy", "far_y.npy");
    ddp_data d;
    if (!open_ok(&spec, &d))
        return;
    CHECK(d.mapping && d.read_ahead && ddp_data_asked_ahead(&d) == 0); /* 32 MiB: read ahead whole */
    struct statfs fs;
    if (statfs(root, &fs) == 0 && fs.f_type == TMPFS_MAGIC) { /* its pages cannot be dropped */
        printf("data readers: %s is a tmpfs, whose pages stay: the prefetch is not checked\n", root);
        ddp_data_free(&d);
        return;
    }
    int64_t rows[6][FAR_BATCH], starts[6], sizes[6];
    static const int64_t shape[] = {FAR_PER};
    for (int b = 0; b < 6; b++) {
        for (int r = 0; r < FAR_BATCH; r++)
            rows[b][r] = (b + 1) * FAR_APART + 8 + r;
        starts[b] = b * FAR_BATCH, sizes[b] = FAR_BATCH;
    }
    /* a dataset read ahead whole asks for nothing */
    CHECK(drop_pages(&d, "far_x.npy"));
    ddp_data_prefetch(&d, rows[2], FAR_BATCH);
    usleep(100000);
    CHECK(!batch_resident(&d, rows[2]));
    /* one too large: batches 3 and 4 come in, the fifth stays out */
    d.read_ahead = false;
    CHECK(ddp_data_asked_ahead(&d) == (int64_t)FAR_SAMPLES * FAR_PER); /* as the banner says it */
    ddp_program p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 10, 1, shape);
    ddp_loader *l = ddp_loader_new(&d, &p, FAR_BATCH, 1);
    CHECK(l != NULL && drop_pages(&d, "far_x.npy"));
    if (l) {
        ddp_loader_begin(l, &rows[0][0], starts, sizes, 6, NULL);
        bool third = comes_in(&d, rows[2]), fourth = comes_in(&d, rows[3]), fifth = batch_resident(&d, rows[4]);
        if (verbose || !third || !fourth || fifth)
            fprintf(stderr, "prefetch: batches 3 and 4 %s and %s, batch 5 %s\n", third ? "in" : "out",
                    fourth ? "in" : "out", fifth ? "in" : "out");
        CHECK(third && fourth && !fifth);
        ddp_loader_free(l);
    }
    ddp_data_free(&d);
}

/* A mapped file changed in place (its size kept) is found, and named; one replaced by
 * another file of its name is not a change (the mapping keeps the old bytes). */
static void test_mapped_file_changed(void) {
    write_big_npy("kept.npy", "kept_y.npy", false);
    write_big_npy("changed.npy", "changed_y.npy", false);
    ddp_dataset kept = dataset(DDP_DATA_NPY, "kept", "kept.npy", "kept_y.npy"),
                changed = dataset(DDP_DATA_NPY, "changed", "changed.npy", "changed_y.npy");
    ddp_data a, b;
    if (!open_ok(&kept, &a) || !open_ok(&changed, &b))
        return;
    char err[1024] = "";
    CHECK(ddp_data_files_unchanged(err, sizeof err));
    write_big_npy("kept.npy.new", "kept_y.npy", false);
    CHECK(rename(path_of("kept.npy.new"), path_of("kept.npy")) == 0);
    CHECK(ddp_data_files_unchanged(err, sizeof err));
    /* a byte rewritten in place, its time a second on (a write in the same tick of the
     * file system's clock may keep the time; a real one comes later than that) */
    int fd = open(path_of("changed.npy"), O_WRONLY);
    struct timespec later[2] = {{0, UTIME_OMIT}, {time(NULL) + 1, 0}};
    CHECK(fd >= 0 && pwrite(fd, "\x7f", 1, 4096) == 1 && futimens(fd, later) == 0);
    if (fd >= 0)
        close(fd);
    check_message(__LINE__, ddp_data_files_unchanged(err, sizeof err), err,
                  "changed.npy: the file was changed during the run, so its samples are no longer those the run "
                  "began with",
                  NULL);
    ddp_data_free(&b);
    CHECK(ddp_data_files_unchanged(err, sizeof err)); /* no longer mapped */
    ddp_data_free(&a);
}

/* A mapped file cut short during the run: the worker ends with status 1 and a line
 * naming the file, not a bare "Bus error". */
static void test_mapped_file_cut_short(void) {
    write_big_npy("cut.npy", "cut_y.npy", false);
    ddp_dataset spec = dataset(DDP_DATA_NPY, "cut", "cut.npy", "cut_y.npy");
    int out[2];
    if (pipe(out) != 0) {
        perror("pipe");
        exit(2);
    }
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        dup2(out[1], STDERR_FILENO);
        close(out[0]);
        ddp_set_identity("train", 0, "", false);
        ddp_data d;
        char err[1024];
        if (!ddp_data_open(&spec, root, &d, err, sizeof err) || truncate(path_of("cut.npy"), 128) != 0)
            _exit(3);
        static const int64_t shape[] = {BIG_PER}, rows[] = {BIG_SAMPLES - 1};
        ddp_program p = model(DDP_F32, DDP_LOSS_SPARSE_CATEGORICAL, 10, 1, shape);
        static float x[BIG_PER];
        int32_t y;
        int64_t id;
        ddp_data_batch(&d, &p, rows, 1, NULL, x, &y, &id);
        _exit(4); /* the rows past the new end were read: not what a truncated mapping does */
    }
    close(out[1]);
    char said[4096] = "";
    size_t n = 0;
    for (ssize_t k; n + 1 < sizeof said && (k = read(out[0], said + n, sizeof said - 1 - n)) > 0;)
        n += (size_t)k;
    said[n] = 0;
    close(out[0]);
    int status = 0;
    waitpid(child, &status, 0);
    if (verbose)
        printf("%s", said);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1);
    CHECK(strstr(said, "train: ") == said && strstr(said, "cut.npy: the file was cut short while this worker read it"));
}

int main(int argc, char **argv) {
    verbose = argc > 1 && strcmp(argv[1], "--verbose") == 0;
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 2;
    }
    test_idx_plain();
    test_idx_gzip();
    test_idx_broken();
    test_cifar10();
    test_npy_good();
    test_npy_broken();
    test_npy_dtypes();
    test_byte_values();
    test_crop_windows();
    test_resized_windows();
    test_resized_crops();
    test_mixing();
    test_data_stats();
    test_csv_good();
    test_csv_broken();
    test_fits_and_batches();
    test_synthetic();
    test_npy_patterns();
    test_check_parts();
    test_check_token_parts();
    test_mapped_npy();
    test_prefetch();
    test_mapped_file_changed();
    test_mapped_file_cut_short();
    while (ncreated > 0)
        remove(path_of(created[--ncreated]));
    rmdir(root);
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("data readers: all checks passed\n");
    return 0;
}
