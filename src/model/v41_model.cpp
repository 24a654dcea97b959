#include "model/v41_model.h"

#include <algorithm>
#include <cmath>

#include "model/rope.h"
#include "model/step.h"

namespace dil {

V41Model::V41Model(ModelConfig cfg, std::unique_ptr<SafeTensors> st, Backend& be, const ModelOptions& opt,
                   const std::string& tokenizer_json, LoadMeter* meter)
    : cfg_(std::move(cfg)), st_(std::move(st)), be_(be), numerics_(opt.numerics), official_(quantizes(opt.numerics)),
      act_(activation_dtype(opt.numerics)), kv_(stored_kv_rows(cfg_, opt.numerics, be, opt.plain_kv)),
      binder_(*st_, be, cfg_, meter), ep_(opt.comm, cfg_.n_routed), replay_(replay_schedule(cfg_)),
      replay_on_(opt.decoder_replay), layer_rows_(size_t(cfg_.n_layers), 0) {
  if (cfg_.gate_temp != 1.0f) DIL_FAIL("gate_temp ", cfg_.gate_temp, " is not supported (the release uses 1.0)");
  // Layers to build and run: all, or a subset (benchmarks) that must hold the kv / index /
  // candidate sources its layers read.
  std::vector<bool> on(size_t(cfg_.n_layers), opt.layers.empty());
  for (int L : opt.layers) on[size_t(L)] = true;
  bool engram_on = false;
  for (int L : cfg_.engram_layers) engram_on |= L < cfg_.n_layers && on[size_t(L)];
  if (engram_on) {
    if (tokenizer_json.empty())
      DIL_FAIL("Engram layers need the model's tokenizer.json (dummy weights: choose layers without Engram)");
    ehash_ = make_engram_hash(cfg_, build_compressed_token_map(tokenizer_json));
  }
  embed_ = binder_.matrix("embed");
  head_ = binder_.matrix("head");
  norm_ = binder_.tensor("norm.weight");
  const auto tables = make_rope_tables(cfg_, be_, &rope_bufs_);  // [0] plain, [1] YaRN
  layers_.resize(size_t(cfg_.n_layers));
  for (int L = 0; L < cfg_.n_layers; ++L) {
    layers_[size_t(L)].active = on[size_t(L)];
    bind_layer(layers_[size_t(L)], L);
    layers_[size_t(L)].rope = tables[cfg_.ratio(L) > 0 ? 1 : 0];
  }
  if (opt.load_mtp) {
    bind_dspark();  // model/v41_dspark.cpp
    for (Layer& l : dsp_->blocks) l.rope = tables[0];  // SWA only: theta 10000, no YaRN
  }
  binder_.end_load();
}

void V41Model::bind_layer(Layer& l, int L) {
  WeightBinder& b = binder_;
  const std::string p = "layers." + std::to_string(L) + ".";
  auto in = [](const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); };
  l.index = L;
  l.ratio = cfg_.ratio(L);
  l.kv_source = in(cfg_.kv_source_layers, L);
  l.index_source = in(cfg_.index_source_layers, L);
  l.kv_src = l.ratio > 0 ? cfg_.kv_source_of(L) : -1;
  l.idx_src = l.ratio > 0 ? cfg_.index_source_of(L) : -1;
  l.cand_source = l.index_source && L == cfg_.candidate_source_layer;
  l.uses_cand = l.index_source && cfg_.candidate_source_layer >= 0 && cfg_.candidate_source_layer < L;
  if (l.ratio > 0 && (l.kv_src < 0 || l.idx_src < 0))
    DIL_FAIL("layer ", L, " reads compressed rows (ratio ", l.ratio, ") but has no kv source or index source before it");
  if (l.kv_src >= 0 && cfg_.ratio(l.kv_src) != l.ratio)
    DIL_FAIL("layer ", L, " has ratio ", l.ratio, " but its kv source ", l.kv_src, " has ratio ", cfg_.ratio(l.kv_src));
  l.kind = std::string("layer:") +
           (l.ratio == 0 ? "SWA"
                         : (l.kv_source ? "Full" : l.index_source ? "Reindex" : "Reuse") + std::string("-r") +
                               std::to_string(l.ratio));
  if (!l.active) return;
  for (int src : {l.kv_src, l.idx_src, l.uses_cand ? cfg_.candidate_source_layer : -1})
    if (src >= 0 && !layers_[size_t(src)].active)
      DIL_FAIL("layer ", L, " reads layer ", src, "'s compressed rows / selection: a layer subset must include ", src);
  bind_block_weights(b, p, ep_, &l);
  if (l.kv_source) {
    l.cwkv = b.matrix(p + "attn.compressor.wkv");
    if (l.ratio > 1) l.cwgate = b.matrix(p + "attn.compressor.wgate");
    l.cnorm = b.tensor(p + "attn.compressor.norm.weight");
    l.iwk = b.matrix(p + "attn.indexer.wk");
    l.iknorm = b.tensor(p + "attn.indexer.k_norm.weight");
  }
  if (l.index_source) {
    l.iwq_b = b.matrix(p + "attn.indexer.wq_b");
    l.iweights = b.matrix(p + "attn.indexer.weights_proj");
  }
  l.gate_bias = b.tensor(p + "ffn.gate.bias");
  l.gate_bias_vl = b.tensor(p + "ffn.gate.bias_vl");
  for (size_t i = 0; i < cfg_.engram_layers.size(); ++i) {
    if (cfg_.engram_layers[i] != L) continue;
    Engram& e = l.engram;
    l.has_engram = true;
    e.index = int(i);
    e.table = &st_->at(p + "engram.embed.weight");
    e.scale = &st_->at(p + "engram.embed.scale");
    e.wkv = b.matrix(p + "engram.wkv");
    // q_weight and k_weight are only ever used as their product (f32, as HF41 computes it).
    const StEntry& qw = st_->at(p + "engram.q_weight");
    const StEntry& kw = st_->at(p + "engram.k_weight");
    const int64_t n = cfg_.hc_mult, D = cfg_.dim;
    std::vector<float> prod(size_t(n * D));  // [n, D]
    auto val = [](const StEntry& t, int64_t i) {
      return t.dtype == DType::BF16 ? bf16_to_f32(reinterpret_cast<const uint16_t*>(t.data)[i])
                                    : reinterpret_cast<const float*>(t.data)[i];
    };
    for (int64_t k = 0; k < n * D; ++k) prod[size_t(k)] = val(qw, k) * val(kw, k);
    e.qk_buf = be_.alloc(prod.size() * 4);
    e.qk = Tensor(e.qk_buf.data(), DType::F32, {n, D}, be_.device());
    be_.upload(e.qk, prod.data());
  }
}

