#include "inferq/event/codec.hpp"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <zdict.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "absl/status/status.h"

namespace inferq {

namespace {

constexpr std::uint32_t kDictionaryMagic = 0xEC30A437;  // RFC 8878 §5, little-endian

absl::Status CheckLevel(int level) {
  if (level < 1 || level > ZSTD_maxCLevel()) {
    return absl::InvalidArgumentError("zstd level " + std::to_string(level) +
                                      " is outside 1.." + std::to_string(ZSTD_maxCLevel()));
  }
  return absl::OkStatus();
}

std::string Hex4(std::string_view b) {
  char out[16];
  std::snprintf(out, sizeof(out), "%02x %02x %02x %02x", static_cast<unsigned char>(b[0]),
                static_cast<unsigned char>(b[1]), static_cast<unsigned char>(b[2]),
                static_cast<unsigned char>(b[3]));
  return out;
}

// One compression and one decompression context per thread, created on first use
// and reused by every later call on that thread (creating a context costs about
// 20 µs: BENCHMARKS.md, bench_wire). Every call starts with
// ZSTD_{C,D}Ctx_reset(ZSTD_reset_session_and_parameters), which also drops a
// referenced CDict/DDict, and then sets what it needs: nothing one call sets (level,
// dictionary, a half-finished frame after an error) reaches the next.
// A context keeps the largest workspace it has needed (libzstd shrinks it again
// after many calls that need far less): see codec.hpp's thread-safety note.
struct ThreadContexts {
  ZSTD_CCtx* cctx = nullptr;
  ZSTD_DCtx* dctx = nullptr;
  std::string chunk;  // streaming decompression's output window (ZSTD_DStreamOutSize)
  ThreadContexts() = default;
  ThreadContexts(const ThreadContexts&) = delete;
  ThreadContexts& operator=(const ThreadContexts&) = delete;
  ~ThreadContexts() {
    ZSTD_freeCCtx(cctx);
    ZSTD_freeDCtx(dctx);
  }
};

ThreadContexts& Contexts() {
  thread_local ThreadContexts contexts;
  return contexts;
}

// This thread's compression context, reset to defaults; nullptr when libzstd cannot
// allocate one.
ZSTD_CCtx* FreshCCtx() {
  ThreadContexts& t = Contexts();
  if (t.cctx == nullptr) t.cctx = ZSTD_createCCtx();
  if (t.cctx == nullptr) return nullptr;
  // Cannot fail between frames; a frame left unfinished by an error is dropped.
  ZSTD_CCtx_reset(t.cctx, ZSTD_reset_session_and_parameters);
  return t.cctx;
}

// `brand_new`: replace the thread's context by a newly created one first.
ZSTD_DCtx* FreshDCtx(bool brand_new = false) {
  ThreadContexts& t = Contexts();
  if (brand_new && t.dctx != nullptr) {
    ZSTD_freeDCtx(t.dctx);
    t.dctx = nullptr;
  }
  if (t.dctx == nullptr) t.dctx = ZSTD_createDCtx();
  if (t.dctx == nullptr) return nullptr;
  ZSTD_DCtx_reset(t.dctx, ZSTD_reset_session_and_parameters);
  return t.dctx;
}

absl::Status ContextError() {
  return absl::ResourceExhaustedError("cannot allocate a zstd context");
}

}  // namespace

ZstdDictionary::~ZstdDictionary() {
  ZSTD_freeCDict(cdict_);
  ZSTD_freeDDict(ddict_);
}

absl::StatusOr<std::shared_ptr<const ZstdDictionary>> ZstdDictionary::FromBytes(std::string bytes,
                                                                                int level) {
  if (absl::Status s = CheckLevel(level); !s.ok()) return s;
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError("zstd dictionary of " + std::to_string(bytes.size()) +
                                      " bytes is too short (a dictionary starts with an "
                                      "8-byte magic and id)");
  }
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::uint32_t magic = u[0] | (u[1] << 8) | (u[2] << 16) | (std::uint32_t{u[3]} << 24);
  if (magic != kDictionaryMagic) {
    return absl::InvalidArgumentError("not a zstd dictionary: it starts with bytes " +
                                      Hex4(bytes) + ", not the magic 37 a4 30 ec");
  }
  const std::uint32_t id = ZDICT_getDictID(bytes.data(), bytes.size());
  if (id == 0) {
    return absl::InvalidArgumentError(
        "zstd dictionary has id 0: frames compressed with it could not name it (use a "
        "dictionary with a nonzero id)");
  }
  std::shared_ptr<ZstdDictionary> d(new ZstdDictionary(std::move(bytes), id, level));
  d->cdict_ = ZSTD_createCDict(d->bytes_.data(), d->bytes_.size(), level);
  d->ddict_ = ZSTD_createDDict(d->bytes_.data(), d->bytes_.size());
  if (d->cdict_ == nullptr || d->ddict_ == nullptr) {
    return absl::InvalidArgumentError("zstd dictionary " + std::to_string(id) + " (" +
                                      std::to_string(d->bytes_.size()) +
                                      " bytes) is corrupt: libzstd cannot load its entropy "
                                      "tables");
  }
  return std::shared_ptr<const ZstdDictionary>(std::move(d));
}

