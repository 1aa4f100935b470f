# Runs inference_server with QoS tiers under overload and checks its summary: exit
# status 0 (every token delivered once and in order), one line per tier whose
# request counts add up to the total, the batch-size and delivery lines, and the
# per-tier objects in the JSON summary.
# Usage: cmake -DEXE=... -DOUT=... -P check_qos_summary.cmake
execute_process(
  COMMAND "${EXE}" --limit 300 --speed 0 --overload 2 --tier-mix 30:30:40 --tenants 4
          --json "${OUT}.json"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "inference_server --overload 2 exited with ${rc}:\n${out}")
endif()
foreach(re
    "requests   300 total, 300 completed"
    "tokens     [0-9]+ total, [0-9]+ delivered, 0 lost, 0 duplicated, 0 out of order"
    "tier mix 30:30:40 over 4 tenants, arrivals x2"
    "batches    [0-9]+ pulls \\(adaptive batcher\\), by size: 1:"
    "delivery   0 redelivered, 0 dead letters")
  if(NOT out MATCHES "${re}")
    message(FATAL_ERROR "summary lacks '${re}':\n${out}")
  endif()
endforeach()
set(sum 0)
foreach(tier gold silver bronze)
  if(NOT out MATCHES "  ${tier} +([0-9]+) +[0-9]+ ms +[0-9.]+%")
    message(FATAL_ERROR "summary lacks the ${tier} line:\n${out}")
  endif()
  math(EXPR sum "${sum} + ${CMAKE_MATCH_1}")
endforeach()
if(NOT sum EQUAL 300)
  message(FATAL_ERROR "the tiers' requests add up to ${sum}, not 300:\n${out}")
endif()
file(READ "${OUT}.json" json)
foreach(key tier_gold tier_silver tier_bronze batches_by_size dead_letters)
  string(JSON v ERROR_VARIABLE err GET "${json}" ${key})
  if(err)
    message(FATAL_ERROR "JSON summary lacks ${key}: ${err}\n${json}")
  endif()
endforeach()
message(STATUS "${out}")
