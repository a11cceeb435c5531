/* request.c — OpenAI request validation (request.h). Every refusal names the offending field in `param`,
 * the way OpenAI does, so a client learns what to change instead of getting a silently different answer. */
#include "request.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "server/tools.h"

void srv_err_set(srv_err *e, int status, const char *type, const char *code, const char *param, const char *fmt,
                 ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
}

void srv_err_json(const srv_err *e, text_buf *out) {
    json_t *o = json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", e->msg, "type", e->type, "param",
                          e->param[0] ? json_string(e->param) : json_null(), "code",
                          e->code[0] ? json_string(e->code) : json_null());
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    text_buf_puts(out, s ? s : "{\"error\":{\"message\":\"error\",\"type\":\"server_error\"}}");
    free(s);
    json_decref(o);
}

typedef struct pctx {
    srv_request *r;
    srv_err *err;
    const srv_limits *lim;
    text_buf ignored;
} pctx;

/* An unknown field: refused in strict mode, else noted and skipped. Returns -1 when refused. */
static int unknown(pctx *c, const char *name) {
    if (c->lim->strict) {
        srv_err_set(c->err, 400, "invalid_request_error", "unknown_parameter", name,
                    "Unrecognized request argument supplied: %.200s", name);
        return -1;
    }
    if (c->ignored.len < 512) text_buf_printf(&c->ignored, "%s%.100s", c->ignored.len ? "," : "", name);
    return 0;
}

static int bad(pctx *c, const char *param, const char *fmt, const char *detail) {
    char msg[400];
    snprintf(msg, sizeof msg, fmt, detail ? detail : "");
    srv_err_set(c->err, 400, "invalid_request_error", "invalid_value", param, "%s", msg);
    return -1;
}

static int bad_type(pctx *c, const char *param, const char *want) {
    srv_err_set(c->err, 400, "invalid_request_error", "invalid_type", param, "Invalid type for '%s': expected %s.",
                param, want);
    return -1;
}

static int get_number(pctx *c, json_t *v, const char *name, double lo, double hi, float *out) {
    if (json_is_null(v)) return 0;
    if (!json_is_number(v)) return bad_type(c, name, "a number");
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) {
        srv_err_set(c->err, 400, "invalid_request_error", "invalid_value", name,
                    "Invalid value for '%s': %g is outside [%g, %g].", name, d, lo, hi);
        return -1;
    }
    *out = (float)d;
    return 0;
}

