#!/usr/bin/python3
"""Non-finite logits fail their request alone (docs/RELIABILITY.md,
"Non-finite logits"): the real tangramd on loopback, CPU backend, a tiny
qwen3 model (untied embeddings) whose embedding row of one token holds a
NaN. A prompt with that token makes every activation of the request NaN
from there on, so its logits row is NaN; prompts without it never read
the row and stay finite. Checked:

1. A prompt without the token completes (the model is usable).
2. With the token, over HTTP: a plain completion gets 500 with an OpenAI
   error naming the non-finite logit; a streaming one gets an SSE error
   event (then [DONE]); never text with a logprob of -9999 as before.
3. Over gRPC: tangram.v1.Generation/Generate ends with INTERNAL and the
   same reason.
4. Four clean requests sent together with two poisoned ones (one step
   batch) all complete with all their tokens, and the worker is the same
   process (nothing restarted); afterwards no request holds pages
   (tangram_kv_pages_used equals tangram_kv_pages_cached on rank 0).

Client timeouts everywhere; about 15 s on two cores.
"""
import json
import os
import shutil
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

ck = du.Checker()
POISON = 4242  # the token whose embedding row holds a NaN


def poison_embedding(model_dir, token):
    """Writes a bf16 NaN into element 0 of embed_tokens row `token` of
    model.safetensors (header: u64 length, JSON with dtype, shape and
    data_offsets relative to the end of the header)."""
    path = os.path.join(model_dir, "model.safetensors")
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        t = head["model.embed_tokens.weight"]
        assert t["dtype"] == "BF16", t["dtype"]
        hidden = t["shape"][1]
        f.seek(8 + n + t["data_offsets"][0] + token * hidden * 2)
        f.write(struct.pack("<H", 0x7FC0))  # bf16 quiet NaN


def complete(d, prompt, stream=False, max_tokens=6):
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "logprobs": 1}
    if stream:
        body["stream"] = True
    try:
        return du.http("POST", d.base_url + "/v1/completions", body,
                       timeout=60)
    except OSError as e:
        return "error: %s" % e, {}, b""


def clean(i):
    return [1000 + 37 * i + k for k in range(20)]


def poisoned(i):
    p = clean(100 + i)
    p[7] = POISON
    return p


def main():
    missing = du.missing_inputs(modules=(("grpc", "python3-grpcio"),
                                         ("google.protobuf",
                                          "python3-protobuf")),
                                tools=("protoc",))
    if missing:
        return du.fail_missing(missing)
    import grpc
    work = du.scratch_dir("tg-nonfinite-")
    try:
        model = du.make_model(os.path.join(work, "model"))
        poison_embedding(model, POISON)
        pb = du.load_tangram_pb2(work)
        ck.check(pb is not None, "protoc generated tangram_pb2")
        d = du.Daemon(model, work)
        try:
            if not ck.check(d.start(), "daemon started",
                            d.log_text()[-3000:]):
                return ck.summary()
            worker = d.child_pids("worker")

            st, _, data = complete(d, clean(0))
            j = du.json_of(data) or {}
            ck.check(st == 200 and j.get("usage", {}).get(
                "completion_tokens") == 6,
                "a prompt without the poisoned token completes", (st, data[:300]))

            st, _, data = complete(d, poisoned(0))
            j = du.json_of(data) or {}
            msg = (j.get("error") or {}).get("message", "")
            ck.check(st == 500 and du.is_openai_error(data) and
                     "non-finite logit" in msg,
                     "poisoned prompt: 500 naming the non-finite logit",
                     (st, data[:400]))
            ck.check(b"-9999" not in data and b"choices" not in data,
                     "poisoned prompt: no text, no -9999 logprob")

            st, _, data = complete(d, poisoned(1), stream=True)
            events, problems = du.sse_events(data)
            errs = [du.json_of(e) for e in events if e != "[DONE]"]
            errs = [e for e in errs if isinstance(e, dict) and "error" in e]
            ck.check(st == 200 and errs and "non-finite logit" in
                     errs[0]["error"].get("message", "") and
                     events and events[-1] == "[DONE]" and not problems,
                     "poisoned stream: an SSE error event naming the "
                     "non-finite logit, then [DONE]", (st, data[-400:]))

            if pb is not None:
                ids, status = du.grpc_generate_ids(grpc, pb, d.grpc_target,
                                                   poisoned(2), 6, 1,
                                                   timeout=60)
                ck.check(ids is None and "INTERNAL" in status and
                         "non-finite logit" in status,
                         "poisoned gRPC Generate: INTERNAL naming the "
                         "non-finite logit", status)
                ids, status = du.grpc_generate_ids(grpc, pb, d.grpc_target,
                                                   clean(1), 6, 1,
                                                   timeout=60)
                ck.check(ids is not None and len(ids) == 6,
                         "clean gRPC Generate completes", status)

            # Clean and poisoned requests in one batch.
            res = {}

            def one(key, prompt, stream):
                res[key] = complete(d, prompt, stream=stream, max_tokens=12)
            jobs = [("clean%d" % i, clean(10 + i), i % 2 == 1)
                    for i in range(4)] + \
                   [("bad%d" % i, poisoned(10 + i), i == 1) for i in range(2)]
            threads = [threading.Thread(target=one, args=j) for j in jobs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            good = 0
            for i in range(4):
                st, _, data = res["clean%d" % i]
                if i % 2 == 0:
                    j = du.json_of(data) or {}
                    good += st == 200 and j.get("usage", {}).get(
                        "completion_tokens") == 12
                else:
                    events, _ = du.sse_events(data)
                    chunks = [du.json_of(e) for e in events if e != "[DONE]"]
                    text_chunks = [c for c in chunks if isinstance(c, dict)
                                   and c.get("choices")]
                    good += st == 200 and not any(
                        isinstance(c, dict) and "error" in c for c in chunks) \
                        and len(text_chunks) >= 1 and events[-1] == "[DONE]"
            ck.check(good == 4, "batch: the 4 clean requests completed "
                     "beside 2 poisoned ones", {k: (v[0], v[2][-200:])
                                                 for k, v in res.items()})
            bad_ok = res["bad0"][0] == 500 and \
                b"non-finite logit" in res["bad0"][2] and \
                b"non-finite logit" in res["bad1"][2]
            ck.check(bad_ok, "batch: the 2 poisoned requests failed",
                     (res["bad0"][:1], res["bad1"][2][-300:]))
            ck.check(d.child_pids("worker") == worker,
                     "the worker kept running (same pid)")
            m = du.kv_page_metrics(d.base_url, 1)
            settled = du.wait_for(lambda: du.only_cached_pages(
                du.kv_page_metrics(d.base_url, 1)), 5)
            ck.check(settled, "no request holds pages afterwards (used == "
                     "cached)", m)
            rc, left = d.stop()
            ck.check(rc == 0 and not left, "stop: exit 0, no child left",
                     (rc, left))
        finally:
            d.stop()
        if ck.failures:
            print("---- tangramd log (tail) ----")
            with open(os.path.join(work, "tangramd.log"),
                      errors="replace") as f:
                print(f.read()[-4000:])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ck.summary()


if __name__ == "__main__":
    sys.exit(main())
