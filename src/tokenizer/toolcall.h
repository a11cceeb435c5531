/* toolcall.h — tool calls in generated ids, read back into (id, name, JSON arguments) as they stream.
 *
 * K2: `<|tool_calls_section_begin|>` then per call `<|tool_call_begin|>functions.NAME:IDX
 * <|tool_call_argument_begin|>{json}<|tool_call_end|>`, then `<|tool_calls_section_end|>`. The whole section
 * is taken out of the message text; the call's id is its header (functions.NAME:IDX), which the chat
 * template renders back verbatim.
 * K3: after the response, `<|open|>tools<|sep|>` holds `<|open|>call tool="NAME" index="N"<|sep|>` with either
 * `<|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>` per argument (string values raw, others
 * JSON) or one `<|open|>json type="object"<|sep|>{json}<|close|>json<|sep|>` block, then `<|close|>call<|sep|>`.
 * The splitter emits no text there, so the parser only watches. K3 calls get ids call_<index>. */
#ifndef DF_TOOLCALL_H
#define DF_TOOLCALL_H

#include <stddef.h>
#include <stdint.h>
#include "tokenizer/tokenizer.h"

typedef struct chat_call {
    char *id;          /* NULL until the header is complete */
    char *name;
    char *args;        /* JSON text so far (NUL-terminated) */
    size_t args_len, args_cap;
    int done;          /* the call's end marker was seen */
} chat_call;

typedef struct chat_tool_parser chat_tool_parser;

chat_tool_parser *chat_tool_parser_new(const tokenizer *t, chat_format fmt);
void chat_tool_parser_free(chat_tool_parser *p);
/* Feeds one generated id; returns 1 when the id belongs to a tool-call section and must not reach the
 * message text (K2), else 0. */
int chat_tool_parser_feed(chat_tool_parser *p, int32_t id);
int chat_tool_parser_count(const chat_tool_parser *p);
const chat_call *chat_tool_parser_call(const chat_tool_parser *p, int i);

#endif
