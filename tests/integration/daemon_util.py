"""daemon_util — shared helpers for integration tests of the real tangramd.

Used by test_daemon_http.py, test_daemon_grpc.py and the fault tests. Only the
Python standard library is needed here.

What it gives:
- env(): TANGRAM_BIN / TANGRAM_DATA / TANGRAM_SOURCE and the program paths.
- Checker: prints "ok   ..." / "FAIL ..." / "skip ..." lines and collects
  failures, so one test file reports every broken check instead of the first.
- make_model(): the tiny qwen3 model of the integration tests (cached per
  directory; ~1 s to generate).
- free_port(): a loopback TCP port that was free a moment ago.
- Daemon: starts `tangramd` with the small settings the tests use, waits for
  /health (starting again on new ports when a parallel test took one),
  remembers the router and worker pids, and stops it (SIGTERM, then
  SIGKILL after a timeout) checking that no child survives. Use it as a
  context manager so the daemon is killed even when a test raises.
- GPU tests: gpu_count() / gpu_skip() (skip only without a device, fail
  under TANGRAM_REQUIRE_GPU=1), and teacher forcing of two backends
  (forced_scores, forced_decode, measure_forced, check_forced).
- http(): one HTTP/1.1 request through http.client (any method, raw body;
  returns status, headers and body), json_of(), is_openai_error(),
  sse_events().
- parse_metrics() / metric(): the Prometheus text format into a dict.

Conventions: every helper raises on programming errors only; network and
server failures come back as values (status codes, None) so tests can check
them.
"""
import http.client as httplib
import json
import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time

BIN = os.environ.get("TANGRAM_BIN", "")
DATA = os.environ.get("TANGRAM_DATA", "")
SOURCE = os.environ.get("TANGRAM_SOURCE", "")

SKIP = 77  # ctest's "skipped" exit status: only the GPU tests may use it


def prog(name):
    """Path of the program `name` in TANGRAM_BIN (it may not exist)."""
    return os.path.join(BIN, name)


# The programs of a test that also builds profiles and runs the in-process
# generator beside the daemon.
ALL_PROGRAMS = ("tangramd", "tangram-router", "tangram-worker",
                "tangram-make-model", "tangram-profile", "tangram-generate")


def missing_inputs(programs=("tangramd", "tangram-router", "tangram-worker",
                               "tangram-make-model"), modules=(), tools=()):
    """Names every input of a test that is absent: programs not built in
    TANGRAM_BIN, the project's qwen3 tokenizer, Python modules (with their
    Debian package) and command-line tools. An empty list means the test
    can run; otherwise the test fails naming them (it never skips)."""
    out = []
    if BIN == "":
        out.append("TANGRAM_BIN is not set")
    else:
        out += ["%s (not built)" % prog(p) for p in programs
                if not os.access(prog(p), os.X_OK)]
    tok = os.path.join(DATA, "tokenizers", "qwen3")
    if not os.path.isdir(tok):
        out.append("project data %s (TANGRAM_DATA=%r)" % (tok, DATA))
    for mod, pkg in modules:
        try:
            __import__(mod)
        except ImportError:
            out.append("Python module %s (Debian package %s)" % (mod, pkg))
    out += ["tool %s (not on PATH)" % t for t in tools
            if shutil.which(t) is None]
    return out


def fail_missing(missing):
    """Prints the missing inputs as a failure; returns exit status 1."""
    print("FAIL: missing inputs (sh deploy/install-deps.sh installs the "
          "packages; cmake --build builds the programs):", flush=True)
    for m in missing:
        print("  - " + m, flush=True)
    return 1


def have_daemon():
    """True when missing_inputs() finds nothing."""
    return not missing_inputs()


class Checker:
    """Collects named checks. check() returns the condition so a caller can
    leave out dependent checks; missing() records a check that could not run
    for want of an input, which is a failure too."""

    def __init__(self):
        self.failures = []
        self.passed = 0

    def check(self, cond, what, detail=None):
        if cond:
            self.passed += 1
            print("ok   " + what, flush=True)
        else:
            self.failures.append(what)
            msg = "FAIL " + what
            if detail is not None:
                msg += "\n       " + str(detail)[:2000]
            print(msg, flush=True)
        return bool(cond)

    def missing(self, what, why):
        self.failures.append("%s (missing: %s)" % (what, why))
        print("FAIL %s: could not run, missing: %s" % (what, why), flush=True)

    def summary(self):
        """Prints the totals; returns the process exit status (0 or 1)."""
        print("%d passed, %d failed" % (self.passed, len(self.failures)),
              flush=True)
        for f in self.failures:
            print("  failed: " + f)
        return 1 if self.failures else 0


# ---- model and ports ------------------------------------------------------

# The tiny model of the integration tests, small enough that the daemon
# starts in seconds on two cores: 2 layers, 4 query heads over 2 KV heads
# of 16, vocabulary of the real qwen3 tokenizer.
TINY_MODEL_ARGS = ["--arch", "qwen3", "--hidden", "64", "--layers", "2",
                   "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
                   "--ffn", "128", "--dtype", "bf16", "--seed", "1"]


