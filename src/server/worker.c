/* worker.c — the FIFO queue and the generation worker. Only this thread touches the sessions. It keeps
 * `parallel` conversation slots, each a session that owns its token history; a request is admitted into a
 * free slot when it reaches the head of the queue (the slot already holding the longest prefix of its
 * prompt, which is then reused) and when its state fits the slot memory. Every step is one df_batch pass:
 * one row per decoding slot, and the prompts of newly admitted requests in slices as large as the pass
 * allows, so a new request starts at the next pass and nobody waits for another's whole answer. A prompt's
 * slices stop where its prompt-cache prefix ends, so that state can be saved on the way. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include "common/util.h"
#include "server/prompt_cache.h"
#include "server/srv_internal.h"
#include "server/tools.h"

srv_job *job_new(srv *s) {
    srv_job *j = xcalloc(1, sizeof *j);
    j->refs = 1;
    atomic_init(&j->cancel, 0);
    atomic_init(&j->prefilled, -1);
    j->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    DF_ASSERT(j->wake_fd >= 0);
    pthread_mutex_lock(&s->mu);
    uint64_t n = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    snprintf(j->id, sizeof j->id, "%llx%06llx", (unsigned long long)s->started, (unsigned long long)n);
    j->created = (long long)time(NULL);
    j->n_choices = 1;
    return j;
}

static void job_free(srv_job *j) {
    if (j->wire && j->wire->free_ctx) j->wire->free_ctx(j->wire_ctx);
    tools_job_free(j);
    srv_request_free(&j->req);
    tok_ids_free(&j->prompt);
    close(j->wake_fd);
    text_buf_free(&j->sse);
    for (int i = 0; j->choices && i < j->n_choices; i++) {
        text_buf_free(&j->choices[i].content);
        text_buf_free(&j->choices[i].reasoning);
        json_decref((json_t *)j->choices[i].logprobs);
    }
    free(j->choices);
    free(j);
}

static void job_unref_locked(srv_job *j) {
    if (--j->refs == 0) job_free(j);
}

void job_release(srv *s, srv_job *j) {
    pthread_mutex_lock(&s->mu);
    job_unref_locked(j);
    pthread_mutex_unlock(&s->mu);
}

void job_wake(srv_job *j) {
    uint64_t one = 1;
    ssize_t w = write(j->wake_fd, &one, sizeof one);
    (void)w;   /* a full counter already means "news" */
}

static int slots_free_locked(const srv *s) {
    int n = 0;
    for (int i = 0; i < s->n_slots; i++) n += s->slots[i].job == NULL;
    return n;
}

