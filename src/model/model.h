/* model.h — the forward pass of Kimi-Linear and Kimi K3 over the storage seam, and its per-conversation
 * state. The engine (src/engine) owns a df_model and one df_state per session. */
#ifndef DF_MODEL_H
#define DF_MODEL_H

#include <stdint.h>
#include "deltafin.h"
#include "config.h"
#include "kernels/kernels.h"
#include "storage/store.h"

typedef struct df_model {
    df_config cfg;
    df_store *store;           /* borrowed */
    df_kern *kern;             /* borrowed */
    int alog_per_channel;      /* SPEC §8.1 alternative reading of K3's A_log; off by default */
    const char *dir;           /* for messages */
    df_profile prof;           /* accumulated phase times; spine_compute is derived at read time */
} df_model;

/* Adds the seconds since *t0 to a phase and restarts the clock. */
double model_clock(double *phase, double t0);

/* KDA layer: recurrent state S[h][j][v] (key channel j, value channel v) and the last W-1 pre-conv
 * inputs per channel of [q|k|v], oldest first. MLA layer: the post-norm latent c and raw rope key r of
 * every position so far. */
typedef struct df_layer_state {
    float *S;                  /* [Hk, Dk, Dk] */
    float *conv;               /* [W-1, 3Pk] */
    float *c, *r;              /* [cap, Lc], [cap, Nr] */
    int64_t cap;
} df_layer_state;

typedef struct df_state {
    int64_t pos;               /* tokens consumed */
    df_step_fn step;           /* optional per-layer callback; non-zero aborts */
    void *step_ctx;
    int n_layers;
    df_layer_state *layers;
} df_state;

df_state *state_new(const df_model *m);
void state_free(df_state *s);
void state_reset(const df_model *m, df_state *s);
void state_copy(const df_model *m, df_state *dst, const df_state *src);

/* Consumes T tokens as one batch, appending to the state. logits: [T, vocab] if all_rows, else the last
 * row only; NULL skips the head. */
int model_forward(df_model *m, df_state *s, const int32_t *tokens, int T, float *logits, int all_rows,
                  df_error *err);
/* Checks every layer's tensors against the config (names, shapes, dtypes). */
int model_check(df_model *m, df_error *err);

#endif
