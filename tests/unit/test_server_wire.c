/* test_server_wire.c — the other wire APIs and the chat fields clients differ on, without a model: ollama's
 * and llama.cpp's request bodies turned into the OpenAI body (options, format, think, tool calls, ids, names,
 * refusals), the reasoning read under either name and written under both, and the hooks every API's answers
 * are written through. */
#include <jansson.h>
#include <string.h>
#include "test.h"
#include "api/api.h"
#include "server/request.h"

static const char *const names[] = {"tiny"};
static const srv_limits strict = {names, 1, 512, 1, 1};

/* Translates body for route r; returns the OpenAI body parsed (NULL when refused; *e holds why). */
static json_t *translate(srv *s, route r, const char *body, api_call *c, srv_err *e) {
    memset(e, 0, sizeof *e);
    if (api_translate(s, r, body, strlen(body), c, e)) return NULL;
    return c->body ? json_loads(c->body, 0, NULL) : json_object();
}

static const char *str(json_t *o, const char *path) {
    json_t *v = o;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *tok = strtok(buf, "."); tok && v; tok = strtok(NULL, "."))
        v = (*tok >= '0' && *tok <= '9') ? json_array_get(v, (size_t)atoi(tok)) : json_object_get(v, tok);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static void test_ollama(srv *s) {
    api_call c;
    srv_err e;
    json_t *o = translate(s, R_OLLAMA_CHAT,
                          "{\"model\":\"tiny:latest\",\"keep_alive\":\"5m\",\"think\":false,\"format\":\"json\","
                          "\"options\":{\"num_predict\":7,\"temperature\":0.5,\"seed\":3,\"stop\":[\"x\"],"
                          "\"num_ctx\":8192},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                          "{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"hm\",\"tool_calls\":["
                          "{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}},"
                          "{\"function\":{\"name\":\"g\",\"arguments\":{}}}]},"
                          "{\"role\":\"tool\",\"content\":\"r1\",\"tool_name\":\"f\"},"
                          "{\"role\":\"tool\",\"content\":\"r2\",\"tool_name\":\"g\"}]}",
                          &c, &e);
    CHECK(o && c.ep == SRV_EP_CHAT && c.wire && json_is_true(json_object_get(o, "stream")),
          "ollama chat translates, streamed by default (%s)", e.msg);
    if (o) {
        CHECK(!strcmp(str(o, "model"), "tiny") && json_integer_value(json_object_get(o, "max_tokens")) == 7 &&
                  json_real_value(json_object_get(o, "temperature")) == 0.5 &&
                  json_integer_value(json_object_get(o, "seed")) == 3 && !strcmp(str(o, "stop.0"), "x") &&
                  !strcmp(str(o, "reasoning_effort"), "none") && !strcmp(str(o, "response_format.type"), "json_object"),
              "model without :latest, options, think false and format json map to their OpenAI fields");
        CHECK(c.ignored.p && strstr(c.ignored.p, "options.num_ctx") && !strstr(c.ignored.p, "keep_alive"),
              "num_ctx is listed as ignored, keep_alive is a no-op (%s)", c.ignored.p ? c.ignored.p : "");
        CHECK(!strcmp(str(o, "messages.1.reasoning_content"), "hm") &&
                  !strcmp(str(o, "messages.1.tool_calls.0.function.arguments"), "{\"a\":1}") &&
                  !strcmp(str(o, "messages.1.tool_calls.0.id"), "functions.f:0") &&
                  !strcmp(str(o, "messages.1.tool_calls.1.id"), "functions.g:1"),
              "thinking, arguments objects as text, and call ids");
        CHECK(!strcmp(str(o, "messages.2.tool_call_id"), "functions.f:0") &&
                  !strcmp(str(o, "messages.3.tool_call_id"), "functions.g:1") && !strcmp(str(o, "messages.3.name"), "g"),
              "tool results answer the calls in order, tool_name as name");
        /* the translated body passes the OpenAI parser in strict mode */
        srv_request r;
        srv_err pe = {0};
        int rc = srv_request_parse(c.body, strlen(c.body), SRV_EP_CHAT, &strict, &r, &pe);
        CHECK(rc == 0 && r.max_tokens == 7 && r.n_msgs == 4 && r.msgs[1].n_tool_calls == 2,
              "the translated body is a valid strict OpenAI request (%s)", pe.msg);
        if (!rc) srv_request_free(&r);
    }
    json_decref(o);
    api_call_free(&c);

    o = translate(s, R_OLLAMA_CHAT,
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":false,\"format\":{\"type\":"
                  "\"object\"},\"options\":{\"num_predict\":-1},\"think\":\"high\"}",
                  &c, &e);
    CHECK(o && json_is_false(json_object_get(o, "stream")) && !json_object_get(o, "max_tokens") &&
              !strcmp(str(o, "response_format.type"), "json_schema") &&
              !strcmp(str(o, "response_format.json_schema.schema.type"), "object") &&
              !strcmp(str(o, "reasoning_effort"), "high"),
          "stream false, num_predict -1 as no limit, a format schema, think \"high\"");
    json_decref(o);
    api_call_free(&c);

    static const struct { const char *body; const char *param; } bad[] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"images\":[\"aGk=\"]}]}", "messages[0].images"},
        {"{\"messages\":[],\"options\":{\"num_predict\":0}}", "options.num_predict"},
        {"{\"messages\":[],\"format\":\"yaml\"}", "format"},
        {"{\"messages\":[],\"think\":\"maybe\"}", "think"},
        {"{\"messages\":[],\"stream\":\"yes\"}", "stream"},
        {"{\"model\":1,\"messages\":[]}", "model"},
        {"[1]", ""},
        {"{", ""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        o = translate(s, R_OLLAMA_CHAT, bad[i].body, &c, &e);
        CHECK(!o && e.status == 400 && !strcmp(e.param, bad[i].param) && c.wire, "%s → 400 param '%s' (got %d '%s')",
              bad[i].body, bad[i].param, e.status, e.param);
        text_buf b = {0};
        if (c.wire) c.wire->error(&e, &b);
        json_t *err = b.p ? json_loads(b.p, 0, NULL) : NULL;
        CHECK(err && str(err, "error") && b.p[b.len - 1] == '\n', "the error is one ollama line {\"error\":…}");
        json_decref(err);
        text_buf_free(&b);
        json_decref(o);
        api_call_free(&c);
    }

    o = translate(s, R_OLLAMA_GENERATE, "{\"model\":\"tiny\",\"prompt\":\"hi\",\"system\":\"be brief\"}", &c, &e);
    CHECK(o && c.ep == SRV_EP_CHAT && !strcmp(str(o, "messages.0.role"), "system") &&
              !strcmp(str(o, "messages.1.content"), "hi"),
          "generate is a user turn under its system prompt");
    json_decref(o);
    api_call_free(&c);
    o = translate(s, R_OLLAMA_GENERATE, "{\"prompt\":\"hi\",\"raw\":true,\"think\":false}", &c, &e);
    CHECK(o && c.ep == SRV_EP_COMPLETIONS && !strcmp(str(o, "prompt"), "hi") && !json_object_get(o, "messages") &&
              !json_object_get(o, "reasoning_effort"),
          "generate raw is a completion of the prompt as it is");
    json_decref(o);
    api_call_free(&c);
    o = translate(s, R_OLLAMA_GENERATE, "{\"prompt\":\"hi\",\"raw\":true,\"format\":\"json\"}", &c, &e);
    CHECK(!o && e.status == 400 && !strcmp(e.param, "format"), "generate raw with a format → 400 (not unconstrained)");
    api_call_free(&c);
    o = translate(s, R_OLLAMA_GENERATE, "{\"model\":\"tiny\"}", &c, &e);
    json_t *a = c.answer ? json_loads(c.answer, 0, NULL) : NULL;
    CHECK(o && !c.body && a && !strcmp(str(a, "done_reason"), "load") && json_is_true(json_object_get(a, "done")),
          "generate without a prompt answers at once with done_reason load");
    json_decref(a);
    json_decref(o);
    api_call_free(&c);
    o = translate(s, R_OLLAMA_GENERATE, "{\"prompt\":\"x\",\"suffix\":\"y\"}", &c, &e);
    CHECK(!o && e.status == 400 && !strcmp(e.param, "suffix"), "generate with a suffix (FIM) → 400");
    api_call_free(&c);
}

