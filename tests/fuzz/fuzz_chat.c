/* fuzz_chat.c — libFuzzer target for the chat renderer and the reasoning/answer splitter, on the byte-level
 * test vocabularies (tests/tokenizer/tiny_k3, tiny_k2). Input: one flags byte (format, generation prompt,
 * thinking, effort), then messages as fields separated by 0x01 (role, content, reasoning; repeating). The
 * rendered ids, then the raw input bytes as ids, go through the splitter. Nothing may crash or leak, and
 * the splitter's output must be valid UTF-8. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Loaded once per process: libFuzzer calls the target many times. */
static tokenizer *fuzz_tok[2];

static void fuzz_load(void) {
    if (fuzz_tok[0]) return;
    df_error err = {0};
    if (tokenizer_load_dir(&fuzz_tok[0], "tests/tokenizer/tiny_k2", &err) ||
        tokenizer_load_dir(&fuzz_tok[1], "tests/tokenizer/tiny_k3", &err))
        df_die("fuzz_chat: %s (run from the repository root)", err.msg);
}

static void fuzz_split(const tokenizer *t, chat_format fmt, int in_reasoning, const int32_t *ids, size_t n) {
    chat_splitter *s = chat_splitter_new(t, fmt, in_reasoning);
    chat_text rs = {0}, ct = {0};
    for (size_t i = 0; i < n; i++)
        if (chat_splitter_feed(s, ids[i], &rs, &ct)) break;
    chat_splitter_finish(s, &rs, &ct);
    for (const chat_text *x = &rs; x; x = x == &rs ? &ct : NULL)
        for (size_t i = 0; i < x->len;) {
            int l = utf8_valid_len((const uint8_t *)x->p + i, x->len - i);
            DF_ASSERT(l > 0);
            i += (size_t)l;
        }
    chat_text_free(&rs);
    chat_text_free(&ct);
    chat_splitter_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    fuzz_load();
    static const char *const efforts[] = {NULL, "low", "high", "max"};
    uint8_t flags = data[0];
    chat_format fmt = flags & 1 ? CHAT_K3 : CHAT_K2;
    const tokenizer *t = fuzz_tok[fmt == CHAT_K3];
    chat_opts o;
    chat_opts_default(&o);
    o.add_generation_prompt = flags >> 1 & 1;
    o.thinking = flags >> 2 & 1;
    o.effort = efforts[flags >> 3 & 3];
    /* fields: NUL-terminated copies of the 0x01-separated parts */
    char *buf = xmalloc(size);
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = 0;
    char *fields[48];
    int nf = 0;
    for (char *p = buf; nf < 48;) {
        fields[nf++] = p;
        char *q = memchr(p, 1, (size_t)(buf + size - 1 - p));
        if (!q) break;
        *q = 0;
        p = q + 1;
    }
    chat_message m[16];
    int n = 0;
    for (int i = 0; i + 1 < nf && n < 16; i += 3, n++)
        m[n] = (chat_message){.role = fields[i], .content = fields[i + 1], .reasoning_content = i + 2 < nf ? fields[i + 2] : NULL};
    tok_ids ids = {0};
    df_error err = {0};
    if (chat_render(t, fmt, m, n, &o, &ids, &err) == DF_OK)
        fuzz_split(t, fmt, fmt == CHAT_K3 && o.add_generation_prompt && o.thinking, ids.v, ids.n);
    else
        DF_ASSERT(err.msg[0]);
    tok_ids_free(&ids);
    int32_t *raw = xmalloc(sizeof *raw * size);
    for (size_t i = 0; i < size; i++) raw[i] = data[i] | (i + 1 < size && data[i] >= 0xf0 ? 0x100 : 0);
    fuzz_split(t, fmt, flags >> 5 & 1, raw, size);
    free(raw);
    free(buf);
    return 0;
}
