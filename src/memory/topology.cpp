#include "inferq/memory/topology.hpp"

#include <sched.h>

#include <algorithm>
#include <memory>
#include <string>

#include <hwloc.h>

#include "absl/status/status.h"

namespace inferq {
namespace {

struct HwlocDeleter {
  void operator()(hwloc_topology_t t) const { hwloc_topology_destroy(t); }
};
using HwlocPtr = std::unique_ptr<std::remove_pointer_t<hwloc_topology_t>, HwlocDeleter>;

// Reads the nodes of a loaded hwloc topology.
absl::Status Build(hwloc_topology_t topo, bool synthetic, std::vector<NumaNode>* out,
                   std::vector<int>* node_of_cpu) {
  const int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t obj = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NumaNode node;
    node.index = static_cast<int>(obj->os_index);
    node.memory_bytes = obj->attr != nullptr ? obj->attr->numanode.local_memory : 0;
    unsigned cpu;
    hwloc_bitmap_foreach_begin(cpu, obj->cpuset) {
      node.cpus.push_back(static_cast<int>(cpu));
    }
    hwloc_bitmap_foreach_end();
    out->push_back(std::move(node));
  }
  if (out->empty()) {
    return absl::InternalError(std::string("hwloc found no NUMA node in the ") +
                               (synthetic ? "synthetic" : "detected") + " topology");
  }
  int max_cpu = -1;
  for (const NumaNode& node : *out) {
    for (int c : node.cpus) max_cpu = std::max(max_cpu, c);
  }
  node_of_cpu->assign(static_cast<std::size_t>(max_cpu + 1), -1);
  for (std::size_t i = 0; i < out->size(); ++i) {
    for (int c : (*out)[i].cpus) (*node_of_cpu)[static_cast<std::size_t>(c)] = static_cast<int>(i);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Topology> Topology::Detect() {
  hwloc_topology_t raw;
  if (hwloc_topology_init(&raw) != 0) return absl::InternalError("hwloc_topology_init failed");
  HwlocPtr topo(raw);
  if (hwloc_topology_load(raw) != 0) return absl::InternalError("hwloc_topology_load failed");
  Topology t;
  t.synthetic_ = false;
  if (absl::Status s = Build(raw, false, &t.nodes_, &t.node_of_cpu_); !s.ok()) return s;
  return t;
}

absl::StatusOr<Topology> Topology::Synthetic(std::string_view description) {
  hwloc_topology_t raw;
  if (hwloc_topology_init(&raw) != 0) return absl::InternalError("hwloc_topology_init failed");
  HwlocPtr topo(raw);
  const std::string desc(description);
  if (hwloc_topology_set_synthetic(raw, desc.c_str()) != 0) {
    return absl::InvalidArgumentError("synthetic topology '" + desc +
                                      "' is not valid hwloc synthetic syntax (e.g. "
                                      "'numa:2 core:2 pu:1')");
  }
  if (hwloc_topology_load(raw) != 0) {
    return absl::InvalidArgumentError("synthetic topology '" + desc + "' could not be loaded");
  }
  Topology t;
  t.synthetic_ = true;
  if (absl::Status s = Build(raw, true, &t.nodes_, &t.node_of_cpu_); !s.ok()) return s;
  return t;
}

std::string Topology::Describe() const {
  std::string s = std::to_string(nodes_.size()) + (nodes_.size() == 1 ? " node" : " nodes");
  if (synthetic_) s += " (synthetic)";
  if (nodes_.size() == 1) s += ": not NUMA, one arena";
  for (const NumaNode& n : nodes_) {
    s += "; node " + std::to_string(n.index) + ": " + std::to_string(n.cpus.size()) + " cpus";
  }
  return s;
}

int Topology::NodeOfCpu(int cpu) const {
  if (cpu < 0 || static_cast<std::size_t>(cpu) >= node_of_cpu_.size()) return -1;
  return node_of_cpu_[static_cast<std::size_t>(cpu)];
}

int Topology::CurrentNode() const {
  const int node = NodeOfCpu(sched_getcpu());
  return node < 0 ? 0 : node;
}

}  // namespace inferq
