/* engine.c — the public API of include/deltafin.h: an engine ties storage, kernels and the model
 * together; a session holds one conversation's state. A session whose evaluation failed part-way is reset,
 * since its layers may have consumed the tokens unevenly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "deltafin.h"
#include "common/util.h"
#include "engine/engine_internal.h"
#include "format/tensor_names.h"
#include "gpu/gpu.h"

void df_engine_opts_default(df_engine_opts *o) {
    memset(o, 0, sizeof *o);
}

/* The largest row count in 16..4096, and no more than a context, whose scratch fits the working reserve
 * (scratch grows with rows). With layers read in parts, no more than one block of rows, so that a pass uses
 * each matrix once and reads each part once. */
static int engine_fit_pass_rows(const df_engine *e) {
    store_stats ss;
    store_get_stats(e->store, &ss);
    int lo = 16, hi = (int)DF_MAX(16, DF_MIN(ss.split_layers ? MODEL_BLOCK_ROWS : 4096, e->model.cfg.max_ctx));
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (model_scratch_bytes(&e->model, mid) <= ss.reserve_bytes) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* The budget's share for one session of opts->ctx_tokens (the model's context if smaller). Read from the
 * folder's config.json ahead of the store, which plans the budget when it opens; a config that does not parse
 * here is reported by the store's own checks. */
static void engine_state_share(const df_engine_opts *opts, store_opts *so) {
    char *path = df_path_join(opts->model_dir, "config.json");
    df_error e = {0};
    char *text = df_read_file_max(path, DF_JSON_FILE_MAX, NULL, &e);
    df_config c;
    if (text && !config_parse(&c, text, path, &e)) {
        so->state_tokens = DF_MIN(opts->ctx_tokens, c.max_ctx);
        so->state_bytes = state_bytes_for(&c, so->state_tokens, DF_ROLLBACK_ROWS_DEFAULT);
        config_free(&c);
    }
    free(text);
    free(path);
}

/* The spine split over ranks: rank 0 keeps the top-level tensors and, of the layers others hold, the matrix its
 * attention reads itself (MLA's kv_b); a layer's holder keeps the rest of its matrices. */
static int engine_spine_keep(void *ctx, int layer, const char *key) {
    const df_engine *e = ctx;
    int me = comm_rank(e->comm), kvb = !strcmp(key, tensor_name_suffix(TN_MLA_KV_B));
    if (layer == e->plan.n_layers) return me == 0;
    if (e->plan.spine_rank[layer] == me) return me == 0 || !kvb;
    return me == 0 && kvb;
}

/* Whether to split the spine (opts.spine_split; auto: when this rank's budget would not hold all of it), and
 * by what: the checkpoint's tables, opened for their sizes only. */
static int engine_spine_split(df_engine *e, const df_engine_opts *opts, store_opts *so, df_error *err) {
    store_opts probe = *so;
    probe.catalog_only = 1;
    df_store *st = NULL;
    int rc = store_open_ex(&st, opts->model_dir, &probe, err);
    if (rc) return rc;
    if (opts->spine_split == DF_SPINE_SPLIT_ON || !store_spine_fits(st)) {
        int L = e->plan.n_layers;
        int64_t *bytes = xcalloc((size_t)L + 1, sizeof *bytes);
        for (int l = 0; l < L; l++) bytes[l] = (int64_t)store_spine_bytes_of(st, l);
        rank_plan_split_spine(&e->plan, bytes, (int64_t)store_spine_bytes_of(st, L));
        free(bytes);
        so->spine_keep = engine_spine_keep;
        so->spine_keep_ctx = e;
    }
    store_free(st);
    return DF_OK;
}

/* Expert parallelism: the rank plan for this job (config.json read ahead of the store, which takes this rank's
 * expert mask at open), this rank's mask and folder. */
