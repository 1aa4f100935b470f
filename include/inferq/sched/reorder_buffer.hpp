/// @file inferq/sched/reorder_buffer.hpp
///
/// ReorderBuffer<T>: puts the items of each sequence (a generation's tokens, keyed by
/// `seq_id`) back in `seq_no` order when several workers emit them out of order.
/// Items are released strictly in order; a number that does not
/// come within `gap_timeout_ns` is reported as missing (a gap, never hidden) and the
/// items after it are released.
///
/// Usage:
/// @code
///   inferq::ReorderBuffer<Token> rb;                      // numbers start at 0
///   auto sink = [&](std::string_view seq_id, std::uint64_t seq_no, Token&& t) {
///     Deliver(seq_id, seq_no, std::move(t));              // strictly in order
///   };
///   auto on_gap = [&](std::string_view seq_id, std::uint64_t first, std::uint64_t end) {
///     ReportLost(seq_id, first, end);                     // [first, end) never came
///   };
///   rb.Offer(tok.seq_id, tok.seq_no, std::move(tok), clock.NowNanos(), sink);
///   rb.ExpireGaps(clock.NowNanos(), sink, on_gap);        // on a timer
///   rb.Finish(seq_id, sink, on_gap, /*end_seq_no=*/n);    // generation done
/// @endcode
///
/// Per sequence the buffer keeps `next` (the next number to release) and the items
/// that came ahead of it. An offered number is
/// @code{.unparsed}
///   < next:  kLate when it lies in a gap reported earlier (one of the last
///            max_remembered_gaps_per_sequence gaps), else kDuplicate (released
///            already, or below the first number given to Start); dropped, counted;
///   = next:  released with every buffered item that follows it without a hole;
///   > next:  buffered (kDuplicate if that number is buffered already), or
///            kOverflow, refused with nothing changed, when seq_no - next >
///            max_pending_per_sequence.
/// @endcode
///
/// Gap timing: a missing number `next` is known missing from the moment some later
/// number arrives, so the sequence's head has been waiting since the earliest
/// arrival among its buffered items. ExpireGaps reports the gap [next, first
/// buffered number) once now_ns - that arrival >= gap_timeout_ns, then releases the
/// run after it, and repeats while the next gap has also waited long enough.
///
/// Memory bound: at most max_sequences sequences, each holding at most
/// max_pending_per_sequence items (with one 16-byte arrival record each) and
/// max_remembered_gaps_per_sequence gap ranges (16 bytes each); a sequence stays
/// until Finish, also when nothing is buffered (it remembers `next`), so callers
/// must Finish every sequence they open.
///
/// Times are ns of the caller's clock; a now_ns earlier than one already seen is
/// taken as the latest seen.
///
/// Thread safety: none. One thread at a time (the caller's receiving thread, or under
/// a lock).
/// Callbacks run on the calling thread and must not call back into this buffer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace inferq {

/// A ReorderBuffer's limits and gap timeout; checked by Validate.
struct ReorderBufferOptions {
  /// Items buffered ahead of the next expected number, per sequence: an item is
  /// accepted when seq_no - next <= max_pending_per_sequence. >= 1.
  std::uint32_t max_pending_per_sequence = 1024;
  /// Sequences known at once (open, not Finished). >= 1.
  std::size_t max_sequences = 65536;
  /// How long a missing number is waited for once a later one has arrived, ns. > 0.
  std::int64_t gap_timeout_ns = 50'000'000;
  /// Reported gaps remembered per sequence to tell late arrivals (kLate) from
  /// duplicates (kDuplicate); arrivals from older gaps count as duplicates. >= 1.
  std::uint32_t max_remembered_gaps_per_sequence = 64;
};

/// What Offer did with an item.
enum class ReorderResult : std::uint8_t {
  kReleased,          ///< this item (and any buffered run after it) went to the sink
  kBuffered,          ///< held until the numbers before it come or are given up
  kDuplicate,         ///< already released or already buffered: dropped, counted
  kLate,              ///< reported missing by a gap earlier: dropped, counted
  kOverflow,          ///< seq_no - next > max_pending_per_sequence: refused, nothing changed
  kTooManySequences,  ///< a new seq_id while max_sequences are open: refused, nothing changed
};

