// The implementations behind moe.hpp's classes (private to moe/). LayerBase, Layer and BspLayer hold a LayerImpl
// and forward every call to it (moe/layer_api.cpp); the contract of each call is its note in moe.hpp.
//   LayerImpl     what both implementations share: the config checks, the input checks of every call, the send
//                 plan, regrouping by expert, the weighted reduction (so that both give bit-identical results),
//                 the output buffers, the call order (moe/layer_impl.cpp)
//   OneSidedImpl  ubep's Layer: per_expert in moe/layer.cpp, per_rank and per_node in its Dedup part
//                 (moe/dedup.hpp, moe/dedup*.cpp)
//   BspImpl       the BSP baseline over MPI collectives (moe/bsp_layer.cpp)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "moe/handle.hpp"
#include "ubep/moe.hpp"

namespace ubep::moe {

class LayerImpl {
 public:
  /// Checks the config on this rank, then agrees on it with every rank (Context::agree).
  /// @note Local completion: on return. Remote completion: no rank returns before every rank has joined the
  /// agreement. Blocks: until every rank joins, at most UBEP_WAIT_TIMEOUT. Communicates: collective over
  /// ctx's communicator.
  LayerImpl(Context& ctx, const Config& config, const char* who);
  virtual ~LayerImpl();
  LayerImpl(const LayerImpl&) = delete;
  LayerImpl& operator=(const LayerImpl&) = delete;

  // The calls of LayerBase, as moe.hpp states them.
  const Config& config() const noexcept { return config_; }
  const ExpertMap& experts() const noexcept { return map_; }
  int local_experts() const noexcept { return map_.count(rank_); }
  virtual std::size_t buffer_bytes() const = 0;
  std::size_t device_buffer_bytes() const noexcept { return device_rows_.size(); }
  static std::size_t device_heap_bytes(const Config& config, int ranks, unsigned run_ahead);
  virtual const char* name() const noexcept = 0;
  const Traffic& traffic() const noexcept { return traffic_; }
  Handle dispatch_send(std::span<const std::byte> tokens, std::span<const int> topk_idx,
                       std::span<const float> topk_weights, std::span<const float> scales);
  virtual void dispatch_recv(Handle& h) = 0;
  Handle dispatch(std::span<const std::byte> tokens, std::span<const int> topk_idx, std::span<const float> topk_weights,
                  std::span<const float> scales);
  virtual std::optional<int> next_expert(Handle& h) = 0;
  ExpertTokens expert_tokens(const Handle& h, int local) const;
  void combine_send(Handle& h, int local, std::span<const std::byte> outputs);
  std::span<std::byte> expert_outputs(Handle& h, int local);
  void combine_send(Handle& h, int local);
  void combine_recv(Handle& h, std::span<float> out);
  void combine(Handle& h, std::span<const std::span<const std::byte>> outputs, std::span<float> out);

 protected:
  /// The implementation part of dispatch_send; `tokens` and `scales` are the caller's (checked) input.
  virtual void send(HandleState& h, std::span<const std::byte> tokens, std::span<const float> scales) = 0;
  /// The implementations of combine_send and combine_recv, on host memory (the caller's, or a host copy of it
  /// under Memory::device).
  virtual void send_outputs(Handle& h, int local, std::span<const std::byte> outputs) = 0;
  virtual void recv_outputs(Handle& h, std::span<float> out) = 0;
  /// The layer-owned rows of expert_outputs for local expert `local` of `h` (`bytes` of them), or an empty
  /// span to use this call's own host memory (the default).
  virtual std::span<std::byte> heap_outputs(HandleState& h, int local, std::size_t bytes);
  /// Packs the tokens `toks` (with their e4m3 scale) at stride token_bytes_ into `dst`.
  void pack(const std::vector<int>& toks, std::byte* dst, std::span<const std::byte> tokens,
            std::span<const float> scales) const;
  /// Stages all n tokens of call `h`, in order, for the owners that gather from them over load/store: into set
  /// h.set of `stage`, UBEP_RUN_AHEAD sets of max_tokens_per_rank rows of token_bytes_ each.
  void stage_tokens(const HandleState& h, std::byte* stage, std::span<const std::byte> tokens,
                    std::span<const float> scales) const;
  /// The state of a call (Handle keeps it private; LayerImpl is its friend, the implementations read it here).
  static HandleState& state_of(const Handle& h) { return *h.state_; }
  /// Throws Errc::invalid_argument for an empty handle or a call already combined, naming the rank and `call`.
  void check_handle(const Handle& h, const char* call) const;
  /// check_handle, then Errc::out_of_range unless `local` is an index of this rank's experts and
  /// Errc::invalid_argument unless that expert is complete, naming the rank, `call`, the call number and the index.
  void check_expert(const Handle& h, int local, const char* call) const;
  /// Throws Errc::invalid_argument unless `h` is the oldest call not yet combined (O(1)).
  void check_oldest(const Handle& h, const char* call) const;
  /// Checks a combine_recv call: the handle, the order, every local expert combine_sent.
  void check_combine_recv(const Handle& h) const;
  /// The final sum both implementations use: per_expert out[t] = sum_k w[t,k] * combine[coffset(t,k)]; per_rank
  /// and per_node the documented order from per-expert rows (BspLayer).
  void reduce(const HandleState& h, const std::byte* combine, std::span<float> out) const;
  /// per_expert: the sum from each (owner, local expert) batch's first row ([ranks x max_local], see
  /// reduce_outputs in moe/kernels.hpp).
  void reduce_batches(const HandleState& h, std::span<const std::byte* const> batches, std::span<float> out) const;
  /// Throws Errc::invalid_argument unless `out` holds n x hidden floats.
  void check_out(const HandleState& h, std::span<float> out) const;
  /// Copies the batches of local expert `le` (batch from source s starts at block(s), token stride
  /// token_bytes_) into one contiguous array; recv_counts must be filled. Where `rows` is given and rows(s)
  /// is not null, the batch from s is gathered: its j-th token is row rows(s)[j] of block(s).
  void regroup(HandleState& h, int le, const std::function<const std::byte*(int)>& block,
               const std::function<const std::uint32_t*(int)>& rows = {});
  /// Checks a combine_send call (handle, expert index, not yet combined, output size); returns the count.
  int check_combine_send(const Handle& h, int local, std::span<const std::byte> outputs) const;
  /// Marks a handle done and recycles its buffers.
  void finish(HandleState& h);
  /// Resizes `v` to `bytes`, first taking the pooled buffer that fits best when `v` is too small.
  void reuse(std::vector<std::byte>& v, std::size_t bytes);
  std::uint64_t finished_ = 0;  // calls whose combine_recv returned
  std::vector<std::vector<std::byte>> pool_;
  Context& ctx_;
  Config config_;
  ExpertMap map_;
  int rank_ = 0, size_ = 1;
  std::uint64_t calls_ = 0;
  std::size_t token_bytes_ = 0, out_token_bytes_ = 0;
  Traffic traffic_;
  std::vector<int> node_;  // Topology::node_of per rank
  /// Partial and node rows in float (per_rank, per_node): float_partials, or f32 outputs.
  bool partial_f32() const noexcept { return config_.float_partials || output_dtype(config_.dtype) == DType::f32; }
  /// Counted bytes of one token copy: the payload and the e4m3 scale (Traffic).
  std::size_t payload_bytes() const noexcept {
    return static_cast<std::size_t>(config_.hidden) * element_size(config_.dtype) +
           (config_.dtype == DType::e4m3 ? 4 : 0);
  }
  /// Adds `bytes` sent to `pe` to the dispatch or combine counters.
  void count(bool dispatch, int pe, std::size_t bytes);