static int engine_rank_plan(df_engine *e, const df_engine_opts *opts, store_opts *so, const char **folder,
                            char **folder_own, df_error *err) {
    int N = comm_size(e->comm), me = comm_rank(e->comm);
    char *path = df_path_join(opts->model_dir, "config.json");
    char *text = df_read_file_max(path, DF_JSON_FILE_MAX, NULL, err);
    df_config c;
    int rc = text ? config_parse(&c, text, path, err) : err->code;
    free(text);
    free(path);
    if (rc) return rc;
    int *ne = xcalloc((size_t)c.n_layers + 1, sizeof *ne);
    for (int l = 0; l < c.n_layers; l++) ne[l] = c.ffn[l] == FFN_MOE ? c.n_experts : 0;
    rc = rank_plan_load(&e->plan, opts->model_dir, c.n_layers, ne, N, err);
    free(ne);
    config_free(&c);
    if (rc) return rc;
    int64_t n = e->plan.base[e->plan.n_layers];
    e->mask = xcalloc((size_t)n + 1, 1);
    for (int64_t k = 0; k < n; k++) e->mask[k] = (uint8_t)((e->plan.holders[k] >> me) & 1);
    *folder = e->plan.folders[me];
    if (opts->expert_dirs) {   /* the rank folders under other names, in rank order */
        char *list = xstrdup(opts->expert_dirs), *save = NULL, *tok = strtok_r(list, ",", &save);
        for (int r = 0; tok && r < me; r++) tok = strtok_r(NULL, ",", &save);
        if (tok) *folder = *folder_own = xstrdup(tok);
        free(list);
        if (!*folder_own)
            return df_error_set(err, DF_EINVAL, "rank %d: --expert-dirs %s names no folder for it (%d ranks)", me,
                                opts->expert_dirs, N), DF_EINVAL;
    }
    so->expert_mask = e->mask;
    so->expert_dirs = NULL;
    so->placement_dir = e->plan.from_file || opts->expert_dirs ? *folder : NULL;
    if (opts->spine_split != DF_SPINE_SPLIT_OFF) rc = engine_spine_split(e, opts, so, err);
    if (me > 0) {   /* rank 0 counts heat and traces; the spine is rank 0's unless split */
        so->experts_only = !e->plan.spine_rank;
        if (so->experts_only) so->preload = DF_PRELOAD_OFF;
        so->heat = DF_HEAT_OFF;
        so->trace_routing = NULL;
    }
    return rc;
}

/* Every expert the plan gives this rank is in its folder (or cannot be placed, and is read from the shards). */
static int engine_check_share(df_engine *e, const char *folder, df_error *err) {
    const rank_plan *p = &e->plan;
    int me = comm_rank(e->comm);
    for (int l = 0; l < p->n_layers; l++) {
        int n = (int)(p->base[l + 1] - p->base[l]);
        if (store_expert_count(e->store, l) != n)
            return df_error_set(err, DF_EFORMAT, "rank %d: %s: layer %d has %d routed experts, its config %d", me,
                                store_dir(e->store), l, store_expert_count(e->store, l), n), DF_EFORMAT;
        for (int x = 0; p->from_file && x < n; x++)
            if (e->mask[p->base[l] + x] && !store_expert_placed(e->store, l, x))
                return df_error_set(err, DF_EIO, "rank %d: its expert folder %s lacks expert %d of layer %d, which the "
                                    "rank plan %s/%s gives it (copy it there with deltafin place --ranks %d)", me,
                                    folder ? folder : "(none)", x, l, store_dir(e->store), RANK_PLAN_FILE,
                                    p->n_ranks), DF_EIO;
    }
    return DF_OK;
}

static void engine_close(df_engine *e) {
    if (e->ep) ep_leader_close(e->ep);
    int failed = e->comm && comm_failed(e->comm);
    gpu_backend_close(&e->model);
    model_free(&e->model);
    free(e->pass_tokens);
    free(e->pass_seg);
    kern_free(&e->kern);
    config_free(&e->model.cfg);
    store_free(e->store);
    rank_plan_free(&e->plan);
    free(e->mask);
    comm_close(e->comm, failed);
    free(e);
}

/* Opens the engine of this process: alone, rank 0 of a job (with the other ranks greeted), or another rank's
 * share (worker). On a worker's failure *comm_out and *plan_out keep the job so the caller can tell rank 0 why. */
