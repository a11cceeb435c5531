/* guard.c — pre-checks of a request (guard.h). */
#include "guard.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

int guard_key_matches(const char *want, const char *auth) {
    if (!auth || strncasecmp(auth, "Bearer", 6) || (auth[6] != ' ' && auth[6] != '\t')) return 0;
    return guard_key_equals(want, auth + 6);
}

int guard_key_equals(const char *want, const char *got) {
    while (*got == ' ' || *got == '\t') got++;
    size_t lw = strlen(want), lg = strlen(got);
    while (lg && (got[lg - 1] == ' ' || got[lg - 1] == '\t')) lg--;
    if (!lw) return 0;
    unsigned char diff = lw != lg;
    for (size_t i = 0; i < lw; i++) diff |= (unsigned char)want[i] ^ (unsigned char)got[i < lg ? i : 0];
    return diff == 0;
}

int guard_origin_allowed(const char *origin, const char *host, const char *const *allowed, int n_allowed) {
    if (!origin) return 1;
    for (int i = 0; i < n_allowed; i++)
        if (!strcmp(allowed[i], "*") || !strcasecmp(allowed[i], origin)) return 1;
    if (!host || !*host) return 0;
    const char *rest = !strncasecmp(origin, "http://", 7) ? origin + 7 : !strncasecmp(origin, "https://", 8) ? origin + 8 : NULL;
    return rest && !strcasecmp(rest, host);
}

/* name (len bytes) is the same host name as want, ignoring case and one final dot */
static int same_name(const char *name, size_t len, const char *want) {
    size_t lw = strlen(want);
    if (len && name[len - 1] == '.') len--;
    if (lw && want[lw - 1] == '.') lw--;
    return len == lw && !strncasecmp(name, want, len);
}

int guard_host_allowed(const char *host, const char *bound, const char *const *allowed, int n_allowed) {
    if (!host) return 1;
    char name[256];
    size_t len;
    if (host[0] == '[') {   /* [IPv6]:port */
        const char *close = strchr(host, ']');
        if (!close || (close[1] && close[1] != ':')) return 0;
        len = (size_t)(close - host - 1);
        if (len >= sizeof name) return 0;
        memcpy(name, host + 1, len);
        name[len] = 0;
        unsigned char a[16];
        if (inet_pton(AF_INET6, name, a) == 1) return 1;
        return 0;
    }
    const char *colon = strchr(host, ':');
    len = colon ? (size_t)(colon - host) : strlen(host);
    if (!len || len >= sizeof name) return 0;
    if (colon)
        for (const char *p = colon + 1; *p; p++)
            if (*p < '0' || *p > '9') return 0;
    for (size_t i = 0; i < len; i++)   /* a host name: letters, digits, '-' and '.' only */
        if (!((host[i] >= 'a' && host[i] <= 'z') || (host[i] >= 'A' && host[i] <= 'Z') ||
              (host[i] >= '0' && host[i] <= '9') || host[i] == '-' || host[i] == '.'))
            return 0;
    memcpy(name, host, len);
    name[len] = 0;
    unsigned char a[4];
    if (inet_pton(AF_INET, name, a) == 1) return 1;
    if (same_name(name, len, "localhost")) return 1;
    size_t ll = len && name[len - 1] == '.' ? len - 1 : len;
    if (ll > 10 && !strncasecmp(name + ll - 10, ".localhost", 10)) return 1;
    if (bound && same_name(name, len, bound)) return 1;
    for (int i = 0; i < n_allowed; i++)
        if (!strcmp(allowed[i], "*") || same_name(name, len, allowed[i])) return 1;
    return 0;
}

long long guard_json_values(const char *body, size_t len, long long limit) {
    long long n = 0;
    int in_str = 0, any = 0;
    for (size_t i = 0; i < len && n <= limit; i++) {
        char c = body[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
            continue;
        }
        if (c == '"') in_str = 1;
        else if (c == ',' || c == ':') n++;
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') any = 1;
    }
    return n + any;
}