 private:
  /// Memory::device: `bytes` of `src` (any memory) in host memory, in `stage` (Context::copy).
  template <class T>
  std::span<const T> to_host(std::span<const T> src, std::vector<std::byte>& stage);
  Symmetric<std::byte> device_rows_;  // Memory::device: per call in flight, the expert batches handed out
  std::size_t device_set_ = 0;        // bytes of one call's share of device_rows_
  std::size_t device_scales_ = 0;     // offset of the scales in a call's share
  std::vector<std::byte> stage_tokens_, stage_idx_, stage_weights_, stage_scales_, stage_outputs_;
  std::vector<float> stage_out_;
};

/// ubep's Layer: one-sided puts and epoch-tagged signals (the buffer layout is at the top of moe/layer.cpp).
class OneSidedImpl final : public LayerImpl {
 public:
  OneSidedImpl(Context& ctx, const Config& config);
  ~OneSidedImpl() override;
  static std::size_t heap_bytes(const Config& config, int ranks, unsigned run_ahead);
  static std::size_t heap_bytes(const Config& config, const Topology& topology, unsigned run_ahead);
  std::size_t buffer_bytes() const override;
  const char* name() const noexcept override { return "ubep"; }
  void dispatch_recv(Handle& h) override;
  std::optional<int> next_expert(Handle& h) override;
  const std::vector<int>& schedule() const noexcept;
  void progress();

 private:
  void send(HandleState& h, std::span<const std::byte> tokens, std::span<const float> scales) override;
  void send_outputs(Handle& h, int local, std::span<const std::byte> outputs) override;
  void recv_outputs(Handle& h, std::span<float> out) override;
  std::span<std::byte> heap_outputs(HandleState& h, int local, std::size_t bytes) override;
  void release_if_done(HandleState& s);
  /// Throws OutOfHeap (with the advice) unless `need` bytes fit in the heap's largest free block.
  void check_heap(std::size_t need) const;
  struct PerExpert;  // per_expert's buffers and bookkeeping (moe/layer.cpp)
  std::unique_ptr<PerExpert> per_expert_;
  struct Dedup;  // per_rank and per_node (moe/dedup.hpp, moe/dedup*.cpp)
  std::unique_ptr<Dedup> dedup_;
};

/// The BSP baseline: MPI_Alltoall of counts, MPI_Alltoallv of tokens and of outputs, on ctx.comm().
class BspImpl final : public LayerImpl {
 public:
  BspImpl(Context& ctx, const Config& config);
  ~BspImpl() override;
  std::size_t buffer_bytes() const override;
  const char* name() const noexcept override { return "bsp"; }
  void dispatch_recv(Handle& h) override;
  std::optional<int> next_expert(Handle& h) override;

 private:
  void send(HandleState& h, std::span<const std::byte> tokens, std::span<const float> scales) override;
  void send_outputs(Handle& h, int local, std::span<const std::byte> outputs) override;
  void recv_outputs(Handle& h, std::span<float> out) override;
  std::size_t peak_bytes_ = 0;
  std::vector<std::byte> sendbuf_, recv_, csend_, crecv_;  // reused across calls
};

}  // namespace ubep::moe