static int engine_open(df_engine **out, const df_engine_opts *opts, int worker, dist_comm **comm_out,
                       rank_plan **plan_out, df_error *err) {
    *out = NULL;
    if (!opts || !opts->model_dir) {
        df_error_set(err, DF_EINVAL, "no model folder given");
        return DF_EINVAL;
    }
    df_engine *e = xcalloc(1, sizeof *e);
    store_opts so = {.mem_budget = opts->mem_budget, .cache_slots = opts->cache_slots,
                     .spine_stream = opts->spine_stream, .buffered_io = opts->buffered_io,
                     .io_threads = opts->io_threads, .remote_url = opts->remote_url, .io_kind = opts->io_kind,
                     .spine = opts->spine, .lookahead = opts->lookahead,
                     .cache_policy = opts->cache_policy, .trace_routing = opts->trace_routing, .heat = opts->heat,
                     .head_tile_rows = opts->head_tile_rows,
                     .spine_part_bytes = opts->spine_part_bytes > 0 ? (uint64_t)opts->spine_part_bytes : 0,
                     .expert_dirs = opts->expert_dirs, .preload = opts->preload};
    const char *folder = NULL;
    char *folder_own = NULL;
    int rc = DF_OK, multi = 0;
    if (opts->ranks == DF_RANKS_LAUNCHER) {
        rc = comm_open(&e->comm, NULL, NULL, err);
        multi = !rc && comm_size(e->comm) > 1;
        if (!rc && (multi ? comm_rank(e->comm) > 0 : 0) != worker)
            rc = DF_EINVAL, df_error_set(err, DF_EINVAL, "rank %d of %d: %s", comm_rank(e->comm), comm_size(e->comm),
                                         worker ? "only the other ranks of a job serve their share"
                                                : "ranks other than 0 serve their share (df_engine_serve)");
        if (!rc && multi) rc = engine_rank_plan(e, opts, &so, &folder, &folder_own, err);
    } else if (worker) {
        rc = DF_EINVAL, df_error_set(err, DF_EINVAL, "df_engine_serve needs opts.ranks = DF_RANKS_LAUNCHER");
    }
    const char *gpu_sel = opts->gpu ? opts->gpu : getenv("DELTAFIN_GPU");
    if (!gpu_sel || !*gpu_sel) gpu_sel = "auto";
    int gpu_want = gpu_selection_wants(gpu_sel), gpu_explicit = gpu_want && strcmp(gpu_sel, "auto") != 0;
    if (!rc && multi && gpu_want) {   /* the GPU backend computes every expert itself; ranks share them on CPUs */
        if (gpu_explicit)
            rc = DF_EUNSUPPORTED, df_error_set(err, DF_EUNSUPPORTED, "--gpu %s: a GPU engine cannot be one rank of "
                                               "an expert-parallel job yet (use --gpu off)", gpu_sel);
        gpu_want = 0;
        snprintf(e->gpu_note, sizeof e->gpu_note, "one of %d ranks: experts are shared over the ranks' CPUs",
                 comm_size(e->comm));
    }
    gpu_probe probe = {0};
    if (!rc && gpu_want) gpu_probe_devices(&probe);
    /* The GPU holds every expert: the host's cache only passes them through at open, so it stays small. */
    if (probe.n_devices > 0 && !opts->cache_slots && !opts->mem_budget) so.cache_slots = 64;
    if (!rc && opts->ctx_tokens > 0 && !worker) engine_state_share(opts, &so);
    if (!rc) rc = store_open_ex(&e->store, opts->model_dir, &so, err);
    if (!rc && multi) rc = engine_check_share(e, folder, err);
    int cfg = 0, kern = 0;
    if (!rc) {
        char *cfg_path = df_path_join(opts->model_dir, "config.json");
        rc = config_parse(&e->model.cfg, store_config_text(e->store), cfg_path, err);
        cfg = !rc;
        free(cfg_path);
    }
    int threads = opts->n_threads > 0 ? opts->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (!rc && !(kern = !kern_init(&e->kern, threads, opts->isa)))
        rc = DF_EUNSUPPORTED, df_error_set(err, DF_EUNSUPPORTED, "kernel ISA \"%s\" is not available on this CPU or "
                                           "build", opts->isa ? opts->isa : getenv("DELTAFIN_ISA"));
    int model = 0;
    if (!rc) {
        e->model.store = e->store;
        e->model.kern = &e->kern;
        e->model.alog_per_channel = opts->alog_per_channel;
        e->model.dir = store_dir(e->store);
        if (so.state_tokens > 0) e->model.cfg.max_ctx = DF_MIN(e->model.cfg.max_ctx, so.state_tokens);
        const df_config *c = &e->model.cfg;
        e->info = (df_model_info){c->is_k3 ? "kimi_k3" : "kimi_linear", c->vocab, c->d, c->n_layers, c->bos_id,
                                  c->eos_id, c->max_ctx};
        /* the scratch arena holds a pass of the server's slots or of a prompt's chunk without growing */
        e->pass_rows = engine_fit_pass_rows(e);
        rc = model_init(&e->model, e->pass_rows, err);
        model = !rc;
    }
    if (!rc && multi && !worker) {
        rc = ep_leader_open(&e->ep, e->comm, &e->model, &e->plan, e->kern.k->isa, err);
        if (!rc) e->model.peers = ep_peers(e->ep);
    }
    free(folder_own);
    if (!rc && gpu_want) {
        if (probe.n_devices <= 0) {
            if (gpu_explicit) {
                df_error_set(err, DF_EUNSUPPORTED, "--gpu %s: %s", gpu_sel, probe.reason);
                rc = DF_EUNSUPPORTED;
            }
            snprintf(e->gpu_note, sizeof e->gpu_note, "%s", probe.reason);
        } else {
            uint64_t states = so.state_bytes ? so.state_bytes
                                             : state_bytes_for(&e->model.cfg, DF_MIN(4096, e->model.cfg.max_ctx),
                                                               DF_ROLLBACK_ROWS_DEFAULT);
            df_error ge = {0};
            int grc = gpu_backend_open(&e->model, gpu_sel, opts->gpu_mem, states, &ge);
            if (grc && gpu_explicit) {
                *err = ge;
                rc = grc;
            } else if (grc) {
                snprintf(e->gpu_note, sizeof e->gpu_note, "%s", ge.msg);
            }
        }
    } else if (!gpu_want && !e->gpu_note[0]) {
        snprintf(e->gpu_note, sizeof e->gpu_note, "off");
    }
    if (rc) {
        if (model) model_free(&e->model);
        if (kern) kern_free(&e->kern);
        if (cfg) config_free(&e->model.cfg);
        store_free(e->store);
        if (worker && comm_out && e->comm) {   /* the caller tells rank 0 */
            *comm_out = e->comm;
            *plan_out = xmalloc(sizeof **plan_out);
            **plan_out = e->plan;
        } else {
            rank_plan_free(&e->plan);
            comm_close(e->comm, 1);
        }
        free(e->mask);
        free(e);
        return rc;
    }
    *out = e;
    return DF_OK;
}