def make_model(out_dir, extra=None):
    """Generates the tiny qwen3 model into out_dir (skipped when out_dir
    already holds one) and returns out_dir. Raises RuntimeError with the
    tool's stderr when generation fails."""
    if os.path.exists(os.path.join(out_dir, "model.safetensors")):
        return out_dir
    cmd = [prog("tangram-make-model")] + TINY_MODEL_ARGS + (extra or []) + [
        "--tokenizer", os.path.join(DATA, "tokenizers", "qwen3"),
        "-o", out_dir]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError("tangram-make-model failed: " + r.stderr)
    return out_dir


def make_model_args(out_dir, args, tokenizer="qwen3"):
    """Runs tangram-make-model with `args` (flags) into out_dir and returns
    out_dir. Raises RuntimeError with the tool's stderr on failure."""
    cmd = [prog("tangram-make-model")] + list(args) + [
        "--tokenizer", os.path.join(DATA, "tokenizers", tokenizer),
        "-o", out_dir]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError("tangram-make-model failed: " + r.stderr)
    return out_dir


def make_skewed_profile(work, layers, kv_heads, head_dim, seed,
                        n_samples=24, low=0.05, heads_per_group=1):
    """Builds a profile with tangram-profile from a synthetic retention
    file of a Qwen3 model (layers x kv_heads of head_dim): per head a base
    retention low + (0.95 - low) * u^2 (u uniform, so a few heads keep much
    and most keep little), n_samples noisy samples around it (sigma 0.03),
    target 0.5. Returns the profile's path (in work)."""
    rng = random.Random(seed)
    base = [[low + (0.95 - low) * rng.random() ** 2 for _ in range(kv_heads)]
            for _ in range(layers)]
    samples = [[[min(1.0, max(0.0, round(base[l][h] + rng.gauss(0, 0.03), 4)))
                 for h in range(kv_heads)] for l in range(layers)]
               for _ in range(n_samples)]
    ret = os.path.join(work, "ret.json")
    with open(ret, "w") as f:
        json.dump({"format": "tangram-retention", "version": 1,
                   "model": {"architecture": "Qwen3ForCausalLM",
                             "num_layers": layers, "num_kv_heads": kv_heads,
                             "head_dim": head_dim},
                   "method": "snapkv", "target_ratio": 0.5,
                   "samples": samples}, f)
    prof = os.path.join(work, "profile.json")
    r = subprocess.run([prog("tangram-profile"), "build", "--retention",
                        ret, "--heads-per-group", str(heads_per_group), "-o",
                        prof], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError("tangram-profile build failed: " + r.stderr)
    return prof


def greedy_agrees(ref_tokens, ref_top, got_tokens, near_tie):
    """The rule comparing two greedy runs whose numerics differ (bf16
    against fp32, a different reduction order): True when got's tokens
    equal ref's, or first differ right after a step where ref's two most
    likely tokens were within near_tie nat (from there on the runs may
    take different paths, so the rest cannot be compared). ref_top: per
    step a {token: logprob} dict of ref's top alternatives."""
    if ref_tokens is None or got_tokens is None or \
            len(ref_tokens) != len(got_tokens):
        return False
    for i, (a, b) in enumerate(zip(ref_tokens, got_tokens)):
        if a == b:
            continue
        lps = sorted(ref_top[i].values(), reverse=True) if ref_top else []
        return len(lps) >= 2 and lps[0] - lps[1] < near_tie
    return True


# ---- CUDA against CPU: both backends score one token sequence --------------

def complete_ids(d, ids, max_tokens, extra=None, headers=None, timeout=300):
    """A greedy /v1/completions of the prompt `ids` (token ids) with
    logprobs 5 and ignore_eos; `extra` adds or overrides body fields.
    Returns (tokens, token_logprobs, top_logprobs, json) of the first
    choice, or (None, why, None, None)."""
    body = {"model": "model", "prompt": list(ids), "max_tokens": max_tokens,
            "temperature": 0, "logprobs": 5, "ignore_eos": True}
    body.update(extra or {})
    try:
        st, _, raw = http("POST", d.base_url + "/v1/completions", body,
                          headers=headers, timeout=timeout)
    except OSError as e:
        return None, "request failed: %s" % e, None, None
    j = json_of(raw)
    if st != 200 or not j:
        return None, "status %s: %s" % (st, raw[:300]), None, None
    lp = j["choices"][0].get("logprobs") or {}
    return lp.get("tokens"), lp.get("token_logprobs"), \
        lp.get("top_logprobs"), j


def forced_scores(d, prompt, seq, extra=None):
    """Teacher forcing through the daemon's API: for each i, the
    log-probability of seq[i] after prompt + seq[:i], from a one-token
    completion of that prefix whose choice is forced to seq[i] by
    logit_bias +100 (the returned logprob is the raw one, unbiased), with
    the backend's own top-5 there. The requests go in order, so a daemon
    reuses the previous prefix's stored KV exactly as another daemon given
    the same requests does; each choice is checked to be seq[i] (its text
    against /detokenize's). Returns a list of {"lp", "top": [(token, lp)
    by lp descending]} per position, or (None, why)."""
    out, text = [], {}
    for i, t in enumerate(seq):
        body = dict(extra or {}, logit_bias={str(t): 100})
        toks, lps, tops, _ = complete_ids(d, list(prompt) + list(seq[:i]), 1,
                                          body)
        if toks is None or not lps or len(lps) != 1:
            return None, "position %d: %s" % (i, lps)
        if t not in text:
            st, _, raw = http("POST", d.base_url + "/detokenize",
                              {"model": "model", "tokens": [t]})
            text[t] = (json_of(raw) or {}).get("prompt") if st == 200 \
                else None
        # Token text is lossy for a lone byte of a UTF-8 sequence.
        if toks[0] != text[t] and "\ufffd" not in (text[t] or "") + toks[0]:
            return None, "position %d: the choice is %r, not the forced " \
                "token %d (%r)" % (i, toks[0], t, text[t])
        top = sorted((tops[0] or {}).items(), key=lambda kv: -kv[1])
        out.append({"lp": lps[0], "top": top})
    return out, None


def forced_decode(d, prompt, tok, n, extra=None):
    """Teacher-forced decode through the daemon's API: the prompt, then n
    tokens all forced to `tok` (logit_bias +100), so every backend decodes
    the same sequence through its decode path. Returns the n raw
    log-probabilities of tok as scores like forced_scores', or (None,
    why)."""
    body = dict(extra or {}, logit_bias={str(tok): 100})
    toks, lps, tops, _ = complete_ids(d, prompt, n, body)
    if toks is None or not lps or len(lps) != n or len(set(toks)) != 1:
        return None, "forced decode: %s %s" % (toks, lps)
    return [{"lp": lp, "top": sorted((tp or {}).items(),
                                     key=lambda kv: -kv[1])}
            for lp, tp in zip(lps, tops)], None


def compare_scores(ref, got, tol):
    """Compares two backends' scores of one sequence (forced_scores or
    forced_decode, position by position): returns a dict with n, worst and
    mean |difference| of the forced token's logprob, bad (positions over
    tol, with both values), agree (positions where both backends' most
    likely token is the same) and must_agree_bad (positions where ref's
    two most likely tokens are more than 2 tol apart, so a logprob error
    within tol could not swap them, yet the most likely tokens differ)."""
    diffs, bad, agree, must = [], [], 0, []
    for i, (a, b) in enumerate(zip(ref, got)):
        dlt = abs(a["lp"] - b["lp"])
        diffs.append(dlt)
        if not dlt <= tol:
            bad.append((i, a["lp"], b["lp"]))
        same = bool(a["top"]) and bool(b["top"]) and \
            a["top"][0][0] == b["top"][0][0]
        agree += same
        gap = a["top"][0][1] - a["top"][1][1] if len(a["top"]) > 1 else 0
        if not same and gap > 2 * tol:
            must.append((i, a["top"][:2], b["top"][:2]))
    n = len(diffs)
    return {"n": n, "worst": max(diffs) if diffs else 0.0,
            "mean": sum(diffs) / n if n else 0.0, "bad": bad,
            "agree": agree, "must_agree_bad": must,
            "complete": len(ref) == len(got)}


def measure_forced(chk, d, cases, n_decode, extra=None):
    """Every score teacher forcing gives of daemon d, for cases [(prompt
    ids, sequence)]: per case (forced_scores of the sequence,
    forced_decode of n_decode copies of its first token, the free-running
    greedy completion of n_decode tokens as (tokens, top_logprobs)).
    `extra` adds body fields to every request (a seed). A failed request is
    a failed check of chk; returns the list, or None after one."""
    out = []
    for k, (p, seq) in enumerate(cases):
        forced, why = forced_scores(d, p, seq, extra)
        if not chk.check(forced is not None, "prompt %d: teacher-forced "
                         "scores" % k, why):
            return None
        dec, why = forced_decode(d, p, seq[0], n_decode, extra)
        if not chk.check(dec is not None, "prompt %d: forced decode" % k,
                         why):
            return None
        toks, lps, tops, _ = complete_ids(d, p, n_decode, extra)
        if not chk.check(toks is not None, "prompt %d: greedy completion"
                         % k, lps):
            return None
        out.append((forced, dec, (toks, tops)))
    return out


def check_forced(chk, name, ref, got, tol, near_tie):
    """Checks measure_forced's scores of one backend (got) against
    another's (ref): the forced token's logprob within tol at every forced
    position and every forced decode step, the most likely token the same
    wherever ref's top two are over 2 tol apart, and the free-running
    greedy completions differing only after a step where ref's top two
    were within near_tie (greedy_agrees). Prints the figures: worst and
    mean |difference|, greedy agreement at the forced positions, and how
    many free-running tokens agree."""
    for k, (a, b) in enumerate(zip(ref, got)):
        for what, x, y in (("forced positions", a[0], b[0]),
                           ("forced decode", a[1], b[1])):
            r = compare_scores(x, y, tol)
            print("# %s, prompt %d, %s: %d positions, worst |dlogprob| "
                  "%.4g, mean %.4g (tolerance %.3g); greedy agreement "
                  "%d/%d" % (name, k, what, r["n"], r["worst"], r["mean"],
                             tol, r["agree"], r["n"]), flush=True)
            chk.check(r["complete"] and r["n"] == len(x) and not r["bad"],
                      "%s, prompt %d: %s within %.3g nat at every position"
                      % (name, k, what, tol), r["bad"])
            chk.check(not r["must_agree_bad"],
                      "%s, prompt %d: %s: the same most likely token "
                      "wherever the reference's top two are over %.3g apart"
                      % (name, k, what, 2 * tol), r["must_agree_bad"])
        ta, tops = a[2]
        tb = b[2][0]
        same = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y),
                    len(ta))
        print("# %s, prompt %d: free-running greedy agrees for %d of %d "
              "tokens" % (name, k, same, len(ta)), flush=True)
        chk.check(greedy_agrees(ta, tops, tb, near_tie),
                  "%s, prompt %d: free-running greedy differs only after a "
                  "near-tie (%.2g nat)" % (name, k, near_tie),
                  "reference %s\ngot %s" % (ta, tb))


