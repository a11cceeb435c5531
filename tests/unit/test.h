/* test.h — the tiny test protocol shared by unit tests: each check prints "ok - name" or "not ok - name",
 * and tests/run.sh counts them. A check that cannot run here (an instruction set this CPU lacks) prints
 * "ok - name # SKIP reason", which run.sh counts as skipped, not passed. A test binary exits non-zero if any
 * check failed. */
#ifndef DF_TEST_H
#define DF_TEST_H

#include <stdio.h>
#include <stdlib.h>

static int test_failures;
static int test_count;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        test_count++;                                                          \
        if (cond) {                                                            \
            printf("ok - ");                                                   \
        } else {                                                               \
            test_failures++;                                                   \
            printf("not ok - %s:%d: ", __FILE__, __LINE__);                    \
        }                                                                      \
        printf(__VA_ARGS__);                                                   \
        printf("\n");                                                          \
        fflush(stdout);                                                        \
    } while (0)

#define SKIP(reason, ...)                                                      \
    do {                                                                       \
        printf("ok - ");                                                       \
        printf(__VA_ARGS__);                                                   \
        printf(" # SKIP %s\n", reason);                                        \
        fflush(stdout);                                                        \
    } while (0)

#define TEST_EXIT() return test_failures ? 1 : 0

#endif
