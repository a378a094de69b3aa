/* SMPI 3.32: MPI_Compare_and_swap is not atomic among origins. Every rank takes a compare-swap lock on
 * rank 0's word and releases it with a second compare-swap; under `smpirun -np 8` about half the releases
 * find another rank's id in the word (two ranks held the lock). Under Open MPI and MPICH: 0 bad releases.
 * Build and run: smpicc smpi_cas_repro.c -o cas && smpirun -np 8 -platform cluster.xml -hostfile H ./cas */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int me, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  uint64_t* base;
  MPI_Win win;
  MPI_Win_allocate(16, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
  base[0] = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Win_lock_all(0, win);
  uint64_t id = (uint64_t)me + 1, zero = 0, res = 0;
  int bad = 0;
  for (int i = 0; i < 100; ++i) {
    do {
      MPI_Compare_and_swap(&id, &zero, &res, MPI_UINT64_T, 0, 0, win);
      MPI_Win_flush(0, win);
    } while (res != 0);
    MPI_Compare_and_swap(&zero, &id, &res, MPI_UINT64_T, 0, 0, win);
    MPI_Win_flush(0, win);
    if (res != id) bad++;
  }
  MPI_Win_unlock_all(win);
  printf("rank %d of %d: %d bad releases of 100\n", me, n, bad);
  MPI_Win_free(&win);
  MPI_Finalize();
  return bad != 0;
}
