#include "model/step.h"

#include <algorithm>

#include "model/rope.h"

namespace dil {

Tensor upload_i32(const std::vector<int32_t>& v, Backend& be, std::vector<Buffer>* storage) {
  size_t n = std::max<size_t>(v.size(), 1);
  Buffer b = be.alloc_scratch(n * 4);  // the upload writes it whole
  Tensor t(b.data(), DType::I32, {int64_t(v.size())}, be.device());
  if (!v.empty()) be.upload(t, v.data());
  storage->push_back(std::move(b));
  return t;
}

int StepStaging::add(const std::vector<int32_t>& v) {
  const int64_t off = int64_t(host_.size());
  host_.insert(host_.end(), v.begin(), v.end());
  host_.resize(size_t((int64_t(host_.size()) + 15) / 16 * 16), 0);  // 64-byte aligned views
  at_.push_back({off, int64_t(v.size())});
  return int(at_.size()) - 1;
}

void StepStaging::upload(Backend& be, std::vector<Buffer>* storage) {
  if (host_.empty()) host_.resize(16, 0);
  Buffer b = be.alloc_scratch(host_.size() * 4);  // the upload writes it whole
  be.upload(Tensor(b.data(), DType::I32, {int64_t(host_.size())}, be.device()), host_.data());
  dev_ = b.data();
  device_ = be.device();
  storage->push_back(std::move(b));
}

Tensor StepStaging::tensor(int h) const {
  DIL_CHECK(dev_ && h >= 0 && h < int(at_.size()), "StepStaging: tensor before upload");
  return Tensor(static_cast<int32_t*>(dev_) + at_[size_t(h)].first, DType::I32, {at_[size_t(h)].second}, device_);
}

namespace {

struct MetaHandles {
  int q_start, len, start_pos, slot, tok_pos, tok_seq, block_table;
};

MetaHandles stage_meta(const StepMeta& m, StepStaging& st) {
  return {st.add(m.h_q_start), st.add(m.h_len), st.add(m.h_start_pos), st.add(m.h_slot),
          st.add(m.h_tok_pos), st.add(m.h_tok_seq), st.add(m.h_block_table)};
}

void bind_meta(StepMeta& m, const MetaHandles& h, const StepStaging& st) {
  m.q_start = st.tensor(h.q_start);
  m.len = st.tensor(h.len);
  m.start_pos = st.tensor(h.start_pos);
  m.slot = st.tensor(h.slot);
  m.tok_pos = st.tensor(h.tok_pos);
  m.tok_seq = st.tensor(h.tok_seq);
  m.block_table = st.tensor(h.block_table).view({m.n_seqs, m.max_blocks});
}

}  // namespace

const EmitPlan& StepPlan::emit(int ratio) const {
  for (const auto& [r, e] : emits)
    if (r == ratio) return e;
  DIL_FAIL("plan_step did not plan the emits of ratio ", ratio);
}

StepPlan plan_step(const StepBatch& batch, int block_tokens, Backend& be, const std::vector<int>& emit_ratios) {
  StepPlan p;
  StepMeta& m = p.meta;
  m.n_seqs = int(batch.seqs.size());
  m.block_tokens = block_tokens;
  int q = 0;
  for (const auto& s : batch.seqs) m.max_blocks = std::max(m.max_blocks, int(s.blocks.size()));
  m.max_blocks = std::max(m.max_blocks, 1);
  m.h_block_table.assign(size_t(m.n_seqs) * size_t(m.max_blocks), -1);
  for (int i = 0; i < m.n_seqs; ++i) {
    const SeqChunk& s = batch.seqs[size_t(i)];
    DIL_CHECK(s.n_tokens > 0 && s.start_pos >= 0, "empty chunk or negative position");
    int need = (s.start_pos + s.n_tokens + block_tokens - 1) / block_tokens;
    DIL_CHECK(int(s.blocks.size()) >= need, "sequence needs ", need, " blocks, has ", s.blocks.size());
    m.h_q_start.push_back(q);
    m.h_len.push_back(s.n_tokens);
    m.h_start_pos.push_back(s.start_pos);
    m.h_slot.push_back(s.slot);
    for (int t = 0; t < s.n_tokens; ++t) {
      m.h_tok_pos.push_back(s.start_pos + t);
      m.h_tok_seq.push_back(i);
    }
    std::copy(s.blocks.begin(), s.blocks.end(), m.h_block_table.begin() + ptrdiff_t(i) * m.max_blocks);
    q += s.n_tokens;
  }
  m.n_tokens = q;
  DIL_CHECK(size_t(q) == batch.tokens.size(), "tokens (", batch.tokens.size(), ") != sum of chunk lengths (", q, ")");
  StepStaging st;
  const MetaHandles mh = stage_meta(m, st);
  const int ids = st.add(batch.tokens);
  std::vector<std::array<int, 3>> eh;  // per planned ratio: seq, row, pos handles
  for (int r : emit_ratios) {
    if (r <= 0) continue;
    bool dup = false;
    for (const auto& e : p.emits) dup = dup || e.first == r;
    if (dup) continue;
    p.emits.push_back({r, plan_emits_host(m, r)});
    const EmitPlan& e = p.emits.back().second;
    eh.push_back({st.add(e.h_seq), st.add(e.h_row), st.add(e.h_pos)});
  }
  st.upload(be, &p.storage);
  bind_meta(m, mh, st);
  p.ids = st.tensor(ids);
  for (size_t i = 0; i < p.emits.size(); ++i) {
    EmitPlan& e = p.emits[i].second;
    e.seq = st.tensor(eh[i][0]);
    e.row = st.tensor(eh[i][1]);
    e.pos = st.tensor(eh[i][2]);
  }
  return p;
}

void upload_meta(StepMeta& m, Backend& be, std::vector<Buffer>* storage) {
  StepStaging st;
  const MetaHandles mh = stage_meta(m, st);
  st.upload(be, storage);
  bind_meta(m, mh, st);
}

EmitPlan plan_emits_host(const StepMeta& m, int ratio) {
  EmitPlan e;
  for (int s = 0; s < m.n_seqs; ++s) {
    int begin = m.h_start_pos[size_t(s)], end = begin + m.h_len[size_t(s)];
    // windows w with begin <= (w+1)*ratio - 1 < end
    for (int w = begin / ratio; (w + 1) * ratio <= end; ++w) {
      if ((w + 1) * ratio - 1 < begin) continue;
      e.h_seq.push_back(s);
      e.h_row.push_back(w);
      e.h_pos.push_back(w * ratio);
    }
  }
  e.n = int(e.h_seq.size());
  return e;
}

EmitPlan plan_emits(const StepMeta& m, int ratio, Backend& be, std::vector<Buffer>* storage) {
  EmitPlan e = plan_emits_host(m, ratio);
  StepStaging st;
  const int a = st.add(e.h_seq), b = st.add(e.h_row), c = st.add(e.h_pos);
  st.upload(be, storage);
  e.seq = st.tensor(a);
  e.row = st.tensor(b);
  e.pos = st.tensor(c);
  return e;
}

std::vector<int32_t> fresh_slots(const StepMeta& m) {
  std::vector<int32_t> r;
  for (int s = 0; s < m.n_seqs; ++s)
    if (m.h_start_pos[size_t(s)] == 0) r.push_back(m.h_slot[size_t(s)]);
  return r;
}

std::vector<int64_t> logit_rows(const StepBatch& batch, const StepMeta& m) {
  std::vector<int64_t> rows;
  for (int s = 0; s < m.n_seqs; ++s) {
    const SeqChunk& c = batch.seqs[size_t(s)];
    const int q0 = m.h_q_start[size_t(s)], len = m.h_len[size_t(s)];
    if (c.all_logits) {
      DIL_CHECK(len == c.n_tokens, "all_logits chunk ", s, " has ", len, " of its ", c.n_tokens, " rows");
      for (int t = 0; t < len; ++t) rows.push_back(q0 + t);
    } else if (c.want_logits) {
      rows.push_back(q0 + len - 1);
    }
  }
  return rows;
}

void copy_rows(Backend& be, const Tensor& src, const std::vector<int64_t>& rows, Tensor dst) {
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    be.copy(dst.rows(int64_t(i), int64_t(j)), src.rows(rows[i], rows[i] + int64_t(j - i)));
    i = j;
  }
}

