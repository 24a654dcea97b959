#!/usr/bin/env python3
# An independent float64 numpy computation of V4.1's DSpark drafter after position 0, written
# from model-spec §4.2-§4.4 (backbone at position 0: single-pass mHC, attention, MoE) and §4.7
# (DSpark), for the drafter fixture v41-tiny-ezero (issue 27): v41-tiny with mtp.0..2 and its
# Engram wkv all zeros, so that Engram adds exactly 0 to the streams (value = 0) and the
# backbone here needs no Engram hashing. At position 0 every attention sees its own window row;
# the ratio-2 layers see no compressed row yet; the ratio-1 layers (kv source 5, its Reuse /
# Reindex layers 6, 7) also see compressed row 0 (compressor.norm(compressor.wkv x) of layer 5's
# attention input, RoPE the identity at 0), which every indexer selects (one visible row).
#   main_hidden = concat(mean_j X_j at the entries of the dspark target layers), main_x =
#   main_norm(main_proj(main_hidden)); block s's context row at 0: kv_norm_s(wkv_s(main_x));
#   the draft block [a, N, N, N, N] at positions 1..5 through the three blocks, each draft
#   query attending to the context row and all 5 draft rows (RoPE at 1..5, theta 10000);
#   U_i = head(norm(x_i)) + markov_head(markov_embed[prev]), prev = a then the greedy drafts;
#   conf_i = proj . concat(x_i, markov_embed[prev_i]).
# Reference numerics (no activation quantization; weights dequantized by the official formulas).
# Writes OUT/dspark-reference.safetensors: `ids` [2] i32 (t0, a), `backbone_logits` [V] f32,
# `draft_logits` [5, V] f32, `drafts` [5] i32, `conf` [5] f32 (tests/model/test_v41_dspark.cpp).
# Usage: dspark_reference.py FIXTURE_DIR TOOLS_TRAIN_TINY_DIR
import json
import os
import sys

import numpy as np

sys.path.insert(0, sys.argv[2])
import checkpoint as ck  # noqa: E402
from block_ops import Ops  # noqa: E402  (this folder: the script's own)

fx = sys.argv[1]
top = json.load(open(os.path.join(fx, "config.json")))
cfg = top["text_config"]
P = ck.dequantize(ck.read_st(os.path.join(fx, "model.safetensors")), top["quantization_config"]["weight_block_size"][0])
D, H, hd, n, rd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"], cfg["hc_mult"], cfg["qk_rope_head_dim"]
ops = Ops(P, cfg)
rms, mixes, hc_post, swiglu = ops.rms, ops.mixes, ops.hc_post, ops.swiglu
G, rs, L = cfg["o_groups"], cfg["routed_scaling_factor"], cfg["num_hidden_layers"]
ratios, kv_sources = cfg["compress_ratios"], cfg["kv_source_layer_ids"]
B, noise, targets = cfg["dspark_block_size"], cfg["dspark_noise_token_id"], cfg["dspark_target_layer_ids"]
n_mtp = cfg["num_nextn_predict_layers"]


def rope(x, pos, inverse=False):  # interleaved pairs of the last rd dims; theta 10000 (DSpark)
    inv = (1.0 / np.power(np.float32(10000.0), np.arange(0, rd, 2, dtype=np.float32) / np.float32(rd))).astype(np.float32)
    phi = (np.float32(pos) * inv).astype(np.float64)
    c, s = np.cos(phi), np.sin(phi) * (-1 if inverse else 1)
    y = x.copy()
    a, b = x[..., hd - rd::2], x[..., hd - rd + 1::2]
    y[..., hd - rd::2] = a * c - b * s
    y[..., hd - rd + 1::2] = a * s + b * c
    return y


