// UcxTransport: the context, the worker and an endpoint to every rank; worker addresses and heap rkeys exchanged
// over MPI; the mode of each peer chosen from its lanes (ucx_transport.hpp); teardown; describe() for ubep-info.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/log.hpp"
#include "base/mpi_check.hpp"
#include "transports/ucx/ucx_transport.hpp"
#include "ubep/error.hpp"

namespace ubep::detail {

namespace {

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
                           bool threaded, std::size_t eager_max)
    : rank_(rank),
      nranks_(nranks),
      threaded_(threaded),
      base_(base),
      heap_bytes_(heap_bytes),
      timeout_(timeout),
      poll_(poll),
      eager_max_(eager_max) {
  ucp_config_t* config = nullptr;
  if (ucs_status_t st = ucp_config_read(nullptr, nullptr, &config); st != UCS_OK) fail("ucp_config_read", st);
  // UCX's keepalive (on with peer error handling) declares an endpoint dead when the peer's worker
  // goes unprogressed for long (a Context idle while another one works, a long compute): ubep's own
  // deadlines detect a peer that is gone, so it is off unless UCX_KEEPALIVE_INTERVAL asks for it.
  if (!std::getenv("UCX_KEEPALIVE_INTERVAL")) ucp_config_modify(config, "KEEPALIVE_INTERVAL", "inf");
  // TCP's segments (a transport's setting: ucp_config_modify takes it without the "TCP_" prefix): a message of
  // up to 16 KiB goes in one copy (8 KiB by default: an 8 KiB message took the slower zero-copy path), and an
  // eager one of up to 512 KiB in one segment (64 KiB by default: at 64 - 256 KiB each further segment cost
  // about 20 us). A receiving endpoint holds one segment while a message is partly in.
  // Measured across two emulated nodes (docs/MULTINODE.md, "The ucx route by size").
  if (!std::getenv("UCX_TCP_TX_SEG_SIZE")) ucp_config_modify(config, "TX_SEG_SIZE", "16K");
  if (!std::getenv("UCX_TCP_RX_SEG_SIZE")) ucp_config_modify(config, "RX_SEG_SIZE", "512K");
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
