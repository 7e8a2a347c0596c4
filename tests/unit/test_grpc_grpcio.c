/* test_grpc_grpcio.c — the router's gRPC server (rt_grpc) driven by
 * Debian's python3-grpcio (the real client of DESIGN §7) on loopback: the
 * fixture with demo methods is tests/support/tt_grpc.{h,c}; an embedded
 * script uses generic unary_unary / unary_stream calls with bytes in and
 * out: round trips, streaming counts and trailers, flow control, status
 * codes with non-ASCII messages, unknown method, RESOURCE_EXHAUSTED,
 * client cancel reaching on_cancel, deadlines, 20 concurrent streams on
 * one connection, the health service (Check, and Watch following state
 * changes), bidirectional streams (answers as messages arrive), admission
 * refusing a call before its body is sent, server reflection in both
 * packages through tests/integration/clients/grpc_reflection.py (a client
 * written from the spec: services, symbols, files, errors, descriptors
 * that build working message classes), and garbage bytes closing only
 * their own connection. Without python3-grpcio the test fails, naming it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "router/net/rt_grpc.h"
#include "tests/support/tt_grpc.h"
#include "tests/support/tt_support.h"

/* The grpcio client script; argv[1] is the port. Prints "FAIL: ..." and
 * exits 1 on the first failed check. */
