/* test_chat.c — golden prompt ids for the K3 XTML and Kimi-Linear/K2 chat formats, written out by hand
 * on byte-level test vocabularies (tests/tokenizer/tiny_k3, tiny_k2: text bytes are their own ids,
 * specials sit at 257 + (Kimi id − 163584)), and the reasoning/answer splitter on generated ids. */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/toolcall.h"

/* Hand-written ids of the specials in the test folders (tokenizer_config.json). */
static const struct {
    const char *name;
    int32_t id;
} SPECIAL_IDS[] = {
    {"<|end_of_msg|>", 259}, {"<|open|>", 260},        {"<|close|>", 261},   {"<|sep|>", 262},
    {"<|im_end|>", 259},     {"<|im_user|>", 260},     {"<|im_assistant|>", 261},
    {"<|im_system|>", 267},  {"<|im_middle|>", 274},
    /* added by test_k2_tools: the tiny K2 folder has no tool-call tokens */
    {"<|tool_calls_section_begin|>", 610}, {"<|tool_calls_section_end|>", 611}, {"<|tool_call_begin|>", 612},
    {"<|tool_call_argument_begin|>", 613}, {"<|tool_call_end|>", 614},
};

/* Expected prompt: a list of special names and literal text; text contributes one id per byte (no "xx"). */
static tok_ids expect(const char *const *parts, const char *family) {
    tok_ids e = {0};
    for (; *parts; parts++) {
        int32_t id = -1;
        for (size_t k = 0; k < sizeof SPECIAL_IDS / sizeof SPECIAL_IDS[0]; k++)
            if (!strcmp(*parts, SPECIAL_IDS[k].name) &&
                (strncmp(*parts, "<|im_", 5) && strncmp(*parts, "<|tool_", 7) ? !strcmp(family, "k3")
                                                                                : !strcmp(family, "k2")))
                id = SPECIAL_IDS[k].id;
        if (id >= 0) tok_ids_push(&e, id);
        else for (const unsigned char *c = (const unsigned char *)*parts; *c; c++) tok_ids_push(&e, *c);
    }
    return e;
}

static int same(const tok_ids *a, const tok_ids *b) {
    return a->n == b->n && !memcmp(a->v, b->v, a->n * sizeof *a->v);
}

static void golden(const tokenizer *t, chat_format fmt, const chat_message *m, int n, const chat_opts *o,
                   const char *const *parts, const char *family, const char *what) {
    tok_ids got = {0}, want = expect(parts, family);
    df_error err = {0};
    int rc = chat_render(t, fmt, m, n, o, &got, &err);
    CHECK(rc == DF_OK && same(&got, &want), "%s %s (%zu ids, want %zu) %s", family, what, got.n, want.n, err.msg);
    tok_ids_free(&got);
    tok_ids_free(&want);
}

#define EFFORT(e)                                                                                             \
    "<|open|>", "message role=\"system\" type=\"thinking-effort\"", "<|sep|>",                                 \
        "`thinking_effort` guides on how much to think in your thinking channel (not including the response " \
        "channel), supported values include `low`, `medium`, `high`, and `max`.\n"                             \
        "Now the system is invoked with `thinking_effort=" e "`.",                                            \
        "<|close|>", "message", "<|sep|>", "<|end_of_msg|>"
#define K3MSG(role, text) "<|open|>", "message role=\"" role "\"", "<|sep|>", text, "<|close|>", "message", "<|sep|>", "<|end_of_msg|>"

/* test_k3_tools's assistant tool section: f's arguments one by one, g's unparsable ones as one json block. */
#define K3_TWO_CALLS \
    "<|close|>", "response", "<|sep|>", "<|open|>", "tools", "<|sep|>", \
    "<|open|>", "call tool=\"f\" index=\"1\"", "<|sep|>", \
    "<|open|>", "argument key=\"b\" type=\"string\"", "<|sep|>", "x", "<|close|>", "argument", "<|sep|>", \
    "<|open|>", "argument key=\"a\" type=\"array\"", "<|sep|>", "[1, 2]", "<|close|>", "argument", "<|sep|>", \
    "<|close|>", "call", "<|sep|>", \
    "<|open|>", "call tool=\"g\" index=\"2\"", "<|sep|>", \
    "<|open|>", "json type=\"object\"", "<|sep|>", "not json", "<|close|>", "json", "<|sep|>", \
    "<|close|>", "call", "<|sep|>", "<|close|>", "tools", "<|sep|>", "<|close|>", "message", "<|sep|>", "<|end_of_msg|>"

