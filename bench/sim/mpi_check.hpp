// The MPI-only simulation programs of bench/sim (ubep_sim_rma_cost, ubep_sim_bsp_alone): an MPI call that
// fails aborts the job with the program's name and the call.
#pragma once

#include <mpi.h>

#include <cstdio>

namespace ubep_sim {

inline void check(int rc, const char* program, const char* what) {
  if (rc != MPI_SUCCESS) {
    std::fprintf(stderr, "%s: %s failed (%d)\n", program, what, rc);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

}  // namespace ubep_sim
