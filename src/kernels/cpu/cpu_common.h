// Helpers shared by the CPU reference ops (internal to src/kernels/cpu).
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace dil::cpu {

// Checks that `t` is a host f32 tensor (parameters, states, f32-only activations).
void check_f32(const Tensor& t, const char* what);
void check_i32(const Tensor& t, const char* what);
// Checks that `t` is a host activation tensor: f32 or bf16 (backend.h conventions).
void check_act(const Tensor& t, const char* what);

// Row i (d values) of a host activation tensor as f32: f32 rows in place, bf16 rows widened
// (exactly) into tmp[0, d).
const float* act_row(const Tensor& t, int64_t i, int64_t d, float* tmp);
// Writes v[0, d) into row i of a host activation tensor (bf16: rounded to nearest even).
void set_act_row(Tensor& t, int64_t i, int64_t d, const float* v);

// KV cache tensors (backend.h AttnArgs): plain activation rows, or U8 packed rows when
// pack.packed(). check_kv: the tensor is [n, rows, d] of the activation dtype, or U8
// [n, rows, row_bytes(pack)] with pack.d == d. kv_row: row i of it as f32 (a packed row
// dequantized into tmp[0, d), exactly the QDQ'd values). set_kv_row: row i <- v[0, d) (packed:
// quantized once, kvpack::pack_row).
void check_kv(const Tensor& t, const kvpack::RowShape& pack, int64_t d, const char* what);
const float* kv_row(const Tensor& t, const kvpack::RowShape& pack, int64_t i, int64_t d, float* tmp);
void set_kv_row(Tensor& t, const kvpack::RowShape& pack, int64_t i, int64_t d, const float* v);

// An f32 image of a host activation tensor, for ops written on f32 loops. An f32 tensor is
// used in place; a bf16 one is widened into a copy (exact), and, for an output (`write`),
// rounded back element by element (RNE) by flush() or the destructor. Inputs and outputs may
// alias (in-place ops): each stage has its own copy, so inputs read the values before the op.
class Staged {
 public:
  Staged(const Tensor& t, const char* what, bool write = false);
  ~Staged() { flush(); }
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;
  Tensor t;  // f32, the shape of the original
  float* f() const { return t.ptr<float>(); }
  void flush();

 private:
  Tensor orig_;
  Buffer copy_;
  bool write_ = false;
};
// Last dimension and number of rows (numel / last dim) of a tensor viewed as [rows, d].
inline int64_t last_dim(const Tensor& t) { return t.ndim ? t.shape[t.ndim - 1] : 0; }
inline int64_t n_rows(const Tensor& t) { int64_t d = last_dim(t); return d ? t.numel() / d : 0; }

// FP8 activation quantization, quantize-dequantize form (official act_quant, inplace=True),
// applied to x[0, n) in blocks of `block` (a ragged last block uses its real elements):
//   amax = max(max|x_blk|, 1e-4f); s = pow2_ceil(amax * (1.0f/448.0f));
//   x <- e4m3_RNE(clamp(x/s, -448, 448)) * s.
void act_quant_qdq(float* x, int64_t n, int block);

// Weight shape [out, in] in logical (dequantized) elements.
int64_t weight_rows(const Weight& w);
int64_t weight_cols(const Weight& w);
// Dequantizes row i of `w` into out[0, in) (model-spec §2.1); every value is exact in double:
//   F32/BF16: the value; FP8: e4m3(q[i,j]) * 2^(S[i/bo, j/bi]-127);
//   FP4: e2m1(nibble(i,j)) * 2^(S[i, j/32]-127), byte k holding column 2k in its low nibble.
void dequant_row(const Weight& w, int64_t i, double* out);

// out[t, o] = sum_k xq[t, k] * W[o, k] for t < T (x [T, in], ld_x floats between rows;
// out [T, out], ld_out floats between rows). With act_block > 0 and an FP8/FP4 weight each
// row of x is first act-quantized (act_quant_qdq) in blocks of act_block (the official
// linear(); F32/BF16 weights take x as is). Accumulation in double over k in
// ascending order, rounded once to f32. Each weight row is dequantized once per call.
void linear_rows(const float* x, int64_t T, int64_t ld_x, const Weight& w, int act_block,
                 float* out, int64_t ld_out);

// Activations evaluated in double and rounded once (CUDA: the same in double).
float sigmoid_f(float x);
float silu_f(float x);

}  // namespace dil::cpu