def require_gpu():
    """True when TANGRAM_REQUIRE_GPU=1 (the GPU round sets it): a GPU test
    that cannot reach a device then fails instead of skipping."""
    return os.environ.get("TANGRAM_REQUIRE_GPU") == "1"


def gpu_probe():
    """(n, problem): the NVIDIA GPUs `nvidia-smi -L` lists, and None, or
    (0, why) when a driver is there but the GPUs cannot be listed (a broken
    driver, or nvidia-smi missing beside a loaded driver). A machine
    without a loaded NVIDIA kernel driver (/proc/driver/nvidia/version
    absent) and without nvidia-smi has no device: (0, None)."""
    driver = os.path.exists("/proc/driver/nvidia/version")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return (0, "an NVIDIA driver is loaded but nvidia-smi is not on "
                   "PATH") if driver else (0, None)
    try:
        r = subprocess.run([smi, "-L"], capture_output=True, text=True,
                           timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 0, "nvidia-smi -L: %s" % e
    n = sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))
    if r.returncode == 0:
        return n, None
    out = (r.stdout + r.stderr).strip()
    if not driver or "No devices were found" in out:
        return 0, None
    return 0, "nvidia-smi -L failed (exit %d): %s" % (r.returncode,
                                                       out[-300:])


def gpu_count():
    """NVIDIA GPUs the machine has (0: none, the only reason a GPU test may
    skip). Raises RuntimeError naming the problem when a driver is there
    but the GPUs cannot be listed: the test then fails, never skips."""
    n, problem = gpu_probe()
    if problem is not None:
        raise RuntimeError("cannot count the GPUs: " + problem)
    return n


