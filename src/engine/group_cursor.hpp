// File: src/engine/group_cursor.hpp (not API)
//
// GroupCursor: a consumer group's position in its stream's log (MessageLog), the
// consumer of the engine-core redesign. Members claim ranges of sequences from one
// shared cursor with one CAS per batch (LMAX Disruptor's WorkProcessors share a
// sequence the same way); each sequence is settled by one bit of an AckWindow (an ack,
// a term, a filter that skips it); what leaves the window unacked (a nak, an
// InProgress, an ack_wait that ran out, a straggler held past the window) moves to a
// small overflow map, which then owns it (JetStream's pending map is the model: the
// common path never touches it).
//
// Redelivery by time costs the claim nothing: a timer thread samples the cursor once
// per tick (Tick), and Expire(now) takes every sequence still unsettled that was
// claimed before the sample of at least ack_wait ago. So with Tick and Expire every
// tick, a message comes back no earlier than ack_wait after its claim and no later
// than ack_wait plus two ticks (plus one tick when ack_wait is a multiple of it).
//
//   GroupCursor g({.window_word_bits = 7, .start = 1, .ack_wait_ns = 30'000'000'000});
//   // published_end: with one publisher its last published sequence + 1; with
//   // several, the member's MessageLog::Reader::ReadyEnd(g.next(), 32).
//   GroupCursor::Range r = g.Claim(/*n=*/32, published_end);             // any member
//   for (std::uint64_t s = r.first; s < r.end; ++s) Deliver(s);          // attempt 1
//   g.Ack(s);                                   // true: this call settled s
//   g.Nak(s, now + delay);                      // to the overflow map, due then
//   g.Tick([&] { return clock.NowNanos(); });  // the timer thread, each tick,
//   g.Expire(now);                              // then its expiries
//   g.TakeDue(now, out, dead);                  // redeliveries (attempt > 1), dead letters
//
// Thread safety: Claim, Ack, AckWord, Nak, InProgress, TakeDue and the readers may be
// called from any number of threads at once. Tick, Expire and Spill are the timer's:
// one thread at a time (they share the samples).
//
// Invariants:
//  1. next_ is the first sequence no member has claimed; Claim moves it up with one
//     CAS, and never to or past window().floor() + W, so every claimed, unsettled
//     sequence has a bit in the window.
//  2. A sequence is settled (its bit set) exactly once (AckWindow inv. 3: the first
//     TrySet wins). Who sets it decides what happens to it: Ack/term/skip (done), or a
//     move to the overflow map (Nak, InProgress, Expire, Spill), which holds mu_ from
//     before its TrySet until the entry is in the map. So a sequence is, at any time,
//     either unsettled (held by the member it was claimed by, attempt 1), or in the
//     map, or done; never two of them, as seen by any thread holding mu_.
//  3. An Ack whose TrySet loses takes mu_ (so a move in progress has finished) and
//     looks the sequence up: found, it erases it and wins; not found, it was done
//     already (false). An ack whose TrySet wins before a racing Expire's wins, and
//     nothing is redelivered; one that comes after still settles the held entry.
//  4. samples_ (the timer's) hold {next_, time} pairs in increasing order; expired_ is
//     the sequence below which every claim is at least ack_wait old and was expired.
//  5. overflow_count_ mirrors map_.size() (written under mu_), so that readers that
//     only need "is anything in the map" take no lock.
//  6. moving_ counts the sequences a move (inv. 2) may have settled in the window and
//     not yet counted in overflow_count_: raised before the move's TrySet, lowered
//     after overflow_count_ has them (all seq_cst). So a reader that loads the window
//     first and then moving_ and overflow_count_ counts every unsettled message at
//     least once (Claim's max_in_flight).
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/container/btree_map.h"
#include "inferq/base/cache_line.hpp"
#include "ack_window.hpp"

namespace inferq::engine_internal {

class GroupCursor {
 public:
  static constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

  struct Options {
    // The window: W = 32 * 2^window_word_bits sequences claimed and unsettled at
    // most (AckWindow), 0..20.
    unsigned window_word_bits = 7;
    // The first sequence to deliver (a consumer's start); those below are settled.
    std::uint64_t start = 1;
    // ns after its claim (or its last InProgress, or its redelivery) at which an
    // unacked message is delivered again; 0: never by time.
    std::int64_t ack_wait_ns = 0;
    // Deliveries at most, the first included; past it, TakeDue hands the message out
    // as a dead letter. 0: unlimited.
    std::uint32_t max_deliver = 0;
    // Messages claimed and not settled, at most, counting what the overflow map
    // holds (JetStream's max_ack_pending); 0: only the window bounds them. Counted
    // from the lowest unsettled sequence, so an ack out of order frees room only
    // once those below it are settled too: never more in flight, sometimes fewer.
    std::uint64_t max_in_flight = 0;
    // Claim registers (NoteClaim), one per member; 0: none, the timer's own samples
    // date every claim (to within a tick).
    std::uint32_t members = 0;
  };

