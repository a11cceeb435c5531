/* policy.c — expert-cache replacement policies (see policy.h) and their offline simulation.
 *
 * LFU here is frequency with exponential decay: a key's weight is the sum of 2^(-age/half-life) over its past
 * requests, kept for keys not in the cache too, so an expert that is used steadily outranks one that was used
 * in a burst long ago, and a freshly loaded expert does not push out a popular one. The weight is stored as its
 * base-2 logarithm plus now/half-life, which orders keys the same way at any later time without ever sweeping
 * the table. REUSE ranks by the expected wait until the next use instead: layers are visited in order, so an
 * expert of the layer about to run is needed sooner than an equally popular one of the layer just done. ARC
 * follows Megiddo and Modha, with ghost lists over keys; victims skip slots the caller forbids (pinned, in
 * flight), walking each list from its least recent end. The simulator replays a trace through these and
 * through Belady's optimum, an oracle LFU that knows every count in advance and an LFU told the next token. */
#include "policy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* Half-life of an LFU request, in requests per key of the bank: long enough to learn popularity, short
 * enough to follow a conversation that moves on. Chosen on the traces of docs/PERFORMANCE.md. */
#define POLICY_LFU_HALF_LIFE_PER_KEY 2.0

enum { ARC_NONE, ARC_T1, ARC_T2, ARC_B1, ARC_B2, ARC_PENDING_T2, ARC_LISTS = 5 };

struct policy {
    int kind, n_slots, n_groups;
    int64_t n_keys;
    int *key_group;        /* key -> layer */
    int64_t *slot_key;     /* slot -> key or -1 */
    uint64_t *slot_stamp;  /* slot -> last use */
    uint64_t clock;
    /* LFU */
    double *score;         /* key -> log2(decayed count) + time/half_life; -inf if never requested */
    double half_life, now;
    /* REUSE: passes over each layer, decayed like the keys' counts, and the layer being computed */
    double *pass_score;
    int cur_group;
    /* ARC */
    int *key_slot;         /* key -> slot or -1 */
    uint8_t *list;         /* key -> ARC_* */
    int64_t *prev, *next;  /* key -> neighbours in its list (toward LRU / toward MRU), -1 at the ends */
    int64_t head[ARC_LISTS], tail[ARC_LISTS];   /* head = least recent */
    int64_t size[ARC_LISTS];
    double target;         /* ARC's p: the share of the bank aimed at T1 */
    int from_b2;           /* the last miss was a B2 ghost */
};

static const char *const policy_names[POLICY_COUNT] = {"lru", "lfu", "arc", "reuse"};

const char *policy_name(int kind) {
    if (kind >= 0 && kind < POLICY_COUNT) return policy_names[kind];
    return kind == POLICY_BELADY ? "belady" : kind == POLICY_ORACLE_FREQ ? "oracle-lfu" : "lfu+next";
}

int policy_parse(const char *name) {
    for (int k = 0; k < POLICY_COUNT; k++)
        if (!strcmp(name, policy_names[k])) return k;
    return -1;
}

policy *policy_new(int kind, int n_slots, int n_groups, const int64_t *base) {
    int64_t n_keys = base[n_groups];
    DF_ASSERT(kind >= 0 && kind < POLICY_COUNT && n_slots > 0 && n_keys > 0 && n_groups > 0);
    policy *p = xcalloc(1, sizeof *p);
    p->kind = kind;
    p->n_slots = n_slots;
    p->n_keys = n_keys;
    p->n_groups = n_groups;
    p->key_group = xmalloc(sizeof *p->key_group * (size_t)n_keys);
    for (int g = 0; g < n_groups; g++)
        for (int64_t k = base[g]; k < base[g + 1]; k++) p->key_group[k] = g;
    p->slot_key = xmalloc(sizeof *p->slot_key * (size_t)n_slots);
    p->slot_stamp = xcalloc((size_t)n_slots, sizeof *p->slot_stamp);
    for (int i = 0; i < n_slots; i++) p->slot_key[i] = -1;
    if (kind == POLICY_LFU || kind == POLICY_REUSE) {
        p->score = xmalloc(sizeof *p->score * (size_t)n_keys);
        for (int64_t k = 0; k < n_keys; k++) p->score[k] = -INFINITY;
        p->pass_score = xmalloc(sizeof *p->pass_score * (size_t)n_groups);
        for (int g = 0; g < n_groups; g++) p->pass_score[g] = -INFINITY;
        p->cur_group = -1;
        p->half_life = POLICY_LFU_HALF_LIFE_PER_KEY * (double)n_keys;
    }
    if (kind == POLICY_ARC) {
        p->key_slot = xmalloc(sizeof *p->key_slot * (size_t)n_keys);
        p->list = xcalloc((size_t)n_keys, 1);
        p->prev = xmalloc(sizeof *p->prev * (size_t)n_keys);
        p->next = xmalloc(sizeof *p->next * (size_t)n_keys);
        for (int64_t k = 0; k < n_keys; k++) p->key_slot[k] = -1;
        for (int l = 0; l < ARC_LISTS; l++) p->head[l] = p->tail[l] = -1;
    }
    return p;
}

