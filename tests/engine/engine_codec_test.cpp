// Payload codec negotiation (ConsumerConfig::accept_codecs): a consumer that does not
// accept an event's codec gets it converted, once per publish and target codec
// however many consumers and streams need it (EngineStats::codec_conversions).
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "../event/token_samples.hpp"
#include "engine_test_util.hpp"
#include "inferq/engine/engine.hpp"
#include "inferq/event/codec.hpp"

using namespace inferq;
using engine_test::Msg;

namespace {

// A trained dictionary and a set holding it.
struct Codecs {
  Codecs() { REQUIRE(dicts->Add(dict).ok()); }
  std::shared_ptr<const ZstdDictionary> dict = inferq_test::TrainOrDie(41);
  std::shared_ptr<ZstdDictionaries> dicts = std::make_shared<ZstdDictionaries>();
};

Event Zstd(const std::string& subject, const std::string& text, const ZstdDictionary* dict) {
  Event e;
  e.subject = subject;
  e.payload = Buffer::FromString(dict != nullptr ? *ZstdCompress(text, *dict) : *ZstdCompress(text));
  e.codec = PayloadCodec::kZstd;
  e.dictionary_id = dict != nullptr ? dict->id() : 0;
  return e;
}

Event Raw(const std::string& subject, const std::string& text) {
  Event e;
  e.subject = subject;
  e.payload = Buffer::FromString(text);
  return e;
}

Member AddC(Engine& engine, const std::string& stream, const std::string& name,
            std::vector<PayloadCodec> accept, std::string filter = "") {
  auto c = engine.AddConsumer({.stream = stream, .name = name, .filter_subject = filter,
                               .accept_codecs = std::move(accept)});
  REQUIRE(c.ok());
  return *c->member(0);
}

Message Take(Member& m) {
  auto r = m.Next(absl::ZeroDuration());
  REQUIRE(r.ok());
  return *std::move(r);
}

}  // namespace

TEST_CASE("three consumers wanting raw from a zstd event share one conversion") {
  Codecs k;
  auto engine = Engine::Create({.codecs = {.dictionaries = k.dicts}}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"tok.>"}}).ok());
  std::vector<Member> raw;
  for (const char* n : {"r1", "r2", "r3"}) raw.push_back(AddC(*engine, "S", n, {PayloadCodec::kNone}));
  Member any = AddC(*engine, "S", "any", {});
  const std::string text = inferq_test::TokenSamples(42, 1)[0];
  Event e = Zstd("tok.a", text, k.dict.get());
  const Buffer published = e.payload;

  auto ack = engine->Publish(std::move(e));
  REQUIRE(ack.ok());
  CHECK(ack->deliveries == 4);
  CHECK(engine->Stats().codec_conversions == 1);

  std::vector<Message> got;
  for (Member& m : raw) got.push_back(Take(m));
  for (const Message& m : got) {
    CHECK(m.event().codec == PayloadCodec::kNone);
    CHECK(m.event().dictionary_id == 0);
    CHECK(m.event().payload.view() == text);
    CHECK(m.event().subject == "tok.a");
    CHECK(&m.event() == &got[0].event());  // one converted Event, shared
  }
  Message as_stored = Take(any);
  CHECK(as_stored.event().codec == PayloadCodec::kZstd);
  CHECK(as_stored.event().dictionary_id == k.dict->id());
  CHECK(as_stored.event().payload.data() == published.data());  // not copied
  CHECK(engine->Stats().codec_conversions == 1);

  // A second publish converts again: once per publish.
  REQUIRE(engine->Publish(Zstd("tok.a", text, k.dict.get())).ok());
  CHECK(engine->Stats().codec_conversions == 2);
}

TEST_CASE("two consumers wanting zstd and one raw from a raw event: one conversion") {
  Codecs k;
  auto engine = Engine::Create({.codecs = {.dictionaries = k.dicts, .compress_dictionary_id = k.dict->id()}}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"tok.>"}}).ok());
  Member z1 = AddC(*engine, "S", "z1", {PayloadCodec::kZstd});
  Member z2 = AddC(*engine, "S", "z2", {PayloadCodec::kZstd});
  Member r = AddC(*engine, "S", "r", {PayloadCodec::kNone});
  const std::string text = inferq_test::TokenSamples(43, 1)[0];
  Event e = Raw("tok.b", text);
  const Buffer published = e.payload;
  REQUIRE(engine->Publish(std::move(e)).ok());
  CHECK(engine->Stats().codec_conversions == 1);

  Message m1 = Take(z1);
  Message m2 = Take(z2);
  CHECK(&m1.event() == &m2.event());
  CHECK(m1.event().codec == PayloadCodec::kZstd);
  CHECK(m1.event().dictionary_id == k.dict->id());  // compressed with the engine's dictionary
  auto back = ZstdDecompress(m1.event().payload.view(), k.dicts.get());
  REQUIRE(back.ok());
  CHECK(*back == text);
  Message mr = Take(r);
  CHECK(mr.event().codec == PayloadCodec::kNone);
  CHECK(mr.event().payload.data() == published.data());
}

TEST_CASE("streams capturing the same event share its conversion") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "A", .subjects = {"tok.>"}}).ok());
  REQUIRE(engine->AddStream({.name = "B", .subjects = {"tok.*"}}).ok());
  Member a = AddC(*engine, "A", "ra", {PayloadCodec::kNone});
  Member b = AddC(*engine, "B", "rb", {PayloadCodec::kNone});
  auto ack = engine->Publish(Zstd("tok.c", "shared by two streams", nullptr));
  REQUIRE(ack.ok());
  CHECK(ack->streams_stored == 2);
  CHECK(engine->Stats().codec_conversions == 1);
  Message ma = Take(a);
  Message mb = Take(b);
  CHECK(&ma.event() == &mb.event());
  CHECK(ma.event().payload.view() == "shared by two streams");
}

TEST_CASE("no conversion when every matching consumer accepts the stored codec") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"tok.>"}}).ok());
  Member both = AddC(*engine, "S", "both", {PayloadCodec::kNone, PayloadCodec::kZstd});
  Member other = AddC(*engine, "S", "other", {PayloadCodec::kNone}, "tok.other");
  REQUIRE(engine->Publish(Zstd("tok.d", "kept compressed", nullptr)).ok());
  CHECK(engine->Stats().codec_conversions == 0);  // "other"'s filter does not match
  Message m = Take(both);
  CHECK(m.event().codec == PayloadCodec::kZstd);
  CHECK(*ZstdDecompress(m.event().payload.view()) == "kept compressed");
  CHECK(other.queued() == 0);

  SECTION("an empty payload is never converted") {
    Member z = AddC(*engine, "S", "z", {PayloadCodec::kZstd});
    REQUIRE(engine->Publish(Raw("tok.e", "")).ok());
    CHECK(engine->Stats().codec_conversions == 0);
    Message mz = Take(z);
    CHECK(mz.event().codec == PayloadCodec::kNone);
    CHECK(mz.event().payload.empty());
  }
}

TEST_CASE("a payload that cannot be converted is refused and nothing is stored") {
  Codecs k;
  auto engine = Engine::Create({.codecs = {.dictionaries = k.dicts}}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"tok.>"}}).ok());
  Member r = AddC(*engine, "S", "r", {PayloadCodec::kNone});

  SECTION("corrupt zstd") {
    Event e = Raw("tok.f", "this is not zstd data");
    e.codec = PayloadCodec::kZstd;
    auto ack = engine->Publish(std::move(e));
    REQUIRE(ack.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Msg(ack.status()) ==
          "consumer 'r' of stream 'S' needs the payload of subject 'tok.f' as none, but "
          "converting it from zstd failed: event payload (zstd, 21 bytes, dictionary_id 0): "
          "zstd data is corrupt in input bytes 0..0: Unknown frame descriptor");
  }
  SECTION("a dictionary the engine lacks") {
    std::shared_ptr<const ZstdDictionary> other = inferq_test::TrainOrDie(44);
    auto ack = engine->Publish(Zstd("tok.g", "needs another dictionary", other.get()));
    REQUIRE(ack.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Msg(ack.status()).find("needs zstd dictionary " + std::to_string(other->id()) +
                                 ", which is not in the dictionary set") != std::string::npos);
  }
  const EngineStats st = engine->Stats();
  CHECK(st.invalid == 1);
  CHECK(st.published == 0);
  CHECK(st.codec_conversions == 0);
  CHECK(st.stream("S")->stored == 0);
  CHECK(st.stream("S")->messages == 0);
  CHECK(st.stream("S")->last_seq == 0);
  CHECK(r.queued() == 0);
}

