/* session_file.c — a session's state on disk, for prompt caches that outlive the process: the token
 * history, the last logits, and every layer's state (KDA recurrent + conv state, MLA latent cache). The
 * file is written atomically and checked entirely (model fingerprint, sizes, checksum) before any of it
 * replaces a session's state.
 *
 * Layout (host byte order; the order marker rejects a file from a machine of the other order):
 *   header  magic "DFSESSN\0", u32 version, u32 order marker 0x01020304, u64 model fingerprint,
 *           i64 pos, u32 vocab, u32 flags (bit 0: last logits present), u64 payload bytes, u64 checksum
 *   payload i32 tokens[pos], f32 logits[vocab] if flagged, the state blob of the model (state_blob_size)
 * The checksum is FNV-1a 64 over the header (checksum field zero) and the payload. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/engine_internal.h"
#include "common/util.h"

#define SESSION_FILE_VERSION 1u
#define SESSION_FILE_ORDER 0x01020304u

static const char session_magic[8] = {'D', 'F', 'S', 'E', 'S', 'S', 'N', 0};

typedef struct {
    char magic[8];
    uint32_t version, order;
    uint64_t fingerprint;
    int64_t pos;
    uint32_t vocab, flags;
    uint64_t payload, checksum;
} session_header;

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

#define FNV_SEED 14695981039346656037ull

/* The model's configuration text, the shapes the state depends on, and what computed the numbers: the
 * weights (and spine kind) the store reads, the kernels' ISA (rounding differs between them), and A_log's
 * reading. A state from other weights would restore without complaint and answer silently wrong. */
static uint64_t model_fingerprint(const df_engine *e) {
    const df_config *c = &e->model.cfg;
    const char *text = store_config_text(e->store);
    uint64_t h = fnv1a(FNV_SEED, text ? text : "", text ? strlen(text) : 0);
    int64_t shape[] = {c->is_k3, c->n_layers, c->d, c->vocab, c->kda_heads, c->kda_dim, c->conv_w, c->kv_lora,
                       c->rope, (int64_t)state_blob_size(&e->model, 1), e->model.alog_per_channel};
    h = fnv1a(h, shape, sizeof shape);
    for (int i = 0; i < c->n_layers; i++) h = fnv1a(h, &c->mixer[i], sizeof c->mixer[i]);
    uint64_t weights = store_weights_id(e->store);
    h = fnv1a(h, &weights, sizeof weights);
    const char *isa = e->kern.k ? e->kern.k->isa : "";
    return fnv1a(h, isa, strlen(isa));
}

uint64_t df_engine_fingerprint(const df_engine *e) { return model_fingerprint(e); }

static uint64_t payload_bytes(const df_engine *e, int64_t pos, int with_logits) {
    return (uint64_t)pos * sizeof(int32_t) + (with_logits ? (uint64_t)e->info.vocab_size * sizeof(float) : 0) +
           state_blob_size(&e->model, pos);
}

static uint64_t header_checksum(session_header h, const uint8_t *payload) {
    h.checksum = 0;
    return fnv1a(fnv1a(FNV_SEED, &h, sizeof h), payload, h.payload);
}

int df_session_save(const df_session *s, const char *path, df_error *err) {
    const df_engine *e = s->eng;
    int64_t pos = s->state->pos;
    session_header h = {{0}, SESSION_FILE_VERSION, SESSION_FILE_ORDER, model_fingerprint(e), pos,
                        (uint32_t)e->info.vocab_size, s->last_valid ? 1u : 0u, payload_bytes(e, pos, s->last_valid),
                        0};
    memcpy(h.magic, session_magic, sizeof h.magic);
    uint8_t *payload = xmalloc(h.payload ? h.payload : 1), *p = payload;
    if (pos) memcpy(p, s->hist, (size_t)pos * sizeof(int32_t));
    p += pos * sizeof(int32_t);
    if (s->last_valid) {
        memcpy(p, s->last_logits, (size_t)e->info.vocab_size * sizeof(float));
        p += (size_t)e->info.vocab_size * sizeof(float);
    }
    state_blob_put(&e->model, s->state, p);
    h.checksum = header_checksum(h, payload);

    char *tmp;   /* a name nobody can plant a symlink or FIFO at */
    int fd = df_temp_create(path, &tmp, err), rc = DF_EIO;
    if (fd >= 0) {
        int e1 = df_write_all(fd, &h, sizeof h);
        if (!e1) e1 = df_write_all(fd, payload, h.payload);
        rc = df_temp_commit(fd, tmp, path, e1, err);
    }
    free(payload);
    return rc;
}

