# A compact torch implementation of the tiny DeepSeek-V4 and V4.1 architectures: the engine's
# reference-mode function (model-spec §3, §4; no quantization simulation), written as a full
# forward over [B, T] token batches that all start at position 0, with dense masks. Parameters
# are a dict {official checkpoint name: tensor}, so a checkpoint's dequantized tensors run as
# they are (`train.py --verify` checks this against tests/data/*/reference.safetensors) and a
# trained dict is exported under the same names.
import json
import math

import torch
import torch.nn.functional as F


class Cfg:
    """The config keys the forward needs, from a V4 (flat) or V4.1 (text_config) config.json."""

    def __init__(self, path):
        with open(path) as f:
            raw = json.load(f)
        self.raw = raw
        self.v41 = "text_config" in raw
        c = raw["text_config"] if self.v41 else raw
        self.c = c
        self.D, self.L, self.H, self.hd = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["head_dim"]
        self.rd, self.q_lora, self.G, self.o_lora = c["qk_rope_head_dim"], c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
        self.E, self.topk, self.inter = c["n_routed_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
        self.route_scale, self.swiglu_limit = c["routed_scaling_factor"], c["swiglu_limit"]
        self.eps, self.n, self.hc_iters, self.hc_eps = c["rms_norm_eps"], c["hc_mult"], c["hc_sinkhorn_iters"], c["hc_eps"]
        self.window, self.ratios = c["sliding_window"], c["compress_ratios"]
        self.Hi, self.di, self.idx_topk = c["index_n_heads"], c["index_head_dim"], c["index_topk"]
        self.vocab = c["vocab_size"]
        self.rope_theta, self.crope_theta = c["rope_theta"], c["compress_rope_theta"]
        self.yarn = c["rope_scaling"]
        self.hash_layers = c.get("num_hash_layers", 0)
        if self.v41:
            self.kv_src = c["kv_source_layer_ids"]
            self.idx_src = c["index_source_layer_ids"]
            self.cand_src, self.cand_topk, self.cand_bs = c["candidate_source_layer_id"], c["candidate_topk_blocks"], c["candidate_block_size"]
            self.eng_layers, self.eng_dim = c["engram_layer_ids"], c["engram_head_dim"]

    def source_of(self, L, srcs):
        s = [x for x in srcs if x <= L]
        return s[-1] if s else -1


# ---- primitives ----

def rms(x, w, eps):
    # [..., d] -> [..., d]
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def rope_table(cfg, compressed, T, dtype, device):
    """cos, sin [T, rd/2] at positions 0..T-1 (YaRN on the compressed table, §3.1)."""
    r = cfg.rd
    base = cfg.crope_theta if compressed else cfg.rope_theta
    f = 1.0 / torch.pow(torch.tensor(float(base), dtype=torch.float64), torch.arange(0, r, 2, dtype=torch.float64) / r)
    if compressed:
        y = cfg.yarn
        orig = y["original_max_position_embeddings"]
        corr = lambda rot: r * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
        lo, hi = max(math.floor(corr(y["beta_fast"])), 0), min(math.ceil(corr(y["beta_slow"])), r - 1)
        hi = hi + 0.001 if hi == lo else hi
        ramp = ((torch.arange(r // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        f = f / y["factor"] * ramp + f * (1 - ramp)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * f[None, :]
    return torch.cos(ang).to(dtype=dtype, device=device), torch.sin(ang).to(dtype=dtype, device=device)


def rope(x, cos, sin, inverse=False):
    """Interleaved RoPE on the last rd dims of x [B, T, ..., d]; cos/sin [T, rd/2]."""
    rd = cos.shape[-1] * 2
    shape = (1, cos.shape[0]) + (1,) * (x.dim() - 3) + (rd // 2,)
    c, s = cos.view(shape), sin.view(shape)
    if inverse:
        s = -s
    xr = x[..., -rd:]
    a, b = xr[..., 0::2], xr[..., 1::2]
    rot = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    return torch.cat([x[..., :-rd], rot], dim=-1)


def hc_mixes(X, fn, base, scale, cfg):
    """mHC mixes (§3.3): X [B, T, n, D] -> pre [B, T, n], post [B, T, n], comb [B, T, n, n]."""
    n = cfg.n
    xf = X.flatten(-2)  # [B, T, n*D]
    rho = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + cfg.eps)
    m = (xf @ fn.t()) * rho  # [B, T, (2+n)*n]
    pre = torch.sigmoid(m[..., :n] * scale[0] + base[:n]) + cfg.hc_eps
    post = 2 * torch.sigmoid(m[..., n:2 * n] * scale[1] + base[n:2 * n])
    C = (m[..., 2 * n:] * scale[2] + base[2 * n:]).unflatten(-1, (n, n))
    C = torch.softmax(C, dim=-1) + cfg.hc_eps
    C = C / (C.sum(-2, keepdim=True) + cfg.hc_eps)
    for _ in range(cfg.hc_iters - 1):
        C = C / (C.sum(-1, keepdim=True) + cfg.hc_eps)
        C = C / (C.sum(-2, keepdim=True) + cfg.hc_eps)
    return pre, post, C


def collapse(X, pre):
    return (X * pre.unsqueeze(-1)).sum(-2)  # [B, T, D]


def hc_post(Fo, X, post, C):
    # X'_k = post_k F + sum_j C[j, k] X_j
    return post.unsqueeze(-1) * Fo.unsqueeze(-2) + torch.einsum("btjk,btjd->btkd", C, X)


def topk_mask(score, k):
    """score [..., N] with -inf for rows that cannot be chosen -> bool mask of the top
    min(k, #choosable) rows; exact ties go to the lowest index (stable sort)."""
    k = min(k, score.shape[-1])
    vals, idx = torch.sort(score, dim=-1, descending=True, stable=True)
    keep = vals[..., :k] > float("-inf")
    mask = torch.zeros(score.shape, dtype=torch.bool, device=score.device)
    return mask.scatter(-1, idx[..., :k], keep)


def sparse_attention(q, kv, comp, comp_mask, sink, cfg):
    """q [B, T, H, d]; kv [B, T, d] window rows; comp [B, Nc, d] compressed rows (or None);
    comp_mask [B, T, Nc] bool. One softmax over window + compressed rows + the sink (§3.1)."""
    B, T, H, d = q.shape
    pos = torch.arange(T, device=q.device)
    win = (pos[:, None] - pos[None, :] >= 0) & (pos[:, None] - pos[None, :] < cfg.window)  # [T, T]
    keys = kv if comp is None else torch.cat([kv, comp], dim=1)  # [B, T+Nc, d]
    mask = win.expand(B, T, T) if comp is None else torch.cat([win.expand(B, T, T), comp_mask], dim=-1)
    s = torch.einsum("bthd,bkd->bhtk", q, keys) / math.sqrt(d)
    s = s.masked_fill(~mask.unsqueeze(1), float("-inf"))
    s = torch.cat([s, sink.view(1, H, 1, 1).expand(B, H, T, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :-1]
    return torch.einsum("bhtk,bkd->bthd", p, keys), p


def attn_out(o, P, p, cos, sin, cfg):
    """Inverse RoPE at the query, grouped wo_a, wo_b: o [B, T, H, d] -> [B, T, D]."""
    B, T, H, d = o.shape
    o = rope(o, cos, sin, inverse=True).reshape(B, T, cfg.G, H * d // cfg.G)
    wo_a = P[p + "attn.wo_a.weight"].view(cfg.G, cfg.o_lora, H * d // cfg.G)
    z = torch.einsum("btgi,goi->btgo", o, wo_a).reshape(B, T, cfg.G * cfg.o_lora)
    return z @ P[p + "attn.wo_b.weight"].t()


def swiglu(x, w1, w3, w2, limit):
    g = (x @ w1.t()).clamp(max=limit)
    u = (x @ w3.t()).clamp(-limit, limit)
    return (F.silu(g) * u) @ w2.t()


def moe(x, P, p, ids, cfg, hash_layer):
    """MoE (§3.8 / §4.4), all experts computed densely and weighted (unselected weight 0).
    x [B, T, D], ids [B, T] -> out [B, T, D], expert load [E] (selection counts)."""
    s = torch.sqrt(F.softplus(x @ P[p + "ffn.gate.weight"].t()))  # [B, T, E]
    with torch.no_grad():
        if hash_layer:
            sel = P[p + "ffn.gate.tid2eid"].long()[ids]  # [B, T, k]
        else:
            sel = torch.sort(s + P[p + "ffn.gate.bias"], dim=-1, descending=True, stable=True)[1][..., :cfg.topk]
        onehot = torch.zeros_like(s).scatter(-1, sel, 1.0)
    sw = s * onehot
    w = sw / (sw.sum(-1, keepdim=True) + (1e-20 if cfg.v41 else 0.0)) * cfg.route_scale  # [B, T, E]
    W1 = torch.stack([P[f"{p}ffn.experts.{e}.w1.weight"] for e in range(cfg.E)])  # [E, I, D]
    W3 = torch.stack([P[f"{p}ffn.experts.{e}.w3.weight"] for e in range(cfg.E)])  # [E, I, D]
    W2 = torch.stack([P[f"{p}ffn.experts.{e}.w2.weight"] for e in range(cfg.E)])  # [E, D, I]
    g = torch.einsum("btd,eid->btei", x, W1).clamp(max=cfg.swiglu_limit)
    u = torch.einsum("btd,eid->btei", x, W3).clamp(-cfg.swiglu_limit, cfg.swiglu_limit)
    h = F.silu(g) * u * w.unsqueeze(-1)  # [B, T, E, I]
    out = torch.einsum("btei,edi->btd", h, W2)
    sh = p + "ffn.shared_experts."
    out = out + swiglu(x, P[sh + "w1.weight"], P[sh + "w3.weight"], P[sh + "w2.weight"], cfg.swiglu_limit)
    return out, onehot.sum(dim=(0, 1))


def indexer_scores(qi, w, keys):
    """score[b, t, s] = sum_h w[b,t,h] ReLU(qi[b,t,h] . keys[b,s]); qi [B,T,Hi,di], keys [B,Nc,di]."""
    return torch.einsum("bth,bths->bts", w, F.relu(torch.einsum("bthd,bsd->bths", qi, keys)))


def visible(T, Nc, ratio, device):
    """[T, Nc] bool: compressed row s is visible to the query at position p iff s < (p+1) div ratio."""
    p = torch.arange(T, device=device)
    return torch.arange(Nc, device=device)[None, :] < ((p + 1) // ratio)[:, None]


def indexer_kl(score, allow, q, comp, scale):
    """Indexer training signal (the DSA warm-up loss of DeepSeek-V3.2): KL(target || softmax(
    score)) over the rows the indexer may choose, where target = the layer's dense attention
    over those rows (softmax per head, summed over heads, renormalized), without gradient.
    score [B, T, Nc] (without the factor scale = di^-0.5 Hi^-0.5); allow [T, Nc] or [B, T, Nc]
    bool; q [B, T, H, d]; comp [B, Nc, d]."""
    allow = allow.expand_as(score)
    score = score * scale  # the official head-weight factor: the loss sees the official logits
    neg = -1e9  # finite: a query may have no row to choose yet
    with torch.no_grad():
        s = torch.einsum("bthd,bsd->bths", q, comp) / math.sqrt(q.shape[-1])
        tgt = torch.softmax(s.masked_fill(~allow.unsqueeze(2), neg), dim=-1).sum(2)
        tgt = (tgt / tgt.sum(-1, keepdim=True)).masked_fill(~allow, 0.0)  # [B, T, Nc]
    logp = torch.log_softmax(score.masked_fill(~allow, neg), dim=-1)
    kl = (tgt * (torch.log(tgt.clamp_min(1e-20)) - logp)).masked_fill(~allow, 0.0).sum(-1)  # [B, T]
    rows = allow.any(-1).to(kl.dtype)  # [B, T]
    return (kl * rows).sum() / rows.sum().clamp_min(1)


class Ctx:
    """Per-forward inputs besides the ids: RoPE tables, Engram rows, whether to compute the
    indexer loss. aux collects the expert loads (bias balancing) and the indexer loss."""

    def __init__(self, cfg, T, dtype, device, engram_rows=None, indexer_loss=False):
        self.plain = rope_table(cfg, False, T, dtype, device)
        self.comp = rope_table(cfg, True, T, dtype, device)
        self.engram_rows = engram_rows or {}
        self.indexer_loss = indexer_loss
        self.loads, self.kl = {}, []

    def table(self, ratio):
        return self.comp if ratio > 0 else self.plain

    def at(self, ratio, m, n):
        """cos, sin at positions 0, m, 2m, ... (n of them): compressed rows sit at w*m."""
        c, s = self.table(ratio)
        return c[0:n * m:m], s[0:n * m:m]


# ---- V4 (model-spec §3) ----

def v4_compress(x, P, q, ratio, dc, cfg, ctx):
    """Compressor (§3.6): x [B, T, D] -> rows [B, T div ratio, dc] (RoPE'd at w*ratio)."""
    B, T, _ = x.shape
    nw, m = T // ratio, ratio
    overlap = ratio == 4
    a = x @ P[q + "wkv.weight"].t()  # [B, T, c*dc]
    g = x @ P[q + "wgate.weight"].t() + P[q + "ape"].repeat(math.ceil(T / m), 1)[:T]
    a, g = a[:, :nw * m].unflatten(1, (nw, m)), g[:, :nw * m].unflatten(1, (nw, m))  # [B, nw, m, c*dc]
    if overlap:
        A, Bv, gA, gB = a[..., :dc], a[..., dc:], g[..., :dc], g[..., dc:]
        A_prev = torch.cat([torch.zeros_like(A[:, :1]), A[:, :-1]], dim=1)
        gA_prev = torch.cat([torch.full_like(gA[:, :1], float("-inf")), gA[:, :-1]], dim=1)
        a, g = torch.cat([A_prev, Bv], dim=2), torch.cat([gA_prev, gB], dim=2)  # [B, nw, 2m, dc]
    pooled = (torch.softmax(g, dim=2) * a).sum(2)  # [B, nw, dc]
    c = rms(pooled, P[q + "norm.weight"], cfg.eps)
    cos, sin = ctx.at(ratio, m, nw)
    return rope(c, cos, sin)


def v4_attention(x, P, p, L, cfg, ctx):
    B, T, _ = x.shape
    ratio = cfg.ratios[L]
    cos, sin = ctx.table(ratio)
    qr = rms(x @ P[p + "attn.wq_a.weight"].t(), P[p + "attn.q_norm.weight"], cfg.eps)  # [B, T, q_lora]
    q = (qr @ P[p + "attn.wq_b.weight"].t()).unflatten(-1, (cfg.H, cfg.hd))  # [B, T, H, hd]
    q = rope(rms(q, None, cfg.eps), cos, sin)  # per-head unweighted norm (V4 only)
    kv = rope(rms(x @ P[p + "attn.wkv.weight"].t(), P[p + "attn.kv_norm.weight"], cfg.eps), cos, sin)  # [B, T, hd]
    comp = cmask = None
    if ratio > 0:
        comp = v4_compress(x, P, p + "attn.compressor.", ratio, cfg.hd, cfg, ctx)  # [B, Nc, hd]
        vis = visible(T, comp.shape[1], ratio, x.device)  # [T, Nc]
        cmask = vis.expand(B, T, comp.shape[1])
        if ratio == 4:
            # Lightning indexer (§3.7). Its inputs are detached: it learns from its own loss only,
            # and the selection itself carries no gradient.
            xd, qd = x.detach(), qr.detach()
            keys = v4_compress(xd, P, p + "attn.indexer.compressor.", ratio, cfg.di, cfg, ctx)
            qi = rope((qd @ P[p + "attn.indexer.wq_b.weight"].t()).unflatten(-1, (cfg.Hi, cfg.di)), cos, sin)
            w = xd @ P[p + "attn.indexer.weights_proj.weight"].t()  # [B, T, Hi]
            score = indexer_scores(qi, w, keys).masked_fill(~vis, float("-inf"))
            cmask = topk_mask(score.detach(), cfg.idx_topk)
            if ctx.indexer_loss:
                ctx.kl.append(indexer_kl(score, vis, q.detach(), comp.detach(), (cfg.di * cfg.Hi) ** -0.5))
    o, _ = sparse_attention(q, kv, comp, cmask, P[p + "attn.attn_sink"], cfg)
    return attn_out(o, P, p, cos, sin, cfg)


def v4_forward(P, cfg, ids, ctx):
    """ids [B, T] -> logits [B, T, vocab]."""
    X = P["embed.weight"][ids].unsqueeze(-2).expand(-1, -1, cfg.n, -1)  # [B, T, n, D]
    for L in range(cfg.L):
        p = f"layers.{L}."
        pre, post, C = hc_mixes(X, P[p + "hc_attn_fn"], P[p + "hc_attn_base"], P[p + "hc_attn_scale"], cfg)
        f = v4_attention(rms(collapse(X, pre), P[p + "attn_norm.weight"], cfg.eps), P, p, L, cfg, ctx)
        X = hc_post(f, X, post, C)
        pre, post, C = hc_mixes(X, P[p + "hc_ffn_fn"], P[p + "hc_ffn_base"], P[p + "hc_ffn_scale"], cfg)
        f, ctx.loads[L] = moe(rms(collapse(X, pre), P[p + "ffn_norm.weight"], cfg.eps), P, p, ids, cfg, L < cfg.hash_layers)
        X = hc_post(f, X, post, C)
    xf = X.flatten(-2)
    m = (xf @ P["hc_head_fn"].t()) * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + cfg.eps)  # [B, T, n]
    pre = torch.sigmoid(m * P["hc_head_scale"] + P["hc_head_base"]) + cfg.hc_eps
    return rms(collapse(X, pre), P["norm.weight"], cfg.eps) @ P["head.weight"].t()


# ---- V4.1 (model-spec §4) ----

def v41_engram(X, P, p, rows, cfg):
    """Engram (§4.5): X [B, T, n, D], rows [B, T, cols] table rows -> X."""
    D = cfg.D
    e = P[p + "engram.embed.weight"][rows].flatten(-2)  # [B, T, cols*dim]
    kv = e @ P[p + "engram.wkv.weight"].t()  # [B, T, (n+1)*D]
    keys, value = kv[..., :cfg.n * D].unflatten(-1, (cfg.n, D)), kv[..., cfg.n * D:]  # [B, T, n, D], [B, T, D]
    qk = P[p + "engram.q_weight"] * P[p + "engram.k_weight"]  # [n, D]
    s = (X * qk * keys).sum(-1) * torch.rsqrt(X.pow(2).mean(-1) + cfg.eps) \
        * torch.rsqrt(keys.pow(2).mean(-1) + cfg.eps) / math.sqrt(D)  # [B, T, n]
    gate = torch.sigmoid(torch.sign(s) * torch.sqrt(s.abs().clamp_min(1e-6)))
    return X + gate.unsqueeze(-1) * value.unsqueeze(-2)


def v41_source_rows(x, P, p, ratio, cfg, ctx):
    """A kv source's compressor (§4.3): main rows [B, Nc, hd] and indexer keys [B, Nc, di]."""
    B, T, _ = x.shape
    a = x @ P[p + "attn.compressor.wkv.weight"].t()  # [B, T, hd]
    if ratio == 1:
        pooled = a
    else:
        nw = T // ratio
        g = x @ P[p + "attn.compressor.wgate.weight"].t()
        a, g = a[:, :nw * ratio].unflatten(1, (nw, ratio)), g[:, :nw * ratio].unflatten(1, (nw, ratio))
        pooled = (torch.softmax(g, dim=2) * a).sum(2)  # [B, nw, hd]
    latent = rms(pooled, P[p + "attn.compressor.norm.weight"], cfg.eps)
    cos, sin = ctx.at(ratio, ratio, latent.shape[1])
    keys = rms(latent.detach() @ P[p + "attn.indexer.wk.weight"].t(), P[p + "attn.indexer.k_norm.weight"], cfg.eps)
    return rope(latent, cos, sin), rope(keys, cos, sin)


def v41_candidates(score, vis, ratio, cfg):
    """Candidate rows of the candidate source (§4.3): blocks of cand_bs rows scored by their
    best visible row, the newest visible block always kept, the top cand_topk blocks.
    score [B, T, Nc] (-inf where not visible) -> bool [B, T, Nc]."""
    B, T, Nc = score.shape
    cb = cfg.cand_bs
    nb = math.ceil(Nc / cb)
    pad = torch.full((B, T, nb * cb - Nc), float("-inf"), dtype=score.dtype, device=score.device)
    bs = torch.cat([score, pad], dim=-1).unflatten(-1, (nb, cb)).amax(-1)  # [B, T, nb]
    n_vis = (torch.arange(T, device=score.device) + 1) // ratio  # [T]
    last = ((n_vis - 1) // cb).clamp_min(0)
    newest = (torch.arange(nb, device=score.device)[None, :] == last[:, None]) & (n_vis[:, None] > 0)  # [T, nb]
    bs = bs.masked_fill(newest, float("inf"))
    blocks = topk_mask(bs, cfg.cand_topk)  # [B, T, nb]
    return blocks.repeat_interleave(cb, dim=-1)[..., :Nc] & vis


def v41_attention(x, P, p, L, cfg, ctx, sh):
    B, T, _ = x.shape
    ratio = cfg.ratios[L]
    cos, sin = ctx.table(ratio)
    qr = rms(x @ P[p + "attn.wq_a.weight"].t(), P[p + "attn.q_norm.weight"], cfg.eps)
    q = rope((qr @ P[p + "attn.wq_b.weight"].t()).unflatten(-1, (cfg.H, cfg.hd)), cos, sin)  # no per-head norm
    kv = rope(rms(x @ P[p + "attn.wkv.weight"].t(), P[p + "attn.kv_norm.weight"], cfg.eps), cos, sin)
    comp = cmask = None
    if ratio > 0:
        if L in cfg.kv_src:
            sh["rows"][L], sh["keys"][L] = v41_source_rows(x, P, p, ratio, cfg, ctx)
        src = cfg.source_of(L, cfg.kv_src)
        comp, keys = sh["rows"][src], sh["keys"][src]
        vis = visible(T, comp.shape[1], ratio, x.device)
        if L in cfg.idx_src:
            xd, qd = x.detach(), qr.detach()  # the indexer learns from its own loss only
            qi = rope((qd @ P[p + "attn.indexer.wq_b.weight"].t()).unflatten(-1, (cfg.Hi, cfg.di)), cos, sin)
            w = xd @ P[p + "attn.indexer.weights_proj.weight"].t()
            score = indexer_scores(qi, w, keys).masked_fill(~vis, float("-inf"))
            if L == cfg.cand_src:
                sh["cand"] = v41_candidates(score.detach(), vis, ratio, cfg)
            elif 0 <= cfg.cand_src < L:
                score = score.masked_fill(~sh["cand"], float("-inf"))  # Reindex: inside the pool
            sh["sel"] = topk_mask(score.detach(), cfg.idx_topk)
            if ctx.indexer_loss:
                allow = sh["cand"] if 0 <= cfg.cand_src < L else vis
                ctx.kl.append(indexer_kl(score, allow, q.detach(), comp.detach(), (cfg.di * cfg.Hi) ** -0.5))
        cmask = sh["sel"]
    o, _ = sparse_attention(q, kv, comp, cmask, P[p + "attn.attn_sink"], cfg)
    return attn_out(o, P, p, cos, sin, cfg)


def v41_forward(P, cfg, ids, ctx):
    """ids [B, T] -> logits [B, T, vocab] (single-pass mHC, §4.2)."""
    B, T = ids.shape
    X = P["embed.weight"][ids].unsqueeze(-2).expand(-1, -1, cfg.n, -1)  # [B, T, n, D]
    pre_mix = torch.zeros(B, T, cfg.n, dtype=X.dtype, device=X.device)
    pre_mix[..., 0] = 1.0  # the first attention collapses stream 0
    sh = {"rows": {}, "keys": {}}
    for L in range(cfg.L):
        p = f"layers.{L}."
        if L in cfg.eng_layers:
            X = v41_engram(X, P, p, ctx.engram_rows[L], cfg)
        a_pre, post, C = hc_mixes(X, P[p + "hc_attn_fn"], P[p + "hc_attn_base"], P[p + "hc_attn_scale"], cfg)
        f = v41_attention(rms(collapse(X, pre_mix), P[p + "attn_norm.weight"], cfg.eps), P, p, L, cfg, ctx, sh)
        X = hc_post(f, X, post, C)
        f_pre, post, C = hc_mixes(X, P[p + "hc_ffn_fn"], P[p + "hc_ffn_base"], P[p + "hc_ffn_scale"], cfg)
        f, ctx.loads[L] = moe(rms(collapse(X, a_pre), P[p + "ffn_norm.weight"], cfg.eps), P, p, ids, cfg, False)
        X = hc_post(f, X, post, C)
        pre_mix = f_pre
    return rms(collapse(X, pre_mix), P["norm.weight"], cfg.eps) @ P["head.weight"].t()


def forward(P, cfg, ids, ctx):
    return (v41_forward if cfg.v41 else v4_forward)(P, cfg, ids, ctx)
