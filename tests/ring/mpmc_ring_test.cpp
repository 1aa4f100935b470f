#include "inferq/ring/mpmc_ring.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "ring_test_util.hpp"

using inferq::MpmcRing;
using namespace std::chrono_literals;

#if defined(__SANITIZE_THREAD__)
constexpr int kItemsPerProducer = 20'000;
#else
constexpr int kItemsPerProducer = 200'000;
#endif

TEST_CASE("capacity is rounded up to a power of two, at least 2") {
  CHECK(MpmcRing<int>(1).capacity() == 2);
  CHECK(MpmcRing<int>(2).capacity() == 2);
  CHECK(MpmcRing<int>(5).capacity() == 8);
  CHECK(MpmcRing<int>(1024).capacity() == 1024);
  CHECK(MpmcRing<int>(1025).capacity() == 2048);
}

TEST_CASE("capacity 0 throws std::invalid_argument") {
  CHECK_THROWS_AS(MpmcRing<int>(0), std::invalid_argument);
  CHECK_THROWS_WITH(MpmcRing<int>(0), "MpmcRing capacity must be > 0, got 0");
  CHECK_THROWS_AS(MpmcRing<int>((std::size_t{1} << 40) + 1), std::invalid_argument);
}

TEST_CASE("single thread: FIFO, full and empty") {
  MpmcRing<int> ring(8);
  int v = -1;
  CHECK_FALSE(ring.try_pop(v));
  for (int i = 0; i < 8; ++i) REQUIRE(ring.try_push(i));
  CHECK(ring.size_approx() == 8);
  CHECK_FALSE(ring.try_push(99));
  for (int i = 0; i < 8; ++i) {
    REQUIRE(ring.try_pop(v));
    CHECK(v == i);
  }
  CHECK_FALSE(ring.try_pop(v));
  CHECK(ring.size_approx() == 0);
}

TEST_CASE("indices wrap around the slots many times") {
  MpmcRing<std::uint64_t> ring(4);
  std::uint64_t v = 0;
  for (std::uint64_t i = 0; i < 10'000; ++i) {
    REQUIRE(ring.try_push(i));
    REQUIRE(ring.try_push(i + 1'000'000));
    REQUIRE(ring.try_pop(v));
    CHECK(v == i);
    REQUIRE(ring.try_pop(v));
    CHECK(v == i + 1'000'000);
  }
}

TEST_CASE("move-only items") {
  MpmcRing<std::unique_ptr<int>> ring(4);
  REQUIRE(ring.try_push(std::make_unique<int>(7)));
  REQUIRE(ring.try_emplace(new int(8)));
  REQUIRE(ring.push(std::make_unique<int>(9)));
  std::unique_ptr<int> out;
  REQUIRE(ring.try_pop(out));
  CHECK(*out == 7);
  REQUIRE(ring.pop(out));
  CHECK(*out == 8);
  REQUIRE(ring.pop(out));
  CHECK(*out == 9);
}

TEST_CASE("a failed push leaves the item with the caller") {
  MpmcRing<std::unique_ptr<int>> ring(2);
  REQUIRE(ring.try_push(std::make_unique<int>(0)));
  REQUIRE(ring.try_push(std::make_unique<int>(1)));
  auto second = std::make_unique<int>(2);
  CHECK_FALSE(ring.try_push(std::move(second)));
  REQUIRE(second != nullptr);
  CHECK(*second == 2);
  CHECK_FALSE(ring.push_for(std::move(second), 1ms));
  REQUIRE(second != nullptr);
  ring.close();
  CHECK_FALSE(ring.push(std::move(second)));
  REQUIRE(second != nullptr);
}

TEST_CASE("items whose copy may throw are copied before a ticket is taken") {
  MpmcRing<std::string> ring(2);
  const std::string long_text(100, 'x');
  REQUIRE(ring.try_push(long_text));
  REQUIRE(ring.try_emplace(3, 'y'));
  std::string out;
  REQUIRE(ring.try_pop(out));
  CHECK(out == long_text);
  REQUIRE(ring.try_pop(out));
  CHECK(out == "yyy");
}

namespace {
struct Counted {
  static inline std::atomic<int> live{0};
  int value = 0;
  Counted() noexcept { ++live; }
  explicit Counted(int v) noexcept : value(v) { ++live; }
  Counted(Counted&& o) noexcept : value(o.value) { ++live; }
  Counted& operator=(Counted&& o) noexcept {
    value = o.value;
    return *this;
  }
  ~Counted() { --live; }
};
}  // namespace

TEST_CASE("items left inside are destroyed with the ring") {
  Counted::live = 0;
  {
    MpmcRing<Counted> ring(8);
    for (int i = 0; i < 5; ++i) REQUIRE(ring.try_emplace(i));
    Counted out;
    REQUIRE(ring.try_pop(out));  // slot 0 emptied: must not be destroyed twice
    CHECK(out.value == 0);
    CHECK(Counted::live == 5);  // 4 inside + out
  }
  CHECK(Counted::live == 0);
}

TEST_CASE("timed operations time out") {
  MpmcRing<int> ring(2);
  int v = 0;
  CHECK_FALSE(ring.pop_for(v, 2ms));
  REQUIRE(ring.try_push(1));
  REQUIRE(ring.try_push(3));
  CHECK_FALSE(ring.push_for(2, 2ms));
  CHECK(ring.pop_for(v, 0ms));
  CHECK(v == 1);
}