std::array<RopeTable, 2> make_rope_tables(const ModelConfig& cfg, Backend& be, std::vector<Buffer>* storage) {
  std::array<RopeTable, 2> tables;
  for (int k = 0; k < 2; ++k) {
    std::vector<float> f = rope_inv_freq(cfg, k == 1);
    Buffer b = be.alloc(f.size() * 4);
    tables[size_t(k)].inv_freq = Tensor(b.data(), DType::F32, {int64_t(f.size())}, be.device());
    tables[size_t(k)].rope_dims = cfg.rope_dims;
    be.upload(tables[size_t(k)].inv_freq, f.data());
    storage->push_back(std::move(b));
  }
  return tables;
}

void fill_uniform(Backend& be, Buffer& b, uint64_t seed, DType dt) {
  if (!b.data()) return;
  DIL_CHECK(dt == DType::F32 || dt == DType::BF16, "fill_uniform: f32 or bf16");
  const size_t n = b.bytes() / dtype_size(dt);
  std::vector<float> host(n);
  uint64_t s = seed;
  for (size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    host[i] = float(int64_t(s >> 40) - (1ll << 23)) / float(1 << 23);
  }
  if (dt == DType::F32) {
    be.upload(Tensor(b.data(), DType::F32, {int64_t(n)}, be.device()), host.data());
    return;
  }
  std::vector<uint16_t> h16(n);
  for (size_t i = 0; i < n; ++i) h16[i] = f32_to_bf16(host[i]);
  be.upload(Tensor(b.data(), DType::BF16, {int64_t(n)}, be.device()), h16.data());
}

void fill_uniform_packed(Backend& be, Buffer& b, uint64_t seed, const kvpack::RowShape& pack) {
  if (!b.data()) return;
  const size_t rb = kvpack::row_bytes(pack), n_rows = b.bytes() / rb;
  DIL_CHECK(n_rows * rb == b.bytes(), "fill_uniform_packed: ", b.bytes(), " bytes are not rows of ", rb);
  constexpr size_t kChunk = 4096;  // rows packed on the host per upload
  std::vector<float> x(size_t(pack.d));           // [d] one row
  std::vector<uint8_t> rows(kChunk * rb);         // [kChunk, rb] packed
  uint64_t s = seed;
  for (size_t r0 = 0; r0 < n_rows; r0 += kChunk) {
    const size_t n = std::min(kChunk, n_rows - r0);
    for (size_t r = 0; r < n; ++r) {
      for (float& v : x) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        v = float(int64_t(s >> 40) - (1ll << 23)) / float(1 << 23);
      }
      kvpack::pack_row(pack, x.data(), rows.data() + r * rb);
    }
    be.upload(Tensor(static_cast<uint8_t*>(b.data()) + r0 * rb, DType::U8, {int64_t(n * rb)}, be.device()), rows.data());
  }
}

}  // namespace dil
