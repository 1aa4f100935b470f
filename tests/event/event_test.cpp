#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "inferq/event/codec.hpp"
#include "inferq/event/event.hpp"
#include "inferq/memory/buffer.hpp"

using inferq::Buffer;

TEST_CASE("a copied Buffer shares its bytes") {
  Buffer a = Buffer::FromString("hello");
  CHECK(a.use_count() == 1);
  Buffer b = a;
  CHECK(b.data() == a.data());
  CHECK(a.use_count() == 2);
  CHECK(b.view() == "hello");
  Buffer c = std::move(b);
  CHECK(b.empty());
  CHECK(b.use_count() == 0);
  CHECK(c.use_count() == 2);
  c = Buffer();
  CHECK(a.use_count() == 1);
}

TEST_CASE("an empty Buffer allocates nothing") {
  Buffer e = Buffer::FromString("");
  CHECK(e.data() == nullptr);
  CHECK(e.size() == 0);
  CHECK(e.view().empty());
}

TEST_CASE("Buffer copies on many threads release the bytes once") {
  Buffer a = Buffer::FromString(std::string(1000, 'z'));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([a, &wrong] {
      for (int i = 0; i < 10000; ++i) {
        Buffer copy = a;
        if (copy.size() != 1000 || copy.view()[999] != 'z') wrong.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(wrong == 0);
  CHECK(a.use_count() == 1);
}

TEST_CASE("headers: exact names, set replaces") {
  inferq::Headers h;
  h.Set("tenant", "acme");
  h.Set("Tenant", "other");
  h.Set("tenant", "acme2");
  CHECK(h.size() == 2);
  CHECK(h.Get("tenant") == "acme2");
  CHECK(h.Get("Tenant") == "other");
  CHECK_FALSE(h.Get("tenan").has_value());
  CHECK_FALSE(h.Get("tenants").has_value());
  CHECK(h.ByteSize() == 6 + 5 + 6 + 5);
  CHECK(h.Erase("Tenant"));
  CHECK_FALSE(h.Erase("Tenant"));
  CHECK(h.size() == 1);
}

TEST_CASE("event stored size counts subject, headers and payload") {
  inferq::Event e;
  e.subject = "a.b";
  e.headers.Set("k", "vv");
  e.payload = Buffer::FromString("12345");
  CHECK(e.StoredSize() == 3 + 3 + 5);
}

TEST_CASE("zstd round trip") {
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "token " + std::to_string(i % 17) + ",";
  auto z = inferq::ZstdCompress(text, 3);
  REQUIRE(z.ok());
  CHECK(z->size() < text.size() / 5);
  auto back = inferq::ZstdDecompress(*z);
  REQUIRE(back.ok());
  CHECK(*back == text);
}

TEST_CASE("zstd: concatenated frames decode to the concatenation") {
  auto a = inferq::ZstdCompress("first,");
  auto b = inferq::ZstdCompress("second");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto back = inferq::ZstdDecompress(*a + *b);
  REQUIRE(back.ok());
  CHECK(*back == "first,second");
}

TEST_CASE("zstd: bad input is an error naming what failed") {
  SECTION("not zstd") {
    auto r = inferq::ZstdDecompress("this is plain text, not zstd");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).rfind("zstd data is corrupt in input bytes 0..", 0) == 0);
  }
  SECTION("too short") {
    auto r = inferq::ZstdDecompress("ab");
    REQUIRE_FALSE(r.ok());
    CHECK(std::string(r.status().message()) ==
          "input of 2 bytes is too short to be zstd data");
  }
  SECTION("truncated") {
    auto z = inferq::ZstdCompress(std::string(100000, 'q') + "tail", 1);
    REQUIRE(z.ok());
    auto r = inferq::ZstdDecompress(z->substr(0, z->size() - 3));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kDataLoss);
  }
  SECTION("output limit") {
    auto z = inferq::ZstdCompress(std::string(1 << 20, 'q'));
    REQUIRE(z.ok());
    auto r = inferq::ZstdDecompress(*z, 1000);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  }
  SECTION("bad level") {
    auto r = inferq::ZstdCompress("x", 0);
    REQUIRE_FALSE(r.ok());
    CHECK(std::string(r.status().message()) == "zstd level 0 is outside 1..22");
  }
}
