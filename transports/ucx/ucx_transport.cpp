#include "transports/ucx/ucx_transport.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

#include "base/log.hpp"
#include "base/mpi_check.hpp"
#include "base/poll.hpp"
#include "ubep/error.hpp"

namespace ubep::detail {
namespace {

using namespace ucx_wire;  // NOLINT: the message kinds

constexpr unsigned kAmId = 7;

static_assert(static_cast<int>(AtomicOp::fetch_add) == op_fetch_add && static_cast<int>(AtomicOp::set) == op_set,
              "the wire's op numbers are AtomicOp's");

std::atomic_ref<std::uint64_t> word(char* base, std::size_t offset) {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(base + offset));
}

/// Applies an atomic to a local word with a CPU atomic; returns the old value.
std::uint64_t apply_atomic(std::atomic_ref<std::uint64_t> w, AtomicOp op, std::uint64_t operand,
                           std::uint64_t compare) {
  switch (op) {
    case AtomicOp::fetch_add:
    case AtomicOp::add: return w.fetch_add(operand, std::memory_order_acq_rel);
    case AtomicOp::swap:
    case AtomicOp::set: return w.exchange(operand, std::memory_order_acq_rel);
    case AtomicOp::compare_swap: {
      std::uint64_t expected = compare;
      w.compare_exchange_strong(expected, operand, std::memory_order_acq_rel, std::memory_order_acquire);
      return expected;
    }
    case AtomicOp::fetch: return w.load(std::memory_order_acquire);
  }
  return 0;
}

ucs_status_t am_handler(void* arg, const void* header, std::size_t header_length, void* data, std::size_t length,
                        const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  UcxTransport::Msg m{};
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (header_length != sizeof m) {
    // Not ubep's header: reported as a header whose version is wrong (0), from no known source.
    m.version = 0;
    m.src = ~std::uint32_t{0};
    return self->on_message(m, data, length, rndv);
  }
  std::memcpy(&m, header, sizeof m);
  return self->on_message(m, data, length, rndv);
}

void ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
  const auto* a = static_cast<const UcxTransport::EndpointArg*>(arg);
  a->self->on_endpoint_error(a->pe, status);
}

ucs_status_t request_status(void* req) { return req ? ucp_request_check_status(req) : UCS_OK; }

/// The lanes of an endpoint as ucp_ep_print_info reports them, one "tcp/eth0.0[rma_bw am am_bw]" each
/// (the transport/device, then the roles: rma, rma_bw, amo, am, am_bw, wireup); and whether one lane
/// carries both RMA and atomics (what the rdma mode needs in hardware).
struct Lanes {
  std::vector<std::string> lanes;
  bool rma_and_amo = false;
};

Lanes lanes_of(ucp_ep_h ep) {
  Lanes out;
  char* text = nullptr;
  std::size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  if (!f) return out;
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::istringstream in(std::string(text, len));
  std::free(text);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("lane[");
    if (at == std::string::npos) continue;
    std::istringstream words(line.substr(line.find(':', at) + 1));
    std::string word, device, roles;
    bool rma = false, amo = false;
    // "0:tcp/mpi0.0 md[1] -> md[1]/tcp/sysdev[255] rma_bw#0 am am_bw#0 wireup"
    for (int i = 0; words >> word; ++i) {
      if (i == 0) {
        device = word.substr(word.find(':') + 1);
        continue;
      }
      if (word.rfind("md[", 0) == 0 || word == "->") continue;
      const std::string role = word.substr(0, word.find('#'));
      rma = rma || role == "rma" || role == "rma_bw";
      amo = amo || role == "amo";
      roles += (roles.empty() ? "" : " ") + role;
    }
    out.lanes.push_back(device + "[" + roles + "]");
    out.rma_and_amo = out.rma_and_amo || (rma && amo);
  }
  return out;
}

}  // namespace

UcxTransport::UcxTransport(MPI_Comm comm, int rank, int nranks, char* base, std::size_t heap_bytes,
                           const std::string& mode, std::chrono::duration<double> timeout, const PollPolicy& poll,
                           bool threaded)
    : rank_(rank),
      nranks_(nranks),
      threaded_(threaded),
      base_(base),
      heap_bytes_(heap_bytes),
      timeout_(timeout),
      poll_(poll) {
  ucp_config_t* config = nullptr;
  if (ucs_status_t st = ucp_config_read(nullptr, nullptr, &config); st != UCS_OK) fail("ucp_config_read", st);
  // UCX's keepalive (on with peer error handling) declares an endpoint dead when the peer's worker
  // goes unprogressed for long (a Context idle while another one works, a long compute): ubep's own
  // deadlines detect a peer that is gone, so it is off unless UCX_KEEPALIVE_INTERVAL asks for it.
  if (!std::getenv("UCX_KEEPALIVE_INTERVAL")) ucp_config_modify(config, "KEEPALIVE_INTERVAL", "inf");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features =
      UCP_FEATURE_AM | (mode == "am" ? 0 : UCP_FEATURE_RMA | UCP_FEATURE_AMO64) | (threaded ? UCP_FEATURE_WAKEUP : 0);
  const ucs_status_t st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) fail("ucp_init", st);
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = threaded ? UCS_THREAD_MODE_SERIALIZED : UCS_THREAD_MODE_SINGLE;
  if (ucs_status_t s = ucp_worker_create(context_, &wparams, &worker_); s != UCS_OK) fail("ucp_worker_create", s);
  if (threaded) {
    if (ucs_status_t s = ucp_worker_get_efd(worker_, &efd_); s != UCS_OK) fail("ucp_worker_get_efd", s);
  }

  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                  UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  hp.id = kAmId;
  hp.cb = am_handler;
  hp.arg = this;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG;
  if (ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &hp); s != UCS_OK)
    fail("ucp_worker_set_am_recv_handler", s);

  // Worker addresses, exchanged once over MPI.
  ucp_address_t* addr = nullptr;
  std::size_t addr_len = 0;
  if (ucs_status_t s = ucp_worker_get_address(worker_, &addr, &addr_len); s != UCS_OK)
    fail("ucp_worker_get_address", s);
  std::vector<int> displs;
  const std::vector<char> all = allgather(comm, addr, addr_len, displs);
  ucp_worker_release_address(worker_, addr);

  eps_.assign(nranks, nullptr);
  ep_args_.resize(nranks);
  for (int pe = 0; pe < nranks; ++pe) {
    ep_args_[pe] = {this, pe};
    ucp_ep_params_t ep{};
    ep.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(all.data() + displs[pe]);
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = ep_error;
    ep.err_handler.arg = &ep_args_[pe];
    if (ucs_status_t s = ucp_ep_create(worker_, &ep, &eps_[pe]); s != UCS_OK) fail("ucp_ep_create", s);
  }
  sources_.resize(nranks);
  seq_out_.assign(nranks, 0);
  gets_in_flight_.assign(nranks, 0);
  rdma_unflushed_.assign(nranks, 0);
  dirty_.assign(nranks, 0);
  rdma_.assign(nranks, 0);
  data_dirty_.assign(nranks, 0);
  failed_.assign(nranks, "");
  dropped_answers_.assign(nranks, 0);
  isolated_.assign(nranks, "");
  // Wire-up: one answered request to every peer, so that every endpoint is connected before use (and
  // each rank answers the others' requests while it waits for its own answers).
  for (int pe = 0; pe < nranks; ++pe) mark(pe);
  flush_all();
  if (mode != "am") map_heap(comm, heap_bytes);
  choose_modes(mode);
}

