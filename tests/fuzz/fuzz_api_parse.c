/* fuzz_api_parse.c — libFuzzer target for the Anthropic Messages and OpenAI Responses request parsers
 * (src/api/api_messages.c, api_responses.c): the first byte picks the API and strict mode, the rest is
 * the body. Any input must become a well-formed chat request or be refused with a 4xx and a message; never
 * crash, hang or leak. The answer side of those files is linked but not run: the symbols it needs from the
 * HTTP layer and the tool-call parser are stubs here. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "api/api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- the answer side's dependencies, never called ---- */
enum MHD_Result http_generate(srv *s, struct MHD_Connection *c, conn_ctx *cc, const srv_wire *wire,
                              http_parse_fn parse, void *arg, int count_only) {
    (void)s, (void)c, (void)cc, (void)wire, (void)parse, (void)arg, (void)count_only;
    abort();
}
int tools_n_calls(const srv_job *j) {
    (void)j;
    abort();
}
const chat_call *tools_call(const srv_job *j, int i) {
    (void)j, (void)i;
    abort();
}
const char *srv_model_id(const srv *s) {
    (void)s;
    abort();
}
json_t *respond_lossy_string(const uint8_t *p, size_t n) {
    (void)p, (void)n;
    abort();
}
int utf8_valid_len(const uint8_t *p, size_t n) {
    (void)p, (void)n;
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int responses = data[0] & 1;
    static const char *const names[] = {"tiny", "alias"};
    const srv_limits lim = {names, 2, 512, (data[0] >> 1) & 1, 1};
    srv_job j;
    memset(&j, 0, sizeof j);
    snprintf(j.id, sizeof j.id, "fuzz");
    srv_err e;
    memset(&e, 0, sizeof e);
    int rc = (responses ? api_responses_parse : api_messages_parse)((const char *)data + 1, size - 1, &j, &lim, &e);
    if (rc) {
        DF_ASSERT(e.status >= 400 && e.status < 500 && e.msg[0]);
        text_buf b = {0};
        DF_ASSERT(j.wire == (responses ? &api_responses_wire : &api_messages_wire));
        j.wire->error(&e, &b);
        DF_ASSERT(b.len > 0);
        text_buf_free(&b);
    } else {
        const srv_request *r = &j.req;
        DF_ASSERT(r->ep == SRV_EP_CHAT && r->n == 1 && r->n_tools <= SRV_MAX_TOOLS && r->n_stop <= SRV_MAX_STOP);
        DF_ASSERT(responses || r->n_msgs > 0);
        for (int i = 0; i < r->n_msgs; i++) {
            const srv_message *m = &r->msgs[i];
            DF_ASSERT(m->role && m->content);
            DF_ASSERT(!strcmp(m->role, "system") || !strcmp(m->role, "user") || !strcmp(m->role, "assistant") ||
                      !strcmp(m->role, "tool"));
            DF_ASSERT(strcmp(m->role, "tool") || m->tool_call_id);
            for (int k = 0; k < m->n_tool_calls; k++) DF_ASSERT(m->tool_calls[k].name && m->tool_calls[k].arguments);
        }
        DF_ASSERT(!r->n_tools || r->tools_json);
        DF_ASSERT(r->tool_choice != SRV_TOOLS_NAMED || r->tool_choice_name);
    }
    srv_request_free(&j.req);
    DF_ASSERT(j.wire == (responses ? &api_responses_wire : &api_messages_wire));
    j.wire->free_ctx(j.wire_ctx);
    return 0;
}
