#!/usr/bin/env python3
# Adds random drafter weights in the official format to a tiny fixture (issue 27):
#   V4   (model_type deepseek_v4):  the MTP block `mtp.0` (model-spec §2.2, §3.10);
#   V4.1 (deepseek_v41):            the DSpark stages `mtp.0..2` (model-spec §2.3, §4.7).
# The backbone tensors are rewritten byte for byte (their codes are copied, never re-quantized),
# so every reference logit of the fixture stays valid; config.json gets num_nextn_predict_layers
# (and, for V4, the MTP block's compress_ratios entry 0; for V4.1 the DSpark entries 0, the
# drafter's expert count and dspark_target_layer_ids = the last 3 backbone layers). Names, dtypes and shapes follow the
# loader's schema (src/model/schema_v4.cpp, schema_v41.cpp), which validates them on load.
#
# Usage: .venv/bin/python tools/add_drafter_weights.py tests/data/v4-tiny [--seed 27]
# Not applied to the committed fixtures (+5.3 MB: v4-tiny +1.1, v41-tiny +4.2, would push the
# tracked tree past the 64 MiB the GPU machine copies): tests/data/make_drafter_fixtures.sh
# (CTest's set-up test drafter_fixtures) applies it to copies in build/drafter-data.
# Idempotent: existing mtp.* tensors are replaced. Values (numpy PCG64, seed fixed per fixture):
# linear weights N(0, 1/in) quantized like the fixture's backbone (FP8 e4m3 with ue8m0 block
# scales, FP4 e2m1 experts with ue8m0 1x32 scales), norms 1 + N(0, 0.1^2) in BF16, mHC fn
# N(0, 0.02^2) / base N(0, 0.5^2) / scale 1 + N(0, 0.1^2) in F32, router bias N(0, 0.1^2) F32,
# attention sinks N(0, 1): the distributions tools make_v4_fixture.py / make_v41_fixture.py use
# for the backbone.
import argparse
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_tiny"))
import checkpoint as ck  # noqa: E402


def text_config(cfg):
    return cfg["text_config"] if "text_config" in cfg else cfg


class Gen:
    def __init__(self, seed, block):
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.block = block
        self.out = {}

    def normal(self, shape, std=1.0, mean=0.0):
        return mean + std * self.rng.standard_normal(shape)

    def fp8(self, name, o, i):
        q, s, _ = ck.quant_fp8_blocks(self.normal((o, i), 1.0 / np.sqrt(i)), self.block, self.block)
        self.out[name + ".weight"] = ("F8_E4M3", q)
        self.out[name + ".scale"] = ("F8_E8M0", s)

    def fp4(self, name, o, i):
        q, s, _ = ck.quant_fp4_rows(self.normal((o, i), 1.0 / np.sqrt(i)))
        self.out[name + ".weight"] = ("I8", q)
        self.out[name + ".scale"] = ("F8_E8M0", s)

    def bf16_lin(self, name, o, i):
        self.out[name] = ("BF16", ck.bf16_encode(self.normal((o, i), 1.0 / np.sqrt(i))))

    def norm(self, name, n):
        self.out[name] = ("BF16", ck.bf16_encode(self.normal((n,), 0.1, 1.0)))

    def f32(self, name, shape, std, mean=0.0):
        self.out[name] = ("F32", self.normal(shape, std, mean).astype(np.float32))