std::vector<char> UcxTransport::allgather(MPI_Comm comm, const void* mine, std::size_t bytes,
                                          std::vector<int>& displs) const {
  const char* call = "Context (ucx)";
  int nranks = 0;
  UBEP_MPI_CHECK(rank_, call, MPI_Comm_size(comm, &nranks));
  int my_len = static_cast<int>(bytes);
  std::vector<int> lens(nranks);
  displs.assign(nranks, 0);
  UBEP_MPI_CHECK(rank_, call, MPI_Allgather(&my_len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm));
  int total = 0;
  for (int i = 0; i < nranks; ++i) {
    displs[i] = total;
    total += lens[i];
  }
  std::vector<char> all(static_cast<std::size_t>(total));
  UBEP_MPI_CHECK(rank_, call,
                 MPI_Allgatherv(mine, my_len, MPI_BYTE, all.data(), lens.data(), displs.data(), MPI_BYTE, comm));
  return all;
}

void UcxTransport::map_heap(MPI_Comm comm, std::size_t heap_bytes) {
  const char* call = "Context (ucx)";
  const int nranks = static_cast<int>(eps_.size());
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = base_;
  mp.length = heap_bytes;
  if (ucs_status_t st = ucp_mem_map(context_, &mp, &mem_); st != UCS_OK) fail("ucp_mem_map (the heap)", st);
  void* packed = nullptr;
  std::size_t packed_len = 0;
  if (ucs_status_t st = ucp_rkey_pack(context_, mem_, &packed, &packed_len); st != UCS_OK) fail("ucp_rkey_pack", st);
  std::vector<int> displs;
  std::vector<char> all = allgather(comm, packed, packed_len, displs);
  ucp_rkey_buffer_release(packed);
  const std::uint64_t mine = reinterpret_cast<std::uintptr_t>(base_);
  remote_base_.assign(nranks, 0);
  UBEP_MPI_CHECK(rank_, call, MPI_Allgather(&mine, 1, MPI_UINT64_T, remote_base_.data(), 1, MPI_UINT64_T, comm));
  rkeys_.assign(nranks, nullptr);
  for (int pe = 0; pe < nranks; ++pe) {
    if (ucs_status_t st = ucp_ep_rkey_unpack(eps_[pe], all.data() + displs[pe], &rkeys_[pe]); st != UCS_OK)
      fail("ucp_ep_rkey_unpack", st);
  }
}

void UcxTransport::choose_modes(const std::string& mode) {
  const int nranks = static_cast<int>(eps_.size());
  lanes_.assign(nranks, "");
  why_.assign(nranks, "");
  for (int pe = 0; pe < nranks; ++pe) {
    const Lanes l = lanes_of(eps_[pe]);
    for (const std::string& lane : l.lanes) lanes_[pe] += (lanes_[pe].empty() ? "" : "; ") + lane;
    if (mode == "am") {
      why_[pe] = "UBEP_UCX_MODE=am";
    } else if (mode == "rdma") {
      rdma_[pe] = 1;
      why_[pe] = l.rma_and_amo ? "UBEP_UCX_MODE=rdma"
                               : "UBEP_UCX_MODE=rdma; no lane has hardware RMA and atomics, UCX emulates them";
    } else {
      rdma_[pe] = l.rma_and_amo ? 1 : 0;
      why_[pe] =
          l.rma_and_amo ? "auto: one lane has hardware RMA and atomics" : "auto: no lane has hardware RMA and atomics";
    }
    any_rdma_ = any_rdma_ || rdma_[pe];
  }
}

UcxTransport::~UcxTransport() {
  // Nothing may land any more: the application may have freed a get's destination already (it did not
  // finalize), and the heap's owner is going away.
  closing_ = true;
  for (auto& [token, p] : pending_) {
    if (p.req) ucp_request_cancel(worker_, p.req);
    if (p.desc) ucp_am_data_release(worker_, p.desc);
    p.desc = nullptr;
  }
  for (Source& so : sources_) {
    for (Incoming& in : so.backlog) {
      if (in.req) ucp_request_cancel(worker_, in.req);
      if (in.desc) ucp_am_data_release(worker_, in.desc);
      in.desc = nullptr;
    }
    for (auto& [seq, in] : so.early) {
      if (in.desc) ucp_am_data_release(worker_, in.desc);
      in.desc = nullptr;
    }
  }
  for (Send& s : sends_) {
    if (s.req) ucp_request_cancel(worker_, s.req);
  }
  for (ucp_rkey_h k : rkeys_) {
    if (k) ucp_rkey_destroy(k);
  }
  for (ucp_ep_h ep : eps_) {
    if (!ep) continue;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(req)) {
      for (int i = 0; i < 1000 && ucp_request_check_status(req) == UCS_INPROGRESS; ++i) ucp_worker_progress(worker_);
      ucp_request_free(req);
    }
  }
  for (Send& s : sends_) {
    if (s.req) ucp_request_free(s.req);
  }
  for (auto& [token, p] : pending_) {
    if (p.req) ucp_request_free(p.req);
  }
  for (Source& so : sources_) {
    for (Incoming& in : so.backlog) {
      if (in.req) ucp_request_free(in.req);
    }
  }
  if (worker_) ucp_worker_destroy(worker_);
  if (mem_) ucp_mem_unmap(context_, mem_);
  if (context_) ucp_cleanup(context_);
}

