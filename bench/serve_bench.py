#!/usr/bin/env python3
"""Serving benchmark against a running `deepinfer-lab serve` (or any OpenAI-compatible server).

For each concurrency level, `concurrency` clients send streaming /v1/completions requests
back to back until `requests` have completed, and the script reports TTFT (time to the first
content chunk), ITL (time between content chunks), end-to-end latency and output throughput,
as a table and as JSON. The request shape follows `vllm bench serve` (stream, include_usage,
ignore_eos, fixed max_tokens), so numbers are comparable with peers' published runs.

  python bench/serve_bench.py --base-url http://127.0.0.1:8000 --concurrency 1,16,64,256 \
      --requests 256 --prompt-words 48 --max-tokens 32 --json out.json

Shared system prompt (the prefix cache): every prompt is the same `--shared-prefix-tokens`
token ids followed by `--user-tokens` ids of its own (token-id prompts, so the lengths are
exact); the table adds the prefix-cache hit rate of the level (from /metrics:
vllm:prefix_cache_hits / vllm:prefix_cache_queries) and the mean usage cached_tokens.

  python bench/serve_bench.py --concurrency 1,4 --requests 16 --shared-prefix-tokens 2000 \
      --user-tokens 24 --max-tokens 8
"""
import argparse
import asyncio
import json
import random
import statistics
import time
import urllib.request

from openai import AsyncOpenAI


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def one_request(client, model, prompt, max_tokens, stats):
    t0 = time.perf_counter()
    first = last = None
    itl = []
    n_out = 0
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, stream=True, temperature=0.0,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].text:
            if first is None:
                first = now
            else:
                itl.append(now - last)
            last = now
        if chunk.usage is not None:
            n_out = chunk.usage.completion_tokens
            details = getattr(chunk.usage, "prompt_tokens_details", None)
            stats["cached"] += (getattr(details, "cached_tokens", 0) or 0) if details else 0
    end = time.perf_counter()
    stats["ttft"].append((first or end) - t0)
    stats["itl"].extend(itl)
    stats["e2e"].append(end - t0)
    stats["out_tokens"] += n_out


def get(base_url, api_key, path):
    req = urllib.request.Request(base_url + path)
    if api_key:
        req.add_header("Authorization", "Bearer " + api_key)
    return urllib.request.urlopen(req).read().decode()


def prefix_counters(base_url, api_key):
    """(queries, hits) in tokens from /metrics; (0, 0) where the server has no such counters."""
    q = h = 0.0
    try:
        text = get(base_url, api_key, "/metrics")
    except Exception:
        return q, h
    for line in text.splitlines():
        if line.startswith("vllm:prefix_cache_queries"):
            q += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_hits"):
            h += float(line.rsplit(" ", 1)[1])
    return q, h


async def run_level(base_url, api_key, model, concurrency, n_requests, prompts, max_tokens):
    client = AsyncOpenAI(base_url=base_url + "/v1", api_key=api_key or "none", max_retries=0, timeout=600)
    stats = {"ttft": [], "itl": [], "e2e": [], "out_tokens": 0, "cached": 0}
    q0, h0 = prefix_counters(base_url, api_key)
    queue = list(range(n_requests))

    async def worker():
        while queue:
            i = queue.pop()
            await one_request(client, model, prompts[i % len(prompts)], max_tokens, stats)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    await client.close()
    q1, h1 = prefix_counters(base_url, api_key)
    return {
        "prefix_cache_hit_rate": (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0,
        "cached_tokens_mean": stats["cached"] / n_requests,
        "concurrency": concurrency, "requests": n_requests, "wall_s": wall,
        "output_tok_s": stats["out_tokens"] / wall, "req_s": n_requests / wall,
        "ttft_ms_p50": 1e3 * pct(stats["ttft"], 50), "ttft_ms_p99": 1e3 * pct(stats["ttft"], 99),
        "itl_ms_p50": 1e3 * pct(stats["itl"], 50), "itl_ms_p99": 1e3 * pct(stats["itl"], 99),
        "e2e_ms_p50": 1e3 * pct(stats["e2e"], 50),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default=None, help="default: the first model /v1/models lists")
    ap.add_argument("--concurrency", default="1,16,64,256")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--shared-prefix-tokens", type=int, default=0,
                    help="token-id prompts: this many ids shared by every prompt (a system prompt)")
    ap.add_argument("--user-tokens", type=int, default=24, help="with --shared-prefix-tokens: ids of each prompt's own")
    ap.add_argument("--id-range", type=int, default=1000, help="token ids drawn from [3, id-range)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    words = ["engine", "token", "prefill", "decode", "expert", "cache", "window", "ratio", "sparse",
             "hopper", "kernel", "batch", "stream", "latency", "throughput", "model", "the", "of", "and"]
    if a.shared_prefix_tokens > 0:
        shared = [rng.randrange(3, a.id_range) for _ in range(a.shared_prefix_tokens)]
        # Distinct user turns for every request: only the system prompt is shared.
        prompts = [shared + [rng.randrange(3, a.id_range) for _ in range(a.user_tokens)]
                   for _ in range(a.requests + 256)]
    else:
        prompts = [" ".join(rng.choice(words) for _ in range(a.prompt_words)) for _ in range(64)]
    model = a.model
    if model is None:
        model = json.loads(get(a.base_url, a.api_key, "/v1/models"))["data"][0]["id"]
    rows = []
    used = 0
    for c in [int(x) for x in a.concurrency.split(",")]:
        n = max(a.requests, c)
        # Each level its own user turns (a level must not hit the previous level's prompts).
        level_prompts = prompts[used:used + n] if a.shared_prefix_tokens > 0 else prompts
        used += n if a.shared_prefix_tokens > 0 else 0
        if a.shared_prefix_tokens > 0 and len(level_prompts) < n:
            level_prompts += [shared + [rng.randrange(3, a.id_range) for _ in range(a.user_tokens)]
                              for _ in range(n - len(level_prompts))]
        rows.append(asyncio.run(run_level(a.base_url, a.api_key, model, c, n, level_prompts, a.max_tokens)))
    print(f"{'conc':>5} {'req/s':>8} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} "
          f"{'e2e p50':>8} {'hit rate':>8} {'cached':>7}")
    for r in rows:
        print(f"{r['concurrency']:>5} {r['req_s']:>8.2f} {r['output_tok_s']:>10.1f} {r['ttft_ms_p50']:>9.1f} "
              f"{r['ttft_ms_p99']:>9.1f} {r['itl_ms_p50']:>8.1f} {r['itl_ms_p99']:>8.1f} {r['e2e_ms_p50']:>8.1f} "
              f"{r['prefix_cache_hit_rate']:>8.3f} {r['cached_tokens_mean']:>7.0f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": model, "prompt_words": a.prompt_words, "shared_prefix_tokens": a.shared_prefix_tokens,
                       "user_tokens": a.user_tokens, "max_tokens": a.max_tokens, "levels": rows}, f, indent=2)


if __name__ == "__main__":
    main()