  // What a settle of one delivery found (the attempt-aware settles below).
  enum class Found : std::uint8_t {
    kCurrent,  // the delivery is the message's newest and still out: the settle applied
    kStale,    // a newer delivery is out, or it waits for redelivery: nothing changed
    kDone,     // the message was settled already: nothing changed
  };

  // Sequences [first, end), claimed by one member.
  struct Range {
    std::uint64_t first = 0;
    std::uint64_t end = 0;
    std::uint64_t size() const { return end - first; }
    bool empty() const { return end == first; }
  };

  // A message of the overflow map handed out again (TakeDue): its sequence and the
  // delivery it is (2 for the first redelivery).
  struct Redelivery {
    std::uint64_t seq = 0;
    std::uint32_t attempt = 0;
    // TakeDue: false when no CountDue (nor the settle that held it) counted this
    // redelivery yet; the taker counts it.
    bool counted = true;
    // TakeDue: a redelivery an older delivery's ack settled after it was counted (see
    // AckDelivery): the taker skips it, and Drop removes it.
    bool superseded = false;
  };

  // A member index that names none (the value of routing's kNoMember).
  static constexpr std::uint32_t kUnknownMember = std::numeric_limits<std::uint32_t>::max();

  // What AckDelivery found.
  struct Acked {
    bool settled = false;  // this call settled the message (false: it was done already)
    bool was_out = false;  // a delivery of it was out (not waiting for redelivery)
    // The delivery out was the acked one (of `attempt`): its member's work is done.
    bool mine = false;
    // Another delivery (a newer one) was out, with this member (kUnknownMember: not
    // known): its work ends unfinished (the ack of an older delivery won).
    std::uint32_t other_member = kUnknownMember;
  };

  // Throws std::invalid_argument for window_word_bits > 20, start not in 1..2^62 (the
  // window's arithmetic stays far from 2^64) or ack_wait_ns < 0.
  explicit GroupCursor(const Options& o)
      : options_(Checked(o)),
        window_(o.window_word_bits, o.start),
        next_(o.start),
        expired_(o.start),
        registers_(o.members) {}
  GroupCursor(const GroupCursor&) = delete;
  GroupCursor& operator=(const GroupCursor&) = delete;

  // Claims up to `n` sequences below `published_end` (the log's first unpublished
  // sequence), below floor() + W (inv. 1) and within max_in_flight: one CAS. Empty
  // when none is there, the window is full (Spill makes room), or max_in_flight
  // messages are out.
  Range Claim(std::uint64_t n, std::uint64_t published_end) {
    std::uint64_t first = next_.load(std::memory_order_relaxed);
    for (;;) {
      std::uint64_t limit = std::min(published_end, window_.floor() + window_.capacity());
      if (options_.max_in_flight > 0) {
        // Unsettled: at most next_ - first_unsettled in the window, plus the map's
        // entries, plus those a move is carrying between the two (inv. 6: the
        // window first, then the counts).
        const std::uint64_t lowest = window_.first_unsettled();
        const std::uint64_t held = moving_.load(std::memory_order_seq_cst) +
                                   overflow_count_.load(std::memory_order_seq_cst);
        limit = held >= options_.max_in_flight ? 0 : std::min(limit, lowest + (options_.max_in_flight - held));
      }
      if (first >= limit || n == 0) return {first, first};
      const std::uint64_t end = first + std::min(n, limit - first);
      // Relaxed is enough: the claim orders nothing but itself (the log's slots are
      // published by their own release stores, read by the claimer with acquire).
      if (next_.compare_exchange_weak(first, end, std::memory_order_relaxed)) return {first, end};
    }
  }

  // Claims every sequence below `published_end` that no member claimed yet, past the
  // window and max_in_flight too, and returns the first of them (published_end when
  // there is none): DeleteConsumer's sweep, after which nothing more is claimed. What
  // lies past floor() + W cannot be settled in the window (Drop leaves it), so the
  // caller ends these sequences itself.
  std::uint64_t ClaimRest(std::uint64_t published_end) {
    std::uint64_t first = next_.load(std::memory_order_relaxed);
    while (first < published_end &&
           !next_.compare_exchange_weak(first, published_end, std::memory_order_relaxed)) {
    }
    return std::min(first, published_end);
  }

  // Acks (or terminates, or skips) `seq`: true when this call settled it, false when
  // it was settled already (a second ack, or an ack of a message already done).
  bool Ack(std::uint64_t seq) {
    if (window_.TrySet(seq)) return true;
    return EraseHeld(seq);
  }