TEST_CASE("a consumer that accepts any codec takes a payload that could not be converted") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"tok.>"}}).ok());
  Member any = AddC(*engine, "S", "any", {});
  Event e = Raw("tok.h", "not zstd, but nobody decompresses it");
  e.codec = PayloadCodec::kZstd;
  REQUIRE(engine->Publish(std::move(e)).ok());
  CHECK(Take(any).event().payload.view() == "not zstd, but nobody decompresses it");
}

TEST_CASE("a redelivery gets the converted event again, without converting again") {
  engine_test::Fixture f;
  Member r = f.Add({.ack_wait = absl::Seconds(5), .accept_codecs = {PayloadCodec::kNone}});
  REQUIRE(f.engine.Publish(Zstd("work.a", "redelivered raw", nullptr)).ok());
  Message first = Take(r);
  CHECK(first.event().payload.view() == "redelivered raw");
  REQUIRE(first.Nak().ok());
  Message second = Take(r);
  CHECK(second.attempt() == 2);
  CHECK(second.event().codec == PayloadCodec::kNone);
  CHECK(second.event().payload.view() == "redelivered raw");
  CHECK(f.engine.Stats().codec_conversions == 1);
}

TEST_CASE("codec settings are validated, naming the bad value") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"tok.>"}}).ok());
  SECTION("an accept_codecs entry that is not a codec") {
    auto c = engine->AddConsumer(
        {.stream = "S", .name = "c", .accept_codecs = {PayloadCodec::kZstd, static_cast<PayloadCodec>(9)}});
    REQUIRE(c.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Msg(c.status()) ==
          "consumer 'c': accept_codecs[1] = 9 is not a PayloadCodec (0 none, 1 zstd)");
  }
  SECTION("a repeated codec") {
    auto c = engine->AddConsumer(
        {.stream = "S", .name = "c", .accept_codecs = {PayloadCodec::kNone, PayloadCodec::kNone}});
    REQUIRE(c.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Msg(c.status()) == "consumer 'c': accept_codecs[1] = 0 repeats accept_codecs[0]");
  }
  SECTION("an event whose codec is not a codec") {
    Event e = Raw("tok.a", "x");
    e.codec = static_cast<PayloadCodec>(5);
    auto ack = engine->Publish(std::move(e));
    REQUIRE(ack.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Msg(ack.status()) == "event payload codec 5 is not one of none (0), zstd (1)");
  }
  SECTION("a raw event with a dictionary id") {
    Event e = Raw("tok.a", "x");
    e.dictionary_id = 3;
    auto ack = engine->Publish(std::move(e));
    REQUIRE(ack.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Msg(ack.status()) == "event payload has codec none but dictionary_id 3 (must be 0)");
    CHECK(engine->Stats().invalid == 1);
  }
  SECTION("engine options") {
    const auto refused = [](EngineOptions o) { return Engine::Create(std::move(o)).status(); };
    CHECK(refused({.codecs = {.zstd_level = 0}}) ==
          absl::InvalidArgumentError("EngineOptions::codecs.zstd_level 0 is outside 1..22"));
    CHECK(refused({.codecs = {.compress_dictionary_id = 77}}) ==
          absl::InvalidArgumentError("EngineOptions::codecs.compress_dictionary_id 77 is not in "
                                     "codecs.dictionaries"));
    CHECK(refused({.codecs = {.max_payload_bytes = 0}}) ==
          absl::InvalidArgumentError("EngineOptions::codecs.max_payload_bytes is 0"));
    CHECK(refused({.flow_control = FlowControlConfig{.memory_budget_bytes = 0}}) ==
          absl::InvalidArgumentError("FlowControlConfig.memory_budget_bytes = 0 must be > 0"));
    CHECK(Engine::Create({.codecs = {.zstd_level = 22}}).ok());
  }
}
