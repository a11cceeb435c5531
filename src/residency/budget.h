/* budget.h — how much memory the engine may use: physical RAM, the memory-cgroup limit that applies to this
 * process (v1 or v2, the tightest along the path), the default budget, and the process's resident set. */
#ifndef DF_STORE_BUDGET_H
#define DF_STORE_BUDGET_H

#include <stdint.h>

uint64_t budget_physical_bytes(void);
/* The tightest memory-cgroup limit on this process, or 0 when none applies. */
uint64_t budget_cgroup_limit(void);
/* The default budget: a cgroup limit (tighter than RAM) less max(768 MiB, 1/8 of it), at least 3/4 of it;
 * else 3/4 of physical RAM. The rest is left to the kernel, the page cache that holds headers and embedding
 * rows, and (without a cgroup) other processes. */
uint64_t budget_default_bytes(void);
/* The same for this much RAM and this cgroup limit (0: unknown / none). */
uint64_t budget_default_for(uint64_t ram, uint64_t cg);
/* Peak and current resident set of this process (VmHWM, VmRSS), in bytes; 0 if unknown. */
uint64_t budget_rss_peak(void);
uint64_t budget_rss_now(void);

#endif
