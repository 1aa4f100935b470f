# inferq's layers (base, memory, ring, event, schema, routing, sched, state, engine)
# as build targets (docs/architecture.md, section 1).
#
# INFERQ_LAYERS lists the layers from the bottom up; a layer may use only the layers
# before it in this list. Each layer is a target `inferq_<layer>`: an OBJECT library
# when it has sources under src/<layer>/, an INTERFACE library when it is header-only.
# libinferq (the `inferq` target) is made of the layers' object files; the layer
# targets are internal to this build and never installed or exported.
#
# What makes a forbidden dependency fail to build: a layer's sources do not see
# include/ as a whole. Each layer target publishes only its own headers, through a
# directory of the build tree that holds one symbolic link,
#   <build>/layers/<layer>/inferq/<layer> -> <source>/include/inferq/<layer>,
# so `#include "inferq/state/state_store.hpp"` compiles only in a layer that links
# inferq_state (directly or through a layer that does). inferq_add_layer refuses, at
# configure time, a LAYERS entry that is not below the layer.
# (A copy of inferq's headers in a system include directory, /usr/include/inferq,
# would still be found by such an include; the layering test reports it all the same.)
#
# What the include path cannot stop, the tests of tests/layering/ find: layering_test
# reads the #include lines (a relative include such as "../../state/x.hpp"; another
# layer's internal/ headers, which that layer's public headers include, so they are on
# the path), and check_layer_symbols.sh finds an object of a layer that needs a symbol
# only a higher layer defines (a declaration written by hand, which libinferq's single
# link would otherwise resolve).
set(INFERQ_LAYERS base memory ring event schema routing sched state engine)
# The adapters layer sits on top of libinferq: each of its optional components (the
# NATS bridge) is a library of its own that links libinferq (CMakeLists.txt), so it is
# not in INFERQ_LAYERS; the layering test checks its includes all the same.
set(INFERQ_ALL_LAYERS ${INFERQ_LAYERS} adapters)

# inferq_add_layer(<layer>
#   [SOURCES <file>...]        compiled parts (src/<layer>/...); none: header-only
#   [LAYERS <layer>...]        lower layers it includes (their targets, linked PUBLIC)
#   [PUBLIC_LIBS <target>...]  third-party targets its public headers need
#   [PRIVATE_LIBS <target>...] third-party targets only its sources need
#   [PRIVATE_INCLUDES <dir>...])
# PUBLIC_LIBS and PRIVATE_LIBS are also collected into INFERQ_PUBLIC_LIBS and
# INFERQ_PRIVATE_LIBS (global properties), which libinferq links PUBLIC and PRIVATE.
function(inferq_add_layer layer)
  cmake_parse_arguments(L "" "" "SOURCES;LAYERS;PUBLIC_LIBS;PRIVATE_LIBS;PRIVATE_INCLUDES"
                        ${ARGN})
  if(L_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "inferq_add_layer(${layer}): unknown arguments '${L_UNPARSED_ARGUMENTS}'")
  endif()
  list(FIND INFERQ_LAYERS "${layer}" level)
  if(level EQUAL -1)
    message(FATAL_ERROR "inferq_add_layer: '${layer}' is not a layer of INFERQ_LAYERS "
                        "(${INFERQ_LAYERS}); the layers are listed in INFERQ_LAYERS")
  endif()
  foreach(dep IN LISTS L_LAYERS)
    list(FIND INFERQ_LAYERS "${dep}" dep_level)
    if(dep_level EQUAL -1)
      message(FATAL_ERROR "inferq_add_layer(${layer}): LAYERS entry '${dep}' is not a layer "
                          "of INFERQ_LAYERS (${INFERQ_LAYERS})")
    endif()
    if(NOT dep_level LESS level)
      list(SUBLIST INFERQ_LAYERS 0 ${level} below)
      list(JOIN below ", " below)
      message(FATAL_ERROR "inferq_add_layer(${layer}): layer '${layer}' may not use '${dep}' "
                          "(not below it); it may use: ${below}")
    endif()
    if(NOT TARGET inferq_${dep})
      message(FATAL_ERROR "inferq_add_layer(${layer}): layer '${dep}' must be added first")
    endif()
  endforeach()

  # The layer's own headers, alone in a directory of the build tree.
  set(tree "${PROJECT_BINARY_DIR}/layers/${layer}")
  file(MAKE_DIRECTORY "${tree}/inferq")
  file(CREATE_LINK "${PROJECT_SOURCE_DIR}/include/inferq/${layer}" "${tree}/inferq/${layer}"
       SYMBOLIC)

  set(target inferq_${layer})
  if(L_SOURCES)
    add_library(${target} OBJECT ${L_SOURCES})
    target_include_directories(${target} PUBLIC "${tree}")
    target_link_libraries(${target} PUBLIC ${L_PUBLIC_LIBS} PRIVATE ${L_PRIVATE_LIBS})
    foreach(dep IN LISTS L_LAYERS)
      target_link_libraries(${target} PUBLIC inferq_${dep})
    endforeach()
    target_include_directories(${target} PRIVATE ${L_PRIVATE_INCLUDES})
    target_compile_features(${target} PUBLIC cxx_std_20)
    if(BUILD_SHARED_LIBS)
      # Its objects go into a shared libinferq.
      set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    endif()
    if(PROJECT_IS_TOP_LEVEL AND NOT MSVC)
      target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic)
    endif()
    # Vendored with no build type: the Release flags (CMakeLists.txt).
    target_compile_options(${target} PRIVATE ${INFERQ_DEFAULT_BUILD_FLAGS})
    set_property(GLOBAL APPEND PROPERTY INFERQ_LAYER_OBJECTS "$<TARGET_OBJECTS:${target}>")
  else()
    if(L_PRIVATE_LIBS OR L_PRIVATE_INCLUDES)
      message(FATAL_ERROR "inferq_add_layer(${layer}): a header-only layer has no PRIVATE_*")
    endif()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE "${tree}")
    target_link_libraries(${target} INTERFACE ${L_PUBLIC_LIBS})
    foreach(dep IN LISTS L_LAYERS)
      target_link_libraries(${target} INTERFACE inferq_${dep})
    endforeach()
    target_compile_features(${target} INTERFACE cxx_std_20)
  endif()
  set_property(GLOBAL APPEND PROPERTY INFERQ_PUBLIC_LIBS ${L_PUBLIC_LIBS})
  set_property(GLOBAL APPEND PROPERTY INFERQ_PRIVATE_LIBS ${L_PRIVATE_LIBS})
endfunction()