static int get_int(pctx *c, json_t *v, const char *name, long long lo, long long hi, long long *out) {
    if (!json_is_integer(v)) return bad_type(c, name, "an integer");
    long long x = json_integer_value(v);
    if (x < lo || x > hi) {
        srv_err_set(c->err, 400, "invalid_request_error", "invalid_value", name,
                    "Invalid value for '%s': %lld is outside [%lld, %lld].", name, x, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

static int get_bool(pctx *c, json_t *v, const char *name, int *out) {
    if (json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return bad_type(c, name, "a boolean");
    *out = json_is_true(v);
    return 0;
}

/* content: a string, null, or a list of {"type":"text","text":…} parts (joined). */
static int parse_content(pctx *c, json_t *v, int i, char **out) {
    char name[96];
    snprintf(name, sizeof name, "messages[%d].content", i);
    if (json_is_null(v) || !v) {
        *out = xstrdup("");
        return 0;
    }
    if (json_is_string(v)) {
        *out = xstrdup(json_string_value(v));
        return 0;
    }
    if (!json_is_array(v)) return bad_type(c, name, "a string or an array of text parts");
    text_buf b = {0};
    text_buf_puts(&b, "");
    size_t j;
    json_t *part;
    json_array_foreach(v, j, part) {
        char pn[128];
        snprintf(pn, sizeof pn, "%s[%zu]", name, j);
        if (!json_is_object(part)) {
            text_buf_free(&b);
            return bad_type(c, pn, "an object");
        }
        const char *key;
        json_t *val;
        json_object_foreach(part, key, val) {
            if (strcmp(key, "type") && strcmp(key, "text")) {
                char kn[200];
                snprintf(kn, sizeof kn, "%s.%.64s", pn, key);
                if (unknown(c, kn)) {
                    text_buf_free(&b);
                    return -1;
                }
            }
        }
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        char tn[200];
        snprintf(tn, sizeof tn, "%s.type", pn);
        if (!json_is_string(type)) {
            text_buf_free(&b);
            return bad_type(c, tn, "a string");
        }
        if (strcmp(json_string_value(type), "text")) {
            srv_err_set(c->err, 400, "invalid_request_error", "unsupported_content", tn,
                        "Content part type '%.64s' is not supported: this model takes text only.",
                        json_string_value(type));
            text_buf_free(&b);
            return -1;
        }
        snprintf(tn, sizeof tn, "%s.text", pn);
        if (!json_is_string(text)) {
            text_buf_free(&b);
            return bad_type(c, tn, "a string");
        }
        text_buf_append(&b, json_string_value(text), json_string_length(text));
    }
    *out = b.p;
    return 0;
}

static int parse_messages(pctx *c, json_t *v) {
    if (!json_is_array(v)) return bad_type(c, "messages", "an array of messages");
    size_t n = json_array_size(v);
    if (n == 0) return bad(c, "messages", "'messages' must not be empty.%s", "");
    c->r->msgs = xcalloc(n, sizeof *c->r->msgs);
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(v, i);
        char name[96];
        snprintf(name, sizeof name, "messages[%zu]", i);
        if (!json_is_object(m)) return bad_type(c, name, "an object");
        const char *key;
        json_t *val;
        json_object_foreach(m, key, val) {
            if (strcmp(key, "role") && strcmp(key, "content") && strcmp(key, "name") &&
                strcmp(key, "reasoning_content") && strcmp(key, "reasoning") && strcmp(key, "tool_calls") &&
                strcmp(key, "tool_call_id")) {
                char kn[200];
                snprintf(kn, sizeof kn, "%s.%.64s", name, key);
                if (json_is_null(val)) continue;
                if (unknown(c, kn)) return -1;
            }
        }
        srv_message *msg = &c->r->msgs[i];
        c->r->n_msgs = (int)i + 1;
        json_t *role = json_object_get(m, "role");
        snprintf(name, sizeof name, "messages[%zu].role", i);
        if (!json_is_string(role)) return bad_type(c, name, "a string");
        const char *rs = json_string_value(role);
        if (strcmp(rs, "system") && strcmp(rs, "developer") && strcmp(rs, "user") && strcmp(rs, "assistant") &&
            strcmp(rs, "tool"))
            return bad(c, name, "Unsupported role '%s' (system, developer, user, assistant, tool).", rs);
        msg->role = xstrdup(rs);
        json_t *content = json_object_get(m, "content");
        if (!content && strcmp(rs, "assistant")) {
            snprintf(name, sizeof name, "messages[%zu].content", i);
            return bad(c, name, "Missing required parameter: '%s'.", name);
        }
        if (parse_content(c, content, (int)i, &msg->content)) return -1;
        json_t *name_v = json_object_get(m, "name");
        snprintf(name, sizeof name, "messages[%zu].name", i);
        if (name_v && !json_is_string(name_v) && !json_is_null(name_v)) return bad_type(c, name, "a string");
        /* the reasoning under either name clients send it (reasoning_content wins when both are there) */
        json_t *rc = json_object_get(m, "reasoning_content");
        snprintf(name, sizeof name, "messages[%zu].reasoning_content", i);
        if (!rc || json_is_null(rc)) {
            rc = json_object_get(m, "reasoning");
            snprintf(name, sizeof name, "messages[%zu].reasoning", i);
        }
        if (rc && !json_is_null(rc)) {
            if (!json_is_string(rc)) return bad_type(c, name, "a string");
            if (strcmp(rs, "assistant")) return bad(c, name, "Only assistant messages carry reasoning_content.%s", "");
            msg->reasoning = xstrdup(json_string_value(rc));
        }
        if (tools_parse_message(msg, m, i, c->err)) return -1;
    }
    return 0;
}

static int parse_ids(pctx *c, json_t *v, const char *name) {
    size_t n = json_array_size(v);
    if (n == 0) return bad(c, name, "'%s' must not be empty.", name);
    c->r->prompt_ids = xmalloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) {
        long long x;
        char en[64];
        snprintf(en, sizeof en, "%s[%zu]", name, i);
        if (get_int(c, json_array_get(v, i), en, 0, c->lim->n_vocab - 1, &x)) return -1;
        c->r->prompt_ids[i] = (int32_t)x;
        c->r->n_prompt_ids = (int)i + 1;
    }
    return 0;
}

/* prompt: a string, a token array, or a one-element list of either. */
static int parse_prompt(pctx *c, json_t *v) {
    if (json_is_array(v) && json_array_size(v) == 1 &&
        (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0))))
        v = json_array_get(v, 0);
    if (json_is_string(v)) {
        c->r->prompt_len = json_string_length(v);
        c->r->prompt = xmalloc(c->r->prompt_len + 1);
        memcpy(c->r->prompt, json_string_value(v), c->r->prompt_len + 1);
        return 0;
    }
    if (json_is_array(v)) {
        size_t n = json_array_size(v);
        if (n > 1 && !json_is_integer(json_array_get(v, 0)))
            return bad(c, "prompt", "Only one prompt per request is supported (n = 1).%s", "");
        return parse_ids(c, v, "prompt");
    }
    return bad_type(c, "prompt", "a string or an array of token ids");
}