int df_engine_open(df_engine **out, const df_engine_opts *opts, df_error *err) {
    return engine_open(out, opts, 0, NULL, NULL, err);
}

int df_launcher_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

int df_engine_serve(const df_engine_opts *opts, df_error *err) {
    df_engine *e = NULL;
    dist_comm *comm = NULL;
    rank_plan *plan = NULL;
    int rc = engine_open(&e, opts, 1, &comm, &plan, err);
    if (rc && !comm) return rc;
    if (rc) {   /* tell rank 0 why, then stay until it ends the job (leaving first could cut its message short) */
        df_error why = *err, e2 = {0};
        ep_serve(comm, NULL, plan, "", "", &why, &e2);
        dist_buf b = {0};
        comm_recv(comm, 0, DIST_TAG_JOB, &b, 64, 4 * comm_timeout(comm), &e2);
        dist_buf_free(&b);
        rank_plan_free(plan);
        free(plan);
        comm_close(comm, 1);
        return rc;
    }
    const char *folder = e->plan.folders[comm_rank(e->comm)];
    rc = ep_serve(e->comm, &e->model, &e->plan, e->kern.k->isa, folder, NULL, err);
    if (rc) comm_fail(e->comm);
    engine_close(e);
    return rc;
}

void df_engine_free(df_engine *e) {
    if (e) engine_close(e);
}

int df_engine_ranks(const df_engine *e) { return e->ep ? ep_ranks(e->ep) : 1; }

int df_engine_rank_info(df_engine *e, int r, df_rank_info *out, df_error *err) {
    memset(out, 0, sizeof *out);
    if (r < 0 || r >= df_engine_ranks(e))
        return df_error_set(err, DF_EINVAL, "no rank %d (the engine has %d)", r, df_engine_ranks(e)), DF_EINVAL;
    ep_rank_info alone = {0};   /* this process, without other ranks: the same counters from its own store */
    const ep_rank_info *in = &alone;
    int rc = DF_OK;
    if (e->ep) {
        rc = ep_refresh_stats(e->ep, err);
        in = ep_rank(e->ep, r);
    } else {
        if (gethostname(alone.host, sizeof alone.host - 1)) snprintf(alone.host, sizeof alone.host, "localhost");
        for (int l = 0; l < e->model.cfg.n_layers; l++) alone.held += store_expert_count(e->store, l);
        ep_rank_info_counters(&alone, e->store);
    }
    snprintf(out->host, sizeof out->host, "%s", in->host);
    snprintf(out->folder, sizeof out->folder, "%s", in->folder);
    out->experts_held = in->held;
    out->experts_shared = in->computed;
    out->cache_slots = in->cache_slots;
    out->cache_bytes = in->cache_bytes;
    out->expert_disk_bytes = in->expert_disk_bytes;
    out->expert_hits = in->expert_hits;
    out->expert_misses = in->expert_misses;
    out->lookahead_loads = in->lookahead_loads;
    out->spine_bytes = in->spine_bytes;
    rank_plan_spine_layers(&e->plan, r, &out->spine_first, &out->spine_layers);
    return rc;
}

void df_engine_net_stats(const df_engine *e, df_net_stats *out) {
    memset(out, 0, sizeof *out);
    if (!e->comm) return;
    dist_counters n;
    comm_counters(e->comm, &n);
    *out = (df_net_stats){n.bytes_sent, n.bytes_recv, n.msgs_sent, n.wait_s, e->ep ? ep_link_wait(e->ep) : 0};
}

int df_engine_health(const df_engine *e, char *why, size_t cap) {
    if (cap) why[0] = 0;
    return e->ep ? ep_health(e->ep, why, cap) : DF_OK;
}

const df_model_info *df_engine_info(const df_engine *e) { return &e->info; }

