// Tests of zstd dictionaries (ZstdDictionary, ZstdDictionaries) and the dictionary
// paths of ZstdCompress / ZstdDecompress / ZstdFrameHeaders.
#include "inferq/event/codec.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <zstd.h>

#include "absl/status/status.h"
#include "token_samples.hpp"

namespace {

using inferq::ZstdDictionaries;
using inferq::ZstdDictionary;

using inferq_test::TokenSamples;
using inferq_test::TrainOrDie;

// What a fresh libzstd context makes of `input`: the reference the per-thread
// contexts of ZstdCompress must match byte for byte.
std::string FreshCompress(const std::string& input, int level) {
  std::string out(ZSTD_compressBound(input.size()), '\0');
  const std::size_t n = ZSTD_compress(out.data(), out.size(), input.data(), input.size(), level);
  REQUIRE(!ZSTD_isError(n));
  out.resize(n);
  return out;
}

std::string FreshCompress(const std::string& input, const ZstdDictionary& dictionary) {
  ZSTD_CCtx* ctx = ZSTD_createCCtx();
  REQUIRE(ctx != nullptr);
  std::string out(ZSTD_compressBound(input.size()), '\0');
  const std::size_t n = ZSTD_compress_usingCDict(ctx, out.data(), out.size(), input.data(),
                                                 input.size(), dictionary.cdict());
  ZSTD_freeCCtx(ctx);
  REQUIRE(!ZSTD_isError(n));
  out.resize(n);
  return out;
}

// A few KiB of token-id text: large enough that levels 1 and 19 give different frames.
std::string LongPayload(std::uint32_t seed) {
  std::string s;
  for (const std::string& t : TokenSamples(seed, 64)) s += t;
  return s;
}

}  // namespace

TEST_CASE("a trained dictionary round-trips a payload and its frames name its id") {
  std::shared_ptr<const ZstdDictionary> dict = TrainOrDie(1);
  CHECK(dict->id() >= 32768);
  CHECK(dict->level() == 3);
  CHECK(dict->bytes().size() <= (8u << 10));
  // Same samples, same dictionary.
  std::shared_ptr<const ZstdDictionary> again = TrainOrDie(1);
  CHECK(again->id() == dict->id());
  CHECK(again->bytes() == dict->bytes());

  ZstdDictionaries set;
  REQUIRE(set.Add(dict).ok());
  const std::string payload = TokenSamples(99, 1)[0];  // not a training sample
  absl::StatusOr<std::string> z = inferq::ZstdCompress(payload, *dict);
  REQUIRE(z.ok());
  absl::StatusOr<inferq::ZstdFrameInfo> info = inferq::ZstdFrameHeaders(*z);
  REQUIRE(info.ok());
  CHECK(info->dictionary_id == dict->id());
  CHECK(info->content_size == payload.size());
  absl::StatusOr<std::string> back = inferq::ZstdDecompress(*z, &set);
  REQUIRE(back.ok());
  CHECK(*back == payload);

  // The point of a dictionary: a small payload compresses better with it.
  absl::StatusOr<std::string> plain = inferq::ZstdCompress(payload, 3);
  REQUIRE(plain.ok());
  CHECK(z->size() < plain->size());
  absl::StatusOr<inferq::ZstdFrameInfo> plain_info = inferq::ZstdFrameHeaders(*plain);
  REQUIRE(plain_info.ok());
  CHECK(plain_info->dictionary_id == 0);
}

TEST_CASE("a dictionary rebuilt from its bytes has the same id and decodes the same frames") {
  std::shared_ptr<const ZstdDictionary> dict = TrainOrDie(2);
  absl::StatusOr<std::shared_ptr<const ZstdDictionary>> copy =
      ZstdDictionary::FromBytes(dict->bytes(), 7);
  REQUIRE(copy.ok());
  CHECK((*copy)->id() == dict->id());
  CHECK((*copy)->level() == 7);
  const std::string payload = TokenSamples(5, 1)[0];
  absl::StatusOr<std::string> z = inferq::ZstdCompress(payload, *dict);
  REQUIRE(z.ok());
  ZstdDictionaries set;
  REQUIRE(set.Add(*copy).ok());
  absl::StatusOr<std::string> back = inferq::ZstdDecompress(*z, &set);
  REQUIRE(back.ok());
  CHECK(*back == payload);
}

