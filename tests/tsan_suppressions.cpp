// File: tests/tsan_suppressions.cpp
//
// ThreadSanitizer's built-in suppressions for the test binaries of the tsan
// preset (linked only when INFERQ_SANITIZE is "thread").
//
// Debian's Abseil is not built with ThreadSanitizer. absl::Status keeps a
// heap-allocated message behind an atomic reference count, and the decrement
// that frees it (Status::UnrefNonInlined) is compiled into libabsl_status.so,
// so TSan never sees its acquire/release. When one thread reads a status's
// message and drops its copy, and another thread then drops the last copy,
// TSan reports the free as racing with the read although the count orders
// them (seen in CI: engine_call_test "a handler exception fails the try as
// internal"). Only reports with Status::Unref or UnrefNonInlined in a stack are
// suppressed; a race on a Status object itself goes through inline code that
// TSan does see.
extern "C" const char* __tsan_default_suppressions() {
  return "race:absl::*::Status::Unref\n";  // also matches UnrefNonInlined
}