static int parse_stop(pctx *c, json_t *v) {
    if (json_is_null(v)) return 0;
    if (json_is_string(v)) {
        c->r->stop = xcalloc(1, sizeof(char *));
        c->r->stop[0] = xstrdup(json_string_value(v));
        c->r->n_stop = 1;
    } else if (json_is_array(v)) {
        size_t n = json_array_size(v);
        if (n > SRV_MAX_STOP) return bad(c, "stop", "At most 16 stop strings are supported.%s", "");
        c->r->stop = xcalloc(n ? n : 1, sizeof(char *));
        for (size_t i = 0; i < n; i++) {
            json_t *s = json_array_get(v, i);
            char en[32];
            snprintf(en, sizeof en, "stop[%zu]", i);
            if (!json_is_string(s)) return bad_type(c, en, "a string");
            c->r->stop[i] = xstrdup(json_string_value(s));
            c->r->n_stop = (int)i + 1;
        }
    } else {
        return bad_type(c, "stop", "a string or an array of strings");
    }
    for (int i = 0; i < c->r->n_stop; i++)
        if (strlen(c->r->stop[i]) > SRV_MAX_STOP_LEN) return bad(c, "stop", "Stop strings are limited to 256 bytes.%s", "");
    return 0;
}

static int parse_stream_options(pctx *c, json_t *v) {
    if (json_is_null(v)) return 0;
    if (!json_is_object(v)) return bad_type(c, "stream_options", "an object");
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        if (strcmp(key, "include_usage")) {
            char kn[100];
            snprintf(kn, sizeof kn, "stream_options.%.64s", key);
            if (unknown(c, kn)) return -1;
            continue;
        }
        if (get_bool(c, val, "stream_options.include_usage", &c->r->include_usage)) return -1;
    }
    return 0;
}

static const char *const chat_fields[] = {"model", "messages", "max_tokens", "max_completion_tokens", "stream",
                                          "stream_options", "temperature", "top_p", "top_k", "min_p", "seed",
                                          "stop", "n", "presence_penalty", "frequency_penalty", "logprobs",
                                          "top_logprobs", "user", "reasoning_effort", NULL};
static const char *const completion_fields[] = {"model", "prompt", "max_tokens", "stream", "stream_options",
                                                "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n",
                                                "presence_penalty", "frequency_penalty", "logprobs", "user", NULL};

static int known_field(const char *const *list, const char *key) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], key)) return 1;
    return 0;
}

