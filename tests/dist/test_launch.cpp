// Which rank a process is: launcher (--nproc), a spawned rank, or a rank of mpirun / SLURM.
#include <gtest/gtest.h>

#include <cstdlib>

#include "dist/launch.h"

using namespace dil;

namespace {
void clear_env() {
  for (const char* v : {"DIL_RANK", "DIL_WORLD_SIZE", "DIL_LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "MASTER_ADDR",
                        "MASTER_PORT"})
    unsetenv(v);
}
}  // namespace

TEST(Launch, SingleRankByDefault) {
  clear_env();
  LaunchPlan p = plan_launch(LaunchRequest{});
  EXPECT_FALSE(p.spawn);
  EXPECT_EQ(p.dist.size, 1);
  EXPECT_EQ(p.dist.rank, 0);
}

TEST(Launch, NprocMakesALauncherWithAFreePort) {
  clear_env();
  LaunchRequest r;
  r.nproc = 2;
  LaunchPlan p = plan_launch(r);
  EXPECT_TRUE(p.spawn);
  EXPECT_EQ(p.dist.size, 2);
  EXPECT_GT(p.dist.master_port, 0);
  EXPECT_EQ(p.dist.master_addr, "127.0.0.1");
}

TEST(Launch, SeveralMachinesNeedAPort) {
  clear_env();
  LaunchRequest r;
  r.nproc = 2;
  r.nnodes = 2;
  r.node_rank = 1;
  EXPECT_THROW(plan_launch(r), Error);
  r.master_port = 29600;
  r.master_addr = "10.0.0.1";
  LaunchPlan p = plan_launch(r);
  EXPECT_TRUE(p.spawn);
  EXPECT_EQ(p.dist.size, 4);
  EXPECT_EQ(p.dist.master_addr, "10.0.0.1");
  r.node_rank = 2;
  EXPECT_THROW(plan_launch(r), Error);
}

TEST(Launch, RankFromMpirunAndSlurm) {
  clear_env();
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  setenv("MASTER_ADDR", "node0", 1);
  LaunchPlan p = plan_launch(LaunchRequest{});
  EXPECT_FALSE(p.spawn);
  EXPECT_EQ(p.dist.rank, 3);
  EXPECT_EQ(p.dist.size, 4);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.dist.master_addr, "node0");
  EXPECT_EQ(p.dist.master_port, 29500);
  clear_env();
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("MASTER_PORT", "29777", 1);
  p = plan_launch(LaunchRequest{});
  EXPECT_EQ(p.dist.rank, 5);
  EXPECT_EQ(p.dist.size, 8);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.dist.master_port, 29777);
  clear_env();
}
