// V4's MTP drafter (model-spec §3.10, weights §2.2): one more block `mtp.0` that predicts the
// token after next from the target's final residual streams X_p (before hc_head) and the next
// token's embedding:
//   Z = e_proj(enorm(embed(t_{p+1}))) (broadcast to the 4 streams) + h_proj(hnorm(X_p,j))
//   Z = Block(Z) at position p (ratio 0: window attention over its own 128-row ring, bias routing)
//   logits(t_{p+2}) = head(norm(hc_head_mtp(Z)))
// State: the block's ring rows are those of the pairs (X_q, t_{q+1}) of every earlier position q,
// so the block runs over every pair a forward completes (mtp_after_step, one position behind the
// backbone: the pair of a chunk's last token needs the token sampled after it), and the slot
// keeps X of its last computed position (`hidden`). Both are slot state: copied with the slot
// (prefix cache, fork, speculative rollback), reset by nothing (a chunk at position 0 pairs only
// tokens of its own).
// Drafting (draft): step 1 is the pair (hidden, sampled token) at the last computed position;
// step i + 1 feeds step i's output streams and its greedy token at the next position
// (DeepSeek-V3-style chained MTP). The chain runs in draft-only ring rows, copies of the
// sequences' rings, so the slots are untouched: the rows the chain writes for positions the
// target has not computed would otherwise overwrite window rows the next forward reads.
#include <algorithm>

#include "backend/sampling.h"
#include "model/step.h"
#include "model/v4_model.h"

