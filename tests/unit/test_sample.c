/* test_sample.c — the sampler (greedy, temperature, top-k/top-p/min-p, penalties, seeds, logprobs), the
 * stop-string matcher, and the shared decode loop on a fixture model. */
#include <math.h>
#include <string.h>
#include "test.h"
#include "engine_fixture.h"
#include "sample/generate.h"
#include "sample/sample.h"
#include "sample/stop.h"

static void fill(float *l, const float *v, int n) { memcpy(l, v, (size_t)n * sizeof *l); }

/* Draws n tokens from logits v with params p; counts[] gets the histogram. */
static void draw_many(const sample_params *p, const float *v, int nv, int n, int *counts) {
    sampler s;
    sampler_init(&s, p, nv);
    float l[8];
    memset(counts, 0, (size_t)nv * sizeof *counts);
    for (int i = 0; i < n; i++) {
        fill(l, v, nv);
        counts[sampler_sample(&s, l, NULL)]++;
    }
    sampler_free(&s);
}

static void test_rng(void) {
    sample_rng a, b, c;
    sample_rng_seed(&a, 42);
    sample_rng_seed(&b, 42);
    sample_rng_seed(&c, 43);
    int same = 1, differ = 0, in_range = 1;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = sample_rng_next(&a), y = sample_rng_next(&b), z = sample_rng_next(&c);
        same &= x == y;
        differ |= x != z;
        double u = sample_rng_uniform(&a);
        sample_rng_uniform(&b);
        in_range &= u >= 0 && u < 1;
    }
    CHECK(same, "rng: same seed gives the same stream");
    CHECK(differ, "rng: different seeds differ");
    CHECK(in_range, "rng: uniform in [0,1)");
}

