// The state of one dispatch/combine call (private to moe/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ubep/moe.hpp"

namespace ubep::moe {

/// Bytes of one dispatched token in the buffers: payload, e4m3 scale, padded to 16.
inline std::size_t token_stride(const Config& c) {
  const std::size_t payload = static_cast<std::size_t>(c.hidden) * element_size(c.dtype);
  return (payload + (c.dtype == DType::e4m3 ? 4 : 0) + 15) / 16 * 16;
}
/// Bytes of one expert output row.
inline std::size_t output_stride(const Config& c) {
  return static_cast<std::size_t>(c.hidden) * element_size(output_dtype(c.dtype));
}

/// One expert of a token in a per_rank/per_node record (also its wire format): owner rank, the owner's
/// local expert, the weight.
struct DdEntry {
  std::int32_t owner, le;
  float w;
};

inline constexpr std::size_t kNotOnDevice = ~std::size_t{0};

struct HandleState {
  std::uint64_t call = 0;
  int set = 0;  // buffer set of this call (ubep layer)
  int n = 0;
  // Input kept for combine: top-k ids and weights, [n x topk].
  std::vector<int> idx;
  std::vector<float> weights;
  // Plan, send side: for each (t, k) its position j within the batch (dest rank, local expert of dest);
  // per (dest, local) the batch size and its offset (in tokens) in this rank's combine buffer, which is
  // laid out dest-major so that each owner's outputs form one contiguous block.
  std::vector<int> pos;                        // [n x topk]
  std::vector<int> send_counts;                // [ranks x max_local]
  std::vector<std::size_t> coffset;            // [ranks x max_local]
  std::vector<std::vector<int>> batch_tokens;  // [ranks x max_local] -> token ids in j order
  // Receive side, per local expert.
  std::vector<int> recv_counts;          // [max_local x ranks]: tokens of local expert le from source s
  std::vector<std::uint64_t> recv_meta;  // [max_local x ranks]: the source's combine offset for that batch
  std::vector<std::uint64_t> want;       // [(max_local+1) x ranks]: dispatch-signal targets (ubep layer)
  std::vector<std::uint8_t> ready;       // local expert regrouped
  std::vector<std::uint8_t> returned;    // handed out by next_expert
  std::vector<std::uint8_t> combined;    // combine_send done
  int num_ready = 0, num_returned = 0, num_combined = 0;
  std::vector<std::vector<std::byte>> expert_data;  // [local] contiguous tokens
  // expert_outputs: per local expert its rows once taken (the Layer's heap rows, or own_outputs), and the heap
  // rows taken so far in this call's set.
  std::vector<std::span<std::byte>> out_rows;  // [local]
  std::vector<std::uint8_t> out_taken;         // [local]
  std::vector<std::uint8_t> out_in_place;      // [local] combine_sent from its expert_outputs rows (per_rank/per_node)
  std::vector<std::vector<std::byte>> own_outputs;  // [local] host rows when not in the heap
  std::size_t out_cursor = 0;
  std::vector<std::vector<float>> expert_scales;  // [local] e4m3 scales
  // Memory::device: the first row of each local expert's batch in this call's share of the GPU rows
  // (kNotOnDevice until expert_tokens copies it there), and the rows used so far.
  std::vector<std::size_t> device_at;
  std::size_t device_rows = 0;
  bool released = false;  // all experts regrouped; the release to the sources may wait for older calls
  // ubep layer: this call's outputs to mpi-route sources, staged until the flush after the last expert.
  std::vector<std::byte> out_stage;
  std::size_t out_bytes = 0, out_staged = 0;  // its size (from the sources' headers), its use
  // ucx-route sources: one block each in out_stage, in expert order like their combine buffer (the
  // outputs of one owner are contiguous there), sent as one message after the last local expert.
  std::vector<std::size_t> out_base;     // [ranks]: the block's byte offset in out_stage
  std::vector<std::uint64_t> out_first;  // [ranks]: the source's combine offset of local expert 0
  std::vector<std::size_t> out_total;    // [ranks]: tokens in the block
  // per_rank / per_node (moe/dedup.hpp, moe/dedup*.cpp). Source side: per target rank (an owner, or a node's relay) its
  // records' tokens and expert entries, its rows' offset in our row buffer, and per (token, target) the row.
  std::vector<std::vector<int>> dd_target_tokens;          // [ranks] token ids, ascending
  std::vector<std::vector<std::uint32_t>> dd_entry_start;  // [ranks] per record: its first entry in dd_target_entries
  std::vector<std::vector<DdEntry>> dd_target_entries;     // [ranks] the records' entries, in k order
  std::vector<std::size_t> dd_target_first_row;            // [ranks] first row of the target's rows
  std::vector<int> dd_token_row;                           // [n x ranks] row of (token, target), -1 if none
  // Owner side: per source the chunk's size and reply address, per (source, record) the entries.
  bool dd_received = false;
  std::vector<std::size_t> dd_source_records;       // [ranks] records in the chunk of each source
  std::vector<std::uint64_t> dd_reply;              // [ranks x 3] reply rank, byte offset, signal index
  std::vector<std::size_t> dd_source_first_record;  // [ranks + 1] first record of each source (records numbered)
  std::vector<std::size_t> dd_record_first_entry;   // [records + 1] first entry of each record
  std::vector<int> dd_entry_expert, dd_entry_row;   // [entries] local expert, row in that expert's batch
  std::vector<float> dd_entry_weight;               // [entries] weight
  std::vector<std::vector<const std::byte*>> dd_expert_tokens;  // [local] the records of each expert, in row order
  std::vector<std::vector<int>> dd_expert_entries;              // [local] entry of each row of the expert's batch
  std::vector<int> dd_entry_record;                             // [entries] its record
  std::vector<int> dd_record_source;                            // [records] its source
  std::vector<int> dd_record_pending;                           // [records] entries whose outputs are not in yet
  std::vector<std::byte*> dd_reply_stage;               // [ranks] staging of the partial rows to a network route
  std::vector<std::vector<std::byte>> dd_kept_outputs;  // [local] copies of the outputs a record still needs
  bool finished = false;
  // BSP baseline: received blocks and combine staging.
  std::vector<std::byte> bsp_recv, bsp_csend, bsp_crecv;
  std::vector<int> bsp_rdispl_tokens;  // [ranks]: first token of source s in bsp_recv
};

}  // namespace ubep::moe