static void test_k3(const tokenizer *t) {
    chat_format fmt = 0;
    df_error err = {0};
    CHECK(chat_detect_format(t, &fmt, &err) == DF_OK && fmt == CHAT_K3, "tiny_k3 folder -> K3 format");
    chat_opts o;
    chat_opts_default(&o);

    chat_message su[] = {{"system", "Be brief.", NULL}, {"user", "Hi there", NULL}};
    static const char *const su_want[] = {EFFORT("max"), K3MSG("system", "Be brief."), K3MSG("user", "Hi there"),
                                          "<|open|>", "message role=\"assistant\"", "<|sep|>",
                                          "<|open|>", "think", "<|sep|>", NULL};
    golden(t, fmt, su, 2, &o, su_want, "k3", "system+user, thinking (effort max)");

    chat_opts off = o;
    off.thinking = 0;
    chat_message u[] = {{"user", "Hi", NULL}};
    static const char *const u_want[] = {K3MSG("user", "Hi"), "<|open|>", "message role=\"assistant\"", "<|sep|>",
                                         "<|open|>", "response", "<|sep|>", NULL};
    golden(t, fmt, u, 1, &off, u_want, "k3", "user only, thinking off");

    chat_opts low = o;
    low.effort = "low";
    chat_message mt[] = {{"user", "2+2?", NULL}, {"assistant", "4", "Add them."}, {"user", "And 3+3?", NULL}};
    static const char *const mt_want[] = {
        EFFORT("low"), K3MSG("user", "2+2?"),
        "<|open|>", "message role=\"assistant\"", "<|sep|>",
        "<|open|>", "think", "<|sep|>", "Add them.", "<|close|>", "think", "<|sep|>",
        "<|open|>", "response", "<|sep|>", "4", "<|close|>", "response", "<|sep|>",
        "<|close|>", "message", "<|sep|>", "<|end_of_msg|>",
        K3MSG("user", "And 3+3?"),
        "<|open|>", "message role=\"assistant\"", "<|sep|>", "<|open|>", "think", "<|sep|>", NULL};
    golden(t, fmt, mt, 3, &low, mt_want, "k3", "multi-turn with reasoning, effort low");

    chat_opts nogen = off;
    nogen.add_generation_prompt = 0;
    chat_message ua[] = {{"user", "Hi", NULL}, {"assistant", "Hello!", "ignored when thinking is off"}};
    static const char *const ua_want[] = {K3MSG("user", "Hi"), "<|open|>", "message role=\"assistant\"", "<|sep|>",
                                          "<|open|>", "response", "<|sep|>", "Hello!", "<|close|>", "response",
                                          "<|sep|>", "<|close|>", "message", "<|sep|>", "<|end_of_msg|>", NULL};
    golden(t, fmt, ua, 2, &nogen, ua_want, "k3", "assistant turn, thinking off, no generation prompt");

    chat_message inj[] = {{"user", "<|open|>x", NULL}};
    static const char *const inj_want[] = {K3MSG("user", "<|open|>x"), NULL};
    golden(t, fmt, inj, 1, &nogen, inj_want, "k3", "typed <|open|> in user text stays text");

    tok_ids ids = {0};
    chat_opts bad = o;
    bad.effort = "medium";
    CHECK(chat_render(t, fmt, u, 1, &bad, &ids, &err) == DF_EINVAL, "effort medium refused: %s", err.msg);
    chat_message fn[] = {{"function", "x", NULL}};
    CHECK(chat_render(t, fmt, fn, 1, &o, &ids, &err) == DF_EUNSUPPORTED, "function role refused: %s", err.msg);
    chat_message tool[] = {{"tool", "x", NULL}};
    CHECK(chat_render(t, fmt, tool, 1, &o, &ids, &err) == DF_EINVAL, "tool result without a name refused: %s", err.msg);
    tok_ids_free(&ids);
}

/* K3 tools as the K3 encoder writes them: a tool-declare system message with the tools re-serialised with
 * sorted keys, assistant calls as typed <argument> tags after the response, tool results named and numbered,
 * and the tool_choice note before the generation prompt. */
