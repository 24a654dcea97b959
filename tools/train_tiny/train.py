# Trains the tiny V4 / V4.1 architectures on real text and exports them in the official
# checkpoint format (tests/data/v4-trained, tests/data/v41-trained; see their READMEs).
#
#   python3 train.py verify --fixture tests/data/v4-tiny            # float64 forward vs reference.safetensors
#   python3 train.py train --fixture tests/data/v4-tiny --tokenizer models/tiny-v4/tokenizer.json \
#       --train-text train.txt --heldout heldout.txt --out OUT [--steps N | --seconds S] [--device cuda]
#   python3 train.py eval --model tests/data/v4-trained                # float64 held-out perplexity
#
# --fixture names the random fixture whose architecture (config.json) and storage (tensor
# names, dtypes, shapes of model.safetensors) the trained model takes over unchanged.
import argparse
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint as ck  # noqa: E402
import tiny_model as tm  # noqa: E402
from engram_hash import EngramHash  # noqa: E402

WINDOW = 512  # training and evaluation sequence length: CSA keys 128, HCA rows 4, V4.1 ratio-1 rows 512


def block_of(cfg):
    return cfg.raw["quantization_config"]["weight_block_size"][0]


def tokenizer_of(fixture, explicit=None):
    if explicit:
        return explicit
    p = os.path.join(fixture, "tokenizer.json")
    return p if os.path.exists(p) else None


def to_torch(params, dtype, device):
    return {k: torch.tensor(v, dtype=torch.int64 if v.dtype.kind == "i" else dtype, device=device)
            for k, v in params.items()}


def make_ctx(cfg, ids, eh, dtype, device, indexer_loss=False):
    rows = {}
    if cfg.v41:
        for li, L in enumerate(eh.layers):
            rows[L] = torch.tensor(eh.rows(li, ids.cpu().numpy()), device=device)
    return tm.Ctx(cfg, ids.shape[1], dtype, device, rows, indexer_loss)


def nll(P, cfg, ids, eh, dtype, device):
    """Summed next-token NLL and count over ids [B, T] (positions 1..T-1 predicted)."""
    logits = tm.forward(P, cfg, ids, make_ctx(cfg, ids, eh, dtype, device))
    lp = torch.log_softmax(logits[:, :-1].to(torch.float64), dim=-1)
    return -lp.gather(-1, ids[:, 1:, None]).sum().item(), ids[:, 1:].numel()


def heldout_windows(tok, path, window=WINDOW):
    """The held-out text's ids cut into consecutive windows (the tail shorter than a window is
    dropped): the same windows `deepinfer-lab quality` scores."""
    with open(path, encoding="utf-8") as f:
        ids = tok.encode(f.read()).ids
    n = len(ids) // window
    return np.array(ids[:n * window], dtype=np.int64).reshape(n, window)


def perplexity(P, cfg, windows, eh, dtype, device, batch=8):
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(windows), batch):
            ids = torch.tensor(windows[i:i + batch], device=device)
            s, c = nll(P, cfg, ids, eh, dtype, device)
            tot, cnt = tot + s, cnt + c
    return math.exp(tot / cnt)


# ---- verify: our forward in float64 on the random fixtures against their references ----

def cmd_verify(a):
    cfg = tm.Cfg(os.path.join(a.fixture, "config.json"))
    st = ck.read_st(os.path.join(a.fixture, "model.safetensors"))
    P = to_torch(ck.dequantize(st, block_of(cfg)), torch.float64, "cpu")
    tokp = tokenizer_of(a.fixture, a.tokenizer)
    eh = EngramHash(cfg.c, tokp) if cfg.v41 else None
    if eh is not None and a.engram_reference:
        ref = ck.read_st(a.engram_reference)
        same = np.array_equal(eh.cls, ref["token_map.v41_tiny"][1].astype(np.int64))
        ids = ref["hash.input_ids"][1].astype(np.int64)[None]
        rows = np.stack([eh.rows(li, ids)[0] for li in range(len(eh.layers))], axis=1)
        print(f"engram: token map equal to the reference: {same}; hash rows equal: "
              f"{np.array_equal(rows, ref['hash.rows'][1])}")
    ref = ck.read_st(os.path.join(a.fixture, "reference.safetensors"))
    worst = 0.0
    for name in ["seq0", "seq1", "seq2", "decode"]:
        ids = ref[f"{name}.input_ids"][1].astype(np.int64)
        want = ref[f"{name}.logits"][1].astype(np.float64)
        if name == "decode":  # full forward over prompt + generated; rows predicting each generated token
            gen = ref["decode.generated_ids"][1].astype(np.int64)
            full = np.concatenate([ids, gen])
            ids_t = torch.tensor(full[None])
            with torch.no_grad():
                got = tm.forward(P, cfg, ids_t, make_ctx(cfg, ids_t, eh, torch.float64, "cpu"))[0].numpy()
            got = got[len(ids) - 1:len(full) - 1]
        else:
            ids_t = torch.tensor(ids[None])
            with torch.no_grad():
                got = tm.forward(P, cfg, ids_t, make_ctx(cfg, ids_t, eh, torch.float64, "cpu"))[0].numpy()
        rel = np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1)
        print(f"{name}: {got.shape[0]} positions, max abs diff {np.abs(got - want).max():.3e}, "
              f"relative L2 max {rel.max():.3e} median {np.median(rel):.3e}, "
              f"argmax agreement {np.mean(got.argmax(-1) == want.argmax(-1)):.4f}")
        worst = max(worst, rel.max())
    ok = worst < a.tol
    print(f"verify {'OK' if ok else 'FAILED'}: worst relative L2 {worst:.3e} (bound {a.tol:g})")
    return 0 if ok else 1


