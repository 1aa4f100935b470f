# check_docs must find each broken rule in a small tree: a README one line too long
# that names an issue and a commit, a guide linking to a missing page and a missing
# anchor, a header naming an issue, a changelog behind the project's version and a
# find_package of another version. (Issue words and hex ids are built from variables,
# so that this file breaks no rule itself.)
#   cmake -DEXE=<check_docs> -DDIR=<scratch dir> -P broken_docs.cmake
set(iss "issue")
set(g "docs/guide")
set(inc "include/inferq")
set(sha "7c2bf")
string(APPEND sha "b0")
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}/${g}" "${DIR}/${inc}")
set(readme "# R\n\nSee [the guide](${g}/a.md#options), measured at ${sha} (${iss} 15).\n")
foreach(i RANGE 1 298)
  string(APPEND readme "line\n")
endforeach()
file(WRITE "${DIR}/README.md" "${readme}")  # 301 lines
file(WRITE "${DIR}/${g}/a.md"
     "# A\n\n## Options\n\n[b](b.md) [top](#a) [none](#nothing) [readme](../../README.md#r)\n"
     "```cmake\nfind_package(inferq 0.1 CONFIG REQUIRED)\nfind_package(inferq CONFIG REQUIRED)\n```\n")
file(WRITE "${DIR}/${inc}/x.hpp" "// as ${iss} 12 asked\n")
file(WRITE "${DIR}/CHANGELOG.md" "# Changelog\n\n## [Unreleased]\n\n## [0.1.0] - 2026-11-30\n")
execute_process(COMMAND "${EXE}" "${DIR}" 0.2.0 RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "exit ${rc}\n${out}")
set(expected
  "CHANGELOG.md:5: the newest release is '0.1.0' but the project's version \\(CMakeLists.txt\\) is 0.2.0\n"
  "README.md:301: the README has 301 lines, over 300: move the material to a guide in docs/guide/\n"
  "README.md:3: names an ${iss} \\('${iss} 15'\\): say what the change is, not its ${iss}\n"
  "README.md:3: names commit '${sha}': a figure's commit belongs in BENCHMARKS.md\n"
  "${g}/a.md:5: links to 'b.md': no file '${g}/b.md'\n"
  "${g}/a.md:5: links to '#nothing': '${g}/a.md' has no heading with anchor 'nothing'\n"
  "${g}/a.md:7: shows 'find_package\\(inferq 0.1' but the project's version is 0.2.0\n"
  "${inc}/x.hpp:1: names an ${iss} \\('${iss} 12'\\): say what the change is, not its ${iss}\n"
  "3 Markdown files, 5 relative links checked, 8 findings\n")
string(JOIN "" expected ${expected})
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "check_docs exited ${rc}, expected 1")
endif()
# The findings in any order; the count line last.
string(REPLACE "\n" ";" want_lines "${expected}")
foreach(l IN LISTS want_lines)
  if(l AND NOT out MATCHES "${l}")
    message(FATAL_ERROR "check_docs did not report: ${l}")
  endif()
endforeach()
string(REGEX MATCHALL "\n" nl "${out}")
list(LENGTH nl n)
if(NOT n EQUAL 9)
  message(FATAL_ERROR "check_docs printed ${n} lines, expected 9")
endif()
