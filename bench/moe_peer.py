"""Peers of the routed-expert benchmark (tests/cuda/test_bench_moe.cpp), same shapes, same job.

For each shape (experts E, rows per expert, model dims D, I): the three expert GEMMs of every
expert (w1 and w3 fused as one [2I, D] weight, then w2 [D, I]) with FP8 e4m3 operands (weights
FP8 here: the peers have no FP4 path on Hopper) and row-wise scales,
  - torch._scaled_grouped_mm (one grouped GEMM per weight), and
  - cuBLASLt FP8 through torch._scaled_mm, one dense GEMM of all E * rows rows per weight (the
    dense ceiling of the same FLOPs: no grouping at all).
FLOPs counted as the benchmark counts them: 2 * rows * 3 * D * I. Prints BENCH lines like the
C++ benchmarks; any failure prints the reason instead of a number.
    python3 bench/moe_peer.py
"""
import sys

SHAPES = [  # what, D, I, E, rows per expert
    ("v41 E96 x 256 (EP4)", 5120, 2304, 96, 256),
    ("v41 E384 x 64 (EP1)", 5120, 2304, 384, 64),
    ("v4 E96 x 256", 4096, 2048, 96, 256),
    ("v4 E128 x 192 (EP2)", 4096, 2048, 128, 192),
    ("v4 E256 x 96 (EP1)", 4096, 2048, 256, 96),
    ("v4 E256 x 32", 4096, 2048, 256, 32),
]


def timed(torch, fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    times.sort()
    return times[len(times) // 2]


def main():
    try:
        import torch
    except ImportError as e:
        print(f"BENCH | moe peers | torch unavailable: {e}")
        return 0
    if not torch.cuda.is_available():
        print("BENCH | moe peers | no CUDA device")
        return 0
    dev = "cuda"
    f8 = torch.float8_e4m3fn
    for what, D, I, E, per in SHAPES:
        M = E * per
        flops = 2.0 * M * 3 * D * I
        g = torch.Generator(device=dev).manual_seed(17)
        x = (torch.randn(M, D, device=dev, generator=g) * 2).to(f8)
        h = torch.randn(M, I, device=dev, generator=g).to(f8)
        w13 = (torch.randn(E, 2 * I, D, device=dev, generator=g)).to(f8)
        w2 = (torch.randn(E, D, I, device=dev, generator=g)).to(f8)
        offs = torch.arange(per, M + 1, per, device=dev, dtype=torch.int32)
        sx = torch.rand(M, device=dev, generator=g) + 0.5
        sh = torch.rand(M, device=dev, generator=g) + 0.5
        s13 = torch.rand(E, 2 * I, device=dev, generator=g) + 0.5
        s2 = torch.rand(E, D, device=dev, generator=g) + 0.5
        try:
            def grouped():
                torch._scaled_grouped_mm(x, w13.transpose(-2, -1), sx, s13, offs=offs, out_dtype=torch.bfloat16)
                torch._scaled_grouped_mm(h, w2.transpose(-2, -1), sh, s2, offs=offs, out_dtype=torch.bfloat16)
            ms = timed(torch, grouped)
            print(f"BENCH | peer _scaled_grouped_mm fp8 | {what:34s} | {ms:9.3f} ms | {flops / ms * 1e-9:8.1f} TFLOP/s |")
        except Exception as e:  # noqa: BLE001 - report, never hide
            print(f"BENCH | peer _scaled_grouped_mm fp8 | {what:34s} | failed: {type(e).__name__}: {str(e)[:160]}")
        try:
            d13 = w13[0].contiguous()
            d2 = w2[0].contiguous()
            one = torch.ones((), device=dev)
            def dense():
                torch._scaled_mm(x, d13.t(), one, one, out_dtype=torch.bfloat16)
                torch._scaled_mm(h, d2.t(), one, one, out_dtype=torch.bfloat16)
            ms = timed(torch, dense)
            print(f"BENCH | peer cuBLASLt fp8 dense      | {what:34s} | {ms:9.3f} ms | {flops / ms * 1e-9:8.1f} TFLOP/s |")
        except Exception as e:  # noqa: BLE001
            print(f"BENCH | peer cuBLASLt fp8 dense      | {what:34s} | failed: {type(e).__name__}: {str(e)[:160]}")
        del x, h, w13, w2
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
