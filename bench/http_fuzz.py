"""Mutation fuzz of the HTTP API of a running `deepinfer-lab serve`.

Requests are generated from the OpenAI/vLLM request shapes (chat with tools, tool calls and
content parts; completions with text, token-id and batched prompts; structured output:
response_format, guided_*, structured_outputs, forced tool calls; tokenize; detokenize),
then mutated at three levels: the JSON value (fields dropped, retyped, extreme numbers,
unicode edge cases, nesting), the body bytes (flips, inserts, cuts) and the HTTP framing
(chunked bodies, wrong or missing Content-Length, odd headers, methods, paths, HTTP/1.0,
pipelining, half-close). Every answer must be 2xx or 4xx (501/505 only where the request asked
for an unsupported transfer coding or HTTP version), and the server must stay healthy. 499 is
what a half-closed HTTP/1.0 client gets for a generation: with no 1xx probe allowed, its EOF
means it has gone.

    python bench/http_fuzz.py --n 100000                 # starts the bundled model itself
    python bench/http_fuzz.py --port 8000 --n 5000       # against a running server
"""
import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORDS = ["hi", "Hello!", "weather in Paris?", "", " ", "\n", "<｜User｜>", "</think>", "<think>", "｜DSML｜",
         "<｜DSML｜tool_calls>", "你好", "🙂", "\u0000", "\ud7ff", "a" * 300, "{\"a\": 1}", "[1,2]", "\\", "\"",
         "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>"]
EXTREMES = [None, True, False, 0, -1, 1, 2, 0.5, -0.0, 1e308, -1e308, 2 ** 31, 2 ** 63, 2 ** 64 + 1, -2 ** 63,
            "", "x", [], {}, [None], {"": None}, "1", "NaN"]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}
# Structured output: the schemas the mutations start from (a mutated schema must be a 400 or
# compile, never a 5xx).
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 9},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["name"], "additionalProperties": False}
FORMATS = [{"type": "text"}, {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}]


def structured(r):
    return r.choice([{"response_format": r.choice(FORMATS)}, {"guided_json": SCHEMA}, {"guided_regex": "[a-c]{1,3}"},
                     {"guided_choice": ["yes", "no"]}, {"structured_outputs": {"json": SCHEMA}}])


def rand_text(r):
    return "".join(r.choice(WORDS) for _ in range(r.randrange(1, 4)))


def chat_body(r):
    msgs = []
    if r.random() < 0.3:
        msgs.append({"role": r.choice(["system", "developer"]), "content": rand_text(r)})
    msgs.append({"role": "user", "content": rand_text(r) if r.random() < 0.7 else
                 [{"type": "text", "text": rand_text(r)} for _ in range(r.randrange(1, 3))]})
    if r.random() < 0.3:
        call = {"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": rand_text(r)})}}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": "c1", "content": rand_text(r)}]
    if r.random() < 0.2:
        msgs.append({"role": "assistant", "content": rand_text(r), "reasoning_content": rand_text(r)})
        msgs.append({"role": "user", "content": rand_text(r)})
    b = {"model": "tiny-v4", "messages": msgs, "max_tokens": r.choice([1, 2, 4, None])}
    opt = {"temperature": r.choice([0, 0.7, 1.0]), "top_p": r.choice([0.5, 1.0]), "top_k": r.choice([0, 5]),
           "seed": r.randrange(1000), "n": r.choice([1, 2]), "stream": r.choice([True, False]),
           "stop": r.choice(["\n", ["a", "b"]]), "logprobs": True, "top_logprobs": r.choice([0, 2]),
           "tools": [TOOL], "tool_choice": r.choice(["auto", "none"]), "presence_penalty": 0.5,
           "frequency_penalty": -0.5, "repetition_penalty": 1.1, "min_p": 0.1, "logit_bias": {"5": -5},
           "stream_options": {"include_usage": True}, "chat_template_kwargs": {"thinking": r.choice([True, False])},
           "reasoning_effort": r.choice(["low", "high", "max"]), "thinking": {"type": "enabled"},
           "min_tokens": 1, "ignore_eos": r.choice([True, False]), "skip_special_tokens": False,
           "include_stop_str_in_output": True, "response_format": {"type": "text"}, "user": "u",
           "stop_token_ids": [7], "max_completion_tokens": 2, "request_id": "r%d" % r.randrange(99)}
    for k in r.sample(sorted(opt), r.randrange(0, 6)):
        b[k] = opt[k]
    if r.random() < 0.25:
        b.update(structured(r))
    if r.random() < 0.1:
        b.update(tools=[TOOL], tool_choice=r.choice(["required", {"type": "function", "function": {"name": "get_weather"}}]),
                 parallel_tool_calls=r.choice([True, False]))
    if b.get("logprobs") is not True:
        b.pop("top_logprobs", None)
    return "/v1/chat/completions", b