void UcxTransport::fail(const char* what, ucs_status_t status) const {
  throw Error(Errc::internal, message_prefix(rank_, "ucx") + what + " failed: " + ucs_status_string(status));
}

// ---- errors: failed and isolated peers -----------------------------------------------------------------

void UcxTransport::keep_error(std::exception_ptr error) {
  if (!kept_) kept_ = std::move(error);
}

void UcxTransport::raise_kept() {
  if (kept_ && !in_thread_) std::rethrow_exception(std::exchange(kept_, nullptr));
}

void UcxTransport::on_endpoint_error(int pe, ucs_status_t status) {
  // Also how a peer that finalized first looks (it closed its endpoints): no error of its own, only what an
  // operation to the peer then gets (check_peer), and the answers owed to it (drain) that cannot go.
  if (closing_ || !failed_[pe].empty()) return;
  failed_[pe] = std::string("its endpoint failed: ") + ucs_status_string(status) +
                " (it died or finalized, or the "
                "network failed)";
}

void UcxTransport::finish_get(Pending& p, ucs_status_t status) {
  if (status == UCS_OK && std::exchange(fail_next_get_reply_, false)) status = UCS_ERR_ENDPOINT_TIMEOUT;  // tests
  --gets_in_flight_[p.pe];
  p.done = true;
  if (status == UCS_OK) return;
  // Part of the reply may have landed: never reported as a completed get. (Where the endpoint failed, UCX has also
  // called on_endpoint_error, and the peer is unreachable from then on.)
  p.failed = true;
  keep_error(std::make_exception_ptr(Error(
      Errc::unreachable, message_prefix(rank_, p.keep ? "get" : "get_nbi") + "the reply of rank " +
                             std::to_string(p.pe) + " to a get of " + std::to_string(p.bytes) +
                             " bytes failed: " + ucs_status_string(status) + " (the destination holds part of it)")));
}

void UcxTransport::fail_next_get_reply_for_testing() {
  const auto lock = guard();  // the progress thread reads it in drain()
  fail_next_get_reply_ = true;
}

void UcxTransport::check_peer(int pe, const char* what) const {
  if (!failed_[pe].empty()) {
    throw Error(Errc::unreachable,
                message_prefix(rank_, what) + "rank " + std::to_string(pe) + " is unreachable: " + failed_[pe]);
  }
  if (!isolated_[pe].empty()) {
    throw Error(Errc::protocol, message_prefix(rank_, what) + "rank " + std::to_string(pe) +
                                    " was isolated after a protocol violation: " + isolated_[pe]);
  }
}

void UcxTransport::violation(int src, const Msg& m, const std::string& what) {
  const bool known = src >= 0 && src < nranks_;
  std::string text = "a " + kind_name(m.kind) + " message from " +
                     (known ? "rank " + std::to_string(src) : std::string("an unknown source")) +
                     " breaks the wire protocol: " + what + "; it was dropped";
  if (known && isolated_[src].empty()) {
    isolated_[src] = text;
    text += ", and rank " + std::to_string(src) + " is isolated (its messages dropped, operations to it refused)";
  }
  keep_error(std::make_exception_ptr(Error(Errc::protocol, message_prefix(rank_, "ucx") + text)));
}

// ---- sending ----------------------------------------------------------------------------------------------

UcxTransport::Msg UcxTransport::header(std::uint8_t kind) const {
  Msg m{};
  m.src = static_cast<std::uint32_t>(rank_);
  m.kind = kind;
  m.version = kVersion;
  return m;
}

void UcxTransport::mark(int pe) {
  if (!dirty_[pe]) {
    dirty_[pe] = 1;
    dirty_list_.push_back(pe);
  }
}

void UcxTransport::throttle(int pe, const char* what) {
  // Answers and forwards sent from inside progress() are never held back (the progress they would wait
  // for is the caller's own).
  if (in_progress_) return;
  if (rdma_[pe] && ++rdma_unflushed_[pe] >= kMaxInFlight) {
    // UCX completes emulated (and bcopy) RMA at once and queues it inside: only a flush bounds that queue.
    rdma_unflushed_[pe] = 0;
    void* req = flush_ep(pe);
    wait(what, pe, [&] { return request_status(req) != UCS_INPROGRESS; });
    finish_flush(req, pe);
  }
  if (sends_.size() + pending_.size() < kMaxInFlight) return;
  progress();
  if (sends_.size() + pending_.size() < kMaxInFlight) return;
  wait(what, pe, [this] { return sends_.size() + pending_.size() <= kMaxInFlight / 2; });
}

void UcxTransport::send(int pe, Msg hdr, const void* buf, std::size_t bytes, bool wait_local, const char* what) {
  if (!is_answer(hdr.kind)) throttle(pe, what);
  send_now(pe, hdr, buf, bytes, wait_local, what);
}

