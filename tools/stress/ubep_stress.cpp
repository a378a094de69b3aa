// ubep-stress: the soak tool of issue 14. Every rank runs rounds of mixed operations from a seeded plan
// (stress_plan.hpp): puts, gets and their nbi forms of random sizes and offsets, put_signal/put_signal_nbi/
// signal_op with set and add, every atomic, fence/quiet/flush/flush_local/progress and test*, waits of every
// kind, and every --moe-every rounds MoE calls with random configs checked against BspLayer
// (stress_moe.cpp); random sleeps on random ranks, and now and then one rank that stops calling ubep for up to
// --stall-ms. Every byte written or read and every signal and counter is compared with what the plans say it
// must be. At the end rank 0 prints operations, bytes checked, mismatches and latency percentiles per call.
//
// One round r, on every rank w:
//   A  the plan's operations, in order (random delays between them, maybe the stall)
//   B  the results of its fetching atomics, put into a log on each counter's owner; its op count to rank 0
//   C  waits until each writer's signal count on w reaches this round's total (one wait kind per round),
//      then checks the writes the contract makes visible at that point (stress_plan.hpp, "early")
//   D  quiet() (or flush(pe) of every pe), then "done" = r + 1 to every rank (signal_op or 0-byte put_signal)
//   E  waits for every rank's done, then checks everything written to w this round, its signal words, and
//      as owner its counters against every rank's plan and log
//   F  every --moe-every rounds: the MoE section
//   G  quiet(), then the round's end signal ((r + 1) << 1, plus 1 from rank 0 when the run ends) to every
//      rank, and a wait for all of them: every rank leaves the loop after the same round.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "stress_core.hpp"
#include "stress_moe.hpp"
#include "stress_plan.hpp"
#include "ubep/ubep.hpp"

namespace ubep::stress {
namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  double duration_s = 60;
  std::uint64_t max_ops = 0;     // 0 = no limit
  std::uint64_t max_rounds = 0;  // 0 = no limit
  std::uint64_t seed = 1;
  std::string json;
  double delay_prob = 0.002;
  std::uint32_t delay_max_us = 3000;
  double stall_every = 300;  // rounds between stalls, on average; 0 = never
  std::uint32_t stall_min_ms = 200, stall_max_ms = 2000;
  int moe_every = 8;
  int quiet_every = 8;
  int ops_per_round = 48;
  std::size_t max_bytes = 65536;
  std::string heap = "64M";
  std::string self_atomics = "auto";
  double report_every_s = 10;
  int print_limit = 20;
  // Self-check: rank 0 breaks one thing on purpose in round inject_round (or the first round after it where it
  // can), to show that the checks see it: data, stale, signal, counter, swap, cas, get or moe.
  std::string inject = "none";
  std::uint64_t inject_round = 2;
  // Replay: start at this round (the plans of round r do not depend on earlier rounds; counters start at 0).
  std::uint64_t first_round = 0;
};

struct LogEntry {
  std::uint64_t result = 0, aux = 0;
};

std::string hex8(const std::byte* p, std::size_t n) {
  std::string s;
  char b[4];
  for (std::size_t i = 0; i < std::min<std::size_t>(n, 8); ++i) {
    std::snprintf(b, sizeof b, "%02x", static_cast<unsigned>(p[i]));
    s += b;
  }
  return s;
}

class Runner {
 public:
  Runner(Context& ctx, const Settings& s, const PlanSettings& ps)
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

  /// Runs rounds until rank 0 says stop; returns the number of rounds.
  std::uint64_t run() {
    start_ = last_report_ = Clock::now();
    std::uint64_t r = s_.first_round;
    for (;; ++r) {
      round_ = r;
      if (!round(r)) break;
    }
    elapsed_s_ = std::chrono::duration<double>(Clock::now() - start_).count();
    return r + 1 - s_.first_round;
  }