def block(g, t, p, n_routed, v41):
    """One ratio-0 block `p` (attention without compressor/indexer, norms, mHC, biased MoE)."""
    D, H, hd, n = t["hidden_size"], t["num_attention_heads"], t["head_dim"], t["hc_mult"]
    q_lora, og, ol, inter = t["q_lora_rank"], t["o_groups"], t["o_lora_rank"], t["moe_intermediate_size"]
    mix = (2 + n) * n
    g.norm(p + "attn_norm.weight", D)
    g.norm(p + "ffn_norm.weight", D)
    for s in ("attn", "ffn"):
        g.f32(p + f"hc_{s}_fn", (mix, n * D), 0.02)
        g.f32(p + f"hc_{s}_base", (mix,), 0.5)
        g.f32(p + f"hc_{s}_scale", (3,), 0.1, 1.0)
    g.fp8(p + "attn.wq_a", q_lora, D)
    g.norm(p + "attn.q_norm.weight", q_lora)
    g.fp8(p + "attn.wq_b", H * hd, q_lora)
    g.fp8(p + "attn.wkv", hd, D)
    g.norm(p + "attn.kv_norm.weight", hd)
    g.fp8(p + "attn.wo_a", og * ol, H * hd // og)
    g.fp8(p + "attn.wo_b", D, og * ol)
    g.f32(p + "attn.attn_sink", (H,), 1.0)
    g.bf16_lin(p + "ffn.gate.weight", n_routed, D)
    g.f32(p + "ffn.gate.bias", (n_routed,), 0.1)  # bias routing; no tid2eid, no bias_vl
    for e in range(n_routed):
        ep = p + f"ffn.experts.{e}."
        g.fp4(ep + "w1", inter, D)
        g.fp4(ep + "w2", D, inter)
        g.fp4(ep + "w3", inter, D)
    g.fp8(p + "ffn.shared_experts.w1", inter, D)
    g.fp8(p + "ffn.shared_experts.w2", D, inter)
    g.fp8(p + "ffn.shared_experts.w3", inter, D)


def v4_mtp(g, t):
    """V4 MTP `mtp.0` (model-spec §2.2): a ratio-0 bias-routed block + e/h projections, norms, hc_head."""
    D, n = t["hidden_size"], t["hc_mult"]
    p = "mtp.0."
    block(g, t, p, t["n_routed_experts"], False)
    g.fp8(p + "e_proj", D, D)
    g.fp8(p + "h_proj", D, D)
    g.norm(p + "enorm.weight", D)
    g.norm(p + "hnorm.weight", D)
    g.norm(p + "norm.weight", D)
    g.f32(p + "hc_head_fn", (n, n * D), 0.02)
    g.f32(p + "hc_head_base", (n,), 0.5)
    g.f32(p + "hc_head_scale", (1,), 0.1, 1.0)


def v41_dspark(g, t, n_stages):
    """V4.1 DSpark stages `mtp.0..n-1` (model-spec §2.3): SWA-only blocks; stage 0 has the context
    projection, the last stage the final norm, the Markov head and the confidence head."""
    D, V, R = t["hidden_size"], t["vocab_size"], t["dspark_markov_rank"]
    for s in range(n_stages):
        p = f"mtp.{s}."
        block(g, t, p, t["dspark_n_routed_experts"], True)
        if s == 0:
            g.fp8(p + "main_proj", D, D * len(t["dspark_target_layer_ids"]))
            g.norm(p + "main_norm.weight", D)
        if s == n_stages - 1:
            g.norm(p + "norm.weight", D)
            # Markov head: embedding rows N(0, 1) like the token embedding, head N(0, 1/R).
            g.out[p + "markov_head.embed.weight"] = ("BF16", ck.bf16_encode(g.normal((V, R), 1.0)))
            g.bf16_lin(p + "markov_head.head.weight", V, R)
            g.bf16_lin(p + "confidence_head.proj.weight", 1, D + R)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("fixture", help="fixture folder (config.json + model.safetensors)")
    ap.add_argument("--seed", type=int, default=27)
    a = ap.parse_args()
    cfg_path = os.path.join(a.fixture, "config.json")
    st_path = os.path.join(a.fixture, "model.safetensors")
    with open(cfg_path) as f:
        cfg = json.load(f)
    t = text_config(cfg)
    v41 = cfg["model_type"] == "deepseek_v41"
    with open(st_path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        meta = json.loads(f.read(n)).get("__metadata__")
    tensors = {k: v for k, v in ck.read_st(st_path).items() if not k.startswith("mtp.")}
    if v41:
        g = Gen(a.seed, cfg["quantization_config"]["weight_block_size"][0])
        n_mtp = 3
        # The tiny config said 128 DSpark experts (V4.1-Flash's count): 20 MB of experts in git.
        # The backbone's 8 keep every code path (top-3 of 8) at 1/16 of the bytes.
        t["dspark_n_routed_experts"] = min(t["dspark_n_routed_experts"], t["n_routed_experts"])
        # The context comes from the entries of the last 3 backbone layers, as in V4.1-Flash
        # ([37, 38, 39] of 40; the tiny config's own list [4, 6, 7] is replaced).
        L = t["num_hidden_layers"]
        t["dspark_target_layer_ids"] = [L - 3, L - 2, L - 1]
        v41_dspark(g, t, n_mtp)
    else:
        g = Gen(a.seed, cfg["quantization_config"]["weight_block_size"][0])
        n_mtp = 1
        v4_mtp(g, t)
    t["num_nextn_predict_layers"] = n_mtp
    # The drafter blocks' entries in compress_ratios, ratio 0, as the released configs list them
    # (V4-Flash 44 entries, last = MTP; V4.1-Flash 43, last 3 = DSpark; model-spec §2.1).
    t["compress_ratios"] = t["compress_ratios"][: t["num_hidden_layers"]] + [0] * n_mtp
    tensors.update(g.out)
    ck.write_st(st_path, tensors, meta)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    print(f"{a.fixture}: {len(g.out)} drafter tensors added ({sum(v[1].nbytes for v in g.out.values())} bytes), "
          f"{len(tensors)} in all")


if __name__ == "__main__":
    main()
