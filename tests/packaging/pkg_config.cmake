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
# No Windows macro in a consumer's flags: Abseil's .pc files carry -DNOMINMAX, and
# inferq.pc passed it on through Requires: before it read Abseil's flags itself.
execute_process(COMMAND pkg-config --cflags inferq
                OUTPUT_VARIABLE cflags RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0 OR cflags MATCHES "NOMINMAX")
  message(FATAL_ERROR "pkg-config --cflags inferq gives '${cflags}' (exit ${rc}): it must not hold -DNOMINMAX")
endif()
message(STATUS "pkg-config --cflags inferq: ${cflags}")
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
# A .pc symlinked elsewhere (as a distribution's pkgconfig directory would hold it)
# still names the install's own directories: was ${pcfiledir}-relative, which resolved
# from the link's directory.
get_filename_component(out_dir "${OUT}" DIRECTORY)
set(link_dir "${out_dir}/pc-link")
file(REMOVE_RECURSE "${link_dir}")
file(MAKE_DIRECTORY "${link_dir}")
file(CREATE_LINK "${pc}" "${link_dir}/inferq.pc" SYMBOLIC)
set(ENV{PKG_CONFIG_PATH} "${link_dir}")
execute_process(COMMAND pkg-config --variable=includedir inferq
                OUTPUT_VARIABLE includedir RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
get_filename_component(real_prefix "${PREFIX}" REALPATH)
if(NOT rc EQUAL 0 OR NOT (includedir STREQUAL "${PREFIX}/include" OR includedir STREQUAL "${real_prefix}/include"))
  message(FATAL_ERROR "through a symlink, inferq's includedir is '${includedir}', not '${PREFIX}/include'")
endif()
message(STATUS "through a symlink: includedir ${includedir}")
