/* session_io_stub.h — TEMPORARY: declares df_session_save / df_session_load, which the library's own
 * implementation adds to include/deltafin.h. Delete this file, session_io_stub.c and the one include of it
 * in src/server/prompt_cache.c when that lands. */
#ifndef DF_SESSION_IO_STUB_H
#define DF_SESSION_IO_STUB_H

#include "deltafin.h"

int df_session_save(const df_session *s, const char *path, df_error *err);
int df_session_load(df_session *s, const char *path, df_error *err);

#endif