def gpu_skip(why="no NVIDIA GPU"):
    """The exit status of a GPU test that found no device: prints
    "skipped: <why>" and returns SKIP, or, under TANGRAM_REQUIRE_GPU=1,
    prints a failure and returns 1."""
    if require_gpu():
        print("FAIL: TANGRAM_REQUIRE_GPU=1 but " + why, flush=True)
        return 1
    print("skipped: " + why, flush=True)
    return SKIP


def free_port():
    """A TCP port on 127.0.0.1 that was free when asked (bind port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- processes ------------------------------------------------------------

def children_of(pid):
    """Pids whose parent is pid (from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(name))
    return out


def cmdline(pid):
    """The command line of pid as one string ('' when it is gone)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def wait_for(pred, timeout, step=0.05):
    """Polls pred() until it returns a true value or timeout seconds pass;
    returns its last value."""
    end = time.time() + timeout
    while True:
        v = pred()
        if v or time.time() >= end:
            return v
        time.sleep(step)


class Daemon:
    """One tangramd on loopback with free HTTP and gRPC ports.

    args: extra tangramd flags (strings). The defaults keep the daemon small:
    --kv-memory 64MiB (the worker would otherwise reserve most of the host
    RAM), --prefill-chunk 64, --heads-per-group 2 (the tiny model has two KV
    heads), --worker-heartbeat-ms 1000 (the daemon's default: a worker
    silent for 5 s is dead; half that was seen to kill workers busy in one
    step on a loaded machine). api_key goes through the environment
    (TANGRAM_API_KEY), as an operator should do. The daemon's stderr goes
    to <workdir>/tangramd.log.
    """

    DEFAULT_ARGS = ["--kv-memory", "64MiB", "--prefill-chunk", "64",
                    "--max-batched-tokens", "512", "--heads-per-group", "2",
                    "--worker-heartbeat-ms", "1000", "--shutdown-timeout", "5"]

    # Starts tried when the daemon loses a port: free_port() only says a
    # port was free a moment ago, and a test running in parallel may bind
    # it before tangramd does.
    PORT_TRIES = 4

    def __init__(self, model, workdir, args=None, api_key=None, profile=None,
                 nofile=None):
        self.model = model
        self.workdir = workdir
        self.args = list(args or [])
        self.api_key = api_key
        self.profile = profile
        self.nofile = nofile  # RLIMIT_NOFILE (soft = hard) of the daemon
        self.new_ports()
        self.proc = None
        self.log_path = os.path.join(workdir, "tangramd.log")
        self.log_from = 0  # where the latest start's part of the log begins
        self.children = set()  # every router/worker pid seen
        self.port_retries = 0

    def new_ports(self):
        """Picks a free HTTP and a free gRPC port, different ones."""
        self.http_port = free_port()
        self.grpc_port = free_port()
        while self.grpc_port == self.http_port:
            self.grpc_port = free_port()

    @property
    def host(self):
        return "127.0.0.1"

    @property
    def base_url(self):
        return "http://127.0.0.1:%d" % self.http_port

    @property
    def grpc_target(self):
        return "127.0.0.1:%d" % self.grpc_port

    def command(self):
        cmd = [prog("tangramd"), "--model", self.model,
               "--http-port", str(self.http_port),
               "--grpc-port", str(self.grpc_port)] + self.DEFAULT_ARGS
        if self.profile:
            cmd += ["--profile", self.profile]
        return cmd + self.args

    def start(self, timeout=60.0):
        """Starts tangramd and waits until /health answers 200. Returns True
        when it is ready; False (daemon left running, call stop()) when it
        exited or did not get ready in time; the log tells why. A daemon
        that could not listen because its port was taken meanwhile (by a
        test running in parallel: "address already in use") is started
        again on new ports, up to PORT_TRIES times in all."""
        for attempt in range(self.PORT_TRIES):
            ok = self.start_once(timeout)
            if ok or attempt + 1 == self.PORT_TRIES or not self.lost_port():
                return ok
            self.stop()
            self.new_ports()
            self.port_retries += 1
        return False

    def lost_port(self):
        """True when the latest start failed for want of its port."""
        if self.proc is not None and self.proc.poll() is None and \
                self.start_failure() is None:
            return False
        return "address already in use" in self.log_since_start().lower()

    def start_once(self, timeout):
        """One start (see start())."""
        try:
            self.log_from = os.path.getsize(self.log_path)
        except OSError:
            self.log_from = 0
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("TANGRAM_") and
               k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        env["TMPDIR"] = self.workdir  # runtime dir (ipc socket) in our tree
        # A worker's patience with a silent router (10 x its heartbeat by
        # default): on a loaded machine the router's start-up (tokenizer,
        # chat template) was seen to take longer than that, and the worker
        # gave up before the router spoke, failing the start. A router that
        # never comes is still tangramd's to handle (a child that fails
        # before READY stops the others).
        env["TANGRAM_ROUTER_TIMEOUT_MS"] = "60000"
        if self.api_key is not None:
            env["TANGRAM_API_KEY"] = self.api_key
        self.log = open(self.log_path, "ab")
        limit = None
        if self.nofile is not None:
            n = self.nofile
            limit = lambda: resource.setrlimit(  # noqa: E731
                resource.RLIMIT_NOFILE, (n, n))
        self.proc = subprocess.Popen(self.command(), env=env,
                                     stdout=self.log, stderr=self.log,
                                     stdin=subprocess.DEVNULL,
                                     preexec_fn=limit)
        end = time.time() + timeout
        while time.time() < end:
            self.note_children()
            if self.proc.poll() is not None:
                return False
            # A start-up failure (bad model, profile, flags) repeats on
            # every restart: no point in waiting for it.
            if self.start_failure() is not None:
                return False
            st = self.health()
            if st == 200:
                self.note_children()
                return True
            time.sleep(0.1)
        return False

    def start_failure(self):
        """The first 'cannot start' line a child logged since the latest
        start, or None."""
        for line in self.log_since_start().splitlines():
            if "cannot start:" in line:
                return line
        return None

    def health(self, timeout=2):
        """Status code of GET /health, or None when nothing answers within
        timeout seconds."""
        try:
            st, _, _ = http("GET", self.base_url + "/health", timeout=timeout)
            return st
        except OSError:
            return None

    def note_children(self):
        """Records the current router/worker children (they may restart)."""
        if self.proc is None:
            return
        for c in children_of(self.proc.pid):
            self.children.add(c)

    def child_pids(self, role):
        """Live children whose command line holds role ('router' or
        'worker')."""
        return [c for c in children_of(self.proc.pid)
                if ("tangram-" + role) in cmdline(c)]

    def log_since_start(self):
        """The log written since the latest start."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_from)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_text(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self, timeout=15.0):
        """SIGTERM, then SIGKILL after timeout seconds; kills any recorded
        child still alive after that. Returns (exit status or None,
        list of children that outlived tangramd). Safe to call twice."""
        if self.proc is None:
            return None, []
        self.note_children()
        rc = self.proc.poll()
        if rc is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                rc = None  # did not stop on its own
        # tangramd waits for its children; give stragglers a moment (up
        # to 15 s on a loaded machine; it ends as soon as they are gone).
        wait_for(lambda: not any(alive(c) for c in self.children), 15)
        left = [c for c in self.children if alive(c)]
        for c in left:
            try:
                os.kill(c, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc = None
        self.log.close()
        return rc, left

    def sanitizer_reports(self):
        """Lines of the log where ASan, LSan or UBSan reported a problem
        (the daemon built with -DTANGRAM_SANITIZE=ON); [] when clean."""
        keys = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                "runtime error:")
        return [ln for ln in self.log_text().splitlines()
                if any(k in ln for k in keys)]

    def check_alive(self, chk):
        """Checks that tangramd runs and no child died (was restarted)."""
        chk.check(self.proc is not None and self.proc.poll() is None and
                  not [ln for ln in self.log_text().splitlines()
                       if "restarting" in ln],
                  "no process died during the test")

    def stop_checked(self, chk):
        """stop() and the checks of a clean end: exit 0 on SIGTERM, no
        router/worker left, no sanitizer report in the log."""
        rc, left = self.stop()
        san = self.sanitizer_reports()
        chk.check(rc == 0, "tangramd exits 0 on SIGTERM (rc %s)" % rc)
        chk.check(not left, "no router/worker survives tangramd (%s)" % left)
        chk.check(not san, "no sanitizer report in the daemon's log",
                  "\n".join(san[:10]))

    def print_log_tail(self, chk, n=4000):
        """Prints the end of the daemon's log when a check failed."""
        if chk.failures:
            print("---- tangramd log (tail) ----")
            print(self.log_text()[-n:])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