static const char py_client[] =
    "import os, queue, sys, time, socket, threading\n"
    "import concurrent.futures as cf\n"
    "import grpc\n"
    "port = int(sys.argv[1])\n"
    "addr = '127.0.0.1:%d' % port\n"
    "ch = grpc.insecure_channel(addr, options=[\n"
    "    ('grpc.max_receive_message_length', 8 << 20),\n"
    "    ('grpc.max_send_message_length', 8 << 20)])\n"
    "def uu(m): return ch.unary_unary(m)\n"
    "def us(m): return ch.unary_stream(m)\n"
    "def check(c, what):\n"
    "    if not c:\n"
    "        print('FAIL:', what, flush=True); sys.exit(1)\n"
    "def code_of(fn):\n"
    "    try:\n"
    "        fn(); return (grpc.StatusCode.OK, '')\n"
    "    except grpc.RpcError as e:\n"
    "        return (e.code(), e.details())\n"
    "def stats():\n"
    "    return [int(x) for x in uu('/test.Echo/Stats')(b'', timeout=5).split()]\n"
    "# unary round trip, trailing metadata\n"
    "r, call = uu('/test.Echo/Unary').with_call(b'\\x00hello\\xff', timeout=5)\n"
    "check(r == b'\\x00hello\\xff', 'echo')\n"
    "check(call.code() == grpc.StatusCode.OK, 'echo code')\n"
    "check(uu('/test.Echo/Unary')(b'', timeout=5) == b'', 'empty echo')\n"
    "big = bytes(range(256)) * 4096\n"
    "check(uu('/test.Echo/Unary')(big, timeout=10) == big, 'echo 1 MiB')\n"
    "lim = b'z' * (4 << 20)\n"
    "check(uu('/test.Echo/Unary')(lim, timeout=20) == lim, 'echo at limit')\n"
    "# server streaming: count, content, flow control past the window\n"
    "msgs = list(us('/test.Echo/Stream')(b'300 4096', timeout=20))\n"
    "check(len(msgs) == 300, 'stream count %d' % len(msgs))\n"
    "check(all(len(m) == 4096 and m[0] == k % 256 and m[1] == (k + 1) % 256\n"
    "          for k, m in enumerate(msgs)), 'stream content')\n"
    "check(list(us('/test.Echo/Stream')(b'0 0', timeout=5)) == [], 'empty stream')\n"
    "it = us('/test.Echo/Ticks')(b'25', timeout=10)\n"
    "got = [m for m in it]\n"
    "check(got == [b'tick %d' % i for i in range(25)], 'ticks')\n"
    "check(it.code() == grpc.StatusCode.OK, 'ticks code')\n"
    "# a stream that ends with an error after its messages\n"
    "it = us('/test.Echo/Stream')(b'3 10 9', timeout=5)\n"
    "got = []\n"
    "try:\n"
    "    for m in it: got.append(m)\n"
    "    check(False, 'stream error not raised')\n"
    "except grpc.RpcError as e:\n"
    "    check(len(got) == 3, 'messages before error')\n"
    "    check(e.code() == grpc.StatusCode.FAILED_PRECONDITION, 'stream err code')\n"
    "    check(e.details() == 'stream failed: \\u00ff 100%', 'stream err msg %r' % e.details())\n"
    "# status codes with non-ASCII messages (percent-encoded on the wire)\n"
    "msg = 'bad input: \\u00fcn\\u00efc\\u00f6d\\u00e9 100% \\u2713 done'\n"
    "c, d = code_of(lambda: uu('/test.Echo/Fail')(msg.encode(), timeout=5))\n"
    "check(c == grpc.StatusCode.INVALID_ARGUMENT, 'fail code %s' % c)\n"
    "check(d == msg, 'fail message %r' % d)\n"
    "c, d = code_of(lambda: uu('/test.Echo/Nope')(b'x', timeout=5))\n"
    "check(c == grpc.StatusCode.UNIMPLEMENTED, 'unknown method %s' % c)\n"
    "check('/test.Echo/Nope' in d, 'unknown method msg')\n"
    "c, d = code_of(lambda: uu('/nope.Svc/X')(b'x', timeout=5))\n"
    "check(c == grpc.StatusCode.UNIMPLEMENTED, 'unknown service')\n"
    "c, d = code_of(lambda: uu('/test.Echo/Unary')(b'y' * (5 << 20), timeout=20))\n"
    "check(c == grpc.StatusCode.RESOURCE_EXHAUSTED, 'oversized %s %s' % (c, d))\n"
    "c, d = code_of(lambda: uu('/test.Echo/Unary')(b'y' * ((4 << 20) + 1), timeout=20))\n"
    "check(c == grpc.StatusCode.RESOURCE_EXHAUSTED, 'limit + 1')\n"
    "check(uu('/test.Echo/Unary')(b'still ok', timeout=5) == b'still ok', 'after errors')\n"
    "# client cancel reaches the server's on_cancel\n"
    "s0 = stats()\n"
    "f = uu('/test.Echo/Slow').future(b'x')\n"
    "for i in range(1000):  # up to 10 s on a loaded machine\n"
    "    if stats()[3] > s0[3]: break\n"
    "    time.sleep(0.01)\n"
    "f.cancel()\n"
    "for i in range(1000):  # up to 10 s on a loaded machine\n"
    "    s1 = stats()\n"
    "    if s1[0] > s0[0]: break\n"
    "    time.sleep(0.01)\n"
    "check(s1[0] == s0[0] + 1 and s1[1] == s0[1], 'cancel counted %s %s' % (s0, s1))\n"
    "# cancel of a stream in the middle\n"
    "it = us('/test.Echo/Ticks')(b'100000', timeout=30)\n"
    "check(next(it) == b'tick 0', 'first tick')\n"
    "it.cancel()\n"
    "for i in range(1000):  # up to 10 s on a loaded machine\n"
    "    s2 = stats()\n"
    "    if s2[0] > s1[0]: break\n"
    "    time.sleep(0.01)\n"
    "check(s2[0] == s1[0] + 1, 'stream cancel counted')\n"
    "# deadlines\n"
    "t0 = time.time()\n"
    "c, d = code_of(lambda: uu('/test.Echo/Slow')(b'x', timeout=0.3))\n"
    "check(c == grpc.StatusCode.DEADLINE_EXCEEDED, 'deadline %s' % c)\n"
    "# not before the deadline; that the server applied it (and did not\n"
    "# just lose the client) is its cancel count below, not a wall time\n"
    "check(time.time() - t0 >= 0.29, 'deadline came early')\n"
    "for i in range(1000):  # up to 10 s on a loaded machine\n"
    "    s3 = stats()\n"
    "    if s3[0] > s2[0]: break\n"
    "    time.sleep(0.01)\n"
    "check(s3[0] == s2[0] + 1, 'deadline cancel counted')\n"
    "# a handle without on_cancel turns into a zombie\n"
    "f = uu('/test.Echo/Keep').future(b'k')\n"
    "for i in range(1000):  # up to 10 s on a loaded machine\n"
    "    if stats()[5] == 1: break\n"
    "    time.sleep(0.01)\n"
    "f.cancel()\n"
    "time.sleep(0.2)\n"
    "check(uu('/test.Echo/Release')(b'', timeout=5) == b'1/1', 'zombie finish')\n"
    "# 20 concurrent streams on one connection\n"
    "def one(i):\n"
    "    n = 10 + i\n"
    "    got = list(us('/test.Echo/Ticks')(str(n).encode(), timeout=30))\n"
    "    return got == [b'tick %d' % k for k in range(n)]\n"
    "with cf.ThreadPoolExecutor(20) as ex:\n"
    "    res = list(ex.map(one, range(20)))\n"
    "check(all(res), 'concurrent streams %s' % res)\n"
    "# health\n"
    "def hreq(s):\n"
    "    b = s.encode()\n"
    "    return (b'\\x0a' + bytes([len(b)]) + b) if b else b''\n"
    "hc = uu('/grpc.health.v1.Health/Check')\n"
    "check(hc(hreq(''), timeout=5) == b'\\x08\\x01', 'health overall')\n"
    "check(hc(hreq('tangram.v1.Generation'), timeout=5) == b'\\x08\\x01', 'serving')\n"
    "uu('/test.Echo/SetServing')(b'0', timeout=5)\n"
    "check(hc(hreq('tangram.v1.Generation'), timeout=5) == b'\\x08\\x02', 'not serving')\n"
    "uu('/test.Echo/SetServing')(b'1', timeout=5)\n"
    "c, d = code_of(lambda: hc(hreq('no.such.Service'), timeout=5))\n"
    "check(c == grpc.StatusCode.NOT_FOUND, 'health unknown %s' % c)\n"
    "c, d = code_of(lambda: hc(b'\\xff\\xff\\xff', timeout=5))\n"
    "check(c == grpc.StatusCode.INVALID_ARGUMENT, 'health garbage %s' % c)\n"
    "# health Watch: the state at once, then each change; unknown services\n"
    "# get SERVICE_UNKNOWN and the stream stays open\n"
    "hw = us('/grpc.health.v1.Health/Watch')\n"
    "it = hw(hreq('tangram.v1.Generation'), timeout=30)\n"
    "check(next(it) == b'\\x08\\x01', 'watch: SERVING at once')\n"
    "uu('/test.Echo/SetServing')(b'0', timeout=5)\n"
    "check(next(it) == b'\\x08\\x02', 'watch: NOT_SERVING when it changes')\n"
    "uu('/test.Echo/SetServing')(b'1', timeout=5)\n"
    "check(next(it) == b'\\x08\\x01', 'watch: SERVING again')\n"
    "it.cancel()\n"
    "it = hw(hreq('no.such.Service'), timeout=30)\n"
    "check(next(it) == b'\\x08\\x03', 'watch: SERVICE_UNKNOWN')\n"
    "time.sleep(0.3)\n"
    "check(it.is_active(), 'watch of an unknown service stays open')\n"
    "it.cancel()\n"
    "c, d = code_of(lambda: next(hw(b'\\xff\\xff\\xff', timeout=5)))\n"
    "check(c == grpc.StatusCode.INVALID_ARGUMENT, 'watch garbage %s' % c)\n"
    "# bidirectional streams: every message echoed as it arrives\n"
    "bi = ch.stream_stream('/test.Echo/Bidi')\n"
    "got = list(bi(iter([b'a', b'', b'ccc']), timeout=10))\n"
    "check(got == [b'a', b'', b'ccc'], 'bidi echo %r' % got)\n"
    "q = queue.Queue()\n"
    "def pingpong():\n"
    "    while True:\n"
    "        m = q.get()\n"
    "        if m is None:\n"
    "            return\n"
    "        yield m\n"
    "it = bi(pingpong(), timeout=10)\n"
    "for k in range(5):\n"
    "    q.put(b'ping %d' % k)\n"
    "    check(next(it) == b'ping %d' % k, 'bidi answer %d before the next ask' % k)\n"
    "q.put(None)\n"
    "check(list(it) == [] and it.code() == grpc.StatusCode.OK, 'bidi ends OK')\n"
    "c, d = code_of(lambda: list(bi(iter([b'x', b'fail', b'y']), timeout=10)))\n"
    "check(c == grpc.StatusCode.INVALID_ARGUMENT and d == 'bidi failed', 'bidi error %s' % c)\n"
    "# admission from the headers: refused while the body is still held back\n"
    "ev = threading.Event()\n"
    "def held():\n"
    "    ev.wait(30)\n"
    "    yield b'never sent'\n"
    "c, d = code_of(lambda: ch.stream_unary('/test.Secret/Unary')(held(), timeout=20))\n"
    "ev.set()\n"
    "check(c == grpc.StatusCode.UNAUTHENTICATED and d == 'no key', 'refused before the body %s %s' % (c, d))\n"
    "check(uu('/test.Secret/Unary')(b'ok', metadata=(('authorization', 'Bearer s3cret'),), timeout=5) == b'ok', 'admitted with the key')\n"
    "# server reflection (both packages), with a client built from the spec\n"
    "sys.path.insert(0, os.path.join(os.environ['TANGRAM_SOURCE'], 'tests', 'integration', 'clients'))\n"
    "import grpc_reflection as gr\n"
    "from google.protobuf import descriptor_pb2\n"
    "want = sorted(['test.Echo', 'test.Secret', 'grpc.health.v1.Health',\n"
    "               'grpc.reflection.v1.ServerReflection',\n"
    "               'grpc.reflection.v1alpha.ServerReflection'])\n"
    "for pkg in ('v1', 'v1alpha'):\n"
    "    r = gr.Reflection(ch, pkg)\n"
    "    names = r.list_services()\n"
    "    check(sorted(names) == want, 'list_services %s %r' % (pkg, names))\n"
    "    fds = r.file_containing_symbol('grpc.health.v1.Health')\n"
    "    fd = descriptor_pb2.FileDescriptorProto.FromString(fds[0])\n"
    "    check(len(fds) == 1 and fd.name == 'health.proto' and\n"
    "          fd.service[0].name == 'Health' and\n"
    "          [m.name for m in fd.service[0].method] == ['Check', 'Watch'] and\n"
    "          fd.service[0].method[1].server_streaming, 'health.proto by symbol %s' % pkg)\n"
    "    pool = gr.build_pool(fds)\n"
    "    Req = gr.message_class(pool, 'grpc.health.v1.HealthCheckRequest')\n"
    "    Resp = gr.message_class(pool, 'grpc.health.v1.HealthCheckResponse')\n"
    "    dyn = ch.unary_unary('/grpc.health.v1.Health/Check',\n"
    "                         request_serializer=lambda m: m.SerializeToString(),\n"
    "                         response_deserializer=Resp.FromString)\n"
    "    check(dyn(Req(service=''), timeout=5).status == 1, 'Check through reflected classes')\n"
    "    for sym, fname in (('grpc.health.v1.Health.Watch', 'health.proto'),\n"
    "                       ('grpc.health.v1.HealthCheckRequest.service', 'health.proto'),\n"
    "                       ('grpc.health.v1.HealthCheckResponse.ServingStatus', 'health.proto'),\n"
    "                       ('grpc.health.v1.HealthCheckResponse.SERVICE_UNKNOWN', 'health.proto'),\n"
    "                       ('tangram.v1.Generation.Generate', 'tangram.proto'),\n"
    "                       ('tangram.v1.SamplingParams.temperature_opt', 'tangram.proto'),\n"
    "                       ('tangram.v1.FINISH_REASON_STOP', 'tangram.proto'),\n"
    "                       ('grpc.reflection.v1alpha.ServerReflection', 'reflection_v1alpha.proto'),\n"
    "                       ('grpc.reflection.v1.ServerReflectionRequest', 'reflection.proto')):\n"
    "        fds = r.file_containing_symbol(sym)\n"
    "        check(descriptor_pb2.FileDescriptorProto.FromString(fds[0]).name == fname,\n"
    "              'symbol %s in %s' % (sym, fname))\n"
    "    ER = r.ExtensionRequest\n"
    "    resps = r.ask([r.Request(host='hh', list_services='*'),\n"
    "                   r.Request(file_by_filename='tangram.proto'),\n"
    "                   r.Request(file_containing_symbol='no.such.Symbol'),\n"
    "                   r.Request(file_by_filename='nope.proto'),\n"
    "                   r.Request(file_containing_extension=ER(containing_type='grpc.health.v1.HealthCheckRequest', extension_number=100)),\n"
    "                   r.Request(all_extension_numbers_of_type='grpc.health.v1.HealthCheckRequest'),\n"
    "                   r.Request(all_extension_numbers_of_type='no.such.Type'),\n"
    "                   r.Request()])\n"
    "    kinds = [x.WhichOneof('message_response') for x in resps]\n"
    "    check(kinds == ['list_services_response', 'file_descriptor_response',\n"
    "                    'error_response', 'error_response', 'error_response',\n"
    "                    'all_extension_numbers_response', 'error_response',\n"
    "                    'error_response'], 'answers in order %r' % kinds)\n"
    "    check(resps[0].valid_host == 'hh' and resps[0].original_request.list_services == '*' and\n"
    "          resps[1].original_request.file_by_filename == 'tangram.proto', 'requests echoed')\n"
    "    check([resps[i].error_response.error_code for i in (2, 3, 4, 6, 7)] == [5, 5, 5, 5, 3],\n"
    "          'error codes %r' % [resps[i].error_response.error_code for i in (2, 3, 4, 6, 7)])\n"
    "    check(resps[5].all_extension_numbers_response.base_type_name == 'grpc.health.v1.HealthCheckRequest' and\n"
    "          list(resps[5].all_extension_numbers_response.extension_number) == [], 'no extensions')\n"
    "    c, d = code_of(lambda: list(ch.stream_stream('/grpc.reflection.%s.ServerReflection/ServerReflectionInfo' % pkg)(iter([b'\\xff\\xff\\xff']), timeout=5)))\n"
    "    check(c == grpc.StatusCode.INVALID_ARGUMENT, 'reflection garbage %s' % c)\n"
    "# garbage on a socket closes that connection only\n"
    "it = us('/test.Echo/Ticks')(b'60', timeout=30)\n"
    "check(next(it) == b'tick 0', 'tick before garbage')\n"
    "sk = socket.create_connection(('127.0.0.1', port))\n"
    "sk.settimeout(5)\n"
    "sk.sendall(b'GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n' + bytes(range(256)) * 8)\n"
    "closed = False\n"
    "try:\n"
    "    while True:\n"
    "        b = sk.recv(4096)\n"
    "        if not b: closed = True; break\n"
    "except ConnectionResetError:\n"
    "    closed = True\n"
    "check(closed, 'garbage connection closed')\n"
    "sk.close()\n"
    "rest = list(it)\n"
    "check(len(rest) == 59 and it.code() == grpc.StatusCode.OK, 'stream survived garbage')\n"
    "check(uu('/test.Echo/Unary')(b'after', timeout=5) == b'after', 'echo after garbage')\n"
    "s4 = stats()\n"
    "check(s4[2] == 0, 'bad cancel statuses %s' % s4)\n"
    "ch.close()\n"
    "print('ok', flush=True)\n";

