/* api_ollama.c — ollama's API as its clients use it (ollama-js, Open WebUI's ollama connections, Continue,
 * Copilot's "Ollama" provider, Aider's ollama_chat): /api/version, /api/tags, /api/ps, /api/show, and
 * /api/chat and /api/generate answered as NDJSON (one JSON object a line, streamed unless "stream":false).
 * A stream's first line goes out before the request is queued, and while the prompt waits or is prefilled a
 * line with empty content and done:false repeats every keepalive interval (clients take it as an empty
 * piece), carrying "prompt_progress". Also the route helpers of every wire API in api.h, GET /, and the
 * handler that runs a translated request (ollama's and /completion's) through the generation path. */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include "common/util.h"
#include "api/api.h"
#include "server/tools.h"

/* The ollama version /api/version reports: clients gate features on a minimum version, and every field
 * they need from the routes here is older than this one. */
#define OLLAMA_VERSION "0.13.0"

/* ---- routing ---- */

route api_route_of(const char *url) {
    static const struct { const char *path; route r; } table[] = {
        {"/messages", R_MESSAGES}, {"/messages/count_tokens", R_COUNT_TOKENS}, {"/responses", R_RESPONSES},
        {"/api/version", R_OLLAMA_VERSION}, {"/api/tags", R_OLLAMA_TAGS}, {"/api/ps", R_OLLAMA_PS},
        {"/api/show", R_OLLAMA_SHOW}, {"/api/chat", R_OLLAMA_CHAT}, {"/api/generate", R_OLLAMA_GENERATE},
        {"/completion", R_LLAMA_COMPLETION},
    };
    const char *v1 = strncmp(url, "/v1/", 4) ? NULL : url + 3;   /* Messages and Responses live under /v1 */
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        int versioned = table[i].r == R_MESSAGES || table[i].r == R_COUNT_TOKENS || table[i].r == R_RESPONSES;
        if (!strcmp(url, table[i].path) || (versioned && v1 && !strcmp(v1, table[i].path))) return table[i].r;
    }
    return R_NONE;
}

static enum MHD_Result api_handle(srv *s, struct MHD_Connection *c, conn_ctx *cc) {
    switch (cc->r) {
    case R_MESSAGES:
    case R_COUNT_TOKENS: return api_handle_messages(s, c, cc);
    case R_RESPONSES: return api_handle_responses(s, c, cc);
    case R_OLLAMA_CHAT:
    case R_OLLAMA_GENERATE:
    case R_LLAMA_COMPLETION: return api_handle_translated(s, c, cc);
    default: return api_ollama_handle(s, c, cc);
    }
}

const http_api *api_routes(void) {
    static const http_api table = {api_route_of, api_route_is_post, api_route_generates, api_route_is_public,
                                   api_handle, api_send_root};
    return &table;
}

int api_route_is_post(route r) {
    return r == R_MESSAGES || r == R_COUNT_TOKENS || r == R_RESPONSES || r == R_OLLAMA_SHOW || r == R_OLLAMA_CHAT ||
           r == R_OLLAMA_GENERATE || r == R_LLAMA_COMPLETION;
}

int api_route_generates(route r) {
    return r == R_MESSAGES || r == R_COUNT_TOKENS || r == R_RESPONSES || r == R_OLLAMA_CHAT ||
           r == R_OLLAMA_GENERATE || r == R_LLAMA_COMPLETION;
}

int api_route_is_public(route r) { return r == R_OLLAMA_VERSION; }

const char *api_served_name(const srv *s, const char *asked) {
    if (!asked) return NULL;
    size_t n = strlen(asked);
    if (n > 7 && !strcmp(asked + n - 7, ":latest")) n -= 7;
    if (strlen(s->model_id) == n && !strncmp(s->model_id, asked, n)) return s->model_id;
    for (int i = 0; i < s->o.n_aliases; i++)
        if (!strcmp(s->o.aliases[i], asked) || (strlen(s->o.aliases[i]) == n && !strncmp(s->o.aliases[i], asked, n)))
            return s->o.aliases[i];
    return NULL;
}

