# Builds TARGET in the build tree BUILD_DIR and passes when the build fails with
# output matching EXPECTED_OUTPUT (a regular expression): the failure must be the one
# the test means, not any other. cmake -DBUILD_DIR=... -DTARGET=... -DEXPECTED_OUTPUT=... -P
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "exit ${rc}\n${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "building '${TARGET}' succeeded; it must fail")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECTED_OUTPUT}")
  message(FATAL_ERROR "building '${TARGET}' failed, but its output does not match "
                      "'${EXPECTED_OUTPUT}'")
endif()
