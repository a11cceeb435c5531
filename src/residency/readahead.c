/* readahead.c — the look-ahead cost model (see readahead.h). Measurements are windows of the cache's and the
 * I/O pool's running counters, smoothed exponentially, so the decision follows a conversation whose routing
 * or disk load changes. Besides the rule, each layer compares what it actually waited for its experts with
 * its guesses read and without (one pass in RA_SAMPLE_OFF goes without while reading): guesses that do not cut
 * the wait are not read, whatever the rule says. */
#include "readahead.h"

#include <pthread.h>
#include <stdlib.h>

#include "common/util.h"

#define RA_WINDOW_REQUESTS 16   /* a layer's precisions are updated after this many scored requests */
#define RA_RANKS DF_LOOKAHEAD_RANKS
#define RA_WINDOW_S 0.05        /* utilisation and hit rate are updated after this much wall time */
#define RA_SAMPLE 4             /* while not reading, score one guess in this many */
#define RA_SMOOTH 0.3           /* weight of the newest window */
#define RA_HYSTERESIS 1.25      /* start reading only when the gain beats the cost by this factor */
#define RA_SAMPLE_OFF 8         /* while reading, one pass in this many goes without, to measure the difference */
#define RA_RETRY 32             /* while reading is measured not to pay, try it again once in this many passes */
#define RA_MIN_GAIN 0.95        /* reading must cut the layer's wait to this fraction of the wait without */

typedef struct ra_layer {
    ecache_hint_stats at;       /* counters at the start of the current window */
    double precision[RA_RANKS], size[RA_RANKS];   /* per rank (ra_inputs); < 0: not measured yet */
    double per_pass;            /* < 0: not measured yet */
    double wait_on, wait_off;   /* seconds a pass waited with guesses read / without; < 0: not measured yet */
    ecache_hint_stats seen;     /* counters at the last plan */
    int reading;                /* ranks read now */
    unsigned calls;
} ra_layer;

struct readahead {
    pthread_mutex_t mu;
    int mode, n_layers;
    ecache *cache;
    io_pool *pool;
    ra_layer *l;
    double t0, busy0, util;     /* util < 0: not measured yet */
    uint64_t hits0, guess_hits0, misses0;
    double hit_rate;            /* the cache's own: hits look-ahead brought in count as misses */
};

static double ra_mix(double old, double now) { return old < 0 ? now : (1 - RA_SMOOTH) * old + RA_SMOOTH * now; }

int ra_read_ranks(const ra_inputs *in, int reading) {
    double u = in->util, h = in->hit_rate, named = 0, right = 0, wrong = 0, best_net = 0;
    int best = 0;
    for (int w = 1; w <= in->n_ranks && in->precision[w - 1] >= 0; w++) {
        double n = in->size[w - 1], p = in->precision[w - 1];
        named += n, right += n * p, wrong += n * (1 - p);
        if (named <= 0) continue;
        double fit = u <= 0 ? 1.0 : DF_MIN(1.0, (1 - u) / u * in->per_pass / named);
        double gain = right * fit * (1 - h), cost = wrong * ((1 - fit) + h);
        int pays = reading ? gain >= cost : gain > RA_HYSTERESIS * cost && gain > 0.05 * named;
        if (pays && gain - cost > best_net) best = w, best_net = gain - cost;
    }
    return best;
}

readahead *readahead_new(int n_layers, int mode, ecache *cache, io_pool *pool) {
    readahead *ra = xcalloc(1, sizeof *ra);
    pthread_mutex_init(&ra->mu, NULL);
    ra->mode = mode;
    ra->n_layers = n_layers;
    ra->cache = cache;
    ra->pool = pool;
    ra->l = xcalloc((size_t)n_layers + 1, sizeof *ra->l);
    for (int i = 0; i < n_layers; i++) {
        ra_layer *L = &ra->l[i];
        L->per_pass = L->wait_on = L->wait_off = -1;
        for (int r = 0; r < RA_RANKS; r++) L->precision[r] = L->size[r] = -1;
    }
    ra->util = ra->hit_rate = -1;
    ra->t0 = df_now();
    ra->busy0 = pool ? io_pool_busy_seconds(pool, 1) : 0;
    return ra;
}

void readahead_free(readahead *ra) {
    if (!ra) return;
    pthread_mutex_destroy(&ra->mu);
    free(ra->l);
    free(ra);
}

