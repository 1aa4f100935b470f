#include "inferq/event/codec.hpp"

#include <algorithm>
#include <memory>
#include <string>

#include <zstd.h>

#include "absl/status/status.h"

namespace inferq {

absl::StatusOr<std::string> ZstdCompress(std::string_view input, int level) {
  if (level < 1 || level > ZSTD_maxCLevel()) {
    return absl::InvalidArgumentError("zstd level " + std::to_string(level) +
                                      " is outside 1.." + std::to_string(ZSTD_maxCLevel()));
  }
  std::string out(ZSTD_compressBound(input.size()), '\0');
  const std::size_t n = ZSTD_compress(out.data(), out.size(), input.data(), input.size(), level);
  if (ZSTD_isError(n)) {
    return absl::InternalError(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  }
  out.resize(n);
  return out;
}

absl::StatusOr<std::string> ZstdDecompress(std::string_view input, std::size_t max_output) {
  if (input.size() < 4) {
    return absl::InvalidArgumentError("input of " + std::to_string(input.size()) +
                                      " bytes is too short to be zstd data");
  }
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> ctx(ZSTD_createDCtx(), &ZSTD_freeDCtx);
  if (!ctx) return absl::ResourceExhaustedError("cannot allocate a zstd context");
  std::string out;
  std::string chunk(ZSTD_DStreamOutSize(), '\0');
  ZSTD_inBuffer in{input.data(), input.size(), 0};
  std::size_t last = 0;  // 0 when the last call finished a frame
  while (in.pos < in.size) {
    ZSTD_outBuffer ob{chunk.data(), chunk.size(), 0};
    const std::size_t before = in.pos;
    last = ZSTD_decompressStream(ctx.get(), &ob, &in);
    if (ZSTD_isError(last)) {
      // libzstd does not say which byte was bad, only which call failed: name the
      // input range that call was reading.
      return absl::InvalidArgumentError(
          std::string("zstd data is corrupt in input bytes ") + std::to_string(before) + ".." +
          std::to_string(std::max(in.pos, before + 1) - 1) + ": " + ZSTD_getErrorName(last));
    }
    if (out.size() + ob.pos > max_output) {
      return absl::ResourceExhaustedError("zstd output exceeds the limit of " +
                                          std::to_string(max_output) + " bytes");
    }
    out.append(chunk.data(), ob.pos);
  }
  // Flush what the decoder still holds for the current frame.
  while (last != 0) {
    ZSTD_outBuffer ob{chunk.data(), chunk.size(), 0};
    last = ZSTD_decompressStream(ctx.get(), &ob, &in);
    if (ZSTD_isError(last)) {
      return absl::InvalidArgumentError(std::string("zstd data is corrupt at its end: ") +
                                        ZSTD_getErrorName(last));
    }
    if (out.size() + ob.pos > max_output) {
      return absl::ResourceExhaustedError("zstd output exceeds the limit of " +
                                          std::to_string(max_output) + " bytes");
    }
    out.append(chunk.data(), ob.pos);
    if (ob.pos == 0 && last != 0) {
      return absl::DataLossError("zstd data is truncated: the input ends inside a frame (" +
                                 std::to_string(input.size()) + " bytes read)");
    }
  }
  return out;
}

}  // namespace inferq