def completion_body(r):
    prompt = r.choice([rand_text(r), [rand_text(r), rand_text(r)], [0, 5, 6, 7], [[0, 1], [2, 3]]])
    b = {"model": "tiny-v4", "prompt": prompt, "max_tokens": r.choice([1, 2, 3])}
    opt = {"echo": True, "logprobs": r.choice([0, 2]), "n": 2, "stream": True, "stop": ["x"], "seed": 3,
           "temperature": 0, "truncate_prompt_tokens": 2, "allowed_token_ids": [3, 4, 5], "add_special_tokens": False,
           "best_of": 1, "suffix": ""}
    for k in r.sample(sorted(opt), r.randrange(0, 4)):
        b[k] = opt[k]
    if r.random() < 0.25:
        b.update(structured(r))
    if b.get("echo") and "logprobs" in b:
        b.pop("logprobs")
    return "/v1/completions", b


def tokenize_body(r):
    if r.random() < 0.5:
        return "/tokenize", {"prompt": rand_text(r), "add_special_tokens": r.choice([True, False]),
                             "return_token_strs": r.choice([True, False])}
    return "/tokenize", {"messages": chat_body(r)[1]["messages"], "tools": [TOOL]}


def detokenize_body(r):
    return "/detokenize", {"tokens": [r.randrange(0, 1024) for _ in range(r.randrange(0, 8))]}


SHAPES = [chat_body, chat_body, completion_body, tokenize_body, detokenize_body]


def mutate_value(r, v, depth=0):
    """One random change somewhere inside a JSON value."""
    if isinstance(v, dict) and v and depth < 6 and r.random() < 0.7:
        k = r.choice(sorted(v, key=str))
        v = dict(v)
        roll = r.random()
        if roll < 0.15:
            del v[k]
        elif roll < 0.25:
            v[rand_text(r)] = r.choice(EXTREMES)
        else:
            v[k] = mutate_value(r, v[k], depth + 1)
        return v
    if isinstance(v, list) and v and depth < 6 and r.random() < 0.7:
        v = list(v)
        i = r.randrange(len(v))
        roll = r.random()
        if roll < 0.15:
            del v[i]
        elif roll < 0.3:
            v.insert(i, r.choice(EXTREMES))
        else:
            v[i] = mutate_value(r, v[i], depth + 1)
        return v
    roll = r.random()
    if roll < 0.5:
        return r.choice(EXTREMES)
    if roll < 0.7:
        return rand_text(r)
    if roll < 0.8:
        return [v]
    if roll < 0.9:
        return {"x": v}
    return r.randint(-2 ** 70, 2 ** 70)


def mutate_bytes(r, b):
    b = bytearray(b)
    for _ in range(r.randrange(1, 4)):
        if not b:
            break
        roll = r.random()
        i = r.randrange(len(b))
        if roll < 0.3:
            b[i] ^= 1 << r.randrange(8)
        elif roll < 0.5:
            b[i:i] = bytes([r.randrange(256)])
        elif roll < 0.7:
            del b[i]
        elif roll < 0.8:
            b = b[:i]
        else:
            b[i:i] = r.choice([b"\\ud800", b"\xff", b"\xc3", b'"', b"{", b"[", b"1e999", b"\\u0000"])
    return bytes(b)