// Byte counts of the cache layout allocate_cache makes: rows packed in the official formats
// (kv_, fast numerics) or plain in the activation dtype, compressor state f32.
CacheSpec V41Model::cache_spec(int block_tokens) const {
  CacheSpec cs;
  cs.block_tokens = block_tokens;
  const size_t hd = size_t(cfg_.head_dim), di = size_t(cfg_.index_head_dim), W = size_t(cfg_.window);
  const size_t row = kv_row_bytes(kv_.global, int64_t(hd), act_) + kv_row_bytes(kv_.index, int64_t(di), act_);
  for (const Layer& l : layers_) {
    cs.bytes_per_slot += W * kv_row_bytes(kv_.swa, int64_t(hd), act_);
    if (!l.kv_source) continue;
    const size_t m = size_t(l.ratio);
    cs.bytes_per_block += size_t(block_tokens) / m * row;
    if (m > 1) cs.bytes_per_slot += 2 * m * hd * 4;
  }
  cs.bytes_per_slot += size_t(std::max(cfg_.engram_max_ngram - 1, 0)) * 4;
  if (dsp_)  // the DSpark rings
    cs.bytes_per_slot += dsp_->blocks.size() * W * kv_row_bytes(kv_.swa, int64_t(hd), act_);
  return cs;
}

void V41Model::allocate_cache(int n_blocks, int n_slots, int block_tokens) {
  DIL_CHECK(block_tokens % 128 == 0, "block_tokens must be a multiple of 128");
  cache_ = {n_blocks, n_slots, block_tokens};
  const size_t hd = size_t(cfg_.head_dim), di = size_t(cfg_.index_head_dim), W = size_t(cfg_.window);
  for (Layer& l : layers_) {
    if (!l.active) continue;
    l.ring = be_.alloc(size_t(n_slots) * W * kv_row_bytes(kv_.swa, int64_t(hd), act_));
    if (!l.kv_source) continue;
    const size_t m = size_t(l.ratio), rows = size_t(n_blocks) * (size_t(block_tokens) / m);
    l.comp_rows = be_.alloc(rows * kv_row_bytes(kv_.global, int64_t(hd), act_));
    l.idx_rows = be_.alloc(rows * kv_row_bytes(kv_.index, int64_t(di), act_));
    if (m > 1) {
      l.cstate_kv = be_.alloc(size_t(n_slots) * m * hd * 4);
      l.cstate_score = be_.alloc(size_t(n_slots) * m * hd * 4);
    }
  }
  if (dsp_)
    for (Layer& l : dsp_->blocks) l.ring = be_.alloc(size_t(n_slots) * W * kv_row_bytes(kv_.swa, int64_t(hd), act_));
  hist_.assign(size_t(n_slots), {});
  hist_next_.assign(size_t(n_slots), 0);
}

