#include "trace.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "inferq/event/codec.hpp"

using inferq::example::ParseTrace;

namespace {
constexpr const char* kHeader = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
std::string Err(std::string_view csv) {
  auto r = ParseTrace(csv, "t.csv");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}
}  // namespace

TEST_CASE("a well-formed trace parses with arrival times relative to the first row") {
  const std::string csv = std::string(kHeader) +
                          "2023-11-16 18:15:46.6805900,374,44\r\n"
                          "2023-11-16 18:15:50.9951690,396,109\n"
                          "2023-11-16 18:15:50.9951690,1,1";  // no final newline
  auto r = ParseTrace(csv, "t.csv");
  REQUIRE(r.ok());
  REQUIRE(r->size() == 3);
  CHECK((*r)[0].arrival_us == 0);
  CHECK((*r)[0].context_tokens == 374);
  CHECK((*r)[0].generated_tokens == 44);
  CHECK((*r)[1].arrival_us == 4'314'579);  // 50.9951690 - 46.6805900 s, truncated to µs
  CHECK((*r)[2].arrival_us == 4'314'579);
  CHECK((*r)[2].generated_tokens == 1);
}

TEST_CASE("malformed rows name the line and the field") {
  const std::string ok_row = "2023-11-16 18:15:46.6805900,374,44\n";
  CHECK(Err("TIMESTAMP,Context,Generated\n") ==
        "t.csv line 1: header 'TIMESTAMP,Context,Generated' is not "
        "'TIMESTAMP,ContextTokens,GeneratedTokens'");
  CHECK(Err(std::string(kHeader) + ok_row + "2023-11-16 18:15:47,12x,5\n") ==
        "t.csv line 3: field ContextTokens '12x' is not an integer");
  CHECK(Err(std::string(kHeader) + ok_row + "2023-11-16 18:15:47,12,\n") ==
        "t.csv line 3: field GeneratedTokens '' is not an integer");
  CHECK(Err(std::string(kHeader) + "2023-11-16 18:15:47,12,0\n") ==
        "t.csv line 2: field GeneratedTokens '0' is out of range 1..1000000");
  CHECK(Err(std::string(kHeader) + "2023-11-16 18:15:47,-3,5\n") ==
        "t.csv line 2: field ContextTokens '-3' is not an integer");
  CHECK(Err(std::string(kHeader) + "2023-11-16 18:15:47,99999999999999999999999,5\n") ==
        "t.csv line 2: field ContextTokens '99999999999999999999999' is out of range "
        "1..1000000");
  CHECK(Err(std::string(kHeader) + "2023-11-16 18:15:47,12\n") ==
        "t.csv line 2: field GeneratedTokens is missing: '2023-11-16 18:15:47,12'");
  CHECK(Err(std::string(kHeader) + "2023-11-16 18:15:47,12,5,7\n") ==
        "t.csv line 2: has more than 3 fields: '2023-11-16 18:15:47,12,5,7'");
  CHECK(Err(std::string(kHeader) + ok_row + "\n" + ok_row) == "t.csv line 3: line is empty");
  CHECK(Err(std::string(kHeader) + ok_row + "2023-11-16 18:15:45.0,1,1\n") ==
        "t.csv line 3: field TIMESTAMP '2023-11-16 18:15:45.0' is earlier than the line "
        "before: the trace must be sorted by time");
  CHECK(Err(std::string(kHeader)) == "t.csv has no requests");
  CHECK(Err("") == "t.csv is empty");
  // Shapes absl::ParseTime alone would accept (found by an adversarial run).
  for (const char* bad : {"infinite-future", "infinite-past", " 2023-11-16 18:15:47",
                          "2023-11-16 18:15:47 ", "2023-1-16 18:15:47",
                          "2023-11-16 18:15:47.123456789012", "-005-11-16 18:15:47",
                          "2023-11-16 23:59:60", "99999999-11-16 18:15:47",
                          "2023-11-16 18:15:47.", "2023-11-16 18:15:47.5x"}) {
    INFO(bad);
    CHECK(Err(std::string(kHeader) + bad + ",12,5\n") ==
          "t.csv line 2: field TIMESTAMP '" + std::string(bad) +
              "' is not a time 'YYYY-MM-DD HH:MM:SS' with up to 9 fractional digits");
  }
  CHECK(Err(std::string(kHeader) + "2023-11-16\t18:15:47,12,5\n") ==
        "t.csv line 2: field TIMESTAMP '2023-11-16\\x0918:15:47' is not a time "
        "'YYYY-MM-DD HH:MM:SS' with up to 9 fractional digits");
  std::string with_nul = std::string(kHeader) + "2023-11-16 18:15:47";
  with_nul += '\0';
  with_nul += "junk,12,5\n";
  CHECK(Err(with_nul).rfind("t.csv line 2: field TIMESTAMP", 0) == 0);
  const std::string bad_time = Err(std::string(kHeader) + "2023-13-16 18:15:47,12,5\n");
  CHECK(bad_time.rfind("t.csv line 2: field TIMESTAMP '2023-13-16 18:15:47' is not a time", 0) == 0);
}