static void test_llama(srv *s) {
    api_call c;
    srv_err e;
    json_t *o = translate(s, R_LLAMA_COMPLETION,
                          "{\"prompt\":[1,2,3],\"n_predict\":9,\"seed\":-1,\"cache_prompt\":true,\"mirostat\":0,"
                          "\"temperature\":0.2,\"stream\":true}",
                          &c, &e);
    CHECK(o && c.ep == SRV_EP_COMPLETIONS && json_array_size(json_object_get(o, "prompt")) == 3 &&
              json_integer_value(json_object_get(o, "max_tokens")) == 9 && !json_object_get(o, "seed") &&
              json_is_true(json_object_get(o, "stream")) && c.ignored.p && !strcmp(c.ignored.p, "mirostat"),
          "/completion: token ids, n_predict, seed -1 as none, cache_prompt a no-op, others listed (%s)", e.msg);
    json_decref(o);
    api_call_free(&c);
    o = translate(s, R_LLAMA_COMPLETION, "{\"prompt\":\"x\",\"n_predict\":-1}", &c, &e);
    CHECK(o && !json_object_get(o, "max_tokens") && json_object_get(o, "stream") == NULL,
          "/completion: n_predict -1 as no limit, not streamed unless asked");
    json_decref(o);
    api_call_free(&c);
    o = translate(s, R_LLAMA_COMPLETION, "{\"prompt\":\"x\",\"n_predict\":0}", &c, &e);
    CHECK(!o && e.status == 400 && !strcmp(e.param, "n_predict"), "/completion: n_predict 0 → 400");
    api_call_free(&c);
    o = translate(s, R_LLAMA_COMPLETION, "{\"n_predict\":3}", &c, &e);
    CHECK(!o && e.status == 400 && !strcmp(e.param, "prompt"), "/completion without a prompt → 400");
    api_call_free(&c);
}

