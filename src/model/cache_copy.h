// The models' Model::copy_cache (fork and prefix cache, model.h CacheCopy): every cache buffer is
// laid out [n_units, ...] with units = slots (SWA rings, compressor state) or blocks (compressed
// rows, indexer keys), so a copy is one device copy of a unit's bytes per buffer, whatever the
// dtype (f32, or bf16 rows in fast numerics).
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace dil {

// Unit `src` of `b` ([n_units, ...]) onto unit `dst`; nothing for an unallocated buffer.
void copy_cache_unit(Backend& be, const Buffer& b, int64_t n_units, int32_t src, int32_t dst);

}  // namespace dil
