// The CLI side of multi-rank runs: the launch options (src/dist/launch.h, declared by
// add_launch_options) and lockstep stepping of per-rank sequences (every rank joins every
// step's collectives; a rank whose sequences are done runs empty steps until all are).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/app.h"
#include "dist/communicator.h"
#include "dist/launch.h"
#include "model/model.h"
#include "model/single_sequence.h"

namespace dil::cli {

struct DistRun {
  LaunchRequest req;
  LaunchPlan plan;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Communicator> comm;  // null on a single rank
  int rank() const { return plan.dist.rank; }
  int size() const { return plan.dist.size; }
};

// Returns nullptr when this process is the launcher (it re-executed `prog` once per local
// rank; *launcher_status is the job's exit status); otherwise the backend (`device`, on this
// rank's GPU) and communicator of this rank.
// `kernels`: forced implementations, op=impl[,op=impl...] (parse_kernel_overrides), for
// benchmark baselines measured in the same run.
std::unique_ptr<DistRun> start_dist(const LaunchRequest& req, const std::string& device, const ProgramArgs& prog,
                                    int* launcher_status, const std::string& kernels = "");

// The model in folder `dir` on this rank's backend, with `numerics` and expert parallelism
// over the job's ranks. Rank 0 prints the load progress and the final load line (stderr).
std::unique_ptr<Model> load_dist_model(const std::string& dir, Numerics numerics, DistRun& run);
// Every id of `lists` inside [0, vocab) (dil::Error naming the first that is not).
void check_token_ids(const std::vector<std::vector<int32_t>>& lists, int64_t vocab);

// One step of this rank: `tokens` into `seq` (empty tokens: an idle step; seq may then be
// null). Returns false, running nothing, when no rank had tokens.
bool lockstep(Model& model, Communicator* comm, SingleSequence* seq, const std::vector<int32_t>& tokens,
              bool all_logits, std::vector<float>* logits);

// "1,2,3;4,5" -> two id lists (';' separates sequences).
std::vector<std::vector<int32_t>> parse_id_lists(const std::string& s);

}  // namespace dil::cli