void api_call_free(api_call *c) {
    free(c->body);
    free(c->answer);
    text_buf_free(&c->ignored);
    if (c->wire && c->wire->free_ctx && c->wire_ctx) c->wire->free_ctx(c->wire_ctx);
    memset(c, 0, sizeof *c);
}

int api_translate(srv *s, route r, const char *body, size_t len, api_call *out, srv_err *err) {
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    int rc;
    if (r == R_LLAMA_COMPLETION) rc = api_llama_translate(s, root, out, err);
    else rc = api_ollama_translate(s, r, root, out, err);
    if (!root && !err->status)
        srv_err_set(err, 400, "invalid_request_error", "invalid_json", NULL,
                    "The request body is not valid JSON (line %d, column %d: %s).", je.line, je.column, je.text);
    json_decref(root);
    return rc;
}

/* The translated body's parse: the OpenAI one's, with the foreign API's ignored fields listed first. */
static int parse_translated(srv *s, conn_ctx *cc, void *arg, srv_job *j, const srv_limits *lim, srv_err *err) {
    (void)s;
    (void)cc;
    api_call *ac = arg;
    j->wire_ctx = ac->wire_ctx;   /* the job frees it from now on */
    ac->wire_ctx = NULL;
    if (srv_request_parse(ac->body, strlen(ac->body), ac->ep, lim, &j->req, err)) return -1;
    if (ac->ignored.len) {
        text_buf ig = {0};
        text_buf_printf(&ig, "%s%s%s", ac->ignored.p, j->req.ignored ? "," : "", j->req.ignored ? j->req.ignored : "");
        free(j->req.ignored);
        j->req.ignored = ig.p;
    }
    return 0;
}

enum MHD_Result api_handle_translated(srv *s, struct MHD_Connection *c, conn_ctx *cc) {
    srv_err err = {0};
    api_call ac = {0};
    int entered = http_parse_enter(s);
    int rc = entered ? api_translate(s, cc->r, cc->body.p ? cc->body.p : "", cc->body.len, &ac, &err) : -1;
    if (entered) http_parse_leave(s);
    else srv_err_set(&err, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
    enum MHD_Result r;
    if (rc) r = http_send_wire_error(s, c, cc, ac.wire, &err);
    else if (ac.answer) r = http_send_json(s, c, cc, 200, ac.answer);   /* nothing to generate */
    else r = http_generate(s, c, cc, ac.wire, parse_translated, &ac, 0);
    api_call_free(&ac);
    return r;
}

/* ---- the model as ollama describes it ---- */

/* Bytes of the weights (the folder's .safetensors files) and the newest one's time. */
static long long model_size(const srv *s, time_t *mtime) {
    long long total = 0;
    int any = 0;
    *mtime = (time_t)s->started;
    DIR *d = opendir(s->o.model_dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors")) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", s->o.model_dir, e->d_name);
        struct stat st;
        if (stat(path, &st) || !S_ISREG(st.st_mode)) continue;
        total += (long long)st.st_size;
        if (!any || st.st_mtime > *mtime) *mtime = st.st_mtime;
        any = 1;
    }
    closedir(d);
    return total;
}

static void rfc3339(time_t t, long nsec, char *out, size_t cap) {
    struct tm tm;
    gmtime_r(&t, &tm);
    size_t n = strftime(out, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, cap - n, ".%09ldZ", nsec);
}

static json_t *now_json(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char b[64];
    rfc3339(ts.tv_sec, ts.tv_nsec, b, sizeof b);
    return json_string(b);
}

