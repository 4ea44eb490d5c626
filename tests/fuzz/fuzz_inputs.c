/* fuzz_inputs.c: libFuzzer target over what a training program reads from outside:
 * dataset files (IDX, NumPy .npy, CSV, CIFAR-10 batches, plain or gzip-compressed),
 * safetensors files (saved parameters, checkpoints), Slurm's node lists and the cluster's
 * variables. Whatever
 * the bytes, each reader must accept them or say why, never read outside its buffers.
 *
 * An input is a kind byte, then what that kind reads:
 *   0 IDX, 1 NumPy: two bytes (little-endian) giving the first file's length, the
 *     inputs' file, then the labels' file (the rest);
 *   2 CSV: a byte of options (bit 0: a header; bits 1-2: 0..2 features beyond one),
 *     then the file;
 *   3 CIFAR-10: the test batch;
 *   4 safetensors: the file, its tensors then read as ddp_load_params reads them;
 *   5 a node list, as SLURM_JOB_NODELIST holds it;
 *   6 tasks per node, as SLURM_TASKS_PER_NODE holds them;
 *   7 safetensors again, made easier to reach: two bytes (little-endian) giving the
 *     header's length, then the header and the tensors' bytes; the file is the
 *     8-byte length (the bytes there are, when fewer) and those bytes;
 *   8 a worker's cluster variables: a byte choosing the program's cluster setting,
 *     then lines of text, the values of cluster_variables in order (a line "~"
 *     leaves its variable unset, as do the lines missing at the end);
 *   9 NumPy, a dataset of two pairs of files read through the patterns x-*.npy and
 *     y-*.npy: three two-byte lengths (x-1, y-1, x-2), the files, y-2 the rest;
 *  10 a token file: a byte choosing the tokens' width (1, 2 or 4 bytes), a byte the
 *     window (1 + it % 16 tokens), then the file.
 * Each dataset's values are checked in three parts as three workers check them, with
 * no model and with one whose embedding reads them (ddp_data_check_inputs).
 * Files are written into a folder of this process's own, below TMPDIR. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data_read.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum {
    KIND_IDX,
    KIND_NPY,
    KIND_CSV,
    KIND_CIFAR10,
    KIND_SAFETENSORS,
    KIND_HOSTLIST,
    KIND_TASKS,
    KIND_SAFETENSORS_SIZED,
    KIND_CLUSTER,
    KIND_NPY_PARTS,
    KIND_TOKENS,
    KINDS
};

static char folder[512];

static void write_file(const char *name, const uint8_t *data, size_t size) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", folder, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        fprintf(stderr, "fuzz_inputs: cannot write %s\n", path);
        abort();
    }
}

/* The dataset read from the files written, and every value it holds read, so that a
 * count that does not match its block shows. */
static void open_dataset(const ddp_dataset *spec) {
    ddp_data d;
    char err[4096];
    if (!ddp_data_open(spec, folder, &d, err, sizeof err)) {
        if (!err[0] || !memchr(err, 0, sizeof err))
            abort(); /* a refusal always says why */
        return;
    }
    /* a model whose embedding looks up 200 token indices, with 300 classes at each
     * position of a label */
    ddp_program lm = {.name = "fuzzed", .label_dtype = DDP_I32, .input_vocab = 200,
                      .label_positions = d.label_elems > 0 ? d.label_elems : 1};
    lm.output_elems = 300 * lm.label_positions;
    for (int64_t part = 0; part < 3; part++) /* as three workers check them */
        for (int model = 0; model < 2; model++)
            if (!ddp_data_check_inputs(&d, model ? &lm : NULL, part, 3, err, sizeof err) &&
                (!err[0] || !memchr(err, 0, sizeof err)))
                abort();
    double sum = 0;
    for (int64_t i = 0; d.labels && i < d.samples * d.label_elems; i++) /* a token file's are its inputs */
        sum += d.labels[i];
    int64_t sample = d.elems * data_elem_size[d.elem];
    for (int64_t s = 0; s < (d.nshards ? d.nshards : 1); s++) { /* each file's samples */
        const unsigned char *inputs = d.nshards ? d.shards[s].inputs : d.inputs;
        int64_t first = d.nshards ? d.shards[s].first : 0;
        int64_t end = d.nshards && s + 1 < d.nshards ? d.shards[s + 1].first : d.samples;
        for (int64_t i = 0; i < (end - first) * sample; i++)
            sum += inputs[i];
    }
    volatile double keep = sum;
    (void)keep;
    ddp_data_free(&d);
}

