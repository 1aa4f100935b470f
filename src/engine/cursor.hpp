// File: src/engine/cursor.hpp (not API)
//
// Cursor consumers: the engine-core redesign's consumer, wired into the engine for
// the configurations it covers so far (CursorEligible). A memory stream that has
// one keeps a log of its stored messages in sequence order (StreamCursors: a
// MessageLog of CursorEntry, each holding the message's record and the mask of the
// cursor consumers whose filter matched at publish), appended once per publish
// however many cursor consumers take it. A cursor consumer does not queue
// deliveries on lanes: its members claim sequences from its GroupCursor, an ack sets
// a bit, and what leaves the window (naks, InProgress, ack_wait expiries) waits in
// the cursor's overflow map. The records, retention, dead letters and counters are
// the engine's as for lane consumers, so the two kinds answer the same (the
// differential test runs both).
//
// Covered (CursorEligible): memory streams; one member; explicit acks; ack_wait
// without a backoff list; max_deliver; dead-letter subjects; filters; overflow
// block; deliver policy new, or all / by start sequence on a stream that holds
// nothing from there. Not yet (those consumers queue on lanes as before): several
// members, ack policy none, max_ack_pending, backoff, QoS tiers, lifecycles,
// accept_codecs, queue timeouts, replay original, predicates, file streams, and an
// event's own ttl or deadline (an event that has one is refused a cursor consumer's
// log: see PushToCursors).
//
// Switched on per engine by INFERQ_CURSOR_CONSUMERS=1 in the environment while the
// redesign is under way (read once by Engine::Create).
//
// Thread safety: StreamCursors is appended to under the stream's mutex (one writer);
// `end` is its release point for readers. CursorState's members are as GroupCursor
// says; each member's Reader is its puller's, `timer_reader` the timer run's
// (run_timers_mu).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "consumer_state.hpp"
#include "group_cursor.hpp"
#include "inferq/ring/event_count.hpp"
#include "message_log.hpp"

namespace inferq::engine_internal {

// One stored message in a stream's cursor log.
struct CursorEntry {
  CursorEntry(Handle record, std::uint64_t consumers) : h(std::move(record)), mask(consumers) {}
  Handle h;            // the stream's record of the message
  std::uint64_t mask;  // bit CursorState::bit set: that cursor consumer takes it
};

using CursorLog = MessageLog<CursorEntry>;

// A stream's log for its cursor consumers (StreamState::cursors).
struct StreamCursors {
  explicit StreamCursors(std::uint64_t first_seq) : log(10, first_seq), end(first_seq) {}
  CursorLog log;
  // The first sequence not in the log yet: stored with release after its entry is
  // published (one writer: the stream's mutex), loaded with acquire by pullers.
  std::atomic<std::uint64_t> end;
  std::uint64_t used_bits = 0;  // CursorState::bit of each attached consumer; stream mu
  // Publishes since the log was last trimmed (stream mu).
  std::uint32_t since_trim = 0;
};

// What a cursor consumer holds (ConsumerState::cursor).
struct CursorState {
  CursorState(const GroupCursor::Options& o, StreamCursors& s, std::uint64_t b, std::uint32_t members,
              std::uint64_t cap)
      : cursor(o), stream(&s), bit(b), capacity(cap), timer_reader(s.log) {
    for (std::uint32_t i = 0; i < members; ++i) readers.push_back(std::make_unique<CursorLog::Reader>(s.log));
  }
  GroupCursor cursor;
  StreamCursors* stream;
  std::uint64_t bit;
  // Publishers wait (overflow block) while this many sequences are published and not
  // claimed: members x lane_capacity.
  std::uint64_t capacity;
  std::vector<std::unique_ptr<CursorLog::Reader>> readers;  // one per member
  CursorLog::Reader timer_reader;                           // the timer run's
  EventCount data;  // pullers wait for a publish (or a due redelivery)
  EventCount room;  // publishers wait for a claim (overflow block)
  std::atomic<bool> closed{false};  // Close or DeleteConsumer: pullers drain, then stop
};

// Whether consumer `c` (its config checked, not yet listed) can be a cursor
// consumer of `stream`. Requires stream.mu.
bool CursorEligible(const StreamState& stream, const ConsumerState& c);
// Makes `c` a cursor consumer of `stream`, starting at the stream's next sequence
// (or start_seq when later). Requires stream.mu.
void AttachCursor(StreamState& stream, ConsumerState& c);
// The cursor consumers of `stream` whose filters `mask` (the stream's filter mask for
// the event's subject) matches, as a mask of CursorState::bit; explicit-ack ones are
// counted in *explicit_acks. Requires stream.mu.
std::uint64_t CursorTargets(const StreamState& stream, std::uint64_t mask, std::uint32_t* explicit_acks);
// Before anything is stored: OK when every cursor consumer of `targets` has room, or
// the publish may not wait and is refused (ResourceExhausted naming the consumer,
// *busy set) / may wait and waited (holding the stream's mutex: the backpressure).
// Internal publishes (dead letters) neither wait nor are refused. Requires stream.mu.
absl::Status CursorRoom(StreamState& stream, std::uint64_t targets, bool wait, bool internal, bool* busy);
// Appends the stored message `h` for cursor consumers `targets` (0: none; every
// message stored while the stream has the log gets its entry, so that the log's
// sequences are the stream's) and wakes their pullers. Requires stream.mu.
void PushToCursors(StreamState& stream, const Handle& h, std::uint64_t targets);
// The timer run's part for a cursor consumer: ack_wait expiries (counted, redelivered
// or given up), delayed naks that came due, the log trimmed; wakes pullers when
// something is due. The earliest time it needs a run again (INT64_MAX: none).
std::int64_t RunCursorTimers(ConsumerState& c, std::int64_t now);
// Close and DeleteConsumer: pullers drain and then stop.
void CloseCursor(ConsumerState& c);
// DeleteConsumer: under interest retention, the stream stops waiting for this
// consumer's unsettled messages. After CloseCursor, with the stream's mutex held.
void ReleaseCursorInterest(ConsumerState& c);
// Stats: messages published and not claimed yet (approximate), and held in the map.
std::uint64_t CursorPending(const ConsumerState& c);

}  // namespace inferq::engine_internal
