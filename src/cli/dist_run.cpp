#include "cli/dist_run.h"

#include <cstdio>

#include "cli/ids.h"

namespace dil::cli {

std::unique_ptr<DistRun> start_dist(const Args& args, int argc, char** argv, int* launcher_status,
                                    const char* default_device, int nproc) {
  auto r = std::make_unique<DistRun>();
  r->req.nproc = nproc > 0 ? nproc : int(args.get_int("nproc", 1));
  r->req.nnodes = int(args.get_int("nnodes", 1));
  r->req.node_rank = int(args.get_int("node-rank", 0));
  r->req.master_addr = args.get("master-addr", "");
  r->req.master_port = int(args.get_int("master-port", 0));
  r->req.timeout_s = double(args.get_int("dist-timeout", 300));
  r->plan = plan_launch(r->req);
  if (r->plan.spawn) {
    *launcher_status = spawn_ranks(r->plan, r->req, argc + 1, argv - 1);  // argv[-1]: the program
    return nullptr;
  }
  r->be = make_backend(parse_backend_kind(args.get("device", default_device)), r->plan.local_rank);
  if (r->plan.dist.size > 1) r->comm = make_communicator(*r->be, r->plan.dist);
  return r;
}

std::unique_ptr<Model> load_dist_model(const Args& args, DistRun& run) {
  ModelOptions opt;
  opt.numerics = parse_numerics(args.get("mode", "official"));
  opt.comm = run.comm.get();
  return load_model(args.need("model"), *run.be, opt);
}

void check_token_ids(const std::vector<std::vector<int32_t>>& lists, int64_t vocab) {
  for (const auto& l : lists)
    for (int32_t t : l)
      if (t < 0 || t >= vocab) DIL_FAIL("token id ", t, " outside the vocabulary [0, ", vocab, ")");
}

bool lockstep(Model& model, Communicator* comm, SingleSequence* seq, const std::vector<int32_t>& tokens,
              bool all_logits, std::vector<float>* logits) {
  if (!comm) {
    if (tokens.empty()) return false;
    *logits = seq->feed(tokens, all_logits);
    return true;
  }
  std::vector<int64_t> counts = comm->exchange({int64_t(tokens.size())});
  bool any = false;
  for (int64_t c : counts) any = any || c > 0;
  if (!any) return false;
  if (tokens.empty()) {
    StepBatch idle;
    idle.rank_tokens = counts;
    model.forward(idle, logits);
  } else {
    *logits = seq->feed(tokens, all_logits, counts);
  }
  return true;
}

std::vector<std::vector<int32_t>> parse_id_lists(const std::string& s) {
  std::vector<std::vector<int32_t>> out;
  size_t a = 0;
  for (;;) {
    size_t b = s.find(';', a);
    std::string part = s.substr(a, b == std::string::npos ? std::string::npos : b - a);
    out.push_back(parse_ids(part));
    if (out.back().empty()) DIL_FAIL("empty id list in '", s, "'");
    if (b == std::string::npos) break;
    a = b + 1;
  }
  return out;
}

}  // namespace dil::cli
