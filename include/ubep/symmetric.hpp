/// \file symmetric.hpp
/// Routes (how a rank reaches a peer) and Symmetric<T>, the handle of a collectively allocated object in
/// the symmetric heap. Included by context.hpp; Context::alloc creates the objects.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

namespace ubep {

namespace detail {
class State;
struct TestAccess;  // ubep's own tests: the internals behind a Context (tests/mpi/test_access.hpp)
/// Local (non-collective, non-throwing) release of a symmetric object; used by destructors.
void release_symmetric(State& state, void* ptr) noexcept;
void free_symmetric(State& state, void* ptr);
}  // namespace detail

/// How a rank reaches a peer. Lower is cheaper.
enum class Route : std::uint8_t {
  self,  ///< the rank itself: memcpy
  shm,   ///< a rank on the same node: direct load/store into its mapped heap
  mpi,   ///< MPI passive-target RMA on the world window
  ucx,   ///< UCX active messages to the peer's worker (UBEP_TRANSPORTS with ucx, builds with UCX)
};
const char* to_string(Route route) noexcept;

/// A collectively allocated array of T in the symmetric heap. Move-only. data() is the local copy; the
/// same pointer names the peer's copy in put/get/atomics. free() is collective and checked across ranks;
/// the destructor releases the object locally (every rank must destroy it in the same order, which the
/// next collective allocation verifies) and never throws.
template <class T>
class Symmetric {
  static_assert(std::is_trivially_copyable_v<T>, "symmetric objects must be trivially copyable");

 public:
  Symmetric() = default;
  Symmetric(Symmetric&& other) noexcept { swap(other); }
  /// Releases the object this handle held, as the destructor does.
  Symmetric& operator=(Symmetric&& other) noexcept {
    Symmetric(std::move(other)).swap(*this);
    return *this;
  }
  Symmetric(const Symmetric&) = delete;
  Symmetric& operator=(const Symmetric&) = delete;
  /// Releases the object on this rank only; never throws.
  /// @note Local completion: none: operations aimed at the object that are still outstanding are not
  /// completed here (the next Context::alloc completes every rank's before it hands the memory out again).
  /// Remote completion: none. Blocks: no. Communicates: no (after finalize() it does nothing).
  ~Symmetric() {
    if (state_ && ptr_) detail::release_symmetric(*state_, ptr_);
  }

  T* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return count_; }
  std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  std::span<T> local() const noexcept { return {ptr_, count_}; }
  T& operator[](std::size_t i) const noexcept { return ptr_[i]; }

  /// Collective: frees the object on every rank; throws Errc::collective_mismatch when ranks free
  /// different objects. Completes outstanding operations first.
  /// @note Local completion: on return every operation this rank issued before is complete (Context::quiet())
  /// and the object is gone. Remote completion: no rank returns before every rank has completed its
  /// outstanding operations and joined. Blocks: quiet(), then the agreement, at most UBEP_WAIT_TIMEOUT each
  /// (context.hpp, "Deadlines"). Communicates: collective over the context's communicator; an empty handle
  /// (moved from, or of count 0) does nothing and communicates with nobody.
  void free() {
    if (state_ && ptr_) detail::free_symmetric(*state_, ptr_);
    state_.reset();
    ptr_ = nullptr;
    count_ = 0;
  }

 private:
  friend class Context;
  Symmetric(std::shared_ptr<detail::State> state, T* ptr, std::size_t count)
      : state_(std::move(state)), ptr_(ptr), count_(count) {}
  void swap(Symmetric& other) noexcept {
    std::swap(state_, other.state_);
    std::swap(ptr_, other.ptr_);
    std::swap(count_, other.count_);
  }
  std::shared_ptr<detail::State> state_;
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace ubep
