# Runs EXE with ARGS ('|'-separated) and checks its exit status (EXPECTED_EXIT) and that
# its stdout+stderr match EXPECTED_OUTPUT (a regular expression).
string(REPLACE "|" ";" args "${ARGS}")
execute_process(COMMAND "${EXE}" ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "exit ${rc}\n${out}${err}")
if(NOT rc STREQUAL EXPECTED_EXIT)
  message(FATAL_ERROR "expected exit ${EXPECTED_EXIT}, got ${rc}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECTED_OUTPUT}")
  message(FATAL_ERROR "output does not match '${EXPECTED_OUTPUT}'")
endif()
