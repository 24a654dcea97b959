"""`serve --dp 2 --ep 2` on the CPU (TCP loopback communicator, the bundled tiny-v4 = the v4-tiny
fixture, reference numerics) against the single-rank server: same greedy tokens whichever rank
runs a request, rank pinning with X-Data-Parallel-Rank, cancellation, per-rank metrics, clean
shutdown on SIGTERM/SIGINT, and a clear non-zero exit when a rank dies; plus a short run of
bench/dp_soak.py."""
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from server_harness import REPO, ServerProcess

MODEL = "tiny-v4"
FLAGS = ("--numerics", "reference", "--max-model-len", "1024")
PROMPTS = [[0, 5, 6, 7, 8], [0, 100, 200, 300], [0] + [7 * i % 1000 for i in range(1, 160)], [0, 41, 42],
           [0, 900, 901, 902, 903, 904, 905]]


@pytest.fixture(scope="module")
def dp():
    s = ServerProcess("--dp", "2", "--ep", "2", *FLAGS)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def one():
    s = ServerProcess(*FLAGS)
    yield s
    s.stop()


def complete(server, prompt, max_tokens=8, rank=None, **extra):
    headers = {} if rank is None else {"X-Data-Parallel-Rank": str(rank)}
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "logprobs": 0, **extra}
    r = httpx.post(server.base + "/v1/completions", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    d = r.json()
    ch = d["choices"][0]
    assert ch["finish_reason"] == "length"
    assert d["usage"]["completion_tokens"] == max_tokens
    return ch["logprobs"]["tokens"], ch["text"]


def rank_gauges(server):
    m = server.metrics()
    out = {}
    for r in (0, 1):
        lab = f'{{model_name="{MODEL}",dp_rank="{r}"}}'
        out[r] = (m[f"dil:dp_rank_requests_running{lab}"], m[f"dil:dp_rank_requests_waiting{lab}"])
    return out, m


def wait_until(pred, limit=20.0):
    deadline = time.time() + limit
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def test_greedy_tokens_equal_single_rank_on_either_rank(dp, one):
    for p in PROMPTS:
        want = complete(one, p)
        for rank in (None, 0, 1):
            assert complete(dp, p, rank=rank) == want, f"prompt {p[:6]}... on rank {rank}"


def test_pinned_rank_runs_while_the_other_idles(dp):
    for busy in (1, 0):
        before, m0 = rank_gauges(dp)
        steps0 = m0["dil:engine_steps_total"]
        with httpx.Client(timeout=60) as c:
            body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 600, "temperature": 0, "ignore_eos": True,
                    "stream": True}
            with c.stream("POST", dp.base + "/v1/completions", json=body,
                          headers={"X-Data-Parallel-Rank": str(busy)}) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                for _ in range(3):
                    next(lines)
                gauges, m = rank_gauges(dp)
                assert gauges[busy][0] == 1, gauges
                assert gauges[1 - busy] == (0.0, 0.0), gauges
                assert m["vllm:num_requests_running"] == 1
            # Leaving the block closes the connection mid-stream: the slot must come free.
        assert wait_until(lambda: rank_gauges(dp)[0] == {0: (0.0, 0.0), 1: (0.0, 0.0)}), rank_gauges(dp)[0]
        m = dp.metrics()
        assert m["dil:kv_blocks_used"] == 0
        assert m["dil:engine_steps_total"] > steps0


