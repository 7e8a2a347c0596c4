#!/usr/bin/python3
"""Checks deploy/k8s/gateway (tangramd behind an inference Gateway: the
InferencePool, its endpoint picker, the HTTPRoute and the Gateway) offline,
without a cluster:

- Every object's fields against deploy/k8s/schema/gateway-fields.yaml (the
  published schemas of the fields we use, with their provenance), the
  endpoint picker's EndpointPickerConfig inside its ConfigMap included.
  Unknown fields are errors (an API server prunes unknown fields of a
  custom resource without a word). The validator is first shown broken
  objects so that it can really fail.
- The objects agree with each other and with the base in deploy/k8s: the
  pool selects the tangramd pods on their HTTP port, whose readiness probe
  is /health; the pool's endpointPickerRef reaches the picker's gRPC port
  through its Service; the route sends the API paths to the pool and hangs
  off the Gateway; the picker watches this pool, reads its configuration
  file from the mounted ConfigMap and may list what it watches.
- The metric names the picker is told to read (its --*-metric flags) exist
  with the right type in the /metrics of a real tangramd started here, and
  tangram_cache_config_info carries the labels the picker reads
  (block_size, num_gpu_blocks) consistent with tangram_kv_pages_capacity.
- Session affinity: the header is X-Session-Id everywhere (the router reads
  x-session-id, the docs name it), no route filter drops it, and the
  picker's prefix-cache scorer, which keeps a conversation on the pod that
  holds its prefix, has the largest weight.

Fails, naming it, when python3-yaml is not installed.
"""

import copy
import os
import re
import shutil
import sys

import daemon_util as du

try:
    import yaml
except ImportError:
    print("FAIL: python3-yaml is not installed (sh deploy/install-deps.sh)")
    sys.exit(1)

SRC = du.SOURCE or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
K8S = os.path.join(SRC, "deploy", "k8s")
GW = os.path.join(K8S, "gateway")
SCHEMA = os.path.join(K8S, "schema", "gateway-fields.yaml")
SESSION_HEADER = "X-Session-Id"

chk = du.Checker()


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# ---- the schema validator -------------------------------------------------

class Schema:
    """The OpenAPI v3 subset of gateway-fields.yaml (see its header)."""

    def __init__(self, doc):
        self.defs = doc.get("definitions") or {}
        self.objects = doc.get("objects") or {}

    def resolve(self, s):
        if "$ref" in s:
            base = self.resolve(self.defs[s["$ref"]])
            s = dict(base, **{k: v for k, v in s.items() if k != "$ref"})
        return s

    def validate(self, value, s, path, errs):
        s = self.resolve(s)
        t = s.get("type")
        types = t if isinstance(t, list) else ([t] if t else [])
        ok_type = {
            "object": lambda v: isinstance(v, dict),
            "array": lambda v: isinstance(v, list),
            "string": lambda v: isinstance(v, str),
            "integer": lambda v: isinstance(v, int) and
            not isinstance(v, bool),
            "number": lambda v: isinstance(v, (int, float)) and
            not isinstance(v, bool),
            "boolean": lambda v: isinstance(v, bool),
        }
        if types and not any(ok_type[x](value) for x in types):
            errs.append("%s: %r is not of type %s" % (path, value, t))
            return
        if "enum" in s and value not in s["enum"]:
            errs.append("%s: %r is not one of %s" % (path, value, s["enum"]))
        if isinstance(value, str):
            if len(value) < s.get("minLength", 0):
                errs.append("%s: %r is shorter than %d"
                            % (path, value, s["minLength"]))
            if "maxLength" in s and len(value) > s["maxLength"]:
                errs.append("%s: longer than %d" % (path, s["maxLength"]))
            if "pattern" in s and not re.search(s["pattern"], value):
                errs.append("%s: %r does not match %s"
                            % (path, value, s["pattern"]))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in s and value < s["minimum"]:
                errs.append("%s: %r < %r" % (path, value, s["minimum"]))
            if "maximum" in s and value > s["maximum"]:
                errs.append("%s: %r > %r" % (path, value, s["maximum"]))
        if isinstance(value, list):
            if len(value) < s.get("minItems", 0):
                errs.append("%s: fewer than %d items" % (path, s["minItems"]))
            if "maxItems" in s and len(value) > s["maxItems"]:
                errs.append("%s: more than %d items" % (path, s["maxItems"]))
            if "items" in s:
                for i, v in enumerate(value):
                    self.validate(v, s["items"], "%s[%d]" % (path, i), errs)
        if isinstance(value, dict):
            for r in s.get("required", []):
                if r not in value:
                    errs.append("%s: required field %r is missing"
                                % (path, r))
            props = s.get("properties")
            extra = s.get("additionalProperties")
            for k, v in value.items():
                sub = "%s.%s" % (path, k)
                if props is not None and k in props:
                    self.validate(v, props[k], sub, errs)
                elif isinstance(extra, dict):
                    self.validate(v, extra, sub, errs)
                elif extra is True:
                    pass
                elif props is not None or extra is False:
                    errs.append("%s: unknown field (not in the schema)" % sub)

    def check_object(self, obj, where):
        key = "%s %s" % (obj.get("apiVersion"), obj.get("kind"))
        s = self.objects.get(key)
        if s is None:
            return ["%s: no schema for %s" % (where, key)]
        errs = []
        body = {k: v for k, v in obj.items() if not k.startswith("_")}
        self.validate(body, {k: v for k, v in s.items()
                             if k != "provenance"}, where, errs)
        return errs


