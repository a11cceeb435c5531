/* api_common.c — the request builder and SSE helpers the Messages and Responses front ends share, and the
 * ignored-field list every wire API keeps (api.h). */
#include "api/api.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "sample/grammar.h"

void api_build_init(api_build *b, srv_request *r, srv_err *err, const srv_limits *lim) {
    memset(r, 0, sizeof *r);
    r->ep = SRV_EP_CHAT;
    r->n = 1;
    sample_params_default(&r->sp);
    *b = (api_build){.r = r, .err = err, .lim = lim};
}

void api_build_free(api_build *b) {
    json_decref(b->tools);
    b->tools = NULL;
    text_buf_free(&b->ignored);
}

int api_refuse(api_build *b, const char *param, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_err_set(b->err, 400, "invalid_request_error", "invalid_value", param, "%s", msg);
    return -1;
}

void api_note_ignored(text_buf *list, const char *field) {
    if (list->len < 512) text_buf_printf(list, "%s%.100s", list->len ? "," : "", field);
}

srv_message *api_add_message(api_build *b, const char *role) {
    srv_request *r = b->r;
    if (r->n_msgs == b->cap_msgs) {
        b->cap_msgs = b->cap_msgs ? 2 * b->cap_msgs : 8;
        r->msgs = xrealloc(r->msgs, (size_t)b->cap_msgs * sizeof *r->msgs);
    }
    srv_message *m = &r->msgs[r->n_msgs++];
    memset(m, 0, sizeof *m);
    m->role = xstrdup(role);
    m->content = xstrdup("");
    return m;
}

srv_message *api_last_message(api_build *b, const char *role) {
    srv_request *r = b->r;
    return r->n_msgs && !strcmp(r->msgs[r->n_msgs - 1].role, role) ? &r->msgs[r->n_msgs - 1] : NULL;
}

void api_append_text(char **dst, const char *text, size_t len, const char *sep) {
    size_t have = *dst ? strlen(*dst) : 0, sl = have && sep ? strlen(sep) : 0;
    char *p = xmalloc(have + sl + len + 1);
    if (have) memcpy(p, *dst, have);
    if (sl) memcpy(p + have, sep, sl);
    memcpy(p + have + sl, text, len);
    p[have + sl + len] = 0;
    free(*dst);
    *dst = p;
}

void api_add_tool_call(srv_message *m, const char *id, const char *name, const char *arguments) {
    m->tool_calls = xrealloc(m->tool_calls, (size_t)(m->n_tool_calls + 1) * sizeof *m->tool_calls);
    srv_tool_call *tc = &m->tool_calls[m->n_tool_calls++];
    tc->id = id ? xstrdup(id) : NULL;
    tc->name = xstrdup(name);
    tc->arguments = xstrdup(arguments && *arguments ? arguments : "{}");
}

