#include "model/step.h"

#include <algorithm>

#include "model/rope.h"

namespace dil {

Tensor upload_i32(const std::vector<int32_t>& v, Backend& be, std::vector<Buffer>* storage) {
  size_t n = std::max<size_t>(v.size(), 1);
  Buffer b = be.alloc(n * 4);
  Tensor t(b.data(), DType::I32, {int64_t(v.size())}, be.device());
  if (!v.empty()) be.upload(t, v.data());
  storage->push_back(std::move(b));
  return t;
}

StepPlan plan_step(const StepBatch& batch, int block_tokens, Backend& be) {
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
  upload_meta(m, be, &p.storage);
  p.ids = upload_i32(batch.tokens, be, &p.storage);
  return p;
}

void upload_meta(StepMeta& m, Backend& be, std::vector<Buffer>* st) {
  m.q_start = upload_i32(m.h_q_start, be, st);
  m.len = upload_i32(m.h_len, be, st);
  m.start_pos = upload_i32(m.h_start_pos, be, st);
  m.slot = upload_i32(m.h_slot, be, st);
  m.tok_pos = upload_i32(m.h_tok_pos, be, st);
  m.tok_seq = upload_i32(m.h_tok_seq, be, st);
  m.block_table = upload_i32(m.h_block_table, be, st).view({m.n_seqs, m.max_blocks});
}

EmitPlan plan_emits(const StepMeta& m, int ratio, Backend& be, std::vector<Buffer>* storage) {
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
  e.seq = upload_i32(e.h_seq, be, storage);
  e.row = upload_i32(e.h_row, be, storage);
  e.pos = upload_i32(e.h_pos, be, storage);
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