# ---- HTTP -----------------------------------------------------------------

def http(method, url, body=None, headers=None, timeout=30):
    """One HTTP/1.1 request. body: bytes, str or a JSON-able object (sent as
    application/json). Returns (status, headers dict with lower-case names,
    body bytes). Raises OSError (including timeouts) on network failure."""
    m = re.match(r"^http://([^/:]+):(\d+)(/.*)?$", url)
    assert m, url
    conn = httplib.HTTPConnection(m.group(1), int(m.group(2)),
                                      timeout=timeout)
    hdrs = dict(headers or {})
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
        hdrs.setdefault("Content-Type", "application/json")
    if isinstance(body, str):
        body = body.encode()
    try:
        conn.request(method, m.group(3) or "/", body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def json_of(data):
    """data parsed as JSON, or None when it does not parse."""
    try:
        return json.loads(data)
    except (ValueError, TypeError):
        return None


def is_openai_error(data):
    """True when data is the OpenAI error shape
    {"error": {"message": str, "type": str, "param": ..., "code": str}}
    (the server's one error shape: "code" is always a non-empty string)."""
    j = json_of(data) if isinstance(data, (bytes, str)) else data
    if not isinstance(j, dict) or not isinstance(j.get("error"), dict):
        return False
    e = j["error"]
    return (isinstance(e.get("message"), str) and e["message"] != "" and
            isinstance(e.get("type"), str) and "param" in e and
            isinstance(e.get("code"), str) and e["code"] != "")


def sse_events(data):
    """Splits an SSE body (bytes) into the payloads of its `data:` lines, in
    order (strings; "[DONE]" stays a string). Returns (payloads, problems)
    where problems lists lines that are not SSE."""
    payloads, problems = [], []
    text = data.decode("utf-8", errors="replace")
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        datas = []
        for line in block.split("\n"):
            if line.startswith("data:"):
                datas.append(line[5:].lstrip(" "))
            elif line.startswith(":") or line.startswith("event:") or \
                    line.startswith("id:") or line.startswith("retry:"):
                continue
            else:
                problems.append(line)
        if datas:
            payloads.append("\n".join(datas))
    return payloads, problems


# ---- metrics --------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)'
                     r'(\s+\d+)?$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def parse_metrics(text):
    """Parses the Prometheus text exposition format. Returns
    (samples, types, problems): samples maps (name, frozenset of label
    pairs) to a float, types maps a family name to its # TYPE, problems
    lists lines that do not parse."""
    samples, types, problems = {}, {}, []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3]
            elif len(parts) < 3 or parts[1] not in ("TYPE", "HELP"):
                if not line.startswith("# "):
                    problems.append(line)
            continue
        m = _SAMPLE.match(line)
        if not m:
            problems.append(line)
            continue
        labels = []
        if m.group(3):
            rest = m.group(3)
            pos = 0
            while pos < len(rest):
                lm = _LABEL.match(rest, pos)
                if not lm:
                    problems.append(line)
                    break
                labels.append((lm.group(1), lm.group(2)))
                pos = lm.end()
        try:
            v = float(m.group(4))
        except ValueError:
            problems.append(line)
            continue
        samples[(m.group(1), frozenset(labels))] = v
    return samples, types, problems


