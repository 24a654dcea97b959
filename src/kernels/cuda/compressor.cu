// The compressor recurrence (model-spec §3.6, §3.9.4) in two data-parallel passes instead of
// a token-serial loop: (1) every row emitted this step pools its window's slots per channel,
// each slot read from this step's a/g rows or from the state the step started with;
// (2) the state is rewritten to what the token-by-token recurrence leaves behind (per slot:
// the latest token of that residue; for the overlapped ratio, the previous-window rows copied
// at the last emission). Pass 2 runs after pass 1 on the same stream. a, g and the state are
// f32 (the official compressor pools in fp32); the emitted rows are an activation, f32 or bf16
// (pass 1 is a template over their storage type, the pooled value rounded once to it).
#include "kernels/cuda/ops.cuh"

namespace dil::cuda {
namespace {

struct CompParams {
  const float *a, *g, *ape;       // [T, C], [T, C], [m, C] or null
  float *skv, *ssc;               // [n_slots, rows, C]
  void* out;                      // [n_emit, dc] f32 | bf16
  const int32_t *q_start, *start_pos, *len, *slot;
  const int32_t *e_seq, *e_row;
  int m, rows, C, dc;
  bool overlap;
};

// (a, g+ape) of position q of sequence s as the recurrence sees it at this step.
__device__ __forceinline__ void comp_fetch(const CompParams& P, int s, int q, int col, float& av, float& gv) {
  int sp = P.start_pos[s];
  if (q >= sp) {
    int64_t t = P.q_start[s] + (q - sp);
    av = P.a[t * P.C + col];
    gv = P.g[t * P.C + col];
    if (P.ape) gv += P.ape[int64_t(q % P.m) * P.C + col];
    return;
  }
  // Before the step: the current partial window [sp - sp%m, sp) lives in rows m + q%m
  // (overlap) or q%m; the previous window (positions below it, negative ones included: a reset
  // state there has score -inf) in rows q%m.
  int row = ((q % P.m) + P.m) % P.m;
  if (P.overlap && q >= sp - sp % P.m) row += P.m;
  int64_t o = (int64_t(P.slot[s]) * P.rows + row) * P.C + col;
  av = P.skv[o];
  gv = P.ssc[o];
}

template <class TO>
__global__ void comp_emit_kernel(CompParams P) {
  pdl_enter();
  int e = blockIdx.x;
  int s = P.e_seq[e], w = P.e_row[e];
  const int n_prev = P.overlap ? P.m : 0;
  const int off = P.overlap ? P.dc : 0;
  for (int ch = threadIdx.x; ch < P.dc; ch += blockDim.x) {
    // Slot i < n_prev: window w-1 (columns [0, dc)); else window w (columns [off, off+dc)).
    // As the reference: max, then exp / sums in double; a weight of exactly 0 (score -inf)
    // skips its value; the pooled value is rounded once.
    double mx = -INFINITY;
    for (int i = 0; i < n_prev + P.m; ++i) {
      int q = i < n_prev ? (w - 1) * P.m + i : w * P.m + (i - n_prev);
      float av, gv;
      comp_fetch(P, s, q, i < n_prev ? ch : off + ch, av, gv);
      mx = fmax(mx, double(gv));
    }
    double den = 0.0, acc = 0.0;
    for (int i = 0; i < n_prev + P.m; ++i) {
      int q = i < n_prev ? (w - 1) * P.m + i : w * P.m + (i - n_prev);
      float av, gv;
      comp_fetch(P, s, q, i < n_prev ? ch : off + ch, av, gv);
      double ex = exp(double(gv) - mx);
      den += ex;
      if (ex != 0.0) acc += ex * double(av);
    }
    st_act(static_cast<TO*>(P.out) + int64_t(e) * P.dc + ch, float(acc / den));
  }
}

constexpr int kMaxOverlapRatio = 8;  // the overlapped compressor's ratio (V4: 4)

// One thread per (sequence, column): writes the state rows the step changes, in that column
// (rows the recurrence leaves alone are not touched). Current-window rows: row cur0 + q % m
// takes position q for every q of the step's last m positions (the latest of each residue).
// Overlapped ratio, when a window completed in the step: rows j < m take that window's
// positions, read before any write (some come from the current-window rows of the initial state).
__global__ void comp_state_kernel(CompParams P, int n_seqs) {
  pdl_enter();
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= int64_t(n_seqs) * P.C) return;
  int s = int(i / P.C), col = int(i % P.C);
  int sp = P.start_pos[s], L = P.len[s];
  if (L == 0) return;
  int end = sp + L;  // first position not processed
  const int64_t base = int64_t(P.slot[s]) * P.rows * P.C + col;  // row r of the slot at base + r * C
  float pa[kMaxOverlapRatio], pg[kMaxOverlapRatio];  // previous-window rows j < m (overlap)
  bool emitted = false;
  if (P.overlap) {
    int w_last = end / P.m - 1;  // last window completed by the end of the step
    emitted = w_last >= 0 && (w_last + 1) * P.m - 1 >= sp;
    if (emitted) {
#pragma unroll
      for (int j = 0; j < kMaxOverlapRatio; ++j) {
        if (j >= P.m) break;
        int q = w_last * P.m + j;
        if (q >= sp) {
          comp_fetch(P, s, q, col, pa[j], pg[j]);
        } else {  // still in the current-window rows of the step's initial state
          pa[j] = P.skv[base + int64_t(P.m + j) * P.C];
          pg[j] = P.ssc[base + int64_t(P.m + j) * P.C];
        }
      }
    }
  }
  const int cur0 = P.overlap ? P.m : 0;  // rows of the current window
  for (int q = max(sp, end - P.m); q < end; ++q) {
    float av, gv;
    comp_fetch(P, s, q, col, av, gv);
    const int64_t o = base + int64_t(cur0 + q % P.m) * P.C;
    P.skv[o] = av;
    P.ssc[o] = gv;
  }
  if (emitted) {
#pragma unroll
    for (int j = 0; j < kMaxOverlapRatio; ++j) {
      if (j >= P.m) break;
      P.skv[base + int64_t(j) * P.C] = pa[j];
      P.ssc[base + int64_t(j) * P.C] = pg[j];
    }
  }
}

}  // namespace

