/// \file osu_buffers.cpp
/// The buffers of the OSU-style harness (osu_harness.hpp): page-aligned local buffers, the payload patterns
/// and their checks, ubep buffers per --memory (Bench::alloc, fill, zero, check), and the baselines' MPI
/// windows.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bench/osu_harness.hpp"
#include "ubep/config.hpp"

namespace ubep::bench {

// ---- buffers and patterns ------------------------------------------------------------------------------

Buffer::Buffer(std::size_t bytes) {
  constexpr std::size_t kPage = 4096;
  const std::size_t rounded = std::max<std::size_t>(kPage, (bytes + kPage - 1) / kPage * kPage);
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kPage, rounded));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);  // touch every page before timing
  ptr_.reset(p);
}

void Buffer::Free::operator()(std::byte* p) const noexcept { std::free(p); }

namespace {
// The (i >> 8) term makes the pattern differ from itself shifted by 256 bytes, so a copy that lands at
// a wrong offset is caught too.
std::uint8_t pattern_byte(std::size_t i, std::uint32_t seed) {
  return static_cast<std::uint8_t>(i * 7 + (i >> 8) * 3 + seed * 13 + 1);
}
}  // namespace

void fill_pattern(void* dst, std::size_t bytes, std::uint32_t seed) {
  auto* p = static_cast<std::uint8_t*>(dst);
  for (std::size_t i = 0; i < bytes; ++i) p[i] = pattern_byte(i, seed);
}

bool check_pattern(const void* src, std::size_t bytes, std::uint32_t seed, const char* what) {
  const auto* p = static_cast<const std::uint8_t*>(src);
  for (std::size_t i = 0; i < bytes; ++i) {
    if (p[i] != pattern_byte(i, seed)) {
      std::fprintf(stderr, "check failed: %s: %zu-byte payload differs at offset %zu: got %u, expected %u\n", what,
                   bytes, i, unsigned{p[i]}, unsigned{pattern_byte(i, seed)});
      return false;
    }
  }
  return true;
}

ubep::Symmetric<std::byte> Bench::alloc(ubep::Context& ctx, std::size_t bytes) const {
  return device_memory() ? ctx.alloc_device<std::byte>(bytes) : ctx.alloc<std::byte>(bytes);
}

void Bench::fill(ubep::Context& ctx, std::byte* dst, std::size_t bytes, std::uint32_t seed) const {
  if (!device_memory()) return fill_pattern(dst, bytes, seed);
  std::vector<std::byte> host(bytes);
  fill_pattern(host.data(), bytes, seed);
  ctx.put(dst, host.data(), bytes, ctx.rank());  // into this rank's GPU heap, complete on return
}

void Bench::zero(ubep::Context& ctx, std::byte* dst, std::size_t bytes) const {
  if (!device_memory()) {
    std::memset(dst, 0, bytes);
    return;
  }
  const std::vector<std::byte> host(bytes);
  ctx.put(dst, host.data(), bytes, ctx.rank());
}

bool Bench::check(ubep::Context& ctx, const std::byte* src, std::size_t bytes, std::uint32_t seed,
                  const char* what) const {
  if (!device_memory()) return check_pattern(src, bytes, seed, what);
  std::vector<std::byte> host(bytes);
  ctx.get(host.data(), src, bytes, ctx.rank());
  return check_pattern(host.data(), bytes, seed, what);
}

Window::Window(Kind kind, std::size_t bytes, MPI_Comm comm) {
  // Baseline windows are built exactly as OSU builds them (no info hints), then held in one passive
  // epoch for their whole life (MPI_Win_lock_all; OSU's -s flush locks the one target: the same cost per
  // put and flush, measured against OSU 7.2 in docs/BENCHMARKS.md).
  const auto size = static_cast<MPI_Aint>(std::max<std::size_t>(bytes, 64));
  if (kind == Kind::allocate) {
    UBEP_BENCH_MPI(MPI_Win_allocate(size, 1, MPI_INFO_NULL, comm, &base_, &win_));
  } else if (kind == Kind::create) {
    memory_ = std::make_unique<Buffer>(static_cast<std::size_t>(size));
    base_ = memory_->data();
    UBEP_BENCH_MPI(MPI_Win_create(base_, size, 1, MPI_INFO_NULL, comm, &win_));
  } else {
    UBEP_BENCH_MPI(MPI_Win_allocate_shared(size, 1, MPI_INFO_NULL, comm, &base_, &win_));
#if UBEP_SIMGRID
    // SMPI 3.32's MPI_Win_shared_query answers the segment's start for every rank (as the runtime's node
    // heap works around it, docs/SIMULATION.md "Simulated scale"); all ranks share one address space, so the bases
    // themselves are exchanged.
    int ranks = 0;
    UBEP_BENCH_MPI(MPI_Comm_size(comm, &ranks));
    peer_bases_.resize(static_cast<std::size_t>(ranks));
    UBEP_BENCH_MPI(MPI_Allgather(&base_, sizeof base_, MPI_BYTE, peer_bases_.data(), sizeof base_, MPI_BYTE, comm));
#endif
  }
  UBEP_BENCH_MPI(MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN));
  UBEP_BENCH_MPI(MPI_Win_lock_all(0, win_));
  std::memset(base_, 0, static_cast<std::size_t>(size));
  UBEP_BENCH_MPI(MPI_Win_sync(win_));
}

Window::~Window() {
  if (win_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(win_);
  MPI_Win_free(&win_);
}

std::byte* Window::peer_base(int rank) const {
  if (!peer_bases_.empty()) return peer_bases_.at(static_cast<std::size_t>(rank));
  MPI_Aint size = 0;
  int disp = 0;
  void* ptr = nullptr;
  UBEP_BENCH_MPI(MPI_Win_shared_query(win_, rank, &size, &disp, &ptr));
  return static_cast<std::byte*>(ptr);
}

}  // namespace ubep::bench