void policy_free(policy *p) {
    if (!p) return;
    free(p->slot_key);
    free(p->slot_stamp);
    free(p->score);
    free(p->pass_score);
    free(p->key_group);
    free(p->key_slot);
    free(p->list);
    free(p->prev);
    free(p->next);
    free(p);
}

/* ---- ARC lists ---------------------------------------------------------------------------------------- */

static void arc_unlink(policy *p, int64_t k) {
    int l = p->list[k];
    if (l == ARC_NONE || l == ARC_PENDING_T2) {
        p->list[k] = ARC_NONE;
        return;
    }
    if (p->prev[k] >= 0) p->next[p->prev[k]] = p->next[k];
    else p->head[l] = p->next[k];
    if (p->next[k] >= 0) p->prev[p->next[k]] = p->prev[k];
    else p->tail[l] = p->prev[k];
    p->size[l]--;
    p->list[k] = ARC_NONE;
}

static void arc_push_mru(policy *p, int64_t k, int l) {
    arc_unlink(p, k);
    p->list[k] = (uint8_t)l;
    p->prev[k] = p->tail[l];
    p->next[k] = -1;
    if (p->tail[l] >= 0) p->next[p->tail[l]] = k;
    else p->head[l] = k;
    p->tail[l] = k;
    p->size[l]++;
}

/* Keeps the ghost lists within ARC's bounds: |T1|+|B1| <= c and the whole directory <= 2c. */
static void arc_trim(policy *p) {
    int64_t c = p->n_slots;
    while (p->size[ARC_B1] && p->size[ARC_T1] + p->size[ARC_B1] > c) arc_unlink(p, p->head[ARC_B1]);
    while (p->size[ARC_T1] + p->size[ARC_T2] + p->size[ARC_B1] + p->size[ARC_B2] > 2 * c) {
        int l = p->size[ARC_B2] ? ARC_B2 : ARC_B1;
        if (!p->size[l]) break;
        arc_unlink(p, p->head[l]);
    }
}

static void arc_request(policy *p, int64_t k) {
    int l = p->list[k];
    double b1 = (double)p->size[ARC_B1], b2 = (double)p->size[ARC_B2];
    if (l == ARC_T1 || l == ARC_T2) {
        arc_push_mru(p, k, ARC_T2);
        return;
    }
    p->from_b2 = l == ARC_B2;
    if (l == ARC_B1) p->target = DF_MIN((double)p->n_slots, p->target + DF_MAX(b2 / b1, 1.0));
    if (l == ARC_B2) p->target = DF_MAX(0.0, p->target - DF_MAX(b1 / DF_MAX(b2, 1.0), 1.0));
    if (l == ARC_B1 || l == ARC_B2) {
        arc_unlink(p, k);
        p->list[k] = ARC_PENDING_T2;
    }
}

/* First slot from the least recent end of list l that the caller allows. */
static int arc_walk(const policy *p, int l, int (*ok)(const void *, int), const void *ctx) {
    for (int64_t k = p->head[l]; k >= 0; k = p->next[k])
        if (p->key_slot[k] >= 0 && ok(ctx, p->key_slot[k])) return p->key_slot[k];
    return -1;
}

/* ---- the interface ------------------------------------------------------------------------------------- */

/* Adds one event at time t to a decayed count kept as log2(count) + t/half_life. */
static double decay_add(double s, double t) {
    return s == -INFINITY ? t : s - t > 40 ? s : t + log2(exp2(s - t) + 1.0);
}

void policy_request(policy *p, int64_t key) {
    DF_ASSERT(key >= 0 && key < p->n_keys);
    if (p->kind == POLICY_ORACLE_FREQ) return;
    if (p->kind == POLICY_LFU || p->kind == POLICY_REUSE) {
        double t = (p->now += 1.0) / p->half_life;
        int g = p->key_group[key];
        if (g != p->cur_group) p->pass_score[g] = decay_add(p->pass_score[g], t);   /* a new pass over layer g */
        p->cur_group = g;
        p->score[key] = decay_add(p->score[key], t);
    } else if (p->kind == POLICY_ARC) {
        arc_request(p, key);
    }
}

