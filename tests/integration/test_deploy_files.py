#!/usr/bin/python3
"""Checks the deployment files of deploy/ against each other and against
tangramd's options: the rows of the serving option table
(common/base/tg_serve_opts.c) marked TG_SERVE_DAEMON.

- Every YAML of deploy/k8s parses (python3-yaml); no object names a
  namespace; kustomization.yaml lists exactly the other manifests.
- ConfigMap keys and the variables of deploy/systemd/tangramd.env are
  TANGRAM_* variables of options that exist in the table, with values the
  option accepts (integer/double ranges, enum choices); the env file shows
  every option. The ConfigMap's per-address connection limits are set
  (not 0) and hold behind the gateway: at least the requests one gateway
  replica may have in flight at the pod, at most half of each table.
- The Deployment asks for nvidia.com/gpu (as many as TANGRAM_TP), probes
  /health over HTTP (readiness) and the gRPC health service on the gRPC
  port, drains within terminationGracePeriodSeconds (preStop delay +
  shutdown timeout + margin), runs non-root with a read-only root file
  system and no capabilities, and mounts writable volumes where the daemon
  writes.
- The Services expose 8000 (appProtocol http) and 50051 (kubernetes.io/h2c)
  and select the Deployment's pods.
- The systemd unit: Type=notify, NotifyAccess=main|all, WatchdogSec,
  non-root User, EnvironmentFile, the hardening options, KillMode=mixed and
  TimeoutStopSec above the shutdown timeout; `systemd-analyze verify` (on a
  copy whose ExecStart is /bin/true) when systemd-analyze exists.
- The Containerfile: Debian 12 multi-stage build, runtime stage with only
  runtime libraries, non-root USER, and a HEALTHCHECK that really answers
  0 for /health 200 and non-zero for 503 or a closed port (run against a
  local HTTP server).
- The docs name what they must (session affinity examples, signals).

Fails, naming it, when python3-yaml is not installed.
"""

import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

try:
    import yaml
except ImportError:
    print("FAIL: python3-yaml is not installed (sh deploy/install-deps.sh)")
    sys.exit(1)

SRC = os.environ.get("TANGRAM_SOURCE",
                     os.path.dirname(os.path.dirname(os.path.dirname(
                         os.path.abspath(__file__)))))
DEPLOY = os.path.join(SRC, "deploy")
K8S = os.path.join(DEPLOY, "k8s")
UNIT = os.path.join(DEPLOY, "systemd", "tangramd.service")
ENVFILE = os.path.join(DEPLOY, "systemd", "tangramd.env")
CONTAINERFILE = os.path.join(DEPLOY, "Containerfile")

failures = []
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        failures.append(what)
    return cond


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# --------------------------------------------------------------------------
# tangramd's rows of the serving option table (common/base/tg_serve_opts.c).

TABLE_SRC = os.path.join(SRC, "common", "base", "tg_serve_opts.c")

def parse_options():
    """Returns {env name: entry dict} from the C table, tangramd's rows only
    (those whose flags carry TG_SERVE_DAEMON). An entry has name, type, min,
    max, def and choices (a list, for enums)."""
    text = read(TABLE_SRC)
    arrays = {}
    for m in re.finditer(r"static const char \*const (\w+)\[\]\s*=\s*\{(.*?)\};",
                         text, re.S):
        arrays[m.group(1)] = re.findall(r'"([^"]*)"', m.group(2))
    table = text[text.index("table[] = {"):]
    opts = {}
    starts = [m.start() for m in re.finditer(r'\{\s*\.name\s*=', table)]
    for i, s in enumerate(starts):
        body = table[s:starts[i + 1] if i + 1 < len(starts) else len(table)]
        if not re.search(r"\.flags\s*=[^,]*\bTG_SERVE_DAEMON\b", body):
            continue
        name = re.search(r'\.name\s*=\s*"([a-z0-9-]+)"', body).group(1)
        e = {"name": name,
             "type": re.search(r"\.type\s*=\s*TG_CONFIG_(\w+)", body).group(1)}
        for k in ("min", "max"):
            m = re.search(r"\.%s\s*=\s*([-0-9.eE]+)" % k, body)
            e[k] = float(m.group(1)) if m else None
        m = re.search(r"\.choices\s*=\s*(\w+)", body)
        e["choices"] = arrays.get(m.group(1)) if m else None
        m = re.search(r'\.def\s*=\s*"([^"]*)"', body)
        e["def"] = m.group(1) if m else None
        opts["TANGRAM_" + name.upper().replace("-", "_")] = e
    return opts


