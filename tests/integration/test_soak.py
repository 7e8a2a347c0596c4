#!/usr/bin/python3
"""Soak test of the real tangramd on loopback: mixed load with faults, then
a drain, accounting for every request.

Two phases, each its own tangramd (CPU backend, the tiny qwen3 model of
daemon_util, --http-send-timeout 2):
  1. "tp1":         --tp 1, full KV (--heads-per-group 2);
  2. "tp2-profile": --tp 2 with a compressing profile built by
                    tangram-profile (--heads-per-group 1).
Each phase runs rounds of load. Six client threads pick, at random (seeded),
among: HTTP completions and chats, streaming and not; multi-turn chats with
X-Session-Id over HTTP and with session_id over gRPC (Generate, streaming);
clients that close the connection mid-stream or right after sending (HTTP)
or cancel the call (gRPC); slow readers with a 4 KiB receive buffer that
pause 0.5 s between reads (inside the send timeout: they must be served
to the end) or stop reading for 6 s (beyond it: the router cuts them); and
bad requests (malformed JSON, wrong types, a prompt over the context,
temperature 5 over gRPC). During every round a fault thread injects worker
faults in turn: SIGKILL of a worker, SIGSTOP for 1 s then SIGCONT (shorter
than the heartbeat deadline of 5 x 1 s: the worker resumes), and SIGSTOP
until the router declares the worker dead and kills it.

Every request sent ends in exactly one of:
  completed     a finish_reason (HTTP body or SSE then [DONE]; gRPC OK with
                STOP or LENGTH on the last message);
  disconnected  we closed or cancelled it;
  cut           a reader we stalled beyond the send timeout was cut;
  error         a proper error: an OpenAI error with status 500/503/429
                (an SSE error event then [DONE] mid-stream), gRPC
                UNAVAILABLE/INTERNAL/RESOURCE_EXHAUSTED with details;
  rejected      a bad request answered 400 (gRPC INVALID_ARGUMENT), or
                503 while a worker restarts;
and never in:
  lost          anything else (a connection closed without an answer, a
                stream without [DONE], a 200 without finish_reason, a
                status the request does not call for);
  hung          no answer within the client's deadline (60 s).
After each round the clients stop and the test waits for nothing to run or
wait; then on every rank tangram_kv_pages_used must equal
tangram_kv_pages_cached (the pages of stored multi-turn entries: anything
else is a leaked page), the router must be the same process (no crash) and
its VmRSS is read. Round 0 is the warm-up; the RSS of every later round must
stay within max(+50 %, +64 MiB) of round 1's (printed: the drift).
At the end of each phase, requests are put in flight and tangramd gets
SIGTERM: every one is answered (completed, or a proper error), new ones get
503 or a refused connection, and tangramd exits 0 with no child left. No
child may die of anything but our SIGKILL or the router's (a crash shows as
another signal or a non-zero exit in the log).

Duration: TANGRAM_SOAK_SECONDS of load in all (default 48, split between
the phases; each round about 8 s in CI, up to 10 rounds a phase). A summary
table (requests by kind and outcome, faults, pages and RSS per round) and a
final "SOAK-SUMMARY {json}" line are printed. Fails, naming it, when the
daemon, grpcio, protobuf or protoc is missing.
"""
import importlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

SECONDS = float(os.environ.get("TANGRAM_SOAK_SECONDS", "48"))
CLIENTS = 6
DEADLINE = 60.0            # a request with no answer by then is hung
SEND_TIMEOUT = 2.0         # --http-send-timeout
SLOW_PAUSE = 0.5           # slow reader inside the send timeout
STALL = 6.0                # slow reader beyond it
SHUTDOWN_TIMEOUT = 30      # --shutdown-timeout of the drain
MODEL = "model"
BACKOFF = 0.3             # a client's pause after an error
RSS_SLACK_FRAC = 0.5
RSS_SLACK_BYTES = 64 << 20
ALLOWED_ERRORS = (500, 503, 429)

ck = du.Checker()
GRPC = None  # (grpc, tangram_pb2) once loaded


# ---- requests -----------------------------------------------------------------

WORDS = ["alpha", "river", "stone", "cloud", "maple", "orbit", "piano",
         "lemon", "tiger", "harbor", "quartz", "velvet", "winter", "copper",
         "garden", "signal", "ember", "falcon"]