# ---- training ----

def init_params(cfg, template, seed):
    """Fresh float parameters with the names and (unpacked) shapes of the template checkpoint."""
    g = np.random.default_rng(seed)
    n, D, out = cfg.n, cfg.D, {}
    depth = 1.0 / math.sqrt(2 * cfg.L)
    for k, (dt, a) in template.items():
        if k.endswith(".scale") and dt == "F8_E8M0":
            continue
        shape = (a.shape[0], a.shape[1] * 2) if dt == "I8" else a.shape
        if k == "embed.weight":
            v = g.normal(0, 1.0, shape)
        elif k.endswith("norm.weight") or k.endswith("q_weight") or k.endswith("k_weight"):
            v = np.ones(shape)
        elif k.endswith("_fn"):
            v = g.normal(0, 1.0 / math.sqrt(shape[1]), shape)
        elif k.endswith("_scale"):
            v = np.full(shape, 0.1)
        elif k.endswith("_base"):
            v = np.zeros(shape)
            if shape[0] == (2 + n) * n:  # comb starts close to the identity
                v[2 * n:] = (4.0 * np.eye(n)).reshape(-1)
        elif k.endswith("tid2eid"):
            v = np.stack([g.permutation(cfg.E)[:cfg.topk] for _ in range(shape[0])])
        elif k.endswith("attn_sink") or k.endswith("ape") or k.endswith("gate.bias") or k.endswith("bias_vl"):
            v = np.zeros(shape)
        elif k.endswith("engram.embed.weight"):
            v = g.normal(0, 1.0, shape)
        else:
            v = g.normal(0, 1.0 / math.sqrt(shape[1]), shape)
            if any(k.endswith(s) for s in ("wo_b.weight", "w2.weight", "engram.wkv.weight")):
                v *= depth
        out[k] = v
    return out


def no_decay(k):
    return k.endswith("norm.weight") or "hc_" in k or k.endswith(("attn_sink", "ape", "q_weight", "k_weight"))


