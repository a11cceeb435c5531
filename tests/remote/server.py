#!/usr/bin/env python3
"""Test HTTP server for deltafin's remote fetch: serves a folder in the Hugging Face hub layout
(/{org}/{name}/resolve/{rev}/{file}) on 127.0.0.1 with HTTP/1.1 keep-alive and byte ranges, counts
connections and requests, and misbehaves on command.

  server.py --root DIR --port-file F [--redirect]

Control endpoints (not counted):
  /_stats            JSON {"connections", "requests", "range_requests", "bytes", "paths": {path: n}}
  /_reset            zero the counters
  /_fault?mode=M&count=N[&match=S][&arg=X]
                     the next N range requests whose path contains S answer with fault M:
                     reset (half the body, then a TCP reset), 500, 503 (Retry-After: arg when given),
                     200 (whole file instead of 206), badrange (Content-Range off by one), short (a
                     Content-Length and body half as long), stall (headers, then silence for arg s, then a reset),
                     404, slow (answers normally after arg s), crange (a 206 whose Content-Range
                     header is arg verbatim: a wrong total, a negative or non-numeric value)
                     etag (the ETag is arg instead of the file's SHA-256)
--redirect answers every file with a 302 to /cdn/{file}?sig=1 (as the hub does to its CDN).
*.safetensors files carry their SHA-256 as a quoted ETag (and X-Linked-Etag on the redirect), as the hub's
LFS files do.
Only standard-library modules: the test machines have no pip packages."""
import argparse
import hashlib
import json
import os
import socket
import struct
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class State:
    def __init__(self, root, redirect):
        self.root = os.path.realpath(root)
        self.redirect = redirect
        self.lock = threading.Lock()
        self.faults = []          # [mode, count, match, arg]
        self.shas = {}            # path -> (mtime, sha256 hex)
        self.reset()

    def reset(self):
        self.connections = 0
        self.requests = 0
        self.range_requests = 0
        self.bytes = 0
        self.paths = {}

    def sha(self, full):
        if not full.endswith(".safetensors"):
            return None
        m = os.path.getmtime(full)
        with self.lock:
            if full in self.shas and self.shas[full][0] == m:
                return self.shas[full][1]
        h = hashlib.sha256()
        with open(full, "rb") as f:
            for b in iter(lambda: f.read(1 << 20), b""):
                h.update(b)
        with self.lock:
            self.shas[full] = (m, h.hexdigest())
        return h.hexdigest()

    def take_fault(self, path):
        with self.lock:
            for f in self.faults:
                if f[1] > 0 and f[2] in path:
                    f[1] -= 1
                    return f[0], f[3]
        return None, None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "deltafin-test"

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # no Nagle wait per response
        self.counted = False      # control requests do not count as connections

    def count_connection(self):
        if not self.counted:
            self.counted = True
            with self.server.state.lock:
                self.server.state.connections += 1

    def log_message(self, fmt, *args):
        pass

    def send_json(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def control(self, url):
        st = self.server.state
        q = urllib.parse.parse_qs(url.query)
        if url.path == "/_stats":
            with st.lock:
                self.send_json({"connections": st.connections, "requests": st.requests,
                                "range_requests": st.range_requests, "bytes": st.bytes, "paths": dict(st.paths)})
        elif url.path == "/_reset":
            with st.lock:
                st.reset()
                st.faults = []
            self.send_json({"ok": True})
        elif url.path == "/_fault":
            with st.lock:
                st.faults.append([q["mode"][0], int(q.get("count", ["1"])[0]), q.get("match", [""])[0],
                                  q.get("arg", [""])[0]])
            self.send_json({"ok": True})
        else:
            self.send_error(404)

    def file_for(self, path):
        parts = path.split("/")
        if len(parts) >= 3 and parts[1] == "cdn":
            rel = "/".join(parts[2:])
        elif "resolve" in parts and parts.index("resolve") + 2 < len(parts):
            rel = "/".join(parts[parts.index("resolve") + 2:])
        else:
            return None, None
        full = os.path.realpath(os.path.join(self.server.state.root, rel))
        if not full.startswith(self.server.state.root + os.sep) or not os.path.isfile(full):
            return rel, None
        return rel, full

    def do_HEAD(self):
        self.serve(head=True)

    def do_GET(self):
        self.serve(head=False)

    def serve(self, head):
        url = urllib.parse.urlparse(self.path)
        if url.path.startswith("/_"):
            return self.control(url)
        st = self.server.state
        rng = self.headers.get("Range")
        self.count_connection()
        with st.lock:
            st.requests += 1
            st.range_requests += rng is not None
            st.paths[url.path] = st.paths.get(url.path, 0) + 1
        rel, full = self.file_for(url.path)
        if st.redirect and not url.path.startswith("/cdn/") and rel is not None:
            sha = st.sha(full) if full else None
            self.send_response(302)
            self.send_header("Location", "/cdn/%s?sig=1" % rel)
            if sha:
                self.send_header("X-Linked-Etag", '"%s"' % sha)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        mode, arg = st.take_fault(url.path) if rng else (None, None)
        sha = arg if mode == "etag" else st.sha(full) if full else None
        if full is None or mode == "404":
            return self.error(404)
        size = os.path.getsize(full)
        if mode == "slow":
            time.sleep(float(arg or 0.2))
        if mode in ("500", "503"):
            return self.error(int(mode), retry_after=arg)
        start, end = 0, size - 1
        if rng and mode != "200":
            try:
                unit, spec = rng.split("=", 1)
                a, b = spec.split("-", 1)
                start = int(a)
                end = min(int(b), size - 1) if b else size - 1
                assert unit == "bytes" and start <= end
            except Exception:
                return self.error(416)
            if start >= size:
                return self.error(416)
        n = end - start + 1
        partial = rng is not None and mode != "200"
        self.send_response(206 if partial else 200)
        self.send_header("Accept-Ranges", "bytes")
        if sha and not st.redirect:
            self.send_header("ETag", '"%s"' % sha)
        if partial:
            shift = 1 if mode == "badrange" else 0
            if mode == "crange":
                self.send_header("Content-Range", arg)
            else:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (start + shift, end + shift, size))
        body_n = n // 2 if mode == "short" else n
        self.send_header("Content-Length", str(body_n))
        self.end_headers()
        if head:
            return
        with open(full, "rb") as f:
            if mode in ("reset", "stall"):
                if mode == "stall":
                    self.wfile.flush()
                    time.sleep(float(arg or 5))
                else:
                    self.send_part(f, start, n // 2)
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True
                return
            self.send_part(f, start, body_n)

    def send_part(self, f, start, n):
        self.wfile.flush()
        sent = 0
        try:
            while sent < n:
                k = self.connection.sendfile(f, start + sent, n - sent)
                if not k:
                    break
                sent += k
        except OSError:           # the client gave up (a fault test): not the server's problem
            self.close_connection = True
        with self.server.state.lock:
            self.server.state.bytes += sent

    def error(self, code, retry_after=""):
        body = b"error\n"
        self.send_response(code)
        if retry_after:
            self.send_header("Retry-After", retry_after)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):   # clients cut off by fault tests are normal
            super().handle_error(request, client_address)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--redirect", action="store_true")
    a = ap.parse_args()
    srv = Server(("127.0.0.1", 0), Handler)
    srv.state = State(a.root, a.redirect)
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(tmp, a.port_file)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
