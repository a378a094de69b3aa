// ubep-stress: what each rank does in one round, as a pure function of (seed, round, rank). Every rank can
// regenerate every other rank's plan, so each target knows exactly which bytes, signals and counter updates
// it must have received, and a mismatch is reproducible from the seed and the round.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "stress_core.hpp"
#include "ubep/signal.hpp"

namespace ubep::stress {

/// The sizes and mix every rank uses (the same command line on every rank).
struct PlanSettings {
  std::uint64_t seed = 1;
  int ranks = 1;
  int ops_per_round = 48;           // planned operations per rank and round (CAS retries and waits come on top)
  std::size_t max_bytes = 65536;    // largest put or get
  double completion_prob = 0.12;    // chance that an operation is fence/quiet/flush/flush_local/progress/test
  bool self_atomics = true;         // may a rank update its own counters while the others do?
  static constexpr int kWords = 4;  // counters of each kind per rank
  std::size_t slot_bytes() const { return ((8 * max_bytes + 63) / 64) * 64; }  // per writer, on each target
  std::size_t get_bytes() const { return std::max<std::size_t>(2 * max_bytes, 4096); }
  std::size_t log_entries() const { return static_cast<std::size_t>(ops_per_round); }
};

enum class K : std::uint8_t {
  fill,      // put to self of the next round's get region
  fill_nbi,  // put_nbi of it
  put,
  put_nbi,
  put_signal,
  put_signal_nbi,
  signal_op,  // on the writer's signal word at pe, no data
  get,
  get_nbi,
  fetch_add,  // counter kinds (one kind per word, as the mpi route requires): add words
  add,
  fetch_add_word,
  swap,  // swap words (set only by their owner between rounds)
  fetch_swap_word,
  cas_inc,   // compare-and-swap words: a CAS loop that increments
  cas_fail,  // a compare-and-swap whose expected value the word can never hold
  fetch_cas_word,
  fence,
  quiet,
  flush,
  flush_local,
  progress,
  probe,  // test/test_all/test_any/test_some with a result that is known
};

inline const char* to_string(K k) noexcept {
  static constexpr const char* names[] = {"fill",
                                          "fill_nbi",
                                          "put",
                                          "put_nbi",
                                          "put_signal",
                                          "put_signal_nbi",
                                          "signal_op",
                                          "get",
                                          "get_nbi",
                                          "fetch_add",
                                          "add",
                                          "fetch(add word)",
                                          "swap",
                                          "fetch(swap word)",
                                          "compare_swap loop",
                                          "compare_swap (failing)",
                                          "fetch(cas word)",
                                          "fence",
                                          "quiet",
                                          "flush",
                                          "flush_local",
                                          "progress",
                                          "test*"};
  return names[static_cast<int>(k)];
}

inline bool is_write(K k) { return k == K::put || k == K::put_nbi || k == K::put_signal || k == K::put_signal_nbi; }
inline bool carries_signal(K k) { return k == K::put_signal || k == K::put_signal_nbi || k == K::signal_op; }
inline bool is_logged(K k) {
  return k == K::fetch_add || k == K::fetch_add_word || k == K::swap || k == K::fetch_swap_word || k == K::cas_inc ||
         k == K::cas_fail || k == K::fetch_cas_word;
}

struct POp {
  K kind = K::fence;
  SignalOp sop = SignalOp::set;
  int pe = 0;               // target, owner or flushed peer
  std::uint32_t word = 0;   // counter index
  std::uint32_t sig_k = 0;  // signal ops: index among this round's signal ops to pe
  std::uint32_t log = 0;    // fetching atomics: index of the result in the log sent to pe
  std::size_t off = 0, len = 0;
  std::uint64_t value = 0;  // add amount, swap token, impossible CAS value
  bool early = false;       // writes: visible to pe once it observes this rank's last signal (see below)
};

struct Plan {
  std::vector<POp> ops;
  std::vector<std::uint32_t> sig_ops;    // per target: signal-carrying ops this round
  std::vector<std::uint32_t> log_count;  // per owner: fetching atomics (log entries) this round
};

/// Keys of the patterns and tokens (stress_core.hpp, "keyed patterns").
inline std::uint64_t write_key(std::uint64_t seed, int writer, int target, std::uint64_t round) {
  return key({seed, 1, static_cast<std::uint64_t>(writer), static_cast<std::uint64_t>(target), round});
}
inline std::uint64_t get_key(std::uint64_t seed, int owner, std::uint64_t round) {
  return key({seed, 2, static_cast<std::uint64_t>(owner), round});
}
/// Tokens swapped in: odd, distinct from each other and from the owner's initial tokens (with probability
/// 1 - 2^-60), so the owner can tell every one apart.
inline std::uint64_t swap_token(std::uint64_t seed, std::uint64_t round, int writer, std::size_t op) {
  return key({seed, 3, round, static_cast<std::uint64_t>(writer), op}) | 1;
}
inline std::uint64_t swap_init(std::uint64_t seed, std::uint64_t round, int owner, int word) {
  return key({seed, 4, round, static_cast<std::uint64_t>(owner), static_cast<std::uint64_t>(word)}) | 1;
}
/// A CAS word counts from 0 and never reaches 2^62: this expected value never matches.
constexpr std::uint64_t kImpossible = std::uint64_t{1} << 62;
constexpr std::uint64_t kCasGaveUp = ~std::uint64_t{0};

/// The plan of rank `w` in round `r`. Writes from w to each target use disjoint ranges of w's slot there, at
/// random offsets (any alignment) and log-uniform sizes. `early` marks the writes whose data the target may
/// check as soon as it sees w's signal count reach this round's total: every put_signal/put_signal_nbi
/// (the signal follows its own data), and every put/put_nbi issued before w's last signal_op to that target
/// (signal_op is ordered after every earlier put of the rank). Everything else is checked after w's quiet().
inline Plan make_plan(const PlanSettings& s, std::uint64_t r, int w) {
  const int P = s.ranks;
  Rng rng(key({s.seed, 10, r, static_cast<std::uint64_t>(w)}));
  Plan plan;
  plan.sig_ops.assign(P, 0);
  plan.log_count.assign(P, 0);
  const std::size_t slot = s.slot_bytes(), gbytes = s.get_bytes();

  // The get region of round r + 1, in 1 to 3 pieces, put to self first thing.
  {
    const int pieces = static_cast<int>(rng.range(1, 3));
    std::size_t at = 0;
    for (int i = 0; i < pieces; ++i) {
      const std::size_t end = i + 1 == pieces ? gbytes : at + rng.below(gbytes - at + 1);
      POp op;
      op.kind = rng.chance(0.5) ? K::fill : K::fill_nbi;
      op.pe = w;
      op.off = at;
      op.len = end - at;
      if (op.len > 0) plan.ops.push_back(op);
      at = end;
    }
  }
  std::vector<std::size_t> cursor(P, 0);
  for (int i = 0; i < s.ops_per_round; ++i) {
    POp op;
    if (rng.chance(s.completion_prob)) {
      static constexpr K kinds[] = {K::fence, K::quiet, K::flush, K::flush_local, K::progress, K::probe};
      op.kind = kinds[rng.below(6)];
      op.pe = static_cast<int>(rng.below(static_cast<std::uint64_t>(P)));
      plan.ops.push_back(op);
      continue;
    }
    const auto u = rng.below(85);
    if (u < 30) {  // a write
      static constexpr K kinds[] = {K::put, K::put_nbi, K::put_signal, K::put_signal_nbi};
      op.kind = kinds[rng.below(4)];
      op.sop = rng.chance(0.5) ? SignalOp::set : SignalOp::add;
      op.pe = static_cast<int>(rng.below(static_cast<std::uint64_t>(P)));
      op.len = rng.log_size(1, s.max_bytes);
      if (carries_signal(op.kind) && rng.chance(0.03)) op.len = 0;  // a signal with no data
      op.off = cursor[op.pe] + rng.below(64);
      if (op.off >= slot) op.len = 0;
      op.len = std::min(op.len, slot - std::min(op.off, slot));
      if (op.len == 0 && !carries_signal(op.kind)) {
        op.kind = K::fence;  // the slot is full this round
      } else {
        cursor[op.pe] = std::min(op.off + op.len, slot);
        if (op.len == 0) op.off = 0;
      }
    } else if (u < 35) {
      op.kind = K::signal_op;
      op.sop = rng.chance(0.5) ? SignalOp::set : SignalOp::add;
      op.pe = static_cast<int>(rng.below(static_cast<std::uint64_t>(P)));
    } else if (u < 55) {
      op.kind = rng.chance(0.5) ? K::get : K::get_nbi;
      op.pe = static_cast<int>(rng.below(static_cast<std::uint64_t>(P)));
      op.len = rng.log_size(1, std::min(s.max_bytes, gbytes));
      op.off = rng.below(gbytes - op.len + 1);
    } else {  // an atomic on a counter of some rank
      if (!s.self_atomics && P > 1) {
        op.pe = static_cast<int>(rng.below(static_cast<std::uint64_t>(P - 1)));
        if (op.pe >= w) ++op.pe;
      } else {
        op.pe = static_cast<int>(rng.below(static_cast<std::uint64_t>(P)));
      }
      op.word = static_cast<std::uint32_t>(rng.below(PlanSettings::kWords));
      const auto sub = rng.below(4);
      switch (rng.below(3)) {
        case 0:
          op.kind = sub < 2 ? K::fetch_add : sub == 2 ? K::add : K::fetch_add_word;
          op.value = rng.range(1, 1u << 16);
          break;
        case 1:
          op.kind = sub < 3 ? K::swap : K::fetch_swap_word;
          op.value = swap_token(s.seed, r, w, plan.ops.size());
          break;
        default:
          op.kind = sub < 2 ? K::cas_inc : sub == 2 ? K::cas_fail : K::fetch_cas_word;
          op.value = kImpossible | rng.below(1u << 20);
          break;
      }
      if (is_logged(op.kind)) op.log = plan.log_count[op.pe]++;
    }
    if (carries_signal(op.kind)) op.sig_k = plan.sig_ops[op.pe]++;
    plan.ops.push_back(op);
  }
  // Early-checkable writes (see above).
  std::vector<std::ptrdiff_t> last_sop(P, -1);
  for (std::size_t i = 0; i < plan.ops.size(); ++i)
    if (plan.ops[i].kind == K::signal_op) last_sop[plan.ops[i].pe] = static_cast<std::ptrdiff_t>(i);
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    POp& op = plan.ops[i];
    if (!is_write(op.kind)) continue;
    op.early =
        op.kind == K::put_signal || op.kind == K::put_signal_nbi || static_cast<std::ptrdiff_t>(i) < last_sop[op.pe];
  }
  return plan;
}

}  // namespace ubep::stress
