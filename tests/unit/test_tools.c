/* test_tools.c — a forced tool call from request to parsed call without a model: the server's grammar for
 * tool_choice required/named (K2 syntax on the tiny K2 vocabulary with tool tokens added, K3 XTML on the tiny
 * K3 vocabulary) drives generation from random logits, the tool-call parser reads the ids back, and every
 * call must name a declared function and carry arguments that satisfy its schema (checked here by hand). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "server/srv_internal.h"
#include "server/tools.h"
#include "test.h"

static const char *const REQUEST =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"tools\":["
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},\"days\":{\"type\":\"integer\",\"minimum\":1,"
    "\"maximum\":7}},\"required\":[\"city\",\"days\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"zone\":{\"enum\":[\"utc\",\"cet\"]}},\"required\":[\"zone\"],\"additionalProperties\":false}}}],"
    "\"tool_choice\":%s%s}";

static uint64_t rng = 88172645463325252ull;
static float noise(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)(rng >> 40) / (float)(1 << 24);
}

static int args_ok(const char *name, const char *args) {
    json_t *a = json_loads(args, 0, NULL);
    int ok = json_is_object(a);
    if (ok && !strcmp(name, "get_weather")) {
        json_t *c = json_object_get(a, "city"), *d = json_object_get(a, "days");
        ok = json_object_size(a) == 2 && json_is_string(c) && strlen(json_string_value(c)) <= 12 * 4 &&
             json_is_integer(d) && json_integer_value(d) >= 1 && json_integer_value(d) <= 7;
    } else if (ok && !strcmp(name, "get_time")) {
        const char *z = json_string_value(json_object_get(a, "zone"));
        ok = json_object_size(a) == 1 && z && (!strcmp(z, "utc") || !strcmp(z, "cet"));
    } else {
        ok = 0;
    }
    json_decref(a);
    return ok;
}

/* Runs `runs` forced generations; returns how many produced only valid calls (and at least one). */
static int forced(tokenizer *t, chat_format fmt, int32_t eos, const char *choice, const char *extra, int runs,
                  int *max_calls, const char *only_name, char *why, size_t why_len) {
    srv s;
    memset(&s, 0, sizeof s);
    df_model_info info;
    memset(&info, 0, sizeof info);
    info.eos_id = eos;
    info.vocab_size = tokenizer_n_vocab(t);
    s.tok = t;
    s.fmt = fmt;
    s.info = &info;
    int good = 0, nv = tokenizer_n_vocab(t);
    float *logits = xmalloc((size_t)nv * sizeof *logits);
    *max_calls = 0;
    for (int run = 0; run < runs; run++) {
        srv_job j;
        memset(&j, 0, sizeof j);
        char body[2048];
        snprintf(body, sizeof body, REQUEST, choice, extra);
        srv_err err = {0};
        srv_limits lim = {.n_vocab = nv, .max_choices = 1};
        if (srv_request_parse(body, strlen(body), SRV_EP_CHAT, &lim, &j.req, &err)) {
            snprintf(why, why_len, "parse: %s", err.msg);
            break;
        }
        j.max_tokens = 400;
        if (tools_prepare(&s, &j, &err)) {
            snprintf(why, why_len, "prepare: %s", err.msg);
            srv_request_free(&j.req);
            break;
        }
        gen_config cfg;
        memset(&cfg, 0, sizeof cfg);
        tools_gen_config(&s, &j, &cfg);
        int ended = 0;
        for (int i = 0; i < j.max_tokens && !ended; i++) {
            for (int k = 0; k < nv; k++) logits[k] = noise() * 4;
            cfg.mask(cfg.mask_ctx, logits, nv, j.max_tokens - i);
            int32_t best = 0;
            for (int k = 1; k < nv; k++)
                if (logits[k] > logits[best]) best = k;
            if (logits[best] == -INFINITY) break;
            cfg.mask_accept(cfg.mask_ctx, best);
            chat_tool_parser_feed(cfg.tools, best);
            ended = best == eos;
        }
        int n = chat_tool_parser_count(cfg.tools), ok = ended && n >= 1;
        for (int i = 0; i < n && ok; i++) {
            const chat_call *c = chat_tool_parser_call(cfg.tools, i);
            ok = c->done && c->id && args_ok(c->name, c->args) && (!*only_name || !strcmp(c->name, only_name));
            if (!ok) snprintf(why, why_len, "call %s(%s) id %s", c->name, c->args, c->id ? c->id : "-");
        }
        if (!ended) snprintf(why, why_len, "generation did not end");
        good += ok;
        if (n > *max_calls) *max_calls = n;
        tools_job_free(&j);
        srv_request_free(&j.req);
    }
    grammar_vocab_free(s.gvocab);
    free(logits);
    return good;
}