/* Fields clients send with a value that changes nothing here; treated as absent even in strict mode. */
static int no_op_value(const char *key, json_t *v) {
    if (json_is_null(v)) return 1;
    if (!strcmp(key, "store") || !strcmp(key, "echo") || !strcmp(key, "parallel_tool_calls"))
        return json_is_false(v) || !strcmp(key, "parallel_tool_calls");
    if (!strcmp(key, "metadata")) return json_is_object(v);
    if (!strcmp(key, "logit_bias")) return json_is_object(v) && json_object_size(v) == 0;
    if (!strcmp(key, "service_tier")) return json_is_string(v);
    if (!strcmp(key, "best_of")) return json_is_integer(v) && json_integer_value(v) == 1;
    if (!strcmp(key, "modalities"))
        return json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)) &&
               !strcmp(json_string_value(json_array_get(v, 0)), "text");
    return 0;
}

static int name_served(const srv_limits *lim, const char *name) {
    for (int i = 0; i < lim->n_names; i++)
        if (!strcmp(lim->names[i], name)) return 1;
    return 0;
}

/* One top-level field. */
static int parse_field(pctx *c, const char *key, json_t *v) {
    srv_request *r = c->r;
    long long x;
    if (!strcmp(key, "model")) {
        if (json_is_null(v)) return 0;
        if (!json_is_string(v)) return bad_type(c, "model", "a string");
        if (c->lim->strict && !name_served(c->lim, json_string_value(v))) {
            srv_err_set(c->err, 404, "invalid_request_error", "model_not_found", "model",
                        "The model '%.200s' does not exist; this server serves '%.200s'.", json_string_value(v),
                        c->lim->n_names ? c->lim->names[0] : "");
            return -1;
        }
        r->model = xstrdup(json_string_value(v));
        return 0;
    }
    if (!strcmp(key, "messages")) return parse_messages(c, v);
    if (!strcmp(key, "prompt")) return parse_prompt(c, v);
    if (!strcmp(key, "max_tokens") || !strcmp(key, "max_completion_tokens")) {
        if (json_is_null(v)) return 0;
        if (get_int(c, v, key, 1, INT32_MAX, &x)) return -1;
        r->max_tokens = (int)x;
        return 0;
    }
    if (!strcmp(key, "stream")) return get_bool(c, v, key, &r->stream);
    if (!strcmp(key, "stream_options")) return parse_stream_options(c, v);
    if (!strcmp(key, "temperature")) return get_number(c, v, key, 0, 2, &r->sp.temperature);
    if (!strcmp(key, "top_p")) return get_number(c, v, key, 0, 1, &r->sp.top_p);
    if (!strcmp(key, "min_p")) return get_number(c, v, key, 0, 1, &r->sp.min_p);
    if (!strcmp(key, "presence_penalty")) return get_number(c, v, key, -2, 2, &r->sp.presence_penalty);
    if (!strcmp(key, "frequency_penalty")) return get_number(c, v, key, -2, 2, &r->sp.frequency_penalty);
    if (!strcmp(key, "top_k")) {
        if (json_is_null(v)) return 0;
        if (get_int(c, v, key, 0, INT32_MAX, &x)) return -1;
        r->sp.top_k = (int)x;
        return 0;
    }
    if (!strcmp(key, "seed")) {
        if (json_is_null(v)) return 0;
        if (!json_is_integer(v)) return bad_type(c, key, "an integer");
        r->sp.seed = (uint64_t)json_integer_value(v);
        r->has_seed = 1;
        return 0;
    }
    if (!strcmp(key, "stop")) return parse_stop(c, v);
    if (!strcmp(key, "n")) {
        if (json_is_null(v)) return 0;
        if (get_int(c, v, key, 1, c->lim->max_choices > 0 ? c->lim->max_choices : 1, &x)) return -1;
        r->n = (int)x;
        return 0;
    }
    if (!strcmp(key, "logprobs")) {
        if (json_is_null(v)) return 0;
        if (r->ep == SRV_EP_CHAT) return get_bool(c, v, key, &r->logprobs);
        if (get_int(c, v, key, 0, 5, &x)) return -1;   /* completions: number of alternatives */
        r->logprobs = 1;
        r->sp.n_top_logprobs = (int)x;
        return 0;
    }
    if (!strcmp(key, "top_logprobs")) {
        if (json_is_null(v)) return 0;
        if (get_int(c, v, key, 0, SAMPLE_MAX_TOP_LOGPROBS, &x)) return -1;
        r->sp.n_top_logprobs = (int)x;
        return 0;
    }
    if (!strcmp(key, "user")) {
        if (!json_is_string(v) && !json_is_null(v)) return bad_type(c, key, "a string");
        return 0;
    }
    if (!strcmp(key, "reasoning_effort")) {
        if (json_is_null(v)) return 0;
        if (!json_is_string(v)) return bad_type(c, key, "a string");
        const char *e = json_string_value(v);
        if (strcmp(e, "low") && strcmp(e, "high") && strcmp(e, "max") && strcmp(e, "none"))
            return bad(c, key, "Unsupported reasoning_effort '%s' (low, high, max, none).", e);
        r->reasoning_effort = xstrdup(e);
        return 0;
    }
    DF_ASSERT(!"field list and parser disagree");
    return -1;
}

