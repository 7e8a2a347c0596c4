#!/usr/bin/python3
"""Integration test of the real tangramd's gRPC front end without an API key:
what operators and generic tools rely on, and the limits that protect it.
Driven by Debian's python3-grpcio, without any generated stub, plus a raw
HTTP/2 socket for what grpcio never sends.

The daemon runs with --grpc-recv-timeout 1, --grpc-idle-timeout 3,
--max-num-seqs 2 and --shutdown-timeout 60 (time for the drain check).

Checked:
- Server reflection (v1 and v1alpha, through tests/integration/clients/
  grpc_reflection.py, written from the spec): the services listed are
  tangram.v1.Generation, grpc.health.v1.Health and both reflection
  services; the descriptors returned parse with descriptor_pb2, and message
  classes built from them call ModelInfo and Generate (tokens streamed,
  finish_reason LENGTH read from the reflected enum).
- grpc-timeout: a long Generate with a client deadline ends with
  DEADLINE_EXCEEDED and its pages come back (/metrics); a raw stream whose
  grpc-timeout is shorter than anything the client would do is ended by the
  server (tangram_grpc_deadline_exceeded_total) and frees its pages too.
- Receive deadline: a raw stream with headers and no body is reset after
  --grpc-recv-timeout (tangram_grpc_receive_timeouts_total), and grpcio sees
  DEADLINE_EXCEEDED "server receive timeout" for a held-back body; a raw
  connection left with nothing in progress is closed by the idle limit
  (tangram_grpc_idle_closes_total); tangram_grpc_connections follows.
- Abort is scoped to the connection that started the request: another
  connection gets found=false and may reuse the id; the owner aborts it.
- Health/Watch: SERVING at once; NOT_SERVING when the worker is killed and
  SERVING again once the supervisor restarted it; on SIGTERM (a request
  still running keeps the drain open) NOT_SERVING; new calls get UNAVAILABLE; when the drain
  ends the stream ends with UNAVAILABLE "the server is shutting down" (a
  status, not a cut connection) and tangramd exits 0.
Fails, naming it, when the daemon, grpcio, protobuf or the project data is
missing. About 20 s on 2 cores.
"""
import os
import shutil
import signal
import socket
import struct
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "clients"))
import daemon_util as du  # noqa: E402

MODEL = "tiny"
chk = du.Checker()
LONG_TOKENS = 4000
# Each channel its own connection (grpcio shares them between channels to
# one target otherwise): the tests of connection-scoped Abort need that.
OWN_CONN = [("grpc.use_local_subchannel_pool", 1)]


# ---- a raw HTTP/2 client (RFC 9113), just enough for the checks ----------

def hpack_literal(name, value):
    """One header as an HPACK literal without indexing, new name, no
    Huffman coding (RFC 7541 §6.2.2); names and values under 127 bytes."""
    n, v = name.encode(), value.encode()
    assert len(n) < 127 and len(v) < 127
    return bytes([0, len(n)]) + n + bytes([len(v)]) + v


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + \
        struct.pack(">I", sid) + payload


