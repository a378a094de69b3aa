/// \file error.hpp
/// The one error type of ubep. Every failure, on every path, is an ubep::Error (or, for an exhausted
/// symmetric heap, an ubep::OutOfHeap). The message always names the rank, the call and the bad value.
#pragma once

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

namespace ubep {

/// What went wrong, coarse enough to branch on.
enum class Errc : int {
  invalid_argument = 1,  ///< a value that is never valid (negative size, unknown enum, bad env variable)
  out_of_range,          ///< a rank, offset, index or expert id outside its range
  misaligned,            ///< an atomic or signal address that is not 8-byte aligned
  overflow,              ///< a size computation that would overflow
  not_symmetric,         ///< an address outside the symmetric heap where a symmetric address is needed
  collective_mismatch,   ///< ranks made different collective calls (sizes, order, setup)
  timeout,               ///< a wait exceeded its deadline; the message lists what it waited for
  finalized,             ///< a call on a context (or an object of it) after finalize()
  out_of_memory,         ///< the symmetric heap is exhausted (thrown as OutOfHeap)
  unsupported,           ///< a feature this build or this MPI does not provide
  mpi,                   ///< an MPI call failed; native() is the MPI error code
  internal,              ///< a broken invariant inside ubep: please report it
  cuda,                  ///< a CUDA call failed; native() is its cudaError_t
  protocol,              ///< a peer sent a message that breaks ubep's wire protocol (a corrupt or forged
                         ///< message, or a peer built from another version); the message names the peer and
                         ///< the field, and the context isolates that peer (docs/RELIABILITY.md, "Trust")
  unreachable,           ///< a peer cannot be reached any more: its endpoint failed (it died, or the network
                         ///< between us did); operations to it fail at once, the other peers stay usable
};

/// Short name of an error code ("timeout", "out_of_range", ...).
const char* to_string(Errc code) noexcept;

/// The exception thrown by every ubep call.
class Error : public std::runtime_error {
 public:
  Error(Errc code, std::string message, int native = 0);
  Errc code() const noexcept { return code_; }
  /// The native error code (the MPI error code for Errc::mpi, the cudaError_t for Errc::cuda), 0 otherwise.
  int native() const noexcept { return native_; }

 private:
  Errc code_;
  int native_;
};

/// Throws Error(Errc::mpi) for the failed MPI call `call` made by ubep operation `where` on `rank`:
/// "ubep: rank R: where: call failed: <MPI_Error_string(code)>", with native() == code. Every MPI error
/// ubep reports (runtime, topology, the MoE BSP baseline, the benchmarks) is built here.
[[noreturn]] void throw_mpi_error(int code, int rank, const char* where, const char* call);

/// check_mpi(MPI_Alltoall(...), rank, "my_step", "MPI_Alltoall"): throws as throw_mpi_error unless `rc`
/// is MPI_SUCCESS (0 in every MPI). For MPI calls on communicators with MPI_ERRORS_RETURN.
inline void check_mpi(int rc, int rank, const char* where, const char* call) {
  if (rc != 0) throw_mpi_error(rc, rank, where, call);
}

/// Thrown when a collective allocation does not fit in the symmetric heap. It is a std::bad_alloc, so
/// generic out-of-memory handling catches it; the message names UBEP_HEAP_SIZE and the size to set.
class OutOfHeap : public std::bad_alloc {
 public:
  explicit OutOfHeap(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

}  // namespace ubep