  // Ack of any delivery of `seq` (an older one's ack still wins over a newer one), and
  // whether a delivery of it was out at the time (its member's count of unsettled
  // deliveries goes down).
  //
  // A redelivery already counted (queued, in the engine's terms) that this ack settles
  // stays in the map, superseded, until a member takes it (TakeDue) and skips it: the
  // engine counts such a copy when a member passes over it, as it does one on a lane.
  // `attempt`: which delivery of it is acked (1: the first).
  Acked AckDelivery(std::uint64_t seq, std::uint32_t attempt) {
    if (window_.TrySet(seq)) return {true, true, true};
    std::lock_guard lock(mu_);
    auto it = map_.find(seq);
    if (it == map_.end() || it->second.superseded) return {};
    const bool out = it->second.out;
    if (!out && it->second.counted) {
      it->second.superseded = true;
      it->second.due_ns = std::numeric_limits<std::int64_t>::min();
      return {true, false};
    }
    const bool mine = out && it->second.attempt == attempt;
    const std::uint32_t other = out && !mine ? it->second.member : kUnknownMember;
    map_.erase(it);
    overflow_count_.store(map_.size(), std::memory_order_seq_cst);
    return {true, out, mine, other};
  }

  // True when `seq` is settled in the window: acked, dropped, or moved to the map (a
  // nak, an expiry, a spill). One load, no lock.
  bool Settled(std::uint64_t seq) const { return window_.IsSet(seq); }

  // True when `seq` is done: settled in the window and not held in the map.
  bool IsDone(std::uint64_t seq) const {
    if (!window_.IsSet(seq)) return false;
    std::lock_guard lock(mu_);
    auto it = map_.find(seq);
    return it == map_.end() || it->second.superseded;
  }

  // True when a delivery of `seq` is out with a member: claimed and unsettled in the
  // window, or held in the map as out.
  bool IsOut(std::uint64_t seq) const {
    if (seq >= next_.load(std::memory_order_acquire)) return false;
    if (!window_.IsSet(seq)) return true;
    std::lock_guard lock(mu_);
    auto it = map_.find(seq);
    return it != map_.end() && it->second.out && !it->second.superseded;
  }

  // Messages of the map waiting to be taken again (due or not).
  std::size_t Queued() const {
    if (overflow_count_.load(std::memory_order_acquire) == 0) return 0;
    std::lock_guard lock(mu_);
    std::size_t n = 0;
    for (const auto& [seq, e] : map_) n += e.out ? 0 : 1;
    return n;
  }

  // Messages waiting for a redelivery not yet due at `now_ns` (a nak's delay).
  std::size_t Delayed(std::int64_t now_ns) const {
    if (overflow_count_.load(std::memory_order_acquire) == 0) return 0;
    std::lock_guard lock(mu_);
    std::size_t n = 0;
    for (const auto& [seq, e] : map_) n += !e.out && !e.superseded && e.due_ns > now_ns ? 1 : 0;
    return n;
  }

  // Redeliveries that came due by `now_ns` and that nothing counted yet (a nak with
  // a delay: counted when it is due, as a queued redelivery is); marks them counted.
  // Appends their sequences to `out`; `behind` as for Nak.
  void CountDue(std::int64_t now_ns, std::vector<std::uint64_t>& out, std::uint64_t behind = 0) {
    if (overflow_count_.load(std::memory_order_acquire) == 0) return;
    std::lock_guard lock(mu_);
    for (auto& [seq, e] : map_) {
      if (!e.out && !e.counted && e.due_ns <= now_ns) {
        e.counted = true;
        e.behind = behind;
        out.push_back(seq);
      }
    }
  }

  // Messages of the map being redelivered: waiting for redelivery, or out again.
  std::size_t Redelivering() const {
    if (overflow_count_.load(std::memory_order_acquire) == 0) return 0;
    std::lock_guard lock(mu_);
    std::size_t n = 0;
    for (const auto& [seq, e] : map_) n += !e.superseded && (!e.out || e.attempt > 1) ? 1 : 0;
    return n;
  }

  // Acks the sequences of `mask` in the word at `base` (a multiple of 32; bit i is
  // base + i) with one CAS; those the window had settled already are acked one by
  // one (Ack). Returns how many this call settled.
  std::uint32_t AckWord(std::uint64_t base, std::uint32_t mask) {
    const std::uint32_t set = window_.TrySetWord(base, mask);
    std::uint32_t done = static_cast<std::uint32_t>(std::popcount(set));
    for (std::uint32_t rest = mask & ~set; rest != 0; rest &= rest - 1) {
      if (EraseHeld(base + static_cast<std::uint64_t>(std::countr_zero(rest)))) ++done;
    }
    return done;
  }

  // Naks `seq`: delivered again once `due_ns` has come (TakeDue). True when it was
  // unsettled or held out (a redelivery); false when it was done already.
  bool Nak(std::uint64_t seq, std::int64_t due_ns) { return Hold(seq, due_ns, /*out=*/false); }

  // `seq` is being worked on: its ack deadline moves to now + ack_wait. True when it
  // was unsettled or held out; false when it was done, or waits for redelivery.
  bool InProgress(std::uint64_t seq, std::int64_t now_ns) {
    return Hold(seq, options_.ack_wait_ns > 0 ? Add(now_ns, options_.ack_wait_ns) : kNever, /*out=*/true);
  }

