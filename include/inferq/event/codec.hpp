/// @file inferq/event/codec.hpp
///
/// Payload codecs. zstd (RFC 8878) through libzstd, optionally with a trained
/// dictionary (ZDICT) for small payloads such as token-id arrays; the codec of a
/// payload is an attribute of its event (Event::codec, Event::dictionary_id), so
/// consumers can ask for raw bytes or accept compressed ones. Also used to read
/// zstd-compressed files such as the bundled trace.
///
/// Usage:
/// @code
///   absl::StatusOr<std::string> z = inferq::ZstdCompress(raw, /*level=*/3);
///   absl::StatusOr<std::string> back = inferq::ZstdDecompress(*z);
///
///   // Small payloads: train a dictionary once, share it.
///   auto dict = inferq::ZstdDictionary::Train(samples, /*max_bytes=*/16 << 10);
///   inferq::ZstdDictionaries dicts;
///   dicts.Add(*dict).IgnoreError();
///   auto small = inferq::ZstdCompress(token_ids, **dict);          // frame names dict id
///   auto raw2 = inferq::ZstdDecompress(*small, &dicts);
/// @endcode
///
/// Thread safety: the free functions share no state between threads. Each thread
/// keeps one libzstd compression and one decompression context, created at its first
/// call and freed when it exits, and every call resets them to libzstd's defaults
/// before setting its own level or dictionary (a context costs about 20 µs to create,
/// more than compressing a small payload: BENCHMARKS.md, bench_wire). A context keeps
/// the largest workspace it has needed (libzstd shrinks it after many calls that need
/// far less), so a thread that compressed a large input at a high level holds up to
/// ZSTD_estimateCCtxSize(level) bytes: 1.2 MiB at level 3, 81 MiB at 19, 649 MiB at
/// 22 (libzstd 1.5.4); small inputs need far less. A ZstdDictionary is immutable
/// after creation: any number of threads may compress and decompress with it at once
/// (libzstd's CDict/DDict are read-only). ZstdDictionaries: const methods may be
/// called from any number of threads at once; Add must not run concurrently with
/// anything else on the same set (build the set, then share it, e.g. as
/// std::shared_ptr<const ZstdDictionaries>).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inferq/event/event.hpp"
#include "inferq/memory/buffer.hpp"

// libzstd's opaque types (zstd.h: typedef struct ZSTD_CDict_s ZSTD_CDict;).
struct ZSTD_CDict_s;
struct ZSTD_DDict_s;

namespace inferq {

/// A zstd dictionary (RFC 8878 §5: magic 0xEC30A437, a nonzero dictionary id, entropy
/// tables, content), with libzstd's precompiled compression and decompression forms.
/// Frames compressed with it record its id in their header.
class ZstdDictionary {
 public:
  /// Trains a dictionary of at most `max_bytes` from `samples` (ZDICT_trainFromBuffer,
  /// libzstd's fast-cover trainer) and precompiles it for compression at `level`.
  /// Cost and expectation: training reads every sample (about 6 MB of working memory,
  /// tens of milliseconds to seconds: do it once, offline or at startup, not per
  /// event). ZDICT wants many samples that resemble the payloads to compress: zstd's
  /// guidance is a few thousand samples, about 100 times `max_bytes` in total; with
  /// too few or too small samples it fails rather than return a useless dictionary.
  /// The id is derived from the content (deterministic for the same samples), in
  /// 32768..2^31-1.
  /// Errors: InvalidArgument when `samples` is empty, their total is 0 bytes or
  /// exceeds 4 GiB, `max_bytes` is outside 256..2^31, or `level` is outside 1..22;
  /// FailedPrecondition when ZDICT cannot train from these samples (the message
  /// carries ZDICT_getErrorName and the sample count and total bytes).
  static absl::StatusOr<std::shared_ptr<const ZstdDictionary>> Train(
      std::span<const std::string> samples, std::size_t max_bytes, int level = 3);

  /// A dictionary from its serialised bytes (what bytes() returns; e.g. a file made by
  /// `zstd --train`), precompiled for compression at `level`.
  /// Errors (InvalidArgument, naming the bad value): `level` outside 1..22; `bytes`
  /// shorter than 8, or not starting with the magic 0xEC30A437 (the message shows the
  /// 4 bytes found, in hex), or with dictionary id 0 (a raw-content dictionary: frames
  /// could not name it); entropy tables libzstd cannot load (corrupt dictionary).
  static absl::StatusOr<std::shared_ptr<const ZstdDictionary>> FromBytes(std::string bytes,
                                                                         int level = 3);

  ~ZstdDictionary();
  ZstdDictionary(const ZstdDictionary&) = delete;
  ZstdDictionary& operator=(const ZstdDictionary&) = delete;

  /// The dictionary id (nonzero) that frames compressed with it record.
  std::uint32_t id() const { return id_; }
  /// The serialised dictionary (what FromBytes takes, e.g. to save it to a file).
  const std::string& bytes() const { return bytes_; }
  int level() const { return level_; }  ///< compression level of its precompiled form

  /// libzstd's precompiled forms (never null).
  ///@{
  const ZSTD_CDict_s* cdict() const { return cdict_; }
  const ZSTD_DDict_s* ddict() const { return ddict_; }
  ///@}

