/* sha256.c: the runtime's SHA-256 and HMAC-SHA-256 (runtime/sha256.c) against the
 * published vectors: the FIPS 180-4 / NIST examples, a message fed in two pieces split
 * at every offset against the same message in one piece, the seven test cases of RFC
 * 4231, an HMAC over several parts against the same bytes as one part, and the
 * comparison of secrets. One line per check; "FAIL" lines say what differed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sha256.h"

static int failures;

static void to_hex(const unsigned char *bytes, size_t n, char *hex) {
    for (size_t i = 0; i < n; i++)
        sprintf(hex + 2 * i, "%02x", bytes[i]);
    hex[2 * n] = 0;
}

/* Reports one check; want_hex may be shorter than the digest (a truncated MAC). */
static void expect_hex(const char *name, const unsigned char digest[32], const char *want_hex) {
    char got[65];
    to_hex(digest, 32, got);
    if (strncmp(got, want_hex, strlen(want_hex)) == 0) {
        printf("ok   %s\n", name);
        return;
    }
    printf("FAIL %s: got %.*s, want %s\n", name, (int)strlen(want_hex), got, want_hex);
    failures++;
}

static void expect(const char *name, bool ok) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", name);
    failures += !ok;
}

/* ------------------------------------------------------------------ FIPS 180-4 / NIST */

