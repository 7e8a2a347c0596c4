#!/usr/bin/python3
"""Integration test: the real tangramd's HTTP front end under hostile load.

Starts tangramd (router + one CPU worker, the tiny qwen3 model) on loopback
with an API key and small limits (--http-max-connections 80, header and body
timeouts 2 s, send timeout 3 s, heartbeats every 2 s), drives it with raw
sockets and http.client, and checks:

- an unauthenticated client announcing an 8 MiB body gets 401 before it
  sends any of it; 64 such clients pushing 4 MiB each all get 401 and the
  router's resident memory (VmRSS of /proc/<router pid>/status) grows by
  less than 64 MiB (it was +several hundred before the head check); the
  refusals are counted;
- without the key every non-public path is 401 first (not 404 / 405, which
  would map the routes), with WWW-Authenticate; /health and /metrics are
  open (the default of --metrics-auth);
- request smuggling framings get 400 (an HTTP version other than 1.x 505,
  an unknown transfer coding 501, an announced chunk over the body limit
  413) and the connection closes; well-formed neighbours still work;
- a client that half-closes after a whole request gets its answer;
- a slowloris head that keeps trickling bytes gets 408 at the header
  deadline;
- idle connections at --http-max-connections give way, so /health from a
  new connection answers while idle ones fill the table; so do trickling
  heads (slowloris) when nothing is idle, slowest first, with 408, then
  uploads under way (a body arriving), slowest first, with 408; requests
  in their handlers do not, and a new connection then takes a place of the
  probe reserve, where /health is answered and a completion gets 503
  connection_limit with Retry-After;
- a streaming client that stops reading is cut after --http-send-timeout,
  its request aborted and its KV pages returned (tangram_kv_pages_used back
  where it was), counted in tangram_http_slow_readers_aborted_total;
- /health turns 503 ("stalled") while the worker is SIGSTOPped, before
  the heartbeat deadline declares it dead, and 200 again after SIGCONT
  with the same worker process;
- a second daemon with --metrics-auth --max-num-seqs 1 --max-queued 1:
  /metrics needs the key, and a request over the queue gets 429 with
  Retry-After.

No timing thresholds: deadlines are only checked to have fired, with
generous waits. About 25 s on 2 cores. Fails (never skips) when the daemon
is not built.
"""
import json
import os
import select
import shutil
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

KEY = "sk-tangram-limits"
AUTH = {"Authorization": "Bearer " + KEY}
MODEL = "tiny"
MAX_CONNS = 80

chk = du.Checker()


# ---- raw HTTP ---------------------------------------------------------------

class Raw:
    """One raw client connection that parses responses itself."""

    def __init__(self, d, rcvbuf=None, timeout=10):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.s.settimeout(timeout)
        self.s.connect(("127.0.0.1", d.http_port))
        self.buf = b""
        self.eof = False

    def send(self, data):
        """Sends data; False when the server already closed."""
        try:
            self.s.sendall(data)
            return True
        except OSError:
            return False

    def fill(self):
        try:
            b = self.s.recv(65536)
        except OSError:
            b = b""
        if not b:
            self.eof = True
            return False
        self.buf += b
        return True

    def response(self):
        """(status, headers dict, body bytes) of the next response; 1xx
        interim responses are skipped. None when the connection ended
        first."""
        while True:
            while b"\r\n\r\n" not in self.buf:
                if not self.fill():
                    return None
            head, _, self.buf = self.buf.partition(b"\r\n\r\n")
            lines = head.decode(errors="replace").split("\r\n")
            try:
                status = int(lines[0].split(" ")[1])
            except (IndexError, ValueError):
                return None
            hdrs = {}
            for ln in lines[1:]:
                k, _, v = ln.partition(":")
                hdrs[k.strip().lower()] = v.strip()
            if 100 <= status < 200:
                continue
            break
        body = b""
        if "content-length" in hdrs:
            n = int(hdrs["content-length"])
            while len(self.buf) < n:
                if not self.fill():
                    break
            body, self.buf = self.buf[:n], self.buf[n:]
        elif hdrs.get("transfer-encoding", "").lower() == "chunked":
            while True:
                while b"\r\n" not in self.buf:
                    if not self.fill():
                        return status, hdrs, body
                size, _, rest = self.buf.partition(b"\r\n")
                n = int(size.split(b";")[0], 16)
                while len(rest) < n + 2:
                    if not self.fill():
                        return status, hdrs, body
                    size, _, rest = self.buf.partition(b"\r\n")
                body += rest[:n]
                self.buf = rest[n + 2:]
                if n == 0:
                    break
        return status, hdrs, body

    def closed(self):
        """True when the server closes the connection (EOF) in time."""
        while not self.eof:
            self.fill()
        return True

    def close(self):
        self.s.close()


