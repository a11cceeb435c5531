/* gpu_internal.h — what the files of src/gpu share: the device context (gpu.c), device copies of the weights
 * looked up by their host views, the activation arena, kernel launches; the op table is gpu_ops.c. */
#ifndef DF_GPU_INTERNAL_H
#define DF_GPU_INTERNAL_H

#include <stdint.h>
#include "cuda_api.h"
#include "gpu.h"
#include "model/layer.h"

/* The kernels of kernels.cu, in the order of gpu_kernel_names (kernel_src.c). */
enum {
    K_MATMUL, K_ADD, K_SIGMOID, K_MUL_SIGMOID, K_GLU, K_COPY2D, K_EMBED, K_RMSNORM, K_GATED_NORM, K_KDA_CONV,
    K_KDA_CONV_HIST, K_KDA_GATE, K_L2NORM, K_KDA_RECUR, K_MLA_QLAT, K_MLA_ATTN, K_MLA_UV, K_ROUTE, K_MOE_GATE_UP,
    K_MOE_DOWN, K_MOE_SUM, K_ATTN_RES, K_READ, K_MLA_APPEND, K_MATMUL1, K_COUNT
};

/* A matrix in device memory, laid out as the kernels' struct wmat. */
typedef struct gpu_wmat {
    uint64_t data, scale;
    int64_t rows, cols, dt, vec;
} gpu_wmat;

/* A layer's routed experts (struct experts of kernels.cu). */
typedef struct gpu_experts {
    uint64_t base, stride, w1, w1s, w3, w3s, w2, w2s;
    int64_t inter, dim, dt, vec;
} gpu_experts;

typedef struct {
    const void *key;           /* the host view: a df_tensor, or a resident fp32 vector */
    gpu_wmat w;                /* a vector: data only */
} gpu_map_ent;

typedef struct gpu_ctx {
    cu_api a;
    CUdevice dev;
    CUcontext ctx;
    CUstream st;
    CUmodule mod;
    CUfunction fn[K_COUNT];
    int ordinal, arch, sms, smem_optin, compiled;
    double compile_s, upload_s;
    char name[128];
    size_t total_mem, free_mem;
    uint64_t budget, weight_bytes, work_bytes, state_bytes;
    uint64_t decode_bytes;     /* weight bytes one decode token reads: spine but the embedding, top-k experts */
    gpu_map_ent *map;
    size_t map_cap, map_n;
    CUdeviceptr *allocs;       /* the weights' allocations */
    int n_allocs, allocs_cap;
    gpu_experts *experts;      /* [n_layers]; base 0 for a layer without routed experts */
    /* the activation arena: a bump allocator over one allocation, spilling to more when a pass outgrows it */
    CUdeviceptr arena;
    size_t arena_cap, arena_used, arena_need;
    CUdeviceptr *spill;
    int n_spill, spill_cap;
    CUdeviceptr tok, hist_tmp, pos;   /* a pass's token ids and its segments' positions, on the device */
    int tok_cap, pos_cap;
    const df_state **pass_states;   /* the pass's sessions, in the order of g->pos */
    int n_pass_states, pass_states_cap;
    /* pinned host staging, so that a captured graph's copies read and write fixed addresses */
    int32_t *h_tok;
    int64_t *h_pos;
    float *h_logits;
    size_t h_logits_cap;       /* floats */
    int h_tok_cap, h_pos_cap;
    /* where a pass's logits go once the stream has drained: n floats from h_logits + off to dst */
    struct gpu_logits_out {
        float *dst;
        size_t off, n;
    } *outs;
    int n_outs, outs_cap;
    /* decode graphs (graph.c): a pass's kernels captured once per signature and replayed */
    int graphs_on;
    int mode;                  /* GPU_EAGER, GPU_CAPTURE, GPU_REPLAY for the pass in progress */
    uint64_t sig;              /* its signature */
    struct gpu_graph {
        uint64_t sig, used;
        CUgraphExec exec;      /* NULL: seen once, not captured yet */
    } graphs[16];
    uint64_t graph_clock, graph_replays, graph_captures;
    int capture_refused;       /* the driver's answer to the last refused cuStreamBeginCapture (0: none) */
    /* DELTAFIN_GPU_PROFILE=1: every launch timed alone (synchronously) per kernel, printed when the engine closes */
    int prof_on;
    CUevent prof_e0, prof_e1;
    double prof_ms[K_COUNT + 1];
    uint64_t prof_n[K_COUNT + 1];
    int err;                   /* the first failure since pass_begin (DF_OK: none) */
    char msg[512];
} gpu_ctx;

enum { GPU_EAGER = 0, GPU_CAPTURE = 1, GPU_REPLAY = 2 };

static inline gpu_ctx *gpu_of(const df_model *m) { return (gpu_ctx *)m->be; }
static inline CUdeviceptr dptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }
static inline float *fptr(CUdeviceptr p) { return (float *)(uintptr_t)p; }

/* Records a failed driver call (the first one wins); returns r != 0. */
int gpu_check(gpu_ctx *g, CUresult r, const char *what);
/* The device copy of a matrix / of a resident fp32 vector the model bound (aborts on one it never uploaded:
 * a programming error). */
const gpu_wmat *gpu_mat(gpu_ctx *g, const df_tensor *t);
CUdeviceptr gpu_vec(gpu_ctx *g, const float *v);
/* n bytes of the pass's activation memory (256-byte aligned); released by gpu_arena_release to a mark. */
CUdeviceptr gpu_arena(gpu_ctx *g, size_t n);
static inline float *gpu_f32(gpu_ctx *g, int64_t n) { return fptr(gpu_arena(g, (size_t)n * sizeof(float))); }
static inline size_t gpu_arena_mark(const gpu_ctx *g) { return g->arena_used; }
static inline void gpu_arena_release(gpu_ctx *g, size_t mark) { g->arena_used = mark; }
/* After a pass whose work has drained: spilled blocks freed, the arena grown to the pass's need. */
void gpu_arena_end_pass(gpu_ctx *g);
/* Launches kernel k on the context's stream. */
void gpu_launch(gpu_ctx *g, int k, unsigned gx, unsigned gy, unsigned gz, unsigned block, unsigned smem, void **args);

/* A stream copy of the pass (skipped while a graph is replayed: the graph holds it). */
void gpu_copy_async(gpu_ctx *g, CUdeviceptr dst, CUdeviceptr src, size_t bytes);
/* Pinned host memory (registered with the driver), NULL when it cannot be had; gpu_host_free releases it. */
void *gpu_host_alloc(gpu_ctx *g, size_t bytes);
void gpu_host_free(gpu_ctx *g, void *p);

/* Decode graphs (graph.c). At pass_begin: the pass's mode from its signature (the shape and every address its
 * kernels take); at pass_end: capture ended and instantiated, or the graph launched. */
void gpu_graph_begin(gpu_ctx *g, const df_model *m, const model_seg *seg, int n_seg, int T);
int gpu_graph_end(gpu_ctx *g, int rc);
void gpu_graph_free(gpu_ctx *g);

/* The op table (gpu_ops.c). */
const model_ops *gpu_ops(void);

#endif