/* A stable identity for the served weights (ollama's is the manifest's sha256; clients only compare it). */
static void model_digest(const srv *s, long long size, time_t mtime, char out[65]) {
    for (int k = 0; k < 4; k++) {
        uint64_t h = 1469598103934665603ull ^ (uint64_t)(k * 0x9E3779B97F4A7C15ull);
        const char *p = s->model_id;
        for (; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
        for (int b = 0; b < 8; b++) h = (h ^ (uint8_t)((uint64_t)size >> (8 * b))) * 1099511628211ull;
        for (int b = 0; b < 8; b++) h = (h ^ (uint8_t)((uint64_t)mtime >> (8 * b))) * 1099511628211ull;
        snprintf(out + 16 * k, 17, "%016llx", (unsigned long long)h);
    }
}

static int can_think(const srv *s) {
    return s->has_chat && (s->fmt == CHAT_K3 || tokenizer_special_id(s->tok, "<think>") >= 0);
}

static json_t *details_json(const srv *s) {
    return json_pack("{s:s,s:s,s:s,s:[s],s:s,s:s}", "parent_model", "", "format", "safetensors", "family",
                     s->info->family, "families", s->info->family, "parameter_size", "", "quantization_level", "");
}

/* "NAME:latest" unless the name has a tag of its own, as ollama lists models. */
static json_t *tagged(const char *name) {
    return strchr(name, ':') ? json_string(name) : json_sprintf("%s:latest", name);
}

static json_t *model_entry(const srv *s, const char *name, int running) {
    time_t mtime;
    long long size = model_size(s, &mtime);
    char digest[65], when[64];
    model_digest(s, size, mtime, digest);
    rfc3339(mtime, 0, when, sizeof when);
    json_t *e = json_pack("{s:o,s:o,s:I,s:s,s:o}", "name", tagged(name), "model", tagged(name), "size",
                          (json_int_t)size, "digest", digest, "details", details_json(s));
    if (running) {
        json_object_set_new(e, "expires_at", json_string("2099-01-01T00:00:00Z"));   /* never unloaded */
        json_object_set_new(e, "size_vram", json_integer(0));
        json_object_set_new(e, "context_length", json_integer((json_int_t)s->info->max_context));
    } else {
        json_object_set_new(e, "modified_at", json_string(when));
    }
    return e;
}

static json_t *model_list(const srv *s, int running) {
    json_t *a = json_array();
    if (!s->o.n_aliases) json_array_append_new(a, model_entry(s, s->model_id, running));
    for (int i = 0; i < s->o.n_aliases; i++) json_array_append_new(a, model_entry(s, s->o.aliases[i], running));
    return json_pack("{s:o}", "models", a);
}

static json_t *show_json(const srv *s) {
    const char *arch = s->info->family;
    json_t *info = json_object();
    json_object_set_new(info, "general.architecture", json_string(arch));
    json_object_set_new(info, "general.basename", json_string(s->model_id));
    char key[128];
    snprintf(key, sizeof key, "%s.context_length", arch);
    json_object_set_new(info, key, json_integer((json_int_t)s->info->max_context));
    snprintf(key, sizeof key, "%s.embedding_length", arch);
    json_object_set_new(info, key, json_integer(s->info->hidden_size));
    snprintf(key, sizeof key, "%s.block_count", arch);
    json_object_set_new(info, key, json_integer(s->info->n_layers));
    snprintf(key, sizeof key, "%s.vocab_size", arch);
    json_object_set_new(info, key, json_integer(s->info->vocab_size));
    json_t *caps = json_pack("[s]", "completion");
    if (s->has_chat) json_array_append_new(caps, json_string("tools"));
    if (can_think(s)) json_array_append_new(caps, json_string("thinking"));
    time_t mtime;
    model_size(s, &mtime);
    char when[64];
    rfc3339(mtime, 0, when, sizeof when);
    /* no ".Suffix" in the template: the Kimi models have no fill-in-the-middle tokens */
    return json_pack("{s:o,s:o,s:o,s:s,s:o,s:o,s:o,s:s}", "modelfile",
                     json_sprintf("# served by deltafin\nFROM %s\n", s->o.model_dir), "parameters",
                     json_sprintf("num_ctx %lld", (long long)s->info->max_context),
                     "template", json_string(s->has_chat ? "{{ .Messages }} (the model's own chat format)" : "{{ .Prompt }}"),
                     "license", "", "details", details_json(s), "model_info", info, "capabilities", caps,
                     "modified_at", when);
}

static enum MHD_Result send_ollama_error(srv *s, struct MHD_Connection *c, conn_ctx *cc, int status, const char *msg) {
    json_t *o = json_pack("{s:s}", "error", msg);
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    enum MHD_Result r = http_send_json(s, c, cc, status, t);
    free(t);
    return r;
}

enum MHD_Result api_ollama_handle(srv *s, struct MHD_Connection *c, conn_ctx *cc) {
    json_t *o = NULL;
    if (cc->r == R_OLLAMA_VERSION) {
        o = json_pack("{s:s}", "version", OLLAMA_VERSION);
    } else if (cc->r == R_OLLAMA_TAGS || cc->r == R_OLLAMA_PS) {
        o = model_list(s, cc->r == R_OLLAMA_PS);
    } else {   /* /api/show {"model": NAME} (older clients: "name") */
        json_t *root = json_loadb(cc->body.p ? cc->body.p : "", cc->body.len, JSON_REJECT_DUPLICATES, NULL);
        json_t *m = json_object_get(root, "model");
        if (!json_is_string(m)) m = json_object_get(root, "name");
        char msg[300];
        if (!json_is_string(m)) {
            json_decref(root);
            return send_ollama_error(s, c, cc, 400, "The body must be a JSON object with a string 'model'.");
        }
        if (!api_served_name(s, json_string_value(m))) {
            snprintf(msg, sizeof msg, "model '%.200s' not found", json_string_value(m));
            json_decref(root);
            return send_ollama_error(s, c, cc, 404, msg);
        }
        json_decref(root);
        o = show_json(s);
    }
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    enum MHD_Result r = http_send_json(s, c, cc, 200, t);
    free(t);
    return r;
}

enum MHD_Result api_send_root(srv *s, struct MHD_Connection *c, conn_ctx *cc) {
    const char *accept = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept");
    if (accept && strcasestr(accept, "text/html"))
        return http_send_text(s, c, cc, 200, "text/html; charset=utf-8", srv_page_html, strlen(srv_page_html), NULL);
    static const char running[] = "Ollama is running";
    return http_send_text(s, c, cc, 200, "text/plain; charset=utf-8", running, sizeof running - 1, NULL);
}

/* ---- requests ---- */

typedef struct ollama_ctx {
    int generate;      /* /api/generate ("response") or /api/chat ("message") */
    char *model;       /* the name the client asked for, answered with */
    double t0;
    int calls_sent;    /* streaming: tool calls already sent */
} ollama_ctx;

static void ollama_ctx_free(void *p) {
    ollama_ctx *o = p;
    if (!o) return;
    free(o->model);
    free(o);
}

static int refuse(srv_err *err, const char *param, const char *msg) {
    srv_err_set(err, 400, "invalid_request_error", "invalid_value", param, "%s", msg);
    return -1;
}

/* options → the sampling fields; the rest is listed as ignored */
static int map_options(json_t *opts, json_t *o, api_call *out, srv_err *err) {
    if (!opts || json_is_null(opts)) return 0;
    if (!json_is_object(opts)) return refuse(err, "options", "'options' must be an object.");
    const char *key;
    json_t *v;
    json_object_foreach(opts, key, v) {
        if (!strcmp(key, "num_predict")) {
            if (!json_is_integer(v)) return refuse(err, "options.num_predict", "'num_predict' must be an integer.");
            json_int_t n = json_integer_value(v);
            if (n == -1 || n == -2) continue;   /* until the end, or until the context is full: the server's cap */
            if (n < 1) return refuse(err, "options.num_predict", "'num_predict' must be -1, -2 or at least 1.");
            json_object_set(o, "max_tokens", v);
        } else if (!strcmp(key, "temperature") || !strcmp(key, "top_p") || !strcmp(key, "top_k") ||
                   !strcmp(key, "min_p") || !strcmp(key, "seed") || !strcmp(key, "stop") ||
                   !strcmp(key, "presence_penalty") || !strcmp(key, "frequency_penalty")) {
            json_object_set(o, key, v);
        } else {   /* num_ctx: the context is the model's; num_gpu, repeat_penalty, mirostat...: not here */
            char name[100];
            snprintf(name, sizeof name, "options.%.64s", key);
            api_note_ignored(&out->ignored, name);
        }
    }
    return 0;
}

static int map_format(json_t *v, json_t *o, srv_err *err) {
    if (!v || json_is_null(v) || (json_is_string(v) && !json_string_length(v))) return 0;
    if (json_is_string(v) && !strcmp(json_string_value(v), "json")) {
        json_object_set_new(o, "response_format", json_pack("{s:s}", "type", "json_object"));
        return 0;
    }
    if (json_is_object(v)) {
        json_object_set_new(o, "response_format", json_pack("{s:s,s:{s:s,s:O}}", "type", "json_schema", "json_schema",
                                                             "name", "format", "schema", v));
        return 0;
    }
    return refuse(err, "format", "'format' must be \"json\" or a JSON schema object.");
}

static int map_think(json_t *v, json_t *o, srv_err *err) {
    if (!v || json_is_null(v) || json_is_true(v)) return 0;
    if (json_is_false(v)) {
        json_object_set_new(o, "reasoning_effort", json_string("none"));
        return 0;
    }
    if (json_is_string(v)) {
        const char *t = json_string_value(v);
        if (!strcmp(t, "medium")) return 0;   /* the model's default */
        if (!strcmp(t, "low") || !strcmp(t, "high")) {
            json_object_set_new(o, "reasoning_effort", json_string(t));
            return 0;
        }
    }
    return refuse(err, "think", "'think' must be true, false, \"low\", \"medium\" or \"high\".");
}

/* ollama messages → OpenAI messages: thinking → reasoning_content, tool-call arguments as objects →
 * JSON text, tool_name → name; calls get ids (ollama's often have none) and tool results the id of the
 * call they answer, in order. */
static int map_messages(json_t *msgs, json_t *o, api_call *out, srv_err *err) {
    if (!json_is_array(msgs)) return refuse(err, "messages", "'messages' must be an array of messages.");
    json_t *res = json_array();
    json_object_set_new(o, "messages", res);
    json_t *last_calls = NULL;   /* the latest assistant's calls (borrowed) */
    size_t next_result = 0;
    int counter = 0;
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        char param[96];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m)) return refuse(err, param, "A message must be an object.");
        json_t *r = json_object();
        json_array_append_new(res, r);
        const char *key;
        json_t *v;
        json_object_foreach(m, key, v) {
            if (!strcmp(key, "role") || !strcmp(key, "content") || !strcmp(key, "tool_call_id")) {
                json_object_set(r, key, v);
            } else if (!strcmp(key, "thinking") || !strcmp(key, "reasoning_content")) {
                if (!json_is_null(v) && (!json_is_string(v) || json_string_length(v)))
                    json_object_set(r, "reasoning_content", v);
            } else if (!strcmp(key, "tool_name")) {
                json_object_set(r, "name", v);
            } else if (!strcmp(key, "images")) {
                if (json_is_array(v) && json_array_size(v)) {
                    snprintf(param, sizeof param, "messages[%zu].images", i);
                    srv_err_set(err, 400, "invalid_request_error", "unsupported_content", param,
                                "Images are not supported: this model takes text only.");
                    return -1;
                }
            } else if (!strcmp(key, "tool_calls")) {
                if (json_is_null(v)) continue;
                snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
                if (!json_is_array(v)) return refuse(err, param, "'tool_calls' must be an array.");
                json_t *calls = json_array();
                size_t k;
                json_t *c;
                json_array_foreach(v, k, c) {
                    json_t *fn = json_object_get(c, "function"), *name = json_object_get(fn, "name"),
                           *args = json_object_get(fn, "arguments"), *id = json_object_get(c, "id");
                    if (!json_is_string(name)) return refuse(err, param, "A tool call needs function.name.");
                    char *a = json_is_string(args) ? xstrdup(json_string_value(args))
                              : args && !json_is_null(args) ? json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY)
                                                            : xstrdup("{}");
                    json_t *cid = json_is_string(id) && json_string_length(id)
                                      ? json_incref(id)
                                      : json_sprintf("functions.%s:%d", json_string_value(name), counter);
                    counter++;
                    json_array_append_new(calls, json_pack("{s:o,s:s,s:{s:O,s:s}}", "id", cid, "type", "function",
                                                           "function", "name", name, "arguments", a));
                    free(a);
                }
                json_object_set_new(r, "tool_calls", calls);
                last_calls = calls;
                next_result = 0;
            } else {
                char name[120];
                snprintf(name, sizeof name, "messages[%zu].%.64s", i, key);
                api_note_ignored(&out->ignored, name);
            }
        }
        json_t *role = json_object_get(r, "role");
        if (json_is_string(role) && !strcmp(json_string_value(role), "tool") && !json_object_get(r, "tool_call_id") &&
            last_calls && next_result < json_array_size(last_calls))
            json_object_set(r, "tool_call_id", json_object_get(json_array_get(last_calls, next_result++), "id"));
        if (!json_object_get(r, "content")) json_object_set_new(r, "content", json_string(""));
    }
    return 0;
}

