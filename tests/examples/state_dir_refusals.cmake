# What a second run over a --state-dir refuses (exit 2, the exact message), after a
# first run of 20 requests filled it. MODE: trace (--limit 30: other requests),
# option (--replicas 2), crash_at (--crash-at 1, before the trace time the replay
# would resume at). The temporary directory is removed whether the check passes or
# fails. Usage: cmake -DEXE=... -DMODE=... -P state_dir_refusals.cmake
execute_process(COMMAND mktemp -d -t inferq_state_dir.XXXXXX OUTPUT_VARIABLE dir
                OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mktemp -d failed: ${rc}")
endif()
# A function, not a macro: a macro would expand the message's backslashes (a
# pattern's \.) as CMake escapes.
function(fail msg)
  file(REMOVE_RECURSE "${dir}")
  message(FATAL_ERROR "${msg}")
endfunction()
execute_process(COMMAND "${EXE}" --limit 20 --speed 0 --state-dir "${dir}/s"
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(NOT rc EQUAL 0)
  fail("the first run exited with ${rc}")
endif()
set(resumes "\\(a replay resumes with the settings of its first run; only --speed, --json, --crash-at and --kill-replica may change\\)")
if(MODE STREQUAL "trace")
  set(args --limit 30 --speed 0)
  set(expected "^inference_server: --state-dir '[^']*/s' holds a replay run with trace 20 requests, fingerprint [0-9a-f]+; this run has trace 30 requests, fingerprint [0-9a-f]+ ${resumes}\n$")
elseif(MODE STREQUAL "option")
  set(args --limit 20 --speed 0 --replicas 2)
  set(expected "^inference_server: --state-dir '[^']*/s' holds a replay run with --replicas 4; this run has --replicas 2 ${resumes}\n$")
elseif(MODE STREQUAL "crash_at")
  set(args --limit 20 --speed 100 --crash-at 1)
  set(expected "^inference_server: --crash-at '1' is not after trace second [0-9]+\\.[0-9][0-9][0-9], where the replay in --state-dir '[^']*/s' resumes\n$")
else()
  fail("unknown MODE '${MODE}'")
endif()
execute_process(COMMAND "${EXE}" ${args} --state-dir "${dir}/s"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "exit ${rc}\n${out}${err}")
if(NOT rc STREQUAL "2")
  fail("expected exit 2, got ${rc}")
endif()
# hwloc's own lines (a root without /sys: "[hwloc/linux] failed to find sysfs cpu
# topology directory ...") are not the program's output: dropped before the match.
string(REGEX REPLACE "(^|\n)\\[hwloc[^\n]*\n" "\\1" err "${err}")
if(NOT "${out}${err}" MATCHES "${expected}")
  fail("output does not match '${expected}'")
endif()
file(REMOVE_RECURSE "${dir}")