class RawH2:
    """One HTTP/2 connection over a blocking socket. Tracks, per stream,
    whether the server ended it (HEADERS with END_STREAM or RST_STREAM)
    and the DATA bytes it sent."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        self.ended = {}      # sid -> "end" | "rst"
        self.data = {}       # sid -> bytes
        self.eof = False
        self.goaway = False
        settings = struct.pack(">HI", 4, (1 << 31) - 1)  # INITIAL_WINDOW
        self.sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" +
                          frame(4, 0, 0, settings) +
                          frame(8, 0, 0, struct.pack(">I", 1 << 30)))

    def request(self, sid, path, body=None, timeout=None):
        hdrs = [(":method", "POST"), (":scheme", "http"), (":path", path),
                (":authority", "localhost"),
                ("content-type", "application/grpc"), ("te", "trailers")]
        if timeout:
            hdrs.append(("grpc-timeout", timeout))
        block = b"".join(hpack_literal(n, v) for n, v in hdrs)
        out = frame(1, 0x4, sid, block)  # END_HEADERS, stream left open
        if body is not None:
            msg = b"\0" + struct.pack(">I", len(body)) + body
            out += frame(0, 0x1, sid, msg)  # END_STREAM
        self.sock.sendall(out)

    def pump(self, until, limit=15.0):
        """Reads frames until until(self) is true, EOF or `limit` seconds;
        returns until(self)."""
        end = time.time() + limit
        while not until(self) and not self.eof and time.time() < end:
            self.sock.settimeout(max(0.05, end - time.time()))
            try:
                got = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                got = b""
            if not got:
                self.eof = True
                break
            self.buf += got
            while len(self.buf) >= 9:
                n = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) < 9 + n:
                    break
                ftype, flags = self.buf[3], self.buf[4]
                sid = int.from_bytes(self.buf[5:9], "big") & 0x7fffffff
                payload = self.buf[9:9 + n]
                self.buf = self.buf[9 + n:]
                self.on_frame(ftype, flags, sid, payload)
        return until(self)

    def on_frame(self, ftype, flags, sid, payload):
        if ftype == 4 and not flags & 1:      # SETTINGS: acknowledge
            self.sock.sendall(frame(4, 1, 0))
        elif ftype == 6 and not flags & 1:    # PING: answer
            self.sock.sendall(frame(6, 1, 0, payload))
        elif ftype == 7:
            self.goaway = True
        elif ftype == 0:
            self.data[sid] = self.data.get(sid, b"") + payload
            if flags & 1:
                self.ended[sid] = "end"
        elif ftype == 1 and flags & 1:
            self.ended[sid] = "end"
        elif ftype == 3:
            self.ended.setdefault(sid, "rst")

    def close(self):
        self.sock.close()


# ---- helpers ------------------------------------------------------------

class Http:
    def __init__(self, d):
        self.d = d

    def metrics(self):
        return du.fetch_metrics(self.d.base_url) or {}

    def value(self, name, **labels):
        return du.metric(self.metrics(), name, **labels) or 0

    def idle(self, timeout=20):
        def quiet():
            m = self.metrics()
            if m and du.metric(m, "tangram_num_requests_running") == 0 and \
                    du.metric(m, "tangram_num_requests_waiting") == 0:
                return m
            return None
        return du.wait_for(quiet, timeout, 0.05)

    def pages(self):
        m = self.idle()
        return None if m is None else du.metric(m, "tangram_kv_pages_used",
                                                rank="0")


class Api:
    """tangram.v1 through message classes built from reflection."""

    def __init__(self, grpc, gr, channel):
        self.grpc, self.gr, self.ch = grpc, gr, channel
        self.r = gr.Reflection(channel, "v1")
        self.files = self.r.file_containing_symbol("tangram.v1.Generation")
        self.pool = gr.build_pool(self.files)
        cls = lambda n: gr.message_class(self.pool, "tangram.v1." + n)  # noqa
        self.GenerateRequest = cls("GenerateRequest")
        self.GenerateResponse = cls("GenerateResponse")
        self.ModelInfoRequest = cls("ModelInfoRequest")
        self.ModelInfoResponse = cls("ModelInfoResponse")
        self.AbortRequest = cls("AbortRequest")
        self.AbortResponse = cls("AbortResponse")
        self.finish = {v.name: v.number for v in self.pool.FindEnumTypeByName(
            "tangram.v1.FinishReason").values}

    def stubs(self, channel):
        ser = lambda m: m.SerializeToString()  # noqa: E731
        gen = "/tangram.v1.Generation/"
        return (channel.unary_stream(
                    gen + "Generate", request_serializer=ser,
                    response_deserializer=self.GenerateResponse.FromString),
                channel.unary_unary(
                    gen + "Abort", request_serializer=ser,
                    response_deserializer=self.AbortResponse.FromString))

    def request(self, **kw):
        sampling = kw.pop("sampling", None)
        req = self.GenerateRequest(**kw)
        for k, v in (sampling or {}).items():
            setattr(req.sampling, k, v)
        return req


class Background:
    """A Generate running in a thread; `first` is set by its first message
    (or its end)."""

    def __init__(self, grpc, generate, req, timeout=120):
        self.grpc, self.msgs, self.code, self.det = grpc, [], None, None
        self.first = threading.Event()
        self.call = generate(req, timeout=timeout)
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        try:
            for m in self.call:
                self.msgs.append(m)
                self.first.set()
            self.code = self.grpc.StatusCode.OK
        except self.grpc.RpcError as e:
            self.code, self.det = e.code(), e.details()
        self.first.set()

    def join(self, timeout=30):
        self.t.join(timeout)
        return not self.t.is_alive()


def code_of(grpc, fn, *a, **kw):
    try:
        return grpc.StatusCode.OK, fn(*a, **kw)
    except grpc.RpcError as e:
        return e.code(), e.details()


# ---- checks --------------------------------------------------------------

def t_reflection(grpc, gr, ch):
    from google.protobuf import descriptor_pb2
    want = {"tangram.v1.Generation", "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection"}
    for pkg in ("v1", "v1alpha"):
        r = gr.Reflection(ch, pkg)
        names = r.list_services()
        chk.check(set(names) == want and len(names) == len(want),
                  "reflection %s lists the services" % pkg, names)
        files = r.file_containing_symbol("tangram.v1.Generation")
        fds = [descriptor_pb2.FileDescriptorProto.FromString(f)
               for f in files]
        svc = fds[0].service[0] if fds and fds[0].service else None
        chk.check(fds and fds[0].name == "tangram.proto" and
                  fds[0].package == "tangram.v1" and svc is not None and
                  [m.name for m in svc.method] ==
                  ["Generate", "Tokenize", "ModelInfo", "Abort"] and
                  svc.method[0].server_streaming and
                  svc.method[0].input_type == ".tangram.v1.GenerateRequest",
                  "reflection %s: tangram.proto by symbol, parsed by "
                  "descriptor_pb2" % pkg)
        for sym in ("tangram.v1.GenerateRequest",
                    "tangram.v1.Generation.Abort",
                    "tangram.v1.SamplingParams.stop_token_ids"):
            f = r.file_containing_symbol(sym)
            chk.check(descriptor_pb2.FileDescriptorProto.FromString(
                f[0]).name == "tangram.proto", "symbol %s (%s)" % (sym, pkg))
        try:
            r.file_containing_symbol("tangram.v1.Nope")
            ok = False
        except LookupError:
            ok = True
        chk.check(ok, "an unknown symbol is NOT_FOUND (%s)" % pkg)


def t_dynamic(grpc, api, ch):
    generate, _ = api.stubs(ch)
    info = ch.unary_unary(
        "/tangram.v1.Generation/ModelInfo",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=api.ModelInfoResponse.FromString)(
            api.ModelInfoRequest(), timeout=10)
    chk.check(info.model == MODEL and info.num_layers == 2,
              "ModelInfo through reflected classes", info)
    msgs = list(generate(api.request(prompt="Hello there", sampling={
        "max_tokens": 6, "temperature": 0, "ignore_eos": True}), timeout=60))
    n = sum(len(m.token_ids) for m in msgs)
    chk.check(n == 6 and msgs[-1].finish_reason ==
              api.finish["FINISH_REASON_LENGTH"] and
              msgs[-1].usage.completion_tokens == 6,
              "Generate through classes built from reflection (%d tokens)" % n)


def t_deadline(grpc, api, ch, http, port):
    generate, _ = api.stubs(ch)
    before = http.pages()
    bg = Background(grpc, generate, api.request(
        prompt="A long deadline story", sampling={
            "max_tokens": LONG_TOKENS, "temperature": 0.7, "seed": 3,
            "ignore_eos": True}), timeout=2.0)
    bg.join(30)
    n = sum(len(m.token_ids) for m in bg.msgs)
    chk.check(bg.code == grpc.StatusCode.DEADLINE_EXCEEDED and bg.msgs and
              n < LONG_TOKENS, "a 2 s deadline ends a long Generate with "
              "DEADLINE_EXCEEDED after %d tokens (%s)" % (n, bg.code))
    after = http.pages()
    chk.check(before is not None and after == before,
              "its pages come back (%s -> %s)" % (before, after))
    # The server ends the call itself: grpc-timeout 1500m on a raw stream
    # whose client never cancels.
    d0 = http.value("tangram_grpc_deadline_exceeded_total")
    body = api.request(prompt="The server's own deadline", sampling={
        "max_tokens": LONG_TOKENS, "ignore_eos": True}).SerializeToString()
    h = RawH2(port)
    h.request(1, "/tangram.v1.Generation/Generate", body, timeout="1500m")
    ended = h.pump(lambda c: 1 in c.ended)
    h.close()
    chk.check(ended and len(h.data.get(1, b"")) > 0,
              "grpc-timeout 1500m: the server streamed, then ended the call")
    chk.check(http.value("tangram_grpc_deadline_exceeded_total") == d0 + 1,
              "tangram_grpc_deadline_exceeded_total counts it")
    after = http.pages()
    chk.check(after == before, "the server-side deadline frees the pages "
              "(%s -> %s)" % (before, after))


def t_receive(grpc, ch, http, port):
    r0 = http.value("tangram_grpc_receive_timeouts_total")
    i0 = http.value("tangram_grpc_idle_closes_total")
    c0 = http.value("tangram_grpc_connections")
    h = RawH2(port)
    h.request(1, "/tangram.v1.Generation/Generate")  # headers, no body
    chk.check(du.wait_for(lambda: http.value("tangram_grpc_connections")
                          == c0 + 1, 5),
              "tangram_grpc_connections counts the raw connection")
    ended = h.pump(lambda c: 1 in c.ended)
    chk.check(ended, "headers without a body: the stream is ended by the "
              "receive deadline (%s)" % h.ended)
    chk.check(http.value("tangram_grpc_receive_timeouts_total") == r0 + 1,
              "tangram_grpc_receive_timeouts_total counts it")
    # Nothing in progress on that connection now: the idle limit closes it.
    closed = h.pump(lambda c: c.eof, limit=20)
    h.close()
    chk.check(closed and h.goaway, "the idle connection gets GOAWAY and is "
              "closed by --grpc-idle-timeout")
    # (grpcio's own idle connection may be closed meanwhile as well.)
    chk.check(http.value("tangram_grpc_idle_closes_total") >= i0 + 1,
              "tangram_grpc_idle_closes_total counts it")
    chk.check(du.wait_for(lambda: http.value("tangram_grpc_connections")
                          <= c0, 5), "tangram_grpc_connections back to %s "
              "or below" % c0)
    # grpcio's view of the same: a body held back past the deadline.
    ev = threading.Event()

    def held():
        ev.wait(30)
        yield b""
    code, det = code_of(grpc, ch.stream_unary(
        "/tangram.v1.Generation/ModelInfo"), held(), timeout=20)
    ev.set()
    chk.check(code == grpc.StatusCode.DEADLINE_EXCEEDED and
              "receive timeout" in (det or ""),
              "grpcio: DEADLINE_EXCEEDED from the server's receive timeout "
              "(%s: %s)" % (code, det))


def t_abort_scope(grpc, api, ch_a, ch_b, http):
    gen_a, abort_a = api.stubs(ch_a)
    gen_b, abort_b = api.stubs(ch_b)
    before = http.pages()
    long_req = api.request(prompt="Mine alone", request_id="mine", sampling={
        "max_tokens": LONG_TOKENS, "temperature": 0.7, "seed": 5,
        "ignore_eos": True})
    a = Background(grpc, gen_a, long_req)
    a.first.wait(30)
    chk.check(len(a.msgs) >= 1, "connection A's request streams")
    code, r = code_of(grpc, abort_b, api.AbortRequest(request_id="mine"),
                      timeout=10)
    chk.check(code == grpc.StatusCode.OK and not r.found,
              "Abort from another connection: found=false", (code, r))
    b = Background(grpc, gen_b, long_req)
    b.first.wait(30)
    chk.check(len(b.msgs) >= 1 and b.code is None,
              "another connection may use the same request_id (%s)" % b.code)
    code, r = code_of(grpc, abort_b, api.AbortRequest(request_id="mine"),
                      timeout=10)
    chk.check(code == grpc.StatusCode.OK and r.found,
              "B aborts its own 'mine'", (code, r))
    b.join(20)
    chk.check(a.code is None and b.code == grpc.StatusCode.CANCELLED,
              "only B's stream ended (A %s, B %s)" % (a.code, b.code))
    code, r = code_of(grpc, abort_a, api.AbortRequest(request_id="mine"),
                      timeout=10)
    chk.check(code == grpc.StatusCode.OK and r.found,
              "the owner's connection aborts it: found=true", (code, r))
    a.join(20)
    chk.check(a.code == grpc.StatusCode.CANCELLED,
              "A's stream ends CANCELLED (%s)" % a.code)
    after = http.pages()
    chk.check(after == before, "pages back after the aborts (%s -> %s)" %
              (before, after))


def t_watch_drain(grpc, api, ch, d):
    gr = api.gr
    hfiles = api.r.file_containing_symbol("grpc.health.v1.Health")
    hpool = gr.build_pool(hfiles)
    HReq = gr.message_class(hpool, "grpc.health.v1.HealthCheckRequest")
    HResp = gr.message_class(hpool, "grpc.health.v1.HealthCheckResponse")
    st = {v.name: v.number for v in hpool.FindEnumTypeByName(
        "grpc.health.v1.HealthCheckResponse.ServingStatus").values}
    watch = ch.unary_stream("/grpc.health.v1.Health/Watch",
                            request_serializer=lambda m: m.SerializeToString(),
                            response_deserializer=HResp.FromString)
    seen, end = [], {}
    got = threading.Condition()

    def follow():
        try:
            for m in watch(HReq(service="tangram.v1.Generation"),
                           timeout=180):
                with got:
                    seen.append(m.status)
                    got.notify_all()
            end["code"] = grpc.StatusCode.OK
        except grpc.RpcError as e:
            end["code"], end["det"] = e.code(), e.details()
        with got:
            end["done"] = True
            got.notify_all()

    def wait_seen(n, timeout=60):
        with got:
            got.wait_for(lambda: len(seen) >= n or end.get("done"), timeout)
        return list(seen)
    t = threading.Thread(target=follow, daemon=True)
    t.start()
    chk.check(wait_seen(1)[:1] == [st["SERVING"]], "Watch: SERVING at once",
              seen)
    # A worker dies: NOT_SERVING until the supervisor has it back.
    workers = d.child_pids("worker")
    if chk.check(len(workers) == 1, "one worker to kill", workers):
        os.kill(workers[0], signal.SIGKILL)
        chk.check(wait_seen(2)[1:2] == [st["NOT_SERVING"]],
                  "Watch: NOT_SERVING when a worker dies", seen)
        chk.check(wait_seen(3, 120)[2:3] == [st["SERVING"]],
                  "Watch: SERVING again once the worker is back", seen)
        d.note_children()
    n0 = len(seen)
    generate, abort = api.stubs(ch)
    bg = Background(grpc, generate, api.request(
        prompt="Keep the drain open", request_id="drain", sampling={
            "max_tokens": LONG_TOKENS, "temperature": 0.7, "seed": 9,
            "ignore_eos": True}))
    bg.first.wait(30)
    chk.check(bg.msgs and bg.code is None, "a long request runs (%s)" %
              bg.code)
    d.proc.send_signal(signal.SIGTERM)
    chk.check(wait_seen(n0 + 1)[n0:] == [st["NOT_SERVING"]],
              "Watch: NOT_SERVING once SIGTERM starts the drain", seen)
    code, _ = code_of(grpc, lambda: list(generate(api.request(
        prompt="too late", sampling={"max_tokens": 2}), timeout=10)))
    chk.check(code == grpc.StatusCode.UNAVAILABLE,
              "Generate during the drain -> UNAVAILABLE (%s)" % code)
    code, r = code_of(grpc, abort, api.AbortRequest(request_id="drain"),
                      timeout=10)
    chk.check(code == grpc.StatusCode.OK and r.found,
              "Abort ends the last request, so the drain ends", (code, r))
    t.join(30)
    chk.check(not t.is_alive() and
              end.get("code") == grpc.StatusCode.UNAVAILABLE and
              end.get("det") == "the server is shutting down" and
              len(seen) == n0 + 1,
              "Watch ends with UNAVAILABLE 'the server is shutting down' "
              "after NOT_SERVING", (end, seen))
    bg.join(20)
    try:
        rc = d.proc.wait(timeout=30)
    except Exception:  # noqa: BLE001
        rc = None
    chk.check(rc == 0, "tangramd exits 0 after the drain (rc %s)" % rc)


def main():
    missing = du.missing_inputs(
        modules=[("grpc", "python3-grpcio"),
                 ("google.protobuf", "python3-protobuf")])
    if missing:
        return du.fail_missing(missing)
    import grpc
    import grpc_reflection as gr
    work = du.scratch_dir("tgdgrpcops")
    d = None
    chans = []
    try:
        model = du.make_model(os.path.join(work, MODEL))
        # A flag given twice keeps the last value: this --shutdown-timeout
        # wins over the helper's default of 5 s.
        d = du.Daemon(model, work, ["--max-num-seqs", "2", "--max-model-len",
                                    "4096", "--grpc-recv-timeout", "1",
                                    "--grpc-idle-timeout", "3",
                                    "--shutdown-timeout", "60"])
        ready = d.start()
        chk.check(ready, "tangramd starts and /health turns 200",
                  d.log_text()[-3000:])
        if ready:
            http = Http(d)
            ch = grpc.insecure_channel(d.grpc_target, options=OWN_CONN)
            ch_b = grpc.insecure_channel(d.grpc_target, options=OWN_CONN)
            chans += [ch, ch_b]
            t_reflection(grpc, gr, ch)
            api = Api(grpc, gr, ch)
            t_dynamic(grpc, api, ch)
            t_deadline(grpc, api, ch, http, d.grpc_port)
            t_receive(grpc, ch, http, d.grpc_port)
            t_abort_scope(grpc, api, ch, ch_b, http)
            chk.check(d.proc.poll() is None and not
                      [ln for ln in d.log_text().splitlines()
                       if "restarting" in ln],
                      "no process died during the test")
            t_watch_drain(grpc, api, ch, d)
    finally:
        for c in chans:
            c.close()
        if d is not None:
            rc, left = d.stop()
            chk.check(not left, "no router/worker survives tangramd (%s)" %
                      left)
            san = d.sanitizer_reports()
            chk.check(not san, "no sanitizer report in the daemon's log",
                      "\n".join(san[:10]))
            if chk.failures:
                print("---- tangramd log (tail) ----")
                print(d.log_text()[-4000:])
        shutil.rmtree(work, ignore_errors=True)
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