void UcxTransport::send_now(int pe, const Msg& hdr, const void* buf, std::size_t bytes, bool wait_local,
                            const char* what) {
  check_peer(pe, what);
  sends_.push_back(Send{hdr, nullptr, pe});
  Send& s = sends_.back();
  // The sequence number is taken only for a message that goes out: one that fails at once leaves no gap.
  if (!is_answer(hdr.kind)) s.hdr.seq = seq_out_[pe] + 1;
  ucp_request_param_t p{};
  void* req = ucp_am_send_nbx(eps_[pe], kAmId, &s.hdr, sizeof s.hdr, buf, bytes, &p);
  if (!UCS_PTR_IS_ERR(req) && !is_answer(hdr.kind)) ++seq_out_[pe];
  track(s, req, wait_local, what);
}

void UcxTransport::send_raw_for_testing(int pe, const Msg& m, const void* payload, std::size_t bytes) {
  const auto lock = guard();
  sends_.push_back(Send{m, nullptr, pe});
  ucp_request_param_t p{};
  track(sends_.back(), ucp_am_send_nbx(eps_[pe], kAmId, &sends_.back().hdr, sizeof m, payload, bytes, &p), true,
        "send_raw_for_testing");
}

std::uint64_t UcxTransport::take_sequence_for_testing(int pe) {
  const auto lock = guard();
  return ++seq_out_[pe];
}

std::uint64_t UcxTransport::track(Send& s, void* req, bool wait_local, const char* what) {
  const int pe = s.pe;
  if (UCS_PTR_IS_ERR(req)) {
    sends_.pop_back();
    const ucs_status_t st = UCS_PTR_STATUS(req);
    if (failed_[pe].empty()) failed_[pe] = std::string("a send to it failed: ") + ucs_status_string(st);
    throw Error(Errc::unreachable, message_prefix(rank_, what) + "an operation to rank " + std::to_string(pe) +
                                       " failed at once: " + ucs_status_string(st) + " (rank " + std::to_string(pe) +
                                       " is unreachable from now on)");
  }
  if (!req) {  // completed in the call
    const std::uint64_t reply = s.reply;
    sends_.pop_back();
    return reply;
  }
  s.req = req;
  if (!wait_local) return 0;
  // This entry is the waiter's: reap_sends() (inside progress) leaves it alone. If the wait times out, the
  // send stays in flight as any other, reaped when UCX completes it (a later quiet() waits for it).
  s.held = true;
  try {
    wait(what, pe, [&s] { return ucp_request_check_status(s.req) != UCS_INPROGRESS; });
  } catch (...) {
    s.held = false;
    throw;
  }
  const ucs_status_t st = ucp_request_check_status(s.req);
  const std::uint64_t reply = s.reply;
  ucp_request_free(s.req);
  for (auto it = sends_.begin(); it != sends_.end(); ++it) {
    if (&*it == &s) {
      sends_.erase(it);
      break;
    }
  }
  if (st != UCS_OK) {
    if (failed_[pe].empty()) failed_[pe] = std::string("a send to it failed: ") + ucs_status_string(st);
    throw Error(Errc::unreachable, message_prefix(rank_, what) + "an operation to rank " + std::to_string(pe) +
                                       " failed: " + ucs_status_string(st));
  }
  return reply;
}

std::uint64_t UcxTransport::expect(std::uint8_t kind, void* dst, std::size_t bytes, int pe) {
  const std::uint64_t token = next_token_++;
  Pending& p = pending_[token];
  p.kind = kind;
  p.dst = dst;
  p.bytes = bytes;
  p.pe = pe;
  return token;
}

std::uint64_t UcxTransport::request(int pe, Msg m, std::uint8_t answer, void* dst, std::size_t dst_bytes, bool keep,
                                    const char* what) {
  check_peer(pe, what);
  throttle(pe, what);  // before anything is registered: a throttle that times out leaves nothing behind
  m.token = expect(answer, dst, dst_bytes, pe);
  pending_[m.token].keep = keep;
  if (answer == get_reply) ++gets_in_flight_[pe];
  try {
    send_now(pe, m, nullptr, 0, false, what);
  } catch (...) {
    pending_.erase(m.token);
    if (answer == get_reply) --gets_in_flight_[pe];
    throw;
  }
  return m.token;
}

void UcxTransport::await(const char* what, int pe, std::uint64_t token) {
  try {
    wait(what, pe, [&] { return pending_.at(token).done; });
  } catch (...) {
    // Nobody waits for it any more: its answer erases it (and uncounts a get) when it comes.
    auto it = pending_.find(token);
    if (it != pending_.end()) {
      if (it->second.done) {
        pending_.erase(it);
      } else {
        it->second.keep = false;
      }
    }
    throw;
  }
}

void UcxTransport::rdma_put(std::size_t offset, const void* src, std::size_t bytes, int pe, bool wait_local,
                            const char* what) {
  check_peer(pe, what);
  throttle(pe, what);
  sends_.push_back(Send{Msg{}, nullptr, pe});
  ucp_request_param_t p{};
  track(sends_.back(), ucp_put_nbx(eps_[pe], src, bytes, remote_base_[pe] + offset, rkeys_[pe], &p), wait_local, what);
}

void UcxTransport::rdma_get(void* dst, std::size_t offset, std::size_t bytes, int pe, bool wait, const char* what) {
  check_peer(pe, what);
  throttle(pe, what);
  sends_.push_back(Send{Msg{}, nullptr, pe});
  ucp_request_param_t p{};
  track(sends_.back(), ucp_get_nbx(eps_[pe], dst, bytes, remote_base_[pe] + offset, rkeys_[pe], &p), wait, what);
}

