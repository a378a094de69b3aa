/// \file moe.hpp
/// MoE dispatch/combine: the All-to-All of expert parallelism, in two implementations with one
/// interface: ubep::moe::Layer (one-sided puts + epoch-tagged signals, no collective, no barrier, peers in
/// topology-schedule order) and ubep::moe::BspLayer (the plain-MPI baseline: MPI_Alltoall of counts,
/// MPI_Alltoallv of tokens, all experts compute, MPI_Alltoallv back). Both give bit-identical results.
///
/// Combine modes (Config::combine). Layer moves data in one of three ways; BspLayer always moves one copy per
/// (token, expert) each way, as Megatron-style dispatchers do, and applies the mode's reduction to its rows,
/// so the two stay bit-identical in every mode.
///   per_expert  one copy of a token per (token, expert) each way, and
///               out[t] = sum_{a = 0..topk-1} w[t,a] * y(t,a), in float from 0, a ascending.
///   per_rank    one copy per (token, owner rank) each way: a token goes to each rank that owns one of its
///               experts once, with those experts and their weights; the owner sums its experts' outputs
///               and sends back one partial row per (token, owner).
///   per_node    (default) per_rank on the source's own node; across nodes one copy per (token, node): the
///               source sends the token to the relay rank of that node, which forwards it to the node's owners
///               over the node's own route, sums their partial rows and sends back one row. The relay of a
///               source s on node B is the rank of B whose index among B's ranks is (s's index among the
///               ranks of its node) mod (ranks on B), so every rank relays for its own share of the sources.
///               On one node it moves exactly what per_rank moves.
/// per_rank and per_node give bit-identical outputs. Their reduction order, defined once (row type R: the
/// output dtype, or float under Config::float_partials; "round" = to R, round to nearest even):
///   P_o[t] = round(sum over a ascending with owner(e_a) = o of w[t,a] * y(t,a))        (float from 0)
///   N_n[t] = sum over the owners o of t on node n, o ascending, of P_o[t]             (float from 0),
///            rounded when n is not the node of t's source (the row the relay sends back)
///   out[t] = sum over the nodes n of t's owners, n ascending, of N_n[t]               (float from 0)
/// Nodes are Topology::node_of (real hosts, or UBEP_VIRTUAL_NODES). Outputs are bit-identical across runs,
/// schedules, routes and per_rank/per_node for one config, rank count and node map.
/// What per_rank and per_node change in the notes (@note) below (written for per_expert where they differ):
///   - A source writes one chunk per owner (a header, then each token once with its experts) and one signal
///     after the chunk; an owner hands out its first expert once every source's chunk is in (per_expert over
///     load/store: once every source has signalled that expert). Over load/store (as in per_expert) the
///     source stages its tokens once and a record names the token's row there; the owner gathers its
///     batches from the stage (from the relay's inbox for the tokens a relay forwards).
///   - combine_send keeps a copy only of the output rows whose token still waits for another local expert;
///     a token's partial row is computed at the combine_send of its last local expert, and the rows go back
///     (one message or signal per source or relay) at the last local expert.
///   - per_node across nodes: a rank also relays. Every wait of a Layer call (dispatch_send's back-pressure,
///     next_expert, dispatch_recv, combine_recv) forwards the inboxes that have arrived and sends the node
///     rows whose partial rows are in, so a relay serves its sources in whatever layer call it is in; its
///     expert compute (outside the layer) delays them. combine_recv(h) returns only once this rank's relay
///     work of that call is done as well, so no source waits for a rank that has left the layer. A timeout
///     report names every awaited source and, for relayed tokens, the relay in between. Between a
///     dispatch_send and its combine_recv a rank must therefore not block outside the layer on other ranks
///     (an MPI collective, a wait on a peer): other ranks' tokens may be waiting in its inbox. A rank that
///     stays outside the layer for long (a long compute, a loop over another library) calls
///     Layer::progress() from time to time. With UBEP_MOE_RELAY_THREAD=1 a thread of the layer does that
///     relay work while calls are in flight and no layer call runs, so the rank may compute or block in MPI
///     meanwhile; it must then not call the Context itself between a dispatch_send and its combine_recv
///     (other layer calls and plain MPI are fine), and must destroy the layer or complete its calls before
///     Context::finalize. The thread's errors are thrown by this rank's next layer call, and what it sends is
///     counted in traffic() at that call; outputs are bit-identical either way. The layer refuses it
///     (Errc::unsupported, every rank alike, before any collective call) with MPI below MPI_THREAD_MULTIPLE,
///     with UBEP_PROGRESS_THREAD=0 and peers on the ucx route, with Memory::device and in SimGrid builds
///     (docs/MOE.md, "The relay thread").
///
/// One call, on every rank:
///   auto h = layer.dispatch(tokens, topk_idx, topk_weights);     // or dispatch_send + dispatch_recv
///   while (auto e = layer.next_expert(h)) {                       // experts in the order they complete
///     auto batch = layer.expert_tokens(h, *e);                    // contiguous [count x hidden]
///     compute(batch, outputs);                                    // your expert
///     layer.combine_send(h, *e, outputs);                         // goes back at once
///   }
///   layer.combine_recv(h, out);                                   // weighted sum, original token order
/// Up to UBEP_RUN_AHEAD calls may be in flight (dispatch_send again before combine_recv). dispatch_recv,
/// next_expert, expert_tokens and combine_send take any call in flight, in any order and interleaved;
/// combine_recv (and combine) completes calls in dispatch order, oldest first, and throws
/// Errc::invalid_argument for any other call, changing nothing. Host memory, or GPU memory under
/// Config::memory ("Device memory" below). Not thread-safe: one thread drives a layer.
///
/// Device memory (Config::memory = Memory::device; every rank alike). The same calls take and give GPU
/// memory: tokens, topk_idx, topk_weights and scales (dispatch_send), the outputs (combine_send, combine) and
/// `out` (combine_recv) may each be device memory (cudaMalloc, the GPU heap of Context::alloc_device) or host
/// memory; ExpertTokens::data and ExpertTokens::scales are device memory, in the GPU heap. The constructor (collective)
/// takes UBEP_RUN_AHEAD x ranks x max_tokens_per_rank x min(topk, local experts) token rows and scales from
/// the GPU heap (device_heap_bytes(); creating the heap if it is the first alloc_device, with its errors:
/// Errc::unsupported on every rank when some rank has no GPU, OutOfHeap naming UBEP_GPU_HEAP_SIZE). The layer moves
/// data between the caller's memory and its own through host memory with Context::copy (cudaMemcpyDefault, waited for):
/// the inputs to host at dispatch_send and combine_send, an expert's batch to the GPU at the first expert_tokens call
/// for it (which then blocks for that copy), the sums to `out` at combine_recv. Everything between ranks goes as with
/// host memory, so outputs are bit-identical to Memory::host for the same inputs, in every mode, route and
/// implementation. What this is not: GPU to GPU between ranks (the Context's put/get/put_signal on the GPU heap are),
/// or GPU compute of the reductions (they run on the CPU, as with host memory).
///
/// Zero-copy combine. An expert may write its outputs straight into rows the layer owns:
///   auto rows = layer.expert_outputs(h, *e);                      // [count x hidden] of output_dtype
///   compute(batch, rows);                                         // your expert writes them in place
///   layer.combine_send(h, *e);                                    // sends them: nothing copied here
/// With Config::zero_copy on a Layer in per_expert (automatic on one node), the rows are in the symmetric
/// heap (Layer::heap_bytes counts them: per buffer set, ranks x max_tokens_per_rank x min(topk, local experts)
/// output rows) and combine_send copies nothing: a source that reaches this rank by load/store reads them in
/// place in its combine_recv (no copy on either side, the weighted sum is the only pass over them); one on
/// the mpi route gets them by an RMA put straight from these rows; one on the ucx route by a staging copy
/// (all its rows in one message, as combine_send(h, e, outputs) sends them). Everywhere else (BspLayer,
/// per_rank, per_node, or Config::zero_copy unset) the rows are this call's own host memory and
/// combine_send(h, e) sends them as combine_send(h, e, rows) would, except that per_rank and per_node owners
/// read them in place for the partial rows (keeping no copy of rows that wait for another local expert). The outputs
/// are bit-identical to the copying combine_send in every case. combine_send(h, e, outputs) with `outputs` being those
/// rows is the same call as combine_send(h, e). Host memory only (Config::memory = host).
///
/// What completes when: the `@note` on each call of LayerBase (and on the constructors) says it, in the
/// four parts and words of context.hpp, for Layer and BspLayer where they differ. In short: Layer never
/// runs a collective after setup and every wait it makes has the deadline UBEP_WAIT_TIMEOUT; BspLayer's
/// dispatch_send and combine_recv are plain MPI collectives on ctx.comm(), without a deadline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ubep/context.hpp"
#include "ubep/topology.hpp"

