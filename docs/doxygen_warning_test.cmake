# cmake -DDOXYGEN=<doxygen> -DDOXYFILE=<build>/docs/Doxyfile -DDIR=<scratch dir> -P this
# (ctest docs.doxygen_fails_on_warnings): the docs target's Doxygen settings fail on
# a warning. A header with an undocumented function must make Doxygen exit non-zero
# and name the function; the same header with the function documented must pass, so
# that the failure is the warning's and not a broken setup's.
foreach(v DOXYGEN DOXYFILE DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "doxygen_warning_test.cmake needs -D${v}=...")
  endif()
endforeach()

# Runs Doxygen with DOXYFILE's settings over a header holding `body`; sets rc and log.
function(run_doxygen body)
  file(REMOVE_RECURSE "${DIR}")
  file(WRITE "${DIR}/headers/fixture/fixture.hpp"
       "/// @file fixture/fixture.hpp\n/// The fixture of docs.doxygen_fails_on_warnings.\n"
       "#pragma once\n\nnamespace fixture {\n\n/// Documented.\nint Documented();\n${body}\n}  // namespace fixture\n")
  file(WRITE "${DIR}/Doxyfile"
       "@INCLUDE = ${DOXYFILE}\n"
       "INPUT = ${DIR}/headers/fixture\n"
       "USE_MDFILE_AS_MAINPAGE =\n"
       "OUTPUT_DIRECTORY = ${DIR}/out\n"
       "STRIP_FROM_PATH = ${DIR}/headers\n"
       "STRIP_FROM_INC_PATH = ${DIR}/headers\n")
  execute_process(COMMAND "${DOXYGEN}" Doxyfile WORKING_DIRECTORY "${DIR}"
                  RESULT_VARIABLE r OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(rc "${r}" PARENT_SCOPE)
  set(log "${out}${err}" PARENT_SCOPE)
endfunction()

run_doxygen("int Undocumented();")
if(rc EQUAL 0)
  message(FATAL_ERROR "Doxygen exited 0 over an undocumented function: the docs target would "
                      "not fail on warnings (is INFERQ_DOCS_WARN_AS_ERROR NO?). Its output:\n${log}")
endif()
# (FAIL_ON_WARNINGS reports warnings as "error:", plain settings as "warning:".)
if(NOT log MATCHES "fixture\\.hpp:[0-9]+: (warning|error): Member Undocumented\\(\\) [^\n]* is not documented")
  message(FATAL_ERROR "Doxygen failed (exit ${rc}) without naming the undocumented function:\n${log}")
endif()

run_doxygen("/// Documented too.\nint Undocumented();")
if(NOT rc EQUAL 0 OR log MATCHES "(warning|error):")
  message(FATAL_ERROR "Doxygen failed (exit ${rc}) over a fully documented header:\n${log}")
endif()
message(STATUS "Doxygen fails on an undocumented function and passes once it is documented")