/// "released", "buffered", "duplicate", "late", "overflow" or "too_many_sequences".
inline std::string_view ReorderResultName(ReorderResult r) {
  switch (r) {
    case ReorderResult::kReleased: return "released";
    case ReorderResult::kBuffered: return "buffered";
    case ReorderResult::kDuplicate: return "duplicate";
    case ReorderResult::kLate: return "late";
    case ReorderResult::kOverflow: return "overflow";
    case ReorderResult::kTooManySequences: return "too_many_sequences";
  }
  return "unknown";
}

/// Counters since construction, except the *_now gauges.
struct ReorderStats {
  std::uint64_t released = 0;         ///< items handed to a sink
  std::uint64_t buffered_now = 0;     ///< items held now
  std::uint64_t sequences_now = 0;    ///< sequences open now
  std::uint64_t duplicates = 0;       ///< kDuplicate results
  std::uint64_t late = 0;             ///< kLate results
  std::uint64_t gaps = 0;             ///< gap ranges reported through on_gap
  std::uint64_t missing_numbers = 0;  ///< numbers in those ranges
  std::uint64_t overflow = 0;         ///< kOverflow results
  std::uint64_t too_many_sequences = 0;  ///< kTooManySequences results and Start refusals
};

/// Puts the items of each sequence back in seq_no order (see the file comment).
template <class T>
class ReorderBuffer {
 public:
  /// InvalidArgument naming the field and its value for a zero limit or a
  /// gap_timeout_ns <= 0.
  static absl::Status Validate(const ReorderBufferOptions& o) {
    if (o.max_pending_per_sequence < 1) {
      return absl::InvalidArgumentError("ReorderBufferOptions.max_pending_per_sequence = " +
                                        std::to_string(o.max_pending_per_sequence) +
                                        " must be >= 1");
    }
    if (o.max_sequences < 1) {
      return absl::InvalidArgumentError("ReorderBufferOptions.max_sequences = " +
                                        std::to_string(o.max_sequences) + " must be >= 1");
    }
    if (o.gap_timeout_ns <= 0) {
      return absl::InvalidArgumentError("ReorderBufferOptions.gap_timeout_ns = " +
                                        std::to_string(o.gap_timeout_ns) + " must be > 0");
    }
    if (o.max_remembered_gaps_per_sequence < 1) {
      return absl::InvalidArgumentError(
          "ReorderBufferOptions.max_remembered_gaps_per_sequence = " +
          std::to_string(o.max_remembered_gaps_per_sequence) + " must be >= 1");
    }
    return absl::OkStatus();
  }

  /// Throws std::invalid_argument with Validate's message for invalid options.
  explicit ReorderBuffer(ReorderBufferOptions options = {}) : options_(options) {
    if (absl::Status s = Validate(options); !s.ok()) {
      throw std::invalid_argument(std::string(s.message()));
    }
  }

  ReorderBuffer(const ReorderBuffer&) = delete;
  ReorderBuffer& operator=(const ReorderBuffer&) = delete;

  /// Opens seq_id with `first_seq_no` as its first number (sequences opened by Offer
  /// start at 0). AlreadyExists when seq_id is open; ResourceExhausted when
  /// max_sequences are open (counted in too_many_sequences).
  absl::Status Start(std::string_view seq_id, std::uint64_t first_seq_no) {
    if (auto it = sequences_.find(seq_id); it != sequences_.end()) {
      return absl::AlreadyExistsError("sequence '" + std::string(seq_id) +
                                      "' is already open (next expected " +
                                      std::to_string(it->second->next) + ")");
    }
    if (sequences_.size() >= options_.max_sequences) {
      ++stats_.too_many_sequences;
      return absl::ResourceExhaustedError(
          "sequence '" + std::string(seq_id) + "' refused: max_sequences = " +
          std::to_string(options_.max_sequences) + " are open");
    }
    Open(seq_id)->next = first_seq_no;
    return absl::OkStatus();
  }

