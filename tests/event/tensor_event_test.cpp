#include "inferq/event/tensor_event.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <zstd.h>

#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "flatbuffers/flatbuffers.h"
#include "inferq/event/event.hpp"
#include "inferq/memory/buffer.hpp"
#include "event_test_util.hpp"
#include "token_samples.hpp"
// The generated wire header (build tree), to build malformed buffers the encoder
// never makes.
#include "inferq/wire/tensor_event_generated.h"

namespace {

using inferq::Buffer;
using inferq::Decode;
using inferq::Encode;
using inferq::Event;
using inferq::PayloadCodec;

std::vector<std::byte> Bytes(const Buffer& b) { return {b.data(), b.data() + b.size()}; }

Event FullEvent() {
  Event e;
  e.subject = "infer.llama.request";
  e.task_id = {0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  e.semantic_tag = "summarize";
  e.tenant = "acme";
  e.qos = inferq::Qos::kBronze;
  e.priority = -17;
  for (std::uint8_t i = 0; i < 16; ++i) e.trace.trace_id[i] = static_cast<std::uint8_t>(0xa0 + i);
  for (std::uint8_t i = 0; i < 8; ++i) e.trace.span_id[i] = static_cast<std::uint8_t>(0x10 + i);
  e.trace.flags = 0x01;
  e.model = "llama-3-8b";
  e.model_version = "2024-05-01";
  e.schema_id = 42;
  e.schema_version = 7;
  e.msg_id = "msg-0001";
  e.seq_id = "gen-77";
  e.seq_no = 0x1'0000'0003ULL;
  e.created = absl::FromUnixNanos(1'732'000'000'123'456'789LL);
  e.deadline = absl::FromUnixNanos(1'732'000'005'000'000'001LL);
  e.ttl = absl::Nanoseconds(2'500'000'001LL);
  e.attempt = 3;
  e.shape = {2, 3, -1, std::numeric_limits<std::int64_t>::max()};
  e.dtype = inferq::DType::kBFloat16;
  e.headers.Set("context_tokens", "374");
  e.headers.Set("", "empty name");
  e.headers.Set("binary", std::string("a\0b", 3));
  std::string payload;
  for (int i = 0; i < 4096; ++i) payload += static_cast<char>("token "[i % 6]);
  payload += std::string("\0\xff", 2);
  e.payload = Buffer::FromString(payload);
  return e;
}

using inferq::event_test::CheckSameEvent;

// A TensorEvent built by hand, for fields the encoder never writes wrong.
struct Raw {
  std::uint8_t qos = 1;
  std::uint8_t dtype = 0;
  std::uint8_t codec = 0;
  std::uint32_t dictionary_id = 0;
  std::uint64_t uncompressed_size = 0;
  std::int64_t ttl_ns = 0;
  std::string payload;
  std::vector<std::string> header_keys;
};

std::vector<std::byte> Build(const Raw& r) {
  namespace wire = inferq::wire;
  flatbuffers::FlatBufferBuilder fbb;
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::Header>>> headers;
  if (!r.header_keys.empty()) {
    std::vector<flatbuffers::Offset<wire::Header>> hs;
    for (const auto& k : r.header_keys) {
      hs.push_back(wire::CreateHeader(fbb, fbb.CreateString(k), fbb.CreateString("v")));
    }
    headers = fbb.CreateVector(hs);
  }
  const auto payload = r.payload.empty()
                           ? flatbuffers::Offset<flatbuffers::Vector<std::uint8_t>>()
                           : fbb.CreateVector(reinterpret_cast<const std::uint8_t*>(r.payload.data()),
                                              r.payload.size());
  wire::TensorEventBuilder b(fbb);
  b.add_qos(static_cast<wire::Qos>(r.qos));
  b.add_dtype(static_cast<wire::DType>(r.dtype));
  b.add_codec(static_cast<wire::Codec>(r.codec));
  b.add_dictionary_id(r.dictionary_id);
  b.add_uncompressed_size(r.uncompressed_size);
  b.add_ttl_ns(r.ttl_ns);
  if (!r.header_keys.empty()) b.add_headers(headers);
  if (!r.payload.empty()) b.add_payload(payload);
  wire::FinishTensorEventBuffer(fbb, b.Finish());
  const auto* p = reinterpret_cast<const std::byte*>(fbb.GetBufferPointer());
  return {p, p + fbb.GetSize()};
}

}  // namespace

TEST_CASE("a fully populated event round-trips exactly with both codecs") {
  const Event e = FullEvent();
  SECTION("codec none") {
    auto wire = Encode(e);
    REQUIRE(wire.ok());
    CHECK(wire->size() > e.payload.size());
    auto back = Decode(wire->span());
    REQUIRE(back.ok());
    CheckSameEvent(e, *back);
  }
  SECTION("codec zstd") {
    auto wire = Encode(e, {.codec = PayloadCodec::kZstd, .zstd_level = 19});
    REQUIRE(wire.ok());
    CHECK(wire->size() < e.payload.size());  // 4 KiB of "token " compresses well
    auto back = Decode(wire->span());
    REQUIRE(back.ok());
    CheckSameEvent(e, *back);
  }
  SECTION("infinite times and ttl") {
    Event f = e;
    f.created = absl::InfiniteFuture();
    f.deadline = absl::InfinitePast();
    f.ttl = absl::InfiniteDuration();
    auto wire = Encode(f);
    REQUIRE(wire.ok());
    auto back = Decode(wire->span());
    REQUIRE(back.ok());
    CheckSameEvent(f, *back);
  }
  SECTION("the extreme finite times") {
    Event f = e;
    f.created = absl::FromUnixNanos(std::numeric_limits<std::int64_t>::min() + 1);
    f.deadline = absl::FromUnixNanos(std::numeric_limits<std::int64_t>::max() - 1);
    f.ttl = absl::Nanoseconds(std::numeric_limits<std::int64_t>::max() - 1);
    auto wire = Encode(f);
    REQUIRE(wire.ok());
    auto back = Decode(wire->span());
    REQUIRE(back.ok());
    CheckSameEvent(f, *back);
  }
  SECTION("a misaligned input") {
    auto wire = Encode(e, {.codec = PayloadCodec::kZstd});
    REQUIRE(wire.ok());
    std::vector<std::byte> shifted(wire->size() + 1);
    std::memcpy(shifted.data() + 1, wire->data(), wire->size());
    auto back = Decode(std::span<const std::byte>(shifted).subspan(1));
    REQUIRE(back.ok());
    CheckSameEvent(e, *back);
  }
}

TEST_CASE("an empty event round-trips with the defaults") {
  const Event e;
  for (PayloadCodec codec : {PayloadCodec::kNone, PayloadCodec::kZstd}) {
    auto wire = Encode(e, {.codec = codec});
    REQUIRE(wire.ok());
    CHECK(wire->size() == 16);  // root offset, identifier, 4-byte vtable, empty table
    auto back = Decode(wire->span());
    REQUIRE(back.ok());
    CheckSameEvent(e, *back);
    CHECK(back->created == absl::InfinitePast());
    CHECK(back->deadline == absl::InfiniteFuture());
    CHECK(back->qos == inferq::Qos::kSilver);
    CHECK(back->payload.empty());
  }
}

TEST_CASE("Encode rejects what the wire cannot hold") {
  Event e;
  SECTION("a finite time beyond int64 nanoseconds") {
    e.created = absl::FromUnixNanos(std::numeric_limits<std::int64_t>::min());
    auto wire = Encode(e);
    REQUIRE(wire.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(wire.status().message()) ==
          "created 1677-09-21T00:12:43.145224192+00:00 is a finite time outside the wire "
          "range of int64 nanoseconds since the Unix epoch");
  }
  SECTION("a negative ttl") {
    e.ttl = absl::Seconds(-1);
    auto wire = Encode(e);
    REQUIRE(wire.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(wire.status().message()) == "ttl -1s is negative");
  }
  SECTION("a zstd level out of range") {
    e.payload = Buffer::FromString("x");
    auto wire = Encode(e, {.codec = PayloadCodec::kZstd, .zstd_level = 23});
    REQUIRE(wire.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(wire.status().message()) == "zstd level 23 is outside 1..22");
  }
  SECTION("a zstd level out of range with an empty payload (nothing to compress)") {
    auto wire = Encode(e, {.codec = PayloadCodec::kZstd, .zstd_level = 0});
    REQUIRE(wire.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(wire.status().message()) == "zstd level 0 is outside 1..22");
  }
}

TEST_CASE("a truncated TensorEvent is an error at every length") {
  Event e;
  e.subject = "a.b";
  e.tenant = "t";
  e.headers.Set("k", "v");
  e.shape = {4};
  e.payload = Buffer::FromString("0123456789");
  for (PayloadCodec codec : {PayloadCodec::kNone, PayloadCodec::kZstd}) {
    auto wire = Encode(e, {.codec = codec});
    REQUIRE(wire.ok());
    const std::vector<std::byte> full = Bytes(*wire);
    for (std::size_t n = 0; n < full.size(); ++n) {
      const std::vector<std::byte> prefix(full.begin(), full.begin() + static_cast<long>(n));
      auto back = Decode(prefix);
      INFO("codec " << static_cast<int>(codec) << ", " << n << " of " << full.size() << " bytes");
      CHECK_FALSE(back.ok());
    }
  }
}

TEST_CASE("flipped bytes never crash Decode") {
  const Event e = [] {
    Event x = FullEvent();
    x.payload = Buffer::FromString("0123456789abcdef");
    return x;
  }();
  for (PayloadCodec codec : {PayloadCodec::kNone, PayloadCodec::kZstd}) {
    auto wire = Encode(e, {.codec = codec});
    REQUIRE(wire.ok());
    const std::vector<std::byte> full = Bytes(*wire);
    int errors = 0;
    for (std::size_t i = 0; i < full.size(); ++i) {
      for (unsigned mask : {0x01u, 0x80u, 0xffu}) {
        std::vector<std::byte> bad = full;
        bad[i] ^= static_cast<std::byte>(mask);
        auto back = Decode(bad);  // ok or an error; ASan/UBSan check the rest
        if (!back.ok()) ++errors;
        if (i >= 4 && i < 8) CHECK(back.status().code() == absl::StatusCode::kInvalidArgument);
      }
    }
    CHECK(errors >= 3 * 4);  // at least every identifier flip
  }
}

TEST_CASE("Decode errors name what failed") {
  SECTION("too short") {
    const std::vector<std::byte> five(5);
    auto back = Decode(five);
    REQUIRE(back.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(back.status().message()) ==
          "TensorEvent of 5 bytes is too short: a FlatBuffer with a file identifier has at "
          "least 8");
  }
  SECTION("wrong file identifier") {
    auto wire = Encode(Event{});
    REQUIRE(wire.ok());
    std::vector<std::byte> bad = Bytes(*wire);
    std::memcpy(bad.data() + 4, "AB\x01\xff", 4);
    auto back = Decode(bad);
    REQUIRE(back.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(back.status().message()) ==
          "not a TensorEvent: file identifier is 'AB\\x01\\xff', expected 'IQTE'");
  }
  SECTION("verifier failure") {
    auto wire = Encode(FullEvent());
    REQUIRE(wire.ok());
    std::vector<std::byte> bad = Bytes(*wire);
    bad.resize(bad.size() - 1);
    auto back = Decode(bad);
    REQUIRE(back.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(back.status().message()) ==
          "TensorEvent of " + std::to_string(bad.size()) +
              " bytes fails FlatBuffers verification (an offset, size, string or alignment "
              "is invalid, or nesting exceeds max_depth 16 or tables exceed max_tables 4096)");
  }
  SECTION("more tables than max_tables") {
    Event e;
    for (int i = 0; i < 10; ++i) e.headers.Set("h" + std::to_string(i), "v");
    auto wire = Encode(e);
    REQUIRE(wire.ok());
    CHECK(Decode(wire->span(), {.max_tables = 11}).ok());  // root + 10 headers
    auto back = Decode(wire->span(), {.max_tables = 10});
    CHECK(back.status().code() == absl::StatusCode::kDataLoss);
  }
  SECTION("a shape vector 4 bytes off its 8-byte alignment") {
    // Found by tensor_event_fuzz: the Verifier passed it and the int64 elements were
    // read misaligned. Shape {1, 5}: moving the shape offset 4 bytes on makes the low
    // half of the first element a length of 1, followed by one 8-byte element at an
    // address 4 bytes off.
    Event e;
    e.shape = {1, 5};
    auto wire = Encode(e);
    REQUIRE(wire.ok());
    std::vector<std::byte> bad = Bytes(*wire);
    auto u32 = [&](std::size_t at) {
      std::uint32_t v;
      std::memcpy(&v, bad.data() + at, 4);
      return v;
    };
    const std::size_t table = u32(0);
    const std::size_t vtable = table - static_cast<std::int32_t>(u32(table));
    std::uint16_t field;
    std::memcpy(&field, bad.data() + vtable + 4 + 2 * 18, 2);  // shape is field id 18
    REQUIRE(field != 0);
    const std::size_t at = table + field;
    const std::uint32_t moved = u32(at) + 4;
    std::memcpy(bad.data() + at, &moved, 4);
    auto back = Decode(bad);
    REQUIRE(back.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(back.status().message()) ==
          "TensorEvent field shape (int64 elements) is not 8-byte aligned: it starts at "
          "buffer offset " + std::to_string(at + moved + 4));
  }
  SECTION("bad enum values") {
    auto qos = Decode(Build({.qos = 3}));
    REQUIRE(qos.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(qos.status().message()) ==
          "TensorEvent field qos holds 3, not a Qos value (0..2)");
    auto dtype = Decode(Build({.dtype = 200}));
    REQUIRE(dtype.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(dtype.status().message()) ==
          "TensorEvent field dtype holds 200, not a DType value (0..11)");
    auto codec = Decode(Build({.codec = 2}));
    REQUIRE(codec.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(codec.status().message()) ==
          "TensorEvent field codec holds 2, not a Codec value (0..1)");
  }
  SECTION("negative ttl") {
    auto back = Decode(Build({.ttl_ns = -5}));
    REQUIRE(back.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(back.status().message()) ==
          "TensorEvent field ttl_ns holds -5, a negative time to live");
  }
  SECTION("a repeated header name") {
    auto back = Decode(Build({.header_keys = {"a", "b", "a"}}));
    REQUIRE(back.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(back.status().message()) ==
          "TensorEvent header 'a' appears more than once (again at entry 2)");
  }
  SECTION("corrupt zstd payload") {
    auto back = Decode(Build({.codec = 1, .uncompressed_size = 5, .payload = "not zstd data"}));
    REQUIRE(back.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(back.status().message()) ==
          "TensorEvent payload (zstd, 13 bytes) fails to decompress: zstd data is corrupt in "
          "input bytes 0..0: Unknown frame descriptor");
  }
  SECTION("a payload larger than its declared size") {
    Event e;
    e.payload = Buffer::FromString(std::string(1000, 'x'));
    auto wire = Encode(e, {.codec = PayloadCodec::kZstd});
    REQUIRE(wire.ok());
    auto good = Decode(wire->span());
    REQUIRE(good.ok());
    // Rebuild with the same compressed bytes but a smaller declared size.
    const auto* t = inferq::wire::GetTensorEvent(wire->data());
    const std::string compressed(reinterpret_cast<const char*>(t->payload()->data()),
                                 t->payload()->size());
    auto back = Decode(Build({.codec = 1, .uncompressed_size = 999, .payload = compressed}));
    REQUIRE(back.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(back.status().message()) ==
          "TensorEvent payload decompresses to more than its uncompressed_size of 999 bytes");
    auto more = Decode(Build({.codec = 1, .uncompressed_size = 1001, .payload = compressed}));
    REQUIRE(more.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(more.status().message()) ==
          "TensorEvent payload decompresses to 1000 bytes, not its uncompressed_size 1001");
  }
  SECTION("the output limit") {
    Event e;
    e.payload = Buffer::FromString(std::string(1000, 'x'));
    auto wire = Encode(e, {.codec = PayloadCodec::kZstd});
    REQUIRE(wire.ok());
    CHECK(Decode(wire->span(), {.max_payload_bytes = 1000}).ok());
    auto back = Decode(wire->span(), {.max_payload_bytes = 999});
    REQUIRE(back.status().code() == absl::StatusCode::kResourceExhausted);
    const auto* t = inferq::wire::GetTensorEvent(wire->data());
    CHECK(std::string(back.status().message()) ==
          "TensorEvent payload of 1000 bytes (uncompressed_size; " +
              std::to_string(t->payload()->size()) +
              " compressed) exceeds max_payload_bytes 999");
    auto raw = Encode(e);
    REQUIRE(raw.ok());
    auto back_raw = Decode(raw->span(), {.max_payload_bytes = 999});
    REQUIRE(back_raw.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(std::string(back_raw.status().message()) ==
          "TensorEvent payload of 1000 bytes exceeds max_payload_bytes 999");
  }
  SECTION("a dictionary the decoder lacks") {
    auto back = Decode(Build({.codec = 1, .dictionary_id = 9, .uncompressed_size = 1,
                              .payload = "z"}));
    REQUIRE(back.status().code() == absl::StatusCode::kNotFound);
    CHECK(std::string(back.status().message()) ==
          "TensorEvent payload is compressed with zstd dictionary 9, which "
          "DecodeOptions::dictionaries lacks");
  }
  SECTION("codec none with a declared size") {
    auto back = Decode(Build({.uncompressed_size = 4, .payload = "abcd"}));
    REQUIRE(back.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(back.status().message()) ==
          "TensorEvent payload has codec none but dictionary_id 0 and uncompressed_size 4 "
          "(both must be 0)");
  }
}

namespace {

using inferq::ZstdDictionaries;
using inferq::ZstdDictionary;
using inferq_test::TokenSamples;
using inferq_test::TrainOrDie;

const inferq::wire::TensorEvent* Wire(const Buffer& b) {
  return inferq::wire::GetTensorEvent(b.data());
}
std::string WirePayload(const Buffer& b) {
  const auto* p = Wire(b)->payload();
  return p == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(p->data()), p->size());
}

}  // namespace

TEST_CASE("a payload compressed with a trained dictionary round-trips through the wire") {
  std::shared_ptr<const ZstdDictionary> dict = TrainOrDie(31);
  ZstdDictionaries dicts;
  REQUIRE(dicts.Add(dict).ok());
  Event e = FullEvent();
  const std::string text = TokenSamples(32, 1)[0];
  e.payload = Buffer::FromString(text);
  auto wire = Encode(e, {.codec = PayloadCodec::kZstd, .dictionary = dict.get()});
  REQUIRE(wire.ok());
  CHECK(Wire(*wire)->codec() == inferq::wire::Codec::Zstd);
  CHECK(Wire(*wire)->dictionary_id() == dict->id());
  CHECK(Wire(*wire)->uncompressed_size() == text.size());
  CHECK(*inferq::ZstdDecompress(WirePayload(*wire), &dicts) == text);

  auto back = Decode(wire->span(), {.dictionaries = &dicts});
  REQUIRE(back.ok());
  CheckSameEvent(e, *back);  // decompressed: codec none, dictionary_id 0, same bytes

  SECTION("without the dictionary: NotFound naming its id") {
    ZstdDictionaries other;
    REQUIRE(other.Add(TrainOrDie(33)).ok());
    auto r = Decode(wire->span(), {.dictionaries = &other});
    REQUIRE(r.status().code() == absl::StatusCode::kNotFound);
    CHECK(std::string(r.status().message()) ==
          "TensorEvent payload is compressed with zstd dictionary " + std::to_string(dict->id()) +
              ", which DecodeOptions::dictionaries lacks");
  }
  SECTION("keep_compressed: the event carries the compressed payload and its codec") {
    auto kept = Decode(wire->span(), {.keep_compressed = true});  // no dictionary needed
    REQUIRE(kept.ok());
    CHECK(kept->codec == PayloadCodec::kZstd);
    CHECK(kept->dictionary_id == dict->id());
    CHECK(kept->payload.view() == WirePayload(*wire));
    auto raw = inferq::TranscodePayload(*kept, PayloadCodec::kNone, {.dictionaries = &dicts});
    REQUIRE(raw.ok());
    CHECK(raw->bytes.view() == text);
    // And it re-encodes byte for byte.
    auto again = Encode(*kept, {.codec = PayloadCodec::kZstd, .dictionary = dict.get()});
    REQUIRE(again.ok());
    CHECK(Bytes(*again) == Bytes(*wire));
  }
  SECTION("keep_compressed on a raw payload changes nothing") {
    Event small;
    small.payload = Buffer::FromString("abc");
    auto w = Encode(small);
    REQUIRE(w.ok());
    auto kept = Decode(w->span(), {.keep_compressed = true});
    REQUIRE(kept.ok());
    CHECK(kept->codec == PayloadCodec::kNone);
    CHECK(kept->payload.view() == "abc");
  }
}

TEST_CASE("Encode writes a payload already in the requested codec through, not recompressed") {
  const std::string text = TokenSamples(34, 50)[0] + TokenSamples(35, 1)[0];
  // Level 19 and level 1 give different bytes: byte identity below proves the payload
  // was not recompressed at Encode's level 1.
  const std::string z19 = *inferq::ZstdCompress(text, 19);
  REQUIRE(z19 != *inferq::ZstdCompress(text, 1));
  Event e;
  e.payload = Buffer::FromString(z19);
  e.codec = PayloadCodec::kZstd;

  SECTION("zstd without a dictionary") {
    auto wire = Encode(e, {.codec = PayloadCodec::kZstd, .zstd_level = 1});
    REQUIRE(wire.ok());
    CHECK(WirePayload(*wire) == z19);
    CHECK(Wire(*wire)->dictionary_id() == 0);
    CHECK(Wire(*wire)->uncompressed_size() == text.size());
    auto back = Decode(wire->span());
    REQUIRE(back.ok());
    CHECK(back->payload.view() == text);
  }
  SECTION("zstd with a dictionary") {
    std::shared_ptr<const ZstdDictionary> dict = TrainOrDie(36);
    const std::string zd = *inferq::ZstdCompress(text, *dict);
    e.payload = Buffer::FromString(zd);
    e.dictionary_id = dict->id();
    auto wire = Encode(e, {.codec = PayloadCodec::kZstd, .dictionary = dict.get()});
    REQUIRE(wire.ok());
    CHECK(WirePayload(*wire) == zd);
    CHECK(Wire(*wire)->dictionary_id() == dict->id());
    CHECK(Wire(*wire)->uncompressed_size() == text.size());
  }
  SECTION("another codec is transcoded") {
    auto wire = Encode(e, {.codec = PayloadCodec::kNone});
    REQUIRE(wire.ok());
    CHECK(WirePayload(*wire) == text);
    CHECK(Wire(*wire)->codec() == inferq::wire::Codec::None);
    CHECK(Wire(*wire)->uncompressed_size() == 0);
  }
  SECTION("another dictionary is transcoded") {
    std::shared_ptr<const ZstdDictionary> dict = TrainOrDie(37);
    ZstdDictionaries dicts;
    REQUIRE(dicts.Add(dict).ok());
    auto wire = Encode(e, {.codec = PayloadCodec::kZstd, .dictionary = dict.get()});
    REQUIRE(wire.ok());
    CHECK(Wire(*wire)->dictionary_id() == dict->id());
    auto back = Decode(wire->span(), {.dictionaries = &dicts});
    REQUIRE(back.ok());
    CHECK(back->payload.view() == text);
  }
}

TEST_CASE("Encode rejects an inconsistent payload codec, naming the value") {
  Event e;
  e.payload = Buffer::FromString("abcdef");
  SECTION("a dictionary with codec none") {
    std::shared_ptr<const ZstdDictionary> dict = TrainOrDie(38);
    auto r = Encode(e, {.codec = PayloadCodec::kNone, .dictionary = dict.get()});
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()) == "EncodeOptions: zstd dictionary " +
                                                   std::to_string(dict->id()) +
                                                   " given with payload codec none");
  }
  SECTION("a raw payload with a dictionary id") {
    e.dictionary_id = 12;
    auto r = Encode(e);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()) ==
          "event payload has codec none but dictionary_id 12 (must be 0)");
  }
  SECTION("a zstd payload that does not record its content size") {
    // Streamed with no pledged size: the frame header has no content size.
    std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx(ZSTD_createCCtx(), &ZSTD_freeCCtx);
    std::string out(256, '\0');
    ZSTD_inBuffer in{"abcdef", 6, 0};
    ZSTD_outBuffer ob{out.data(), out.size(), 0};
    REQUIRE(!ZSTD_isError(ZSTD_compressStream2(cctx.get(), &ob, &in, ZSTD_e_continue)));
    ZSTD_inBuffer none{nullptr, 0, 0};
    REQUIRE(ZSTD_compressStream2(cctx.get(), &ob, &none, ZSTD_e_end) == 0);
    out.resize(ob.pos);
    REQUIRE(ZSTD_getFrameContentSize(out.data(), out.size()) == ZSTD_CONTENTSIZE_UNKNOWN);
    e.payload = Buffer::FromString(out);
    e.codec = PayloadCodec::kZstd;
    auto r = Encode(e, {.codec = PayloadCodec::kZstd});
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()) ==
          "event payload (zstd, " + std::to_string(out.size()) +
              " bytes): zstd frame at offset 0 does not record its content size");
    // Transcoding it works: the streaming decoder does not need the size.
    auto raw = Encode(e, {.codec = PayloadCodec::kNone});
    REQUIRE(raw.ok());
    CHECK(WirePayload(*raw) == "abcdef");
  }
  SECTION("a dictionary_id its frame does not name") {
    e.payload = Buffer::FromString(*inferq::ZstdCompress("abcdef"));
    e.codec = PayloadCodec::kZstd;
    e.dictionary_id = 77;
    auto r = Encode(e, {.codec = PayloadCodec::kNone});  // 77 is not in any set
    REQUIRE(r.status().code() == absl::StatusCode::kNotFound);
    CHECK(std::string(r.status().message()).find("needs zstd dictionary 77") != std::string::npos);
  }
}