def t_schema_selftest(schema, pool, route):
    """The validator fails on what it must refuse."""
    bad = []
    o = copy.deepcopy(pool)
    o["spec"]["endpointPickerRef"]["portNumber"] = 9002  # misspelt field
    bad.append(("an unknown field", o, "unknown field"))
    o = copy.deepcopy(pool)
    o["spec"]["endpointPickerRef"]["failureMode"] = "FailSilently"
    bad.append(("a value outside the enum", o, "is not one of"))
    o = copy.deepcopy(pool)
    del o["spec"]["targetPorts"]
    bad.append(("a missing required field", o, "required field"))
    o = copy.deepcopy(pool)
    o["spec"]["targetPorts"][0]["number"] = 70000
    bad.append(("a port out of range", o, "> 65535"))
    o = copy.deepcopy(route)
    o["spec"]["rules"][0]["timeouts"]["request"] = "1 hour"
    bad.append(("a malformed duration", o, "does not match"))
    o = copy.deepcopy(pool)
    o["apiVersion"] = "inference.networking.x-k8s.io/v1alpha2"
    bad.append(("an API version without a schema", o, "no schema"))
    for what, obj, want in bad:
        errs = schema.check_object(obj, "selftest")
        chk.check(any(want in e for e in errs),
                  "schema check refuses %s" % what, errs)


# ---- loading --------------------------------------------------------------

def load_dir(d):
    objs = []
    for f in sorted(os.listdir(d)):
        if not f.endswith((".yaml", ".yml")):
            continue
        for o in yaml.safe_load_all(read(os.path.join(d, f))):
            if o is not None:
                o["_file"] = f
                objs.append(o)
    return objs


def one(objs, kind, name=None):
    found = [o for o in objs if o.get("kind") == kind and
             (name is None or (o.get("metadata") or {}).get("name") == name)]
    return found[0] if len(found) == 1 else None


def flag(args, name):
    """Value of --name=value (or --name value) in a container's args."""
    for i, a in enumerate(args):
        if a == "--" + name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--" + name + "="):
            return a[len(name) + 3:]
    return None


# ---- static checks --------------------------------------------------------

