#include "inferq/memory/topology.hpp"

#include <set>
#include <string>

#include <catch2/catch.hpp>

#include "inferq/memory/numa_arena.hpp"

using inferq::Topology;

TEST_CASE("synthetic two-node topology: nodes, cpus and placement") {
  auto t = Topology::Synthetic("numa:2 core:2 pu:1");
  REQUIRE(t.ok());
  CHECK(t->synthetic());
  REQUIRE(t->node_count() == 2);
  CHECK(t->nodes()[0].cpus == std::vector<int>{0, 1});
  CHECK(t->nodes()[1].cpus == std::vector<int>{2, 3});
  CHECK(t->NodeOfCpu(0) == 0);
  CHECK(t->NodeOfCpu(3) == 1);
  CHECK(t->NodeOfCpu(4) == -1);
  CHECK(t->NodeOfCpu(-1) == -1);
  const int current = t->CurrentNode();
  CHECK((current == 0 || current == 1));
  CHECK(t->Describe() == "2 nodes (synthetic); node 0: 2 cpus; node 1: 2 cpus");
}

TEST_CASE("synthetic four-node topology") {
  auto t = Topology::Synthetic("numa:4 core:1 pu:2");
  REQUIRE(t.ok());
  REQUIRE(t->node_count() == 4);
  CHECK(t->NodeOfCpu(7) == 3);
  CHECK(t->nodes()[2].cpus == std::vector<int>{4, 5});
}

TEST_CASE("a bad synthetic description is an error naming it") {
  auto t = Topology::Synthetic("numa:zero");
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(t.status().message()).rfind("synthetic topology 'numa:zero' is not valid", 0) == 0);
}

TEST_CASE("the real machine: every cpu in one node, current node valid") {
  auto t = Topology::Detect();
  REQUIRE(t.ok());
  REQUIRE(t->node_count() >= 1);
  std::set<int> cpus;
  for (const auto& n : t->nodes()) {
    for (int c : n.cpus) CHECK(cpus.insert(c).second);
  }
  CHECK(t->CurrentNode() >= 0);
  CHECK(t->CurrentNode() < static_cast<int>(t->node_count()));
  if (t->node_count() == 1) {
    CHECK(t->Describe().find("not NUMA, one arena") != std::string::npos);
  }
}

TEST_CASE("arena: one-node fallback is stated, allocation works, bad input named") {
  auto t = Topology::Detect();
  REQUIRE(t.ok());
  auto arena = inferq::NumaArena::Create(*t, 0, 1);
  if (arena.status().code() == absl::StatusCode::kUnimplemented) {  // built without mimalloc
    CHECK(std::string(arena.status().message()) ==
          "NumaArena needs mimalloc: inferq was built with INFERQ_WITH_MIMALLOC=OFF");
    return;
  }
  REQUIRE(arena.ok());
  const auto s = (*arena)->Stats();
  CHECK(s.bytes_reserved == 32u << 20);  // rounded up to mimalloc's 32 MiB unit
  if (t->node_count() == 1) {
    CHECK_FALSE(s.bound);
    CHECK(s.binding == "one node: not bound");
  }
  void* p = (*arena)->Allocate(1000);
  REQUIRE(p != nullptr);
  void* q = (*arena)->Allocate(5000, 4096);
  REQUIRE(q != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(q) % 4096 == 0);
  inferq::NumaArena::Free(p);
  inferq::NumaArena::Free(q);

  auto bad = inferq::NumaArena::Create(*t, 5, 1 << 20);
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).rfind("NUMA node index 5 is outside 0..", 0) == 0);
  auto synth = Topology::Synthetic("numa:2 core:1 pu:1");
  REQUIRE(synth.ok());
  auto on_synth = inferq::NumaArena::Create(*synth, 1, 1 << 20);
  REQUIRE(on_synth.ok());
  CHECK((*on_synth)->Stats().binding == "synthetic topology: not bound");
  CHECK((*on_synth)->node() == 1);
}