def test_concurrent_streaming_and_plain_requests(dp, one):
    want = {i: complete(one, p, max_tokens=12)[1] for i, p in enumerate(PROMPTS)}

    def stream(i, rank):
        headers = {} if rank is None else {"X-Data-Parallel-Rank": str(rank)}
        body = {"model": MODEL, "prompt": PROMPTS[i], "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        text, usage = "", None
        with httpx.stream("POST", dp.base + "/v1/completions", json=body, headers=headers, timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                d = json.loads(line[6:])
                for ch in d["choices"]:
                    text += ch["text"]
                usage = d.get("usage") or usage
        assert usage["completion_tokens"] == 12
        return text

    jobs = []
    with concurrent.futures.ThreadPoolExecutor(12) as ex:
        for k in range(3):
            for i in range(len(PROMPTS)):
                rank = [None, 0, 1][(i + k) % 3]
                if (i + k) % 2:
                    jobs.append((i, ex.submit(stream, i, rank)))
                else:
                    jobs.append((i, ex.submit(lambda i=i, rank=rank: complete(dp, PROMPTS[i], 12, rank)[1])))
        for i, f in jobs:
            assert f.result() == want[i], f"prompt {i}"
    assert wait_until(lambda: rank_gauges(dp)[0] == {0: (0.0, 0.0), 1: (0.0, 0.0)})


def test_bad_rank_header_is_a_400(dp, one):
    for server, bad in ((dp, ["2", "-1", "x", "1.0", "99999999999"]), (one, ["1"])):
        for v in bad:
            r = httpx.post(server.base + "/v1/completions", json={"model": MODEL, "prompt": [0, 5], "max_tokens": 2},
                           headers={"X-Data-Parallel-Rank": v}, timeout=30)
            assert r.status_code == 400, (v, r.text)
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error"
            assert "X-Data-Parallel-Rank" in err["message"]
    # Chat completions read it too; a single-rank server takes rank 0.
    r = httpx.post(dp.base + "/v1/chat/completions", headers={"X-Data-Parallel-Rank": "5"}, timeout=30,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 400
    complete(one, [0, 5], 2, rank=0)


def test_ep_must_equal_dp():
    binary = os.environ.get("DIL_BIN", os.path.join(REPO, "build", "deepinfer-lab"))
    r = subprocess.run([binary, "serve", "--dp", "2", "--ep", "1", "--port", "0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert "only ep == dp is supported" in r.stderr, r.stderr


def test_soak_short(dp):
    r = subprocess.run([sys.executable, os.path.join(REPO, "bench", "dp_soak.py"), "--base-url", dp.base,
                        "--duration", "20", "--ranks", "2", "--concurrency", "3"],
                       capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["errors"] == 0 and s["mismatches"] == 0 and s["ok"] > 0
    assert s["per_rank"].get("0", 0) > 0 and s["per_rank"].get("1", 0) > 0
    assert dp.alive()


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # field 4: ppid
                out.append(int(d))
    return out


def rank_of(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        for kv in f.read().split(b"\0"):
            if kv.startswith(b"DIL_RANK="):
                return int(kv[9:])
    return -1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_whole_job_cleanly(sig):
    s = ServerProcess("--dp", "2", "--ep", "2", *FLAGS)
    ranks = children(s.proc.pid)
    assert len(ranks) == 2
    complete(s, PROMPTS[1], 4, rank=1)
    s.proc.send_signal(sig)
    assert s.proc.wait(timeout=30) == 0, s.read_log()
    for pid in ranks:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    log = s.read_log()
    assert "rank 1 stopped" in log and "serve: stopped" in log, log
    s.stop()


def test_signal_to_another_rank_stops_the_job():
    s = ServerProcess("--dp", "2", "--ep", "2", *FLAGS)
    rank1 = [p for p in children(s.proc.pid) if rank_of(p) == 1]
    assert len(rank1) == 1
    os.kill(rank1[0], signal.SIGTERM)
    assert s.proc.wait(timeout=30) == 0, s.read_log()
    assert "stopped by another rank" in s.read_log()
    s.stop()


def test_a_dead_rank_ends_the_server_with_a_clear_error():
    s = ServerProcess("--dp", "2", "--ep", "2", *FLAGS)
    victim = [p for p in children(s.proc.pid) if rank_of(p) == 1]
    assert len(victim) == 1
    os.kill(victim[0], signal.SIGKILL)
    t0 = time.time()
    code = s.proc.wait(timeout=20)
    assert code != 0
    assert time.time() - t0 < 10
    log = s.read_log()
    # The watchdog ("lost rank 1") or the engine thread, whichever notices first.
    assert "lost rank 1" in log or ("lost a peer" in log and "rank 1" in log), log
    assert "exited with status" in log, log  # the launcher names the first rank that failed
    with pytest.raises(httpx.HTTPError):
        httpx.get(s.base + "/health", timeout=2)
    s.stop()