SIZE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
              "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40,
              "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "b": 1}


def value_ok(e, v):
    """Whether string v is acceptable for option e (a conservative model of
    tg_config's parsing: what we write in the deploy files must pass)."""
    t = e["type"]
    if t == "STRING":
        return True
    if t == "ENUM":
        return v in (e["choices"] or [])
    if t in ("INT", "DOUBLE"):
        try:
            x = int(v) if t == "INT" else float(v)
        except ValueError:
            return False
    elif t == "BOOL":
        return v.lower() in ("true", "false", "1", "0", "yes", "no", "on",
                             "off")
    elif t == "SIZE":
        m = re.fullmatch(r"([0-9]*\.?[0-9]+)([a-zA-Z]*)", v)
        if not m or m.group(2).lower() not in SIZE_UNITS:
            return False
        x = float(m.group(1)) * SIZE_UNITS[m.group(2).lower()]
    elif t == "SIZE_FRAC":
        m = re.fullmatch(r"([0-9]*\.?[0-9]+)(%|[a-zA-Z]*)", v)
        if not m:
            return False
        num, unit = float(m.group(1)), m.group(2).lower()
        if t == "SIZE_FRAC" and unit == "%":
            return 0 < num <= 100
        if t == "SIZE_FRAC" and unit == "" and num <= 1:
            return num > 0
        if unit not in SIZE_UNITS:
            return False
        x = num * SIZE_UNITS[unit]
    else:
        return False
    if e["min"] is not None and x < e["min"]:
        return False
    if e["max"] is not None and x > e["max"]:
        return False
    return True


OPTS = parse_options()
check(len(OPTS) >= 18, "tg_serve_opts.c: parsed only %d tangramd options"
      % len(OPTS))
for must in ("TANGRAM_MODEL", "TANGRAM_HTTP_PORT", "TANGRAM_GRPC_PORT",
             "TANGRAM_SHUTDOWN_TIMEOUT", "TANGRAM_HOST", "TANGRAM_TP"):
    check(must in OPTS, "tg_serve_opts.c: option %s not found" % must)
# The worker's and the router's own rows are not tangramd's.
for other in ("TANGRAM_RANK", "TANGRAM_ROUTER", "TANGRAM_IPC_ENDPOINT"):
    check(other not in OPTS, "tg_serve_opts.c: %s taken for tangramd's" % other)
# The value model itself must reject what tangramd rejects.
check(not value_ok(OPTS["TANGRAM_HTTP_PORT"], "70000"), "value_ok: port range")
check(not value_ok(OPTS["TANGRAM_BACKEND"], "rocm"), "value_ok: enum")
check(value_ok(OPTS["TANGRAM_KV_MEMORY"], "0.9")
      and value_ok(OPTS["TANGRAM_KV_MEMORY"], "60GiB")
      and not value_ok(OPTS["TANGRAM_KV_MEMORY"], "lots"), "value_ok: size")


def check_env_var(where, key, value):
    if not check(key in OPTS, "%s: %s is not a tangramd option" % (where, key)):
        return
    check(value_ok(OPTS[key], value),
          "%s: %s=%r is not a valid value" % (where, key, value))


# --------------------------------------------------------------------------
# Kubernetes manifests.

docs = {}          # kind -> list of objects
files = sorted(f for f in os.listdir(K8S) if f.endswith((".yaml", ".yml")))
for f in ("configmap.yaml", "deployment.yaml", "service.yaml",
          "kustomization.yaml"):
    check(f in files, "deploy/k8s/%s is missing" % f)
for f in files:
    try:
        objs = [d for d in yaml.safe_load_all(read(os.path.join(K8S, f)))
                if d is not None]
    except yaml.YAMLError as ex:
        check(False, "deploy/k8s/%s: YAML error: %s" % (f, ex))
        continue
    check(objs, "deploy/k8s/%s: empty" % f)
    for d in objs:
        if not check(isinstance(d, dict) and "kind" in d and "apiVersion" in d,
                     "deploy/k8s/%s: object without kind/apiVersion" % f):
            continue
        d["_file"] = f
        docs.setdefault(d["kind"], []).append(d)
        if d["kind"] != "Kustomization":
            md = d.get("metadata") or {}
            check(md.get("name"), "%s: %s without a name" % (f, d["kind"]))
            check("namespace" not in md,
                  "%s: %s names a namespace" % (f, d["kind"]))