  // The attempt-aware settles of delivery `attempt` of `seq` (1 = the claim's), for a
  // consumer whose old deliveries may still be settled after an expiry handed the
  // message out again: only the newest delivery, while it is out, decides.
  //  - Finish: settles it as done (a term; a give-up after the last delivery).
  //  - Nak: waits for redelivery, due at `due_ns`.
  //  - InProgress: its ack deadline moves to now + ack_wait (a no-op, kCurrent, when
  //    there is no ack_wait).
  // Each returns kCurrent when it applied, kStale or kDone when it changed nothing.
  Found Finish(std::uint64_t seq, std::uint32_t attempt) {
    if (attempt == 1 && window_.TrySet(seq)) return Found::kCurrent;
    std::lock_guard lock(mu_);
    auto it = map_.find(seq);
    if (it == map_.end() || it->second.superseded) return Found::kDone;
    if (it->second.attempt != attempt || !it->second.out) return Found::kStale;
    map_.erase(it);
    overflow_count_.store(map_.size(), std::memory_order_seq_cst);
    return Found::kCurrent;
  }
  // `counted`: the caller counts the redelivery now (a nak without a delay); false
  // leaves it to CountDue or TakeDue.
  // `behind`: taken only once the cursor has claimed what lies below it (0: at once).
  Found Nak(std::uint64_t seq, std::uint32_t attempt, std::int64_t due_ns, bool counted = true,
            std::uint64_t behind = 0) {
    return HoldDelivery(seq, attempt, due_ns, /*out=*/false, counted, behind);
  }
  Found InProgress(std::uint64_t seq, std::uint32_t attempt, std::int64_t now_ns) {
    if (options_.ack_wait_ns == 0) return Current(seq, attempt);
    return HoldDelivery(seq, attempt, Add(now_ns, options_.ack_wait_ns), /*out=*/true);
  }
  // What delivery `attempt` of `seq` is now (nothing changes).
  Found Current(std::uint64_t seq, std::uint32_t attempt) {
    std::lock_guard lock(mu_);  // inv. 2: a move is not half done
    auto it = map_.find(seq);
    if (it != map_.end()) {
      if (it->second.superseded) return Found::kDone;
      return it->second.attempt == attempt && it->second.out ? Found::kCurrent : Found::kStale;
    }
    if (window_.IsSet(seq)) return Found::kDone;
    return attempt == 1 ? Found::kCurrent : Found::kStale;
  }

  // A member's claim register: member `member` claimed sequences below `end` by time
  // `at_ns` (it read the clock after its claim). The next Tick takes it as a sample,
  // so a claim's ack deadline is its own time, not the timer's next tick (exact with
  // a clock that only a test moves). Written by that member only; at_ns first and
  // end with release, so a Tick that acquires `end` reads a time no older than it.
  void NoteClaim(std::uint32_t member, std::uint64_t end, std::int64_t at_ns) {
    Register& r = registers_[member];
    r.at_ns.store(at_ns, std::memory_order_relaxed);
    r.end.store(end, std::memory_order_release);
  }

  // Timer: samples the cursor, then the clock: `now()` returns the time in ns (inv.
  // 4). Every sequence below the sample was claimed at or before that time, so none
  // comes back early. Call once per tick; the tick is how late after ack_wait a
  // message may come back.
  template <class NowFn>
    requires std::is_invocable_r_v<std::int64_t, NowFn&>
  void Tick(NowFn&& now) {
    if (options_.ack_wait_ns == 0) return;
    // The members' registers first, in the order of their ends: each is a claim dated
    // by its member (NoteClaim).
    if (!registers_.empty()) {
      register_samples_.clear();
      for (Register& r : registers_) {
        const std::uint64_t end = r.end.load(std::memory_order_acquire);
        if (end != 0) register_samples_.push_back({end, r.at_ns.load(std::memory_order_relaxed)});
      }
      std::sort(register_samples_.begin(), register_samples_.end(),
                [](const Sample& a, const Sample& b) { return a.end < b.end; });
      for (const Sample& x : register_samples_) AddSample(x.end, x.at_ns);
    }
    // seq_cst, and the clock read after it: a claim the load does not see is later.
    const std::uint64_t claimed = next_.load(std::memory_order_seq_cst);
    const std::int64_t at = now();
    AddSample(claimed, at);
  }
  // Tick at a time read before the call: for a clock nothing else moves (a
  // ManualClock, a test), where no claim falls between the reading and the sample.
  void Tick(std::int64_t now_ns) {
    Tick([now_ns] { return now_ns; });
  }

