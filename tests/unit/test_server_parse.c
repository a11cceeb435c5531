/* test_server_parse.c — OpenAI request validation: accepted shapes, refusals that name the field (strict
 * mode), what lenient mode ignores, and the pre-checks of guard.h. */
#include <string.h>
#include "test.h"
#include "server/guard.h"
#include "server/request.h"

static const char *const names[] = {"tiny", "gpt-4o-mini"};
static const srv_limits lim = {names, 2, 512, 1, 1};
static const srv_limits lenient = {names, 2, 512, 0, 4};

static int parse_with(const srv_limits *l, const char *body, srv_endpoint ep, srv_request *r, srv_err *e) {
    memset(e, 0, sizeof *e);
    return srv_request_parse(body, strlen(body), ep, l, r, e);
}

static int parse(const char *body, srv_endpoint ep, srv_request *r, srv_err *e) {
    return parse_with(&lim, body, ep, r, e);
}

/* Expects a refusal with the given status and param. */
static void refused(const char *body, srv_endpoint ep, int status, const char *param, const char *what) {
    srv_request r;
    srv_err e;
    int rc = parse(body, ep, &r, &e);
    CHECK(rc == -1 && e.status == status && !strcmp(e.param, param), "%s → %d param '%s' (got %d '%s': %s)", what,
          status, param, e.status, e.param, e.msg);
}

