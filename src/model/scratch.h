/* scratch.h — the forward pass's working memory: one arena per model, reused by every pass (one pass runs at a
 * time on an engine), so a pass allocates nothing from the heap once the arena is big enough.
 *
 * Allocation is a bump of a pointer, 64-byte aligned; scratch_release returns to a mark (last in, first out).
 * The arena is sized when the model opens for passes of its row capacity (model_scratch_bytes); a bigger pass
 * (a long prompt evaluated in one piece, a context longer than the attention scores were sized for) takes
 * what does not fit from the heap and, when it ends, the arena grows once to what that pass needed plus half,
 * so the next such pass fits. `grows` counts those heap allocations after scratch_init: tests assert it stays
 * 0 while decoding. Internal to src/model. */
#ifndef DF_SCRATCH_H
#define DF_SCRATCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct scratch {
    uint8_t *base;
    size_t cap, used;
    size_t need;               /* the most bytes in use at once since the last scratch_end_pass */
    void **spill;              /* blocks taken from the heap past cap, freed at scratch_end_pass */
    int n_spill, spill_cap;
    uint64_t grows;            /* heap allocations since scratch_init (spilled blocks and regrowths) */
} scratch;

void scratch_init(scratch *a, size_t cap);
void scratch_free(scratch *a);
/* n bytes, 64-byte aligned, uninitialised (scratch_zalloc: zeroed), valid until released past. */
void *scratch_alloc(scratch *a, size_t n);
void *scratch_zalloc(scratch *a, size_t n);
static inline size_t scratch_mark(const scratch *a) { return a->used; }
static inline void scratch_release(scratch *a, size_t mark) { a->used = mark; }
/* After a pass (everything released): frees spilled blocks and grows the arena if the pass needed more. */
void scratch_end_pass(scratch *a);

/* Bytes scratch_alloc takes for n elements of size sz: rounded up to 64, at least 64. */
static inline size_t scratch_size(size_t n, size_t sz) { return n * sz > 0 ? (n * sz + 63) / 64 * 64 : 64; }

/* Typed shorthands. */
#define SCRATCH_F32(a, n) ((float *)scratch_alloc((a), (size_t)(n) * sizeof(float)))
#define SCRATCH_NEW(a, type, n) ((type *)scratch_alloc((a), (size_t)(n) * sizeof(type)))

#endif