// A kv source's compressor (model-spec §4.3): pre-RoPE latents of the windows completing in
// this step; from them the indexer keys and the main compressed rows of the whole group.
void V41Model::write_source_rows(Layer& l, const Tensor& x, const StepPlan& p, Scratch& s) {
  const StepMeta& m = p.meta;
  const int64_t T = x.size(0), hd = cfg_.head_dim, di = cfg_.index_head_dim;
  const int ratio = l.ratio, rpb = cache_.block_tokens / ratio;
  const EmitPlan& plan = p.emit(ratio);  // planned (and uploaded) with the step
  Tensor a = s.f32({T, hd});  // f32: the compressor's projections and pooling run in fp32
  be_.linear(x, l.cwkv, 0, a);
  Tensor latent;  // [plan.n, hd] activation
  if (ratio == 1) {
    DIL_CHECK(plan.n == T, "ratio-1 compressor: every token emits");
    latent = act(s, {T, hd});
    be_.rms_norm(a, l.cnorm, cfg_.norm_eps, latent);
  } else {
    // Softmax-gated pooling of the m tokens of a window, per channel; no APE, no overlap.
    Tensor st_kv = l.cstate_kv.as(DType::F32, {cache_.n_slots, ratio, hd});
    Tensor st_sc = l.cstate_score.as(DType::F32, {cache_.n_slots, ratio, hd});
    std::vector<int32_t> fresh = fresh_slots(m);
    if (!fresh.empty()) be_.reset_state(st_kv, st_sc, fresh);
    Tensor g = s.f32({T, hd});
    be_.linear(x, l.cwgate, 0, g);
    Tensor pooled = act(s, {std::max(plan.n, 1), hd});
    CompressorArgs ca;
    ca.a = a; ca.g = g; ca.state_kv = st_kv; ca.state_score = st_sc;
    ca.ratio = ratio; ca.overlap = false; ca.dc = int(hd); ca.out = pooled;
    be_.compressor(ca, plan, m);
    if (plan.n == 0) return;
    latent = act(s, {plan.n, hd});
    be_.rms_norm(pooled.rows(0, plan.n), l.cnorm, cfg_.norm_eps, latent);
  }
  const int64_t n = plan.n;
  // Indexer keys from the pre-RoPE latent: k_norm(wk c), RoPE at w*m, FP4 (ue8m0 per 32).
  Tensor k0 = act(s, {n, di}), k = act(s, {n, di});
  be_.linear(latent, l.iwk, 0, k0);
  be_.rms_norm(k0, l.iknorm, cfg_.norm_eps, k);
  be_.rope(k.view({n, 1, di}), plan.pos, l.rope, false);
  if (official_) be_.fp4_qdq(k, 32, false);
  be_.paged_write(k, kv_tensor(l.idx_rows, cache_.n_blocks, rpb, di, kv_.index, act_), rpb, plan, m, kv_.index);
  // Main row: RoPE at w*m, FP4 over all dims with E4M3 scales per 16.
  be_.rope(latent.view({n, 1, hd}), plan.pos, l.rope, false);
  if (official_) be_.fp4_qdq(latent, 16, true);
  be_.paged_write(latent, kv_tensor(l.comp_rows, cache_.n_blocks, rpb, hd, kv_.global, act_), rpb, plan, m,
                  kv_.global);
}

