"""SIGTERM/SIGINT: the server stops taking work (503, /health not ready), lets running requests
finish up to --shutdown-timeout, aborts the rest with finish_reason "abort", and exits 0; a
second signal exits at once."""
import json
import signal
import threading
import time

import httpx

from server_harness import RawConn, ServerProcess, request_bytes

MODEL = "tiny-v4"


def long_completion(max_tokens, stream=False):
    return json.dumps({"model": MODEL, "prompt": "go", "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": stream}).encode()


def test_sigterm_aborts_long_requests_after_the_timeout_and_exits_0():
    s = ServerProcess("--max-model-len", "4096", "--shutdown-timeout", "2")
    try:
        results = {}

        def run(name, stream):
            c = RawConn(s.port, timeout=60)
            c.send(request_bytes("POST", "/v1/completions", long_completion(4000, stream)))
            results[name] = c.read_response()

        threads = [threading.Thread(target=run, args=("plain", False)),
                   threading.Thread(target=run, args=("stream", True))]
        for t in threads:
            t.start()
        time.sleep(1.0)
        assert s.metrics()["dil:requests_in_flight"] == 2
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        # Draining: no new work, not ready; the metrics still answer.
        r = httpx.post(s.base + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert r.headers["connection"] == "close"
        assert httpx.get(s.base + "/health", timeout=10).status_code == 503
        assert httpx.get(s.base + "/metrics", timeout=10).status_code == 200
        for t in threads:
            t.join(30)
        rc = s.proc.wait(30)
        elapsed = time.time() - t0
        print(f"\nexit {rc} {elapsed:.2f} s after SIGTERM (timeout 2 s)")
        assert rc == 0
        assert elapsed < 2 + 5
        plain = json.loads(results["plain"].body)
        assert results["plain"].status == 200
        assert plain["choices"][0]["finish_reason"] == "abort"
        assert 0 < plain["usage"]["completion_tokens"] < 4000
        events = [line[6:] for line in results["stream"].body.decode().split("\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        finals = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
        assert finals[-1] == "abort"
    finally:
        s.stop()


def test_sigterm_lets_a_short_request_finish():
    s = ServerProcess("--max-model-len", "1024", "--shutdown-timeout", "30")
    try:
        out = {}

        def run():
            out["r"] = httpx.post(s.base + "/v1/completions", content=long_completion(150),
                                  headers={"Content-Type": "application/json"}, timeout=60)

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.3)
        s.proc.send_signal(signal.SIGINT)
        t.join(60)
        assert s.proc.wait(60) == 0
        r = out["r"]
        assert r.status_code == 200
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["completion_tokens"] == 150
    finally:
        s.stop()


def test_second_signal_exits_at_once():
    s = ServerProcess("--max-model-len", "4096", "--shutdown-timeout", "60")
    try:
        c = RawConn(s.port, timeout=60)
        c.send(request_bytes("POST", "/v1/completions", long_completion(4000)))
        time.sleep(0.5)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert s.proc.poll() is None  # draining, waiting for the request
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        rc = s.proc.wait(10)
        assert rc == 128 + signal.SIGTERM and time.time() - t0 < 2
    finally:
        s.stop()


def test_idle_server_exits_0_at_once():
    s = ServerProcess("--max-model-len", "256")
    try:
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(10) == 0
        assert time.time() - t0 < 2
    finally:
        s.stop()