static int read_all(int fd, void *p, size_t n) {
    uint8_t *b = p;
    while (n) {
        ssize_t r = read(fd, b, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Checks the header against the engine and the file's size. */
static int header_check(const df_engine *e, const session_header *h, uint64_t file_size, const char *path,
                        df_error *err) {
    if (memcmp(h->magic, session_magic, sizeof h->magic)) {
        df_error_set(err, DF_EFORMAT, "%s: not a deltafin session file (bad magic)", path);
        return DF_EFORMAT;
    }
    if (h->order != SESSION_FILE_ORDER || h->version != SESSION_FILE_VERSION) {
        df_error_set(err, DF_EFORMAT, "%s: session file version %u (byte order %#x); this build reads version %u",
                     path, h->version, h->order, SESSION_FILE_VERSION);
        return DF_EFORMAT;
    }
    if (h->fingerprint != model_fingerprint(e) || h->vocab != (uint32_t)e->info.vocab_size) {
        df_error_set(err, DF_EINVAL, "%s: session state was saved for another model (fingerprint %016llx, this "
                     "model %016llx)", path, (unsigned long long)h->fingerprint,
                     (unsigned long long)model_fingerprint(e));
        return DF_EINVAL;
    }
    if (h->pos < 0 || h->pos > e->info.max_context || h->flags > 1u) {
        df_error_set(err, DF_EFORMAT, "%s: bad header (position %lld, flags %u; the model's context is %lld)", path,
                     (long long)h->pos, h->flags, (long long)e->info.max_context);
        return DF_EFORMAT;
    }
    uint64_t want = payload_bytes(e, h->pos, (int)h->flags);
    if (h->payload != want) {
        df_error_set(err, DF_EFORMAT, "%s: bad header (%llu payload bytes for %lld positions, expected %llu)", path,
                     (unsigned long long)h->payload, (long long)h->pos, (unsigned long long)want);
        return DF_EFORMAT;
    }
    if (file_size != sizeof *h + want) {
        df_error_set(err, DF_EFORMAT, "%s: %llu bytes, expected %llu for %lld positions (truncated or damaged)",
                     path, (unsigned long long)file_size, (unsigned long long)(sizeof *h + want),
                     (long long)h->pos);
        return DF_EFORMAT;
    }
    return DF_OK;
}

int df_session_load(df_session *s, const char *path, df_error *err) {
    const df_engine *e = s->eng;
    int fd = df_open_regular(path, O_RDONLY, err);   /* a FIFO there would block the caller for good */
    if (fd < 0) return DF_EIO;
    struct stat st;
    session_header h;
    uint8_t *payload = NULL;
    int rc = DF_OK;
    if (fstat(fd, &st) || (uint64_t)st.st_size < sizeof h || read_all(fd, &h, sizeof h)) {
        df_error_set(err, DF_EFORMAT, "%s: too short for a session file header", path);
        rc = DF_EFORMAT;
    }
    if (!rc) rc = header_check(e, &h, (uint64_t)st.st_size, path, err);
    if (!rc) {
        payload = xmalloc(h.payload ? h.payload : 1);
        if (read_all(fd, payload, h.payload)) {
            df_error_set(err, DF_EIO, "%s: read failed", path);
            rc = DF_EIO;
        } else if (header_checksum(h, payload) != h.checksum) {
            df_error_set(err, DF_EFORMAT, "%s: checksum mismatch (the file is damaged)", path);
            rc = DF_EFORMAT;
        }
    }
    close(fd);
    const int32_t *tokens = (const int32_t *)payload;
    for (int64_t i = 0; !rc && i < h.pos; i++)
        if (tokens[i] < 0 || tokens[i] >= e->info.vocab_size) {
            df_error_set(err, DF_EFORMAT, "%s: token %d at position %lld is outside the vocabulary", path, tokens[i],
                         (long long)i);
            rc = DF_EFORMAT;
        }
    if (!rc) {
        const uint8_t *p = payload + h.pos * sizeof(int32_t);
        size_t nl = (size_t)e->info.vocab_size * sizeof(float);
        state_reset(s->state->m, s->state);
        session_hist_reserve(s, h.pos ? h.pos : 1);
        memcpy(s->hist, tokens, (size_t)h.pos * sizeof(int32_t));
        s->last_valid = (int)h.flags;
        if (h.flags) {
            if (!s->last_logits) s->last_logits = xmalloc(nl);
            memcpy(s->last_logits, p, nl);
            p += nl;
        }
        state_blob_get(s->state->m, s->state, h.pos, p);
        s->last_start = h.pos;
    }
    free(payload);
    return rc;
}
