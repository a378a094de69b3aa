// Issue 14: a real MPI job in which one rank fails on purpose, for tests/faults/run_fault.sh.
//
//   fault_job <fault> <point> [victim] [iteration]
//
// Every rank runs the same loop (a put_signal/wait_until ring, a barrier, a collective alloc/free and one
// moe::Layer dispatch/combine per iteration). At `iteration` (default 2) rank `victim` (default 1) fails at
// `point` instead of going on:
//   point  dispatch (before dispatch_send), combine (after its tokens are in, before combine_send),
//          barrier (instead of Context::barrier), alloc (instead of Context::alloc), signal (instead of its
//          put_signal of the ring)
//   fault  kill (raise(SIGKILL)), getkill (4000 get_nbi to the rank before it, then SIGKILL: that rank owes answers
//          to a dead peer, issue 34 item 3), exit0 / exit1 (_exit(0) / _exit(1): no MPI_Finalize), throw (an exception
//          that unwinds out of the loop, through the Layer and the Context, to main, which prints it and
//          returns 1 without MPI_Finalize), stall (alive, sleeps FAULT_STALL_S seconds without calling
//          ubep or MPI, default UBEP_WAIT_TIMEOUT + 30), compute (the same, busy: a long compute loop),
//          none (no fault: the job must pass)
// The victim prints "fault_job: FAULT <fault> at <point> rank <v> pid <pid> t=<unix time>" just before the
// fault (MPICH's Hydra names a dead process by its pid, not its rank).
// A survivor that catches ubep::Error prints "fault_job: rank <r> detected the failure after <s> s (t=...,
// Errc::...): <what()>" and calls MPI_Abort(MPI_COMM_WORLD, 3): the usual end of a failed MPI job, which also
// takes down a victim that is still alive (stalled); should MPI_Abort block, it _exit(3)s after 2 s.
// Exit codes: 0 all passed, 2 usage, 3 ubep detected a fault. Public API only.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <ubep/moe.hpp>
#include <ubep/ubep.hpp>
#include <vector>

