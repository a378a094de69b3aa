// The BSP baseline, as Megatron-style dispatchers do it: MPI_Alltoall of per-(destination, expert)
// counts, one pass packing tokens by (destination, expert), MPI_Alltoallv of tokens, all experts
// compute, MPI_Alltoallv of outputs back, weighted sum. Same interface and same reduction as ubep's.
#include <climits>
#include <cstring>

#include "moe/layer_impl.hpp"

namespace ubep::moe {
namespace {
int as_int(std::size_t v, int rank, const char* what) {
  if (v > static_cast<std::size_t>(INT_MAX)) {
    throw Error(Errc::overflow, "ubep: rank " + std::to_string(rank) + ": moe::BspLayer: " + what + " of " +
                                    std::to_string(v) + " bytes exceeds MPI's int count");
  }
  return static_cast<int>(v);
}
}  // namespace

BspImpl::BspImpl(Context& ctx, const Config& config) : LayerImpl(ctx, config, "moe::BspLayer") {}
BspImpl::~BspImpl() = default;
std::size_t BspImpl::buffer_bytes() const { return peak_bytes_; }

void BspImpl::send(HandleState& h, std::span<const std::byte> tokens, std::span<const float> scales) {
  const int P = size_, L = map_.max_local();
  MPI_Comm comm = ctx_.comm();
  // Counts: [P x L] ints to every rank.
  std::vector<int> rc(static_cast<std::size_t>(P) * L);
  check_mpi(MPI_Alltoall(h.send_counts.data(), L, MPI_INT, rc.data(), L, MPI_INT, comm), rank_, "moe::BspLayer",
            "MPI_Alltoall");
  // Pack by (destination, local expert, j): exactly the order of coffset.
  const std::size_t total = h.coffset.empty() ? 0 : h.coffset.back() + h.send_counts.back();
  // Buffers persist across calls (sendbuf_ and the recycled handle vectors): a fresh vector per call would
  // page-fault hundreds of MiB and make the baseline slower than the MPI under it.
  std::vector<std::byte>& sendbuf = sendbuf_;
  sendbuf.resize(total * token_bytes_);
  h.bsp_recv.swap(recv_);
  h.bsp_csend.swap(csend_);
  h.bsp_crecv.swap(crecv_);
  std::vector<int> scounts(P), sdispl(P), rcounts(P), rdispl(P);
  for (int d = 0; d < P; ++d) {
    std::size_t dest_tokens = 0;
    for (int le = 0; le < L; ++le) {
      const std::size_t b = static_cast<std::size_t>(d) * L + le;
      const auto& toks = h.batch_tokens[b];
      pack(toks, sendbuf.data() + h.coffset[b] * token_bytes_, tokens, scales);
      dest_tokens += toks.size();
    }
    scounts[d] = as_int(dest_tokens * token_bytes_, rank_, "send block");
    count(true, d, dest_tokens * payload_bytes());
    sdispl[d] = as_int(h.coffset[static_cast<std::size_t>(d) * L] * token_bytes_, rank_, "send displacement");
  }
  h.bsp_rdispl_tokens.assign(P, 0);
  std::size_t rtotal = 0;
  for (int s = 0; s < P; ++s) {
    std::size_t from = 0;
    for (int le = 0; le < L; ++le) {
      h.recv_counts[static_cast<std::size_t>(le) * P + s] = rc[static_cast<std::size_t>(s) * L + le];
      from += rc[static_cast<std::size_t>(s) * L + le];
    }
    h.bsp_rdispl_tokens[s] = static_cast<int>(rtotal);
    rcounts[s] = as_int(from * token_bytes_, rank_, "receive block");
    rdispl[s] = as_int(rtotal * token_bytes_, rank_, "receive displacement");
    rtotal += from;
  }
  h.bsp_recv.resize(rtotal * token_bytes_);
  check_mpi(MPI_Alltoallv(sendbuf.data(), scounts.data(), sdispl.data(), MPI_BYTE, h.bsp_recv.data(), rcounts.data(),
                          rdispl.data(), MPI_BYTE, comm),
            rank_, "moe::BspLayer", "MPI_Alltoallv (tokens)");
  // Regroup by local expert: inside each source's block, tokens are ordered by local expert.
  for (int le = 0; le < local_experts(); ++le) {
    regroup(h, le, [&](int s) {
      std::size_t before = 0;
      for (int l2 = 0; l2 < le; ++l2) before += h.recv_counts[static_cast<std::size_t>(l2) * P + s];
      return h.bsp_recv.data() + (h.bsp_rdispl_tokens[s] + before) * token_bytes_;
    });
  }
  const std::size_t out_total = rtotal * out_token_bytes_, back = total * out_token_bytes_;
  h.bsp_csend.resize(out_total);
  h.bsp_crecv.resize(back);
  peak_bytes_ = std::max(peak_bytes_, sendbuf.size() + h.bsp_recv.size() + out_total + back);
}

void BspImpl::dispatch_recv(Handle& h) { check_handle(h, "dispatch_recv"); }

std::optional<int> BspImpl::next_expert(Handle& h) {
  check_handle(h, "next_expert");
  HandleState& s = state_of(h);
  if (s.num_returned == local_experts()) return std::nullopt;
  for (int le = 0; le < local_experts(); ++le) {
    if (!s.returned[le]) {
      s.returned[le] = 1;
      ++s.num_returned;
      return le;
    }
  }
  return std::nullopt;
}

void BspImpl::send_outputs(Handle& h, int local, std::span<const std::byte> outputs) {
  check_combine_send(h, local, outputs);
  HandleState& s = state_of(h);
  const int P = size_;
  // Outputs of this expert go into each source's block at the source's (local expert, j) order.
  std::size_t row = 0;
  for (int src = 0; src < P; ++src) {
    std::size_t before = 0;
    for (int l2 = 0; l2 < local; ++l2) before += s.recv_counts[static_cast<std::size_t>(l2) * P + src];
    const std::size_t c = s.recv_counts[static_cast<std::size_t>(local) * P + src];
    if (c == 0) continue;  // outputs.data() may be null
    std::memcpy(s.bsp_csend.data() + (s.bsp_rdispl_tokens[src] + before) * out_token_bytes_,
                outputs.data() + row * out_token_bytes_, c * out_token_bytes_);
    row += c;
  }
  s.combined[local] = 1;
  ++s.num_combined;
}

void BspImpl::recv_outputs(Handle& h, std::span<float> out) {
  // Every rank checks the order before the collective: calls out of order would pair another call's
  // MPI_Alltoallv with ours on a rank that completes them in order.
  check_combine_recv(h);
  HandleState& s = state_of(h);
  const int P = size_, L = map_.max_local();
  std::vector<int> scounts(P), sdispl(P), rcounts(P), rdispl(P);
  for (int p = 0; p < P; ++p) {
    std::size_t from = 0, to = 0;
    for (int le = 0; le < L; ++le) {
      from += s.recv_counts[static_cast<std::size_t>(le) * P + p];
      to += s.send_counts[static_cast<std::size_t>(p) * L + le];
    }
    scounts[p] = as_int(from * out_token_bytes_, rank_, "combine send block");
    count(false, p, from * out_token_bytes_);
    sdispl[p] = as_int(s.bsp_rdispl_tokens[p] * out_token_bytes_, rank_, "combine send displacement");
    rcounts[p] = as_int(to * out_token_bytes_, rank_, "combine receive block");
    rdispl[p] = as_int(s.coffset[static_cast<std::size_t>(p) * L] * out_token_bytes_, rank_, "combine displacement");
  }
  check_mpi(MPI_Alltoallv(s.bsp_csend.data(), scounts.data(), sdispl.data(), MPI_BYTE, s.bsp_crecv.data(),
                          rcounts.data(), rdispl.data(), MPI_BYTE, ctx_.comm()),
            rank_, "moe::BspLayer", "MPI_Alltoallv (outputs)");
  reduce(s, s.bsp_crecv.data(), out);
  s.bsp_recv.swap(recv_);
  s.bsp_csend.swap(csend_);
  s.bsp_crecv.swap(crecv_);
  finish(s);
}

}  // namespace ubep::moe