  // Timer: every sequence claimed before a sample at least ack_wait old and still
  // unsettled moves to the overflow map, out with its ack deadline passed (now), so
  // that TimeOut or TakeDue takes it (a word of the window per CAS). Returns how many
  // moved.
  std::size_t Expire(std::int64_t now_ns) {
    if (options_.ack_wait_ns == 0) return 0;
    std::uint64_t through = expired_;
    while (!samples_.empty() && samples_.front().at_ns <= now_ns - options_.ack_wait_ns) {
      through = std::max(through, samples_.front().end);
      samples_.pop_front();
    }
    std::size_t moved = 0;
    std::uint64_t s = std::max(expired_, window_.floor());
    while (s < through) {
      const std::uint64_t base = s & ~(AckWindow::kWordSeqs - 1);
      const std::uint64_t word_end = std::min(base + AckWindow::kWordSeqs, through);
      const std::uint64_t lo = s - base;
      const std::uint64_t hi = word_end - base;
      const std::uint64_t mask = ((std::uint64_t{1} << hi) - 1) & ~((std::uint64_t{1} << lo) - 1);
      std::lock_guard lock(mu_);  // inv. 2: the move is one step for Ack
      Moving carrying(moving_, static_cast<std::size_t>(std::popcount(mask)));  // inv. 6
      std::uint32_t taken = window_.TrySetWord(base, mask);
      if (taken != 0) {
        for (; taken != 0; taken &= taken - 1) {
          map_.insert_or_assign(base + static_cast<std::uint64_t>(std::countr_zero(taken)),
                                Entry{1, now_ns, true});
          ++moved;
        }
        overflow_count_.store(map_.size(), std::memory_order_seq_cst);
      }
      s = word_end;
    }
    expired_ = std::max(expired_, through);
    return moved;
  }

  // Timer: makes room in a full window. Every claimed, unsettled sequence of the
  // floor's word moves to the overflow map, held out (attempt 1), with the ack
  // deadline its claim gave it: the first sample that saw it claimed + ack_wait
  // (now + ack_wait when no sample has yet; none without ack_wait). Returns how many
  // moved. For a straggler held longer than W later claims: memory stays bounded by
  // W plus what the map holds. Sequences not claimed yet are never taken.
  std::size_t Spill(std::int64_t now_ns) {
    return MoveClaimed(1, std::numeric_limits<std::uint64_t>::max(), now_ns);
  }

  // DeleteConsumer's sweep, after ClaimRest: every claimed, unsettled sequence below
  // `stop` (the claims made before the sweep) moves to the overflow map held out, as
  // Spill moves the floor's word: the rest of a batch's claim or a claim not yet
  // delivered, and deliveries out with members. Their members let go of them
  // (Drop); meanwhile the map tells the log's trim to keep their entries, which a
  // window no longer moving would hold back for the whole log (GroupCursor::NextHeld).
  // Returns how many moved.
  std::size_t SpillBelow(std::uint64_t stop, std::int64_t now_ns) {
    return MoveClaimed(std::numeric_limits<std::uint64_t>::max(), stop, now_ns);
  }

  // Timer, after Expire: every delivery out whose ack deadline has passed (`now_ns`)
  // times out. It waits for redelivery, due now, and is appended to `timed_out`; or,
  // when it was delivery max_deliver, it is removed and appended to `dead` (the
  // caller gives it up). {seq, attempt}: the delivery that timed out.
  // `behind` as for Nak.
  void TimeOut(std::int64_t now_ns, std::vector<Redelivery>& timed_out, std::vector<Redelivery>& dead,
               std::uint64_t behind = 0) {
    if (overflow_count_.load(std::memory_order_acquire) == 0) return;
    std::lock_guard lock(mu_);
    for (auto it = map_.begin(); it != map_.end();) {
      Entry& e = it->second;
      if (!e.out || e.superseded || e.due_ns > now_ns) {
        ++it;
        continue;
      }
      if (options_.max_deliver > 0 && e.attempt >= options_.max_deliver) {
        dead.push_back({it->first, e.attempt});
        dead_unread_.fetch_add(1, std::memory_order_relaxed);  // (mu_ orders it: NextHeld)
        it = map_.erase(it);
        continue;
      }
      e.out = false;
      e.due_ns = now_ns;
      e.behind = behind;
      e.order = ++waits_;
      timed_out.push_back({it->first, e.attempt});
      ++it;
    }
    overflow_count_.store(map_.size(), std::memory_order_seq_cst);
  }

  // The earliest time a held message is due (redelivery, or an ack deadline);
  // kNever when the map is empty. For the timer's next wake-up.
  std::int64_t next_due() const {
    if (overflow_count_.load(std::memory_order_acquire) == 0) return kNever;
    std::lock_guard lock(mu_);
    std::int64_t due = kNever;
    for (const auto& [seq, e] : map_) {
      if (!e.superseded) due = std::min(due, e.due_ns);
    }
    return due;
  }

  // Removes `seq` from the cursor's care whatever state it is in (the stream removed
  // the message: a purge, a limit): unsettled, it is settled; held, it leaves the map.
  // True when it was unsettled or held.
  bool Drop(std::uint64_t seq) {
    if (window_.TrySet(seq)) return true;
    return EraseHeld(seq);
  }

