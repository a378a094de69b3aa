// Fuzz target: the check of a signal message of the mpi route (UBEP_MPI_SIGNAL=message; transports/mpi_rma.hpp,
// check_signal_message), what MpiRmaTransport::deliver runs on every {offset, op, value} it receives before it
// updates a word of its heap (issue 34, "The wire is input").
// Input: 8 bytes offset, 8 bytes op, 8 bytes value, 4 bytes heap size.
// Property: a message that passes is an add, a set or the wake, and its word is an aligned word inside the heap: the
// update is replayed (transports/transport.hpp, apply_posted) on a heap of exactly that size, where ASan sees any
// byte outside. A rejection names a field.
#include <cstring>
#include <vector>

#include "fuzz_common.hpp"
#include "transports/mpi_rma.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ubep::fuzz::Bytes in(data, size);
  const auto u64 = [&] { return in.u32() | (static_cast<std::uint64_t>(in.u32()) << 32); };
  const std::uint64_t offset = u64(), op = u64() % 512, value = u64();
  constexpr std::uint64_t kWake = 0xff;  // transports/mpi_rma.cpp
  const std::size_t heap_bytes = in.u32() % (1u << 16);
  const std::string why = ubep::detail::check_signal_message(offset, op, heap_bytes, kWake);
  if (!why.empty()) {
    UBEP_FUZZ_CHECK(why.rfind("field '", 0) == 0, "a rejection that names no field: " + why);
    return 0;
  }
  if (op == kWake) return 0;
  UBEP_FUZZ_CHECK(op == static_cast<std::uint64_t>(ubep::detail::AtomicOp::add) ||
                      op == static_cast<std::uint64_t>(ubep::detail::AtomicOp::set),
                  "an op other than add or set accepted: " + std::to_string(op));
  UBEP_FUZZ_CHECK(offset % 8 == 0 && offset <= heap_bytes && heap_bytes - offset >= 8,
                  "a word outside the heap accepted: offset " + std::to_string(offset));
  // 8-byte aligned storage of exactly heap_bytes (rounded up to a whole word for the allocation only).
  std::vector<std::uint64_t> heap((heap_bytes + 7) / 8);
  ubep::detail::apply_posted(reinterpret_cast<char*>(heap.data()), offset, static_cast<ubep::detail::AtomicOp>(op),
                             value);
  return 0;
}
