/* verify.c — the checks of `deltafin verify` in the order they run (verify.h): the checkpoint's files, its config
 * (and against K3's values), the tensors (verify_shapes.c), the install manifest's SHA-256 record, then the
 * engine: it opens, one token gives finite logits, and the token oracles that apply. A check that cannot run
 * because an earlier one failed is reported SKIP with that reason, so a broken folder is never computed on. */
#include "verify.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/util.h"
#include "install/dcache.h"
#include "tokenizer/tokenizer.h"

void verify_say(verify_report *r, verify_result res, const char *check, const char *fmt, ...) {
    char detail[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (res == VERIFY_PASS) r->n_pass++;
    else if (res == VERIFY_FAIL) r->n_fail++;
    else r->n_skip++;
    if (r->line) r->line(r->ctx, res, check, detail);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Oracles */

static int32_t *ids_copy(const int32_t *v, int n) {
    int32_t *c = xmalloc(sizeof *c * (size_t)(n + 1));
    memcpy(c, v, sizeof *c * (size_t)n);
    return c;
}

void verify_oracle_k3(verify_oracle *o) {
    static const int32_t prompt[] = {1008, 10484, 318, 15383, 387};
    static const int32_t greedy[] = {17374, 13,    646,   606,   142957, 37092, 387,   7081, 306,
                                     17374, 13,    646,   14715, 91527,  16575, 387,   1280};
    *o = (verify_oracle){.source = xstrdup("the Kimi K3 oracle published by the original Deltafin"),
                         .prompt = xstrdup("The capital of France is"),
                         .prompt_ids = ids_copy(prompt, 5), .n_prompt_ids = 5,
                         .greedy = ids_copy(greedy, 17), .n_greedy = 17};
}

static int oracle_ids(json_t *a, const char *path, int c, const char *key, int32_t **out, int *n, df_error *err) {
    json_t *v = json_object_get(a, key);
    if (!json_is_array(v) || !json_array_size(v))
        return df_error_set(err, DF_EFORMAT, "%s: cases[%d].%s must be a non-empty array of token ids", path, c, key),
               DF_EFORMAT;
    *n = (int)json_array_size(v);
    *out = xmalloc(sizeof **out * (size_t)*n);
    for (int i = 0; i < *n; i++) {
        json_t *x = json_array_get(v, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
            return df_error_set(err, DF_EFORMAT, "%s: cases[%d].%s[%d] is not a token id", path, c, key, i),
                   DF_EFORMAT;
        (*out)[i] = (int32_t)json_integer_value(x);
    }
    return DF_OK;
}

int verify_oracles_load(const char *path, verify_oracle **out, int *n, df_error *err) {
    *out = NULL;
    *n = 0;
    json_t *root = df_json_load_file(path, 0, err);
    if (!root) return err->code;
    json_t *cases = json_object_get(root, "cases");
    int single = !cases && json_is_object(root), rc = DF_OK;
    int count = single ? 1 : json_is_array(cases) ? (int)json_array_size(cases) : 0;
    if (!count)
        rc = (df_error_set(err, DF_EFORMAT, "%s: expected {\"prompt\", \"prompt_ids\", \"greedy\"} or a non-empty "
                           "\"cases\" array of them", path), DF_EFORMAT);
    verify_oracle *v = xcalloc((size_t)count + 1, sizeof *v);
    int k = 0;
    for (; k < count && !rc; k++) {
        json_t *c = single ? root : json_array_get(cases, (size_t)k);
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        if (!prompt) {
            rc = (df_error_set(err, DF_EFORMAT, "%s: cases[%d].prompt must be a string", path, k), DF_EFORMAT);
            break;
        }
        char src[512];
        snprintf(src, sizeof src, "%s, case %d", path, k);
        v[k].source = xstrdup(src);
        v[k].prompt = xstrdup(prompt);
        rc = oracle_ids(c, path, k, "prompt_ids", &v[k].prompt_ids, &v[k].n_prompt_ids, err);
        if (!rc) rc = oracle_ids(c, path, k, "greedy", &v[k].greedy, &v[k].n_greedy, err);
    }
    json_decref(root);
    if (rc) {
        verify_oracles_free(v, count);
        return rc;
    }
    *out = v;
    *n = count;
    return DF_OK;
}

void verify_oracles_free(verify_oracle *v, int n) {
    for (int i = 0; v && i < n; i++) {
        free(v[i].source);
        free(v[i].prompt);
        free(v[i].prompt_ids);
        free(v[i].greedy);
    }
    free(v);
}

/* ---------------------------------------------------------------------------------------------------- */
/* The install manifest: the SHA-256 checks `deltafin fetch` recorded, and that the files are still the size
 * they were installed at (hashing them again would read the whole model). */

static void verify_install(const checkpoint *ck, verify_report *r) {
    dc_manifest m;
    int found = 0;
    df_error err = {0};
    if (dc_manifest_load(ck->dir, &m, &found, &err)) {
        verify_say(r, VERIFY_FAIL, "install", "%s", err.msg);
        return;
    }
    if (!found) {
        verify_say(r, VERIFY_SKIP, "install", "no %s: not installed by `deltafin fetch`, so no SHA-256 was recorded "
                   "to check", DC_MANIFEST);
        return;
    }
    char msg[1024] = "";
    int o = 0, bad = 0, ok = 0, partial = 0, nohash = 0;
#define INSTALL_BAD(...)                                                                                        \
    do {                                                                                                        \
        if (bad++ < 6 && o < (int)sizeof msg - 200)                                                             \
            o += snprintf(msg + o, sizeof msg - (size_t)o, "\n      " __VA_ARGS__);                             \
    } while (0)
    for (int i = 0; i < m.n; i++) {
        const dc_shard *s = &m.shards[i];
        char *path = df_path_join(ck->dir, s->name);
        struct stat sb;
        if (stat(path, &sb)) INSTALL_BAD("%s: listed in the manifest but missing", path);
        else if ((uint64_t)sb.st_size != s->size)
            INSTALL_BAD("%s is %lld bytes, the manifest says %llu", path, (long long)sb.st_size,
                        (unsigned long long)s->size);
        else if (s->state == DC_PENDING) INSTALL_BAD("%s was never completely installed (rerun deltafin fetch)", path);
        else if (s->state == DC_SPINE) partial++;
        else if (!s->sha256) nohash++;
        else if (!s->verified)
            INSTALL_BAD("%s is complete but its SHA-256 was never checked (rerun deltafin fetch)", path);
        else ok++;
        free(path);
    }
#undef INSTALL_BAD
    dc_manifest_free(&m);
    if (bad) verify_say(r, VERIFY_FAIL, "install", "%d of the manifest's shards fail:%s", bad, msg);
    else if (!ok)
        verify_say(r, VERIFY_SKIP, "install", "the manifest records no verified SHA-256 (%d spine-only, %d without "
                   "a published hash)", partial, nohash);
    else {
        char more[256] = "";
        int k = 0;
        if (partial) k += snprintf(more + k, sizeof more - (size_t)k, "; %d spine-only (a partial install: their "
                                   "experts stream from the disk cache or the remote)", partial);
        if (nohash) snprintf(more + k, sizeof more - (size_t)k, "; %d complete without a published hash", nohash);
        verify_say(r, VERIFY_PASS, "install", "%d shard%s complete with SHA-256 verified at install%s", ok,
                   ok > 1 ? "s" : "", more);
    }
}

/* ---------------------------------------------------------------------------------------------------- */
/* The engine: opening, one forward pass, the oracles. */

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static void ids_text(char *buf, size_t cap, const int32_t *v, int n) {
    int o = snprintf(buf, cap, "[");
    for (int i = 0; i < n && o < (int)cap - 16; i++)
        o += snprintf(buf + o, cap - (size_t)o, "%s%d", i ? ", " : "", v[i]);
    if (o < (int)cap) snprintf(buf + o, cap - (size_t)o, "]");
}

/* The text of ids as the tokenizer decodes them, quoted for a message (empty without a tokenizer). */
static void ids_decoded(const tokenizer *tok, const int32_t *v, int n, char *buf, size_t cap) {
    buf[0] = 0;
    char *text = NULL;
    size_t len = 0, tcap = 0;
    if (tok && !tokenizer_decode(tok, v, (size_t)n, &text, &len, &tcap, &(df_error){0}) && text)
        snprintf(buf, cap, " \"%.*s\"", (int)DF_MIN(len, cap - 8), text);
    free(text);
}

static void verify_tokenizer(const tokenizer *tok, const verify_oracle *o, verify_report *r) {
    tok_ids ids = {0};
    df_error err = {0};
    char want[512], got[512];
    ids_text(want, sizeof want, o->prompt_ids, o->n_prompt_ids);
    if (tokenizer_encode(tok, o->prompt, strlen(o->prompt), 0, &ids, &err))
        verify_say(r, VERIFY_FAIL, "tokenizer oracle", "\"%s\": %s", o->prompt, err.msg);
    else if ((int)ids.n != o->n_prompt_ids || memcmp(ids.v, o->prompt_ids, sizeof *ids.v * ids.n)) {
        ids_text(got, sizeof got, ids.v, (int)ids.n);
        verify_say(r, VERIFY_FAIL, "tokenizer oracle", "\"%s\" gives %s, %s has %s", o->prompt, got, o->source, want);
    } else {
        verify_say(r, VERIFY_PASS, "tokenizer oracle", "\"%s\" -> %s", o->prompt, want);
    }
    tok_ids_free(&ids);
}

static void verify_greedy(df_engine *eng, const tokenizer *tok, const verify_oracle *o, verify_report *r) {
    int V = df_engine_info(eng)->vocab_size;
    for (int i = 0; i < o->n_prompt_ids; i++)
        if (o->prompt_ids[i] >= V) {
            verify_say(r, VERIFY_FAIL, "greedy oracle", "prompt id %d is outside the vocabulary of %d",
                       o->prompt_ids[i], V);
            return;
        }
    df_session *s = NULL;
    df_error err = {0};
    float *logits = xmalloc(sizeof *logits * (size_t)V);
    int32_t *got = xmalloc(sizeof *got * (size_t)o->n_greedy);
    df_stats st0, st1;
    df_engine_stats(eng, &st0);
    double t0 = df_now();
    int rc = df_session_init(&s, eng, &err), n = 0;
    if (!rc) rc = df_session_eval(s, o->prompt_ids, o->n_prompt_ids, logits, 0, &err);
    double t_prompt = df_now() - t0;
    int finite = 1;
    while (!rc && n < o->n_greedy) {
        for (int i = 0; i < V && finite; i++) finite = isfinite(logits[i]);
        if (!finite) break;
        got[n] = argmax(logits, V);
        if (got[n] != o->greedy[n]) break;
        if (++n < o->n_greedy) rc = df_session_eval(s, &got[n - 1], 1, logits, 0, &err);
    }
    double t = df_now() - t0;
    df_engine_stats(eng, &st1);
    char text[512], want_text[512], reads[256];
    snprintf(reads, sizeof reads, "%llu expert reads (%.2f GB, %llu of them look-ahead guesses), %.2f GB of spine",
             (unsigned long long)(st1.expert_loads - st0.expert_loads),
             (st1.expert_disk_bytes - st0.expert_disk_bytes) / 1e9,
             (unsigned long long)(st1.lookahead_loads - st0.lookahead_loads),
             (st1.spine_disk_bytes - st0.spine_disk_bytes) / 1e9);
    if (rc) {
        verify_say(r, VERIFY_FAIL, "greedy oracle", "evaluation failed after %d ids: %s", n, err.msg);
    } else if (!finite) {
        verify_say(r, VERIFY_FAIL, "greedy oracle", "the logits before id %d are not finite", n + 1);
    } else if (n < o->n_greedy) {
        ids_decoded(tok, got, n + 1, text, sizeof text);
        ids_decoded(tok, o->greedy, n + 1, want_text, sizeof want_text);
        verify_say(r, VERIFY_FAIL, "greedy oracle", "id %d of %d is %d, %s has %d: continuation%s, expected%s (%.1f s; "
                   "%s)", n + 1, o->n_greedy, got[n], o->source, o->greedy[n], text, want_text, t, reads);
    } else {
        ids_decoded(tok, got, n, text, sizeof text);
        verify_say(r, VERIFY_PASS, "greedy oracle", "all %d ids match%s (prompt %.1f s, %.1f s in all; %s)", n,
                   text, t_prompt, t, reads);
    }
    free(got);
    free(logits);
    df_session_free(s);
}

/* One token through the whole model (only without an oracle: the oracles' prompts check the same and read
 * only the experts they need). */
static void verify_forward(df_engine *eng, const df_config *cfg, verify_report *r) {
    df_error err = {0};
    int V = df_engine_info(eng)->vocab_size;
    float *logits = xmalloc(sizeof *logits * (size_t)V);
    df_session *s = NULL;
    int32_t tok0 = cfg->bos_id >= 0 && cfg->bos_id < V ? cfg->bos_id : 0;
    double t0 = df_now();
    int rc = df_session_init(&s, eng, &err);
    if (!rc) rc = df_session_eval(s, &tok0, 1, logits, 0, &err);
    int finite = 1;
    for (int i = 0; !rc && i < V && finite; i++) finite = isfinite(logits[i]);
    if (rc) verify_say(r, VERIFY_FAIL, "forward", "one token (id %d): %s", tok0, err.msg);
    else if (!finite) verify_say(r, VERIFY_FAIL, "forward", "one token (id %d) gives logits that are not finite", tok0);
    else verify_say(r, VERIFY_PASS, "forward", "one token (id %d) gives %d finite logits (%.1f s)", tok0, V,
                    df_now() - t0);
    df_session_free(s);
    free(logits);
}

static void verify_engine(const verify_opts *vo, const df_config *cfg, int published, verify_report *r) {
    verify_oracle k3 = {0};
    const verify_oracle *oracles = vo->oracles;
    int n_oracles = vo->n_oracles;
    if (!n_oracles && published) {
        verify_oracle_k3(&k3);
        oracles = &k3;
        n_oracles = 1;
    }
    df_engine_opts eo = vo->engine;
    if (!n_oracles) eo.preload = DF_PRELOAD_OFF;   /* one token reads what it needs and no more */
    df_engine *eng = NULL;
    df_error err = {0};
    double t0 = df_now();
    if (df_engine_open(&eng, &eo, &err)) {
        verify_say(r, VERIFY_FAIL, "engine", "does not open: %s", err.msg);
    } else {
        verify_say(r, VERIFY_PASS, "engine", "opens: every spine tensor binds with a usable dtype (%.1f s)",
                   df_now() - t0);
        if (!n_oracles) {
            verify_forward(eng, cfg, r);
            verify_say(r, VERIFY_SKIP, "token oracle", "none is known for this model (%s); --oracle FILE checks one "
                       "you trust", cfg->is_k3 ? "a K3-shaped checkpoint, not the published size" : "kimi_linear");
        } else {
            tokenizer *tok = NULL;
            if (tokenizer_load_dir(&tok, eo.model_dir, &err)) {
                verify_say(r, VERIFY_FAIL, "tokenizer oracle", "no tokenizer: %s", err.msg);
                tok = NULL;
            }
            for (int i = 0; i < n_oracles; i++) {
                if (tok) verify_tokenizer(tok, &oracles[i], r);
                verify_greedy(eng, tok, &oracles[i], r);
            }
            tokenizer_free(tok);
        }
        df_engine_free(eng);
    }
    if (oracles == &k3) {
        free(k3.source);
        free(k3.prompt);
        free(k3.prompt_ids);
        free(k3.greedy);
    }
}

/* ---------------------------------------------------------------------------------------------------- */

int verify_model(const verify_opts *o, verify_report *r) {
    const char *dir = o->engine.model_dir;
    checkpoint ck;
    df_error err = {0};
    df_config cfg = {0};
    int ok_files = !ckpt_open(&ck, dir, &err), ok_cfg = 0, ok_tensors = 0, published = 0;
    if (!ok_files) {
        verify_say(r, VERIFY_FAIL, "files", "%s", err.msg);
    } else {
        verify_say(r, VERIFY_PASS, "files", "config.json and %d shard%s (%s) with %lld tensors, every header valid",
                   ck.n_shards, ck.n_shards > 1 ? "s" : "",
                   ck.indexed ? "model.safetensors.index.json" : "model.safetensors", (long long)ck.n_tensors);
        char *path = df_path_join(dir, "config.json");
        ok_cfg = !config_parse(&cfg, ck.config_text, path, &err);
        free(path);
        if (!ok_cfg) {
            verify_say(r, VERIFY_FAIL, "config", "%s", err.msg);
        } else {
            int mla = 0, moe = 0;
            for (int l = 0; l < cfg.n_layers; l++) mla += cfg.mixer[l] == MIXER_MLA, moe += cfg.ffn[l] == FFN_MOE;
            verify_say(r, VERIFY_PASS, "config", "%s: %d layers (%d KDA, %d MLA; %d MoE), %d experts, top-%d, "
                       "vocabulary %d", ck.model_type, cfg.n_layers, cfg.n_layers - mla, mla, moe, cfg.n_experts,
                       cfg.topk, cfg.vocab);
            int before = r->n_fail;
            if (cfg.is_k3) verify_config_k3(&cfg, r, &published);
            else verify_say(r, VERIFY_SKIP, "config: Kimi K3 values", "model_type %s: no published shapes are "
                            "checked; the tensors are checked against its own config", ck.model_type);
            ok_cfg = r->n_fail == before;
            ok_tensors = !verify_tensors(&ck, &cfg, r);
        }
    }
    if (ok_files) verify_install(&ck, r);
    else verify_say(r, VERIFY_SKIP, "install", "the checkpoint's files did not open");
    if (o->no_engine)
        verify_say(r, VERIFY_SKIP, "engine", "not opened (--no-engine): no forward pass, no token oracle");
    else if (!ok_cfg || !ok_tensors)
        verify_say(r, VERIFY_SKIP, "engine", "not opened: the checkpoint failed the checks above");
    else verify_engine(o, &cfg, published, r);
    ckpt_free(&ck);
    config_free(&cfg);
    return r->n_fail;
}