static void two_files(int64_t kind, const char *first, const char *second, const uint8_t *data, size_t size) {
    if (size < 2)
        return;
    size_t split = (size_t)(data[0] | data[1] << 8), rest = size - 2;
    if (split > rest)
        split = rest;
    write_file(first, data + 2, split);
    write_file(second, data + 2 + split, rest - split);
    ddp_dataset spec = {.name = "fuzzed", .kind = kind, .path = {first, second}, .scale = 1};
    open_dataset(&spec);
}

static void npy_parts(const uint8_t *data, size_t size) {
    static const char *const names[] = {"x-1.npy", "y-1.npy", "x-2.npy", "y-2.npy"};
    if (size < 6)
        return;
    size_t at = 6;
    for (int i = 0; i < 4; i++) {
        size_t n = i < 3 ? (size_t)(data[2 * i] | data[2 * i + 1] << 8) : size - at;
        if (n > size - at)
            n = size - at;
        write_file(names[i], data + at, n);
        at += n;
    }
    ddp_dataset spec = {.name = "fuzzed", .kind = DDP_DATA_NPY, .path = {"x-*.npy", "y-*.npy"}, .scale = 1};
    open_dataset(&spec);
}

static void tokens(const uint8_t *data, size_t size) {
    static const int64_t widths[] = {1, 2, 4};
    if (size < 2)
        return;
    write_file("tokens.bin", data + 2, size - 2);
    ddp_dataset spec = {.name = "fuzzed", .kind = DDP_DATA_TOKENS, .path = {"tokens.bin", NULL}, .scale = 1,
                        .token_bytes = widths[data[0] % 3], .window = 1 + data[1] % 16};
    open_dataset(&spec);
}

static void csv(const uint8_t *data, size_t size) {
    if (size < 1)
        return;
    static const char *const named[] = {"x0", "x1", "x2"}, *const numbered[] = {"0", "1", "2"};
    bool header = data[0] & 1;
    int64_t features = 1 + (data[0] >> 1) % 3;
    write_file("table.csv", data + 1, size - 1);
    ddp_dataset spec = {.name = "fuzzed", .kind = DDP_DATA_CSV, .path = {"table.csv", NULL}, .scale = 1,
                        .header = header, .features = header ? named : numbered, .nfeatures = features,
                        .target = header ? "y" : "3"};
    open_dataset(&spec);
}

static void cifar10(const uint8_t *data, size_t size) {
    write_file("test_batch.bin", data, size);
    ddp_dataset spec = {.name = "fuzzed", .kind = DDP_DATA_CIFAR10, .path = {".", NULL}, .scale = 1, .part = 1};
    open_dataset(&spec);
}

/* A safetensors file of prefix (0 or 8 bytes) and data, read as a checkpoint would be. */
static void safetensors(const uint8_t *prefix, size_t prefix_size, const uint8_t *data, size_t size) {
    /* exactly the file's bytes: a reader must stop at their end */
    unsigned char *bytes = malloc(prefix_size + size ? prefix_size + size : 1);
    if (!bytes)
        return;
    if (prefix_size)
        memcpy(bytes, prefix, prefix_size);
    if (size)
        memcpy(bytes + prefix_size, data, size);
    size += prefix_size;
    ddp_tensor_file f;
    char err[1024];
    if (ddp_tensors_parse(&f, bytes, size, "fuzzed.safetensors", err, sizeof err)) {
        static const char *const loaded[] = {"F32", "F64", "F16", "BF16"}; /* as ddp_load_params */
        for (int64_t i = 0; i < f.count; i++) {
            const ddp_tensor_in *e = &f.tensors[i];
            bool known = false, too_many = false;
            for (int k = 0; k < 4; k++)
                known |= strcmp(e->dtype, loaded[k]) == 0;
            int64_t elems = 1;
            for (int64_t d = 0; d < e->rank; d++)
                too_many |= __builtin_mul_overflow(elems, e->shape[d], &elems);
            if (known && !too_many && elems > 0 && elems <= (1 << 20)) {
                float *values = malloc((size_t)elems * sizeof *values);
                if (values)
                    ddp_tensor_values(&f, e, false, values, elems);
                free(values);
            }
        }
        (void)ddp_tensors_meta(&f, "format");
    } else if (!err[0]) {
        abort();
    }
    ddp_tensors_free(&f);
}