void policy_seed(policy *p, int64_t key, double weight) {
    if (!p->score || !(weight > 0)) return;
    double t = p->now / p->half_life, s = p->score[key];
    p->score[key] = s == -INFINITY ? t + log2(weight) : t + log2(exp2(s - t) + weight);
    int g = p->key_group[key];   /* its hottest expert is taken to be used on nearly every pass */
    p->pass_score[g] = DF_MAX(p->pass_score[g], p->score[key]);
}

void policy_touch(policy *p, int slot) { p->slot_stamp[slot] = ++p->clock; }

void policy_fill(policy *p, int slot, int64_t key) {
    DF_ASSERT(p->slot_key[slot] < 0 && key >= 0 && key < p->n_keys);
    p->slot_key[slot] = key;
    p->slot_stamp[slot] = ++p->clock;
    if (p->kind == POLICY_ARC) {
        p->key_slot[key] = slot;
        arc_push_mru(p, key, p->list[key] == ARC_PENDING_T2 ? ARC_T2 : ARC_T1);
        arc_trim(p);
    }
}

void policy_clear(policy *p, int slot) {
    int64_t k = p->slot_key[slot];
    if (k < 0) return;
    p->slot_key[slot] = -1;
    if (p->kind == POLICY_ARC) {
        p->key_slot[k] = -1;
        arc_push_mru(p, k, p->list[k] == ARC_T2 ? ARC_B2 : ARC_B1);
        arc_trim(p);
    }
}

/* Expected requests-to-wait, in layer steps, until key is asked for again: the steps until its layer comes
 * round, plus a whole pass over the layers for each pass its layer makes without it (geometric, with the
 * probability of use per pass estimated by decayed counts). */
static double reuse_wait(const policy *p, int64_t key) {
    int g = p->key_group[key], G = p->n_groups;
    double use = p->score[key] == -INFINITY ? 0.0 : exp2(p->score[key] - p->pass_score[g]);
    if (use <= 0) return INFINITY;
    use = DF_MIN(use, 1.0);
    int steps = p->cur_group < 0 ? G : (g - p->cur_group - 1 + 2 * G) % G + 1;
    return steps + G * (1.0 - use) / use;
}

int policy_victim(policy *p, int (*ok)(const void *ctx, int slot), const void *ctx) {
    if (p->kind == POLICY_ARC) {
        double t1 = (double)p->size[ARC_T1];
        int first = t1 > 0 && (t1 > p->target || (p->from_b2 && t1 == floor(p->target))) ? ARC_T1 : ARC_T2;
        int v = arc_walk(p, first, ok, ctx);
        return v >= 0 ? v : arc_walk(p, first == ARC_T1 ? ARC_T2 : ARC_T1, ok, ctx);
    }
    int best = -1;
    double best_wait = 0;
    for (int i = 0; i < p->n_slots; i++) {
        if (p->slot_key[i] < 0 || !ok(ctx, i)) continue;
        if (p->kind == POLICY_REUSE) {
            double w = reuse_wait(p, p->slot_key[i]);
            if (best < 0 || w > best_wait || (w == best_wait && p->slot_stamp[i] < p->slot_stamp[best]))
                best = i, best_wait = w;
            continue;
        }
        if (best < 0) {
            best = i;
            continue;
        }
        if (p->kind == POLICY_LFU || p->kind == POLICY_ORACLE_FREQ) {
            double a = p->score[p->slot_key[i]], b = p->score[p->slot_key[best]];
            if (a < b || (a == b && p->slot_stamp[i] < p->slot_stamp[best])) best = i;
        } else if (p->slot_stamp[i] < p->slot_stamp[best]) {
            best = i;
        }
    }
    return best;
}

/* ---- simulation ---------------------------------------------------------------------------------------- */

typedef struct sim_ctx {
    const int64_t *slot_key;
    const int64_t *held;   /* key -> last record that asked for it */
    const int64_t *soon;   /* lfu+next: key -> the last record whose next token asks for it */
    int64_t rec;
    int strict;            /* 0: anything may go; 1: not the record's keys; 2: nor the next token's */
} sim_ctx;

static int sim_may_go(const void *ctx, int slot) {
    const sim_ctx *c = ctx;
    int64_t k = c->slot_key[slot];
    return !c->strict || (c->held[k] != c->rec && (c->strict < 2 || c->soon[k] != c->rec));
}

