#!/usr/bin/python3
"""Integration test: /metrics passes Prometheus's own linter.

Starts tangramd (router + two CPU workers, --tp 2, so the per-rank
families have two series each) on loopback with an API key, serves an HTTP
completion, a streamed chat, a refused request and a gRPC call so that the
histograms and counters carry samples, then runs `promtool check metrics`
(Debian package `prometheus`) on the live /metrics text: it must exit 0
and print nothing (no lint finding: counters end in _total, nothing else
does, help texts present, names and label sets well formed). Also checks
the text parses as the exposition format by the project's own reader.

Fails (never skips) when promtool is missing, naming the package that
provides it (deploy/install-deps.sh installs it).
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

KEY = "sk-tangram-promtool"
AUTH = {"Authorization": "Bearer " + KEY}
MODEL = "tiny"

chk = du.Checker()


def traffic(d):
    st, _, _ = du.http("POST", d.base_url + "/v1/completions",
                       {"model": MODEL, "prompt": "Hello there",
                        "max_tokens": 4, "temperature": 0}, AUTH)
    chk.check(st == 200, "a completion is served", st)
    st, _, _ = du.http("POST", d.base_url + "/v1/chat/completions",
                       {"model": MODEL, "stream": True, "max_tokens": 4,
                        "messages": [{"role": "user", "content": "Hi"}]},
                       AUTH)
    chk.check(st == 200, "a streamed chat is served", st)
    st, _, _ = du.http("GET", d.base_url + "/v1/models")
    chk.check(st == 401, "a request without the key is refused", st)
    import grpc
    ident = (lambda b: b)
    ch = grpc.insecure_channel(d.grpc_target)
    try:
        ch.unary_unary("/tangram.v1.Generation/ModelInfo",
                       request_serializer=ident,
                       response_deserializer=ident)(
            b"", metadata=[("authorization", "Bearer " + KEY)], timeout=10)
        ok = True
    except grpc.RpcError as e:
        ok = e.code().name
    finally:
        ch.close()
    chk.check(ok is True, "a gRPC call is served", ok)


def main():
    missing = du.missing_inputs(modules=[("grpc", "python3-grpcio")],
                                tools=["promtool"])
    if missing:
        return du.fail_missing([m + (" (Debian package prometheus)"
                                     if "promtool" in m else "")
                                for m in missing])
    work = du.scratch_dir("tgdpromtool")
    d = None
    try:
        model = du.make_model(os.path.join(work, MODEL))
        d = du.Daemon(model, work, ["--tp", "2", "--heads-per-group", "1"],
                      api_key=KEY)
        ready = d.start()
        chk.check(ready, "tangramd --tp 2 starts and /health turns 200",
                  d.log_text()[-3000:])
        if ready:
            traffic(d)
            st, hd, body = du.http("GET", d.base_url + "/metrics")
            chk.check(st == 200 and body.startswith(b"# HELP "),
                      "/metrics answers with the exposition text", st)
            _, _, problems = du.parse_metrics(body.decode())
            chk.check(not problems,
                      "the text parses as the exposition format", problems)
            r = subprocess.run(["promtool", "check", "metrics"], input=body,
                               capture_output=True, timeout=60)
            out = (r.stdout + r.stderr).decode(errors="replace").strip()
            chk.check(r.returncode == 0 and out == "",
                      "promtool check metrics finds nothing on the live "
                      "/metrics (%d lines)" % body.count(b"\n"),
                      "exit %d: %s" % (r.returncode, out[:2000]))
            v = subprocess.run(["promtool", "--version"], capture_output=True,
                               text=True, timeout=30)
            print("promtool: " + (v.stdout + v.stderr).splitlines()[0]
                  if (v.stdout + v.stderr) else "promtool: ?")
        d.stop_checked(chk)
    finally:
        if d is not None:
            d.print_log_tail(chk, 3000)
            d.stop()
        shutil.rmtree(work, ignore_errors=True)
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