int api_add_tool(api_build *b, const char *param, const char *name, const char *description, json_t *parameters) {
    srv_request *r = b->r;
    if (!name || !tools_name_valid(name))
        return api_refuse(b, param, "A tool name must be 1-64 characters of a-z, A-Z, 0-9, _ and -.");
    for (int k = 0; k < r->n_tools; k++)
        if (!strcmp(r->tools[k].name, name)) return api_refuse(b, param, "Tool '%s' is declared twice.", name);
    if (r->n_tools >= SRV_MAX_TOOLS) return api_refuse(b, param, "At most %d tools are supported.", SRV_MAX_TOOLS);
    if (parameters && !json_is_null(parameters) && !json_is_object(parameters))
        return api_refuse(b, param, "A tool's input schema must be a JSON schema object.");
    if (!r->tools) r->tools = xcalloc(SRV_MAX_TOOLS, sizeof *r->tools);
    srv_tool *t = &r->tools[r->n_tools++];
    t->name = xstrdup(name);
    t->parameters = json_is_object(parameters) ? json_dumps(parameters, JSON_COMPACT) : NULL;
    if (!b->tools) b->tools = json_array();
    json_t *fn = json_pack("{s:s}", "name", name);
    if (description && *description) json_object_set_new(fn, "description", json_string(description));
    if (json_is_object(parameters)) json_object_set(fn, "parameters", parameters);
    else json_object_set_new(fn, "parameters", json_pack("{s:s}", "type", "object"));
    json_array_append_new(b->tools, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    return 0;
}

int api_build_finish(api_build *b) {
    srv_request *r = b->r;
    if (b->tools && json_array_size(b->tools)) r->tools_json = json_dumps(b->tools, JSON_COMPACT);
    if (!r->n_tools && r->tool_choice == SRV_TOOLS_NONE) r->tool_choice = SRV_TOOLS_AUTO;
    if (b->ignored.len) r->ignored = xstrdup(b->ignored.p);
    return tools_check_request(r, b->err);
}

int api_get_number(api_build *b, json_t *v, const char *name, double lo, double hi, float *out) {
    if (json_is_null(v)) return 0;
    if (!json_is_number(v)) {
        srv_err_set(b->err, 400, "invalid_request_error", "invalid_type", name, "Invalid type for '%s': expected a number.",
                    name);
        return -1;
    }
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return api_refuse(b, name, "Invalid value for '%s': %g is outside [%g, %g].", name, d, lo, hi);
    *out = (float)d;
    return 0;
}

int api_get_int(api_build *b, json_t *v, const char *name, long long lo, long long hi, long long *out) {
    if (!json_is_integer(v)) {
        srv_err_set(b->err, 400, "invalid_request_error", "invalid_type", name,
                    "Invalid type for '%s': expected an integer.", name);
        return -1;
    }
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return api_refuse(b, name, "Invalid value for '%s': %lld is outside [%lld, %lld].", name, x, lo, hi);
    *out = x;
    return 0;
}

int api_get_model(api_build *b, json_t *v) {
    if (json_is_null(v)) return 0;
    if (!json_is_string(v)) return api_refuse(b, "model", "'model' must be a string.");
    const char *name = json_string_value(v);
    int served = 0;
    for (int i = 0; i < b->lim->n_names; i++) served |= !strcmp(b->lim->names[i], name);
    if (b->lim->strict && !served) {
        srv_err_set(b->err, 404, "invalid_request_error", "model_not_found", "model",
                    "The model '%.200s' does not exist; this server serves '%.200s'.", name,
                    b->lim->n_names ? b->lim->names[0] : "");
        return -1;
    }
    free(b->r->model);
    b->r->model = xstrdup(name);
    return 0;
}

int api_set_schema(api_build *b, const char *param, json_t *schema) {
    srv_request *r = b->r;
    if (schema && !json_is_null(schema) && !json_is_object(schema))
        return api_refuse(b, param, "The schema must be a JSON schema object.");
    r->response_format = SRV_FORMAT_JSON_SCHEMA;
    free(r->response_schema);
    r->response_schema = json_is_object(schema) ? json_dumps(schema, JSON_COMPACT) : xstrdup("{\"type\":\"object\"}");
    df_error de = {0};
    if (grammar_check_schema(r->response_schema, strlen(r->response_schema), &de)) {
        srv_err_set(b->err, 400, "invalid_request_error", "invalid_schema", param, "%s", de.msg);
        return -1;
    }
    return 0;
}

void api_sse(text_buf *out, const char *event, json_t *o) {
    if (out) {
        char *t = json_dumps(o, JSON_COMPACT);
        DF_ASSERT(t);
        text_buf_printf(out, "event: %s\ndata: %s\n\n", event, t);
        free(t);
    }
    json_decref(o);
}

size_t api_utf8_prefix(const char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        int k = utf8_valid_len((const uint8_t *)p + i, n - i);
        if (k <= 0) break;
        i += (size_t)k;
    }
    return i;
}

json_t *api_string(const char *p, size_t n) { return respond_lossy_string((const uint8_t *)p, n); }
