#include "model/v4_model.h"

#include <algorithm>
#include <cmath>

#include "model/rope.h"
#include "model/step.h"

namespace dil {

V4Model::V4Model(ModelConfig cfg, std::unique_ptr<SafeTensors> st, Backend& be, const ModelOptions& opt,
                 LoadMeter* meter)
    : cfg_(std::move(cfg)), st_(std::move(st)), be_(be), numerics_(opt.numerics), official_(quantizes(opt.numerics)),
      act_(activation_dtype(opt.numerics)), kv_(stored_kv_rows(cfg_, opt.numerics, be, opt.plain_kv)),
      binder_(*st_, be, cfg_, meter), ep_(opt.comm, cfg_.n_routed) {
  embed_ = binder_.matrix("embed");
  head_ = binder_.matrix("head");
  norm_ = binder_.tensor("norm.weight");
  hc_head_ = {binder_.tensor("hc_head_fn"), binder_.tensor("hc_head_base"), binder_.tensor("hc_head_scale")};
  // Two RoPE tables: plain (ratio-0 layers) and compressed (compress_rope_theta + YaRN).
  const auto tables = make_rope_tables(cfg_, be_, &rope_bufs_);  // [0] plain, [1] YaRN
  std::vector<int> ids = opt.layers;
  if (ids.empty())
    for (int L = 0; L < cfg_.n_layers; ++L) ids.push_back(L);
  layers_.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    Layer& l = layers_[i];
    const int L = ids[i];
    l.id = L;
    bind_block(l, "layers." + std::to_string(L) + ".", cfg_.ratio(L), cfg_.is_hash_layer(L));
    l.rope = tables[l.ratio > 0 ? 1 : 0];
  }
  if (opt.load_mtp) {
    bind_mtp();
    mtp_->block.rope = tables[0];
  }
  binder_.end_load();
}

void V4Model::bind_block(Layer& l, const std::string& p, int ratio, bool hash) {
  WeightBinder& b = binder_;
  l.ratio = ratio;
  bind_block_weights(b, p, ep_, &l);
  if (ratio > 0) {
    auto bind_comp = [&](Compressor& c, const std::string& q, int dc) {
      c.wkv = b.matrix(q + "wkv");
      c.wgate = b.matrix(q + "wgate");
      c.ape = b.tensor(q + "ape");
      c.norm = b.tensor(q + "norm.weight");
      c.dc = dc;
      c.overlap = ratio == 4;
    };
    bind_comp(l.comp, p + "attn.compressor.", cfg_.head_dim);
    if (ratio == 4) {
      bind_comp(l.icomp, p + "attn.indexer.compressor.", cfg_.index_head_dim);
      l.iwq_b = b.matrix(p + "attn.indexer.wq_b");
      l.iweights = b.matrix(p + "attn.indexer.weights_proj");
    }
  }
  if (hash) l.tid2eid = b.table_i32(p + "ffn.gate.tid2eid");
  else l.gate_bias = b.tensor(p + "ffn.gate.bias");
}

// Byte counts of the cache layout this model allocates (see allocate_cache): rows packed in the
// official formats (kv_, fast numerics) or plain in the activation dtype, compressor state f32.
CacheSpec V4Model::cache_spec(int block_tokens) const {
  CacheSpec cs;
  cs.block_tokens = block_tokens;
  const size_t hd = size_t(cfg_.head_dim), di = size_t(cfg_.index_head_dim), W = size_t(cfg_.window);
  const size_t es = dtype_size(act_);
  const size_t row = kv_row_bytes(kv_.global, int64_t(hd), act_), key = kv_row_bytes(kv_.index, int64_t(di), act_);
  // MTP: its window ring and the streams of the last computed position (hidden).
  if (mtp_) cs.bytes_per_slot += W * kv_row_bytes(kv_.swa, int64_t(hd), act_) + size_t(cfg_.hc_mult) * size_t(cfg_.dim) * es;
  for (const Layer& l : layers_) {
    cs.bytes_per_slot += W * kv_row_bytes(kv_.swa, int64_t(hd), act_);
    if (l.ratio == 0) continue;
    size_t m = size_t(l.ratio);
    cs.bytes_per_block += size_t(block_tokens) / m * row;
    cs.bytes_per_slot += 2 * (l.comp.overlap ? 2 * m * 2 * hd : m * hd) * 4;
    if (l.ratio == 4) {
      cs.bytes_per_block += size_t(block_tokens) / 4 * key;
      cs.bytes_per_slot += 2 * (2 * m * 2 * di) * 4;
    }
  }
  return cs;
}

