# The main example's durable replay: a first run with --state-dir in a fresh
# temporary directory SIGKILLs itself with --crash-at in the middle of the trace (it
# must die by SIGKILL, before any summary); a second run with the same options
# without --crash-at continues it, and its --json summary covers the whole replay:
# every request completed, none lost, the requests stored and completed before the
# crash counted in. The temporary directory is removed whether the checks pass or
# fail. Usage: cmake -DEXE=... -P crash_resume.cmake
set(limit 500)
set(crash_at 60)
execute_process(COMMAND mktemp -d -t inferq_crash_resume.XXXXXX OUTPUT_VARIABLE dir
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
# At --speed 50 the 500 requests span 2:09 of trace: about 3 s of wall time each
# run takes at least. A long ack wait: a loaded machine that falls behind must not
# redeliver to replicas that are alive.
set(args --limit ${limit} --speed 50 --ack-wait-ms 600000 --state-dir "${dir}/state")

execute_process(COMMAND "${EXE}" ${args} --crash-at ${crash_at} --json "${dir}/first.json"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "first run (--crash-at ${crash_at}): ${rc}\n${err}")
# execute_process names a child ended by SIGKILL "Subprocess killed" (SIGTERM,
# SIGSEGV, SIGABRT have names of their own).
if(NOT rc STREQUAL "Subprocess killed")
  fail("the first run was not killed by SIGKILL: ${rc}\n${out}${err}")
endif()
if(NOT err MATCHES "--crash-at ${crash_at}: SIGKILL at trace 1:00 \\(")
  fail("the first run did not say it crashed at trace 1:00:\n${err}")
endif()
if(EXISTS "${dir}/first.json" OR out MATCHES "requests ")
  fail("the first run wrote a summary before it was killed:\n${out}")
endif()

execute_process(COMMAND "${EXE}" ${args} --json "${dir}/second.json"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET)
message(STATUS "second run: exit ${rc}\n${out}")
if(NOT rc EQUAL 0)
  fail("the second run exited with ${rc}")
endif()
foreach(re "requests   ${limit} total, ${limit} completed"
           "[0-9]+ total, [0-9]+ delivered, 0 lost, [0-9]+ duplicated, 0 out of order"
           "durable    state dir '[^']*/state' \\(file streams, fdatasync every 1 s\\): resumed at trace "
           "[0-9]+ duplicate tokens dropped by the client's reorder buffer: 0 stored before this run, [0-9]+ of steps redone after the restart, 0 within this run")
  if(NOT out MATCHES "${re}")
    fail("the second run's summary lacks '${re}'")
  endif()
endforeach()
file(READ "${dir}/second.json" json)
# Each key with the value it must have, or the range it must lie in (lo..hi).
foreach(check "requests_total=${limit}" "requests_completed=${limit}" "tokens_lost=0"
              "tokens_out_of_order=0" "durable.resumed=ON" "durable.duplicates_in_run=0"
              # The crash came in the middle: some requests, not all, were stored and
              # completed before it.
              "durable.requests_stored_before=1..${limit}"
              "durable.requests_completed_before=1..${limit}")
  string(REGEX MATCH "^([^=]+)=(.*)$" _ "${check}")
  set(path "${CMAKE_MATCH_1}")
  set(want "${CMAKE_MATCH_2}")
  string(REPLACE "." ";" keys "${path}")
  string(JSON got ERROR_VARIABLE jerr GET "${json}" ${keys})
  if(jerr)
    fail("the second run's --json lacks ${path}: ${jerr}\n${json}")
  endif()
  if(want MATCHES "^([0-9]+)\\.\\.([0-9]+)$")
    if(got LESS CMAKE_MATCH_1 OR NOT got LESS CMAKE_MATCH_2)
      fail("${path} is ${got}, not in [${CMAKE_MATCH_1}, ${CMAKE_MATCH_2})\n${json}")
    endif()
  elseif(NOT got STREQUAL want)
    fail("${path} is ${got}, not ${want}\n${json}")
  endif()
endforeach()
string(JSON dropped GET "${json}" duplicate_tokens_dropped)
string(JSON duplicates GET "${json}" duplicates)
if(NOT dropped EQUAL duplicates)
  fail("duplicate_tokens_dropped ${dropped} differs from duplicates ${duplicates}")
endif()
file(REMOVE_RECURSE "${dir}")
