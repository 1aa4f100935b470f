// The layering check: reads the #include lines of every file under
// include/inferq/<layer>/ and src/<layer>/ and reports each include that reaches a
// higher layer, another layer's internal/ headers or src/ files, or a folder that is
// not a layer. The build catches most of these first (a layer target sees only the
// headers of the layers it links: cmake/InferqLayers.cmake); this check also sees
// relative includes and internal/ headers, which the include path cannot hide.
//
// What counts as an include: a `#include "..."` or `#include <...>` directive outside
// comments and string literals (a raw string literal that spans lines is read as
// code; no checked file has one). What it reaches:
//   "inferq/<layer>/..." or <inferq/<layer>/...>  that layer (internal/ when a path
//                                                  component is `internal`);
//   "inferq/wire/..."                              the event layer's generated
//                                                  TensorEvent code (private to it);
//   "inferq/version.hpp"                           nothing (allowed everywhere);
//   "inferq/inferq.hpp"                            every layer (allowed nowhere);
//   "..." that exists relative to the including file: the layer whose folder holds it
//                                                  (src/<layer>/ files are private);
//   anything else                                  a third-party or system header.
//
// Thread safety: CheckTree only reads files; calls share nothing.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace inferq_layering {

struct Violation {
  std::string file;     // relative to the root, '/'-separated
  int line = 0;         // 1-based; 0 for a folder
  std::string include;  // as written, with its quotes or angle brackets; empty for a folder
  std::string reason;
};

// "src/schema/registry.cpp:14: #include "inferq/state/state_store.hpp": <reason>".
std::string Format(const Violation& v);

// Checks the tree at `root` (a folder holding include/inferq/ and src/) against
// `layers`, listed from the bottom up: a layer may include the layers before it. The
// violations are sorted by file and line.
std::vector<Violation> CheckTree(const std::filesystem::path& root,
                                 const std::vector<std::string>& layers);

}  // namespace inferq_layering
