/* fuzz_server_parse.c — libFuzzer target for what a request passes before any real work: the OpenAI request
 * parser (strict or lenient), the JSON value pre-count, and the Authorization and Origin checks. The first
 * byte picks the endpoint and mode, the rest is the body (also used as the header values). Any input must
 * parse or be refused with a well-formed error; never crash, hang or leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "server/guard.h"
#include "server/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    srv_endpoint ep = (data[0] & 1) ? SRV_EP_CHAT : SRV_EP_COMPLETIONS;
    static const char *const names[] = {"tiny", "alias"};
    const srv_limits lim = {names, 2, 512, (data[0] >> 1) & 1, 1 + ((data[0] >> 2) & 7)};
    const char *body = (const char *)data + 1;
    size_t len = size - 1;

    long long values = guard_json_values(body, len, 1000);
    DF_ASSERT(values >= 0 && values <= 1001 + 1);
    char *text = xmalloc(len + 1);   /* header values are NUL-terminated strings */
    memcpy(text, body, len);
    text[len] = 0;
    static const char *const cors[] = {"http://ok.example"};
    (void)guard_key_matches("secret", text);
    (void)guard_origin_allowed(text, "127.0.0.1:8080", cors, 1);
    /* a name is answered only when it is one of the fixed forms: never for a text with a character no
     * allowed form holds */
    if (guard_host_allowed(text, "box.example", cors, 1) && strpbrk(text, "/?#@ \t\r\n"))
        DF_ASSERT(!"Host with a character no allowed form has was allowed");
    DF_ASSERT(!guard_key_matches("", text));
    free(text);

    srv_request r;
    srv_err e;
    memset(&e, 0, sizeof e);
    if (srv_request_parse(body, len, ep, &lim, &r, &e)) {
        DF_ASSERT(e.status >= 400 && e.status < 500 && e.msg[0]);
        text_buf b = {0};
        srv_err_json(&e, &b);
        DF_ASSERT(b.len > 0);
        text_buf_free(&b);
        return 0;
    }
    DF_ASSERT(ep != SRV_EP_CHAT || r.n_msgs > 0);
    DF_ASSERT(ep != SRV_EP_COMPLETIONS || r.prompt || r.n_prompt_ids > 0);
    DF_ASSERT(r.n >= 1 && r.n <= lim.max_choices);
    DF_ASSERT(!lim.strict || !r.ignored);
    for (int i = 0; i < r.n_prompt_ids; i++) DF_ASSERT(r.prompt_ids[i] >= 0 && r.prompt_ids[i] < 512);
    srv_request_free(&r);
    return 0;
}