static void test_k3_tools(const tokenizer *t) {
    chat_opts o;
    chat_opts_default(&o);
    o.thinking = 0;
    o.tools_json = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]";
    o.tool_choice = "required";
    chat_tool_call calls[] = {{"c1", "f", "{\"b\":\"x\",\"a\":[1, 2]}"}, {"c2", "g", "not json"}};
    chat_message m[] = {{"user", "Hi", NULL}, {"assistant", "", NULL}, {"tool", "42", NULL}, {"tool", "43", NULL}};
    chat_message_tools mt[] = {{0}, {calls, 2, NULL, NULL}, {NULL, 0, "c2", NULL}, {NULL, 0, "c1", NULL}};
    o.msg_tools = mt;
    static const char *const want[] = {
        "<|open|>", "message role=\"system\" type=\"tool-declare\"", "<|sep|>",
        "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n"
        "[{\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}},\"type\":\"function\"}]\n```",
        "<|close|>", "message", "<|sep|>", "<|end_of_msg|>",
        K3MSG("user", "Hi"),
        "<|open|>", "message role=\"assistant\"", "<|sep|>", "<|open|>", "response", "<|sep|>",
        K3_TWO_CALLS,
        K3MSG("tool\" tool=\"f\" index=\"1", "43"), K3MSG("tool\" tool=\"g\" index=\"2", "42"),
        "<|open|>", "message role=\"system\" type=\"tool-choice\"", "<|sep|>",
        "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.",
        "<|close|>", "message", "<|sep|>", "<|end_of_msg|>",
        "<|open|>", "message role=\"assistant\"", "<|sep|>", "<|open|>", "response", "<|sep|>", NULL};
    golden(t, CHAT_K3, m, 4, &o, want, "k3",
           "tools declared, calls as arguments / json block, results re-sorted into call order, tool_choice");

    chat_opts f = o;
    f.tools_json = NULL;
    f.tool_choice = NULL;
    f.msg_tools = NULL;
    f.response_format = "json_schema";
    f.response_schema = "{\"type\":\"object\",\"required\":[\"a\"]}";
    static const char *const fwant[] = {
        K3MSG("user", "Hi"),
        "<|open|>", "message role=\"system\" type=\"response-format\"", "<|sep|>",
        "The system is invoked with `response_format=json_schema`.\nYour response must be raw JSON data without "
        "markdown code blocks (```json) or any additional formatting.\nThe JSON data must match the following "
        "schema:\n```json\n{\"required\":[\"a\"],\"type\":\"object\"}\n```",
        "<|close|>", "message", "<|sep|>", "<|end_of_msg|>",
        "<|open|>", "message role=\"assistant\"", "<|sep|>", "<|open|>", "response", "<|sep|>", NULL};
    golden(t, CHAT_K3, m, 1, &f, fwant, "k3", "response_format json_schema note");

    chat_opts one = o;
    one.tools_json = NULL;
    one.tool_choice = NULL;
    one.add_generation_prompt = 0;
    chat_message_tools mt1[] = {{0}, {calls, 2, NULL, NULL}, {NULL, 0, "c2", NULL}};
    one.msg_tools = mt1;
    static const char *const owant[] = {
        K3MSG("user", "Hi"),
        "<|open|>", "message role=\"assistant\"", "<|sep|>", "<|open|>", "response", "<|sep|>",
        K3_TWO_CALLS,
        K3MSG("tool\" tool=\"g\" index=\"1", "42"), NULL};
    golden(t, CHAT_K3, m, 3, &one, owant, "k3", "one result of two calls: named after its call, numbered 1");
}

/* K2: tool_declare turn first, calls in a section after the content (ids kept, or functions.NAME:IDX), results
 * as "## Return of ID". */
static void test_k2_tools(tokenizer *t) {
    df_error err = {0};
    static const char *const names[] = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                        "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"};
    for (int i = 0; i < 5; i++) tokenizer_add_special(t, names[i], 610 + i, &err);
    chat_opts o;
    chat_opts_default(&o);
    o.thinking = 0;
    o.tools_json = "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]";
    chat_tool_call calls[] = {{"functions.f:0", "f", "{\"a\":1}"}, {NULL, "g", ""}};
    chat_message m[] = {{"user", "Hi", NULL}, {"assistant", "Sure.", NULL}, {"tool", "42", NULL}};
    chat_message_tools mt[] = {{0}, {calls, 2, NULL, NULL}, {NULL, 0, "functions.f:0", NULL}};
    o.msg_tools = mt;
    static const char *const want[] = {
        "<|im_system|>", "tool_declare", "<|im_middle|>", "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]",
        "<|im_end|>", "<|im_system|>", "system", "<|im_middle|>", "You are Kimi, an AI assistant created by Moonshot AI.",
        "<|im_end|>", "<|im_user|>", "user", "<|im_middle|>", "Hi", "<|im_end|>",
        "<|im_assistant|>", "assistant", "<|im_middle|>", "Sure.", "<|tool_calls_section_begin|>",
        "<|tool_call_begin|>", "functions.f:0", "<|tool_call_argument_begin|>", "{\"a\":1}", "<|tool_call_end|>",
        "<|tool_call_begin|>", "functions.g:1", "<|tool_call_argument_begin|>", "{}", "<|tool_call_end|>",
        "<|tool_calls_section_end|>", "<|im_end|>",
        "<|im_system|>", "tool", "<|im_middle|>", "## Return of functions.f:0\n42", "<|im_end|>",
        "<|im_assistant|>", "assistant", "<|im_middle|>", NULL};
    golden(t, CHAT_K2, m, 3, &o, want, "k2", "tool_declare, tool-call section, tool result");
}