void V4Model::allocate_cache(int n_blocks, int n_slots, int block_tokens) {
  DIL_CHECK(block_tokens % 128 == 0, "block_tokens must be a multiple of 128");
  cache_ = {n_blocks, n_slots, block_tokens};
  const size_t hd = size_t(cfg_.head_dim), di = size_t(cfg_.index_head_dim), W = size_t(cfg_.window);
  const size_t es = dtype_size(act_);
  const size_t row = kv_row_bytes(kv_.global, int64_t(hd), act_), key = kv_row_bytes(kv_.index, int64_t(di), act_);
  if (mtp_) {
    mtp_->block.ring_slots = n_slots + kDraftSlots;
    mtp_->block.ring = be_.alloc(size_t(n_slots + kDraftSlots) * W * kv_row_bytes(kv_.swa, int64_t(hd), act_));
    mtp_->hidden = be_.alloc(size_t(n_slots) * size_t(cfg_.hc_mult) * size_t(cfg_.dim) * es);
  }
  for (Layer& l : layers_) {
    l.ring = be_.alloc(size_t(n_slots) * W * kv_row_bytes(kv_.swa, int64_t(hd), act_));
    if (l.ratio == 0) continue;
    size_t m = size_t(l.ratio);
    l.comp_rows = be_.alloc(size_t(n_blocks) * (size_t(block_tokens) / m) * row);
    size_t cs = size_t(n_slots) * (l.comp.overlap ? 2 * m * 2 * hd : m * hd) * 4;
    l.cstate_kv = be_.alloc(cs);
    l.cstate_score = be_.alloc(cs);
    if (l.ratio == 4) {
      l.idx_rows = be_.alloc(size_t(n_blocks) * (size_t(block_tokens) / 4) * key);
      size_t is = size_t(n_slots) * 2 * m * 2 * di * 4;
      l.istate_kv = be_.alloc(is);
      l.istate_score = be_.alloc(is);
    }
  }
}

void V4Model::hc_pre(const Tensor& X, const Hc& hc, const Tensor& norm_w, Tensor xn, Tensor post, Tensor comb,
                     Scratch& s) {
  const int64_t T = X.size(0), n = cfg_.hc_mult;
  Tensor pre = s.f32({T, n});
  HcArgs a{hc.fn, hc.base, hc.scale, cfg_.hc_mult, cfg_.hc_iters, cfg_.norm_eps, cfg_.hc_eps};
  be_.hc_pre(X, a, Tensor(), norm_w, pre, post, comb, xn);
}

void V4Model::compress(Layer& l, Compressor& c, const Tensor& x, Buffer& skv, Buffer& sscore, Buffer& rows_cache,
                       int dc, bool indexer, const StepPlan& p, Scratch& s) {
  const StepMeta& m = p.meta;
  const int64_t T = x.size(0);
  const int ratio = l.ratio, coff = c.overlap ? 2 : 1, srows = coff * ratio;
  const int rpb = cache_.block_tokens / ratio;
  Tensor st_kv = skv.as(DType::F32, {cache_.n_slots, srows, coff * dc});
  Tensor st_sc = sscore.as(DType::F32, {cache_.n_slots, srows, coff * dc});
  std::vector<int32_t> fresh = fresh_slots(m);
  if (!fresh.empty()) be_.reset_state(st_kv, st_sc, fresh);
  const EmitPlan& plan = p.emit(ratio);  // planned (and uploaded) with the step
  // The pooling runs in f32 (official: x.float() times f32 weights); the pooled row is then an
  // activation (bf16(pooled) in fast numerics).
  Tensor a = s.f32({T, coff * dc}), g = s.f32({T, coff * dc});
  be_.linear(x, c.wkv, 0, a);
  be_.linear(x, c.wgate, 0, g);
  Tensor pooled = act(s, {plan.n, dc});
  CompressorArgs ca;
  ca.a = a; ca.g = g; ca.ape = c.ape; ca.state_kv = st_kv; ca.state_score = st_sc;
  ca.ratio = ratio; ca.overlap = c.overlap; ca.dc = dc; ca.out = pooled;
  be_.compressor(ca, plan, m);
  if (plan.n == 0) return;
  Tensor rn = act(s, {plan.n, dc});
  be_.rms_norm(pooled, c.norm, cfg_.norm_eps, rn);
  // RoPE at the window's first position w*m (model-spec §3.6).
  be_.rope(rn.view({plan.n, 1, dc}), plan.pos, l.rope, false);
  if (official_) {
    if (indexer) {
      be_.hadamard(rn);
      be_.fp4_qdq(rn, 32, false);
    } else {
      be_.fp8_qdq(rn, dc - cfg_.rope_dims, 64);
    }
  }
  const kvpack::RowShape& pack = indexer ? kv_.index : kv_.global;
  be_.paged_write(rn, kv_tensor(rows_cache, cache_.n_blocks, rpb, dc, pack, act_), rpb, plan, m, pack);
}