std::uint64_t UcxTransport::rdma_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, std::uint64_t compare,
                                        int pe, bool fetching, const char* what) {
  check_peer(pe, what);
  throttle(pe, what);
  ucp_worker_fence(worker_);  // release: after every earlier operation of this rank
  sends_.push_back(Send{Msg{}, nullptr, pe});
  Send& s = sends_.back();
  s.operand = operand;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  p.datatype = ucp_dt_make_contig(sizeof(std::uint64_t));
  ucp_atomic_op_t uop = UCP_ATOMIC_OP_ADD;
  bool reply = true;
  switch (op) {
    case AtomicOp::fetch_add: break;
    case AtomicOp::add: reply = false; break;
    case AtomicOp::swap:
    case AtomicOp::set: uop = UCP_ATOMIC_OP_SWAP; break;  // UCP has no non-fetching set: a swap, reply unused
    case AtomicOp::compare_swap:  // buffer = the compare value, reply buffer = the new one, then the old one
      uop = UCP_ATOMIC_OP_CSWAP;
      s.operand = compare;
      s.reply = operand;
      break;
    case AtomicOp::fetch:
      uop = UCP_ATOMIC_OP_OR;
      s.operand = 0;
      break;
  }
  if (reply) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER;
    p.reply_buffer = &s.reply;
  }
  return track(s, ucp_atomic_op_nbx(eps_[pe], uop, &s.operand, 1, remote_base_[pe] + offset, rkeys_[pe], &p), fetching,
               what);
}

void UcxTransport::rdma_signal(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) {
  mark(pe);
  if (op == AtomicOp::add) {
    rdma_atomic(op, offset, operand, 0, pe, false, "put_signal");
    return;
  }
  check_peer(pe, "put_signal");
  throttle(pe, "put_signal");
  ucp_worker_fence(worker_);
  sends_.push_back(Send{Msg{}, nullptr, pe});
  Send& s = sends_.back();
  s.operand = operand;
  ucp_request_param_t p{};
  track(s, ucp_put_nbx(eps_[pe], &s.operand, sizeof s.operand, remote_base_[pe] + offset, rkeys_[pe], &p), false,
        "put_signal");
}

void UcxTransport::fence() {
  const auto lock = guard();                 // the progress thread may be inside the worker
  if (any_rdma_) ucp_worker_fence(worker_);  // am: one ordered stream per peer already
}

void UcxTransport::reap_sends() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    if (it->held) {
      ++it;
      continue;
    }
    const ucs_status_t st = request_status(it->req);
    if (st == UCS_INPROGRESS) {
      ++it;
      continue;
    }
    if (it->req) ucp_request_free(it->req);
    if (st != UCS_OK) {
      const int pe = it->pe;
      if (failed_[pe].empty()) {
        failed_[pe] = std::string("a message to it failed: ") + ucs_status_string(st);
        keep_error(std::make_exception_ptr(Error(
            Errc::unreachable, message_prefix(rank_, "ucx") + "a message to rank " + std::to_string(pe) + " failed: " +
                                   ucs_status_string(st) + " (rank " + std::to_string(pe) + " is unreachable)")));
      }
    }
    it = sends_.erase(it);
  }
}

void UcxTransport::wait(const char* what, int pe, const std::function<bool()>& done) {
  const auto start = std::chrono::steady_clock::now();
  Backoff backoff(poll_);
  for (;;) {
    progress();
    if (done()) return;
    check_peer(pe, what);  // a peer that failed (or was isolated) meanwhile never answers
    backoff.pause();
    if (timeout_.count() > 0 && (backoff.polls() & 15) == 0) {
      const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
      if (waited > timeout_) {
        throw Error(Errc::timeout, message_prefix(rank_, what) + "no answer from rank " + std::to_string(pe) +
                                       " over ucx within " + std::to_string(waited.count()) +
                                       " s (UBEP_WAIT_TIMEOUT); rank " + std::to_string(pe) +
                                       " must progress for messages to land (a ubep call or its progress thread: "
                                       "stalled, dead, or UBEP_PROGRESS_THREAD=0 while it computes); the "
                                       "operation stays in flight and a later quiet() completes it");
      }
    }
  }
}

// ---- the operations ---------------------------------------------------------------------------------------

void UcxTransport::put(std::size_t offset, const void* src, std::size_t bytes, int pe) {
  send_put(offset, src, bytes, pe, true, "put");
}

void UcxTransport::put_nbi(std::size_t offset, const void* src, std::size_t bytes, int pe) {
  send_put(offset, src, bytes, pe, false, "put_nbi");
}

void UcxTransport::send_put(std::size_t offset, const void* src, std::size_t bytes, int pe, bool wait_local,
                            const char* what) {
  const auto lock = guard();
  raise_kept();
  check_peer(pe, what);
  mark(pe);
  data_dirty_[pe] = 1;
  if (rdma_[pe]) return rdma_put(offset, src, bytes, pe, wait_local, what);
  Msg m = header(put_data);
  m.offset = offset;
  m.bytes = bytes;
  send(pe, m, src, bytes, wait_local, what);
}

void UcxTransport::get(void* dst, std::size_t offset, std::size_t bytes, int pe) {
  const auto lock = guard();
  raise_kept();
  check_peer(pe, "get");
  if (rdma_[pe]) {
    mark(pe);
    return rdma_get(dst, offset, bytes, pe, true, "get");
  }
  mark(pe);
  Msg m = header(get_req);
  m.offset = offset;
  m.bytes = bytes;
  const std::uint64_t token = request(pe, m, get_reply, dst, bytes, true, "get");
  await("get", pe, token);
  const bool failed = pending_.at(token).failed;
  pending_.erase(token);
  if (failed) {  // the error finish_get kept (or an earlier one)
    raise_kept();
    throw Error(Errc::unreachable, message_prefix(rank_, "get") + "the reply of rank " + std::to_string(pe) +
                                       " failed (the destination holds part of it)");
  }
}

void UcxTransport::get_nbi(void* dst, std::size_t offset, std::size_t bytes, int pe) {
  const auto lock = guard();
  raise_kept();
  check_peer(pe, "get_nbi");
  mark(pe);
  if (rdma_[pe]) return rdma_get(dst, offset, bytes, pe, false, "get_nbi");
  Msg m = header(get_req);
  m.offset = offset;
  m.bytes = bytes;
  (void)request(pe, m, get_reply, dst, bytes, false, "get_nbi");
}