/* ids for a list of special names and text (tiny vocabularies: a text byte is its own id) */
static tok_ids ids_of(const tokenizer *t, const char *const *parts) {
    tok_ids e = {0};
    for (; *parts; parts++) {
        int32_t id = (*parts)[0] == '<' && (*parts)[1] == '|' ? tokenizer_special_id(t, *parts) : -1;
        if (id >= 0) tok_ids_push(&e, id);
        else for (const unsigned char *c = (const unsigned char *)*parts; *c; c++) tok_ids_push(&e, *c);
    }
    return e;
}

static void test_tool_parser(const tokenizer *k3, const tokenizer *k2) {
    static const char *const k2_gen[] = {"Let me check.", "<|tool_calls_section_begin|>", "<|tool_call_begin|>",
                                         " functions.get_weather:3", "<|tool_call_argument_begin|>",
                                         "{\"city\":\"Paris\"}", "<|tool_call_end|>", "<|tool_call_begin|>",
                                         "functions.f:4", "<|tool_call_argument_begin|>", "{}", "<|tool_call_end|>",
                                         "<|tool_calls_section_end|>", "<|im_end|>", NULL};
    tok_ids g = ids_of(k2, k2_gen);
    chat_tool_parser *p = chat_tool_parser_new(k2, CHAT_K2);
    size_t text = 0, consumed = 0;
    for (size_t i = 0; i < g.n; i++) {
        if (chat_tool_parser_feed(p, g.v[i])) consumed++;
        else text++;
    }
    const chat_call *a = chat_tool_parser_count(p) == 2 ? chat_tool_parser_call(p, 0) : NULL;
    const chat_call *b = a ? chat_tool_parser_call(p, 1) : NULL;
    CHECK(a && text == strlen("Let me check.") + 1 && !strcmp(a->id, "functions.get_weather:3") &&
              !strcmp(a->name, "get_weather") && !strcmp(a->args, "{\"city\":\"Paris\"}") && a->done &&
              !strcmp(b->name, "f") && !strcmp(b->args, "{}"),
          "K2 tool calls read back; the section stays out of the text (%zu text ids, %zu consumed)", text, consumed);
    chat_tool_parser_free(p);
    tok_ids_free(&g);

    static const char *const k3_gen[] = {
        "<|close|>", "response", "<|sep|>", "<|open|>", "tools", "<|sep|>",
        "<|open|>", "call tool=\"get_weather\" index=\"1\"", "<|sep|>",
        "<|open|>", "argument key=\"city\" type=\"string\"", "<|sep|>", "Pa\"ris\n", "<|close|>", "argument", "<|sep|>",
        "<|open|>", "argument key=\"days\" type=\"number\"", "<|sep|>", "3", "<|close|>", "argument", "<|sep|>",
        "<|close|>", "call", "<|sep|>",
        "<|open|>", "call tool=\"a&amp;b\" index=\"2\"", "<|sep|>",
        "<|open|>", "json type=\"object\"", "<|sep|>", "{\"x\":[1]}", "<|close|>", "json", "<|sep|>",
        "<|close|>", "call", "<|sep|>", "<|close|>", "tools", "<|sep|>", "<|close|>", "message", "<|sep|>",
        "<|end_of_msg|>", NULL};
    g = ids_of(k3, k3_gen);
    p = chat_tool_parser_new(k3, CHAT_K3);
    consumed = 0;
    for (size_t i = 0; i < g.n; i++) consumed += (size_t)chat_tool_parser_feed(p, g.v[i]);
    a = chat_tool_parser_count(p) == 2 ? chat_tool_parser_call(p, 0) : NULL;
    b = a ? chat_tool_parser_call(p, 1) : NULL;
    CHECK(a && !consumed && !strcmp(a->name, "get_weather") && !strcmp(a->id, "call_1") &&
              !strcmp(a->args, "{\"city\":\"Pa\\\"ris\\n\",\"days\":3}") && !strcmp(b->name, "a&b") &&
              !strcmp(b->args, "{\"x\":[1]}") && b->done,
          "K3 tool calls read back from argument tags and a json block (%s | %s)", a ? a->args : "-", b ? b->args : "-");
    chat_tool_parser_free(p);
    tok_ids_free(&g);
}

