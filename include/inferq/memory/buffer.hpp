/// @file inferq/memory/buffer.hpp
///
/// Buffer: immutable, reference-counted bytes. Copying a Buffer shares the bytes (one
/// atomic increment); the bytes are freed with the last copy. This is how one payload
/// reaches every consumer of an event without being copied.
///
/// Usage:
/// @code
///   inferq::Buffer b = inferq::Buffer::FromString("hello");
///   inferq::Buffer c = b;                 // shares: c.data() == b.data()
///   std::string_view v = c.view();        // "hello"
/// @endcode
///
/// Thread safety: a Buffer object is a value (like std::shared_ptr): different Buffer
/// objects sharing the same bytes may be copied and destroyed on different threads at
/// once; the bytes never change after creation, so reading them needs no lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <span>
#include <string_view>
#include <utility>

namespace inferq {

class FixedPool;
namespace memory_internal {
/// Process-wide pool for a buffer block of `bytes` (header included), or nullptr when
/// it is larger than the largest class (4 KiB): then operator new is used.
FixedPool* BufferPoolFor(std::size_t bytes);
void* PoolAllocate(FixedPool* pool);
void PoolDeallocate(FixedPool* pool, void* p) noexcept;
}  // namespace memory_internal

/// Immutable, reference-counted bytes; copies share them (see the file comment).
class Buffer {
 public:
  Buffer() noexcept = default;

  /// A new buffer holding a copy of `bytes`. An empty input gives an empty Buffer that
  /// allocates nothing. Throws std::bad_alloc when memory runs out.
  static Buffer Copy(std::span<const std::byte> bytes) {
    Buffer b;
    if (bytes.empty()) return b;
    // Small buffers come from process-wide FixedPools (64 B to 4 KiB blocks, per-
    // thread caches): no general-heap allocation in steady state.
    const std::size_t total = sizeof(Block) + bytes.size();
    FixedPool* pool = memory_internal::BufferPoolFor(total);
    void* mem = pool != nullptr ? memory_internal::PoolAllocate(pool) : ::operator new(total);
    b.block_ = ::new (mem) Block{{1}, bytes.size(), pool};
    std::memcpy(b.block_->bytes(), bytes.data(), bytes.size());
    return b;
  }
  /// Copy of the bytes of `s`, as Copy.
  static Buffer FromString(std::string_view s) {
    return Copy(std::as_bytes(std::span<const char>(s.data(), s.size())));
  }

  /// Shares the bytes of `o` (one atomic increment).
  Buffer(const Buffer& o) noexcept : block_(o.block_) {
    // relaxed: taking another reference needs no ordering (as in std::shared_ptr).
    if (block_) block_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  /// Takes the bytes of `o`, which is left empty.
  Buffer(Buffer&& o) noexcept : block_(std::exchange(o.block_, nullptr)) {}
  /// Shares (or takes, from an rvalue) the bytes of `o`, releasing this buffer's own.
  Buffer& operator=(Buffer o) noexcept {
    std::swap(block_, o.block_);
    return *this;
  }
  ~Buffer() { Release(); }

  /// The bytes; nullptr for an empty Buffer. Valid while any copy of this Buffer lives.
  const std::byte* data() const noexcept { return block_ ? block_->bytes() : nullptr; }
  /// Number of bytes.
  std::size_t size() const noexcept { return block_ ? block_->size : 0; }
  /// True when size() is 0.
  bool empty() const noexcept { return size() == 0; }
  /// The bytes as a span.
  std::span<const std::byte> span() const noexcept { return {data(), size()}; }
  /// The bytes as characters.
  std::string_view view() const noexcept {
    return {reinterpret_cast<const char*>(data()), size()};
  }
  /// Number of Buffer objects sharing these bytes (0 for an empty Buffer). A snapshot:
  /// other threads may change it at any time.
  std::uint32_t use_count() const noexcept {
    return block_ ? block_->refs.load(std::memory_order_relaxed) : 0;
  }

 private:
  struct Block {
    std::atomic<std::uint32_t> refs;
    std::size_t size;
    FixedPool* pool;  ///< where the block goes back to; nullptr = operator delete
    std::byte* bytes() { return reinterpret_cast<std::byte*>(this + 1); }
  };
  void Release() noexcept {
    // acq_rel: the thread that frees the block must see every other owner's reads
    // of it completed (release on each decrement, acquire on the last). A count of 1
    // read with acquire is the same last decrement without the locked instruction:
    // this Buffer holds the only reference, so no other thread can take one (that
    // would copy this object while it is destroyed), and the acquire pairs with the
    // release of every earlier owner's decrement (libstdc++'s shared_ptr does the
    // same since GCC 12).
    if (block_ && (block_->refs.load(std::memory_order_acquire) == 1 ||
                   block_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1)) {
      FixedPool* pool = block_->pool;
      block_->~Block();
      if (pool != nullptr) {
        memory_internal::PoolDeallocate(pool, block_);
      } else {
        ::operator delete(block_);
      }
    }
    block_ = nullptr;
  }
  Block* block_ = nullptr;
};

}  // namespace inferq
