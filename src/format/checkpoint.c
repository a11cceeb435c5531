/* checkpoint.c — the checkpoint of a model folder (checkpoint.h): config.json, the shards (one
 * model.safetensors or those an index names) and every tensor classified by the tensor-name table. */
#include "checkpoint.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"

static void ckpt_note(checkpoint *ck, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ckpt_note(checkpoint *ck, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    ck->notes = xrealloc(ck->notes, sizeof *ck->notes * (size_t)(ck->n_notes + 1));
    ck->notes[ck->n_notes++] = xstrdup(line);
}

static void ckpt_push(checkpoint *ck, int shard, const st_tensor *t) {
    if (ck->n_tensors == ck->cap) {
        ck->cap = ck->cap ? ck->cap * 2 : 256;
        ck->tensors = xrealloc(ck->tensors, sizeof *ck->tensors * (size_t)ck->cap);
    }
    ck->tensors[ck->n_tensors++] = (ckpt_tensor){.shard = shard, .t = t, .layer = -1, .expert = -1};
}

int ckpt_add_shard(checkpoint *ck, const char *file, df_error *err) {
    char *path = df_path_join(ck->dir, file);
    ck->shards = xrealloc(ck->shards, sizeof *ck->shards * (size_t)(ck->n_shards + 1));
    int rc = st_file_open(&ck->shards[ck->n_shards], path, err);
    free(path);
    if (rc) return rc;
    return ck->n_shards++, DF_OK;
}

int ckpt_file_name_ok(const char *f) {
    if (!*f || f[0] == '/') return 0;
    for (const char *p = f; *p; p = strchr(p, '/') ? strchr(p, '/') + 1 : p + strlen(p))
        if (!strncmp(p, "..", 2) && (p[2] == '/' || !p[2])) return 0;
    return 1;
}

/* ---------------------------------------------------------------------------------------------------- */
/* config.json */

static int ckpt_load_config(checkpoint *ck, df_error *err) {
    char *path = df_path_join(ck->dir, "config.json");
    size_t len;
    ck->config_text = df_read_file_max(path, DF_JSON_FILE_MAX, &len, err);
    if (!ck->config_text) {
        free(path);
        return DF_EIO;
    }
    json_error_t je;
    json_t *root = json_loadb(ck->config_text, len, 0, &je);
    int rc = DF_OK;
    if (!root || !json_is_object(root)) {
        df_error_set(err, DF_EFORMAT, "%s: bad JSON: %s (line %d, column %d)", path, root ? "not an object" : je.text,
                     je.line, je.column);
        rc = DF_EFORMAT;
    } else {
        const char *mt = json_string_value(json_object_get(root, "model_type"));
        ck->model_type = xstrdup(mt ? mt : "unknown");
        ck->family = tensor_family_of(ck->model_type);
        json_t *text = json_object_get(root, "text_config");
        if (!strcmp(ck->model_type, "kimi_k3") && json_is_object(text)) {
            json_incref(text);
            json_decref(root);
            root = text;
        }
        json_int_t nl = json_integer_value(json_object_get(root, "num_hidden_layers"));
        ck->config_layers = nl > 0 && nl <= TENSOR_MAX_LAYERS ? (int)nl : 0;
    }
    json_decref(root);
    free(path);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Collecting the tensors: from the index's weight_map, or every tensor of model.safetensors. */

static int ckpt_load_index(checkpoint *ck, const char *index_path, df_error *err) {
    json_t *root = df_json_load_file(index_path, JSON_REJECT_DUPLICATES, err);
    if (!root) return err->code;
    json_t *wm = json_object_get(root, "weight_map");
    int rc = DF_OK;
    if (!json_is_object(wm)) {
        df_error_set(err, DF_EFORMAT, "%s: missing \"weight_map\" object", index_path);
        rc = DF_EFORMAT;
    }
    char **shard_names = NULL;
    int64_t *used = NULL;
    int last = -1;
    const char *name;
    json_t *val;
    if (!rc) json_object_foreach(wm, name, val) {
        if (!json_is_string(val) || !ckpt_file_name_ok(json_string_value(val))) {
            df_error_set(err, DF_EFORMAT, "%s: tensor '%s': shard must be a relative file name inside the model "
                         "folder", index_path, name);
            rc = DF_EFORMAT;
            break;
        }
        const char *file = json_string_value(val);
        int s = last >= 0 && !strcmp(shard_names[last], file) ? last : -1;
        for (int i = 0; s < 0 && i < ck->n_shards; i++)
            if (!strcmp(shard_names[i], file)) s = i;
        if (s < 0) {
            if ((rc = ckpt_add_shard(ck, file, err))) {
                char inner[sizeof err->msg];
                memcpy(inner, err->msg, sizeof inner);
                df_error_set(err, rc, "%s names shard '%s' (for tensor '%s'), which cannot be used: %s", index_path,
                             file, name, inner);
                break;
            }
            s = ck->n_shards - 1;
            shard_names = xrealloc(shard_names, sizeof *shard_names * (size_t)ck->n_shards);
            used = xrealloc(used, sizeof *used * (size_t)ck->n_shards);
            shard_names[s] = xstrdup(file);
            used[s] = 0;
        }
        last = s;
        const st_tensor *t = st_file_find(&ck->shards[s], name);
        if (!t) {
            df_error_set(err, DF_EFORMAT, "%s lists tensor '%s' in shard %s, but the shard has no such tensor",
                         index_path, name, ck->shards[s].path);
            rc = DF_EFORMAT;
            break;
        }
        used[s]++;
        ckpt_push(ck, s, t);
    }
    for (int i = 0; i < ck->n_shards && shard_names; i++) {
        if (!rc && used[i] < ck->shards[i].n_tensors) {
            ck->n_unindexed += ck->shards[i].n_tensors - used[i];
            ckpt_note(ck, "%s: %lld tensors not listed in the index (ignored)", ck->shards[i].path,
                      (long long)(ck->shards[i].n_tensors - used[i]));
        }
        free(shard_names[i]);
    }
    free(shard_names);
    free(used);
    json_decref(root);
    return rc;
}

static int ckpt_collect(checkpoint *ck, df_error *err) {
    char *index_path = df_path_join(ck->dir, "model.safetensors.index.json");
    int rc;
    if (access(index_path, F_OK) == 0) {
        ck->indexed = 1;
        rc = ckpt_load_index(ck, index_path, err);
    } else {
        char *single = df_path_join(ck->dir, "model.safetensors");
        if (access(single, F_OK) != 0) {
            df_error_set(err, DF_EIO, "%s: neither model.safetensors nor model.safetensors.index.json found",
                         ck->dir);
            rc = DF_EIO;
        } else if (!(rc = ckpt_add_shard(ck, "model.safetensors", err))) {
            for (int i = 0; i < ck->shards[0].n_tensors; i++) ckpt_push(ck, 0, &ck->shards[0].tensors[i]);
        }
        free(single);
    }
    free(index_path);
    return rc;
}

/* Every tensor through the name table; a name under experts.{e}. that the table does not know is an error
 * (a routed expert would silently go missing), any other unknown name is only counted by the store. */
static int ckpt_classify(checkpoint *ck, df_error *err) {
    int max_layer = ck->config_layers - 1;
    for (int64_t i = 0; i < ck->n_tensors; i++) {
        ckpt_tensor *x = &ck->tensors[i];
        x->cls = tensor_classify(x->t->name, ck->family, &x->layer, &x->expert, &x->kind);
        if (x->cls == TENSOR_UNKNOWN && x->expert >= 0)
            return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': unrecognised routed-expert tensor name (expected "
                                "experts.{e}.w{1,2,3}.weight, .weight_packed or .weight_scale)",
                                ck->shards[x->shard].path, x->t->name), DF_EFORMAT;
        if ((x->cls == TENSOR_SPINE || x->cls == TENSOR_EXPERT) && x->layer > max_layer) max_layer = x->layer;
    }
    ck->n_layers = max_layer + 1;
    return DF_OK;
}

int ckpt_open(checkpoint *ck, const char *dir, df_error *err) {
    memset(ck, 0, sizeof *ck);
    ck->dir = xstrdup(dir);
    int rc = ckpt_load_config(ck, err);
    if (!rc) rc = ckpt_collect(ck, err);
    if (!rc) rc = ckpt_classify(ck, err);
    return rc;
}

void ckpt_drop_tensors(checkpoint *ck) {
    free(ck->tensors);
    ck->tensors = NULL;
    ck->n_tensors = ck->cap = 0;
}

void ckpt_free(checkpoint *ck) {
    ckpt_drop_tensors(ck);
    for (int i = 0; i < ck->n_shards; i++) st_file_close(&ck->shards[i]);
    free(ck->shards);
    for (int i = 0; i < ck->n_notes; i++) free(ck->notes[i]);
    free(ck->notes);
    free(ck->model_type);
    free(ck->config_text);
    free(ck->dir);
    memset(ck, 0, sizeof *ck);
}