TEST_CASE("a frame compressed with dictionary A does not decompress without A") {
  std::shared_ptr<const ZstdDictionary> a = TrainOrDie(3);
  std::shared_ptr<const ZstdDictionary> b = TrainOrDie(4);
  REQUIRE(a->id() != b->id());
  absl::StatusOr<std::string> z = inferq::ZstdCompress(TokenSamples(6, 1)[0], *a);
  REQUIRE(z.ok());
  const std::string a_id = std::to_string(a->id());

  SECTION("a set holding only B") {
    ZstdDictionaries only_b;
    REQUIRE(only_b.Add(b).ok());
    absl::StatusOr<std::string> r = inferq::ZstdDecompress(*z, &only_b);
    REQUIRE(r.status().code() == absl::StatusCode::kNotFound);
    CHECK(std::string(r.status().message()) ==
          "zstd data was compressed with dictionary " + a_id +
              ", which is not in the dictionary set (1 dictionaries)");
  }
  SECTION("an empty set") {
    ZstdDictionaries none;
    absl::StatusOr<std::string> r = inferq::ZstdDecompress(*z, &none);
    REQUIRE(r.status().code() == absl::StatusCode::kNotFound);
    CHECK(std::string(r.status().message()).find("dictionary " + a_id) != std::string::npos);
  }
  SECTION("no set: reported as corrupt data, naming the id") {
    absl::StatusOr<std::string> r = inferq::ZstdDecompress(*z);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message())
              .ends_with(": Dictionary mismatch (its frame header names zstd dictionary " + a_id +
                         "; no dictionaries were given)"));
  }
}

TEST_CASE("a dictionary set refuses a second dictionary with the same id") {
  std::shared_ptr<const ZstdDictionary> a = TrainOrDie(7);
  ZstdDictionaries set;
  REQUIRE(set.Add(a).ok());
  absl::Status dup = set.Add(*ZstdDictionary::FromBytes(a->bytes()));
  CHECK(dup.code() == absl::StatusCode::kAlreadyExists);
  CHECK(std::string(dup.message()) ==
        "a zstd dictionary with id " + std::to_string(a->id()) + " is already in the set");
  CHECK(set.size() == 1);
  CHECK(set.Find(a->id()) == a.get());
  CHECK(set.Find(0) == nullptr);
  CHECK(set.Find(a->id() + 1) == nullptr);
  CHECK(set.Add(nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(set.size() == 1);
}

TEST_CASE("FromBytes rejects what is not a usable zstd dictionary, naming it") {
  SECTION("too short") {
    auto r = ZstdDictionary::FromBytes("\x37\xa4\x30");
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).find("3 bytes is too short") != std::string::npos);
  }
  SECTION("wrong magic") {
    auto r = ZstdDictionary::FromBytes(std::string("\x00\x01\x02\x03\x04\x05\x06\x07", 8));
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()) ==
          "not a zstd dictionary: it starts with bytes 00 01 02 03, not the magic 37 a4 30 ec");
  }
  SECTION("id 0") {
    std::string bytes = TrainOrDie(8)->bytes();
    bytes[4] = bytes[5] = bytes[6] = bytes[7] = '\0';
    auto r = ZstdDictionary::FromBytes(bytes);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).find("has id 0") != std::string::npos);
  }
  SECTION("corrupt entropy tables") {
    std::shared_ptr<const ZstdDictionary> good = TrainOrDie(9);
    std::string bytes = good->bytes();
    for (std::size_t i = 8; i < 72; ++i) bytes[i] = '\xff';
    auto r = ZstdDictionary::FromBytes(bytes);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()) ==
          "zstd dictionary " + std::to_string(good->id()) + " (" +
              std::to_string(bytes.size()) +
              " bytes) is corrupt: libzstd cannot load its entropy tables");
  }
  SECTION("truncated to its header") {
    std::string bytes = TrainOrDie(10)->bytes().substr(0, 12);
    auto r = ZstdDictionary::FromBytes(bytes);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).find("is corrupt") != std::string::npos);
  }
  SECTION("bad level") {
    auto r = ZstdDictionary::FromBytes(TrainOrDie(11)->bytes(), 23);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()) == "zstd level 23 is outside 1..22");
  }
}

