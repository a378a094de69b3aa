// The symmetric GPU heap (Context::alloc_device; README "GPUs"): created collectively by the first call on the
// CUDA device current on each rank (or in host memory under UBEP_GPU_EMULATE=1), mapped by the node peers
// (transports/device_heap.hpp), and reached by put/get/put_signal as copies on one internal stream. Every rank
// fails together when one cannot take part: each step ends with an agreement on whether every rank succeeded,
// before the next one starts.
#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "base/mpi_check.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/state.hpp"
#include "ubep/config.hpp"
#include "ubep/gpu.hpp"

namespace ubep {
namespace detail {

namespace {

/// Objects in the GPU heap are aligned to at least this (cudaMalloc's alignment; vector loads in kernels).
constexpr std::size_t kDeviceAlign = 256;

/// One step of the creation, agreed: every rank says whether its step succeeded (MINLOC over comm, polled with
/// the wait deadline); when one failed, each rank throws: the failed one its own error, the others
/// Errc::unsupported naming the first rank that failed and `what` it could not do.
void agree_step(State& s, const char* call, const std::exception_ptr& mine, const char* what) {
  struct Vote {
    int ok;
    int rank;
  };
  auto buf = std::make_unique<Vote[]>(2);  // MPI may still write into it after a timeout: kept then
  buf[0] = {mine ? 0 : 1, s.rank};
  MPI_Request req = MPI_REQUEST_NULL;
  UBEP_MPI_CHECK(s.rank, call, MPI_Iallreduce(&buf[0], &buf[1], 1, MPI_2INT, MPI_MINLOC, s.comm, &req));
  try {
    s.wait_request(call, req, "the agreement on the GPU heap");
  } catch (...) {
    (void)buf.release();
    throw;
  }
  if (buf[1].ok) return;
  if (mine) std::rethrow_exception(mine);
  s.fail(Errc::unsupported, call,
         "no GPU heap: rank " + std::to_string(buf[1].rank) + " could not " + what +
             " (its error says why); every rank fails here, the context stays usable for host memory");
}

template <class Fn>
std::exception_ptr attempt(Fn&& fn) {
  try {
    fn();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

/// This rank's heap (step 1: a device and its IPC kind agreed by the node; step 2: the allocation).
std::unique_ptr<DeviceHeap> make_heap(State& s, const char* call) {
  const std::string where = s.prefix(call);
  std::unique_ptr<DeviceHeap> heap;
  if (s.options.gpu_emulate) {
    agree_step(s, call, attempt([&] { heap = make_emulated_device_heap(s.options.gpu_heap_size, where); }),
               "allocate its emulated GPU heap");
    return heap;
  }
#if UBEP_HAVE_CUDA
  const GpuStatus& g = gpu_status();
  cuda::DeviceChoice choice;
  agree_step(s, call, attempt([&] {
               if (!g.available) s.fail(Errc::unsupported, call, "no usable GPU here: " + g.reason);
               choice = cuda::choose_device(where);
             }),
             "find a usable GPU");
  // The node shares heaps one way: fd where every rank's device supports it, else legacy IPC.
  int ipc = static_cast<int>(choice.ipc), node_ipc = 0;
  UBEP_MPI_CHECK(s.rank, call, MPI_Allreduce(&ipc, &node_ipc, 1, MPI_INT, MPI_MIN, s.node_comm));
  agree_step(s, call, attempt([&] {
               heap = cuda::make_device_heap(s.options.gpu_heap_size, choice.device, static_cast<cuda::Ipc>(node_ipc),
                                             where);
             }),
             "allocate its GPU heap");
  return heap;
#else
  s.fail(Errc::unsupported, call,
         "this libubep was built without CUDA: there is no GPU heap (UBEP_GPU_EMULATE=1 emulates one in host memory, "
         "for testing)");
#endif
}

/// Collective: this rank's heap, the node peers' mapped; s.device and s.device_base/size set on success.
void create(State& s, const char* call) {
  auto mem = std::make_unique<DeviceMemory>();
  mem->heap = make_heap(s, call);
  // Every heap must have one size (the granularity may differ between device models).
  unsigned long long size = mem->heap->size(), lo = 0, hi = 0;
  UBEP_MPI_CHECK(s.rank, call, MPI_Allreduce(&size, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, s.comm));
  UBEP_MPI_CHECK(s.rank, call, MPI_Allreduce(&size, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, s.comm));
  if (lo != hi) {
    s.fail(Errc::unsupported, call,
           "the GPU heaps differ in size across ranks (" + std::to_string(lo) + " to " + std::to_string(hi) +
               " bytes after rounding UBEP_GPU_HEAP_SIZE=" + std::to_string(s.options.gpu_heap_size) +
               " to each device's allocation granularity); set UBEP_GPU_HEAP_SIZE=" + std::to_string(hi));
  }
  const std::string where = s.prefix(call);
  agree_step(s, call, attempt([&] {
               mem->heap->map_node(
                   s.node_comm, s.rank, call, s.options.wait_timeout,
                   [&](MPI_Request& r) { s.wait_request(call, r, "the exchange of CUDA IPC handles"); }, where);
             }),
             "map the GPU heaps of its node peers");
  mem->alloc = HeapAllocator(0, mem->heap->size());
  mem->peer.assign(s.size, nullptr);
  for (std::size_t r = 0; r < s.node_ranks.size(); ++r)
    mem->peer[s.node_ranks[r]] = mem->heap->peer(static_cast<int>(r));
  s.device_base = mem->heap->base();
  s.device_size = mem->heap->size();
  s.device = std::move(mem);
}

}  // namespace

void State::synchronize_device(const char* call) {
  device->heap->synchronize(prefix(call));
  device_pending = false;
}

namespace {

/// The offset of [addr, addr + bytes) in the GPU heap and pe's heap as mapped here; throws naming the call.
std::pair<std::size_t, char*> device_target(State& s, const char* call, const void* addr, std::size_t bytes, int pe) {
  const std::size_t off = check_heap_range(s, call, addr, bytes, s.device_base, s.device_size, s.device->alloc,
                                           "symmetric GPU heap", "pass a pointer into an object from alloc_device");
  char* peer = s.device->peer[pe];
  if (peer == nullptr) {
    s.fail(Errc::unsupported, call,
           "rank " + std::to_string(pe) + " is on another node (route " + to_string(s.routes[pe]) +
               "): its GPU heap is reached only from its node (CUDA IPC); GPU memory between nodes has no route "
               "yet (README \"GPUs\"): move it through host memory (Context::alloc)");
  }
  return {off, peer};
}

}  // namespace

void State::device_put(const char* call, void* dest, const void* src, std::size_t bytes, int pe, bool complete) {
  const auto [off, peer] = device_target(*this, call, dest, bytes, pe);
  device->heap->copy_async(peer + off, src, bytes, prefix(call));
  device_pending = true;
  if (complete) synchronize_device(call);
}

void State::device_get(const char* call, void* dest, const void* src, std::size_t bytes, int pe, bool complete) {
  const auto [off, peer] = device_target(*this, call, src, bytes, pe);
  device->heap->copy_async(dest, peer + off, bytes, prefix(call));
  device_pending = true;
  if (complete) synchronize_device(call);
}

void* State::device_ptr(const char* call, const void* dest, std::size_t bytes, int pe) {
  const std::size_t off = check_heap_range(*this, call, dest, bytes, device_base, device_size, device->alloc,
                                           "symmetric GPU heap", "pass a pointer into an object from alloc_device");
  char* peer = device->peer[pe];
  return peer ? peer + off : nullptr;
}

bool State::release_device(std::size_t offset) noexcept { return device && device->alloc.release(offset); }

}  // namespace detail

using detail::State;

void* Context::alloc_device_bytes(std::size_t count, std::size_t elem_size, std::size_t align) {
  State& s = *state_;
  const char* call = "alloc_device";
  const std::size_t bytes = detail::alloc_request(s, call, count, elem_size, align, detail::kDeviceAlign);
  s.quiet();  // device copies too: nothing aimed at a freed object lands in the new one
  if (!s.device) detail::create(s, call);
  const std::optional<std::size_t> off =
      detail::alloc_agreed(s, call, detail::CollKind::alloc_device, s.device->alloc, bytes, align);
  if (bytes == 0) return nullptr;
  if (!off) detail::throw_out_of_heap(s, call, s.device->alloc, s.device_size, "UBEP_GPU_HEAP_SIZE", bytes, align);
  return s.device_base + *off;
}

namespace detail {

std::string gpu_heap_description(const State& s) {
  if (!s.device) {
    return "not created (the first alloc_device creates UBEP_GPU_HEAP_SIZE=" + std::to_string(s.options.gpu_heap_size) +
           " bytes on the current CUDA device)";
  }
  return s.device->heap->describe();
}

std::string gpu_path(const State& s, int pe) {
  if (pe == s.rank) return "self: copies within this rank's GPU heap";
  if (std::find(s.node_ranks.begin(), s.node_ranks.end(), pe) != s.node_ranks.end())
    return "CUDA IPC: the node peer's GPU heap mapped here, copies on ubep's stream";
  return std::string("none: another node (route ") + to_string(s.routes[pe]) +
         "), GPU memory between nodes has no route yet";
}

}  // namespace detail
}  // namespace ubep
