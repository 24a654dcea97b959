"""HTTP/1.1 edge cases a hostile or unusual client produces, on the real server: one body limit
for every transfer encoding, Content-Length validation, exclusive port ownership, pipelining,
half-close, HTTP/1.0, keep-alive timeouts, whole-request deadlines, idle connections that cost
no thread, and a non-streaming request cancelled when its client goes away."""
import json
import select
import socket
import subprocess
import time

import httpx
import pytest

from server_harness import (DEFAULT_BIN, RawConn, ServerProcess, peak_rss_kib, request_bytes, rss_kib,
                            threads)
import os

MODEL = "tiny-v4"
CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).encode()


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--max-model-len", "2048")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def quick():
    """Short keep-alive and request deadlines, so the tests can watch them fire."""
    s = ServerProcess("--max-model-len", "256", "--keep-alive-timeout", "2", "--request-timeout", "2")
    yield s
    s.stop()


def test_pipelined_requests_are_answered_in_order(server):
    c = RawConn(server.port)
    tok = json.dumps({"prompt": "Hello world"}).encode()
    c.send(request_bytes("GET", "/health") + request_bytes("POST", "/tokenize", tok) +
           request_bytes("POST", "/v1/chat/completions", CHAT) + request_bytes("GET", "/v1/models"))
    r1, r2, r3, r4 = (c.read_response() for _ in range(4))
    assert (r1.status, r2.status, r3.status, r4.status) == (200, 200, 200, 200)
    assert json.loads(r1.body) == {"status": "ok"}
    assert json.loads(r2.body)["count"] >= 2
    assert json.loads(r3.body)["object"] == "chat.completion"
    assert json.loads(r4.body)["data"][0]["id"] == MODEL
    # Still open for more.
    c.send(request_bytes("GET", "/health"))
    assert c.read_response().status == 200
    c.close()