def out_proj(o, p):  # o [H, hd] -> wo_a per group, wo_b
    og = o.reshape(G, H * hd // G)
    wa = P[p + "attn.wo_a.weight"].reshape(G, -1, H * hd // G)
    return P[p + "attn.wo_b.weight"] @ np.einsum("gnk,gk->gn", wa, og).reshape(-1)


def query(x, p):  # V4.1: no per-head norm of q
    return (P[p + "attn.wq_b.weight"] @ rms(P[p + "attn.wq_a.weight"] @ x, P[p + "attn.q_norm.weight"])).reshape(H, hd)


def window_row(x, p):
    return rms(P[p + "attn.wkv.weight"] @ x, P[p + "attn.kv_norm.weight"])


def attend(q, keys, p):  # q [H, hd], keys [K, hd] (values = keys), with the sink
    s = (q @ keys.T) / np.sqrt(hd)  # [H, K]
    sink = P[p + "attn.attn_sink"]
    mx = np.maximum(s.max(-1), sink)
    e = np.exp(s - mx[:, None])
    return (e @ keys) / (e.sum(-1) + np.exp(sink - mx))[:, None]


def moe(x, p, topk):  # §4.4
    s = np.sqrt(np.log1p(np.exp(P[p + "ffn.gate.weight"] @ x)))
    sel = np.argsort(-(s + P[p + "ffn.gate.bias"]), kind="stable")[:topk]
    w = s[sel] / (s[sel].sum() + (1e-20 if topk > 1 else 0.0)) * rs
    out = sum(wi * swiglu(x, P[f"{p}ffn.experts.{e}.w1.weight"], P[f"{p}ffn.experts.{e}.w3.weight"],
                          P[f"{p}ffn.experts.{e}.w2.weight"]) for wi, e in zip(w, sel))
    sh = p + "ffn.shared_experts."
    return out + swiglu(x, P[sh + "w1.weight"], P[sh + "w3.weight"], P[sh + "w2.weight"])


# Backbone at position 0 (token t0), recording the target layers' entry means.
t0, a = 17, 42
X = np.repeat(P["embed.weight"][t0][None, :], n, 0)
pre_mix = np.eye(n)[0]
comp0 = None  # compressed row 0 of the ratio-1 group (kv source 5)
means = {}
for layer in range(L):
    p = f"layers.{layer}."
    if layer in targets:
        means[layer] = X.mean(0)  # after Engram (0 here), before the layer's mHC
    a_pre, post, C = mixes(X, p + "hc_attn")
    x = rms(pre_mix @ X, P[p + "attn_norm.weight"])
    keys = [window_row(x, p)]
    if ratios[layer] == 1:
        if layer in kv_sources:
            comp0 = rms(P[p + "attn.compressor.wkv.weight"] @ x, P[p + "attn.compressor.norm.weight"])
        keys.append(comp0)
    X = hc_post(out_proj(attend(query(x, p), np.array(keys), p), p), X, post, C)
    f_pre, post, C = mixes(X, p + "hc_ffn")
    X = hc_post(moe(rms(a_pre @ X, P[p + "ffn_norm.weight"]), p, cfg["num_experts_per_tok"]), X, post, C)
    pre_mix = f_pre
backbone = P["head.weight"] @ rms(pre_mix @ X, P["norm.weight"])

# DSpark.
main_x = rms(P["mtp.0.main_proj.weight"] @ np.concatenate([means[t] for t in targets]), P["mtp.0.main_norm.weight"])
Z = np.repeat(P["embed.weight"][[a] + [noise] * (B - 1)][:, None, :], n, 1)  # [B, n, D]
pm = np.repeat(np.eye(n)[0][None, :], B, 0)
for s in range(n_mtp):
    p = f"mtp.{s}."
    ctx = window_row(main_x, p)  # RoPE at 0: the identity
    mx = [mixes(Z[i], p + "hc_attn") for i in range(B)]
    xs = [rms(pm[i] @ Z[i], P[p + "attn_norm.weight"]) for i in range(B)]
    rows = np.array([ctx] + [rope(window_row(xs[i], p), 1 + i) for i in range(B)])
    for i in range(B):
        o = rope(attend(rope(query(xs[i], p), 1 + i), rows, p), 1 + i, inverse=True)
        Z[i] = hc_post(out_proj(o, p), Z[i], mx[i][1], mx[i][2])
    for i in range(B):
        f_pre, post, C = mixes(Z[i], p + "hc_ffn")
        Z[i] = hc_post(moe(rms(mx[i][0] @ Z[i], P[p + "ffn_norm.weight"]), p, cfg["dspark_num_experts_per_tok"]), Z[i],
                       post, C)
        pm[i] = f_pre
last = f"mtp.{n_mtp - 1}."
U, drafts, conf, prev = [], [], [], a
for i in range(B):
    x = pm[i] @ Z[i]
    me = P[last + "markov_head.embed.weight"][prev]
    u = P["head.weight"] @ rms(x, P[last + "norm.weight"]) + P[last + "markov_head.head.weight"] @ me
    prev = int(np.argmax(u))
    U.append(u)
    drafts.append(prev)
    conf.append(float(P[last + "confidence_head.proj.weight"][0] @ np.concatenate([x, me])))
U = np.array(U)
ck.write_st(os.path.join(fx, "dspark-reference.safetensors"),
            {"ids": ("I32", np.array([t0, a], dtype=np.int32)), "backbone_logits": ("F32", backbone.astype(np.float32)),
             "draft_logits": ("F32", U.astype(np.float32)), "drafts": ("I32", np.array(drafts, dtype=np.int32)),
             "conf": ("F32", np.array(conf, dtype=np.float32))})
# The greedy drafts' margins: a test comparing argmaxes is meaningful only where the top two are apart.
gaps = [float(np.sort(u)[-1] - np.sort(u)[-2]) for u in U]
print(f"dspark_reference: {fx}/dspark-reference.safetensors (tokens {t0} {a}; drafts {drafts}; "
      f"top-2 gaps {min(gaps):.3g}..{max(gaps):.3g})")
