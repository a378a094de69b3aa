// ubep's dispatch/combine. Symmetric buffers, per buffer set (UBEP_RUN_AHEAD sets, call c uses set c % S):
//   dbuf  [S][max_local][ranks][M] tokens  on the expert's owner, written by each source into its slot
//   dmeta [S][max_local][ranks]           the source's combine offset for that batch
//   dsig  [S][max_local][ranks]           (c+1) << 32 | count, set by the source after its data
//   cbuf  [S][M * topk] outputs            on the token's source, written by the expert owners
//   csig  [S][num_experts]                 (c+1) << 32 | count, set by the owner after the outputs
//   rel   [ranks]                          c+1: owner d has consumed everything of call c from us
// No collective, no barrier: a source writes call c into owner d's set only after d released call c-S.
#include <algorithm>
#include <cstring>
#include <string>

#include "moe/handle.hpp"
#include "ubep/moe.hpp"
#include "ubep/topology.hpp"

namespace ubep::moe {

struct Layer::Impl {
  Symmetric<std::byte> dbuf, cbuf;
  Symmetric<std::uint64_t> dmeta, dsig, csig, rel;
  std::vector<int> schedule;
  std::vector<int> writers;  // writer of each (local expert, source) dispatch signal: the source
  std::vector<std::byte> staging;
  std::size_t set_tokens = 0;  // tokens per (set) in dbuf: max_local * ranks * M
  std::size_t heap = 0;
};

namespace {
constexpr std::uint64_t tag(std::uint64_t call) { return (call + 1) << 32; }
}  // namespace

std::size_t Layer::heap_bytes(const Config& c, int ranks, unsigned run_ahead) {
  const ExpertMap map{c.num_experts, ranks};
  const std::size_t tb = token_stride(c), ob = output_stride(c);
  const std::size_t L = static_cast<std::size_t>(map.max_local()), P = ranks, M = c.max_tokens_per_rank;
  const std::size_t words = run_ahead * (2 * L * P + c.num_experts) + P;
  const auto up = [](std::size_t b) { return (b + 63) / 64 * 64; };
  return up(run_ahead * L * P * M * tb) + up(run_ahead * M * c.topk * ob) + 4 * up(words * 8) + 4096;
}

Layer::Layer(Context& ctx, const Config& config)
    : LayerBase(ctx, config, "moe::Layer"), impl_(std::make_unique<Impl>()) {
  const std::size_t S = ctx.options().run_ahead, L = map_.max_local(), P = size_;
  const std::size_t M = static_cast<std::size_t>(config.max_tokens_per_rank);
  impl_->set_tokens = L * P * M;
  const std::size_t need = heap_bytes(config, size_, ctx.options().run_ahead);
  if (need > ctx.heap_free()) {
    throw OutOfHeap("ubep: rank " + std::to_string(rank_) + ": moe::Layer: needs " + std::to_string(need) +
                    " bytes of symmetric heap, " + std::to_string(ctx.heap_free()) +
                    " are free; set UBEP_HEAP_SIZE to at least " +
                    std::to_string(need + (ctx.options().heap_size - ctx.heap_free())) +
                    " (or lower max_tokens_per_rank or UBEP_RUN_AHEAD)");
  }
  impl_->dbuf = ctx.alloc<std::byte>(S * impl_->set_tokens * token_bytes_);
  impl_->cbuf = ctx.alloc<std::byte>(S * M * config.topk * out_token_bytes_);
  impl_->dmeta = ctx.alloc<std::uint64_t>(S * L * P);
  impl_->dsig = ctx.alloc_signals(S * L * P);
  impl_->csig = ctx.alloc_signals(S * config.num_experts);
  impl_->rel = ctx.alloc_signals(P);
  impl_->heap = need;
  impl_->schedule = ubep::schedule(ctx.topology(), rank_, parse_schedule(ctx.options().schedule));
  impl_->staging.resize(M * config.topk * token_bytes_);
  for (int le = 0; le < map_.count(rank_); ++le) {
    for (int src = 0; src < size_; ++src) impl_->writers.push_back(src);
  }
}

Layer::~Layer() = default;
const std::vector<int>& Layer::schedule() const noexcept { return impl_->schedule; }
std::size_t Layer::buffer_bytes() const { return impl_->heap + impl_->staging.size(); }

void Layer::send(HandleState& h, std::span<const std::byte> tokens, std::span<const float> scales) {
  Impl& m = *impl_;
  const std::size_t S = ctx_.options().run_ahead, L = map_.max_local(), P = size_;
  const std::size_t M = static_cast<std::size_t>(config_.max_tokens_per_rank);
  const std::size_t payload = static_cast<std::size_t>(config_.hidden) * element_size(config_.dtype);
  const bool scaled = config_.dtype == DType::e4m3;
  h.meta_out.assign(P * L, 0);
  std::size_t staged = 0;
  for (int d : m.schedule) {
    // Back-pressure: d must have consumed call c - S from us before we overwrite that buffer set.
    if (h.call >= S) {
      const int w[] = {d};
      ctx_.wait_until(&m.rel[d], Cmp::ge, h.call - S + 1, {.writers = w, .what = "moe back-pressure (run-ahead)"});
    }
    const int local_d = map_.count(d);
    const bool direct = ctx_.route(d) != Route::mpi;  // load/store: copy each token straight into d
    for (int le = 0; le < local_d; ++le) {
      const std::size_t b = static_cast<std::size_t>(d) * L + le;
      const std::vector<int>& toks = h.batch_tokens[b];
      const std::size_t slot = ((h.set * L + le) * P + rank_) * M;
      std::byte* dest = m.dbuf.data() + slot * token_bytes_;
      if (direct) {
        for (std::size_t j = 0; j < toks.size(); ++j) {
          ctx_.put(dest + j * token_bytes_, tokens.data() + toks[j] * payload, payload, d);
          if (scaled) ctx_.put(dest + j * token_bytes_ + payload, &scales[toks[j]], 4, d);
        }
      } else if (!toks.empty()) {
        std::byte* st = m.staging.data() + staged * token_bytes_;
        pack(toks, st, tokens, scales);
        ctx_.put_nbi(dest, st, toks.size() * token_bytes_, d);
        staged += toks.size();
      }
      h.meta_out[b] = h.coffset[b];
      ctx_.put_nbi(&m.dmeta[(h.set * L + le) * P + rank_], &h.meta_out[b], 8, d);
    }
    ctx_.fence();  // the data and metadata above are delivered before the signals below
    for (int le = 0; le < local_d; ++le) {
      const std::size_t b = static_cast<std::size_t>(d) * L + le;
      ctx_.signal_op(&m.dsig[(h.set * L + le) * P + rank_], tag(h.call) | h.send_counts[b], SignalOp::set, d);
    }
  }
  ctx_.progress();  // on the mpi route: one flush per peer, then every signal
}

std::optional<int> Layer::next_expert(Handle& h) {
  check_handle(h, "next_expert");
  HandleState& s = h.state();
  Impl& m = *impl_;
  const int local = local_experts();
  release_if_done(s);  // a rank without experts releases at once
  if (s.num_returned == local) return std::nullopt;
  const std::size_t L = map_.max_local(), P = size_;
  const std::size_t M = static_cast<std::size_t>(config_.max_tokens_per_rank);
  // Every (local expert, source) signal of this call, with its target: tag(call) until seen, then a
  // value no signal reaches, so that each wait returns only for signals that arrived since the last one.
  const std::span<const std::uint64_t> all(&m.dsig[s.set * L * P], local * P);
  if (s.want.empty()) s.want.assign(local * P, tag(s.call));
  constexpr std::uint64_t kSeen = ~std::uint64_t{0};
  for (;;) {
    for (int le = 0; le < local; ++le) {
      if (s.returned[le]) continue;
      if (!s.ready[le]) {
        bool complete = true;
        for (std::size_t src = 0; src < P && complete; ++src) complete = s.want[le * P + src] == kSeen;
        if (!complete) continue;
        for (std::size_t src = 0; src < P; ++src) {
          s.recv_counts[le * P + src] = static_cast<int>(all[le * P + src] & 0xffffffffu);
          s.recv_meta[le * P + src] = m.dmeta[(s.set * L + le) * P + src];
        }
        regroup(s, le, [&](int src) { return m.dbuf.data() + (((s.set * L + le) * P + src) * M) * token_bytes_; });
        release_if_done(s);
      }
      s.returned[le] = 1;
      ++s.num_returned;
      return le;
    }
    const std::string what = "moe dispatch counts of call " + std::to_string(s.call);
    for (std::size_t i : ctx_.wait_until_some(all, Cmp::ge, s.want, {.writers = m.writers, .what = what.c_str()})) {
      s.want[i] = kSeen;
    }
  }
}

void Layer::release_if_done(HandleState& s) {
  if (s.released || s.num_ready != local_experts()) return;
  // Everything of this call is copied out of our buffers: let every source reuse its set.
  for (int src = 0; src < size_; ++src) ctx_.signal_op(&impl_->rel[rank_], s.call + 1, SignalOp::set, src);
  ctx_.progress();
  s.released = true;
}

void Layer::dispatch_recv(Handle& h) {
  check_handle(h, "dispatch_recv");
  HandleState& s = h.state();
  // Complete every expert; hand-out state is restored so that next_expert still returns each once.
  std::vector<std::uint8_t> returned = s.returned;
  const int was = s.num_returned;
  while (next_expert(h)) {
  }
  s.returned = std::move(returned);
  s.num_returned = was;
}

void Layer::combine_send(Handle& h, int local, std::span<const std::byte> outputs) {
  check_combine_send(h, local, outputs);
  HandleState& s = h.state();
  Impl& m = *impl_;
  const std::size_t P = size_, Mk = static_cast<std::size_t>(config_.max_tokens_per_rank) * config_.topk;
  const int e = map_.first(rank_) + local;
  // Rows of `outputs` are in source order (regroup order); send each source its block.
  std::vector<std::size_t> first(P + 1, 0);
  for (std::size_t src = 0; src < P; ++src) first[src + 1] = first[src] + s.recv_counts[local * P + src];
  for (int src : m.schedule) {
    const int c = s.recv_counts[local * P + src];
    if (c == 0) continue;
    std::byte* dest = m.cbuf.data() + (s.set * Mk + s.recv_meta[local * P + src]) * out_token_bytes_;
    ctx_.put_nbi(dest, outputs.data() + first[src] * out_token_bytes_, c * out_token_bytes_, src);
  }
  ctx_.fence();
  for (int src : m.schedule) {
    const int c = s.recv_counts[local * P + src];
    if (c) ctx_.signal_op(&m.csig[s.set * config_.num_experts + e], tag(s.call) | c, SignalOp::set, src);
  }
  ctx_.quiet();  // `outputs` may be reused when we return; on the mpi route this also sends the signals
  s.combined[local] = 1;
  ++s.num_combined;
}

void Layer::combine_recv(Handle& h, std::span<float> out) {
  check_handle(h, "combine_recv");
  HandleState& s = h.state();
  Impl& m = *impl_;
  const int E = config_.num_experts, L = map_.max_local();
  if (s.num_combined != local_experts()) {
    throw Error(Errc::invalid_argument, "ubep: rank " + std::to_string(rank_) +
                                            ": combine_recv: " + std::to_string(local_experts() - s.num_combined) +
                                            " local expert(s) of this call were not combine_sent yet");
  }
  std::vector<std::uint64_t> want(E, 0);
  std::vector<int> writers(E);
  for (int e = 0; e < E; ++e) {
    const int d = map_.owner(e), le = e - map_.first(d);
    writers[e] = d;
    if (s.send_counts[static_cast<std::size_t>(d) * L + le]) want[e] = tag(s.call);
  }
  const std::string what = "moe combine, call " + std::to_string(s.call);
  ctx_.wait_until_all({&m.csig[s.set * E], static_cast<std::size_t>(E)}, Cmp::ge, want,
                      {.writers = writers, .what = what.c_str()});
  reduce(
      s,
      m.cbuf.data() + s.set * static_cast<std::size_t>(config_.max_tokens_per_rank) * config_.topk * out_token_bytes_,
      out);
  finish(s);
}

}  // namespace ubep::moe
