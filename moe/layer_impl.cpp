// What both MoE implementations share in LayerImpl (moe/layer_impl.hpp): the config checks, the send plan, regrouping
// by expert, the weighted reduction (so that both give bit-identical results), the output buffers and the call checks.
#include "moe/layer_impl.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "moe/kernels.hpp"

namespace ubep::moe {

namespace {
/// Memory::device, one call in flight: the bytes of the token rows (rounded to 256) and of rows and scales.
/// The rows: every row a rank's experts can receive (each source's token at most once per local expert, at
/// most topk of them). Bounded by the 2^52 check of the constructor.
std::pair<std::size_t, std::size_t> device_rows(const Config& c, int ranks) {
  const std::size_t rows = static_cast<std::size_t>(ranks) * static_cast<std::size_t>(c.max_tokens_per_rank) *
                           static_cast<std::size_t>(std::min(c.topk, ExpertMap{c.num_experts, ranks}.max_local()));
  const std::size_t payload = static_cast<std::size_t>(c.hidden) * element_size(c.dtype);
  const std::size_t tokens = (rows * payload + 255) / 256 * 256;
  return {tokens, tokens + (c.dtype == DType::e4m3 ? (rows * sizeof(float) + 255) / 256 * 256 : 0)};
}

bool valid(Memory m) { return m == Memory::host || m == Memory::device; }
bool valid(Combine c) {
  return c == Combine::per_expert || c == Combine::per_rank || c == Combine::per_node || c == Combine::automatic;
}
bool valid(DType t) {
  switch (t) {
    case DType::f32:
    case DType::bf16:
    case DType::e4m3: return true;
  }
  return false;
}
}  // namespace

LayerImpl::LayerImpl(Context& ctx, const Config& c, const char* who) : ctx_(ctx), config_(c) {
  rank_ = ctx.rank();
  size_ = ctx.size();
  const std::string pre = "ubep: rank " + std::to_string(rank_) + ": " + who + ": ";
  auto bad = [&](const std::string& what) { throw Error(Errc::invalid_argument, pre + what); };
  choose_kernels(ctx.options().moe_kernels);  // UBEP_MOE_KERNELS: the first layer of the process picks
  // Before any collective, so that a config every rank shares fails on every rank alike.
  if (!valid(c.dtype)) {
    bad("dtype=" + std::to_string(static_cast<int>(c.dtype)) + " is not a moe::DType (f32=0, bf16=1, e4m3=2)");
  }
  if (!valid(c.combine)) {
    bad("combine=" + std::to_string(static_cast<int>(c.combine)) +
        " is not a moe::Combine (per_expert=0, per_rank=1, per_node=2, automatic=3)");
  }
  if (!valid(c.memory)) {
    bad("memory=" + std::to_string(static_cast<int>(c.memory)) + " is not a moe::Memory (host=0, device=1)");
  }
  // The row kernels (UBEP_MOE_KERNELS), resolved here so that a bad choice fails at construction, naming the rank.
  try {
    (void)kernels();
  } catch (const Error& e) {
    const std::string what = e.what(), drop = "ubep: moe: ";
    throw Error(e.code(), pre + (what.rfind(drop, 0) == 0 ? what.substr(drop.size()) : what));
  }
  // Host-side buffers (per-expert counts, one scratch row) grow with these outside any heap check, so
  // they are bounded: 2^20 experts, rows of 2^20 elements (found by fuzz_moe_validation).
  constexpr int kMaxDim = 1 << 20;
  if (c.num_experts < 1 || c.num_experts > kMaxDim) {
    bad("num_experts=" + std::to_string(c.num_experts) + " must be in [1, " + std::to_string(kMaxDim) + "]");
  }
  if (c.hidden < 1 || c.hidden > kMaxDim) {
    bad("hidden=" + std::to_string(c.hidden) + " must be in [1, " + std::to_string(kMaxDim) + "]");
  }
  if (c.topk < 1 || c.topk > c.num_experts) {
    bad("topk=" + std::to_string(c.topk) + " must be in [1, num_experts=" + std::to_string(c.num_experts) + "]");
  }
  if (c.max_tokens_per_rank < 0) bad("max_tokens_per_rank=" + std::to_string(c.max_tokens_per_rank) + " is negative");
  // Every buffer size (Layer::heap_bytes, BspLayer's buffers) is a product of these; beyond 2^52 bytes the
  // 64-bit sums wrap, and a wrapped heap_bytes passed the heap check (found by fuzz_moe_validation).
  std::uint64_t worst = 8;  // bytes of the widest row element (float partials), times the counts below
  bool wraps = false;
  for (const std::int64_t f : {std::int64_t{c.max_tokens_per_rank}, std::int64_t{c.topk}, std::int64_t{c.hidden},
                               std::int64_t{size_}, static_cast<std::int64_t>(ctx.options().run_ahead)}) {
    wraps = wraps || __builtin_mul_overflow(worst, static_cast<std::uint64_t>(f), &worst);
  }
  if (wraps || worst > (std::uint64_t{1} << 52)) {
    bad("max_tokens_per_rank x topk x hidden = " + std::to_string(c.max_tokens_per_rank) + " x " +
        std::to_string(c.topk) + " x " + std::to_string(c.hidden) + " needs buffers beyond 2^52 bytes on " +
        std::to_string(size_) + " ranks");
  }
  ctx.agree(
      who,
      {c.num_experts, c.hidden, static_cast<std::int64_t>(c.dtype), c.topk, c.max_tokens_per_rank,
       static_cast<std::int64_t>(ctx.options().run_ahead), static_cast<std::int64_t>(c.combine),
       c.float_partials ? 1 : 0},
      {"num_experts", "hidden", "dtype", "topk", "max_tokens_per_rank", "UBEP_RUN_AHEAD", "combine", "float_partials"});
  ctx.agree(who, {static_cast<std::int64_t>(c.memory), c.zero_copy ? 1 : 0},
            {"memory", "zero_copy"});  // agree() takes at most 8 values
  map_ = ExpertMap{c.num_experts, size_};
  token_bytes_ = token_stride(c);
  out_token_bytes_ = output_stride(c);
  if (c.memory == Memory::device) {
    device_scales_ = device_rows(c, size_).first;
    device_set_ = device_heap_bytes(c, size_, 1);
    device_rows_ = ctx.alloc_device<std::byte>(device_heap_bytes(c, size_, ctx.options().run_ahead));
  }
  node_.resize(size_);
  for (int p = 0; p < size_; ++p) node_[p] = ctx.topology().node_of(p);
  config_.combine = resolve_combine(c.combine, ctx.topology());
}

void LayerImpl::count(bool dispatch, int pe, std::size_t bytes) {
  if (pe == rank_) return;
  const bool on = node_[pe] == node_[rank_];
  std::uint64_t& c = dispatch ? (on ? traffic_.dispatch_on_node : traffic_.dispatch_off_node)
                              : (on ? traffic_.combine_on_node : traffic_.combine_off_node);
  c += bytes;
}

LayerImpl::~LayerImpl() = default;

void LayerImpl::check_handle(const Handle& h, const char* call) const {
  if (!h.state_) {
    throw Error(Errc::invalid_argument, "ubep: rank " + std::to_string(rank_) + ": " + call + ": empty handle");
  }
  if (h.state_->finished) {
    throw Error(Errc::invalid_argument, "ubep: rank " + std::to_string(rank_) + ": " + call + ": call #" +
                                            std::to_string(h.state_->call) + " was already combined");
  }
}

void LayerImpl::check_oldest(const Handle& h, const char* call) const {
  // Calls complete in dispatch order, so the oldest call in flight is the number of calls completed.
  if (h.state_->call != finished_) {
    throw Error(Errc::invalid_argument, "ubep: rank " + std::to_string(rank_) + ": " + call + ": call #" +
                                            std::to_string(h.state_->call) + " given, but call #" +
                                            std::to_string(finished_) +
                                            " is older and not combined yet: calls complete in dispatch order");
  }
}

void LayerImpl::check_combine_recv(const Handle& h) const {
  check_handle(h, "combine_recv");
  check_oldest(h, "combine_recv");
  const int missing = local_experts() - h.state_->num_combined;
  if (missing != 0) {
    throw Error(Errc::invalid_argument, "ubep: rank " + std::to_string(rank_) + ": combine_recv: call #" +
                                            std::to_string(h.state_->call) + ": " + std::to_string(missing) +
                                            " local expert(s) were not combine_sent yet");
  }
}

std::size_t LayerImpl::device_heap_bytes(const Config& c, int ranks, unsigned run_ahead) {
  if (c.memory != Memory::device) return 0;
  return device_rows(c, ranks).second * run_ahead;
}

template <class T>
std::span<const T> LayerImpl::to_host(std::span<const T> src, std::vector<std::byte>& stage) {
  if (config_.memory == Memory::host || src.empty()) return src;
  stage.resize(src.size_bytes());
  ctx_.copy(stage.data(), src.data(), src.size_bytes());
  return {reinterpret_cast<const T*>(stage.data()), src.size()};  // std::vector's storage suits any T here
}

Handle LayerImpl::dispatch_send(std::span<const std::byte> tokens, std::span<const int> topk_idx,
                                std::span<const float> topk_weights, std::span<const float> scales) {
  tokens = to_host(tokens, stage_tokens_);
  topk_idx = to_host(topk_idx, stage_idx_);
  topk_weights = to_host(topk_weights, stage_weights_);
  scales = to_host(scales, stage_scales_);
  const std::string pre = "ubep: rank " + std::to_string(rank_) + ": dispatch: ";
  const int k = config_.topk, E = config_.num_experts;
  if (topk_idx.size() % k != 0) {
    throw Error(Errc::invalid_argument, pre + "topk_idx has " + std::to_string(topk_idx.size()) +
                                            " entries, not a multiple of topk=" + std::to_string(k));
  }
  const std::size_t n = topk_idx.size() / k;
  if (n > static_cast<std::size_t>(config_.max_tokens_per_rank)) {
    throw Error(Errc::out_of_range, pre + "n=" + std::to_string(n) + " tokens exceeds max_tokens_per_rank=" +
                                        std::to_string(config_.max_tokens_per_rank));
  }
  const std::size_t payload = static_cast<std::size_t>(config_.hidden) * element_size(config_.dtype);
  if (tokens.size() != n * payload) {
    throw Error(Errc::invalid_argument,
                pre + "tokens has " + std::to_string(tokens.size()) + " bytes, expected n x hidden x " +
                    std::to_string(element_size(config_.dtype)) + " = " + std::to_string(n * payload));
  }
  if (topk_weights.size() != topk_idx.size()) {
    throw Error(Errc::invalid_argument, pre + "topk_weights has " + std::to_string(topk_weights.size()) +
                                            " entries, topk_idx has " + std::to_string(topk_idx.size()));
  }
  const std::size_t want_scales = config_.dtype == DType::e4m3 ? n : 0;
  if (scales.size() != want_scales) {
    throw Error(Errc::invalid_argument, pre + "scales has " + std::to_string(scales.size()) + " entries, expected " +
                                            std::to_string(want_scales) + " (one per token for e4m3, none otherwise)");
  }
  for (std::size_t t = 0; t < n; ++t) {
    for (int a = 0; a < k; ++a) {
      const int e = topk_idx[t * k + a];
      if (e < 0 || e >= E) {
        throw Error(Errc::out_of_range, pre + "token " + std::to_string(t) + " slot " + std::to_string(a) +
                                            ": expert id " + std::to_string(e) + " is out of range [0, " +
                                            std::to_string(E) + ")");
      }
      for (int b = 0; b < a; ++b) {
        if (topk_idx[t * k + b] == e) {
          throw Error(Errc::invalid_argument, pre + "token " + std::to_string(t) + " lists expert " +
                                                  std::to_string(e) + " twice in its top-k");
        }
      }
    }
  }
  if (calls_ - finished_ >= ctx_.options().run_ahead) {
    throw Error(Errc::invalid_argument,
                pre + "call #" + std::to_string(calls_) + " would be the " + std::to_string(calls_ - finished_ + 1) +
                    "th call in flight; combine earlier " +
                    "calls first (UBEP_RUN_AHEAD=" + std::to_string(ctx_.options().run_ahead) + ")");
  }

  Handle handle;
  handle.state_ = std::make_unique<HandleState>();
  HandleState& h = *handle.state_;
  h.call = calls_;
  h.set = static_cast<int>(calls_ % ctx_.options().run_ahead);
  h.n = static_cast<int>(n);
  h.idx.assign(topk_idx.begin(), topk_idx.end());
  h.weights.assign(topk_weights.begin(), topk_weights.end());
  const int L = map_.max_local();
  h.send_counts.assign(static_cast<std::size_t>(size_) * L, 0);
  h.pos.resize(n * k);
  h.batch_tokens.assign(static_cast<std::size_t>(size_) * L, {});
  for (std::size_t t = 0; t < n; ++t) {
    for (int a = 0; a < k; ++a) {
      const int e = topk_idx[t * k + a], d = map_.owner(e), le = e - map_.first(d);
      int& c = h.send_counts[static_cast<std::size_t>(d) * L + le];
      h.pos[t * k + a] = c++;
      h.batch_tokens[static_cast<std::size_t>(d) * L + le].push_back(static_cast<int>(t));
    }
  }
  h.coffset.assign(h.send_counts.size(), 0);
  std::size_t acc = 0;
  for (std::size_t i = 0; i < h.send_counts.size(); ++i) {
    h.coffset[i] = acc;
    acc += static_cast<std::size_t>(h.send_counts[i]);
  }
  const int local = map_.count(rank_);
  h.recv_counts.assign(static_cast<std::size_t>(L) * size_, 0);
  h.recv_meta.assign(static_cast<std::size_t>(L) * size_, 0);
  h.ready.assign(local, 0);
  h.returned.assign(local, 0);
  h.combined.assign(local, 0);
  h.expert_data.resize(local);
  h.expert_scales.resize(local);
  h.out_rows.resize(local);
  h.out_taken.assign(local, 0);
  h.out_in_place.assign(local, 0);
  h.own_outputs.resize(local);
  if (config_.memory == Memory::device) h.device_at.assign(local, kNotOnDevice);
  send(h, tokens, scales);
  ++calls_;
  ++traffic_.calls;
  return handle;
}

Handle LayerImpl::dispatch(std::span<const std::byte> tokens, std::span<const int> topk_idx,
                           std::span<const float> topk_weights, std::span<const float> scales) {
  Handle h = dispatch_send(tokens, topk_idx, topk_weights, scales);
  dispatch_recv(h);
  return h;
}

void LayerImpl::pack(const std::vector<int>& toks, std::byte* dst, std::span<const std::byte> tokens,
                     std::span<const float> scales) const {
  const std::size_t payload = static_cast<std::size_t>(config_.hidden) * element_size(config_.dtype);
  pack_tokens(toks, tokens, scales, payload, dst, token_bytes_);
}

void LayerImpl::stage_tokens(const HandleState& h, std::byte* stage, std::span<const std::byte> tokens,
                             std::span<const float> scales) const {
  std::vector<int> all(static_cast<std::size_t>(h.n));
  std::iota(all.begin(), all.end(), 0);
  pack(all,
       stage + static_cast<std::size_t>(h.set) * static_cast<std::size_t>(config_.max_tokens_per_rank) * token_bytes_,
       tokens, scales);
}

void LayerImpl::check_expert(const Handle& h, int local, const char* call) const {
  check_handle(h, call);
  const HandleState& s = *h.state_;
  const std::string pre = "ubep: rank " + std::to_string(rank_) + ": " + call + ": call " + std::to_string(s.call) +
                          ": local expert " + std::to_string(local);
  if (local < 0 || local >= map_.count(rank_)) {
    throw Error(Errc::out_of_range,
                pre + " is out of range [0, " + std::to_string(map_.count(rank_)) + "): not an expert of this rank");
  }
  if (!s.ready[local]) {
    throw Error(Errc::invalid_argument, pre + " (expert " + std::to_string(map_.first(rank_) + local) +
                                            ") is not complete yet (use next_expert or dispatch_recv)");
  }
}

ExpertTokens LayerImpl::expert_tokens(const Handle& h, int local) const {
  check_expert(h, local, "expert_tokens");
  const HandleState& s = *h.state_;
  ExpertTokens t;
  t.local = local;
  t.expert = map_.first(rank_) + local;
  const std::size_t payload = static_cast<std::size_t>(config_.hidden) * element_size(config_.dtype);
  t.count = static_cast<int>(payload ? s.expert_data[local].size() / payload : 0);
  t.data = s.expert_data[local];
  t.scales = s.expert_scales[local];
  if (config_.memory == Memory::device) {
    // The first call for this expert copies its batch into this call's share of the GPU rows.
    HandleState& m = *h.state_;
    std::byte* set = device_rows_.data() + static_cast<std::size_t>(m.set) * device_set_;
    if (m.device_at[local] == kNotOnDevice) {
      m.device_at[local] = m.device_rows;
      ctx_.copy(set + m.device_rows * payload, t.data.data(), t.data.size_bytes());
      ctx_.copy(set + device_scales_ + m.device_rows * sizeof(float), t.scales.data(), t.scales.size_bytes());
      m.device_rows += static_cast<std::size_t>(t.count);
    }
    t.data = {set + m.device_at[local] * payload, t.data.size()};
    t.scales = {reinterpret_cast<const float*>(set + device_scales_) + m.device_at[local], t.scales.size()};
  }
  return t;
}

void LayerImpl::regroup(HandleState& h, int le, const std::function<const std::byte*(int)>& block,
                        const std::function<const std::uint32_t*(int)>& rows) {
  const std::size_t payload = static_cast<std::size_t>(config_.hidden) * element_size(config_.dtype);
  std::size_t total = 0;
  for (int s = 0; s < size_; ++s)
    total += static_cast<std::size_t>(h.recv_counts[static_cast<std::size_t>(le) * size_ + s]);
  std::vector<std::byte>& data = h.expert_data[le];
  reuse(data, total * payload);
  std::vector<float>& scales = h.expert_scales[le];
  scales.resize(config_.dtype == DType::e4m3 ? total : 0);
  const std::span<const int> counts(&h.recv_counts[static_cast<std::size_t>(le) * size_], size_);
  std::vector<const std::byte*> blocks(counts.size(), nullptr);
  std::vector<const std::uint32_t*> at(rows ? counts.size() : 0, nullptr);
  for (int s = 0; s < size_; ++s) {
    if (counts[s] == 0) continue;
    blocks[s] = block(s);
    if (rows) at[s] = rows(s);
  }
  regroup_tokens(counts, blocks, token_bytes_, payload, data.data(), scales.empty() ? nullptr : scales.data(), at);
  h.ready[le] = 1;
  ++h.num_ready;
}

void LayerImpl::check_out(const HandleState& h, std::span<float> out) const {
  const std::size_t hidden = static_cast<std::size_t>(config_.hidden);
  if (out.size() != static_cast<std::size_t>(h.n) * hidden) {
    throw Error(Errc::invalid_argument,
                "ubep: rank " + std::to_string(rank_) + ": combine_recv: out has " + std::to_string(out.size()) +
                    " elements, expected n x hidden = " + std::to_string(static_cast<std::size_t>(h.n) * hidden));
  }
}

void LayerImpl::reduce_batches(const HandleState& h, std::span<const std::byte* const> batches,
                               std::span<float> out) const {
  check_out(h, out);
  reduce_outputs(map_, config_.topk, h.idx, h.weights, h.pos, batches, out_token_bytes_,
                 output_dtype(config_.dtype) == DType::f32, static_cast<std::size_t>(config_.hidden), out);
}

void LayerImpl::reduce(const HandleState& h, const std::byte* combine, std::span<float> out) const {
  if (config_.combine == Combine::per_expert) {
    return reduce_batches(h, batches_at(h.coffset, combine, out_token_bytes_), out);
  }
  check_out(h, out);
  const std::size_t hidden = static_cast<std::size_t>(config_.hidden);
  const bool f32 = output_dtype(config_.dtype) == DType::f32;
  // The per_rank/per_node order from per-expert rows: each owner's partial row as the owner would compute it,
  // then the node sums (moe.hpp, "Combine modes").
  const int k = config_.topk, L = map_.max_local();
  const bool r_f32 = partial_f32();
  const std::size_t rb = hidden * (r_f32 ? 4 : 2);
  std::vector<std::byte> partials(static_cast<std::size_t>(k) * rb);
  std::vector<int> owners;
  std::vector<float> w;
  std::vector<const std::byte*> y, rows;
  std::vector<NodeTerm> terms;
  for (int t = 0; t < h.n; ++t) {
    owners.clear();
    for (int a = 0; a < k; ++a) owners.push_back(map_.owner(h.idx[static_cast<std::size_t>(t) * k + a]));
    std::sort(owners.begin(), owners.end(),
              [&](int x, int z) { return std::pair(node_[x], x) < std::pair(node_[z], z); });
    owners.erase(std::unique(owners.begin(), owners.end()), owners.end());
    rows.clear();
    for (std::size_t i = 0; i < owners.size(); ++i) {
      w.clear();
      y.clear();
      for (int a = 0; a < k; ++a) {
        const std::size_t ta = static_cast<std::size_t>(t) * k + a;
        const int e = h.idx[ta], d = map_.owner(e), le = e - map_.first(d);
        if (d != owners[i]) continue;
        w.push_back(h.weights[ta]);
        y.push_back(combine + (h.coffset[static_cast<std::size_t>(d) * L + le] + h.pos[ta]) * out_token_bytes_);
      }
      partial_row(w, y, f32, hidden, r_f32, partials.data() + i * rb);
      rows.push_back(partials.data() + i * rb);
    }
    terms.clear();
    for (std::size_t i = 0; i < owners.size();) {
      std::size_t j = i;
      while (j < owners.size() && node_[owners[j]] == node_[owners[i]]) ++j;
      terms.push_back(
          {nullptr, std::span<const std::byte* const>(rows.data() + i, j - i), node_[owners[i]] != node_[rank_]});
      i = j;
    }
    reduce_token(terms, r_f32, hidden, out.data() + static_cast<std::size_t>(t) * hidden);
  }
}

int LayerImpl::check_combine_send(const Handle& h, int local, std::span<const std::byte> outputs) const {
  check_expert(h, local, "combine_send");
  const std::string pre =
      "ubep: rank " + std::to_string(rank_) + ": combine_send: call " + std::to_string(h.state_->call) + ": ";
  if (h.state_->combined[local]) {
    throw Error(Errc::invalid_argument, pre + "local expert " + std::to_string(local) + " was already sent");
  }
  ExpertTokens t;
  const std::size_t payload = static_cast<std::size_t>(config_.hidden) * element_size(config_.dtype);
  t.count = static_cast<int>(payload ? h.state_->expert_data[local].size() / payload : 0);
  if (outputs.size() != static_cast<std::size_t>(t.count) * out_token_bytes_) {
    throw Error(Errc::invalid_argument, pre + "local expert " + std::to_string(local) + ": outputs has " +
                                            std::to_string(outputs.size()) + " bytes, expected count x hidden x " +
                                            std::to_string(element_size(output_dtype(config_.dtype))) + " = " +
                                            std::to_string(static_cast<std::size_t>(t.count) * out_token_bytes_));
  }
  return t.count;
}

void LayerImpl::reuse(std::vector<std::byte>& v, std::size_t bytes) {
  if (v.capacity() < bytes) {
    // The pooled buffer that fits best: one that had to grow would be fresh memory, and the first write to it
    // page-faults (a buffer per expert and call: across 2 emulated nodes the layer took 0.76 - 1.3 of BSP with
    // the last pooled buffer taken whatever its size, 0.42 - 0.60 with the best fit).
    std::size_t best = pool_.size();
    for (std::size_t i = 0; i < pool_.size(); ++i) {
      if (pool_[i].capacity() >= bytes && (best == pool_.size() || pool_[i].capacity() < pool_[best].capacity())) {
        best = i;
      }
    }
    if (best < pool_.size()) {
      v.swap(pool_[best]);
      std::swap(pool_[best], pool_.back());
      pool_.pop_back();
    }
  }
  v.resize(bytes);
}

void LayerImpl::finish(HandleState& h) {
  for (auto& d : h.expert_data) {
    if (d.capacity()) pool_.push_back(std::move(d));
  }
  for (auto& d : h.own_outputs) {
    if (d.capacity()) pool_.push_back(std::move(d));
  }
  h.finished = true;
  ++finished_;
}

void LayerImpl::combine_send(Handle& h, int local, std::span<const std::byte> outputs) {
  send_outputs(h, local, to_host(outputs, stage_outputs_));
}

std::span<std::byte> LayerImpl::heap_outputs(HandleState&, int, std::size_t) { return {}; }

std::span<std::byte> LayerImpl::expert_outputs(Handle& h, int local) {
  check_expert(h, local, "expert_outputs");
  HandleState& s = *h.state_;
  const std::string pre = "ubep: rank " + std::to_string(rank_) + ": expert_outputs: call " + std::to_string(s.call) +
                          ": local expert " + std::to_string(local);
  const std::string which = " (expert " + std::to_string(map_.first(rank_) + local) + ")";
  if (s.combined[local]) {
    throw Error(Errc::invalid_argument, pre + which +
                                            " was already combine_sent: its rows are the sources' until "
                                            "combine_recv, a second write would race their reads");
  }
  if (config_.memory == Memory::device) {
    throw Error(Errc::unsupported, pre + which +
                                       ": expert_outputs is host memory only, Config::memory is device "
                                       "(pass the outputs to combine_send(h, e, outputs))");
  }
  if (!s.out_taken[local]) {
    const std::size_t payload = static_cast<std::size_t>(config_.hidden) * element_size(config_.dtype);
    const std::size_t count = payload ? s.expert_data[local].size() / payload : 0;
    const std::size_t bytes = count * out_token_bytes_;
    std::span<std::byte> rows = heap_outputs(s, local, bytes);
    if (rows.empty() && bytes) {
      std::vector<std::byte>& own = s.own_outputs[local];
      reuse(own, bytes);
      rows = own;
    }
    s.out_rows[local] = rows.first(bytes);
    s.out_taken[local] = 1;
  }
  return s.out_rows[local];
}

void LayerImpl::combine_send(Handle& h, int local) {
  check_handle(h, "combine_send");
  const HandleState& s = *h.state_;
  if (local >= 0 && local < local_experts() && s.ready[local] && !s.combined[local] && !s.out_taken[local]) {
    throw Error(Errc::invalid_argument, "ubep: rank " + std::to_string(rank_) + ": combine_send: call " +
                                            std::to_string(s.call) + ": local expert " + std::to_string(local) +
                                            " has no outputs: expert_outputs(h, " + std::to_string(local) +
                                            ") was not taken (write the outputs there, or pass them)");
  }
  // Out of range, incomplete or already sent: combine_send(h, local, outputs) names it.
  const bool taken = local >= 0 && local < local_experts() && s.out_taken[local];
  send_outputs(h, local, taken ? std::span<const std::byte>(s.out_rows[local]) : std::span<const std::byte>{});
}

void LayerImpl::combine_recv(Handle& h, std::span<float> out) {
  if (config_.memory == Memory::host) return recv_outputs(h, out);
  stage_out_.resize(out.size());
  recv_outputs(h, stage_out_);
  ctx_.copy(out.data(), stage_out_.data(), out.size_bytes());
}

void LayerImpl::combine(Handle& h, std::span<const std::span<const std::byte>> outputs, std::span<float> out) {
  check_handle(h, "combine");
  check_oldest(h, "combine");
  if (static_cast<int>(outputs.size()) != local_experts()) {
    throw Error(Errc::invalid_argument, "ubep: rank " + std::to_string(rank_) +
                                            ": combine: " + std::to_string(outputs.size()) + " output arrays for " +
                                            std::to_string(local_experts()) + " local experts");
  }
  for (int le = 0; le < local_experts(); ++le) {
    if (!h.state_->combined[le]) combine_send(h, le, outputs[le]);
  }
  combine_recv(h, out);
}

}  // namespace ubep::moe