static int grpcio_available(void)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int dn = open("/dev/null", O_WRONLY);
        if (dn >= 0) {
            dup2(dn, 1);
            dup2(dn, 2);
        }
        execl(tt_python(), "python3", "-c", "import grpc", (char *)0);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static int g_have_grpcio = -1;

static void test_python_grpcio(void **state)
{
    (void)state;
    if (!g_have_grpcio)
        fail_msg("%s cannot import grpc: install python3-grpcio", tt_python());
    struct tt_grpc_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    tt_grpc_fx_start(fx);
    char port[16];
    snprintf(port, sizeof(port), "%d", fx->port);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(tt_python(), "python3", "-c", py_client, port,
              (char *)0);
        _exit(127);
    }
    int st = 0, waited = 0;
    for (int i = 0; i < 1200; i++) { /* 120 s at most */
        if (waitpid(pid, &st, WNOHANG) == pid) {
            waited = 1;
            break;
        }
        usleep(100000);
    }
    if (!waited) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    assert_true(waited);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    /* Every connection of the client is gone once it exited. */
    for (int i = 0; i < 300 && fx->srv.set.n_open; i++)
        usleep(10000);
    assert_int_equal(fx->srv.set.n_open, 0);
    assert_int_equal(atomic_load(&fx->cancel_bad), 0);
    tt_grpc_fx_stop(fx);
    free(fx);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    g_have_grpcio = grpcio_available();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_python_grpcio),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return failed;
}