  /// Offers item seq_no of seq_id, arrived at now_ns. Calls
  /// sink(std::string_view seq_id, std::uint64_t seq_no, T&& item) for each item
  /// this makes releasable, in order, before returning. Opens seq_id (next = 0) if
  /// it is not open, unless the result is kOverflow or kTooManySequences.
  /// O(log buffered) plus the released items.
  template <class Sink>
  ReorderResult Offer(std::string_view seq_id, std::uint64_t seq_no, T value,
                      std::int64_t now_ns, Sink&& sink) {
    now_ns_ = std::max(now_ns_, now_ns);
    auto it = sequences_.find(seq_id);
    Sequence* s = nullptr;
    if (it != sequences_.end()) {
      s = it->second.get();
    } else {
      if (seq_no > options_.max_pending_per_sequence) {
        ++stats_.overflow;
        return ReorderResult::kOverflow;
      }
      if (sequences_.size() >= options_.max_sequences) {
        ++stats_.too_many_sequences;
        return ReorderResult::kTooManySequences;
      }
      s = Open(seq_id);
    }
    if (seq_no < s->next) {
      if (InRememberedGap(*s, seq_no)) {
        ++stats_.late;
        return ReorderResult::kLate;
      }
      ++stats_.duplicates;
      return ReorderResult::kDuplicate;
    }
    if (seq_no - s->next > options_.max_pending_per_sequence) {
      ++stats_.overflow;
      return ReorderResult::kOverflow;
    }
    if (seq_no > s->next) {
      if (!s->pending.try_emplace(seq_no, std::move(value)).second) {
        ++stats_.duplicates;
        return ReorderResult::kDuplicate;
      }
      s->arrivals.emplace_back(seq_no, now_ns_);
      ++stats_.buffered_now;
      UpdateWaiting(*s);
      return ReorderResult::kBuffered;
    }
    WaitingGuard guard{this, s};
    ++s->next;
    ++stats_.released;
    sink(std::string_view(s->id), seq_no, std::move(value));
    ReleaseRun(*s, sink);
    return ReorderResult::kReleased;
  }

  /// Reports, for every sequence whose head has waited gap_timeout_ns or more (see
  /// the file comment), the missing range through
  /// on_gap(std::string_view seq_id, std::uint64_t first_missing, std::uint64_t end_missing)
  /// (half-open), then releases the items after it through `sink`; a sequence can
  /// report several gaps in one call. Sequences are visited in the order their
  /// heads started waiting. Returns the number of gaps reported.
  /// O(log sequences) per gap plus the released items.
  template <class Sink, class OnGap>
  std::size_t ExpireGaps(std::int64_t now_ns, Sink&& sink, OnGap&& on_gap) {
    now_ns_ = std::max(now_ns_, now_ns);
    std::size_t reported = 0;
    while (!waiting_.empty()) {
      auto first = waiting_.begin();
      if (now_ns_ - first->first.first < options_.gap_timeout_ns) break;
      Sequence& s = *first->second;
      WaitingGuard guard{this, &s};
      ReportGapAndRelease(s, sink, on_gap);
      ++reported;
    }
    return reported;
  }

  /// The time (ns) at which ExpireGaps will next have a gap to report, or nullopt
  /// when no sequence is waiting: the caller arms a timer for it (the engine does not
  /// use ReorderBuffer).
  std::optional<std::int64_t> NextGapDeadline() const {
    if (waiting_.empty()) return std::nullopt;
    const std::int64_t since = waiting_.begin()->first.first;
    return since > INT64_MAX - options_.gap_timeout_ns ? INT64_MAX
                                                       : since + options_.gap_timeout_ns;
  }

  /// Closes seq_id: the items it still holds are released in order, each hole before
  /// them reported through on_gap first; then, when end_seq_no (one past the last
  /// number of the sequence) is given and above the next expected number, the
  /// trailing range [next, end_seq_no) is reported too. False (nothing called) when
  /// seq_id is not open. A later Offer for seq_id opens a new sequence at 0.
  template <class Sink, class OnGap>
  bool Finish(std::string_view seq_id, Sink&& sink, OnGap&& on_gap,
              std::optional<std::uint64_t> end_seq_no = std::nullopt) {
    auto it = sequences_.find(seq_id);
    if (it == sequences_.end()) return false;
    Sequence& s = *it->second;
    {
      WaitingGuard guard{this, &s};
      while (!s.pending.empty()) ReportGapAndRelease(s, sink, on_gap);
    }
    if (end_seq_no && *end_seq_no > s.next) {
      ++stats_.gaps;
      stats_.missing_numbers += *end_seq_no - s.next;
      const std::uint64_t first = s.next;
      s.next = *end_seq_no;
      on_gap(std::string_view(s.id), first, *end_seq_no);
    }
    sequences_.erase(it);  // the callbacks do not touch the map: `it` is still valid
    --stats_.sequences_now;
    return true;
  }