static const srv_wire ollama_wire;

int api_ollama_translate(srv *s, route rt, json_t *root, api_call *out, srv_err *err) {
    out->wire = &ollama_wire;
    if (!json_is_object(root)) {
        if (root) refuse(err, NULL, "The request body must be a JSON object.");
        return -1;
    }
    int generate = rt == R_OLLAMA_GENERATE;
    json_t *o = json_object();
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model) && !json_is_string(model)) {
        json_decref(o);
        return refuse(err, "model", "'model' must be a string.");
    }
    const char *asked = json_is_string(model) ? json_string_value(model) : NULL;
    const char *served = api_served_name(s, asked);
    /* a served name goes on without its ":latest"; another stays as asked (strict mode refuses it) */
    if (asked) json_object_set_new(o, "model", json_string(served ? served : asked));
    json_t *stream = json_object_get(root, "stream");
    if (stream && !json_is_null(stream) && !json_is_boolean(stream)) {
        json_decref(o);
        return refuse(err, "stream", "'stream' must be a boolean.");
    }
    int streaming = !json_is_false(stream);   /* ollama streams unless told not to */
    json_object_set_new(o, "stream", json_boolean(streaming));
    int rc = 0, raw = 0;
    json_t *prompt = NULL, *system = NULL;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (rc) break;
        if (!strcmp(key, "model") || !strcmp(key, "stream")) continue;
        if (!strcmp(key, "options")) rc = map_options(v, o, out, err);
        else if (!strcmp(key, "format")) rc = map_format(v, o, err);
        else if (!strcmp(key, "think")) rc = map_think(v, o, err);
        else if (!strcmp(key, "keep_alive")) continue;   /* the model stays loaded as long as the server runs */
        else if (!generate && !strcmp(key, "messages")) rc = map_messages(v, o, out, err);
        else if (!generate && (!strcmp(key, "tools") || !strcmp(key, "tool_choice"))) json_object_set(o, key, v);
        else if (generate && !strcmp(key, "prompt")) prompt = v;
        else if (generate && !strcmp(key, "system")) system = v;
        else if (generate && !strcmp(key, "raw")) raw = json_is_true(v);
        else if (generate && !strcmp(key, "suffix") && json_is_string(v) && json_string_length(v))
            rc = refuse(err, "suffix", "'suffix' (fill in the middle) is not supported: this model has no such tokens.");
        else if (generate && !strcmp(key, "images") && json_is_array(v) && json_array_size(v))
            rc = refuse(err, "images", "Images are not supported: this model takes text only.");
        else if (!json_is_null(v)) api_note_ignored(&out->ignored, key);   /* context, template, logprobs, ... */
    }
    if (!rc && !generate && !json_object_get(o, "messages")) rc = refuse(err, "messages", "Missing required parameter: 'messages'.");
    if (!rc && prompt && !json_is_string(prompt)) rc = refuse(err, "prompt", "'prompt' must be a string.");
    if (!rc && system && !json_is_null(system) && !json_is_string(system)) rc = refuse(err, "system", "'system' must be a string.");
    ollama_ctx *ctx = xcalloc(1, sizeof *ctx);
    ctx->generate = generate;
    ctx->model = xstrdup(asked ? asked : srv_model_id(s));
    ctx->t0 = df_now();
    out->wire_ctx = ctx;
    if (rc) {
        json_decref(o);
        return -1;
    }
    out->ep = SRV_EP_CHAT;
    if (generate && (!prompt || !json_string_length(prompt))) {   /* ollama: loads the model, says so */
        json_t *a = json_pack("{s:s,s:o,s:s,s:b,s:s}", "model", ctx->model, "created_at", now_json(), "response", "",
                              "done", 1, "done_reason", "load");
        out->answer = json_dumps(a, JSON_COMPACT);
        json_decref(a);
        json_decref(o);
        return 0;
    }
    if (generate && (raw || !s->has_chat)) {   /* the prompt as it is */
        if (json_object_get(o, "response_format")) {   /* constrained output starts after the chat format's prompt */
            refuse(err, "format", "'format' needs the chat format: it cannot be used with raw prompts.");
            json_decref(o);
            return -1;
        }
        out->ep = SRV_EP_COMPLETIONS;
        json_object_set(o, "prompt", prompt);
        json_object_del(o, "reasoning_effort");
    } else if (generate) {   /* the prompt as a user turn, under its system prompt */
        json_t *msgs = json_array();
        if (json_is_string(system) && json_string_length(system))
            json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", system));
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", prompt));
        json_object_set_new(o, "messages", msgs);
    }
    out->body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return 0;
}