int main(void) {
    srv_request r;
    srv_err e;
    int rc = parse("{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                   "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hel\"},{\"type\":\"text\","
                   "\"text\":\"lo\"}]},{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"hm\"}],"
                   "\"max_completion_tokens\":7,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                   "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"seed\":42,\"stop\":[\"a\",\"b\"],"
                   "\"n\":1,\"presence_penalty\":0.1,\"frequency_penalty\":-0.2,\"logprobs\":true,"
                   "\"top_logprobs\":3,\"user\":\"u\",\"reasoning_effort\":\"low\"}",
                   SRV_EP_CHAT, &r, &e);
    CHECK(rc == 0, "full chat request parses (%s)", e.msg);
    if (!rc) {
        CHECK(r.n_msgs == 3 && !strcmp(r.msgs[1].content, "hello") && !strcmp(r.msgs[2].content, "") &&
                  !strcmp(r.msgs[2].reasoning, "hm"),
              "messages: string, text parts joined, null content, reasoning");
        CHECK(r.max_tokens == 7 && r.stream && r.include_usage && r.sp.temperature == 0.5f && r.sp.top_k == 40 &&
                  r.has_seed && r.sp.seed == 42 && r.n_stop == 2 && r.logprobs && r.sp.n_top_logprobs == 3 &&
                  !strcmp(r.reasoning_effort, "low"),
              "chat fields land in the struct");
        srv_request_free(&r);
    }
    rc = parse("{\"prompt\":[1,2,3],\"max_tokens\":4,\"logprobs\":2,\"stop\":\"x\"}", SRV_EP_COMPLETIONS, &r, &e);
    CHECK(rc == 0 && r.n_prompt_ids == 3 && r.prompt_ids[2] == 3 && r.logprobs && r.sp.n_top_logprobs == 2 &&
              r.n_stop == 1,
          "completion with a token-array prompt");
    srv_request_free(&r);
    rc = parse("{\"prompt\":[\"once upon\"],\"temperature\":0}", SRV_EP_COMPLETIONS, &r, &e);
    CHECK(rc == 0 && r.prompt && !strcmp(r.prompt, "once upon") && r.sp.temperature == 0 && !r.max_tokens,
          "completion with a one-string list, temperature 0");
    srv_request_free(&r);
    rc = parse("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"seed\":null,\"stop\":null,\"n\":null}",
               SRV_EP_CHAT, &r, &e);
    CHECK(rc == 0 && !r.has_seed && r.sp.temperature == 1.0f && r.sp.top_p == 1.0f, "nulls mean defaults");
    srv_request_free(&r);

    refused("{", SRV_EP_CHAT, 400, "", "malformed JSON");
    refused("[1]", SRV_EP_CHAT, 400, "", "non-object body");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"functions\":[]}", SRV_EP_CHAT, 400,
            "functions", "unknown field");
    refused("{\"messages\":[]}", SRV_EP_CHAT, 400, "messages", "empty messages");
    refused("{\"model\":\"tiny\"}", SRV_EP_CHAT, 400, "messages", "missing messages");
    refused("{\"prompt\":\"x\",\"model\":\"gpt-4\"}", SRV_EP_COMPLETIONS, 404, "model", "wrong model");
    refused("{\"messages\":\"hi\"}", SRV_EP_CHAT, 400, "messages", "messages of the wrong type");
    refused("{\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}", SRV_EP_CHAT, 400, "messages[0].role",
            "function role");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
            SRV_EP_CHAT, 400, "messages[0].content[0].image_url", "image part");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", SRV_EP_CHAT, 400,
            "messages[0].content[0].type", "image part type");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", SRV_EP_CHAT, 400,
            "messages[0].tool_calls", "tool calls");
    refused("{\"prompt\":\"x\",\"temperature\":3}", SRV_EP_COMPLETIONS, 400, "temperature", "temperature range");
    refused("{\"prompt\":\"x\",\"temperature\":\"hot\"}", SRV_EP_COMPLETIONS, 400, "temperature", "temperature type");
    refused("{\"prompt\":\"x\",\"n\":2}", SRV_EP_COMPLETIONS, 400, "n", "n = 2");
    refused("{\"prompt\":\"x\",\"max_tokens\":0}", SRV_EP_COMPLETIONS, 400, "max_tokens", "max_tokens 0");
    refused("{\"prompt\":\"x\",\"max_tokens\":1.5}", SRV_EP_COMPLETIONS, 400, "max_tokens", "fractional max_tokens");
    refused("{\"prompt\":[1,512]}", SRV_EP_COMPLETIONS, 400, "prompt[1]", "token id outside the vocabulary");
    refused("{\"prompt\":[\"a\",\"b\"]}", SRV_EP_COMPLETIONS, 400, "prompt", "two prompts");
    refused("{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", SRV_EP_COMPLETIONS, 400,
            "stream_options", "stream_options without stream");
    refused("{\"prompt\":\"x\",\"stream\":true,\"stream_options\":{\"foo\":1}}", SRV_EP_COMPLETIONS, 400,
            "stream_options.foo", "unknown stream option");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", SRV_EP_CHAT, 400,
            "top_logprobs", "top_logprobs without logprobs");
    refused("{\"prompt\":\"x\",\"logprobs\":true}", SRV_EP_COMPLETIONS, 400, "logprobs",
            "completions logprobs must be an integer");
    refused("{\"prompt\":\"x\",\"stop\":[1]}", SRV_EP_COMPLETIONS, 400, "stop[0]", "non-string stop");
    refused("{\"prompt\":\"x\",\"echo\":true}", SRV_EP_COMPLETIONS, 400, "echo", "echo is refused");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"extreme\"}", SRV_EP_CHAT,
            400, "reasoning_effort", "bad reasoning effort");
    refused("{\"prompt\":\"x\",\"prompt\":\"y\"}", SRV_EP_COMPLETIONS, 400, "", "duplicate keys");
    const char bad_utf8[] = "{\"prompt\":\"\xff\xfe\"}";
    refused(bad_utf8, SRV_EP_COMPLETIONS, 400, "", "invalid UTF-8");
    refused("{\"prompt\":\"a\\u0000b\"}", SRV_EP_COMPLETIONS, 400, "", "embedded NUL");

    /* strict mode still treats no-op values as absent and accepts the served names */
    rc = parse("{\"model\":\"gpt-4o-mini\",\"prompt\":\"x\",\"store\":false,\"metadata\":{\"k\":\"v\"},"
               "\"logit_bias\":{},\"service_tier\":\"auto\",\"modalities\":[\"text\"],\"best_of\":1}",
               SRV_EP_COMPLETIONS, &r, &e);
    CHECK(rc == 0 && !r.ignored && !strcmp(r.model, "gpt-4o-mini"), "strict: no-op values and an alias accepted (%s)",
          e.msg);
    srv_request_free(&r);

    /* lenient (the default): unknown fields ignored and listed, any model name, nulls absent */
    rc = parse_with(&lenient,
                    "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                    "\"text\":\"hi\",\"cache_control\":{}}],\"tool_calls\":null,\"extra\":1}],\"tools\":[],"
                    "\"stream_options\":{\"include_usage\":true},\"top_logprobs\":2,\"n\":3,\"store\":true}",
                    SRV_EP_CHAT, &r, &e);
    CHECK(rc == 0 && r.ignored && !strcmp(r.ignored, "messages[0].extra,messages[0].content[0].cache_control,store") &&
              !strcmp(r.model, "gpt-4o") && r.n == 3 && !r.include_usage && !r.sp.n_top_logprobs,
          "lenient: unknown fields ignored and listed (%s), other model names, n = 3 (%s)", r.ignored, e.msg);
    srv_request_free(&r);
    rc = parse_with(&lenient, "{\"prompt\":\"x\",\"n\":5}", SRV_EP_COMPLETIONS, &r, &e);
    CHECK(rc == -1 && !strcmp(e.param, "n"), "lenient: n above the slots is refused");
    rc = parse_with(&lenient, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", SRV_EP_COMPLETIONS, &r, &e);
    CHECK(rc == -1 && !strcmp(e.param, "temperature"), "lenient: a known field of the wrong type is still refused");

    /* guard.h */
    CHECK(guard_key_matches("k3y", "Bearer k3y") && guard_key_matches("k3y", "bearer k3y") &&
              guard_key_matches("k3y", "BEARER  k3y ") && !guard_key_matches("k3y", "Bearer k3") &&
              !guard_key_matches("k3y", "Bearerk3y") && !guard_key_matches("k3y", "Basic k3y") &&
              !guard_key_matches("k3y", NULL) && !guard_key_matches("", "Bearer "),
          "API key: Bearer scheme in any case, exact key");
    const char *cors[] = {"http://ok.example"}, *any[] = {"*"};
    CHECK(guard_origin_allowed(NULL, "h:1", NULL, 0) && guard_origin_allowed("http://h:1", "h:1", NULL, 0) &&
              guard_origin_allowed("https://H:1", "h:1", NULL, 0) && !guard_origin_allowed("http://evil", "h:1", NULL, 0) &&
              !guard_origin_allowed("null", "h:1", NULL, 0) && guard_origin_allowed("http://ok.example", "h:1", cors, 1) &&
              !guard_origin_allowed("http://ok.example.evil", "h:1", cors, 1) && guard_origin_allowed("http://x", NULL, any, 1),
          "Origin: none, the page's own, or an allowed one");
    /* Host: the fixed forms are answered, any other name refused, for each port form */
    const char *hosts_ok[] = {NULL, "127.0.0.1", "10.0.0.7", "[::1]", "[fe80::1]", "localhost", "LocalHost.", "a.localhost",
                              "box.example", "BOX.example.", "extra.example"};
    const char *hosts_bad[] = {"evil.example", "localhost.evil.example", "127.0.0.1.evil.example", "box.example.evil",
                               "[::1", "[::1]x", "xlocalhost", "evil.example:x", "", ":80", "[evil.example]",
                               "a b.localhost", "e/vil.localhost", "x@localhost"};
    const char *extra[] = {"extra.example"};
    int hok = 0, hbad = 0, nh = 0;
    for (int port = 0; port < 2; port++) {
        for (size_t i = 0; i < sizeof hosts_ok / sizeof *hosts_ok; i++) {
            char h[80];
            if (hosts_ok[i]) snprintf(h, sizeof h, "%s%s", hosts_ok[i], port ? ":8080" : "");
            hok += guard_host_allowed(hosts_ok[i] ? h : NULL, "box.example", extra, 1);
            nh++;
        }
        for (size_t i = 0; i < sizeof hosts_bad / sizeof *hosts_bad; i++) {
            char h[80];
            snprintf(h, sizeof h, "%s%s", hosts_bad[i], port && hosts_bad[i][0] ? ":8080" : "");
            hbad += !guard_host_allowed(h, "box.example", extra, 1);
        }
    }
    CHECK(hok == nh && hbad == 2 * (int)(sizeof hosts_bad / sizeof *hosts_bad),
          "Host: addresses, localhost, the bound and allowed names answered (%d/%d), other names refused (%d/%d)", hok,
          nh, hbad, 2 * (int)(sizeof hosts_bad / sizeof *hosts_bad));
    const char *j1 = "{\"a\":[1,2,3],\"b\":\"x,y:z\\\",\"}";
    CHECK(guard_json_values(j1, strlen(j1), 100) == 6 && guard_json_values("", 0, 100) == 0 &&
              guard_json_values("[1,2,3,4,5,6,7,8]", 17, 3) <= 5,
          "JSON value count: commas and colons outside strings (%lld)", guard_json_values(j1, strlen(j1), 100));
    /* tools and constrained output */
    rc = parse("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":null,"
               "\"tool_calls\":[{\"id\":\"functions.f:0\",\"type\":\"function\",\"function\":{\"name\":\"f\","
               "\"arguments\":\"{\\\"a\\\":1}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"functions.f:0\","
               "\"content\":\"42\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
               "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}}],\"tool_choice\":{\"type\":"
               "\"function\",\"function\":{\"name\":\"f\"}},\"parallel_tool_calls\":false,\"response_format\":"
               "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"integer\"}}}}",
               SRV_EP_CHAT, &r, &e);
    CHECK(rc == 0 && r.n_tools == 1 && !strcmp(r.tools[0].name, "f") && strstr(r.tools[0].parameters, "integer") &&
              r.tool_choice == SRV_TOOLS_NAMED && !strcmp(r.tool_choice_name, "f") && r.parallel_tool_calls == -1 &&
              r.response_format == SRV_FORMAT_JSON_SCHEMA && !strcmp(r.response_schema, "{\"type\":\"integer\"}") &&
              r.msgs[1].n_tool_calls == 1 && !strcmp(r.msgs[1].tool_calls[0].arguments, "{\"a\":1}") &&
              !strcmp(r.msgs[2].tool_call_id, "functions.f:0") && r.tools_json && r.tools_json[0] == '[',
          "tools, tool_choice, parallel_tool_calls, response_format, tool_calls and tool messages parsed (%s)", e.msg);
    srv_request_free(&r);
    rc = parse("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[],\"tool_choice\":null,"
               "\"response_format\":{\"type\":\"text\"}}", SRV_EP_CHAT, &r, &e);
    CHECK(rc == 0 && !r.n_tools && !r.tools_json && r.response_format == SRV_FORMAT_TEXT, "empty tools, text format");
    srv_request_free(&r);
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
            "\"function\":{\"name\":\"a b\"}}]}", SRV_EP_CHAT, 400, "tools[0].function.name", "bad function name");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", SRV_EP_CHAT, 400,
            "tool_choice", "required without tools");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":"
            "{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\","
            "\"pattern\":\"x\"}}}}}],\"tool_choice\":\"required\"}", SRV_EP_CHAT, 400, "tools[0].function.parameters",
            "forced call with an unsupported schema");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\","
            "\"json_schema\":{\"schema\":{\"type\":\"object\",\"required\":[\"z\"]}}}}", SRV_EP_CHAT, 400,
            "response_format.json_schema.schema", "schema with an unknown required key");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"yaml\"}}",
            SRV_EP_CHAT, 400, "response_format.type", "unknown response format");
    refused("{\"prompt\":\"x\",\"tools\":[]}", SRV_EP_COMPLETIONS, 400, "tools", "tools on completions");

    text_buf b = {0};
    srv_err_set(&e, 400, "invalid_request_error", "unknown_parameter", "tools", "Unrecognized: %s", "tools");
    srv_err_json(&e, &b);
    CHECK(strstr(b.p, "\"param\":\"tools\"") && strstr(b.p, "\"type\":\"invalid_request_error\""),
          "error JSON is OpenAI-shaped: %s", b.p);
    text_buf_free(&b);
    TEST_EXIT();
}