absl::StatusOr<std::shared_ptr<const ZstdDictionary>> ZstdDictionary::Train(
    std::span<const std::string> samples, std::size_t max_bytes, int level) {
  if (absl::Status s = CheckLevel(level); !s.ok()) return s;
  if (samples.empty()) {
    return absl::InvalidArgumentError("zstd dictionary training needs samples; got none");
  }
  if (max_bytes < 256 || max_bytes > (std::size_t{1} << 31)) {
    return absl::InvalidArgumentError("zstd dictionary max_bytes " + std::to_string(max_bytes) +
                                      " is outside 256..2147483648");
  }
  std::size_t total = 0;
  for (const std::string& s : samples) total += s.size();
  if (total == 0 || total > (std::size_t{1} << 32) || samples.size() > 0xFFFFFFFFu) {
    return absl::InvalidArgumentError("zstd dictionary samples total " + std::to_string(total) +
                                      " bytes in " + std::to_string(samples.size()) +
                                      " samples; need 1 byte to 4 GiB");
  }
  std::string joined;
  joined.reserve(total);
  std::vector<std::size_t> sizes;
  sizes.reserve(samples.size());
  for (const std::string& s : samples) {
    joined += s;
    sizes.push_back(s.size());
  }
  std::string dict(max_bytes, '\0');
  const std::size_t n = ZDICT_trainFromBuffer(dict.data(), dict.size(), joined.data(),
                                              sizes.data(), static_cast<unsigned>(sizes.size()));
  if (ZDICT_isError(n)) {
    return absl::FailedPreconditionError(
        std::string("zstd dictionary training failed: ") + ZDICT_getErrorName(n) + " (" +
        std::to_string(samples.size()) + " samples, " + std::to_string(total) +
        " bytes; ZDICT needs many samples, about 100x max_bytes " + std::to_string(max_bytes) +
        " in total)");
  }
  dict.resize(n);
  return FromBytes(std::move(dict), level);
}

absl::Status ZstdDictionaries::Add(std::shared_ptr<const ZstdDictionary> dictionary) {
  if (dictionary == nullptr) {
    return absl::InvalidArgumentError("ZstdDictionaries::Add: the dictionary is null");
  }
  const std::uint32_t id = dictionary->id();
  auto it = std::lower_bound(dictionaries_.begin(), dictionaries_.end(), id,
                             [](const auto& d, std::uint32_t v) { return d->id() < v; });
  if (it != dictionaries_.end() && (*it)->id() == id) {
    return absl::AlreadyExistsError("a zstd dictionary with id " + std::to_string(id) +
                                    " is already in the set");
  }
  dictionaries_.insert(it, std::move(dictionary));
  return absl::OkStatus();
}

