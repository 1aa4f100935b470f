/// @file inferq/sched/timer_wheel.hpp
///
/// TimerWheel<T>: a hierarchical hashed timing wheel (Varghese and Lauck,
/// "Hashed and Hierarchical Timing Wheels: Data Structures for the Efficient
/// Implementation of a Timer Facility", SOSP 1987, scheme 7). The engine keeps every
/// timer of a consumer on one wheel (ack waits and backoff, delayed naks, queue
/// timeouts, event TTLs and deadlines) and call timeouts on another: Schedule and
/// Cancel are O(1), Advance costs the timers it fires or moves, not the time that
/// passed.
///
/// Time is whatever int64 nanosecond clock the caller uses (base/clock.hpp); the
/// wheel holds no clock, the caller passes `now_ns` to Advance.
///
/// Usage:
/// @code
///   inferq::TimerWheel<MessageRef> wheel(clock.NowNanos());   // 1 ms ticks, 256 x 4
///   inferq::TimerId id = wheel.Schedule(deadline_ns, ref);
///   wheel.Cancel(id);                                          // acked in time
///   wheel.Advance(clock.NowNanos(), [](MessageRef&& r, std::int64_t deadline_ns) {
///     ...                                                      // expired
///   });
///   std::optional<std::int64_t> next = wheel.NextDeadline();  // sleep until then
/// @endcode
///
/// Guarantees:
///  - A timer fires in the first Advance whose now_ns >= its deadline, never earlier:
///    slots are tick-granular, but a timer whose deadline is later than now_ns stays
///    in its slot even when its tick has come.
///  - One Advance fires its timers in deadline order, ties in Schedule order.
///  - A deadline in the past (at or before the latest now_ns the wheel has seen)
///    fires at the next Advance; a deadline beyond the wheel's span
///    (tick_ns x slots_per_level^levels) waits in an overflow list and moves into
///    the wheel when its top-level cycle comes.
///
/// Thread safety: none. One thread at a time (the engine holds each wheel's lock: a
/// consumer's is used by settling and pulling threads and by the timer thread); const
/// methods may run concurrently with each other only.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace inferq {

/// A TimerWheel's tick and levels; checked by TimerWheel::Validate.
struct TimerWheelOptions {
  /// Width of one level-0 slot, ns; > 0. Timers are sorted into slots by tick, and
  /// fire by their exact deadline.
  std::int64_t tick_ns = 1'000'000;
  /// Slots of each level: a power of two in [2, 65536].
  std::uint32_t slots_per_level = 256;
  /// Levels: 1..8. Level l's slots are tick_ns x slots_per_level^l wide; the wheel
  /// spans tick_ns x slots_per_level^levels (defaults: 2^32 ms, about 49.7 days).
  std::uint32_t levels = 4;
};

/// A handle for Cancel. The default value names no timer. A handle stays unique for
/// 2^32 reuses of its slot (a generation counter), so a stale handle (its timer
/// fired or was cancelled) is recognised and refused.
struct TimerId {
  std::uint64_t value = 0;  ///< the slot's generation (high 32 bits) and index; 0: none
  /// Same slot and generation.
  friend bool operator==(TimerId, TimerId) = default;
};

/// A hierarchical hashed timing wheel of timers carrying a T (see the file comment).
template <class T>
class TimerWheel {
 public:
  /// InvalidArgument naming the field and its value when tick_ns <= 0,
  /// slots_per_level is not a power of two in [2, 65536], or levels is not in 1..8.
  static absl::Status Validate(const TimerWheelOptions& options) {
    if (options.tick_ns <= 0) {
      return absl::InvalidArgumentError("TimerWheelOptions.tick_ns = " +
                                        std::to_string(options.tick_ns) +
                                        " must be > 0");
    }
    if (options.slots_per_level < 2 || options.slots_per_level > 65536 ||
        !std::has_single_bit(options.slots_per_level)) {
      return absl::InvalidArgumentError(
          "TimerWheelOptions.slots_per_level = " + std::to_string(options.slots_per_level) +
          " must be a power of two in [2, 65536]");
    }
    if (options.levels < 1 || options.levels > 8) {
      return absl::InvalidArgumentError("TimerWheelOptions.levels = " +
                                        std::to_string(options.levels) +
                                        " must be in 1..8");
    }
    return absl::OkStatus();
  }

  /// The wheel's time starts at start_ns (ns of the caller's clock). Throws
  /// std::invalid_argument with Validate's message for invalid options.
  explicit TimerWheel(std::int64_t start_ns, TimerWheelOptions options = {})
      : options_(options), start_ns_(start_ns), now_ns_(start_ns) {
    if (absl::Status s = Validate(options); !s.ok()) {
      throw std::invalid_argument(std::string(s.message()));
    }
    bits_ = static_cast<std::uint32_t>(std::countr_zero(options.slots_per_level));
    mask_ = options.slots_per_level - 1;
    words_per_level_ = (options.slots_per_level + 63) / 64;
    heads_.assign(static_cast<std::size_t>(options.levels) * options.slots_per_level + 1, kNil);
    occupied_.assign(static_cast<std::size_t>(options.levels) * words_per_level_, 0);
  }

