/* safetensors.c: the reader of safetensors files (saved parameters and checkpoints),
 * ddp_tensors_parse, on files made here: a good one whose tensors and metadata are read
 * back exactly, and damaged ones of every kind, each refused with a message that names
 * the file and says what is wrong. Every file lies in a block of exactly its size, so a
 * reader that looks past the end is caught by the sanitizers and valgrind. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime.h"

/* A file: the header's length (8 bytes, little-endian; header_len when not -1, else the
 * header's own), the header, then data_len bytes of data. */
static unsigned char *file_of(int64_t header_len, const char *header, const void *data, size_t data_len,
                              size_t *len) {
    size_t h = strlen(header);
    uint64_t said = header_len < 0 ? h : (uint64_t)header_len;
    *len = 8 + h + data_len;
    unsigned char *bytes = malloc(*len);
    for (int i = 0; i < 8; i++)
        bytes[i] = (unsigned char)(said >> 8 * i);
    memcpy(bytes + 8, header, h);
    if (data_len)
        memcpy(bytes + 8 + h, data, data_len);
    return bytes;
}

/* The file parsed, false and err when refused; f is freed either way unless kept. */
static bool parses(unsigned char *bytes, size_t len, ddp_tensor_file *f, char *err, size_t errlen) {
    err[0] = 0;
    return ddp_tensors_parse(f, bytes, len, "test.safetensors", err, errlen);
}

static void refused(int line, int64_t header_len, const char *header, size_t data_len, const char *reason) {
    static const unsigned char zeros[64];
    size_t len;
    unsigned char *bytes = file_of(header_len, header, zeros, data_len, &len);
    ddp_tensor_file f;
    char err[1024];
    bool ok = parses(bytes, len, &f, err, sizeof err);
    bool good = !ok && strstr(err, reason) && strstr(err, "test.safetensors");
    if (!good)
        fprintf(stderr, "line %d: %s (wanted a refusal with `%s`)\n", line, ok ? "accepted" : err, reason);
    CHECK(good);
    ddp_tensors_free(&f);
}

static void test_good_file(void) {
    const char *header = "{\"__metadata__\": {\"format\": \"ddp-checkpoint\", \"note\": \"a\\u0041\\u00e9\\n\"},"
                         " \"w\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]},"
                         " \"b\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [16, 20], \"extra\": [[{}]]},"
                         " \"h\": {\"shape\": [1], \"data_offsets\": [20, 22], \"dtype\": \"F16\"},"
                         " \"s\": {\"dtype\": \"F64\", \"shape\": [], \"data_offsets\": [24, 32]}}";
    unsigned char data[32] = {0};
    float w[4] = {1.5f, -2, 0x1p-126f, 3e38f};
    double s = -0.1;
    memcpy(data, w, 16);
    memcpy(data + 16, "\x80\x3f\x00\xc0", 4); /* BF16 1, -2 */
    memcpy(data + 20, "\x00\x3c", 2);         /* F16 1 */
    memcpy(data + 24, &s, 8);
    size_t len;
    unsigned char *bytes = file_of(-1, header, data, sizeof data, &len);
    ddp_tensor_file f;
    char err[1024];
    CHECK(parses(bytes, len, &f, err, sizeof err));
    CHECK(f.count == 4);
    const char *format = ddp_tensors_meta(&f, "format"), *note = ddp_tensors_meta(&f, "note");
    CHECK(format && strcmp(format, "ddp-checkpoint") == 0);
    CHECK(note && strcmp(note, "aA?\n") == 0); /* \u escapes outside ASCII become '?' */
    CHECK(!ddp_tensors_meta(&f, "step"));
    const ddp_tensor_in *tw = ddp_tensors_find(&f, "w"), *tb = ddp_tensors_find(&f, "b"),
                        *th = ddp_tensors_find(&f, "h"), *ts = ddp_tensors_find(&f, "s");
    CHECK(tw && tb && th && ts && !ddp_tensors_find(&f, "x"));
    if (tw && tb && th && ts) {
        CHECK(tw->rank == 2 && tw->shape[0] == 2 && tw->shape[1] == 2 && ts->rank == 0);
        float got[4];
        double got64[4];
        ddp_tensor_values(&f, tw, false, got, 4);
        CHECK(memcmp(got, w, sizeof w) == 0);
        ddp_tensor_values(&f, tw, true, got64, 4);
        CHECK(got64[0] == 1.5 && got64[3] == (double)3e38f);
        ddp_tensor_values(&f, tb, false, got, 2);
        CHECK(got[0] == 1 && got[1] == -2);
        ddp_tensor_values(&f, th, true, got64, 1);
        CHECK(got64[0] == 1);
        ddp_tensor_values(&f, ts, true, got64, 1);
        CHECK(got64[0] == s);
    }
    ddp_tensors_free(&f);

    /* no tensors, and a header that ends the file */
    bytes = file_of(-1, " { } ", NULL, 0, &len);
    CHECK(parses(bytes, len, &f, err, sizeof err) && f.count == 0 && f.data_len == 0);
    ddp_tensors_free(&f);
    /* a dtype the reader does not convert is parsed (loading refuses it, naming it) */
    bytes = file_of(-1, "{\"i\": {\"dtype\": \"I64\", \"shape\": [3], \"data_offsets\": [0, 5]}}", data, 8, &len);
    CHECK(parses(bytes, len, &f, err, sizeof err) && f.count == 1 && strcmp(f.tensors[0].dtype, "I64") == 0);
    ddp_tensors_free(&f);
}

