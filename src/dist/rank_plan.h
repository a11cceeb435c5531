/* rank_plan.h — which ranks hold each routed expert when several processes (one per machine) share a model
 * (expert parallelism). `deltafin place --ranks N` writes it to DIR/.deltafin/ranks beside copying each rank's
 * experts into that rank's folder (FOLDER/deltafin-experts.bin with its own FOLDER/.deltafin/placement):
 *
 *     deltafin-ranks 1
 *     ranks N
 *     folder R PATH           once per rank: where rank R reads its experts
 *     layer L H0 H1 ...       once per layer: per expert, the ranks holding it as a hexadecimal bit mask
 *     end
 *
 * Without a plan, rank e mod N holds expert e and reads it from the model folder's own shards. An expert held by
 * several ranks (the hottest, replicated so that no rank reads much more than the others) is computed, pass by
 * pass, by one of its holders chosen deterministically from the routing (rank_plan_assign). */
#ifndef DF_DIST_RANK_PLAN_H
#define DF_DIST_RANK_PLAN_H

#include <stdint.h>
#include "deltafin.h"

#define RANK_PLAN_FILE ".deltafin/ranks"
#define RANK_PLAN_MAX 64

typedef struct rank_plan {
    int n_ranks, n_layers;
    int64_t *base;          /* per layer: its first expert in layer-major order; base[n_layers] = all */
    uint64_t *holders;      /* per expert: bit r set = rank r holds it */
    char **folders;         /* per rank: its expert folder; NULL = the model folder's shards (no plan file) */
    int16_t *spine_rank;    /* per layer: the rank holding its spine matrices (rank_plan_split_spine); NULL = every
                               rank has the whole spine it uses (rank 0 all of it) */
    uint64_t checksum;      /* of the plan's content: every rank must have the same */
    int from_file;
} rank_plan;

/* Reads DIR/.deltafin/ranks for a model of these layers and experts run on n_ranks ranks; without the file, the
 * e mod n_ranks plan. A plan for another rank count or model shape is an error saying so. */
int rank_plan_load(rank_plan *p, const char *dir, int n_layers, const int *n_experts, int n_ranks, df_error *err);
/* A plan by heat (per expert, layer-major; NULL = uniform): per layer, experts dealt hottest first to the rank
 * with the least expected load relative to its weight; an expert hotter than a rank's fair share of its layer is
 * replicated on as many ranks as it takes to bring it under that share. */
void rank_plan_build(rank_plan *p, int n_ranks, const double *weights, int n_layers, const int *n_experts,
                     const float *heat);
/* Splits the spine over the ranks by layers: each rank gets a contiguous run of layers holding about 1/N of the
 * spine's bytes, rank 0's share counting the top-level tensors (embedding, lm_head), which stay with it. */
void rank_plan_split_spine(rank_plan *p, const int64_t *layer_bytes, int64_t top_bytes);
/* The run of layers whose spine rank r holds: its first layer and how many (0, 0 without a split or a run). */
void rank_plan_spine_layers(const rank_plan *p, int r, int *first, int *count);
int rank_plan_write(const rank_plan *p, const char *dir, const char *const *folders, df_error *err);
void rank_plan_free(rank_plan *p);
/* Whether rank r holds expert (layer, e). */
static inline int rank_plan_holds(const rank_plan *p, int r, int layer, int e) {
    return (int)((p->holders[p->base[layer] + e] >> r) & 1);
}
/* The rank computing each of a layer's selected experts uniq[0..n) (rows[u] rows routed to each): the holder,
 * or of several holders the one with the fewest rows assigned so far in this selection, ties going to the
 * (turn mod ties)-th of the tied holders (the caller advances turn pass by pass, so a replicated expert's passes
 * are dealt over its holders in turn). Which rank computes an expert never changes the result, only who reads it. */
void rank_plan_assign(const rank_plan *p, int layer, const int *uniq, const int *rows, int n, unsigned turn,
                      int *rank);

#endif