  TimerWheel(const TimerWheel&) = delete;
  TimerWheel& operator=(const TimerWheel&) = delete;

  /// Schedules `value` to fire at deadline_ns (ns of the caller's clock). A deadline
  /// at or before the latest now_ns seen (start_ns or the last Advance) fires at the
  /// next Advance. Called from inside Advance's `fire`, the timer fires in a later
  /// Advance, never in the running one, even when its deadline has passed: a
  /// callback that re-arms itself for "now" cannot make Advance loop forever.
  /// O(1) (amortised: the node pool grows by doubling).
  TimerId Schedule(std::int64_t deadline_ns, T value) {
    std::uint32_t i;
    if (free_ != kNil) {
      i = free_;
      free_ = nodes_[i].next;
    } else {
      if (nodes_.size() >= kNil) throw std::length_error("TimerWheel: 2^32 - 1 timers pending");
      i = static_cast<std::uint32_t>(nodes_.size());
      nodes_.emplace_back();
    }
    Node& n = nodes_[i];
    n.value.emplace(std::move(value));
    n.deadline_ns = deadline_ns;
    n.order = next_order_++;
    n.state = State::kPending;
    Place(i);
    ++size_;
    return TimerId{(static_cast<std::uint64_t>(n.generation) << 32) | i};
  }

  /// Cancels a pending timer: true when it was pending (its value is destroyed and
  /// it will not fire); false for a timer that fired or was cancelled already, and
  /// for the default TimerId. O(1). May be called from inside `fire`, also for a
  /// timer of the same Advance that has not fired yet.
  bool Cancel(TimerId id) {
    const std::uint32_t i = static_cast<std::uint32_t>(id.value);
    const std::uint32_t gen = static_cast<std::uint32_t>(id.value >> 32);
    if (i >= nodes_.size()) return false;
    Node& n = nodes_[i];
    if (n.generation != gen) return false;
    if (n.state == State::kPending) {
      Unlink(i);
    } else if (n.state != State::kFiring) {
      return false;
    }
    // kFiring: the node waits in this Advance's batch; freeing it bumps the
    // generation, which the batch checks before firing.
    Free(i);
    --size_;
    return true;
  }

  /// Fires every timer whose deadline is <= now_ns: calls fire(T&& value,
  /// std::int64_t deadline_ns) for each, in deadline order, ties in Schedule order.
  /// A now_ns earlier than the latest one seen is taken as that one (the wheel's
  /// time never goes back). Returns the number of timers fired.
  ///
  /// `fire` may call Schedule (see there) and Cancel; it must not call Advance (a
  /// nested Advance does nothing and returns 0). If `fire` throws, the timers of
  /// this Advance that had not fired yet stay pending (they fire at the next
  /// Advance) and the exception propagates.
  ///
  /// Cost: O(levels x slots_per_level / 64) to find the slots whose range has begun,
  /// plus O(1) per timer moved down a level (each timer moves at most `levels`
  /// times, and overflow timers once per top-level cycle), plus O(k log k) to order
  /// the k timers fired. A jump over any amount of time costs no more.
  template <class F>
  std::size_t Advance(std::int64_t now_ns, F&& fire) {
    if (advancing_) return 0;
    now_ns_ = std::max(now_ns_, now_ns);
    const std::uint64_t target = TickOf(now_ns_);

    // 1. Detach every slot whose first tick is <= target. A slot of level l covers
    //    the ticks whose digits above l equal the current tick's and whose digit l
    //    is the slot index; the untouched slots (first tick > target) still satisfy
    //    that for the new current tick, since target lies between the old current
    //    tick and their first tick.
    scratch_.clear();
    for (std::uint32_t l = 0; l < options_.levels; ++l) {
      const std::uint32_t shift = l * bits_;
      if (shift >= 64) break;
      const std::uint32_t upper = shift + bits_;
      const std::uint64_t base = upper >= 64 ? 0 : (tick_ & ~((std::uint64_t{1} << upper) - 1));
      std::uint32_t s = static_cast<std::uint32_t>(tick_ >> shift) & mask_;
      while ((s = NextOccupied(l, s)) != kNil) {
        const std::uint64_t first = base + (static_cast<std::uint64_t>(s) << shift);
        if (first > target) break;
        DetachSlot(l * options_.slots_per_level + s);
        ++s;
      }
    }
    if (heads_.back() != kNil && TopCycle(target) != TopCycle(tick_)) {
      DetachSlot(static_cast<std::uint32_t>(heads_.size() - 1));
    }
    tick_ = target;

    // 2. Due timers join the batch; the others go back in, relative to the new
    //    current tick (a lower level, or the current slot if due later in this tick).
    batch_.clear();
    for (std::uint32_t i : scratch_) {
      Node& n = nodes_[i];
      if (n.deadline_ns <= now_ns_) {
        n.state = State::kFiring;
        batch_.push_back(Due{n.deadline_ns, n.order, i, n.generation});
      } else {
        Place(i);
      }
    }
    std::sort(batch_.begin(), batch_.end(), [](const Due& a, const Due& b) {
      return a.deadline_ns != b.deadline_ns ? a.deadline_ns < b.deadline_ns : a.order < b.order;
    });

    // 3. Fire. The batch is swapped out so that a Schedule or Cancel from `fire`
    //    never touches the vector being walked.
    std::vector<Due> batch;
    batch.swap(batch_);
    std::size_t fired = 0;
    std::size_t k = 0;
    advancing_ = true;
    try {
      for (; k < batch.size(); ++k) {
        const Due d = batch[k];
        Node& n = nodes_[d.index];
        if (n.generation != d.generation || n.state != State::kFiring) continue;  // cancelled
        T value = std::move(*n.value);
        Free(d.index);
        --size_;
        ++fired;
        fire(std::move(value), d.deadline_ns);
      }
    } catch (...) {
      // The timer whose callback threw has fired; the rest stay pending.
      for (++k; k < batch.size(); ++k) {
        const Due d = batch[k];
        Node& n = nodes_[d.index];
        if (n.generation != d.generation || n.state != State::kFiring) continue;
        n.state = State::kPending;
        Place(d.index);
      }
      advancing_ = false;
      batch.clear();
      batch_.swap(batch);
      throw;
    }
    advancing_ = false;
    batch.clear();
    batch_.swap(batch);  // keeps the capacity for the next Advance
    return fired;
  }