static void test_greedy_and_filters(void) {
    sample_params p;
    sample_params_default(&p);
    p.temperature = 0;
    const float v[4] = {1.0f, 3.0f, 3.0f, 2.0f};
    int cnt[4];
    draw_many(&p, v, 4, 50, cnt);
    CHECK(cnt[1] == 50, "greedy picks the best logit, ties to the lowest id");

    /* probabilities 0.5 0.3 0.15 0.05 */
    const float q[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    sample_params_default(&p);
    p.seed = 7;
    draw_many(&p, q, 4, 20000, cnt);
    int close = 1;
    const double want[4] = {0.5, 0.3, 0.15, 0.05};
    for (int i = 0; i < 4; i++) close &= fabs(cnt[i] / 20000.0 - want[i]) < 0.015;
    CHECK(close, "temperature 1 follows softmax (%d %d %d %d)", cnt[0], cnt[1], cnt[2], cnt[3]);

    p.top_k = 1;
    p.temperature = 2;
    draw_many(&p, q, 4, 2000, cnt);
    CHECK(cnt[0] == 2000, "top_k 1 is greedy");

    sample_params_default(&p);
    p.top_k = 2;
    draw_many(&p, q, 4, 4000, cnt);
    CHECK(cnt[2] == 0 && cnt[3] == 0 && cnt[0] > 2000 && cnt[1] > 1000, "top_k 2 keeps two tokens");

    sample_params_default(&p);
    p.top_p = 0.7f;
    draw_many(&p, q, 4, 4000, cnt);
    CHECK(cnt[2] == 0 && cnt[3] == 0 && fabs(cnt[0] / 4000.0 - 0.625) < 0.03, "top_p 0.7 keeps 0.5+0.3");

    sample_params_default(&p);
    p.min_p = 0.5f;
    draw_many(&p, q, 4, 4000, cnt);
    CHECK(cnt[2] == 0 && cnt[3] == 0 && cnt[1] > 0, "min_p 0.5 drops tokens under half the best");

    sample_params_default(&p);
    p.temperature = 0.05f;
    draw_many(&p, q, 4, 1000, cnt);
    CHECK(cnt[0] == 1000, "low temperature sharpens to the best token");

}

/* Any NaN or +inf among the logits, wherever it is and whatever the knobs, is an error naming it; so are
 * logits that forbid every token. Without them the same draw gives a token whose logit is finite. */
static void test_non_finite(void) {
    enum { TRIALS = 300, MAXV = 257 };
    float v[MAXV], l[MAXV];
    uint64_t x = 12345;
    int refused = 0, named = 0, clean_ok = 0, none_refused = 0;
    for (int t = 0; t < TRIALS; t++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int nv = 2 + (int)((x >> 33) % (MAXV - 2)), bad_at = (int)((x >> 20) % (uint64_t)nv), kind = (int)((x >> 12) % 2);
        sample_params p;
        sample_params_default(&p);
        p.temperature = (t % 3) ? 0.7f : 0.0f;
        p.top_k = (t % 5 == 1) ? 1 + t % 7 : 0;
        p.top_p = (t % 4 == 2) ? 0.9f : 1.0f;
        p.min_p = (t % 6 == 3) ? 0.05f : 0.0f;
        p.presence_penalty = (t % 7 == 4) ? 0.5f : 0.0f;
        p.seed = (uint64_t)t;
        for (int i = 0; i < nv; i++) v[i] = (i % 11 == 5 && i != bad_at) ? -INFINITY : (float)((x >> (i % 40)) % 997) / 50.0f;
        sampler s;
        sampler_init(&s, &p, nv);
        sampler_accept(&s, (int32_t)(t % nv));
        fill(l, v, nv);
        int32_t id = sampler_sample(&s, l, NULL);
        clean_ok += id >= 0 && id < nv && isfinite(v[id]);
        fill(l, v, nv);
        l[bad_at] = kind ? NAN : INFINITY;
        id = sampler_sample(&s, l, NULL);
        refused += id == -1;
        named += id == -1 && strstr(sampler_error(&s), kind ? "NaN" : "+inf") != NULL;
        for (int i = 0; i < nv; i++) l[i] = -INFINITY;
        none_refused += sampler_sample(&s, l, NULL) == -1 && strstr(sampler_error(&s), "forbidden");
        sampler_free(&s);
    }
    CHECK(clean_ok == TRIALS, "finite logits: a token with a finite logit every time (%d/%d)", clean_ok, TRIALS);
    CHECK(refused == TRIALS && named == TRIALS, "one NaN/+inf anywhere: refused %d/%d, error names it %d/%d",
          refused, TRIALS, named, TRIALS);
    CHECK(none_refused == TRIALS, "every token forbidden: refused %d/%d", none_refused, TRIALS);
}

static int mask_none(void *ctx, float *logits, int n_vocab, int budget) {
    for (int i = 0; i < n_vocab; i++) logits[i] = -INFINITY;
    return 0;
}

static int count_events(void *ctx, const gen_event *ev) {
    (*(int *)ctx)++;
    return 0;
}

/* The decode loop reports such a step as an error (no token, no event), never as the end of the message. */
static void test_generate_non_finite(void) {
    enum { NV = 32 };
    float l[NV];
    int bad_ok = 0, dead_ok = 0, n = 0;
    for (int t = 0; t < 40; t++) {
        gen_config cfg = {.max_tokens = 8, .eos_id = t % 2 ? 3 : -1};
        sample_params_default(&cfg.sp);
        cfg.sp.temperature = t % 3 ? 1.0f : 0.0f;
        if (t % 4 == 3) {
            cfg.mask = mask_none;
            for (int i = 0; i < NV; i++) l[i] = (float)i;
        } else {
            for (int i = 0; i < NV; i++) l[i] = (float)(i % 5);
            l[(t * 7) % NV] = t % 2 ? NAN : INFINITY;
        }
        gen_state *g = gen_state_new(&cfg, NV);
        gen_result res = {0};
        int32_t next = -7;
        int events = 0;
        int end = gen_step(g, l, count_events, &events, &next, &res);
        int ok = end == 1 && res.finish == GEN_FINISH_ERROR && events == 0 && res.ids.n == 0 && gen_state_error(g)[0];
        if (cfg.mask) dead_ok += ok && strstr(gen_state_error(g), "constraint") != NULL;
        else bad_ok += ok && strstr(gen_state_error(g), "non-finite") != NULL;
        n += cfg.mask != NULL;
        tok_ids_free(&res.ids);
        gen_state_free(g);
    }
    CHECK(bad_ok == 40 - n && dead_ok == n, "gen_step: non-finite logits (%d/%d) and a constraint allowing nothing "
          "(%d/%d) end as errors with a reason, no token emitted", bad_ok, 40 - n, dead_ok, n);
}

static void test_seed_and_penalties(void) {
    enum { NV = 64 };
    float v[NV], l[NV];
    for (int i = 0; i < NV; i++) v[i] = sinf((float)i);
    sample_params p;
    sample_params_default(&p);
    p.seed = 1234;
    p.top_p = 0.9f;
    p.top_k = 40;
    sampler a, b, c;
    sampler_init(&a, &p, NV);
    sampler_init(&b, &p, NV);
    p.seed = 99;
    sampler_init(&c, &p, NV);
    int same = 1, differ = 0;
    for (int i = 0; i < 200; i++) {
        fill(l, v, NV);
        int32_t x = sampler_sample(&a, l, NULL);
        fill(l, v, NV);
        int32_t y = sampler_sample(&b, l, NULL);
        fill(l, v, NV);
        int32_t z = sampler_sample(&c, l, NULL);
        same &= x == y;
        differ |= x != z;
    }
    CHECK(same, "same seed, same samples");
    CHECK(differ, "different seed, different samples");
    sampler_free(&a);
    sampler_free(&b);
    sampler_free(&c);

    sample_params_default(&p);
    p.temperature = 0;
    p.frequency_penalty = 0.6f;
    sampler s;
    sampler_init(&s, &p, 4);
    const float w[4] = {2.0f, 1.0f, 0.0f, 0.0f};
    int seq[4];
    for (int i = 0; i < 4; i++) {
        fill(l, w, 4);
        seq[i] = sampler_sample(&s, l, NULL);
        sampler_accept(&s, seq[i]);
    }
    CHECK(seq[0] == 0 && seq[1] == 0 && seq[2] == 1, "frequency penalty grows per occurrence (%d %d %d %d)", seq[0],
          seq[1], seq[2], seq[3]);
    sampler_free(&s);
    p.frequency_penalty = 0;
    p.presence_penalty = 1.5f;
    sampler_init(&s, &p, 4);
    for (int i = 0; i < 4; i++) {
        fill(l, w, 4);
        seq[i] = sampler_sample(&s, l, NULL);
        sampler_accept(&s, seq[i]);
    }
    /* 2 1 0 0 → 0.5 1 0 0 → 0.5 -0.5 0 0, and it stays there: presence does not grow with repeats */
    CHECK(seq[0] == 0 && seq[1] == 1 && seq[2] == 0 && seq[3] == 0, "presence penalty applies once per token (%d %d %d %d)",
          seq[0], seq[1], seq[2], seq[3]);
    sampler_free(&s);
}

static void test_logprobs(void) {
    const float q[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    float l[4];
    sample_params p;
    sample_params_default(&p);
    p.temperature = 0;
    p.n_top_logprobs = 3;
    sampler s;
    sampler_init(&s, &p, 4);
    fill(l, q, 4);
    sample_result r;
    int32_t id = sampler_sample(&s, l, &r);
    CHECK(id == 0 && r.id == 0 && fabsf(r.logprob - logf(0.5f)) < 1e-5f, "chosen token's logprob");
    CHECK(r.n_top == 3 && r.top[0].id == 0 && r.top[1].id == 1 && r.top[2].id == 2 &&
              fabsf(r.top[2].logprob - logf(0.15f)) < 1e-5f,
          "top logprobs sorted best first");
    sampler_free(&s);
    p.n_top_logprobs = 99;
    sampler_init(&s, &p, 4);
    fill(l, q, 4);
    sampler_sample(&s, l, &r);
    CHECK(r.n_top == 4, "top logprobs capped at the vocabulary");
    sampler_free(&s);
}

static int feed_all(stop_matcher *m, const char *const *parts, int n, text_buf *out) {
    for (int i = 0; i < n; i++)
        if (stop_feed(m, parts[i], strlen(parts[i]), out)) return 1;
    stop_flush(m, out);
    return 0;
}

static void test_stop(void) {
    const char *stops[] = {"STOP", "\n\n", "é!"};
    stop_matcher m;
    text_buf out = {0};
    stop_init(&m, stops, 3);
    const char *a[] = {"Hello wor", "ld! ST", "O", "P and more"};
    CHECK(feed_all(&m, a, 4, &out) && !strcmp(out.p, "Hello world! "), "stop string across pieces, not emitted: '%s'",
          out.p);
    stop_free(&m);

    text_buf_clear(&out);
    stop_init(&m, stops, 3);
    stop_feed(&m, "abc S", 5, &out);
    CHECK(!strcmp(out.p, "abc "), "possible stop start is held back");
    stop_feed(&m, "X", 1, &out);
    CHECK(!strcmp(out.p, "abc SX"), "released when it cannot be a stop any more");
    stop_feed(&m, "\n", 1, &out);
    stop_flush(&m, &out);
    CHECK(!strcmp(out.p, "abc SX\n"), "flush releases the held tail");
    stop_free(&m);

    text_buf_clear(&out);
    stop_init(&m, stops, 3);
    const char *u[] = {"caf", "é", "!", "x"};
    CHECK(feed_all(&m, u, 4, &out) && !strcmp(out.p, "caf"), "multi-byte stop string");
    stop_free(&m);

    text_buf_clear(&out);
    stop_init(&m, NULL, 0);
    const char *n[] = {"a", "b"};
    CHECK(!feed_all(&m, n, 2, &out) && !strcmp(out.p, "ab"), "no stop strings passes text through");
    stop_free(&m);
    text_buf_free(&out);
}

typedef struct cb_state {
    int events, finals, cancel_after;
    int32_t ids[64];
} cb_state;

static int on_event(void *ctx, const gen_event *ev) {
    cb_state *c = ctx;
    if (c->events < 64) c->ids[c->events] = ev->id;
    c->events++;
    c->finals += ev->final;
    return c->cancel_after && c->events >= c->cancel_after;
}

static void test_generate(void) {
    df_engine_opts o;
    ef_opts(&o, "tests/fixtures/kl-fp32", NULL);
    o.n_threads = 1;
    df_engine *e = NULL;
    df_session *s = NULL;
    df_error err = {0};
    if (df_engine_open(&e, &o, &err) || df_session_init(&s, e, &err)) {
        CHECK(0, "open fixture model: %s", err.msg);
        return;
    }
    int nv = df_engine_info(e)->vocab_size;
    float *logits = malloc((size_t)nv * sizeof *logits);
    const int32_t prompt[] = {1, 20, 30, 40};
    gen_config cfg = {.max_tokens = 12, .eos_id = -1};
    sample_params_default(&cfg.sp);
    cfg.sp.temperature = 0;
    cb_state c1 = {0}, c2 = {0};
    gen_result r1, r2;
    df_session_eval(s, prompt, 4, logits, 0, &err);
    int rc = gen_run(s, &cfg, logits, nv, on_event, &c1, &r1, &err);
    CHECK(rc == 0 && r1.finish == GEN_FINISH_LENGTH && r1.ids.n == 12 && r1.n_evaluated == 11 && c1.events == 12 &&
              c1.finals == 1,
          "gen_run stops at max_tokens with one final event");
    CHECK(df_session_pos(s) == 4 + 11, "session consumed prompt + all but the last token");
    df_session_reset(s);
    df_session_eval(s, prompt, 4, logits, 0, &err);
    gen_run(s, &cfg, logits, nv, on_event, &c2, &r2, &err);
    CHECK(r2.ids.n == 12 && !memcmp(r1.ids.v, r2.ids.v, 12 * sizeof(int32_t)), "greedy generation is deterministic");

    cfg.eos_id = r1.ids.v[3];
    int first = 0;
    while (r1.ids.v[first] != cfg.eos_id) first++;
    gen_result r3;
    cb_state c3 = {0};
    df_session_reset(s);
    df_session_eval(s, prompt, 4, logits, 0, &err);
    gen_run(s, &cfg, logits, nv, on_event, &c3, &r3, &err);
    CHECK(r3.finish == GEN_FINISH_STOP && (int)r3.ids.n == first + 1, "end token stops generation");

    cfg.eos_id = -1;
    gen_result r4;
    cb_state c4 = {.cancel_after = 3};
    df_session_reset(s);
    df_session_eval(s, prompt, 4, logits, 0, &err);
    rc = gen_run(s, &cfg, logits, nv, on_event, &c4, &r4, &err);
    CHECK(rc == DF_ECANCELLED && r4.finish == GEN_FINISH_CANCELLED && c4.events == 3, "callback cancels generation");
    gen_result r5;
    cb_state c5 = {0};
    df_session_reset(s);
    df_session_eval(s, prompt, 4, logits, 0, &err);
    logits[nv / 3] = NAN;
    memset(&err, 0, sizeof err);
    rc = gen_run(s, &cfg, logits, nv, on_event, &c5, &r5, &err);
    CHECK(rc == DF_EINVAL && r5.finish == GEN_FINISH_ERROR && c5.events == 0 && strstr(err.msg, "NaN"),
          "gen_run: a NaN logit fails with DF_EINVAL and a message (%s)", err.msg);
    tok_ids_free(&r5.ids);
    tok_ids_free(&r1.ids);
    tok_ids_free(&r2.ids);
    tok_ids_free(&r3.ids);
    tok_ids_free(&r4.ids);
    free(logits);
    df_session_free(s);
    df_engine_free(e);
}

int main(void) {
    test_rng();
    test_greedy_and_filters();
    test_non_finite();
    test_generate_non_finite();
    test_seed_and_penalties();
    test_logprobs();
    test_stop();
    test_generate();
    TEST_EXIT();
}
