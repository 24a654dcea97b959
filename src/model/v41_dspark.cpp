// V4.1's DSpark drafter (model-spec §4.7, weights §2.3): three SWA-only blocks `mtp.0..2` that
// draft dspark_block_size (5) tokens in one forward, a rank-256 Markov head that makes the
// drafts depend on each other, and a confidence head.
//
// Context (every forward, dspark_context): for each backbone position q, main_x_q =
// main_norm(main_proj(concat_k(mean_j X_j at the entry of target layer k))) (the plain mean of
// the 4 streams, after the layer's Engram, before its mHC), and in every block s the context
// row kv_norm_s(wkv_s(main_x_q)), RoPE at q, FP8 QDQ, at ring slot q mod W. Only a chunk's
// trailing min(n, W) positions can still be read (the ring keeps W), so only they are
// computed; decoder replay keeps at least those rows at the entry of every layer (replay.h:
// x(L) >= kv(L) >= min(n, W)). The rings are slot state: prefix cache, fork and speculative
// rollback copy them with the slot (cache_copy.cpp).
//
// Draft (draft_dspark), after a forward that computed position p, with a = the token sampled
// for p + 1: the block [a, N, N, N, N] (N = dspark_noise_token_id) at positions p+1 .. p+5
// through the three blocks, Single-Pass mHC from the one-hot pre as the backbone; each block's
// attention is non-causal (AttnArgs::non_causal): every draft query reads the ring rows of
// positions <= p (at most W) and all five draft rows, which are never written into the ring, so
// a draft leaves the slot as it found it. Then x = collapse(Z, pre) [5, D], U_i = head(norm(x_i))
// (f32), and sequentially prev = a, for i = 0..4: me_i = markov_embed[prev], U_i += markov_head
// me_i, d_i = argmax U_i (Backend::sample at temperature 0), prev = d_i: d_i is the draft for
// p + 2 + i. conf_i = proj . concat(x_i, me_i) (f32, a logit): returned for tests, and the draft
// is cut before the first position whose survival estimate prod sigmoid(conf) falls below
// DraftRequest::min_survival (0: never; --dspark-min-survival). The engine verifies what it is
// given, so outputs are the target's whatever the cut.
#include <algorithm>
#include <cmath>

#include "backend/sampling.h"
#include "model/step.h"
#include "model/v41_model.h"

