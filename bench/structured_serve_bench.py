"""Structured output through the server: the same chat requests with and without a JSON
schema (guided_json, so the prompts are equal), then the engine's mask counters from /metrics:
how long masks took and how much of that the engine waited for after its forward.

    DIL_BIN=build/deepinfer-lab .venv/bin/python bench/structured_serve_bench.py [--requests 32] [--max-tokens 128]

Starts its own server (the bundled tiny model on the CPU unless --model is given)."""
import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from server_harness import ServerProcess  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default=None)
    a = ap.parse_args()
    flags = ["--max-num-seqs", str(a.concurrency)] + (["--model", a.model] if a.model else [])
    s = ServerProcess(*flags)
    try:
        def one(i, constrained):
            body = {"model": os.path.basename(a.model or "tiny-v4"), "max_tokens": a.max_tokens, "temperature": 1.0,
                    "seed": i, "messages": [{"role": "user", "content": "Reply in JSON."}], "ignore_eos": True}
            if constrained:
                body["guided_json"] = SCHEMA
                body["ignore_eos"] = False
            r = httpx.post(s.base + "/v1/chat/completions", json=body, timeout=900)
            r.raise_for_status()
            return r.json()["usage"]["completion_tokens"]

        for constrained in (False, True):
            before = s.metrics()
            t = time.time()
            with ThreadPoolExecutor(a.concurrency) as pool:
                tokens = sum(pool.map(lambda i: one(i, constrained), range(a.requests)))
            dt = time.time() - t
            after = s.metrics()
            steps = after["dil:engine_steps_total"] - before["dil:engine_steps_total"]
            mask = after["dil:structured_output_mask_seconds_total"] - before["dil:structured_output_mask_seconds_total"]
            wait = after["dil:structured_output_wait_seconds_total"] - before["dil:structured_output_wait_seconds_total"]
            print(f"{'guided_json' if constrained else 'free text  '}: {a.requests} requests, {tokens} tokens in "
                  f"{dt:.1f} s ({tokens / dt:.0f} tok/s), {steps:.0f} engine steps, masks {mask * 1e3:.1f} ms, "
                  f"waited {wait * 1e3:.2f} ms")
    finally:
        s.stop()


if __name__ == "__main__":
    main()
