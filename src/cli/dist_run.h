// The CLI side of multi-rank runs: --nproc/--nnodes/--node-rank/--master-addr/--master-port
// (src/dist/launch.h) and lockstep stepping of per-rank sequences (every rank joins every
// step's collectives; a rank whose sequences are done runs empty steps until all are).
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "cli/args.h"
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

// Reads the launch options. Returns nullptr when this process is the launcher (then
// *launcher_status is the job's exit status); otherwise the backend (on this rank's GPU) and
// communicator of this rank.
// argc/argv: the subcommand's (argv[0] = its name, argv[-1] = the program).
// nproc > 0: ranks per machine fixed by the command (serve's --dp / --nnodes) instead of --nproc.
std::unique_ptr<DistRun> start_dist(const Args& args, int argc, char** argv, int* launcher_status,
                                    const char* default_device = "cpu", int nproc = 0);

// The model of --model on this rank's backend, with --mode numerics and expert parallelism
// over the job's ranks.
std::unique_ptr<Model> load_dist_model(const Args& args, DistRun& run);
// Every id of `lists` inside [0, vocab) (dil::Error naming the first that is not).
void check_token_ids(const std::vector<std::vector<int32_t>>& lists, int64_t vocab);

// One step of this rank: `tokens` into `seq` (empty tokens: an idle step; seq may then be
// null). Returns false, running nothing, when no rank had tokens.
bool lockstep(Model& model, Communicator* comm, SingleSequence* seq, const std::vector<int32_t>& tokens,
              bool all_logits, std::vector<float>* logits);

// "1,2,3;4,5" -> two id lists (';' separates sequences).
std::vector<std::vector<int32_t>> parse_id_lists(const std::string& s);

}  // namespace dil::cli
