// The two comm channels (comm/comm.h, comm/data_comm.h) over a thread world: the cpu backend's data
// channel moves device buffers through the world, the meta backend's moves nothing and never meets
// another rank, and an engine refuses a null buffer that has a count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "comm/data_comm.h"
#include "comm/thread_comm.h"
#include "core/error.h"
#include "core/units.h"

namespace fp {
namespace {

// Rank r's value i: distinct over ranks and positions.
float value(int r, int64_t i) { return static_cast<float>(1000 * (r + 1) + i); }

// Device tensor of n floats holding host values v (a null tensor when n = 0, as the arena gives).
Tensor upload(Backend& be, const std::vector<float>& v, const char* name) {
  const int64_t n = static_cast<int64_t>(v.size());
  Tensor t = be.alloc_f32(Category::Category_comm, {n}, name);
  if (n > 0) be.copy_from_host(t.data(), v.data(), t.bytes());
  return t;
}

std::vector<float> download(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) be.copy_to_host(v.data(), t.data(), t.bytes());
  return v;
}

// Every data-channel call of the cpu backend over a W-rank thread world, checked against what each
// rank must hold. Rank r sends r + d elements... to rank d in the all-to-all, so rank 0 sends nothing
// to itself and its send or receive buffers can be empty (null): the rule "null only with a count of
// 0" holds, and the other side of that rank still moves.
TEST(DataComm, CpuChannelMovesDeviceBuffers) {
  static constexpr int W = 3;
  ThreadWorld world(W);
  world.run([](Comm& comm) {
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    std::unique_ptr<DataComm> data = be->data_channel(comm);
    Stream& s = be->compute_stream();
    const int r = comm.rank();
    ASSERT_EQ(data->rank(), r);
    ASSERT_EQ(data->size(), W);

    // all_gather of 5 each.
    std::vector<float> mine(5);
    for (int64_t i = 0; i < 5; ++i) mine[i] = value(r, i);
    Tensor send = upload(*be, mine, "send");
    Tensor all = be->alloc_f32(Category::Category_comm, {W * 5}, "all");
    data->all_gather(s, send.data(), all.data(), 5, DType::DType_F32);
    const std::vector<float> got = download(*be, all);
    for (int q = 0; q < W; ++q)
      for (int64_t i = 0; i < 5; ++i) ASSERT_EQ(got[q * 5 + i], value(q, i)) << "rank " << r << " from " << q;

    // reduce_scatter_sum of W blocks of 4: block b of rank q holds value(q, b * 4 + i).
    std::vector<float> blocks(W * 4);
    for (int64_t i = 0; i < W * 4; ++i) blocks[i] = value(r, i);
    Tensor bsend = upload(*be, blocks, "blocks");
    Tensor mine4 = be->alloc_f32(Category::Category_comm, {4}, "mine4");
    data->reduce_scatter_sum(s, bsend.data(), mine4.data(), 4, DType::DType_F32);
    const std::vector<float> sum = download(*be, mine4);
    for (int64_t i = 0; i < 4; ++i) {
      float want = 0;
      for (int q = 0; q < W; ++q) want += value(q, r * 4 + i);
      ASSERT_EQ(sum[i], want) << "rank " << r << " element " << i;
    }

    // all_to_all_v: rank q sends q * d elements to rank d (rank 0 sends nothing at all, and nobody
    // sends to rank 0, so rank 0's both buffers are empty tensors with null data).
    std::vector<int64_t> sc(W), rc(W);
    for (int d = 0; d < W; ++d) sc[d] = static_cast<int64_t>(r) * d;
    for (int q = 0; q < W; ++q) rc[q] = static_cast<int64_t>(q) * r;
    const int64_t ns = std::accumulate(sc.begin(), sc.end(), int64_t{0});
    const int64_t nr = std::accumulate(rc.begin(), rc.end(), int64_t{0});
    std::vector<float> out(static_cast<size_t>(ns));
    for (int64_t i = 0; i < ns; ++i) out[i] = value(r, i);
    Tensor a_send = upload(*be, out, "a2a.send");
    Tensor a_recv = be->alloc_f32(Category::Category_comm, {nr}, "a2a.recv");
    if (r == 0) {
      ASSERT_TRUE(a_send.data() == nullptr && a_recv.data() == nullptr);
    }
    data->all_to_all_v(s, a_send.data(), sc.data(), a_recv.data(), rc.data(), DType::DType_F32);
    const std::vector<float> in = download(*be, a_recv);
    int64_t at = 0;
    for (int q = 0; q < W; ++q) {
      int64_t first = 0;  // where q's block for this rank starts in q's send buffer
      for (int d = 0; d < r; ++d) first += static_cast<int64_t>(q) * d;
      for (int64_t i = 0; i < rc[q]; ++i, ++at) ASSERT_EQ(in[at], value(q, first + i)) << "rank " << r << " from " << q;
    }

    // A ring shift, blocking and started: 3 elements to the next rank.
    const int next = (r + 1) % W, prev = (r + W - 1) % W;
    Tensor ring = be->alloc_f32(Category::Category_comm, {3}, "ring");
    data->send_recv(s, send.data(), 3, next, ring.data(), 3, prev, DType::DType_F32);
    std::vector<float> hop = download(*be, ring);
    for (int64_t i = 0; i < 3; ++i) ASSERT_EQ(hop[i], value(prev, i));
    CommRequest q = data->send_recv_start(s, send.f32() + 2, 3, next, ring.data(), 3, prev, DType::DType_F32);
    data->wait(q);
    EXPECT_FALSE(q.active());
    hop = download(*be, ring);
    for (int64_t i = 0; i < 3; ++i) ASSERT_EQ(hop[i], value(prev, 2 + i));
  });
}

// The meta backend's channel: null device buffers with real counts, and not one meeting of the world;
// the control channel still meets (and moves host data) on every call.
TEST(DataComm, MetaChannelMovesNothingAndNeverMeets) {
  static constexpr int W = 4;
  ThreadWorld world(W);
  world.run([](Comm& comm) {
    auto be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
    std::unique_ptr<DataComm> data = be->data_channel(comm);
    Stream& s = be->compute_stream();
    Tensor t = be->alloc_f32(Category::Category_comm, {1 << 20}, "meta");
    ASSERT_EQ(t.data(), nullptr);
    std::vector<int64_t> counts(W, 1 << 18);
    data->all_gather(s, t.data(), t.data(), 1 << 18, DType::DType_F32);
    data->reduce_scatter_sum(s, t.data(), t.data(), 1 << 18, DType::DType_F32);
    data->all_to_all_v(s, t.data(), counts.data(), t.data(), counts.data(), DType::DType_F32);
    data->send_recv(s, t.data(), 7, (comm.rank() + 1) % W, t.data(), 7, (comm.rank() + W - 1) % W, DType::DType_F32);
    CommRequest q = data->send_recv_start(s, t.data(), 7, 0, t.data(), 7, 0, DType::DType_F32);
    EXPECT_TRUE(data->test(q));
  });
  EXPECT_EQ(world.meetings(), 0u);
  world.run([](Comm& comm) {
    int64_t x = comm.rank() + 1;
    comm.all_reduce_sum(&x, 1, DType::DType_I64);
    EXPECT_EQ(x, W * (W + 1) / 2);
  });
  EXPECT_EQ(world.meetings(), 1u);
}

// Note [Summing bf16 over ranks]: a bf16 sum moves bf16 bytes and every rank adds its P inputs widened
// to f32 in rank order, rounded once. Checked against that scalar definition on random bf16 values
// (mixed magnitudes and signs), and on a case where rounding once differs from rounding after every
// addition: 1 + 2^-8 + 2^-8 is 1 + 2^-7 exactly, but 1 + 2^-8 alone rounds (to even) back to 1.
TEST(DataComm, Bf16SumsAddInRankOrderAndRoundOnce) {
  static constexpr int W = 3;
  static constexpr int64_t n = 1000;  // more than one of comm_sum_bf16's blocks
  auto bits = [](int r, int64_t i) {   // rank r's element i of a (W n) buffer
    if (i == 0) return bf16_from_float(r == 0 ? 1.0f : 0.00390625f);  // 1, 2^-8, 2^-8
    const uint32_t h = static_cast<uint32_t>((r + 1) * 2654435761u ^ static_cast<uint32_t>(i) * 40503u);
    const float mag = std::ldexp(1.0f + static_cast<float>(h % 1000) / 1000.0f, static_cast<int>(h % 13) - 6);
    return bf16_from_float((h >> 20) % 2 ? -mag : mag);
  };
  auto want = [&](int64_t i) {
    float acc = 0;
    for (int q = 0; q < W; ++q) acc += bf16_to_float(bits(q, i));
    return bf16_from_float(acc);
  };
  ASSERT_EQ(bf16_to_float(want(0)), 1.0078125f);  // the round-once case
  ThreadWorld world(W);
  world.run([&](Comm& comm) {
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    std::unique_ptr<DataComm> data = be->data_channel(comm);
    const int r = comm.rank();
    std::vector<uint16_t> mine(static_cast<size_t>(W * n));
    for (int64_t i = 0; i < W * n; ++i) mine[i] = bits(r, i);
    // reduce_scatter_sum on the data channel: block r of every rank, summed at rank r.
    Tensor send = be->alloc(Category::Category_comm, {W * n}, DType::DType_BF16, "send");
    Tensor recv = be->alloc(Category::Category_comm, {n}, DType::DType_BF16, "recv");
    be->copy_from_host(send.data(), mine.data(), send.bytes());
    data->reduce_scatter_sum(be->compute_stream(), send.data(), recv.data(), n, DType::DType_BF16);
    std::vector<uint16_t> got(static_cast<size_t>(n));
    be->copy_to_host(got.data(), recv.data(), recv.bytes());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want(r * n + i)) << "rank " << r << " element " << i;
    // all_reduce_sum on the control channel, in place: every rank gets every element's sum.
    comm.all_reduce_sum(mine.data(), W * n, DType::DType_BF16);
    for (int64_t i = 0; i < W * n; ++i) ASSERT_EQ(mine[i], want(i)) << "rank " << r << " element " << i;
  });
}