std::uint64_t UcxTransport::fetch_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, std::uint64_t compare,
                                         int pe) {
  const auto lock = guard();
  raise_kept();
  check_peer(pe, "atomic");
  mark(pe);
  if (rdma_[pe]) return rdma_atomic(op, offset, operand, compare, pe, true, "atomic");
  Msg m = header(fetch_req);
  m.op = static_cast<std::uint8_t>(op);
  m.offset = offset;
  m.value = operand;
  m.compare = compare;
  const std::uint64_t token = request(pe, m, fetch_reply, nullptr, 0, true, "atomic");
  await("atomic", pe, token);
  const std::uint64_t value = pending_.at(token).value;
  pending_.erase(token);
  return value;
}

void UcxTransport::post_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) {
  const auto lock = guard();
  raise_kept();
  check_peer(pe, "atomic");
  mark(pe);
  if (rdma_[pe]) {
    rdma_atomic(op, offset, operand, 0, pe, false, "atomic");
    return;
  }
  Msg m = header(atomic_post);
  m.op = static_cast<std::uint8_t>(op);
  m.offset = offset;
  m.value = operand;
  send(pe, m, nullptr, 0, false, "atomic");
}

void UcxTransport::post_signal(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) {
  const auto lock = guard();
  raise_kept();
  // The stream (am) or a fence (rdma) orders the signal after every earlier operation to pe: nothing to wait for.
  if (rdma_[pe]) return rdma_signal(op, offset, operand, pe);
  post_atomic(op, offset, operand, pe);
}

bool UcxTransport::sends_done(int pe) {
  reap_sends();
  return std::none_of(sends_.begin(), sends_.end(), [pe](const Send& s) { return s.pe == pe; });
}

bool UcxTransport::flushed(int pe, std::uint64_t token) {
  return pending_.at(token).done && gets_in_flight_[pe] == 0 && sends_done(pe);
}

bool UcxTransport::put_with_signal(std::size_t offset, const void* src, std::size_t bytes, AtomicOp op,
                                   std::size_t sig_offset, std::uint64_t value, int pe, bool wait_local) {
  const auto lock = guard();
  raise_kept();
  check_peer(pe, wait_local ? "put_signal" : "put_signal_nbi");
  mark(pe);
  if (bytes) data_dirty_[pe] = 1;
  if (rdma_[pe]) {  // put, fence, signal: no message for the target's CPU on a hardware lane
    rdma_put(offset, src, bytes, pe, wait_local, wait_local ? "put_signal" : "put_signal_nbi");
    rdma_signal(op, sig_offset, value, pe);
    return true;
  }
  Msg m = header(put_signal);
  m.offset = offset;
  m.bytes = bytes;
  m.op = static_cast<std::uint8_t>(op);
  m.compare = sig_offset;
  m.value = value;
  send(pe, m, src, bytes, wait_local, wait_local ? "put_signal" : "put_signal_nbi");
  return true;
}

void UcxTransport::flush(int pe) {
  const auto lock = guard();
  raise_kept();
  if (!dirty_[pe]) return;
  flush_peers({pe}, "flush");
}

void UcxTransport::flush_local(int pe) {
  const auto lock = guard();
  raise_kept();
  const auto done = [&] { return gets_in_flight_[pe] == 0 && sends_done(pe); };
  if (!done()) wait("flush_local", pe, done);
}

void UcxTransport::flush_all() {
  const auto lock = guard();
  raise_kept();
  const std::vector<int> peers = dirty_list_;
  flush_peers(peers, "quiet");
}

void UcxTransport::order_before_signal(int pe) {
  const auto lock = guard();
  raise_kept();
  std::vector<int> peers;
  for (int q : dirty_list_) {
    if (q != pe && data_dirty_[q]) peers.push_back(q);
  }
  if (!peers.empty()) flush_peers(peers, "signal_op");
}

void UcxTransport::flush_peers(const std::vector<int>& peers, const char* what) {
  // All requests first, then all answers: one round trip for every peer together. An rdma peer's
  // request is ucp_ep_flush_nbx (its completion proves remote completion); an am peer's, a message.
  struct Flush {
    int pe;
    std::uint64_t token;
    void* req;
  };
  std::vector<Flush> flushes;
  // Whatever throws, no request is left behind unanswered-for: flush answers of peers not yet waited for are
  // left to erase themselves, ucp flush requests to be freed.
  const auto abandon = [&](std::size_t from) {
    for (std::size_t i = from; i < flushes.size(); ++i) {
      if (flushes[i].req) {
        ucp_request_free(flushes[i].req);  // UCX completes it, then frees it
      } else if (auto it = pending_.find(flushes[i].token); it != pending_.end()) {
        if (it->second.done) {
          pending_.erase(it);
        } else {
          it->second.keep = false;
        }
      }
    }
  };
  try {
    for (int pe : peers) {
      if (rdma_[pe]) {
        check_peer(pe, what);
        flushes.push_back({pe, 0, flush_ep(pe)});
        continue;
      }
      Msg m = header(flush_req);
      flushes.push_back({pe, request(pe, m, flush_reply, nullptr, 0, true, what), nullptr});
    }
  } catch (...) {
    abandon(0);
    throw;
  }
  for (std::size_t i = 0; i < flushes.size(); ++i) {
    const Flush& f = flushes[i];
    try {
      if (rdma_[f.pe]) {
        wait(what, f.pe, [&] { return request_status(f.req) != UCS_INPROGRESS && sends_done(f.pe); });
        flushes[i].req = nullptr;
        finish_flush(f.req, f.pe);
      } else {
        wait(what, f.pe, [&] { return flushed(f.pe, f.token); });
        pending_.erase(f.token);
      }
    } catch (...) {
      abandon(i);
      throw;
    }
    unmark(f.pe);
  }
}

void UcxTransport::unmark(int pe) {
  dirty_[pe] = 0;
  data_dirty_[pe] = 0;
  dirty_list_.erase(std::remove(dirty_list_.begin(), dirty_list_.end(), pe), dirty_list_.end());
}

// ---- target side ----------------------------------------------------------------------------------