namespace {

constexpr int kDetectedExit = 3;
constexpr int kAbortWatchdogSeconds = 2;

struct Plan {
  std::string fault, point;
  int victim = 1, iteration = 2, iterations = 4;
  double stall_s = 0;
};

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// Whether `rank` fails here; if so it does, and returns only for `throw` (by throwing), `stall` and `compute`.
// `ctx` and `word` (a symmetric word) serve getkill's gets.
void maybe_fault(const Plan& p, int rank, int iteration, const char* point, ubep::Context& ctx, std::uint64_t* word) {
  if (rank != p.victim || iteration != p.iteration || p.point != point || p.fault == "none") return;
  if (p.fault == "getkill") {  // answers owed by the rank before it, which then finds this one dead
    static std::vector<std::uint64_t> sink(4000);
    const int from = (rank + ctx.size() - 1) % ctx.size();
    for (std::uint64_t& w : sink) ctx.get_nbi(&w, word, sizeof w, from);
  }
  std::fprintf(stderr, "fault_job: FAULT %s at %s rank %d pid %d t=%.3f\n", p.fault.c_str(), point, rank,
               static_cast<int>(getpid()), unix_now());
  std::fflush(stderr);
  if (p.fault == "kill" || p.fault == "getkill") std::raise(SIGKILL);
  if (p.fault == "exit0") _exit(0);
  if (p.fault == "exit1") _exit(1);
  if (p.fault == "throw") throw std::runtime_error(std::string("injected failure at ") + point);
  if (p.fault == "stall") {
    std::this_thread::sleep_for(std::chrono::duration<double>(p.stall_s));  // no ubep, no MPI
    std::fprintf(stderr, "fault_job: rank %d woke up after a stall of %.0f s\n", rank, p.stall_s);
  }
  if (p.fault == "compute") {  // a long compute phase: busy, and no ubep or MPI call either
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(p.stall_s);
    volatile double x = 1;
    while (std::chrono::steady_clock::now() < end) {
      for (int i = 0; i < 100000; ++i) x = x * 1.0000001 + 1e-9;
    }
    std::fprintf(stderr, "fault_job: rank %d finished a compute of %.0f s\n", rank, p.stall_s);
  }
}

void run(const Plan& p) {
  ubep::Context ctx;
  const int me = ctx.rank(), n = ctx.size();
  const int right = (me + 1) % n, left = (me + n - 1) % n;

  ubep::moe::Config cfg{
      .num_experts = 2 * n, .hidden = 64, .dtype = ubep::moe::DType::f32, .topk = 2, .max_tokens_per_rank = 8};
  ubep::moe::Layer layer(ctx, cfg);
  auto ring = ctx.alloc<std::uint64_t>(1);
  auto sig = ctx.alloc_signals(1);

  const int tokens = cfg.max_tokens_per_rank;
  std::vector<float> in(static_cast<std::size_t>(tokens) * cfg.hidden), out(in.size());
  std::vector<int> idx(static_cast<std::size_t>(tokens) * cfg.topk);
  std::vector<float> w(idx.size(), 0.5f);
  for (int t = 0; t < tokens; ++t) {
    for (int k = 0; k < cfg.topk; ++k) idx[t * cfg.topk + k] = (me + t + k) % cfg.num_experts;
    for (int h = 0; h < cfg.hidden; ++h) in[t * cfg.hidden + h] = static_cast<float>(me * 1000 + t);
  }
  const int writers[] = {left};

  for (int it = 0; it < p.iterations; ++it) {
    const std::uint64_t epoch = it + 1;
    maybe_fault(p, me, it, "signal", ctx, ring.data());
    ctx.put_signal(ring.data(), &epoch, sizeof epoch, sig.data(), epoch, ubep::SignalOp::set, right);
    ctx.wait_until(sig.data(), ubep::Cmp::ge, epoch, {.writers = writers, .what = "the ring signal"});

    maybe_fault(p, me, it, "barrier", ctx, ring.data());
    ctx.barrier();

    maybe_fault(p, me, it, "alloc", ctx, ring.data());
    auto scratch = ctx.alloc<float>(1024);
    scratch.free();

    maybe_fault(p, me, it, "dispatch", ctx, ring.data());
    auto h = layer.dispatch_send(std::as_bytes(std::span(in)), idx, w);
    layer.dispatch_recv(h);
    maybe_fault(p, me, it, "combine", ctx, ring.data());
    while (auto le = layer.next_expert(h)) {
      const auto batch = layer.expert_tokens(h, *le);
      layer.combine_send(h, *le, batch.data);  // identity experts: f32 in, f32 out
    }
    layer.combine_recv(h, out);
    for (int t = 0; t < tokens; ++t) {  // two experts at weight 0.5 each: out = in
      if (out[t * cfg.hidden] != in[t * cfg.hidden]) throw std::logic_error("wrong combine result");
    }
  }
  ctx.finalize();
}

int usage() {
  std::fprintf(
      stderr,
      "usage: fault_job <kill|getkill|exit0|exit1|throw|stall|compute|none> <dispatch|combine|barrier|alloc|signal> "
      "[victim] [iteration]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  Plan p;
  p.fault = argv[1];
  p.point = argv[2];
  if (argc > 3) p.victim = std::atoi(argv[3]);
  if (argc > 4) p.iteration = std::atoi(argv[4]);
  const std::vector<std::string> faults = {"kill", "getkill", "exit0", "exit1", "throw", "stall", "compute", "none"};
  const std::vector<std::string> points = {"dispatch", "combine", "barrier", "alloc", "signal"};
  if (std::find(faults.begin(), faults.end(), p.fault) == faults.end()) return usage();
  if (std::find(points.begin(), points.end(), p.point) == points.end()) return usage();
  const ubep::Options env = ubep::Options::from_env();
  p.stall_s = env.wait_timeout.count() + 30;
  if (const char* s = std::getenv("FAULT_STALL_S")) p.stall_s = std::atof(s);

  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const auto t0 = std::chrono::steady_clock::now();
  const auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  try {
    run(p);
  } catch (const ubep::Error& e) {
    std::fprintf(stderr, "fault_job: rank %d detected the failure after %.2f s (t=%.3f, Errc::%s): %s\n", rank, since(),
                 unix_now(), ubep::to_string(e.code()), e.what());
    std::fflush(stderr);
    // MPICH's Hydra drops the last stderr lines of a process that MPI_Abort kills at once: let it forward them.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    // MPI_Abort can block: under MPICH a call that ubep abandoned on its worker thread (a flush to the
    // stalled rank) keeps MPICH's global lock. Then exit non-zero anyway, which makes the launcher end the job.
    std::thread([rank] {
      std::this_thread::sleep_for(std::chrono::seconds(kAbortWatchdogSeconds));
      std::fprintf(stderr, "fault_job: rank %d: MPI_Abort did not end the job within %d s; _exit(%d)\n", rank,
                   kAbortWatchdogSeconds, kDetectedExit);
      _exit(kDetectedExit);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, kDetectedExit);
  } catch (const std::exception& e) {  // the victim of `throw`: the Context has been unwound, not finalized
    std::fprintf(stderr, "fault_job: rank %d: %s (unwound; exiting without MPI_Finalize)\n", rank, e.what());
    return 1;
  }
  MPI_Finalize();
  if (rank == 0) std::printf("fault_job: all ranks passed\n");
  return 0;
}