/* lfu+next: marks the keys of the records after r, a pass over the layers' worth, as wanted soon. */
static void sim_mark_next(const policy_trace *t, int64_t r, int layers, int64_t *soon) {
    for (int64_t q = r + 1; q <= r + layers && q < t->n_rec; q++)
        for (int64_t i = t->rec[q]; i < t->rec[q + 1]; i++) soon[t->keys[i]] = r;
}

/* Belady: on a miss with a full bank, evict the key whose next use lies farthest ahead (or never comes). A
 * key of the current record is always used sooner than any other, so it never goes while another may. */
static uint64_t sim_belady(const policy_trace *t, int n_slots) {
    int64_t n = t->n, n_keys = t->base[t->n_groups];
    const int64_t *keys = t->keys;
    int64_t *next = xmalloc(sizeof *next * (size_t)(n + 1)), *last = xmalloc(sizeof *last * (size_t)n_keys);
    for (int64_t k = 0; k < n_keys; k++) last[k] = INT64_MAX;
    for (int64_t i = n - 1; i >= 0; i--) {
        next[i] = last[keys[i]];
        last[keys[i]] = i;
    }
    int *where = xmalloc(sizeof *where * (size_t)n_keys);
    for (int64_t k = 0; k < n_keys; k++) where[k] = -1;
    int64_t *slot_key = xmalloc(sizeof *slot_key * (size_t)n_slots);
    int64_t *slot_next = xmalloc(sizeof *slot_next * (size_t)n_slots);
    int used = 0;
    uint64_t hits = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = keys[i];
        int s = where[k];
        if (s >= 0) {
            hits += i >= t->count_from;
        } else if (used < n_slots) {
            s = used++;
        } else {
            s = 0;
            for (int j = 1; j < n_slots; j++)
                if (slot_next[j] > slot_next[s]) s = j;
            where[slot_key[s]] = -1;
        }
        slot_key[s] = k;
        slot_next[s] = next[i];
        where[k] = s;
    }
    free(next);
    free(last);
    free(where);
    free(slot_key);
    free(slot_next);
    return hits;
}

uint64_t policy_simulate(int kind, const policy_trace *t, int n_slots) {
    if (kind == POLICY_COUNT) return sim_belady(t, n_slots);
    int64_t n_keys = t->base[t->n_groups];
    int oracle = kind == POLICY_ORACLE_FREQ, next = kind == POLICY_ORACLE_NEXT;
    policy *p = policy_new(oracle || next ? POLICY_LFU : kind, n_slots, t->n_groups, t->base);
    if (oracle) {   /* the whole trace's counts, known in advance and never updated */
        for (int64_t k = 0; k < n_keys; k++) p->score[k] = -INFINITY;
        for (int64_t i = 0; i < t->n; i++)
            p->score[t->keys[i]] = p->score[t->keys[i]] == -INFINITY ? 1 : p->score[t->keys[i]] + 1;
        p->kind = POLICY_ORACLE_FREQ;
    }
    int *where = xmalloc(sizeof *where * (size_t)n_keys);
    int64_t *held = xmalloc(sizeof *held * (size_t)n_keys), *soon = xmalloc(sizeof *soon * (size_t)n_keys);
    for (int64_t k = 0; k < n_keys; k++) where[k] = -1, held[k] = soon[k] = -1;
    int used = 0;
    uint64_t hits = 0;
    sim_ctx ctx = {p->slot_key, held, soon, 0, 1};
    int layers = 0;   /* with routed experts: the records of one token */
    for (int g = 0; g < t->n_groups; g++) layers += t->base[g + 1] > t->base[g];
    for (int64_t r = 0; r < t->n_rec; r++) {
        ctx.rec = r;
        if (next) sim_mark_next(t, r, layers, soon);
        for (int64_t i = t->rec[r]; i < t->rec[r + 1]; i++) held[t->keys[i]] = r;
        for (int64_t i = t->rec[r]; i < t->rec[r + 1]; i++) {
            int64_t k = t->keys[i];
            policy_request(p, k);
            int s = where[k];
            if (s >= 0) {
                hits += i >= t->count_from;
                policy_touch(p, s);
                continue;
            }
            if (used < n_slots) {
                s = used++;
            } else {
                s = -1;
                for (ctx.strict = next ? 2 : 1; s < 0 && ctx.strict >= 0; ctx.strict--)   /* at 0: a record */
                    s = policy_victim(p, sim_may_go, &ctx);   /* larger than the bank makes room itself */
                where[p->slot_key[s]] = -1;
                policy_clear(p, s);
            }
            policy_fill(p, s, k);
            where[k] = s;
        }
    }
    policy_free(p);
    free(where);
    free(held);
    free(soon);
    return hits;
}