  /// The next number seq_id will release, or nullopt when it is not open.
  std::optional<std::uint64_t> NextExpected(std::string_view seq_id) const {
    auto it = sequences_.find(seq_id);
    if (it == sequences_.end()) return std::nullopt;
    return it->second->next;
  }

  /// The counters.
  ReorderStats Stats() const { return stats_; }
  /// The options it was made with.
  const ReorderBufferOptions& options() const { return options_; }

 private:
  struct Sequence {
    std::string id;
    std::uint64_t next = 0;
    std::map<std::uint64_t, T> pending;  ///< buffered items, seq_no > next
    /// (seq_no, arrival ns) of buffered items in arrival order; entries with
    /// seq_no < next were released and are dropped lazily from the front. Since
    /// arrival times never decrease, the front's time is the earliest arrival.
    std::deque<std::pair<std::uint64_t, std::int64_t>> arrivals;
    std::deque<std::pair<std::uint64_t, std::uint64_t>> gaps;  ///< reported, ascending
    std::uint64_t uid = 0;                 ///< ties in waiting_
    std::optional<std::int64_t> waiting_since;  ///< key in waiting_ when set
  };

  using WaitKey = std::pair<std::int64_t, std::uint64_t>;  ///< (waiting since, uid)

  /// Re-files a sequence in waiting_ whenever a scope that changed it ends, also by
  /// an exception from a callback.
  struct WaitingGuard {
    ReorderBuffer* self;
    Sequence* s;
    ~WaitingGuard() { self->UpdateWaiting(*s); }
  };

  Sequence* Open(std::string_view seq_id) {
    auto s = std::make_unique<Sequence>();
    s->id = std::string(seq_id);
    s->uid = next_uid_++;
    Sequence* raw = s.get();
    sequences_.emplace(std::string_view(raw->id), std::move(s));
    ++stats_.sequences_now;
    return raw;
  }

  bool InRememberedGap(const Sequence& s, std::uint64_t n) const {
    // The first remembered gap whose start is > n; the one before it may hold n.
    auto it = std::upper_bound(s.gaps.begin(), s.gaps.end(), n,
                               [](std::uint64_t v, const auto& g) { return v < g.first; });
    return it != s.gaps.begin() && n < std::prev(it)->second;
  }

  template <class Sink>
  void ReleaseRun(Sequence& s, Sink& sink) {
    while (!s.pending.empty() && s.pending.begin()->first == s.next) {
      auto node = s.pending.extract(s.pending.begin());
      ++s.next;
      --stats_.buffered_now;
      ++stats_.released;
      sink(std::string_view(s.id), node.key(), std::move(node.mapped()));
    }
  }

  /// s.pending is not empty and its first number is above s.next.
  template <class Sink, class OnGap>
  void ReportGapAndRelease(Sequence& s, Sink& sink, OnGap& on_gap) {
    const std::uint64_t first = s.next;
    const std::uint64_t end = s.pending.begin()->first;
    ++stats_.gaps;
    stats_.missing_numbers += end - first;
    s.gaps.emplace_back(first, end);
    if (s.gaps.size() > options_.max_remembered_gaps_per_sequence) s.gaps.pop_front();
    s.next = end;
    on_gap(std::string_view(s.id), first, end);
    ReleaseRun(s, sink);
  }

  void UpdateWaiting(Sequence& s) {
    while (!s.arrivals.empty() && s.arrivals.front().first < s.next) s.arrivals.pop_front();
    std::optional<std::int64_t> since;
    if (!s.pending.empty()) since = s.arrivals.front().second;
    if (since == s.waiting_since) return;
    if (s.waiting_since) waiting_.erase(WaitKey{*s.waiting_since, s.uid});
    if (since) waiting_.emplace(WaitKey{*since, s.uid}, &s);
    s.waiting_since = since;
  }

  ReorderBufferOptions options_;
  /// Keys view the Sequence's own id (stable: the Sequence is heap-allocated).
  absl::flat_hash_map<std::string_view, std::unique_ptr<Sequence>> sequences_;
  std::map<WaitKey, Sequence*> waiting_;  ///< sequences holding items, by waiting since
  ReorderStats stats_;
  std::int64_t now_ns_ = INT64_MIN;  ///< latest now_ns seen
  std::uint64_t next_uid_ = 0;
};

}  // namespace inferq
