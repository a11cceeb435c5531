/* test_api_parse.c — the Anthropic Messages and OpenAI Responses requests as the chat requests they become:
 * system text (Claude Code's billing-header block dropped), tool_use/tool_result and function/custom tool
 * items as tool calls and tool messages, thinking and reasoning items as the assistant's reasoning, tools and
 * tool_choice, stop sequences, constrained output, and the refusals. The expected messages are written out by
 * hand from the two APIs' documented meaning. */
#include <string.h>
#include "test.h"
#include "api/api.h"

static const char *const names[] = {"tiny"};
static const srv_limits lim = {names, 1, 512, 0, 1};
static const srv_limits strict = {names, 1, 512, 1, 1};

typedef struct parsed {
    srv_job j;
    srv_err e;
    int rc;
} parsed;

static void parse(parsed *p, int responses, const srv_limits *l, const char *body) {
    memset(p, 0, sizeof *p);
    snprintf(p->j.id, sizeof p->j.id, "t");
    p->rc = (responses ? api_responses_parse : api_messages_parse)(body, strlen(body), &p->j, l, &p->e);
}

static void done_with(parsed *p) {
    srv_request_free(&p->j.req);
    if (p->j.wire) p->j.wire->free_ctx(p->j.wire_ctx);
}

static int msg_is(const srv_request *r, int i, const char *role, const char *content) {
    return i < r->n_msgs && !strcmp(r->msgs[i].role, role) && !strcmp(r->msgs[i].content, content);
}