TEST_CASE("training fails with a clear error on too few or bad samples") {
  SECTION("too few, too small samples: ZDICT's own reason") {
    std::vector<std::string> few = {"abc", "abd", "abe"};
    auto r = ZstdDictionary::Train(few, 4096);
    REQUIRE(r.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(std::string(r.status().message())
              .starts_with("zstd dictionary training failed: "));
    CHECK(std::string(r.status().message()).find("(3 samples, 9 bytes;") != std::string::npos);
  }
  SECTION("no samples") {
    auto r = ZstdDictionary::Train({}, 4096);
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("only empty samples") {
    std::vector<std::string> empty(10);
    auto r = ZstdDictionary::Train(empty, 4096);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).find("total 0 bytes in 10 samples") !=
          std::string::npos);
  }
  SECTION("max_bytes below 256") {
    auto r = ZstdDictionary::Train(TokenSamples(1, 10), 255);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()) ==
          "zstd dictionary max_bytes 255 is outside 256..2147483648");
  }
}

TEST_CASE("ZstdFrameHeaders sums concatenated frames and rejects non-zstd data") {
  auto a = inferq::ZstdCompress("first,");
  auto b = inferq::ZstdCompress(std::string(1000, 'x'));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto info = inferq::ZstdFrameHeaders(*a + *b);
  REQUIRE(info.ok());
  CHECK(info->content_size == 1006);
  CHECK(info->dictionary_id == 0);

  auto bad = inferq::ZstdFrameHeaders("plain text, not zstd");
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.status().message()) == "zstd data has no valid frame header at offset 0");
  auto cut = inferq::ZstdFrameHeaders(*a + b->substr(0, b->size() - 2));
  REQUIRE(cut.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(cut.status().message()).starts_with("zstd frame at offset " +
                                                        std::to_string(a->size())));
}

TEST_CASE("TranscodePayload shares a payload already in the target form") {
  std::shared_ptr<const ZstdDictionary> dict = TrainOrDie(20);
  inferq::Event e;
  e.payload = inferq::Buffer::FromString(*inferq::ZstdCompress(TokenSamples(21, 1)[0], *dict));
  e.codec = inferq::PayloadCodec::kZstd;
  e.dictionary_id = dict->id();
  auto same = inferq::TranscodePayload(e, inferq::PayloadCodec::kZstd, {.dictionary = dict.get()});
  REQUIRE(same.ok());
  CHECK(same->bytes.data() == e.payload.data());  // the same bytes, not a copy
  CHECK(same->codec == inferq::PayloadCodec::kZstd);
  CHECK(same->dictionary_id == dict->id());

  inferq::Event raw;
  raw.payload = inferq::Buffer::FromString("abc");
  auto none = inferq::TranscodePayload(raw, inferq::PayloadCodec::kNone);
  REQUIRE(none.ok());
  CHECK(none->bytes.data() == raw.payload.data());
}

TEST_CASE("TranscodePayload converts between raw, zstd and zstd with a dictionary") {
  std::shared_ptr<const ZstdDictionary> a = TrainOrDie(22);
  std::shared_ptr<const ZstdDictionary> b = TrainOrDie(23);
  ZstdDictionaries set;
  REQUIRE(set.Add(a).ok());
  REQUIRE(set.Add(b).ok());
  const std::string text = TokenSamples(24, 1)[0];
  inferq::Event raw;
  raw.payload = inferq::Buffer::FromString(text);

  auto with_a = inferq::TranscodePayload(raw, inferq::PayloadCodec::kZstd, {.dictionary = a.get()});
  REQUIRE(with_a.ok());
  CHECK(with_a->codec == inferq::PayloadCodec::kZstd);
  CHECK(with_a->dictionary_id == a->id());
  CHECK(inferq::ZstdFrameHeaders(with_a->bytes.view())->dictionary_id == a->id());

  inferq::Event za;
  za.payload = with_a->bytes;
  za.codec = inferq::PayloadCodec::kZstd;
  za.dictionary_id = a->id();
  auto to_b = inferq::TranscodePayload(za, inferq::PayloadCodec::kZstd,
                                       {.dictionary = b.get(), .dictionaries = &set});
  REQUIRE(to_b.ok());
  CHECK(to_b->dictionary_id == b->id());
  CHECK(*inferq::ZstdDecompress(to_b->bytes.view(), &set) == text);
  auto plain = inferq::TranscodePayload(za, inferq::PayloadCodec::kZstd,
                                        {.zstd_level = 1, .dictionaries = &set});
  REQUIRE(plain.ok());
  CHECK(plain->dictionary_id == 0);
  CHECK(*inferq::ZstdDecompress(plain->bytes.view()) == text);
  auto back = inferq::TranscodePayload(za, inferq::PayloadCodec::kNone, {.dictionaries = &set});
  REQUIRE(back.ok());
  CHECK(back->codec == inferq::PayloadCodec::kNone);
  CHECK(back->dictionary_id == 0);
  CHECK(back->bytes.view() == text);

  SECTION("the dictionary missing: NotFound naming its id") {
    ZstdDictionaries only_b;
    REQUIRE(only_b.Add(b).ok());
    auto r = inferq::TranscodePayload(za, inferq::PayloadCodec::kNone, {.dictionaries = &only_b});
    REQUIRE(r.status().code() == absl::StatusCode::kNotFound);
    CHECK(std::string(r.status().message()) ==
          "event payload (zstd, " + std::to_string(za.payload.size()) + " bytes, dictionary_id " +
              std::to_string(a->id()) + ") needs zstd dictionary " + std::to_string(a->id()) +
              ", which is not in the dictionary set");
  }
  SECTION("a dictionary_id that is not the frame's") {
    inferq::Event wrong = za;
    wrong.dictionary_id = b->id();
    auto r = inferq::TranscodePayload(wrong, inferq::PayloadCodec::kNone, {.dictionaries = &set});
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).ends_with(": its first frame names dictionary " +
                                                       std::to_string(a->id())));
  }
}

TEST_CASE("TranscodePayload rejects an inconsistent event, naming the value") {
  inferq::Event e;
  e.payload = inferq::Buffer::FromString("abc");
  SECTION("codec none with a dictionary id") {
    e.dictionary_id = 5;
    auto r = inferq::TranscodePayload(e, inferq::PayloadCodec::kZstd);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()) ==
          "event payload has codec none but dictionary_id 5 (must be 0)");
  }
  SECTION("an unknown codec") {
    e.codec = static_cast<inferq::PayloadCodec>(7);
    auto r = inferq::TranscodePayload(e, inferq::PayloadCodec::kNone);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()) ==
          "event payload codec 7 is not one of none (0), zstd (1)");
  }
  SECTION("a corrupt zstd payload") {
    e.codec = inferq::PayloadCodec::kZstd;
    auto r = inferq::TranscodePayload(e, inferq::PayloadCodec::kNone);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()) ==
          "event payload (zstd, 3 bytes, dictionary_id 0): input of 3 bytes is too short to "
          "be zstd data");
  }
  SECTION("a bad level") {
    auto r = inferq::TranscodePayload(e, inferq::PayloadCodec::kZstd, {.zstd_level = 0});
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()) == "zstd level 0 is outside 1..22");
  }
  SECTION("an empty payload stays empty and raw") {
    inferq::Event empty;
    empty.codec = inferq::PayloadCodec::kZstd;
    auto r = inferq::TranscodePayload(empty, inferq::PayloadCodec::kZstd);
    REQUIRE(r.ok());
    CHECK(r->bytes.empty());
    CHECK(r->codec == inferq::PayloadCodec::kNone);
  }
}

