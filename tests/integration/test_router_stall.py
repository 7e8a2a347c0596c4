#!/usr/bin/python3
"""A stopped router is restarted by tangramd (docs/RELIABILITY.md "A
stalled router"): the real tangramd on loopback, CPU backend, the tiny
qwen3 model of the integration tests, default --router-stall-ms (15 s).

The router writes WATCHDOG on its notify pipe every second from its event
loop; tangramd kills a router silent for longer than --router-stall-ms and
restarts it with the workers, as after a crash. Checked:

1. A SIGSTOP of 1 s (far under the deadline) then SIGCONT: the router keeps
   its pid and serves.
2. SIGSTOP of the router until tangramd acts, with a streaming request in
   flight and a second request sent during the stop: tangramd logs why
   ("sent no WATCHDOG for N ms ... router stall 1") and kills the stopped
   router no earlier than 14 s after the stop (the deadline counts from
   the last WATCHDOG, which came at most 1 s before it) and no later than
   15.25 s + LATE_S (checks every 250 ms; LATE_S for a loaded machine);
   both requests end (an error: their connection is cut) by then instead
   of waiting as long as the router stays stopped; a new router and worker
   start, /health is 200 again within the deadline + START_S, and a new
   request is served.
3. An invalid --router-stall-ms (1000: under twice the router's one-second
   report) is refused at start with exit status 2 naming the flag.

Before tangramd watched the router, nothing restarted it: check 2 failed
with the router still stopped 25 s after the stop. Client timeouts
everywhere, so a hang is a failure. About 25 s on two cores.
"""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

ck = du.Checker()

DEADLINE_S = 15.0   # --router-stall-ms default
TICK_S = 1.0        # the router's WATCHDOG period
CHECK_S = 0.25      # TD_STALL_CHECK_MS
# Slack on a bound that checks that a timer fired when it should rather
# than much later: a loaded machine may delay a process by seconds.
LATE_S = 10.0
# A fresh router and worker loading the tokenizer and the tiny model and
# saying READY: daemon_util allows a whole tangramd start 60 s on a loaded
# 2-core machine, and this is the same work.
START_S = 60.0


class Call(threading.Thread):
    """One completion in a thread; records when and how it ended."""

    def __init__(self, port, stream, max_tokens):
        super().__init__(daemon=True)
        self.port, self.stream, self.max_tokens = port, stream, max_tokens
        self.status = None
        self.error = None
        self.first = threading.Event()
        self.t_end = None

    def run(self):
        body = json.dumps({"model": "tiny", "prompt": "Once upon a time",
                           "max_tokens": self.max_tokens, "ignore_eos": True,
                           "stream": self.stream})
        conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                          timeout=120)
        try:
            conn.request("POST", "/v1/completions", body,
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            self.status = r.status
            while True:
                chunk = r.read1(4096) if self.stream else r.read()
                self.first.set()
                if not chunk or not self.stream:
                    break
        except (OSError, http.client.HTTPException) as e:
            self.error = repr(e)
        finally:
            self.first.set()
            self.t_end = time.time()
            conn.close()


def complete(d):
    try:
        st, _, data = du.http("POST", d.base_url + "/v1/completions",
                              {"model": "tiny", "prompt": "Hello",
                               "max_tokens": 4}, timeout=60)
        return st, data
    except OSError as e:
        return None, repr(e)


def check_short_stop(d):
    router = d.child_pids("router")
    if not ck.check(len(router) == 1, "one router child", router):
        return
    os.kill(router[0], signal.SIGSTOP)
    time.sleep(1.0)
    os.kill(router[0], signal.SIGCONT)
    st, data = complete(d)
    ck.check(st == 200, "after a 1 s SIGSTOP the router serves", data)
    ck.check(d.child_pids("router") == router and
             "sent no WATCHDOG" not in d.log_text(),
             "a 1 s SIGSTOP is not a stall: same router, nothing killed",
             d.child_pids("router"))


def check_long_stop(d):
    router = d.child_pids("router")
    worker = d.child_pids("worker")
    if not ck.check(len(router) == 1 and len(worker) == 1,
                    "one router and one worker", (router, worker)):
        return
    inflight = Call(d.http_port, True, 2000)
    inflight.start()
    ck.check(inflight.first.wait(30) and inflight.status == 200,
             "a streaming request is running", inflight.error)
    t_stop = time.time()
    os.kill(router[0], signal.SIGSTOP)
    time.sleep(0.5)
    during = Call(d.http_port, False, 4)
    during.start()
    gone = du.wait_for(lambda: not du.alive(router[0]),
                       DEADLINE_S + CHECK_S + LATE_S)
    t_kill = time.time() - t_stop
    ck.check(gone, "tangramd killed the stopped router (%.2f s after the "
             "stop)" % t_kill)
    if not gone:
        os.kill(router[0], signal.SIGCONT)
        return
    lo = DEADLINE_S - TICK_S
    ck.check(t_kill >= lo, "not before the deadline: %.2f s >= %.2f s" %
             (t_kill, lo))
    log = d.log_text()
    ck.check("router (pid %d) sent no WATCHDOG for" % router[0] in log and
             "--router-stall-ms 15000" in log and "router stall 1 since" in
             log, "tangramd logged why, and counted it",
             [ln for ln in log.splitlines() if "WATCHDOG" in ln][-3:])
    for c, what in ((inflight, "the streaming request in flight"),
                    (during, "the request sent during the stop")):
        c.join(LATE_S)
        ck.check(c.t_end is not None and c.t_end - t_stop <
                 DEADLINE_S + CHECK_S + LATE_S,
                 "%s ended once the router was killed (%s s after the "
                 "stop: %s)" % (what, c.t_end and "%.2f" % (c.t_end - t_stop),
                                c.error or c.status))
    back = du.wait_for(lambda: d.health() == 200 and
                       d.child_pids("router") and
                       d.child_pids("router") != router and
                       d.child_pids("worker") and
                       d.child_pids("worker") != worker,
                       DEADLINE_S + START_S)
    t_back = time.time() - t_stop
    ck.check(back, "a new router and worker serve again (/health 200 %.2f s "
             "after the stop; bound %.0f s)" % (t_back,
                                              DEADLINE_S + START_S))
    st, data = complete(d)
    ck.check(st == 200, "a new request is served after the restart", data)


def check_bad_flag(model, work):
    r = subprocess.run([du.prog("tangramd"), "--model", model,
                        "--router-stall-ms", "1000"],
                       capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items()
                            if not k.startswith("TANGRAM_")})
    ck.check(r.returncode == 2 and "--router-stall-ms (1000) must be 0 "
             "(never) or at least 2000" in r.stderr,
             "--router-stall-ms 1000 is refused with exit status 2 (%s)" %
             r.returncode, r.stderr[-500:])


def main():
    missing = du.missing_inputs()
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tg-rstall-")
    try:
        model = du.make_model(os.path.join(work, "tiny"))
        check_bad_flag(model, work)
        d = du.Daemon(model, work)
        try:
            if ck.check(d.start(), "tangramd started", d.log_text()[-3000:]):
                check_short_stop(d)
                check_long_stop(d)
            d.stop_checked(ck)
        finally:
            for pid in d.children:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            d.stop()
            d.print_log_tail(ck)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ck.summary()


if __name__ == "__main__":
    sys.exit(main())