def make_request(r):
    """Returns (raw bytes, half_close, expects_protocol_5xx, n_requests)."""
    path, body = r.choice(SHAPES)(r)
    if r.random() < 0.7:
        body = mutate_value(r, body)
    data = json.dumps(body, ensure_ascii=r.random() < 0.5).encode()
    if r.random() < 0.25:
        data = mutate_bytes(r, data)
    method = "POST" if r.random() < 0.95 else r.choice(["GET", "PUT", "DELETE", "HEAD", "OPTIONS", "P0ST"])
    if r.random() < 0.05:
        path = r.choice(["/v1/chat/completions/", "/v1/models", "/health", "/metrics", "/%00", "/v1/../tokenize",
                         path + "?x=1", "http://h" + path, "*"])
    version = "1.1" if r.random() < 0.9 else "1.0"
    headers = [("Host", "x")] if version == "1.1" or r.random() < 0.5 else []
    headers.append(("Content-Type", r.choice(["application/json"] * 8 + ["text/plain", "", "application/json; x"])))
    half_close = r.random() < 0.3
    framing = r.random()
    if framing < 0.75 or version == "1.0":
        headers.append(("Content-Length", str(len(data))))
        payload = data
    elif framing < 0.9:
        headers.append(("Transfer-Encoding", "chunked"))
        payload = b""
        i = 0
        while i < len(data):
            n = r.randrange(1, 64)
            payload += b"%x\r\n" % len(data[i:i + n]) + data[i:i + n] + b"\r\n"
            i += n
        payload += b"0\r\n\r\n"
    else:
        # Framing a server must reject or wait on: wrong lengths are sent with a half-close so
        # the answer comes at once instead of at the request deadline.
        kind = r.choice(["short", "neg", "junk", "both", "te"])
        half_close = True
        if kind == "short":
            headers.append(("Content-Length", str(len(data) + r.randrange(1, 50))))
        elif kind == "neg":
            headers.append(("Content-Length", "-" + str(len(data))))
        elif kind == "junk":
            headers.append(("Content-Length", r.choice(["abc", "1 2", "0x10", "", "+5", "99999999999999999999"])))
        elif kind == "both":
            headers += [("Content-Length", str(len(data))), ("Transfer-Encoding", "chunked")]
        else:
            headers.append(("Transfer-Encoding", r.choice(["gzip", "identity", "chunked, gzip", "x"])))
        payload = data
    if r.random() < 0.05:
        headers.append((r.choice(["X-Data-Parallel-Rank", "Expect", "Connection", "Authorization", "X-Request-Id"]),
                        r.choice(["0", "1", "-1", "100-continue", "close", "Bearer x", "zz"])))
    head = f"{method} {path} HTTP/{version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    raw = head.encode() + payload
    if r.random() < 0.1:
        raw = mutate_bytes(r, raw)
        half_close = True  # the framing may now promise more bytes than it has
    protocol_5xx = bool(re.search(rb"^[^\r\n]* HTTP/[02-9]\.", raw)) or bool(
        re.search(rb"(?im)^transfer-encoding:(?![ \t]*chunked[ \t]*\r?$)", raw))
    n = 1
    if r.random() < 0.1 and version == "1.1" and not half_close:
        raw += b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"  # pipelined after it
        n = 2
    return raw, half_close, protocol_5xx, n


