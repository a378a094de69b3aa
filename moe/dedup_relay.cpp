// ubep's per_node dispatch/combine, the relay: it forwards each inbox to the owners of its node, sums their
// partial rows into node rows for the inbox's source and releases the inbox (moe/dedup.hpp).
#include <algorithm>
#include <cstring>
#include <vector>

#include "moe/dedup.hpp"
#include "moe/kernels.hpp"
#include "moe/wire.hpp"

namespace ubep::moe {

bool OneSidedImpl::Dedup::relay_work() {
  bool moved = false;
  for (std::size_t set = 0; set < shape.sets; ++set) {
    for (std::size_t slot = 0; slot < my_inbox_slots(); ++slot) moved = advance_slot(set, slot) || moved;
  }
  if (moved) ctx.progress();
  return moved;
}

template <class F>
void OneSidedImpl::Dedup::for_owners(const std::byte* record, F&& f) const {
  std::uint32_t count;
  std::memcpy(&count, record + shape.token_slot, 4);
  if (count > std::min(shape.topk, shape.max_local * shape.node_size)) {
    protocol(wire::check_record_count(count, std::min(shape.topk, shape.max_local * shape.node_size)),
             "an inbox record", -1, 0);
  }
  const auto* entries = reinterpret_cast<const DdEntry*>(record + dedup::entries_at(shape.token_slot));
  for (std::size_t owner_index = 0; owner_index < local_owners.size(); ++owner_index) {
    for (std::uint32_t i = 0; i < count; ++i) {
      if (entries[i].owner == local_owners[owner_index]) {
        f(owner_index);
        break;
      }
    }
  }
}

bool OneSidedImpl::Dedup::advance_slot(std::size_t set, std::size_t slot) {
  RelaySlot& relay = relay_slots[set * shape.inbox_slots + slot];
  const int source = shape.relayed[rank][slot];
  const std::size_t num_owners = local_owners.size();
  std::byte* inbox = inbox_buf.data() + (set * shape.inbox_slots + slot) * shape.inbox_bytes;
  const std::uint64_t call = relay.call;
  bool moved = false;
  if (relay.phase == Phase::awaiting_inbox) {
    if (!ready(shape.inbox_signals + set * shape.inbox_slots + slot, dedup::tag(call))) return false;
    const auto* header = reinterpret_cast<const std::uint64_t*>(inbox);
    protocol(
        wire::check_inbox_header(header, shape.max_tokens, shape.row_buf_rows() * shape.row_bytes, shape.row_bytes),
        "the inbox", source, call);
    relay.records = header[0];
    relay.reply_offset = header[1];
    relay.forwarded.assign(num_owners, 0);
    relay.owner_records.assign(num_owners, 0);
    relay.owner_first_row.assign(num_owners, 0);
    relay.record_rows_end.assign(relay.records, 0);
    relay.record_rows.clear();
    // Count each owner's records, then number its rows: an owner's rows follow those of the owners before it.
    for (std::size_t j = 0; j < relay.records; ++j) {
      for_owners(inbox + dedup::kHeader + j * shape.inbox_record,
                 [&](std::size_t owner_index) { ++relay.owner_records[owner_index]; });
    }
    for (std::size_t o = 1; o < num_owners; ++o) {
      relay.owner_first_row[o] = relay.owner_first_row[o - 1] + relay.owner_records[o - 1];
    }
    std::vector<std::size_t> next_row(relay.owner_first_row);
    for (std::size_t j = 0; j < relay.records; ++j) {
      for_owners(inbox + dedup::kHeader + j * shape.inbox_record, [&](std::size_t owner_index) {
        relay.record_rows.push_back(static_cast<std::uint32_t>(next_row[owner_index]++));
      });
      relay.record_rows_end[j] = static_cast<std::uint32_t>(relay.record_rows.size());
    }
    relay.phase = Phase::forwarding;
    moved = true;
  }
  if (relay.phase == Phase::forwarding) {
    std::size_t done = 0;
    for (std::size_t owner_index = 0; owner_index < num_owners; ++owner_index) {
      if (!relay.forwarded[owner_index]) {
        const int owner = local_owners[owner_index];
        if (call >= shape.sets && !ready(shape.release_signals + owner, call - shape.sets + 1)) continue;
        forward(set, slot, source, owner_index, relay, inbox);
        relay.forwarded[owner_index] = 1;
        moved = true;
      }
      ++done;
    }
    if (done < num_owners) return moved;
    relay.phase = Phase::awaiting_partial_rows;
    moved = true;
  }
  if (relay.phase == Phase::awaiting_partial_rows) {
    bool all = true;
    for (std::size_t owner_index = 0; owner_index < num_owners; ++owner_index) {
      const std::size_t signal = shape.partial_signals + (set * shape.inbox_slots + slot) * shape.node_size +
                                 shape.index_in_node[local_owners[owner_index]];
      if (relay.owner_records[owner_index] && !ready(signal, dedup::tag(call))) all = false;
    }
    if (!all) return moved;
    // Every owner that got records has sent its partial rows, so it is done with the inbox (owners on
    // load/store gather from it): release the inbox to its source, in call order (a call done before an
    // older one waits for it; the flag of set released % sets is that call's: its inbox came after the
    // release of the call `sets` before it). By moe.hpp's run-ahead the source waits for this release only
    // after its combine_recv of this call, which needs the node rows below anyway.
    inbox_done[set * shape.inbox_slots + slot] = 1;
    const std::uint64_t was = inbox_released[slot];
    while (inbox_done[(inbox_released[slot] % shape.sets) * shape.inbox_slots + slot]) {
      inbox_done[(inbox_released[slot]++ % shape.sets) * shape.inbox_slots + slot] = 0;
    }
    if (inbox_released[slot] != was) {
      dedup::notify(ctx, &signal_buf[shape.release_signals + rank], inbox_released[slot], source);
    }
    if (relay.records) send_node_rows(set, slot, source, relay);
    relay.call += shape.sets;
    relay.phase = Phase::awaiting_inbox;
    return true;
  }
  return moved;
}

void OneSidedImpl::Dedup::forward(std::size_t set, std::size_t slot, int source, std::size_t owner_index,
                                  const RelaySlot& relay, const std::byte* inbox) {
  const int owner = local_owners[owner_index];
  const std::size_t records = relay.owner_records[owner_index];
  std::byte* region = chunk_buf.data() + (set * shape.ranks + source) * shape.chunk_bytes;
  RegionWriter out(*this, owner, region, stage_key(Staged::forwarded_chunk, set, slot * shape.node_size + owner_index),
                   dedup::kHeader + records * shape.owner_record);
  const std::uint64_t header[4] = {
      records, static_cast<std::uint64_t>(rank),
      (set * (shape.source_rows + shape.inbox_slots * shape.relay_rows) + shape.source_rows + slot * shape.relay_rows +
       relay.owner_first_row[owner_index]) *
          shape.row_bytes,
      shape.partial_signals + (set * shape.inbox_slots + slot) * shape.node_size + shape.index_in_node[owner]};
  out.write(0, header, sizeof header);
  const bool rows_only = !dedup::packed(ctx.route(owner));
  std::size_t written = 0;
  std::vector<DdEntry> owner_entries;
  for (std::size_t j = 0; j < relay.records; ++j) {
    const std::byte* record = inbox + dedup::kHeader + j * shape.inbox_record;
    std::uint32_t count;
    std::memcpy(&count, record + shape.token_slot, 4);
    const auto* entries = reinterpret_cast<const DdEntry*>(record + dedup::entries_at(shape.token_slot));
    owner_entries.clear();
    for (std::uint32_t i = 0; i < count; ++i) {
      if (entries[i].owner == owner) owner_entries.push_back(entries[i]);
    }
    if (owner_entries.empty()) continue;
    const std::size_t at = dedup::kHeader + written * shape.owner_record;
    const std::uint32_t owner_count = static_cast<std::uint32_t>(owner_entries.size());
    if (rows_only) {  // the owner gathers the token from our inbox: its record's index there suffices
      const std::uint32_t row = static_cast<std::uint32_t>(j);
      out.write(at, &row, 4);
    } else {
      out.write(at, record, shape.token_bytes);
    }
    out.write(at + shape.token_slot, &owner_count, 4);
    out.write(at + dedup::entries_at(shape.token_slot), owner_entries.data(), owner_entries.size() * sizeof(DdEntry));
    count_sent(true, owner, shape.token_bytes);
    ++written;
  }
  out.finish(shape.chunk_signals + set * shape.ranks + source, dedup::tag(relay.call) | records);
}

void OneSidedImpl::Dedup::send_node_rows(std::size_t set, std::size_t slot, int source, const RelaySlot& relay) {
  const std::byte* partial_rows = row_buf.data() + (set * (shape.source_rows + shape.inbox_slots * shape.relay_rows) +
                                                    shape.source_rows + slot * shape.relay_rows) *
                                                       shape.row_bytes;
  RegionWriter out(*this, source, row_buf.data() + relay.reply_offset, stage_key(Staged::node_rows, set, slot),
                   relay.records * shape.row_bytes);
  std::vector<const std::byte*> rows;
  for (std::size_t j = 0; j < relay.records; ++j) {
    rows.clear();
    for (std::uint32_t i = j ? relay.record_rows_end[j - 1] : 0; i < relay.record_rows_end[j]; ++i) {
      rows.push_back(partial_rows + relay.record_rows[i] * shape.row_bytes);
    }
    node_row(rows, float_rows, hidden, out.in_place(j * shape.row_bytes, shape.row_bytes));
  }
  count_sent(false, source, relay.records * shape.row_bytes);
  out.finish(shape.row_signals + set * shape.ranks + rank, dedup::tag(relay.call) | 1);
}

}  // namespace ubep::moe
