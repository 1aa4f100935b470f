# Runs inference_server twice on the same requests, once as fast as possible and once
# paced in wall time at --speed 200 (where publisher and replicas keep pace with each
# other, so a replica that did not wait for the publisher would miss requests that
# arrived just before its step), and requires identical trace-time results (TTFT,
# TBT, E2E, counts). Placement is round robin (with seq_id affinity): the default
# topology score reacts to measured wall-clock load, so its placement, and with it
# the trace-time figures, depends on timing. The ack wait, 6,000,000 trace ms (30 s of
# wall time at --speed 200), is far above any step on a loaded machine: a redelivery
# would change the figures (a 600,000 ms wait, 3 s of wall time, left the replicas'
# renewals 1.5 s, which steps at load 15-26 on 2 cores came near).
# Usage: cmake -DEXE=... -DOUT=... -P compare_replays.cmake
foreach(speed 0 200)
  execute_process(
    COMMAND "${EXE}" --limit 400 --speed ${speed} --policy round_robin --ack-wait-ms 6000000 --json "${OUT}-${speed}.json"
    RESULT_VARIABLE rc OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "inference_server --speed ${speed} exited with ${rc}")
  endif()
  file(STRINGS "${OUT}-${speed}.json" lines)
  # Everything except the real-time figures.
  list(FILTER lines EXCLUDE REGEX "engine_latency_us|wall_seconds|batches_by_size")
  set(result_${speed} "${lines}")
endforeach()
if(NOT result_0 STREQUAL result_200)
  message(FATAL_ERROR "trace-time results differ between speeds:\n${result_0}\n---\n${result_200}")
endif()
message(STATUS "identical trace-time results at --speed 0 and --speed 200:\n${result_0}")
