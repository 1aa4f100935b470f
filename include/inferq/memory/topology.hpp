/// @file inferq/memory/topology.hpp
///
/// Topology: the NUMA nodes of the machine, their CPUs and memory, and the node a
/// thread runs on, read with hwloc. A synthetic description (hwloc's synthetic
/// syntax, e.g. "numa:2 core:2 pu:1") builds a pretend machine for tests of
/// placement logic on a one-node host.
///
/// Usage:
/// @code
///   absl::StatusOr<inferq::Topology> t = inferq::Topology::Detect();
///   int node = t->CurrentNode();        // node of the CPU this thread is on now
///   auto two = inferq::Topology::Synthetic("numa:2 core:2 pu:1");
///   two->NodeOfCpu(3);                  // 1
/// @endcode
///
/// Thread safety: an immutable value once built; const methods from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace inferq {

/// One NUMA node of a Topology.
struct NumaNode {
  int index = 0;                   ///< OS index of the node (what mbind/mimalloc take)
  std::vector<int> cpus;           ///< OS indexes of its processing units, ascending
  std::uint64_t memory_bytes = 0;  ///< local memory (0 when unknown, as in synthetic ones)
};

/// The NUMA nodes of a machine, real (Detect) or pretend (Synthetic).
class Topology {
 public:
  /// The machine this process runs on. Internal when hwloc cannot load it.
  static absl::StatusOr<Topology> Detect();
  /// A pretend machine. InvalidArgument (with hwloc's complaint) for a description
  /// hwloc does not accept, e.g. "numa:0".
  static absl::StatusOr<Topology> Synthetic(std::string_view description);

  /// The nodes, in hwloc's logical order (at least one from Detect or Synthetic).
  const std::vector<NumaNode>& nodes() const { return nodes_; }
  /// nodes().size().
  std::size_t node_count() const { return nodes_.size(); }
  /// True for a topology made by Synthetic.
  bool synthetic() const { return synthetic_; }
  /// "one node: not NUMA" style summary for logs and stats.
  std::string Describe() const;

  /// Index into nodes() of the node holding `cpu`, or -1 when no node holds it.
  int NodeOfCpu(int cpu) const;
  /// Index into nodes() of the node of the CPU the calling thread runs on right now
  /// (sched_getcpu; the thread may move). 0 when that CPU is unknown to this topology,
  /// as for a synthetic machine larger or smaller than the real one.
  int CurrentNode() const;

 private:
  std::vector<NumaNode> nodes_;
  std::vector<int> node_of_cpu_;  ///< by OS CPU index; -1 = none
  bool synthetic_ = false;
};

}  // namespace inferq