int main(void) {
    parsed p;

    /* ---- Messages ---- */
    parse(&p, 0, &lim,
          "{\"system\":[{\"type\":\"text\",\"text\":\"x-anthropic-billing-header: cc_version=1; cch=42;\"},"
          "{\"type\":\"text\",\"text\":\"You are terse.\",\"cache_control\":{\"type\":\"ephemeral\"}},"
          "{\"type\":\"text\",\"text\":\"Be kind.\"}],"
          "\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},"
          "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"Look it up.\",\"signature\":\"sig\"},"
          "{\"type\":\"text\",\"text\":\"Checking.\"},{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}}]},"
          "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"is_error\":true,"
          "\"content\":[{\"type\":\"text\",\"text\":\"down\"},{\"type\":\"text\",\"text\":\"retry\"}]},{\"type\":\"text\",\"text\":\"And now?\"}]}],"
          "\"tools\":[{\"name\":\"get_weather\",\"description\":\"Weather\",\"input_schema\":{\"type\":\"object\"}},"
          "{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}],"
          "\"tool_choice\":{\"type\":\"tool\",\"name\":\"get_weather\",\"disable_parallel_tool_use\":true},"
          "\"stop_sequences\":[\"END\"],\"max_tokens\":99,\"temperature\":0.5,\"top_k\":7,\"stream\":true,"
          "\"metadata\":{\"user_id\":\"u\"},\"context_management\":{\"edits\":[]}}");
    const srv_request *r = &p.j.req;
    CHECK(p.rc == 0, "a Claude Code-shaped request parses (%s)", p.e.msg);
    CHECK(r->n_msgs == 5 && msg_is(r, 0, "system", "You are terse.\nBe kind."),
          "system blocks joined, the billing-header block dropped");
    CHECK(msg_is(r, 1, "user", "Weather?") && msg_is(r, 2, "assistant", "Checking.") && r->msgs[2].reasoning &&
              !strcmp(r->msgs[2].reasoning, "Look it up."),
          "assistant text and thinking (as reasoning)");
    CHECK(r->n_msgs > 2 && r->msgs[2].n_tool_calls == 1 && !strcmp(r->msgs[2].tool_calls[0].id, "t1") &&
              !strcmp(r->msgs[2].tool_calls[0].name, "get_weather") &&
              !strcmp(r->msgs[2].tool_calls[0].arguments, "{\"city\":\"Paris\"}"),
          "tool_use → the assistant's tool call with its input as JSON");
    CHECK(msg_is(r, 3, "tool", "Error: down\nretry") && !strcmp(r->msgs[3].tool_call_id, "t1") &&
              r->msgs[3].name && !strcmp(r->msgs[3].name, "get_weather") && msg_is(r, 4, "user", "And now?"),
          "tool_result (is_error, text blocks) → a tool message named after its call, then the user's text");
    CHECK(r->n_tools == 1 && !strcmp(r->tools[0].name, "get_weather") && r->tools_json &&
              strstr(r->tools_json, "\"type\":\"function\"") && !strstr(r->tools_json, "web_search"),
          "tools: input_schema as a function, the server tool ignored");
    CHECK(r->tool_choice == SRV_TOOLS_NAMED && !strcmp(r->tool_choice_name, "get_weather") && r->parallel_tool_calls == -1,
          "tool_choice tool + disable_parallel_tool_use");
    CHECK(r->n_stop == 1 && !strcmp(r->stop[0], "END") && r->max_tokens == 99 && r->sp.temperature == 0.5f &&
              r->sp.top_k == 7 && r->stream,
          "stop_sequences, max_tokens, sampling, stream");
    CHECK(r->ignored && strstr(r->ignored, "metadata") && strstr(r->ignored, "context_management") &&
              strstr(r->ignored, "tools.web_search_20250305"),
          "ignored fields are listed (%s)", r->ignored ? r->ignored : "none");
    done_with(&p);

    parse(&p, 0, &strict,
          "{\"system\":\"x-anthropic-billing-header: a=1;\\nReal system.\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
          "\"thinking\":{\"type\":\"disabled\"},\"tool_choice\":{\"type\":\"any\"},\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],"
          "\"output_config\":{\"effort\":\"low\"},\"speed\":\"fast\"}");
    CHECK(p.rc == 0 && msg_is(&p.j.req, 0, "system", "Real system.") && !strcmp(p.j.req.reasoning_effort, "none") &&
              p.j.req.tool_choice == SRV_TOOLS_REQUIRED,
          "strict mode still ignores Anthropic extras; a billing-header first line of a system string dropped; "
          "thinking disabled; tool_choice any (%s)", p.e.msg);
    done_with(&p);

    parse(&p, 0, &lim, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                       "\"output_format\":{\"type\":\"json_schema\",\"schema\":{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}}}}}");
    CHECK(p.rc == 0 && p.j.req.response_format == SRV_FORMAT_JSON_SCHEMA && strstr(p.j.req.response_schema, "integer"),
          "output_format json_schema constrains the answer");
    done_with(&p);

    static const struct {
        const char *body, *param, *what;
        int status;
    } bad[] = {
        {"{\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", "messages[0]", "a system role in messages", 400},
        {"{\"messages\":[]}", "messages", "no messages", 400},
        {"{\"max_tokens\":5}", "messages", "messages missing", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}", "messages[0].content[0]", "an image block", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", "max_tokens", "max_tokens 0", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"nope\"}}", "tool_choice", "a named tool that is not declared", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop_sequences\":[1]}", "stop_sequences", "a stop sequence that is not a string", 400},
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"name\":\"f\"}]}]}", "messages[0].content[0]", "tool_use without id", 400},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        parse(&p, 0, &lim, bad[i].body);
        CHECK(p.rc == -1 && p.e.status == bad[i].status && !strcmp(p.e.param, bad[i].param), "messages: %s → %d '%s' (got %d '%s': %s)",
              bad[i].what, bad[i].status, bad[i].param, p.e.status, p.e.param, p.e.msg);
        done_with(&p);
    }
    parse(&p, 0, &strict, "{\"model\":\"claude-x\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
    CHECK(p.rc == -1 && p.e.status == 404, "strict mode refuses another model name");
    done_with(&p);

    /* ---- Responses ---- */
    parse(&p, 1, &lim,
          "{\"instructions\":\"Be brief.\",\"input\":[{\"type\":\"message\",\"role\":\"developer\",\"content\":\"Rules.\"},"
          "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Fix it\"},{\"type\":\"input_text\",\"text\":\"now\"}]},"
          "{\"type\":\"reasoning\",\"id\":\"rs\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"Plan.\"}],\"encrypted_content\":null},"
          "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"shell\",\"arguments\":\"{\\\"cmd\\\":\\\"ls\\\"}\"},"
          "{\"type\":\"custom_tool_call\",\"call_id\":\"c2\",\"name\":\"apply_patch\",\"input\":\"*** Begin Patch\\n\"},"
          "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"a.c\"},"
          "{\"type\":\"custom_tool_call_output\",\"call_id\":\"c2\",\"output\":[{\"type\":\"input_text\",\"text\":\"Done\"}]},"
          "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Fixed.\"}]},"
          "{\"type\":\"web_search_call\",\"id\":\"ws\"}],"
          "\"tools\":[{\"type\":\"function\",\"name\":\"shell\",\"parameters\":{\"type\":\"object\"}},"
          "{\"type\":\"custom\",\"name\":\"apply_patch\",\"description\":\"Patch.\",\"format\":{\"type\":\"grammar\",\"syntax\":\"lark\",\"definition\":\"start: x\"}},"
          "{\"type\":\"web_search\"},{\"type\":\"namespace\",\"name\":\"ns\",\"tools\":[]}],"
          "\"tool_choice\":{\"type\":\"custom\",\"name\":\"apply_patch\"},\"reasoning\":{\"effort\":\"medium\",\"summary\":\"auto\"},"
          "\"max_output_tokens\":50,\"store\":false,\"include\":[\"reasoning.encrypted_content\"],\"parallel_tool_calls\":false,"
          "\"text\":{\"format\":{\"type\":\"text\"},\"verbosity\":\"low\"}}");
    r = &p.j.req;
    CHECK(p.rc == 0, "a Codex-shaped request parses (%s)", p.e.msg);
    CHECK(r->n_msgs == 7 && msg_is(r, 0, "system", "Be brief.") && msg_is(r, 1, "system", "Rules.") &&
              msg_is(r, 2, "user", "Fix it\nnow"),
          "instructions, a developer message (as system) and input_text parts");
    CHECK(r->n_msgs > 3 && msg_is(r, 3, "assistant", "") && r->msgs[3].reasoning && !strcmp(r->msgs[3].reasoning, "Plan.") &&
              r->msgs[3].n_tool_calls == 2 && !strcmp(r->msgs[3].tool_calls[0].arguments, "{\"cmd\":\"ls\"}") &&
              !strcmp(r->msgs[3].tool_calls[1].name, "apply_patch") &&
              !strcmp(r->msgs[3].tool_calls[1].arguments, "{\"input\":\"*** Begin Patch\\n\"}"),
          "a reasoning item and two calls make one assistant turn; a custom call's input is its 'input' argument");
    CHECK(msg_is(r, 4, "tool", "a.c") && !strcmp(r->msgs[4].name, "shell") && msg_is(r, 5, "tool", "Done") &&
              !strcmp(r->msgs[5].tool_call_id, "c2") && msg_is(r, 6, "assistant", "Fixed."),
          "function_call_output and custom_tool_call_output → tool messages; the assistant message");
    CHECK(r->n_tools == 2 && r->tools[1].parameters && strstr(r->tools[1].parameters, "\"input\"") &&
              strstr(r->tools_json, "start: x") && !strstr(r->tools_json, "web_search") && !strstr(r->tools_json, "\"ns\""),
          "a custom tool is a function of one string 'input' with its grammar in the description; hosted tools ignored");
    CHECK(r->tool_choice == SRV_TOOLS_NAMED && !strcmp(r->tool_choice_name, "apply_patch") &&
              !strcmp(r->reasoning_effort, "high") && r->max_tokens == 50 && r->parallel_tool_calls == -1,
          "tool_choice custom, reasoning effort medium → high, max_output_tokens, parallel_tool_calls false");
    done_with(&p);

    parse(&p, 1, &lim, "{\"input\":\"hi\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"x\",\"schema\":{\"type\":\"object\"},\"strict\":true}}}");
    CHECK(p.rc == 0 && msg_is(&p.j.req, 0, "user", "hi") && p.j.req.response_format == SRV_FORMAT_JSON_SCHEMA,
          "input string; text.format json_schema");
    done_with(&p);
    parse(&p, 1, &lim, "{\"input\":[],\"max_output_tokens\":1}");
    CHECK(p.rc == 0 && p.j.req.n_msgs == 0 && p.j.req.max_tokens == 1, "an empty input (Codex's probe) parses");
    done_with(&p);

    static const struct {
        const char *body, *param, *what;
    } rbad[] = {
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id", "previous_response_id"},
        {"{\"input\":\"x\",\"conversation\":\"c\"}", "conversation", "conversation"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"x\"}]}]}", "input[0]", "an input_image part"},
        {"{\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}", "input[0]", "a function_call without call_id"},
        {"{\"input\":[{\"role\":\"critic\",\"content\":\"x\"}]}", "input[0]", "an unknown role"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", "text.format.type", "an unknown text format"},
        {"{\"input\":\"x\",\"reasoning\":{\"effort\":\"huge\"}}", "reasoning.effort", "an unknown effort"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"bad name\"}]}", "tools[0]", "a bad tool name"},
        {"{\"input\":7}", "input", "input of the wrong type"},
    };
    for (size_t i = 0; i < sizeof rbad / sizeof *rbad; i++) {
        parse(&p, 1, &lim, rbad[i].body);
        CHECK(p.rc == -1 && p.e.status == 400 && !strcmp(p.e.param, rbad[i].param), "responses: %s → 400 '%s' (got %d '%s': %s)",
              rbad[i].what, rbad[i].param, p.e.status, p.e.param, p.e.msg);
        done_with(&p);
    }
    TEST_EXIT();
}
