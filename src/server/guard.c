/* guard.c — pre-checks of a request (guard.h). */
#include "guard.h"

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