  /// The earliest pending deadline, exactly (ns), or nullopt when no timer is
  /// pending. It may be earlier than the latest now_ns (a timer scheduled in the
  /// past, or during Advance). Timers of a running Advance that have not fired yet
  /// are not counted. Cost: O(levels x slots_per_level / 64) plus the timers of the
  /// first non-empty slot (or of the overflow list when the wheel itself is empty).
  std::optional<std::int64_t> NextDeadline() const {
    // Every timer of level l is earlier than every timer of level l + 1 (its ticks
    // share all digits above l with the current tick, level l + 1's timers have a
    // larger digit l + 1), and within a level the slots are in tick order; the
    // overflow list comes last.
    for (std::uint32_t l = 0; l < options_.levels; ++l) {
      const std::uint32_t shift = l * bits_;
      if (shift >= 64) break;
      const std::uint32_t s = NextOccupied(l, static_cast<std::uint32_t>(tick_ >> shift) & mask_);
      if (s != kNil) return MinDeadline(heads_[l * options_.slots_per_level + s]);
    }
    if (heads_.back() != kNil) return MinDeadline(heads_.back());
    return std::nullopt;
  }

  /// Pending timers (scheduled, not fired, not cancelled).
  std::size_t size() const { return size_; }
  /// True when size() is 0.
  bool empty() const { return size_ == 0; }
  /// The options it was made with.
  const TimerWheelOptions& options() const { return options_; }

 private:
  static constexpr std::uint32_t kNil = std::numeric_limits<std::uint32_t>::max();

  enum class State : std::uint8_t { kFree, kPending, kFiring };

  struct Node {
    std::optional<T> value;
    std::int64_t deadline_ns = 0;
    std::uint64_t order = 0;  ///< Schedule order, for ties
    std::uint32_t prev = kNil;
    std::uint32_t next = kNil;  ///< also the free list's link
    std::uint32_t list = kNil;  ///< index into heads_
    std::uint32_t generation = 1;
    State state = State::kFree;
  };

  struct Due {
    std::int64_t deadline_ns;
    std::uint64_t order;
    std::uint32_t index;
    std::uint32_t generation;
  };

  /// Ticks since start_ns; deadlines before start_ns are tick 0.
  std::uint64_t TickOf(std::int64_t t) const {
    if (t <= start_ns_) return 0;
    const std::uint64_t diff = static_cast<std::uint64_t>(t) - static_cast<std::uint64_t>(start_ns_);
    return diff / static_cast<std::uint64_t>(options_.tick_ns);
  }

  /// Which span-sized cycle a tick is in (always 0 when the span covers 2^64 ticks).
  std::uint64_t TopCycle(std::uint64_t tick) const {
    const std::uint32_t span_bits = bits_ * options_.levels;
    return span_bits >= 64 ? 0 : tick >> span_bits;
  }