kust = (docs.get("Kustomization") or [{}])[0]
listed = set(kust.get("resources") or [])
check(listed == set(files) - {"kustomization.yaml"},
      "kustomization.yaml resources %s != manifests %s"
      % (sorted(listed), sorted(set(files) - {"kustomization.yaml"})))
check("namespace" not in kust, "kustomization.yaml sets a namespace")

cm = (docs.get("ConfigMap") or [None])[0]
config = {}
if check(cm is not None, "no ConfigMap"):
    config = cm.get("data") or {}
    for k, v in config.items():
        check(isinstance(v, str), "ConfigMap %s: value %r is not a string"
              % (k, v))
        check_env_var("ConfigMap", k, str(v))
    check("TANGRAM_MODEL" in config, "ConfigMap lacks TANGRAM_MODEL")
    check(config.get("TANGRAM_HOST") in ("0.0.0.0", "::"),
          "ConfigMap: TANGRAM_HOST must listen on the pod address")


def opt_default(key):
    return OPTS[key]["def"]


def cfg(key):
    return config.get(key, opt_default(key))


http_port = int(cfg("TANGRAM_HTTP_PORT"))
grpc_port = int(cfg("TANGRAM_GRPC_PORT"))
shutdown_timeout = float(cfg("TANGRAM_SHUTDOWN_TIMEOUT"))
check(http_port == 8000 and grpc_port == 50051,
      "ConfigMap ports %d/%d, expected 8000/50051" % (http_port, grpc_port))
# Behind the gateway every client has a gateway replica's address: the
# per-address limits must hold all that one replica can have in flight at
# the pod (running + queued requests, an HTTP/1.1 connection each) and
# still keep one address from taking the table (at most half of it; 0
# would let one client take all of it).
in_flight = int(cfg("TANGRAM_MAX_NUM_SEQS")) + int(cfg("TANGRAM_MAX_QUEUED"))
for api in ("HTTP", "GRPC"):
    per_ip = int(cfg("TANGRAM_%s_MAX_CONNECTIONS_PER_IP" % api))
    total = int(cfg("TANGRAM_%s_MAX_CONNECTIONS" % api))
    check(0 < per_ip <= total // 2,
          "ConfigMap: TANGRAM_%s_MAX_CONNECTIONS_PER_IP %d must be set, at "
          "most half of TANGRAM_%s_MAX_CONNECTIONS %d" %
          (api, per_ip, api, total))
    check(api == "GRPC" or per_ip >= in_flight,
          "ConfigMap: TANGRAM_HTTP_MAX_CONNECTIONS_PER_IP %d is below the "
          "%d requests one gateway replica may have in flight (MAX_NUM_SEQS "
          "+ MAX_QUEUED)" % (per_ip, in_flight))

