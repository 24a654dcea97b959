#!/usr/bin/env python3
# An independent float64 numpy computation of V4's MTP drafter at position 0, written from
# model-spec §3 (backbone block, head) and §3.10 (MTP), for the drafter fixture (issue 27):
#   X_0   = the backbone's final residual streams after token t0 at position 0 (every layer's
#           attention sees only its own row there: RoPE is the identity at 0, no compressed row
#           exists yet, the ring is empty);
#   Z     = e_proj(enorm(embed(t1))) + h_proj(hnorm(X_0,j)) per stream; Z = Block_mtp(Z) at 0;
#   logits = head(mtp.norm(hc_head_mtp(Z)))  -> the MTP's prediction of the token after t1.
# Reference numerics (no quantization of activations; weights dequantized by the official
# formulas). Checked first against the fixture's own HF float64 logits of position 0 (the
# backbone part), then written to OUT as mtp-reference.safetensors: `ids` [2] i32 (t0, t1),
# `backbone_logits` [V] f32, `mtp_logits` [V] f32 (tests/model/test_v4_mtp.cpp compares them).
# Usage: mtp_reference.py FIXTURE_DIR TOOLS_TRAIN_TINY_DIR
import json
import os
import sys

import numpy as np

sys.path.insert(0, sys.argv[2])
import checkpoint as ck  # noqa: E402
from block_ops import Ops  # noqa: E402  (this folder: the script's own)

fx = sys.argv[1]
cfg = json.load(open(os.path.join(fx, "config.json")))
P = ck.dequantize(ck.read_st(os.path.join(fx, "model.safetensors")), cfg["quantization_config"]["weight_block_size"][0])
ref = ck.read_st(os.path.join(fx, "reference.safetensors"))
D, H, hd, n = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"], cfg["hc_mult"]
ops = Ops(P, cfg)
rms, mixes, hc_post, swiglu = ops.rms, ops.mixes, ops.hc_post, ops.swiglu
G, eps, hc_eps = cfg["o_groups"], cfg["rms_norm_eps"], cfg["hc_eps"]
topk, E, rs = cfg["num_experts_per_tok"], cfg["n_routed_experts"], cfg["routed_scaling_factor"]
n_hash, L = cfg["num_hash_layers"], cfg["num_hidden_layers"]


def attention(x, p):  # §3.5 at position 0: one key (itself), RoPE identity
    q = (P[p + "attn.wq_b.weight"] @ rms(P[p + "attn.wq_a.weight"] @ x, P[p + "attn.q_norm.weight"])).reshape(H, hd)
    q = rms(q)  # per-head, unweighted (V4)
    kv = rms(P[p + "attn.wkv.weight"] @ x, P[p + "attn.kv_norm.weight"])
    s = (q @ kv) / np.sqrt(hd)  # [H]
    sink = P[p + "attn.attn_sink"]
    w = np.exp(s) / (np.exp(s) + np.exp(sink))
    o = w[:, None] * kv[None, :]  # [H, hd]
    og = o.reshape(G, H * hd // G)
    wa = P[p + "attn.wo_a.weight"].reshape(G, -1, H * hd // G)
    z = np.einsum("gnk,gk->gn", wa, og).reshape(-1)
    return P[p + "attn.wo_b.weight"] @ z


def moe(x, p, tok, hash_layer):  # §3.8
    s = np.sqrt(np.log1p(np.exp(P[p + "ffn.gate.weight"] @ x)))
    if hash_layer:
        sel = P[p + "ffn.gate.tid2eid"][tok].astype(np.int64)
    else:
        sel = np.argsort(-(s + P[p + "ffn.gate.bias"]), kind="stable")[:topk]
    w = s[sel] / s[sel].sum() * rs
    out = sum(wi * swiglu(x, P[f"{p}ffn.experts.{e}.w1.weight"], P[f"{p}ffn.experts.{e}.w3.weight"],
                          P[f"{p}ffn.experts.{e}.w2.weight"]) for wi, e in zip(w, sel))
    sh = p + "ffn.shared_experts."
    return out + swiglu(x, P[sh + "w1.weight"], P[sh + "w3.weight"], P[sh + "w2.weight"])


def block(X, p, tok, hash_layer):
    pre, post, C = mixes(X, p + "hc_attn")
    X = hc_post(attention(rms(pre @ X, P[p + "attn_norm.weight"]), p), X, post, C)
    pre, post, C = mixes(X, p + "hc_ffn")
    return hc_post(moe(rms(pre @ X, P[p + "ffn_norm.weight"]), p, tok, hash_layer), X, post, C)


def head(X, p):  # §3.4: no Sinkhorn
    fn, base, scale = P[p + "hc_head_fn"], P[p + "hc_head_base"], P[p + "hc_head_scale"]
    xf = X.reshape(-1)
    m = (fn @ xf) / np.sqrt(np.mean(xf * xf) + eps)
    pre = 1 / (1 + np.exp(-(m * scale[0] + base))) + hc_eps
    return P["head.weight"] @ rms(pre @ X, P[p + "norm.weight"])


ids = ref["seq0.input_ids"][1].reshape(-1)
t0, t1 = int(ids[0]), int(ids[1])
X = np.repeat(P["embed.weight"][t0][None, :], n, 0)
for layer in range(L):
    X = block(X, f"layers.{layer}.", t0, layer < n_hash)
backbone = head(X, "")
want = ref["seq0.logits"][1].reshape(len(ids), -1)[0].astype(np.float64)
err = np.linalg.norm(backbone - want) / np.linalg.norm(want)
print(f"mtp_reference: backbone at position 0 vs HF float64: rel L2 {err:.2e}")
# The HF logits are stored in f32 (2^-24 relative each) and summed in another order: measured
# 1.8e-7. Any wrong term of the block (a norm, a mix, a clamp) moves them by far more than 1e-6.
assert err < 1e-6, "the numpy backbone does not reproduce the fixture's HF float64 logits"

p = "mtp.0."
e = P[p + "e_proj.weight"] @ rms(P["embed.weight"][t1], P[p + "enorm.weight"])
Z = e[None, :] + rms(X, P[p + "hnorm.weight"]) @ P[p + "h_proj.weight"].T
Z = block(Z, p, t1, False)
mtp = head(Z, p)
ck.write_st(os.path.join(fx, "mtp-reference.safetensors"),
            {"ids": ("I32", np.array([t0, t1], dtype=np.int32)), "backbone_logits": ("F32", backbone.astype(np.float32)),
             "mtp_logits": ("F32", mtp.astype(np.float32))})
print(f"mtp_reference: {fx}/mtp-reference.safetensors (tokens {t0} {t1})")
