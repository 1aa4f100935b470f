// inferq's layers as the #include lines show them: the source tree has no
// include of a higher layer, of another layer's internal/ headers or src/ files; and
// the check finds each kind of violation in a small tree written for the purpose.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

#include <catch2/catch.hpp>

#include "layering_check.hpp"

namespace {

namespace fs = std::filesystem;
using inferq_layering::CheckTree;
using inferq_layering::Format;
using inferq_layering::Violation;

// INFERQ_ALL_LAYERS of cmake/InferqLayers.cmake (the library's layers, then adapters), from
// the bottom up, as "base,memory,...".
std::vector<std::string> Layers() {
  std::vector<std::string> out;
  std::string list = INFERQ_LAYERS;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    out.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

std::vector<std::string> Formatted(const std::vector<Violation>& violations) {
  std::vector<std::string> out;
  for (const Violation& v : violations) out.push_back(Format(v));
  return out;
}

// A tree of files under the temporary directory, removed at the end of the test.
class Tree {
 public:
  Tree() {
    static std::atomic<int> counter{0};
    root_ = fs::temp_directory_path() /
            ("inferq_layering_test_" + std::to_string(getpid()) + "_" +
             std::to_string(counter++));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  ~Tree() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  Tree(const Tree&) = delete;
  Tree& operator=(const Tree&) = delete;

  Tree& Write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return *this;
  }
  std::vector<std::string> Check() const { return Formatted(CheckTree(root_, Layers())); }

 private:
  fs::path root_;
};

TEST_CASE("the layer order is the documented one", "[layering]") {
  CHECK(Layers() == std::vector<std::string>{"base", "memory", "ring", "event", "schema",
                                             "routing", "sched", "state", "engine", "adapters"});
}

TEST_CASE("no file of include/inferq/<layer>/ or src/<layer>/ breaks the layers",
          "[layering]") {
  const std::vector<std::string> violations =
      Formatted(CheckTree(INFERQ_SOURCE_DIR, Layers()));
  for (const std::string& v : violations) UNSCOPED_INFO(v);
  CHECK(violations.empty());
}

TEST_CASE("an include of a higher layer is named with file, line and include",
          "[layering]") {
  Tree tree;
  tree.Write("include/inferq/state/state_store.hpp", "#pragma once\n")
      .Write("src/schema/registry.cpp",
             "#include \"inferq/schema/registry.hpp\"\n"
             "\n"
             "#include \"inferq/state/state_store.hpp\"\n");
  CHECK(tree.Check() ==
        std::vector<std::string>{
            "src/schema/registry.cpp:3: #include \"inferq/state/state_store.hpp\": layer schema "
            "may not include layer state (a higher layer; schema may use base, memory, ring, "
            "event)"});
}

TEST_CASE("a public header's include of a higher layer, with angle brackets or spaces",
          "[layering]") {
  Tree tree;
  tree.Write("include/inferq/sched/batcher.hpp",
             "#pragma once\n"
             "#include <inferq/engine/engine.hpp>\n"
             "  #  include   \"inferq/routing/subject.hpp\"\n");
  CHECK(tree.Check() ==
        std::vector<std::string>{
            "include/inferq/sched/batcher.hpp:2: #include <inferq/engine/engine.hpp>: layer sched "
            "may not include layer engine (a higher layer; sched may use base, memory, ring, "
            "event, schema, routing)"});
}

TEST_CASE("the lowest layer may include no other layer", "[layering]") {
  Tree tree;
  tree.Write("include/inferq/base/clock.hpp", "#include \"inferq/memory/buffer.hpp\"\n");
  CHECK(tree.Check() ==
        std::vector<std::string>{"include/inferq/base/clock.hpp:1: #include "
                                 "\"inferq/memory/buffer.hpp\": layer base may not include "
                                 "layer memory (a higher layer; base may use no other layer)"});
}

TEST_CASE("another layer's internal/ header is refused, the layer's own is not",
          "[layering]") {
  Tree tree;
  tree.Write("include/inferq/ring/internal/event_count.hpp", "#pragma once\n")
      .Write("include/inferq/ring/mpmc_ring.hpp",
             "#include \"inferq/ring/internal/event_count.hpp\"\n"
             "#include \"internal/event_count.hpp\"\n")
      .Write("src/engine/lane_queue.hpp",
             "#include \"inferq/ring/mpmc_ring.hpp\"\n"
             "#include \"inferq/ring/internal/event_count.hpp\"\n");
  CHECK(tree.Check() ==
        std::vector<std::string>{
            "src/engine/lane_queue.hpp:2: #include \"inferq/ring/internal/event_count.hpp\": "
            "layer ring's internal/ headers are for layer ring only"});
}

TEST_CASE("a relative include is judged by the folder it resolves to", "[layering]") {
  Tree tree;
  tree.Write("src/state/log_format.hpp", "#pragma once\n")
      .Write("include/inferq/state/state_store.hpp", "#pragma once\n")
      .Write("include/inferq/memory/buffer.hpp", "#pragma once\n")
      .Write("tests/util.hpp", "#pragma once\n")
      .Write("src/state/recovery.cpp", "#include \"log_format.hpp\"\n")  // its own: fine
      .Write("src/engine/engine.cpp",
             "#include \"../state/log_format.hpp\"\n"
             "#include \"../../include/inferq/state/state_store.hpp\"\n"
             "#include \"../../tests/util.hpp\"\n")
      .Write("src/event/codec.cpp",
             "#include \"../../include/inferq/memory/buffer.hpp\"\n"  // lower: fine
             "#include \"../state/log_format.hpp\"\n");
  CHECK(tree.Check() ==
        std::vector<std::string>{
            "src/engine/engine.cpp:1: #include \"../state/log_format.hpp\": the file is private "
            "to layer state (src/ or generated)",
            "src/engine/engine.cpp:3: #include \"../../tests/util.hpp\": it resolves to "
            "tests/util.hpp, outside include/inferq/<layer>/ and src/<layer>/",
            "src/event/codec.cpp:2: #include \"../state/log_format.hpp\": layer event may not "
            "include layer state (a higher layer; event may use base, memory, ring)"});
}

TEST_CASE("a public header may not include its layer's src/ files", "[layering]") {
  Tree tree;
  tree.Write("src/state/log_format.hpp", "#pragma once\n")
      .Write("include/inferq/state/state_store.hpp",
             "#include \"../../../src/state/log_format.hpp\"\n");
  CHECK(tree.Check() ==
        std::vector<std::string>{
            "include/inferq/state/state_store.hpp:1: #include "
            "\"../../../src/state/log_format.hpp\": a public header may not include a private "
            "file (src/ or generated: not installed)"});
}

TEST_CASE("the generated TensorEvent header is the event layer's alone", "[layering]") {
  Tree tree;
  tree.Write("src/event/tensor_event.cpp", "#include \"inferq/wire/tensor_event_generated.h\"\n")
      .Write("src/schema/record.cpp", "#include \"inferq/wire/tensor_event_generated.h\"\n");
  CHECK(tree.Check() ==
        std::vector<std::string>{
            "src/schema/record.cpp:1: #include \"inferq/wire/tensor_event_generated.h\": the "
            "file is private to layer event (src/ or generated)"});
}

TEST_CASE("the umbrella header and unknown layers are refused", "[layering]") {
  Tree tree;
  tree.Write("include/inferq/inferq.hpp", "#include \"inferq/engine/engine.hpp\"\n")
      .Write("include/inferq/plugins/nats.hpp", "#pragma once\n")
      .Write("src/engine/engine.cpp",
             "#include \"inferq/inferq.hpp\"\n"
             "#include \"inferq/version.hpp\"\n"
             "#include \"inferq/plugins/nats.hpp\"\n")
      .Write("src/main.cpp", "int main() {}\n");
  CHECK(tree.Check() ==
        std::vector<std::string>{
            "include/inferq/plugins: the folder is not a layer (the layers: base, memory, ring, "
            "event, schema, routing, sched, state, engine, adapters)",
            "src/engine/engine.cpp:1: #include \"inferq/inferq.hpp\": the umbrella header "
            "includes every layer; layer engine includes the headers it uses",
            "src/engine/engine.cpp:3: #include \"inferq/plugins/nats.hpp\": inferq/plugins is "
            "not a layer (the layers: base, memory, ring, event, schema, routing, sched, state, "
            "engine, adapters)",
            "src/main.cpp: a file of src/ outside every layer folder"});
}

TEST_CASE("includes in comments and string literals are not includes", "[layering]") {
  Tree tree;
  tree.Write("src/schema/registry.cpp",
             "// #include \"inferq/state/a.hpp\"\n"
             "/* a block\n"
             "#include \"inferq/state/b.hpp\"\n"
             "*/\n"
             "const char* s = \"/*\"; const int n = 65'000;\n"
             "#include \"inferq/state/c.hpp\"  // after a string holding /*: read\n"
             "x = \"#include \\\"inferq/state/d.hpp\\\"\";\n"
             "/* one line */ #include \"inferq/state/e.hpp\"\n");
  CHECK(tree.Check() ==
        std::vector<std::string>{
            "src/schema/registry.cpp:6: #include \"inferq/state/c.hpp\": layer schema may not "
            "include layer state (a higher layer; schema may use base, memory, ring, event)",
            "src/schema/registry.cpp:8: #include \"inferq/state/e.hpp\": layer schema may not "
            "include layer state (a higher layer; schema may use base, memory, ring, event)"});
}

// Of libinferq: the adapters' headers (include/inferq/adapters/) belong to optional
// components with libraries of their own (inferq::nats) and are left out of it.
TEST_CASE("the umbrella header includes every public header", "[layering]") {
  const fs::path include = fs::path(INFERQ_SOURCE_DIR) / "include";
  std::ifstream in(include / "inferq" / "inferq.hpp");
  REQUIRE(in);
  std::string umbrella((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> missing;
  std::size_t headers = 0;
  for (const auto& entry : fs::recursive_directory_iterator(include / "inferq")) {
    const std::string rel = fs::relative(entry.path(), include).generic_string();
    if (!entry.is_regular_file() || entry.path().extension() != ".hpp" ||
        rel == "inferq/inferq.hpp" || rel.find("/internal/") != std::string::npos ||
        rel.rfind("inferq/adapters/", 0) == 0) {
      continue;
    }
    ++headers;
    if (umbrella.find("#include \"" + rel + "\"") == std::string::npos) missing.push_back(rel);
  }
  for (const std::string& m : missing) UNSCOPED_INFO("inferq.hpp lacks " << m);
  CHECK(headers >= 37);  // not vacuous: 37 public headers when this test was written
  CHECK(missing.empty());
}

TEST_CASE("includes of lower layers and third-party headers pass", "[layering]") {
  Tree tree;
  tree.Write("include/inferq/event/event.hpp",
             "#include <string>\n#include \"absl/time/time.h\"\n"
             "#include \"inferq/memory/buffer.hpp\"\n#include \"inferq/base/clock.hpp\"\n")
      .Write("src/engine/engine.cpp",
             "#include \"inferq/state/state_store.hpp\"\n#include \"inferq/event/event.hpp\"\n");
  CHECK(tree.Check().empty());
}

}  // namespace