dep = (docs.get("Deployment") or [None])[0]
pod_labels = {}
if check(dep is not None, "no Deployment"):
    spec = dep["spec"]
    tmpl = spec["template"]
    pod_labels = tmpl["metadata"]["labels"]
    sel = spec["selector"]["matchLabels"]
    check(all(pod_labels.get(k) == v for k, v in sel.items()),
          "Deployment selector does not match its pod labels")
    pod = tmpl["spec"]
    ctrs = pod["containers"]
    check(len(ctrs) == 1, "Deployment: expected one container")
    c = ctrs[0]
    psc = pod.get("securityContext") or {}
    csc = c.get("securityContext") or {}
    check(psc.get("runAsNonRoot") is True or csc.get("runAsNonRoot") is True,
          "Deployment: runAsNonRoot")
    uid = csc.get("runAsUser", psc.get("runAsUser"))
    check(uid is None or uid > 0, "Deployment: runAsUser 0")
    check(csc.get("readOnlyRootFilesystem") is True,
          "Deployment: readOnlyRootFilesystem")
    check(csc.get("allowPrivilegeEscalation") is False,
          "Deployment: allowPrivilegeEscalation must be false")
    check("ALL" in ((csc.get("capabilities") or {}).get("drop") or []),
          "Deployment: capabilities.drop ALL")
    check(not (csc.get("capabilities") or {}).get("add"),
          "Deployment: adds capabilities")
    # GPUs: a limit, equal to the tensor-parallel ranks.
    limits = (c.get("resources") or {}).get("limits") or {}
    gpus = limits.get("nvidia.com/gpu")
    check(isinstance(gpus, int) and gpus >= 1,
          "Deployment: resources.limits nvidia.com/gpu missing")
    check(gpus == int(cfg("TANGRAM_TP")),
          "Deployment: nvidia.com/gpu %r != TANGRAM_TP %s"
          % (gpus, cfg("TANGRAM_TP")))
    check(cfg("TANGRAM_BACKEND") == "cuda",
          "ConfigMap: a GPU Deployment should use TANGRAM_BACKEND=cuda")
    # Ports.
    ports = {p["name"]: p["containerPort"] for p in c.get("ports") or []}
    check(ports.get("http") == http_port, "Deployment: http port %r" % ports)
    check(ports.get("grpc") == grpc_port, "Deployment: grpc port %r" % ports)

    def port_of(p):
        return ports.get(p, p)

    # Probes.
    rp = c.get("readinessProbe") or {}
    lp = c.get("livenessProbe") or {}
    sp = c.get("startupProbe") or {}
    probes = [p for p in (rp, lp, sp) if p]
    check(any(p.get("httpGet", {}).get("path") == "/health"
              and port_of(p["httpGet"].get("port")) == http_port
              for p in probes), "Deployment: no httpGet /health probe")
    check(rp.get("httpGet", {}).get("path") == "/health",
          "Deployment: readinessProbe must be httpGet /health")
    check(any("grpc" in p and port_of(p["grpc"].get("port")) == grpc_port
              for p in probes), "Deployment: no grpc probe on the gRPC port")
    check(lp and ("grpc" in lp or "httpGet" in lp),
          "Deployment: livenessProbe missing")
    # Graceful termination.
    grace = pod.get("terminationGracePeriodSeconds", 30)
    pre = ((c.get("lifecycle") or {}).get("preStop") or {})
    delay = 0
    if "exec" in pre:
        cmd = pre["exec"].get("command") or []
        m = re.fullmatch(r"(?:/bin/)?sleep", cmd[0]) if cmd else None
        if m and len(cmd) == 2:
            delay = float(cmd[1])
    elif "sleep" in pre:
        delay = float(pre["sleep"].get("seconds", 0))
    check(pre, "Deployment: no preStop hook")
    check(grace >= delay + shutdown_timeout + 10,
          "Deployment: terminationGracePeriodSeconds %s < preStop %s + "
          "shutdown timeout %s + 10 s margin" % (grace, delay,
                                                 shutdown_timeout))
    # Configuration from the ConfigMap; extra env names are options too
    # (or the few non-tangram variables the image documents).
    refs = [e.get("configMapRef", {}).get("name")
            for e in c.get("envFrom") or []]
    check(cm is not None and cm["metadata"]["name"] in refs,
          "Deployment: envFrom does not load the ConfigMap")
    for e in c.get("env") or []:
        if e["name"].startswith("TANGRAM_"):
            check(e["name"] in OPTS,
                  "Deployment env: %s is not a tangramd option" % e["name"])
    # Writable places on a read-only root: runtime dir (ipc sockets), /tmp.
    vols = {v["name"]: v for v in pod.get("volumes") or []}
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts") or []}
    for m in mounts.values():
        check(m["name"] in vols, "Deployment: mount of unknown volume %s"
              % m["name"])
    for path in ("/run/tangram", "/tmp"):
        check(path in mounts and not mounts[path].get("readOnly"),
              "Deployment: %s must be a writable volume" % path)
    model = cfg("TANGRAM_MODEL")
    check(any(model.startswith(p.rstrip("/") + "/") for p in mounts),
          "Deployment: TANGRAM_MODEL %s is on no mounted volume" % model)

