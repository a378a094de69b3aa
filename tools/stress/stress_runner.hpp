// ubep-stress: the Runner, which plays the rounds of the soak on one rank (the tool is described in
// ubep_stress.cpp), and the settings it runs with. Its parts: stress_runner.cpp (set-up, the run loop, phase A:
// the planned operations, probes and self-check faults), stress_round.cpp (one round's phases and the waits),
// stress_checks.cpp (the checks of data, words and counters).
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
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "stress_core.hpp"
#include "stress_plan.hpp"
#include "ubep/ubep.hpp"

namespace ubep::stress {

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

class Runner {
 public:
  Runner(Context& ctx, const Settings& s, const PlanSettings& ps);

  /// Runs rounds until rank 0 says stop; returns the number of rounds.
  std::uint64_t run();

  std::uint64_t ops() const {
    std::uint64_t n = 0;
    for (const Hist& h : hist_) n += h.n;
    return n;
  }
  const std::vector<Hist>& hist() const { return hist_; }
  const Counters& counters() const { return counters_; }
  double elapsed_s() const { return elapsed_s_; }
  /// Where the rank is, for an error report.
  std::string where() const;

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
  void maybe_delay(Rng& rng);
  void stall(std::uint32_t ms);  // no ubep call at all for `ms`

  // ---- the self-check's faults ----
  bool inject_now(const char* kind, std::uint64_t r) const;
  void inject_after_ops(std::uint64_t r);

  // ---- checks (stress_checks.cpp) ----
  void check_write(int writer, const POp& op, std::size_t index, std::uint64_t r, const char* when);
  void check_get(int owner, std::size_t off, const std::byte* got, std::size_t len, std::uint64_t r, K kind, int index);
  void expect_word(bool ok, std::uint64_t r, const std::string& what);

  struct PendingGet {
    int pe, index;
    std::size_t off, len;
    std::vector<std::byte> buf;
  };
  void complete_gets(std::optional<int> pe, std::uint64_t r);

  // ---- the test* probes: results known from the protocol ----
  void probe(Rng& rng, std::uint64_t r);  // r: rounds since the first

  // ---- phase A: one planned operation ----
  void execute(const POp& op, std::size_t index, std::uint64_t r, std::vector<std::vector<LogEntry>>& logs);

  // ---- waits of every kind (stress_round.cpp) ----
  // Waits until sig[x] >= values[x] for every x whose value is not kSignalIgnored; `kind` picks the call.
  // `exact`: every signal ends at exactly its value this round (so Cmp::eq is a valid way to wait for it).
  void wait_values(const std::uint64_t* sig, const std::vector<std::uint64_t>& values, std::uint64_t kind,
                   const char* what, Rng& rng, bool exact);

  // ---- counters, as their owner (stress_checks.cpp) ----
  void check_counters(std::uint64_t r, const std::vector<Plan>& plans);

  // ---- one round; false after the last (stress_round.cpp) ----
  bool round(std::uint64_t r);

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

}  // namespace ubep::stress
