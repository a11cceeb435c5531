/* spine.c — resident and double-buffered spine units (see spine.h). Each region is read in pieces of
 * SPINE_PIECE bytes split at aligned file offsets, so one layer's read keeps several requests in flight on
 * the I/O pool at low priority (expert reads go first). */
#include "spine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

#define SPINE_PIECE (8u << 20)

enum { BUF_EMPTY, BUF_LOADING, BUF_READY, BUF_ERROR };

typedef struct sp_buf {
    uint8_t *mem;
    uint64_t cap;
    int unit;
    int status;
    int pending;
    int in_use;
    df_error err;
} sp_buf;

struct spine {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    io_source *src;
    io_pool *pool;
    int n;
    spine_unit *u;
    sp_buf *res;          /* per unit: its resident buffer (mem NULL when streamed) */
    sp_buf stream[2];
    int n_streamed;
    int last;             /* the unit acquired last */
    uint64_t resident_bytes;
};

typedef struct sp_piece {
    spine *sp;
    sp_buf *b;
    const spine_unit *u;
    const spine_region *r;
    uint64_t off, len;
    uint8_t *dst;
} sp_piece;

static uint64_t sp_region_room(const spine_region *r) { return io_span_bytes(r->off, r->len) + IO_ALIGN; }

uint64_t spine_unit_bytes(const spine_unit *u) {
    uint64_t n = 0;
    for (int i = 0; i < u->n; i++) n += sp_region_room(&u->r[i]);
    return n ? n : IO_ALIGN;
}

const uint8_t *spine_region_data(const uint8_t *base, const spine_region *r) {
    uint64_t head = r->off % IO_ALIGN, e = r->elem > 1 ? (uint64_t)r->elem : 1;
    return base + r->buf_off + (head + e - 1) / e * e;
}

/* Lock held, all pieces done: realign regions whose file offset is not a multiple of their element size. */
static void sp_finish(spine *sp, sp_buf *b) {
    if (b->status == BUF_ERROR) return;
    const spine_unit *u = &sp->u[b->unit];
    for (int i = 0; i < u->n; i++) {
        const spine_region *r = &u->r[i];
        const uint8_t *want = spine_region_data(b->mem, r), *at = b->mem + r->buf_off + r->off % IO_ALIGN;
        if (want != at) memmove((void *)want, at, r->len);
    }
    b->status = BUF_READY;
}

static void sp_piece_job(void *arg) {
    sp_piece *p = arg;
    spine *sp = p->sp;
    df_error err = {0};
    char what[96];
    snprintf(what, sizeof what, "the spine of %s", p->u->name);
    int rc = sp->src->read(sp->src, p->r->file, p->off, p->len, p->dst, what, &err);
    pthread_mutex_lock(&sp->mu);
    if (rc && p->b->status != BUF_ERROR) {
        p->b->status = BUF_ERROR;
        p->b->err = err;
    }
    if (--p->b->pending == 0) {
        sp_finish(sp, p->b);
        pthread_cond_broadcast(&sp->cv);
    }
    pthread_mutex_unlock(&sp->mu);
    free(p);
}

/* Lock held. Starts reading unit into b. */
static void sp_start(spine *sp, sp_buf *b, int unit, int prio) {
    const spine_unit *u = &sp->u[unit];
    b->unit = unit;
    b->status = BUF_LOADING;
    b->pending = 1;   /* guard until every piece is submitted */
    for (int i = 0; i < u->n; i++) {
        const spine_region *r = &u->r[i];
        uint64_t a0 = r->off - r->off % IO_ALIGN, end = r->off + r->len;
        for (uint64_t k = a0; k < end; k += SPINE_PIECE) {
            sp_piece *p = xmalloc(sizeof *p);
            uint64_t s = k < r->off ? r->off : k, e = DF_MIN(end, k + SPINE_PIECE);
            *p = (sp_piece){sp, b, u, r, s, e - s, b->mem + r->buf_off + (k - a0)};
            b->pending++;
            io_pool_submit(sp->pool, prio, sp_piece_job, p);
        }
    }
    if (--b->pending == 0) sp_finish(sp, b);
}

static void sp_wait(spine *sp, sp_buf *b) {
    while (b->status == BUF_LOADING) pthread_cond_wait(&sp->cv, &sp->mu);
}