static void test_reasoning(srv *s) {
    srv_request r;
    srv_err e = {0};
    const char *both = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"a\","
                       "\"reasoning\":\"vllm\"},{\"role\":\"assistant\",\"content\":\"b\",\"reasoning\":\"x\","
                       "\"reasoning_content\":\"llama\"}]}";
    int rc = srv_request_parse(both, strlen(both), SRV_EP_CHAT, &strict, &r, &e);
    CHECK(rc == 0 && !strcmp(r.msgs[1].reasoning, "vllm") && !strcmp(r.msgs[2].reasoning, "llama"),
          "history reasoning under either name (reasoning_content first) (%s)", e.msg);
    if (!rc) srv_request_free(&r);

    /* the answer's reasoning goes out under both names, in the message and in stream deltas */
    srv_job j = {0};
    j.req.ep = SRV_EP_CHAT;
    j.n_choices = 1;
    srv_choice ch = {0};
    j.choices = &ch;
    text_buf_puts(&ch.content, "answer");
    text_buf_puts(&ch.reasoning, "thought");
    snprintf(j.id, sizeof j.id, "x");
    char *body = respond_final_json(s, &j);
    json_t *o = json_loads(body, 0, NULL);
    CHECK(!strcmp(str(o, "choices.0.message.reasoning_content"), "thought") &&
              !strcmp(str(o, "choices.0.message.reasoning"), "thought"),
          "message carries reasoning_content and reasoning");
    json_decref(o);
    free(body);
    gen_event ev = {.reasoning = "th", .reasoning_len = 2};
    text_buf out = {0};
    respond_sse_event(s, &j, 0, &ev, &out);
    o = out.p && !strncmp(out.p, "data: ", 6) ? json_loads(out.p + 6, 0, NULL) : NULL;
    CHECK(o && !strcmp(str(o, "choices.0.delta.reasoning_content"), "th") &&
              !strcmp(str(o, "choices.0.delta.reasoning"), "th") && !json_object_get(json_object_get(
                  json_array_get(json_object_get(o, "choices"), 0), "delta"), "content"),
          "stream delta carries reasoning_content and reasoning");
    json_decref(o);
    text_buf_free(&out);
    text_buf_free(&ch.content);
    text_buf_free(&ch.reasoning);
}

