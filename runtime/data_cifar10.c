/* data_cifar10.c: CIFAR-10's binary version (cifar-10-batches-bin): a folder holding
 * data_batch_1.bin .. data_batch_5.bin for training and test_batch.bin for testing.
 *
 * Each file is a run of 3073-byte records: a label byte (0..9), then the 32x32 image as
 * three planes, red, green and blue, each row-major. Models take images channels last,
 * so the planes are interleaved into [32, 32, 3] here, once, rather than in every batch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data_read.h"

enum {
    SIDE = 32,
    CHANNELS = 3,
    PIXELS = SIDE * SIDE,
    IMAGE = PIXELS * CHANNELS,
    RECORD = 1 + IMAGE,
    CLASSES = 10
};

static const char *const train_files[] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                          "data_batch_4.bin", "data_batch_5.bin"};
static const char *const test_files[] = {"test_batch.bin"};

static bool check_folder(const ddp_data *d, char *err, size_t errlen) {
    char what[DATA_ROLE_MAX];
    struct stat st;
    data_role(what, sizeof what, d->spec, "CIFAR-10 folder");
    if (stat(d->where, &st) != 0)
        return data_fail(err, errlen, d->where, "no such folder (%s); check the path%s", what,
                         data_root_hint(d->spec));
    if (!S_ISDIR(st.st_mode))
        return data_fail(err, errlen, d->where,
                         "is not a folder (%s); cifar10(dir) names the folder that holds "
                         "data_batch_1.bin .. data_batch_5.bin and test_batch.bin",
                         what);
    return true;
}

/* Appends a file's records to d: labels checked, images interleaved. */
static bool append_records(ddp_data *d, const char *path, const data_bytes *b, char *err, size_t errlen) {
    if (b->len % RECORD != 0)
        return data_fail(err, errlen, path,
                         "%zu bytes is not a whole number of %d-byte records (a label byte and a 32x32x3 "
                         "image); the file is damaged or not a CIFAR-10 binary batch: download "
                         "cifar-10-binary.tar.gz again",
                         b->len, RECORD);
    int64_t records = (int64_t)(b->len / RECORD), first = d->samples;
    for (int64_t r = 0; r < records; r++)
        if (b->data[r * RECORD] >= CLASSES)
            return data_fail(
                err, errlen, path,
                "record %lld has the label %d, but CIFAR-10 labels are 0..9; the file is damaged or "
                "not a CIFAR-10 batch (CIFAR-100's binary files are another format)",
                (long long)r, b->data[r * RECORD]);
    unsigned char *inputs = realloc(d->inputs, (size_t)(first + records) * IMAGE);
    double *labels = realloc(d->labels, (size_t)(first + records) * sizeof *labels);
    if (inputs)
        d->inputs = inputs;
    if (labels)
        d->labels = labels;
    if (!inputs || !labels)
        return data_fail(err, errlen, path, "out of memory for %lld images", (long long)(first + records));
    for (int64_t r = 0; r < records; r++) {
        const unsigned char *record = b->data + r * RECORD, *planes = record + 1;
        unsigned char *image = inputs + (first + r) * IMAGE;
        labels[first + r] = record[0];
        for (int p = 0; p < PIXELS; p++)
            for (int c = 0; c < CHANNELS; c++)
                image[p * CHANNELS + c] = planes[c * PIXELS + p];
    }
    d->samples = first + records;
    return true;
}

static bool read_batch(ddp_data *d, const char *name, int number, int count, char *err, size_t errlen) {
    char path[sizeof d->where + 32], role[sizeof d->where + 64];
    if (!data_join_path(path, sizeof path, d->where, name))
        return data_fail(err, errlen, d->where, "the path is too long");
    snprintf(role, sizeof role, "CIFAR-10 %s batch %d of %d in the folder %s",
             d->spec->part ? "test" : "training", number, count, d->where);
    data_bytes b;
    if (!data_read_file(path, d->spec, role, &b, err, errlen))
        return false;
    bool ok = append_records(d, path, &b, err, errlen);
    data_bytes_free(&b);
    return ok;
}

bool data_read_cifar10(ddp_data *d, char *err, size_t errlen) {
    const char *const *files = d->spec->part ? test_files : train_files;
    int count = d->spec->part ? 1 : 5;
    if (!check_folder(d, err, errlen))
        return false;
    for (int i = 0; i < count; i++)
        if (!read_batch(d, files[i], i + 1, count, err, errlen))
            return false;
    static const int64_t shape[] = {SIDE, SIDE, CHANNELS};
    data_set_sample_shape(d, 3, shape);
    d->elem = DDP_ELEM_U8;
    d->label_elems = 1;
    return true;
}