def read_responses(sock, n, deadline, head_request=False):
    """Statuses of up to n responses (1xx skipped); stops at EOF."""
    buf = b""
    out = []

    def fill():
        nonlocal buf
        sock.settimeout(max(0.1, deadline - time.time()))
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError
        buf += chunk

    try:
        while len(out) < n:
            while b"\r\n\r\n" not in buf:
                fill()
            head, buf = buf.split(b"\r\n\r\n", 1)
            lines = head.split(b"\r\n")
            status = int(lines[0].split(b" ")[1])
            if 100 <= status < 200:
                continue
            hdrs = {}
            for line in lines[1:]:
                k, _, v = line.partition(b":")
                hdrs[k.strip().lower()] = v.strip()
            out.append(status)
            if head_request and len(out) == 1:
                continue  # no body after a HEAD response's headers
            if hdrs.get(b"transfer-encoding", b"").lower() == b"chunked":
                while True:
                    while b"\r\n" not in buf:
                        fill()
                    size_line, buf = buf.split(b"\r\n", 1)
                    size = int(size_line.split(b";")[0], 16)
                    while len(buf) < size + 2:
                        fill()
                    buf = buf[size + 2:]
                    if size == 0:
                        break
            elif b"content-length" in hdrs:
                size = int(hdrs[b"content-length"])
                while len(buf) < size:
                    fill()
                buf = buf[size:]
            else:
                while True:
                    fill()
    except (EOFError, ConnectionResetError):
        pass
    return out


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.status = {}
        self.bad = []
        self.protocol_5xx = 0
        self.no_answer = 0
        self.silent = []

    def add(self, statuses, expected, raw, protocol_5xx):
        with self.lock:
            for s in statuses:
                self.status[s] = self.status.get(s, 0) + 1
                if s >= 500:
                    if protocol_5xx and s in (501, 505):
                        self.protocol_5xx += 1
                    else:
                        self.bad.append((s, raw[:400]))
            if not statuses and raw.strip():  # a mutation that left no bytes requests nothing
                self.no_answer += 1
                self.silent.append(raw[:300])


def worker(port, seed, count, stats, timeout):
    r = random.Random(seed)
    for _ in range(count):
        raw, half_close, protocol_5xx, n = make_request(r)
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        except OSError as e:
            stats.bad.append(("connect", repr(e).encode()))
            return
        try:
            s.sendall(raw)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            got = read_responses(s, n, time.time() + timeout, raw.startswith(b"HEAD "))
        except OSError:
            got = []
        finally:
            s.close()
        stats.add(got, n, raw, protocol_5xx)


def http_get(port, path):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body.decode(errors="replace")


def run(port, n, seed=1, threads=4, timeout=30, log=print):
    stats = Stats()
    t0 = time.time()
    per = n // threads
    ws = [threading.Thread(target=worker, args=(port, seed * 1000 + i, per, stats, timeout)) for i in range(threads)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    elapsed = time.time() - t0
    health, _ = http_get(port, "/health")
    _, metrics = http_get(port, "/metrics")
    m = {}
    for line in metrics.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            m[re.sub(r"\{.*\}", "", k)] = m.get(re.sub(r"\{.*\}", "", k), float(v))
    answered = sum(stats.status.values())
    log(f"{per * threads} requests in {elapsed:.1f} s ({per * threads / elapsed:.0f}/s), {answered} answers: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(stats.status.items()))
        + f"; protocol 501/505: {stats.protocol_5xx}; connections closed without an answer: {stats.no_answer}; "
          f"/health {health}; running {m.get('vllm:num_requests_running')}, in flight "
          f"{m.get('dil:requests_in_flight')}, KV blocks used {m.get('dil:kv_blocks_used')}")
    return stats, health, m


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--port", type=int, default=0, help="a running server (default: start the bundled model)")
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "deepinfer-lab"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=4)
    a = ap.parse_args()
    proc = None
    port = a.port
    if not port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([a.bin, "serve", "--port", str(port), "--max-model-len", "64"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
        for _ in range(600):
            try:
                if http_get(port, "/health")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
    try:
        stats, health, m = run(port, a.n, a.seed, a.threads)
        ok = not stats.bad and health == 200 and m.get("vllm:num_requests_running") == 0
        for s, raw in stats.bad[:10]:
            print("BAD", s, raw)
        if proc and proc.poll() is not None:
            print("the server died with status", proc.returncode)
            ok = False
        return 0 if ok else 1
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    sys.exit(main())
