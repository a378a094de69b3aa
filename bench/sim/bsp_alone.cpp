// ubep_sim_bsp_alone: the BSP baseline's communication and nothing else, no ubep code: per iteration one
// MPI_Alltoall of the counts, the dispatch MPI_Alltoallv and the combine MPI_Alltoallv back, for
// ubep_moe_bench's shapes (--tokens per rank, --hidden bf16 elements, --topk distinct experts uniformly at
// random, one expert per rank). bench/sim/run.sh simulates it beside every ubep_moe_bench run: its wall time
// is what SimGrid's flow model charges for the all-to-all itself, the part of a simulation's wall time that no
// implementation of the layer can avoid.
// Prints the simulated layer time (maximum over ranks, median over iterations) in microseconds.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "mpi_check.hpp"

namespace {

void check(int rc, const char* what) { ubep_sim::check(rc, "ubep_sim_bsp_alone", what); }

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int tokens = 32, hidden = 1024, topk = 8, iterations = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--hidden")) hidden = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--topk")) topk = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--iterations")) iterations = std::atoi(argv[i + 1]);
  }
  if (tokens <= 0 || hidden <= 0 || topk <= 0 || topk > n || iterations <= 0) {
    if (me == 0)
      std::fprintf(stderr, "ubep_sim_bsp_alone: --tokens, --hidden, --iterations positive, 0 < --topk <= ranks (%d)\n",
                   n);
    MPI_Finalize();
    return 2;
  }
  std::vector<int> scount(n), rcount(n), sdispl(n), rdispl(n), experts(n);
  for (int e = 0; e < n; ++e) experts[e] = e;
  std::mt19937_64 rng(0x5eedULL * static_cast<unsigned>(n) + static_cast<unsigned>(me));
  const int row = 2 * hidden;  // bf16
  for (int t = 0; t < tokens; ++t) {
    for (int k = 0; k < topk; ++k) {  // a partial Fisher-Yates shuffle: topk distinct experts
      std::uniform_int_distribution<int> pick(k, n - 1);
      std::swap(experts[k], experts[pick(rng)]);
      scount[experts[k]] += row;
    }
  }
  check(MPI_Alltoall(scount.data(), 1, MPI_INT, rcount.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Alltoall");
  int sent = 0, received = 0;
  for (int i = 0; i < n; ++i) {
    sdispl[i] = sent;
    sent += scount[i];
    rdispl[i] = received;
    received += rcount[i];
  }
  std::vector<char> send(static_cast<std::size_t>(sent) + 1, 1), recv(static_cast<std::size_t>(received) + 1);
  std::vector<double> layer;
  for (int it = 0; it < iterations; ++it) {
    check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    const double t0 = MPI_Wtime();
    check(MPI_Alltoall(scount.data(), 1, MPI_INT, rcount.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Alltoall");
    check(MPI_Alltoallv(send.data(), scount.data(), sdispl.data(), MPI_BYTE, recv.data(), rcount.data(), rdispl.data(),
                        MPI_BYTE, MPI_COMM_WORLD),
          "MPI_Alltoallv (dispatch)");
    check(MPI_Alltoallv(recv.data(), rcount.data(), rdispl.data(), MPI_BYTE, send.data(), scount.data(), sdispl.data(),
                        MPI_BYTE, MPI_COMM_WORLD),
          "MPI_Alltoallv (combine)");
    const double mine = MPI_Wtime() - t0;
    double worst = 0.0;
    check(MPI_Reduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD), "MPI_Reduce");
    layer.push_back(worst);
  }
  if (me == 0) {
    std::sort(layer.begin(), layer.end());
    std::printf("bsp_alone ranks %d tokens %d hidden %d topk %d: layer %.1f us (median of %d)\n", n, tokens, hidden,
                topk, layer[layer.size() / 2] * 1e6, iterations);
  }
  MPI_Finalize();
  return 0;
}
