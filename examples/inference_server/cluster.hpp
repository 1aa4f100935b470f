// The NATS side of inference_server --role client|replica: the JetStream streams the
// processes share and the bridges that connect each process's engine to them.
//
//   client                                  replica (one or more processes)
//   REQUESTS --export--> INFER_REQUESTS --import (durable "replicas")--> REQUESTS
//   REPLIES  <--import (durable "client")-- INFER_TOKENS <--export-- REPLIES
//
// INFER_REQUESTS and INFER_TOKENS are work-queue streams on file storage with
// --js-replicas replicas. The replicas share one durable, so each request goes to one
// of them; their import acks a request to NATS only when the replica acked it locally,
// which it does when the generation is complete (ImportAck::kConsumed), so a replica
// process that dies hands its unfinished requests to the others after kJetStreamAckWait.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "inferq/adapters/nats/bridge.hpp"
#include "inferq/engine/engine.hpp"

namespace inferq::example {

inline constexpr char kRequestsJetStream[] = "INFER_REQUESTS";
inline constexpr char kTokensJetStream[] = "INFER_TOKENS";
// How long JetStream waits for a replica's ack (or in-progress) before it gives the
// request to another replica: the time a killed replica's work takes to move. 15 s:
// at 5 s, on 2 cores at load 8, in-progress and acks of live replicas reached the
// three-node cluster late and it ran 53 requests a second time (cluster_demo plain).
inline constexpr absl::Duration kJetStreamAckWait = absl::Seconds(15);
// How long each JetStream step of a starting process (a stream's creation or purge,
// a durable consumer's creation or lookup) is tried again while the cluster forms
// (no meta or stream leader yet, no suitable peers for placement, timeouts).
inline constexpr absl::Duration kFormingWait = absl::Seconds(30);

struct ClusterConfig {
  std::vector<std::string> servers;  // nats://host:port, ...
  std::string model;                 // requests are infer.<model>.request
  int stream_replicas = 1;           // JetStream replicas of the two streams (1..5)
  // A replica process: the requests it takes from NATS at once (what its replicas
  // run in a batch); the rest wait in JetStream for whichever process has room.
  int replica_room = 32;
};

// Creates INFER_REQUESTS and INFER_TOKENS when they are missing (a second process
// finds them); with `purge`, empties both (the client, before a replay). Unavailable
// naming the servers when none answers; FailedPrecondition with JetStream's error when
// a stream exists with another configuration (another --model or --js-replicas), or
// when the cluster did not form within kFormingWait (the error says so).
absl::Status EnsureReplayStreams(const ClusterConfig& config, bool purge);

// The messages INFER_REQUESTS and INFER_TOKENS hold now: requests not yet finished
// by a replica (their ack waits for the generation), tokens not yet taken by the
// client. Each count comes from its stream's leader: Unavailable naming the stream
// when one has none, or when no server answers (an outage, a cluster electing).
absl::StatusOr<std::uint64_t> MessagesInJetStream(const ClusterConfig& config);

// The client's bridge: exports the local stream REQUESTS (consumer "to-nats") to
// INFER_REQUESTS, imports INFER_TOKENS (durable "client") into the local REPLIES.
absl::StatusOr<std::unique_ptr<nats::NatsBridge>> StartClientBridge(Engine& engine, const ClusterConfig& config);

// A replica's bridge: imports INFER_REQUESTS (durable "replicas", ImportAck::kConsumed
// on the local work-queue stream REQUESTS), exports the local REPLIES (consumer
// "to-nats") to INFER_TOKENS. `origin` names this process in Inferq-Origin.
absl::StatusOr<std::unique_ptr<nats::NatsBridge>> StartReplicaBridge(Engine& engine, const ClusterConfig& config,
                                                                     const std::string& origin);

}  // namespace inferq::example