void compressor(Ctx& c, const CompressorArgs& a, const EmitPlan& plan, const StepMeta& m) {
  CompParams P{};
  P.m = a.ratio;
  P.overlap = a.overlap;
  P.dc = a.dc;
  P.C = (a.overlap ? 2 : 1) * a.dc;
  P.rows = int(a.state_kv.size(1));
  DIL_CHECK(P.rows == (a.overlap ? 2 : 1) * a.ratio && (!a.overlap || a.ratio <= kMaxOverlapRatio),
            "compressor: state rows ", P.rows, " for ratio ", a.ratio, a.overlap ? " (overlapped)" : "");
  DIL_CHECK(a.a.size(-1) == P.C && a.state_kv.size(2) == P.C, "compressor: width ", a.a.shape_str(), " vs ", P.C);
  check_f32(a.a, "compressor a");
  check_f32(a.g, "compressor g");
  check_f32(a.state_kv, "compressor state_kv");
  check_f32(a.state_score, "compressor state_score");
  P.a = a.a.ptr<float>();
  P.g = a.g.ptr<float>();
  P.ape = a.ape.empty() ? nullptr : a.ape.ptr<float>();
  P.skv = a.state_kv.ptr<float>();
  P.ssc = a.state_score.ptr<float>();
  P.out = a.out.empty() ? nullptr : a.out.data;
  P.q_start = m.q_start.ptr<int32_t>();
  P.start_pos = m.start_pos.ptr<int32_t>();
  P.len = m.len.ptr<int32_t>();
  P.slot = m.slot.ptr<int32_t>();
  if (plan.n > 0) {
    P.e_seq = plan.seq.ptr<int32_t>();
    P.e_row = plan.row.ptr<int32_t>();
    DIL_CHECK(a.out.numel() >= int64_t(plan.n) * P.dc, "compressor: out ", a.out.shape_str(), " for ", plan.n,
              " rows");
    with_act(a.out, "compressor out", [&](auto to) {
      using TO = decltype(to);
      launch_pdl(c, "comp_emit_kernel", comp_emit_kernel<TO>, dim3(unsigned(plan.n)), dim3(128), 0, P);
    });
  }
  if (m.n_seqs > 0) {
    launch_pdl(c, "comp_state_kernel", comp_state_kernel, dim3(grid_for(int64_t(m.n_seqs) * P.C, 128)), dim3(128), 0, P, m.n_seqs);
  }
}

}  // namespace dil::cuda