static void sized_safetensors(const uint8_t *data, size_t size) {
    if (size < 2)
        return;
    uint64_t header = (uint64_t)(data[0] | data[1] << 8), rest = size - 2;
    uint8_t prefix[8];
    for (int i = 0; i < 8; i++)
        prefix[i] = (uint8_t)((header < rest ? header : rest) >> 8 * i);
    safetensors(prefix, 8, data + 2, rest);
}

/* The bytes as an environment variable's text: up to the first zero byte. */
static char *text_of(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (text) {
        memcpy(text, data, size);
        text[size] = 0;
    }
    return text;
}

static void hostlist(const uint8_t *data, size_t size) {
    char *list = text_of(data, size), err[1024];
    if (!list)
        return;
    ddp_hostlist h = {0};
    if (ddp_hostlist_parse(list, &h, err, sizeof err)) {
        for (int64_t i = 0; i < h.count; i++)
            if (!h.names[i])
                abort();
        ddp_hostlist_free(&h);
    } else if (!err[0]) {
        abort();
    }
    free(list);
}

static void tasks_per_node(const uint8_t *data, size_t size) {
    char *list = text_of(data, size), err[1024];
    if (!list)
        return;
    int64_t *counts = NULL;
    int nodes = 0;
    if (ddp_tasks_per_node_parse(list, &counts, &nodes, err, sizeof err)) {
        for (int i = 0; i < nodes; i++)
            if (counts[i] < 0)
                abort();
        free(counts);
    } else if (!err[0]) {
        abort();
    }
    free(list);
}

static const char *const cluster_variables[] = {
    "SLURM_JOB_ID",   "SLURM_STEP_ID",  "SLURM_STEP_NUM_TASKS", "SLURM_PROCID",         "SLURM_LOCALID",
    "SLURM_NODEID",   "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "DDP_RANK", "DDP_WORLD_SIZE",
    "DDP_LOCAL_RANK", "DDP_LOCAL_WORLD_SIZE", "DDP_COORDINATOR"};
enum { CLUSTER_VARIABLES = sizeof cluster_variables / sizeof *cluster_variables };

static void cluster(const uint8_t *data, size_t size) {
    if (size < 1)
        return;
    char *text = text_of(data + 1, size - 1), err[1024];
    if (!text)
        return;
    /* putenv of buffers of this file's own: setenv keeps every value it replaces */
    static char assignments[CLUSTER_VARIABLES][4096];
    char *line = text;
    for (int i = 0; i < CLUSTER_VARIABLES; i++) {
        char *end = line ? strchr(line, '\n') : NULL;
        if (end)
            *end = 0;
        unsetenv(cluster_variables[i]);
        if (line && strcmp(line, "~") != 0) {
            snprintf(assignments[i], sizeof assignments[i], "%s=%s", cluster_variables[i], line);
            putenv(assignments[i]);
        }
        line = end ? end + 1 : NULL;
    }
    ddp_settings s = {.cluster = data[0] % 4, .port_base = -1, .port_range = {29500, 29999}};
    ddp_cluster c;
    if (ddp_cluster_resolve(&s, NULL, &c, err, sizeof err)) {
        if (c.rank < 0 || c.rank >= c.world || c.port_base < 1 || c.port_base + c.local_world - 1 > 65535)
            abort();
        ddp_cluster_free(&c);
    } else if (!err[0]) {
        abort();
    }
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!folder[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(folder, sizeof folder, "%s/ddp-fuzz-inputs.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(folder))
            abort();
    }
    if (size < 1)
        return 0;
    switch (data[0] % KINDS) {
    case KIND_IDX: two_files(DDP_DATA_IDX, "images.idx", "labels.idx", data + 1, size - 1); break;
    case KIND_NPY: two_files(DDP_DATA_NPY, "inputs.npy", "labels.npy", data + 1, size - 1); break;
    case KIND_CSV: csv(data + 1, size - 1); break;
    case KIND_CIFAR10: cifar10(data + 1, size - 1); break;
    case KIND_SAFETENSORS: safetensors(NULL, 0, data + 1, size - 1); break;
    case KIND_HOSTLIST: hostlist(data + 1, size - 1); break;
    case KIND_TASKS: tasks_per_node(data + 1, size - 1); break;
    case KIND_SAFETENSORS_SIZED: sized_safetensors(data + 1, size - 1); break;
    case KIND_CLUSTER: cluster(data + 1, size - 1); break;
    case KIND_NPY_PARTS: npy_parts(data + 1, size - 1); break;
    case KIND_TOKENS: tokens(data + 1, size - 1); break;
    }
    return 0;
}
