#!/usr/bin/env python3
"""The peer of tests/cuda CudaIndexerFastBench.DISABLED_TopkRows: torch.topk (fp32, k = 512,
sorted) on 4,096 rows x {32K, 64K, 256K} uniform(-1, 1) scores on the GPU, timed with CUDA
events (median of 10 after 2 warm-ups), printed as the same BENCH lines so scripts/gpu-check
puts both in one table. Needs torch with CUDA; prints a note and exits 0 without it.

  python3 bench/topk_peer.py [--rows 32768,65536,262144] [--queries 4096] [--k 512]
"""
import argparse
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="32768,65536,262144")
    ap.add_argument("--queries", type=int, default=4096)
    ap.add_argument("--k", type=int, default=512)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("topk_peer: torch is not installed, no peer timing")
        return 0
    if not torch.cuda.is_available():
        print("topk_peer: no CUDA device visible to torch, no peer timing")
        return 0
    for n in (int(r) for r in args.rows.split(",")):
        x = torch.rand(args.queries, n, device="cuda", dtype=torch.float32) * 2 - 1
        for _ in range(2):
            torch.topk(x, args.k, dim=1, sorted=True)
        ms = []
        for _ in range(args.reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.topk(x, args.k, dim=1, sorted=True)
            b.record()
            torch.cuda.synchronize()
            ms.append(a.elapsed_time(b))
        ms.sort()
        t = ms[len(ms) // 2]
        shape = f"{args.queries} x {n}"
        gbps = 4.0 * args.queries * n / t * 1e-6
        print(f"BENCH | {'torch.topk k' + str(args.k):<26} | {shape:<34} | {t:9.3f} ms | {0.0:8.2f} TFLOP/s | "
              f"{gbps:8.1f} GB/s | peer (x5 target: {t / 5:.3f} ms)")
        sys.stdout.flush()
        del x
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