// The old meta convention (a null buffer with a count: "move nothing") is a bug now, refused by the
// engine instead of silently moving nothing.
TEST(DataComm, NullBufferWithCountIsRefused) {
  ThreadWorld world(2);
  try {
    world.run([](Comm& comm) {
      std::vector<float> recv(8);
      comm.all_gather(nullptr, recv.data(), 4, DType::DType_F32);
    });
    ADD_FAILURE() << "a null buffer with 4 elements was accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("null buffer"), std::string::npos) << e.what();
  }
}

// Comm::split (Note [Experts in groups] in model/params.h): 6 ranks by rank / 2 (groups of 2) and by
// rank % 2 (groups of 3, the replicas), used alongside the parent; each group's calls meet only its own ranks,
// so the groups may make different numbers of calls. The device data channel over a group sums in place.
TEST(CommSplit, GroupsInRankOrderMeetOnlyTheirOwn) {
  static constexpr int W = 6;
  ThreadWorld world(W);
  world.run([](Comm& comm) {
    const int r = comm.rank();
    std::unique_ptr<Comm> group = comm.split(r / 2);
    std::unique_ptr<Comm> replicas = comm.split(r % 2);
    ASSERT_EQ(group->size(), 2);
    ASSERT_EQ(group->rank(), r % 2);
    ASSERT_EQ(replicas->size(), 3);
    ASSERT_EQ(replicas->rank(), r / 2);
    std::vector<int64_t> members(2);
    const int64_t me = r;
    group->all_gather(&me, members.data(), 1, DType::DType_I64);
    EXPECT_EQ(members, (std::vector<int64_t>{r / 2 * 2, r / 2 * 2 + 1}));
    for (int i = 0; i <= r / 2; ++i) {  // group g meets g + 1 times: no other group waits for it
      double x = 1.0;
      group->all_reduce_sum(&x, 1, DType::DType_F64);
      EXPECT_EQ(x, 2.0);
    }
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    std::unique_ptr<DataComm> data = be->data_channel(*replicas);
    Tensor t = upload(*be, {value(r, 0), value(r, 1)}, "t");
    data->all_reduce_sum(be->compute_stream(), t.data(), 2, DType::DType_F32);
    const std::vector<float> got = download(*be, t);
    for (int64_t i = 0; i < 2; ++i) EXPECT_EQ(got[i], value(r % 2, i) + value(r % 2 + 2, i) + value(r % 2 + 4, i));
    double total = 1.0;
    comm.all_reduce_sum(&total, 1, DType::DType_F64);  // the parent still meets all six
    EXPECT_EQ(total, 6.0);
  });
  const std::unique_ptr<Comm> one = comm_single();
  const std::unique_ptr<Comm> sub = one->split(7);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->rank(), 0);
}

// A rank that fails while the others wait inside their groups ends the run: the parent's failure breaks
// the worlds split from it, so nobody hangs, and the failing rank's own error is the one reported.
TEST(CommSplit, AFailedRankBreaksTheGroups) {
  ThreadWorld world(4);
  try {
    world.run([](Comm& comm) {
      std::unique_ptr<Comm> group = comm.split(comm.rank() / 2);
      if (comm.rank() == 3) throw Error("rank 3 gives up", "");
      double x = 1.0;
      group->all_reduce_sum(&x, 1, DType::DType_F64);  // rank 2 waits here for rank 3
      comm.barrier();
    });
    ADD_FAILURE() << "the run did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 gives up"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp
