#include "cli/dist_run.h"

#include <cstdio>

#include "backend/plan.h"
#include "cli/ids.h"
#include "cli/load_report.h"

namespace dil::cli {

std::unique_ptr<DistRun> start_dist(const LaunchRequest& req, const std::string& device, const ProgramArgs& prog,
                                    int* launcher_status, const std::string& kernels) {
  auto r = std::make_unique<DistRun>();
  r->req = req;
  r->plan = plan_launch(r->req);
  if (r->plan.spawn) {
    *launcher_status = spawn_ranks(r->plan, r->req, prog.argc, prog.argv);
    return nullptr;
  }
  BackendOptions bo;
  if (!kernels.empty()) parse_kernel_overrides(kernels, &bo);
  r->be = make_backend(parse_backend_kind(device), r->plan.local_rank, bo);
  if (r->plan.dist.size > 1) r->comm = make_communicator(*r->be, r->plan.dist);
  return r;
}

std::unique_ptr<Model> load_dist_model(const std::string& dir, Numerics numerics, DistRun& run) {
  ModelOptions opt;
  opt.numerics = numerics;
  opt.comm = run.comm.get();
  if (run.rank() != 0) return load_model(dir, *run.be, opt);
  LoadPrinter printer = LoadPrinter::for_stderr();
  opt.on_progress = printer.callback();
  auto model = load_model(dir, *run.be, opt);
  std::fprintf(stderr, "%s\n", loaded_line(printer.last(), "").c_str());
  return model;
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