def t_static(schema, base, gw):
    files = sorted(f for f in os.listdir(GW) if f.endswith(".yaml"))
    kust = one(gw, "Kustomization")
    listed = (kust or {}).get("resources") or []
    chk.check(kust is not None and ".." in listed and
              set(listed) - {".."} == set(files) - {"kustomization.yaml"},
              "gateway/kustomization.yaml lists the base and every manifest",
              listed)

    for o in gw + base:
        if o.get("kind") == "Kustomization":
            continue
        chk.check("namespace" not in (o.get("metadata") or {}),
                  "%s %s names no namespace" % (o["_file"], o.get("kind")))
    for o in gw:
        if o.get("kind") == "Kustomization":
            continue
        where = "%s: %s %s" % (o["_file"], o["kind"],
                               (o.get("metadata") or {}).get("name"))
        errs = schema.check_object(o, where)
        chk.check(not errs, "%s matches its schema" % where, errs)

    pool = one(gw, "InferencePool")
    route = one(gw, "HTTPRoute")
    gateway = one(gw, "Gateway")
    epp_dep = one(gw, "Deployment", "tangramd-epp")
    epp_svc = one(gw, "Service", "tangramd-epp")
    epp_cm = one(gw, "ConfigMap", "tangramd-epp")
    role = one(gw, "Role")
    binding = one(gw, "RoleBinding")
    sa = one(gw, "ServiceAccount")
    td = one(base, "Deployment", "tangramd")
    if not chk.check(all(x is not None for x in (
            pool, route, gateway, epp_dep, epp_svc, epp_cm, role, binding,
            sa, td)), "every object is present once"):
        return None
    t_schema_selftest(schema, pool, route)

    # The pool selects the tangramd pods on their HTTP port.
    tpl = td["spec"]["template"]
    pod_labels = tpl["metadata"]["labels"]
    sel = pool["spec"]["selector"]["matchLabels"]
    chk.check(all(pod_labels.get(k) == v for k, v in sel.items()),
              "the InferencePool selects the tangramd pods", (sel, pod_labels))
    ctr = tpl["spec"]["containers"][0]
    ports = {p.get("name"): p["containerPort"] for p in ctr["ports"]}
    chk.check([p["number"] for p in pool["spec"]["targetPorts"]] ==
              [ports.get("http")],
              "the pool's target port is tangramd's HTTP port (%s)"
              % ports.get("http"))
    rp = (ctr.get("readinessProbe") or {}).get("httpGet") or {}
    chk.check(rp.get("path") == "/health" and
              rp.get("port") in ("http", ports.get("http")),
              "tangramd's readiness probe is GET /health on the HTTP port "
              "(the pool leaves out loading and draining pods)", rp)
    env = {e["name"]: e for e in ctr.get("env") or []}
    cm_base = one(base, "ConfigMap") or {}
    chk.check("TANGRAM_METRICS_AUTH" not in env and
              (cm_base.get("data") or {}).get("TANGRAM_METRICS_AUTH",
                                              "false") == "false",
              "tangramd's /metrics stays open to the picker's scrapes "
              "(no TANGRAM_METRICS_AUTH)")

    # The pool reaches the picker's gRPC port through its Service.
    ref = pool["spec"]["endpointPickerRef"]
    svc_port = [p for p in epp_svc["spec"]["ports"]
                if p["port"] == ref["port"]["number"]]
    epp = epp_dep["spec"]["template"]["spec"]["containers"][0]
    epp_ports = {p.get("name"): p["containerPort"] for p in epp["ports"]}
    target = svc_port[0].get("targetPort") if svc_port else None
    target = epp_ports.get(target, target)
    chk.check(ref["name"] == epp_svc["metadata"]["name"] and
              ref.get("kind", "Service") == "Service" and target == 9002,
              "endpointPickerRef reaches the picker's ext-proc port 9002",
              (ref, svc_port, epp_ports))
    chk.check(all(epp_svc["spec"]["selector"].get(k) == v for k, v in
                  epp_svc["spec"]["selector"].items()) and
              all(epp_dep["spec"]["template"]["metadata"]["labels"].get(k) == v
                  for k, v in epp_svc["spec"]["selector"].items()),
              "the picker's Service selects the picker's pods")

    # The route: API paths to the pool, under the Gateway.
    rule = route["spec"]["rules"][0]
    be = rule["backendRefs"]
    chk.check(len(route["spec"]["rules"]) == 1 and len(be) == 1 and
              be[0].get("group") == "inference.networking.k8s.io" and
              be[0].get("kind") == "InferencePool" and
              be[0]["name"] == pool["metadata"]["name"],
              "the HTTPRoute's backend is the InferencePool", be)
    paths = [(m["path"]["type"], m["path"]["value"]) for m in rule["matches"]]
    chk.check(("PathPrefix", "/v1/") in paths and
              ("Exact", "/tokenize") in paths,
              "the HTTPRoute sends /v1/* and /tokenize to the pool", paths)
    pr = route["spec"]["parentRefs"]
    chk.check(len(pr) == 1 and pr[0]["name"] == gateway["metadata"]["name"]
              and pr[0].get("kind", "Gateway") == "Gateway",
              "the HTTPRoute hangs off the Gateway", pr)

    # The picker: this pool, its configuration file, its rights.
    args = epp.get("args") or []
    chk.check(flag(args, "pool-name") == pool["metadata"]["name"] and
              flag(args, "pool-group") in (None,
                                           "inference.networking.k8s.io"),
              "the picker watches this InferencePool", args)
    cfg_path = flag(args, "config-file") or ""
    mounts = {m["mountPath"]: m["name"] for m in epp.get("volumeMounts", [])}
    vols = {v["name"]: v for v in
            epp_dep["spec"]["template"]["spec"].get("volumes", [])}
    mdir, key = os.path.split(cfg_path)
    vol = vols.get(mounts.get(mdir)) or {}
    chk.check((vol.get("configMap") or {}).get("name") ==
              epp_cm["metadata"]["name"] and key in (epp_cm.get("data") or {}),
              "--config-file is a key of the mounted picker ConfigMap",
              (cfg_path, mounts, vols))
    pcfg = yaml.safe_load((epp_cm.get("data") or {}).get(key, "")) or {}
    pcfg["_file"] = "epp.yaml (ConfigMap %s)" % key
    errs = schema.check_object(pcfg, "EndpointPickerConfig")
    chk.check(not errs, "the picker's EndpointPickerConfig matches its "
              "schema", errs)
    declared = {p.get("name") or p["type"] for p in pcfg.get("plugins", [])}
    used = {p["pluginRef"] for prof in pcfg.get("schedulingProfiles", [])
            for p in prof.get("plugins", [])}
    chk.check(used <= declared, "every pluginRef names a declared plugin",
              (used, declared))
    chk.check(epp_dep["spec"]["template"]["spec"].get("serviceAccountName")
              == sa["metadata"]["name"] and
              binding["roleRef"]["name"] == role["metadata"]["name"] and
              any(s["kind"] == "ServiceAccount" and
                  s["name"] == sa["metadata"]["name"]
                  for s in binding.get("subjects", [])),
              "the picker runs as its ServiceAccount, bound to its Role")
    grants = {(g, r): set(rule_["verbs"]) for rule_ in role["rules"]
              for g in rule_.get("apiGroups", []) for r in rule_["resources"]}
    need = {("inference.networking.k8s.io", "inferencepools"),
            ("", "pods")}
    chk.check(all({"get", "list", "watch"} <= grants.get(n, set())
                  for n in need),
              "the Role lets the picker get/list/watch its pool and pods",
              grants)
    return {"args": args, "pcfg": pcfg, "route": route}