def text(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Record:
    """One request: its kind, the outcome and a detail for failures."""
    __slots__ = ("kind", "outcome", "detail", "secs")

    def __init__(self, kind):
        self.kind, self.outcome, self.detail, self.secs = kind, None, "", 0.0


class Ledger:
    """Every request of a phase, thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.records = []
        self.local = threading.local()

    def add(self, rec):
        with self.lock:
            self.records.append(rec)
        if rec.outcome == "error" or (rec.outcome == "rejected" and
                                      "503" in rec.detail):
            self.local.backoff = True

    def take_backoff(self):
        """True once after this thread's request got an error."""
        b = getattr(self.local, "backoff", False)
        self.local.backoff = False
        return b

    def counts(self):
        out = {}
        with self.lock:
            for r in self.records:
                out.setdefault(r.kind, {}).setdefault(r.outcome, 0)
                out[r.kind][r.outcome] += 1
        return out

    def bad(self):
        with self.lock:
            return [r for r in self.records
                    if r.outcome not in ("completed", "disconnected", "cut",
                                         "error", "rejected")]


def http_bytes(port, path, body, headers=None):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = "POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % (path, port)
    head += "Content-Type: application/json\r\nConnection: close\r\n"
    for k, v in (headers or {}).items():
        head += "%s: %s\r\n" % (k, v)
    head += "Content-Length: %d\r\n\r\n" % len(data)
    return head.encode() + data


def dechunk(raw):
    """(body, complete) of a chunked body."""
    out, pos = b"", 0
    while True:
        eol = raw.find(b"\r\n", pos)
        if eol < 0:
            return out, False
        try:
            n = int(raw[pos:eol].split(b";")[0], 16)
        except ValueError:
            return out, False
        if n == 0:
            return out, True
        if len(raw) < eol + 2 + n + 2:
            return out + raw[eol + 2:eol + 2 + n], False
        out += raw[eol + 2:eol + 2 + n]
        pos = eol + 2 + n + 2


def parse_response(raw):
    """(status, headers, body, complete) of a raw HTTP/1.1 response read to
    EOF; status None when the head is incomplete."""
    end = raw.find(b"\r\n\r\n")
    if end < 0:
        return None, {}, b"", False
    lines = raw[:end].decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        return None, {}, b"", False
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    rest = raw[end + 4:]
    if "chunked" in hdrs.get("transfer-encoding", "").lower():
        body, complete = dechunk(rest)
        return status, hdrs, body, complete
    if "content-length" in hdrs:
        n = int(hdrs["content-length"])
        return status, hdrs, rest[:n], len(rest) >= n
    return status, hdrs, rest, True  # delimited by the close


def classify_http(rec, status, body, complete, stream, bad_request):
    """Sets rec.outcome from a response read to its end."""
    if status is None:
        rec.outcome, rec.detail = "lost", "no response head"
        return
    if bad_request:
        ok = status in (400, 503) and du.is_openai_error(body) and complete
        rec.outcome = "rejected" if ok else "lost"
        rec.detail = "status %s %r" % (status, body[:200])
        return
    if status != 200:
        ok = status in ALLOWED_ERRORS and du.is_openai_error(body) and complete
        rec.outcome = "error" if ok else "lost"
        rec.detail = "status %s %r" % (status, body[:200])
        return
    if not complete:
        rec.outcome, rec.detail = "lost", "body cut short %r" % body[-200:]
        return
    if not stream:
        j = du.json_of(body) or {}
        ch = (j.get("choices") or [{}])[0]
        if ch.get("finish_reason"):
            rec.outcome = "completed"
        else:
            rec.outcome, rec.detail = "lost", "no finish_reason %r" % body[:200]
        return
    events, problems = du.sse_events(body)
    if problems or not events or events[-1] != "[DONE]":
        rec.outcome = "lost"
        rec.detail = "stream without [DONE] %r" % body[-300:]
        return
    errs = [e for e in events[:-1] if du.is_openai_error(e)]
    reasons = [c.get("finish_reason") for e in events[:-1]
               for c in ((du.json_of(e) or {}).get("choices") or [])
               if isinstance(c, dict) and c.get("finish_reason")]
    if len(errs) == 1 and not reasons:
        rec.outcome = "error"
    elif not errs and len(reasons) == 1:
        rec.outcome = "completed"
    else:
        rec.outcome = "lost"
        rec.detail = "errors %d, finish reasons %s" % (len(errs), reasons)


def http_call(port, ledger, kind, path, body, stream=False, mode="normal",
              headers=None, bad=False):
    """One HTTP request on a raw socket. mode: normal, close_now (close
    right after sending), close_mid (close after two SSE events), slow
    (pause SLOW_PAUSE between reads of a 4 KiB buffer), stall (stop reading
    for STALL after the first event). Returns (record, response body)."""
    rec = Record(kind)
    t0 = time.time()
    deadline = t0 + DEADLINE
    if isinstance(body, dict):
        body = dict(body, stream=stream)
    raw, out = b"", b""
    s = None
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if mode in ("slow", "stall"):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(10)
        s.connect(("127.0.0.1", port))
        s.sendall(http_bytes(port, path, body, headers))
        if mode == "close_now":
            rec.outcome = "disconnected"
            return rec, b""
        stalled = False
        while True:
            left = deadline - time.time()
            if left <= 0:
                rec.outcome, rec.detail = "hung", "%d bytes read" % len(raw)
                return rec, b""
            s.settimeout(min(left, 5.0))
            try:
                chunk = s.recv(4096 if mode in ("slow", "stall") else 65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            raw += chunk
            if mode == "close_mid" and raw.count(b"data:") >= 2:
                if b"[DONE]" not in raw:
                    rec.outcome = "disconnected"
                    return rec, b""
            elif mode == "slow":
                time.sleep(SLOW_PAUSE)
            elif mode == "stall" and not stalled and b"data:" in raw:
                stalled = True
                time.sleep(STALL)
        status, _, out, complete = parse_response(raw)
        if mode == "stall" and stalled and status == 200 and not complete:
            rec.outcome = "cut"
            return rec, out
        classify_http(rec, status, out, complete, stream, bad)
        return rec, out
    except ConnectionRefusedError as e:
        rec.outcome, rec.detail = "lost", "refused: %s" % e
        return rec, b""
    except OSError as e:
        rec.outcome, rec.detail = "lost", "%s: %s" % (type(e).__name__, e)
        return rec, b""
    finally:
        if s is not None:
            s.close()
        rec.secs = time.time() - t0
        ledger.add(rec)


def completion(rng, n_words, max_tokens, ignore_eos=False):
    b = {"model": MODEL, "prompt": text(rng, n_words), "max_tokens": max_tokens,
         "temperature": rng.choice([0, 0.7])}
    if ignore_eos:
        b["ignore_eos"] = True
    return b


def chat_text(out, stream):
    """The assistant text of a chat response body (streaming or not)."""
    if not stream:
        j = du.json_of(out) or {}
        return ((j.get("choices") or [{}])[0].get("message") or {}).get(
            "content") or ""
    s = ""
    for e in du.sse_events(out)[0][:-1]:
        for c in (du.json_of(e) or {}).get("choices") or []:
            s += (c.get("delta") or {}).get("content") or ""
    return s


# ---- gRPC ---------------------------------------------------------------------

def load_grpc(work):
    try:
        grpc = importlib.import_module("grpc")
    except ImportError:
        return "Python module grpc (Debian package python3-grpcio)"
    try:
        importlib.import_module("google.protobuf")
    except ImportError:
        return "Python module google.protobuf (Debian package python3-protobuf)"
    if shutil.which("protoc") is None:
        return "tool protoc (Debian package protobuf-compiler)"
    proto = os.path.join(du.SOURCE or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", ".."), "proto")
    r = subprocess.run(["protoc", "-I", proto, "--python_out=" + work,
                        "tangram.proto"], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        return "protoc failed: " + r.stderr
    sys.path.insert(0, work)
    global GRPC
    GRPC = (grpc, importlib.import_module("tangram_pb2"))
    return None


class Grpc:
    def __init__(self, target):
        grpc, pb = GRPC
        self.ch = grpc.insecure_channel(target)
        self.generate = self.ch.unary_stream(
            "/tangram.v1.Generation/Generate",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.GenerateResponse.FromString)

    def close(self):
        self.ch.close()


def grpc_call(cli, ledger, kind, req, cancel_after=None, bad=False):
    """One Generate. cancel_after: cancel after that many messages. Returns
    (record, text)."""
    grpc, pb = GRPC
    rec = Record(kind)
    t0 = time.time()
    txt, last = "", None
    try:
        call = cli.generate(req, timeout=DEADLINE)
        n = 0
        for m in call:
            txt += m.text
            last = m
            n += 1
            if cancel_after is not None and n >= cancel_after:
                call.cancel()
                rec.outcome = "disconnected"
                return rec, txt
        if bad:
            rec.outcome, rec.detail = "lost", "bad request answered OK"
        elif last is not None and last.finish_reason in (
                pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH):
            rec.outcome = "completed"
        else:
            rec.outcome = "lost"
            rec.detail = "OK without finish reason: %s" % last
    except grpc.RpcError as e:
        code, details = e.code(), e.details() or ""
        if cancel_after is not None and code == grpc.StatusCode.CANCELLED \
                and rec.outcome == "disconnected":
            pass
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            rec.outcome, rec.detail = "hung", details
        elif bad and code in (grpc.StatusCode.INVALID_ARGUMENT,
                              grpc.StatusCode.UNAVAILABLE) and details:
            rec.outcome = "rejected"
        elif not bad and code in (grpc.StatusCode.UNAVAILABLE,
                                  grpc.StatusCode.INTERNAL,
                                  grpc.StatusCode.RESOURCE_EXHAUSTED) and details:
            rec.outcome = "error"
        else:
            rec.outcome, rec.detail = "lost", "%s %s" % (code, details)
    finally:
        if rec.outcome is None:
            rec.outcome = "lost"
        rec.secs = time.time() - t0
        ledger.add(rec)
    return rec, txt


def grpc_req(rng, session=None, messages=None, prompt=None, max_tokens=16,
             ignore_eos=False, temperature=0.0):
    _, pb = GRPC
    r = pb.GenerateRequest()
    if messages is not None:
        for role, content in messages:
            r.messages.add(role=role, content=content)
    else:
        r.prompt = prompt if prompt is not None else text(rng, 12)
    if session:
        r.session_id = session
    r.sampling.max_tokens = max_tokens
    r.sampling.temperature = temperature
    r.sampling.ignore_eos = ignore_eos
    return r


# ---- client scenarios -----------------------------------------------------------

BAD_BODIES = [b"{not json", {"model": MODEL, "prompt": 5},
              {"model": MODEL, "prompt": "x", "max_tokens": -1},
              {"model": MODEL, "prompt": "x " * 40000, "max_tokens": 1},
              {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}]


def sc_completion(ctx, rng):
    http_call(ctx.port, ctx.ledger, "http completion", "/v1/completions",
              completion(rng, rng.randint(4, 60), rng.randint(1, 48)),
              stream=rng.random() < 0.5)


def sc_chat_session(ctx, rng):
    """A multi-turn chat over HTTP with X-Session-Id (2 to 4 turns)."""
    sid = "soak-%d-%d" % (ctx.phase_no, rng.getrandbits(40))
    msgs = [{"role": "system", "content": "You are terse."}]
    for _ in range(rng.randint(2, 4)):
        msgs.append({"role": "user", "content": text(rng, rng.randint(3, 20))})
        stream = rng.random() < 0.5
        rec, out = http_call(
            ctx.port, ctx.ledger, "http chat turn", "/v1/chat/completions",
            {"model": MODEL, "messages": msgs, "max_tokens": rng.randint(4, 32),
             "temperature": 0}, stream=stream, headers={"X-Session-Id": sid})
        if rec.outcome != "completed":
            return
        msgs.append({"role": "assistant", "content": chat_text(out, stream)})


def sc_grpc_session(ctx, rng):
    """A multi-turn chat over gRPC with session_id (2 or 3 turns)."""
    sid = "soak-g-%d-%d" % (ctx.phase_no, rng.getrandbits(40))
    msgs = [("user", text(rng, rng.randint(3, 20)))]
    for _ in range(rng.randint(2, 3)):
        rec, txt = grpc_call(ctx.grpc, ctx.ledger, "grpc chat turn",
                             grpc_req(rng, sid, messages=msgs,
                                      max_tokens=rng.randint(4, 32)))
        if rec.outcome != "completed":
            return
        msgs += [("assistant", txt), ("user", text(rng, rng.randint(3, 12)))]


def sc_grpc_prompt(ctx, rng):
    grpc_call(ctx.grpc, ctx.ledger, "grpc generate",
              grpc_req(rng, prompt=text(rng, rng.randint(4, 60)),
                       max_tokens=rng.randint(1, 48), temperature=0.7))


def sc_disconnect(ctx, rng):
    r = rng.random()
    if r < 0.4:
        http_call(ctx.port, ctx.ledger, "http disconnect", "/v1/completions",
                  completion(rng, 20, 300, True), stream=True, mode="close_mid")
    elif r < 0.6:
        http_call(ctx.port, ctx.ledger, "http disconnect", "/v1/chat/completions",
                  {"model": MODEL, "messages": [{"role": "user",
                                                 "content": text(rng, 10)}],
                   "max_tokens": 300, "ignore_eos": True},
                  stream=rng.random() < 0.5, mode="close_now")
    else:
        grpc_call(ctx.grpc, ctx.ledger, "grpc cancel",
                  grpc_req(rng, prompt=text(rng, 20), max_tokens=300,
                           ignore_eos=True), cancel_after=2)


def sc_slow(ctx, rng):
    if rng.random() < 0.5:
        http_call(ctx.port, ctx.ledger, "http slow reader", "/v1/completions",
                  completion(rng, 10, 120, True), stream=True, mode="slow")
    else:
        http_call(ctx.port, ctx.ledger, "http stalled reader", "/v1/completions",
                  completion(rng, 10, 400, True), stream=True, mode="stall")


def sc_bad(ctx, rng):
    if rng.random() < 0.75:
        http_call(ctx.port, ctx.ledger, "http bad request", "/v1/completions"
                  if rng.random() < 0.6 else "/v1/chat/completions",
                  rng.choice(BAD_BODIES), bad=True)
    else:
        grpc_call(ctx.grpc, ctx.ledger, "grpc bad request",
                  grpc_req(rng, prompt="x", temperature=5.0), bad=True)


SCENARIOS = [(sc_completion, 5), (sc_chat_session, 3), (sc_grpc_session, 2),
             (sc_grpc_prompt, 2), (sc_disconnect, 2), (sc_slow, 1),
             (sc_bad, 2)]


# The kinds of answer every phase must have served, and a scenario of each.
SERVED_KINDS = [("http completion", sc_completion),
                ("http chat turn", sc_chat_session),
                ("grpc chat turn", sc_grpc_session),
                ("grpc generate", sc_grpc_prompt)]


class Ctx:
    def __init__(self, d, ledger, phase_no):
        self.port = d.http_port
        self.ledger = ledger
        self.phase_no = phase_no
        self.grpc = Grpc(d.grpc_target)


def client_loop(ctx, seed, until):
    rng = random.Random(seed)
    fns = [f for f, w in SCENARIOS for _ in range(w)]
    while time.time() < until:
        rng.choice(fns)(ctx, rng)
        # As a client should: back off a little after an error (503 while
        # a worker restarts) instead of hammering the server.
        if ctx.ledger.take_backoff():
            time.sleep(BACKOFF)


# ---- faults ---------------------------------------------------------------------

FAULTS = ["kill", "stop_short", "stop_long"]


def inject(d, fault, rng, log):
    """One worker fault; returns True when it was injected. A fault waits
    for the daemon to serve again after the previous one (the restart
    backoff grows to 10 s when workers die more often than once a minute)."""
    du.wait_for(lambda: d.health() == 200, 30, 0.1)
    workers = d.child_pids("worker")
    if not workers:
        log.append("%s: no worker to hit (restarting)" % fault)
        return False
    pid = rng.choice(workers)
    try:
        if fault == "kill":
            os.kill(pid, signal.SIGKILL)
        elif fault == "stop_short":
            os.kill(pid, signal.SIGSTOP)
            time.sleep(1.0)
            os.kill(pid, signal.SIGCONT)
        else:
            os.kill(pid, signal.SIGSTOP)
            gone = du.wait_for(lambda: not du.alive(pid), 20, 0.05)
            if not gone:
                os.kill(pid, signal.SIGCONT)
                log.append("stop_long: worker %d not killed by the router in "
                           "20 s" % pid)
                return False
    except ProcessLookupError:
        log.append("%s: worker %d already gone" % (fault, pid))
        return False
    d.note_children()
    return True


# ---- state ----------------------------------------------------------------------

def rss_bytes(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for ln in f:
                if ln.startswith("VmRSS:"):
                    return int(ln.split()[1]) * 1024
    except OSError:
        pass
    return None


def idle_metrics(d, n_ranks, timeout=60):
    """Waits for nothing running or waiting and /health 200; returns the
    metrics then, or None."""
    def quiet():
        if d.health() != 200:
            return None
        m = du.fetch_metrics(d.base_url)
        if m and du.metric(m, "tangram_num_requests_running") == 0 and \
                du.metric(m, "tangram_num_requests_waiting") == 0:
            return m
        return None
    return du.wait_for(quiet, timeout, 0.1)


def pages_of(m, n_ranks):
    """[(used, cached, total)] per rank."""
    return [(du.metric(m, "tangram_kv_pages_used", rank=str(r)),
             du.metric(m, "tangram_kv_pages_cached", rank=str(r)),
             du.metric(m, "tangram_kv_pages_capacity", rank=str(r)))
            for r in range(n_ranks)]


def run_round(d, ctx, phase_no, rnd, secs, fault_iter, fault_counts, notes):
    until = time.time() + secs
    threads = [threading.Thread(target=client_loop, daemon=True,
                                args=(ctx, 1000 * phase_no + 100 * rnd + i,
                                      until)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    rng = random.Random(7 + 31 * phase_no + rnd)
    for frac in (0.3, 0.65):
        wait = until - secs * (1 - frac) - time.time()
        if wait > 0:
            time.sleep(wait)
        f = next(fault_iter)
        if inject(d, f, rng, notes):
            fault_counts[f] += 1
    # Each scenario is bounded by the client deadline per request.
    for t in threads:
        t.join(DEADLINE * 5)
    return not any(t.is_alive() for t in threads)


def drain(d, ledger, rng):
    """Requests in flight, SIGTERM, answers for all; returns tangramd's exit
    status (None when it did not exit)."""
    results = []
    lock = threading.Lock()

    def one(i):
        if i % 3 == 2:
            rec, _ = grpc_call(ctx_grpc, ledger, "drain in flight",
                               grpc_req(rng, prompt=text(rng, 10),
                                        max_tokens=40, ignore_eos=True))
        else:
            rec, _ = http_call(d.http_port, ledger, "drain in flight",
                               "/v1/completions",
                               completion(random.Random(i), 10, 40, True),
                               stream=(i % 2 == 0))
        with lock:
            results.append(rec)

    ctx_grpc = Grpc(d.grpc_target)
    threads = [threading.Thread(target=one, args=(i,), daemon=True)
               for i in range(6)]
    for t in threads:
        t.start()
    du.wait_for(lambda: (du.metric(du.fetch_metrics(d.base_url) or {},
                                   "tangram_num_requests_running") or 0) >= 4,
                20, 0.02)
    d.proc.send_signal(signal.SIGTERM)
    late = []
    for i in range(3):
        time.sleep(0.05)
        rec = Record("drain late")
        try:
            st, _, body = du.http("POST", d.base_url + "/v1/completions",
                                  completion(random.Random(90 + i), 5, 4),
                                  timeout=DEADLINE)
            ok = st == 503 and du.is_openai_error(body)
            rec.outcome = "rejected" if ok else (
                "completed" if st == 200 else "lost")
            rec.detail = "status %s" % st
        except ConnectionRefusedError:
            rec.outcome = "rejected"  # the listener is closed: not accepted
        except OSError as e:
            rec.outcome, rec.detail = "lost", str(e)
        ledger.add(rec)
        late.append(rec)
    for t in threads:
        t.join(DEADLINE + 10)
    ctx_grpc.close()
    try:
        rc = d.proc.wait(timeout=SHUTDOWN_TIMEOUT + 20)
    except subprocess.TimeoutExpired:
        rc = None
    return rc, results, late


# ---- phases ---------------------------------------------------------------------

def run_phase(phase_no, name, model, work, args, profile, n_ranks, secs,
              summary):
    ledger = Ledger()
    fault_counts = {f: 0 for f in FAULTS}
    notes = []
    d = du.Daemon(model, work, profile=profile, args=args + [
        "--http-send-timeout", str(SEND_TIMEOUT),
        "--shutdown-timeout", str(SHUTDOWN_TIMEOUT)])
    rounds = []
    try:
        if not ck.check(d.start(), "%s: tangramd ready" % name,
                        d.log_text()[-3000:]):
            return
        router = d.child_pids("router")
        ck.check(len(router) == 1, "%s: one router process" % name, router)
        router = router[0] if router else None
        ctx = Ctx(d, ledger, phase_no)
        m0 = idle_metrics(d, n_ranks)
        start_pages = pages_of(m0, n_ranks) if m0 else None
        n_rounds = max(3, min(10, int(secs // 8)))
        per_round = secs / n_rounds
        fault_iter = iter(FAULTS * (2 * n_rounds))
        for rnd in range(n_rounds):
            t0 = time.time()
            ended = run_round(d, ctx, phase_no, rnd, per_round, fault_iter,
                              fault_counts, notes)
            ck.check(ended, "%s round %d: every client thread ended" %
                     (name, rnd))
            m = idle_metrics(d, n_ranks)
            ok = ck.check(m is not None, "%s round %d: idle with /health 200 "
                          "after the load" % (name, rnd))
            pg = pages_of(m, n_ranks) if ok else []
            ck.check(ok and all(u is not None and u == c for u, c, _ in pg),
                     "%s round %d: pages used == pages cached on every rank "
                     "(no leaked page): %s" % (name, rnd, pg))
            same = d.child_pids("router") == [router]
            ck.check(same, "%s round %d: the router is still pid %s" %
                     (name, rnd, router), d.child_pids("router"))
            rounds.append({"round": rnd, "secs": round(time.time() - t0, 1),
                           "requests": len(ledger.records),
                           "pages": pg, "rss": rss_bytes(router)})
        rss = [r["rss"] for r in rounds]
        if ck.check(all(isinstance(x, int) for x in rss),
                    "%s: router RSS read every round" % name, rss):
            base = rss[1]
            bound = base + max(int(base * RSS_SLACK_FRAC), RSS_SLACK_BYTES)
            ck.check(max(rss[1:]) <= bound,
                     "%s: router RSS after warm-up %.1f MiB, max %.1f MiB, "
                     "last %.1f MiB (drift %+.1f MiB; bound %.1f MiB)" %
                     (name, base / 2**20, max(rss[1:]) / 2**20,
                      rss[-1] / 2**20, (rss[-1] - base) / 2**20,
                      bound / 2**20))
        sm = du.fetch_metrics(d.base_url) or {}
        cut = du.metric(sm, "tangram_http_slow_readers_aborted_total") or 0
        ck.check(sum(fault_counts.values()) >= 2 * n_rounds - 2,
                 "%s: faults injected %s" % (name, fault_counts), notes)
        # On a loaded 2-core machine few requests of a kind may fall
        # between the faults, and all of them may meet one (at load
        # average 15 the 3 gRPC chat turns of a short run all did): a kind
        # that never completed runs again, at most 3 times, with no fault
        # injected, so the check below still says the server serves it
        # after the faults.
        rng_q = random.Random(99 + phase_no)
        quiet = []
        for kind, fn in SERVED_KINDS:
            for _ in range(3):
                if ledger.counts().get(kind, {}).get("completed", 0) > 0:
                    break
                quiet.append(kind)
                fn(ctx, rng_q)
        if quiet:
            notes.append("quiet pass after the faults for %s" % quiet)
        d.note_children()
        children = set(d.children)
        rc, inflight, late = drain(d, ledger, random.Random(phase_no))
        ck.check(rc == 0, "%s drain: tangramd exited 0" % name, rc)
        ck.check(len(inflight) == 6 and all(r.outcome in ("completed", "error")
                                            for r in inflight),
                 "%s drain: all 6 in-flight requests answered (%s)" %
                 (name, [r.outcome for r in inflight]),
                 [(r.outcome, r.detail) for r in inflight])
        ck.check(all(r.outcome == "rejected" for r in late),
                 "%s drain: requests after SIGTERM refused (503 or closed "
                 "listener)" % name, [(r.outcome, r.detail) for r in late])
        du.wait_for(lambda: not any(du.alive(c) for c in children), 5)
        ck.check(not any(du.alive(c) for c in children),
                 "%s drain: no child left" % name)
        counts = ledger.counts()
        bad = ledger.bad()
        total = len(ledger.records)
        ck.check(not bad, "%s: %d requests, none lost or hung" % (name, total),
                 [(r.kind, r.outcome, r.detail) for r in bad[:10]])
        by_outcome = {}
        for k in counts.values():
            for o, n in k.items():
                by_outcome[o] = by_outcome.get(o, 0) + n
        served = [k for k, _ in SERVED_KINDS
                  if counts.get(k, {}).get("completed", 0) > 0]
        ck.check(len(served) == 4, "%s: completions of every kind between "
                 "the faults (again after them: %s): %s" %
                 (name, sorted(set(quiet)) or "none", served), counts)
        reused = du.metric(sm, "tangram_cached_prompt_tokens_total") or 0
        ck.check(reused > 0, "%s: later turns reused stored KV (%d cached "
                 "prompt tokens)" % (name, reused))
        ck.check(cut >= 1 or counts.get("http stalled reader", {}).get(
            "cut", 0) == 0, "%s: stalled readers cut by the router: %d "
                 "(tangram_http_slow_readers_aborted_total)" % (name, cut))
        log = d.log_text()
        crashes = re.findall(r"(?:router|worker rank \d+) \(pid \d+\) "
                             r"(?:exited with status [1-9]\d*|killed by "
                             r"signal (?!9 )\d+[^\n]*)", log)
        ck.check(not crashes, "%s: no child crashed (only SIGKILLs)" % name,
                 crashes)
        dead = len(re.findall(r"link: rank \d+ died: no message for", log))
        summary[name] = {"requests": total, "hung_workers_killed": dead,
                         "cached_prompt_tokens": reused, "by_kind": counts,
                         "by_outcome": by_outcome, "faults": fault_counts,
                         "slow_readers_cut": cut, "start_pages": start_pages,
                         "rounds": rounds, "drain_exit": rc,
                         "drain": [r.outcome for r in inflight + late]}
        print_phase(name, summary[name])
    finally:
        d.stop()


def print_phase(name, s):
    print("---- %s: %d requests ----" % (name, s["requests"]))
    outcomes = ["completed", "disconnected", "cut", "error", "rejected",
                "lost", "hung"]
    print("%-22s" % "kind" + "".join("%13s" % o for o in outcomes))
    for kind in sorted(s["by_kind"]):
        print("%-22s" % kind + "".join("%13d" % s["by_kind"][kind].get(o, 0)
                                       for o in outcomes))
    print("%-22s" % "total" + "".join("%13d" % s["by_outcome"].get(o, 0)
                                      for o in outcomes))
    print("faults: %s (workers the router declared dead and killed: %d); "
          "stalled readers cut by the router: %d" %
          (s["faults"], s["hung_workers_killed"], s["slow_readers_cut"]))
    print("pages at start (used, cached, total per rank): %s" %
          s["start_pages"])
    print("%6s %7s %9s %12s  %s" % ("round", "secs", "requests", "RSS MiB",
                                    "pages after (used, cached, total)"))
    for r in s["rounds"]:
        print("%6d %7.1f %9d %12.1f  %s" % (
            r["round"], r["secs"], r["requests"],
            (r["rss"] or 0) / 2**20, r["pages"]))
    print("drain: exit %s, answers %s" % (s["drain_exit"], s["drain"]))


def main():
    missing = du.missing_inputs(programs=(
        "tangramd", "tangram-router", "tangram-worker", "tangram-make-model",
        "tangram-profile"))
    work = du.scratch_dir("tg-soak-")
    try:
        why = load_grpc(work) if not missing else None
        if why:
            missing.append(why)
        if missing:
            return du.fail_missing(missing)
        model = du.make_model(os.path.join(work, "model"))
        prof = du.make_skewed_profile(work, 2, 2, 16, 5, heads_per_group=1)
        summary = {"seconds": SECONDS}
        t0 = time.time()
        phases = [("tp1", ["--tp", "1"], None, 1),
                  ("tp2-profile", ["--tp", "2", "--heads-per-group", "1"],
                   prof, 2)]
        for i, (name, args, profile, n_ranks) in enumerate(phases):
            sub = os.path.join(work, name)
            os.makedirs(sub)
            run_phase(i, name, model, sub, args, profile, n_ranks,
                      SECONDS / len(phases), summary)
        summary["wall_seconds"] = round(time.time() - t0, 1)
        print("SOAK-SUMMARY " + json.dumps(summary, sort_keys=True))
        if ck.failures:
            for name, _, _, _ in phases:
                p = os.path.join(work, name, "tangramd.log")
                if os.path.exists(p):
                    with open(p, errors="replace") as f:
                        print("---- %s tangramd log (tail) ----" % name)
                        print(f.read()[-4000:])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ck.summary()


if __name__ == "__main__":
    sys.exit(main())
