// ubep-stress: one round of the Runner (stress_runner.hpp, phases A to G) and the waits of every kind
// that its phases C, E and G use.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "stress_moe.hpp"
#include "stress_runner.hpp"

namespace ubep::stress {

// ---- waits of every kind ----
void Runner::wait_values(const std::uint64_t* sig, const std::vector<std::uint64_t>& values, std::uint64_t kind,
                         const char* what, Rng& rng, bool exact) {
  std::vector<int> writers(P_);
  for (int x = 0; x < P_; ++x) writers[x] = x;
  WaitOptions o;
  o.writers = writers;
  o.what = what;
  const std::span<const std::uint64_t> sigs = span_of(sig);
  bool all_same = true;
  for (int x = 0; x < P_; ++x) all_same = all_same && values[x] == values[0];
  switch (kind % 6) {
    case 0:  // one wait_until per signal, a random comparison that means ">= value" (or "== value")
      for (int x = 0; x < P_; ++x) {
        if (values[x] == kSignalIgnored) continue;
        WaitOptions one;
        one.writers = std::span<const int>(&writers[x], 1);
        one.what = what;
        std::uint64_t got;
        Timer t(hist_, Op::wait_until);
        const auto c = rng.below(3);
        if (c == 0 && values[x] > 0) {
          got = ctx_.wait_until(sig + x, Cmp::gt, values[x] - 1, one);
        } else if (c == 1 && exact) {
          got = ctx_.wait_until(sig + x, Cmp::eq, values[x], one);
        } else {
          got = ctx_.wait_until(sig + x, Cmp::ge, values[x], one);
        }
        expect_word(got >= values[x], round_,
                    std::string("wait_until returned ") + std::to_string(got) + " < " + std::to_string(values[x]) +
                        " (" + what + ")");
      }
      break;
    case 1: {  // wait_until_all, the scalar form when every value is the same
      Timer t(hist_, Op::wait_until_all);
      if (all_same && values[0] != kSignalIgnored) {
        ctx_.wait_until_all(sigs, Cmp::ge, values[0], o);
      } else {
        ctx_.wait_until_all(sigs, Cmp::ge, std::span<const std::uint64_t>(values), o);
      }
      break;
    }
    case 2:
    case 3: {  // wait_until_any / wait_until_some until every signal was returned
      std::vector<std::uint64_t> left = values;
      if (kind % 6 == 3 && all_same && values[0] != kSignalIgnored) {  // the scalar form first
        std::vector<std::size_t> got;
        {
          Timer t(hist_, Op::wait_until_some);
          got = ctx_.wait_until_some(sigs, Cmp::ge, values[0], o);
        }
        expect_word(!got.empty(), round_, std::string("wait_until_some returned no index (") + what + ")");
        for (std::size_t i : got) {
          expect_word(i < left.size() && ctx_.signal_fetch(sig + i) >= values[0], round_,
                      std::string("wait_until_some returned index ") + std::to_string(i) +
                          " whose condition does not hold (" + what + ")");
          if (i < left.size()) left[i] = kSignalIgnored;
        }
      }
      for (;;) {
        if (std::all_of(left.begin(), left.end(), [](std::uint64_t v) { return v == kSignalIgnored; })) break;
        std::vector<std::size_t> got;
        if (kind % 6 == 2) {
          Timer t(hist_, Op::wait_until_any);
          got.push_back(ctx_.wait_until_any(sigs, Cmp::ge, std::span<const std::uint64_t>(left), o));
        } else {
          Timer t(hist_, Op::wait_until_some);
          got = ctx_.wait_until_some(sigs, Cmp::ge, std::span<const std::uint64_t>(left), o);
        }
        for (std::size_t i : got) {
          const bool ok = i < left.size() && left[i] != kSignalIgnored && ctx_.signal_fetch(sig + i) >= left[i];
          expect_word(ok, round_,
                      std::string("wait_until_any/some returned index ") + std::to_string(i) +
                          " whose condition does not hold (" + what + ")");
          if (i < left.size()) left[i] = kSignalIgnored;
        }
        if (got.empty()) {
          expect_word(false, round_, std::string("wait_until_some returned no index (") + what + ")");
          break;
        }
      }
      break;
    }
    case 4: {  // the scalar wait_until_any once (when it applies), then wait_until_all
      if (all_same && values[0] != kSignalIgnored) {
        std::size_t i;
        {
          Timer t(hist_, Op::wait_until_any);
          i = ctx_.wait_until_any(sigs, Cmp::ge, values[0], o);
        }
        expect_word(i < sigs.size() && ctx_.signal_fetch(sig + i) >= values[0], round_,
                    std::string("wait_until_any returned index ") + std::to_string(i) + " (" + what + ")");
      }
      Timer t(hist_, Op::wait_until_all);
      ctx_.wait_until_all(sigs, Cmp::ge, std::span<const std::uint64_t>(values), o);
      break;
    }
    default: {  // polling with test/test_all and a short sleep (no busy spin), with our own deadline
      const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(ctx_.options().wait_timeout);
      std::vector<std::uint64_t> left = values;
      for (;;) {
        bool all = true;
        if (all_same && values[0] != kSignalIgnored && rng.chance(0.5)) {
          Timer t(hist_, Op::test_all);
          all = ctx_.test_all(sigs, Cmp::ge, values[0]);
        } else {
          for (int x = 0; x < P_; ++x) {
            if (left[x] == kSignalIgnored) continue;
            bool ok;
            {
              Timer t(hist_, Op::test);
              ok = ctx_.test(sig + x, Cmp::ge, left[x]);
            }
            if (ok) {
              left[x] = kSignalIgnored;
            } else {
              all = false;
            }
          }
        }
        if (all) break;
        if (Clock::now() > deadline) {
          std::string m = std::string("ubep-stress: polling with test* timed out (") + what + "):";
          for (int x = 0; x < P_; ++x)
            if (values[x] != kSignalIgnored)
              m += " signal[" + std::to_string(x) + "] = " + std::to_string(ctx_.signal_fetch(sig + x)) +
                   (ctx_.signal_fetch(sig + x) >= values[x] ? " >= " : " < ") + std::to_string(values[x]) + ";";
          throw Error(Errc::timeout, m);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(rng.range(20, 200)));
      }
    }
  }
}

// ---- one round; false after the last ----
bool Runner::round(std::uint64_t r) {
  const std::uint64_t e = r - s_.first_round;  // rounds since the first: the values of the done and end words
  const int P = P_;
  std::vector<Plan> plans;
  plans.reserve(P);
  for (int x = 0; x < P; ++x) plans.push_back(make_plan(ps_, r, x));
  const Plan& mine = plans[me_];
  Rng delay_rng(key({s_.seed, 20, r, static_cast<std::uint64_t>(me_)}));
  probe_rng_ = Rng(key({s_.seed, 21, r, static_cast<std::uint64_t>(me_)}));
  Rng wait_rng(key({s_.seed, 22, r, static_cast<std::uint64_t>(me_)}));
  // The stall of this round, if any: one rank, at one point, for a while.
  Rng stall_rng(key({s_.seed, 23, r}));
  int staller = -1;
  std::size_t stall_at = 0;
  std::uint32_t stall_ms = 0;
  if (s_.stall_every > 0 && stall_rng.chance(1.0 / s_.stall_every)) {
    staller = static_cast<int>(stall_rng.below(static_cast<std::uint64_t>(P)));
    stall_at = stall_rng.below(mine.ops.size() + 3);
    stall_ms = static_cast<std::uint32_t>(stall_rng.range(s_.stall_min_ms, s_.stall_max_ms));
  }
  const bool i_stall = staller == me_;
  const bool moe =
      s_.moe_every > 0 && r % static_cast<std::uint64_t>(s_.moe_every) == static_cast<std::uint64_t>(s_.moe_every - 1);

  // A
  phase_ = "A (operations)";
  std::vector<std::vector<LogEntry>> logs(P);
  for (int o = 0; o < P; ++o) logs[o].resize(mine.log_count[o]);
  for (std::size_t i = 0; i < mine.ops.size(); ++i) {
    if (i_stall && stall_at == i) stall(stall_ms);
    maybe_delay(delay_rng);
    execute(mine.ops[i], i, r, logs);
  }
  op_index_ = -1;
  for (int t = 0; t < P; ++t) sig_sent_[t] += mine.sig_ops[t];
  inject_after_ops(r);

  // B
  phase_ = "B (logs)";
  for (int o = 0; o < P; ++o) {
    if (logs[o].empty()) continue;
    LogEntry* dst = logs_.data() + static_cast<std::size_t>(me_) * logmax_;
    if (delay_rng.chance(0.5)) {
      Timer t(hist_, Op::put);
      ctx_.put(dst, logs[o].data(), logs[o].size() * sizeof(LogEntry), o);
    } else {
      Timer t(hist_, Op::put_nbi);
      ctx_.put_nbi(dst, logs[o].data(), logs[o].size() * sizeof(LogEntry), o);
    }
  }
  {
    Timer t(hist_, Op::atomic_set);
    ctx_.atomic_set(opcnt(me_), ops(), 0);
  }

  // C
  phase_ = "C (signal counts)";
  {
    std::vector<std::uint64_t> want(P, kSignalIgnored);
    bool any = false;
    for (int x = 0; x < P; ++x) {
      if (plans[x].sig_ops[me_] == 0) continue;
      want[x] = sig_recv_[x] + plans[x].sig_ops[me_];
      any = true;
    }
    if (any) wait_values(psig(), want, wait_rng.below(6), "writers' signal counts", wait_rng, true);
    for (int x = 0; x < P; ++x) {
      sig_recv_[x] += plans[x].sig_ops[me_];
      if (want[x] == kSignalIgnored) continue;
      const std::uint64_t got = ctx_.signal_fetch(psig() + x);
      expect_word(got == want[x], r,
                  "signal word of rank " + std::to_string(x) + " on rank " + std::to_string(me_) + ": expected " +
                      std::to_string(want[x]) + " after " + std::to_string(plans[x].sig_ops[me_]) +
                      " signal ops this round, got " + std::to_string(got));
      for (std::size_t i = 0; i < plans[x].ops.size(); ++i) {
        const POp& op = plans[x].ops[i];
        if (op.pe == me_ && op.early) check_write(x, op, i, r, "after the writer's signal");
      }
    }
  }

  // D
  phase_ = "D (quiet, done)";
  if (delay_rng.chance(0.7)) {
    Timer t(hist_, Op::quiet);
    ctx_.quiet();
  } else {
    for (int pe = 0; pe < P; ++pe) {
      Timer t(hist_, Op::flush);
      ctx_.flush(pe);
    }
  }
  complete_gets(std::nullopt, r);
  keep_.clear();
  for (int t = 0; t < P; ++t) {
    const bool add = delay_rng.chance(0.5);
    const SignalOp sop = add ? SignalOp::add : SignalOp::set;
    const std::uint64_t v = add ? 1 : e + 1;
    if (delay_rng.chance(0.5)) {
      Timer tm(hist_, Op::signal_op);
      ctx_.signal_op(done() + me_, v, sop, t);
    } else {
      Timer tm(hist_, Op::put_signal);
      ctx_.put_signal(slot(me_), &zero_, 0, done() + me_, v, sop, t);
    }
  }
  if (i_stall && stall_at == mine.ops.size()) stall(stall_ms);

  // E
  phase_ = "E (done, checks)";
  wait_values(done(), std::vector<std::uint64_t>(P, e + 1), wait_rng.below(6), "done", wait_rng, true);
  for (int x = 0; x < P; ++x) {
    const std::uint64_t d = ctx_.signal_fetch(done() + x), c = ctx_.signal_fetch(psig() + x);
    expect_word(
        d == e + 1, r,
        "done word of rank " + std::to_string(x) + ": expected " + std::to_string(e + 1) + " got " + std::to_string(d));
    expect_word(c == sig_recv_[x], r,
                "signal word of rank " + std::to_string(x) + " on rank " + std::to_string(me_) +
                    " after its quiet: expected " + std::to_string(sig_recv_[x]) + " got " + std::to_string(c));
    for (std::size_t i = 0; i < plans[x].ops.size(); ++i) {
      const POp& op = plans[x].ops[i];
      if (op.pe == me_ && is_write(op.kind)) check_write(x, op, i, r, "after the writer's quiet");
    }
  }
  check_counters(r, plans);
  std::uint64_t global_ops = 0;
  if (me_ == 0)
    for (int x = 0; x < P; ++x) global_ops += ctx_.signal_fetch(opcnt(x));

  // F
  if (moe) {
    phase_ = "F (moe)";
    MoeSettings ms;
    ms.seed = s_.seed;
    ms.delay_prob = std::min(1.0, s_.delay_prob * 20);
    ms.delay_max_us = s_.delay_max_us;
    ms.inject = s_.inject == "moe" && me_ == 0 && r >= s_.inject_round;
    moe_round(ctx_, ms, r, i_stall && stall_at == mine.ops.size() + 1 ? stall_ms : 0, hist_, counters_, mism_);
  } else if (i_stall && stall_at == mine.ops.size() + 1) {
    stall(stall_ms);
  }

  // G
  phase_ = "G (end of round)";
  bool stop = false;
  if (me_ == 0) {
    const auto now = Clock::now();
    const double el = std::chrono::duration<double>(now - start_).count();
    stop = el >= s_.duration_s || (s_.max_ops > 0 && global_ops >= s_.max_ops) ||
           (s_.max_rounds > 0 && e + 1 >= s_.max_rounds);
    if (s_.report_every_s > 0 && std::chrono::duration<double>(now - last_report_).count() >= s_.report_every_s) {
      last_report_ = now;
      std::printf("# %7.1f s: round %" PRIu64 ", %" PRIu64 " operations, rank 0: %" PRIu64 " mismatches\n", el, r,
                  global_ops, counters_.mismatches);
      std::fflush(stdout);
    }
  }
  {
    Timer t(hist_, Op::quiet);
    ctx_.quiet();
  }
  const std::uint64_t end = ((e + 1) << 1) | (stop ? 1 : 0);
  for (int t = 0; t < P; ++t) {
    Timer tm(hist_, Op::signal_op);
    if (delay_rng.chance(0.5)) {
      ctx_.signal_op(endsig() + me_, end, SignalOp::set, t);
    } else {
      ctx_.signal_op(endsig() + me_, end - (e << 1), SignalOp::add, t);
    }
  }
  if (i_stall && stall_at == mine.ops.size() + 2) stall(stall_ms);
  wait_values(endsig(), std::vector<std::uint64_t>(P, (e + 1) << 1), wait_rng.below(6), "end of round", wait_rng,
              false);
  for (int x = 0; x < P; ++x) {
    const std::uint64_t v = ctx_.signal_fetch(endsig() + x);
    expect_word(v >> 1 == e + 1 && (x == 0 || (v & 1) == 0), r,
                "end-of-round word of rank " + std::to_string(x) + ": expected " + std::to_string(e + 1) + " got " +
                    std::to_string(v >> 1) + " (bit " + std::to_string(v & 1) + ")");
  }
  const bool last = (ctx_.signal_fetch(endsig()) & 1) != 0;
  if (Rng(key({s_.seed, 24, r})).chance(0.05)) {  // the same decision on every rank: ctx.barrier() is collective
    Timer t(hist_, Op::barrier);
    ctx_.barrier();
  }
  return !last;
}

}  // namespace ubep::stress