TEST_CASE("close: pushes fail, pops drain what is left, then fail") {
  MpmcRing<int> ring(8);
  REQUIRE(ring.try_push(1));
  REQUIRE(ring.try_push(2));
  CHECK_FALSE(ring.closed());
  ring.close();
  ring.close();  // idempotent
  CHECK(ring.closed());
  CHECK_FALSE(ring.try_push(3));
  CHECK_FALSE(ring.push(3));
  int v = 0;
  REQUIRE(ring.pop(v));
  CHECK(v == 1);
  REQUIRE(ring.pop_for(v, 1h));
  CHECK(v == 2);
  CHECK_FALSE(ring.pop(v));
  CHECK_FALSE(ring.pop_for(v, 1h));
}

TEST_CASE("close wakes blocked consumers") {
  MpmcRing<int> ring(4);
  std::atomic<int> returned_false{0};
  std::vector<std::thread> consumers;
  for (int i = 0; i < 3; ++i) {
    consumers.emplace_back([&] {
      int v;
      if (!ring.pop(v)) ++returned_false;
    });
  }
  std::this_thread::sleep_for(50ms);  // let them reach the sleeping phase
  ring.close();
  for (auto& t : consumers) t.join();  // a lost wake-up hangs here (ctest timeout)
  CHECK(returned_false == 3);
}

TEST_CASE("close wakes blocked producers") {
  MpmcRing<int> ring(2);
  REQUIRE(ring.try_push(1));
  REQUIRE(ring.try_push(2));
  std::atomic<int> returned_false{0};
  std::vector<std::thread> producers;
  for (int i = 0; i < 3; ++i) {
    producers.emplace_back([&] {
      if (!ring.push(10)) ++returned_false;
    });
  }
  std::this_thread::sleep_for(50ms);
  ring.close();
  for (auto& t : producers) t.join();
  CHECK(returned_false == 3);
  CHECK(ring.size_approx() == 2);
}

TEST_CASE("a blocked consumer wakes for a push") {
  MpmcRing<int> ring(2);
  std::atomic<int> got{-1};
  std::thread consumer([&] {
    int v;
    if (ring.pop(v)) got = v;
  });
  std::this_thread::sleep_for(20ms);
  REQUIRE(ring.try_push(42));
  consumer.join();
  CHECK(got == 42);
}