static void fmt_count(char out[32], int64_t n) {
    static const char *const units[] = {"", "K", "M", "B", "T"};
    double v = (double)n;
    int u = 0;
    while (v >= 1000.0 && u < 4) {
        v /= 1000.0;
        u++;
    }
    snprintf(out, 32, u ? "%.3g%s" : "%.0f%s", v, units[u]);
}

int df_engine_describe(const df_engine *e, char *buf, size_t cap) {
    const df_config *c = &e->model.cfg;
    int n = snprintf(buf, cap, "family: %s\nlayers: %d (hidden %d, vocab %d)\nschedule: ", e->info.family,
                     c->n_layers, c->d, c->vocab);
    for (int i = 0; i < c->n_layers && n < (int)cap; i++)
        n += snprintf(buf + n, cap - n, "%s%s", c->mixer[i] == MIXER_KDA ? "K" : "M",
                      c->ffn[i] == FFN_MOE ? "e" : "d");
    if (n < (int)cap)
        n += snprintf(buf + n, cap - n, "   (K=KDA M=MLA, e=MoE d=dense)\n"
                      "kda: %d heads x %d, conv %d%s%s\nmla: %d heads, q_lora %d, kv_lora %d, nope %d, rope %d, v %d%s\n"
                      "moe: %d experts, top %d, %d shared, width %d%s, groups %d/%d, scale %g\n"
                      "ffn activation: %s; attn_res block: %d\nkernels: %s, %d threads\n",
                      c->kda_heads, c->kda_dim, c->conv_w, c->full_rank_gate ? ", full-rank gate" : "",
                      c->has_lower_bound ? ", lower-bounded decay" : "", c->mla_heads, c->q_lora, c->kv_lora,
                      c->nope, c->rope, c->vdim, c->mla_out_gate ? ", output gate" : "", c->n_experts, c->topk,
                      c->n_shared, c->moe_inter, c->latent_dim ? " (latent)" : "", c->topk_group, c->n_group,
                      c->routed_scale, c->use_situ ? "SiTU-GLU" : "SwiGLU", c->attn_res_block, e->kern.k->isa,
                      e->kern.n_threads);
    df_param_counts pc;
    config_param_counts(c, &pc);
    char a[4][32];
    fmt_count(a[0], pc.spine + pc.experts);
    fmt_count(a[1], pc.spine);
    fmt_count(a[2], pc.experts);
    fmt_count(a[3], pc.spine + pc.per_expert * c->topk * pc.n_moe_layers);
    if (n < (int)cap)
        n += snprintf(buf + n, cap - n, "parameters: %s total = spine %s + routed experts %s (%lld per expert); "
                      "%s active per token\n", a[0], a[1], a[2], (long long)pc.per_expert, a[3]);
    if (n < (int)cap)
        n += snprintf(buf + n, cap - n, "working memory: %.1f MiB of scratch for passes of up to %d rows\n",
                      (double)e->model.sc.cap / (1 << 20), df_engine_pass_rows(e));
    if (n < (int)cap && e->model.ops != model_ops_cpu()) {
        gpu_backend_describe(&e->model, buf + n, cap - n);
        n += (int)strlen(buf + n);
    } else if (n < (int)cap) {
        n += snprintf(buf + n, cap - n, "gpu: not used (%s)\n", e->gpu_note[0] ? e->gpu_note : "off");
    }
    if (n < (int)cap) store_describe(e->store, buf + n, cap - n);
    n = (int)strlen(buf);
    if (e->ep && n < (int)cap)
        n += snprintf(buf + n, cap - n, "ranks: %d (expert parallel; rank plan: %s; spine %s)\n", ep_ranks(e->ep),
                      e->plan.from_file ? RANK_PLAN_FILE : "expert e on rank e mod N, read from the model folder",
                      e->plan.spine_rank ? "split by layers over the ranks" : "whole on rank 0");
    for (int r = 0; e->ep && r < ep_ranks(e->ep) && n < (int)cap; r++) {
        const ep_rank_info *in = ep_rank(e->ep, r);
        int first, count;
        rank_plan_spine_layers(&e->plan, r, &first, &count);
        char layers[48] = "";
        if (count) snprintf(layers, sizeof layers, " (layers %d-%d)", first, first + count - 1);
        n += snprintf(buf + n, cap - n, "  rank %d on %s: holds %lld routed experts (%lld also held elsewhere), "
                      "%d cache slots (%.1f MiB), spine %.1f MiB%s, reads %s\n", r, in->host, (long long)in->held,
                      (long long)in->computed, in->cache_slots, (double)in->cache_bytes / (1 << 20),
                      (double)in->spine_bytes / (1 << 20), layers, in->folder[0] ? in->folder : "the model folder's shards");
    }
    return DF_OK;
}

int df_engine_check(df_engine *e, df_error *err) { return model_check(&e->model, err); }

