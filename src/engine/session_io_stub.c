/* session_io_stub.c — TEMPORARY stand-ins for df_session_save / df_session_load until the library's own
 * implementation is merged (delete this file and session_io_stub.h then): both report DF_EUNSUPPORTED, so
 * the server's prompt cache turns itself off and its tests skip. */
#include "engine/session_io_stub.h"

int df_session_save(const df_session *s, const char *path, df_error *err) {
    (void)s;
    df_error_set(err, DF_EUNSUPPORTED, "saving session state to '%s' is not supported by this build", path);
    return DF_EUNSUPPORTED;
}

int df_session_load(df_session *s, const char *path, df_error *err) {
    (void)s;
    df_error_set(err, DF_EUNSUPPORTED, "loading session state from '%s' is not supported by this build", path);
    return DF_EUNSUPPORTED;
}