Tensor V41Model::attention(Layer& l, const Tensor& x, const StepMeta& m, Shared& sh, Scratch& s) {
  const int64_t T = x.size(0), H = cfg_.n_heads, hd = cfg_.head_dim;
  const int ab = act_block();
  auto proj = std::make_unique<ProfileScope>(prof_, "projections");
  // Query: wq_b(q_norm(wq_a x)), no per-head norm (V4.1), RoPE on the last rope dims.
  Tensor qa = act(s, {T, cfg_.q_lora_rank}), qr = act(s, {T, cfg_.q_lora_rank});
  be_.linear(x, l.wq_a, ab, qa);
  be_.rms_norm(qa, l.q_norm, cfg_.norm_eps, qr);
  Tensor q = act(s, {T, H, hd});
  be_.linear(qr, l.wq_b, ab, q.view({T, H * hd}));
  be_.rope(q, m.tok_pos, l.rope, false);
  Tensor kv = window_rows(l, x, m.tok_pos, s);

  proj.reset();
  AttnArgs a;
  a.q = q;
  a.kv_new = kv;
  a.ring = kv_tensor(l.ring, cache_.n_slots, cfg_.window, hd, kv_.swa, act_);
  a.ring_pack = kv_.swa;
  a.sink = l.sink;
  a.scale = float(1.0 / std::sqrt(double(hd)));
  a.window = cfg_.window;
  a.non_causal = l.drafter;  // a DSpark draft block: its ring holds the context rows
  if (l.ratio > 0) {
    Layer& src = layers_[size_t(l.kv_src)];
    const int rpb = cache_.block_tokens / l.ratio;
    // A kv source's rows were written by forward() over every token before this (replay may
    // have narrowed x to the trailing rows since).
    if (l.index_source) {
      ProfileScope ps(prof_, "indexer");
      const int64_t Hi = cfg_.index_heads, di = cfg_.index_head_dim;
      Tensor qi = act(s, {T, Hi, di});
      be_.linear(qr, l.iwq_b, ab, qi.view({T, Hi * di}));
      be_.rope(qi, m.tok_pos, l.rope, false);
      if (official_) be_.fp4_qdq(qi.view({T * Hi, di}), 32, false);  // no Hadamard in V4.1
      // The head weights' constant factor di^-0.5 * Hi^-0.5 is positive: it cannot change a
      // selection (rows or candidate blocks), so it is omitted as in V4.
      Tensor w = act(s, {T, Hi});
      be_.linear(x, l.iweights, 0, w);
      IndexerArgs ia;
      ia.q = qi; ia.w = w; ia.ratio = l.ratio; ia.rows_per_block = rpb;
      ia.keys = kv_tensor(src.idx_rows, cache_.n_blocks, rpb, di, kv_.index, act_);
      ia.keys_pack = kv_.index;
      ia.topk = cfg_.index_topk; ia.out_idx = sh.sel; ia.sort_ascending = true;
      if (l.cand_source || l.uses_cand) {
        ia.cand_block = cfg_.candidate_block_size;
        ia.cand_topk = cfg_.candidate_topk_blocks;
        (l.cand_source ? ia.cand_out : ia.cand_in) = sh.cand;
      }
      be_.indexer_topk(ia, m);
    }
    a.comp_ratio = l.ratio;
    a.rows_per_block = rpb;
    a.comp = kv_tensor(src.comp_rows, cache_.n_blocks, rpb, hd, kv_.global, act_);
    a.comp_pack = kv_.global;
    a.comp_idx = sh.sel;  // the latest index source's rows (Reuse layers share them)
  }
  return attention_output(be_, prof_, cfg_, l, a, kv, m, ab, s);
}

// Window rows of x's tokens at positions pos [T]: kv_norm(wkv x), RoPE, FP8 round trip of all
// dims in blocks of 32. -> [T, hd] activation.
Tensor V41Model::window_rows(Layer& l, const Tensor& x, const Tensor& pos, Scratch& s) {
  const int64_t T = x.size(0), hd = cfg_.head_dim;
  Tensor kv0 = act(s, {T, hd}), kv = act(s, {T, hd});
  be_.linear(x, l.wkv, act_block(), kv0);
  be_.rms_norm(kv0, l.kv_norm, cfg_.norm_eps, kv);
  be_.rope(kv.view({T, 1, hd}), pos, l.rope, false);
  if (official_) be_.fp8_qdq(kv, int(hd), 32);
  return kv;
}

Tensor V41Model::moe(Layer& l, const Tensor& x, const ExpertParallel::Step& ep, Scratch& s) {
  const int64_t T = x.size(0), E = l.drafter ? cfg_.dspark_n_routed : cfg_.n_routed;
  const int64_t k = l.drafter ? cfg_.dspark_topk : cfg_.topk;
  const ExpertParallel& epx = l.drafter ? dsp_->ep : ep_;  // the drafter's experts are its own
  auto gate = std::make_unique<ProfileScope>(prof_, "moe gate");
  Tensor logits = s.f32({T, E});
  be_.linear(x, l.gate, 0, logits);
  MoeRouteArgs r;
  r.logits = logits; r.bias = l.gate_bias; r.topk = int(k); r.route_scale = cfg_.route_scale;
  r.norm_eps = k > 1 ? 1e-20f : 0.0f;  // V4.1: +1e-20 on the sum (not rms_norm_eps), only when k > 1
  // Image-span tokens would route with bias_vl through r.bias_vl / r.image_mask; text only for now.
  r.bias_vl = l.gate_bias_vl;
  r.out_w = s.f32({T, k});
  r.out_idx = s.i32({T, k});
  be_.moe_route(r);
  gate.reset();
  Tensor routed = epx.experts(be_, prof_, experts_args(l), x, r.out_w, r.out_idx, ep, s);  // [T, D] f32 routed sum
  ProfileScope ps(prof_, "moe shared");
  Tensor out = act(s, {T, cfg_.dim});  // bf16(routed + shared) in fast numerics, as the official MoE
  be_.add(routed, shared_expert(be_, x, l.sw1, l.sw2, l.sw3, act_block(), cfg_.swiglu_limit, s), out);
  return out;
}

