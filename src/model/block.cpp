#include "model/block.h"

namespace dil {

void bind_block_weights(WeightBinder& b, const std::string& p, const ExpertParallel& ep, BlockWeights* l) {
  l->attn_norm = b.tensor(p + "attn_norm.weight");
  l->ffn_norm = b.tensor(p + "ffn_norm.weight");
  l->hc_attn = {b.tensor(p + "hc_attn_fn"), b.tensor(p + "hc_attn_base"), b.tensor(p + "hc_attn_scale")};
  l->hc_ffn = {b.tensor(p + "hc_ffn_fn"), b.tensor(p + "hc_ffn_base"), b.tensor(p + "hc_ffn_scale")};
  l->wq_a = b.matrix(p + "attn.wq_a");
  l->q_norm = b.tensor(p + "attn.q_norm.weight");
  l->wq_b = b.matrix(p + "attn.wq_b");
  l->wkv = b.matrix(p + "attn.wkv");
  l->kv_norm = b.tensor(p + "attn.kv_norm.weight");
  l->wo_a = b.matrix(p + "attn.wo_a");
  l->wo_b = b.matrix(p + "attn.wo_b");
  l->sink = b.tensor(p + "attn.attn_sink");
  l->gate = b.matrix(p + "ffn.gate");
  for (int e = ep.lo(); e < ep.hi(); ++e) {  // this rank's experts only (all of them on one rank)
    const std::string q = p + "ffn.experts." + std::to_string(e) + ".";
    l->w1.push_back(b.matrix(q + "w1"));
    l->w2.push_back(b.matrix(q + "w2"));
    l->w3.push_back(b.matrix(q + "w3"));
  }
  l->sw1 = b.matrix(p + "ffn.shared_experts.w1");
  l->sw2 = b.matrix(p + "ffn.shared_experts.w2");
  l->sw3 = b.matrix(p + "ffn.shared_experts.w3");
}

Tensor attention_output(Backend& be, StepProfiler* prof, const ModelConfig& cfg, const BlockWeights& l, AttnArgs& a,
                        const Tensor& kv, const StepMeta& m, int act_block, Scratch& s) {
  const int64_t T = a.q.size(0), H = a.q.size(1), hd = a.q.size(2), G = cfg.o_groups, D = cfg.dim;
  const DType act = a.q.dtype;
  Tensor o = s.make(act, {T, H, hd});
  a.out = o;
  {
    ProfileScope ps(prof, "attention core");
    be.sparse_attention(a, m);
    // A non-causal chunk (the DSpark draft block) is not part of its sequence: the ring keeps
    // the sequence's own rows.
    if (!a.non_causal) be.ring_write(kv, a.ring, m, a.ring_pack);
  }
  ProfileScope ps(prof, "projections");
  be.rope(o, m.tok_pos, l.rope, true);  // de-rotate the output's rope dims at the query position
  Tensor z = s.make(act, {T, G, cfg.o_lora_rank});
  // wo_a: dequantized, no act quant (the official convert.py makes it BF16; an einsum).
  be.grouped_linear(o.view({T, G, H * hd / G}), l.wo_a, int(G), z);
  Tensor y = s.make(act, {T, D});
  be.linear(z.view({T, G * cfg.o_lora_rank}), l.wo_b, act_block, y);
  return y;
}

}  // namespace dil