int df_session_init(df_session **out, df_engine *eng, df_error *err) {
    (void)err;
    df_session *s = xcalloc(1, sizeof *s);
    s->eng = eng;
    s->state = state_new(&eng->model);
    *out = s;
    return DF_OK;
}

void df_session_free(df_session *s) {
    if (!s) return;
    state_free(s->state);
    free(s->hist);
    free(s->last_logits);
    free(s);
}

static void session_forget(df_session *s) {
    state_reset(&s->eng->model, s->state);
    s->last_start = 0;
    s->last_valid = 0;
}

void session_hist_reserve(df_session *s, int64_t n) {
    if (n <= s->hist_cap) return;
    s->hist_cap = n * 2;
    s->hist = xrealloc(s->hist, (size_t)s->hist_cap * sizeof(int32_t));
}

static void session_record(df_session *s, int64_t pos0, const int32_t *tokens, int n, const float *logits,
                           int all_rows) {
    session_hist_reserve(s, pos0 + n);
    memcpy(s->hist + pos0, tokens, (size_t)n * sizeof(int32_t));
    s->last_start = pos0;
    int vocab = s->eng->info.vocab_size;
    s->last_valid = logits != NULL;
    if (logits) {
        if (!s->last_logits) s->last_logits = xmalloc((size_t)vocab * sizeof(float));
        memcpy(s->last_logits, logits + (all_rows ? (int64_t)(n - 1) * vocab : 0), (size_t)vocab * sizeof(float));
    }
}

/* After the pass that took s's snapshot: the snapshot session gets its history (or is reset if the pass
 * failed) and the snapshot is used up. */
static void session_snapshot_done(df_session *s, int rc) {
    df_session *into = s->snap_into;
    s->snap_into = NULL;
    if (rc) {
        session_forget(into);
        return;
    }
    session_record(into, 0, s->hist, (int)s->snap_pos, NULL, 0);
}

int df_session_snapshot_at(df_session *s, int64_t pos, df_session *into, df_error *err) {
    if (pos && (!into || into == s || into->eng != s->eng || pos <= s->state->pos)) {
        df_error_set(err, DF_EINVAL, "a snapshot needs another session of the same engine and a position after %lld",
                     (long long)s->state->pos);
        return DF_EINVAL;
    }
    s->snap_into = pos ? into : NULL;
    s->snap_pos = pos;
    return DF_OK;
}

typedef struct {
    df_session *s;
    const int32_t *tokens;
    int n, all_rows;
    float *logits;
} batch_entry;

/* One forward pass over the entries. A failed pass leaves each session as it was where the model could
 * put it back (an evaluation within the rollback record's rows) and resets the others, whose layers may
 * have consumed the tokens unevenly; a refused one (DF_EINVAL) changes nothing. */
static int batch_run(df_engine *eng, const batch_entry *e, int n, df_error *err) {
    int T = 0;
    for (int i = 0; i < n; i++) T += e[i].n;
    model_seg one, *seg = &one;
    const int32_t *tokens = e[0].tokens;
    if (n > 1) {                   /* several sessions: their rows concatenated, in buffers kept for the next pass */
        if (T > eng->pass_tokens_cap) {
            eng->pass_tokens_cap = DF_MAX(T, 2 * eng->pass_tokens_cap);
            eng->pass_tokens = xrealloc(eng->pass_tokens, (size_t)eng->pass_tokens_cap * sizeof(int32_t));
        }
        if (n > eng->pass_seg_cap) {
            eng->pass_seg_cap = DF_MAX(n, 2 * eng->pass_seg_cap);
            eng->pass_seg = xrealloc(eng->pass_seg, (size_t)eng->pass_seg_cap * sizeof *seg);
        }
        seg = eng->pass_seg;
        for (int i = 0, at = 0; i < n; at += e[i++].n)
            memcpy(eng->pass_tokens + at, e[i].tokens, (size_t)e[i].n * sizeof(int32_t));
        tokens = eng->pass_tokens;
    }
    for (int i = 0; i < n; i++) {
        df_session *s = e[i].s;
        int64_t pos = s->state->pos;
        int snap = s->snap_into && s->snap_pos > pos && s->snap_pos <= pos + e[i].n;
        seg[i] = (model_seg){s->state, e[i].n, e[i].logits, e[i].all_rows, 0, snap ? s->snap_into->state : NULL,
                             s->snap_pos};
    }
    int rc = model_forward_batch(&eng->model, seg, n, tokens, err);
    for (int i = 0; i < n; i++) {
        df_session *s = e[i].s;
        if (!rc) session_record(s, s->state->pos - e[i].n, e[i].tokens, e[i].n, e[i].logits, e[i].all_rows);
        else if (rc != DF_EINVAL && !seg[i].restored) session_forget(s);
        if (seg[i].snap) session_snapshot_done(s, rc);
    }
    if (!rc) eng->tokens_evaluated += (uint64_t)T;
    return rc;
}

