// Turns a failed MPI call into an ubep::Error. Every communicator and window ubep owns uses
// MPI_ERRORS_RETURN, so a failure comes back here instead of aborting the job.
#pragma once

#include <mpi.h>

#include <string>

#include "ubep/error.hpp"

namespace ubep::detail {

[[noreturn]] inline void throw_mpi_error(int code, int rank, const char* call, const char* where) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  throw Error(Errc::mpi,
              "ubep: rank " + std::to_string(rank) + ": " + where + ": " + call + " failed: " + std::string(text, len),
              code);
}

}  // namespace ubep::detail

/// UBEP_MPI_CHECK(rank, "where", MPI_Call(...)): throws ubep::Error(Errc::mpi) naming the rank, the
/// ubep operation and the MPI call when the call does not return MPI_SUCCESS.
#define UBEP_MPI_CHECK(rank, where, call)                                    \
  do {                                                                       \
    int ubep_mpi_rc_ = (call);                                               \
    if (ubep_mpi_rc_ != MPI_SUCCESS) {                                       \
      ::ubep::detail::throw_mpi_error(ubep_mpi_rc_, (rank), #call, (where)); \
    }                                                                        \
  } while (0)
