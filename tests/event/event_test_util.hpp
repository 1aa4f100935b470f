// Test helper shared by the tests that carry an Event through something and back (the
// TensorEvent wire format, the NATS mapping, an engine publish): every field equal.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "inferq/event/event.hpp"

namespace inferq::event_test {

// Every field of `a` equals `b`'s: headers (unless `headers` is false) as their
// (name, value) list in order, the payload by its bytes. One CHECK per field, so a
// failure names the field.
inline void CheckSameEvent(const Event& a, const Event& b, bool headers = true) {
  CHECK(a.subject == b.subject);
  CHECK(a.task_id == b.task_id);
  CHECK(a.semantic_tag == b.semantic_tag);
  CHECK(a.tenant == b.tenant);
  CHECK(a.qos == b.qos);
  CHECK(a.priority == b.priority);
  CHECK(a.trace == b.trace);
  CHECK(a.model == b.model);
  CHECK(a.model_version == b.model_version);
  CHECK(a.schema_id == b.schema_id);
  CHECK(a.schema_version == b.schema_version);
  CHECK(a.msg_id == b.msg_id);
  CHECK(a.seq_id == b.seq_id);
  CHECK(a.seq_no == b.seq_no);
  CHECK(a.created == b.created);
  CHECK(a.deadline == b.deadline);
  CHECK(a.ttl == b.ttl);
  CHECK(a.attempt == b.attempt);
  CHECK(a.shape == b.shape);
  CHECK(a.dtype == b.dtype);
  if (headers) {
    const std::vector<std::pair<std::string, std::string>> ha(a.headers.begin(), a.headers.end());
    const std::vector<std::pair<std::string, std::string>> hb(b.headers.begin(), b.headers.end());
    CHECK(ha == hb);
  }
  CHECK(a.payload.view() == b.payload.view());
  CHECK(a.codec == b.codec);
  CHECK(a.dictionary_id == b.dictionary_id);
}

}  // namespace inferq::event_test
