#!/usr/bin/env python3
"""Soak test of a data-parallel server (`deepinfer-lab serve --dp N --ep N`). Python stdlib
only (it runs on GPU machines without the repo's venv).

Runs mixed load in phases, over and over until --duration: every rank busy (pinned and
unpinned requests); only one rank busy while the others idle (X-Data-Parallel-Rank pinning),
for each rank in turn; bursts of short and long prompts; streaming and non-streaming;
clients that disconnect mid-stream; idle gaps. Every request is greedy with ignore_eos, so it
must finish with 200, finish_reason "length" and exactly max_tokens tokens, and the same
(prompt, max_tokens) must give the same text whichever rank ran it. /health is polled all
along. Prints one JSON line (requests, errors, tokens, latencies, per-rank counts, the
longest stall between two stream chunks) and exits 1 on any failure or a stall over
--max-stall seconds.

    python3 bench/dp_soak.py --base-url http://127.0.0.1:8000 --duration 600 --ranks 2
"""
import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

MAX_TOKENS = (4, 16, 48)


class Soak:
    def __init__(self, args):
        self.args = args
        u = urllib.parse.urlparse(args.base_url)
        self.host, self.port = u.hostname, u.port or 80
        self.lock = threading.Lock()
        self.requests = 0
        self.ok = 0
        self.errors = []          # first few error strings
        self.n_errors = 0
        self.tokens = 0
        self.max_latency = 0.0
        self.longest_stall = 0.0
        self.disconnects = 0
        self.per_rank = {}        # "0".."N-1" pinned, "auto" unpinned
        self.outputs = {}         # (prompt index, max_tokens) -> text
        self.mismatches = 0
        self.health_checks = 0
        self.health_failures = 0
        self.last_progress = time.monotonic()
        self.in_flight = 0
        self.stop = threading.Event()
        rng = random.Random(args.seed)
        # Short (3-12 tokens) and long (150-400 tokens) prompts of token ids below 1000.
        self.prompts = [[rng.randrange(2, 1000) for _ in range(rng.randrange(3, 13))] for _ in range(6)]
        self.prompts += [[rng.randrange(2, 1000) for _ in range(rng.randrange(150, 401))] for _ in range(3)]
        self.model = args.model or self.get_model()

    # ------------------------------------------------------------------ HTTP
    def conn(self, timeout):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get_model(self):
        c = self.conn(30)
        c.request("GET", "/v1/models")
        r = c.getresponse()
        body = json.loads(r.read())
        c.close()
        return body["data"][0]["id"]

    def error(self, what):
        with self.lock:
            self.n_errors += 1
            if len(self.errors) < 10:
                self.errors.append(what)

    def record(self, key, rank, text, n_tokens, latency):
        with self.lock:
            self.ok += 1
            self.tokens += n_tokens
            self.max_latency = max(self.max_latency, latency)
            self.per_rank[rank] = self.per_rank.get(rank, 0) + 1
            self.last_progress = time.monotonic()
            prev = self.outputs.setdefault(key, text)
            if prev != text:
                self.mismatches += 1
                if len(self.errors) < 10:
                    self.errors.append(f"prompt {key[0]} max_tokens {key[1]} on rank {rank}: "
                                       f"{text!r} != {prev!r}")

    def one(self, p, max_tokens, rank=None, stream=False, disconnect_after=None):
        """One completion; rank None = unpinned. disconnect_after: close after that many chunks."""
        body = {"model": self.model, "prompt": self.prompts[p], "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        headers = {"Content-Type": "application/json"}
        if rank is not None:
            headers["X-Data-Parallel-Rank"] = str(rank)
        label = "auto" if rank is None else str(rank)
        with self.lock:
            self.requests += 1
            self.in_flight += 1
        t0 = time.monotonic()
        c = self.conn(self.args.max_stall + 30)
        try:
            c.request("POST", "/v1/completions", json.dumps(body), headers)
            r = c.getresponse()
            if r.status != 200:
                self.error(f"HTTP {r.status} on rank {label}: {r.read()[:300]!r}")
                return
            if not stream:
                d = json.loads(r.read())
                ch = d["choices"][0]
                n = d["usage"]["completion_tokens"]
                if n != max_tokens or ch["finish_reason"] != "length":
                    self.error(f"rank {label}: {n} tokens, finish {ch['finish_reason']} (want {max_tokens}, length)")
                    return
                self.record((p, max_tokens), label, ch["text"], n, time.monotonic() - t0)
                return
            text, usage, finish, chunks = "", None, None, 0
            last = time.monotonic()
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                now = time.monotonic()
                with self.lock:
                    self.longest_stall = max(self.longest_stall, now - last)
                last = now
                data = line[6:]
                if data == b"[DONE]":
                    break
                d = json.loads(data)
                if "error" in d:
                    self.error(f"stream error on rank {label}: {d['error']}")
                    return
                if d.get("usage"):
                    usage = d["usage"]
                for ch in d.get("choices", []):
                    text += ch.get("text") or ""
                    if ch.get("finish_reason"):
                        finish = ch["finish_reason"]
                chunks += 1
                if disconnect_after is not None and chunks >= disconnect_after:
                    with self.lock:
                        self.disconnects += 1
                        self.last_progress = time.monotonic()
                    return  # the finally closes the socket mid-stream
            n = usage["completion_tokens"] if usage else -1
            if n != max_tokens or finish != "length":
                self.error(f"stream on rank {label}: {n} tokens, finish {finish} (want {max_tokens}, length)")
                return
            self.record((p, max_tokens), label, text, n, time.monotonic() - t0)
        except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
            self.error(f"rank {label}: {type(e).__name__}: {e}")
        finally:
            c.close()
            with self.lock:
                self.in_flight -= 1

    def health(self):
        while not self.stop.wait(1.0):
            try:
                c = self.conn(10)
                c.request("GET", "/health")
                st = c.getresponse().status
                c.close()
            except (OSError, http.client.HTTPException) as e:
                st = str(e)
            with self.lock:
                self.health_checks += 1
                if st != 200:
                    self.health_failures += 1
                    if len(self.errors) < 10:
                        self.errors.append(f"/health: {st}")
                stalled = self.in_flight > 0 and time.monotonic() - self.last_progress > self.args.max_stall
                if stalled:
                    self.longest_stall = max(self.longest_stall, time.monotonic() - self.last_progress)
            if stalled:
                self.error(f"no request finished for {self.args.max_stall} s with {self.in_flight} in flight")
                self.stop.set()

    # ------------------------------------------------------------------ phases
    def clients(self, n, until, pick):
        """n client threads sending pick(rng) -> kwargs of one() until `until`."""
        def run(i):
            rng = random.Random(self.args.seed * 1000 + i + int(until))
            while time.monotonic() < until and not self.stop.is_set():
                self.one(**pick(rng))
        ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    def phase(self, name, seconds):
        until = time.monotonic() + seconds
        n, ranks = self.args.concurrency, self.args.ranks
        short = list(range(6))
        if name == "all":
            self.clients(n, until, lambda g: dict(p=g.randrange(len(self.prompts)), max_tokens=g.choice(MAX_TOKENS),
                                                  rank=g.choice([None] + list(range(ranks))),
                                                  stream=g.random() < 0.5))
        elif name.startswith("rank"):
            r = int(name[4:])
            self.clients(n, until, lambda g: dict(p=g.choice(short), max_tokens=g.choice(MAX_TOKENS), rank=r,
                                                  stream=g.random() < 0.5))
        elif name == "burst":
            while time.monotonic() < until and not self.stop.is_set():
                ts = [threading.Thread(target=self.one, kwargs=dict(p=i % len(self.prompts),
                                                                    max_tokens=MAX_TOKENS[i % 2], stream=i % 3 == 0),
                                       daemon=True) for i in range(4 * n)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
        elif name == "disconnect":
            self.clients(n, until, lambda g: dict(p=g.choice(short), max_tokens=48,
                                                  rank=g.choice([None] + list(range(ranks))), stream=True,
                                                  disconnect_after=g.choice([None, 1, 3])))
        elif name == "idle":
            self.stop.wait(seconds)

    def run(self):
        hc = threading.Thread(target=self.health, daemon=True)
        hc.start()
        names = ["all"] + [f"rank{r}" for r in range(self.args.ranks)] + ["burst", "disconnect", "idle"]
        t_end = time.monotonic() + self.args.duration
        phase_s = max(1.0, min(30.0, self.args.duration / (2 * len(names))))
        i = 0
        t0 = time.monotonic()
        while time.monotonic() < t_end and not self.stop.is_set():
            name = names[i % len(names)]
            self.phase(name, min(phase_s if name != "idle" else phase_s / 2, max(0.0, t_end - time.monotonic())))
            i += 1
        self.stop.set()
        hc.join()
        summary = {
            "requests": self.requests, "ok": self.ok, "errors": self.n_errors, "mismatches": self.mismatches,
            "tokens": self.tokens, "disconnects": self.disconnects,
            "max_latency_s": round(self.max_latency, 3), "longest_stall_s": round(self.longest_stall, 3),
            "per_rank": dict(sorted(self.per_rank.items())), "distinct_outputs": len(self.outputs),
            "health_checks": self.health_checks, "health_failures": self.health_failures,
            "phases": i, "duration_s": round(time.monotonic() - t0, 1),
        }
        if self.errors:
            summary["first_errors"] = self.errors
        print(json.dumps(summary), flush=True)
        failed = (self.n_errors or self.mismatches or self.health_failures or self.ok == 0
                  or self.longest_stall > self.args.max_stall)
        return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--duration", type=float, default=60, help="seconds of load")
    ap.add_argument("--ranks", type=int, default=2, help="data-parallel ranks of the server")
    ap.add_argument("--concurrency", type=int, default=4, help="client threads per phase")
    ap.add_argument("--model", default="", help="model name (default: the server's first)")
    ap.add_argument("--max-stall", type=float, default=30, help="fail when no progress for this long")
    ap.add_argument("--seed", type=int, default=1)
    sys.exit(Soak(ap.parse_args()).run())


if __name__ == "__main__":
    main()