/* Lock held. Closes the global window when it is long enough. */
static void ra_global(readahead *ra) {
    double t = df_now();
    if (t - ra->t0 < RA_WINDOW_S) return;
    double busy = io_pool_busy_seconds(ra->pool, 1);
    ecache_stats cs;
    ecache_get_stats(ra->cache, &cs);
    ra->util = ra_mix(ra->util, DF_MIN(1.0, (busy - ra->busy0) / (t - ra->t0)));
    uint64_t all = cs.hits - ra->hits0, own = all - (cs.lookahead_hits - ra->guess_hits0), m = cs.misses - ra->misses0;
    if (all + m) ra->hit_rate = ra_mix(ra->hit_rate, (double)own / (double)(all + m));
    ra->t0 = t, ra->busy0 = busy, ra->hits0 = cs.hits, ra->guess_hits0 = cs.lookahead_hits, ra->misses0 = cs.misses;
}

/* Lock held. Attributes the layer's waits since the last plan to reading or not, and closes its precision
 * window when it has enough scored requests. A rank's precision is measured once its guesses named an expert. */
static void ra_layer_update(readahead *ra, int layer) {
    ra_layer *L = &ra->l[layer];
    ecache_hint_stats now;
    ecache_hint_layer(ra->cache, layer, &now);
    uint64_t passes = now.passes - L->seen.passes;
    if (passes) {
        double w = (now.wait_s - L->seen.wait_s) / (double)passes;
        if (now.read_hints > L->seen.read_hints) L->wait_on = ra_mix(L->wait_on, w);
        else L->wait_off = ra_mix(L->wait_off, w);
        L->seen = now;
    }
    uint64_t req = now.requests - L->at.requests, scored = now.scored - L->at.scored;
    if (req < RA_WINDOW_REQUESTS || !scored) return;
    L->per_pass = ra_mix(L->per_pass, (double)req / (double)scored);
    for (int r = 0; r < RA_RANKS; r++) {
        uint64_t g = now.guessed_rank[r] - L->at.guessed_rank[r], rec = now.recalled_rank[r] - L->at.recalled_rank[r];
        L->size[r] = ra_mix(L->size[r], (double)g / (double)scored);
        if (g) L->precision[r] = ra_mix(L->precision[r], (double)rec / (double)g);
    }
    L->at = now;
}

int readahead_plan(readahead *ra, int layer, int *read_ranks) {
    *read_ranks = 0;
    if (!ra->cache || layer < 0 || layer >= ra->n_layers) return STORE_LOOKAHEAD_SKIP;
    if (ra->mode == DF_LOOKAHEAD_OFF) return STORE_LOOKAHEAD_SKIP;
    if (ra->mode == DF_LOOKAHEAD_ON) return *read_ranks = RA_RANKS, STORE_LOOKAHEAD_READ;
    pthread_mutex_lock(&ra->mu);
    ra_global(ra);
    ra_layer_update(ra, layer);
    ra_layer *L = &ra->l[layer];
    int rule = 0;
    if (L->per_pass >= 0 && ra->util >= 0) {
        ra_inputs in = {L->precision, L->size, RA_RANKS, L->per_pass, ra->util, ra->hit_rate < 0 ? 0 : ra->hit_rate};
        rule = ra_read_ranks(&in, L->reading);
    }
    int worse = L->wait_on >= 0 && L->wait_off >= 0 && L->wait_on > RA_MIN_GAIN * L->wait_off;
    L->reading = worse ? 0 : rule;
    int plan = STORE_LOOKAHEAD_SKIP;
    if (L->reading) plan = L->calls % RA_SAMPLE_OFF == RA_SAMPLE_OFF - 1 ? STORE_LOOKAHEAD_SCORE : STORE_LOOKAHEAD_READ;
    else if (rule && L->calls % RA_RETRY == 0) plan = STORE_LOOKAHEAD_READ;
    else if (L->calls % RA_SAMPLE == 0) plan = STORE_LOOKAHEAD_SCORE;
    if (plan == STORE_LOOKAHEAD_READ) *read_ranks = rule;
    L->calls++;
    pthread_mutex_unlock(&ra->mu);
    return plan;
}

int readahead_reading(readahead *ra, int layer) {
    if (!ra->cache || layer < 0 || layer >= ra->n_layers || ra->mode == DF_LOOKAHEAD_OFF) return 0;
    if (ra->mode == DF_LOOKAHEAD_ON) return RA_RANKS;
    pthread_mutex_lock(&ra->mu);
    int r = ra->l[layer].reading;
    pthread_mutex_unlock(&ra->mu);
    return r;
}