/* ---- answers ---- */

static void put_line(json_t *o, text_buf *out) {
    char *t = json_dumps(o, JSON_COMPACT);
    DF_ASSERT(t);
    text_buf_printf(out, "%s\n", t);
    free(t);
    json_decref(o);
}

/* {"model","created_at"} and the text field of either route ("message" {role, content, thinking} or
 * "response" and "thinking") */
static json_t *line_base(const srv_job *j, const char *content, size_t clen, const char *thinking, size_t tlen) {
    const ollama_ctx *x = j->wire_ctx;
    json_t *o = json_pack("{s:s,s:o}", "model", x->model, "created_at", now_json());
    json_t *c = respond_lossy_string((const uint8_t *)(content ? content : ""), clen);
    if (x->generate) {
        json_object_set_new(o, "response", c);
        if (tlen) json_object_set_new(o, "thinking", respond_lossy_string((const uint8_t *)thinking, tlen));
    } else {
        json_t *m = json_pack("{s:s,s:o}", "role", "assistant", "content", c);
        if (tlen) json_object_set_new(m, "thinking", respond_lossy_string((const uint8_t *)thinking, tlen));
        json_object_set_new(o, "message", m);
    }
    return o;
}

/* Calls [from, to) as ollama has them: arguments as an object (the text as it came when it is not one). */
static json_t *calls_json(const srv_job *j, int from, int to) {
    json_t *a = json_array();
    for (int i = from; i < to; i++) {
        const chat_call *c = tools_call(j, i);
        json_t *args = json_loadb(c->args, c->args_len, 0, NULL);
        if (!json_is_object(args)) {
            json_decref(args);
            args = respond_lossy_string((const uint8_t *)c->args, c->args_len);
        }
        json_array_append_new(a, json_pack("{s:s,s:{s:i,s:o,s:o}}", "id", c->id, "function", "index", i, "name",
                                           respond_lossy_string((const uint8_t *)c->name, strlen(c->name)),
                                           "arguments", args));
    }
    return a;
}

