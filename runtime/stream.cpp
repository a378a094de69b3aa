// Stream-ordered signals: Context::put_signal_on_stream, signal_op_on_stream, wait_until_on_stream and
// StreamWait (include/ubep/stream.hpp says what holds). The GPU reaches the node's host heaps through CUDA
// registrations made at the first call; the kernels and CUDA calls are transports/cuda/'s.
#include <algorithm>
#include <atomic>
#include <sstream>
#include <utility>

#include "runtime/gpu_streams.hpp"
#include "runtime/state.hpp"
#include "transports/transport.hpp"
#include "ubep/config.hpp"
#include "ubep/gpu.hpp"

#if UBEP_HAVE_CUDA_KERNELS
#include "transports/cuda/host_memory.hpp"
#include "transports/cuda/signal_kernels.hpp"
#endif

namespace ubep {
namespace detail {

GpuStreams::~GpuStreams() {
#if UBEP_HAVE_CUDA_KERNELS
  for (void* p : registered) cuda::unregister_host(p);
  for (void* p : blocks) cuda::free_mapped(p);
#endif
}

std::vector<HostRange> merge_host_ranges(std::vector<HostRange> ranges, std::uintptr_t page) {
  std::sort(ranges.begin(), ranges.end(), [](const HostRange& a, const HostRange& b) { return a.begin < b.begin; });
  std::vector<HostRange> merged;
  for (HostRange& r : ranges) {
    // The page holding r's first byte is at or before the page holding the last one's last byte (+1: touching).
    if (!merged.empty() && r.begin / page <= (merged.back().end + page - 1) / page) {
      merged.back().end = std::max(merged.back().end, r.end);
      merged.back().pes.insert(merged.back().pes.end(), r.pes.begin(), r.pes.end());
    } else {
      merged.push_back(std::move(r));
    }
  }
  return merged;
}

namespace {

/// Payloads up to this size go with the signal in one kernel; larger ones through the copy engines.
constexpr std::size_t kKernelCopyMax = 64 * 1024;
/// Stream-wait slots are allocated this many at a time: the first block when the stream calls are set up (before
/// any kernel runs), another only when that many waits are in flight at once.
constexpr std::size_t kSlotsPerBlock = 64;

#if UBEP_HAVE_CUDA_KERNELS
void check_cuda(const State& s, const char* call, int rc, const char* what) {
  if (rc != 0) {
    throw Error(Errc::cuda, s.prefix(call) + what + " failed: " + cuda::error_string(rc), rc);
  }
}

/// The node's mapped heaps registered with CUDA, merged where their pages touch (two registrations may not
/// share a page); the device address of each peer's heap.
void register_heaps(State& s, const char* call, GpuStreams& g) {
  std::vector<HostRange> ranges;
  for (int pe = 0; pe < s.comms.size; ++pe) {
    if (const char* m = s.routes.mapped[pe]) {
      const auto b = reinterpret_cast<std::uintptr_t>(m);
      ranges.push_back({b, b + s.heap.size, {pe}});
    }
  }
  const std::vector<HostRange> merged = merge_host_ranges(std::move(ranges), 4096);
  g.device_heap.assign(s.comms.size, nullptr);
  for (const HostRange& r : merged) {
    void* device = nullptr;
    auto* host = reinterpret_cast<void*>(r.begin);
    bool here = false;
    const int rc = cuda::register_host(host, r.end - r.begin, &device, &here);
    if (here) g.registered.push_back(host);  // undone by ~GpuStreams, also when the next line throws
    check_cuda(s, call, rc, "cudaHostRegister of the node's symmetric heaps");
    for (int pe : r.pes) {
      g.device_heap[pe] =
          static_cast<char*>(device) + (reinterpret_cast<std::uintptr_t>(s.routes.mapped[pe]) - r.begin);
    }
  }
}

/// Another block of kSlotsPerBlock stream-wait slots (mapped host memory), all free.
void add_slots(State& s, const char* call, GpuStreams& g) {
  void *host = nullptr, *device = nullptr;
  check_cuda(s, call, cuda::alloc_mapped(kSlotsPerBlock * sizeof(cuda::StreamWaitStatus), &host, &device),
             "cudaHostAlloc of stream-wait slots");
  g.blocks.push_back(host);
  for (std::size_t i = 0; i < kSlotsPerBlock; ++i) {
    g.slots.push_back(
        {static_cast<cuda::StreamWaitStatus*>(host) + i, static_cast<cuda::StreamWaitStatus*>(device) + i});
    g.free_slots.push_back(&g.slots.back());
  }
}
#endif

/// The checks every stream call makes after its argument checks, in this order: `pe` reached by load/store
/// (route and signals), a build with the kernels, a GPU; then the first call registers the heaps, loads the
/// kernels and allocates the first stream-wait slots, so that no later call loads a module or allocates
/// while a wait kernel spins (either may need a context-wide synchronization that waits for that kernel).
GpuStreams& stream_peer(State& s, const char* call, int pe) {
  if (s.routes.mapped_signals[pe] == nullptr) {
    std::string why = "rank " + std::to_string(pe) + " is on the " + to_string(s.routes.route[pe]) + " route";
    if (s.routes.mapped[pe] != nullptr) why = "the signals to rank " + std::to_string(pe) + " go through MPI";
    s.fail(Errc::unsupported, call,
           why +
               ": stream-ordered calls reach peers by load/store only (route self or shm, load/store "
               "atomics); the staged path to other nodes is not built yet");
  }
#if UBEP_HAVE_CUDA_KERNELS
  if (!s.gpu.streams) {
    const GpuStatus& g = gpu_status();
    if (!g.available) s.fail(Errc::unsupported, call, "no usable GPU here: " + g.reason);
    auto streams = std::make_unique<GpuStreams>();
    register_heaps(s, call, *streams);  // on a throw, the registrations made so far are undone
    check_cuda(s, call, cuda::load_kernels(), "loading the signal kernels (cudaFuncGetAttributes)");
    add_slots(s, call, *streams);
    s.gpu.streams = std::move(streams);
  }
  return *s.gpu.streams;
#else
  s.fail(Errc::unsupported, call,
         UBEP_HAVE_CUDA ? "this libubep was built without nvcc, so without its GPU kernels (UBEP_WITH_CUDA)"
                        : "this libubep was built without CUDA (UBEP_WITH_CUDA)");
#endif
}

#if UBEP_HAVE_CUDA_KERNELS
struct HostAdd {
  char* base;
  std::size_t offset;
  std::uint64_t value;
};

void apply_host_add(void* arg) {
  const auto* a = static_cast<HostAdd*>(arg);
  apply_posted(a->base, a->offset, AtomicOp::add, a->value);
  delete a;
}

/// The signal update of a stream call: a set from the GPU, an add from a host callback (see stream.hpp).
void signal_on_stream(State& s, const char* call, GpuStreams& g, std::size_t soff, std::uint64_t value, SignalOp op,
                      int pe, GpuStream stream) {
  if (op == SignalOp::set) {
    auto* sig = reinterpret_cast<std::uint64_t*>(g.device_heap[pe] + soff);
    check_cuda(s, call, cuda::signal_op_async(stream, sig, value, op), "the signal kernel's launch");
    return;
  }
  auto* add = new HostAdd{s.routes.mapped_signals[pe], soff, value};
  const int rc = cuda::host_func_async(stream, apply_host_add, add);
  if (rc != 0) delete add;
  check_cuda(s, call, rc, "cudaLaunchHostFunc of the signal add");
}

StreamWaitSlot* take_slot(State& s, const char* call, GpuStreams& g) {
  if (g.free_slots.empty()) add_slots(s, call, g);
  StreamWaitSlot* slot = g.free_slots.back();
  g.free_slots.pop_back();
  *slot->host = cuda::StreamWaitStatus{};
  std::atomic_thread_fence(std::memory_order_release);
  return slot;
}
#endif

}  // namespace
}  // namespace detail

using detail::State;

void Context::put_signal_on_stream(void* dest, const void* src, std::size_t bytes, std::uint64_t* sig,
                                   std::uint64_t value, SignalOp op, int pe, GpuStream stream) {
  constexpr const char* call = "put_signal_on_stream";
  State& s = *state_;
  s.check_alive(call);
  s.check_pe(call, pe);
  const std::size_t off = bytes ? s.check_range(call, dest, bytes) : 0;
  const std::size_t soff = s.check_word(call, sig);
  detail::GpuStreams& g = detail::stream_peer(s, call, pe);
#if UBEP_HAVE_CUDA_KERNELS
  char* d = g.device_heap[pe];
  if (op == SignalOp::set && bytes <= detail::kKernelCopyMax) {
    detail::check_cuda(s, call,
                       detail::cuda::put_signal_async(stream, d + off, src, bytes,
                                                      reinterpret_cast<std::uint64_t*>(d + soff), value, op),
                       "the put_signal kernel's launch");
    return;
  }
  if (bytes) detail::check_cuda(s, call, detail::cuda::copy_async(stream, d + off, src, bytes), "cudaMemcpyAsync");
  detail::signal_on_stream(s, call, g, soff, value, op, pe, stream);
#else
  (void)g, (void)off, (void)soff, (void)src, (void)value, (void)op, (void)stream;
#endif
}

void Context::signal_op_on_stream(std::uint64_t* sig, std::uint64_t value, SignalOp op, int pe, GpuStream stream) {
  constexpr const char* call = "signal_op_on_stream";
  State& s = *state_;
  s.check_alive(call);
  s.check_pe(call, pe);
  const std::size_t soff = s.check_word(call, sig);
  detail::GpuStreams& g = detail::stream_peer(s, call, pe);
#if UBEP_HAVE_CUDA_KERNELS
  detail::signal_on_stream(s, call, g, soff, value, op, pe, stream);
#else
  (void)g, (void)soff, (void)value, (void)op, (void)stream;
#endif
}

StreamWait Context::wait_until_on_stream(const std::uint64_t* sig, Cmp cmp, std::uint64_t value, GpuStream stream,
                                         const WaitOptions& opts) {
  constexpr const char* call = "wait_until_on_stream";
  State& s = *state_;
  s.check_wait(call, std::span<const std::uint64_t>(sig, 1), opts);
  detail::GpuStreams& g = detail::stream_peer(s, call, s.comms.rank);
  StreamWait::Wait w;
  w.offset = static_cast<std::size_t>(reinterpret_cast<const char*>(sig) - s.heap.base);
  w.cmp = cmp;
  w.value = value;
  w.timeout_s = (opts.timeout ? *opts.timeout : s.options.wait_timeout).count();
  w.writers.assign(opts.writers.begin(), opts.writers.end());
  if (opts.what) w.what = opts.what;
#if UBEP_HAVE_CUDA_KERNELS
  detail::StreamWaitSlot* slot = detail::take_slot(s, call, g);
  const double ns = w.timeout_s * 1e9;
  const std::uint64_t timeout_ns = ns <= 0 ? 0 : ns >= 1.8e19 ? ~std::uint64_t{0} : static_cast<std::uint64_t>(ns);
  const int rc = detail::cuda::wait_until_async(
      stream, reinterpret_cast<const std::uint64_t*>(g.device_heap[s.comms.rank] + w.offset), cmp, value, timeout_ns,
      slot->device);
  if (rc != 0) g.free_slots.push_back(slot);
  detail::check_cuda(s, call, rc, "the wait kernel's launch");
  return StreamWait(state_, slot, std::move(w));
#else
  (void)g, (void)stream;
  return StreamWait();
#endif
}

StreamWait::StreamWait(std::shared_ptr<detail::State> state, detail::StreamWaitSlot* slot, Wait wait)
    : state_(std::move(state)), slot_(slot), wait_(std::move(wait)) {}

StreamWait::StreamWait(StreamWait&& other) noexcept
    : state_(std::move(other.state_)), slot_(std::exchange(other.slot_, nullptr)), wait_(std::move(other.wait_)) {}

StreamWait& StreamWait::operator=(StreamWait&& other) noexcept {
  if (this != &other) {
    StreamWait old(std::move(other));  // takes other's wait; its destructor releases this one's
    std::swap(state_, old.state_);
    std::swap(slot_, old.slot_);
    std::swap(wait_, old.wait_);
  }
  return *this;
}

#if UBEP_HAVE_CUDA_KERNELS
namespace {
std::uint64_t slot_state(const detail::StreamWaitSlot* slot) {
  return std::atomic_ref<std::uint64_t>(slot->host->state).load(std::memory_order_acquire);
}
}  // namespace
#endif

StreamWait::~StreamWait() {
  if (!state_ || !slot_ || state_->finalized || !state_->gpu.streams) return;
#if UBEP_HAVE_CUDA_KERNELS
  if (slot_state(slot_) != detail::cuda::StreamWaitStatus::pending) state_->gpu.streams->free_slots.push_back(slot_);
#endif
}

bool StreamWait::done() const {
  if (!state_ || !slot_) throw Error(Errc::invalid_argument, "ubep: StreamWait::done(): an empty StreamWait");
  state_->check_alive("StreamWait::done");
#if UBEP_HAVE_CUDA_KERNELS
  return slot_state(slot_) != detail::cuda::StreamWaitStatus::pending;
#else
  return false;
#endif
}

std::uint64_t StreamWait::result() const {
  constexpr const char* call = "StreamWait::result";
  if (!state_ || !slot_) throw Error(Errc::invalid_argument, "ubep: StreamWait::result(): an empty StreamWait");
  const State& s = *state_;
  s.check_alive(call);
#if UBEP_HAVE_CUDA_KERNELS
  const std::uint64_t st = slot_state(slot_);
  const detail::cuda::StreamWaitStatus& status = *slot_->host;
  if (st == detail::cuda::StreamWaitStatus::met) return status.observed;
  if (st == detail::cuda::StreamWaitStatus::pending) {
    s.fail(Errc::invalid_argument, call,
           "the stream has not passed this wait_until_on_stream yet (synchronize the stream, or ask done())");
  }
  std::ostringstream msg;
  msg << "timeout after " << static_cast<double>(status.waited_ns) / 1e9
      << " s on the GPU's clock (UBEP_WAIT_TIMEOUT or WaitOptions::timeout: " << wait_.timeout_s
      << " s) in wait_until_on_stream";
  if (!wait_.what.empty()) msg << " waiting for " << wait_.what;
  msg << "; the stream went on\n  signal (rank " << s.comms.rank << ", heap offset " << wait_.offset
      << ") = " << status.observed << ", waiting for " << to_string(wait_.cmp) << " " << wait_.value;
  if (wait_.writers.empty()) {
    msg << "; writers unknown (pass WaitOptions::writers to name them)";
  } else if (wait_.writers[0] >= 0) {
    msg << "; expected writer: rank " << wait_.writers[0];
  }
  s.fail(Errc::timeout, call, msg.str());
#else
  s.fail(Errc::unsupported, call, "built without ubep's GPU kernels");
#endif
}

}  // namespace ubep
