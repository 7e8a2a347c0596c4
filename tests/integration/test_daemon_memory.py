#!/usr/bin/python3
"""Integration test of the router's memory under large requests: what a
request costs after parsing is bounded (--max-request-memory), and
/health answers throughout.

Starts tangramd (router + one CPU worker) on loopback with the tiny qwen3
model and the default limits (--max-request-memory 1 GiB,
--tokenizer-threads 4) but --max-body-memory 64 MiB (a quarter of the
default: fewer bodies wait for their turn, so the test takes a minute, not
two; the parsed forms the attack piled up never counted against it), then:

- 48 clients (a process of their own, so that this one's GIL cannot slow
  the prober) each send one 8 MiB chat request made of 270,000 tiny
  messages, with the API key, and retry on 503 as Retry-After says for
  ATTACK_S, longer (at most ATTACK_MAX_S) until a dozen have their answer
  (the "64 retrying clients" of the report): each such body
  becomes ~300 MiB of parsed JSON, messages and rendered chat, so together
  they took the router from 60 MiB to 4.8 GiB. Every client ends with 400
  context_length_exceeded (the chat renders to more tokens than the
  context) or, when it gave up retrying, 503 with Retry-After (its body
  did not fit the body budget), at least a dozen with the 400, and the
  router's RSS, sampled every 10 ms by a process of its own, stays under
  RSS_CEILING_MIB;
- then 6 clients with 8 MiB prompts of integers and 1 with an 8 MiB
  single-word /tokenize (BPE's worst case) at once: the same ceiling, every
  /tokenize answered with its ids;
- an 8 MiB array of 2.8 million empty objects, which would take ~2 GiB to
  parse and render, is refused with 413 request_too_large naming
  --max-request-memory before it is parsed;
- throughout, a prober process asks /health every 50 ms: every probe is
  answered (200, or 503 when the starved worker is reported stalled), none
  slower than PROBE_BOUND_S; the slowest and the 99th percentile are
  printed;
- afterwards the budgets are empty (tangram_request_memory_bytes and
  tangram_request_body_memory_bytes 0, nobody waiting) and the router is
  the same process.
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

KEY = "sk-tangram-memory"
AUTH = {"Authorization": "Bearer " + KEY}
# How long the chat clients keep retrying at least; the requests in the
# router by then are answered however long they take. The check wants a
# dozen of them answered 400 (the work flows, not only refusals): how many
# are in 20 s depends on the machine's load (9 at load average 15 on this
# 2-core box), so until a dozen clients have their answer the clients go
# on retrying, for at most ATTACK_MAX_S (at load 17: 20 answered in the
# 288 s the whole chat phase took).
ATTACK_S = 20
ATTACK_MAX_S = 180
WANT_ANSWERED = 12
# --max-body-memory of the daemon; TANGRAM_TEST_BODY_MEMORY=256MiB runs the
# default (the report's setting; the test then takes about 80 s).
BODY_MEMORY = os.environ.get("TANGRAM_TEST_BODY_MEMORY", "64MiB")

# The router's RSS under the attacks may not pass this. What it holds at
# most: its baseline (~60 MiB), the bodies being received or waiting
# (--max-body-memory, 64 MiB here), what large requests become between
# their parse and their tokens (--max-request-memory, 1 GiB, an estimate
# above what they really take) and what the allocator keeps of freed
# memory for reuse: 1,536 MiB leaves 384 MiB for the baseline and the
# allocator. Measured here: peak 1.0-1.2 GiB; with the default 256 MiB of
# bodies, 1.1-1.26 GiB (docs/RELIABILITY.md). Before the budget the chat
# attack alone reached 4.8 GiB.
RSS_CEILING_MIB = 1536

# How long one /health may take while the attacks run. The loop thread
# that answers it does no parsing, rendering or tokenizing (the thread
# pool does, at a lower priority) and frees no parsed request, so an answer
# takes well under a millisecond of its time; what a probe waits for is
# the CPU, shared on this 2-core machine with four busy pool threads, the
# worker, the 48 clients and the other engineers' builds (load average 8
# to 20). Measured: 99th percentile under 30 ms, slowest 0.4 s at load 8.
# 2 s is five times that slowest and still fails the old router, whose
# loop freed hundreds of megabytes of parsed requests and which swapped
# the machine into seconds-long answers (4.9 s measured).
PROBE_BOUND_S = 2.0

chk = du.Checker()

# Clients: argv = port, key, kind, count, seconds to retry. One thread per
# client; each sends its body and retries on 503 (Retry-After) or a reset
# until it gets another answer or the time to retry is over (a request sent
# before then waits for its answer); prints one JSON line per client: its
# final status and the answer's start.
CLIENTS = r"""
import json, socket, sys, threading, time
port, key, kind, n, deadline = (int(sys.argv[1]), sys.argv[2], sys.argv[3],
                                int(sys.argv[4]), float(sys.argv[5]))
