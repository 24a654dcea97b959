#include "model/cache_copy.h"

#include "model/v41_model.h"
#include "model/v4_model.h"

namespace dil {

void copy_cache_unit(Backend& be, const Buffer& b, int64_t n_units, int32_t src, int32_t dst) {
  if (b.bytes() == 0 || src == dst) return;
  DIL_CHECK(n_units > 0 && b.bytes() % size_t(n_units) == 0, "cache buffer of ", b.bytes(), " bytes is not ",
            n_units, " units");
  DIL_CHECK(src >= 0 && src < n_units && dst >= 0 && dst < n_units, "cache copy ", src, " -> ", dst, " outside ",
            n_units, " units");
  const int64_t unit = int64_t(b.bytes()) / n_units;
  const Tensor all = b.as(DType::U8, {n_units, unit});  // [n_units, unit bytes]
  be.copy(all.rows(dst, dst + 1), all.rows(src, src + 1));
}

void V4Model::copy_cache(const std::vector<CacheCopy>& ops) {
  for (const CacheCopy& op : ops) {
    const bool slot = op.kind == CacheCopy::Kind::Slot;
    const int64_t units = slot ? cache_.n_slots : cache_.n_blocks;
    for (Layer& l : layers_) {
      if (slot) {
        for (const Buffer* b : {&l.ring, &l.cstate_kv, &l.cstate_score, &l.istate_kv, &l.istate_score})
          copy_cache_unit(be_, *b, units, op.src, op.dst);
      } else {
        for (const Buffer* b : {&l.comp_rows, &l.idx_rows}) copy_cache_unit(be_, *b, units, op.src, op.dst);
      }
    }
    if (slot && mtp_) {  // the MTP ring (its draft rows beyond the slots are never copied) and hidden
      copy_cache_unit(be_, mtp_->block.ring, mtp_->block.ring_slots, op.src, op.dst);
      copy_cache_unit(be_, mtp_->hidden, units, op.src, op.dst);
    }
  }
}

void V41Model::copy_cache(const std::vector<CacheCopy>& ops) {
  for (const CacheCopy& op : ops) {
    const bool slot = op.kind == CacheCopy::Kind::Slot;
    const int64_t units = slot ? cache_.n_slots : cache_.n_blocks;
    for (Layer& l : layers_) {
      if (!l.active) continue;
      if (slot) {
        for (const Buffer* b : {&l.ring, &l.cstate_kv, &l.cstate_score}) copy_cache_unit(be_, *b, units, op.src, op.dst);
      } else {
        for (const Buffer* b : {&l.comp_rows, &l.idx_rows}) copy_cache_unit(be_, *b, units, op.src, op.dst);
      }
    }
    if (slot && dsp_)  // the DSpark rings: the context rows of the sequence's positions
      for (const Layer& l : dsp_->blocks) copy_cache_unit(be_, l.ring, units, op.src, op.dst);
    if (slot) {
      // The Engram look-back is host state: copied here, in program order with the forwards that
      // read and write it (they run on the host thread that issues the device work).
      DIL_CHECK(op.src >= 0 && op.src < cache_.n_slots && op.dst >= 0 && op.dst < cache_.n_slots, "slot copy ",
                op.src, " -> ", op.dst, " outside ", cache_.n_slots, " slots");
      hist_[size_t(op.dst)] = hist_[size_t(op.src)];
      hist_next_[size_t(op.dst)] = hist_next_[size_t(op.src)];
    }
  }
}

}  // namespace dil