namespace ubep::moe {

/// Element type of dispatched tokens. Expert outputs (combine) are float32 for f32 and bfloat16 otherwise.
enum class DType : std::uint8_t {
  f32,   ///< float
  bf16,  ///< bfloat16, stored as std::uint16_t
  e4m3,  ///< 8-bit float (OCP FP8 E4M3) with one float scale per token
};
const char* to_string(DType t) noexcept;
DType parse_dtype(const std::string& name);  // "f32", "bf16", "e4m3"; throws Errc::invalid_argument
std::size_t element_size(DType t) noexcept;
/// Element type of expert outputs for a dispatch type.
DType output_dtype(DType t) noexcept;

/// bfloat16 and FP8 E4M3 conversions (round to nearest even; E4M3 saturates at +-448).
std::uint16_t float_to_bf16(float f) noexcept;
float bf16_to_float(std::uint16_t b) noexcept;
std::uint8_t float_to_e4m3(float f) noexcept;
float e4m3_to_float(std::uint8_t q) noexcept;
/// Element `i` of a row of type `t` (a token of `hidden` elements), as a float: e4m3 elements are multiplied
/// by `scale` (the token's scale), the other types ignore it.
float load_element(DType t, const std::byte* row, int i, float scale = 1.0f) noexcept;
/// Stores `v` as element `i` of a row of type `t`, rounded as above; e4m3 stores v / scale.
void store_element(DType t, std::byte* row, int i, float v, float scale = 1.0f) noexcept;

/// The row kernels both layers reduce and round with, for the whole process: "avx512", "avx2" or "portable".
/// UBEP_MOE_KERNELS picks them (read once, at the first layer or reduction): auto (the default) is the fastest
/// this CPU runs, chosen at run time from what it reports; portable forces the plain loops. Every path gives
/// bit-identical results. Throws Errc::invalid_argument for an unknown name, Errc::unsupported for a path the
/// CPU does not run (a layer's constructor throws the same, naming its rank).
const char* kernels();

/// How moe::Layer moves tokens and sums expert outputs: see "Combine modes" at the top of this file.
enum class Combine : std::uint8_t {
  per_expert,  ///< one copy per (token, expert) each way
  per_rank,    ///< one copy per (token, owner rank) each way, partial sums at the owner
  per_node,    ///< per_rank inside a node, one copy per (token, node) across nodes through a relay rank
  automatic,   ///< (default) per_expert when every rank is on one node, per_node otherwise: resolve_combine
};
const char* to_string(Combine c) noexcept;
/// "per_expert", "per_rank", "per_node", "automatic" (or "auto"); Errc::invalid_argument otherwise.
Combine parse_combine(const std::string& name);
/// The mode a layer on `topology`'s node map runs for `c`: `c` itself, except automatic, which is per_expert
/// when Topology::num_nodes() is 1 (on one node a token row crosses by one load/store copy either way, and
/// per_expert spares the owner its partial rows: faster at every shape measured, docs/MOE.md) and per_node
/// otherwise (one copy per token and node across the network). Every rank holds the same node map, so every
/// rank resolves alike; LayerBase::config().combine is the resolved mode, and its reduction order is that
/// mode's ("Combine modes" above).
Combine resolve_combine(Combine c, const Topology& topology);

/// Where the caller's buffers live (Config::memory): see "Device memory" at the top of this file.
enum class Memory : std::uint8_t {
  host,    ///< every span passed in and handed out is host memory
  device,  ///< expert batches are handed out in GPU memory; spans passed in may be GPU or host memory
};
const char* to_string(Memory m) noexcept;
Memory parse_memory(const std::string& name);  // "host", "device"; Errc::invalid_argument

struct Config {
  int num_experts = 0;                   ///< experts in the layer, spread over ranks in contiguous blocks
  int hidden = 0;                        ///< elements per token
  DType dtype = DType::bf16;             ///< element type of the tokens
  int topk = 1;                          ///< experts per token (distinct)
  int max_tokens_per_rank = 0;           ///< the largest n any rank passes to dispatch
  Combine combine = Combine::automatic;  ///< the data path and reduction order (every rank alike)
  bool float_partials = false;           ///< per_rank, per_node: partial and node rows in float, not output_dtype
  Memory memory = Memory::host;          ///< the caller's buffers (every rank alike): "Device memory" above
  bool zero_copy = false;                ///< Layer, per_expert: expert_outputs rows in the symmetric heap
                                         ///< ("Zero-copy combine" above; every rank alike)
};

/// Bytes this rank sent to other ranks (itself excluded), counted by the layer since its construction: token
/// rows in dispatch (hidden x element size, plus the 4-byte scale for e4m3, per copy, relay forwards
/// included), output rows in combine (expert outputs, partial rows, node rows). Headers, expert lists,
/// weights and signals are not counted. On-node: to ranks with the same Topology::node_of.
struct Traffic {
  std::uint64_t calls = 0;  ///< dispatch_send calls counted
  std::uint64_t dispatch_on_node = 0, dispatch_off_node = 0;
  std::uint64_t combine_on_node = 0, combine_off_node = 0;
};

/// Which ranks own which experts: the first (E mod P) ranks own one expert more.
struct ExpertMap {
  int num_experts = 0, ranks = 0;
  int owner(int expert) const;
  int first(int rank) const;
  int count(int rank) const;
  int max_local() const { return (num_experts + ranks - 1) / ranks; }
};

class LayerImpl;     // the implementation behind a layer (internal, moe/layer_impl.hpp)
struct HandleState;  // the state of one call (internal, moe/handle.hpp)
/// One dispatch/combine call in flight. Move-only; valid until combine_recv returns.
class Handle {
 public:
  Handle();
  Handle(Handle&&) noexcept;
  Handle& operator=(Handle&&) noexcept;
  ~Handle();
  std::uint64_t call() const;  ///< this rank's call number (0, 1, 2, ...)
  int tokens() const;          ///< n of this call on this rank

 private:
  friend class LayerImpl;
  std::unique_ptr<HandleState> state_;
};

/// The received tokens of one local expert.
struct ExpertTokens {
  int expert = 0;                   ///< global expert id
  int local = 0;                    ///< index among this rank's experts
  int count = 0;                    ///< tokens received for it
  std::span<const std::byte> data;  ///< [count x hidden] elements of Config::dtype, contiguous
  std::span<const float> scales;    ///< e4m3 only: one scale per token
};

/// The interface of both implementations: every call of a layer, with its contract. Layer and BspLayer add
/// their constructors (and Layer its own few calls); their state lives behind this interface, in moe/.
class LayerBase {
 public:
  LayerBase(const LayerBase&) = delete;
  LayerBase& operator=(const LayerBase&) = delete;
  virtual ~LayerBase();
  /// The config given to the constructor, with Config::combine resolved (resolve_combine).
  const Config& config() const noexcept;
  /// Which rank owns which expert.
  const ExpertMap& experts() const noexcept;
  /// The number of experts this rank owns.
  int local_experts() const noexcept;
  /// Bytes of communication buffers this implementation holds on this rank (symmetric + local), host memory.
  std::size_t buffer_bytes() const;
  /// Bytes of the GPU heap this layer holds on this rank (Memory::device: the expert batches; 0 for host).
  std::size_t device_buffer_bytes() const noexcept;
  /// The GPU heap bytes a layer of `config` takes per rank on `ranks` ranks at this run-ahead: for
  /// Memory::device run_ahead x (round256(R x token bytes) + round256(R x 4) for e4m3), R = ranks x
  /// max_tokens_per_rank x min(topk, local experts of the rank with most); 0 for Memory::host. The GPU heap
  /// (UBEP_GPU_HEAP_SIZE) must hold it beside the caller's own alloc_device objects.
  static std::size_t device_heap_bytes(const Config& config, int ranks, unsigned run_ahead);
  /// "ubep" (Layer) or "bsp" (BspLayer), as benchmarks print it.
  const char* name() const noexcept;
  /// What this rank has sent so far (see Traffic).
  const Traffic& traffic() const noexcept;