# Past the deadline, retries go on until `want` clients have their final
# answer (not 503) or until `latest`.
want, latest = int(sys.argv[6]), float(sys.argv[7])
size = 8 << 20
if kind == "chat":
    msg = b'{"role":"user","content":"hi"},'
    k = (size - 100) // len(msg)
    body = (b'{"model":"tiny","messages":[' + msg * (k - 1) + msg[:-1] +
            b'],"max_tokens":4}')
    path = "/v1/chat/completions"
elif kind == "ints":
    k = (size - 100) // 2
    body = (b'{"model":"tiny","prompt":[' + b"1," * (k - 1) +
            b'1],"max_tokens":4}')
    path = "/v1/completions"
elif kind == "word":
    body = (b'{"model":"tiny","add_special_tokens":false,"prompt":"' +
            b"a" * (size - 100) + b'"}')
    path = "/tokenize"
else:
    k = (size - 100) // 3
    body = b'{"model":"tiny","messages":[' + b"{}," * (k - 1) + b'{}]}'
    path = "/v1/chat/completions"
head = ("POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
        "Content-Type: application/json\r\nContent-Length: %d\r\n"
        "Connection: close\r\n\r\n" % (path, key, len(body))).encode()
end = time.monotonic() + deadline
hard_end = time.monotonic() + max(deadline, latest)
out, answered, mu = [], [0], threading.Lock()
def retrying():
    now = time.monotonic()
    with mu:
        return now < end or (answered[0] < want and now < hard_end)
def one(i):
    tries, last = 0, None
    while retrying():
        tries += 1
        try:
            # An answer may take minutes on a loaded 2-core machine (the
            # 8 MiB one-word /tokenize took over 120 s at load average 17
            # beside the integer prompts): a timeout would only send the
            # same work again.
            s = socket.create_connection(("127.0.0.1", port), timeout=600)
            try:
                s.sendall(head + body)
            except OSError:
                pass  # refused mid-body: the answer is read below
            data = b""
            while True:
                b = s.recv(1 << 20)
                if not b:
                    break
                data += b
            s.close()
        except OSError:
            data = b""
        status = int(data[9:12]) if data[:5] == b"HTTP/" else 0
        last = (status, data.split(b"\r\n\r\n", 1)[-1][:400].decode(
            errors="replace"))
        if status not in (0, 503):
            with mu:
                answered[0] += 1
            break
        time.sleep(1.0)
    out.append({"i": i, "tries": tries, "status": last[0] if last else 0,
                "body": last[1] if last else ""})
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in ts:
    t.start()
for t in ts:
    t.join()
for o in out:
    print(json.dumps(o))
"""

# Prober: argv = port, router pid. Samples the router's VmRSS every 10 ms
# and GETs /health every 50 ms on a new connection until stdin closes;
# prints the peak RSS (MiB) and every probe's (latency, status).
PROBE = r"""
import json, select, socket, sys, time
port, pid = int(sys.argv[1]), int(sys.argv[2])
def rss():
    try:
        with open("/proc/%d/status" % pid) as f:
            for l in f:
                if l.startswith("VmRSS:"):
                    return int(l.split()[1]) // 1024
    except OSError:
        return 0
    return 0
peak, lat, nxt = 0, [], 0.0
while not select.select([sys.stdin], [], [], 0)[0]:
    peak = max(peak, rss())
    if time.monotonic() >= nxt:
        t0 = time.monotonic()
        status = "none"
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n"
                      b"Connection: close\r\n\r\n")
            d = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                d += b
            s.close()
            status = d[9:12].decode()
        except OSError as e:
            status = "error " + str(e)
        lat.append((time.monotonic() - t0, status))
        nxt = time.monotonic() + 0.05
    time.sleep(0.01)