// Engram (model-spec §4.5): hash each position's n-grams to table rows (host), gather and
// dequantize the rows from the memory-mapped table, project with wkv, gate into every stream.
// Only the rows `rows` of each chunk (the layer's input under decoder replay); their n-grams
// reach back into the chunk's earlier tokens and the slot's look-back history.
void V41Model::engram(Layer& l, const StepBatch& batch, const StepMeta& m, const RowSpans& rows_in, const Tensor& X,
                      Tensor out, Scratch& s) {
  const Engram& e = l.engram;
  const int64_t T = total_rows(rows_in), C = ehash_.cols(), hd = cfg_.engram_head_dim, B = hd / 32;
  const int back = ehash_.max_ngram - 1;
  std::vector<int64_t> rows(size_t(T * C));  // [T, C]
  std::vector<int32_t> ids;
  int64_t r0 = 0;  // first row of the chunk in X
  for (int sq = 0; sq < m.n_seqs; ++sq) {
    const int slot = m.h_slot[size_t(sq)], p0 = m.h_start_pos[size_t(sq)], len = m.h_len[size_t(sq)];
    const int q0 = m.h_q_start[size_t(sq)];
    const RowSpan sp = rows_in[size_t(sq)];
    const std::vector<int32_t>& h = hist_[size_t(slot)];
    const int nh = std::min(p0, back);
    DIL_CHECK(int(h.size()) >= nh, "Engram history of slot ", slot, " is short");
    ids.assign(h.end() - nh, h.end());  // positions [p0 - nh, p0 + len)
    ids.insert(ids.end(), batch.tokens.begin() + q0, batch.tokens.begin() + q0 + len);
    // Queries at [p0 + begin, p0 + end) with their own look-back of min(p, back) tokens.
    const int64_t pb = p0 + sp.begin, hb = std::min<int64_t>(pb, back);
    engram_rows(ehash_, e.index, ids.data() + (pb - hb - (p0 - nh)), nullptr, pb, sp.size(), rows.data() + r0 * C);
    r0 += sp.size();
  }
  const int64_t n_rows = e.table->shape[0];
  std::vector<float> emb(size_t(T * C * hd));  // [T, C*hd]
  const uint8_t* wt = e.table->data;
  const uint8_t* sc = e.scale->data;
  for (int64_t i = 0; i < T * C; ++i) {
    const int64_t r = rows[size_t(i)];
    DIL_CHECK(r >= 0 && r < n_rows, "Engram row ", r, " outside the table (", n_rows, " rows)");
    for (int64_t c = 0; c < hd; ++c)
      emb[size_t(i * hd + c)] = e4m3_to_f32(wt[r * hd + c]) * e8m0_to_f32(sc[r * B + c / 32]);
  }
  // The dequantized rows (e4m3 x 2^k) are exact in bf16: the activation dtype holds them.
  Tensor et = act(s, {T, C * hd}), kv = act(s, {T, (cfg_.hc_mult + 1) * cfg_.dim});
  if (act_ == DType::BF16) {
    std::vector<uint16_t> e16(emb.size());
    for (size_t i = 0; i < emb.size(); ++i) e16[i] = f32_to_bf16(emb[i]);
    be_.upload(et, e16.data());
  } else {
    be_.upload(et, emb.data());
  }
  be_.linear(et, e.wkv, act_block(), kv);
  be_.engram_mix(X, kv, e.qk, Tensor(), cfg_.norm_eps, out);
}

MoeExpertsArgs V41Model::experts_args(Layer& l) const {
  MoeExpertsArgs e;
  e.w1 = &l.w1; e.w2 = &l.w2; e.w3 = &l.w3;
  e.act_block = act_block(); e.swiglu_limit = cfg_.swiglu_limit;
  e.round_bf16 = numerics_ == Numerics::Fast;
  return e;
}

// A rank without tokens in a step where another rank has some: no attention or Engram (they
// are per rank), but every active layer's MoE collectives, with padding rows only.
void V41Model::forward_idle(const ExpertParallel::Step& ep) {
  for (Layer& l : layers_) {
    if (!l.active) continue;
    Scratch s(be_);
    Tensor x = act(s, {0, cfg_.dim}), w = s.f32({0, cfg_.topk}), idx = s.i32({0, cfg_.topk});
    ep_.routed(be_, prof_, experts_args(l), x, w, idx, ep, s);
  }
}

void V41Model::forward(const StepBatch& batch, std::vector<float>* logits) { run_step(batch, logits, nullptr); }

Tensor V41Model::forward_device(const StepBatch& batch) {
  Tensor lg;
  run_step(batch, nullptr, &lg);
  return lg;
}

