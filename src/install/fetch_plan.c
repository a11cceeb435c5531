/* fetch_plan.c — the shard list and per-shard expert/spine layout of a remote repository (see
 * fetch_plan.h). */
#include "fetch_plan.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "format/safetensors.h"
#include "format/tensor_names.h"

static int fplan_name_ok(const char *f) {
    if (!*f || f[0] == '/') return 0;
    for (const char *p = f; *p; p = strchr(p, '/') ? strchr(p, '/') + 1 : p + strlen(p))
        if (*p == '/' || (!strncmp(p, "..", 2) && (p[2] == '/' || !p[2]))) return 0;
    return 1;
}

int fplan_index_shards(const char *json, size_t len, const char *src, char ***names, int *n, df_error *err) {
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root)
        return df_error_set(err, DF_EFORMAT, "%s: bad JSON: %s (line %d, column %d)", src, je.text, je.line,
                            je.column), DF_EFORMAT;
    json_t *wm = json_object_get(root, "weight_map");
    int rc = json_is_object(wm) && json_object_size(wm) ? DF_OK
             : (df_error_set(err, DF_EFORMAT, "%s: no weight_map object listing tensors", src), DF_EFORMAT);
    const char *k;
    json_t *v;
    if (!rc) json_object_foreach(wm, k, v) {
        const char *name = json_string_value(v);
        if (!name || !fplan_name_ok(name)) {
            rc = (df_error_set(err, DF_EFORMAT, "%s: weight_map['%s'] must be a shard file name inside the model "
                               "folder (a string, not absolute, no '..')", src, k), DF_EFORMAT);
            break;
        }
        int seen = 0;
        for (int i = *n - 1; i >= 0 && !seen; i--) seen = !strcmp((*names)[i], name);
        if (seen) continue;
        if (*n >= FPLAN_MAX_SHARDS) {
            rc = (df_error_set(err, DF_EFORMAT, "%s: more than %d shard files", src, FPLAN_MAX_SHARDS), DF_EFORMAT);
            break;
        }
        *names = xrealloc(*names, sizeof **names * (size_t)(*n + 1));
        (*names)[(*n)++] = xstrdup(name);
    }
    json_decref(root);
    return rc;
}

static int fplan_cmp_begin(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

int fplan_layout_parse(fplan_layout *L, const char *name, const char *header, uint64_t header_len,
                       uint64_t file_size, df_error *err) {
    memset(L, 0, sizeof *L);
    st_file f;
    int rc = st_header_parse(&f, name, header, header_len, file_size, err);
    if (rc) return rc;
    L->size = file_size;
    L->header_len = header_len;
    const st_tensor **t = xcalloc((size_t)f.n_tensors + 1, sizeof *t);
    int k = 0;
    for (int i = 0; i < f.n_tensors; i++)
        if (f.tensors[i].end > f.tensors[i].begin) t[k++] = &f.tensors[i];
    qsort(t, (size_t)k, sizeof *t, fplan_cmp_begin);   /* disjoint: st_header_parse refused overlaps */
    L->runs = xcalloc((size_t)k + 2, sizeof *L->runs);
    L->holes = xcalloc((size_t)k + 1, sizeof *L->holes);
    L->runs[L->n_runs++] = (dc_span){0, f.data_start};
    for (int i = 0; i < k; i++) {
        uint64_t b = f.data_start + t[i]->begin, n = t[i]->end - t[i]->begin;
        int layer, expert;
        tensor_family fam = tensor_family_guess(t[i]->name);   /* a shard header carries no model_type */
        if (tensor_classify(t[i]->name, fam, &layer, &expert, NULL) != TENSOR_EXPERT) {
            dc_span *r = &L->runs[L->n_runs - 1];
            if (r->off + r->len == b) r->len += n;
            else L->runs[L->n_runs++] = (dc_span){b, n};
            continue;
        }
        fplan_hole *h = L->n_holes ? &L->holes[L->n_holes - 1] : NULL;
        if (h && h->layer == layer && h->expert == expert && h->span.off + h->span.len == b) h->span.len += n;
        else L->holes[L->n_holes++] = (fplan_hole){{b, n}, layer, expert};
    }
    free(t);
    st_file_close(&f);
    return DF_OK;
}

int fplan_layout_fetch(fplan_layout *L, remote *r, const char *name, df_error *err) {
    memset(L, 0, sizeof *L);
    uint64_t size;
    char sha[65];
    int rc = remote_file_info(r, name, &size, sha, err);
    uint8_t len8[8];
    remote_req q = {.file = name, .off = 0, .len = 8, .what = "shard header length", .dst = len8};
    if (!rc && size < 8)
        rc = (df_error_set(err, DF_EFORMAT, "%s: remote file of %llu bytes is no safetensors shard", name,
                           (unsigned long long)size), DF_EFORMAT);
    if (!rc) rc = remote_fetch(r, &q, 1, err);
    if (rc) return rc;
    uint64_t hl;
    if ((rc = st_header_length(len8, size, name, &hl, err))) return rc;
    char *h = xmalloc(hl + 1);
    q = (remote_req){.file = name, .off = 8, .len = hl, .what = "shard header", .dst = (uint8_t *)h};
    rc = remote_fetch(r, &q, 1, err);
    if (!rc) rc = fplan_layout_parse(L, name, h, hl, size, err);
    if (!rc) memcpy(L->sha256, sha, sizeof sha);
    free(h);
    return rc;
}

void fplan_layout_free(fplan_layout *L) {
    free(L->runs);
    free(L->holes);
    memset(L, 0, sizeof *L);
}
