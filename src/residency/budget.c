/* budget.c — memory limits as Linux reports them (sysconf, /proc/self/cgroup, the cgroup files) and the
 * resident set from /proc/self/status. */
#include "budget.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"

uint64_t budget_physical_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

/* A limit file's value; 0 for "max", absent or absurd (v1 reports "no limit" as ~2^63). */
static uint64_t budget_read_limit(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[64] = "";
    uint64_t v = 0;
    if (fgets(buf, sizeof buf, f) && strncmp(buf, "max", 3)) v = strtoull(buf, NULL, 10);
    fclose(f);
    return v >= (1ull << 60) ? 0 : v;
}

/* Walks from the process's cgroup up to the root of one hierarchy, keeping the smallest limit. */
static uint64_t budget_walk(const char *root, const char *cg, const char *file) {
    char path[4096];
    char rel[2048];
    snprintf(rel, sizeof rel, "%s", cg);
    uint64_t best = 0;
    for (;;) {
        snprintf(path, sizeof path, "%s%s/%s", root, rel, file);
        uint64_t v = budget_read_limit(path);
        if (v && (!best || v < best)) best = v;
        char *slash = strrchr(rel, '/');
        if (!slash || !rel[0]) break;
        *slash = 0;
    }
    return best;
}

uint64_t budget_cgroup_limit(void) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return 0;
    char line[4096];
    uint64_t best = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = 0;
        const char *ctrl = c1 + 1, *cg = c2 + 1;
        uint64_t v = 0;
        if (!*ctrl) {   /* v2 unified hierarchy */
            v = budget_walk("/sys/fs/cgroup", cg, "memory.max");
            uint64_t u = budget_walk("/sys/fs/cgroup/unified", cg, "memory.max");
            if (u && (!v || u < v)) v = u;
        } else if (strstr(ctrl, "memory")) {
            v = budget_walk("/sys/fs/cgroup/memory", cg, "memory.limit_in_bytes");
        }
        if (v && (!best || v < best)) best = v;
    }
    fclose(f);
    return best;
}

/* A cgroup limit is this process's own allowance: only a margin for what the budget does not count (code,
 * thread stacks, heap slack, page cache of headers and embedding rows: 0.5 GiB under a 3 GiB limit with K3's
 * on-demand embedding) is left; the budget is never below three quarters of it. Physical RAM is shared with the
 * rest of the machine: a quarter is left. */
#define BUDGET_CGROUP_MARGIN (768ull << 20)

uint64_t budget_default_bytes(void) { return budget_default_for(budget_physical_bytes(), budget_cgroup_limit()); }

uint64_t budget_default_for(uint64_t ram, uint64_t cg) {
    if (cg && (!ram || cg < ram)) {
        uint64_t margin = DF_MAX(BUDGET_CGROUP_MARGIN, cg / 8);
        return DF_MAX(cg > margin ? cg - margin : 0, cg / 4 * 3);
    }
    return (ram ? ram : 4ull << 30) / 4 * 3;
}

static uint64_t budget_status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    uint64_t v = 0;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') v = strtoull(line + kl + 1, NULL, 10) * 1024;
    fclose(f);
    return v;
}

uint64_t budget_rss_peak(void) { return budget_status_kb("VmHWM"); }
uint64_t budget_rss_now(void) { return budget_status_kb("VmRSS"); }