Tensor V41Model::one_hot_pre(int64_t T) {
  const int64_t n = cfg_.hc_mult;
  if (T > one_hot_rows_) {  // an upload: callers ask before their first kernel
    one_hot_rows_ = std::max(T, 2 * one_hot_rows_);
    std::vector<float> h(size_t(one_hot_rows_ * n), 0.0f);  // [rows, n]
    for (int64_t t = 0; t < one_hot_rows_; ++t) h[size_t(t * n)] = 1.0f;
    one_hot_ = be_.alloc(h.size() * 4);
    be_.upload(Tensor(one_hot_.data(), DType::F32, {one_hot_rows_, n}, be_.device()), h.data());
  }
  return Tensor(one_hot_.data(), DType::F32, {T, n}, be_.device());
}

void V41Model::run_step(const StepBatch& batch, std::vector<float>* logits, Tensor* dev) {
  std::vector<float> none;  // forward_device: no host logits
  if (!logits) logits = &none;
  DIL_CHECK(cache_.n_slots > 0, "allocate_cache before forward");
  std::fill(layer_rows_.begin(), layer_rows_.end(), 0);
  Scratch step(be_);
  ExpertParallel::Step ep;
  if (ep_.on()) {
    // Every rank's token count, agreed on the host before any device work of the step.
    logits->clear();
    if (!ep_.begin(batch, int(cfg_.topk), be_, step, &ep)) return;  // nobody has work
    if (batch.tokens.empty()) {
      forward_idle(ep);
      return;
    }
  }
  std::vector<int> ratios;  // every kv source's emits planned with the step
  for (const Layer& l : layers_)
    if (l.active && l.kv_source) ratios.push_back(l.ratio);
  StepPlan p = plan_step(batch, cache_.block_tokens, be_, ratios);
  const StepMeta& m = p.meta;
  const int64_t T = m.n_tokens, D = cfg_.dim, n = cfg_.hc_mult;
  for (int sq = 0; sq < m.n_seqs; ++sq) {
    const int slot = m.h_slot[size_t(sq)], p0 = m.h_start_pos[size_t(sq)];
    DIL_CHECK(slot >= 0 && slot < cache_.n_slots, "slot out of range");
    if (p0 == 0) hist_[size_t(slot)].clear();
    else DIL_CHECK(hist_next_[size_t(slot)] == p0 || hist_next_[size_t(slot)] == kSynthetic, "slot ", slot,
                   " continues at ", p0, " but its state ends at ", hist_next_[size_t(slot)]);
  }

  const Tensor one_hot = one_hot_pre(T);  // before the step's first kernel (step.h: no upload mid-forward)
  DsparkStep ds;  // the drafter's context rows of this step (their layout uploaded now too)
  if (dsp_) ds = plan_dspark(batch, m, step);
  Tensor means;   // [targets, ds.rows, D] the stream means at the targets' entries
  if (dsp_) means = act(step, {int64_t(dsp_->record.size()), std::max<int64_t>(ds.rows, 1), D});

  auto other = std::make_unique<ProfileScope>(prof_, "embed+head");
  Tensor e = act(step, {T, D});
  be_.embed(embed_, p.ids, e);
  // Step-sized buffers; under decoder replay each layer uses the first R rows (its rows).
  Tensor X = act(step, {T, n, D}), X2 = act(step, {T, n, D});  // residual streams
  be_.hc_expand(e, int(n), X);
  other.reset();
  // Single-pass mHC: each sublayer collapses with the previous sublayer's pre; the first
  // attention collapses stream 0 alone.
  Tensor pre_mix = step.f32({T, n}), a_pre = step.f32({T, n}), f_pre = step.f32({T, n});
  be_.copy(pre_mix, one_hot);
  const int64_t K = std::max(cfg_.index_topk, 1), CK = std::max(cfg_.candidate_topk_blocks, 1);
  Shared sh{step.i32({T, K}), step.i32({T, CK})}, sh2;  // sh2: gather targets, made when replay narrows
  bool sel_set = false, cand_set = false;  // written by an index / candidate source in this step

  // Decoder replay (model/replay.h): the rows each layer computes. `cur` are the rows X,
  // pre_mix and the shared selections hold, `cm` the same rows as a step.
  const std::vector<LayerSpans> spans = plan_replay(replay_, batch, replay_on_);
  RowSpans cur;
  for (const SeqChunk& c : batch.seqs) cur.push_back({0, c.n_tokens});
  const RowSpans whole = cur;
  StepMeta cm = m;
  auto narrow = [&](const RowSpans& to, bool with_pre) {
    const int64_t R0 = total_rows(cur), R1 = total_rows(to);
    gather_rows(be_, X.rows(0, R0), cur, X2.rows(0, R1), to);
    std::swap(X, X2);
    if (with_pre) {  // f_pre is free until the ffn's hc_mix writes it
      gather_rows(be_, pre_mix.rows(0, R0), cur, f_pre.rows(0, R1), to);
      std::swap(pre_mix, f_pre);
    }
    if (sel_set) {
      if (sh2.sel.empty()) sh2.sel = step.i32({T, K});
      gather_rows(be_, sh.sel.rows(0, R0), cur, sh2.sel.rows(0, R1), to);
      std::swap(sh.sel, sh2.sel);
    }
    if (cand_set) {
      if (sh2.cand.empty()) sh2.cand = step.i32({T, CK});
      gather_rows(be_, sh.cand.rows(0, R0), cur, sh2.cand.rows(0, R1), to);
      std::swap(sh.cand, sh2.cand);
    }
    cur = to;
    cm = to == whole ? m : sub_meta(m, to, be_, step.storage());
  };

  for (Layer& l : layers_) {
    if (!l.active) continue;
    ProfileScope layer_scope(prof_, l.kind.c_str());
    Scratch s(be_);  // this layer's temporaries
    const LayerSpans& ls = spans[size_t(l.index)];
    if (!(cur == ls.x)) narrow(ls.x, true);  // a layer subset (benchmarks) skipped the layers between
    int64_t R = cm.n_tokens;
    if (l.has_engram) {
      ProfileScope ps(prof_, "engram");
      engram(l, batch, m, cur, X.rows(0, R), X2.rows(0, R), s);
      std::swap(X, X2);
    }
    if (dsp_) dspark_record(l.index, X.rows(0, R), cur, ds, means, s);  // the block's input, after Engram
    auto mhc = std::make_unique<ProfileScope>(prof_, "mhc+norms");
    Tensor xn = act(s, {R, D}), post, comb;  // post [R, n], comb [R, n, n] f32 once R is final
    HcArgs ha{l.hc_attn.fn, l.hc_attn.base, l.hc_attn.scale, cfg_.hc_mult, cfg_.hc_iters, cfg_.norm_eps, cfg_.hc_eps};
    if (!ls.trims()) {
      // The attention's collapse (with the previous sublayer's pre) and its own mix run on the
      // same rows: one fused op.
      post = s.f32({R, n});
      comb = s.f32({R, n, n});
      be_.hc_pre(X.rows(0, R), ha, pre_mix.rows(0, R), l.attn_norm, a_pre.rows(0, R), post, comb, xn);
    } else {
      Tensor u = act(s, {R, D});
      be_.hc_collapse(X.rows(0, R), pre_mix.rows(0, R), u);
      be_.rms_norm(u, l.attn_norm, cfg_.norm_eps, xn);
    }
    mhc.reset();
    if (l.kv_source) {  // compressed rows and indexer keys of every token, before any layer reads them
      DIL_CHECK(cur == whole, "layer ", l.index, " is a kv source but replay narrowed its rows");
      ProfileScope ps(prof_, "compressors");
      write_source_rows(l, xn, p, s);
    }
    if (ls.trims()) {
      // Rows whose window row the next rows' attention (or the next step) reads, but whose
      // output no later layer needs: their window rows only, written into the ring now (the
      // attention below reads positions before its rows from there).
      if (total_rows(ls.head) > 0) {
        ProfileScope ps(prof_, "projections");
        StepMeta hm = sub_meta(m, ls.head, be_, s.storage());
        Tensor xh = act(s, {hm.n_tokens, D});  // [head rows, D]
        gather_rows(be_, xn, cur, xh, ls.head);
        be_.ring_write(window_rows(l, xh, hm.tok_pos, s),
                       kv_tensor(l.ring, cache_.n_slots, cfg_.window, cfg_.head_dim, kv_.swa, act_), hm, kv_.swa);
      }
      Tensor xo = act(s, {total_rows(ls.out), D});  // [out rows, D]
      gather_rows(be_, xn, cur, xo, ls.out);
      xn = xo;
      narrow(ls.out, false);
      R = cm.n_tokens;
    }
    layer_rows_[size_t(l.index)] = R;
    Tensor Xr = X.rows(0, R), X2r = X2.rows(0, R);
    if (ls.trims()) {  // the mix of the rows replay kept
      post = s.f32({R, n});
      comb = s.f32({R, n, n});
      mhc = std::make_unique<ProfileScope>(prof_, "mhc+norms");
      be_.hc_mix(Xr, ha, a_pre.rows(0, R), post, comb);
      mhc.reset();
    }
    Shared shr{sh.sel.rows(0, R), sh.cand.rows(0, R)};
    Tensor f = attention(l, xn, cm, shr, s);
    sel_set |= l.index_source;
    cand_set |= l.cand_source;
    mhc = std::make_unique<ProfileScope>(prof_, "mhc+norms");
    be_.hc_post(f, Xr, post, comb, X2r);
    std::swap(X, X2);
    std::swap(Xr, X2r);
    HcArgs hf{l.hc_ffn.fn, l.hc_ffn.base, l.hc_ffn.scale, cfg_.hc_mult, cfg_.hc_iters, cfg_.norm_eps, cfg_.hc_eps};
    // Single pass: the ffn collapses with the attention's pre while it mixes its own.
    Tensor xf = act(s, {R, D});
    be_.hc_pre(Xr, hf, a_pre.rows(0, R), l.ffn_norm, f_pre.rows(0, R), post, comb, xf);
    mhc.reset();
    f = moe(l, xf, ep, s);
    mhc = std::make_unique<ProfileScope>(prof_, "mhc+norms");
    be_.hc_post(f, Xr, post, comb, X2r);
    std::swap(X, X2);
    std::swap(pre_mix, f_pre);
  }
  if (dsp_) {
    ProfileScope ps(prof_, "dspark context");
    dspark_context(ds, means, step);
  }
  // Engram look-back for the next step of each sequence.
  for (int sq = 0; sq < m.n_seqs; ++sq) {
    const int slot = m.h_slot[size_t(sq)], q0 = m.h_q_start[size_t(sq)], len = m.h_len[size_t(sq)];
    std::vector<int32_t>& h = hist_[size_t(slot)];
    h.insert(h.end(), batch.tokens.begin() + q0, batch.tokens.begin() + q0 + len);
    const size_t keep = size_t(std::max(cfg_.engram_max_ngram - 1, 0));
    if (h.size() > keep) h.erase(h.begin(), h.end() - ptrdiff_t(keep));
    // A synthesized context (benchmarks re-run one step) stays synthetic until a fresh start.
    if (hist_next_[size_t(slot)] != kSynthetic || m.h_start_pos[size_t(sq)] == 0)
      hist_next_[size_t(slot)] = m.h_start_pos[size_t(sq)] + len;
  }

  ProfileScope head_scope(prof_, "embed+head");
  const std::vector<int64_t> rows = logit_rows(batch, cm);  // rows of X after the last layer
  const int64_t R = int64_t(rows.size());
  if (!dev) logits->assign(size_t(R * cfg_.vocab_size), 0.0f);
  if (R == 0) return;
  // No hc head: collapse with the last sublayer's pre, final norm, fp32 head.
  Tensor Xh = act(step, {R, n, D}), ph = step.f32({R, n});
  copy_rows(be_, X, rows, Xh);
  copy_rows(be_, pre_mix, rows, ph);
  Tensor h = act(step, {R, D}), hn = act(step, {R, D});
  Tensor lg = dev ? device_logits(be_, R, cfg_.vocab_size) : step.f32({R, cfg_.vocab_size});  // [R, V] f32
  be_.hc_collapse(Xh, ph, h);
  be_.rms_norm(h, norm_, cfg_.norm_eps, hn);
  be_.linear(hn, head_, 0, lg);
  if (dev) *dev = lg;
  else be_.download(logits->data(), lg);
}

}  // namespace dil