/* Complete calls not yet sent, as one line (all of them once the answer is over). */
static void send_calls(const srv_job *j, int final, text_buf *out) {
    ollama_ctx *x = j->wire_ctx;
    int n = tools_n_calls(j), to = x->calls_sent;
    while (to < n && tools_call(j, to)->id && (final || tools_call(j, to)->done)) to++;
    if (to == x->calls_sent || x->generate) return;
    json_t *o = line_base(j, "", 0, NULL, 0);
    json_object_set_new(json_object_get(o, "message"), "tool_calls", calls_json(j, x->calls_sent, to));
    json_object_set_new(o, "done", json_false());
    put_line(o, out);
    x->calls_sent = to;
}

static long long ns(double s) { return s > 0 ? (long long)(s * 1e9) : 0; }

/* done, done_reason and the counts and times ollama reports (in nanoseconds; the prompt's time is from
 * being queued to its first token) */
static void add_done(const srv_job *j, json_t *o) {
    const ollama_ctx *x = j->wire_ctx;
    double end = j->t_done > 0 ? j->t_done : df_now();
    json_object_set_new(o, "done", json_true());
    json_object_set_new(o, "done_reason", json_string(j->choices[0].finish == GEN_FINISH_LENGTH ? "length" : "stop"));
    json_object_set_new(o, "total_duration", json_integer(ns(end - x->t0)));
    json_object_set_new(o, "load_duration", json_integer(0));
    json_object_set_new(o, "prompt_eval_count", json_integer((json_int_t)j->prompt.n));
    json_object_set_new(o, "prompt_eval_duration", json_integer(j->t_first > 0 ? ns(j->t_first - j->t_queued) : 0));
    json_object_set_new(o, "eval_count", json_integer(j->choices[0].n_gen));
    json_object_set_new(o, "eval_duration", json_integer(j->t_first > 0 ? ns(end - j->t_first) : 0));
}

