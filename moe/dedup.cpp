// ubep's per_rank and per_node dispatch/combine: the buffers, the waits, the source and the owner sides
// (moe/dedup.hpp has the buffer table; the relay is in dedup_relay.cpp).
#include "moe/dedup.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>

#include "moe/kernels.hpp"
#include "moe/wire.hpp"

namespace ubep::moe {
namespace dedup {
namespace {
constexpr std::size_t up64(std::size_t b) { return (b + 63) / 64 * 64; }
constexpr std::size_t up16(std::size_t b) { return (b + 15) / 16 * 16; }

std::vector<int> nodes_of(const Topology& topology) {
  std::vector<int> v(topology.size());
  for (int p = 0; p < topology.size(); ++p) v[p] = topology.node_of(p);
  return v;
}
}  // namespace

Shape::Shape(const Config& config, const std::vector<int>& nodes, unsigned run_ahead) {
  ranks = nodes.size();
  sets = run_ahead;
  max_tokens = static_cast<std::size_t>(config.max_tokens_per_rank);
  const ExpertMap map{config.num_experts, static_cast<int>(ranks)};
  max_local = static_cast<std::size_t>(map.max_local());
  topk = static_cast<std::size_t>(config.topk);
  node_of = nodes;
  int num_nodes = 0;
  for (int n : node_of) num_nodes = std::max(num_nodes, n + 1);
  node_ranks.assign(num_nodes, {});
  index_in_node.assign(ranks, 0);
  for (std::size_t p = 0; p < ranks; ++p) {
    index_in_node[p] = static_cast<int>(node_ranks[node_of[p]].size());
    node_ranks[node_of[p]].push_back(static_cast<int>(p));
  }
  node_has_experts.assign(num_nodes, 0);
  for (std::size_t p = 0; p < ranks; ++p) node_has_experts[node_of[p]] |= map.count(static_cast<int>(p)) > 0 ? 1 : 0;
  for (const auto& r : node_ranks) node_size = std::max(node_size, r.size());
  relays = config.combine == Combine::per_node && num_nodes > 1;
  relayed.assign(ranks, {});
  if (relays) {
    for (std::size_t source = 0; source < ranks; ++source) {
      for (int node = 0; node < num_nodes; ++node) {
        if (node != node_of[source] && node_has_experts[node]) {
          relayed[relay_of(static_cast<int>(source), node)].push_back(static_cast<int>(source));
        }
      }
    }
    for (const auto& v : relayed) inbox_slots = std::max(inbox_slots, v.size());
  }
  token_bytes =
      static_cast<std::size_t>(config.hidden) * element_size(config.dtype) + (config.dtype == DType::e4m3 ? 4 : 0);
  token_slot = std::max<std::size_t>(token_bytes, 4);
  staged_stride = token_stride(config);
  owner_record = up16(entries_at(token_slot) + sizeof(DdEntry) * std::min(topk, max_local));
  inbox_record = up16(entries_at(token_slot) + sizeof(DdEntry) * std::min(topk, max_local * node_size));
  chunk_bytes = kHeader + max_tokens * owner_record;
  inbox_bytes = inbox_slots ? kHeader + max_tokens * inbox_record : 0;
  const bool float_rows = config.float_partials || output_dtype(config.dtype) == DType::f32;
  row_bytes = static_cast<std::size_t>(config.hidden) * (float_rows ? 4 : 2);
  source_rows = max_tokens * std::min(topk, ranks);
  relay_rows = max_tokens * std::min(topk, node_size);
  chunk_signals = 0;
  inbox_signals = chunk_signals + sets * ranks;
  row_signals = inbox_signals + sets * inbox_slots;
  partial_signals = row_signals + sets * ranks;
  release_signals = partial_signals + sets * inbox_slots * node_size;
  signal_count = release_signals + ranks;
}

int Shape::relay_of(int source, int node) const {
  return node_ranks[node][index_in_node[source] % node_ranks[node].size()];
}

std::size_t Shape::inbox_slot(int source, int node) const {
  const auto& v = relayed[relay_of(source, node)];
  return static_cast<std::size_t>(std::find(v.begin(), v.end(), source) - v.begin());
}

std::size_t Shape::heap() const {
  return up64(chunk_buf_bytes()) + up64(std::max<std::size_t>(token_buf_bytes(), 1)) + up64(inbox_buf_bytes()) +
         up64(row_buf_rows() * row_bytes) + up64(signal_count * 8) + 4096;
}

void notify(Context& ctx, std::uint64_t* signal, std::uint64_t value, int pe) {
  if (ctx.atomics_through_mpi()) {
    ctx.signal_op(signal, value, SignalOp::set, pe);
  } else {
    ctx.put_signal(nullptr, nullptr, 0, signal, value, SignalOp::set, pe);
  }
}

}  // namespace dedup

std::size_t dedup_heap_bytes(const Config& config, const std::vector<int>& node_of, unsigned run_ahead) {
  return dedup::Shape(config, node_of, run_ahead).heap();
}
std::size_t dedup_heap_bytes(const Config& config, const Topology& topology, unsigned run_ahead) {
  return dedup_heap_bytes(config, dedup::nodes_of(topology), run_ahead);
}

OneSidedImpl::Dedup::Dedup(OneSidedImpl& parent, Context& context)
    : layer(parent), ctx(context), shape(parent.config_, parent.node_, context.options().run_ahead) {
  rank = layer.rank_;
  const bool threaded = ctx.options().moe_relay_thread && shape.relays;
  if (threaded) {  // before the first collective call: every rank refuses alike (the settings and levels agree)
    if (std::string why = relay_thread_refused(); !why.empty()) {
      throw Error(Errc::unsupported,
                  "ubep: rank " + std::to_string(rank) + ": moe::Layer: UBEP_MOE_RELAY_THREAD=1 " + why);
    }
  }
  float_rows = layer.partial_f32();
  const std::size_t need = shape.heap();
  layer.check_heap(need);
  chunk_buf = ctx.alloc<std::byte>(shape.chunk_buf_bytes());
  token_buf = ctx.alloc<std::byte>(std::max<std::size_t>(shape.token_buf_bytes(), 1));
  inbox_buf = ctx.alloc<std::byte>(std::max<std::size_t>(shape.inbox_buf_bytes(), 1));
  row_buf = ctx.alloc<std::byte>(shape.row_buf_rows() * shape.row_bytes);
  signal_buf = ctx.alloc_signals(shape.signal_count);
  awaited.assign(shape.signal_count, kSignalIgnored);
  seen.assign(shape.signal_count, 0);
  writer_of.assign(shape.signal_count, -1);
  const int ranks = static_cast<int>(shape.ranks);
  const int my_node = shape.node_of[rank];
  for (std::size_t set = 0; set < shape.sets; ++set) {
    for (int source = 0; source < ranks; ++source) {
      writer_of[shape.chunk_signals + set * shape.ranks + source] =
          writes_direct(source, rank) ? source : shape.relay_of(source, my_node);
      writer_of[shape.row_signals + set * shape.ranks + source] = source;
    }
    for (std::size_t slot = 0; slot < shape.relayed[rank].size(); ++slot) {
      writer_of[shape.inbox_signals + set * shape.inbox_slots + slot] = shape.relayed[rank][slot];
      for (std::size_t i = 0; i < shape.node_ranks[my_node].size(); ++i) {
        writer_of[shape.partial_signals + (set * shape.inbox_slots + slot) * shape.node_size + i] =
            shape.node_ranks[my_node][i];
      }
    }
  }
  for (int p = 0; p < ranks; ++p) writer_of[shape.release_signals + p] = p;
  schedule = ubep::schedule(ctx.topology(), rank, ctx.options().schedule);
  reduction_order.resize(ranks);
  std::iota(reduction_order.begin(), reduction_order.end(), 0);
  std::stable_sort(reduction_order.begin(), reduction_order.end(),
                   [&](int a, int b) { return shape.node_of[a] < shape.node_of[b]; });
  for (int p = 0; p < ranks; ++p) {
    if (writes_direct(p, rank)) chunk_writers.push_back(p);
    ucx = ucx || ctx.route(p) == Route::ucx;
  }
  for (int p : shape.node_ranks[my_node]) {
    if (layer.map_.count(p) > 0) local_owners.push_back(p);
  }
  set_received.assign(shape.sets, 0);
  relay_slots.resize(shape.sets * shape.inbox_slots);
  for (std::size_t set = 0; set < shape.sets; ++set) {
    for (std::size_t slot = 0; slot < shape.inbox_slots; ++slot) relay_slots[set * shape.inbox_slots + slot].call = set;
  }
  inbox_released.assign(shape.inbox_slots, 0);
  inbox_done.assign(shape.sets * shape.inbox_slots, 0);
  hidden = static_cast<std::size_t>(layer.config_.hidden);
  if (threaded && my_inbox_slots() > 0) relay_thread = std::thread([this] { relay_loop(); });
}

OneSidedImpl::Dedup::~Dedup() {
  relay_stop = true;
  if (relay_thread.joinable()) relay_thread.join();
}

std::string OneSidedImpl::Dedup::relay_thread_refused() const {
  if (UBEP_SIMGRID) return "is not for SimGrid builds (SMPI's ranks are threads it schedules itself)";
  if (layer.config_.memory == Memory::device) return "takes host memory only (Config::memory is device)";
  if (ctx.thread_level() < MPI_THREAD_MULTIPLE) {
    return "needs MPI_THREAD_MULTIPLE (the thread sends while the application may sit in MPI); MPI provides " +
           std::to_string(ctx.thread_level());
  }
  for (int p = 0; p < static_cast<int>(shape.ranks); ++p) {
    if (ctx.route(p) == Route::ucx && ctx.options().progress_thread == ProgressThread::off) {
      return "needs UCX's worker in its threaded mode: UBEP_PROGRESS_THREAD=auto or 1, not 0 (rank " +
             std::to_string(p) + " is on the ucx route)";
    }
  }
  return {};
}

std::unique_lock<std::mutex> OneSidedImpl::Dedup::enter() {
  if (!relay_thread.joinable()) return {};
  std::unique_lock<std::mutex> lock(mu);
  for (const Count& c : thread_counts) layer.count(c.dispatch, c.pe, c.bytes);
  thread_counts.clear();
  if (thread_error) std::rethrow_exception(std::exchange(thread_error, nullptr));
  return lock;
}

void OneSidedImpl::Dedup::count_sent(bool dispatch, int pe, std::size_t bytes) {
  if (relay_thread.joinable() && std::this_thread::get_id() == relay_thread.get_id()) {
    thread_counts.push_back({dispatch, pe, bytes});
  } else {
    layer.count(dispatch, pe, bytes);
  }
}

void OneSidedImpl::Dedup::relay_loop() {
  // It looks after kMinUs, doubling up to kMaxUs while nothing moved (or a layer call held the lock, or no call
  // was in flight), back to kMinUs once something did: an idle layer costs a wake-up per millisecond.
  constexpr long kMinUs = 20, kMaxUs = 1000;
  long nap_us = kMinUs;
  while (!relay_stop.load(std::memory_order_relaxed)) {
    std::this_thread::sleep_for(std::chrono::microseconds(nap_us));
    bool moved = false;
    std::unique_lock<std::mutex> lock(mu, std::try_to_lock);
    if (lock.owns_lock() && in_flight > 0 && !thread_error) {
      try {
        moved = progress();
      } catch (...) {
        thread_error = std::current_exception();
      }
    }
    nap_us = moved ? kMinUs : std::min(nap_us * 2, kMaxUs);
  }
}

bool OneSidedImpl::Dedup::owner_gathers(int source, int owner) const {
  return writes_direct(source, owner) && layer.map_.count(owner) > 0 &&
         !dedup::packed(ctx.route(source == rank ? owner : source));
}

bool OneSidedImpl::Dedup::ready(std::size_t signal, std::uint64_t value) {
  if (seen[signal] >= value) return true;
  awaited[signal] = std::min(awaited[signal], value);
  return false;
}

void OneSidedImpl::Dedup::serve(const std::function<bool()>& pred, const char* what) {
  for (;;) {
    while (relay_work()) {
    }
    if (pred()) return;
    std::vector<std::size_t> arrived;
    try {
      arrived = ctx.wait_until_some({signal_buf.data(), shape.signal_count}, Cmp::ge, awaited,
                                    {.writers = writer_of, .what = what});
    } catch (const Error& e) {
      if (e.code() != Errc::timeout) throw;
      throw Error(Errc::timeout, std::string(e.what()) + "; meanwhile " + awaited_report());
    }
    for (std::size_t i : arrived) {
      seen[i] = awaited[i];
      awaited[i] = kSignalIgnored;
    }
  }
}

bool OneSidedImpl::Dedup::progress() {
  bool any = false;
  for (;;) {
    bool moved = relay_work();
    for (std::size_t i = 0; i < shape.signal_count; ++i) {
      if (awaited[i] == kSignalIgnored || !ctx.test(&signal_buf[i], Cmp::ge, awaited[i])) continue;
      seen[i] = awaited[i];
      awaited[i] = kSignalIgnored;
      moved = true;
    }
    if (!moved) break;
    any = true;
  }
  ctx.progress();
  return any;
}

std::string OneSidedImpl::Dedup::awaited_report() const {
  std::string out = "moe::Layer (" + std::string(to_string(layer.config_.combine)) + ") awaited:";
  std::size_t listed = 0, more = 0;
  const int my_node = shape.node_of[rank];
  for (std::size_t i = 0; i < shape.signal_count; ++i) {
    if (awaited[i] == kSignalIgnored) continue;
    if (listed == 12) {
      ++more;
      continue;
    }
    ++listed;
    std::string w;
    if (i < shape.inbox_signals) {
      const int source = static_cast<int>((i - shape.chunk_signals) % shape.ranks);
      w = "the tokens of rank " + std::to_string(source);
      if (writer_of[i] != source) w += " (through its relay, rank " + std::to_string(writer_of[i]) + ")";
    } else if (i < shape.row_signals) {
      w = "the tokens of rank " + std::to_string(writer_of[i]) + " to relay";
    } else if (i < shape.partial_signals) {
      w = "the outputs from rank " + std::to_string(writer_of[i]);
    } else if (i < shape.release_signals) {
      const std::size_t slot = ((i - shape.partial_signals) / shape.node_size) % shape.inbox_slots;
      w = "the outputs of rank " +
          std::to_string(shape.node_ranks[my_node][(i - shape.partial_signals) % shape.node_size]) +
          " for the tokens of rank " + std::to_string(shape.relayed[rank][slot]) + " (relayed)";
    } else {
      w = "the release of its buffers by rank " + std::to_string(writer_of[i]);
    }
    out += (listed > 1 ? "; " : " ") + w + " (call " + std::to_string((awaited[i] >> 32) - 1) + ")";
    if (i >= shape.release_signals) out.erase(out.rfind(" (call"));  // releases count calls, they carry no call tag
  }
  if (more) out += "; and " + std::to_string(more) + " more";
  return out;
}

std::byte* OneSidedImpl::Dedup::stage(std::uint64_t key, std::size_t bytes, int pe) {
  std::vector<std::byte>& v = stages[key];
  if (!v.empty() && ctx.route(pe) == Route::ucx) ctx.flush_local(pe);
  if (v.size() < bytes) v.resize(bytes);
  return v.data();
}

OneSidedImpl::Dedup::RegionWriter::RegionWriter(Dedup& layer_dedup, int target, std::byte* region, std::uint64_t key,
                                                std::size_t bytes)
    : parent(layer_dedup), pe(target), remote(region), packed(dedup::packed(layer_dedup.ctx.route(target))) {
  if (packed) {
    dest = parent.stage(key, bytes, target);
  } else if (bytes) {
    dest = parent.ctx.ptr(region, bytes, target);
  }
}

void OneSidedImpl::Dedup::RegionWriter::write(std::size_t offset, const void* from, std::size_t n) {
  if (n == 0) return;
  std::memcpy(dest + offset, from, n);
  extent = std::max(extent, offset + n);
}

std::byte* OneSidedImpl::Dedup::RegionWriter::in_place(std::size_t offset, std::size_t n) {
  extent = std::max(extent, offset + n);
  return dest + offset;
}

void OneSidedImpl::Dedup::RegionWriter::finish(std::size_t signal, std::uint64_t value) {
  std::uint64_t* at = &parent.signal_buf[signal];
  if (packed) {
    parent.ctx.put_signal_nbi(remote, dest, extent, at, value, SignalOp::set, pe);
  } else {
    dedup::notify(parent.ctx, at, value, pe);
  }
}

void OneSidedImpl::Dedup::internal(const std::string& what) const {
  throw Error(Errc::internal, "ubep: rank " + std::to_string(rank) + ": moe::Layer (" +
                                  to_string(layer.config_.combine) + "): " + what);
}

void OneSidedImpl::Dedup::protocol(const std::string& why, const char* what, int from, std::uint64_t call) const {
  if (why.empty()) return;
  throw Error(Errc::protocol, "ubep: rank " + std::to_string(rank) + ": moe::Layer (" +
                                  to_string(layer.config_.combine) + "): " + what + " from rank " +
                                  std::to_string(from) + " in call " + std::to_string(call) +
                                  " breaks the protocol: " + why);
}

std::size_t OneSidedImpl::Dedup::buffer_bytes() const {
  std::unique_lock<std::mutex> lock;
  if (relay_thread.joinable()) lock = std::unique_lock<std::mutex>(mu);  // the thread may add staging copies
  std::size_t b = shape.heap();
  for (const auto& [key, v] : stages) b += v.size();
  return b;
}

// ---- source ---------------------------------------------------------------------------------------------

void OneSidedImpl::Dedup::send(HandleState& state, std::span<const std::byte> tokens, std::span<const float> scales) {
  const std::size_t ranks = shape.ranks, topk = shape.topk, num_tokens = static_cast<std::size_t>(state.n),
                    set = static_cast<std::size_t>(state.set);
  const std::size_t payload = static_cast<std::size_t>(layer.config_.hidden) * element_size(layer.config_.dtype);
  ++in_flight;
  state.dd_target_tokens.assign(ranks, {});
  state.dd_entry_start.assign(ranks, {});
  state.dd_target_entries.assign(ranks, {});
  state.dd_target_first_row.assign(ranks, 0);
  state.dd_token_row.assign(num_tokens * ranks, -1);
  for (std::size_t token = 0; token < num_tokens; ++token) {
    for (std::size_t i = 0; i < topk; ++i) {
      const int expert = state.idx[token * topk + i], owner = layer.map_.owner(expert);
      const int target = target_of(owner);
      if (state.dd_target_tokens[target].empty() || state.dd_target_tokens[target].back() != static_cast<int>(token)) {
        state.dd_target_tokens[target].push_back(static_cast<int>(token));
        state.dd_entry_start[target].push_back(static_cast<std::uint32_t>(state.dd_target_entries[target].size()));
      }
      state.dd_target_entries[target].push_back(
          {owner, expert - layer.map_.first(owner), state.weights[token * topk + i]});
    }
  }
  std::size_t rows = 0;
  for (std::size_t target = 0; target < ranks; ++target) {
    state.dd_target_first_row[target] = rows;
    for (std::size_t j = 0; j < state.dd_target_tokens[target].size(); ++j) {
      state.dd_token_row[static_cast<std::size_t>(state.dd_target_tokens[target][j]) * ranks + target] =
          static_cast<int>(rows + j);
    }
    rows += state.dd_target_tokens[target].size();
  }
  if (rows > shape.source_rows) {
    internal("call " + std::to_string(state.call) + " needs " + std::to_string(rows) + " rows");
  }
  const std::uint64_t call = state.call;
  const std::string what = "moe back-pressure (run-ahead), call " + std::to_string(call);
  // Owners that gather from our token_buf set: all of them must have released call - sets before it is restaged.
  bool staged = false;
  for (int target : schedule) {
    if (!owner_gathers(rank, target)) continue;
    if (call >= shape.sets) {
      serve([&] { return ready(shape.release_signals + target, call - shape.sets + 1); }, what.c_str());
    }
    staged = true;
  }
  if (staged) layer.stage_tokens(state, token_buf.data(), tokens, scales);
  for (int target : schedule) {
    const bool relay = !writes_direct(rank, target);
    if (relay
            ? !(shape.node_has_experts[shape.node_of[target]] && shape.relay_of(rank, shape.node_of[target]) == target)
            : layer.map_.count(target) == 0) {
      continue;
    }
    if (call >= shape.sets) {
      serve([&] { return ready(shape.release_signals + target, call - shape.sets + 1); }, what.c_str());
    }
    const auto& target_tokens = state.dd_target_tokens[target];
    const std::size_t record = relay ? shape.inbox_record : shape.owner_record;
    std::byte* region;
    std::size_t signal;
    // Where the rows come back: byte offset of the target's rows in our row_buf. An owner's header also
    // names the reply rank and signal (us, row signal [set][owner]); an inbox's has only the offset (the relay
    // replies to the inbox's source, on row signal [set][relay]).
    const std::uint64_t reply =
        (set * (shape.source_rows + shape.inbox_slots * shape.relay_rows) + state.dd_target_first_row[target]) *
        shape.row_bytes;
    std::uint64_t header[4] = {target_tokens.size(), static_cast<std::uint64_t>(rank), reply,
                               shape.row_signals + set * ranks + target};
    if (relay) {
      const std::size_t slot = shape.inbox_slot(rank, shape.node_of[target]);
      region = inbox_buf.data() + (set * shape.inbox_slots + slot) * shape.inbox_bytes;
      signal = shape.inbox_signals + set * shape.inbox_slots + slot;
      header[1] = reply;  // the inbox layout: count, reply offset
      header[2] = header[3] = 0;
    } else {
      region = chunk_buf.data() + (set * ranks + rank) * shape.chunk_bytes;
      signal = shape.chunk_signals + set * ranks + rank;
    }
    RegionWriter out(*this, target, region, stage_key(Staged::chunk, set, target),
                     dedup::kHeader + target_tokens.size() * record);
    out.write(0, header, sizeof header);
    const bool rows_only = owner_gathers(rank, target);  // target gathers from our token_buf: the rows suffice
    for (std::size_t j = 0; j < target_tokens.size(); ++j) {
      const std::size_t token = static_cast<std::size_t>(target_tokens[j]);
      const std::size_t at = dedup::kHeader + j * record;
      const std::uint32_t first = state.dd_entry_start[target][j];
      const std::uint32_t end = j + 1 < target_tokens.size()
                                    ? state.dd_entry_start[target][j + 1]
                                    : static_cast<std::uint32_t>(state.dd_target_entries[target].size());
      const std::uint32_t entries = end - first;
      if (rows_only) {
        const std::uint32_t row = static_cast<std::uint32_t>(token);
        out.write(at, &row, 4);
      } else {
        out.write(at, tokens.data() + token * payload, payload);
        if (!scales.empty()) out.write(at + payload, &scales[token], 4);
      }
      out.write(at + shape.token_slot, &entries, 4);
      out.write(at + dedup::entries_at(shape.token_slot), state.dd_target_entries[target].data() + first,
                entries * sizeof(DdEntry));
    }
    count_sent(true, target, target_tokens.size() * shape.token_bytes);
    out.finish(signal, dedup::tag(call) | target_tokens.size());
  }
  ctx.progress();
}

void OneSidedImpl::Dedup::combine_recv(HandleState& state, std::span<float> out) {
  const std::size_t ranks = shape.ranks, set = static_cast<std::size_t>(state.set);
  const std::string what = "moe combine of call " + std::to_string(state.call);
  serve(
      [&] {
        bool all = true;
        for (std::size_t target = 0; target < ranks; ++target) {
          if (!state.dd_target_tokens[target].empty()) {
            all = ready(shape.row_signals + set * ranks + target, dedup::tag(state.call)) && all;
          }
        }
        // Our relay work of this call is done too (its sources wait for it).
        for (std::size_t slot = 0; slot < my_inbox_slots(); ++slot) {
          all = all && relay_slots[set * shape.inbox_slots + slot].call > state.call;
        }
        return all;
      },
      what.c_str());
  if (out.size() != static_cast<std::size_t>(state.n) * hidden) {
    throw Error(Errc::invalid_argument,
                "ubep: rank " + std::to_string(rank) + ": combine_recv: out has " + std::to_string(out.size()) +
                    " elements, expected n x hidden = " + std::to_string(static_cast<std::size_t>(state.n) * hidden));
  }
  const std::byte* rows =
      row_buf.data() + set * (shape.source_rows + shape.inbox_slots * shape.relay_rows) * shape.row_bytes;
  std::vector<const std::byte*> owner_rows;
  std::vector<NodeTerm> terms;
  const int my_node = shape.node_of[rank];
  for (int token = 0; token < state.n; ++token) {
    owner_rows.clear();
    terms.clear();
    // Ranks in (node, rank) order; a relay's row is its node's row, owners' rows are partial rows.
    std::size_t first = 0;
    int node = -1;
    owner_rows.reserve(ranks);  // the terms' spans point into owner_rows: no reallocation
    const auto close_node = [&] {
      if (node >= 0 && owner_rows.size() > first) {
        terms.push_back({nullptr,
                         std::span<const std::byte* const>(owner_rows.data() + first, owner_rows.size() - first),
                         node != my_node});
      }
    };
    for (int target : reduction_order) {
      const int row = state.dd_token_row[static_cast<std::size_t>(token) * ranks + target];
      if (row < 0) continue;
      if (!writes_direct(rank, target)) {
        close_node();
        node = -1;
        first = owner_rows.size();
        terms.push_back({rows + static_cast<std::size_t>(row) * shape.row_bytes, {}, true});
        continue;
      }
      if (shape.node_of[target] != node) {
        close_node();
        node = shape.node_of[target];
        first = owner_rows.size();
      }
      owner_rows.push_back(rows + static_cast<std::size_t>(row) * shape.row_bytes);
    }
    close_node();
    reduce_token(terms, float_rows, hidden, out.data() + static_cast<std::size_t>(token) * hidden);
  }
  if (ucx) {
    for (int p = 0; p < static_cast<int>(ranks); ++p) {
      if (ctx.route(p) == Route::ucx) ctx.flush_local(p);
    }
  }
  for (auto& v : state.dd_kept_outputs) {
    if (v.capacity()) layer.pool_.push_back(std::move(v));
  }
  --in_flight;
}

}  // namespace ubep::moe
