/* hello.c: self-test program for tests/multinode/emulate.sh.
 *
 * Every rank prints its rank, MPI_Get_processor_name and the size of its MPI_COMM_TYPE_SHARED
 * communicator, then checks one-sided traffic across nodes: an MPI_Win_allocate window, a 1 MiB MPI_Put
 * to a rank on another node, MPI_Win_flush, then MPI_Accumulate (sum) on a counter at every rank.
 * Rank 0 checks that the number of distinct processor names equals UBEP_EMULATED_NODES (when set) and
 * that every node has the same number of ranks. Exits non-zero on any mismatch.
 *   hello [--fail RANK]   RANK exits with status 3 after MPI_Init (tests failure propagation)
 *   hello [--abort RANK]  RANK calls MPI_Abort(MPI_COMM_WORLD, 4) after MPI_Init
 *   hello [--hang]        every rank sleeps forever (tests --timeout and signal cleanup)
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCK (1 << 20) /* bytes put to the peer */

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--fail") == 0 && i + 1 < argc && atoi(argv[i + 1]) == rank) {
      fprintf(stderr, "rank %d: failing on purpose\n", rank);
      exit(3);
    }
    if (strcmp(argv[i], "--abort") == 0 && i + 1 < argc && atoi(argv[i + 1]) == rank) {
      fprintf(stderr, "rank %d: MPI_Abort on purpose\n", rank);
      MPI_Abort(MPI_COMM_WORLD, 4);
    }
    if (strcmp(argv[i], "--hang") == 0) {
      printf("rank %d/%d hanging\n", rank, size);  // selftest.sh waits for rank 1's line before it signals
      fflush(stdout);
      for (;;) sleep(1);
    }
  }

  char name[MPI_MAX_PROCESSOR_NAME];
  int len;
  MPI_Get_processor_name(name, &len);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int node_size, node_rank;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_rank(node, &node_rank);
  printf("rank %d/%d host %s shared_comm_size %d\n", rank, size, name, node_size);
  fflush(stdout);

  int errors = 0;
  /* Processor names: rank 0 counts the distinct ones. */
  char* names = rank == 0 ? malloc((size_t)size * MPI_MAX_PROCESSOR_NAME) : NULL;
  MPI_Gather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
  int node_sizes_differ = 0, min_ns, max_ns;
  MPI_Allreduce(&node_size, &min_ns, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&node_size, &max_ns, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  node_sizes_differ = min_ns != max_ns;
  if (rank == 0) {
    int distinct = 0;
    for (int i = 0; i < size; i++) {
      int seen = 0;
      for (int j = 0; j < i; j++)
        if (strcmp(names + (size_t)i * MPI_MAX_PROCESSOR_NAME, names + (size_t)j * MPI_MAX_PROCESSOR_NAME) == 0)
          seen = 1;
      distinct += !seen;
    }
    const char* env = getenv("UBEP_EMULATED_NODES");
    printf("distinct_hosts %d emulated_nodes %s\n", distinct, env ? env : "unset");
    if (env && atoi(env) != distinct) {
      fprintf(stderr, "FAIL: %d distinct processor names, UBEP_EMULATED_NODES=%s\n", distinct, env);
      errors++;
    }
    if (node_sizes_differ) {
      fprintf(stderr, "FAIL: shared-memory communicators differ in size (%d..%d)\n", min_ns, max_ns);
      errors++;
    }
    free(names);
  }

  /* One-sided: put a 1 MiB block to a rank node_size ranks ahead (the next node with block placement),
   * flush, then add rank+1 to a counter at every rank. Size is a multiple of 64 (MPICH 4.0.2 bug). */
  int64_t* base;
  MPI_Win win;
  MPI_Aint win_bytes = BLOCK + 64;
  MPI_Win_allocate(win_bytes, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
  memset(base, 0, (size_t)win_bytes);
  volatile int64_t* counter = (int64_t*)((char*)base + BLOCK); /* the accumulate target */
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Win_lock_all(MPI_MODE_NOCHECK, win);
  int target = (rank + node_size) % size, source = (rank - node_size + size) % size;
  int64_t* block = malloc(BLOCK);
  for (size_t i = 0; i < BLOCK / 8; i++) block[i] = ((int64_t)rank << 32) | (int64_t)i;
  double t0 = MPI_Wtime();
  MPI_Put(block, BLOCK, MPI_BYTE, target, 0, BLOCK, MPI_BYTE, win);
  MPI_Win_flush(target, win);
  double t1 = MPI_Wtime();
  int64_t one = rank + 1;
  for (int p = 0; p < size; p++) MPI_Accumulate(&one, 1, MPI_INT64_T, p, BLOCK, 1, MPI_INT64_T, MPI_SUM, win);
  MPI_Win_flush_all(win);
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Win_sync(win);
  int64_t expect_counter = (int64_t)size * (size + 1) / 2;
  int64_t got_counter;
  MPI_Fetch_and_op(NULL, &got_counter, MPI_INT64_T, rank, BLOCK, MPI_NO_OP, win);
  MPI_Win_flush(rank, win);
  if (got_counter != expect_counter || *counter != expect_counter) {
    fprintf(stderr, "FAIL rank %d: counter %lld (local load %lld), expected %lld\n", rank, (long long)got_counter,
            (long long)*counter, (long long)expect_counter);
    errors++;
  }
  for (size_t i = 0; i < BLOCK / 8; i++) {
    int64_t want = ((int64_t)source << 32) | (int64_t)i;
    if (base[i] != want) {
      fprintf(stderr, "FAIL rank %d: block word %zu is %llx, expected %llx (from rank %d)\n", rank, i,
              (long long)base[i], (long long)want, source);
      errors++;
      break;
    }
  }
  MPI_Win_unlock_all(win);
  printf("rank %d put 1 MiB to rank %d + flush: %.1f us\n", rank, target, (t1 - t0) * 1e6);
  fflush(stdout);
  MPI_Win_free(&win);
  free(block);

  int all_errors;
  MPI_Allreduce(&errors, &all_errors, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("%s: %d error(s)\n", all_errors ? "FAILED" : "PASSED", all_errors);
  MPI_Comm_free(&node);
  MPI_Finalize();
  return all_errors ? 1 : 0;
}
