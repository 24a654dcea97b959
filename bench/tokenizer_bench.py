"""Tokenizer encode throughput: deepinfer-lab vs HF `tokenizers`, single-threaded, one run.

Usage: .venv/bin/python bench/tokenizer_bench.py [--mb 10] [--tokenizer PATH] [--bin build/deepinfer-lab]
Generates >= 10 MB of mixed text (tests/python/tokenizer_corpus.py: prose, code, CJK, kana,
Hangul, Arabic, Devanagari, Thai, Cyrillic/Greek, emoji, numbers, CRLF), encodes every document
with both (same documents, same order, loading excluded, each engine starts with a cold word
cache), checks the token counts agree and prints MB/s and the ratio.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before importing tokenizers: single-threaded HF
os.environ["TOKENIZERS_PARALLELISM"] = "false"
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
from tokenizer_corpus import mixed_text  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=10.0)
    ap.add_argument("--tokenizer", default=str(ROOT / "tests/data/deepseek-v3-tokenizer/tokenizer.json"))
    ap.add_argument("--bin", default=str(ROOT / "build/deepinfer-lab"))
    a = ap.parse_args()
    docs = mixed_text(int(a.mb * 1e6))
    n_bytes = sum(len(d.encode()) for d in docs)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
        path = f.name
    try:
        hf = Tokenizer.from_file(a.tokenizer)
        t0, c0 = time.perf_counter(), time.thread_time()
        hf_tokens = sum(len(hf.encode(d).ids) for d in docs)
        hf_s, hf_cpu = time.perf_counter() - t0, time.thread_time() - c0
        out = subprocess.run([a.bin, "tokenize", "--tokenizer", a.tokenizer, "--bench", path],
                             capture_output=True, text=True, check=True)
        ours = json.loads(out.stdout)
    finally:
        os.unlink(path)
    assert ours["bytes"] == n_bytes, (ours, n_bytes)
    assert ours["tokens"] == hf_tokens, f"token counts differ: ours {ours['tokens']} hf {hf_tokens}"
    mb = n_bytes / 1e6
    # Throughput from CPU time of the encoding thread (robust on a shared machine); wall too.
    r = {"documents": len(docs), "megabytes": round(mb, 2), "tokens": hf_tokens,
         "hf_cpu_seconds": round(hf_cpu, 3), "hf_wall_seconds": round(hf_s, 3), "hf_mb_per_cpu_s": round(mb / hf_cpu, 2),
         "ours_cpu_seconds": round(ours["cpu_seconds"], 3), "ours_wall_seconds": round(ours["seconds"], 3),
         "ours_mb_per_cpu_s": round(mb / ours["cpu_seconds"], 2),
         "speedup_vs_hf_cpu": round(hf_cpu / ours["cpu_seconds"], 2), "speedup_vs_hf_wall": round(hf_s / ours["seconds"], 2)}
    print(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