int srv_request_parse(const char *body, size_t len, srv_endpoint ep, const srv_limits *lim, srv_request *r,
                      srv_err *err) {
    memset(r, 0, sizeof *r);
    r->ep = ep;
    r->n = 1;
    sample_params_default(&r->sp);
    pctx c = {r, err, lim, {0}};
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!root) {
        srv_err_set(err, 400, "invalid_request_error", "invalid_json", NULL,
                    "The request body is not valid JSON (line %d, column %d: %s).", je.line, je.column, je.text);
        return -1;
    }
    int rc = 0;
    if (!json_is_object(root)) {
        rc = bad(&c, NULL, "The request body must be a JSON object.%s", "");
    } else {
        const char *const *fields = ep == SRV_EP_CHAT ? chat_fields : completion_fields;
        const char *key;
        json_t *v;
        json_object_foreach(root, key, v) {
            int t = tools_parse_field(r, key, v, err);
            if (t) {
                rc = t < 0 ? -1 : 0;
                if (rc) break;
                continue;
            }
            if (!known_field(fields, key)) {
                if (no_op_value(key, v)) continue;
                if ((rc = unknown(&c, key))) break;
                continue;
            }
            if ((rc = parse_field(&c, key, v))) break;
        }
    }
    const char *need = ep == SRV_EP_CHAT ? "messages" : "prompt";
    if (!rc && !json_object_get(root, need)) {
        srv_err_set(err, 400, "invalid_request_error", "missing_required_parameter", need,
                    "Missing required parameter: '%s'.", need);
        rc = -1;
    }
    if (!rc && r->sp.n_top_logprobs && !r->logprobs && ep == SRV_EP_CHAT) {
        if (lim->strict) rc = bad(&c, "top_logprobs", "'top_logprobs' needs 'logprobs' set to true.%s", "");
        else r->sp.n_top_logprobs = 0;
    }
    if (!rc) rc = tools_check_request(r, err);
    if (!rc && r->include_usage && !r->stream) {
        if (lim->strict) rc = bad(&c, "stream_options", "'stream_options' is only allowed when 'stream' is true.%s", "");
        else r->include_usage = 0;
    }
    if (!rc && c.ignored.len) r->ignored = xstrdup(c.ignored.p);
    text_buf_free(&c.ignored);
    json_decref(root);
    if (rc) srv_request_free(r);
    return rc;
}

void srv_request_free(srv_request *r) {
    tools_request_free(r);
    for (int i = 0; i < r->n_msgs; i++) {
        free(r->msgs[i].role);
        free(r->msgs[i].content);
        free(r->msgs[i].reasoning);
    }
    free(r->msgs);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->reasoning_effort);
    free(r->model);
    free(r->ignored);
    memset(r, 0, sizeof *r);
}
