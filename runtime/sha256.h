/* sha256.h: SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), self-contained, for the
 * runtime's authentication of the processes of one job (auth.c): hashing a shared
 * secret into a key and proving knowledge of it over nonces. Nothing here is meant
 * for bulk data; it is small and plain rather than fast. */
#ifndef DDP_SHA256_H
#define DDP_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A hash in progress: the chaining state, the bytes hashed so far, and the part of the
 * current 64-byte block not yet compressed (fill bytes of block). */
typedef struct ddp_sha256 {
    uint32_t state[8];
    uint64_t bytes;
    unsigned char block[64];
    size_t fill;
} ddp_sha256;

void ddp_sha256_init(ddp_sha256 *s);
/* data may be NULL when len is 0. */
void ddp_sha256_update(ddp_sha256 *s, const void *data, size_t len);
/* Writes the digest; s must be initialised again before it is used for another. */
void ddp_sha256_final(ddp_sha256 *s, unsigned char out[32]);
void ddp_sha256_digest(const void *data, size_t len, unsigned char out[32]);

/* HMAC-SHA-256 (RFC 2104) of the concatenation of parts, so callers need not copy */
void ddp_hmac_sha256(const void *key, size_t key_len, const void *const *parts, const size_t *part_lens,
                     int nparts, unsigned char out[32]);

/* constant-time comparison of n bytes */
bool ddp_equal_secret(const void *a, const void *b, size_t n);

#endif