print(json.dumps({"peak": peak, "lat": lat}))
"""


def clients(d, kind, n, deadline, want=0, latest=0):
    return subprocess.Popen([sys.executable, "-c", CLIENTS,
                             str(d.http_port), KEY, kind, str(n),
                             str(deadline), str(want), str(latest)],
                            stdout=subprocess.PIPE, text=True)


def finish(p):
    out, _ = p.communicate(timeout=1200)
    return [json.loads(ln) for ln in out.splitlines() if ln.strip()]


def code_of(body):
    try:
        return json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def metric(d, name):
    m = du.fetch_metrics(d.base_url, AUTH)
    return du.metric(m, name) if m else None


def main():
    missing = du.missing_inputs()
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgdmemory")
    d = None
    try:
        model = du.make_model(os.path.join(work, "tiny"))
        d = du.Daemon(model, work, ["--max-body-memory", BODY_MEMORY],
                      api_key=KEY)
        ready = d.start()
        chk.check(ready, "tangramd starts and /health turns 200",
                  d.log_text()[-3000:])
        if not ready:
            return chk.summary()
        router = d.child_pids("router")
        chk.check(len(router) == 1, "the router process is found")
        pid = router[0]
        with open("/proc/%d/status" % pid) as f:
            base = [int(ln.split()[1]) // 1024 for ln in f
                    if ln.startswith("VmRSS:")][0]
        prober = subprocess.Popen([sys.executable, "-c", PROBE,
                                   str(d.http_port), str(pid)],
                                  stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        got = finish(clients(d, "chat", 48, ATTACK_S, WANT_ANSWERED,
                             ATTACK_MAX_S))
        t_chat = time.monotonic() - t0
        ctx = [g for g in got if g["status"] == 400 and
               code_of(g["body"]) == "context_length_exceeded"]
        # A client that gave up was refused for the body budget; a reset
        # before its answer could be read (the router closes at once on a
        # refused large body) shows as 0.
        full = [g for g in got if g["status"] in (0, 503) and
                (g["status"] == 0 or
                 code_of(g["body"]) == "body_memory_full")]
        chk.check(len(got) == 48 and len(ctx) + len(full) == 48 and
                  len(ctx) >= WANT_ANSWERED,
                  "48 clients of 8 MiB chats retrying for %d s or more: %d answered "
                  "400 context_length_exceeded, %d still refused 503 "
                  "body_memory_full when they gave up, nothing else (%d "
                  "tries, %.0f s)" %
                  (ATTACK_S, len(ctx), len(full),
                   sum(g["tries"] for g in got), t_chat),
                  [(g["status"], g["body"][:120]) for g in got
                   if g not in ctx and g not in full][:5])
        # Integers and BPE's worst case at once.
        t1 = time.monotonic()
        ints = clients(d, "ints", 6, 150)
        word = clients(d, "word", 1, 150)
        got_i, got_w = finish(ints), finish(word)
        t_mix = time.monotonic() - t1
        chk.check(len(got_i) == 6 and
                  all(g["status"] == 400 and
                      code_of(g["body"]) == "context_length_exceeded"
                      for g in got_i),
                  "6 clients of 8 MiB integer prompts all get 400 "
                  "context_length_exceeded",
                  [(g["status"], g["body"][:120]) for g in got_i][:5])
        chk.check(len(got_w) == 1 and
                  all(g["status"] == 200 and '"count":' in g["body"]
                      for g in got_w),
                  "an 8 MiB one-word /tokenize gets its ids (%.0f s with "
                  "the integers)" % t_mix,
                  [(g["status"], g["body"][:120]) for g in got_w])
        # More than the whole budget: refused before it is parsed.
        got = finish(clients(d, "objects", 1, 60))
        chk.check(len(got) == 1 and got[0]["status"] == 413 and
                  code_of(got[0]["body"]) == "request_too_large" and
                  "--max-request-memory" in got[0]["body"],
                  "8 MiB of empty objects (~2 GiB parsed) gets 413 "
                  "request_too_large naming --max-request-memory",
                  got[:1])
        out, _ = prober.communicate("stop\n", timeout=60)
        probe = json.loads(out)
        lat = sorted(x[0] for x in probe["lat"])
        bad = [x for x in probe["lat"] if x[1] not in ("200", "503")]
        p99 = lat[int(len(lat) * 0.99)] if lat else None
        print("router RSS %d MiB before, peak %d MiB; /health: %d probes, "
              "p50 %.3f s, p99 %.3f s, slowest %.3f s" %
              (base, probe["peak"], len(lat), lat[len(lat) // 2], p99,
               lat[-1]))
        chk.check(probe["peak"] < RSS_CEILING_MIB,
                  "the router's RSS stays under %d MiB (peak %d MiB, %d "
                  "before)" % (RSS_CEILING_MIB, probe["peak"], base))
        chk.check(len(lat) >= 100 and not bad and lat[-1] < PROBE_BOUND_S,
                  "every /health probe during the attacks is answered "
                  "within %.1f s (%d probes, slowest %.3f s, 99th "
                  "percentile %.3f s)" %
                  (PROBE_BOUND_S, len(lat), lat[-1], p99), bad[:5])
        back = du.wait_for(lambda: metric(d, "tangram_request_memory_bytes")
                           == 0 and metric(
                               d, "tangram_request_body_memory_bytes") == 0,
                           30)
        chk.check(back and metric(d, "tangram_request_memory_waiting") == 0,
                  "the request memory and body budgets are empty again")
        refused = metric(d, "tangram_request_memory_refused_total")
        chk.check(refused is not None and refused >= 1,
                  "tangram_request_memory_refused_total counts the 413 "
                  "(%s)" % refused)
        chk.check(d.child_pids("router") == [pid],
                  "the router is the same process throughout")
        rc, left = d.stop()
        d = None
        chk.check(rc == 0 and not left, "tangramd stops cleanly")
    finally:
        if d is not None:
            rc, left = d.stop()
            if chk.failures:
                print("---- tangramd log (tail) ----")
                print(d.log_text()[-4000:])
        shutil.rmtree(work, ignore_errors=True)
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
