#include "ubep/error.hpp"

#include <mpi.h>

#include "base/log.hpp"

namespace ubep {

const char* to_string(Errc code) noexcept {
  switch (code) {
    case Errc::invalid_argument: return "invalid_argument";
    case Errc::out_of_range: return "out_of_range";
    case Errc::misaligned: return "misaligned";
    case Errc::overflow: return "overflow";
    case Errc::not_symmetric: return "not_symmetric";
    case Errc::collective_mismatch: return "collective_mismatch";
    case Errc::timeout: return "timeout";
    case Errc::finalized: return "finalized";
    case Errc::out_of_memory: return "out_of_memory";
    case Errc::unsupported: return "unsupported";
    case Errc::mpi: return "mpi";
    case Errc::internal: return "internal";
    case Errc::cuda: return "cuda";
    case Errc::protocol: return "protocol";
    case Errc::unreachable: return "unreachable";
  }
  return "unknown";
}

Error::Error(Errc code, std::string message, int native)
    : std::runtime_error(std::move(message)), code_(code), native_(native) {}

void throw_mpi_error(int code, int rank, const char* where, const char* call) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  throw Error(Errc::mpi, detail::message_prefix(rank, where) + call + " failed: " + std::string(text, len), code);
}

}  // namespace ubep
