/* data_read.h: what the dataset readers (data_idx.c, data_cifar10.c, data_npy.c,
 * data_csv.c, data_tokens.c) share with data.c, which holds these helpers: reading a
 * file whole, plain or gzip-compressed; byte order and element types; the one-line
 * messages every failure ends in. Private to the data files of the runtime. */
#ifndef DDP_DATA_READ_H
#define DDP_DATA_READ_H

#include "runtime.h"

/* A file's bytes: read into memory, followed by one zero byte that len does not count
 * (so text readers may treat the buffer as a string); or mapped (data_map_file), then
 * read-only and with nothing after the last byte. */
typedef struct data_bytes {
    unsigned char *data;
    size_t len;
    bool mapped;
    bool read_ahead; /* mapped, and the whole file asked to be read in the background */
} data_bytes;

/* Reads a file whole through zlib, which inflates gzip files and passes others through.
 * role says which of the dataset's files it is ("images", "labels"), for messages. A
 * missing, empty or unreadable file, and a gzip stream cut short, are errors. */
bool data_read_file(const char *path, const ddp_dataset *spec, const char *role, data_bytes *out, char *err,
                    size_t errlen);
void data_bytes_free(data_bytes *b);
/* The bytes from offset on, moved to the front of the block (so aligned for any element
 * type), which the caller now owns; b is left empty. Spares a large file's payload a
 * second copy. A mapped b is copied out; NULL: out of memory. */
void *data_take(data_bytes *b, size_t offset);

/* data_map.c. A file of inputs mapped read-only where it is not gzip-compressed and
 * mapping works, else read as data_read_file does (out->mapped says which). A reader
 * that must rewrite the values in place (their byte order) calls data_own first; one
 * that copies them into another order (Fortran's) reads the mapping as it is. */
bool data_map_file(const char *path, const ddp_dataset *spec, const char *role, data_bytes *out, char *err,
                   size_t errlen);
void data_unmap(data_bytes *b);
/* A mapped b made a copy in memory, writable; false: out of memory (b unchanged). */
bool data_own(data_bytes *b);
/* The values from offset on, for d->inputs: in place when b is mapped and offset is
 * aligned for elements of width bytes (d then owns the mapping), else as data_take. */
void *data_keep_inputs(ddp_data *d, data_bytes *b, size_t offset, int width);
/* d's inputs freed or unmapped. */
void data_free_inputs(ddp_data *d);

/* Writes "FILE: message" into err; returns false, so a reader can `return data_fail(...)`. */
bool data_fail(char *err, size_t errlen, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* "the dataset `name`, role" (or "the dataset's role" for an unnamed one), for messages;
 * DATA_ROLE_MAX holds any, since a role may name a folder. */
enum { DATA_ROLE_MAX = 1280 };
const char *data_role(char *buf, size_t len, const ddp_dataset *spec, const char *role);
/* The end of a missing file's advice: " or give --data-root" where the dataset names a
 * path that --data-root would move (a relative one), else "". */
const char *data_root_hint(const ddp_dataset *spec);
/* Up to n bytes of text (a cell, a piece of a header) for quoting in a message: cut
 * short with "..." past len, control characters as '?', so the message stays one line. */
const char *data_excerpt(char *buf, size_t len, const char *text, size_t n);
/* dir/name into out; false if it does not fit. */
bool data_join_path(char *out, size_t outlen, const char *dir, const char *name);

extern const int data_elem_size[DDP_ELEM_COUNT];
extern const char *const data_elem_name[DDP_ELEM_COUNT];

uint32_t data_be32(const unsigned char *p);
uint32_t data_le32(const unsigned char *p);
uint16_t data_le16(const unsigned char *p);
/* count elements of width bytes, stored big- or little-endian, to the host's order */
void data_to_native(void *p, size_t count, int width, bool big_endian);
/* count values of an element type as doubles (labels are kept so); values, a malloc'd
 * block, is freed. NULL when out of memory. */
double *data_into_doubles(void *values, int elem, size_t count);

/* d's label values all finite, or false with the first that is not named. */
bool data_check_labels(const ddp_data *d, char *err, size_t errlen);

/* The bytes of samples x dims elements of width bytes; false on overflow. */
bool data_array_bytes(int64_t samples, const int64_t *dims, int rank, int width, uint64_t *bytes);
/* Sets d's per-sample shape and element count. */
void data_set_sample_shape(ddp_data *d, int rank, const int64_t *dims);

/* The readers: each fills d's samples, shape, inputs and labels from the files named
 * by d->where and d->label_where. */
bool data_read_idx(ddp_data *d, char *err, size_t errlen);
bool data_read_cifar10(ddp_data *d, char *err, size_t errlen);
bool data_read_npy(ddp_data *d, char *err, size_t errlen);
bool data_read_csv(ddp_data *d, char *err, size_t errlen);
bool data_read_tokens(ddp_data *d, char *err, size_t errlen);
/* The largest of a token file's count tokens from token first on. */
int64_t data_largest_token(const ddp_data *d, int64_t first, int64_t count);

#endif
