# INFERQ_SANITIZE: "address,undefined" or "thread" (set by the asan and tsan presets).
# Applied to every target of this build, so tests and the library are instrumented
# alike. Dependencies from Debian packages are not instrumented: code under
# ThreadSanitizer synchronizes only through std:: primitives (std::mutex, atomics),
# which TSan sees, never through an uninstrumented library's locks. The one
# exception, absl::Status's reference count, is suppressed for the test binaries
# by tests/tsan_suppressions.cpp, which says why.
set(INFERQ_SANITIZE "" CACHE STRING "Sanitizers to build with (address,undefined | thread)")
if(INFERQ_SANITIZE)
  # Debug information comes from the build type: the asan and tsan presets use
  # -O1 -g1: line tables are enough for the sanitizers' stack traces, and -O1 is
  # what the ASan and TSan documentation suggest; both compile faster than -O2 -g,
  # which keeps .ci/run within its time budget.
  add_compile_options(-fsanitize=${INFERQ_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${INFERQ_SANITIZE})
  if(INFERQ_SANITIZE MATCHES "undefined")
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
endif()
