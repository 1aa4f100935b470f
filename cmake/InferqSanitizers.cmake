# INFERQ_SANITIZE: "address,undefined" or "thread" (set by the asan and tsan presets).
# Applied to every target of this build, so tests and the library are instrumented
# alike. Dependencies from Debian packages are not instrumented: code under
# ThreadSanitizer synchronizes only through std:: primitives (std::mutex, atomics),
# which TSan sees, never through an uninstrumented library's locks. The one
# exception, absl::Status's reference count, is suppressed for the test binaries
# by tests/tsan_suppressions.cpp, which says why.
set(INFERQ_SANITIZE "" CACHE STRING "Sanitizers to build with (address,undefined | thread)")
if(INFERQ_SANITIZE)
  add_compile_options(-fsanitize=${INFERQ_SANITIZE} -fno-omit-frame-pointer -g)
  add_link_options(-fsanitize=${INFERQ_SANITIZE})
  if(INFERQ_SANITIZE MATCHES "undefined")
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
endif()