namespace dil {

// Random contents for every cache buffer of the active layers and a synthetic Engram look-back:
// a long context synthesized for the benchmarks (any start position is then accepted).
void V41Model::randomize_cache(uint64_t seed) {
  std::vector<Layer*> all;  // the active layers, then the DSpark blocks (their rings)
  for (Layer& l : layers_)
    if (l.active) all.push_back(&l);
  if (dsp_)
    for (Layer& l : dsp_->blocks) all.push_back(&l);
  for (Layer* lp : all) {
    Layer& l = *lp;
    const std::pair<Buffer*, const kvpack::RowShape*> caches[] = {
        {&l.ring, &kv_.swa}, {&l.comp_rows, &kv_.global}, {&l.idx_rows, &kv_.index}};
    for (auto [b, pack] : caches) {
      if (pack->packed()) fill_uniform_packed(be_, *b, seed++, *pack);  // quantized by the packing
      else fill_uniform(be_, *b, seed++, act_);
    }
    for (Buffer* b : {&l.cstate_kv, &l.cstate_score}) fill_uniform(be_, *b, seed++);
    if (!official_ || kv_.swa.packed()) continue;
    // The rows as compress() and attention() write them (QDQ'd at the official points), so a
    // synthesized context takes the same kernel paths as a real one.
    const int64_t hd = cfg_.head_dim, di = cfg_.index_head_dim;
    auto rows = [&](Buffer& b, int64_t w) { return b.as(act_, {int64_t(b.bytes() / dtype_size(act_)) / w, w}); };
    if (l.ring.data()) be_.fp8_qdq(rows(l.ring, hd), int(hd), 32);
    if (l.comp_rows.data()) be_.fp4_qdq(rows(l.comp_rows, hd), 16, true);
    if (l.idx_rows.data()) be_.fp4_qdq(rows(l.idx_rows, di), 32, false);
  }
  const size_t keep = size_t(std::max(cfg_.engram_max_ngram - 1, 0));
  for (size_t i = 0; i < hist_.size(); ++i) {
    hist_[i].assign(keep, cfg_.bos_id);
    hist_next_[i] = kSynthetic;
  }
}

}  // namespace dil
