/* error.h — filling a df_error (the public struct of deltafin.h): the library's calls report failures through
 * it; callers of the public API only read it, so the setter stays out of the public header. */
#ifndef DF_ERROR_H
#define DF_ERROR_H

#include "deltafin.h"

/* Sets err->code and a printf-style message naming what is at fault; err may be NULL. */
void df_error_set(df_error *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif
