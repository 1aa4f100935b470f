#include "inferq/base/limits.hpp"

#include <string>

#include <catch2/catch.hpp>

using inferq::ValidateId;
using inferq::ValidateName;

namespace {
std::string Msg(const absl::Status& s) { return std::string(s.message()); }
}  // namespace

TEST_CASE("the name rule: 1 to 64 of A-Z a-z 0-9 _ -") {
  CHECK(ValidateName("stream", "Az09_-").ok());
  CHECK(ValidateName("stream", std::string(64, 'n')).ok());
  CHECK(Msg(ValidateName("stream", std::string(65, 'n'))) ==
        "stream name '" + std::string(65, 'n') + "' must have 1 to 64 characters");
  CHECK(Msg(ValidateName("consumer", "")) == "consumer name '' must have 1 to 64 characters");
  CHECK(Msg(ValidateName("function", "a.b")) ==
        "function name 'a.b' has the character '.' at byte 1; only A-Z a-z 0-9 _ - are allowed");
  CHECK(Msg(ValidateName("stream", "a b")) ==
        "stream name 'a b' has the character ' ' at byte 1; only A-Z a-z 0-9 _ - are allowed");
  CHECK(ValidateName("stream", "a*").code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the id rule: 1 to 256 visible ASCII bytes") {
  CHECK(ValidateId("model", "llama-3.1:8b/instruct").ok());
  CHECK(ValidateId("msg_id", std::string(256, '!')).ok());
  const std::string rule = " must be 1 to 256 visible ASCII characters (0x21 to 0x7e)";
  CHECK(Msg(ValidateId("model", "")) == "model ''" + rule);
  CHECK(Msg(ValidateId("model", "a b")) == "model 'a b'" + rule);
  CHECK(Msg(ValidateId("msg_id", std::string(257, 'm'))) ==
        "msg_id '" + std::string(257, 'm') + "'" + rule);
  CHECK(Msg(ValidateId("msg_id", "caf\xc3\xa9")) == "msg_id 'caf\xc3\xa9'" + rule);
}

TEST_CASE("kMaxDuration is 365 days") {
  CHECK(inferq::kMaxDuration == absl::Hours(24 * 365));
}
