/* unit_util.c: the front end's small utilities against values worked out by hand:
 * edit distance (with transpositions and its early exit), number and count
 * formatting, the map through growth, and nested scopes with shadowing. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "ddpc.h"

static void test_edit_distance(void) {
    CHECK(edit_distance("dense", "dense", 3) == 0);
    CHECK(edit_distance("dens", "dense", 3) == 1);
    CHECK(edit_distance("desne", "dense", 3) == 1); /* a transposition counts once */
    CHECK(edit_distance("conv", "conv2d", 3) == 2);
    CHECK(edit_distance("kitten", "sitting", 3) == 3);
    CHECK(edit_distance("abc", "xyzuvw", 2) == 3);  /* gives up past the limit */
    CHECK(suggest("activaton", (const char *[]){"units", "activation", "bias"}, 3) != NULL);
    CHECK(suggest("zzz", (const char *[]){"units", "activation"}, 2) == NULL);
}

static void test_formatting(Arena *a) {
    CHECK(strcmp(fmt_count(a, 0), "0") == 0);
    CHECK(strcmp(fmt_count(a, 999), "999") == 0);
    CHECK(strcmp(fmt_count(a, 1000), "1,000") == 0);
    CHECK(strcmp(fmt_count(a, 3274634), "3,274,634") == 0);
    CHECK(strcmp(fmt_count(a, -1234567), "-1,234,567") == 0);
    CHECK(strcmp(fmt_number(a, 3), "3") == 0);
    CHECK(strcmp(fmt_number(a, 0.001), "0.001") == 0);
    CHECK(strcmp(fmt_number(a, 1.0 / 255), "0.00392156862745098") == 0);
    CHECK(strcmp(fmt_number(a, 1e-7), "1e-07") == 0);
    CHECK(strcmp(fmt_number(a, -2.5), "-2.5") == 0);
}

static void test_map(Arena *a) {
    Map m = {0};
    char *keys[1000];
    for (int i = 0; i < 1000; i++) {
        keys[i] = arena_printf(a, "key%d", i);
        map_put(a, &m, keys[i], keys[i]);
    }
    CHECK(m.len == 1000);
    int found = 0;
    for (int i = 0; i < 1000; i++)
        found += map_get(&m, arena_printf(a, "key%d", i)) == keys[i];
    CHECK(found == 1000);
    CHECK(map_get(&m, "key1000") == NULL);
    map_put(a, &m, keys[7], NULL);
    CHECK(map_get(&m, "key7") == NULL && m.len == 1000);
}

static void test_scopes(Arena *a) {
    Scopes s = {0};
    int outer = 1, inner = 2;
    scopes_push(a, &s);
    scopes_bind(a, &s, "x", &outer);
    scopes_push(a, &s);
    CHECK(scopes_get(&s, "x") == &outer);
    scopes_bind(a, &s, "x", &inner);
    scopes_bind(a, &s, "y", &inner);
    CHECK(scopes_get(&s, "x") == &inner);
    CHECK(scopes_innermost(&s) == 1);
    scopes_pop(a, &s);
    CHECK(scopes_get(&s, "x") == &outer);
    CHECK(scopes_get(&s, "y") == NULL);
    scopes_pop(a, &s);
    CHECK(scopes_get(&s, "x") == NULL);
}

int main(void) {
    Arena *a = arena_new();
    test_edit_distance();
    test_formatting(a);
    test_map(a);
    test_scopes(a);
    arena_free(a);
    printf("unit_util: %s (%d failed checks)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
