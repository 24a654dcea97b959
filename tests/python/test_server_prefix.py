"""The prefix cache and n > 1 fork through the HTTP API, on the bundled tiny-v4 model:
usage.prompt_tokens_details.cached_tokens, vLLM's prefix-cache counters, --no-prefix-cache, and
n = 4 computing its prompt once (the metrics show it) with each choice equal to its seed alone."""
import httpx

from server_harness import ServerProcess

MODEL = "tiny-v4"
SYSTEM = [3 + (i * 37 + (i * i) % 23) % 1000 for i in range(300)]  # a 300-token "system prompt"


def complete(c, prompt, **kw):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 5, "ignore_eos": True}
    body.update(kw)
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def answers(j):
    return [(ch["text"], ch["logprobs"]["token_logprobs"], ch["logprobs"]["top_logprobs"]) for ch in j["choices"]]


def turns():
    """Turn 1, turn 2 = turn 1 + more, and another user's turn after the same system prompt."""
    return [SYSTEM + [5, 6, 7], SYSTEM + [5, 6, 7] + list(range(40, 90)), SYSTEM + list(range(100, 130)),
            SYSTEM + list(range(200, 215))]


def test_cached_tokens_metrics_and_the_switch():
    cold = ServerProcess("--max-model-len", "1024", "--no-prefix-cache")
    try:
        with httpx.Client(base_url=cold.base, timeout=120) as c:
            want = [complete(c, p) for p in turns()]
        assert all(j["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 for j in want)
        m = cold.metrics()
        assert m["vllm:prefix_cache_queries_total"] == 0 and m["vllm:prefix_cache_hits_total"] == 0
    finally:
        cold.stop()
    s = ServerProcess("--max-model-len", "1024")
    try:
        with httpx.Client(base_url=s.base, timeout=120) as c:
            got = [complete(c, p) for p in turns()]
        # The same answers, logprobs included, whatever was reused.
        assert [answers(j) for j in got] == [answers(j) for j in want]
        cached = [j["usage"]["prompt_tokens_details"]["cached_tokens"] for j in got]
        # Turn 2 resumes at turn 1's prompt end; the third request diverges from them at 300
        # (recorded there); the fourth hits that point.
        assert cached == [0, 303, 0, 300]
        m = s.metrics()
        assert m["vllm:prefix_cache_queries_total"] == sum(len(p) for p in turns())
        assert m["vllm:prefix_cache_hits_total"] == 603
        src = {k: v for k, v in m.items() if k.startswith("vllm:prompt_tokens_by_source_total{")}
        assert sum(v for k, v in src.items() if 'local_cache_hit' in k) == 603
        assert sum(v for k, v in src.items() if 'local_compute' in k) == sum(len(p) for p in turns()) - 603
    finally:
        s.stop()


def test_n4_prefills_once_and_each_choice_is_its_seed_alone():
    s = ServerProcess("--max-model-len", "1024", "--no-prefix-cache")  # only the fork can save the prefill
    try:
        prompt = SYSTEM[:200]
        with httpx.Client(base_url=s.base, timeout=120) as c:
            before = s.metrics()
            j = complete(c, prompt, n=4, seed=11, temperature=1.0, max_tokens=6)
            after = s.metrics()
            one = [complete(c, prompt, n=1, seed=11 + i, temperature=1.0, max_tokens=6) for i in range(4)]
        assert [ch["index"] for ch in j["choices"]] == [0, 1, 2, 3]
        assert answers(j) == [answers(o)[0] for o in one]
        assert len({ch["text"] for ch in j["choices"]}) > 1  # the seeds differ
        assert after["dil:forks_total"] - before["dil:forks_total"] == 3
        computed = 'vllm:prompt_tokens_by_source_total{model_name="%s",source="local_compute"}' % MODEL
        hit = computed.replace("local_compute", "local_cache_hit")
        assert after[computed] - before[computed] == 200  # the prompt computed once
        assert after[hit] - before[hit] == 600            # and forked three times
        assert j["usage"]["prompt_tokens"] == 200
        assert j["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # no choice was cached as a whole
    finally:
        s.stop()