int job_enqueue(srv *s, srv_job *j, srv_err *err) {
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        srv_err_set(err, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
        return -1;
    }
    /* the queue holds those that cannot have a slot now: with --queue 0, a request is taken only when
     * enough slots are free for it and for everyone queued before it */
    int waiting = s->q_slots + j->n_choices - slots_free_locked(s);
    if (waiting > s->o.queue) {
        pthread_mutex_unlock(&s->mu);
        if (s->o.queue == 0)
            srv_err_set(err, 429, "rate_limit_error", "server_busy", NULL,
                        "The server is busy: all %d slots are in use and it runs with --queue 0. Retry later.",
                        s->n_slots);
        else
            srv_err_set(err, 429, "rate_limit_error", "server_busy", NULL,
                        "The server is busy: %d requests are already waiting. Retry later.", s->o.queue);
        return -1;
    }
    j->refs++;
    j->next = NULL;
    j->t_queued = df_now();
    if (s->q_tail) s->q_tail->next = j;
    else s->q_head = j;
    s->q_tail = j;
    s->n_queued++;
    s->q_slots += j->n_choices;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* Marks j finished and tells its connection (srv.mu held). */
static void job_finish_locked(srv_job *j) {
    j->done = 1;
    job_wake(j);
}

void job_cancel(srv *s, srv_job *j) {
    atomic_store(&j->cancel, 1);
    pthread_mutex_lock(&s->mu);
    srv_job **pp = &s->q_head, *prev = NULL;
    while (*pp && *pp != j) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (*pp) {   /* still queued: drop it now */
        *pp = j->next;
        if (s->q_tail == j) s->q_tail = prev;
        s->n_queued--;
        s->q_slots -= j->n_choices;
        j->failed = 1;
        job_finish_locked(j);
        job_unref_locked(j);
    } else {
        pthread_cond_signal(&s->cv_work);   /* a running one: the worker frees its slot before the next pass */
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- slots and their memory ---- */

uint64_t slot_bytes(const srv *s, int64_t tokens) {
    if (!s->spec) return df_session_state_bytes(s->eng, tokens, 0);
    /* speculation: the rollback record of a verify pass, its rows of logits and the draft model's sessions */
    int rows = spec_draft_max(s->spec) + 1;
    return df_session_state_bytes(s->eng, tokens, rows) + (uint64_t)rows * s->info->vocab_size * sizeof(float) +
           spec_state_bytes(s->spec, tokens);
}

static uint64_t slots_reserved(const srv *s) {
    uint64_t sum = 0;
    for (int i = 0; i < s->n_slots; i++) sum += s->slots[i].reserved;
    return sum;
}

/* Replaces *sess with a fresh session, which holds only the fixed part of a state; 0 if none could be made
 * (*sess is kept). */
static int session_renew(srv *s, df_session **sess) {
    df_session *fresh = NULL;
    df_error e = {0};
    if (df_session_init(&fresh, s->eng, &e)) return 0;
    df_session_free(*sess);
    *sess = fresh;
    return 1;
}

/* Gives an idle slot's memory back. */
static void slot_drop_state(srv *s, srv_slot *sl) {
    if (!session_renew(s, &sl->sess)) return;
    sl->cap_tokens = 0;
    sl->reserved = slot_bytes(s, 0);
}

static int64_t common_prefix(const df_session *sess, const tok_ids *p) {
    int64_t have;
    const int32_t *h = df_session_tokens(sess, &have);
    int64_t i = 0;
    while (i < have && i < (int64_t)p->n && h[i] == p->v[i]) i++;
    return i;
}

/* Moves the queue's head into free slots while it fits (srv.mu held). */
static void admit_locked(srv *s) {
    while (s->q_head) {
        srv_job *j = s->q_head;
        int nfree = slots_free_locked(s);
        if (nfree < j->n_choices) break;
        /* the answer's first slot: the free one holding the longest prefix of the prompt (then the least
         * recently used); the others get a copy of it after the prefill */
        int pick[SRV_MAX_CHOICES], np = 0;
        int best = -1;
        int64_t best_len = -1;
        for (int i = 0; i < s->n_slots; i++) {
            srv_slot *sl = &s->slots[i];
            if (sl->job) continue;
            int64_t c = common_prefix(sl->sess, &j->prompt);
            if (c > best_len || (c == best_len && sl->last_used < s->slots[best].last_used)) {
                best = i;
                best_len = c;
            }
        }
        pick[np++] = best;
        while (np < j->n_choices) {
            int lru = -1;
            for (int i = 0; i < s->n_slots; i++) {
                int taken = 0;
                for (int k = 0; k < np; k++) taken |= pick[k] == i;
                if (!s->slots[i].job && !taken && (lru < 0 || s->slots[i].last_used < s->slots[lru].last_used))
                    lru = i;
            }
            pick[np++] = lru;
        }
        /* memory: the chosen slots at their new size, everyone else as they are; idle slots give theirs
         * back (oldest first) when that is what it takes */
        uint64_t want = 0, keep = 0;
        for (int k = 0; k < np; k++) {
            srv_slot *sl = &s->slots[pick[k]];
            want += slot_bytes(s, DF_MAX(sl->cap_tokens, (int64_t)j->prompt.n + j->max_tokens));
            keep += sl->reserved;
        }
        uint64_t others = slots_reserved(s) - keep;
        while (others + want > s->slot_mem) {
            srv_slot *victim = NULL;
            for (int i = 0; i < s->n_slots; i++) {
                srv_slot *sl = &s->slots[i];
                int taken = 0;
                for (int k = 0; k < np; k++) taken |= pick[k] == i;
                if (!sl->job && !taken && sl->cap_tokens > 0 && (!victim || sl->last_used < victim->last_used))
                    victim = sl;
            }
            if (!victim) break;
            others -= victim->reserved;
            slot_drop_state(s, victim);
            others += victim->reserved;
        }
        if (others + want > s->slot_mem) {   /* the chosen slots give up what they hold beyond this request */
            want = 0;
            for (int k = 0; k < np; k++) {
                srv_slot *sl = &s->slots[pick[k]];
                if (sl->cap_tokens > (int64_t)j->prompt.n + j->max_tokens && !s->n_running) slot_drop_state(s, sl);
                want += slot_bytes(s, DF_MAX(sl->cap_tokens, (int64_t)j->prompt.n + j->max_tokens));
            }
        }
        if (others + want > s->slot_mem && s->n_running > 0) {   /* waits for running ones to end */
            if (!j->waited_for_memory) {
                pthread_mutex_lock(&s->m.mu);
                s->m.requests_waited_for_memory++;
                pthread_mutex_unlock(&s->m.mu);
            }
            j->waited_for_memory = 1;
            break;
        }
        s->q_head = j->next;
        if (!s->q_head) s->q_tail = NULL;
        s->n_queued--;
        s->q_slots -= j->n_choices;
        j->next = NULL;
        j->n_open = j->n_choices;
        for (int k = 0; k < np; k++) {
            srv_slot *sl = &s->slots[pick[k]];
            sl->job = j;
            sl->choice = k;
            sl->phase = k == 0 ? SLOT_SYNC : SLOT_WAIT_COPY;
            sl->seq = ++s->next_seq;
            sl->cap_tokens = DF_MAX(sl->cap_tokens, (int64_t)j->prompt.n + j->max_tokens);
            sl->reserved = slot_bytes(s, sl->cap_tokens);
            memset(&sl->res, 0, sizeof sl->res);
        }
        s->n_running++;
    }
}

/* ---- generation events ---- */

typedef struct event_ctx {
    srv *s;
    srv_slot *sl;
} event_ctx;

static int on_event(void *ctx, const gen_event *ev) {
    event_ctx *w = ctx;
    srv_job *j = w->sl->job;
    int c = w->sl->choice;
    j->choices[c].n_gen++;
    if (ev->final) j->choices[c].finish = ev->finish;
    if (j->wire) {   /* n is 1: the job keeps the text, the wire writes its own events */
        respond_accumulate(w->s, j, c, ev);
        pthread_mutex_lock(&w->s->mu);
        j->wire->event(w->s, j, ev, j->req.stream && !j->wire_ended ? &j->sse : NULL);
        pthread_mutex_unlock(&w->s->mu);
        if (j->req.stream) job_wake(j);
    } else if (j->req.stream) {
        text_buf chunk = {0};
        tools_sse_deltas(w->s, j, ev->final, &chunk);   /* tools and n > 1 do not go together */
        respond_sse_event(w->s, j, c, ev, &chunk);
        pthread_mutex_lock(&w->s->mu);
        text_buf_append(&j->sse, chunk.p, chunk.len);
        pthread_mutex_unlock(&w->s->mu);
        job_wake(j);
        text_buf_free(&chunk);
    } else {
        respond_accumulate(w->s, j, c, ev);
    }
    return atomic_load(&j->cancel);
}

static void snapshot_stats(srv *s) {
    df_stats st;
    df_engine_stats(s->eng, &st);
    pthread_mutex_lock(&s->m.mu);
    s->m.engine = st;
    pthread_mutex_unlock(&s->m.mu);
}

/* A slot's answer is over (finished, cancelled or failed): count it, free the slot, and finish the job
 * when it was its last open answer. */
static void slot_release(srv *s, srv_slot *sl, int rc, const df_error *err) {
    srv_job *j = sl->job;
    double now = df_now();
    pthread_mutex_lock(&s->m.mu);
    s->m.generated_tokens += sl->res.ids.n;
    s->m.decode_passes += (uint64_t)sl->res.passes;
    s->m.drafted += (uint64_t)sl->res.drafted;
    s->m.accepted += (uint64_t)sl->res.accepted;
    if (sl->choice == 0 && j->t_first > 0) {
        s->m.decode_s += now - j->t_first;
        if (sl->res.ids.n > 1) s->m.last_s_per_token = (now - j->t_first) / (double)(sl->res.ids.n - 1);
    }
    pthread_mutex_unlock(&s->m.mu);
    gen_state_free(sl->gen);
    sl->gen = NULL;
    tok_ids_free(&sl->res.ids);
    int64_t pos = df_session_pos(sl->sess);
    sl->cap_tokens = DF_MAX(sl->cap_tokens, pos);
    sl->reserved = slot_bytes(s, sl->cap_tokens);
    sl->last_used = now;
    sl->phase = SLOT_IDLE;
    pthread_mutex_lock(&s->mu);
    sl->job = NULL;
    j->drafted += sl->res.drafted;
    j->accepted += sl->res.accepted;
    if (rc == DF_ECANCELLED || atomic_load(&j->cancel)) j->failed = 1;
    else if (rc) {
        if (!j->failed) {
            j->failed = 1;
            srv_err_set(&j->err, 500, "server_error", "generation_failed", NULL, "Generation failed: %s",
                        err ? err->msg : "unknown error");
            if (j->req.stream && j->wire) {
                if (!j->wire_ended) j->wire->fail(s, j, &j->err, &j->sse);
                j->wire_ended = 1;
            } else if (j->req.stream) {
                text_buf b = {0};
                srv_err_json(&j->err, &b);
                text_buf_printf(&j->sse, "data: %s\n\ndata: [DONE]\n\n", b.p);
                text_buf_free(&b);
            }
        }
    }
    if (--j->n_open == 0) {
        j->t_done = now;
        if (j->req.stream && !j->failed && j->wire) {
            if (!j->wire_ended) j->wire->end(s, j, &j->sse);
            j->wire_ended = 1;
        } else if (j->req.stream && !j->failed) {
            text_buf end = {0};
            respond_sse_end(s, j, &end);
            text_buf_append(&j->sse, end.p, end.len);
            text_buf_free(&end);
        }
        if (j->failed && atomic_load(&j->cancel)) {
            pthread_mutex_lock(&s->m.mu);
            s->m.requests_cancelled++;
            pthread_mutex_unlock(&s->m.mu);
        }
        s->n_running--;
        job_finish_locked(j);
        job_unref_locked(j);
    } else {
        job_wake(j);
    }
    pthread_mutex_unlock(&s->mu);
}

/* The first token of a choice, from the logits after the prompt. */
static void slot_start_decode(srv *s, srv_slot *sl) {
    srv_job *j = sl->job;
    gen_config cfg = {.tok = s->tok, .chat = j->chat, .fmt = s->fmt, .in_reasoning = j->in_reasoning,
                      .max_tokens = j->max_tokens, .eos_id = s->info->eos_id,
                      .stop = (const char *const *)j->req.stop, .n_stop = j->req.n_stop, .sp = j->req.sp};
    cfg.sp.seed += (uint64_t)sl->choice;   /* n > 1: different samples from one seed */
    tools_gen_config(s, j, &cfg);
    /* a constrained answer's rows are sampled under the constraint one by one: nothing to gain from drafts */
    sl->drafting = sl->spec && !cfg.mask;
    sl->gen = gen_state_new(&cfg, s->info->vocab_size);
    sl->phase = SLOT_DECODE;
}

static void slot_end(srv *s, srv_slot *sl) {
    if (sl->res.finish == GEN_FINISH_ERROR) {   /* the message outlives the generation state it is in */
        df_error e = {0};
        df_error_set(&e, DF_EINVAL, "%s", gen_state_error(sl->gen));
        slot_release(s, sl, DF_EINVAL, &e);
        return;
    }
    slot_release(s, sl, sl->res.finish == GEN_FINISH_CANCELLED ? DF_ECANCELLED : DF_OK, NULL);
}

/* The first token of an answer, from the logits after its prompt; releases the slot when that ends it. */
static void slot_first_token(srv *s, srv_slot *sl) {
    event_ctx w = {s, sl};
    if (gen_step(sl->gen, sl->logits, on_event, &w, &sl->in[0], &sl->res)) slot_end(s, sl);
}

/* Adds a decoding slot's rows to the pass: its last token, and the drafts its speculation proposes when
 * they pay with the rows already in the pass and the others still to come (one per decoding slot). */
static int slot_add_decode(srv *s, srv_slot *sl, int rows, int later, df_error *err) {
    int k = 0;
    if (sl->drafting) {
        spec_set_shared_rows(sl->spec, rows + later);
        k = spec_propose(sl->spec, sl->sess, sl->in[0], sl->job->max_tokens - (int)sl->res.ids.n, sl->in + 1, err);
        if (k < 0) return k;
    }
    sl->n_draft = k;
    sl->pass_pos = df_session_pos(sl->sess);
    return df_batch_add(s->batch, sl->sess, sl->in, k + 1, k ? sl->rows : sl->logits, k > 0, err);
}

/* After the pass: the slot's rows verified and emitted token by token, the session cut back to what was
 * kept, and the outcome shown to the cost model (eval_s < 0: a prompt slice shared the pass). */
static void slot_verify(srv *s, srv_slot *sl, int pass_rows, double eval_s) {
    event_ctx w = {s, sl};
    int k = sl->n_draft, keep, accepted;
    int end = gen_step_rows(sl->gen, k ? sl->rows : sl->logits, sl->in + 1, k, on_event, &w, &sl->in[0], &keep,
                            &accepted, &sl->res);
    double rollback = -1;
    df_error err = {0};
    int rc = DF_OK;
    if (keep < k + 1) {
        double t0 = df_now();
        rc = df_session_truncate(sl->sess, sl->pass_pos + keep, &err);
        rollback = df_now() - t0;
    }
    if (sl->spec) {
        spec_set_shared_rows(sl->spec, pass_rows - (k + 1));
        spec_observe(sl->spec, k + 1, accepted, eval_s, rollback);
    }
    if (rc) slot_release(s, sl, rc, &err);
    else if (end) slot_end(s, sl);
}

/* Brings a newly admitted slot's session to the longest prefix it can reuse (or restore from the prompt
 * cache); the rest of the prompt is prefilled by the passes. */
static void slot_sync(srv *s, srv_slot *sl) {
    srv_job *j = sl->job;
    int64_t n = (int64_t)j->prompt.n, p = common_prefix(sl->sess, &j->prompt);
    if (p == n) p = n - 1;   /* the last prompt token is evaluated again for its logits */
    df_error e = {0};
    if (p < df_session_pos(sl->sess) && df_session_truncate(sl->sess, p, &e)) {
        df_session_reset(sl->sess);
        p = 0;
    }
    if (s->pcache && p < n - 1) {
        int64_t got = pcache_restore(s->pcache, sl->sess, j->prompt.v, n - 1, p);
        if (got > p) {
            j->cache_restored = (int)got;
            p = got;
        }
    }
    j->n_reused = (int)p;
    sl->at = p;
    atomic_store(&j->prefilled, (long long)p);
    sl->save_at = s->pcache && pcache_active(s->pcache) && j->cache_at > p ? j->cache_at : 0;
    sl->phase = SLOT_PREFILL;
}

/* A pass of one slot, after each layer: a prompt slice's progress for the stream's keepalives, and a cancel. */
static int worker_step_cb(void *ctx, int layer, int n_layers) {
    srv_slot *sl = ctx;
    if (sl->phase == SLOT_PREFILL && n_layers > 0)
        atomic_store(&sl->job->prefilled, (long long)(sl->at + (int64_t)sl->last_rows * layer / n_layers));
    return atomic_load(&sl->job->cancel);
}

/* One forward pass over every running slot. */
static void worker_pass(srv *s) {
    df_batch_clear(s->batch);
    int rows = 0, entries = 0;
    srv_slot *only = NULL;
    df_error err = {0};
    /* cancelled answers leave first; new ones find their prefix */
    for (int i = 0; i < s->n_slots; i++) {
        srv_slot *sl = &s->slots[i];
        sl->last_rows = 0;
        if (!sl->job) continue;
        if (atomic_load(&sl->job->cancel)) {
            slot_release(s, sl, DF_ECANCELLED, NULL);
            continue;
        }
        if (sl->phase == SLOT_SYNC) slot_sync(s, sl);
    }
    int decoding = 0;
    for (int i = 0; i < s->n_slots; i++) decoding += s->slots[i].job && s->slots[i].phase == SLOT_DECODE;
    for (int i = 0; i < s->n_slots; i++) {
        srv_slot *sl = &s->slots[i];
        if (!sl->job || sl->phase != SLOT_DECODE) continue;
        int rc = slot_add_decode(s, sl, rows, --decoding, &err);
        if (rc) {
            slot_release(s, sl, rc, &err);
            continue;
        }
        sl->last_rows = sl->n_draft + 1;
        rows += sl->last_rows;
        entries++;
        only = sl;
    }
    int decode_rows = rows;
    srv_slot *snap_slot = NULL;
    /* prompts in admission order, each as large a slice as the pass has room for */
    for (;;) {
        srv_slot *next = NULL;
        for (int i = 0; i < s->n_slots; i++) {
            srv_slot *sl = &s->slots[i];
            if (sl->job && sl->phase == SLOT_PREFILL && !sl->last_rows && (!next || sl->seq < next->seq)) next = sl;
        }
        int room = s->pass_rows - rows;
        if (!next || (room <= 0 && entries > 0)) break;
        if (room <= 0) room = 1;
        int64_t left = (int64_t)next->job->prompt.n - next->at;
        int n = (int)DF_MIN((int64_t)room, left);
        /* the prompt cache's prefix ends inside this slice: taken as a snapshot in the same pass if its state
         * fits the slot memory beside the slots', else the slice stops there */
        int inside = next->save_at > next->at && next->save_at < next->at + n, snap = 0;
        if (inside && !snap_slot)
            snap = slots_reserved(s) + df_session_state_bytes(s->eng, next->save_at, 0) <= s->slot_mem;
        if (inside && !snap) n = (int)(next->save_at - next->at);
        if (df_batch_add(s->batch, next->sess, next->job->prompt.v + next->at, n, n == left ? next->logits : NULL,
                         0, &err)) {
            slot_release(s, next, DF_EINVAL, &err);
            continue;
        }
        if (snap && !df_session_snapshot_at(next->sess, next->save_at, s->snap, &err)) snap_slot = next;
        next->last_rows = n;
        rows += n;
        entries++;
        only = next;
    }
    if (!entries) return;
    if (entries == 1) df_session_set_step_callback(only->sess, worker_step_cb, only);
    double t0 = df_now();
    int rc = df_batch_eval(s->batch, &err);
    if (entries == 1) df_session_set_step_callback(only->sess, NULL, NULL);
    double dt = df_now() - t0;
    snapshot_stats(s);
    if (rows > decode_rows) {
        pthread_mutex_lock(&s->m.mu);
        s->m.prefill_passes++;
        pthread_mutex_unlock(&s->m.mu);
    }
    for (int i = 0; i < s->n_slots; i++) {
        srv_slot *sl = &s->slots[i];
        if (!sl->job || !sl->last_rows) continue;
        if (rc) {   /* every session of a failed pass is reset; their answers fail */
            df_session_reset(sl->sess);
            slot_release(s, sl, rc, &err);
            continue;
        }
        if (sl->phase == SLOT_DECODE) {
            slot_verify(s, sl, rows, rows == decode_rows ? dt : -1);
            continue;
        }
        srv_job *j = sl->job;
        sl->at += sl->last_rows;
        atomic_store(&j->prefilled, (long long)sl->at);
        pthread_mutex_lock(&s->m.mu);
        s->m.prefill_s += dt * sl->last_rows / rows;
        pthread_mutex_unlock(&s->m.mu);
        if (sl->save_at && sl->at >= sl->save_at) {
            int saved = sl->at == sl->save_at ? pcache_save(s->pcache, sl->sess, j->prompt.v, sl->at)
                        : sl == snap_slot && pcache_save(s->pcache, s->snap, j->prompt.v, sl->save_at);
            sl->save_at = 0;
            if (saved) {
                pthread_mutex_lock(&s->m.mu);
                s->m.prompt_cache_saved++;
                pthread_mutex_unlock(&s->m.mu);
            }
        }
        if (sl->at < (int64_t)j->prompt.n) continue;
        /* the prompt is in: remember it, hand copies to the other answers, and sample everyone's first token */
        j->t_first = df_now();
        pthread_mutex_lock(&s->m.mu);
        s->m.prompt_tokens += j->prompt.n - (size_t)j->n_reused;
        s->m.prompt_tokens_reused += (uint64_t)j->n_reused;
        s->m.last_ttft_s = j->t_first - j->t_queued;
        if (j->cache_restored) s->m.prompt_cache_restored++;
        pthread_mutex_unlock(&s->m.mu);
        for (int k = 0; k < s->n_slots; k++) {
            srv_slot *o = &s->slots[k];
            if (o->job != j || o->phase != SLOT_WAIT_COPY) continue;
            df_error ce = {0};
            if (df_session_copy(o->sess, sl->sess, &ce)) {
                slot_release(s, o, ce.code ? ce.code : DF_EIO, &ce);
                continue;
            }
            memcpy(o->logits, sl->logits, (size_t)s->info->vocab_size * sizeof(float));
            slot_start_decode(s, o);
            slot_first_token(s, o);
        }
        slot_start_decode(s, sl);
        slot_first_token(s, sl);
    }
    if (snap_slot) session_renew(s, &s->snap);   /* it held the prefix only until it was saved */
}

void *worker_main(void *arg) {
    srv *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stopping && !s->n_running && !s->q_head) pthread_cond_wait(&s->cv_work, &s->mu);
        if (s->stopping) break;
        admit_locked(s);
        pthread_mutex_unlock(&s->mu);
        worker_pass(s);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    /* shutting down: running answers stop, whatever still waits is answered as failed */
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].job) {
            atomic_store(&s->slots[i].job->cancel, 1);
            slot_release(s, &s->slots[i], DF_ECANCELLED, NULL);
        }
    pthread_mutex_lock(&s->mu);
    while (s->q_head) {
        srv_job *j = s->q_head;
        s->q_head = j->next;
        s->n_queued--;
        s->q_slots -= j->n_choices;
        j->failed = 1;
        srv_err_set(&j->err, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
        job_finish_locked(j);
        job_unref_locked(j);
    }
    s->q_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}
