// The TCP loopback communicator's collectives on the CPU backend, 3 ranks, exact values.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "dist_util.h"

using namespace dil;
using namespace dil::test;

TEST(TcpCommunicator, CollectivesAndExchange) {
  const int R = 3, port = free_port();
  run_ranks(R, [&](int r) {
    auto be = make_backend(BackendKind::CPU);
    auto comm = make_communicator(*be, options(r, R, port));
    ASSERT_EQ(comm->rank(), r);
    ASSERT_EQ(comm->size(), R);
    // all_gather: rank r contributes [2, 2] rows of value 10r + i.
    Buffer a = be->alloc(4 * 4), g = be->alloc(R * 4 * 4);
    Tensor in = a.as(DType::F32, {2, 2}), all = g.as(DType::F32, {R * 2, 2});  // [2, 2], [R*2, 2] f32
    for (int i = 0; i < 4; ++i) in.ptr<float>()[i] = float(10 * r + i);
    comm->all_gather(in, all);
    for (int q = 0; q < R; ++q)
      for (int i = 0; i < 4; ++i) EXPECT_EQ(all.ptr<float>()[q * 4 + i], float(10 * q + i));
    // i32 all_gather (routing indices travel this way).
    Buffer ai = be->alloc(4), gi = be->alloc(R * 4);
    Tensor ii = ai.as(DType::I32, {1}), io = gi.as(DType::I32, {R});
    ii.ptr<int32_t>()[0] = -1 - r;
    comm->all_gather(ii, io);
    for (int q = 0; q < R; ++q) EXPECT_EQ(io.ptr<int32_t>()[q], -1 - q);
    // reduce_scatter: element j of rank r's input is r + j/8; rank r receives chunk r summed.
    Buffer b = be->alloc(R * 2 * 4), o = be->alloc(2 * 4);
    Tensor rin = b.as(DType::F32, {R * 2}), rout = o.as(DType::F32, {2});  // [R*2], [2] f32
    for (int j = 0; j < R * 2; ++j) rin.ptr<float>()[j] = float(r) + float(j) / 8;
    comm->reduce_scatter(rin, rout);
    for (int j = 0; j < 2; ++j) EXPECT_EQ(rout.ptr<float>()[j], float(0 + 1 + 2) + 3 * float(r * 2 + j) / 8);
    // all_reduce in place.
    Tensor x = rout;
    x.ptr<float>()[0] = float(r + 1);
    x.ptr<float>()[1] = 0.5f;
    comm->all_reduce(x);
    EXPECT_EQ(x.ptr<float>()[0], 6.0f);
    EXPECT_EQ(x.ptr<float>()[1], 1.5f);
    // Host exchange of shape vectors.
    auto v = comm->exchange({int64_t(r), int64_t(100 + r)});
    ASSERT_EQ(v.size(), size_t(2 * R));
    for (int q = 0; q < R; ++q) {
      EXPECT_EQ(v[size_t(2 * q)], q);
      EXPECT_EQ(v[size_t(2 * q + 1)], 100 + q);
    }
    comm->barrier();
  });
}

TEST(TcpCommunicator, VariableLengthGatherAndScatter) {
  const int R = 3, port = free_port();
  // Rank r's message: r*1000 + 7 bytes (rank 0's 7 bytes, an empty one in round 2).
  auto message = [](int r, int round) {
    std::vector<char> m(round == 2 && r == 1 ? 0 : size_t(r * 1000 + 7));
    for (size_t i = 0; i < m.size(); ++i) m[i] = char((i * 31 + size_t(r) * 7 + size_t(round)) & 0xff);
    return m;
  };
  run_ranks(R, [&](int r) {
    auto be = make_backend(BackendKind::CPU);
    auto comm = make_communicator(*be, options(r, R, port));
    for (int round = 0; round < 3; ++round) {
      const auto all = comm->gather_bytes(message(r, round));
      if (r == 0) {
        ASSERT_EQ(all.size(), size_t(R));
        for (int q = 0; q < R; ++q) EXPECT_EQ(all[size_t(q)], message(q, round)) << "from rank " << q;
      } else {
        EXPECT_TRUE(all.empty());
      }
      // Scatter: rank 0 sends rank q the message of rank (q + 1) % R of the next round.
      std::vector<std::vector<char>> parts;
      if (r == 0)
        for (int q = 0; q < R; ++q) parts.push_back(message((q + 1) % R, round + 1));
      EXPECT_EQ(comm->scatter_bytes(parts), message((r + 1) % R, round + 1));
    }
  });
}

TEST(TcpCommunicator, RankOutsideTheWorldIsAnError) {
  auto be = make_backend(BackendKind::CPU);
  EXPECT_THROW(make_communicator(*be, options(2, 2, free_port())), Error);
}

TEST(TcpCommunicator, MissingRankTimesOutWithAClearError) {
  auto be = make_backend(BackendKind::CPU);
  DistOptions o = options(0, 2, free_port());
  o.timeout_s = 0.5;
  try {
    make_communicator(*be, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("waited"), std::string::npos) << e.what();
  }
}