// The codec keeps one libzstd context per thread; each call must start from
// defaults, so neither a level nor a dictionary of one call reaches the next.
TEST_CASE("one thread alternating dictionaries, levels and no dictionary gets fresh-context results") {
  std::shared_ptr<const ZstdDictionary> a = TrainOrDie(30);
  std::shared_ptr<const ZstdDictionary> b = TrainOrDie(31);
  REQUIRE(a->id() != b->id());
  ZstdDictionaries set;
  REQUIRE(set.Add(a).ok());
  REQUIRE(set.Add(b).ok());
  const std::string small = TokenSamples(32, 1)[0];
  const std::string big = LongPayload(33);
  // Otherwise a leaked level could not show in the bytes.
  REQUIRE(FreshCompress(big, 1) != FreshCompress(big, 19));

  struct Step {
    const std::string* input;
    const ZstdDictionary* dict;  // nullptr: plain zstd at `level`
    int level;
  };
  const Step steps[] = {
      {&big, nullptr, 19}, {&big, nullptr, 1},  {&small, a.get(), 0}, {&small, nullptr, 3},
      {&small, b.get(), 0}, {&small, a.get(), 0}, {&big, nullptr, 1},  {&big, b.get(), 0},
      {&big, nullptr, 19}, {&small, nullptr, 1},
  };
  for (int round = 0; round < 2; ++round) {
    for (const Step& step : steps) {
      INFO("round " << round << ", " << step.input->size() << " bytes, dictionary "
                    << (step.dict ? step.dict->id() : 0) << ", level " << step.level);
      absl::StatusOr<std::string> z = step.dict != nullptr
                                          ? inferq::ZstdCompress(*step.input, *step.dict)
                                          : inferq::ZstdCompress(*step.input, step.level);
      REQUIRE(z.ok());
      CHECK(*z == (step.dict != nullptr ? FreshCompress(*step.input, *step.dict)
                                        : FreshCompress(*step.input, step.level)));
      absl::StatusOr<inferq::ZstdFrameInfo> info = inferq::ZstdFrameHeaders(*z);
      REQUIRE(info.ok());
      CHECK(info->dictionary_id == (step.dict != nullptr ? step.dict->id() : 0));
      absl::StatusOr<std::string> back = inferq::ZstdDecompress(*z, &set);
      REQUIRE(back.ok());
      CHECK(*back == *step.input);
      if (step.dict != nullptr) {
        // The dictionary the last call referenced must not be left on the context:
        // without a set the frame cannot be decoded.
        absl::StatusOr<std::string> none = inferq::ZstdDecompress(*z);
        CHECK(none.status().code() == absl::StatusCode::kInvalidArgument);
      }
    }
  }
}

TEST_CASE("a failed decompression leaves this thread's context usable") {
  const std::string payload = LongPayload(34);
  absl::StatusOr<std::string> z = inferq::ZstdCompress(payload, 3);
  REQUIRE(z.ok());
  SECTION("truncated mid-frame") {
    auto r = inferq::ZstdDecompress(z->substr(0, z->size() / 2));
    CHECK(r.status().code() == absl::StatusCode::kDataLoss);
  }
  SECTION("corrupt block") {
    std::string bad = *z;
    for (std::size_t i = bad.size() / 2; i < bad.size() / 2 + 16; ++i) bad[i] ^= 0x5a;
    auto r = inferq::ZstdDecompress(bad);
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("over the output limit") {
    auto r = inferq::ZstdDecompress(*z, payload.size() - 1);
    CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  }
  auto again = inferq::ZstdDecompress(*z);
  REQUIRE(again.ok());
  CHECK(*again == payload);
}

// Threads each compress and decompress with their own contexts while sharing the
// dictionaries and decoding one another's frames. Runs under ThreadSanitizer.
TEST_CASE("the codec used from several threads at once round-trips every payload") {
  std::shared_ptr<const ZstdDictionary> a = TrainOrDie(35);
  std::shared_ptr<const ZstdDictionary> b = TrainOrDie(36);
  ZstdDictionaries set;
  REQUIRE(set.Add(a).ok());
  REQUIRE(set.Add(b).ok());
  const std::vector<std::string> payloads = TokenSamples(37, 16);
  // Frames made on this thread, decoded on the others.
  std::vector<std::string> frames;
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    auto z = i % 3 == 0   ? inferq::ZstdCompress(payloads[i], *a)
             : i % 3 == 1 ? inferq::ZstdCompress(payloads[i], *b)
                          : inferq::ZstdCompress(payloads[i], 1 + static_cast<int>(i % 5));
    REQUIRE(z.ok());
    frames.push_back(*std::move(z));
  }
  constexpr int kThreads = 4;
  constexpr int kIterations = 200;
  std::atomic<int> failures{0};
  std::atomic<int> round_trips{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIterations; ++i) {
        const std::size_t k = static_cast<std::size_t>(t * 7 + i) % payloads.size();
        const int kind = (t + i) % 4;
        auto z = kind == 0   ? inferq::ZstdCompress(payloads[k], *a)
                 : kind == 1 ? inferq::ZstdCompress(payloads[k], *b)
                             : inferq::ZstdCompress(payloads[k], kind == 2 ? 1 : 9);
        if (!z.ok()) {
          failures.fetch_add(1);
          continue;
        }
        auto own = inferq::ZstdDecompress(*z, &set);
        auto other = inferq::ZstdDecompress(frames[k], &set);
        if (own.ok() && *own == payloads[k] && other.ok() && *other == payloads[k]) {
          round_trips.fetch_add(1);
        } else {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(failures.load() == 0);
  CHECK(round_trips.load() == kThreads * kIterations);
}