const ZstdDictionary* ZstdDictionaries::Find(std::uint32_t id) const {
  auto it = std::lower_bound(dictionaries_.begin(), dictionaries_.end(), id,
                             [](const auto& d, std::uint32_t v) { return d->id() < v; });
  return it != dictionaries_.end() && (*it)->id() == id ? it->get() : nullptr;
}

absl::StatusOr<std::string> ZstdCompress(std::string_view input, const ZstdDictionary& dictionary) {
  ZSTD_CCtx* ctx = FreshCCtx();
  if (ctx == nullptr) return ContextError();
  std::string out(ZSTD_compressBound(input.size()), '\0');
  // The CDict brings its level; the reset left content size on and the dictionary id
  // in the frame header (libzstd's defaults), as ZSTD_compress_usingCDict writes them.
  std::size_t n = ZSTD_CCtx_refCDict(ctx, dictionary.cdict());
  if (!ZSTD_isError(n)) {
    n = ZSTD_compress2(ctx, out.data(), out.size(), input.data(), input.size());
  }
  if (ZSTD_isError(n)) {
    return absl::InternalError("zstd compression with dictionary " +
                               std::to_string(dictionary.id()) +
                               " failed: " + ZSTD_getErrorName(n));
  }
  out.resize(n);
  return out;
}

absl::StatusOr<ZstdFrameInfo> ZstdFrameHeaders(std::string_view input) {
  ZstdFrameInfo info;
  if (input.empty()) {
    return absl::InvalidArgumentError("zstd data is empty: no frame header");
  }
  info.dictionary_id = ZSTD_getDictID_fromFrame(input.data(), input.size());
  std::size_t pos = 0;
  while (pos < input.size()) {
    const char* p = input.data() + pos;
    const std::size_t left = input.size() - pos;
    const unsigned long long size = ZSTD_getFrameContentSize(p, left);
    if (size == ZSTD_CONTENTSIZE_ERROR) {
      return absl::InvalidArgumentError("zstd data has no valid frame header at offset " +
                                        std::to_string(pos));
    }
    if (size == ZSTD_CONTENTSIZE_UNKNOWN) {
      return absl::InvalidArgumentError("zstd frame at offset " + std::to_string(pos) +
                                        " does not record its content size");
    }
    const std::size_t frame = ZSTD_findFrameCompressedSize(p, left);
    if (ZSTD_isError(frame)) {
      return absl::InvalidArgumentError("zstd frame at offset " + std::to_string(pos) +
                                        " is incomplete or corrupt: " + ZSTD_getErrorName(frame));
    }
    if (size > UINT64_MAX - info.content_size) {
      return absl::InvalidArgumentError("zstd frames' content sizes overflow 64 bits");
    }
    info.content_size += size;
    pos += frame;
  }
  return info;
}

absl::StatusOr<std::string> ZstdCompress(std::string_view input, int level) {
  if (absl::Status s = CheckLevel(level); !s.ok()) return s;
  ZSTD_CCtx* ctx = FreshCCtx();
  if (ctx == nullptr) return ContextError();
  std::string out(ZSTD_compressBound(input.size()), '\0');
  std::size_t n = ZSTD_CCtx_setParameter(ctx, ZSTD_c_compressionLevel, level);
  if (!ZSTD_isError(n)) {
    n = ZSTD_compress2(ctx, out.data(), out.size(), input.data(), input.size());
  }
  if (ZSTD_isError(n)) {
    return absl::InternalError(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  }
  out.resize(n);
  return out;
}

namespace {

// ZstdDecompress on this thread's context (`brand_new`: a newly created one).
absl::StatusOr<std::string> DecompressOn(bool brand_new, std::string_view input,
                                         const ZstdDictionaries* dictionaries,
                                         std::size_t max_output) {
  if (input.size() < 4) {
    return absl::InvalidArgumentError("input of " + std::to_string(input.size()) +
                                      " bytes is too short to be zstd data");
  }
  ZSTD_DCtx* ctx = FreshDCtx(brand_new);
  if (ctx == nullptr) return ContextError();
  // The dictionary id the first frame's header names (0: none, or no valid header).
  const unsigned frame_dictionary = ZSTD_getDictID_fromFrame(input.data(), input.size());
  if (const unsigned id = frame_dictionary; id != 0 && dictionaries != nullptr) {
    const ZstdDictionary* d = dictionaries->Find(id);
    if (d == nullptr) {
      return absl::NotFoundError("zstd data was compressed with dictionary " +
                                 std::to_string(id) + ", which is not in the dictionary set (" +
                                 std::to_string(dictionaries->size()) + " dictionaries)");
    }
    const std::size_t r = ZSTD_DCtx_refDDict(ctx, d->ddict());
    if (ZSTD_isError(r)) {
      return absl::InternalError(std::string("zstd cannot use dictionary ") + std::to_string(id) +
                                 ": " + ZSTD_getErrorName(r));
    }
  }
  // Fast path: one frame that records a content size of at most kOneShotMaxBytes
  // (and within the limit) is decompressed in one call straight into an output of
  // that size. libzstd checks that the frame really produces that many bytes. The
  // bound keeps a lying header of a few bytes from making us allocate up to
  // `max_output` before libzstd finds the lie; larger frames stream, as before. On
  // any error the streaming path below decodes the input again from a reset
  // context; it reports errors precisely and checks the limit on what it produces.
  constexpr unsigned long long kOneShotMaxBytes = 1 << 20;
  if (const unsigned long long size = ZSTD_getFrameContentSize(input.data(), input.size());
      size != ZSTD_CONTENTSIZE_UNKNOWN && size != ZSTD_CONTENTSIZE_ERROR &&
      size <= kOneShotMaxBytes && size <= max_output &&
      ZSTD_findFrameCompressedSize(input.data(), input.size()) == input.size()) {
    std::string out(static_cast<std::size_t>(size), '\0');
    const std::size_t n = ZSTD_decompressDCtx(ctx, out.data(), out.size(), input.data(),
                                              input.size());
    if (!ZSTD_isError(n) && n == out.size()) return out;
    // The error left the context mid-frame: start it over, with the same dictionary.
    ZSTD_DCtx_reset(ctx, ZSTD_reset_session_only);
  }
  std::string out;
  std::string& chunk = Contexts().chunk;
  if (chunk.size() != ZSTD_DStreamOutSize()) chunk.assign(ZSTD_DStreamOutSize(), '\0');
  ZSTD_inBuffer in{input.data(), input.size(), 0};
  std::size_t last = 0;  // 0 when the last call finished a frame
  while (in.pos < in.size) {
    ZSTD_outBuffer ob{chunk.data(), chunk.size(), 0};
    const std::size_t before = in.pos;
    last = ZSTD_decompressStream(ctx, &ob, &in);
    if (ZSTD_isError(last)) {
      // libzstd does not say which byte was bad, only which call failed: name the
      // input range that call was reading.
      // Without a dictionary set, a header naming a dictionary is reported as
      // corruption (it may be garbage that parses as a header), naming the id.
      const bool wants_dictionary = frame_dictionary != 0 && dictionaries == nullptr &&
                                    ZSTD_getErrorCode(last) == ZSTD_error_dictionary_wrong;
      return absl::InvalidArgumentError(
          std::string("zstd data is corrupt in input bytes ") + std::to_string(before) + ".." +
          std::to_string(std::max(in.pos, before + 1) - 1) + ": " + ZSTD_getErrorName(last) +
          (wants_dictionary ? " (its frame header names zstd dictionary " +
                                  std::to_string(frame_dictionary) + "; no dictionaries were given)"
                            : std::string()));
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
    last = ZSTD_decompressStream(ctx, &ob, &in);
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

}  // namespace

absl::StatusOr<std::string> ZstdDecompress(std::string_view input,
                                           const ZstdDictionaries* dictionaries,
                                           std::size_t max_output) {
  absl::StatusOr<std::string> r = DecompressOn(false, input, dictionaries, max_output);
  if (r.ok()) return r;
  // A reused context that failed once can fail the same bytes with another libzstd
  // error the next time ("Data corruption detected", then "Destination buffer is too
  // small", after the same reset: found by tensor_event_fuzz). An error is decided on
  // a newly created context, so the same input always gets the same error.
  return DecompressOn(true, input, dictionaries, max_output);
}

absl::StatusOr<CodedPayload> TranscodePayload(const Event& event, PayloadCodec target,
                                              const TranscodeOptions& options) {
  const auto valid = [](PayloadCodec c) {
    return c == PayloadCodec::kNone || c == PayloadCodec::kZstd;
  };
  if (!valid(event.codec)) {
    return absl::InvalidArgumentError("event payload codec " +
                                      std::to_string(static_cast<int>(event.codec)) +
                                      " is not one of none (0), zstd (1)");
  }
  if (!valid(target)) {
    return absl::InvalidArgumentError("target payload codec " +
                                      std::to_string(static_cast<int>(target)) +
                                      " is not one of none (0), zstd (1)");
  }
  if (event.codec == PayloadCodec::kNone && event.dictionary_id != 0) {
    return absl::InvalidArgumentError("event payload has codec none but dictionary_id " +
                                      std::to_string(event.dictionary_id) + " (must be 0)");
  }
  if (target == PayloadCodec::kZstd && options.dictionary == nullptr) {
    if (absl::Status s = CheckLevel(options.zstd_level); !s.ok()) return s;
  }
  if (event.payload.empty()) return CodedPayload{};
  const std::uint32_t target_dictionary =
      target == PayloadCodec::kZstd && options.dictionary != nullptr ? options.dictionary->id() : 0;
  if (event.codec == target && event.dictionary_id == target_dictionary) {
    return CodedPayload{event.payload, target, target_dictionary};  // shared, not copied
  }

  std::string decompressed;
  std::string_view raw = event.payload.view();
  if (event.codec == PayloadCodec::kZstd) {
    const std::string what = "event payload (zstd, " + std::to_string(raw.size()) +
                             " bytes, dictionary_id " + std::to_string(event.dictionary_id) + ")";
    const unsigned frame_dictionary = ZSTD_getDictID_fromFrame(raw.data(), raw.size());
    if (frame_dictionary != 0 && frame_dictionary != event.dictionary_id) {
      return absl::InvalidArgumentError(what + ": its first frame names dictionary " +
                                        std::to_string(frame_dictionary));
    }
    if (event.dictionary_id != 0 &&
        (options.dictionaries == nullptr || options.dictionaries->Find(event.dictionary_id) == nullptr)) {
      return absl::NotFoundError(what + " needs zstd dictionary " +
                                 std::to_string(event.dictionary_id) +
                                 ", which is not in the dictionary set");
    }
    absl::StatusOr<std::string> r =
        ZstdDecompress(raw, options.dictionaries, options.max_payload_bytes);
    if (!r.ok()) {
      return absl::Status(r.status().code(), what + ": " + std::string(r.status().message()));
    }
    decompressed = *std::move(r);
    raw = decompressed;
  }
  if (target == PayloadCodec::kNone) return CodedPayload{Buffer::FromString(raw)};
  absl::StatusOr<std::string> z = options.dictionary != nullptr
                                      ? ZstdCompress(raw, *options.dictionary)
                                      : ZstdCompress(raw, options.zstd_level);
  if (!z.ok()) return z.status();
  return CodedPayload{Buffer::FromString(*z), PayloadCodec::kZstd, target_dictionary};
}

}  // namespace inferq
