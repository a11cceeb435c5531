/* test_config_values.c — every numeric value of the fixtures' config.json, set in turn to 0, -1, -1e30 and
 * 1e30: the config is refused at open with a message naming the key, or the engine opens on it (or refuses
 * it naming the file or tensor at fault) and its logits are all finite. Never NaN logits with success. */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "engine_fixture.h"
#include "model/config.h"

typedef struct leaf {
    json_t *parent;          /* object or array holding the value */
    const char *key;         /* its key (NULL in an array) */
    size_t index;
    char name[128];          /* the key to look for in a refusal: the nearest object key */
} leaf;

static void collect(json_t *v, const char *name, leaf **out, int *n) {
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            if (json_is_number(x)) {
                *out = xrealloc(*out, sizeof **out * (size_t)(*n + 1));
                leaf *l = &(*out)[(*n)++];
                *l = (leaf){v, k, 0, {0}};
                snprintf(l->name, sizeof l->name, "%s", k);
            } else {
                collect(x, k, out, n);
            }
        }
    } else if (json_is_array(v) && json_array_size(v) && json_is_number(json_array_get(v, 0))) {
        *out = xrealloc(*out, sizeof **out * (size_t)(*n + 1));   /* a list's first element stands for it */
        leaf *l = &(*out)[(*n)++];
        *l = (leaf){v, NULL, 0, {0}};
        snprintf(l->name, sizeof l->name, "%s", name);
    }
}

static void set_leaf(const leaf *l, json_t *v) {
    if (l->key) json_object_set_new(l->parent, l->key, v);
    else json_array_set_new(l->parent, l->index, v);
}

static json_t *get_leaf(const leaf *l) {
    return l->key ? json_object_get(l->parent, l->key) : json_array_get(l->parent, l->index);
}

static int all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static void family(const char *fixture, const char *tmp) {
    char src[256], path[512], link[512], target[1024], cwd[512];
    snprintf(src, sizeof src, "tests/fixtures/%s/config.json", fixture);
    json_error_t je;
    json_t *root = json_load_file(src, 0, &je);
    if (!root || !getcwd(cwd, sizeof cwd)) {
        CHECK(0, "%s: config.json loads", fixture);
        return;
    }
    snprintf(link, sizeof link, "%s/model.safetensors", tmp);
    snprintf(target, sizeof target, "%s/tests/fixtures/%s/model.safetensors", cwd, fixture);
    unlink(link);
    if (symlink(target, link)) CHECK(0, "%s: link the weights", fixture);
    snprintf(path, sizeof path, "%s/config.json", tmp);
    leaf *leaves = NULL;
    int n = 0;
    collect(root, "", &leaves, &n);
    const double values[] = {0, -1, -1e30, 1e30};
    int refused = 0, opened = 0, bad = 0, tried = 0;
    const int32_t ids[4] = {1, 5, 9, 3};
    for (int i = 0; i < n; i++) {
        json_t *keep = json_incref(get_leaf(&leaves[i]));
        for (size_t v = 0; v < sizeof values / sizeof *values; v++) {
            set_leaf(&leaves[i], values[v] == (double)(int64_t)values[v] ? json_integer((json_int_t)values[v])
                                                                         : json_real(values[v]));
            char *text = json_dumps(root, JSON_COMPACT);
            FILE *f = fopen(path, "wb");
            if (f) fputs(text, f), fclose(f);
            tried++;
            df_config c;
            df_error err = {0};
            if (config_parse(&c, text, "cfg.json", &err)) {
                refused++;
                if (!strstr(err.msg, leaves[i].name) && bad++ < 12)
                    printf("# %s: %s = %g refused without naming it: %s\n", fixture, leaves[i].name, values[v],
                           err.msg);
                free(text);
                continue;
            }
            config_free(&c);
            free(text);
            err = (df_error){0};
            df_engine *eng = ef_open(tmp, NULL, &err);
            df_session *s = NULL;
            int V = eng ? df_engine_info(eng)->vocab_size : 0;
            float *logits = eng ? xmalloc(sizeof *logits * (size_t)V * 4) : NULL;
            int rc = eng ? df_session_init(&s, eng, &err) : -1;
            if (!rc) rc = df_session_eval(s, ids, 4, logits, 1, &err);
            if (!rc) {
                opened++;
                if (!all_finite(logits, (int64_t)V * 4) && bad++ < 12)
                    printf("# %s: %s = %g accepted, and the logits are not finite\n", fixture, leaves[i].name,
                           values[v]);
            } else if (!err.msg[0] && bad++ < 12) {
                printf("# %s: %s = %g failed without a message\n", fixture, leaves[i].name, values[v]);
            }
            free(logits);
            df_session_free(s);
            df_engine_free(eng);
        }
        set_leaf(&leaves[i], keep);
    }
    CHECK(bad == 0 && tried > 100, "%s: %d numeric keys x 4 values (0, -1, -1e30, 1e30): %d refused naming the key, "
          "%d run with finite logits, the rest refused by the engine with a message (%d bad)", fixture, n, refused,
          opened, bad);
    free(leaves);
    json_decref(root);
    unlink(path);
    unlink(link);
}

int main(void) {
    char tmp[64];
    snprintf(tmp, sizeof tmp, "/tmp/df_cfgvals_%d", (int)getpid());
    mkdir(tmp, 0755);
    family("kl-fp32", tmp);
    family("k3-tiny", tmp);
    rmdir(tmp);
    TEST_EXIT();
}
