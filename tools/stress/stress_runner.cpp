// ubep-stress: the Runner's set-up, its run loop, and phase A of a round: the planned operations, the
// test* probes, the random delays and stalls, and the self-check's faults (stress_runner.hpp).
#include "stress_runner.hpp"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>

namespace ubep::stress {

Runner::Runner(Context& ctx, const Settings& s, const PlanSettings& ps)
    : ctx_(ctx),
      s_(s),
      ps_(ps),
      P_(ctx.size()),
      me_(ctx.rank()),
      hist_(kOps),
      mism_(counters_, ctx.rank(), s.seed, s.print_limit) {
  slot_ = ps_.slot_bytes();
  gbytes_ = ps_.get_bytes();
  logmax_ = ps_.log_entries();
  slots_ = ctx_.alloc<std::byte>(static_cast<std::size_t>(P_) * slot_);
  gbuf_ = ctx_.alloc<std::byte>(2 * gbytes_);
  logs_ = ctx_.alloc<LogEntry>(static_cast<std::size_t>(P_) * logmax_);
  sigs_ = ctx_.alloc_signals(3 * static_cast<std::size_t>(P_));
  words_ = ctx_.alloc_signals(3 * PlanSettings::kWords + static_cast<std::size_t>(P_));
  sig_sent_.assign(P_, 0);
  sig_recv_.assign(P_, 0);
  add_expected_.assign(PlanSettings::kWords, 0);
  cas_expected_.assign(PlanSettings::kWords, 0);
  cas_cache_.assign(static_cast<std::size_t>(P_) * PlanSettings::kWords, 0);
  // Round 0's get region and swap tokens, before anyone reads them.
  std::vector<std::byte> g(gbytes_);
  fill_pattern(get_key(s_.seed, me_, s_.first_round), 0, g.data(), gbytes_);
  ctx_.put(gregion(s_.first_round), g.data(), gbytes_, me_);
  for (int j = 0; j < PlanSettings::kWords; ++j)
    ctx_.atomic_set(swap_word(j), swap_init(s_.seed, s_.first_round, me_, j), me_);
  ctx_.barrier();
}

std::uint64_t Runner::run() {
  start_ = last_report_ = Clock::now();
  std::uint64_t r = s_.first_round;
  for (;; ++r) {
    round_ = r;
    if (!round(r)) break;
  }
  elapsed_s_ = std::chrono::duration<double>(Clock::now() - start_).count();
  return r + 1 - s_.first_round;
}

std::string Runner::where() const {
  std::ostringstream w;
  w << "round " << round_ << " (seed " << s_.seed << "), phase " << phase_;
  if (op_index_ >= 0) w << ", op #" << op_index_ << " (" << to_string(op_kind_) << " pe " << op_pe_ << ")";
  return w.str();
}

// ---- delays ----
void Runner::maybe_delay(Rng& rng) {
  if (s_.delay_prob > 0 && rng.chance(s_.delay_prob)) {
    ++counters_.delays;
    std::this_thread::sleep_for(std::chrono::microseconds(rng.range(1, s_.delay_max_us)));
  }
}

void Runner::stall(std::uint32_t ms) {
  ++counters_.stalls;
  counters_.stall_ms += ms;
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// ---- the self-check's faults ----
bool Runner::inject_now(const char* kind, std::uint64_t r) const {
  return me_ == 0 && !injected_ && r >= s_.inject_round && s_.inject == kind;
}

void Runner::inject_after_ops(std::uint64_t r) {
  const int pe = (me_ + 1) % P_;
  if (inject_now("signal", r)) {  // one signal update too many
    ctx_.signal_op(psig() + me_, 1, SignalOp::add, pe);
    injected_ = true;
  } else if (inject_now("counter", r)) {  // an add the plan does not have
    ctx_.atomic_add(add_word(0), 1, pe);
    injected_ = true;
  } else if (inject_now("swap", r)) {  // a swap nobody logs: one token appears, another disappears
    ctx_.atomic_swap(swap_word(0), 12345, pe);
    injected_ = true;
  } else if (inject_now("cas", r)) {  // an increment nobody logs
    std::uint64_t v = ctx_.atomic_fetch(cas_word(0), pe);
    for (;;) {
      const std::uint64_t old = ctx_.atomic_compare_swap(cas_word(0), v, v + 1, pe);
      if (old == v) break;
      v = old;
    }
    injected_ = true;
  } else if (inject_now("get", r)) {
    injected_ = true;  // done by the fill ops of this round
  }
}

// ---- the test* probes: results known from the protocol ----
void Runner::probe(Rng& rng, std::uint64_t r) {
  const std::uint64_t prev_end = r << 1;
  switch (rng.below(5)) {
    case 0: {
      const int x = static_cast<int>(rng.below(static_cast<std::uint64_t>(P_)));
      bool a, b;
      {
        Timer t(hist_, Op::test);
        a = ctx_.test(done() + x, Cmp::le, r + 1);
      }
      {
        Timer t(hist_, Op::test);
        b = ctx_.test(done() + x, Cmp::ge, r);
      }
      expect_word(a && b, r,
                  "test: done[" + std::to_string(x) + "] = " + std::to_string(ctx_.signal_fetch(done() + x)) +
                      " outside [" + std::to_string(r) + ", " + std::to_string(r + 1) + "]");
      break;
    }
    case 1: {
      bool ok;
      {
        Timer t(hist_, Op::test_all);
        ok = ctx_.test_all(span_of(done()), Cmp::ge, r);
      }
      expect_word(ok, r, "test_all(done >= " + std::to_string(r) + ") is false");
      break;
    }
    case 2: {
      std::optional<std::size_t> i;
      {
        Timer t(hist_, Op::test_any);
        i = ctx_.test_any(span_of(done()), Cmp::gt, r + 1);
      }
      expect_word(!i, r,
                  "test_any(done > " + std::to_string(r + 1) + ") returned index " + std::to_string(i.value_or(0)));
      break;
    }
    case 3: {
      std::vector<std::size_t> v;
      {
        Timer t(hist_, Op::test_some);
        v = ctx_.test_some(span_of(endsig()), Cmp::ge, prev_end);
      }
      expect_word(static_cast<int>(v.size()) == P_, r,
                  "test_some(endsig >= " + std::to_string(prev_end) + ") returned " + std::to_string(v.size()) +
                      " of " + std::to_string(P_) + " indices");
      break;
    }
    default: {
      std::optional<std::size_t> i;
      {
        Timer t(hist_, Op::test_any);
        i = ctx_.test_any(span_of(endsig()), Cmp::lt, prev_end);
      }
      expect_word(!i, r, "test_any(endsig < " + std::to_string(prev_end) + ") returned an index");
    }
  }
}

// ---- phase A: one planned operation ----
void Runner::execute(const POp& op, std::size_t index, std::uint64_t r, std::vector<std::vector<LogEntry>>& logs) {
  op_index_ = static_cast<int>(index);
  op_kind_ = op.kind;
  op_pe_ = op.pe;
  const int pe = op.pe;
  switch (op.kind) {
    case K::fill:
    case K::fill_nbi: {
      keep_.emplace_back(op.len);
      // inject get: the next round's get region keeps this round's pattern (stale)
      fill_pattern(get_key(s_.seed, me_, inject_now("get", r) ? r : r + 1), op.off, keep_.back().data(), op.len);
      std::byte* dst = gregion(r + 1) + op.off;
      if (op.kind == K::fill) {
        Timer t(hist_, Op::put);
        ctx_.put(dst, keep_.back().data(), op.len, me_);
      } else {
        Timer t(hist_, Op::put_nbi);
        ctx_.put_nbi(dst, keep_.back().data(), op.len, me_);
      }
      break;
    }
    case K::put:
    case K::put_nbi:
    case K::put_signal:
    case K::put_signal_nbi:
    case K::signal_op: {
      std::byte* dst = slot(me_) + op.off;
      const void* src = nullptr;
      if (op.len > 0) {
        keep_.emplace_back(op.len);
        fill_pattern(write_key(s_.seed, me_, pe, r), op.off, keep_.back().data(), op.len);
        src = keep_.back().data();
        if (inject_now("data", r)) {  // one flipped byte in the middle
          keep_.back()[op.len / 2] ^= std::byte{0x5a};
          injected_ = true;
        }
        if ((op.kind == K::put || op.kind == K::put_nbi) && inject_now("stale", r)) {  // a put never issued
          injected_ = true;
          break;
        }
      } else {
        src = &zero_;
      }
      const std::uint64_t value = op.sop == SignalOp::set ? sig_sent_[pe] + op.sig_k + 1 : 1;
      std::uint64_t* sig = psig() + me_;
      switch (op.kind) {
        case K::put: {
          Timer t(hist_, Op::put);
          ctx_.put(dst, src, op.len, pe);
          break;
        }
        case K::put_nbi: {
          Timer t(hist_, Op::put_nbi);
          ctx_.put_nbi(dst, src, op.len, pe);
          break;
        }
        case K::put_signal: {
          Timer t(hist_, Op::put_signal);
          ctx_.put_signal(dst, src, op.len, sig, value, op.sop, pe);
          break;
        }
        case K::put_signal_nbi: {
          Timer t(hist_, Op::put_signal_nbi);
          ctx_.put_signal_nbi(dst, src, op.len, sig, value, op.sop, pe);
          break;
        }
        default: {
          Timer t(hist_, Op::signal_op);
          ctx_.signal_op(sig, value, op.sop, pe);
        }
      }
      break;
    }
    case K::get: {
      std::vector<std::byte> buf(op.len);
      {
        Timer t(hist_, Op::get);
        ctx_.get(buf.data(), gregion(r) + op.off, op.len, pe);
      }
      check_get(pe, op.off, buf.data(), op.len, r, K::get, static_cast<int>(index));
      break;
    }
    case K::get_nbi: {
      pending_.push_back(PendingGet{pe, static_cast<int>(index), op.off, op.len, std::vector<std::byte>(op.len)});
      Timer t(hist_, Op::get_nbi);
      ctx_.get_nbi(pending_.back().buf.data(), gregion(r) + op.off, op.len, pe);
      break;
    }
    case K::fetch_add: {
      Timer t(hist_, Op::atomic_fetch_add);
      logs[pe][op.log].result = ctx_.atomic_fetch_add(add_word(op.word), op.value, pe);
      break;
    }
    case K::add: {
      Timer t(hist_, Op::atomic_add);
      ctx_.atomic_add(add_word(op.word), op.value, pe);
      break;
    }
    case K::fetch_add_word: {
      Timer t(hist_, Op::atomic_fetch);
      logs[pe][op.log].result = ctx_.atomic_fetch(add_word(op.word), pe);
      break;
    }
    case K::swap: {
      Timer t(hist_, Op::atomic_swap);
      logs[pe][op.log].result = ctx_.atomic_swap(swap_word(op.word), op.value, pe);
      break;
    }
    case K::fetch_swap_word: {
      Timer t(hist_, Op::atomic_fetch);
      logs[pe][op.log].result = ctx_.atomic_fetch(swap_word(op.word), pe);
      break;
    }
    case K::cas_inc: {
      std::uint64_t& guess = cas_cache_[static_cast<std::size_t>(pe) * PlanSettings::kWords + op.word];
      LogEntry e{kCasGaveUp, 0};
      for (int tries = 1; tries <= 64; ++tries) {
        std::uint64_t old;
        {
          Timer t(hist_, Op::atomic_compare_swap);
          old = ctx_.atomic_compare_swap(cas_word(op.word), guess, guess + 1, pe);
        }
        e.aux = static_cast<std::uint64_t>(tries);
        if (old == guess) {
          e.result = old;
          ++guess;
          break;
        }
        ++counters_.cas_retries;
        guess = old;
      }
      if (e.result == kCasGaveUp) ++counters_.cas_gave_up;
      logs[pe][op.log] = e;
      break;
    }
    case K::cas_fail: {
      Timer t(hist_, Op::atomic_compare_swap);
      logs[pe][op.log].result = ctx_.atomic_compare_swap(cas_word(op.word), op.value, op.value + 1, pe);
      break;
    }
    case K::fetch_cas_word: {
      Timer t(hist_, Op::atomic_fetch);
      logs[pe][op.log].result = ctx_.atomic_fetch(cas_word(op.word), pe);
      break;
    }
    case K::fence: {
      Timer t(hist_, Op::fence);
      ctx_.fence();
      break;
    }
    case K::quiet: {
      {
        Timer t(hist_, Op::quiet);
        ctx_.quiet();
      }
      complete_gets(std::nullopt, r);
      break;
    }
    case K::flush: {
      {
        Timer t(hist_, Op::flush);
        ctx_.flush(pe);
      }
      complete_gets(pe, r);
      break;
    }
    case K::flush_local: {
      {
        Timer t(hist_, Op::flush_local);
        ctx_.flush_local(pe);
      }
      complete_gets(pe, r);
      break;
    }
    case K::progress: {
      Timer t(hist_, Op::progress);
      ctx_.progress();
      break;
    }
    case K::probe: probe(probe_rng_, r - s_.first_round); break;
  }
}

}  // namespace ubep::stress