svcs = docs.get("Service") or []
check(svcs, "no Service")
for s in svcs:
    sp_ = s["spec"]
    name = s["metadata"]["name"]
    check(all(pod_labels.get(k) == v
              for k, v in (sp_.get("selector") or {}).items())
          and sp_.get("selector"), "Service %s selects no pods" % name)
    byport = {p["port"]: p for p in sp_.get("ports") or []}
    check(byport.get(8000, {}).get("appProtocol") == "http",
          "Service %s: port 8000 with appProtocol http" % name)
    check(byport.get(50051, {}).get("appProtocol") == "kubernetes.io/h2c",
          "Service %s: port 50051 with appProtocol kubernetes.io/h2c" % name)
    if dep is not None:
        cports = dep["spec"]["template"]["spec"]["containers"][0]["ports"]
        names = {p["name"] for p in cports} | {p["containerPort"]
                                               for p in cports}
        for p in byport.values():
            check(p.get("targetPort", p["port"]) in names,
                  "Service %s: targetPort %r is no container port"
                  % (name, p.get("targetPort")))

for pdb in docs.get("PodDisruptionBudget") or []:
    ml = pdb["spec"]["selector"]["matchLabels"]
    check(all(pod_labels.get(k) == v for k, v in ml.items()),
          "PodDisruptionBudget selects no tangramd pod")

# kubectl renders the kustomization offline (no cluster needed).
kubectl = shutil.which("kubectl")
if kubectl:
    r = subprocess.run([kubectl, "kustomize", K8S], capture_output=True,
                       text=True, timeout=60)
    if check(r.returncode == 0, "kubectl kustomize failed: " + r.stderr):
        kinds = sorted(d["kind"] for d in yaml.safe_load_all(r.stdout) if d)
        want = sorted(d["kind"] for k, v in docs.items() for d in v
                      if k != "Kustomization")
        check(kinds == want, "kubectl kustomize kinds %s != %s"
              % (kinds, want))

# --------------------------------------------------------------------------
# deploy/systemd/tangramd.env

env_text = read(ENVFILE)
env_set, env_shown = {}, set()
for ln, line in enumerate(env_text.splitlines(), 1):
    s = line.strip()
    if not s:
        continue
    m = re.fullmatch(r"#\s*(TANGRAM_[A-Z0-9_]+)=(.*)", s)
    if m:
        env_shown.add(m.group(1))
        check_env_var("tangramd.env:%d (commented)" % ln, m.group(1),
                      m.group(2))
        continue
    if s.startswith("#"):
        continue
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", s)
    if not check(m, "tangramd.env:%d: not KEY=value: %r" % (ln, s)):
        continue
    check(m.group(1).startswith("TANGRAM_"),
          "tangramd.env:%d: %s is not a TANGRAM_ variable" % (ln, m.group(1)))
    check_env_var("tangramd.env:%d" % ln, m.group(1), m.group(2))
    env_set[m.group(1)] = m.group(2)
    env_shown.add(m.group(1))
check("TANGRAM_MODEL" in env_set, "tangramd.env does not set TANGRAM_MODEL")
check(not env_set.get("TANGRAM_API_KEY"),
      "tangramd.env must not carry an API key")
missing = sorted(set(OPTS) - env_shown)
check(not missing, "tangramd.env does not show options %s" % missing)
unit_shutdown = float(env_set.get("TANGRAM_SHUTDOWN_TIMEOUT",
                                  opt_default("TANGRAM_SHUTDOWN_TIMEOUT")))

# --------------------------------------------------------------------------
# deploy/systemd/tangramd.service

def parse_unit(text):
    """{section: {key: [values]}} (keys may repeat)."""
    out, sec = {}, None
    for line in text.splitlines():
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        if s.startswith("[") and s.endswith("]"):
            sec = out.setdefault(s[1:-1], {})
            continue
        k, _, v = s.partition("=")
        sec.setdefault(k.strip(), []).append(v.strip())
    return out


def timespan(v):
    """systemd time span ("45s", "1min 30s", "15min", "90") in seconds."""
    mult = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600,
            "hr": 3600, "ms": 1e-3, "us": 1e-6}
    total = 0.0
    for num, unit in re.findall(r"([0-9.]+)\s*([a-z]*)", v):
        total += float(num) * mult[unit]
    return total


unit_text = read(UNIT)
unit = parse_unit(unit_text)
svc = unit.get("Service", {})


def one(key):
    v = svc.get(key)
    return v[-1] if v else None


def yes(key):
    return one(key) in ("yes", "true", "on", "1")