def test_half_closed_client_gets_its_responses(server):
    """shutdown(SHUT_WR) after sending: the requests are answered, then the server closes."""
    c = RawConn(server.port)
    tok = json.dumps({"prompt": "Hello"}).encode()
    c.send(request_bytes("POST", "/tokenize", tok) + request_bytes("GET", "/health"))
    c.sock.shutdown(socket.SHUT_WR)
    assert c.read_response().status == 200
    assert c.read_response().status == 200
    assert c.closed_by_peer(5)
    # A generation that runs for many engine steps: the server checks the connection at every
    # step; an interim 100 tells a half-closed client (still reading) from a closed one.
    body = json.dumps({"model": MODEL, "prompt": "go", "max_tokens": 300, "ignore_eos": True}).encode()
    c = RawConn(server.port)
    c.send(request_bytes("POST", "/v1/completions", body))
    c.sock.shutdown(socket.SHUT_WR)
    r = c.read_response()
    assert r.status == 200, r.body
    assert all(s == 100 for s in r.interim)
    out = json.loads(r.body)
    assert out["choices"][0]["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 300
    assert c.closed_by_peer(5)


def test_http10_gets_unchunked_responses_and_close(server):
    c = RawConn(server.port)
    c.send(b"GET /health HTTP/1.0\r\n\r\n")
    r = c.read_response()
    assert r.status == 200 and r.header("connection") == "close" and r.header("content-length") == "15"
    assert c.closed_by_peer(5)
    # A stream for an HTTP/1.0 client: no chunked coding, the body ends with the connection.
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                       "stream": True}).encode()
    c = RawConn(server.port)
    c.send(request_bytes("POST", "/v1/chat/completions", body, version="1.0"))
    r = c.read_response()
    assert r.status == 200 and "transfer-encoding" not in r.headers and r.header("connection") == "close"
    events = [line for line in r.body.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 3


def test_keep_alive_is_announced_and_configurable(server, quick):
    r = httpx.get(server.base + "/health")
    assert r.headers["connection"] == "keep-alive" and r.headers["keep-alive"] == "timeout=75"
    c = RawConn(quick.port)
    c.send(request_bytes("GET", "/health"))
    r = c.read_response()
    assert r.header("keep-alive") == "timeout=2"
    t0 = time.time()
    assert c.closed_by_peer(10)
    assert 1.5 < time.time() - t0 < 4.5


def test_content_length_is_validated_at_once(server, quick):
    for bad in ("-1", "abc", "+3", "1, 2", "0x10", "1e3"):
        c = RawConn(server.port)
        t0 = time.time()
        c.send(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: " + bad.encode() + b"\r\n\r\n{}")
        r = c.read_response()
        assert r.status == 400 and time.time() - t0 < 2, (bad, r.status)
        assert r.header("connection") == "close" and "Content-Length" in json.loads(r.body)["error"]["message"]
        assert c.closed_by_peer(5)
    # Over the limit: 413 before any body byte is sent.
    c = RawConn(server.port)
    c.send(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n")
    assert c.read_response().status == 413
    # Larger than what is sent: the client half-closes -> 400 at once; it waits -> 408 at the
    # request deadline (2 s on `quick`).
    c = RawConn(server.port)
    c.send(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": 1}")
    c.sock.shutdown(socket.SHUT_WR)
    assert c.read_response().status == 400
    c = RawConn(quick.port)
    t0 = time.time()
    c.send(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": 1}")
    r = c.read_response()
    assert r.status == 408 and 1.5 < time.time() - t0 < 4.5


def test_slow_client_is_timed_out_as_a_whole(quick):
    """One byte every 0.25 s never trips a per-read timeout; the request deadline still holds."""
    c = RawConn(quick.port)
    req = request_bytes("POST", "/tokenize", json.dumps({"prompt": "x" * 100}).encode())
    t0 = time.time()
    got = None
    for b in req:
        try:
            c.send(bytes([b]))
        except OSError:
            break
        if select.select([c.sock], [], [], 0.25)[0]:
            got = c.read_response()
            break
    assert got is not None and got.status == 408
    assert time.time() - t0 < 4.5


def test_expect_100_continue(server):
    body = json.dumps({"prompt": "Hello"}).encode()
    c = RawConn(server.port)
    c.send(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
           b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    assert c._line() == b"HTTP/1.1 100 Continue" and c._line() == b""
    c.send(body)
    assert c.read_response().status == 200
    # Too large: the final answer comes instead of 100, and no body needs to be sent.
    c.send(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 99999999\r\n\r\n")
    r = c.read_response()
    assert r.status == 413 and not r.interim


@pytest.mark.parametrize("raw,status", [
    (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}", 400),
    (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
    (b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    (b"GET /health HTTP/1.1\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\r\nHost: x\r\n folded: y\r\n\r\n", 400),
    (b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"v" * 70000 + b"\r\n\r\n", 431),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nExpect: magic\r\n\r\n", 417),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 tls hello\r\n\r\n", 400),
    (b"DELETE /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 405),
])
def test_broken_framing_gets_4xx_and_close(server, raw, status):
    c = RawConn(server.port)
    c.send(raw)
    r = c.read_response()
    assert r.status == status, r.body
    if status != 405:  # a well-framed request on an existing path keeps the connection
        assert r.header("connection") == "close"
        assert c.closed_by_peer(10)
    assert "error" in json.loads(r.body)


def _chunks(total, size=1 << 16):
    block = b"x" * size
    for _ in range(total // size):
        yield block


def test_chunked_body_limit_while_reading(server):
    """50 MB chunked: 413 once the decoded body passes --max-body-bytes (4 MiB), with the
    server's peak RSS growing by less than 64 MiB (nothing past the limit is kept)."""
    pid = server.proc.pid
    peak0 = peak_rss_kib(pid)
    total = 50 << 20
    c = RawConn(server.port)
    c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n")
    sent = 0
    for block in _chunks(total):
        if select.select([c.sock], [], [], 0)[0]:
            break  # the answer came: a well-behaved client stops sending
        try:
            c.send(b"%x\r\n" % len(block) + block + b"\r\n")
        except OSError:
            break
        sent += len(block)
    r = c.read_response()
    assert r.status == 413, r.body
    assert sent < total  # refused while the body was still arriving
    assert "request_too_large" in r.body.decode()
    # A client library that sends the whole body first gets the 413 too (the server drains
    # input after answering, so the response is not lost to a reset).
    rr = httpx.post(server.base + "/v1/chat/completions", content=_chunks(total),
                    headers={"Content-Type": "application/json"}, timeout=60)
    assert rr.status_code == 413
    grown = (peak_rss_kib(pid) - peak0) / 1024
    print(f"\npeak RSS growth over two 50 MB chunked bodies: {grown:.1f} MiB")
    assert grown < 64
    assert httpx.get(server.base + "/health").status_code == 200


def test_second_server_on_a_used_port_exits_with_a_clear_message(server):
    binary = os.environ.get("DIL_BIN", DEFAULT_BIN)
    r = subprocess.run([binary, "serve", "--port", str(server.port)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert f"cannot listen on 127.0.0.1:{server.port}" in r.stderr and "already in use" in r.stderr, r.stderr
    assert httpx.get(server.base + "/health").status_code == 200


def test_idle_connections_cost_no_thread(server):
    """600 idle keep-alive connections (and 100 with half a request): /health stays fast and
    the server's thread count does not follow the connection count."""
    pid = server.proc.pid
    t_idle = threads(pid)
    conns = []
    for i in range(700):
        s = socket.create_connection(("127.0.0.1", server.port))
        if i % 7 == 0:
            s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
        conns.append(s)
    time.sleep(0.5)
    worst = 0.0
    with httpx.Client() as c:
        for _ in range(20):
            t0 = time.time()
            assert c.get(server.base + "/health").status_code == 200
            worst = max(worst, time.time() - t0)
    t_busy = threads(pid)
    print(f"\n700 idle connections: threads {t_idle} -> {t_busy}, worst /health {worst * 1000:.1f} ms")
    assert worst < 0.5
    assert t_busy <= t_idle + 8
    for s in conns:
        s.close()


def test_idle_server_holds_few_threads():
    s = ServerProcess("--max-model-len", "256")
    try:
        # A burst of concurrent requests grows the handler pool; idle handlers leave after
        # 10 s, so the idle server goes back to a handful of threads.
        with httpx.Client(limits=httpx.Limits(max_connections=64)) as c:
            import concurrent.futures as cf
            with cf.ThreadPoolExecutor(32) as ex:
                list(ex.map(lambda _: c.post(s.base + "/tokenize", json={"prompt": "hi"}).status_code, range(200)))
        n_burst = threads(s.proc.pid)
        deadline = time.time() + 30
        while threads(s.proc.pid) > 12 and time.time() < deadline:
            time.sleep(0.5)
        n_idle = threads(s.proc.pid)
        print(f"\nthreads after a burst {n_burst}, idle {n_idle}")
        assert n_idle <= 12
    finally:
        s.stop()


def test_non_streaming_request_is_cancelled_when_the_client_goes_away(server):
    """A large max_tokens, the client closes after 1 s: 0 running requests within 2 engine
    steps of the moment the server sees the close (it looks once per engine step)."""
    body = json.dumps({"model": MODEL, "prompt": "go on", "max_tokens": 1900, "ignore_eos": True}).encode()
    c = RawConn(server.port)
    c.send(request_bytes("POST", "/v1/completions", body))
    time.sleep(1.0)
    before = server.metrics()
    assert before["vllm:num_requests_running"] == 1 and before["dil:requests_in_flight"] == 1
    c.close()
    t0 = time.time()
    m0 = server.metrics()  # the engine's step count at the close (steps before it do not count)
    while True:
        m = server.metrics()
        if m["vllm:num_requests_running"] == 0 and m["dil:requests_in_flight"] == 0:
            break
        assert time.time() - t0 < 10, m
    steps = m["dil:engine_steps_total"] - m0["dil:engine_steps_total"]
    print(f"\nnon-streaming request freed {time.time() - t0:.3f} s after the close, {steps:.0f} engine steps")
    assert steps <= 2
    assert m['vllm:request_success_total{model_name="tiny-v4",finished_reason="abort"}'] >= 1
    assert m['dil:http_responses_total{model_name="tiny-v4",code="499"}'] >= 1
