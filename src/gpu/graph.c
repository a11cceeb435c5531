/* graph.c — decode passes as CUDA graphs: a pass's kernels and copies are captured once and replayed, so that a
 * token costs one graph launch instead of a thousand kernel launches. A graph is valid for one signature: the
 * pass's shape (segments, rows, logits asked for) and every device address its kernels take (the sessions' state,
 * the arena, the staging buffers); what changes from token to token (token ids, positions) is read from device
 * memory the graph's first copies fill from pinned staging. A signature seen once runs eagerly (settling the arena
 * and the states' sizes), the second time it is captured, then replayed. Passes that would grow a state, take a
 * snapshot or run more than GRAPH_MAX_ROWS rows per session always run eagerly. */
#include <stdlib.h>
#include <string.h>
#include "gpu_internal.h"
#include "common/util.h"

#define GRAPH_MAX_ROWS 16
#define N_GRAPHS ((int)(sizeof ((gpu_ctx *)0)->graphs / sizeof ((gpu_ctx *)0)->graphs[0]))

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

/* The signature, or 0 when the pass must run eagerly. */
static uint64_t pass_signature(gpu_ctx *g, const df_model *m, const model_seg *seg, int n_seg, int T) {
    const df_config *c = &m->cfg;
    uint64_t h = mix(0x5eed, (uint64_t)T);
    h = mix(h, (uint64_t)n_seg);
    uint64_t fixed[] = {g->arena, g->arena_cap, g->tok, g->pos, (uint64_t)(uintptr_t)g->h_tok,
                        (uint64_t)(uintptr_t)g->h_pos, (uint64_t)(uintptr_t)g->h_logits, g->hist_tmp};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) h = mix(h, fixed[i]);
    for (int j = 0; j < n_seg; j++) {
        const df_state *s = seg[j].s;
        int rec = state_records(s, seg[j].T);
        if (seg[j].T > GRAPH_MAX_ROWS || seg[j].snap) return 0;
        h = mix(h, (uint64_t)(uintptr_t)s);
        h = mix(h, ((uint64_t)seg[j].T << 3) | ((uint64_t)(seg[j].logits != NULL) << 1) | (uint64_t)seg[j].all_rows |
                       ((uint64_t)rec << 2));
        for (int i = 0; i < s->n_layers; i++) {
            const df_layer_state *l = &s->layers[i];
            if (c->mixer[i] == MIXER_MLA && s->pos + seg[j].T > l->cap) return 0;    /* the cache grows */
            if (rec && c->mixer[i] == MIXER_KDA && kda_record_floats(c, seg[j].T) > l->rec_cap) return 0;
            h = mix(h, (uint64_t)(uintptr_t)l->S);
            h = mix(h, (uint64_t)(uintptr_t)l->conv);
            h = mix(h, (uint64_t)(uintptr_t)l->c);
            h = mix(h, (uint64_t)(uintptr_t)l->r);
            h = mix(h, (uint64_t)(uintptr_t)l->rec);
        }
    }
    return h ? h : 1;
}

void gpu_graph_begin(gpu_ctx *g, const df_model *m, const model_seg *seg, int n_seg, int T) {
    g->mode = GPU_EAGER;
    g->sig = g->graphs_on && !g->prof_on ? pass_signature(g, m, seg, n_seg, T) : 0;
    if (!g->sig) return;
    g->graph_clock++;
    int lru = 0;
    for (int i = 0; i < N_GRAPHS; i++) {
        struct gpu_graph *x = &g->graphs[i];
        if (x->sig == g->sig) {
            x->used = g->graph_clock;
            if (x->exec) {
                g->mode = GPU_REPLAY;
            } else {
                CUresult r = g->a.cuStreamBeginCapture(g->st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
                if (!r) g->mode = GPU_CAPTURE;
                else g->capture_refused = r;
            }
            return;
        }
        if (x->used < g->graphs[lru].used) lru = i;
    }
    struct gpu_graph *x = &g->graphs[lru];     /* first sighting: remembered, run eagerly */
    if (x->exec) g->a.cuGraphExecDestroy(x->exec);
    x->exec = NULL;
    x->sig = g->sig;
    x->used = g->graph_clock;
}

static struct gpu_graph *slot_of(gpu_ctx *g) {
    for (int i = 0; i < N_GRAPHS; i++)
        if (g->graphs[i].sig == g->sig) return &g->graphs[i];
    return NULL;
}

int gpu_graph_end(gpu_ctx *g, int rc) {
    struct gpu_graph *x = slot_of(g);
    int mode = g->mode;
    g->mode = GPU_EAGER;
    if (mode == GPU_CAPTURE) {
        CUgraph graph = NULL;
        CUresult r = g->a.cuStreamEndCapture(g->st, &graph);
        if (rc) {              /* a pass cut short (cancelled) is neither kept nor run */
            if (graph) g->a.cuGraphDestroy(graph);
            if (x) x->sig = 0;
            return g->err;
        }
        if (!r && !g->err && g->n_spill == 0 && x) r = g->a.cuGraphInstantiate(&x->exec, graph, 0);
        else if (!r) r = g->err ? 0 : 1;
        if (graph) g->a.cuGraphDestroy(graph);
        if (r || g->err || !x || !x->exec) {
            if (x) x->sig = 0, x->exec = NULL;
            if (!g->err) gpu_check(g, r ? r : 1, "capturing a decode graph");
            return g->err;
        }
        g->graph_captures++;
        mode = GPU_REPLAY;
    }
    if (mode == GPU_REPLAY && x && x->exec && !rc) {
        g->graph_replays++;
        gpu_check(g, g->a.cuGraphLaunch(x->exec, g->st), "launching a decode graph");
    }
    return g->err;
}

void gpu_graph_free(gpu_ctx *g) {
    for (int i = 0; i < N_GRAPHS; i++)
        if (g->graphs[i].exec) g->a.cuGraphExecDestroy(g->graphs[i].exec);
    memset(g->graphs, 0, sizeof g->graphs);
}
