// ubep-stress: the MoE part of a round: random layer configs and routing through moe::Layer, checked bit
// for bit against moe::BspLayer of the same config.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "stress_core.hpp"
#include "ubep/moe.hpp"
#include "ubep/ubep.hpp"

namespace ubep::stress {

struct MoeSettings {
  std::uint64_t seed = 1;
  int max_tokens = 24;      // per rank and call
  int max_hidden = 96;      // elements per token
  double delay_prob = 0.0;  // per expert: a "compute" delay with Layer::progress() calls
  std::uint32_t delay_max_us = 2000;
  bool inject = false;  // self-check: this rank's experts return a wrong value to Layer (not to BspLayer)
};

/// One MoE section of round `round`, on every rank (collective: every rank calls it in the same round).
/// `stall_ms` > 0: this rank computes that long (calling Layer::progress(), as moe.hpp asks of a rank that
/// stays outside the layer) between its dispatch and its combine.
void moe_round(Context& ctx, const MoeSettings& s, std::uint64_t round, std::uint32_t stall_ms, std::vector<Hist>& hist,
               Counters& counters, Mismatches& mismatches);

}  // namespace ubep::stress