Tensor V4Model::attention(Layer& l, const Tensor& x, const StepPlan& p, Scratch& s) {
  const StepMeta& m = p.meta;
  const int64_t T = x.size(0), H = cfg_.n_heads, hd = cfg_.head_dim;
  const int ab = act_block(), rd = cfg_.rope_dims;
  auto proj = std::make_unique<ProfileScope>(prof_, "projections");
  // Query path: q_norm(wq_a x) also feeds the indexer.
  Tensor qa = act(s, {T, cfg_.q_lora_rank}), qr = act(s, {T, cfg_.q_lora_rank});
  be_.linear(x, l.wq_a, ab, qa);
  be_.rms_norm(qa, l.q_norm, cfg_.norm_eps, qr);
  Tensor q0 = act(s, {T, H, hd}), q = act(s, {T, H, hd});
  be_.linear(qr, l.wq_b, ab, q0.view({T, H * hd}));
  be_.rms_norm(q0.view({T * H, hd}), Tensor(), cfg_.norm_eps, q.view({T * H, hd}));  // per-head, unweighted (V4)
  be_.rope(q, m.tok_pos, l.rope, false);
  // Window KV row of every token: kv_norm(wkv x), RoPE, FP8 round trip of the nope dims.
  Tensor kv0 = act(s, {T, hd}), kv = act(s, {T, hd});
  be_.linear(x, l.wkv, ab, kv0);
  be_.rms_norm(kv0, l.kv_norm, cfg_.norm_eps, kv);
  be_.rope(kv.view({T, 1, hd}), m.tok_pos, l.rope, false);
  if (official_) be_.fp8_qdq(kv, int(hd) - rd, 64);

  proj.reset();
  AttnArgs a;
  a.q = q;
  a.kv_new = kv;
  a.ring = kv_tensor(l.ring, l.ring_slots ? l.ring_slots : cache_.n_slots, cfg_.window, hd, kv_.swa, act_);
  a.ring_pack = kv_.swa;
  a.sink = l.sink;
  a.scale = float(1.0 / std::sqrt(double(hd)));
  a.window = cfg_.window;
  if (l.ratio > 0) {
    {
      ProfileScope ps(prof_, "compressors");
      compress(l, l.comp, x, l.cstate_kv, l.cstate_score, l.comp_rows, int(hd), false, p, s);
    }
    a.comp_ratio = l.ratio;
    a.rows_per_block = cache_.block_tokens / l.ratio;
    a.comp = kv_tensor(l.comp_rows, cache_.n_blocks, a.rows_per_block, hd, kv_.global, act_);
    a.comp_pack = kv_.global;
    if (l.ratio == 4) {
      // Lightning indexer (model-spec §3.7).
      const int64_t Hi = cfg_.index_heads, di = cfg_.index_head_dim;
      {
        ProfileScope ps(prof_, "compressors");
        compress(l, l.icomp, x, l.istate_kv, l.istate_score, l.idx_rows, int(di), true, p, s);
      }
      ProfileScope ps(prof_, "indexer");
      Tensor qi = act(s, {T, Hi, di});
      be_.linear(qr, l.iwq_b, ab, qi.view({T, Hi * di}));
      be_.rope(qi, m.tok_pos, l.rope, false);
      if (official_) {
        be_.hadamard(qi.view({T * Hi, di}));
        be_.fp4_qdq(qi.view({T * Hi, di}), 32, false);
      }
      // The official weights are scaled by di^-0.5 * Hi^-0.5; a positive constant factor does
      // not change the top-k selection, which is all the scores are used for, so it is omitted.
      Tensor w = act(s, {T, Hi});
      be_.linear(x, l.iweights, 0, w);
      Tensor idx = s.i32({T, cfg_.index_topk});
      IndexerArgs ia;
      ia.q = qi; ia.w = w; ia.ratio = 4; ia.rows_per_block = cache_.block_tokens / 4;
      ia.keys = kv_tensor(l.idx_rows, cache_.n_blocks, ia.rows_per_block, di, kv_.index, act_);
      ia.keys_pack = kv_.index;
      ia.topk = cfg_.index_topk; ia.out_idx = idx;
      be_.indexer_topk(ia, m);
      a.comp_idx = idx;
    }
  }
  return attention_output(be_, prof_, cfg_, l, a, kv, m, ab, s);
}