#define K2DEF "<|im_system|>", "system", "<|im_middle|>", "You are Kimi, an AI assistant created by Moonshot AI.", "<|im_end|>"

static void test_k2(const tokenizer *t) {
    chat_format fmt = 0;
    df_error err = {0};
    CHECK(chat_detect_format(t, &fmt, &err) == DF_OK && fmt == CHAT_K2, "tiny_k2 folder -> K2 format");
    chat_opts o;
    chat_opts_default(&o);
    o.thinking = 0;

    chat_message u[] = {{"user", "Hi", NULL}};
    static const char *const u_want[] = {K2DEF, "<|im_user|>", "user", "<|im_middle|>", "Hi", "<|im_end|>",
                                         "<|im_assistant|>", "assistant", "<|im_middle|>", NULL};
    golden(t, fmt, u, 1, &o, u_want, "k2", "user only inserts the default system prompt");

    chat_message mt[] = {{"system", "Be brief.", NULL}, {"user", "2+2?", NULL}, {"assistant", "4", "r"},
                         {"user", "3+3?", NULL}};
    static const char *const mt_want[] = {
        "<|im_system|>", "system", "<|im_middle|>", "Be brief.", "<|im_end|>",
        "<|im_user|>", "user", "<|im_middle|>", "2+2?", "<|im_end|>",
        "<|im_assistant|>", "assistant", "<|im_middle|>", "4", "<|im_end|>",
        "<|im_user|>", "user", "<|im_middle|>", "3+3?", "<|im_end|>",
        "<|im_assistant|>", "assistant", "<|im_middle|>", NULL};
    golden(t, fmt, mt, 4, &o, mt_want, "k2", "system + multi-turn, no newlines between turns");

    chat_opts th = o;
    th.thinking = 1;
    th.add_generation_prompt = 0;
    chat_message r[] = {{"user", "a", NULL}, {"assistant", "b", "old"}, {"user", "c", NULL}, {"assistant", "d", "new"}};
    static const char *const r_want[] = {
        K2DEF, "<|im_user|>", "user", "<|im_middle|>", "a", "<|im_end|>",
        "<|im_assistant|>", "assistant", "<|im_middle|>", "<think></think>b", "<|im_end|>",
        "<|im_user|>", "user", "<|im_middle|>", "c", "<|im_end|>",
        "<|im_assistant|>", "assistant", "<|im_middle|>", "<think>new</think>d", "<|im_end|>", NULL};
    golden(t, fmt, r, 4, &th, r_want, "k2", "thinking: reasoning kept only after the last user turn");
}

static void feed_all(chat_splitter *s, const int32_t *ids, size_t n, chat_text *rs, chat_text *ct, int *ended,
                     int *partial_seen) {
    for (size_t i = 0; i < n; i++) {
        *ended = chat_splitter_feed(s, ids[i], rs, ct);
        if ((rs->len && (uint8_t)rs->p[rs->len - 1] >= 0xC0) || (ct->len && (uint8_t)ct->p[ct->len - 1] >= 0xC0))
            *partial_seen = 1;
    }
}

static void push_text(tok_ids *a, const char *s) {
    for (; *s; s++) tok_ids_push(a, (uint8_t)*s);
}

