/* sha256.c: SHA-256 as FIPS 180-4 describes it (section 6.2), HMAC-SHA-256 as RFC 2104
 * builds it on any hash, and a comparison of secrets whose time does not depend on
 * where they differ. Written for auth.c: short messages, clarity before speed. */
#include "sha256.h"

#include <string.h>

enum { BLOCK = 64, DIGEST = 32, LENGTH_FIELD = 8 };

/* FIPS 180-4 4.2.2: the first 32 bits of the fractional parts of the cube roots of the
 * first 64 primes. */
static const uint32_t round_constants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

/* FIPS 180-4 5.3.3: the first 32 bits of the fractional parts of the square roots of
 * the first 8 primes. */
static const uint32_t initial_state[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

/* ------------------------------------------------------------------ the functions of 4.1.2 */

static uint32_t rotate_right(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }
static uint32_t choose(uint32_t x, uint32_t y, uint32_t z) { return (x & y) ^ (~x & z); }
static uint32_t majority(uint32_t x, uint32_t y, uint32_t z) { return (x & y) ^ (x & z) ^ (y & z); }
static uint32_t big_sigma0(uint32_t x) { return rotate_right(x, 2) ^ rotate_right(x, 13) ^ rotate_right(x, 22); }
static uint32_t big_sigma1(uint32_t x) { return rotate_right(x, 6) ^ rotate_right(x, 11) ^ rotate_right(x, 25); }
static uint32_t small_sigma0(uint32_t x) { return rotate_right(x, 7) ^ rotate_right(x, 18) ^ (x >> 3); }
static uint32_t small_sigma1(uint32_t x) { return rotate_right(x, 17) ^ rotate_right(x, 19) ^ (x >> 10); }

/* The standard is big-endian throughout, whatever this machine is. */
static uint32_t load_big_endian32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void store_big_endian32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (24 - 8 * i));
}

static void store_big_endian64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (56 - 8 * i));
}

/* ------------------------------------------------------------------ the hash, 6.2.2 */

/* One 512-bit block into the chaining state. */
static void compress(uint32_t state[8], const unsigned char block[BLOCK]) {
    uint32_t schedule[64];
    for (int t = 0; t < 16; t++)
        schedule[t] = load_big_endian32(block + 4 * t);
    for (int t = 16; t < 64; t++)
        schedule[t] = small_sigma1(schedule[t - 2]) + schedule[t - 7] + small_sigma0(schedule[t - 15]) +
                      schedule[t - 16];

    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = h + big_sigma1(e) + choose(e, f, g) + round_constants[t] + schedule[t];
        uint32_t t2 = big_sigma0(a) + majority(a, b, c);
        h = g, g = f, f = e, e = d + t1;
        d = c, c = b, b = a, a = t1 + t2;
    }
    state[0] += a, state[1] += b, state[2] += c, state[3] += d;
    state[4] += e, state[5] += f, state[6] += g, state[7] += h;
}

void ddp_sha256_init(ddp_sha256 *s) {
    memcpy(s->state, initial_state, sizeof s->state);
    s->bytes = 0;
    s->fill = 0;
}

void ddp_sha256_update(ddp_sha256 *s, const void *data, size_t len) {
    const unsigned char *p = data;
    s->bytes += len;
    while (len > 0) {
        /* whole blocks straight from the caller's bytes when nothing is pending */
        if (s->fill == 0 && len >= BLOCK) {
            compress(s->state, p);
            p += BLOCK, len -= BLOCK;
            continue;
        }
        size_t take = BLOCK - s->fill < len ? BLOCK - s->fill : len;
        memcpy(s->block + s->fill, p, take);
        s->fill += take, p += take, len -= take;
        if (s->fill == BLOCK) {
            compress(s->state, s->block);
            s->fill = 0;
        }
    }
}

/* 5.1.1: a one bit, zeros, and the message's length in bits in the last 64 bits of a
 * block, taking one more block when fewer than 9 bytes of this one are left. */
void ddp_sha256_final(ddp_sha256 *s, unsigned char out[32]) {
    uint64_t bits = s->bytes * 8;
    s->block[s->fill++] = 0x80;
    if (s->fill > BLOCK - LENGTH_FIELD) {
        memset(s->block + s->fill, 0, BLOCK - s->fill);
        compress(s->state, s->block);
        s->fill = 0;
    }
    memset(s->block + s->fill, 0, BLOCK - LENGTH_FIELD - s->fill);
    store_big_endian64(s->block + BLOCK - LENGTH_FIELD, bits);
    compress(s->state, s->block);
    for (int i = 0; i < 8; i++)
        store_big_endian32(out + 4 * i, s->state[i]);
}

void ddp_sha256_digest(const void *data, size_t len, unsigned char out[32]) {
    ddp_sha256 s;
    ddp_sha256_init(&s);
    ddp_sha256_update(&s, data, len);
    ddp_sha256_final(&s, out);
}

/* ------------------------------------------------------------------ HMAC, RFC 2104 */

/* Key material should not outlive its use on the stack; through a volatile pointer so
 * the compiler cannot drop the stores as dead. */
static void wipe(void *p, size_t n) {
    volatile unsigned char *v = p;
    while (n--)
        *v++ = 0;
}

/* The key padded to a block, a key longer than a block hashed first, each byte
 * xor-ed with pad (0x36 inside, 0x5c outside). */
static void padded_key(const void *key, size_t key_len, unsigned char pad, unsigned char out[BLOCK]) {
    memset(out, 0, BLOCK);
    if (key_len > BLOCK)
        ddp_sha256_digest(key, key_len, out);
    else if (key_len > 0)
        memcpy(out, key, key_len);
    for (int i = 0; i < BLOCK; i++)
        out[i] ^= pad;
}

void ddp_hmac_sha256(const void *key, size_t key_len, const void *const *parts, const size_t *part_lens,
                     int nparts, unsigned char out[32]) {
    unsigned char pad[BLOCK], inner[DIGEST];
    ddp_sha256 s;

    padded_key(key, key_len, 0x36, pad);
    ddp_sha256_init(&s);
    ddp_sha256_update(&s, pad, BLOCK);
    for (int i = 0; i < nparts; i++)
        ddp_sha256_update(&s, parts[i], part_lens[i]);
    ddp_sha256_final(&s, inner);

    padded_key(key, key_len, 0x5c, pad);
    ddp_sha256_init(&s);
    ddp_sha256_update(&s, pad, BLOCK);
    ddp_sha256_update(&s, inner, DIGEST);
    ddp_sha256_final(&s, out);

    wipe(pad, sizeof pad);
    wipe(inner, sizeof inner);
    wipe(&s, sizeof s);
}

/* Every byte is looked at whatever came before, so the time taken tells an attacker
 * nothing about how much of a guessed MAC was right. */
bool ddp_equal_secret(const void *a, const void *b, size_t n) {
    const unsigned char *x = a, *y = b;
    volatile unsigned char difference = 0;
    for (size_t i = 0; i < n; i++)
        difference |= x[i] ^ y[i];
    return difference == 0;
}