Tensor V4Model::moe(Layer& l, const Tensor& x, const Tensor& ids, const ExpertParallel::Step& ep, Scratch& s) {
  const int64_t T = x.size(0), E = cfg_.n_routed, k = cfg_.topk;
  auto gate = std::make_unique<ProfileScope>(prof_, "moe gate");
  Tensor logits = s.f32({T, E});
  be_.linear(x, l.gate, 0, logits);
  MoeRouteArgs r;
  r.logits = logits; r.bias = l.gate_bias; r.tid2eid = l.tid2eid; r.ids = ids;
  r.topk = int(k); r.route_scale = cfg_.route_scale; r.norm_eps = 0.0f;  // V4: no eps (M4)
  r.out_w = s.f32({T, k});
  r.out_idx = s.i32({T, k});
  be_.moe_route(r);
  gate.reset();
  Tensor routed = ep_.experts(be_, prof_, experts_args(l), x, r.out_w, r.out_idx, ep, s);  // [T, D] f32 routed sum
  ProfileScope ps(prof_, "moe shared");
  Tensor out = act(s, {T, cfg_.dim});  // bf16(routed + shared) in fast numerics, as the official MoE
  be_.add(routed, shared_expert(be_, x, l.sw1, l.sw2, l.sw3, act_block(), cfg_.swiglu_limit, s), out);
  return out;
}

void V4Model::forward(const StepBatch& batch, std::vector<float>* logits) { run_step(batch, logits, nullptr); }

Tensor V4Model::forward_device(const StepBatch& batch) {
  Tensor lg;
  run_step(batch, nullptr, &lg);
  return lg;
}

void V4Model::run_step(const StepBatch& batch, std::vector<float>* logits, Tensor* dev) {
  std::vector<float> none;  // forward_device: no host logits
  if (!logits) logits = &none;
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
  DIL_CHECK(cache_.n_slots > 0, "allocate_cache before forward");
  std::vector<int> ratios;  // every compressor's emits planned with the step
  for (const Layer& l : layers_) ratios.push_back(l.ratio);
  StepPlan p = plan_step(batch, cache_.block_tokens, be_, ratios);
  const StepMeta& m = p.meta;
  const int64_t T = m.n_tokens, D = cfg_.dim, n = cfg_.hc_mult;
  for (int s = 0; s < m.n_seqs; ++s)
    DIL_CHECK(m.h_slot[size_t(s)] >= 0 && m.h_slot[size_t(s)] < cache_.n_slots, "slot out of range");

  auto other = std::make_unique<ProfileScope>(prof_, "embed+head");
  Tensor e = act(step, {T, D});
  be_.embed(embed_, p.ids, e);
  Tensor X = act(step, {T, n, D}), X2 = act(step, {T, n, D});  // residual streams
  be_.hc_expand(e, int(n), X);
  other.reset();
  for (Layer& l : layers_) {
    ProfileScope layer_scope(prof_, l.ratio == 0 ? "layer:SWA" : l.ratio == 4 ? "layer:CSA" : "layer:HCA");
    Scratch s(be_);  // this layer's temporaries
    Tensor xn = act(s, {T, D}), post = s.f32({T, n}), comb = s.f32({T, n, n});
    auto mhc = std::make_unique<ProfileScope>(prof_, "mhc+norms");
    hc_pre(X, l.hc_attn, l.attn_norm, xn, post, comb, s);
    mhc.reset();
    Tensor f = attention(l, xn, p, s);
    mhc = std::make_unique<ProfileScope>(prof_, "mhc+norms");
    be_.hc_post(f, X, post, comb, X2);
    std::swap(X, X2);
    hc_pre(X, l.hc_ffn, l.ffn_norm, xn, post, comb, s);
    mhc.reset();
    f = moe(l, xn, p.ids, ep, s);
    mhc = std::make_unique<ProfileScope>(prof_, "mhc+norms");
    be_.hc_post(f, X, post, comb, X2);
    std::swap(X, X2);
  }
  if (mtp_) {
    ProfileScope ps(prof_, "mtp");
    mtp_after_step(batch, m, X, step);
  }

  ProfileScope head_scope(prof_, "embed+head");
  // Rows that need logits.
  const std::vector<int64_t> rows = logit_rows(batch, m);
  const int64_t R = int64_t(rows.size());
  if (!dev) logits->assign(size_t(R * cfg_.vocab_size), 0.0f);
  if (R == 0) return;
  Tensor Xh = act(step, {R, n, D});
  copy_rows(be_, X, rows, Xh);
  Tensor pre = step.f32({R, n}), post = step.f32({R, n}), comb = step.f32({R, n, n});
  HcArgs ha{hc_head_.fn, hc_head_.base, hc_head_.scale, cfg_.hc_mult, cfg_.hc_iters, cfg_.norm_eps, cfg_.hc_eps};
  Tensor hn = act(step, {R, D});
  Tensor lg = dev ? device_logits(be_, R, cfg_.vocab_size) : step.f32({R, cfg_.vocab_size});  // [R, V] f32
  be_.hc_pre(Xh, ha, Tensor(), norm_, pre, post, comb, hn);
  be_.linear(hn, head_, 0, lg);
  if (dev) *dev = lg;
  else be_.download(logits->data(), lg);
}

}  // namespace dil

