// File: src/engine/handle_queue.hpp (not API)
//
// HandleQueue<T>: a FIFO on a circular buffer that grows by doubling and never
// shrinks, so a stream in steady state pushes and pops without touching the heap
// (std::deque allocates and frees a block every few hundred elements).
// Not thread-safe: the stream's mutex guards it.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace inferq::engine_internal {

template <class T>
class HandleQueue {
 public:
  bool empty() const { return size_ == 0; }
  std::size_t size() const { return size_; }
  T& front() { return buf_[head_]; }
  // The i-th element from the front; i < size().
  const T& at(std::size_t i) const { return buf_[(head_ + i) & (buf_.size() - 1)]; }
  T& at(std::size_t i) { return buf_[(head_ + i) & (buf_.size() - 1)]; }

  // Makes room for one more push_back, which then cannot fail. Throws
  // std::bad_alloc.
  void ReserveOne() {
    if (size_ == buf_.size()) Grow();
  }
  void push_back(T v) {
    if (size_ == buf_.size()) Grow();
    buf_[(head_ + size_) & (buf_.size() - 1)] = std::move(v);
    ++size_;
  }
  // Calls f(element) for each element, front to back.
  template <class F>
  void for_each(F&& f) const {
    const std::size_t mask = buf_.size() - 1;
    for (std::size_t i = 0; i < size_; ++i) f(buf_[(head_ + i) & mask]);
  }
  void pop_front() {
    buf_[head_] = T();
    head_ = (head_ + 1) & (buf_.size() - 1);
    --size_;
  }
  // Removes every element for which pred is true, keeping the order of the rest.
  template <class Pred>
  void erase_if(Pred pred) {
    std::size_t kept = 0;
    const std::size_t mask = buf_.size() - 1;
    for (std::size_t i = 0; i < size_; ++i) {
      T& v = buf_[(head_ + i) & mask];
      if (pred(v)) {
        v = T();
      } else {
        if (kept != i) buf_[(head_ + kept) & mask] = std::move(v);
        ++kept;
      }
    }
    for (std::size_t i = kept; i < size_; ++i) buf_[(head_ + i) & mask] = T();
    size_ = kept;
  }

 private:
  void Grow() {
    std::vector<T> next(buf_.empty() ? 64 : buf_.size() * 2);
    for (std::size_t i = 0; i < size_; ++i) {
      next[i] = std::move(buf_[(head_ + i) & (buf_.size() - 1)]);
    }
    buf_ = std::move(next);
    head_ = 0;
  }
  std::vector<T> buf_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

}  // namespace inferq::engine_internal