  // Hands out the held messages whose time has come, oldest sequence first, at most
  // `max` of them in this call: those waiting for redelivery (a nak's delay, an
  // expiry) and those held out whose ack deadline passed. Each is appended to `out` as
  // its next delivery (held out again, ack deadline now + ack_wait), or, past
  // max_deliver, to `dead` (removed).
  // `waiting_only`: only those waiting for redelivery; a delivery out whose deadline
  // passed stays for TimeOut (the engine counts the time-out there).
  // `member`: the member they are handed to (kUnknownMember: not known; AckDelivery
  // reports it when an older delivery's ack wins over one of them).
  void TakeDue(std::int64_t now_ns, std::vector<Redelivery>& out, std::vector<Redelivery>& dead,
               std::size_t max = std::numeric_limits<std::size_t>::max(), bool waiting_only = false,
               std::uint32_t member = kUnknownMember) {
    if (overflow_count_.load(std::memory_order_acquire) == 0) return;
    const std::int64_t deadline = options_.ack_wait_ns > 0 ? Add(now_ns, options_.ack_wait_ns) : kNever;
    std::lock_guard lock(mu_);
    const std::uint64_t claimed = next_.load(std::memory_order_acquire);
    // The due ones, earliest due first, then in the order they began to wait (Entry::
    // order): as a lane hands out what was queued again.
    struct Due {
      std::int64_t due_ns;
      std::uint64_t order;
      std::uint64_t seq;
      bool operator<(const Due& o) const {
        return due_ns != o.due_ns ? due_ns < o.due_ns : order != o.order ? order < o.order : seq < o.seq;
      }
    };
    std::vector<Due> due;
    for (const auto& [seq, e] : map_) {
      if (!e.out && e.behind > claimed) continue;  // queued behind what is not claimed yet
      if (e.superseded) {  // handed out once, to be skipped; Drop removes it
        if (!e.out) due.push_back({std::numeric_limits<std::int64_t>::min(), e.order, seq});
        continue;
      }
      if (e.due_ns > now_ns || (waiting_only && e.out)) continue;
      due.push_back({e.due_ns, e.order, seq});
    }
    std::sort(due.begin(), due.end());
    std::size_t taken = 0;
    for (const Due& d : due) {
      if (taken >= max) break;
      auto it = map_.find(d.seq);
      Entry& e = it->second;
      if (e.superseded) {
        e.out = true;
        out.push_back({d.seq, e.attempt, true, true});
        ++taken;
        continue;
      }
      const std::uint32_t next = e.attempt + 1;
      if (options_.max_deliver > 0 && next > options_.max_deliver) {
        dead.push_back({d.seq, e.attempt});
        dead_unread_.fetch_add(1, std::memory_order_relaxed);  // (mu_ orders it: NextHeld)
        map_.erase(it);
        continue;
      }
      const bool counted = e.counted;
      e = Entry{next, deadline, true};
      e.member = member;
      out.push_back({d.seq, next, counted});
      ++taken;
    }
    overflow_count_.store(map_.size(), std::memory_order_seq_cst);
  }

  // Every sequence below it is settled and out of the map: what retention may trim
  // up to (interest, work queue). A snapshot, under mu_ (so that no move is half
  // done: inv. 2); for the trimmer, once per batch, not per event.
  std::uint64_t lowest_held() const {
    std::lock_guard lock(mu_);
    const std::uint64_t f = window_.first_unsettled();
    return map_.empty() ? f : std::min(f, map_.begin()->first);
  }

  // Empties the overflow map: a deleted consumer's sweep that let go of what it held
  // (a tracked consumer's deliveries out, superseded redeliveries), so that nothing
  // keeps its entries. A member's later settle or drop of one of them changes nothing.
  // Returns how many it held.
  std::size_t ForgetHeld() {
    std::lock_guard lock(mu_);
    const std::size_t n = map_.size();
    map_.clear();
    overflow_count_.store(0, std::memory_order_seq_cst);
    return n;
  }