int df_session_eval(df_session *s, const int32_t *tokens, int n, float *logits, int all_rows, df_error *err) {
    batch_entry e = {s, tokens, n, all_rows, logits};
    return batch_run(s->eng, &e, 1, err);
}

const int32_t *df_session_tokens(const df_session *s, int64_t *n) {
    *n = s->state->pos;
    return s->hist;
}

/* Evaluates ids[0..n) on top of the current state in bounded chunks; the last chunk's logits go to logits. */
static int session_feed(df_session *s, const int32_t *ids, int64_t n, float *logits, df_error *err) {
    int rc = DF_OK, chunk = df_engine_pass_rows(s->eng);
    for (int64_t at = 0; !rc && at < n; at += chunk) {
        int c = n - at < chunk ? (int)(n - at) : chunk;
        rc = df_session_eval(s, ids + at, c, at + c == n ? logits : NULL, 0, err);
    }
    return rc;
}

int df_session_truncate(df_session *s, int64_t pos, df_error *err) {
    int64_t cur = s->state->pos;
    if (pos == cur) return DF_OK;
    if (pos < s->last_start || pos > cur) {
        df_error_set(err, DF_EINVAL, "cannot return to position %lld: the session can go back to %lld..%lld",
                     (long long)pos, (long long)s->last_start, (long long)cur);
        return DF_EINVAL;
    }
    s->last_valid = 0;
    if (state_rewind(&s->eng->model, s->state, pos) == 0) {
        s->eng->rollback_replays++;
        return DF_OK;
    }
    /* No record of the last evaluation (one row, or more than the session keeps a record for): rebuilt from
     * the history, reading the weights again. */
    s->eng->rollback_reevals++;
    int32_t *keep = xmalloc((size_t)(pos ? pos : 1) * sizeof(int32_t));
    memcpy(keep, s->hist, (size_t)pos * sizeof(int32_t));
    session_forget(s);
    int rc = session_feed(s, keep, pos, NULL, err);
    free(keep);
    return rc;
}

void df_session_set_rollback_rows(df_session *s, int rows) { state_set_record_rows(s->state, rows); }

uint64_t df_session_memory(const df_session *s) {
    return state_bytes(&s->eng->model, s->state) + (uint64_t)s->hist_cap * sizeof(int32_t) +
           (s->last_logits ? (uint64_t)s->eng->info.vocab_size * sizeof(float) : 0);
}

int df_session_sync(df_session *s, const int32_t *ids, int64_t n, float *logits, int64_t *reused, df_error *err) {
    if (reused) *reused = 0;
    if (n <= 0) {
        df_error_set(err, DF_EINVAL, "no tokens to evaluate");
        return DF_EINVAL;
    }
    int64_t have = s->state->pos, p = 0;
    while (p < have && p < n && s->hist[p] == ids[p]) p++;
    if (p == n && have == n && s->last_valid) {
        if (logits) memcpy(logits, s->last_logits, (size_t)s->eng->info.vocab_size * sizeof(float));
        if (reused) *reused = n;
        return DF_OK;
    }
    if (p == n) p = n - 1;                 /* the last token is evaluated again for its logits */
    int rc = DF_OK;
    if (p < have) {
        if (p >= s->last_start) rc = df_session_truncate(s, p, err);
        else {
            session_forget(s);
            p = 0;
        }
    }
    if (!rc) rc = session_feed(s, ids + p, n - p, logits, err);
    if (!rc && reused) *reused = p;
    return rc;
}

int64_t df_session_pos(const df_session *s) { return s->state->pos; }

int df_engine_pass_rows(const df_engine *e) { return e->pass_rows; }

uint64_t df_session_state_bytes(const df_engine *e, int64_t n_tokens, int rollback_rows) {
    return state_bytes_for(&e->model.cfg, n_tokens, rollback_rows);
}

int df_session_copy(df_session *dst, const df_session *src, df_error *err) {
    if (dst->eng != src->eng) {
        df_error_set(err, DF_EINVAL, "sessions belong to different engines");
        return DF_EINVAL;
    }
    state_copy(&src->eng->model, dst->state, src->state);
    int64_t n = src->state->pos;
    session_hist_reserve(dst, n ? n : 1);
    if (n) memcpy(dst->hist, src->hist, (size_t)n * sizeof(int32_t));
    dst->last_start = src->last_start;
    dst->last_valid = src->last_valid;
    if (src->last_valid) {
        size_t bytes = (size_t)src->eng->info.vocab_size * sizeof(float);
        if (!dst->last_logits) dst->last_logits = xmalloc(bytes);
        memcpy(dst->last_logits, src->last_logits, bytes);
    }
    return DF_OK;
}