namespace dil {

// Random contents for every cache buffer: a synthesized long context for the benchmarks.
// Compressor scores stay finite so that a partially filled window pools real numbers.
void V4Model::randomize_cache(uint64_t seed) {
  std::vector<Layer*> all;
  for (Layer& l : layers_) all.push_back(&l);
  if (mtp_) {
    all.push_back(&mtp_->block);
    fill_uniform(be_, mtp_->hidden, seed++, act_);
  }
  for (Layer* lp : all) {
    Layer& l = *lp;
    const std::pair<Buffer*, const kvpack::RowShape*> caches[] = {
        {&l.ring, &kv_.swa}, {&l.comp_rows, &kv_.global}, {&l.idx_rows, &kv_.index}};
    for (auto [b, pack] : caches) {
      if (pack->packed()) fill_uniform_packed(be_, *b, seed++, *pack);  // quantized by the packing
      else fill_uniform(be_, *b, seed++, act_);
    }
    for (Buffer* b : {&l.cstate_kv, &l.cstate_score, &l.istate_kv, &l.istate_score}) fill_uniform(be_, *b, seed++);
    if (!official_ || kv_.swa.packed()) continue;
    // The rows as the model writes them (attention(), compress()): QDQ'd at the official points,
    // so a synthesized context takes the same kernel paths as a real one (the fast indexer
    // rescores keys that are not FP4 values on CUDA cores).
    const int64_t hd = cfg_.head_dim, di = cfg_.index_head_dim, rd = cfg_.rope_dims;
    auto rows = [&](Buffer& b, int64_t w) { return b.as(act_, {int64_t(b.bytes() / dtype_size(act_)) / w, w}); };
    if (l.ring.data()) be_.fp8_qdq(rows(l.ring, hd), int(hd - rd), 64);
    if (l.comp_rows.data()) be_.fp8_qdq(rows(l.comp_rows, hd), int(hd - rd), 64);
    if (l.idx_rows.data()) be_.fp4_qdq(rows(l.idx_rows, di), 32, false);
  }
}

}  // namespace dil

namespace dil {

// A rank without tokens in a step where another rank has some: no attention (it is per rank),
// but every layer's MoE collectives, with padding rows only.
void V4Model::forward_idle(const ExpertParallel::Step& ep) {
  for (Layer& l : layers_) {
    Scratch s(be_);
    Tensor x = act(s, {0, cfg_.dim}), w = s.f32({0, cfg_.topk}), idx = s.i32({0, cfg_.topk});
    ep_.routed(be_, prof_, experts_args(l), x, w, idx, ep, s);
  }
}

MoeExpertsArgs V4Model::experts_args(Layer& l) const {
  MoeExpertsArgs e;
  e.w1 = &l.w1; e.w2 = &l.w2; e.w3 = &l.w3;
  e.act_block = act_block(); e.swiglu_limit = cfg_.swiglu_limit;
  e.round_bf16 = numerics_ == Numerics::Fast;
  return e;
}

}  // namespace dil