  /// Starts a dispatch: checks the input, sends every token to the ranks of its top-k experts and returns
  /// as soon as everything is issued. tokens: [n x hidden] of dtype; topk_idx, topk_weights: [n x topk];
  /// scales: [n] for e4m3, empty otherwise. The inputs may be reused when dispatch_send returns.
  /// Throws Errc::out_of_range (expert id, n), invalid_argument (duplicate expert in one token, sizes,
  /// more than UBEP_RUN_AHEAD calls in flight), each before anything communicates.
  /// @note Local completion: on return (the inputs may be reused; they are copied into the owners' buffers or
  /// a staging copy). Remote completion: Layer: the tokens are at each owner when its
  /// dispatch_recv/next_expert observes this rank's signal; every signal is issued before dispatch_send
  /// returns (on the mpi route after one flush per owner, which completes the tokens). BspLayer: at each
  /// owner when its own dispatch_send returns (MPI_Alltoallv). Blocks: Layer: from call UBEP_RUN_AHEAD on,
  /// until each owner has released call c - UBEP_RUN_AHEAD, whose buffers call c reuses, at most
  /// UBEP_WAIT_TIMEOUT per owner (Errc::timeout naming it); on the mpi route one MPI_Win_flush per owner, at
  /// most UBEP_WAIT_TIMEOUT. BspLayer: until every rank joins MPI_Alltoall and MPI_Alltoallv, without a
  /// deadline. Communicates: Layer: with every rank that owns an expert (a header and a signal also for 0
  /// tokens), one-sided. BspLayer: collective over ctx.comm().
  [[nodiscard]] Handle dispatch_send(std::span<const std::byte> tokens, std::span<const int> topk_idx,
                                     std::span<const float> topk_weights, std::span<const float> scales = {});
  /// Waits until every local expert has all its tokens. Any call in flight, in any order; in ubep's Layer
  /// the buffers of a call received before an older one are handed back to the sources together with
  /// the older call's (a source's dispatch_send that reuses them waits for that).
  /// @note Local completion: on return expert_tokens(h, e) holds the tokens of every local expert. Remote
  /// completion: Layer: the release of the received buffers (a signal to every rank; none from a rank without
  /// experts) is issued on return, or later with an older call not yet received; BspLayer: nothing to
  /// complete. Blocks: Layer: until every source's tokens are in, at most UBEP_WAIT_TIMEOUT per wait
  /// (Errc::timeout naming the sources missing), then to deliver the release, at most UBEP_WAIT_TIMEOUT per
  /// MPI call; BspLayer: no. Communicates: Layer: waits for every source's signals, then signals every rank;
  /// BspLayer: no (dispatch_send received everything).
  void dispatch_recv(Handle& h);
  /// dispatch_send + dispatch_recv.
  /// @note Local completion: on return the inputs may be reused and expert_tokens(h, e) holds the tokens of
  /// every local expert. Remote completion: as dispatch_send and dispatch_recv. Blocks: as dispatch_send,
  /// then as dispatch_recv. Communicates: Layer: with every rank, one-sided; BspLayer: collective over
  /// ctx.comm().
  [[nodiscard]] Handle dispatch(std::span<const std::byte> tokens, std::span<const int> topk_idx,
                                std::span<const float> topk_weights, std::span<const float> scales = {});
  /// The next local expert whose tokens are all in (waiting if none is yet), in completion order;
  /// nullopt once every local expert was returned. In ubep's Layer an expert completes when every source
  /// on the node has signalled that expert and every off-node source its whole region. Any call in
  /// flight, in any order, as dispatch_recv.
  /// @note Local completion: on return expert_tokens(h, *e) holds the tokens of the expert returned. Remote
  /// completion: Layer: once the last local expert is in, the release as in dispatch_recv; BspLayer: nothing
  /// to complete. Blocks: Layer: only when none of the experts still to return is complete, at most
  /// UBEP_WAIT_TIMEOUT per wait, and after the last one to deliver the release, at most UBEP_WAIT_TIMEOUT per
  /// MPI call; never once every expert was returned (nullopt); BspLayer: no. Communicates: Layer: waits for
  /// the sources' signals, and after the last local expert signals every rank; BspLayer: no.
  std::optional<int> next_expert(Handle& h);
  /// The tokens of local expert `local` (it must be complete: from next_expert or after dispatch_recv).
  /// @note Local completion: on return (the spans point into this call's local copy, valid until
  /// combine_recv(h) returns). Remote completion: none. Blocks: no. Communicates: no.
  ExpertTokens expert_tokens(const Handle& h, int local) const;
  /// Sends local expert `local`'s outputs back: [count x hidden] of output_dtype(dtype), in the order of
  /// expert_tokens. Returns when `outputs` may be reused. Any call in flight, in any order.
  /// @note Local completion: on return (`outputs` may be reused; they are copied to the sources or to a
  /// staging copy). Remote completion: Layer: the outputs are at each source when its combine_recv observes
  /// this rank's signal, which the combine_send of the last local expert issues (on the mpi route after one
  /// flush per source, which completes the outputs); BspLayer: at combine_recv's MPI_Alltoallv. Blocks:
  /// Layer: only the call for the last local expert, through MPI, to deliver the signals (one MPI_Win_flush
  /// per peer with data in flight), at most UBEP_WAIT_TIMEOUT per MPI call; BspLayer: no. Communicates:
  /// Layer: with the sources of this expert's tokens, and after the last local expert a signal to every
  /// source that sent tokens; BspLayer: no (a local copy).
  void combine_send(Handle& h, int local, std::span<const std::byte> outputs);
  /// The rows local expert `local`'s outputs go in, for the expert to write ("Zero-copy combine" above):
  /// [count x hidden] of output_dtype(dtype), in the order of expert_tokens, valid until combine_recv(h)
  /// returns. The same span on every call for one expert. Throws Errc::out_of_range for an expert index
  /// outside [0, local_experts()), Errc::invalid_argument for an expert not yet complete or one already
  /// combine_sent (its rows are the sources' now: a second write would race their reads), Errc::unsupported
  /// under Memory::device; each names the rank, the call and the expert.
  /// @note Local completion: on return. Remote completion: none. Blocks: no. Communicates: no.
  std::span<std::byte> expert_outputs(Handle& h, int local);
  /// Sends the rows of expert_outputs(h, local), as the expert wrote them, back to the sources. Throws
  /// Errc::invalid_argument, changing nothing, when expert_outputs(h, local) was not taken for this call, and as
  /// combine_send(h, local, outputs) does otherwise.
  /// @note As combine_send(h, local, outputs); with Config::zero_copy on a Layer in per_expert the rows must
  /// not be written again until combine_recv(h) returns (load/store sources read them in place).
  void combine_send(Handle& h, int local);
  /// Waits for the outputs of every expert this rank's tokens went to and writes
  /// out[t] = sum_k topk_weights[t,k] * output(t,k) in float, in the order of Config::combine ("Combine modes"),
  /// original token order.
  /// Completes calls in dispatch order: `h` must be the oldest call not yet combined (a later one would
  /// free a buffer set that the next dispatch overwrites while an older call still reads it), with every
  /// local expert combine_sent. Throws Errc::invalid_argument naming the call given and the one expected,
  /// before anything communicates: the layer stays usable, combine the older call first.
  /// @note Local completion: on return `out` holds the sums, and the call is done (its expert_tokens spans
  /// are no longer valid, and `h` is refused by every later call). Remote completion: Layer: nothing of its
  /// own (it only waits; its deferred signals are delivered first, as by every wait); BspLayer: this rank's
  /// expert outputs are at each source when its own combine_recv returns (MPI_Alltoallv). Blocks: Layer:
  /// until every owner this rank sent tokens to has signalled its outputs, at most UBEP_WAIT_TIMEOUT
  /// (Errc::timeout naming the owners); BspLayer: until every rank joins MPI_Alltoallv, without a deadline.
  /// Communicates: Layer: waits for the owners' signals, sends nothing; BspLayer: collective over ctx.comm().
  void combine_recv(Handle& h, std::span<float> out);
  /// combine_send for every local expert (outputs[i] for local expert i), then combine_recv. Checks the
  /// order first: a call out of order throws as combine_recv does, before any combine_send.
  /// @note Local completion: on return, as combine_recv (the outputs may be reused too). Remote completion:
  /// as combine_send, then combine_recv. Blocks: as combine_send, then combine_recv. Communicates: Layer:
  /// with the sources of this rank's experts, and waits for the owners of its tokens, one-sided; BspLayer:
  /// collective over ctx.comm().
  void combine(Handle& h, std::span<const std::span<const std::byte>> outputs, std::span<float> out);