namespace {
// Producer p pushes (p << 32 | i) for i = 0..n-1; consumers record what they get.
template <class Ring = MpmcRing<std::uint64_t>>
void RunContract(int producers, int consumers, std::size_t capacity, bool use_try,
                 int items_per_producer = kItemsPerProducer) {
  const int kItemsPerProducer = items_per_producer;
  Ring ring(capacity);
  std::vector<std::vector<std::uint64_t>> got(static_cast<std::size_t>(consumers));
  std::vector<std::thread> threads;
  for (int c = 0; c < consumers; ++c) {
    threads.emplace_back([&, c] {
      auto& mine = got[static_cast<std::size_t>(c)];
      std::uint64_t v;
      if (use_try) {
        for (;;) {
          if (ring.try_pop(v)) {
            mine.push_back(v);
          } else if (ring.closed() && ring.size_approx() == 0) {
            break;
          } else {
            std::this_thread::yield();
          }
        }
      } else {
        while (ring.pop(v)) mine.push_back(v);
      }
    });
  }
  std::atomic<int> push_failures{0};
  std::vector<std::thread> prods;
  for (int p = 0; p < producers; ++p) {
    prods.emplace_back([&, p] {
      for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(kItemsPerProducer); ++i) {
        const std::uint64_t v = (static_cast<std::uint64_t>(p) << 32) | i;
        if (use_try) {
          while (!ring.try_push(v)) std::this_thread::yield();
        } else if (!ring.push(v)) {
          push_failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : prods) t.join();
  ring.close();
  for (auto& t : threads) t.join();

  std::vector<std::vector<bool>> seen(
      static_cast<std::size_t>(producers),
      std::vector<bool>(static_cast<std::size_t>(kItemsPerProducer), false));
  std::size_t total = 0;
  std::size_t duplicates = 0;
  std::size_t order_violations = 0;
  for (const auto& mine : got) {
    std::vector<std::int64_t> last(static_cast<std::size_t>(producers), -1);
    for (std::uint64_t v : mine) {
      const auto p = static_cast<std::size_t>(v >> 32);
      const auto i = static_cast<std::int64_t>(v & 0xffffffffu);
      if (seen[p][static_cast<std::size_t>(i)]) ++duplicates;
      seen[p][static_cast<std::size_t>(i)] = true;
      // Per-producer FIFO: one consumer sees one producer's items in push order.
      if (i <= last[p]) ++order_violations;
      last[p] = i;
      ++total;
    }
  }
  CHECK(push_failures == 0);
  CHECK(total == static_cast<std::size_t>(producers) * kItemsPerProducer);
  CHECK(duplicates == 0);
  CHECK(order_violations == 0);
  std::size_t missing = 0;
  for (const auto& s : seen) {
    for (bool b : s) missing += b ? 0 : 1;
  }
  CHECK(missing == 0);
}
}  // namespace

TEST_CASE("4 producers x 4 consumers: no loss, no duplication, per-producer FIFO") {
  SECTION("blocking push/pop, small ring") { RunContract(4, 4, 64, false); }
  SECTION("try_push/try_pop, small ring") { RunContract(4, 4, 64, true); }
  SECTION("blocking, smallest ring") { RunContract(4, 4, 2, false); }
  SECTION("1 producer x 1 consumer") { RunContract(1, 1, 1024, false); }
}

TEST_CASE("close during a stress run loses nothing pushed successfully") {
  MpmcRing<std::uint64_t> ring(16);
  std::atomic<std::uint64_t> pushed{0};
  std::atomic<std::uint64_t> popped{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < 3; ++p) {
    threads.emplace_back([&] {
      while (ring.push(1)) pushed.fetch_add(1);
    });
  }
  for (int c = 0; c < 3; ++c) {
    threads.emplace_back([&] {
      std::uint64_t v;
      while (ring.pop(v)) popped.fetch_add(v);
    });
  }
  std::this_thread::sleep_for(30ms);
  ring.close();
  for (auto& t : threads) t.join();
  CHECK(pushed.load() == popped.load());
  CHECK(ring.size_approx() == 0);
}

// ---- regressions from an adversarial run ----

TEST_CASE("timeouts too long for int64 nanoseconds mean no deadline") {
  MpmcRing<int> ring(2);
  std::thread producer([&] {
    std::this_thread::sleep_for(10ms);
    ring.push(5);
  });
  int v = 0;
  CHECK(ring.pop_for(v, std::chrono::hours::max()));  // was: false at once
  CHECK(v == 5);
  producer.join();
  REQUIRE(ring.try_push(6));
  REQUIRE(ring.try_push(8));
  std::thread consumer([&] {
    std::this_thread::sleep_for(10ms);
    int out;
    ring.pop(out);
  });
  CHECK(ring.push_for(7, std::chrono::seconds::max()));
  consumer.join();
}

namespace {
struct CopyCounted {
  static inline std::atomic<int> copies{0};
  CopyCounted() = default;
  CopyCounted(const CopyCounted&) { ++copies; }  // may throw: not noexcept
  CopyCounted(CopyCounted&&) noexcept = default;
  CopyCounted& operator=(CopyCounted&&) noexcept = default;
  ~CopyCounted() = default;
};
}  // namespace

TEST_CASE("a blocking push of a throwing-copy item copies it once, not per retry") {
  MpmcRing<CopyCounted> ring(2);
  const CopyCounted item;
  REQUIRE(ring.try_emplace());
  REQUIRE(ring.try_emplace());
  CopyCounted::copies = 0;
  CHECK_FALSE(ring.push_for(item, 20ms));
  CHECK(CopyCounted::copies == 1);  // was: one copy per retry (139 in 50 ms)
}

// ---- rings issue: failure modes users of other queues have reported ----

namespace inferq {
// Starts a fresh ring's tickets at `ticket` (test-only access, see the header).
struct MpmcRingTestAccess {
  template <class Ring>
  static void StartAt(Ring& r, std::uint64_t ticket) {
    r.head_.store(ticket);
    r.tail_.store(ticket);
    for (std::uint64_t i = 0; i < r.capacity_; ++i) {
      const std::uint64_t t = (ticket + i) & Ring::kTicketMask;
      r.SlotAt(t).seq.store(t);
    }
  }
  template <class Ring>
  static std::uint64_t Head(const Ring& r) {
    return r.head_.load() & Ring::kTicketMask;
  }
  template <class Ring>
  static const void* SlotAddress(const Ring& r, std::uint64_t ticket) {
    return &r.SlotAt(ticket);
  }
  static constexpr std::uint64_t kTicketMask = (std::uint64_t{1} << 63) - 1;
};
}  // namespace inferq

TEST_CASE("slots are packed in ticket order k to a cache line at every capacity") {
  using inferq::MpmcRingTestAccess;
  struct Item24 {
    std::uint64_t a, b, c;
  };
  for (std::size_t capacity : {2u, 4u, 8u, 1024u}) {
    CAPTURE(capacity);
    MpmcRing<std::uint64_t> ring(capacity);  // 16-byte slots: 4 to a line
    MpmcRing<Item24> wide(capacity);         // 32-byte slots: 2 to a line
    for (std::uint64_t t = 0; t < capacity; ++t) {
      const auto* slot = static_cast<const char*>(MpmcRingTestAccess::SlotAddress(ring, t));
      const auto* first = static_cast<const char*>(MpmcRingTestAccess::SlotAddress(ring, 0));
      CHECK(slot - first == static_cast<std::ptrdiff_t>(16 * t));
      const auto* wslot = static_cast<const char*>(MpmcRingTestAccess::SlotAddress(wide, t));
      const auto* wfirst = static_cast<const char*>(MpmcRingTestAccess::SlotAddress(wide, 0));
      CHECK(wslot - wfirst == static_cast<std::ptrdiff_t>(32 * t));
    }
    CHECK(reinterpret_cast<std::uintptr_t>(MpmcRingTestAccess::SlotAddress(ring, 0)) % 64 == 0);
    // Ticket `capacity` is slot 0 again.
    CHECK(MpmcRingTestAccess::SlotAddress(ring, capacity) == MpmcRingTestAccess::SlotAddress(ring, 0));
    // A ring with fewer slots than a line holds still moves items in order.
    for (std::uint64_t round = 0; round < 3; ++round) {
      for (std::uint64_t i = 0; i < capacity; ++i) REQUIRE(wide.try_push(Item24{round, i, i + 1}));
      CHECK_FALSE(wide.try_push(Item24{}));
      for (std::uint64_t i = 0; i < capacity; ++i) {
        Item24 out{};
        REQUIRE(wide.try_pop(out));
        CHECK(out.a == round);
        CHECK(out.b == i);
        CHECK(out.c == i + 1);
      }
    }
  }
}

TEST_CASE("8 producers x 8 consumers, millions of items: no loss, no duplicate, FIFO") {
#if defined(__SANITIZE_THREAD__)
  RunContract(8, 8, 256, false, 25'000);
#else
  RunContract(8, 8, 256, false, 250'000);  // 2,000,000 items
#endif
}

TEST_CASE("tickets run through the 63-bit wrap point") {
  using inferq::MpmcRingTestAccess;
  SECTION("single thread") {
    MpmcRing<std::uint64_t> ring(8);
    MpmcRingTestAccess::StartAt(ring, MpmcRingTestAccess::kTicketMask - 20);
    std::uint64_t v = 0;
    for (std::uint64_t i = 0; i < 100; ++i) {
      REQUIRE(ring.try_push(i));
      REQUIRE(ring.try_push(i + 1000));
      CHECK(ring.size_approx() == 2);
      REQUIRE(ring.try_pop(v));
      CHECK(v == i);
      REQUIRE(ring.try_pop(v));
      CHECK(v == i + 1000);
    }
    CHECK(MpmcRingTestAccess::Head(ring) == 179);  // wrapped: 2^63 - 21 + 200
    for (int i = 0; i < 8; ++i) REQUIRE(ring.try_push(static_cast<std::uint64_t>(i)));
    CHECK_FALSE(ring.try_push(99));  // full is still detected across the wrap
  }
  SECTION("bulk across the wrap") {
    MpmcRing<std::uint64_t> ring(8);
    MpmcRingTestAccess::StartAt(ring, MpmcRingTestAccess::kTicketMask - 2);
    std::vector<std::uint64_t> in{1, 2, 3, 4, 5, 6};
    CHECK(ring.try_push_bulk(std::span(in)) == 6);
    std::array<std::uint64_t, 8> out{};
    CHECK(ring.try_pop_bulk(std::span(out)) == 6);
    CHECK(out[0] == 1);
    CHECK(out[5] == 6);
  }
  SECTION("threads across the wrap") {
    MpmcRing<std::uint64_t> ring(4);
    MpmcRingTestAccess::StartAt(ring, MpmcRingTestAccess::kTicketMask - 5000);
    std::atomic<std::uint64_t> sum{0};
    std::thread consumer([&] {
      std::uint64_t v, local = 0;
      while (ring.pop(v)) local += v;
      sum = local;
    });
    std::thread producer([&] {
      for (std::uint64_t i = 1; i <= 20'000; ++i) ring.push(i);
      ring.close();
    });
    producer.join();
    consumer.join();
    CHECK(sum.load() == 20'000ull * 20'001 / 2);
  }
}

TEST_CASE("try_push on a ring that cannot be full never fails") {
  // Full ring of 64; 4 threads each pop one item and push it back. A thread pushes
  // only after its own pop, so the ring is never full at that moment: every push
  // must succeed (a ring that fails while the next slot is still being emptied by
  // another consumer fails this test).
  MpmcRing<std::uint64_t> ring(64);
  for (std::uint64_t i = 0; i < 64; ++i) REQUIRE(ring.try_push(i));
#if defined(__SANITIZE_THREAD__)
  constexpr int kRounds = 20'000;
#else
  constexpr int kRounds = 500'000;
#endif
  std::atomic<int> push_failures{0}, pop_failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::uint64_t v;
      for (int i = 0; i < kRounds; ++i) {
        if (!ring.try_pop(v)) {
          ++pop_failures;  // impossible too: at most 4 of 64 items are out
          continue;
        }
        if (!ring.try_push(v)) ++push_failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(push_failures == 0);
  CHECK(pop_failures == 0);
  CHECK(ring.size_approx() == 64);
}

TEST_CASE("a producer blocked on a full ring wakes when a consumer pops") {
  MpmcRing<int> ring(2);
  REQUIRE(ring.try_push(0));
  REQUIRE(ring.try_push(1));
  std::atomic<bool> pushed{false};
  std::thread producer([&] { pushed = ring.push(2); });
  std::this_thread::sleep_for(30ms);  // long enough to reach the sleeping phase
  int v = 0;
  REQUIRE(ring.try_pop(v));
  producer.join();  // a lost wake-up hangs here
  CHECK(pushed.load());
  REQUIRE(ring.try_pop(v));
  CHECK(v == 1);
  REQUIRE(ring.try_pop(v));
  CHECK(v == 2);
}

TEST_CASE("oversubscription: 16 threads on the cores finish a fixed workload") {
  RunContract(8, 8, 16, false, 20'000);
  RunContract(8, 8, 16, true, 20'000);
}

TEST_CASE("bulk operations move what fits, in order") {
  MpmcRing<std::unique_ptr<int>> ring(4);
  std::vector<std::unique_ptr<int>> in;
  for (int i = 0; i < 6; ++i) in.push_back(std::make_unique<int>(i));
  CHECK(ring.try_push_bulk(in.begin(), in.end()) == 4);
  CHECK(in[3] == nullptr);  // moved
  REQUIRE(in[4] != nullptr);  // did not fit: untouched
  CHECK(ring.try_push_bulk(in.begin() + 4, in.end()) == 0);
  std::array<std::unique_ptr<int>, 3> out;
  CHECK(ring.try_pop_bulk(std::span(out)) == 3);
  CHECK(*out[0] == 0);
  CHECK(*out[2] == 2);
  CHECK(ring.try_push_bulk(in.begin() + 4, in.end()) == 2);
  std::array<std::unique_ptr<int>, 8> rest;
  CHECK(ring.try_pop_bulk(std::span(rest)) == 3);
  CHECK(*rest[0] == 3);
  CHECK(*rest[1] == 4);
  CHECK(*rest[2] == 5);
  CHECK(ring.try_pop_bulk(std::span(rest)) == 0);
  ring.close();
  CHECK(ring.try_push_bulk(in.begin(), in.end()) == 0);
}

TEST_CASE("bulk operations under contention lose and duplicate nothing") {
  MpmcRing<std::uint64_t> ring(64);
  constexpr std::uint64_t kPerProducer = 100'000;
  std::atomic<std::uint64_t> sum{0}, count{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < 2; ++p) {
    threads.emplace_back([&] {
      std::array<std::uint64_t, 8> batch;
      std::uint64_t next = 1;
      while (next <= kPerProducer) {
        std::size_t n = 0;
        for (; n < batch.size() && next + n <= kPerProducer; ++n) batch[n] = next + n;
        const std::size_t moved = ring.try_push_bulk(batch.begin(), batch.begin() + n);
        next += moved;
        if (moved == 0) std::this_thread::yield();
      }
    });
  }
  for (int c = 0; c < 2; ++c) {
    threads.emplace_back([&] {
      std::array<std::uint64_t, 8> batch;
      while (count.load() < 2 * kPerProducer) {
        const std::size_t n = ring.try_pop_bulk(std::span(batch));
        std::uint64_t local = 0;
        for (std::size_t i = 0; i < n; ++i) local += batch[i];
        sum += local;
        count += n;
        if (n == 0) std::this_thread::yield();
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(count.load() == 2 * kPerProducer);
  CHECK(sum.load() == 2 * (kPerProducer * (kPerProducer + 1) / 2));
}

TEST_CASE("every wait strategy keeps the contract") {
  // SpinWait only with as many threads as cores: spinners never give way.
  SECTION("SpinWait") { RunContract<MpmcRing<std::uint64_t, inferq::SpinWait>>(1, 1, 64, false, 20'000); }
  SECTION("YieldWait") { RunContract<MpmcRing<std::uint64_t, inferq::YieldWait>>(4, 4, 64, false, 20'000); }
  SECTION("HybridWait") { RunContract<MpmcRing<std::uint64_t, inferq::HybridWait>>(4, 4, 64, false, 20'000); }
  SECTION("BudgetedWait") { RunContract<MpmcRing<std::uint64_t, inferq::BudgetedWait>>(4, 4, 64, false, 20'000); }
}

TEST_CASE("timed waits end on time with every wait strategy") {
  // SpinWait once ignored the deadline while spinning.
  int v = 0;
  MpmcRing<int, inferq::SpinWait> spin(2);
  CHECK_FALSE(spin.pop_for(v, 2ms));
  MpmcRing<int, inferq::YieldWait> yield(2);
  CHECK_FALSE(yield.pop_for(v, 2ms));
  REQUIRE(yield.try_push(1));
  REQUIRE(yield.try_push(2));
  CHECK_FALSE(yield.push_for(3, 2ms));
  MpmcRing<int> hybrid(2);
  CHECK_FALSE(hybrid.pop_for(v, 2ms));
  MpmcRing<int, inferq::BudgetedWait> budgeted(2);
  CHECK_FALSE(budgeted.pop_for(v, 2ms));
  REQUIRE(budgeted.try_push(1));
  REQUIRE(budgeted.try_push(2));
  CHECK_FALSE(budgeted.push_for(3, 2ms));
}

TEST_CASE("a timed-out sleeper passes its wake-up on, so no item is stranded") {
  // Many consumers with short timeouts and one that waits forever: every item must
  // reach someone although woken sleepers may time out instead of taking it.
  MpmcRing<int> ring(64);
  std::atomic<int> taken{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < 4; ++c) {
    threads.emplace_back([&] {
      int v;
      while (!stop.load()) {
        if (ring.pop_for(v, std::chrono::microseconds(50))) ++taken;
      }
    });
  }
  std::thread patient([&] {
    int v;
    while (ring.pop(v)) ++taken;
  });
  for (int i = 0; i < 20'000; ++i) {
    ring.push(i);
    if (i % 1000 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  while (taken.load() < 20'000) std::this_thread::sleep_for(1ms);  // hangs if stranded
  stop = true;
  ring.close();
  for (auto& t : threads) t.join();
  patient.join();
  CHECK(taken.load() == 20'000);
}

// ---- regressions from a second adversarial run ----

TEST_CASE("a bulk pop wakes as many sleeping producers as it frees slots") {
  MpmcRing<int> ring(4);
  for (int i = 0; i < 4; ++i) REQUIRE(ring.try_push(i));
  std::atomic<int> returned{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < 4; ++p) {
    producers.emplace_back([&, p] {
      if (ring.push(10 + p)) ++returned;
    });
  }
  std::this_thread::sleep_for(50ms);  // past the active window: all asleep
  std::array<int, 4> out{};
  REQUIRE(ring.try_pop_bulk(std::span(out)) == 4);
  for (auto& t : producers) t.join();  // was: 3 of 4 slept on with room in the ring
  CHECK(returned == 4);
  CHECK(ring.size_approx() == 4);
}

TEST_CASE("a bulk push wakes as many sleeping consumers as it adds items") {
  MpmcRing<int> ring(16);
  std::atomic<int> returned{0};
  std::vector<std::thread> consumers;
  for (int c = 0; c < 8; ++c) {
    consumers.emplace_back([&] {
      int v;
      if (ring.pop(v)) ++returned;
    });
  }
  std::this_thread::sleep_for(50ms);
  std::array<int, 8> in{1, 2, 3, 4, 5, 6, 7, 8};
  REQUIRE(ring.try_push_bulk(std::span(in)) == 8);  // fixed-extent span accepted too
  for (auto& t : consumers) t.join();  // was: 7 of 8 slept on with items in the ring
  CHECK(returned == 8);
}

namespace {
struct Base {
  virtual ~Base() = default;
};
struct Derived : Base {};
}  // namespace

TEST_CASE("a bulk push into a full ring leaves a converting item with the caller") {
  MpmcRing<std::unique_ptr<Base>> ring(2);
  REQUIRE(ring.try_push(std::make_unique<Base>()));
  REQUIRE(ring.try_push(std::make_unique<Base>()));
  std::vector<std::unique_ptr<Derived>> in;
  in.push_back(std::make_unique<Derived>());
  CHECK(ring.try_push_bulk(in.begin(), in.end()) == 0);
  CHECK(in[0] != nullptr);  // was: converted, then destroyed
}

// Invariant 4 of internal/event_count.hpp: a push skips the futex wake while a
// consumer waits actively, and that consumer passes the wake on. Consumers that take
// one item each and leave make a skipped wake-up that nobody passes on hang the test.
TEST_CASE("single pushes while some consumers spin and others sleep reach every consumer") {
  for (const int delay_us : {0, 2, 10, 20, 40, 200}) {
    for (int round = 0; round < 20; ++round) {
      MpmcRing<int> ring(64);
      std::atomic<int> returned{0};
      std::vector<std::thread> consumers;
      for (int c = 0; c < 8; ++c) {
        consumers.emplace_back([&] {
          int v;
          if (ring.pop(v)) ++returned;
        });
      }
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      for (int i = 0; i < 8; ++i) REQUIRE(ring.try_push(i));
      for (auto& t : consumers) t.join();
      REQUIRE(returned.load() == 8);
      REQUIRE(ring.size_approx() == 0);
    }
  }
}

TEST_CASE("single pops while some producers spin and others sleep reach every producer") {
  for (const int delay_us : {0, 2, 10, 20, 40, 200}) {
    for (int round = 0; round < 20; ++round) {
      MpmcRing<int> ring(8);
      for (int i = 0; i < 8; ++i) REQUIRE(ring.try_push(i));
      std::atomic<int> returned{0};
      std::vector<std::thread> producers;
      for (int p = 0; p < 8; ++p) {
        producers.emplace_back([&, p] {
          if (ring.push(100 + p)) ++returned;
        });
      }
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      int v;
      for (int i = 0; i < 8; ++i) REQUIRE(ring.try_pop(v));
      for (auto& t : producers) t.join();
      REQUIRE(returned.load() == 8);
      REQUIRE(ring.size_approx() == 8);
    }
  }
}

namespace {
using inferq::ring_test::SleepAtOnce;
using inferq::ring_test::Watchdog;

// `pairs` threads push into `there` and pop from `back`; as many echo threads pop
// from `there` and push into `back`. Each item makes the round trip once.
template <class Ring>
void PingPong(int pairs, int items_per_pair) {
  Ring there(2), back(2);
  std::atomic<std::uint64_t> progress{0};
  Watchdog watchdog(progress, there, back);
  std::atomic<std::uint64_t> sum{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < pairs; ++p) {
    threads.emplace_back([&, p] {
      for (int i = 1; i <= items_per_pair; ++i) {
        if (!there.push(static_cast<std::uint64_t>(p) * 1'000'000 + i)) return;
        std::uint64_t v;
        if (!back.pop(v)) return;
        sum.fetch_add(v);
        progress.fetch_add(1);
      }
    });
    threads.emplace_back([&] {
      for (int i = 0; i < items_per_pair; ++i) {
        std::uint64_t v;
        if (!there.pop(v) || !back.push(v)) return;
      }
    });
  }
  for (auto& t : threads) t.join();
  watchdog.Stop();
  CHECK_FALSE(watchdog.stalled());
  const auto n = static_cast<std::uint64_t>(items_per_pair);
  CHECK(progress.load() == static_cast<std::uint64_t>(pairs) * n);
  CHECK(sum.load() == static_cast<std::uint64_t>(pairs) *
                          (static_cast<std::uint64_t>(pairs - 1) * 1'000'000 * n / 2 +
                           n * (n + 1) / 2));
}
}  // namespace

// The notifier's side of the event count has no fence: a push or pop relies on its
// own seq_cst claim of head_/tail_ (event_count.hpp, invariants 2 and 3). If that
// pairing were wrong a sleeper would miss the item pushed as it fell asleep, and a
// ping-pong, where every hand-off wakes a sleeper, would stall.
TEST_CASE("a waiter falling asleep as the other side moves is always woken") {
#if defined(__SANITIZE_THREAD__)
  constexpr int kItems = 2'000;
#else
  constexpr int kItems = 20'000;
#endif
  SECTION("every wait sleeps, one pair") { PingPong<MpmcRing<std::uint64_t, SleepAtOnce>>(1, kItems); }
  SECTION("every wait sleeps, 3 pairs") { PingPong<MpmcRing<std::uint64_t, SleepAtOnce>>(3, kItems); }
  SECTION("HybridWait, 3 pairs") { PingPong<MpmcRing<std::uint64_t>>(3, kItems); }
}

// The process-wide budget of active waiters (wait_strategy.hpp; invariant 5 of internal/event_count.hpp).
TEST_CASE("the active-waiter budget admits at most its limit and gives back every token") {
  using inferq::ActiveWaiterBudget;
  SECTION("the budget itself") {
    ActiveWaiterBudget budget(2);
    CHECK(budget.Limit() == 2);
    ActiveWaiterBudget none(0);
    CHECK(none.Limit() == 0);
    CHECK_FALSE(none.TryAcquire());
    CHECK(none.Active() == 0);
    CHECK(budget.TryAcquire());
    CHECK(budget.TryAcquire());
    CHECK_FALSE(budget.TryAcquire());
    CHECK(budget.Active() == 2);
    budget.Release();
    CHECK(budget.TryAcquire());
    budget.Release();
    budget.Release();
    CHECK(budget.Active() == 0);
    CHECK(ActiveWaiterBudget(-3).Limit() == 0);
  }
  SECTION("budgeted waiters on many rings: never more active than the limit, none left") {
    ActiveWaiterBudget& process = ActiveWaiterBudget::Process();
    REQUIRE(process.Limit() == ActiveWaiterBudget::DefaultLimit());
    REQUIRE(process.Active() == 0);
    constexpr int kRings = 8;
    constexpr int kItems = 2'000;
    using Lane = MpmcRing<int, inferq::BudgetedWait>;
    std::vector<std::unique_ptr<Lane>> rings;
    for (int r = 0; r < kRings; ++r) rings.push_back(std::make_unique<Lane>(16));
    std::atomic<bool> stop{false};
    std::atomic<int> most_active{0};
    std::thread sampler([&] {
      while (!stop.load()) {
        const int n = process.Active();
        if (n > most_active.load()) most_active.store(n);
        std::this_thread::yield();
      }
    });
    std::atomic<long> received{0}, timeouts{0};
    std::vector<std::thread> consumers;
    for (int r = 0; r < kRings; ++r) {
      consumers.emplace_back([&, r] {
        int v;
        for (;;) {
          // Timed pops mix deadlines into the waits: each way out of WaitUntil
          // (item, deadline, close) must give its token back.
          if (rings[r]->pop_for(v, std::chrono::microseconds(50 + 10 * r))) {
            ++received;
          } else if (rings[r]->closed()) {
            return;
          } else {
            ++timeouts;
          }
        }
      });
    }
    for (int i = 0; i < kItems; ++i) {
      REQUIRE(rings[i % kRings]->push(i));
      if (i % 64 == 0) std::this_thread::sleep_for(std::chrono::microseconds(30));
    }
    for (auto& ring : rings) ring->close();
    for (auto& t : consumers) t.join();
    stop.store(true);
    sampler.join();
    CHECK(received.load() == kItems);
    CHECK(most_active.load() <= process.Limit());
    CHECK(process.Active() == 0);
  }
}

// Invariant 6 of internal/event_count.hpp: the adaptive skip of BudgetedWait.
TEST_CASE("after an active phase without its item the next 1 then 3 then 7 up to 63 waits sleep at once") {
  inferq::AdaptiveSpin ec;
  // Counts the waits that sleep at once before the next one may spin.
  auto skipped = [&] {
    int n = 0;
    while (!ec.ShouldSpin()) ++n;
    return n;
  };
  CHECK(skipped() == 0);
  const int expected[] = {1, 3, 7, 15, 31, 63, 63, 63};
  for (const int e : expected) {
    ec.Record(false);
    CHECK(skipped() == e);
  }
  ec.Record(true);  // an active phase got its item: the next miss starts at 1
  CHECK(skipped() == 0);
  ec.Record(false);
  CHECK(skipped() == 1);
}

TEST_CASE("a quiet push reaches a sleeping consumer once the producer wakes it") {
  MpmcRing<int> ring(16);
  std::atomic<int> returned{0}, sum{0};
  std::vector<std::thread> consumers;
  for (int c = 0; c < 4; ++c) {
    consumers.emplace_back([&] {
      int v;
      // Bounded: a wake-up lost by the quiet pushes fails the count below, not the run.
      if (ring.pop_for(v, 30s)) {
        sum += v;
        ++returned;
      }
    });
  }
  std::this_thread::sleep_for(50ms);
  for (int v : {1, 2, 3, 4}) REQUIRE(ring.try_push_quiet(std::move(v)));
  ring.wake_consumers(4);
  for (auto& t : consumers) t.join();
  CHECK(returned == 4);
  CHECK(sum == 10);
  CHECK(ring.size_approx() == 0);
}

TEST_CASE("a quiet push fails as try_push does: full or closed, the item left with the caller") {
  MpmcRing<std::unique_ptr<int>> ring(2);
  REQUIRE(ring.try_push_quiet(std::make_unique<int>(1)));
  REQUIRE(ring.try_push_quiet(std::make_unique<int>(2)));
  auto third = std::make_unique<int>(3);
  CHECK_FALSE(ring.try_push_quiet(std::move(third)));
  REQUIRE(third != nullptr);
  CHECK(*third == 3);
  ring.close();
  std::unique_ptr<int> out;
  REQUIRE(ring.try_pop(out));
  CHECK(*out == 1);
  CHECK_FALSE(ring.try_push_quiet(std::move(third)));
  CHECK(*third == 3);
}

TEST_CASE("bursts of quiet pushes, each woken once, lose and duplicate nothing (4 x 4 threads)") {
  constexpr int kProducers = 4, kConsumers = 4, kPerProducer = 20'000, kBurst = 16;
  MpmcRing<std::uint64_t> ring(64);
  std::vector<std::vector<std::uint64_t>> got(kConsumers);
  std::vector<std::thread> threads;
  for (int c = 0; c < kConsumers; ++c) {
    threads.emplace_back([&, c] {
      std::uint64_t v;
      while (ring.pop(v)) got[static_cast<std::size_t>(c)].push_back(v);
    });
  }
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      int i = 0;
      while (i < kPerProducer) {
        std::size_t pushed = 0;
        for (int b = 0; b < kBurst && i < kPerProducer; ++b) {
          std::uint64_t v = (static_cast<std::uint64_t>(p) << 32) | static_cast<std::uint64_t>(i);
          if (!ring.try_push_quiet(std::move(v))) break;
          ++pushed;
          ++i;
        }
        ring.wake_consumers(pushed);
        if (pushed == 0) std::this_thread::yield();
      }
    });
  }
  for (auto& t : producers) t.join();
  ring.close();
  for (auto& t : threads) t.join();
  std::size_t total = 0;
  for (const auto& list : got) {
    std::vector<int> last(kProducers, -1);
    for (std::uint64_t v : list) {
      const auto p = static_cast<std::size_t>(v >> 32);
      const auto i = static_cast<int>(v & 0xffffffffu);
      REQUIRE(i > last[p]);  // per producer, each consumer sees increasing items
      last[p] = i;
    }
    total += list.size();
  }
  CHECK(total == static_cast<std::size_t>(kProducers) * kPerProducer);
  std::vector<std::vector<bool>> seen(kProducers, std::vector<bool>(kPerProducer, false));
  for (const auto& list : got) {
    for (std::uint64_t v : list) {
      auto&& s = seen[static_cast<std::size_t>(v >> 32)][static_cast<std::size_t>(v & 0xffffffffu)];
      REQUIRE_FALSE(s);
      s = true;
    }
  }
}

// EventCount's invariant 7, step by step on one thread: while a wake-up is on its way
// to an announced sleeper, a second notify makes no syscall; the sleeper's leaving
// clears the mark, and so does a sleeper preparing to wait (after it read its key,
// before its re-check), so the next notify wakes again.
TEST_CASE("an event count sends one wake-up at a time to its sleepers") {
  inferq::ring_internal::EventCount ec;
  CHECK_FALSE(ec.ClaimWake());  // nobody sleeps
  (void)ec.PrepareWait();       // a sleeper announces itself
  CHECK(ec.HasSleepers());
  CHECK(ec.ClaimWake());        // a wake-up goes to it
  CHECK_FALSE(ec.ClaimWake());  // not again while it is on its way
  CHECK_FALSE(ec.ClaimWake());
  CHECK(ec.HasSleepers());
  ec.CancelWait();              // it leaves (re-checked and found its item)
  CHECK_FALSE(ec.HasSleepers());
  CHECK_FALSE(ec.ClaimWake());
  // A notifier marked a wake-up for a sleeper that then left: the next sleeper is
  // still woken.
  (void)ec.PrepareWait();
  CHECK(ec.ClaimWake());
  ec.CancelWait();
  (void)ec.PrepareWait();
  CHECK(ec.ClaimWake());
  // The absorbed wake-up (the smallest case of a hang in a first version): a second
  // sleeper prepares after the mark was set; it clears the mark before its re-check,
  // so if it then sleeps, the next notify wakes it.
  (void)ec.PrepareWait();
  CHECK(ec.ClaimWake());
  CHECK_FALSE(ec.ClaimWake());
  ec.CancelWait();
  ec.CancelWait();
  CHECK_FALSE(ec.HasSleepers());
}

TEST_CASE("try_pop_quiet pops in FIFO order, and wake_producers lets a blocked push through",
          "[concurrency]") {
  inferq::MpmcRing<int> ring(2);
  REQUIRE(ring.try_push(1));
  REQUIRE(ring.try_push(2));
  std::atomic<int> pushed{0};
  std::thread producer([&] {
    for (int v = 3; v <= 6; ++v) {
      if (!ring.push(v)) return;  // blocks while full; false once closed
      pushed.fetch_add(1);
    }
  });
  std::vector<int> got;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (got.size() < 6 && std::chrono::steady_clock::now() < give_up) {
    int v = 0;
    std::size_t n = 0;
    while (ring.try_pop_quiet(v)) {
      got.push_back(v);
      ++n;
    }
    ring.wake_producers(n);  // the batch's one wake-up
    std::this_thread::yield();
  }
  ring.close();  // a producer still blocked (the test failed) returns
  producer.join();
  CHECK(got == std::vector<int>{1, 2, 3, 4, 5, 6});
  CHECK(pushed.load() == 4);
  int v = 0;
  CHECK(!ring.try_pop_quiet(v));
  ring.wake_producers(0);  // nothing popped: nothing to do
}