 private:
  ZstdDictionary(std::string bytes, std::uint32_t id, int level)
      : bytes_(std::move(bytes)), id_(id), level_(level) {}
  std::string bytes_;
  std::uint32_t id_;
  int level_;
  ZSTD_CDict_s* cdict_ = nullptr;
  ZSTD_DDict_s* ddict_ = nullptr;
};

/// A set of dictionaries by id, for decompression: a frame names its dictionary, the
/// set supplies it.
class ZstdDictionaries {
 public:
  /// InvalidArgument for a null dictionary; AlreadyExists when a dictionary with the
  /// same id is in the set (names the id; the set is unchanged).
  absl::Status Add(std::shared_ptr<const ZstdDictionary> dictionary);
  /// nullptr when no dictionary has `id` (or id is 0).
  const ZstdDictionary* Find(std::uint32_t id) const;
  /// Number of dictionaries in the set.
  std::size_t size() const { return dictionaries_.size(); }
  /// True for a set without dictionaries.
  bool empty() const { return dictionaries_.empty(); }

 private:
  std::vector<std::shared_ptr<const ZstdDictionary>> dictionaries_;  ///< sorted by id
};

/// Compresses `input` as one zstd frame at `level` (1..22; ZSTD_maxCLevel()). The frame
/// records its content size.
/// InvalidArgument when `level` is outside 1..22; ResourceExhausted when libzstd
/// cannot allocate its context; Internal naming libzstd's error if compression
/// itself fails (an input larger than zstd handles, about 2^64 bytes in principle).
absl::StatusOr<std::string> ZstdCompress(std::string_view input, int level = 3);

/// Compresses `input` as one zstd frame with `dictionary` at the dictionary's level;
/// the frame records the dictionary's id and its content size. ResourceExhausted and
/// Internal as for the form above.
absl::StatusOr<std::string> ZstdCompress(std::string_view input, const ZstdDictionary& dictionary);

/// Decompresses one or more concatenated zstd frames (streaming, so frames without a
/// recorded content size work too). A frame compressed with a dictionary is
/// decompressed with the dictionary of that id from `dictionaries` (the id is read
/// from the first frame's header; all frames must use it).
/// Errors: NotFound when the first frame names a dictionary id that `dictionaries`
/// lacks (the message names the id); InvalidArgument when `input` is not zstd data
/// or is corrupt (the message names libzstd's reason and the input offset), and,
/// with `dictionaries` null, for a frame that names a dictionary (the message adds
/// the id: the header may as well be garbage); DataLoss when the input ends inside a frame (truncated); ResourceExhausted
/// when the output would exceed `max_output` bytes (a guard against decompression
/// bombs; default 1 GiB).
absl::StatusOr<std::string> ZstdDecompress(std::string_view input,
                                           const ZstdDictionaries* dictionaries,
                                           std::size_t max_output = std::size_t{1} << 30);
/// As above without dictionaries: a frame that names one is InvalidArgument.
inline absl::StatusOr<std::string> ZstdDecompress(std::string_view input,
                                                  std::size_t max_output = std::size_t{1} << 30) {
  return ZstdDecompress(input, nullptr, max_output);
}

/// What the headers of a sequence of zstd frames say (ZstdFrameHeaders).
struct ZstdFrameInfo {
  std::uint64_t content_size = 0;   ///< decompressed bytes of all the frames
  std::uint32_t dictionary_id = 0;  ///< the first frame's dictionary; 0 = none
};
/// The decompressed size of the zstd frames in `input`, read from their headers
/// (ZSTD_getFrameContentSize per frame; nothing is decompressed), and the dictionary
/// id of the first frame (0 = none).
/// InvalidArgument when `input` is not a sequence of complete zstd frames, or a frame
/// does not record its content size (names the frame's offset).
absl::StatusOr<ZstdFrameInfo> ZstdFrameHeaders(std::string_view input);

/// A payload in one codec: its bytes and how they are stored.
struct CodedPayload {
  Buffer bytes;                             ///< the payload as stored
  PayloadCodec codec = PayloadCodec::kNone;  ///< how `bytes` are stored
  std::uint32_t dictionary_id = 0;  ///< 0 unless codec is kZstd with a dictionary
};

/// How TranscodePayload compresses and where it finds dictionaries.
struct TranscodeOptions {
  /// Compression level without a dictionary, 1..22 (with one, the dictionary's level).
  int zstd_level = 3;
  /// Target kZstd: compress with this dictionary (nullptr = none).
  const ZstdDictionary* dictionary = nullptr;
  /// Where a payload compressed with dictionary_id != 0 finds its dictionary.
  const ZstdDictionaries* dictionaries = nullptr;
  /// Largest payload, in bytes after decompression (a guard against bombs).
  std::size_t max_payload_bytes = std::size_t{256} << 20;
};

/// `event.payload` (stored as event.codec / event.dictionary_id say) converted to
/// `target` (with options.dictionary for kZstd). When the payload is already in that
/// form (same codec and dictionary id) it is returned as is: shared, not copied, not
/// recompressed. An empty payload stays empty and is returned as kNone whatever the
/// target (an empty payload is the same in every codec). Used by Encode and by the
/// engine (ConsumerConfig::accept_codecs).
/// Errors: InvalidArgument when event.codec is not a PayloadCodec, a kNone payload
/// has dictionary_id != 0, the zstd level is outside 1..22, the payload is not valid
/// zstd (libzstd's reason), or its frame names a dictionary other than
/// event.dictionary_id (names both); NotFound when the payload needs dictionary
/// event.dictionary_id and options.dictionaries lacks it (names the id);
/// ResourceExhausted when it decompresses to more than max_payload_bytes; DataLoss
/// for a truncated zstd payload.
absl::StatusOr<CodedPayload> TranscodePayload(const Event& event, PayloadCodec target,
                                              const TranscodeOptions& options = {});

}  // namespace inferq