 protected:
  /// Takes the implementation the derived class built (its constructor runs the collective setup).
  explicit LayerBase(std::unique_ptr<LayerImpl> impl);
  /// The implementation, for the calls only a derived class has.
  LayerImpl& impl() const noexcept { return *impl_; }

 private:
  std::unique_ptr<LayerImpl> impl_;
};

/// ubep's dispatch/combine: one-sided, signal-synchronized, overlapped, topology-scheduled.
class Layer final : public LayerBase {
 public:
  /// Collective. Allocates the receive buffers from ctx's symmetric heap, UBEP_RUN_AHEAD sets of: per_expert
  /// one region per source of max_tokens_per_rank x min(topk, local experts) tokens, plus combine buffers;
  /// per_rank/per_node one chunk per source of max_tokens_per_rank tokens with their expert lists, rows for
  /// max_tokens_per_rank x min(topk, ranks) partial or node rows, and per_node across nodes one inbox of
  /// max_tokens_per_rank tokens per source this rank relays for, with max_tokens_per_rank x min(topk, ranks
  /// per node) partial rows each; every mode a stage of max_tokens_per_rank tokens (this rank's, gathered from
  /// by the owners on load/store); per_expert under Config::zero_copy as many expert-output rows as token rows and
  /// a table of ranks x max_local words; and the signals (see heap_bytes()). Throws Errc::invalid_argument for a bad
  /// config (a dtype outside DType, a combine outside Combine, num_experts or hidden outside [1, 2^20], topk
  /// outside [1, num_experts], a negative max_tokens_per_rank, buffers beyond 2^52 bytes) on each rank before
  /// any collective; collective_mismatch when ranks disagree on the config; OutOfHeap
  /// naming UBEP_HEAP_SIZE and a size that is enough when set exactly: the bytes outside the heap's
  /// largest free block plus heap_bytes() (it assumes that block is the heap's free end, which holds
  /// unless freed objects left a larger hole below a live one). Peers are served in the order of the
  /// schedule `UBEP_SCHEDULE` (ctx.options().schedule).
  /// @note Local completion: on return the buffers exist on this rank, its signals zeroed. Remote completion:
  /// no rank returns before every rank has zeroed its signals (Context::alloc_signals). Blocks: the config
  /// agreement, two Context::alloc (four under Config::zero_copy in per_expert) and three Context::alloc_signals,
  /// each at most UBEP_WAIT_TIMEOUT.
  /// Communicates: collective over ctx's communicator.
  Layer(Context& ctx, const Config& config);
  /// Releases the buffers on this rank only, as ~Symmetric does.
  /// @note Local completion: none: calls still in flight are abandoned. Remote completion: none. Blocks: no.
  /// Communicates: no.
  ~Layer() override;
  /// Symmetric heap bytes a Layer needs per rank for this config and run-ahead, on `ranks` ranks of one node.
  static std::size_t heap_bytes(const Config& config, int ranks, unsigned run_ahead);
  /// The same for the node map of `topology` (per_node across nodes adds the relays' buffers).
  static std::size_t heap_bytes(const Config& config, const Topology& topology, unsigned run_ahead);
  /// The peer order this rank uses.
  const std::vector<int>& schedule() const noexcept;
  /// Runs this rank's relay work that can run now (per_node across nodes: forwards the inboxes that have
  /// arrived, sends the node rows whose partial rows are in) and lets the transports progress; never waits.
  /// Call it from a loop that keeps this rank outside the layer (a long compute, polling another library)
  /// while calls are in flight: other ranks' tokens pass through this rank, and they wait for it otherwise.
  /// In per_expert and per_rank there is no relay work: it only calls Context::progress().
  /// @note Local completion: none of its own. Remote completion: the forwards and node rows it sends are
  /// complete as sends of any Layer call (the signal after the data). Blocks: never for a peer; delivering
  /// deferred signals at most UBEP_WAIT_TIMEOUT per MPI call. Communicates: with the owners of this rank's
  /// node and the sources it relays for, one-sided.
  void progress();
};

/// The plain-MPI baseline, as Megatron-style dispatchers do it, on ctx.comm().
class BspLayer final : public LayerBase {
 public:
  /// Collective. Throws as Layer's constructor does, except OutOfHeap (it allocates no symmetric memory).
  /// @note Local completion: on return. Remote completion: no rank returns before every rank has joined the
  /// config agreement. Blocks: the agreement, at most UBEP_WAIT_TIMEOUT. Communicates: collective over ctx's
  /// communicator.
  BspLayer(Context& ctx, const Config& config);
  /// @note Local completion: none: calls in flight are abandoned. Remote completion: none. Blocks: no.
  /// Communicates: no.
  ~BspLayer() override;
};

}  // namespace ubep::moe
