/// @file inferq/ring/event_count.hpp
///
/// The rings' waiting primitive, for code that waits on a condition of its own (a
/// cursor over a log, a count of free slots) the way MpmcRing's blocking calls wait
/// for an item: inferq::EventCount, Dmitry Vyukov's event count (folly::EventCount is
/// the same idea), and inferq::WaitUntil, which waits under a wait strategy
/// (wait_strategy.hpp: spin, yield, then sleep on the event count).
///
/// Usage:
/// @code
///   inferq::EventCount ready;
///   std::atomic<std::uint64_t> published{0};
///   // Waiter: true once `got` succeeded, false at the deadline or when give_up.
///   bool ok = inferq::WaitUntil<inferq::HybridWait>(
///       ready, deadline_ns, [&] { return TryTake(); },          // the try
///       [&] { return closed.load(); },                           // give up
///       [&] { return published.load() > taken.load(); });        // more for others
///   // Notifier: make the change with a seq_cst store or read-modify-write, then
///   published.fetch_add(1, std::memory_order_seq_cst);
///   ready.NotifyOne();
/// @endcode
///
/// The protocol and why no wake-up is lost are stated as numbered invariants in
/// ring/internal/event_count.hpp; the one rule for a caller: the change a waiter's
/// try reads is made with a seq_cst store or read-modify-write before NotifyOne /
/// NotifyMany / NotifyAll. A notifier with nobody asleep pays one load.
///
/// Thread safety: every member of EventCount may be called from any thread; a
/// WaitUntil's callables run on the waiting thread.
#pragma once

#include "inferq/ring/internal/event_count.hpp"
#include "inferq/ring/wait_strategy.hpp"

namespace inferq {

/// See the file comment and ring/internal/event_count.hpp.
using EventCount = ring_internal::EventCount;
/// Waits as `Strategy` says until a try succeeds (true), `give_up()` (false) or the
/// monotonic deadline in ns (kNoDeadline: none; false) passes: see
/// ring_internal::WaitUntil.
using ring_internal::WaitUntil;

}  // namespace inferq