def exchange(d, data, shutdown=False):
    """Sends raw bytes on a fresh connection; returns (status, headers,
    body, closed_after) or None when no response came."""
    c = Raw(d)
    try:
        c.send(data)
        if shutdown:
            c.s.shutdown(socket.SHUT_WR)
        r = c.response()
        if r is None:
            return None
        c.s.settimeout(5)
        closed = c.closed()
        return r + (closed,)
    finally:
        c.close()


def rss_kb(pid):
    """VmRSS of pid in KiB, or None."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def metrics(d):
    return du.fetch_metrics(d.base_url)


def metric(d, name, **labels):
    m = metrics(d)
    return None if m is None else du.metric(m, name, **labels)


# ---- checks -----------------------------------------------------------------

def t_unauth_flood(d):
    router = d.child_pids("router")
    if not chk.check(len(router) == 1, "the router process is found"):
        return
    pid = router[0]
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: 8388608\r\n\r\n")
    # The answer comes before any byte of the announced body is sent.
    c = Raw(d, timeout=5)
    c.send(head)
    r = c.response()
    c.close()
    chk.check(r is not None and r[0] == 401 and
              r[1].get("www-authenticate") == "Bearer" and
              du.is_openai_error(r[2]),
              "an unauthenticated 8 MiB upload gets 401 before any body byte",
              r)
    # Many of them pushing 4 MiB each: the router keeps none of it.
    n = 64
    before = rss_kb(pid)
    junk = b"x" * (4 << 20)
    conns = [Raw(d, timeout=2) for _ in range(n)]
    for c in conns:
        c.send(head)
        c.send(junk)  # may fail once the server has answered and closed
    time.sleep(0.5)  # let the router read what the kernel still holds
    peak = rss_kb(pid)
    answered = 0
    for c in conns:
        r = c.response()
        answered += r is not None and r[0] == 401
        c.close()
    chk.check(answered == n, "%d unauthenticated uploads pushing 4 MiB each: "
              "all answered 401 (%d)" % (n, answered))
    grew = (peak - before) // 1024 if before and peak else None
    chk.check(grew is not None and grew < 64,
              "router RSS stays bounded under the flood (%s MiB -> %s MiB, "
              "+%s MiB for %d x 4 MiB pushed)" %
              (before // 1024 if before else None,
               peak // 1024 if peak else None, grew, n))
    v = du.wait_for(lambda: (metric(d, "tangram_http_requests_refused_total",
                                    reason="unauthenticated") or 0) >= n + 1,
                    5)
    chk.check(v, "tangram_http_requests_refused_total{reason="
              "\"unauthenticated\"} counts them")


def t_routes_hidden(d):
    for what, method, path in (("unknown path", "GET", "/v1/nothing"),
                               ("wrong method", "DELETE", "/v1/completions"),
                               ("known path", "GET", "/v1/models")):
        st, hd, body = du.http(method, d.base_url + path)
        j = du.json_of(body)
        chk.check(st == 401 and hd.get("www-authenticate") == "Bearer" and
                  du.is_openai_error(body) and
                  j["error"]["code"] == "invalid_api_key",
                  "no key: %s -> 401 (not 404/405)" % what, (st, body[:200]))
    st, _, _ = du.http("GET", d.base_url + "/v1/nothing", headers=AUTH)
    chk.check(st == 404, "with the key: unknown path -> 404", st)
    st, hd, _ = du.http("DELETE", d.base_url + "/v1/completions",
                        headers=AUTH)
    chk.check(st == 405 and "POST" in hd.get("allow", ""),
              "with the key: wrong method -> 405 with Allow", st)
    st, _, _ = du.http("GET", d.base_url + "/health")
    chk.check(st == 200, "/health is open", st)
    st, hd, body = du.http("GET", d.base_url + "/metrics")
    chk.check(st == 200 and b"tangram_http_connections_open" in body,
              "/metrics is open without the key by default (with the HTTP "
              "counters)", st)


def completion_body(**kw):
    b = {"model": MODEL, "prompt": "Hello there", "max_tokens": 4,
         "temperature": 0}
    b.update(kw)
    return json.dumps(b).encode()


def t_smuggling(d):
    A = "Authorization: Bearer %s\r\n" % KEY
    body = completion_body()
    cl = "Content-Length: %d\r\n" % len(body)
    post = "POST /v1/completions HTTP/1.1\r\n"
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    cases = [
        ("bare LF line endings", 400,
         (post + "Host: x\n" + A.replace("\r\n", "\n") + cl.replace(
             "\r\n", "\n") + "\n").encode() + body),
        ("chunk data not followed by CRLF", 400,
         (post + "Host: x\r\n" + A + "Transfer-Encoding: chunked\r\n\r\n")
         .encode() + b"%x\r\n%sXX0\r\n\r\n" % (len(body), body)),
        ("obs-fold header", 400,
         (post + "Host: x\r\n" + A + "X-A: b\r\n c\r\n" + cl + "\r\n")
         .encode() + body),
        ("space before the colon", 400,
         (post + "Host : x\r\n" + A + cl + "\r\n").encode() + body),
        ("HTTP/9.9", 505,
         ("POST /v1/completions HTTP/9.9\r\nHost: x\r\n" + A + cl + "\r\n")
         .encode() + body),
        ("Content-Length and Transfer-Encoding", 400,
         (post + "Host: x\r\n" + A + cl + "Transfer-Encoding: chunked\r\n"
          "\r\n").encode() + chunked),
        ("two Content-Lengths", 400,
         (post + "Host: x\r\n" + A + cl + cl + "\r\n").encode() + body),
        ("unknown Transfer-Encoding", 501,
         (post + "Host: x\r\n" + A + "Transfer-Encoding: gzip, chunked\r\n"
          "\r\n").encode() + chunked),
        ("chunked twice", 400,
         (post + "Host: x\r\n" + A + "Transfer-Encoding: chunked\r\n"
          "Transfer-Encoding: chunked\r\n\r\n").encode() + chunked),
        ("Transfer-Encoding on HTTP/1.0", 400,
         ("POST /v1/completions HTTP/1.0\r\n" + A +
          "Transfer-Encoding: chunked\r\n\r\n").encode() + chunked),
        ("invalid header name", 400,
         (post + "Host: x\r\n" + A + "X(y: z\r\n" + cl + "\r\n").encode() +
         body),
        ("HTTP/1.1 without Host", 400,
         (post + A + cl + "\r\n").encode() + body),
        ("two Host headers", 400,
         (post + "Host: x\r\nHost: y\r\n" + A + cl + "\r\n").encode() + body),
        ("chunk size over the body limit", 413,
         (post + "Host: x\r\n" + A + "Transfer-Encoding: chunked\r\n\r\n"
          "10000000\r\n").encode()),
        ("chunk size overflowing 64 bits", 400,
         (post + "Host: x\r\n" + A + "Transfer-Encoding: chunked\r\n\r\n"
          "fffffffffffffffffff\r\n").encode()),
    ]
    for what, want, data in cases:
        r = exchange(d, data)
        ok = r is not None and r[0] == want and \
            r[1].get("connection") == "close" and du.is_openai_error(r[2]) \
            and r[3]
        chk.check(ok, "smuggling: %s -> %d and close" % (what, want),
                  r[:3] if r else r)
    # The well-formed neighbour of the chunked cases works.
    r = exchange(d, (post + "Host: x\r\n" + A +
                     "Transfer-Encoding: chunked\r\n\r\n").encode() + chunked)
    j = du.json_of(r[2]) if r else None
    chk.check(r is not None and r[0] == 200 and j and
              j.get("object") == "text_completion",
              "a well-formed chunked completion works", r[:3] if r else r)
    v = metric(d, "tangram_http_requests_refused_total", reason="malformed")
    chk.check(v is not None and v >= 13, "malformed requests are counted "
              "(%s)" % v)


def t_half_close(d):
    body = completion_body(max_tokens=6)
    data = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
            "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (KEY, len(body))).encode() + body
    r = exchange(d, data, shutdown=True)
    j = du.json_of(r[2]) if r else None
    chk.check(r is not None and r[0] == 200 and j and
              j["usage"]["completion_tokens"] >= 1 and r[3],
              "half-close after a whole request: the completion is answered, "
              "then the connection closes", r[:3] if r else r)


def t_slowloris(d):
    c = Raw(d, timeout=1)
    c.send(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    got = None
    for _ in range(40):  # up to ~20 s of trickling, deadline is 2 s
        if not c.send(b"a"):
            break
        time.sleep(0.5)
        try:
            b = c.s.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except OSError:
            b = b""
        if b.startswith(b"HTTP/1.1 "):
            got = b
            break
    c.close()
    chk.check(got is not None and got.startswith(b"HTTP/1.1 408"),
              "a trickling slowloris head gets 408 at the header deadline",
              got[:80] if got else got)
    v = du.wait_for(lambda: (metric(d, "tangram_http_requests_timed_out_total",
                                    phase="header") or 0) >= 1, 5)
    chk.check(v, "the header timeout is counted")


def t_conn_limit(d):
    # Idle connections fill the table and more: each new one makes room.
    idle = [Raw(d, timeout=3) for _ in range(MAX_CONNS + 8)]
    time.sleep(0.3)
    st = d.health()
    chk.check(st == 200, "/health answers from a new connection while idle "
              "connections hold the limit", st)
    for c in idle:
        c.close()
    v = du.wait_for(lambda: (metric(d, "tangram_http_connections_evicted_total")
                             or 0) >= 8, 5)
    chk.check(v, "idle connections gave way (evicted counter)")
    du.wait_for(lambda: (metric(d, "tangram_http_connections_open") or 99)
                <= 1, 5)
    # Slowloris at the limit: every connection holds part of a head. A new
    # client is still served: the slowest head gives way with 408.
    heads = [Raw(d, timeout=3) for _ in range(MAX_CONNS)]
    for c in heads:
        c.send(b"GET /v1/models HTTP/1.1\r\n")
    time.sleep(1.0)  # the router has read every head's first line
    served = [d.health() for _ in range(5)]
    chk.check(served == [200] * 5,
              "%d trickling heads at --http-max-connections %d: new clients "
              "are still served" % (MAX_CONNS, MAX_CONNS), served)
    ready = select.select([c.s for c in heads], [], [], 0.5)[0]
    answers = [c.response() for c in heads if c.s in ready]
    r = next((a for a in answers if a and b"too slow" in a[2]), None)
    chk.check(r is not None and r[0] == 408 and du.is_openai_error(r[2]),
              "the slowest heads gave way with 408 (request head too slow)",
              answers[:3])
    v = metric(d, "tangram_http_slow_heads_evicted_total")
    # The first newcomer took a head's place; the others found it free
    # again once that one had left.
    chk.check(v is not None and v >= 1, "slow heads evicted are counted (%s)"
              % v)
    for c in heads:
        c.close()
    du.wait_for(lambda: (metric(d, "tangram_http_connections_open") or 99)
                <= 1, 5)
    # Uploads under way (a body arriving) give way too, slowest first, when
    # nothing is idle and no head is arriving.
    part = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: "
            "Bearer %s\r\nContent-Length: 100\r\n\r\n{" % KEY).encode()
    uploads = [Raw(d, timeout=3) for _ in range(MAX_CONNS)]
    for c in uploads:
        c.send(part)
    time.sleep(0.3)
    served = [d.health() for _ in range(3)]
    chk.check(served == [200] * 3,
              "%d uploads under way at --http-max-connections %d: new "
              "clients are still served" % (MAX_CONNS, MAX_CONNS), served)
    ready = select.select([c.s for c in uploads], [], [], 0.5)[0]
    answers = [c.response() for c in uploads if c.s in ready]
    r = next((a for a in answers if a and b"body too slow" in a[2]), None)
    chk.check(r is not None and r[0] == 408 and du.is_openai_error(r[2]),
              "the slowest uploads gave way with 408 (request body too slow)",
              answers[:3])
    v = metric(d, "tangram_http_slow_bodies_evicted_total")
    chk.check(v is not None and v >= 1, "slow bodies evicted are counted (%s)"
              % v)
    for c in uploads:
        c.close()
    du.wait_for(lambda: (metric(d, "tangram_http_connections_open") or 99)
                <= 1, 5)
    # Requests in their handlers do not give way (the worker, stopped for a
    # moment, keeps them there): a new connection takes a place of the
    # probe reserve, where /health is answered and anything else gets 503
    # connection_limit with Retry-After.
    body = json.dumps({"model": MODEL, "prompt": "Hi",
                       "max_tokens": 2}).encode()
    req = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: "
           "Bearer %s\r\nContent-Type: application/json\r\n"
           "Content-Length: %d\r\n\r\n" % (KEY, len(body))).encode() + body
    worker = d.child_pids("worker")
    busy, probe, r = [], None, None
    if worker:
        os.kill(worker[0], signal.SIGSTOP)
    try:
        busy = [Raw(d, timeout=20) for _ in range(MAX_CONNS)]
        for c in busy:
            c.send(req)
        time.sleep(0.3)
        p = Raw(d, timeout=3)
        p.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        probe = p.response()
        p.close()
        extra = Raw(d, timeout=3)
        extra.send(req)
        r = extra.response()
        extra.close()
    finally:
        if worker:
            os.kill(worker[0], signal.SIGCONT)
    chk.check(probe is not None and probe[0] in (200, 503) and
              b'"status"' in probe[2],
              "every connection busy: /health is answered on the probe "
              "reserve", probe)
    chk.check(r is not None and r[0] == 503 and
              r[1].get("retry-after", "").isdigit() and
              du.is_openai_error(r[2]) and
              du.json_of(r[2])["error"]["code"] == "connection_limit",
              "every connection busy: a completion gets 503 "
              "connection_limit with Retry-After", r)
    done = 0
    for c in busy:
        rr = c.response()
        done += rr is not None and rr[0] == 200
        c.close()
    chk.check(done == MAX_CONNS, "the busy ones are answered once the worker "
              "goes on (%d of %d)" % (done, MAX_CONNS))
    st = du.wait_for(lambda: d.health() == 200, 10)
    chk.check(st, "/health answers again once they are gone")
    v = metric(d, "tangram_http_connections_rejected_total",
               reason="max_connections")
    chk.check(v is not None and v >= 1, "the refusal is counted (%s)" % v)


def pages_used(d):
    m = du.fetch_metrics(d.base_url)
    return None if m is None else du.metric(m, "tangram_kv_pages_used",
                                            rank="0")


def idle_metrics(d, timeout=30):
    def quiet():
        m = du.fetch_metrics(d.base_url)
        if m and du.metric(m, "tangram_num_requests_running") == 0 and \
                du.metric(m, "tangram_num_requests_waiting") == 0:
            return m
        return None
    return du.wait_for(quiet, timeout, 0.1)


def t_slow_reader(d):
    idle_metrics(d)
    before = pages_used(d)
    body = json.dumps({"model": MODEL, "prompt": "Never read me",
                       "max_tokens": 6000, "ignore_eos": True,
                       "logprobs": 20, "stream": True}).encode()
    head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
            "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (KEY, len(body))).encode()
    c = Raw(d, rcvbuf=4096)
    c.send(head + body)
    # Read nothing. The router holds the output at its bound, then cuts us.
    v = du.wait_for(lambda: (metric(d,
                                    "tangram_http_slow_readers_aborted_total")
                             or 0) >= 1, 60, 0.2)
    chk.check(v, "a stream nobody reads is cut after --http-send-timeout")
    m = idle_metrics(d)
    chk.check(m is not None, "its request ended (nothing running)")
    after = pages_used(d)
    chk.check(before is not None and after == before,
              "its KV pages came back (%s -> %s)" % (before, after))
    m = metrics(d)
    aborted = du.metric(m, "tangram_request_success_total",
                        finished_reason="abort") if m else None
    chk.check(aborted is not None and aborted >= 1,
              "it finished as aborted (%s)" % aborted)
    c.close()


def t_health_stall(d):
    workers = d.child_pids("worker")
    if not chk.check(len(workers) == 1, "one worker process", workers):
        return
    w = workers[0]
    seen = {}

    def stalled():
        try:
            st, _, body = du.http("GET", d.base_url + "/health", timeout=2)
        except OSError:
            return False
        j = du.json_of(body)
        if st == 503 and j and j.get("status") == "stalled":
            seen["body"] = j
            return True
        return False

    os.kill(w, signal.SIGSTOP)
    try:
        ok = du.wait_for(stalled, 9, 0.1)
    finally:
        os.kill(w, signal.SIGCONT)
    chk.check(ok and "rank 0" in seen["body"].get("reason", ""),
              "/health is 503 (stalled, naming the rank) while the worker is "
              "SIGSTOPped", seen.get("body"))
    back = du.wait_for(lambda: d.health() == 200, 10, 0.1)
    chk.check(back, "/health is 200 again after SIGCONT")
    chk.check(d.child_pids("worker") == [w],
              "the same worker serves on (it was never declared dead)",
              d.child_pids("worker"))
    st, _, _ = du.http("POST", d.base_url + "/v1/completions",
                       {"model": MODEL, "prompt": "still", "max_tokens": 2},
                       AUTH)
    chk.check(st == 200, "and it serves completions", st)


def t_second_daemon(work, model):
    os.makedirs(work, exist_ok=True)
    d = du.Daemon(model, work, ["--metrics-auth", "--max-num-seqs", "1",
                                "--max-queued", "1"], api_key=KEY)
    try:
        if not chk.check(d.start(), "tangramd with --metrics-auth starts",
                         d.log_text()[-2000:]):
            return
        st, hd, _ = du.http("GET", d.base_url + "/metrics")
        chk.check(st == 401 and hd.get("www-authenticate") == "Bearer",
                  "--metrics-auth: /metrics without the key -> 401", st)
        st, _, _ = du.http("GET", d.base_url + "/metrics", headers=AUTH)
        chk.check(st == 200, "--metrics-auth: /metrics with the key -> 200",
                  st)
        # One running, one waiting: the third is over --max-queued.
        long_body = json.dumps({"model": MODEL, "prompt": "Run long",
                                "max_tokens": 4000, "ignore_eos": True,
                                "stream": True}).encode()
        head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                "Authorization: Bearer %s\r\nContent-Type: application/json"
                "\r\nContent-Length: %d\r\n\r\n" % (KEY, len(long_body)))
        running = Raw(d)
        running.send(head.encode() + long_body)
        while b"data:" not in running.buf and running.fill():
            pass
        waiting = Raw(d)
        wb = completion_body(max_tokens=2)
        waiting.send(("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      "Authorization: Bearer %s\r\n"
                      "Content-Type: application/json\r\nContent-Length: %d"
                      "\r\n\r\n" % (KEY, len(wb))).encode() + wb)
        time.sleep(0.3)
        st, hd, body = du.http("POST", d.base_url + "/v1/completions",
                               {"model": MODEL, "prompt": "x",
                                "max_tokens": 2}, AUTH)
        chk.check(st == 429 and hd.get("retry-after", "").isdigit() and
                  int(hd["retry-after"]) >= 1 and du.is_openai_error(body),
                  "queue full: 429 with Retry-After", (st, hd, body[:200]))
        running.close()
        r = waiting.response()
        waiting.close()
        chk.check(r is not None and r[0] == 200,
                  "the waiting request is served once the stream left",
                  r[:2] if r else r)
    finally:
        rc, left = d.stop()
        chk.check(rc == 0 and not left, "second tangramd stops cleanly")
        san = d.sanitizer_reports()
        chk.check(not san, "no sanitizer report (second daemon)",
                  "\n".join(san[:10]))


def main():
    missing = du.missing_inputs()
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgdlimits")
    d = None
    try:
        model = du.make_model(os.path.join(work, MODEL))
        d = du.Daemon(model, work,
                      ["--http-max-connections", str(MAX_CONNS),
                       "--http-header-timeout", "2",
                       "--http-body-timeout", "2",
                       "--http-send-timeout", "3",
                       "--worker-heartbeat-ms", "2000"],
                      api_key=KEY)
        ready = d.start()
        chk.check(ready, "tangramd starts and /health turns 200",
                  d.log_text()[-3000:])
        if ready:
            t_routes_hidden(d)
            t_unauth_flood(d)
            t_smuggling(d)
            t_half_close(d)
            t_slowloris(d)
            t_conn_limit(d)
            t_slow_reader(d)
            t_health_stall(d)
            chk.check(d.proc.poll() is None and not
                      [ln for ln in d.log_text().splitlines()
                       if "restarting" in ln],
                      "no process died during the test")
        rc, left = d.stop()
        san = d.sanitizer_reports()
        d = None
        chk.check(rc == 0, "tangramd exits 0 on SIGTERM (rc %s)" % rc)
        chk.check(not left, "no router/worker survives tangramd (%s)" % left)
        chk.check(not san, "no sanitizer report in the daemon's log",
                  "\n".join(san[:10]))
        t_second_daemon(os.path.join(work, "second"), model)
    finally:
        if d is not None:
            d.stop()
        if chk.failures:
            log = os.path.join(work, "tangramd.log")
            if os.path.exists(log):
                with open(log, errors="replace") as f:
                    print("---- tangramd log (tail) ----")
                    print(f.read()[-4000:])
        shutil.rmtree(work, ignore_errors=True)
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