int spine_new(spine **out, io_source *src, io_pool *pool, int n_units, spine_unit *units, df_error *err) {
    spine *sp = xcalloc(1, sizeof *sp);
    pthread_mutex_init(&sp->mu, NULL);
    pthread_cond_init(&sp->cv, NULL);
    sp->src = src;
    sp->pool = pool;
    sp->n = n_units;
    sp->u = units;
    sp->res = xcalloc((size_t)n_units + 1, sizeof *sp->res);
    sp->last = -1;
    uint64_t stream_cap = 0;
    for (int i = 0; i < n_units; i++) {
        spine_unit *u = &units[i];
        uint64_t at = 0;
        for (int k = 0; k < u->n; k++) {
            u->r[k].buf_off = at;
            at += sp_region_room(&u->r[k]);
        }
        u->bytes = spine_unit_bytes(u);
        if (u->resident) {
            sp->res[i] = (sp_buf){.mem = io_mem_alloc(u->bytes), .cap = u->bytes, .unit = i};
            sp->resident_bytes += u->bytes;
        } else {
            sp->n_streamed++;
            stream_cap = DF_MAX(stream_cap, u->bytes);
        }
    }
    for (int b = 0; b < 2 && sp->n_streamed; b++)
        sp->stream[b] = (sp_buf){.mem = io_mem_alloc(stream_cap), .cap = stream_cap, .unit = -1};
    pthread_mutex_lock(&sp->mu);
    for (int i = 0; i < n_units; i++)
        if (units[i].resident) sp_start(sp, &sp->res[i], i, IO_PRIO_HIGH);
    int rc = DF_OK;
    for (int i = 0; i < n_units; i++) {
        if (!units[i].resident) continue;
        sp_wait(sp, &sp->res[i]);
        if (sp->res[i].status == BUF_ERROR && !rc) {
            *err = sp->res[i].err;
            rc = err->code;
        }
    }
    pthread_mutex_unlock(&sp->mu);
    *out = sp;
    if (rc) {
        spine_free(sp);
        *out = NULL;
    }
    return rc;
}

void spine_free(spine *sp) {
    if (!sp) return;
    pthread_mutex_lock(&sp->mu);
    for (int b = 0; b < 2; b++) sp_wait(sp, &sp->stream[b]);
    pthread_mutex_unlock(&sp->mu);
    for (int b = 0; b < 2; b++) io_mem_free(sp->stream[b].mem, sp->stream[b].cap);
    for (int i = 0; i < sp->n; i++) {
        io_mem_free(sp->res[i].mem, sp->res[i].cap);
        free(sp->u[i].r);
    }
    free(sp->res);
    free(sp->u);
    pthread_mutex_destroy(&sp->mu);
    pthread_cond_destroy(&sp->cv);
    free(sp);
}

/* The streamed unit after `after` in forward order, wrapping around to the first (the next token). */
static int sp_next_streamed(const spine *sp, int after) {
    for (int k = 1; k <= sp->n; k++) {
        int i = ((after < 0 ? -1 : after) + k) % sp->n;
        if (!sp->u[i].resident) return i;
    }
    return -1;
}

static sp_buf *sp_holding(spine *sp, int unit) {
    for (int b = 0; b < 2; b++)
        if (sp->stream[b].status != BUF_EMPTY && sp->stream[b].unit == unit) return &sp->stream[b];
    return NULL;
}

/* Lock held. Fills idle stream buffers with the next streamed units not yet held. A buffer already holding
 * the very next unit is not idle even when nobody uses it yet (reusing it would read that unit twice). */
static void sp_read_ahead(spine *sp) {
    int want = sp->last, next = sp_next_streamed(sp, sp->last);
    for (int tries = 0; tries < 2; tries++) {
        want = sp_next_streamed(sp, want);
        if (want < 0 || want == sp->last) return;
        if (sp_holding(sp, want)) continue;
        sp_buf *free_b = NULL;
        for (int b = 0; b < 2 && !free_b; b++) {
            sp_buf *x = &sp->stream[b];
            if (!x->in_use && x->status != BUF_LOADING && !(x->status == BUF_READY && x->unit == next)) free_b = x;
        }
        if (!free_b) return;
        sp_start(sp, free_b, want, IO_PRIO_LOW);
    }
}

int spine_acquire(spine *sp, int unit, uint8_t **base, df_error *err) {
    DF_ASSERT(unit >= 0 && unit < sp->n);
    if (sp->u[unit].resident) {
        *base = sp->res[unit].mem;
        return DF_OK;
    }
    pthread_mutex_lock(&sp->mu);
    sp_buf *b;
    for (;;) {
        b = sp_holding(sp, unit);
        if (b) break;
        for (int k = 0; k < 2 && !b; k++)
            if (!sp->stream[k].in_use && sp->stream[k].status != BUF_LOADING) b = &sp->stream[k];
        if (b) {
            sp_start(sp, b, unit, IO_PRIO_HIGH);
            break;
        }
        pthread_cond_wait(&sp->cv, &sp->mu);   /* both buffers busy reading ahead */
    }
    b->in_use = 1;
    sp->last = unit;
    sp_wait(sp, b);
    int rc = DF_OK;
    if (b->status == BUF_ERROR) {
        *err = b->err;
        rc = err->code;
        b->in_use = 0;
        b->status = BUF_EMPTY;
    } else {
        *base = b->mem;
    }
    sp_read_ahead(sp);
    pthread_mutex_unlock(&sp->mu);
    return rc;
}

void spine_release(spine *sp, int unit) {
    if (sp->u[unit].resident) return;
    pthread_mutex_lock(&sp->mu);
    sp_buf *b = sp_holding(sp, unit);
    if (b) b->in_use = 0;
    sp_read_ahead(sp);
    pthread_cond_broadcast(&sp->cv);
    pthread_mutex_unlock(&sp->mu);
}

const spine_region *spine_unit_region(const spine *sp, int unit, int i) { return &sp->u[unit].r[i]; }
uint64_t spine_resident_bytes(const spine *sp) { return sp->resident_bytes; }
uint64_t spine_stream_bytes(const spine *sp) { return sp->n_streamed ? 2 * sp->stream[0].cap : 0; }
int spine_streamed_units(const spine *sp) { return sp->n_streamed; }