namespace dil {

void V4Model::bind_mtp() {
  DIL_CHECK(cfg_.n_mtp >= 1, "load_mtp without an MTP layer");
  mtp_ = std::make_unique<Mtp>();
  const std::string p = "mtp.0.";
  const int ratio = cfg_.ratio(cfg_.n_layers);
  if (ratio != 0) DIL_FAIL("the MTP block has compress ratio ", ratio, " in config.json; only ratio 0 is supported");
  Layer& l = mtp_->block;
  l.id = cfg_.n_layers;
  bind_block(l, p, 0, false);  // bias routing (ffn.gate.bias), no tid2eid
  mtp_->e_proj = binder_.matrix(p + "e_proj");
  mtp_->h_proj = binder_.matrix(p + "h_proj");
  mtp_->enorm = binder_.tensor(p + "enorm.weight");
  mtp_->hnorm = binder_.tensor(p + "hnorm.weight");
  mtp_->norm = binder_.tensor(p + "norm.weight");
  mtp_->hc_head = {binder_.tensor(p + "hc_head_fn"), binder_.tensor(p + "hc_head_base"),
                   binder_.tensor(p + "hc_head_scale")};
}

Tensor V4Model::mtp_block(const Tensor& H, const StepPlan& p, Scratch& s) {
  const Tensor& ids = p.ids;  // [T] i32
  Mtp& t = *mtp_;
  Layer& l = t.block;
  const int64_t T = H.size(0), n = cfg_.hc_mult, D = cfg_.dim;
  const int ab = act_block();
  Tensor e = act(s, {T, D}), en = act(s, {T, D}), ep = act(s, {T, D});
  be_.embed(embed_, ids, e);
  be_.rms_norm(e, t.enorm, cfg_.norm_eps, en);
  be_.linear(en, t.e_proj, ab, ep);
  Tensor hn = act(s, {T * n, D}), hp = act(s, {T * n, D});  // per stream
  be_.rms_norm(H.view({T * n, D}), t.hnorm, cfg_.norm_eps, hn);
  be_.linear(hn, t.h_proj, ab, hp);
  Tensor epx = act(s, {T, n, D}), X = act(s, {T, n, D}), X2 = act(s, {T, n, D});
  be_.hc_expand(ep, int(n), epx);  // e_proj(e).unsqueeze(2): the same row for every stream
  be_.add(epx, hp.view({T, n, D}), X);
  // The block, as a backbone layer (run_step).
  Tensor xn = act(s, {T, D}), post = s.f32({T, n}), comb = s.f32({T, n, n});
  hc_pre(X, l.hc_attn, l.attn_norm, xn, post, comb, s);
  Tensor f = attention(l, xn, p, s);
  be_.hc_post(f, X, post, comb, X2);
  std::swap(X, X2);
  hc_pre(X, l.hc_ffn, l.ffn_norm, xn, post, comb, s);
  ExpertParallel::Step ep_step;  // single rank (check_drafter refuses expert parallelism)
  f = moe(l, xn, ids, ep_step, s);
  be_.hc_post(f, X, post, comb, X2);
  return X2;
}

void V4Model::mtp_after_step(const StepBatch& batch, const StepMeta& m, const Tensor& X, Scratch& s) {
  Mtp& t = *mtp_;
  const int64_t n = cfg_.hc_mult, D = cfg_.dim;
  Tensor hidden = t.hidden.as(act_, {cache_.n_slots, n, D});
  // The pairs: for chunk [start, start + len) the positions start-1 .. start+len-2 (from 0 when
  // start == 0), each with the token one later: the chunk's own tokens (minus its first at 0).
  StepBatch sub;
  struct Run { int64_t dst, src, rows; bool from_hidden; int32_t slot; };  // copies into H
  std::vector<Run> runs;
  int64_t rows = 0;
  for (int i = 0; i < m.n_seqs; ++i) {
    const int32_t start = m.h_start_pos[size_t(i)], len = m.h_len[size_t(i)], q0 = m.h_q_start[size_t(i)];
    const int32_t slot = m.h_slot[size_t(i)];
    const int32_t first = start > 0 ? start - 1 : 0, count = start > 0 ? len : len - 1;
    if (count <= 0) continue;
    SeqChunk c;
    c.slot = slot;
    c.start_pos = first;
    c.n_tokens = count;
    c.blocks = batch.seqs[size_t(i)].blocks;  // unread (ratio 0); plan_step checks their count
    c.want_logits = false;
    sub.seqs.push_back(std::move(c));
    const int32_t tok0 = start > 0 ? q0 : q0 + 1;
    sub.tokens.insert(sub.tokens.end(), batch.tokens.begin() + tok0, batch.tokens.begin() + q0 + len);
    if (start > 0) runs.push_back({rows, 0, 1, true, slot});
    if (len > 1) runs.push_back({rows + (start > 0 ? 1 : 0), q0, len - 1, false, slot});
    rows += count;
  }
  Tensor H = act(s, {std::max<int64_t>(rows, 1), n, D});  // [rows, n, D] the pairs' streams
  for (const Run& r : runs)
    be_.copy(H.rows(r.dst, r.dst + r.rows),
             r.from_hidden ? hidden.rows(r.slot, r.slot + 1) : X.rows(r.src, r.src + r.rows));
  // The slots' new `hidden`, after H read the old one (one stream: in order).
  for (int i = 0; i < m.n_seqs; ++i) {
    const int32_t last = m.h_q_start[size_t(i)] + m.h_len[size_t(i)] - 1, slot = m.h_slot[size_t(i)];
    be_.copy(hidden.rows(slot, slot + 1), X.rows(last, last + 1));
  }
  if (rows == 0) return;
  StepPlan p = plan_step(sub, cache_.block_tokens, be_);
  Scratch bs(be_);
  mtp_block(H.rows(0, rows), p, bs);
}

void V4Model::draft(const std::vector<DraftRequest>& in, std::vector<std::vector<int32_t>>* out,
                    std::vector<float>* logits) {
  DIL_CHECK(mtp_, "draft without the MTP block (load_mtp)");
  DIL_CHECK(!logits || in.size() <= size_t(kDraftSlots), "draft logits of at most ", kDraftSlots, " requests");
  out->assign(in.size(), {});
  if (logits) logits->clear();
  for (size_t i0 = 0; i0 < in.size(); i0 += kDraftSlots) {
    const int S = int(std::min<size_t>(kDraftSlots, in.size() - i0));
    int k = 0;
    for (int i = 0; i < S; ++i) k = std::max(k, in[i0 + size_t(i)].n);
    std::vector<std::vector<int32_t>> part;
    draft_chain(in.data() + i0, S, k, &part, logits);
    for (int i = 0; i < S; ++i) {
      part[size_t(i)].resize(size_t(std::max(0, in[i0 + size_t(i)].n)));
      (*out)[i0 + size_t(i)] = std::move(part[size_t(i)]);
    }
  }
}

// S sequences, k chained steps, all of them for every sequence (the engine asks for the same k
// almost always; the extra tokens of a shorter request are dropped).
void V4Model::draft_chain(const DraftRequest* in, int S, int k, std::vector<std::vector<int32_t>>* out,
                          std::vector<float>* logits) {
  Mtp& t = *mtp_;
  const int64_t n = cfg_.hc_mult, D = cfg_.dim, V = cfg_.vocab_size;
  const int32_t base = cache_.n_slots;  // draft ring rows [base, base + S)
  out->assign(size_t(S), {});
  Tensor hidden = t.hidden.as(act_, {cache_.n_slots, n, D});
  Scratch s(be_);
  Tensor H = act(s, {S, n, D});  // [S, n, D] the streams each step starts from
  for (int i = 0; i < S; ++i) {
    DIL_CHECK(in[i].slot >= 0 && in[i].slot < cache_.n_slots && in[i].pos >= 0 && in[i].n >= 1,
              "draft request: slot ", in[i].slot, ", position ", in[i].pos, ", n ", in[i].n);
    be_.copy(H.rows(i, i + 1), hidden.rows(in[i].slot, in[i].slot + 1));
    // The window the chain reads: the sequence's ring (positions <= pos - 1); the chain writes
    // pos, pos + 1, ... into this copy only.
    Tensor ring = t.block.ring.as(DType::U8, {t.block.ring_slots, int64_t(t.block.ring.bytes()) / t.block.ring_slots});
    be_.copy(ring.rows(base + i, base + i + 1), ring.rows(in[i].slot, in[i].slot + 1));
  }
  std::vector<int32_t> tok(static_cast<size_t>(S));
  for (int i = 0; i < S; ++i) tok[size_t(i)] = in[i].token;
  // Greedy rows for Backend::sample (the engine's sampler specification, temperature 0).
  std::vector<SampleRow> srows(static_cast<size_t>(S));
  for (int i = 0; i < S; ++i) {
    srows[size_t(i)].src_row = i;
    srows[size_t(i)].temperature = 0.0f;
  }
  Tensor rows_t = s.i32({S, kSampleRowWords});
  be_.upload(rows_t, srows.data());
  std::vector<int32_t> res(size_t(S) * size_t(sample_out_words(0)));
  for (int j = 0; j < k; ++j) {
    StepBatch b;
    b.tokens = tok;
    for (int i = 0; i < S; ++i) {
      SeqChunk c;
      c.slot = base + i;
      c.start_pos = in[i].pos + j;
      c.n_tokens = 1;
      // Unread (ratio 0): plan_step wants blocks covering the position.
      c.blocks.assign(size_t((c.start_pos + cache_.block_tokens) / cache_.block_tokens), 0);
      b.seqs.push_back(std::move(c));
    }
    StepPlan p = plan_step(b, cache_.block_tokens, be_);
    Scratch js(be_);
    Tensor Z = mtp_block(H, p, js);  // [S, n, D]
    Tensor pre = js.f32({S, n}), post = js.f32({S, n}), comb = js.f32({S, n, n});
    HcArgs ha{t.hc_head.fn, t.hc_head.base, t.hc_head.scale, cfg_.hc_mult, cfg_.hc_iters, cfg_.norm_eps, cfg_.hc_eps};
    Tensor hn = act(js, {S, D});
    Tensor lg = js.f32({S, V});  // [S, V] f32
    be_.hc_pre(Z, ha, Tensor(), t.norm, pre, post, comb, hn);
    be_.linear(hn, head_, 0, lg);
    if (logits) {
      logits->resize(logits->size() + size_t(S * V));
      be_.download(logits->data() + logits->size() - size_t(S * V), lg);
    }
    SampleArgs sa;
    sa.logits = lg;
    sa.rows = rows_t;
    sa.out = js.i32({S, sample_out_words(0)});
    be_.sample(sa);
    be_.download(res.data(), sa.out);  // the next step's ids (a host round trip per step)
    for (int i = 0; i < S; ++i) {
      tok[size_t(i)] = res[size_t(i) * size_t(sample_out_words(0))];
      DIL_CHECK(tok[size_t(i)] >= 0 && tok[size_t(i)] < V, "MTP draft: no token (non-finite logits?)");
      (*out)[size_t(i)].push_back(tok[size_t(i)]);
    }
    if (j + 1 < k) be_.copy(H, Z);
  }
}

}  // namespace dil