namespace dil {

namespace {

// A device tensor of the activation dtype as an embedding table, so that Backend::embed gathers
// its rows by index (a row permutation in one op: rows of several buffers interleaved).
Weight as_table(const Tensor& t) {
  Weight w;
  w.kind = t.dtype == DType::BF16 ? Weight::Kind::BF16 : Weight::Kind::F32;
  w.w = t;
  w.out = t.size(0);
  w.in = t.size(1);
  return w;
}

// Columns [c0, c0 + n) of a one-row BF16/F32 matrix [1, in] as a weight of its own (contiguous).
Weight columns(const Weight& w, int64_t c0, int64_t n) {
  DIL_CHECK(w.out == 1 && (w.kind == Weight::Kind::BF16 || w.kind == Weight::Kind::F32) && c0 + n <= w.in,
            "columns of a [", w.out, ", ", w.in, "] weight");
  Weight c = w;
  c.w = Tensor(static_cast<char*>(w.w.data) + size_t(c0) * dtype_size(w.w.dtype), w.w.dtype, {1, n}, w.w.device);
  c.in = n;
  return c;
}

}  // namespace

void V41Model::bind_dspark() {
  const int S = cfg_.n_mtp;
  if (S < 1) DIL_FAIL(cfg_.model_type, ": config.json has no DSpark stages (num_nextn_predict_layers 0)");
  if (cfg_.dspark_block_size < 1 || cfg_.dspark_target_layers.empty() || cfg_.dspark_n_routed < 1 ||
      cfg_.dspark_topk < 1 || cfg_.dspark_markov_rank < 1)
    DIL_FAIL(cfg_.model_type, ": DSpark needs dspark_block_size, dspark_target_layer_ids, dspark_n_routed_experts, ",
             "dspark_num_experts_per_tok and dspark_markov_rank in config.json");
  dsp_ = std::make_unique<Dspark>(cfg_.dspark_n_routed);
  Dspark& d = *dsp_;
  d.blocks.resize(size_t(S));
  for (int s = 0; s < S; ++s) {
    Layer& l = d.blocks[size_t(s)];
    const std::string p = "mtp." + std::to_string(s) + ".";
    l.index = cfg_.n_layers + s;
    l.ratio = cfg_.ratio(l.index);
    if (l.ratio != 0)
      DIL_FAIL("DSpark stage ", s, " has compress ratio ", l.ratio, " in config.json; the stages are SWA only");
    l.drafter = true;
    l.kind = "dspark";
    bind_block_weights(binder_, p, d.ep, &l);
    l.gate_bias = binder_.tensor(p + "ffn.gate.bias");  // bias routing, no bias_vl (drafts are text)
  }
  const std::string first = "mtp.0.", last = "mtp." + std::to_string(S - 1) + ".";
  d.main_proj = binder_.matrix(first + "main_proj");
  d.main_norm = binder_.tensor(first + "main_norm.weight");
  d.norm = binder_.tensor(last + "norm.weight");
  d.markov_embed = binder_.matrix(last + "markov_head.embed");
  d.markov_head = binder_.matrix(last + "markov_head.head");
  const Weight proj = binder_.matrix(last + "confidence_head.proj");  // [1, D + R]
  d.conf_x = columns(proj, 0, cfg_.dim);
  d.conf_m = columns(proj, cfg_.dim, cfg_.dspark_markov_rank);
  int last_active = -1;
  for (const Layer& l : layers_)
    if (l.active) last_active = l.index;
  DIL_CHECK(last_active >= 0, "DSpark without any active backbone layer");
  for (int T : cfg_.dspark_target_layers) {
    if (T < 0 || T >= cfg_.n_layers)
      DIL_FAIL("dspark_target_layer_ids: layer ", T, " outside [0, ", cfg_.n_layers, ")");
    int at = last_active;
    for (int L = T; L < cfg_.n_layers; ++L)
      if (layers_[size_t(L)].active) {
        at = L;
        break;
      }
    d.record.push_back(at);
  }
}

V41Model::DsparkStep V41Model::plan_dspark(const StepBatch& batch, const StepMeta& m, Scratch& step) {
  DsparkStep ds;
  for (const SeqChunk& c : batch.seqs) {
    const int n = c.n_tokens, k = std::min(n, cfg_.window);
    ds.spans.push_back({n - k, n});
    ds.rows += k;
  }
  if (ds.rows == 0) return ds;
  ds.meta = sub_meta(m, ds.spans, be_, step.storage());
  const int64_t K = int64_t(dsp_->record.size()), R = ds.rows;
  std::vector<int32_t> perm(size_t(K * R));  // main_hidden row r, part k <- means row k * R + r
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) perm[size_t(r * K + k)] = int32_t(k * R + r);
  ds.perm = upload_i32(perm, be_, step.storage());
  return ds;
}

void V41Model::dspark_record(int L, const Tensor& X, const RowSpans& cur, const DsparkStep& ds, Tensor means,
                             Scratch& s) {
  if (ds.rows == 0) return;
  const int64_t n = cfg_.hc_mult, D = cfg_.dim, R = ds.rows, K = int64_t(dsp_->record.size());
  Tensor all = means.view({K * R, D});  // [K * R, D] target k's rows at [k R, (k + 1) R)
  for (size_t k = 0; k < dsp_->record.size(); ++k) {
    if (dsp_->record[k] != L) continue;
    Tensor Xc = X;  // [R, n, D] the context rows' streams
    if (!(cur == ds.spans)) {
      Xc = act(s, {R, n, D});
      gather_rows(be_, X, cur, Xc, ds.spans);
    }
    Tensor quarter = s.f32({R, n});  // [R, n] 1/n: the plain mean as a collapse (exact weights)
    be_.fill(quarter, 1.0f / float(n));
    be_.hc_collapse(Xc, quarter, all.rows(int64_t(k) * R, int64_t(k + 1) * R));
  }
}

void V41Model::dspark_context(const DsparkStep& ds, const Tensor& means, Scratch& s) {
  if (ds.rows == 0) return;
  const int64_t K = int64_t(dsp_->record.size()), R = ds.rows, D = cfg_.dim, hd = cfg_.head_dim;
  Tensor mh = act(s, {R, K * D});  // [R, K*D] main_hidden: the K means of a row side by side
  be_.embed(as_table(means.view({K * R, D})), ds.perm, mh.view({R * K, D}));
  Tensor mp = act(s, {R, D}), mx = act(s, {R, D});  // [R, D] main_proj out, main_x
  be_.linear(mh, dsp_->main_proj, act_block(), mp);
  be_.rms_norm(mp, dsp_->main_norm, cfg_.norm_eps, mx);  // main_x [R, D], shared by the blocks
  for (Layer& l : dsp_->blocks)
    be_.ring_write(window_rows(l, mx, ds.meta.tok_pos, s),
                   kv_tensor(l.ring, cache_.n_slots, cfg_.window, hd, kv_.swa, act_), ds.meta, kv_.swa);
}

