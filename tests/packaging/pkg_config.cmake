# Builds consumer.cpp against an installed inferq with nothing but pkg-config and the
# compiler, as a project without CMake would, and runs it.
#   cmake -DPREFIX=<install prefix> -DCXX=<compiler> -DSOURCE=<consumer.cpp>
#         -DOUT=<executable> -DJSON_SCHEMA=<0|1> -P pkg_config.cmake
file(GLOB pc_files "${PREFIX}/lib*/pkgconfig/inferq.pc" "${PREFIX}/lib/*/pkgconfig/inferq.pc")
if(NOT pc_files)
  message(FATAL_ERROR "no inferq.pc under ${PREFIX}")
endif()
list(GET pc_files 0 pc)
get_filename_component(pc_dir "${pc}" DIRECTORY)
message(STATUS "pkg-config file: ${pc}")
set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
execute_process(COMMAND pkg-config --cflags --libs inferq
                OUTPUT_VARIABLE flags RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs inferq failed (${rc})")
endif()
message(STATUS "pkg-config --cflags --libs inferq: ${flags}")
separate_arguments(flags UNIX_COMMAND "${flags}")
execute_process(COMMAND "${CXX}" -std=c++20 -DCONSUMER_EXPECTS_JSON_SCHEMA=${JSON_SCHEMA}
                        "${SOURCE}" ${flags} -o "${OUT}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "compiling ${SOURCE} with the flags of pkg-config failed")
endif()
execute_process(COMMAND "${OUT}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${OUT} exited with ${rc}")
endif()