  // The first unsettled sequence of the window (a snapshot): below it every sequence
  // is done or held in the overflow map (lowest_held counts the map too).
  std::uint64_t window_low() const { return window_.first_unsettled(); }
  // The lowest sequence at or above `from` that the overflow map holds; UINT64_MAX
  // when none. For the log's trim, which keeps a held sequence's segment only.
  // `from` itself while a dead letter TakeDue or TimeOut handed out is not read yet
  // (DeadRead): its entry left the map, and its caller still reads it from the log.
  // Always under mu_ (no look at overflow_count_ first): a move whose TrySet the
  // caller's window_low saw holds mu_ until its entry is in the map (inv. 2).
  std::uint64_t NextHeld(std::uint64_t from) const {
    std::uint64_t next = std::numeric_limits<std::uint64_t>::max();
    {
      std::lock_guard lock(mu_);
      const auto it = map_.lower_bound(from);
      if (it != map_.end()) next = it->first;
    }
    // After the map: an entry that left it before this look had its dead letter
    // counted under mu_, so this load sees the count.
    return dead_unread_.load(std::memory_order_seq_cst) > 0 ? from : next;
  }
  // Dead letters handed out and not read yet (see NextHeld); look after lowest_held.
  bool dead_unread() const { return dead_unread_.load(std::memory_order_seq_cst) > 0; }
  // The caller of TakeDue or TimeOut has read the entries of `n` dead letters they
  // handed out (NextHeld keeps the log's entries until then).
  void DeadRead(std::size_t n) {
    if (n > 0) dead_unread_.fetch_sub(static_cast<std::uint32_t>(n), std::memory_order_seq_cst);
  }

  // The first sequence not claimed yet.
  std::uint64_t next() const { return next_.load(std::memory_order_relaxed); }
  // The window's ack floor (a multiple of 32).
  std::uint64_t floor() const { return window_.floor(); }
  // W: sequences the window holds.
  std::uint64_t window_capacity() const { return window_.capacity(); }
  // Messages the overflow map holds (snapshot).
  std::size_t held() const { return overflow_count_.load(std::memory_order_acquire); }
  // True when `seq` is in the overflow map.
  bool IsHeld(std::uint64_t seq) const {
    std::lock_guard lock(mu_);
    return map_.contains(seq);
  }
  const Options& options() const { return options_; }

 private:
  struct Entry {
    std::uint32_t attempt = 1;  // deliveries so far
    std::int64_t due_ns = 0;    // out: ack deadline; waiting: when to deliver again
    bool out = false;           // delivered and not acked (else waiting)
    bool counted = true;        // waiting: its redelivery was counted (CountDue)
    bool superseded = false;    // settled by an older delivery's ack (AckDelivery)
    // Waiting: taken only once the cursor reached this sequence (the engine queues a
    // redelivery behind what was published before it; 0: at once).
    std::uint64_t behind = 0;
    // When it last began to wait (waits_ then), to hand out the due ones in the order
    // they began to wait, as a lane queues them: not by sequence, which let one
    // message nak'd again and again starve the others (found by the adversarial
    // review).
    std::uint64_t order = 0;
    // Out: the member it is with, when known (TakeDue). Last: Entry{...} is written
    // positionally.
    std::uint32_t member = kUnknownMember;
  };
  struct Sample {
    std::uint64_t end;  // next_ at the sample
    std::int64_t at_ns;
  };

  static Options Checked(const Options& o) {
    if (o.window_word_bits > 20) {
      throw std::invalid_argument("GroupCursor window_word_bits must be 0..20, got " +
                                  std::to_string(o.window_word_bits));
    }
    if (o.start == 0 || o.start > (std::uint64_t{1} << 62)) {
      throw std::invalid_argument("GroupCursor start must be 1..2^62, got " + std::to_string(o.start));
    }
    if (o.ack_wait_ns < 0) {
      throw std::invalid_argument("GroupCursor ack_wait_ns must not be negative, got " +
                                  std::to_string(o.ack_wait_ns));
    }
    return o;
  }
  static std::int64_t Add(std::int64_t a, std::int64_t b) { return a > kNever - b ? kNever : a + b; }

  // inv. 6: raised for the life of a move.
  struct Moving {
    std::atomic<std::size_t>& count;
    std::size_t n;
    Moving(std::atomic<std::size_t>& c, std::size_t k) : count(c), n(k) { count.fetch_add(n, std::memory_order_seq_cst); }
    ~Moving() { count.fetch_sub(n, std::memory_order_seq_cst); }
    Moving(const Moving&) = delete;
    Moving& operator=(const Moving&) = delete;
  };

  // The ack deadline claimed sequence `seq` had: the first sample that saw it
  // claimed, + ack_wait; now + ack_wait when none has; kNever without ack_wait. The
  // timer's (samples_).
  std::int64_t ClaimDeadline(std::uint64_t seq, std::int64_t now_ns) const {
    if (options_.ack_wait_ns == 0) return kNever;
    const auto it = std::upper_bound(samples_.begin(), samples_.end(), seq,
                                     [](std::uint64_t s, const Sample& x) { return s < x.end; });
    return Add(it == samples_.end() ? now_ns : it->at_ns, options_.ack_wait_ns);
  }

