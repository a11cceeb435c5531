/* fuzz_server_parse.c — libFuzzer target for the OpenAI request parser: the first byte picks the endpoint,
 * the rest is the body. Any input must parse or be refused with a well-formed error; never crash or leak. */
#include <stdint.h>
#include <string.h>
#include "common/util.h"
#include "server/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    srv_endpoint ep = (data[0] & 1) ? SRV_EP_CHAT : SRV_EP_COMPLETIONS;
    const srv_limits lim = {"tiny", 512};
    srv_request r;
    srv_err e;
    memset(&e, 0, sizeof e);
    if (srv_request_parse((const char *)data + 1, size - 1, ep, &lim, &r, &e)) {
        DF_ASSERT(e.status >= 400 && e.status < 500 && e.msg[0]);
        text_buf b = {0};
        srv_err_json(&e, &b);
        DF_ASSERT(b.len > 0);
        text_buf_free(&b);
        return 0;
    }
    DF_ASSERT(ep != SRV_EP_CHAT || r.n_msgs > 0);
    DF_ASSERT(ep != SRV_EP_COMPLETIONS || r.prompt || r.n_prompt_ids > 0);
    for (int i = 0; i < r.n_prompt_ids; i++) DF_ASSERT(r.prompt_ids[i] >= 0 && r.prompt_ids[i] < 512);
    srv_request_free(&r);
    return 0;
}