static void test_splitter(const tokenizer *k3, tokenizer *k2) {
    tok_ids g = {0};
    push_text(&g, "Let me think \xc3\xa9");   /* é arrives as two byte tokens */
    int32_t mid[] = {261, 't', 'h', 'i', 'n', 'k', 262, 260, 'r', 'e', 's', 'p', 'o', 'n', 's', 'e', 262};
    for (size_t i = 0; i < sizeof mid / sizeof mid[0]; i++) tok_ids_push(&g, mid[i]);
    push_text(&g, "Answer.");
    int32_t end[] = {261, 'r', 'e', 's', 'p', 'o', 'n', 's', 'e', 262, 261, 'm', 'e', 's', 's', 'a', 'g', 'e', 262, 259, 'z'};
    for (size_t i = 0; i < sizeof end / sizeof end[0]; i++) tok_ids_push(&g, end[i]);

    chat_text rs = {0}, ct = {0};
    int ended = 0, partial = 0;
    chat_splitter *s = chat_splitter_new(k3, CHAT_K3, 1);
    feed_all(s, g.v, g.n, &rs, &ct, &ended, &partial);
    chat_splitter_finish(s, &rs, &ct);
    CHECK(ended && !partial && rs.len == 15 && !memcmp(rs.p, "Let me think \xc3\xa9", 15) && ct.len == 7 &&
              !memcmp(ct.p, "Answer.", 7),
          "K3: reasoning / answer split, no half characters, stops at <|end_of_msg|>");
    chat_splitter_free(s);
    chat_text_free(&rs);
    chat_text_free(&ct);

    s = chat_splitter_new(k3, CHAT_K3, 0);
    int32_t plain[] = {'O', 'K', 261, 'r', 'e', 's', 'p', 'o', 'n', 's', 'e', 262, 259};
    feed_all(s, plain, 13, &rs, &ct, &ended, &partial);
    CHECK(ended && rs.len == 0 && ct.len == 2 && !memcmp(ct.p, "OK", 2), "K3 thinking off: all answer");
    chat_splitter_free(s);
    chat_text_free(&rs);
    chat_text_free(&ct);

    g.n = 0;
    push_text(&g, "<think>why?</think>Because.");
    tok_ids_push(&g, 259);   /* <|im_end|> */
    s = chat_splitter_new(k2, CHAT_K2, 0);
    feed_all(s, g.v, g.n, &rs, &ct, &ended, &partial);
    CHECK(ended && rs.len == 4 && !memcmp(rs.p, "why?", 4) && ct.len == 8 && !memcmp(ct.p, "Because.", 8),
          "K2: textual <think>…</think> markers");
    chat_splitter_free(s);
    chat_text_free(&rs);
    chat_text_free(&ct);

    g.n = 0;
    push_text(&g, "<thin");
    s = chat_splitter_new(k2, CHAT_K2, 0);
    feed_all(s, g.v, g.n, &rs, &ct, &ended, &partial);
    chat_splitter_finish(s, &rs, &ct);
    CHECK(!ended && ct.len == 5 && !memcmp(ct.p, "<thin", 5), "K2: a held-back partial marker is flushed as text");
    chat_splitter_free(s);
    chat_text_free(&rs);
    chat_text_free(&ct);

    df_error err = {0};
    tokenizer_add_special(k2, "<think>", 600, &err);
    tokenizer_add_special(k2, "</think>", 601, &err);
    int32_t sp[] = {600, 'w', 'h', 'y', 601, 'A', 259};
    s = chat_splitter_new(k2, CHAT_K2, 0);
    feed_all(s, sp, 7, &rs, &ct, &ended, &partial);
    CHECK(ended && rs.len == 3 && !memcmp(rs.p, "why", 3) && ct.len == 1 && ct.p[0] == 'A',
          "K2.5: special <think> tokens");
    chat_splitter_free(s);
    chat_text_free(&rs);
    chat_text_free(&ct);

    chat_opts o;
    chat_opts_default(&o);
    chat_message u[] = {{"user", "Hi", NULL}};
    tok_ids ids = {0};
    CHECK(chat_render(k2, CHAT_K2, u, 1, &o, &ids, &err) == DF_OK && ids.n && ids.v[ids.n - 1] == 600,
          "K2.5 thinking: generation prompt ends with <think>");
    tok_ids_free(&ids);
    tok_ids_free(&g);
}

int main(void) {
    tokenizer *k3 = NULL, *k2 = NULL;
    df_error err = {0};
    CHECK(tokenizer_load_dir(&k3, "tests/tokenizer/tiny_k3", &err) == DF_OK, "load tiny_k3 (%s)", err.msg);
    CHECK(tokenizer_load_dir(&k2, "tests/tokenizer/tiny_k2", &err) == DF_OK, "load tiny_k2 (%s)", err.msg);
    if (!k3 || !k2) TEST_EXIT();
    test_k3(k3);
    test_k2(k2);
    test_k3_tools(k3);
    test_k2_tools(k2);
    test_tool_parser(k3, k2);
    test_splitter(k3, k2);
    tokenizer_free(k3);
    tokenizer_free(k2);
    TEST_EXIT();
}