  /// Puts pending node i into the list its deadline belongs to, relative to tick_:
  /// the current level-0 slot if its tick has come, else the level of the highest
  /// digit in which its tick differs from tick_, else the overflow list.
  void Place(std::uint32_t i) {
    const std::uint64_t d = std::max(TickOf(nodes_[i].deadline_ns), tick_);
    std::uint32_t list;
    if (d == tick_) {
      list = static_cast<std::uint32_t>(d & mask_);
    } else if (TopCycle(d) != TopCycle(tick_)) {
      list = static_cast<std::uint32_t>(heads_.size() - 1);
    } else {
      const std::uint32_t level = static_cast<std::uint32_t>(std::bit_width(d ^ tick_) - 1) / bits_;
      const std::uint32_t slot = static_cast<std::uint32_t>(d >> (level * bits_)) & mask_;
      list = level * options_.slots_per_level + slot;
    }
    Link(i, list);
  }

  void Link(std::uint32_t i, std::uint32_t list) {
    Node& n = nodes_[i];
    n.list = list;
    n.prev = kNil;
    n.next = heads_[list];
    if (n.next != kNil) nodes_[n.next].prev = i;
    heads_[list] = i;
    if (list + 1 < heads_.size()) SetOccupied(list, true);
  }

  void Unlink(std::uint32_t i) {
    Node& n = nodes_[i];
    if (n.prev != kNil) {
      nodes_[n.prev].next = n.next;
    } else {
      heads_[n.list] = n.next;
      if (n.next == kNil && n.list + 1 < heads_.size()) SetOccupied(n.list, false);
    }
    if (n.next != kNil) nodes_[n.next].prev = n.prev;
    n.prev = n.next = n.list = kNil;
  }

  /// Moves every node of a list to scratch_ (still kPending, linked nowhere).
  void DetachSlot(std::uint32_t list) {
    for (std::uint32_t i = heads_[list]; i != kNil;) {
      Node& n = nodes_[i];
      const std::uint32_t next = n.next;
      n.prev = n.next = n.list = kNil;
      scratch_.push_back(i);
      i = next;
    }
    heads_[list] = kNil;
    if (list + 1 < heads_.size()) SetOccupied(list, false);
  }

  void Free(std::uint32_t i) {
    Node& n = nodes_[i];
    n.value.reset();
    n.state = State::kFree;
    if (++n.generation == 0) n.generation = 1;  // TimerId{} never names a timer
    n.prev = n.list = kNil;
    n.next = free_;
    free_ = i;
  }

  void SetOccupied(std::uint32_t list, bool on) {
    const std::uint32_t level = list / options_.slots_per_level;
    const std::uint32_t slot = list % options_.slots_per_level;
    std::uint64_t& word = occupied_[level * words_per_level_ + slot / 64];
    const std::uint64_t bit = std::uint64_t{1} << (slot % 64);
    word = on ? (word | bit) : (word & ~bit);
  }

  /// The first occupied slot of `level` at or after `from`, or kNil.
  std::uint32_t NextOccupied(std::uint32_t level, std::uint32_t from) const {
    const std::uint64_t* words = &occupied_[level * words_per_level_];
    for (std::uint32_t w = from / 64; w < words_per_level_; ++w) {
      std::uint64_t bits = words[w];
      if (w == from / 64) bits &= ~std::uint64_t{0} << (from % 64);
      if (bits != 0) return w * 64 + static_cast<std::uint32_t>(std::countr_zero(bits));
    }
    return kNil;
  }

  std::int64_t MinDeadline(std::uint32_t head) const {
    std::int64_t m = nodes_[head].deadline_ns;
    for (std::uint32_t i = nodes_[head].next; i != kNil; i = nodes_[i].next) {
      m = std::min(m, nodes_[i].deadline_ns);
    }
    return m;
  }

  TimerWheelOptions options_;
  std::int64_t start_ns_;
  std::int64_t now_ns_;       ///< latest now_ns seen (start_ns_ at first)
  std::uint64_t tick_ = 0;    ///< TickOf(now_ns_)
  std::uint32_t bits_ = 0;    ///< log2(slots_per_level)
  std::uint32_t mask_ = 0;
  std::uint32_t words_per_level_ = 0;
  std::vector<Node> nodes_;
  std::uint32_t free_ = kNil;
  /// heads_[level * slots_per_level + slot]; the last entry is the overflow list.
  std::vector<std::uint32_t> heads_;
  std::vector<std::uint64_t> occupied_;  ///< one bit per slot: its list is non-empty
  std::vector<std::uint32_t> scratch_;
  std::vector<Due> batch_;
  std::uint64_t next_order_ = 0;
  std::size_t size_ = 0;
  bool advancing_ = false;
};

}  // namespace inferq
