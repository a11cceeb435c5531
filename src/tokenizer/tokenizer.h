/* tokenizer.h — tiktoken-style byte-level BPE (the format and algorithm of Kimi's `tiktoken.model`),
 * the incremental UTF-8 decoder used while streaming, and the chat formats (Kimi K3 XTML, Kimi-Linear/K2)
 * with the splitter that routes generated text to reasoning_content vs content.
 *
 * Invalid UTF-8 input (tiktoken itself only takes valid strings): the text is cut into maximal valid runs and
 * single invalid bytes; each valid run is pre-tokenised normally, each invalid byte is its own piece and
 * becomes its byte token. decode(encode(x)) == x for any bytes x. */
#ifndef DF_TOKENIZER_H
#define DF_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "deltafin.h"

typedef struct tokenizer tokenizer;

/* A growable array of token ids. */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;

void tok_ids_push(tok_ids *a, int32_t id);
void tok_ids_free(tok_ids *a);

/* Named pre-tokenisation patterns; anything else passed to tokenizer_load_tiktoken is used as a raw regex
 * (PCRE2 syntax). */
#define TOK_PATTERN_KIMI "kimi"
#define TOK_PATTERN_CL100K "cl100k"
#define TOK_PATTERN_O200K "o200k"

/* Loads a tiktoken rank file (`<base64 bytes> <rank>` per line). pattern: a name above or a regex; the
 * cl100k/o200k names also add that encoding's standard special tokens. */
int tokenizer_load_tiktoken(tokenizer **out, const char *path, const char *pattern, df_error *err);
/* Loads a model folder: tiktoken.model, Kimi pattern, special tokens from tokenizer_config.json
 * (added_tokens_decoder); the 256 ids after the base vocabulary that have no name are
 * `<|reserved_token_{id}|>`. Also applies Kimi's whitespace/non-whitespace run split (≤ 25 000 chars). */
int tokenizer_load_dir(tokenizer **out, const char *dir, df_error *err);
void tokenizer_free(tokenizer *t);

/* Adds a special token (name → id); the id may lie outside the base vocabulary. */
int tokenizer_add_special(tokenizer *t, const char *name, int32_t id, df_error *err);

/* Encodes len bytes of text, appending to out. allow_special: special-token strings in the text become
 * their ids (longest match at the earliest position); otherwise they are ordinary text. Fails only when
 * the regex engine gives up (match/stack limits on pathological input). */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int allow_special, tok_ids *out,
                     df_error *err);

/* Number of ids (base vocabulary + specials, i.e. 1 + the largest id). */
int32_t tokenizer_n_vocab(const tokenizer *t);
/* The bytes of one token (special tokens: their name); NULL for an id that is not a token. */
const uint8_t *tokenizer_token_bytes(const tokenizer *t, int32_t id, size_t *len);
/* Appends the bytes of ids to *buf (growable, *cap bytes, *len used). Fails on an unknown id. */
int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, char **buf, size_t *len, size_t *cap,
                     df_error *err);
/* Id of a special token by name, or -1. */
int32_t tokenizer_special_id(const tokenizer *t, const char *name);
int tokenizer_is_special(const tokenizer *t, int32_t id);

/* ---- incremental UTF-8: never emits part of a character; invalid bytes become U+FFFD. ---- */
typedef struct utf8_stream {
    uint8_t pend[4];
    int npend;
} utf8_stream;

void utf8_stream_init(utf8_stream *s);
/* Feeds n bytes; appends the complete characters to out (growable: *out, *len, *cap). */
void utf8_stream_feed(utf8_stream *s, const uint8_t *p, size_t n, char **out, size_t *len, size_t *cap);
/* End of stream: a held-back incomplete sequence becomes U+FFFD. */
void utf8_stream_flush(utf8_stream *s, char **out, size_t *len, size_t *cap);
/* Length of the valid UTF-8 sequence at p (1..4), or 0 if the bytes at p do not start one. */
int utf8_valid_len(const uint8_t *p, size_t n);

/* ---- chat formats ---- */
typedef enum { CHAT_K2 = 1, CHAT_K3 = 2 } chat_format;

typedef struct chat_tool_call {
    const char *id;                 /* K2 renders it verbatim (functions.NAME:IDX); NULL: made up */
    const char *name;
    const char *arguments;          /* JSON text */
} chat_tool_call;

typedef struct chat_message {
    const char *role;               /* system | user | assistant | tool (K3 also: developer → system) */
    const char *content;
    const char *reasoning_content;  /* assistant only; may be NULL */
} chat_message;

/* The tool parts of a message (chat_opts.msg_tools has one per message). */
typedef struct chat_message_tools {
    const chat_tool_call *tool_calls;   /* assistant */
    int n_tool_calls;
    const char *tool_call_id;       /* tool: the call it answers */
    const char *name;               /* tool: the function's name (K3; else found from tool_call_id) */
} chat_message_tools;

typedef struct chat_opts {
    int add_generation_prompt;
    int thinking;                   /* K3: think channel + thinking-effort message; K2: <think> blocks */
    const char *effort;             /* K3: low | high | max (NULL = max) */
    const char *tools_json;         /* the OpenAI tools array as JSON; NULL: no tools declared */
    const char *tool_choice;        /* K3: "required" or "none" add the template's note; else NULL */
    const char *response_format;    /* K3: "json_object" or "json_schema" add the template's note */
    const char *response_schema;    /* json_schema: the schema as JSON */
    const chat_message_tools *msg_tools;   /* NULL, or one entry per message */
} chat_opts;

void chat_opts_default(chat_opts *o);   /* generation prompt on, thinking on, effort max */
/* K3 when the tokenizer has <|open|>/<|close|>/<|sep|>/<|end_of_msg|>, K2 when it has the <|im_*|> tokens. */
int chat_detect_format(const tokenizer *t, chat_format *fmt, df_error *err);
/* Renders a conversation to prompt ids (appended to out). Structural markers are special tokens; message
 * text is encoded with specials disallowed, so typed markers cannot inject structure. */
int chat_render(const tokenizer *t, chat_format fmt, const chat_message *msgs, int n, const chat_opts *o,
                tok_ids *out, df_error *err);

/* Splits generated ids into reasoning and answer text, streaming: each feed appends only complete UTF-8
 * characters to the two delta buffers. K3: reasoning until <|close|>think<|sep|>, the answer inside
 * <|open|>response<|sep|>…<|close|>response<|sep|>, done at <|end_of_msg|>. K2: <think>…</think> then the
 * answer, done at <|im_end|>. */
typedef struct chat_text {
    char *p;
    size_t len, cap;
} chat_text;

typedef struct chat_splitter chat_splitter;
/* in_reasoning: the prompt ended inside the reasoning part (K3 generation prompt with thinking on). */
chat_splitter *chat_splitter_new(const tokenizer *t, chat_format fmt, int in_reasoning);
void chat_splitter_free(chat_splitter *s);
/* Returns 1 once the message has ended (later ids are ignored), else 0. */
int chat_splitter_feed(chat_splitter *s, int32_t id, chat_text *reasoning, chat_text *content);
/* Flushes held-back bytes (partial characters, a partial K2 marker) at the end of generation. */
void chat_splitter_finish(chat_splitter *s, chat_text *reasoning, chat_text *content);
void chat_text_free(chat_text *t);

#endif