static void check_nist_vectors(void) {
    unsigned char d[32];
    ddp_sha256_digest("", 0, d);
    expect_hex("sha256 of \"\"", d, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    ddp_sha256_digest(NULL, 0, d);
    expect_hex("sha256 of NULL, 0 bytes", d, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    ddp_sha256_digest("abc", 3, d);
    expect_hex("sha256 of \"abc\"", d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");

    const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    ddp_sha256_digest(two_blocks, strlen(two_blocks), d);
    expect_hex("sha256 of the 448-bit message", d, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");

    /* a million 'a' both at once and in uneven pieces, so the byte count passes 2^20 */
    enum { MILLION = 1000000 };
    char *as = malloc(MILLION);
    if (!as) {
        expect("allocate a million bytes", false);
        return;
    }
    memset(as, 'a', MILLION);
    ddp_sha256_digest(as, MILLION, d);
    expect_hex("sha256 of a million 'a'", d, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    ddp_sha256 s;
    ddp_sha256_init(&s);
    for (size_t done = 0, piece = 1; done < MILLION; done += piece, piece = piece * 3 % 997 + 1)
        ddp_sha256_update(&s, as + done, piece < MILLION - done ? piece : MILLION - done);
    ddp_sha256_final(&s, d);
    expect_hex("sha256 of a million 'a' in uneven pieces", d,
               "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(as);
}

/* ------------------------------------------------------------------ split updates */

static void check_split_updates(void) {
    enum { LEN = 131 };
    unsigned char message[LEN], whole[32], split[32];
    for (int i = 0; i < LEN; i++)
        message[i] = (unsigned char)(i * 167 + 13);
    ddp_sha256_digest(message, LEN, whole);

    int bad = 0;
    for (size_t at = 0; at < LEN; at++) {
        ddp_sha256 s;
        ddp_sha256_init(&s);
        ddp_sha256_update(&s, message, at);
        ddp_sha256_update(&s, NULL, 0);
        ddp_sha256_update(&s, message + at, LEN - at);
        ddp_sha256_final(&s, split);
        if (memcmp(whole, split, 32) != 0) {
            printf("FAIL 131-byte message split at %zu differs from one piece\n", at);
            bad++;
        }
    }
    failures += bad;
    if (!bad)
        printf("ok   131-byte message split at every offset 0..130 equals one piece\n");

    ddp_sha256 s;
    ddp_sha256_init(&s);
    for (int i = 0; i < LEN; i++)
        ddp_sha256_update(&s, message + i, 1);
    ddp_sha256_final(&s, split);
    expect("131-byte message a byte at a time equals one piece", memcmp(whole, split, 32) == 0);
}

/* ------------------------------------------------------------------ RFC 4231 */

typedef struct hmac_case {
    const char *name;
    unsigned char key_byte; /* the key is key_len copies of it, unless key is set */
    const char *key;
    size_t key_len;
    unsigned char data_byte; /* likewise for the data */
    const char *data;
    size_t data_len;
    const char *want_hex; /* 32 hex digits for case 5, which is truncated to 128 bits */
} hmac_case;

static const hmac_case rfc4231[] = {
    {"RFC 4231 case 1", 0x0b, NULL, 20, 0, "Hi There", 8,
     "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
    {"RFC 4231 case 2 (key shorter than the output)", 0, "Jefe", 4, 0, "what do ya want for nothing?", 28,
     "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
    {"RFC 4231 case 3", 0xaa, NULL, 20, 0xdd, NULL, 50,
     "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
    {"RFC 4231 case 4", 0, "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16"
                           "\x17\x18\x19",
     25, 0xcd, NULL, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
    {"RFC 4231 case 5 (truncated to 128 bits)", 0x0c, NULL, 20, 0, "Test With Truncation", 20,
     "a3b6167473100ee06e0c796c2955552b"},
    {"RFC 4231 case 6 (key longer than a block)", 0xaa, NULL, 131, 0,
     "Test Using Larger Than Block-Size Key - Hash Key First", 54,
     "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
    {"RFC 4231 case 7 (key and data longer than a block)", 0xaa, NULL, 131, 0,
     "This is a test using a larger than block-size key and a larger than block-size data. The key needs to be "
     "hashed before being used by the HMAC algorithm.",
     152, "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
};

/* The bytes a case names: given, or len copies of one byte into buf. */
static const void *case_bytes(const char *given, unsigned char byte, size_t len, unsigned char *buf) {
    if (given)
        return given;
    memset(buf, byte, len);
    return buf;
}

static void check_rfc4231(void) {
    for (size_t i = 0; i < sizeof rfc4231 / sizeof rfc4231[0]; i++) {
        const hmac_case *c = &rfc4231[i];
        unsigned char key_buf[256], data_buf[256], mac[32];
        const void *key = case_bytes(c->key, c->key_byte, c->key_len, key_buf);
        const void *parts[] = {case_bytes(c->data, c->data_byte, c->data_len, data_buf)};
        ddp_hmac_sha256(key, c->key_len, parts, &c->data_len, 1, mac);
        expect_hex(c->name, mac, c->want_hex);
    }
}

/* Case 7's message in pieces that cross the block boundary, one of them empty. */
static void check_hmac_parts(void) {
    const hmac_case *c = &rfc4231[6];
    unsigned char key[131], one[32], several[32];
    memset(key, c->key_byte, sizeof key);
    const void *whole[] = {c->data};
    ddp_hmac_sha256(key, sizeof key, whole, &c->data_len, 1, one);

    const char *m = c->data;
    const void *parts[] = {m, m + 5, m + 5, m + 63, m + 64, m + 100};
    const size_t lens[] = {5, 0, 58, 1, 36, c->data_len - 100};
    ddp_hmac_sha256(key, sizeof key, parts, lens, 6, several);
    expect("HMAC of case 7's message in six parts equals one part", memcmp(one, several, 32) == 0);
    expect_hex("HMAC of case 7's message in six parts matches RFC 4231", several, c->want_hex);

    /* no parts at all is the MAC of the empty message */
    unsigned char none[32], empty[32];
    const void *empty_part[] = {""};
    const size_t zero = 0;
    ddp_hmac_sha256(key, sizeof key, NULL, NULL, 0, none);
    ddp_hmac_sha256(key, sizeof key, empty_part, &zero, 1, empty);
    expect("HMAC of no parts equals HMAC of one empty part", memcmp(none, empty, 32) == 0);
}

/* ------------------------------------------------------------------ secrets */

static void check_equal_secret(void) {
    unsigned char a[32], b[32];
    for (int i = 0; i < 32; i++)
        a[i] = b[i] = (unsigned char)(i * 29 + 1);
    expect("equal secrets compare equal", ddp_equal_secret(a, b, 32));
    expect("zero bytes compare equal", ddp_equal_secret(a, "x", 0));
    b[0] ^= 1;
    expect("secrets differing in the first byte differ", !ddp_equal_secret(a, b, 32));
    b[0] ^= 1, b[31] ^= 0x80;
    expect("secrets differing in the last bit differ", !ddp_equal_secret(a, b, 32));
    expect("a difference past n is not looked at", ddp_equal_secret(a, b, 31));
}

int main(void) {
    check_nist_vectors();
    check_split_updates();
    check_rfc4231();
    check_hmac_parts();
    check_equal_secret();
    if (failures) {
        printf("FAIL sha256: %d check(s) failed\n", failures);
        return 1;
    }
    printf("ok   sha256: all checks passed\n");
    return 0;
}