static void ollama_start(const srv *s, srv_job *j, text_buf *out) {
    (void)s;
    json_t *o = line_base(j, "", 0, NULL, 0);
    json_object_set_new(o, "done", json_false());
    put_line(o, out);
}

static void ollama_event(const srv *s, srv_job *j, const gen_event *ev, text_buf *out) {
    (void)s;
    if (!out) return;   /* not streamed: the final answer is the job's text */
    if (ev->content_len || ev->reasoning_len) {
        json_t *o = line_base(j, ev->content, ev->content_len, ev->reasoning, ev->reasoning_len);
        json_object_set_new(o, "done", json_false());
        put_line(o, out);
    }
    send_calls(j, 0, out);
}

static void ollama_end(const srv *s, srv_job *j, text_buf *out) {
    (void)s;
    send_calls(j, 1, out);
    json_t *o = line_base(j, "", 0, NULL, 0);
    add_done(j, o);
    put_line(o, out);
}

static void ollama_keepalive(const srv *s, srv_job *j, text_buf *out) {
    (void)s;
    json_t *o = line_base(j, "", 0, NULL, 0);
    json_object_set_new(o, "done", json_false());
    long long at = atomic_load(&j->prefilled);
    json_object_set_new(o, "prompt_progress", json_pack("{s:I,s:I,s:b}", "total", (json_int_t)j->prompt.n, "processed",
                                                        (json_int_t)(at < 0 ? 0 : at), "queued", at < 0));
    put_line(o, out);
}

