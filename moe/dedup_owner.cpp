// ubep's per_rank and per_node dispatch/combine, the owner side: it receives its chunks, regroups the tokens
// by local expert, releases the chunks and sends each source (or relay) its partial rows (moe/dedup.hpp).
#include <algorithm>
#include <cstring>
#include <string>

#include "moe/dedup.hpp"
#include "moe/kernels.hpp"
#include "moe/wire.hpp"

namespace ubep::moe {

std::optional<int> OneSidedImpl::Dedup::next_expert(HandleState& state) {
  const int num_local = layer.local_experts();
  if (state.num_returned == num_local) return std::nullopt;
  if (!state.dd_received) receive(state);
  for (int local = 0; local < num_local; ++local) {
    if (state.ready[local] && !state.returned[local]) {
      state.returned[local] = 1;
      ++state.num_returned;
      return local;
    }
  }
  // Regroup the next expert and hand it out at once (the copy of the next overlaps the caller's work).
  for (int local = 0; local < num_local; ++local) {
    if (state.ready[local]) continue;
    regroup(state, local);
    if (state.num_ready == num_local) release(state);
    state.returned[local] = 1;
    ++state.num_returned;
    return local;
  }
  return std::nullopt;
}

void OneSidedImpl::Dedup::receive(HandleState& state) {
  const std::size_t ranks = shape.ranks, set = static_cast<std::size_t>(state.set);
  const std::string what = "moe dispatch of call " + std::to_string(state.call);
  serve(
      [&] {
        bool all = true;
        for (std::size_t source = 0; source < ranks; ++source) {
          all = ready(shape.chunk_signals + set * ranks + source, dedup::tag(state.call)) && all;
        }
        return all;
      },
      what.c_str());
  const int num_local = layer.local_experts();
  state.dd_source_records.assign(ranks, 0);
  state.dd_reply.assign(3 * ranks, 0);
  state.dd_source_first_record.assign(ranks + 1, 0);
  state.dd_record_first_entry.assign(1, 0);
  state.dd_entry_expert.clear();
  state.dd_entry_row.clear();
  state.dd_entry_weight.clear();
  state.dd_expert_tokens.assign(num_local, {});
  state.dd_expert_entries.assign(num_local, {});
  state.dd_entry_record.clear();
  state.dd_record_source.clear();
  state.dd_record_pending.clear();
  std::vector<int> next_row(num_local, 0);
  for (std::size_t source = 0; source < ranks; ++source) {
    const std::byte* region = chunk_buf.data() + (set * ranks + source) * shape.chunk_bytes;
    const auto* header = reinterpret_cast<const std::uint64_t*>(region);
    // Records that carry rows instead of tokens (mapped here, one range check): those of a source that
    // gathers (rows of its staged tokens), and those its relay forwards over load/store (rows of the inbox).
    const int from = static_cast<int>(source);
    const int writer = writes_direct(from, rank) ? from : shape.relay_of(from, shape.node_of[rank]);
    const std::byte* staged = nullptr;
    std::size_t stride = 0;
    if (owner_gathers(from, rank)) {
      stride = shape.staged_stride;
      staged = ctx.ptr(token_buf.data() + set * shape.max_tokens * shape.staged_stride,
                       shape.max_tokens * shape.staged_stride, from);
    } else if (writer != from && !dedup::packed(ctx.route(writer))) {
      stride = shape.inbox_record;
      const std::byte* inbox =
          inbox_buf.data() +
          (set * shape.inbox_slots + shape.inbox_slot(from, shape.node_of[rank])) * shape.inbox_bytes;
      if (const std::byte* mapped = ctx.ptr(inbox, shape.inbox_bytes, writer)) staged = mapped + dedup::kHeader;
    }
    if (stride && !staged) {
      internal("the tokens of rank " + std::to_string(source) + " are not mapped from rank " + std::to_string(writer) +
               " on a load/store route");
    }
    state.dd_source_records[source] = header[0];
    state.dd_reply[3 * source] = header[1];
    state.dd_reply[3 * source + 1] = header[2];
    state.dd_reply[3 * source + 2] = header[3];
    protocol(wire::check_chunk_header(header, shape.max_tokens, ranks, shape.signal_count,
                                      shape.row_buf_rows() * shape.row_bytes, shape.row_bytes),
             "the chunk", from, state.call);
    for (std::size_t j = 0; j < header[0]; ++j) {
      const std::byte* record = region + dedup::kHeader + j * shape.owner_record;
      std::uint32_t count;
      std::memcpy(&count, record + shape.token_slot, 4);
      const auto* entries = reinterpret_cast<const DdEntry*>(record + dedup::entries_at(shape.token_slot));
      protocol(wire::check_record_count(count, std::min(shape.topk, shape.max_local)), "a record", from, state.call);
      protocol(wire::check_record_entries(entries, count, rank, num_local), "a record", from, state.call);
      const std::byte* token = record;
      if (staged) {
        std::uint32_t row;
        std::memcpy(&row, record, 4);
        protocol(wire::check_gathered_rows(&row, 1, shape.max_tokens), "a record", from, state.call);
        token = staged + static_cast<std::size_t>(row) * stride;
      }
      for (std::uint32_t i = 0; i < count; ++i) {
        const DdEntry& entry = entries[i];
        state.dd_expert_entries[entry.le].push_back(static_cast<int>(state.dd_entry_expert.size()));
        state.dd_entry_record.push_back(static_cast<int>(state.dd_record_source.size()));
        state.dd_entry_expert.push_back(entry.le);
        state.dd_entry_weight.push_back(entry.w);
        state.dd_entry_row.push_back(next_row[entry.le]++);
        state.dd_expert_tokens[entry.le].push_back(token);
        ++state.recv_counts[static_cast<std::size_t>(entry.le) * ranks + source];
      }
      state.dd_record_first_entry.push_back(state.dd_entry_expert.size());
      state.dd_record_source.push_back(from);
      state.dd_record_pending.push_back(static_cast<int>(count));
    }
    state.dd_source_first_record[source + 1] = state.dd_source_first_record[source] + header[0];
  }
  state.dd_received = true;
  state.dd_kept_outputs.resize(num_local);
}

void OneSidedImpl::Dedup::regroup(HandleState& state, int local) {
  const std::size_t payload = static_cast<std::size_t>(layer.config_.hidden) * element_size(layer.config_.dtype);
  const auto& records = state.dd_expert_tokens[local];
  std::vector<std::byte>& data = state.expert_data[local];
  layer.reuse(data, records.size() * payload);
  std::vector<float>& scales = state.expert_scales[local];
  const bool scaled = layer.config_.dtype == DType::e4m3;
  scales.resize(scaled ? records.size() : 0);
  for (std::size_t i = 0; i < records.size(); ++i) {
    std::memcpy(data.data() + i * payload, records[i], payload);
    if (scaled) std::memcpy(&scales[i], records[i] + payload, 4);
  }
  state.ready[local] = 1;
  ++state.num_ready;
}

void OneSidedImpl::Dedup::release(HandleState& state) {
  if (state.released) return;
  state.released = true;
  set_received[state.set] = 1;
  const std::uint64_t was = released_calls;
  while (released_calls < layer.calls_ && set_received[released_calls % shape.sets]) {
    set_received[released_calls++ % shape.sets] = 0;
  }
  if (released_calls == was) return;
  for (int writer : chunk_writers) {
    dedup::notify(ctx, &signal_buf[shape.release_signals + rank], released_calls, writer);
  }
  ctx.progress();
}

void OneSidedImpl::Dedup::dispatch_recv(HandleState& state) {
  std::vector<std::uint8_t> returned = state.returned;
  const int was = state.num_returned;
  for (int local = 0; local < layer.local_experts(); ++local) {
    if (!state.dd_received) receive(state);
    if (!state.ready[local]) regroup(state, local);
  }
  if (state.num_ready == layer.local_experts() && layer.local_experts() > 0) release(state);
  state.returned = std::move(returned);
  state.num_returned = was;
}

void OneSidedImpl::Dedup::combine_send(HandleState& state, int local, std::span<const std::byte> outputs) {
  const std::size_t out_bytes = layer.out_token_bytes_, set = static_cast<std::size_t>(state.set);
  const bool outputs_f32 = output_dtype(layer.config_.dtype) == DType::f32;
  if (state.num_combined == 0) {
    // Staging for the partial rows to network-route reply ranks (the rows are computed into it).
    state.dd_reply_stage.assign(shape.ranks, nullptr);
    for (std::size_t source = 0; source < shape.ranks; ++source) {
      const int to = static_cast<int>(state.dd_reply[3 * source]);
      if (state.dd_source_records[source] && dedup::packed(ctx.route(to))) {
        state.dd_reply_stage[source] =
            stage(stage_key(Staged::partial_rows, set, source), state.dd_source_records[source] * shape.row_bytes, to);
      }
    }
  }
  // The outputs are this expert's expert_outputs rows: they stay until combine_recv, so the rows of records
  // still waiting for another expert are read there later instead of copied.
  const bool in_place = state.out_taken[local] && outputs.data() == state.out_rows[local].data();
  state.out_in_place[local] = in_place ? 1 : 0;
  const std::vector<int>& entries_of = state.dd_expert_entries[local];
  std::vector<std::byte>* copy = nullptr;
  std::vector<float> weights;
  std::vector<const std::byte*> expert_rows;
  for (std::size_t j = 0; j < entries_of.size(); ++j) {
    const int record = state.dd_entry_record[entries_of[j]];
    const std::byte* mine = outputs.data() + j * out_bytes;
    if (--state.dd_record_pending[record] > 0) {
      if (in_place) continue;
      if (!copy) {
        copy = &state.dd_kept_outputs[local];
        layer.reuse(*copy, outputs.size());
      }
      std::memcpy(copy->data() + j * out_bytes, mine, out_bytes);
      continue;
    }
    weights.clear();
    expert_rows.clear();
    for (std::size_t i = state.dd_record_first_entry[record];
         i < state.dd_record_first_entry[static_cast<std::size_t>(record) + 1]; ++i) {
      weights.push_back(state.dd_entry_weight[i]);
      const int expert = state.dd_entry_expert[i];
      const std::byte* kept =
          state.out_in_place[expert] ? state.out_rows[expert].data() : state.dd_kept_outputs[expert].data();
      expert_rows.push_back(expert == local ? mine
                                            : kept + static_cast<std::size_t>(state.dd_entry_row[i]) * out_bytes);
    }
    const int source = state.dd_record_source[record];
    const std::size_t at = (static_cast<std::size_t>(record) - state.dd_source_first_record[source]) * shape.row_bytes;
    if (std::byte* staged = state.dd_reply_stage[source]) {
      partial_row(weights, expert_rows, outputs_f32, hidden, float_rows, staged + at);
    } else {  // a load/store route: the row is computed straight into the source's buffer
      partial_row(weights, expert_rows, outputs_f32, hidden, float_rows,
                  ctx.ptr(row_buf.data() + state.dd_reply[3 * source + 1] + at, shape.row_bytes,
                          static_cast<int>(state.dd_reply[3 * source])));
    }
  }
  state.combined[local] = 1;
  if (++state.num_combined < layer.local_experts()) return;
  // The last local expert: every partial row is computed; one message or signal per reply.
  for (int source : schedule) {
    const std::size_t records = state.dd_source_records[source];
    if (records == 0) continue;
    const int to = static_cast<int>(state.dd_reply[3 * source]);
    std::uint64_t* signal = &signal_buf[state.dd_reply[3 * source + 2]];
    if (std::byte* staged = state.dd_reply_stage[source]) {
      ctx.put_signal_nbi(row_buf.data() + state.dd_reply[3 * source + 1], staged, records * shape.row_bytes, signal,
                         dedup::tag(state.call) | 1, SignalOp::set, to);
    } else {
      dedup::notify(ctx, signal, dedup::tag(state.call) | 1, to);
    }
    count_sent(false, to, records * shape.row_bytes);
  }
  ctx.progress();
}

}  // namespace ubep::moe