TEST_CASE("keep_compressed checks the zstd frame headers against the wire fields") {
  const std::string z = *inferq::ZstdCompress("hello hello hello");
  SECTION("a size mismatch") {
    auto r = Decode(Build({.codec = 1, .uncompressed_size = 18, .payload = z}),
                    {.keep_compressed = true});
    REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(r.status().message()) ==
          "TensorEvent payload's zstd frames hold 17 bytes, not its uncompressed_size 18");
  }
  SECTION("a dictionary_id the frame does not name") {
    auto r = Decode(Build({.codec = 1, .dictionary_id = 5, .uncompressed_size = 17, .payload = z}),
                    {.keep_compressed = true});
    REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(r.status().message()) ==
          "TensorEvent payload has dictionary_id 5 but its zstd frame names no dictionary");
  }
  SECTION("a frame naming another dictionary than the field") {
    std::shared_ptr<const ZstdDictionary> dict = TrainOrDie(39);
    const std::string zd = *inferq::ZstdCompress("hello hello hello", *dict);
    for (bool keep : {true, false}) {
      auto r = Decode(Build({.codec = 1, .dictionary_id = 5, .uncompressed_size = 17, .payload = zd}),
                      {.keep_compressed = keep});
      REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
      CHECK(std::string(r.status().message()) ==
            "TensorEvent payload has dictionary_id 5 but its zstd frame names dictionary " +
                std::to_string(dict->id()));
    }
  }
  SECTION("not zstd at all") {
    auto r = Decode(Build({.codec = 1, .uncompressed_size = 5, .payload = "not zstd data"}),
                    {.keep_compressed = true});
    REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(r.status().message()) ==
          "TensorEvent payload (zstd, 13 bytes): zstd data has no valid frame header at offset 0");
  }
}