check(one("Type") == "notify", "unit: Type=notify")
check(one("NotifyAccess") in ("main", "all"), "unit: NotifyAccess=main|all")
check(timespan(one("WatchdogSec") or "0") > 0, "unit: WatchdogSec")
check(one("User") not in (None, "", "root", "0"), "unit: non-root User=")
check(any(v.lstrip("-") == "/etc/tangram/tangramd.env"
          for v in svc.get("EnvironmentFile", [])),
      "unit: EnvironmentFile=/etc/tangram/tangramd.env")
check((one("ExecStart") or "").split()[0:1] == ["/usr/local/bin/tangramd"],
      "unit: ExecStart=/usr/local/bin/tangramd")
for k in ("NoNewPrivileges", "ProtectHome", "PrivateTmp"):
    check(yes(k), "unit: %s=yes" % k)
check(one("ProtectSystem") == "strict", "unit: ProtectSystem=strict")
check("/run/tangram" in " ".join(svc.get("ReadWritePaths", [])).split(),
      "unit: ReadWritePaths=/run/tangram")
check(one("RuntimeDirectory") == "tangram", "unit: RuntimeDirectory=tangram")
check(svc.get("CapabilityBoundingSet") == [""],
      "unit: CapabilityBoundingSet= (empty)")
check(any("nvidia" in v for v in svc.get("DeviceAllow", [])),
      "unit: DeviceAllow for the NVIDIA devices")
check(one("PrivateDevices") not in ("yes", "true"),
      "unit: PrivateDevices=yes would hide /dev/nvidia*")
check(one("KillMode") == "mixed", "unit: KillMode=mixed")
stop = timespan(one("TimeoutStopSec") or "90")
check(stop >= unit_shutdown + 10,
      "unit: TimeoutStopSec %s s < shutdown timeout %s s + 10 s"
      % (stop, unit_shutdown))
check("WantedBy" in unit.get("Install", {}), "unit: [Install] WantedBy=")

analyze = shutil.which("systemd-analyze")
if analyze:
    with tempfile.TemporaryDirectory() as td:
        copy = os.path.join(td, "tangramd.service")
        with open(copy, "w", encoding="utf-8") as f:
            f.write(re.sub(r"(?m)^ExecStart=.*$", "ExecStart=/bin/true",
                           unit_text))
        r = subprocess.run([analyze, "verify", copy], capture_output=True,
                           text=True, timeout=60)
        out = (r.stdout + r.stderr).strip()
        # verify exits 0 on unknown keys but names the file in a warning.
        bad = [ln for ln in out.splitlines() if copy in ln
               or "Unknown" in ln or "Failed" in ln]
        check(r.returncode == 0 and not bad,
              "systemd-analyze verify: rc %d: %s" % (r.returncode, out))
        r = subprocess.run([analyze, "security", "--offline=yes", copy],
                           capture_output=True, text=True, timeout=60)
        m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout)
        if r.returncode == 0 and m:  # --offline needs systemd >= 250
            check(float(m.group(1)) <= 3.0,
                  "systemd-analyze security: exposure %s > 3.0"
                  % m.group(1))

# --------------------------------------------------------------------------
# deploy/Containerfile

cf = read(CONTAINERFILE)
# Join continuation lines into instructions.
instrs = []
for line in re.sub(r"\\\n", " ", cf).splitlines():
    s = line.strip()
    if s and not s.startswith("#"):
        op, _, rest = s.partition(" ")
        instrs.append((op.upper(), rest.strip()))
args = {}
for op, rest in instrs:
    if op == "ARG" and "=" in rest:
        k, _, v = rest.partition("=")
        args[k] = v.strip('"')
froms = [rest for op, rest in instrs if op == "FROM"]
check(len(froms) >= 2, "Containerfile: not multi-stage")
check(args.get("BUILD_IMAGE", "").startswith("debian:12"),
      "Containerfile: build stage must default to Debian 12")
check(args.get("RUNTIME_IMAGE", "").startswith("debian:12"),
      "Containerfile: runtime stage must default to Debian 12")
build_runs = " ".join(rest for op, rest in instrs if op == "RUN")
check("deploy/install-deps.sh" in build_runs and "cmake --build" in build_runs,
      "Containerfile: build with install-deps.sh and cmake")
