/* guard.h — the checks a request passes before any real work, as pure functions of their input (fuzzed with
 * the request parser): the API key in an Authorization header, whether a browser Origin may call, whether
 * the Host header names this server, and a cheap scan that bounds how many JSON values a body holds before
 * it is parsed. */
#ifndef DF_SRV_GUARD_H
#define DF_SRV_GUARD_H

#include <stddef.h>

/* 1 when auth is "Bearer KEY" (scheme in any case, spaces after it) with KEY equal to want; compared in
 * time independent of where they differ. */
int guard_key_matches(const char *want, const char *auth);
/* 1 when got (a bare key, as x-api-key carries it; surrounding blanks ignored) equals want; compared in time
 * independent of where they differ. */
int guard_key_equals(const char *want, const char *got);
/* 1 when a request carrying this Origin may be answered: no Origin (not a browser), the page's own origin
 * (Origin is http(s)://HOST with HOST the request's Host header), or one of the allowed origins ("*" = any). */
int guard_origin_allowed(const char *origin, const char *host, const char *const *allowed, int n_allowed);
/* 1 when the Host header (a name or address, a port after it or not) names this server: no Host (not a
 * browser), an IP address literal, localhost or a name under .localhost, the name it listens on (bound), or
 * one of the allowed names ("*" = any). A page whose own name was rebound to this machine's address sends
 * its own name, which none of these is, so reading answers through DNS rebinding fails here. */
int guard_host_allowed(const char *host, const char *bound, const char *const *allowed, int n_allowed);
/* An upper bound on the JSON values (array elements and object members) in body, counted without parsing
 * or allocating; stops counting once past limit. */
long long guard_json_values(const char *body, size_t len, long long limit);

#endif