  std::uint64_t ops() const {
    std::uint64_t n = 0;
    for (const Hist& h : hist_) n += h.n;
    return n;
  }
  const std::vector<Hist>& hist() const { return hist_; }
  const Counters& counters() const { return counters_; }
  double elapsed_s() const { return elapsed_s_; }
  /// Where the rank is, for an error report.
  std::string where() const {
    std::ostringstream w;
    w << "round " << round_ << " (seed " << s_.seed << "), phase " << phase_;
    if (op_index_ >= 0) w << ", op #" << op_index_ << " (" << to_string(op_kind_) << " pe " << op_pe_ << ")";
    return w.str();
  }

 private:
  // ---- addresses ----
  std::uint64_t* psig() const { return sigs_.data(); }             // psig[w]: writer w's signal count
  std::uint64_t* done() const { return sigs_.data() + P_; }        // done[w] = r + 1 after w's quiet
  std::uint64_t* endsig() const { return sigs_.data() + 2 * P_; }  // endsig[w] = (r + 1) << 1 | stop
  std::uint64_t* add_word(int j) const { return words_.data() + j; }
  std::uint64_t* swap_word(int j) const { return words_.data() + PlanSettings::kWords + j; }
  std::uint64_t* cas_word(int j) const { return words_.data() + 2 * PlanSettings::kWords + j; }
  std::uint64_t* opcnt(int w) const { return words_.data() + 3 * PlanSettings::kWords + w; }
  std::byte* slot(int writer) const { return slots_.data() + static_cast<std::size_t>(writer) * slot_; }
  std::byte* gregion(std::uint64_t round) const { return gbuf_.data() + (round % 2) * gbytes_; }
  std::span<const std::uint64_t> span_of(const std::uint64_t* p) const { return {p, static_cast<std::size_t>(P_)}; }

  // ---- delays ----
  void maybe_delay(Rng& rng) {
    if (s_.delay_prob > 0 && rng.chance(s_.delay_prob)) {
      ++counters_.delays;
      std::this_thread::sleep_for(std::chrono::microseconds(rng.range(1, s_.delay_max_us)));
    }
  }
  void stall(std::uint32_t ms) {  // no ubep call at all for `ms`
    ++counters_.stalls;
    counters_.stall_ms += ms;
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }

  // ---- the self-check's faults ----
  bool inject_now(const char* kind, std::uint64_t r) const {
    return me_ == 0 && !injected_ && r >= s_.inject_round && s_.inject == kind;
  }
  void inject_after_ops(std::uint64_t r) {
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

  // ---- checks ----
  void check_write(int writer, const POp& op, std::size_t index, std::uint64_t r, const char* when) {
    if (op.len == 0) return;
    const std::byte* got = slot(writer) + op.off;
    const std::uint64_t k = write_key(s_.seed, writer, me_, r);
    counters_.bytes_checked += op.len;
    const std::size_t bad = first_mismatch(k, op.off, got, op.len);
    if (bad == op.len) return;
    std::byte want[8];
    fill_pattern(k, op.off + bad, want, std::min<std::size_t>(8, op.len - bad));
    std::ostringstream m;
    m << to_string(op.kind) << " from rank " << writer << " to rank " << me_ << ", op #" << index << ", slot offset "
      << op.off << ", " << op.len << " bytes, checked " << when << ": first bad byte at +" << bad << ": expected "
      << hex8(want, op.len - bad) << " got " << hex8(got + bad, op.len - bad) << "; "
      << matching_bytes(k, op.off, got, op.len) << "/" << op.len << " bytes match this round";
    if (r > 0)
      m << ", " << matching_bytes(write_key(s_.seed, writer, me_, r - 1), op.off, got, op.len) << " match round "
        << r - 1 << " (stale)";
    mism_.report(r, m.str());
  }
  void check_get(int owner, std::size_t off, const std::byte* got, std::size_t len, std::uint64_t r, K kind,
                 int index) {
    const std::uint64_t k = get_key(s_.seed, owner, r);
    counters_.bytes_checked += len;
    const std::size_t bad = first_mismatch(k, off, got, len);
    if (bad == len) return;
    std::byte want[8];
    fill_pattern(k, off + bad, want, std::min<std::size_t>(8, len - bad));
    std::ostringstream m;
    m << to_string(kind) << " by rank " << me_ << " from rank " << owner << ", op #" << index << ", offset " << off
      << ", " << len << " bytes: first bad byte at +" << bad << ": expected " << hex8(want, len - bad) << " got "
      << hex8(got + bad, len - bad) << "; " << matching_bytes(k, off, got, len) << "/" << len
      << " bytes match this round";
    if (r > 0) m << ", " << matching_bytes(get_key(s_.seed, owner, r - 1), off, got, len) << " match round " << r - 1;
    mism_.report(r, m.str());
  }
  void expect_word(bool ok, std::uint64_t r, const std::string& what) {
    ++counters_.words_checked;
    if (!ok) mism_.report(r, what);
  }

  struct PendingGet {
    int pe, index;
    std::size_t off, len;
    std::vector<std::byte> buf;
  };
  void complete_gets(std::optional<int> pe, std::uint64_t r) {
    auto it = std::remove_if(pending_.begin(), pending_.end(), [&](PendingGet& g) {
      if (pe && g.pe != *pe) return false;
      check_get(g.pe, g.off, g.buf.data(), g.len, r, K::get_nbi, g.index);
      return true;
    });
    pending_.erase(it, pending_.end());
  }

  // ---- the test* probes: results known from the protocol ----
  void probe(Rng& rng, std::uint64_t r) {  // r: rounds since the first
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
  void execute(const POp& op, std::size_t index, std::uint64_t r, std::vector<std::vector<LogEntry>>& logs) {
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

  // ---- waits of every kind ----
  // Waits until sig[x] >= values[x] for every x whose value is not kSignalIgnored; `kind` picks the call.
  // `exact`: every signal ends at exactly its value this round (so Cmp::eq is a valid way to wait for it).
  void wait_values(const std::uint64_t* sig, const std::vector<std::uint64_t>& values, std::uint64_t kind,
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

  // ---- counters, as their owner ----
  void check_counters(std::uint64_t r, const std::vector<Plan>& plans) {
    for (int j = 0; j < PlanSettings::kWords; ++j) {
      // add words: the sum, fetch_add intervals disjoint inside [start, end), fetches inside [start, end]
      {
        const std::uint64_t start = add_expected_[j];
        std::uint64_t sum = 0;
        std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;  // [old, old + amount)
        std::vector<std::uint64_t> reads;
        for (int x = 0; x < P_; ++x) {
          std::uint64_t floor = 0;  // a writer's own fetches never go backwards
          for (const POp& op : plans[x].ops) {
            if (op.pe != me_ || op.word != static_cast<std::uint32_t>(j)) continue;
            if (op.kind == K::add) sum += op.value;
            if (op.kind != K::fetch_add && op.kind != K::fetch_add_word) continue;
            const std::uint64_t got = logs_[static_cast<std::size_t>(x) * logmax_ + op.log].result;
            expect_word(got >= floor, r,
                        "add word " + std::to_string(j) + " on rank " + std::to_string(me_) + ": rank " +
                            std::to_string(x) + "'s " + to_string(op.kind) + " returned " + std::to_string(got) +
                            ", below its own earlier result " + std::to_string(floor));
            if (op.kind == K::fetch_add) {
              sum += op.value;
              spans.emplace_back(got, got + op.value);
              floor = std::max(floor, got + op.value);
            } else {
              reads.push_back(got);
              floor = std::max(floor, got);
            }
          }
        }
        const std::uint64_t end = start + sum;
        std::uint64_t final_v;
        {
          Timer t(hist_, Op::atomic_fetch);
          final_v = ctx_.atomic_fetch(add_word(j), me_);
        }
        expect_word(final_v == end, r,
                    "add word " + std::to_string(j) + " on rank " + std::to_string(me_) + ": expected " +
                        std::to_string(end) + " (= " + std::to_string(start) + " + " + std::to_string(sum) +
                        " added this round) got " + std::to_string(final_v));
        std::sort(spans.begin(), spans.end());
        for (std::size_t i = 0; i < spans.size(); ++i) {
          const bool inside = spans[i].first >= start && spans[i].second <= end;
          const bool disjoint = i == 0 || spans[i].first >= spans[i - 1].second;
          expect_word(
              inside && disjoint, r,
              "add word " + std::to_string(j) + " on rank " + std::to_string(me_) + ": fetch_add returned " +
                  std::to_string(spans[i].first) + " (+" + std::to_string(spans[i].second - spans[i].first) + ")" +
                  (inside ? ""
                          : ", outside this round's [" + std::to_string(start) + ", " + std::to_string(end) + ")") +
                  (disjoint ? "" : ", overlapping another fetch_add's range (not atomic)"));
        }
        for (std::uint64_t v : reads)
          expect_word(v >= start && v <= end, r,
                      "add word " + std::to_string(j) + ": fetch returned " + std::to_string(v) + " outside [" +
                          std::to_string(start) + ", " + std::to_string(end) + "]");
        add_expected_[j] = final_v;
      }
      // swap words: {initial token} + tokens swapped in == tokens returned + final value, as multisets
      {
        std::vector<std::uint64_t> in{swap_init(s_.seed, r, me_, j)}, out, reads;
        for (int x = 0; x < P_; ++x) {
          for (const POp& op : plans[x].ops) {
            if (op.pe != me_ || op.word != static_cast<std::uint32_t>(j)) continue;
            const std::uint64_t got = logs_[static_cast<std::size_t>(x) * logmax_ + op.log].result;
            if (op.kind == K::swap) {
              in.push_back(op.value);
              out.push_back(got);
            } else if (op.kind == K::fetch_swap_word) {
              reads.push_back(got);
            }
          }
        }
        std::uint64_t final_v;
        {
          Timer t(hist_, Op::atomic_fetch);
          final_v = ctx_.atomic_fetch(swap_word(j), me_);
        }
        out.push_back(final_v);
        std::sort(in.begin(), in.end());
        std::sort(out.begin(), out.end());
        std::size_t diff = 0;
        {
          std::vector<std::uint64_t> d;
          std::set_symmetric_difference(in.begin(), in.end(), out.begin(), out.end(), std::back_inserter(d));
          diff = d.size();
        }
        expect_word(diff == 0, r,
                    "swap word " + std::to_string(j) + " on rank " + std::to_string(me_) + ": " + std::to_string(diff) +
                        " tokens differ between those swapped in (" + std::to_string(in.size()) +
                        " with the initial one) and those returned plus the final value (lost or duplicated)");
        for (std::uint64_t v : reads)
          expect_word(std::binary_search(in.begin(), in.end(), v), r,
                      "swap word " + std::to_string(j) + ": fetch returned " + std::to_string(v) +
                          ", a value no rank swapped in this round");
        Timer t(hist_, Op::atomic_set);
        ctx_.atomic_set(swap_word(j), swap_init(s_.seed, r + 1, me_, j), me_);
      }
      // CAS words: the successful olds are exactly start, start + 1, ..., final - 1
      {
        const std::uint64_t start = cas_expected_[j];
        std::vector<std::uint64_t> olds, reads;
        for (int x = 0; x < P_; ++x) {
          for (const POp& op : plans[x].ops) {
            if (op.pe != me_ || op.word != static_cast<std::uint32_t>(j)) continue;
            const LogEntry& e = logs_[static_cast<std::size_t>(x) * logmax_ + op.log];
            if (op.kind == K::cas_inc && e.result != kCasGaveUp) olds.push_back(e.result);
            if (op.kind == K::cas_fail) {
              expect_word(e.result != op.value, r, "compare_swap with an impossible expected value returned it");
              reads.push_back(e.result);
            }
            if (op.kind == K::fetch_cas_word) reads.push_back(e.result);
          }
        }
        std::uint64_t final_v;
        {
          Timer t(hist_, Op::atomic_fetch);
          final_v = ctx_.atomic_fetch(cas_word(j), me_);
        }
        std::sort(olds.begin(), olds.end());
        bool ok = final_v == start + olds.size();
        for (std::size_t i = 0; ok && i < olds.size(); ++i) ok = olds[i] == start + i;
        expect_word(
            ok, r,
            "cas word " + std::to_string(j) + " on rank " + std::to_string(me_) + ": start " + std::to_string(start) +
                ", " + std::to_string(olds.size()) + " successful increments, final " + std::to_string(final_v) +
                (olds.empty() ? ""
                              : ", olds from " + std::to_string(olds.front()) + " to " + std::to_string(olds.back())));
        for (std::uint64_t v : reads)
          expect_word(v >= start && v <= final_v, r,
                      "cas word " + std::to_string(j) + ": a fetch or failed compare_swap returned " +
                          std::to_string(v) + " outside [" + std::to_string(start) + ", " + std::to_string(final_v) +
                          "]");
        cas_expected_[j] = final_v;
      }
    }
  }

  // ---- one round; false after the last ----
  bool round(std::uint64_t r) {
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
    const bool moe = s_.moe_every > 0 &&
                     r % static_cast<std::uint64_t>(s_.moe_every) == static_cast<std::uint64_t>(s_.moe_every - 1);

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
      expect_word(d == e + 1, r,
                  "done word of rank " + std::to_string(x) + ": expected " + std::to_string(e + 1) + " got " +
                      std::to_string(d));
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

  Context& ctx_;
  const Settings& s_;
  const PlanSettings& ps_;
  int P_, me_;
  std::size_t slot_ = 0, gbytes_ = 0, logmax_ = 0;
  Symmetric<std::byte> slots_, gbuf_;
  Symmetric<LogEntry> logs_;
  Symmetric<std::uint64_t> sigs_, words_;
  std::vector<std::uint64_t> sig_sent_, sig_recv_, add_expected_, cas_expected_, cas_cache_;
  std::vector<std::vector<std::byte>> keep_;  // sources of this round's puts, until the quiet of phase D
  std::vector<PendingGet> pending_;
  std::vector<Hist> hist_;
  Counters counters_;
  Mismatches mism_;
  Rng probe_rng_{0};
  std::byte zero_{};
  Clock::time_point start_, last_report_;
  double elapsed_s_ = 0;
  std::uint64_t round_ = 0;
  const char* phase_ = "setup";
  int op_index_ = -1, op_pe_ = 0;
  bool injected_ = false;
  K op_kind_ = K::fence;
};

std::string us(std::uint64_t ns) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", static_cast<double>(ns) / 1000.0);
  return b;
}

int main_impl(int argc, char** argv) {
  Settings s;
  CLI::App app{"ubep-stress: the soak test (issue 14). Run under mpirun; every rank gets the same options."};
  app.add_option("--duration", s.duration_s, "seconds to run (rank 0 decides, at the end of a round)");
  app.add_option("--ops", s.max_ops, "stop once the ranks did this many operations in total (0 = no limit)");
  app.add_option("--rounds", s.max_rounds, "stop after this many rounds (0 = no limit)");
  app.add_option("--seed", s.seed, "the seed every plan derives from (a mismatch names it and its round)");
  app.add_option("--json", s.json, "write a machine-readable summary to this file (rank 0)");
  app.add_option("--delay-prob", s.delay_prob, "chance of a random sleep before each operation");
  app.add_option("--delay-max-us", s.delay_max_us, "longest random sleep");
  app.add_option("--stall-every", s.stall_every, "rounds between stalls on average (0 = never)");
  app.add_option("--stall-ms", s.stall_max_ms, "longest stall: a rank that makes no ubep call for that long");
  app.add_option("--stall-min-ms", s.stall_min_ms, "shortest stall");
  app.add_option("--moe-every", s.moe_every, "an MoE section every N rounds (0 = never)");
  app.add_option("--quiet-every", s.quiet_every, "one completion call (fence/quiet/flush/...) per N operations");
  app.add_option("--ops-per-round", s.ops_per_round, "planned operations per rank and round");
  app.add_option("--max-bytes", s.max_bytes, "largest put or get (sizes are log-uniform from 1)");
  app.add_option("--heap-size", s.heap, "symmetric heap per rank unless UBEP_HEAP_SIZE is set");
  app.add_option("--self-atomics", s.self_atomics,
                 "auto|on|off: may a rank update its own counters while the others do (auto: not when the atomics "
                 "go through MPI, docs/ROUTES.md \"Known limit\")");
  app.add_option("--report-every", s.report_every_s, "seconds between progress lines (0 = none)");
  app.add_option("--print-limit", s.print_limit, "mismatches printed per rank (all are counted)");
  app.add_option("--inject", s.inject,
                 "self-check: rank 0 breaks one thing on purpose (data, stale, signal, counter, swap, cas, get, moe); "
                 "the run must then fail")
      ->check(CLI::IsMember({"none", "data", "stale", "signal", "counter", "swap", "cas", "get", "moe"}));
  app.add_option("--inject-round", s.inject_round, "the round of --inject");
  app.add_option("--first-round", s.first_round,
                 "replay: start at this round (its plans are those of a run from 0; a mismatch or error names its "
                 "round)");
  CLI11_PARSE(app, argc, argv);
  if (s.stall_min_ms > s.stall_max_ms) s.stall_min_ms = s.stall_max_ms;
  if (s.max_bytes < 1 || s.ops_per_round < 1 || s.quiet_every < 1) {
    std::fprintf(stderr, "ubep-stress: --max-bytes, --ops-per-round and --quiet-every must be >= 1\n");
    return 2;
  }

  Options opts = Options::from_env();
  if (std::getenv("UBEP_HEAP_SIZE") == nullptr) opts.heap_size = parse_size(s.heap, "--heap-size");
  Context ctx(MPI_COMM_WORLD, opts);
  const int P = ctx.size(), me = ctx.rank();
  PlanSettings ps;
  ps.seed = s.seed;
  ps.ranks = P;
  ps.ops_per_round = s.ops_per_round;
  ps.max_bytes = s.max_bytes;
  ps.completion_prob = 1.0 / s.quiet_every;
  ps.self_atomics = s.self_atomics == "on" || (s.self_atomics == "auto" && !ctx.atomics_through_mpi());
  ctx.agree("ubep-stress settings",
            {static_cast<std::int64_t>(s.seed), s.ops_per_round, static_cast<std::int64_t>(s.max_bytes), s.moe_every,
             ps.self_atomics ? 1 : 0, static_cast<std::int64_t>(s.stall_every * 1000),
             static_cast<std::int64_t>(s.duration_s * 1000), static_cast<std::int64_t>(s.max_ops)},
            {"seed", "ops_per_round", "max_bytes", "moe_every", "self_atomics", "stall_every", "duration", "ops"});

  const RuntimeInfo info = ctx.info();
  std::map<std::string, int> routes;
  for (Route r : info.routes) ++routes[to_string(r)];
  std::string transports, route_text;
  for (const auto& t : info.transports) transports += (transports.empty() ? "" : ",") + t;
  for (const auto& [name, n] : routes) route_text += (route_text.empty() ? "" : " ") + name + "x" + std::to_string(n);
  const char* atomics = ctx.atomics_through_mpi() ? "mpi" : info.ucx.empty() ? "load/store" : "ucx";
  if (me == 0) {
    std::printf("# ubep-stress: %d ranks on %d node(s), seed %" PRIu64 ", duration %.0f s, ops %" PRIu64
                ", %d ops/round, max %zu bytes, moe every %d rounds, delay prob %g (max %u us), stall every %g "
                "rounds (%u-%u ms)\n",
                P, ctx.topology().num_nodes(), s.seed, s.duration_s, s.max_ops, s.ops_per_round, s.max_bytes,
                s.moe_every, s.delay_prob, s.delay_max_us, s.stall_every, s.stall_min_ms, s.stall_max_ms);
    std::printf("# rank 0: transports %s, routes %s, atomics %s, self atomics %s, UBEP_WAIT_TIMEOUT %.0f s\n",
                transports.c_str(), route_text.c_str(), atomics, ps.self_atomics ? "on" : "off",
                ctx.options().wait_timeout.count());
    std::fflush(stdout);
  }

  Runner runner(ctx, s, ps);
  std::uint64_t rounds = 0;
  try {
    rounds = runner.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ubep-stress: ERROR rank %d at %s: %s\n", me, runner.where().c_str(), e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
  }
  const double elapsed = runner.elapsed_s();

  // Sum everything on rank 0 (every rank is past its last wait: a plain MPI collective is safe after barrier).
  ctx.barrier();
  const Counters& c = runner.counters();
  std::vector<std::uint64_t> sums{c.bytes_checked, c.words_checked,    c.mismatches,  c.moe_calls,
                                  c.moe_tokens,    c.zero_token_calls, c.delays,      c.stalls,
                                  c.stall_ms,      c.cas_retries,      c.cas_gave_up, runner.ops()};
  std::vector<std::uint64_t> tot(sums.size());
  MPI_Reduce(sums.data(), tot.data(), static_cast<int>(sums.size()), MPI_UINT64_T, MPI_SUM, 0, ctx.comm());
  std::uint64_t first = c.first_mismatch_round, first_all = 0;
  MPI_Reduce(&first, &first_all, 1, MPI_UINT64_T, MPI_MIN, 0, ctx.comm());
  std::vector<std::uint64_t> per_rank(P);
  MPI_Gather(&c.mismatches, 1, MPI_UINT64_T, per_rank.data(), 1, MPI_UINT64_T, 0, ctx.comm());
  std::vector<Hist> all(kOps);
  for (int k = 0; k < kOps; ++k) {
    const Hist& h = runner.hist()[k];
    MPI_Reduce(h.counts.data(), all[k].counts.data(), Hist::kBuckets, MPI_UINT64_T, MPI_SUM, 0, ctx.comm());
    MPI_Reduce(&h.n, &all[k].n, 1, MPI_UINT64_T, MPI_SUM, 0, ctx.comm());
    MPI_Reduce(&h.max_ns, &all[k].max_ns, 1, MPI_UINT64_T, MPI_MAX, 0, ctx.comm());
  }

  int rc = 0;
  if (me == 0) {
    const std::uint64_t ops = tot[11], mism = tot[2];
    std::printf("# rounds %" PRIu64 ", %.1f s, operations %" PRIu64 " (%.0f/s), bytes checked %" PRIu64
                ", words checked %" PRIu64 ", mismatches %" PRIu64 "\n",
                rounds, elapsed, ops, static_cast<double>(ops) / std::max(elapsed, 1e-9), tot[0], tot[1], mism);
    std::printf("# moe calls %" PRIu64 " (%" PRIu64 " tokens, %" PRIu64 " zero-token calls), delays %" PRIu64
                ", stalls %" PRIu64 " (%" PRIu64 " ms), compare_swap retries %" PRIu64 " (gave up %" PRIu64 ")\n",
                tot[3], tot[4], tot[5], tot[6], tot[7], tot[8], tot[9], tot[10]);
    std::printf("%-18s %12s %10s %10s %10s %12s\n", "# op", "count", "p50_us", "p99_us", "p99.9_us", "max_us");
    nlohmann::json jops = nlohmann::json::object();
    for (int k = 0; k < kOps; ++k) {
      const Hist& h = all[k];
      if (h.n == 0) continue;
      std::printf("%-18s %12" PRIu64 " %10s %10s %10s %12s\n", to_string(static_cast<Op>(k)), h.n,
                  us(h.quantile(0.5)).c_str(), us(h.quantile(0.99)).c_str(), us(h.quantile(0.999)).c_str(),
                  us(h.max_ns).c_str());
      jops[to_string(static_cast<Op>(k))] = {{"count", h.n},
                                             {"p50_us", h.quantile(0.5) / 1000.0},
                                             {"p99_us", h.quantile(0.99) / 1000.0},
                                             {"p99.9_us", h.quantile(0.999) / 1000.0},
                                             {"max_us", h.max_ns / 1000.0}};
    }
    if (mism == 0) {
      std::printf("ubep-stress: PASSED: %" PRIu64 " operations, %" PRIu64 " bytes checked, 0 mismatches\n", ops,
                  tot[0]);
    } else {
      std::string who;
      for (int x = 0; x < P; ++x)
        if (per_rank[x] > 0) who += " rank " + std::to_string(x) + ": " + std::to_string(per_rank[x]);
      std::printf("ubep-stress: FAILED: %" PRIu64 " mismatches (%s), the first in round %" PRIu64
                  "; rerun with --seed %" PRIu64 "\n",
                  mism, who.c_str() + 1, first_all, s.seed);
      rc = 1;
    }
    std::fflush(stdout);
    if (!s.json.empty()) {
      nlohmann::json j;
      j["tool"] = "ubep-stress";
      j["version"] = UBEP_VERSION_STRING;
      j["ranks"] = P;
      j["nodes"] = ctx.topology().num_nodes();
      j["seed"] = s.seed;
      j["transports"] = info.transports;
      j["routes"] = routes;
      j["atomics"] = atomics;
      j["self_atomics"] = ps.self_atomics;
      j["options"] = ctx.options().describe();
      j["settings"] = {{"duration_s", s.duration_s},       {"ops", s.max_ops},
                       {"ops_per_round", s.ops_per_round}, {"max_bytes", s.max_bytes},
                       {"moe_every", s.moe_every},         {"quiet_every", s.quiet_every},
                       {"delay_prob", s.delay_prob},       {"delay_max_us", s.delay_max_us},
                       {"stall_every", s.stall_every},     {"stall_ms", {s.stall_min_ms, s.stall_max_ms}}};
      j["rounds"] = rounds;
      j["elapsed_s"] = elapsed;
      j["operations"] = ops;
      j["bytes_checked"] = tot[0];
      j["words_checked"] = tot[1];
      j["mismatches"] = mism;
      j["mismatches_per_rank"] = per_rank;
      if (mism > 0) j["first_mismatch_round"] = first_all;
      j["moe"] = {{"calls", tot[3]}, {"tokens", tot[4]}, {"zero_token_calls", tot[5]}};
      j["delays"] = tot[6];
      j["stalls"] = {{"count", tot[7]}, {"total_ms", tot[8]}};
      j["compare_swap"] = {{"retries", tot[9]}, {"gave_up", tot[10]}};
      j["latency"] = jops;
      j["passed"] = mism == 0;
      std::ofstream(s.json) << j.dump(2) << "\n";
    }
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, ctx.comm());
  ctx.finalize();
  return rc;
}

}  // namespace
}  // namespace ubep::stress

int main(int argc, char** argv) {
  try {
    return ubep::stress::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ubep-stress: ERROR: %s\n", e.what());
    std::fflush(stderr);
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
  }
}
