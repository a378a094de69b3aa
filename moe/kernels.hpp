// The CPU loops of dispatch/combine (private to moe/): packing tokens into a send buffer, regrouping the
// received batches of one local expert into one array, and the weighted reduction of the expert outputs.
// Plain arguments only, so that bench/micro/ times exactly the code both layers run (LayerImpl::pack,
// regroup and reduce are thin wrappers around these).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "moe/row_kernels.hpp"
#include "ubep/moe.hpp"

namespace ubep::moe {

/// The kernel paths, slowest first. Which ones this CPU runs: supported().
enum class KernelPath : std::uint8_t { portable, avx2, avx512 };
const char* to_string(KernelPath p) noexcept;
/// Whether this build and this CPU run `p` (portable always; avx2 needs AVX2, avx512 AVX-512F).
bool supported(KernelPath p) noexcept;
/// The set of `p`; `p` must be supported.
const RowKernels& row_kernels(KernelPath p) noexcept;
/// The path the loops below use: UBEP_MOE_KERNELS (auto, portable, avx2, avx512), read at the first call;
/// auto (or unset) is the fastest supported path. Throws Errc::invalid_argument naming the variable for an
/// unknown name, Errc::unsupported for a path this CPU does not run (and again at every later call).
KernelPath active_path();
/// The first MoE layer of the process: makes its context's UBEP_MOE_KERNELS the path, unless a path is already
/// chosen. Throws Errc::unsupported for a path this CPU does not run.
void choose_kernels(MoeKernels k);
/// Tests and bench/micro: makes `p` the path of the loops below for the whole process (it must be supported).
void set_active_path(KernelPath p);

/// Copies token toks[j] (`payload` bytes at tokens + toks[j] * payload) to dst + j * stride, followed by
/// its 4-byte scale scales[toks[j]] when `scales` is not empty (e4m3).
void pack_tokens(std::span<const int> toks, std::span<const std::byte> tokens, std::span<const float> scales,
                 std::size_t payload, std::byte* dst, std::size_t stride);

/// Concatenates counts[s] rows of block s (blocks[s], row stride `stride`; read only when counts[s] > 0)
/// for s = 0, 1, ...: the `payload` bytes of each row into `data`, contiguously, and when `scales` is not
/// null the 4-byte scale that follows the payload into scales[row]. `data` holds sum(counts) x payload
/// bytes, `scales` as many floats. Where `rows` is not empty and rows[s] is not null, block s is gathered:
/// its j-th row is row rows[s][j] of blocks[s] (a source's staged tokens), not row j.
void regroup_tokens(std::span<const int> counts, std::span<const std::byte* const> blocks, std::size_t stride,
                    std::size_t payload, std::byte* data, float* scales,
                    std::span<const std::uint32_t* const> rows = {});

/// out[t] = sum_a weights[t,a] * row(t,a), a = 0..topk-1 ascending, in float, for t = 0..n-1 with
/// n = idx.size() / topk, out [n x hidden] (overwritten). Row (t,a) of expert e = idx[t,a], owned by rank
/// d = map.owner(e) as local expert le, is batch[d * map.max_local() + le] + pos[t,a] * row_bytes: `hidden`
/// floats when `f32`, else `hidden` bfloat16 values. A batch is the rows of one (owner, expert) in this
/// source's token order, wherever they are (the source's combine buffer, or the owner's rows read in place).
void reduce_outputs(const ExpertMap& map, int topk, std::span<const int> idx, std::span<const float> weights,
                    std::span<const int> pos, std::span<const std::byte* const> batch, std::size_t row_bytes, bool f32,
                    std::size_t hidden, std::span<float> out);
/// The batches of a combine buffer laid out by `coffset` (in rows): combine + coffset[i] * row_bytes.
std::vector<const std::byte*> batches_at(std::span<const std::size_t> coffset, const std::byte* combine,
                                         std::size_t row_bytes);

/// The steps of the per_rank/per_node reduction (moe.hpp, "Combine modes"); rows of the row type R are
/// `hidden` floats when `r_f32`, else bfloat16 values. Every implementation (owner, relay, source, BspLayer)
/// calls these, so that they round alike. Each works through the row in blocks that stay in L1: every input
/// row is read once and the result written once (no pass over a float accumulator in memory).
/// dst (a row of type R) = round(0 + w[0] * y[0] + w[1] * y[1] + ...), in float, left to right; y rows of
/// the output type (float when `y_f32`).
void partial_row(std::span<const float> w, std::span<const std::byte* const> y, bool y_f32, std::size_t hidden,
                 bool r_f32, std::byte* dst);
/// dst (a row of type R) = round(0 + rows[0] + rows[1] + ...), in float, left to right (rows of type R).
void node_row(std::span<const std::byte* const> rows, bool r_f32, std::size_t hidden, std::byte* dst);

/// One node's share of a token at its source: either the row its relay sent (`node_row`), or the partial
/// rows of its owners in rank order (`rows`), rounded to R when `round` (a node other than the source's).
struct NodeTerm {
  const std::byte* node_row = nullptr;
  std::span<const std::byte* const> rows;
  bool round = false;
};
/// out = 0 + N_0 + N_1 + ... over the terms in order (nodes ascending), N_n = 0 + rows[0] + rows[1] + ...
/// (or the node's row), as documented.
void reduce_token(std::span<const NodeTerm> terms, bool r_f32, std::size_t hidden, float* out);

}  // namespace ubep::moe
