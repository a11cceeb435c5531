/* request.h — parsing and validating an OpenAI request body (chat completions or completions) into a plain
 * struct. A pure function of its input (no model, no I/O) so it can be fuzzed: anything of the wrong type or
 * out of range is refused with an OpenAI-shaped error that names the field. Unknown fields, and null or
 * no-op values, are ignored by default (and reported) the way clients written for OpenAI expect; strict
 * mode refuses unknown fields. */
#ifndef DF_SRV_REQUEST_H
#define DF_SRV_REQUEST_H

#include <stddef.h>
#include <stdint.h>
#include "sample/sample.h"
#include "sample/stop.h"

typedef enum { SRV_EP_CHAT = 1, SRV_EP_COMPLETIONS = 2 } srv_endpoint;

#define SRV_MAX_STOP 16
#define SRV_MAX_CHOICES 8
#define SRV_MAX_STOP_LEN 256

typedef struct srv_err {
    int status;        /* HTTP status */
    char type[40];     /* invalid_request_error, rate_limit_error, server_error, ... */
    char code[48];     /* "" = null */
    char param[160];   /* "" = null */
    char msg[640];
} srv_err;

void srv_err_set(srv_err *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* {"error":{"message":…,"type":…,"param":…,"code":…}} */
void srv_err_json(const srv_err *e, text_buf *out);

typedef struct srv_tool_call {
    char *id, *name, *arguments;   /* arguments: JSON text as the client sent it */
} srv_tool_call;

typedef struct srv_message {
    char *role;        /* system | developer | user | assistant | tool */
    char *content;
    char *reasoning;   /* assistant reasoning_content, or NULL */
    srv_tool_call *tool_calls;     /* assistant */
    int n_tool_calls;
    char *tool_call_id;            /* tool */
    char *name;
} srv_message;

typedef struct srv_tool {
    char *name;
    char *parameters;   /* JSON schema text, or NULL (any object) */
} srv_tool;

typedef enum { SRV_TOOLS_AUTO = 0, SRV_TOOLS_NONE, SRV_TOOLS_REQUIRED, SRV_TOOLS_NAMED } srv_tool_choice;
typedef enum { SRV_FORMAT_TEXT = 0, SRV_FORMAT_JSON_OBJECT, SRV_FORMAT_JSON_SCHEMA } srv_format;

typedef struct srv_limits {
    const char *const *names;   /* the served model's names; strict mode refuses any other */
    int n_names;
    int n_vocab;            /* token-array prompts must be below it */
    int strict;             /* refuse unknown fields and other model names (default: ignore and list them) */
    int max_choices;        /* n may be 1..max_choices */
} srv_limits;

typedef struct srv_request {
    srv_endpoint ep;
    srv_message *msgs;
    int n_msgs;
    char *prompt;            /* completions: text prompt (NULL when prompt_ids is used) */
    size_t prompt_len;
    int32_t *prompt_ids;
    int n_prompt_ids;
    int max_tokens;          /* 0 = not given */
    int stream, include_usage;
    sample_params sp;
    int has_seed;
    char **stop;
    int n_stop;
    int logprobs;            /* report log-probabilities (sp.n_top_logprobs alternatives) */
    char *reasoning_effort;  /* chat: low | high | max | none; NULL = model default */
    int n;                   /* answers wanted (>= 1) */
    char *model;             /* the name asked for, or NULL */
    char *ignored;           /* lenient mode: unknown fields that were ignored, comma-separated; NULL if none */
    /* tools and constrained output (tools_request.c) */
    char *tools_json;        /* the tools array, compact JSON in the client's key order; NULL = none */
    srv_tool *tools;
    int n_tools;
    srv_tool_choice tool_choice;
    char *tool_choice_name;  /* SRV_TOOLS_NAMED */
    int parallel_tool_calls; /* 0: not given (allowed), 1: true, -1: false */
    srv_format response_format;
    char *response_schema;   /* SRV_FORMAT_JSON_SCHEMA: the schema, compact JSON */
} srv_request;

/* Returns 0 and fills out, or -1 and fills err (out is then empty). */
int srv_request_parse(const char *body, size_t len, srv_endpoint ep, const srv_limits *lim, srv_request *out,
                      srv_err *err);
void srv_request_free(srv_request *r);

#endif
