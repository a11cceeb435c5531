/* tools_request.c — the request side of tools and constrained output (tools.h): `tools`, `tool_choice`,
 * `parallel_tool_calls`, `response_format` and the tool parts of messages, validated before a job exists.
 * Pure (no model, no I/O), so the request fuzzer covers it too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "sample/grammar.h"
#include "server/tools.h"


/* ---- request ---- */

static int refuse(srv_err *err, const char *param, const char *fmt, const char *what) {
    char msg[400];
    snprintf(msg, sizeof msg, fmt, what);
    srv_err_set(err, 400, "invalid_request_error", "invalid_value", param, "%s", msg);
    return -1;
}

int tools_name_valid(const char *s) {
    size_t n = strlen(s);
    if (!n || n > 64) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '-'))
            return 0;
    return 1;
}

static int parse_tools(srv_request *r, json_t *v, srv_err *err) {
    if (json_is_null(v)) return 1;
    if (!json_is_array(v)) return refuse(err, "tools", "'tools' must be an array of function tools.%s", "");
    size_t n = json_array_size(v);
    if (n == 0) return 1;   /* no tools: as if absent */
    if (n > SRV_MAX_TOOLS) return refuse(err, "tools", "At most 64 tools are supported.%s", "");
    r->tools = xcalloc(n, sizeof *r->tools);
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(v, i), *fn = json_object_get(t, "function");
        char param[64];
        snprintf(param, sizeof param, "tools[%zu]", i);
        json_t *type = json_object_get(t, "type");
        if (!json_is_object(t) || (type && !json_is_string(type)) || (type && strcmp(json_string_value(type), "function")))
            return refuse(err, param, "Only tools of type 'function' are supported.%s", "");
        snprintf(param, sizeof param, "tools[%zu].function", i);
        if (!json_is_object(fn)) return refuse(err, param, "'function' must be an object.%s", "");
        json_t *name = json_object_get(fn, "name"), *params = json_object_get(fn, "parameters");
        snprintf(param, sizeof param, "tools[%zu].function.name", i);
        if (!json_is_string(name) || !tools_name_valid(json_string_value(name)))
            return refuse(err, param, "A function name must be 1-64 characters of a-z, A-Z, 0-9, _ and -.%s", "");
        for (int k = 0; k < r->n_tools; k++)
            if (!strcmp(r->tools[k].name, json_string_value(name)))
                return refuse(err, param, "Function '%s' is declared twice.", json_string_value(name));
        r->tools[r->n_tools].name = xstrdup(json_string_value(name));
        r->n_tools++;
        snprintf(param, sizeof param, "tools[%zu].function.parameters", i);
        if (params && !json_is_null(params)) {
            if (!json_is_object(params)) return refuse(err, param, "'parameters' must be a JSON schema object.%s", "");
            r->tools[r->n_tools - 1].parameters = json_dumps(params, JSON_COMPACT);
        }
    }
    r->tools_json = json_dumps(v, JSON_COMPACT);
    return 1;
}

static int parse_tool_choice(srv_request *r, json_t *v, srv_err *err) {
    if (json_is_null(v)) return 1;
    if (json_is_string(v)) {
        const char *c = json_string_value(v);
        if (!strcmp(c, "auto")) r->tool_choice = SRV_TOOLS_AUTO;
        else if (!strcmp(c, "none")) r->tool_choice = SRV_TOOLS_NONE;
        else if (!strcmp(c, "required")) r->tool_choice = SRV_TOOLS_REQUIRED;
        else return refuse(err, "tool_choice", "Unsupported tool_choice '%s' (auto, none, required, or a function).", c);
        return 1;
    }
    json_t *fn = json_object_get(v, "function"), *name = json_object_get(fn, "name");
    if (!json_is_object(v) || !json_is_string(name))
        return refuse(err, "tool_choice",
                      "'tool_choice' must be auto, none, required or {\"type\":\"function\",\"function\":{\"name\":…}}.%s",
                      "");
    r->tool_choice = SRV_TOOLS_NAMED;
    free(r->tool_choice_name);
    r->tool_choice_name = xstrdup(json_string_value(name));
    return 1;
}

static int parse_response_format(srv_request *r, json_t *v, srv_err *err) {
    if (json_is_null(v)) return 1;
    json_t *type = json_object_get(v, "type");
    if (!json_is_object(v) || !json_is_string(type))
        return refuse(err, "response_format", "'response_format' must be an object with a 'type'.%s", "");
    const char *t = json_string_value(type);
    if (!strcmp(t, "text")) return 1;
    if (!strcmp(t, "json_object")) {
        r->response_format = SRV_FORMAT_JSON_OBJECT;
        return 1;
    }
    if (strcmp(t, "json_schema"))
        return refuse(err, "response_format.type", "Unsupported response_format type '%s' (text, json_object, json_schema).", t);
    json_t *js = json_object_get(v, "json_schema"), *schema = json_object_get(js, "schema");
    if (!json_is_object(js)) return refuse(err, "response_format.json_schema", "'json_schema' must be an object.%s", "");
    r->response_format = SRV_FORMAT_JSON_SCHEMA;
    free(r->response_schema);
    r->response_schema = schema && !json_is_null(schema) ? json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY)
                                                         : xstrdup("{\"type\":\"object\"}");
    df_error de = {0};
    if (grammar_check_schema(r->response_schema, strlen(r->response_schema), &de)) {
        srv_err_set(err, 400, "invalid_request_error", "invalid_schema", "response_format.json_schema.schema", "%s",
                    de.msg);
        return -1;
    }
    return 1;
}