void df_session_reset(df_session *s) {
    session_forget(s);
    s->snap_into = NULL;
}

/* ---- batches: one forward pass over every entry ---------------------------------------------------- */

struct df_batch {
    df_engine *eng;
    batch_entry *e;
    int n, cap;
};

int df_batch_init(df_batch **out, df_engine *eng, df_error *err) {
    (void)err;
    df_batch *b = xcalloc(1, sizeof *b);
    b->eng = eng;
    *out = b;
    return DF_OK;
}

void df_batch_free(df_batch *b) {
    if (!b) return;
    free(b->e);
    free(b);
}

void df_batch_clear(df_batch *b) { b->n = 0; }

int df_batch_add(df_batch *b, df_session *s, const int32_t *tokens, int n, float *logits, int all_rows,
                 df_error *err) {
    if (s->eng != b->eng || n <= 0) {
        df_error_set(err, DF_EINVAL, n <= 0 ? "no tokens to evaluate" : "session belongs to another engine");
        return DF_EINVAL;
    }
    for (int i = 0; i < b->n; i++)
        if (b->e[i].s == s) {
            df_error_set(err, DF_EINVAL, "a session appears twice in one batch");
            return DF_EINVAL;
        }
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 8;
        b->e = xrealloc(b->e, (size_t)b->cap * sizeof *b->e);
    }
    b->e[b->n++] = (batch_entry){s, tokens, n, all_rows, logits};
    return DF_OK;
}

int df_batch_eval(df_batch *b, df_error *err) {
    if (!b->n) {
        df_error_set(err, DF_EINVAL, "the batch is empty");
        return DF_EINVAL;
    }
    return batch_run(b->eng, b->e, b->n, err);
}

void df_session_set_step_callback(df_session *s, df_step_fn fn, void *ctx) {
    s->state->step = fn;
    s->state->step_ctx = ctx;
}

void df_engine_stats(const df_engine *e, df_stats *out) {
    memset(out, 0, sizeof *out);
    out->tokens_evaluated = e->tokens_evaluated;
    out->rollback_replays = e->rollback_replays;
    out->rollback_reevals = e->rollback_reevals;
    store_stats ss;
    store_get_stats(e->store, &ss);
    out->expert_hits = ss.expert_hits;
    out->expert_misses = ss.expert_misses;
    out->expert_disk_bytes = ss.expert_disk_bytes;
    out->spine_disk_bytes = ss.spine_disk_bytes;
    out->disk_bytes = ss.expert_disk_bytes + ss.spine_disk_bytes;
    out->net_bytes = ss.net_bytes;
    out->expert_loads = ss.expert_loads;
    out->expert_requests = ss.expert_requests;
    out->mem_budget = ss.mem_budget;
    out->cache_bytes = ss.cache_bytes;
    out->resident_spine_bytes = ss.resident_spine_bytes;
    out->stream_buffer_bytes = ss.stream_buffer_bytes;
    out->expert_bytes = ss.expert_bytes;
    out->cache_slots = ss.cache_slots;
    out->streamed_layers = ss.streamed_layers;
    out->direct_fallbacks = ss.direct_fallbacks;
    out->io_uring = ss.io_uring;
    out->lookahead_loads = ss.lookahead_loads;
    out->lookahead_requests = ss.lookahead_requests;
    out->lookahead_recalled = ss.lookahead_recalled;
    out->warm_loads = ss.warm_loads;
    out->io_busy_s = ss.io_busy_s;
    out->head_tiles = ss.head_tiles;
    out->split_layers = ss.split_layers;
}

void df_engine_lookahead_layer(const df_engine *e, int layer, df_layer_lookahead *out) {
    store_lookahead_layer(e->store, layer, out);
}
void df_engine_warm_wait(df_engine *e) { store_warm_wait(e->store); }
void df_engine_populate_wait(df_engine *e) { store_populate_wait(e->store); }

const char *df_engine_heat_note(const df_engine *e) { return store_heat_note(e->store); }

void df_engine_profile(const df_engine *e, df_profile *out) {
    *out = e->model.prof;
    out->spine_compute = out->total - out->spine_read - out->expert_read - out->attention - out->expert_compute -
                         out->lm_head - out->spine_remote;
    if (out->spine_compute < 0) out->spine_compute = 0;
}

void df_engine_profile_reset(df_engine *e) { memset(&e->model.prof, 0, sizeof e->model.prof); }

const char *df_engine_backend(const df_engine *e) { return e->model.ops->name; }
double df_engine_gpu_read_gbps(df_engine *e) { return gpu_backend_read_gbps(&e->model); }
uint64_t df_engine_decode_weight_bytes(const df_engine *e) { return gpu_backend_decode_bytes(&e->model); }