  // Spill and SpillBelow: every claimed, unsettled sequence below `stop` in the first
  // `words` words from the floor moves to the map, held out (attempt 1), with the ack
  // deadline its claim gave it (inv. 2, 6). Returns how many moved.
  std::size_t MoveClaimed(std::uint64_t words, std::uint64_t stop, std::int64_t now_ns) {
    std::lock_guard lock(mu_);  // inv. 2
    const std::uint64_t claimed = std::min(stop, next_.load(std::memory_order_acquire));
    std::size_t moved = 0;
    for (std::uint64_t base = window_.floor(); base < claimed && words > 0; base += AckWindow::kWordSeqs, --words) {
      const std::uint64_t span = std::min<std::uint64_t>(claimed - base, AckWindow::kWordSeqs);
      const std::uint32_t mask =
          span == AckWindow::kWordSeqs ? ~std::uint32_t{0} : (std::uint32_t{1} << span) - 1;
      Moving carrying(moving_, static_cast<std::size_t>(std::popcount(mask)));  // inv. 6
      for (std::uint32_t taken = window_.TrySetWord(base, mask); taken != 0; taken &= taken - 1) {
        const std::uint64_t seq = base + static_cast<std::uint64_t>(std::countr_zero(taken));
        map_.insert_or_assign(seq, Entry{1, ClaimDeadline(seq, now_ns), true});
        ++moved;
      }
      overflow_count_.store(map_.size(), std::memory_order_seq_cst);
    }
    return moved;
  }

  // inv. 3: the map's part of an ack, after its TrySet lost (not the common path).
  bool EraseHeld(std::uint64_t seq) {
    std::lock_guard lock(mu_);
    const bool erased = map_.erase(seq) > 0;
    overflow_count_.store(map_.size(), std::memory_order_seq_cst);
    return erased;
  }

  // Nak (out = false) or InProgress (out = true) of `seq` at `due_ns` (inv. 2).
  bool Hold(std::uint64_t seq, std::int64_t due_ns, bool out) {
    std::lock_guard lock(mu_);  // inv. 2
    Moving carrying(moving_, 1);  // inv. 6
    if (window_.TrySet(seq)) {
      Entry& e = map_.insert_or_assign(seq, Entry{1, due_ns, out}).first->second;
      if (!out) e.order = ++waits_;
      overflow_count_.store(map_.size(), std::memory_order_seq_cst);
      return true;
    }
    auto it = map_.find(seq);
    if (it == map_.end()) return false;
    if (out && !it->second.out) return false;  // waiting for redelivery: not being worked on
    it->second.due_ns = due_ns;
    it->second.out = out;
    if (!out) it->second.order = ++waits_;
    return true;
  }

  // Nak or InProgress of delivery `attempt` (inv. 2).
  Found HoldDelivery(std::uint64_t seq, std::uint32_t attempt, std::int64_t due_ns, bool out,
                     bool counted = true, std::uint64_t behind = 0) {
    std::lock_guard lock(mu_);  // inv. 2
    if (attempt == 1) {
      Moving carrying(moving_, 1);  // inv. 6
      if (window_.TrySet(seq)) {
        Entry& e = map_.insert_or_assign(seq, Entry{1, due_ns, out, counted, false, behind}).first->second;
        if (!out) e.order = ++waits_;
        overflow_count_.store(map_.size(), std::memory_order_seq_cst);
        return Found::kCurrent;
      }
    }
    auto it = map_.find(seq);
    if (it == map_.end() || it->second.superseded) return Found::kDone;
    if (it->second.attempt != attempt || !it->second.out) return Found::kStale;
    it->second.due_ns = due_ns;
    it->second.out = out;
    it->second.counted = counted;
    it->second.behind = behind;
    if (!out) it->second.order = ++waits_;
    return Found::kCurrent;
  }

  // Adds sample {end, at} (timer only), keeping samples_ increasing in both: a sample
  // another dates earlier for more sequences makes it redundant, and dropping a
  // sample only dates claims later (never early).
  void AddSample(std::uint64_t end, std::int64_t at) {
    if (!samples_.empty() && samples_.back().end >= end) return;
    while (!samples_.empty() && samples_.back().at_ns >= at) samples_.pop_back();
    samples_.push_back({end, at});
  }

  struct alignas(kCacheLineSize) Register {
    std::atomic<std::uint64_t> end{0};
    std::atomic<std::int64_t> at_ns{0};
  };

  const Options options_;
  AckWindow window_;
  alignas(kCacheLineSize) std::atomic<std::uint64_t> next_;
  // The timer's (Tick, Expire): one thread at a time.
  alignas(kCacheLineSize) std::deque<Sample> samples_;
  std::uint64_t expired_;
  // The overflow map (inv. 2, 3, 5).
  alignas(kCacheLineSize) mutable std::mutex mu_;
  absl::btree_map<std::uint64_t, Entry> map_;  // guarded by mu_
  std::uint64_t waits_ = 0;  // Entry::order of the last entry that began to wait; mu_
  std::atomic<std::size_t> overflow_count_{0};
  std::atomic<std::size_t> moving_{0};  // inv. 6
  std::atomic<std::uint32_t> dead_unread_{0};  // NextHeld, DeadRead
  std::vector<Register> registers_;     // NoteClaim: one per member
  std::vector<Sample> register_samples_;  // Tick's scratch (the timer's)
};

}  // namespace inferq::engine_internal