ucs_status_t UcxTransport::on_message(const Msg& m, void* data, std::size_t length, bool rndv) {
  if (closing_) return UCS_OK;  // dropped (a rendezvous is released by UCX)
  const std::string why = check_message(m, length, rndv, Limits{nranks_, heap_bytes_});
  const int src = m.src < static_cast<std::uint32_t>(nranks_) ? static_cast<int>(m.src) : -1;
  if (!why.empty()) {
    violation(src, m, why);
    return UCS_OK;
  }
  if (!isolated_[src].empty()) return UCS_OK;  // everything of an isolated peer is dropped
  if (is_answer(m.kind)) return on_answer(m, data, length, rndv);
  Source& so = sources_[src];
  if (m.seq < so.next || m.seq - so.next >= kReorderWindow || so.early.count(m.seq) != 0) {
    violation(src, m,
              "field 'seq' = " + std::to_string(m.seq) + ": expected " + std::to_string(so.next) +
                  (m.seq < so.next || so.early.count(m.seq) != 0 ? " (a duplicate)" : " (too far ahead)"));
    return UCS_OK;
  }
  const bool in_turn = m.seq == so.next;
  if (in_turn && !rndv && so.backlog.empty()) {  // the common case: apply at once
    ++so.next;
    apply(m, data, length);
    if (so.early.empty()) return UCS_OK;
  } else {
    Incoming in;
    in.m = m;
    in.rndv = rndv;
    if (rndv) {
      in.desc = data;
    } else {
      const auto* b = static_cast<const std::byte*>(data);
      in.data.assign(b, b + length);
    }
    if (in_turn) {
      ++so.next;
      so.backlog.push_back(std::move(in));
    } else {
      so.early.emplace(m.seq, std::move(in));
    }
  }
  // Whatever arrived early and is now in turn joins the backlog (drain() applies it).
  for (auto it = so.early.begin(); it != so.early.end() && it->first == so.next; it = so.early.erase(it)) {
    so.backlog.push_back(std::move(it->second));
    ++so.next;
  }
  if (std::find(backlogged_.begin(), backlogged_.end(), src) == backlogged_.end()) backlogged_.push_back(src);
  return rndv ? UCS_INPROGRESS : UCS_OK;
}

ucs_status_t UcxTransport::on_answer(const Msg& m, void* data, std::size_t length, bool rndv) {
  // Answers to this rank: not part of any source's ordered stream of writes.
  const int src = static_cast<int>(m.src);
  auto it = pending_.find(m.token);
  if (it == pending_.end() || it->second.pe != src || it->second.kind != m.kind) {
    violation(src, m,
              "field 'token' = " + std::to_string(m.token) +
                  (it == pending_.end()   ? ": this rank awaits no such answer"
                   : it->second.pe != src ? ": it was asked of rank " + std::to_string(it->second.pe)
                                          : ": it awaits a " + kind_name(it->second.kind)));
    return UCS_OK;
  }
  Pending& p = it->second;
  if (m.kind == fetch_reply) p.value = m.value;
  if (m.kind == get_reply) {
    if (length != p.bytes) {
      violation(src, m,
                "field 'length' = " + std::to_string(length) + ": the get asked for " + std::to_string(p.bytes));
      return UCS_OK;  // the get stays unanswered: its wait times out naming the peer
    }
    if (rndv) {
      p.desc = data;  // received into p.dst after the handlers ran
      get_rndv_tokens_.push_back(m.token);
      return UCS_INPROGRESS;
    }
    std::memcpy(p.dst, data, length);
    --gets_in_flight_[p.pe];
  }
  if (!p.keep) {
    pending_.erase(it);  // get_nbi, or a waiter that gave up: nobody looks at this entry again
    return UCS_OK;
  }
  p.done = true;
  return UCS_OK;
}

void UcxTransport::apply(const Msg& m, const void* data, std::size_t length) {
  // check_message passed: every offset and length is inside the heap, every word aligned, every op valid.
  const int src = static_cast<int>(m.src);
  switch (m.kind) {
    case put_data:
      if (length) std::memcpy(base_ + m.offset, data, length);
      break;
    case put_signal:
      if (length) std::memcpy(base_ + m.offset, data, length);
      apply_atomic(word(base_, m.compare), static_cast<AtomicOp>(m.op), m.value, 0);  // release: after the data
      break;
    case atomic_post: apply_atomic(word(base_, m.offset), static_cast<AtomicOp>(m.op), m.value, 0); break;
    case get_req: {
      Msg r = header(get_reply);
      r.token = m.token;
      answer(src, r, base_ + m.offset, m.bytes);
      break;
    }
    case fetch_req: {
      Msg r = header(fetch_reply);
      r.token = m.token;
      r.value = apply_atomic(word(base_, m.offset), static_cast<AtomicOp>(m.op), m.value, m.compare);
      answer(src, r, nullptr, 0);
      break;
    }
    case flush_req: {
      Msg r = header(flush_reply);
      r.token = m.token;
      answer(src, r, nullptr, 0);
      break;
    }
    default: break;
  }
}

void UcxTransport::answer(int to, Msg reply, const void* buf, std::size_t bytes) {
  owed_.push_back(Answer{to, reply, buf, bytes});  // sent after the handlers ran, not from inside one
}

void UcxTransport::drain_source(int src) {
  std::deque<Incoming>& q = sources_[src].backlog;
  while (!q.empty() && isolated_[src].empty()) {
    Incoming& in = q.front();
    if (in.rndv) {
      if (in.desc) {
        ucp_request_param_t rp{};
        void* req = ucp_am_recv_data_nbx(worker_, in.desc, base_ + in.m.offset, in.m.bytes, &rp);
        in.desc = nullptr;
        if (UCS_PTR_IS_ERR(req)) {
          keep_error(std::make_exception_ptr(
              Error(Errc::unreachable, message_prefix(rank_, "ucx") + "receiving a put of rank " + std::to_string(src) +
                                           " failed: " + ucs_status_string(UCS_PTR_STATUS(req)))));
          q.pop_front();
          continue;
        }
        in.req = req;
      }
      if (in.req) {
        if (ucp_request_check_status(in.req) == UCS_INPROGRESS) return;
        ucp_request_free(in.req);
        in.req = nullptr;
      }
      if (in.m.kind == put_signal) {  // the data is in: now the signal
        apply_atomic(word(base_, in.m.compare), static_cast<AtomicOp>(in.m.op), in.m.value, 0);
      }
    } else {
      apply(in.m, in.data.data(), in.data.size());
    }
    q.pop_front();
  }
  if (!isolated_[src].empty()) {  // an isolated source's rendezvous data is released, never received
    for (Incoming& in : q) {
      if (in.desc) ucp_am_data_release(worker_, in.desc);
      in.desc = nullptr;
    }
  }
}

