// UBEP_MPI_CHECK: the one-line form of ubep::check_mpi for ubep's own MPI calls. Every communicator and
// window ubep owns uses MPI_ERRORS_RETURN, so a failure comes back here instead of aborting the job.
#pragma once

#include <mpi.h>

#include "ubep/error.hpp"

/// UBEP_MPI_CHECK(rank, "where", MPI_Call(...)): throws ubep::Error(Errc::mpi) naming the rank, the
/// ubep operation and the MPI call (ubep::throw_mpi_error) when the call does not return MPI_SUCCESS.
#define UBEP_MPI_CHECK(rank, where, call)                            \
  do {                                                               \
    int ubep_mpi_rc_ = (call);                                       \
    if (ubep_mpi_rc_ != MPI_SUCCESS) {                               \
      ::ubep::throw_mpi_error(ubep_mpi_rc_, (rank), (where), #call); \
    }                                                                \
  } while (0)