static void ollama_error(const srv_err *e, text_buf *out) { put_line(json_pack("{s:s}", "error", e->msg), out); }

/* a stream's last line is the error line as a whole answer has it: ollama's clients raise it */
static void ollama_fail(const srv *s, srv_job *j, const srv_err *e, text_buf *out) {
    (void)s;
    (void)j;
    ollama_error(e, out);
}

static char *ollama_final(const srv *s, srv_job *j) {
    (void)s;
    const srv_choice *ch = &j->choices[0];
    json_t *o = line_base(j, ch->content.p, ch->content.len, ch->reasoning.p, ch->reasoning.len);
    const ollama_ctx *x = j->wire_ctx;
    if (!x->generate && tools_n_calls(j)) {
        int n = 0;
        while (n < tools_n_calls(j) && tools_call(j, n)->id) n++;
        json_object_set_new(json_object_get(o, "message"), "tool_calls", calls_json(j, 0, n));
    }
    add_done(j, o);
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    DF_ASSERT(t);
    return t;
}

static const srv_wire ollama_wire = {
    .stream_type = "application/x-ndjson",
    .start = ollama_start,
    .event = ollama_event,
    .end = ollama_end,
    .fail = ollama_fail,
    .keepalive = ollama_keepalive,
    .error = ollama_error,
    .final_json = ollama_final,
    .free_ctx = ollama_ctx_free,
};
