/* tf32.c: the emulated device's TF32 rounding (ddp_tf32_round) against values worked
 * out by hand from the format: values TF32 holds stay, ties go away from zero, one bit
 * below a tie goes down, signs are kept, infinities and NaN stay, the largest float
 * rounds to infinity, subnormals round like the rest. One line per check. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "device.h"

static int failures;

static float from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static uint32_t bits_of(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

static void expect(const char *what, uint32_t in, uint32_t want) {
    uint32_t got = bits_of(ddp_tf32_round(from_bits(in)));
    bool nan_ok = isnan(from_bits(want)) && isnan(from_bits(got));
    if (got == want || nan_ok) {
        printf("ok   %s: %08x -> %08x\n", what, in, got);
        return;
    }
    printf("FAIL %s: %08x -> %08x, want %08x\n", what, in, got, want);
    failures++;
}

int main(void) {
    expect("1 stays", 0x3f800000u, 0x3f800000u);
    expect("1 + 2^-10 (the last bit TF32 keeps) stays", 0x3f802000u, 0x3f802000u);
    expect("1 + 2^-11, a tie, goes away from zero", 0x3f801000u, 0x3f802000u);
    expect("-(1 + 2^-11), a tie, goes away from zero", 0xbf801000u, 0xbf802000u);
    expect("1 + 2^-11 - 2^-23, below the tie, goes down", 0x3f800fffu, 0x3f800000u);
    expect("1 + 3 * 2^-11, a tie, goes away from zero too", 0x3f803000u, 0x3f804000u);
    expect("a mantissa of all ones carries into the exponent", 0x3fffffffu, 0x40000000u);
    expect("the largest float rounds to infinity", 0x7f7fffffu, 0x7f800000u);
    expect("infinity stays", 0x7f800000u, 0x7f800000u);
    expect("-infinity stays", 0xff800000u, 0xff800000u);
    expect("NaN stays NaN", 0x7fc00001u, 0x7fc00000u);
    expect("zero stays", 0x00000000u, 0x00000000u);
    expect("-zero stays", 0x80000000u, 0x80000000u);
    expect("a subnormal at a tie goes up", 0x00001000u, 0x00002000u);
    expect("a subnormal below the tie goes to zero", 0x00000fffu, 0x00000000u);
    return failures ? 1 : 0;
}
