// File: examples/inference_server/durable.hpp
//
// The state directory of a durable replay (inference_server --state-dir DIR): its
// checks, and the file that ties the directory to one replay.
//
//   DIR/replay      the settings that fix what the replay stores (the trace's
//                   fingerprint, --model, --replicas, ...), written once by the first
//                   run (temporary file, fdatasync, rename, fsync of DIR); a later run
//                   must match it
//   DIR/REQUESTS/   file stream of requests and decode steps, with the ack log of the
//                   durable consumer `replicas` in consumers/
//   DIR/REPLIES/    file stream of tokens, with the ack log of consumer `client`
//   DIR/DEAD/       file stream of dead letters
//
// Usage:
//   if (absl::Status s = PrepareStateDir(dir); !s.ok()) ...          // creates DIR
//   if (absl::Status s = CheckReplaySettings(dir, settings); !s.ok()) ...
//
// Thread safety: plain functions; one run owns the directory (the engine's file
// streams lock their own directories: a second process is refused there).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "trace.hpp"

namespace inferq::example {

// Makes `dir` (and missing parents) a directory. InvalidArgument "'DIR' is a regular
// file, not a directory" (or a FIFO, a character device, ...) when the path exists
// and is not a directory; NotFound "cannot create 'DIR': <why>" when it cannot be
// created (a parent that is a file: "Not a directory"), PermissionDenied "cannot
// write in 'DIR': <why>" when it is not writable.
absl::Status PrepareStateDir(const std::string& dir);

// 64-bit FNV-1a over every request's arrival time and token counts: two replays
// with the same fingerprint replay the same requests (the --trace file, --limit and
// --overload all change it).
std::uint64_t TraceFingerprint(const std::vector<TraceRequest>& trace);

// The replay settings as (option, value) pairs, e.g. {"--replicas", "4"}.
using ReplaySettings = std::vector<std::pair<std::string, std::string>>;

// Writes `settings` to DIR/replay when it does not exist yet (durably: a temporary
// file fdatasync'ed, renamed into place, DIR fsync'ed). When it exists, compares:
// FailedPrecondition naming the first option whose value differs ("--state-dir 'DIR'
// holds a replay run with --replicas 4; this run has --replicas 2 (...)"), a missing
// line, or a file that is not such a record; InvalidArgument with the errno text
// for an I/O error.
absl::Status CheckReplaySettings(const std::string& dir, const ReplaySettings& settings);

// `s` as a JSON string literal, quotes included (", \ and control bytes escaped).
std::string JsonString(const std::string& s);

}  // namespace inferq::example
