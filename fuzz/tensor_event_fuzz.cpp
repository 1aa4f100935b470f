// libFuzzer target: TensorEvent Decode on untrusted bytes (what a durable stream, a
// bridge or a file hands it). Decode must return an Event or an error, never crash or
// trip ASan/UBSan; the same bytes at an odd address must give the same answer; and
// an Event it returns must survive Encode and Decode unchanged (raw, zstd, and zstd
// with a trained dictionary: fuzz_dictionary.hpp, which the seeds use too). Decode
// with keep_compressed must agree with a full decode on the payload's bytes when both
// succeed, and re-encode its compressed payload byte for byte.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_dictionary.hpp"
#include "inferq/event/codec.hpp"
#include "inferq/event/event.hpp"
#include "inferq/event/tensor_event.hpp"

namespace {

// Small bounds keep each run fast: the default 256 MiB limit would let one input
// allocate that much.
inferq::DecodeOptions Options(bool keep_compressed = false) {
  return {.max_payload_bytes = 1 << 20,
          .dictionaries = &inferq_fuzz::FuzzDictionaries(),
          .keep_compressed = keep_compressed};
}

bool Same(const inferq::Event& a, const inferq::Event& b) {
  const std::vector<std::pair<std::string, std::string>> ha(a.headers.begin(), a.headers.end());
  const std::vector<std::pair<std::string, std::string>> hb(b.headers.begin(), b.headers.end());
  return a.subject == b.subject && a.task_id == b.task_id && a.semantic_tag == b.semantic_tag &&
         a.tenant == b.tenant && a.qos == b.qos && a.priority == b.priority &&
         a.trace == b.trace && a.model == b.model && a.model_version == b.model_version &&
         a.schema_id == b.schema_id && a.schema_version == b.schema_version &&
         a.msg_id == b.msg_id && a.seq_id == b.seq_id && a.seq_no == b.seq_no &&
         a.created == b.created && a.deadline == b.deadline && a.ttl == b.ttl &&
         a.attempt == b.attempt && a.shape == b.shape && a.dtype == b.dtype && ha == hb &&
         a.payload.view() == b.payload.view() && a.codec == b.codec &&
         a.dictionary_id == b.dictionary_id;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  absl::StatusOr<inferq::Event> e = inferq::Decode(bytes, Options());

  // The same bytes, misaligned (Decode copies them to aligned storage).
  std::vector<std::byte> shifted(size + 1);
  if (size != 0) std::memcpy(shifted.data() + 1, data, size);
  absl::StatusOr<inferq::Event> s =
      inferq::Decode(std::span<const std::byte>(shifted).subspan(1), Options());
  if (e.ok() != s.ok()) std::abort();
  // Accept compressed: the frame headers are checked, the blocks are not.
  absl::StatusOr<inferq::Event> kept = inferq::Decode(bytes, Options(/*keep_compressed=*/true));
  if (kept.ok()) {
    if (kept->codec == inferq::PayloadCodec::kZstd) {
      // Written through as it is.
      const inferq::ZstdDictionaries& dicts = inferq_fuzz::FuzzDictionaries();
      absl::StatusOr<inferq::Buffer> wire = inferq::Encode(
          *kept, {.codec = inferq::PayloadCodec::kZstd,
                  .dictionary = kept->dictionary_id != 0 ? dicts.Find(kept->dictionary_id) : nullptr,
                  .dictionaries = &dicts});
      if (kept->dictionary_id == 0 || kept->dictionary_id == inferq_fuzz::FuzzDictionary()->id()) {
        if (!wire.ok()) std::abort();
        absl::StatusOr<inferq::Event> again = inferq::Decode(wire->span(), Options(true));
        if (!again.ok() || !Same(*kept, *again)) std::abort();
      }
    }
    if (e.ok()) {
      absl::StatusOr<inferq::CodedPayload> raw = inferq::TranscodePayload(
          *kept, inferq::PayloadCodec::kNone,
          {.dictionaries = &inferq_fuzz::FuzzDictionaries(), .max_payload_bytes = 1 << 20});
      if (!raw.ok() || raw->bytes.view() != e->payload.view()) std::abort();
    }
  }
  if (!e.ok()) {
    if (e.status() != s.status()) std::abort();
    return 0;
  }
  if (!Same(*e, *s)) std::abort();

  const inferq::ZstdDictionary* dict = inferq_fuzz::FuzzDictionary().get();
  for (const inferq::EncodeOptions& options :
       {inferq::EncodeOptions{.codec = inferq::PayloadCodec::kNone},
        inferq::EncodeOptions{.codec = inferq::PayloadCodec::kZstd, .zstd_level = 1},
        inferq::EncodeOptions{.codec = inferq::PayloadCodec::kZstd, .dictionary = dict}}) {
    absl::StatusOr<inferq::Buffer> wire = inferq::Encode(*e, options);
    if (!wire.ok()) std::abort();  // everything Decode returns is encodable
    absl::StatusOr<inferq::Event> back = inferq::Decode(wire->span(), Options());
    if (!back.ok() || !Same(*e, *back)) std::abort();
  }
  return 0;
}