rt_pkgs = set(args.get("RUNTIME_PKGS", "").split())
for p in ("libuv1", "libzmq5", "libprotobuf-c1", "libjemalloc2",
          "libjansson4", "libpcre2-8-0", "libutf8proc2", "libnghttp2-14",
          "libhttp-parser2.9", "libopenblas0", "libsystemd0"):
    check(p in rt_pkgs, "Containerfile: runtime package %s missing" % p)
check(not [p for p in rt_pkgs if p.endswith("-dev")
           or p in ("build-essential", "cmake", "gcc")],
      "Containerfile: build tools in the runtime stage")
if shutil.which("apt-cache"):
    r = subprocess.run(["apt-cache", "show"] + sorted(rt_pkgs),
                       capture_output=True, text=True, timeout=60)
    if "Package:" in r.stdout:   # package lists present on this machine
        found = set(re.findall(r"(?m)^Package: (\S+)", r.stdout))
        check(found >= rt_pkgs, "Containerfile: unknown Debian packages %s"
              % sorted(rt_pkgs - found))
# Runtime stage: after the last FROM.
last = max(i for i, (op, _) in enumerate(instrs) if op == "FROM")
rt = instrs[last:]
users = [rest for op, rest in rt if op == "USER"]
check(users and users[-1].split(":")[0] not in ("root", "0"),
      "Containerfile: runtime stage must end with a non-root USER")
check(users and users[-1].split(":")[0].isdigit(),
      "Containerfile: USER should be numeric (runAsNonRoot can verify it)")
exposed = " ".join(rest for op, rest in rt if op == "EXPOSE").split()
check("8000" in exposed and "50051" in exposed, "Containerfile: EXPOSE")
check(any(op == "ENTRYPOINT" and "/usr/local/bin/tangramd" in rest
          for op, rest in rt), "Containerfile: ENTRYPOINT tangramd")
for op, rest in instrs:
    if op == "COPY" and "--from" not in rest:
        for src in rest.split()[:-1]:
            check(os.path.exists(os.path.join(SRC, src)),
                  "Containerfile: COPY source %s does not exist" % src)
hc = [rest for op, rest in rt if op == "HEALTHCHECK"]
hc_cmd = None
if check(hc, "Containerfile: no HEALTHCHECK"):
    m = re.search(r"\bCMD\s+(\[.*\])\s*$", hc[0])
    if check(m, "Containerfile: HEALTHCHECK CMD must be exec form"):
        hc_cmd = json.loads(m.group(1))


class Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 (http.server's naming)
        code = Health.status if self.path == "/health" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def run_hc(port):
    env = dict(os.environ, TANGRAM_HTTP_PORT=str(port))
    r = subprocess.run(hc_cmd, env=env, capture_output=True, timeout=20)
    return r.returncode


if hc_cmd and os.path.exists(hc_cmd[0]):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    port = srv.server_address[1]
    Health.status = 200
    check(run_hc(port) == 0, "HEALTHCHECK: not healthy on /health 200")
    Health.status = 503
    check(run_hc(port) != 0, "HEALTHCHECK: healthy on /health 503")
    srv.shutdown()
    srv.server_close()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()[1]
    s.close()
    check(run_hc(closed) != 0, "HEALTHCHECK: healthy on a closed port")

# --------------------------------------------------------------------------
# install-deps.sh, docs

deps = read(os.path.join(DEPLOY, "install-deps.sh"))
check("python3-yaml" in deps, "install-deps.sh: python3-yaml not in PKGS")
readme = read(os.path.join(DEPLOY, "README.md"))
for f in ("Containerfile", "install-deps.sh", "run-tests.sh", "gpu-round.sh",
          "check-format.sh", "check-includes.py",
          "quickstart.sh",
          "systemd/tangramd.service", "systemd/tangramd.env") + tuple(
              "k8s/" + f for f in files):
    check(f in readme, "deploy/README.md does not describe %s" % f)
guide = read(os.path.join(SRC, "docs", "DEPLOYMENT.md"))
for s in ("X-Session-Id", "hash $http_x_session_id consistent",
          "consistentHash", "ring_hash", "SIGTERM", "SIGHUP",
          "tangram-profile show", "--shutdown-timeout", "systemctl",
          "kubectl apply -k"):
    check(s in guide, "docs/DEPLOYMENT.md does not mention %r" % s)

print("%d checks, %d failures" % (checks, len(failures)))
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
