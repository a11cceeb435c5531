/* test_chat.c — golden prompt ids for the K3 XTML and Kimi-Linear/K2 chat formats, written out by hand from
 * SPEC §5 on byte-level test vocabularies (tests/tokenizer/tiny_k3, tiny_k2: text bytes are their own ids,
 * specials sit at 257 + (Kimi id − 163584)), and the reasoning/answer splitter on generated ids. */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "tokenizer/tokenizer.h"

/* Hand-written ids of the specials in the test folders (tokenizer_config.json). */
static const struct {
    const char *name;
    int32_t id;
} SPECIAL_IDS[] = {
    {"<|end_of_msg|>", 259}, {"<|open|>", 260},        {"<|close|>", 261},   {"<|sep|>", 262},
    {"<|im_end|>", 259},     {"<|im_user|>", 260},     {"<|im_assistant|>", 261},
    {"<|im_system|>", 267},  {"<|im_middle|>", 274},
};

/* Expected prompt: a list of special names and literal text; text contributes one id per byte (no "xx"). */
static tok_ids expect(const char *const *parts, const char *family) {
    tok_ids e = {0};
    for (; *parts; parts++) {
        int32_t id = -1;
        for (size_t k = 0; k < sizeof SPECIAL_IDS / sizeof SPECIAL_IDS[0]; k++)
            if (!strcmp(*parts, SPECIAL_IDS[k].name) &&
                (strncmp(*parts, "<|im_", 5) ? !strcmp(family, "k3") : !strcmp(family, "k2")))
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
    chat_message tool[] = {{"tool", "x", NULL}};
    CHECK(chat_render(t, fmt, tool, 1, &o, &ids, &err) == DF_EUNSUPPORTED, "tool role refused: %s", err.msg);
    tok_ids_free(&ids);
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
    test_splitter(k3, k2);
    tokenizer_free(k3);
    tokenizer_free(k2);
    TEST_EXIT();
}