def cmd_train(a):
    torch.manual_seed(a.seed)
    dev = a.device
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    from tokenizers import Tokenizer
    cfg = tm.Cfg(os.path.join(a.fixture, "config.json"))
    tokp = tokenizer_of(a.fixture, a.tokenizer)
    tok = Tokenizer.from_file(tokp)
    eh = EngramHash(cfg.c, tokp) if cfg.v41 else None
    with open(a.train_text, encoding="utf-8") as f:
        data = np.array(tok.encode(f.read()).ids, dtype=np.int64)
    held = heldout_windows(tok, a.heldout)
    print(f"train tokens {len(data)}, held-out windows {held.shape}", flush=True)
    template = ck.read_st(os.path.join(a.fixture, "model.safetensors"))
    init = init_params(cfg, template, a.seed)
    P = {k: torch.tensor(v, dtype=torch.int64 if k.endswith("tid2eid") else torch.float32, device=dev)
         for k, v in init.items()}
    fixed = {k for k in P if k.endswith(("tid2eid", "gate.bias", "bias_vl"))}  # not trained by gradient
    for k in P:
        if k not in fixed:
            P[k].requires_grad_(True)
    groups = [{"params": [P[k] for k in P if k not in fixed and not no_decay(k)], "weight_decay": a.wd},
              {"params": [P[k] for k in P if k not in fixed and no_decay(k)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if dev == "cuda" else {}))
    rng = np.random.default_rng(a.seed + 1)

    def batch():
        starts = rng.integers(0, len(data) - WINDOW, size=a.batch)
        return torch.tensor(np.stack([data[s:s + WINDOW] for s in starts]), device=dev)

    def step_fn(step, total):
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, step / total))))
        for gr in opt.param_groups:
            gr["lr"] = lr
        ids = batch()
        ctx = make_ctx(cfg, ids, eh, torch.float32, dev, indexer_loss=True)
        logits = tm.forward(P, cfg, ids, ctx)
        lm = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        kl = torch.stack(ctx.kl).sum() if ctx.kl else torch.zeros((), device=dev)
        opt.zero_grad(set_to_none=True)
        (lm + kl).backward()
        torch.nn.utils.clip_grad_norm_([p for gr in groups for p in gr["params"]], 1.0)
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing of the biased routers (DeepSeek-V3)
            for L, load in ctx.loads.items():
                k = f"layers.{L}.ffn.gate.bias"
                if not (L < cfg.hash_layers):
                    P[k] += a.bias_rate * torch.sign(load.mean() - load)
        return lm.item(), kl.item()

    t0 = time.time()
    total, done = a.steps, 0
    if total is None:  # time budget: 2 warm-up steps, time 10, then fix the step count
        for s in range(2):
            step_fn(s, 10 ** 9)
        t1 = time.time()
        for s in range(2, 12):
            step_fn(s, 10 ** 9)
        per = (time.time() - t1) / 10
        total = max(20, int((a.seconds - (time.time() - t0)) / per) + 12)
        print(f"{per * 1000:.1f} ms/step -> {total} steps for {a.seconds} s", flush=True)
        done = 12
    val = held[:8]
    for s in range(done, total):
        lm, kl = step_fn(s, total)
        if s % a.log_every == 0 or s == total - 1:
            msg = f"step {s} lm {lm:.4f} (ppl {math.exp(lm):.2f}) indexer-kl {kl:.4f} {time.time() - t0:.0f}s"
            if a.val_every and s % a.val_every == 0:
                msg += f" held-out[:8] ppl {perplexity({k: v.detach() for k, v in P.items()}, cfg, val, eh, torch.float32, dev):.2f}"
            print(msg, flush=True)
    train_s = time.time() - t0
    Pf = {k: v.detach() for k, v in P.items()}
    ppl_float = perplexity(Pf, cfg, held, eh, torch.float32, dev)
    params = {k: v.detach().cpu().double().numpy() for k, v in P.items()}
    tensors, deq = ck.quantize_like(params, template, block_of(cfg))
    ppl_quant = perplexity(to_torch(deq, torch.float32, dev), cfg, held, eh, torch.float32, dev)
    os.makedirs(a.out, exist_ok=True)
    ck.write_st(os.path.join(a.out, "model.safetensors"), tensors, {"format": "pt"})
    rep = {"steps": total, "batch": a.batch, "window": WINDOW, "seed": a.seed, "lr": a.lr, "train_seconds": round(train_s, 1),
           "train_tokens": int(len(data)), "heldout_windows": int(len(held)), "device": dev,
           "heldout_ppl_float32": ppl_float, "heldout_ppl_quantized": ppl_quant, "torch": torch.__version__}
    with open(os.path.join(a.out, "train_report.json"), "w") as f:
        json.dump(rep, f, indent=1)
    print(json.dumps(rep), flush=True)
    return 0


def cmd_eval(a):
    """Held-out perplexity of an exported checkpoint, dequantized, in float64: the engine's
    reference-mode function."""
    from tokenizers import Tokenizer
    cfg = tm.Cfg(os.path.join(a.model, "config.json"))
    tokp = tokenizer_of(a.model, a.tokenizer)
    eh = EngramHash(cfg.c, tokp) if cfg.v41 else None
    held = heldout_windows(Tokenizer.from_file(tokp), a.heldout or os.path.join(a.model, "heldout.txt"))
    if a.windows:
        held = held[:a.windows]
    st = ck.read_st(os.path.join(a.model, "model.safetensors"))
    P = to_torch(ck.dequantize(st, block_of(cfg)), torch.float64, "cpu")
    print(f"{a.model}: {len(held)} windows of {WINDOW}: held-out perplexity (float64, dequantized) "
          f"{perplexity(P, cfg, held, eh, torch.float64, 'cpu', batch=1):.4f}")
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify")
    v.add_argument("--fixture", required=True)
    v.add_argument("--tokenizer")
    v.add_argument("--engram-reference", help="tests/data/v41-engram/engram_reference.safetensors")
    v.add_argument("--tol", type=float, default=1e-5)
    t = sub.add_parser("train")
    t.add_argument("--fixture", required=True)
    t.add_argument("--tokenizer")
    t.add_argument("--train-text", required=True)
    t.add_argument("--heldout", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int)
    t.add_argument("--seconds", type=float, default=200)
    t.add_argument("--batch", type=int, default=16)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--wd", type=float, default=0.05)
    t.add_argument("--warmup", type=int, default=100)
    t.add_argument("--bias-rate", type=float, default=1e-3)
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--val-every", type=int, default=0, help="held-out perplexity of 8 windows every N steps (a multiple of --log-every)")
    t.add_argument("--device", default="cpu")
    e = sub.add_parser("eval")
    e.add_argument("--model", required=True)
    e.add_argument("--tokenizer")
    e.add_argument("--heldout")
    e.add_argument("--windows", type=int)
    a = ap.parse_args()
    return {"verify": cmd_verify, "train": cmd_train, "eval": cmd_eval}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