TEST_CASE("unprintable bytes in a row are quoted as \\xNN, not cut at a NUL") {
  const std::string header = kHeader;
  const std::string row = "2023-11-16 18:15:46.0,374,";
  CHECK(Err(header + row + std::string("1\0x", 3) + "\n") ==
        "t.csv line 2: field GeneratedTokens '1\\x00x' is not an integer");
  CHECK(Err(header + "2023-11-16 18:15:46.0," + std::string("\0", 1) + ",1\n") ==
        "t.csv line 2: field ContextTokens '\\x00' is not an integer");
  CHECK(Err(header + std::string("2023-11-16 18:15:47\0junk", 24) + ",12,5\n") ==
        "t.csv line 2: field TIMESTAMP '2023-11-16 18:15:47\\x00junk' is not a time "
        "'YYYY-MM-DD HH:MM:SS' with up to 9 fractional digits");
  CHECK(Err(header + row + "1'\n") ==
        "t.csv line 2: field GeneratedTokens '1\\x27' is not an integer");
  CHECK(Err("TIMESTAMP\x01,ContextTokens,GeneratedTokens\n") ==
        "t.csv line 1: header 'TIMESTAMP\\x01,ContextTokens,GeneratedTokens' is not "
        "'TIMESTAMP,ContextTokens,GeneratedTokens'");
  CHECK(Err(header + "2023-11-16 18:15:47,1\t2\n") ==
        "t.csv line 2: field GeneratedTokens is missing: '2023-11-16 18:15:47,1\\x092'");
  CHECK(Err(header + row + "1,\x1b[2J\n") ==
        "t.csv line 2: has more than 3 fields: '2023-11-16 18:15:46.0,374,1,\\x1b[2J'");
}

TEST_CASE("LoadTrace reads zstd and plain files and reports a missing one") {
  const std::string csv = std::string(kHeader) +
                          "2023-11-16 18:15:46.0,10,2\n2023-11-16 18:15:47.5,20,3\n";
  const auto dir = std::filesystem::temp_directory_path() /
                   ("inferq_trace_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return (dir / name).string();
  };
  auto z = inferq::ZstdCompress(csv);
  REQUIRE(z.ok());
  const std::string plain_path = write("t.csv", csv);
  const std::string zstd_path = write("t.csv.zst", *z);
  const std::string bad_path = write("bad.csv.zst", z->substr(0, 4) + "garbage after the magic");
  auto plain = inferq::example::LoadTrace(plain_path);
  auto packed = inferq::example::LoadTrace(zstd_path);
  auto bad = inferq::example::LoadTrace(bad_path);
  std::filesystem::remove_all(dir);
  REQUIRE(plain.ok());
  REQUIRE(packed.ok());
  REQUIRE(plain->size() == 2);
  REQUIRE(packed->size() == 2);
  CHECK((*packed)[1].arrival_us == 1'500'000);
  CHECK((*packed)[1].context_tokens == 20);
  CHECK((*plain)[1].generated_tokens == (*packed)[1].generated_tokens);
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).rfind("trace '" + bad_path + "': zstd data is corrupt", 0) == 0);

  auto missing = inferq::example::LoadTrace("/nonexistent/trace.csv");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(missing.status().message()).rfind("cannot open trace '/nonexistent/trace.csv'", 0) == 0);
}