void UcxTransport::drain() {
  // Rendezvous receives of get replies, straight into the caller's buffer.
  for (std::uint64_t token : get_rndv_tokens_) {
    auto it = pending_.find(token);
    if (it == pending_.end()) continue;
    Pending& p = it->second;
    ucp_request_param_t rp{};
    void* req = ucp_am_recv_data_nbx(worker_, p.desc, p.dst, p.bytes, &rp);
    p.desc = nullptr;
    if (UCS_PTR_IS_PTR(req)) {
      p.req = req;
      continue;
    }
    finish_get(p, UCS_PTR_STATUS(req));  // received in the call (UCS_OK), or failed at once
    if (!p.keep) pending_.erase(it);
  }
  get_rndv_tokens_.clear();
  for (auto it = pending_.begin(); it != pending_.end();) {
    Pending& p = it->second;
    const ucs_status_t st = p.req ? ucp_request_check_status(p.req) : UCS_INPROGRESS;
    if (st != UCS_INPROGRESS) {
      ucp_request_free(p.req);
      p.req = nullptr;
      finish_get(p, st);
      if (!p.keep) {
        it = pending_.erase(it);
        continue;
      }
    }
    ++it;
  }
  // Each source's backlog, in order: a rendezvous at the head holds back everything behind it.
  for (std::size_t i = 0; i < backlogged_.size();) {
    const int src = backlogged_[i];
    drain_source(src);
    const Source& so = sources_[src];
    if (so.backlog.empty() && so.early.empty()) {
      backlogged_[i] = backlogged_.back();
      backlogged_.pop_back();
    } else {
      ++i;
    }
  }
  // The answers owed, in the order they were earned. One that cannot go out (its peer failed) is dropped; the
  // others still go (a dead peer must not make every live one wait and blame this rank).
  std::vector<Answer> owed;
  owed.swap(owed_);
  for (const Answer& a : owed) {
    if (!isolated_[a.to].empty()) continue;
    if (!failed_[a.to].empty()) {
      if (dropped_answers_[a.to]++ == 0) {  // said once per peer
        keep_error(std::make_exception_ptr(
            Error(Errc::unreachable, message_prefix(rank_, "ucx") + "rank " + std::to_string(a.to) +
                                         " is unreachable (" + failed_[a.to] + "): the answers this rank owes it (" +
                                         kind_name(a.m.kind) + ", ...) are dropped; the other peers are served")));
      }
      continue;
    }
    try {
      send(a.to, a.m, a.buf, a.bytes, false, "ucx answer");
    } catch (const Error&) {
      keep_error(std::current_exception());
    }
  }
}

void UcxTransport::progress() {
  const auto lock = guard();
  if (!in_thread_) app_polls_.fetch_add(1, std::memory_order_relaxed);  // the caller's thread serves the worker
  if (in_progress_) return;  // a send inside drain() must not re-enter the handlers
  in_progress_ = true;
  try {
    while (ucp_worker_progress(worker_) != 0) {
    }
    drain();
    reap_sends();
  } catch (...) {
    in_progress_ = false;
    keep_error(std::current_exception());
  }
  in_progress_ = false;
  raise_kept();
}

void UcxTransport::poll_keeping_errors() noexcept {
  const auto lock = guard();
  app_polls_.fetch_add(1, std::memory_order_relaxed);
  thread_pass();
}

void UcxTransport::thread_pass() noexcept {
  const auto lock = guard();
  in_thread_ = true;
  try {
    progress();
  } catch (...) {
    keep_error(std::current_exception());
  }
  in_thread_ = false;
}

bool UcxTransport::arm() noexcept {
  const auto lock = guard();
  return ucp_worker_arm(worker_) == UCS_OK;
}

bool UcxTransport::busy() noexcept {
  const auto lock = guard();
  return !sends_.empty() || !backlogged_.empty() ||
         std::any_of(pending_.begin(), pending_.end(), [](const auto& p) { return p.second.req != nullptr; });
}

void* UcxTransport::flush_ep(int pe) {
  ucp_request_param_t p{};
  void* req = ucp_ep_flush_nbx(eps_[pe], &p);
  if (UCS_PTR_IS_ERR(req)) fail("ucp_ep_flush_nbx", UCS_PTR_STATUS(req));
  return req;
}

void UcxTransport::finish_flush(void* req, int pe) {
  const ucs_status_t st = request_status(req);
  if (req) ucp_request_free(req);
  if (st != UCS_OK) {
    throw Error(Errc::unreachable, message_prefix(rank_, "flush") + "ucp_ep_flush_nbx to rank " + std::to_string(pe) +
                                       " failed: " + ucs_status_string(st));
  }
}

std::string UcxTransport::describe() const {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  const auto rdma_peers = static_cast<std::size_t>(std::count(rdma_.begin(), rdma_.end(), 1));
  std::string modes = rdma_peers == 0              ? "mode am (active messages)"
                      : rdma_peers == rdma_.size() ? "mode rdma (put, fence, atomics)"
                                                   : "mode rdma to " + std::to_string(rdma_peers) + " of " +
                                                         std::to_string(rdma_.size()) + " ranks, am to the others";
  return "UCX " + std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release) + ", " + modes;
}

std::string UcxTransport::describe_peer(int pe) const {
  return std::string(rdma_[pe] ? "rdma" : "am") + " (" + why_[pe] + "); lanes " + lanes_[pe];
}

}  // namespace ubep::detail
