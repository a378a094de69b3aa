// The gtest main of every MPI test: MPI is initialized before the tests (so each test may create and
// finalize its own Context), only rank 0 prints, and a failure on any rank fails the run on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#if defined(MPICH_NUMVERSION) && MPICH_NUMVERSION < 40200000
#include <unistd.h>

#include <chrono>
#include <thread>
#endif

namespace {

// Prints failures from every rank (prefixed), progress from rank 0 only.
class RankPrinter : public testing::EmptyTestEventListener {
 public:
  RankPrinter(testing::TestEventListener* inner, int rank) : inner_(inner), rank_(rank) {}
  ~RankPrinter() override { delete inner_; }
  void OnTestProgramStart(const testing::UnitTest& u) override {
    if (rank_ == 0) inner_->OnTestProgramStart(u);
  }
  void OnTestIterationStart(const testing::UnitTest& u, int i) override {
    if (rank_ == 0) inner_->OnTestIterationStart(u, i);
  }
  void OnTestStart(const testing::TestInfo& t) override {
    if (rank_ == 0) inner_->OnTestStart(t);
  }
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.message());
    }
  }
  void OnTestEnd(const testing::TestInfo& t) override {
    if (rank_ == 0) inner_->OnTestEnd(t);
  }
  void OnTestIterationEnd(const testing::UnitTest& u, int i) override {
    if (rank_ == 0) inner_->OnTestIterationEnd(u, i);
  }
  void OnTestProgramEnd(const testing::UnitTest& u) override {
    if (rank_ == 0) inner_->OnTestProgramEnd(u);
  }

 private:
  testing::TestEventListener* inner_;
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  testing::InitGoogleTest(&argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto& listeners = testing::UnitTest::GetInstance()->listeners();
  auto* inner = listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankPrinter(inner, rank));

  const int local = RUN_ALL_TESTS();
  int global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("%s: %d ranks, %s\n", argc > 0 ? argv[0] : "test", size,
                global == 0 ? "all ranks passed" : "FAILED on at least one rank");
  }
#if defined(MPICH_NUMVERSION) && MPICH_NUMVERSION < 40200000
  // MPICH before 4.2 sometimes hangs in MPI_Finalize after every rank passed (pmodels/mpich#6596; docs/MULTINODE.md,
  // "Known problems"). The verdict is agreed above: a rank whose MPI_Finalize has not returned after 20 s exits with
  // it.
  std::fflush(stdout);
  std::thread([rank, global] {
    std::this_thread::sleep_for(std::chrono::seconds(20));
    std::fprintf(stderr,
                 "[rank %d] MPI_Finalize still running after 20 s (MPICH < 4.2, pmodels/mpich#6596): "
                 "exiting with the agreed verdict\n",
                 rank);
    _exit(global);
  }).detach();
#endif
  MPI_Finalize();
  return global;
}