static void test_damaged_files(void) {
    static const char fits[] = "does not fit its shape";
    static const char not_json[] = "not the JSON the format wants";
    /* the length */
    for (size_t n = 0; n < 8; n++) {
        unsigned char *bytes = malloc(n ? n : 1);
        memset(bytes, 0, n);
        ddp_tensor_file f;
        char err[1024];
        CHECK(!parses(bytes, n, &f, err, sizeof err) && strstr(err, "shorter than its 8-byte header length"));
        ddp_tensors_free(&f);
    }
    refused(__LINE__, 3, "{}", 0, "beyond the end of the file");
    refused(__LINE__, INT64_MAX, "{}", 0, "beyond the end of the file");
    /* the JSON */
    refused(__LINE__, -1, "", 0, not_json);
    refused(__LINE__, -1, "{} x", 0, not_json);
    refused(__LINE__, -1, "{\"w\": {\"shape\": [1, 2", 0, not_json); /* a number at the very end of the file */
    refused(__LINE__, 19, "{\"w\": {\"shape\": [123]}}", 0, not_json); /* its digits go on past the header */
    refused(__LINE__, -1, "{\"w\": {\"shape\": [-1]}}", 0, not_json);
    refused(__LINE__, -1, "{\"w\": {\"shape\": [+1]}}", 0, not_json);
    refused(__LINE__, -1, "{\"w\": {\"shape\": [9223372036854775808]}}", 0, not_json);
    refused(__LINE__, -1, "{\"w\": {\"shape\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}}", 0, not_json);
    refused(__LINE__, -1, "{\"w\": {\"data_offsets\": [0]}}", 0, not_json);
    refused(__LINE__, -1, "{\"w\": {\"dtype\": \"F32}}", 0, not_json);
    refused(__LINE__, -1, "{\"w\" {}}", 0, not_json);
    refused(__LINE__, -1, "{\"w\": {}, }", 0, not_json);
    char deep[256] = "{\"w\": {\"x\": ";
    for (int i = 0; i < 40; i++)
        strcat(deep, "[");
    refused(__LINE__, -1, deep, 0, not_json); /* nested past what the reader follows, and cut short */
    /* the byte ranges */
    refused(__LINE__, -1, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 8, fits);
    refused(__LINE__, -1, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 16]}}", 8, fits);
    refused(__LINE__, -1, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 8, fits);
    /* 2^62 x 4 elements of 4 bytes: the product overflows to 0, which an empty range matched */
    refused(__LINE__, -1,
            "{\"w\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 4], \"data_offsets\": [0, 0]}}", 0, fits);
    refused(__LINE__, -1,
            "{\"w\": {\"dtype\": \"F64\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 0]}}", 0, fits);
}

int main(void) {
    test_good_file();
    test_damaged_files();
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    else
        printf("safetensors: every check passed\n");
    return failures != 0;
}
