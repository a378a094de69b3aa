// ubep_sim_rma_cost: what SimGrid's SMPI charges for one all-to-all step of ubep's mpi-route protocol
// against the same bytes as two-sided messages, in one simulation (UBEP_SIMGRID builds; bench/sim/run.sh
// runs it once per platform). Every rank sends --bytes to every other rank:
//   alltoallv          MPI_Alltoallv (the BSP baseline's data step)
//   isend/irecv        one MPI_Isend and MPI_Irecv per peer, one MPI_Waitall
//   put+flush+signal   ubep's protocol on the mpi route with signals as messages: MPI_Put to every peer, then
//                      MPI_Win_flush per peer, then a 24-byte MPI_Send per peer (the signal), all received
//   put+flush_all      the same with one MPI_Win_flush_all
// Prints simulated microseconds, the maximum over ranks, per variant and repetition; the ratio of the third
// to the second is the price SMPI's RMA model puts on ubep's protocol beyond the bytes themselves.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "mpi_check.hpp"

namespace {

void check(int rc, const char* what) { ubep_sim::check(rc, "ubep_sim_rma_cost", what); }

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int bytes = 8192, reps = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--bytes")) bytes = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  if (bytes <= 0 || reps <= 0) {
    if (me == 0) std::fprintf(stderr, "ubep_sim_rma_cost: --bytes and --reps must be positive\n");
    MPI_Finalize();
    return 2;
  }
  const auto total = static_cast<std::size_t>(bytes) * static_cast<std::size_t>(n);
  std::vector<char> send(total, 1), recv(total), sig(24 * static_cast<std::size_t>(n));
  std::vector<int> counts(n, bytes), displs(n);
  for (int i = 0; i < n; ++i) displs[i] = i * bytes;
  char* base = nullptr;
  MPI_Win win = MPI_WIN_NULL;
  check(MPI_Win_allocate(static_cast<MPI_Aint>(total), 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win),
        "MPI_Win_allocate");
  check(MPI_Win_lock_all(0, win), "MPI_Win_lock_all");
  std::vector<MPI_Request> req(2 * static_cast<std::size_t>(n));
  auto report = [&](const char* name, int rep, double t0) {
    const double mine = MPI_Wtime() - t0;
    double worst = 0.0;
    MPI_Reduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (me == 0)
      std::printf("%-20s rep %d  %10.1f us  (%d ranks, %d bytes per peer)\n", name, rep, worst * 1e6, n, bytes);
  };
  if (me == 0) std::printf("# ubep_sim_rma_cost: simulated us, maximum over ranks\n");
  for (int rep = 0; rep < reps; ++rep) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    check(MPI_Alltoallv(send.data(), counts.data(), displs.data(), MPI_BYTE, recv.data(), counts.data(), displs.data(),
                        MPI_BYTE, MPI_COMM_WORLD),
          "MPI_Alltoallv");
    report("alltoallv", rep, t0);

    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int i = 0; i < n; ++i) MPI_Irecv(recv.data() + displs[i], bytes, MPI_BYTE, i, 1, MPI_COMM_WORLD, &req[i]);
    for (int k = 0; k < n; ++k) {
      const int pe = (me + k) % n;
      MPI_Isend(send.data() + displs[pe], bytes, MPI_BYTE, pe, 1, MPI_COMM_WORLD, &req[n + pe]);
    }
    check(MPI_Waitall(2 * n, req.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    report("isend/irecv", rep, t0);

    for (int all = 0; all < 2; ++all) {
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      for (int i = 0; i < n; ++i) MPI_Irecv(sig.data() + 24 * i, 24, MPI_BYTE, i, 2, MPI_COMM_WORLD, &req[i]);
      for (int k = 1; k < n; ++k) {
        const int pe = (me + k) % n;
        check(MPI_Put(send.data() + displs[pe], bytes, MPI_BYTE, pe, static_cast<MPI_Aint>(displs[me]), bytes, MPI_BYTE,
                      win),
              "MPI_Put");
      }
      if (all) check(MPI_Win_flush_all(win), "MPI_Win_flush_all");
      for (int k = 1; k < n && !all; ++k) check(MPI_Win_flush((me + k) % n, win), "MPI_Win_flush");
      for (int k = 0; k < n; ++k) MPI_Send(send.data(), 24, MPI_BYTE, (me + k) % n, 2, MPI_COMM_WORLD);
      check(MPI_Waitall(n, req.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
      report(all ? "put+flush_all+signal" : "put+flush+signal", rep, t0);
    }
  }
  MPI_Win_unlock_all(win);
  MPI_Win_free(&win);
  MPI_Finalize();
  return 0;
}
