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
  /health, remembers the router and worker pids, and stops it (SIGTERM, then
  SIGKILL after a timeout) checking that no child survives. Use it as a
  context manager so the daemon is killed even when a test raises.
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


def gpu_count():
    """NVIDIA GPUs nvidia-smi -L lists (0 without the tool or a driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    r = subprocess.run([smi, "-L"], capture_output=True, text=True)
    if r.returncode != 0:
        return 0
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))


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
    heads). api_key goes through the environment (TANGRAM_API_KEY), as an
    operator should do. The daemon's stderr goes to <workdir>/tangramd.log.
    """

    DEFAULT_ARGS = ["--kv-memory", "64MiB", "--prefill-chunk", "64",
                    "--max-batched-tokens", "512", "--heads-per-group", "2",
                    "--worker-heartbeat-ms", "500", "--shutdown-timeout", "5"]

    def __init__(self, model, workdir, args=None, api_key=None, profile=None,
                 nofile=None):
        self.model = model
        self.workdir = workdir
        self.args = list(args or [])
        self.api_key = api_key
        self.profile = profile
        self.nofile = nofile  # RLIMIT_NOFILE (soft = hard) of the daemon
        self.http_port = free_port()
        self.grpc_port = free_port()
        while self.grpc_port == self.http_port:
            self.grpc_port = free_port()
        self.proc = None
        self.log_path = os.path.join(workdir, "tangramd.log")
        self.children = set()  # every router/worker pid seen

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
        exited or did not get ready in time; the log tells why."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("TANGRAM_") and
               k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        env["TMPDIR"] = self.workdir  # runtime dir (ipc socket) in our tree
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
        """The first 'cannot start' line a child logged, or None."""
        for line in self.log_text().splitlines():
            if "cannot start:" in line:
                return line
        return None

    def health(self):
        """Status code of GET /health, or None when nothing answers."""
        try:
            st, _, _ = http("GET", self.base_url + "/health", timeout=2)
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
        # tangramd waits for its children; give stragglers a moment.
        wait_for(lambda: not any(alive(c) for c in self.children), 3)
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
    """A directory holding tests/integration/clients/package.json and the
    given .mjs scripts with the official OpenAI Node client installed
    (npm install, once per build tree). Returns (dir, None), or (None, why)
    when node/npm is missing or the install failed."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return None, "node/npm not installed"
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clients")
    base = os.path.dirname(BIN.rstrip("/")) if BIN else ""
    root = os.path.join(base, "integration-clients") if base and \
        os.access(base, os.W_OK) else os.path.join(
            os.environ.get("TMPDIR", "/tmp"), "tangram-integration-clients")
    os.makedirs(root, exist_ok=True)
    for f in ["package.json"] + list(scripts):
        shutil.copyfile(os.path.join(src, f), os.path.join(root, f))
    if not os.path.isdir(os.path.join(root, "node_modules", "openai")):
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund",
                            "--loglevel=error"], cwd=root,
                           capture_output=True, text=True, timeout=240)
        if r.returncode != 0 or not os.path.isdir(
                os.path.join(root, "node_modules", "openai")):
            return None, "npm install failed: " + r.stderr[-300:]
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