/* Every API's hooks as the worker and the stream call them: those called unconditionally are set, the framing
 * matches the Content-Type, and a stream's fail writes one last piece in that framing carrying the error. */
static void test_wires(srv *s) {
    api_call c;
    srv_err e;
    const srv_wire *oll = NULL, *lla = NULL;
    if (!api_translate(s, R_OLLAMA_CHAT, "{\"messages\":[]}", 15, &c, &e)) oll = c.wire;
    api_call_free(&c);
    if (!api_translate(s, R_LLAMA_COMPLETION, "{\"prompt\":\"x\"}", 14, &c, &e)) lla = c.wire;
    api_call_free(&c);
    CHECK(oll && lla, "ollama's chat and /completion bodies translate");
    const struct { const char *name; const srv_wire *w; const char *type; } all[] = {
        {"messages", &api_messages_wire, "text/event-stream"}, {"responses", &api_responses_wire, "text/event-stream"},
        {"ollama", oll, "application/x-ndjson"}, {"completion", lla, "text/event-stream"},
    };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        const srv_wire *w = all[i].w;
        CHECK(w && w->start && w->event && w->end && w->fail && w->error && w->final_json && w->free_ctx &&
                  !strcmp(w->stream_type, all[i].type),
              "%s: every hook the worker and the stream call is set, streams as %s", all[i].name, all[i].type);
    }
    srv_job j;
    memset(&j, 0, sizeof j);
    srv_err_set(&e, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
    text_buf b = {0};
    if (lla) lla->fail(s, &j, &e, &b);
    CHECK(b.p && !strncmp(b.p, "data: {", 7) && strstr(b.p, "shutting down") && !strcmp(b.p + b.len - 2, "\n\n"),
          "/completion's stream ends with an error data event");
    text_buf_free(&b);
    if (oll) oll->fail(s, &j, &e, &b);
    json_t *line = b.p ? json_loadb(b.p, b.len - 1, 0, NULL) : NULL;
    CHECK(line && strstr(json_string_value(json_object_get(line, "error")), "shutting down") && b.p[b.len - 1] == '\n',
          "ollama's stream ends with an error line");
    json_decref(line);
    text_buf_free(&b);
    api_messages_wire.fail(s, &j, &e, &b);
    CHECK(b.p && !strncmp(b.p, "event: error\ndata: ", 19) && strstr(b.p, "\"type\":\"error\"") &&
              strstr(b.p, "shutting down"),
          "a Messages stream ends with an error event");
    text_buf_free(&b);
}

int main(void) {
    df_model_info info = {.family = "kimi_linear", .vocab_size = 512, .hidden_size = 64, .n_layers = 2,
                          .max_context = 512};
    srv s = {0};
    s.info = &info;
    s.model_id = "tiny";
    s.has_chat = 1;
    test_ollama(&s);
    test_llama(&s);
    test_reasoning(&s);
    test_wires(&s);
    TEST_EXIT();
}
