# check_citations must find a citation of a file that does not exist: a tree with a
# README.md citing a missing source file and a page under docs linking to a missing b.md.
# (The names are built from variables, so that this file cites nothing itself.)
#   cmake -DEXE=<check_citations> -DDIR=<scratch dir> -P missing_citation.cmake
set(s "src")
set(d "docs")
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}/${s}" "${DIR}/${d}")
file(WRITE "${DIR}/${s}/here.cpp" "// see ${s}/here.cpp and ${d}/a.md\n")
file(WRITE "${DIR}/README.md" "Cites `${s}/here.cpp` and `${s}/missing.cpp`.\n")
file(WRITE "${DIR}/${d}/a.md" "See [b](b.md) and [README](../README.md).\n")
execute_process(COMMAND "${EXE}" "${DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "exit ${rc}\n${out}")
set(expected "README.md:1: cites '${s}/missing.cpp', which the repository lacks\n"
             "${d}/a.md:1: cites 'b.md', which the repository lacks\n")
string(JOIN "" expected ${expected})
if(NOT rc EQUAL 1 OR NOT out MATCHES "^${expected}[0-9]+ citations in 3 files checked, 2 missing\n$")
  message(FATAL_ERROR "check_citations missed the missing files (exit ${rc})")
endif()