def t_affinity(st):
    """X-Session-Id is the session header everywhere; nothing drops it."""
    route = st["route"]
    filters = [f for r in route["spec"]["rules"]
               for f in r.get("filters") or []]
    dropped = [f for f in filters
               if SESSION_HEADER.lower() in repr(f).lower()]
    chk.check(not dropped, "no HTTPRoute filter touches %s" % SESSION_HEADER,
              dropped)
    # The front ends' files (rt_api_http*.c, rt_api_grpc*.c) name it.
    api = os.path.join(SRC, "router", "api")
    http_src = "".join(read(os.path.join(api, f)) for f in sorted(os.listdir(api))
                       if f.startswith("rt_api_http") and f.endswith(".c"))
    grpc_src = "".join(read(os.path.join(api, f)) for f in sorted(os.listdir(api))
                       if f.startswith("rt_api_grpc") and f.endswith(".c"))
    chk.check('"%s"' % SESSION_HEADER.lower() in http_src and
              '"%s"' % SESSION_HEADER.lower() in grpc_src,
              "the router reads the %s header (HTTP) and metadata key (gRPC)"
              % SESSION_HEADER)
    doc = read(os.path.join(SRC, "docs", "DEPLOYMENT.md"))
    sec = doc.split("## Inference gateway", 1)
    chk.check(len(sec) == 2 and SESSION_HEADER in sec[1].split("\n## ")[0],
              "docs/DEPLOYMENT.md has an 'Inference gateway' section naming "
              "%s" % SESSION_HEADER)
    ep = read(os.path.join(GW, "epp.yaml"))
    chk.check(SESSION_HEADER in ep and SESSION_HEADER in
              read(os.path.join(GW, "httproute.yaml")),
              "the manifests say how %s is used" % SESSION_HEADER)
    w = {p["pluginRef"]: p.get("weight", 1)
         for prof in st["pcfg"].get("schedulingProfiles", [])
         for p in prof.get("plugins", [])
         if p["pluginRef"].endswith("scorer")}
    chk.check(w and w.get("prefix-cache-scorer") == max(w.values()) and
              sorted(w.values())[-1] > sorted(w.values())[-2],
              "the prefix-cache scorer (conversation affinity) weighs most",
              w)


