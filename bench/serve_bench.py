#!/usr/bin/env python3
"""Serving benchmark against a running `deepinfer-lab serve` (or any OpenAI-compatible server).

For each concurrency level, `concurrency` clients send streaming /v1/completions requests
back to back until `requests` have completed, and the script reports TTFT (time to the first
content chunk), ITL (time between content chunks), end-to-end latency and output throughput,
as a table and as JSON. The request shape follows `vllm bench serve` (stream, include_usage,
ignore_eos, fixed max_tokens), so numbers are comparable with peers' published runs.

  python bench/serve_bench.py --base-url http://127.0.0.1:8000 --concurrency 1,16,64,256 \
      --requests 256 --prompt-tokens 64 --max-tokens 32 --json out.json
"""
import argparse
import asyncio
import json
import random
import statistics
import time

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
    end = time.perf_counter()
    stats["ttft"].append((first or end) - t0)
    stats["itl"].extend(itl)
    stats["e2e"].append(end - t0)
    stats["out_tokens"] += n_out


async def run_level(base_url, api_key, model, concurrency, n_requests, prompts, max_tokens):
    client = AsyncOpenAI(base_url=base_url + "/v1", api_key=api_key or "none", max_retries=0, timeout=600)
    stats = {"ttft": [], "itl": [], "e2e": [], "out_tokens": 0}
    queue = list(range(n_requests))

    async def worker():
        while queue:
            i = queue.pop()
            await one_request(client, model, prompts[i % len(prompts)], max_tokens, stats)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    await client.close()
    return {
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
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    words = ["engine", "token", "prefill", "decode", "expert", "cache", "window", "ratio", "sparse",
             "hopper", "kernel", "batch", "stream", "latency", "throughput", "model", "the", "of", "and"]
    prompts = [" ".join(rng.choice(words) for _ in range(a.prompt_words)) for _ in range(64)]
    model = a.model
    if model is None:
        import urllib.request
        req = urllib.request.Request(a.base_url + "/v1/models")
        if a.api_key:
            req.add_header("Authorization", "Bearer " + a.api_key)
        model = json.load(urllib.request.urlopen(req))["data"][0]["id"]
    rows = []
    for c in [int(x) for x in a.concurrency.split(",")]:
        rows.append(asyncio.run(run_level(a.base_url, a.api_key, model, c, max(a.requests, c), prompts, a.max_tokens)))
    print(f"{'conc':>5} {'req/s':>8} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'e2e p50':>8}")
    for r in rows:
        print(f"{r['concurrency']:>5} {r['req_s']:>8.2f} {r['output_tok_s']:>10.1f} {r['ttft_ms_p50']:>9.1f} "
              f"{r['ttft_ms_p99']:>9.1f} {r['itl_ms_p50']:>8.1f} {r['itl_ms_p99']:>8.1f} {r['e2e_ms_p50']:>8.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": model, "prompt_words": a.prompt_words, "max_tokens": a.max_tokens, "levels": rows}, f, indent=2)


if __name__ == "__main__":
    main()
