// Starting the ranks of a job. One process per GPU (design.md "Scale"):
// - `--nproc N` on one machine: the launcher process spawns N copies of the program (local
//   ranks 0..N-1, rank i on GPU i), waits for them and returns the first failure's status;
// - several machines: the same command on each with --nnodes M --node-rank k
//   --master-addr HOST --master-port P (global rank = k*N + local rank);
// - under mpirun or SLURM (one process per rank already): the rank, world size and local rank
//   are read from OMPI_COMM_WORLD_* or SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID.
#pragma once
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace dil {

struct LaunchRequest {
  int nproc = 1;       // ranks per machine
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;  // empty: MASTER_ADDR or 127.0.0.1
  int master_port = 0;      // 0: MASTER_PORT, or (one machine) a free port, or 29500
  double timeout_s = 300;
};

struct LaunchPlan {
  bool spawn = false;   // this process is the launcher: call spawn_ranks and exit with its status
  DistOptions dist;     // this process's rank (size 1: a plain single-rank run)
  int local_rank = 0;   // GPU index on this machine
};

// Decides what this process is from the request and the environment (DIL_RANK etc. set by
// spawn_ranks, then the mpirun/SLURM variables).
LaunchPlan plan_launch(const LaunchRequest& req);

// Runs argv (this program, same arguments) as ranks [node_rank*nproc, (node_rank+1)*nproc) of
// the job and waits. When one rank fails the others get a few seconds to exit on their own
// (their watchdog notices) and are then killed. Returns 0 or the first failing rank's status.
int spawn_ranks(const LaunchPlan& plan, const LaunchRequest& req, int argc, char** argv);

}  // namespace dil