# ---- against a real tangramd ----------------------------------------------

METRIC_FLAGS = {  # flag -> the Prometheus type the picker expects
    "total-queued-requests-metric": "gauge",
    "total-running-requests-metric": "gauge",
    "kv-cache-usage-percentage-metric": "gauge",
    "cache-info-metric": "gauge",
}


def t_live(args, work):
    names = {}
    for f in METRIC_FLAGS:
        v = flag(args, f)
        chk.check(v, "the picker is given --%s" % f)
        names[f] = v or ""
    chk.check(flag(args, "lora-info-metric") == "",
              "LoRA scraping is off (--lora-info-metric=)")
    chk.check(flag(args, "model-server-metrics-path") in (None, "/metrics"),
              "the picker scrapes /metrics")

    model = du.make_model(os.path.join(work, "model"))
    key = "gateway-test-key"
    d = du.Daemon(model, work, api_key=key)
    try:
        ready = d.start()
        if not chk.check(ready, "tangramd starts (API key set)",
                         d.log_text()[-3000:]):
            return
        # The picker scrapes without credentials.
        st, _, body = du.http("GET", d.base_url + "/metrics")
        chk.check(st == 200, "/metrics answers without the API key (%s)" % st)
        samples, types, problems = du.parse_metrics(body.decode())
        chk.check(not problems, "/metrics parses", problems[:5])
        by_name = {}
        for (n, labels), v in samples.items():
            by_name.setdefault(n, []).append((dict(labels), v))
        for f, want in METRIC_FLAGS.items():
            spec = names[f]
            m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?$", spec)
            name = m.group(1) if m else spec
            chk.check(name in by_name and types.get(name) == want,
                      "--%s=%s exists in /metrics as a %s" % (f, spec, want),
                      (types.get(name), sorted(by_name)[:60]))
        kv = by_name.get(names["kv-cache-usage-percentage-metric"], [])
        chk.check(len(kv) == 1 and 0 <= kv[0][1] <= 1,
                  "KV-cache use is one fraction in [0, 1] (%s)" % kv)
        info = by_name.get(names["cache-info-metric"], [])
        if chk.check(len(info) == 1 and info[0][1] == 1,
                     "tangram_cache_config_info is one series of value 1",
                     info):
            lab = info[0][0]
            total = du.metric(samples, "tangram_kv_pages_capacity", rank="0")
            chk.check({"block_size", "num_gpu_blocks", "page_size",
                       "num_pages", "num_ranks"} <= set(lab),
                      "it carries block_size and num_gpu_blocks (read by "
                      "the picker) and page_size, num_pages, num_ranks", lab)
            ok = all(str(lab.get(k, "")).isdigit() for k in
                     ("block_size", "num_gpu_blocks", "page_size",
                      "num_pages"))
            chk.check(ok and lab["block_size"] == lab["page_size"] == "16" and
                      total is not None and int(lab["num_pages"]) == total
                      and lab["num_ranks"] == "1",
                      "page_size 16 = block_size, num_pages = "
                      "tangram_kv_pages_capacity{rank=\"0\"} (%s)" % total, lab)
            # Full KV (no profile): a block of 16 tokens takes one page per
            # (layer, group) row: 2 layers x 1 group of 2 heads.
            chk.check(ok and int(lab["num_gpu_blocks"]) ==
                      int(lab["num_pages"]) // 2,
                      "num_gpu_blocks = num_pages / (layers x groups) with "
                      "full KV", lab)
    finally:
        rc, left = d.stop()
        chk.check(rc == 0 and not left, "tangramd stops cleanly")


def main():
    missing = du.missing_inputs()
    if missing:
        return du.fail_missing(missing)
    schema = Schema(yaml.safe_load(read(SCHEMA)))
    chk.check(all("provenance" in s for s in schema.objects.values()),
              "every object schema names its provenance")
    try:
        base = load_dir(K8S)
        gw = load_dir(GW)
    except yaml.YAMLError as ex:
        chk.check(False, "the manifests parse", ex)
        return chk.summary()
    st = t_static(schema, base, gw)
    if st is not None:
        t_affinity(st)
        work = du.scratch_dir("tgk8sgw")
        try:
            t_live(st["args"], work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
