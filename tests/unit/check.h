/* check.h: the unit tests' one assertion: a failed check prints its place and
 * condition and counts, and the test goes on to report every failure at the end. */
#ifndef DDP_TEST_CHECK_H
#define DDP_TEST_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond)                                                                                          \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                         \
            failures++;                                                                                      \
        }                                                                                                    \
    } while (0)

#endif
