// Streams and events: ordering holds under random delays (Note [Stream delays for testing]).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "backend/host_stream.h"

namespace fp {

namespace {
void random_delays(Stream& s, unsigned seed) {
  auto rng = std::make_shared<std::mt19937>(seed);
  auto mu = std::make_shared<std::mutex>();
  s.set_delay_hook([rng, mu] {
    int us;
    {
      std::lock_guard<std::mutex> lock(*mu);
      us = static_cast<int>((*rng)() % 300);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  });
}
}  // namespace

TEST(Stream, RunsInOrder) {
  HostStream s("w", HostStream::Mode::Mode_worker);
  random_delays(s, 1);
  std::vector<int> seen;
  for (int i = 0; i < 200; ++i) s.enqueue([&seen, i] { seen.push_back(i); });
  s.synchronize();
  ASSERT_EQ(seen.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(seen[i], i);
}

// A producer stream writes buffer b, records an event; a consumer stream waits on it and reads.
// Under random delays on both, every read sees the value written for its round.
TEST(Stream, WaitOrdersAcrossStreamsUnderRandomDelays) {
  for (unsigned seed = 0; seed < 5; ++seed) {
    HostStream prod("d2h", HostStream::Mode::Mode_worker), cons("h2d", HostStream::Mode::Mode_worker);
    random_delays(prod, seed);
    random_delays(cons, seed + 100);
    constexpr int kRounds = 100;
    std::vector<std::atomic<int>> buf(kRounds);
    std::vector<int> got(kRounds, -1);
    for (auto& b : buf) b = -1;
    std::vector<Event> ev(kRounds);
    for (int r = 0; r < kRounds; ++r) {
      prod.enqueue([&buf, r] { buf[r] = r * 7; });
      prod.record(ev[r]);
      cons.wait(ev[r]);
      cons.enqueue([&buf, &got, r] { got[r] = buf[r]; });
    }
    cons.synchronize();
    prod.synchronize();
    for (int r = 0; r < kRounds; ++r) ASSERT_EQ(got[r], r * 7) << "seed " << seed << " round " << r;
  }
}

TEST(Stream, EventSynchronizeBlocksHostUntilCapturedWork) {
  HostStream s("w", HostStream::Mode::Mode_worker);
  std::atomic<bool> done{false};
  s.enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    done = true;
  });
  Event e;
  s.record(e);
  std::atomic<bool> later{false};
  s.enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    later = true;
  });
  e.synchronize();
  EXPECT_TRUE(done.load());
  EXPECT_TRUE(e.query());
  s.synchronize();
  EXPECT_TRUE(later.load());
}

TEST(Stream, WaitOnUnrecordedEventIsNoop) {
  HostStream s("w", HostStream::Mode::Mode_worker);
  Event never;
  EXPECT_TRUE(never.query());
  s.wait(never);
  int x = 0;
  s.enqueue([&] { x = 1; });
  s.synchronize();
  EXPECT_EQ(x, 1);
}

// A wait keeps the point captured when it was enqueued, even if the event is re-recorded later.
TEST(Stream, WaitCapturesTheRecordAtCallTime) {
  HostStream a("a", HostStream::Mode::Mode_worker), b("b", HostStream::Mode::Mode_worker);
  std::atomic<int> stage{0};
  Event e;
  a.enqueue([&] { stage = 1; });
  a.record(e);
  b.wait(e);
  int seen = -1;
  b.enqueue([&] { seen = stage.load(); });
  b.synchronize();
  // Now re-record after blocking work; b's earlier wait was already satisfied by the first record.
  a.enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stage = 2;
  });
  a.record(e);
  b.wait(e);
  int seen2 = -1;
  b.enqueue([&] { seen2 = stage.load(); });
  b.synchronize();
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(seen2, 2);
  a.synchronize();
}

TEST(Stream, TaskErrorSurfacesAtSynchronize) {
  HostStream s("w", HostStream::Mode::Mode_worker);
  s.enqueue([] { throw std::runtime_error("copy failed"); });
  int x = 0;
  s.enqueue([&] { x = 1; });
  EXPECT_THROW(s.synchronize(), std::runtime_error);
  EXPECT_EQ(x, 1);
  EXPECT_NO_THROW(s.synchronize());
}

TEST(Stream, InlineStreamRunsAtEnqueue) {
  HostStream s("compute", HostStream::Mode::Mode_inline);
  int x = 0;
  s.enqueue([&] { x = 5; });
  EXPECT_EQ(x, 5);
  Event e;
  s.record(e);
  EXPECT_TRUE(e.query());
}

}  // namespace fp