int tools_parse_field(srv_request *r, const char *key, json_t *v, srv_err *err) {
    if (r->ep != SRV_EP_CHAT) return 0;
    if (!strcmp(key, "tools")) return parse_tools(r, v, err);
    if (!strcmp(key, "tool_choice")) return parse_tool_choice(r, v, err);
    if (!strcmp(key, "parallel_tool_calls")) {
        if (json_is_null(v)) return 1;
        if (!json_is_boolean(v)) return refuse(err, key, "'parallel_tool_calls' must be a boolean.%s", "");
        r->parallel_tool_calls = json_is_true(v) ? 1 : -1;
        return 1;
    }
    if (!strcmp(key, "response_format")) return parse_response_format(r, v, err);
    return 0;
}

int tools_parse_message(srv_message *m, json_t *obj, size_t i, srv_err *err) {
    char param[96];
    json_t *calls = json_object_get(obj, "tool_calls"), *id = json_object_get(obj, "tool_call_id"),
           *name = json_object_get(obj, "name");
    if (json_is_string(name)) m->name = xstrdup(json_string_value(name));
    snprintf(param, sizeof param, "messages[%zu].tool_call_id", i);
    if (id && !json_is_null(id)) {
        if (!json_is_string(id)) return refuse(err, param, "'tool_call_id' must be a string.%s", "");
        if (strcmp(m->role, "tool")) return refuse(err, param, "Only tool messages carry a tool_call_id.%s", "");
        m->tool_call_id = xstrdup(json_string_value(id));
    }
    snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
    if (!calls || json_is_null(calls)) return 0;
    if (strcmp(m->role, "assistant")) return refuse(err, param, "Only assistant messages carry tool_calls.%s", "");
    if (!json_is_array(calls)) return refuse(err, param, "'tool_calls' must be an array.%s", "");
    size_t n = json_array_size(calls);
    m->tool_calls = xcalloc(n ? n : 1, sizeof *m->tool_calls);
    for (size_t k = 0; k < n; k++) {
        json_t *c = json_array_get(calls, k), *fn = json_object_get(c, "function");
        json_t *cid = json_object_get(c, "id"), *fname = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu]", i, k);
        if (!json_is_object(c) || !json_is_object(fn) || !json_is_string(fname))
            return refuse(err, param, "A tool call needs function.name.%s", "");
        srv_tool_call *tc = &m->tool_calls[m->n_tool_calls++];
        tc->name = xstrdup(json_string_value(fname));
        if (json_is_string(cid)) tc->id = xstrdup(json_string_value(cid));
        if (json_is_string(args)) tc->arguments = xstrdup(json_string_value(args));
        else if (args && !json_is_null(args)) tc->arguments = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
        else tc->arguments = xstrdup("{}");
    }
    return 0;
}

static const srv_tool *find_tool(const srv_request *r, const char *name) {
    for (int i = 0; i < r->n_tools; i++)
        if (!strcmp(r->tools[i].name, name)) return &r->tools[i];
    return NULL;
}

int tools_check_request(const srv_request *r, srv_err *err) {
    if ((r->tool_choice == SRV_TOOLS_REQUIRED || r->tool_choice == SRV_TOOLS_NAMED) && !r->n_tools)
        return refuse(err, "tool_choice", "tool_choice '%s' needs 'tools'.",
                      r->tool_choice == SRV_TOOLS_REQUIRED ? "required" : "function");
    if (r->tool_choice == SRV_TOOLS_NAMED && !find_tool(r, r->tool_choice_name))
        return refuse(err, "tool_choice", "tool_choice names '%s', which is not among the tools.", r->tool_choice_name);
    if (r->tool_choice == SRV_TOOLS_REQUIRED || r->tool_choice == SRV_TOOLS_NAMED)
        for (int i = 0; i < r->n_tools; i++) {
            if (r->tool_choice == SRV_TOOLS_NAMED && strcmp(r->tools[i].name, r->tool_choice_name)) continue;
            df_error de = {0};
            if (r->tools[i].parameters && grammar_check_schema(r->tools[i].parameters, strlen(r->tools[i].parameters), &de)) {
                char param[64];
                snprintf(param, sizeof param, "tools[%d].function.parameters", i);
                srv_err_set(err, 400, "invalid_request_error", "invalid_schema", param,
                            "The arguments of '%s' cannot be generated under this schema: %s", r->tools[i].name, de.msg);
                return -1;
            }
        }
    return 0;
}

void tools_request_free(srv_request *r) {
    for (int i = 0; i < r->n_msgs; i++) {
        srv_message *m = &r->msgs[i];
        for (int k = 0; k < m->n_tool_calls; k++) {
            free(m->tool_calls[k].id);
            free(m->tool_calls[k].name);
            free(m->tool_calls[k].arguments);
        }
        free(m->tool_calls);
        free(m->tool_call_id);
        free(m->name);
    }
    for (int i = 0; i < r->n_tools; i++) {
        free(r->tools[i].name);
        free(r->tools[i].parameters);
    }
    free(r->tools);
    free(r->tools_json);
    free(r->tool_choice_name);
    free(r->response_schema);
}

