/* hostlist.c: Slurm's host lists and tasks per node, against expansions that
 * `scontrol show hostnames` gave (tests/cluster/scontrol.sh compares the two live
 * where Slurm is installed), and malformed lists, each refused with a reason.
 *
 *   unit_hostlist            run the checks
 *   unit_hostlist LIST       print LIST's hosts, one a line (for the comparison) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime.h"

/* LIST expands to the space-separated hosts of want */
static void expands(const char *list, const char *want) {
    ddp_hostlist h;
    char err[512], got[4096] = "";
    if (!ddp_hostlist_parse(list, &h, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", list, err);
        CHECK(!"a valid list was refused");
        return;
    }
    for (int i = 0; i < h.count; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", i ? " " : "", h.names[i]);
    if (strcmp(got, want) != 0)
        fprintf(stderr, "%s: got `%s`, want `%s`\n", list, got, want);
    CHECK(strcmp(got, want) == 0);
    ddp_hostlist_free(&h);
}

static void refused(const char *list, const char *reason) {
    ddp_hostlist h;
    char err[512] = "";
    bool ok = ddp_hostlist_parse(list, &h, err, sizeof err);
    if (ok || !strstr(err, reason))
        fprintf(stderr, "%s: %s (wanted a refusal with `%s`)\n", list, ok ? "accepted" : err, reason);
    CHECK(!ok && strstr(err, reason));
    if (ok)
        ddp_hostlist_free(&h);
}

static void tasks(const char *list, const char *want) {
    int64_t *counts;
    int nodes;
    char err[512], got[1024] = "";
    bool ok = ddp_tasks_per_node_parse(list, &counts, &nodes, err, sizeof err);
    for (int i = 0; ok && i < nodes; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? " " : "", (long long)counts[i]);
    if (!want) {
        CHECK(!ok && strstr(err, "are malformed"));
        return;
    }
    if (!ok || strcmp(got, want) != 0)
        fprintf(stderr, "%s: got `%s` %s, want `%s`\n", list, got, ok ? "" : err, want);
    CHECK(ok && strcmp(got, want) == 0);
    free(counts);
}

static void test_lists(void) {
    expands("n1", "n1");
    expands("a[01-03,07],b", "a01 a02 a03 a07 b");
    expands("jz[001-004,007],gpu-a", "jz001 jz002 jz003 jz004 jz007 gpu-a");
    expands("n[9-10]", "n9 n10"); /* never sorted: rank 0 is on n9 */
    expands("x[8-12]", "x8 x9 x10 x11 x12");
    expands("x[00-10]", "x00 x01 x02 x03 x04 x05 x06 x07 x08 x09 x10");
    expands("x[998-1000]", "x998 x999 x1000");
    expands("x[098-100]", "x098 x099 x100");
    expands("x[1-3]y[1-2]", "x1y1 x1y2 x2y1 x2y2 x3y1 x3y2");
    expands("n[1-2]-ib[3-4]", "n1-ib3 n1-ib4 n2-ib3 n2-ib4");
    expands("a[1-2]b[5-7]c[8-9]", /* Slurm's order: the last group fastest, then the first */
            "a1b5c8 a1b5c9 a2b5c8 a2b5c9 a1b6c8 a1b6c9 a2b6c8 a2b6c9 a1b7c8 a1b7c9 a2b7c8 a2b7c9");
    expands("node-[008-011]", "node-008 node-009 node-010 node-011");
    expands("n[1,1],n1", "n1 n1 n1"); /* duplicates kept, as Slurm does */
    expands(",a,,b c", "a b c");
    expands("[1-2]", "1 2");
    expands("x[0-0]", "x0");
    expands("gpu[1-2]-a", "gpu1-a gpu2-a"); /* a suffix after the last bracket */
    ddp_hostlist h;
    char err[256];
    CHECK(ddp_hostlist_parse("c[0-99999]", &h, err, sizeof err) && h.count == 100000 &&
          strcmp(h.names[99999], "c99999") == 0 && strcmp(h.names[0], "c0") == 0);
    ddp_hostlist_free(&h);
}

static void test_malformed(void) {
    refused("", "names no host");
    refused(" , ", "names no host");
    refused("x[1-3", "a `[` is not closed");
    refused("x]", "a `]` without its `[`");
    refused("x[]", "must hold numbers");
    refused("x[a-b]", "must hold numbers");
    refused("x[3-1]", "runs backwards");
    refused("x[1-]", "a number after `-`");
    refused("x[-1]", "must hold numbers");
    refused("x[1[2]]", "expected `,` or `]`");
    refused("x[1234567890]", "must hold numbers");
    refused("x[0-999999]y[0-9]", "more than");
    refused("x[0-599999],y[0-599999]", "more than 1048576 hosts"); /* each item within, the two not */
    refused("a[1-2]b[1-2]c[1-2]d[1-2]e[1-2]f[1-2]g[1-2]h[1-2]i[1-2]", "more than 8 bracket groups");
    char longname[400];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    refused(longname, "longer than");
}

static void test_tasks(void) {
    tasks("4", "4");
    tasks("2(x3),1", "2 2 2 1");
    tasks("4(x2),3", "4 4 3");
    tasks("1,1,1", "1 1 1");
    tasks("3,1", "3 1");
    tasks("", NULL);
    tasks("2(x0)", NULL);
    tasks("0", NULL);
    tasks("2(3)", NULL);
    tasks("2(x3", NULL);
    tasks("2,", NULL);
    tasks("a", NULL);
    tasks("2(x3)1", NULL);
}

int main(int argc, char **argv) {
    if (argc == 2) {
        ddp_hostlist h;
        char err[512];
        if (!ddp_hostlist_parse(argv[1], &h, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        for (int i = 0; i < h.count; i++)
            printf("%s\n", h.names[i]);
        ddp_hostlist_free(&h);
        return 0;
    }
    test_lists();
    test_malformed();
    test_tasks();
    printf("unit_hostlist: %s (%d failed checks)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
