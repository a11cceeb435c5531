/* remote_server.h — the test HTTP server (tests/remote/server.py, 127.0.0.1 only) for unit tests: started
 * on a folder it serves in the hub layout ({host}/org/m/resolve/main/{path under root}), its control
 * endpoints (/_reset, /_fault?..., /_stats) and its counters. */
#ifndef DF_TEST_REMOTE_SERVER_H
#define DF_TEST_REMOTE_SERVER_H

#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct server {
    pid_t pid;
    int port;
    char host[64];
    char base[128];
} server;

/* Serves root; the port is written to tmp/port. Returns 1 once the server is up. */
static int server_start(server *s, const char *root, const char *tmp) {
    char portf[512];
    snprintf(portf, sizeof portf, "%s/port", tmp);
    s->pid = fork();
    if (s->pid == 0) {
        execlp("python3", "python3", "tests/remote/server.py", "--root", root, "--port-file", portf, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) {
        FILE *f = fopen(portf, "r");
        if (f) {
            int ok = fscanf(f, "%d", &s->port) == 1;
            fclose(f);
            if (ok) break;
        }
        usleep(50000);
    }
    snprintf(s->host, sizeof s->host, "http://127.0.0.1:%d", s->port);
    snprintf(s->base, sizeof s->base, "%s/org/m/resolve/main", s->host);
    return s->port > 0;
}

static void server_stop(server *s) {
    kill(s->pid, SIGTERM);
    waitpid(s->pid, NULL, 0);
}

/* The end of a test program that served tmp: the server stopped, tmp removed, curl cleaned up. */
static int server_finish(server *s, const char *tmp) {
    server_stop(s);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    int rc = system(cmd);
    curl_global_cleanup();
    return rc;
}

static size_t ctl_write(char *p, size_t sz, size_t n, void *ctx) {
    char *buf = ctx;
    size_t have = strlen(buf), k = sz * n;
    if (have + k < 4096) memcpy(buf + have, p, k), buf[have + k] = 0;
    return sz * n;
}

/* GET of a control endpoint; the body (up to 4095 bytes) into out. */
static void ctl(const server *s, const char *path, char *out) {
    char url[512];
    snprintf(url, sizeof url, "%s%s", s->host, path);
    out[0] = 0;
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, ctl_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    curl_easy_perform(h);
    curl_easy_cleanup(h);
}

static long stat_of(const server *s, const char *key) {
    char buf[4096], pat[64];
    ctl(s, "/_stats", buf);
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(buf, pat);
    return p ? atol(p + strlen(pat)) : -1;
}

#endif