int main(void) {
    tokenizer *k3 = NULL, *k2 = NULL;
    df_error err = {0};
    CHECK(tokenizer_load_dir(&k3, "tests/tokenizer/tiny_k3", &err) == DF_OK, "load tiny_k3 (%s)", err.msg);
    CHECK(tokenizer_load_dir(&k2, "tests/tokenizer/tiny_k2", &err) == DF_OK, "load tiny_k2 (%s)", err.msg);
    if (!k3 || !k2) TEST_EXIT();
    static const char *const names[] = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                        "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"};
    for (int i = 0; i < 5; i++) tokenizer_add_special(k2, names[i], 610 + i, &err);
    struct {
        tokenizer *t;
        chat_format fmt;
        const char *eos, *fam;
    } cases[] = {{k2, CHAT_K2, "<|im_end|>", "K2"}, {k3, CHAT_K3, "<|end_of_msg|>", "K3"}};
    for (int c = 0; c < 2; c++) {
        int32_t eos = tokenizer_special_id(cases[c].t, cases[c].eos);
        char why[512];
        int max_calls;
        why[0] = 0;
        int g = forced(cases[c].t, cases[c].fmt, eos, "\"required\"", "", 12, &max_calls, "", why, sizeof why);
        CHECK(g == 12 && max_calls > 1, "%s required: %d/12 generations are valid calls, up to %d in parallel %s",
              cases[c].fam, g, max_calls, why);
        why[0] = 0;
        g = forced(cases[c].t, cases[c].fmt, eos, "\"required\"", ",\"parallel_tool_calls\":false", 6, &max_calls,
                   "", why, sizeof why);
        CHECK(g == 6 && max_calls == 1, "%s parallel_tool_calls false: one valid call each time %s", cases[c].fam, why);
        why[0] = 0;
        g = forced(cases[c].t, cases[c].fmt, eos, "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}", "", 6,
                   &max_calls, "get_time", why, sizeof why);
        CHECK(g == 6 && max_calls == 1, "%s named function: get_time with valid arguments %s", cases[c].fam, why);
    }
    /* tool_choice none (K2): the ids that would open a call are masked out, everything else is left alone */
    srv s;
    memset(&s, 0, sizeof s);
    df_model_info info = {0};
    info.eos_id = tokenizer_special_id(k2, "<|im_end|>");
    s.tok = k2;
    s.fmt = CHAT_K2;
    s.info = &info;
    srv_job j;
    memset(&j, 0, sizeof j);
    char body[2048];
    snprintf(body, sizeof body, REQUEST, "\"none\"", "");
    srv_err e = {0};
    srv_limits lim = {.n_vocab = tokenizer_n_vocab(k2), .max_choices = 1};
    int nv = tokenizer_n_vocab(k2), masked = 0, kept = 0;
    if (!srv_request_parse(body, strlen(body), SRV_EP_CHAT, &lim, &j.req, &e) && !tools_prepare(&s, &j, &e)) {
        gen_config cfg;
        memset(&cfg, 0, sizeof cfg);
        tools_gen_config(&s, &j, &cfg);
        float *logits = xcalloc((size_t)nv, sizeof *logits);
        if (cfg.mask) cfg.mask(cfg.mask_ctx, logits, nv, 10);
        for (int k = 0; k < nv; k++) {
            int opener = k == tokenizer_special_id(k2, "<|tool_calls_section_begin|>") ||
                         k == tokenizer_special_id(k2, "<|tool_call_begin|>");
            if (opener) masked += logits[k] == -INFINITY;
            else kept += logits[k] == 0;
        }
        free(logits);
        tools_job_free(&j);
    }
    srv_request_free(&j.req);
    CHECK(masked == 2 && kept == nv - 2, "K2 tool_choice none: the two call openers are masked, nothing else (%s)",
          e.msg);
    tokenizer_free(k3);
    tokenizer_free(k2);
    TEST_EXIT();
}