void V41Model::draft_dspark(const std::vector<DraftRequest>& in, std::vector<std::vector<int32_t>>* out,
                            std::vector<float>* logits, std::vector<float>* conf) {
  DIL_CHECK(dsp_, "draft without the DSpark drafter (load_mtp)");
  const int B = cfg_.dspark_block_size;
  const int64_t S = int64_t(in.size()), R = S * B, n = cfg_.hc_mult, D = cfg_.dim, V = cfg_.vocab_size;
  const int64_t Rk = cfg_.dspark_markov_rank;
  out->assign(in.size(), {});
  if (logits) logits->clear();
  if (conf) conf->clear();
  if (S == 0) return;
  int k = 0;  // drafts wanted: the largest request
  for (const DraftRequest& r : in) {
    DIL_CHECK(r.slot >= 0 && r.slot < cache_.n_slots && r.pos >= 0 && r.n >= 1, "draft request: slot ", r.slot,
              ", position ", r.pos, ", n ", r.n);
    DIL_CHECK(r.n <= B, "DSpark drafts at most dspark_block_size = ", B, " tokens, ", r.n, " asked");
    k = std::max(k, r.n);
  }
  bool cut = false;  // some request cuts its draft by the confidence head
  for (const DraftRequest& r : in) cut |= r.min_survival > 0.0;
  const int steps = conf ? B : k;  // Markov steps: every position when the confidences are asked for
  // The draft block of every request: [a, N, .., N] at positions pos + 1 .. pos + B.
  StepBatch b;
  for (const DraftRequest& r : in) {
    SeqChunk c;
    c.slot = r.slot;
    c.start_pos = r.pos + 1;
    c.n_tokens = B;
    c.want_logits = false;
    // Unread (window only): plan_step wants blocks covering the positions.
    c.blocks.assign(size_t((c.start_pos + B - 1) / cache_.block_tokens + 1), 0);
    b.seqs.push_back(std::move(c));
    b.tokens.push_back(r.token);
    b.tokens.insert(b.tokens.end(), size_t(B - 1), cfg_.dspark_noise_token);
  }
  const Tensor one_hot = one_hot_pre(R);  // uploads first (the forward's own rule)
  StepPlan p = plan_step(b, cache_.block_tokens, be_);
  Scratch s(be_);
  std::vector<int32_t> perm(static_cast<size_t>(R));  // position-major row i * S + q <- request-major q * B + i
  for (int64_t q = 0; q < S; ++q)
    for (int i = 0; i < B; ++i) perm[size_t(i * S + q)] = int32_t(q * B + i);
  const Tensor perm_t = upload_i32(perm, be_, s.storage());
  Tensor ids_t = s.i32({S});  // [S] the Markov head's previous tokens
  std::vector<SampleRow> srows(static_cast<size_t>(S));  // greedy rows for Backend::sample (temperature 0)
  for (int64_t q = 0; q < S; ++q) {
    srows[size_t(q)].src_row = int32_t(q);
    srows[size_t(q)].temperature = 0.0f;
  }
  Tensor rows_t = s.i32({S, kSampleRowWords});  // [S, words] the sampler's rows
  be_.upload(rows_t, srows.data());

  Tensor e = act(s, {R, D});  // [S * B, D] the block's embeddings, request-major
  be_.embed(embed_, p.ids, e);
  Tensor X = act(s, {R, n, D}), X2 = act(s, {R, n, D});  // [R, n, D] the draft rows' streams
  be_.hc_expand(e, int(n), X);
  Tensor pre_mix = s.f32({R, n}), a_pre = s.f32({R, n}), f_pre = s.f32({R, n});  // [R, n] collapse weights
  be_.copy(pre_mix, one_hot);
  const ExpertParallel::Step no_ep;  // single rank
  for (Layer& l : dsp_->blocks) {  // as a backbone layer of run_step (every row, no replay)
    Scratch ls(be_);
    Tensor xn = act(ls, {R, D}), post = ls.f32({R, n}), comb = ls.f32({R, n, n});  // [R, D], [R, n], [R, n, n]
    HcArgs ha{l.hc_attn.fn, l.hc_attn.base, l.hc_attn.scale, cfg_.hc_mult, cfg_.hc_iters, cfg_.norm_eps, cfg_.hc_eps};
    be_.hc_pre(X, ha, pre_mix, l.attn_norm, a_pre, post, comb, xn);
    Shared none;  // window only: no selections
    Tensor f = attention(l, xn, p.meta, none, ls);
    be_.hc_post(f, X, post, comb, X2);
    std::swap(X, X2);
    HcArgs hf{l.hc_ffn.fn, l.hc_ffn.base, l.hc_ffn.scale, cfg_.hc_mult, cfg_.hc_iters, cfg_.norm_eps, cfg_.hc_eps};
    Tensor xf = act(ls, {R, D});  // [R, D] the ffn's input
    be_.hc_pre(X, hf, a_pre, l.ffn_norm, f_pre, post, comb, xf);
    f = moe(l, xf, no_ep, ls);
    be_.hc_post(f, X, post, comb, X2);
    std::swap(X, X2);
    std::swap(pre_mix, f_pre);
  }
  // Head: collapse with the last pre, position-major rows, the last stage's norm, the shared head.
  Tensor x = act(s, {R, D}), xp = act(s, {R, D}), hn = act(s, {R, D});  // [R, D] each
  be_.hc_collapse(X, pre_mix, x);
  be_.embed(as_table(x), perm_t, xp);  // [B * S, D] row i * S + q: position i of request q
  be_.rms_norm(xp, dsp_->norm, cfg_.norm_eps, hn);
  Tensor U = s.f32({R, V});  // [B * S, V] f32 draft logits
  be_.linear(hn, head_, 0, U);
  // Markov head, position by position: each step's previous tokens are the last step's drafts
  // (a host round trip per step, as the MTP chain).
  Tensor ME = act(s, {R, Rk}), bias = s.f32({S, V});  // [B * S, R] the Markov embeddings
  std::vector<int32_t> prev(static_cast<size_t>(S)), res(static_cast<size_t>(S * sample_out_words(0)));
  for (int64_t q = 0; q < S; ++q) prev[size_t(q)] = in[size_t(q)].token;
  for (int i = 0; i < steps; ++i) {
    be_.upload(ids_t, prev.data());
    Tensor me = ME.rows(i * S, (i + 1) * S), Ui = U.rows(i * S, (i + 1) * S);
    be_.embed(dsp_->markov_embed, ids_t, me);
    be_.linear(me, dsp_->markov_head, 0, bias);
    be_.add(Ui, bias, Ui);
    SampleArgs sa;
    sa.logits = Ui;
    sa.rows = rows_t;
    sa.out = s.i32({S, sample_out_words(0)});
    be_.sample(sa);
    be_.download(res.data(), sa.out);
    for (int64_t q = 0; q < S; ++q) {
      prev[size_t(q)] = res[size_t(q) * size_t(sample_out_words(0))];
      DIL_CHECK(prev[size_t(q)] >= 0 && prev[size_t(q)] < V, "DSpark draft: no token (non-finite logits?)");
      if (i < in[size_t(q)].n) (*out)[size_t(q)].push_back(prev[size_t(q)]);
    }
  }
  if (logits) {
    logits->resize(size_t(k) * size_t(S * V));
    be_.download(logits->data(), U.rows(0, int64_t(k) * S));
  }
  if (!conf && !cut) return;
  // conf = proj[:, :D] . x + proj[:, D:] . me (f32) of the positions the Markov steps reached.
  const int64_t Rc = int64_t(steps) * S;
  Tensor cx = s.f32({Rc, 1}), cm = s.f32({Rc, 1});  // [steps * S, 1] the two parts
  be_.linear(xp.rows(0, Rc), dsp_->conf_x, 0, cx);
  be_.linear(ME.rows(0, Rc), dsp_->conf_m, 0, cm);
  be_.add(cx, cm, cx);
  std::vector<float> h(static_cast<size_t>(Rc));  // position-major
  be_.download(h.data(), cx);
  if (conf) {
    conf->resize(size_t(R));
    for (int64_t q = 0; q < S; ++q)
      for (int i = 0; i < B; ++i) (*conf)[size_t(q * B + i)] = h[size_t(i * S + q)];
  }
  // The cut: position i's confidence depends on the tokens before it only (x_i, and me_i of
  // d_{i-1}), so whether d_i is proposed never depends on d_i (the DSpark paper's
  // non-anticipation; the engine's verification keeps the target's outputs anyway).
  for (int64_t q = 0; q < S; ++q) {
    const double ms = in[size_t(q)].min_survival;
    if (ms <= 0.0) continue;
    std::vector<int32_t>& d = (*out)[size_t(q)];
    double survival = 1.0;
    size_t keep = 0;
    for (; keep < d.size(); ++keep) {
      survival *= 1.0 / (1.0 + std::exp(-double(h[keep * size_t(S) + size_t(q)])));
      if (survival < ms) break;
    }
    d.resize(keep);
  }
}

}  // namespace dil