def metric(samples, name, **labels):
    """The value of one sample, or None when absent."""
    return samples.get((name, frozenset(labels.items())))


def fetch_metrics(base_url, headers=None):
    """GET /metrics and parse it; returns parse_metrics()'s samples or None
    when the request fails."""
    try:
        st, _, body = http("GET", base_url + "/metrics", headers=headers)
    except OSError:
        return None
    if st != 200:
        return None
    return parse_metrics(body.decode(errors="replace"))[0]


def node_clients(scripts):
    """A directory holding tests/integration/clients/package.json, its
    package-lock.json and the given .mjs scripts, with the official OpenAI
    Node client installed from the committed lockfile (`npm ci`: exactly
    its versions and integrity hashes), once per build tree and again when
    the lockfile changes; a file lock makes tests running in parallel share
    one install. Returns (dir, None), or (None, why) when node/npm is
    missing or the install failed."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clients")
    return node_packages(src, "integration-clients", scripts, "openai",
                         ["npm", "ci"])


def node_packages(src, name, scripts, sentinel, install):
    """node_clients for any folder `src` holding package.json and
    package-lock.json: copies them and `scripts` into <build>/<name> (or
    $TMPDIR/tangram-<name>), runs `install` (an npm command line, to which
    the quiet flags are added) there once per build tree and again when the
    lockfile changes, under a file lock; node_modules/<sentinel> must exist
    afterwards. Returns (dir, None) or (None, why)."""
    import fcntl
    if shutil.which("node") is None or shutil.which("npm") is None:
        return None, "node/npm not installed"
    base = os.path.dirname(BIN.rstrip("/")) if BIN else ""
    root = os.path.join(base, name) if base and \
        os.access(base, os.W_OK) else os.path.join(
            os.environ.get("TMPDIR", "/tmp"), "tangram-" + name)
    os.makedirs(root, exist_ok=True)
    lockname = os.path.relpath(
        os.path.join(src, "package-lock.json"),
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, ".install-lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for f in ["package.json", "package-lock.json"] + list(scripts):
            # Replaced whole: a test running node on the old copy keeps it.
            tmp = os.path.join(root, ".%s.%d" % (f, os.getpid()))
            shutil.copyfile(os.path.join(src, f), tmp)
            os.replace(tmp, os.path.join(root, f))
        with open(os.path.join(src, "package-lock.json"), "rb") as f:
            want = f.read()
        stamp = os.path.join(root, "node_modules", ".tangram-lockfile")
        try:
            with open(stamp, "rb") as f:
                have = f.read()
        except OSError:
            have = None
        if have != want or not os.path.isdir(
                os.path.join(root, "node_modules", sentinel)):
            try:
                r = subprocess.run(list(install) + [
                    "--no-audit", "--no-fund", "--loglevel=error"], cwd=root,
                    capture_output=True, text=True, timeout=300)
            except subprocess.TimeoutExpired:
                return None, " ".join(install) + " timed out"
            if r.returncode != 0 or not os.path.isdir(
                    os.path.join(root, "node_modules", sentinel)):
                return None, ("%s (tests/%s) failed: %s"
                              % (" ".join(install), lockname,
                                 r.stderr[-300:]))
            with open(stamp, "wb") as f:
                f.write(want)
    return root, None


def kv_page_metrics(base_url, n_ranks):
    """The page counters of every rank from /metrics, or None when it cannot
    be fetched: released (sum of tangram_kv_pages_released_total),
    released_ranks, used, cached and total (lists per rank, None where a
    sample is absent) and cached_tokens
    (tangram_cached_prompt_tokens_total)."""
    s = fetch_metrics(base_url)
    if s is None:
        return None

    def per_rank(name):
        return [metric(s, name, rank=str(r)) for r in range(n_ranks)]
    released = per_rank("tangram_kv_pages_released_total")
    return {
        "released": sum(v or 0 for v in released),
        "released_ranks": released,
        "used": per_rank("tangram_kv_pages_used"),
        "cached": per_rank("tangram_kv_pages_cached"),
        "total": per_rank("tangram_kv_pages_capacity"),
        "cached_tokens": metric(s, "tangram_cached_prompt_tokens_total"),
    }


def only_cached_pages(m):
    """Whether every page in use on every rank belongs to the multi-turn
    store (no request holds pages): used == cached per rank."""
    return m is not None and None not in m["used"] and m["used"] == m["cached"]


def load_tangram_pb2(out_dir):
    """Generates the Python classes of proto/tangram.proto into out_dir with
    protoc and imports them; returns the tangram_pb2 module, or None when
    protoc fails (the caller's check names it)."""
    import importlib
    import sys
    proto_dir = os.path.join(SOURCE, "proto")
    r = subprocess.run(["protoc", "-I", proto_dir, "--python_out=" + out_dir,
                        "tangram.proto"], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        return None
    sys.path.insert(0, out_dir)
    return importlib.import_module("tangram_pb2")


def grpc_generate_ids(grpc, pb, target, ids, max_tokens, seed, timeout=300):
    """Token ids of a greedy tangram.v1.Generation/Generate of prompt ids
    with max_tokens and seed, as (ids, "OK"), or (None, "<code> <details>")
    when the call fails."""
    ch = grpc.insecure_channel(target)
    gen = ch.unary_stream("/tangram.v1.Generation/Generate",
                          request_serializer=lambda m: m.SerializeToString(),
                          response_deserializer=pb.GenerateResponse.FromString)
    req = pb.GenerateRequest(prompt_token_ids=ids)
    req.sampling.CopyFrom(pb.SamplingParams(max_tokens=max_tokens,
                                            temperature=0.0, seed=seed))
    out = []
    try:
        for m in gen(req, timeout=timeout):
            out += list(m.token_ids)
        return out, "OK"
    except grpc.RpcError as e:
        return None, "%s %s" % (e.code(), e.details())
    finally:
        ch.close()


def scratch_dir(prefix):
    """A fresh temporary directory (the caller removes it)."""
    return tempfile.mkdtemp(prefix=prefix)


# ---- real shapes ----------------------------------------------------------

def shape_args(config_path, layers=None, seed=1):
    """tangram-make-model flags for the shape of a real config.json (the
    project's data/configs): width, heads, KV heads, head_dim, ffn, RoPE
    theta and Llama-3 scaling, context, norm eps, tied embeddings, bf16;
    `layers` (None: the config's depth) makes a shallower model of the same
    width. Returns (flags, tokenizer folder name under data/tokenizers)."""
    with open(config_path) as f:
        c = json.load(f)
    mt = c.get("model_type", "")
    arch = {"qwen3": "qwen3", "qwen2": "qwen2", "llama": "llama",
            "mistral": "mistral"}.get(mt)
    if arch is None:
        raise RuntimeError("%s: model_type %r has no tangram-make-model "
                           "architecture" % (config_path, mt))
    heads = c["num_attention_heads"]
    args = ["--arch", arch, "--hidden", str(c["hidden_size"]),
            "--layers", str(layers or c["num_hidden_layers"]),
            "--heads", str(heads),
            "--kv-heads", str(c.get("num_key_value_heads", heads)),
            "--head-dim", str(c.get("head_dim") or c["hidden_size"] // heads),
            "--ffn", str(c["intermediate_size"]),
            "--rope-theta", repr(float(c.get("rope_theta", 10000.0))),
            "--max-position", str(c.get("max_position_embeddings", 32768)),
            "--rms-eps", repr(float(c.get("rms_norm_eps", 1e-6))),
            "--dtype", "bf16", "--seed", str(seed)]
    rs = c.get("rope_scaling") or {}
    if rs.get("rope_type") == "llama3":
        args += ["--rope-scaling-llama3", repr(float(rs["factor"])),
                 "--rope-original-max",
                 str(rs.get("original_max_position_embeddings", 8192))]
    if c.get("tie_word_embeddings"):
        args.append("--tie")
    tok = {"qwen3": "qwen3", "qwen2": "qwen2.5"}.get(arch, "llama3")
    return args, tok


def config_path(name):
    """data/configs/<name>_config.json of the project data (TANGRAM_DATA),
    e.g. config_path("Qwen--Qwen3-8B")."""
    return os.path.join(DATA, "configs", name + "_config.json")


def random_ids(vocab, n, seed):
    """n token ids in [1000, min(vocab, 100000)) from a fixed 64-bit LCG
    (Knuth's MMIX constants): reproducible prompts of ordinary tokens, no
    special ids, for the reference tests and peer benchmarks."""
    hi = min(vocab, 100000)
    x, out = seed, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(1000 + (x >> 33) % (hi - 1000))
    return out


def hf_from_pretrained(transformers, torch, model_dir, dtype):
    """transformers' AutoModelForCausalLM.from_pretrained(model_dir) in
    `dtype` (a torch dtype). transformers >= 4.56 names the argument dtype
    (and keeps torch_dtype); older ones know only torch_dtype; a version
    that ignored it is cast. The modules are the caller's (this file needs
    only the standard library)."""
    auto = transformers.AutoModelForCausalLM
    try:
        m = auto.from_pretrained(model_dir, dtype=dtype)
    except TypeError:
        m = auto.from_pretrained(model_dir, torch_dtype=dtype)
    if next(m.parameters()).dtype != dtype:
        m = m.to(dtype)
    return m
