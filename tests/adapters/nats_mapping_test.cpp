// Tests of the Event <-> NATS message mapping (inferq/adapters/nats/mapping.hpp): no
// server needed.
#include "inferq/adapters/nats/mapping.hpp"

#include <catch2/catch.hpp>

#include "inferq/event/tensor_event.hpp"
#include "../event/event_test_util.hpp"

using namespace inferq;
using namespace inferq::nats;

namespace {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

Event FullEvent() {
  Event e;
  e.subject = "infer.llama.request";
  e.task_id = {0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  e.semantic_tag = "summarize";
  e.tenant = "acme";
  e.qos = Qos::kGold;
  e.priority = -7;
  for (std::uint8_t i = 0; i < 16; ++i) e.trace.trace_id[i] = static_cast<std::uint8_t>(0xa0 + i);
  for (std::uint8_t i = 0; i < 8; ++i) e.trace.span_id[i] = static_cast<std::uint8_t>(0x10 + i);
  e.trace.flags = 1;
  e.model = "llama";
  e.model_version = "3.1";
  e.schema_id = 4;
  e.schema_version = 2;
  e.msg_id = "req-17";
  e.seq_id = "gen-9";
  e.seq_no = 12;
  e.created = absl::FromUnixNanos(1700000000123456789);
  e.deadline = absl::FromUnixNanos(1700000001000000000);
  e.ttl = absl::Milliseconds(1500);
  e.attempt = 3;
  e.shape = {2, -1, 4096};
  e.dtype = DType::kBFloat16;
  e.headers.Set("context_tokens", "374");
  e.headers.Set("x-spaced", "a  b");
  e.payload = Buffer::FromString(std::string("pay\0load", 8));
  return e;
}

// Every field but the headers, which the mapping's own tests check (the wire adds
// entries of its own to them).
void CheckSameEvent(const Event& a, const Event& b) { inferq::event_test::CheckSameEvent(a, b, /*headers=*/false); }

}  // namespace

TEST_CASE("nats mapping: every attribute has its header, in the table's order") {
  auto w = ToWire(FullEvent(), "site-a.infer.llama.request", PayloadFormat::kRaw, "site-a");
  REQUIRE(w.ok());
  CHECK(w->subject == "site-a.infer.llama.request");
  const HeaderList expected = {
      {"Nats-Msg-Id", "req-17"},
      {"traceparent", "00-a0a1a2a3a4a5a6a7a8a9aaabacadaeaf-1011121314151617-01"},
      {"Inferq-Origin", "site-a"},
      {"Inferq-Task-Id", "0123456789abcdeffedcba9876543210"},
      {"Inferq-Semantic-Tag", "summarize"},
      {"Inferq-Tenant", "acme"},
      {"Inferq-Qos", "gold"},
      {"Inferq-Priority", "-7"},
      {"Inferq-Model", "llama"},
      {"Inferq-Model-Version", "3.1"},
      {"Inferq-Schema-Id", "4"},
      {"Inferq-Schema-Version", "2"},
      {"Inferq-Seq-Id", "gen-9"},
      {"Inferq-Seq-No", "12"},
      {"Inferq-Created", "1700000000123456789"},
      {"Inferq-Deadline", "1700000001000000000"},
      {"Inferq-Ttl", "1500000000"},
      {"Inferq-Attempt", "3"},
      {"Inferq-Shape", "2,-1,4096"},
      {"Inferq-Dtype", "bfloat16"},
      {"context_tokens", "374"},
      {"x-spaced", "a  b"},
  };
  CHECK(w->headers == expected);
  CHECK(w->payload.view() == std::string("pay\0load", 8));
}

TEST_CASE("nats mapping: an event with defaults has no headers") {
  Event e;
  e.subject = "a.b";
  auto w = ToWire(e, "a.b", PayloadFormat::kRaw, "");
  REQUIRE(w.ok());
  CHECK(w->headers.empty());
  auto back = FromWire("a.b", w->headers, {}, PayloadFormat::kRaw);
  REQUIRE(back.ok());
  CheckSameEvent(e, *back);
  CHECK(back->headers.empty());
}

TEST_CASE("nats mapping: raw and TensorEvent payloads come back as the same event") {
  for (PayloadFormat f : {PayloadFormat::kRaw, PayloadFormat::kTensorEvent}) {
    INFO(static_cast<int>(f));
    Event e = FullEvent();
    auto w = ToWire(e, "x.infer.llama.request", f, "site-a");
    REQUIRE(w.ok());
    if (f == PayloadFormat::kTensorEvent) {
      CHECK(w->headers == HeaderList{{"Nats-Msg-Id", "req-17"},
                                     {"traceparent", "00-a0a1a2a3a4a5a6a7a8a9aaabacadaeaf-1011121314151617-01"},
                                     {"Inferq-Origin", "site-a"}});
    }
    auto back = FromWire("infer.llama.request", w->headers,
                         std::span<const std::byte>(w->payload.data(), w->payload.size()), f);
    REQUIRE(back.ok());
    CheckSameEvent(e, *back);
    CHECK(back->headers.Get("context_tokens") == std::optional<std::string_view>("374"));
    CHECK(back->headers.Get("x-spaced") == std::optional<std::string_view>("a  b"));
    CHECK(back->headers.Get("Inferq-Origin") == std::optional<std::string_view>("site-a"));
  }
  Event zstd;
  zstd.subject = "a";
  zstd.codec = PayloadCodec::kZstd;
  zstd.dictionary_id = 9;
  zstd.ttl = absl::InfiniteDuration();
  zstd.qos = Qos::kBronze;
  auto w = ToWire(zstd, "a", PayloadFormat::kRaw, "");
  REQUIRE(w.ok());
  CHECK(w->headers == HeaderList{{"Inferq-Qos", "bronze"},
                                 {"Inferq-Ttl", "9223372036854775807"},
                                 {"Inferq-Codec", "zstd"},
                                 {"Inferq-Dictionary-Id", "9"}});
  auto back = FromWire("a", w->headers, {}, PayloadFormat::kRaw);
  REQUIRE(back.ok());
  CheckSameEvent(zstd, *back);
}

TEST_CASE("nats mapping: headers that cannot cross are refused, naming them") {
  Event e;
  e.subject = "a";
  e.headers.Set("Inferq-Tenant", "x");
  auto w = ToWire(e, "a", PayloadFormat::kRaw, "");
  REQUIRE_FALSE(w.ok());
  CHECK(std::string(w.status().message()) ==
        "event header 'Inferq-Tenant' takes the name of a mapped attribute; rename it to cross to NATS");
  Event bad_name;
  bad_name.headers.Set("has space", "x");
  w = ToWire(bad_name, "a", PayloadFormat::kRaw, "");
  REQUIRE_FALSE(w.ok());
  CHECK(std::string(w.status().message()) ==
        "header name 'has space' cannot travel in NATS (a control character, space, ':' or non-ASCII byte)");
  // mapping.hpp lists non-ASCII names too (UTF-8 "X-Grüße": bytes over 126).
  Event non_ascii;
  non_ascii.headers.Set("X-Gr\xC3\xBC\xC3\x9F" "e", "x");
  w = ToWire(non_ascii, "a", PayloadFormat::kRaw, "");
  REQUIRE_FALSE(w.ok());
  CHECK(w.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(w.status().message()) ==
        "header name 'X-Gr\xC3\xBC\xC3\x9F" "e' cannot travel in NATS (a control character, space, ':' or "
        "non-ASCII byte)");
  Event bad_value;
  bad_value.tenant = "a\r\nInjected: 1";
  w = ToWire(bad_value, "a", PayloadFormat::kRaw, "");
  REQUIRE_FALSE(w.ok());
  CHECK(std::string(w.status().message()) ==
        "header 'Inferq-Tenant' has a value with a CR or LF, which cannot travel in NATS: 'a\r\nInjected: 1'");
}

// Found by an adversarial review: libnats 3.4.1 takes C strings (a NUL cut the rest
// off, and two msg_ids differing after it were one to JetStream's duplicate window:
// an acked event lost), reads an empty header value as the next header line
// (Inferq-Origin swallowed), trims white space, and JetStream obeys Nats-* headers
// (Nats-Rollup purged a stream).
TEST_CASE("nats mapping: values libnats would change and JetStream's control headers are refused") {
  using namespace std::string_literals;
  struct Case {
    std::string what;
    Event event;
    std::string message;
  };
  auto with = [](auto set) {
    Event e;
    e.subject = "a";
    set(e);
    return e;
  };
  const std::vector<Case> cases = {
      {"NUL in msg_id", with([](Event& e) { e.msg_id = "job\0" "1"s; }),
       "header 'Nats-Msg-Id' has a value with a NUL byte, which cannot travel in NATS: 'job\0" "1'"s},
      {"empty header value", with([](Event& e) { e.headers.Set("x", ""); }),
       "header 'x' has a value with no characters, which cannot travel in NATS: ''"},
      {"leading space", with([](Event& e) { e.headers.Set("x", " v"); }),
       "header 'x' has a value with white space at an end, which cannot travel in NATS: ' v'"},
      {"trailing tab", with([](Event& e) { e.tenant = "acme\t"; }),
       "header 'Inferq-Tenant' has a value with white space at an end, which cannot travel in NATS: 'acme\t'"},
      {"Nats-Rollup", with([](Event& e) { e.headers.Set("Nats-Rollup", "all"); }),
       "event header 'Nats-Rollup' is in JetStream's own Nats-* namespace, where it would act on the broker; "
       "rename it to cross to NATS"},
      {"nats-expected-stream", with([](Event& e) { e.headers.Set("nats-expected-stream", "X"); }),
       "event header 'nats-expected-stream' is in JetStream's own Nats-* namespace, where it would act on the "
       "broker; rename it to cross to NATS"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    auto w = ToWire(c.event, "a", PayloadFormat::kRaw, "site-a");
    REQUIRE_FALSE(w.ok());
    CHECK(w.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(w.status().message()) == c.message);
  }
  // A subject (or prefix) with a NUL would be cut there on the wire.
  const std::string nul_subject = "work.a\0.b"s;
  CHECK(std::string(AddSubjectPrefix("site", nul_subject).status().message()) ==
        "subject 'work.a\0.b' has a control byte, which cannot travel in NATS"s);
  CHECK(std::string(AddSubjectPrefix("a\0b"s, "x").status().message()) ==
        "subject prefix 'a\0b' has a control byte, which cannot travel in NATS"s);
}

TEST_CASE("nats mapping: unreadable header values are refused, naming header and value") {
  struct Case {
    std::string name, value, message;
  };
  const std::vector<Case> cases = {
      {"Inferq-Qos", "platinum", "NATS header 'Inferq-Qos' has value 'platinum': not gold, silver or bronze"},
      {"Inferq-Priority", "2147483648",
       "NATS header 'Inferq-Priority' has value '2147483648': not a decimal signed 32-bit integer"},
      {"Inferq-Seq-No", "-1", "NATS header 'Inferq-Seq-No' has value '-1': not a decimal unsigned 64-bit integer"},
      {"Inferq-Seq-No", " 5", "NATS header 'Inferq-Seq-No' has value ' 5': not a decimal unsigned 64-bit integer"},
      {"Inferq-Ttl", "-5", "NATS header 'Inferq-Ttl' has value '-5': a negative time to live"},
      {"Inferq-Task-Id", "0123", "NATS header 'Inferq-Task-Id' has value '0123': not 32 lowercase hex digits"},
      {"Inferq-Shape", "2,,3", "NATS header 'Inferq-Shape' has value '2,,3': not comma-separated decimal int64 dims"},
      {"Inferq-Dtype", "float8", "NATS header 'Inferq-Dtype' has value 'float8': not a dtype inferq knows"},
      {"Inferq-Codec", "lz4", "NATS header 'Inferq-Codec' has value 'lz4': not none or zstd"},
      {"traceparent", "00-xyz",
       "NATS header 'traceparent' has value '00-xyz': traceparent '00-xyz' is 6 characters long, not 55"},
  };
  for (const Case& c : cases) {
    INFO(c.name << ": " << c.value);
    auto e = FromWire("a", HeaderList{{c.name, c.value}}, {}, PayloadFormat::kRaw);
    REQUIRE_FALSE(e.ok());
    CHECK(e.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(e.status().message()) == c.message);
  }
  auto garbage = FromWire("a", {}, std::as_bytes(std::span<const char>("not a flatbuffer", 16)),
                          PayloadFormat::kTensorEvent);
  CHECK_FALSE(garbage.ok());
}

TEST_CASE("nats mapping: subject prefixes are added and replaced") {
  CHECK(*AddSubjectPrefix("", "a.b") == "a.b");
  CHECK(*AddSubjectPrefix("site-a", "a.b") == "site-a.a.b");
  CHECK(*AddSubjectPrefix("x.y", "a") == "x.y.a");
  CHECK(std::string(AddSubjectPrefix("x.*", "a").status().message()) ==
        "subject prefix 'x.*' is not a valid literal subject");
  CHECK(std::string(AddSubjectPrefix("x..y", "a").status().message()) ==
        "subject prefix 'x..y' is not a valid literal subject");
  CHECK(*ReplaceSubjectPrefix("site.a.infer.x", "site.a", "local") == "local.infer.x");
  CHECK(*ReplaceSubjectPrefix("site.a.infer.x", "site.a", "") == "infer.x");
  CHECK(*ReplaceSubjectPrefix("infer.x", "", "b") == "b.infer.x");
  CHECK(std::string(ReplaceSubjectPrefix("site.ab.x", "site.a", "").status().message()) ==
        "subject 'site.ab.x' does not start with prefix 'site.a' and a further token");
  CHECK(std::string(ReplaceSubjectPrefix("site.a", "site.a", "").status().message()) ==
        "subject 'site.a' does not start with prefix 'site.a' and a further token");
}
