// The classes of moe.hpp: each call forwards to the layer's implementation (moe/layer_impl.hpp), which checks it.
#include <utility>

#include "moe/layer_impl.hpp"

namespace ubep::moe {

Handle::Handle() = default;
Handle::Handle(Handle&&) noexcept = default;
Handle& Handle::operator=(Handle&&) noexcept = default;
Handle::~Handle() = default;
std::uint64_t Handle::call() const { return state_ ? state_->call : 0; }
int Handle::tokens() const { return state_ ? state_->n : 0; }

LayerBase::LayerBase(std::unique_ptr<LayerImpl> impl) : impl_(std::move(impl)) {}
LayerBase::~LayerBase() = default;

const Config& LayerBase::config() const noexcept { return impl_->config(); }
const ExpertMap& LayerBase::experts() const noexcept { return impl_->experts(); }
int LayerBase::local_experts() const noexcept { return impl_->local_experts(); }
std::size_t LayerBase::buffer_bytes() const { return impl_->buffer_bytes(); }
std::size_t LayerBase::device_buffer_bytes() const noexcept { return impl_->device_buffer_bytes(); }
std::size_t LayerBase::device_heap_bytes(const Config& config, int ranks, unsigned run_ahead) {
  return LayerImpl::device_heap_bytes(config, ranks, run_ahead);
}
const char* LayerBase::name() const noexcept { return impl_->name(); }
const Traffic& LayerBase::traffic() const noexcept { return impl_->traffic(); }

Handle LayerBase::dispatch_send(std::span<const std::byte> tokens, std::span<const int> topk_idx,
                                std::span<const float> topk_weights, std::span<const float> scales) {
  return impl_->dispatch_send(tokens, topk_idx, topk_weights, scales);
}
void LayerBase::dispatch_recv(Handle& h) { impl_->dispatch_recv(h); }
Handle LayerBase::dispatch(std::span<const std::byte> tokens, std::span<const int> topk_idx,
                           std::span<const float> topk_weights, std::span<const float> scales) {
  return impl_->dispatch(tokens, topk_idx, topk_weights, scales);
}
std::optional<int> LayerBase::next_expert(Handle& h) { return impl_->next_expert(h); }
ExpertTokens LayerBase::expert_tokens(const Handle& h, int local) const { return impl_->expert_tokens(h, local); }
void LayerBase::combine_send(Handle& h, int local, std::span<const std::byte> outputs) {
  impl_->combine_send(h, local, outputs);
}
std::span<std::byte> LayerBase::expert_outputs(Handle& h, int local) { return impl_->expert_outputs(h, local); }
void LayerBase::combine_send(Handle& h, int local) { impl_->combine_send(h, local); }
void LayerBase::combine_recv(Handle& h, std::span<float> out) { impl_->combine_recv(h, out); }
void LayerBase::combine(Handle& h, std::span<const std::span<const std::byte>> outputs, std::span<float> out) {
  impl_->combine(h, outputs, out);
}

Layer::Layer(Context& ctx, const Config& config) : LayerBase(std::make_unique<OneSidedImpl>(ctx, config)) {}
Layer::~Layer() = default;
std::size_t Layer::heap_bytes(const Config& config, int ranks, unsigned run_ahead) {
  return OneSidedImpl::heap_bytes(config, ranks, run_ahead);
}
std::size_t Layer::heap_bytes(const Config& config, const Topology& topology, unsigned run_ahead) {
  return OneSidedImpl::heap_bytes(config, topology, run_ahead);
}
const std::vector<int>& Layer::schedule() const noexcept { return static_cast<OneSidedImpl&>(impl()).schedule(); }
void Layer::progress() { static_cast<OneSidedImpl&>(impl()).progress(); }

BspLayer::BspLayer(Context& ctx, const Config& config) : LayerBase(std::make_unique<BspImpl>(ctx, config)) {}
BspLayer::~BspLayer() = default;

}  // namespace ubep::moe
