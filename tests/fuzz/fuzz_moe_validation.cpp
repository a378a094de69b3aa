// Fuzz target: the MoE input validation (moe/types.cpp, moe/layer_impl.cpp, moe/layer.cpp, moe/bsp_layer.cpp): the
// Config checks of the layer constructors (dtype, combine, num_experts, hidden, topk, max_tokens_per_rank, the heap it
// needs), and dispatch_send's checks of one call (routing: expert ids, duplicates in a token; counts: topk_idx a
// multiple of topk, n <= max_tokens_per_rank; sizes of tokens, weights and scales), then the calls of a whole
// dispatch/combine, some of them misused (a local expert out of range, combine_recv before every combine_send,
// combine_send twice, wrong output sizes, a handle used after its combine). One rank: LLVMFuzzerInitialize starts a
// singleton MPI job (no mpirun) and one Context, kept for the run. Property: the constructor either builds a layer or
// throws ubep::Error(invalid_argument) naming the field, or ubep::OutOfHeap; dispatch_send accepts exactly the calls an
// independent check here accepts and rejects the others with ubep::Error(invalid_argument or out_of_range); every
// expert gets exactly the tokens routed to it, byte for byte; per_expert with f32 outputs of 1.0 sums exactly the
// weights; no call times out (one rank never waits for anyone). Any other exception, a crash or a sanitizer report is a
// finding.
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "fuzz_common.hpp"
#include "ubep/context.hpp"
#include "ubep/moe.hpp"

namespace {

using ubep::Errc;
using ubep::moe::Combine;
using ubep::moe::Config;
using ubep::moe::DType;

ubep::Context* g_ctx = nullptr;  // reachable until exit: never finalized (MPI_Finalize at exit is not needed)

// Every Error here must be one of the documented rejections.
void expect_rejection(const ubep::Error& e, std::initializer_list<Errc> codes, const char* call) {
  bool ok = false;
  for (Errc c : codes) ok = ok || e.code() == c;
  UBEP_FUZZ_CHECK(ok, std::string(call) + ": unexpected error code: " + e.what());
  ubep::fuzz::check_message(e, "ubep: rank 0: ");
}

// A small signed value from one byte, mostly in [lo, hi], sometimes an extreme.
int pick(std::uint8_t b, int lo, int hi) {
  if (b == 0xff) return 1 << 30;
  if (b == 0xfe) return -1;
  if (b == 0xfd) return 0;
  return lo + b % (hi - lo + 1);
}

struct Call {
  int n = 0;
  std::vector<int> idx;
  std::vector<float> weights, scales;
  std::vector<std::byte> tokens;
};

// What dispatch_send must accept (the documented checks, written here independently).
bool valid_call(const Config& c, const Call& call, std::size_t elem) {
  if (call.idx.size() % c.topk) return false;
  const std::size_t n = call.idx.size() / c.topk;
  if (n > static_cast<std::size_t>(c.max_tokens_per_rank)) return false;
  if (call.tokens.size() != n * c.hidden * elem || call.weights.size() != call.idx.size()) return false;
  if (call.scales.size() != (c.dtype == DType::e4m3 ? n : 0)) return false;
  for (std::size_t t = 0; t < n; ++t)
    for (int a = 0; a < c.topk; ++a) {
      const int e = call.idx[t * c.topk + a];
      if (e < 0 || e >= c.num_experts) return false;
      for (int b = 0; b < a; ++b)
        if (call.idx[t * c.topk + b] == e) return false;
    }
  return true;
}

void run_calls(ubep::moe::LayerBase& layer, const Config& c, ubep::fuzz::Bytes& in) {
  const std::size_t elem = ubep::moe::element_size(c.dtype),
                    out_elem = ubep::moe::element_size(ubep::moe::output_dtype(c.dtype));
  for (int round = 0; round < 2 && !in.empty(); ++round) {
    // The call: n tokens, each with topk expert ids from the bytes (mostly valid, some out of range or repeated).
    Call call;
    const std::uint8_t shape = in.u8();
    call.n = std::min<int>(in.u8() % 24, c.max_tokens_per_rank + 1);
    const int slots = call.n * c.topk + ((shape & 1) ? static_cast<int>(in.u8() % 3) - 1 : 0);
    for (int i = 0; i < std::max(slots, 0); ++i) {
      const std::uint8_t b = in.u8();
      call.idx.push_back(b >= 0xf0 ? static_cast<int>(b) - 0xf8 - (b == 0xff ? (1 << 30) : 0) : b % c.num_experts);
    }
    const std::size_t n = call.idx.size() / c.topk;
    for (std::size_t i = 0; i < call.idx.size() + ((shape & 2) ? 1 : 0); ++i)
      call.weights.push_back(static_cast<float>(in.u8()) / 64.0f);
    call.tokens.resize(n * c.hidden * elem + ((shape & 4) ? 1 : 0));
    for (std::size_t i = 0; i < call.tokens.size(); ++i) call.tokens[i] = static_cast<std::byte>(i * 131 + round);
    call.scales.assign((c.dtype == DType::e4m3 ? n : 0) + ((shape & 8) ? 1 : 0), 0.5f);
    const bool valid = valid_call(c, call, elem);
    ubep::moe::Handle h;
    try {
      h = layer.dispatch_send(call.tokens, call.idx, call.weights, call.scales);
    } catch (const ubep::Error& e) {
      UBEP_FUZZ_CHECK(!valid, std::string("dispatch_send rejects a valid call: ") + e.what());
      expect_rejection(e, {Errc::invalid_argument, Errc::out_of_range}, "dispatch_send");
      continue;
    }
    UBEP_FUZZ_CHECK(valid, "dispatch_send accepts an invalid call");
    const int local = layer.local_experts();
    UBEP_FUZZ_CHECK(local == c.num_experts, "one rank owns every expert");
    if (shape & 16) {  // a local expert out of range, and one not complete yet (BspLayer: complete at once)
      try {
        (void)layer.expert_tokens(h, local);
        UBEP_FUZZ_CHECK(false, "expert_tokens accepts local expert " + std::to_string(local));
      } catch (const ubep::Error& e) {
        expect_rejection(e, {Errc::out_of_range}, "expert_tokens");
      }
    }
    if (shape & 32) {  // combine_recv before any combine_send
      std::vector<float> out(n * c.hidden);
      try {
        layer.combine_recv(h, out);
        UBEP_FUZZ_CHECK(local == 0, "combine_recv before combine_send");
      } catch (const ubep::Error& e) {
        expect_rejection(e, {Errc::invalid_argument}, "combine_recv");
      }
    }
    // Every expert gets exactly its tokens, in token order, byte for byte.
    std::vector<int> seen(local, 0);
    while (auto le = layer.next_expert(h)) {
      UBEP_FUZZ_CHECK(*le >= 0 && *le < local && !seen[*le], "next_expert returned " + std::to_string(*le));
      seen[*le] = 1;
      const ubep::moe::ExpertTokens t = layer.expert_tokens(h, *le);
      std::vector<int> want;
      for (std::size_t tok = 0; tok < n; ++tok)
        for (int a = 0; a < c.topk; ++a)
          if (call.idx[tok * c.topk + a] == t.expert) want.push_back(static_cast<int>(tok));
      UBEP_FUZZ_CHECK(t.count == static_cast<int>(want.size()),
                      "expert " + std::to_string(t.expert) + " got " + std::to_string(t.count) + " tokens");
      const std::size_t row = static_cast<std::size_t>(c.hidden) * elem;
      UBEP_FUZZ_CHECK(t.data.size() == want.size() * row, "expert data size");
      for (std::size_t i = 0; i < want.size(); ++i)
        UBEP_FUZZ_CHECK(std::memcmp(t.data.data() + i * row, call.tokens.data() + want[i] * row, row) == 0,
                        "expert " + std::to_string(t.expert) + " row " + std::to_string(i) + " differs");
      UBEP_FUZZ_CHECK(t.scales.size() == (c.dtype == DType::e4m3 ? want.size() : 0), "scales size");
      // Outputs of 1.0 (wrong size first, now and then).
      std::vector<std::byte> outputs(static_cast<std::size_t>(t.count) * c.hidden * out_elem);
      for (std::size_t i = 0; i < outputs.size() / out_elem; ++i) {
        if (out_elem == 4) {
          const float one = 1.0f;
          std::memcpy(outputs.data() + i * 4, &one, 4);
        } else {
          const std::uint16_t one = ubep::moe::float_to_bf16(1.0f);
          std::memcpy(outputs.data() + i * 2, &one, 2);
        }
      }
      if (shape & 64) {
        std::vector<std::byte> wrong(outputs.size() + out_elem);
        try {
          layer.combine_send(h, *le, wrong);
          UBEP_FUZZ_CHECK(false, "combine_send accepts outputs of the wrong size");
        } catch (const ubep::Error& e) {
          expect_rejection(e, {Errc::invalid_argument}, "combine_send");
        }
      }
      layer.combine_send(h, *le, outputs);
      if (shape & 128) {
        try {
          layer.combine_send(h, *le, outputs);
          UBEP_FUZZ_CHECK(false, "combine_send accepts a local expert twice");
        } catch (const ubep::Error& e) {
          expect_rejection(e, {Errc::invalid_argument}, "combine_send");
        }
      }
    }
    for (int le = 0; le < local; ++le) UBEP_FUZZ_CHECK(seen[le], "next_expert skipped an expert");
    std::vector<float> out(n * c.hidden, -1.0f);
    if (shape & 2) {  // out of the wrong size
      std::vector<float> wrong(out.size() + 1);
      try {
        layer.combine_recv(h, wrong);
        UBEP_FUZZ_CHECK(false, "combine_recv accepts out of the wrong size");
      } catch (const ubep::Error& e) {
        expect_rejection(e, {Errc::invalid_argument}, "combine_recv");
      }
    }
    layer.combine_recv(h, out);
    if (c.combine == Combine::per_expert && c.dtype == DType::f32) {
      for (std::size_t tok = 0; tok < n; ++tok) {
        float sum = 0.0f;
        for (int a = 0; a < c.topk; ++a) sum += call.weights[tok * c.topk + a] * 1.0f;
        for (int j = 0; j < c.hidden; ++j)
          UBEP_FUZZ_CHECK(out[tok * c.hidden + j] == sum, "token " + std::to_string(tok) + ": " +
                                                              std::to_string(out[tok * c.hidden + j]) +
                                                              " != " + std::to_string(sum));
      }
    }
    try {  // the handle is done
      (void)layer.expert_tokens(h, 0);
      UBEP_FUZZ_CHECK(false, "expert_tokens accepts a combined call");
    } catch (const ubep::Error& e) {
      expect_rejection(e, {Errc::invalid_argument}, "expert_tokens");
    }
  }
}

}  // namespace

// MPI_Init's allocations live until exit (MPI is never finalized here), and their stacks run through MCA
// components without frame pointers, which the suppressions cannot match: no leak scan at exit. libFuzzer's
// leak check after each input (what finds a leak in ubep's code) still runs.
extern "C" const char* __lsan_default_options() { return "leak_check_at_exit=0"; }

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // The environment of the MPI tests (cmake/UbepTesting.cmake), unless the caller set it.
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  setenv("OMPI_MCA_osc", "ucx,sm", 0);
  // Open MPI installs its own SIGABRT/SIGBUS handlers in MPI_Init (libFuzzer's come later and then keep
  // them), which would print a stack and exit without libFuzzer saving the input: intercept nothing.
  setenv("OMPI_MCA_opal_signal", "", 1);
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) std::abort();
  ubep::Options o = ubep::Options::from_env();
  o.heap_size = std::size_t{64} << 20;
  o.wait_timeout = std::chrono::duration<double>(20.0);  // one rank never waits: a timeout is a finding
  g_ctx = new ubep::Context(MPI_COMM_WORLD, o);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ubep::fuzz::Bytes in(data, size);
  Config c;
  const std::uint8_t flags = in.u8();
  c.num_experts = pick(in.u8(), 1, 24);
  c.hidden = pick(in.u8(), 1, 40);
  c.dtype = static_cast<DType>(in.u8() % 5);  // 3, 4: not a DType
  c.topk = pick(in.u8(), 1, 9);
  c.max_tokens_per_rank = pick(in.u8(), 0, 32);
  c.combine = static_cast<Combine>(in.u8() % 6);  // 4, 5: not a Combine (3: automatic)
  c.float_partials = flags & 1;
  // Finding M1 (docs/reliability/fuzz.md, fixed): num_experts and hidden above 2^20 are invalid_argument.
  std::unique_ptr<ubep::moe::LayerBase> layer;
  try {
    if (flags & 2)
      layer = std::make_unique<ubep::moe::BspLayer>(*g_ctx, c);
    else
      layer = std::make_unique<ubep::moe::Layer>(*g_ctx, c);
  } catch (const ubep::OutOfHeap& e) {
    UBEP_FUZZ_CHECK(std::string(e.what()).find("UBEP_HEAP_SIZE") != std::string::npos, e.what());
    return 0;
  } catch (const ubep::Error& e) {
    expect_rejection(e, {Errc::invalid_argument}, "moe layer constructor");
    return 0;
  }
  const bool valid_config = static_cast<int>(c.dtype) <= 2 && static_cast<int>(c.combine) <= 3 && c.num_experts >= 1 &&
                            c.num_experts <= (1 << 20) && c.hidden >= 1 && c.hidden <= (1 << 20) && c.topk >= 1 &&
                            c.topk <= c.num_experts && c.max_tokens_per_rank >= 0;
  UBEP_FUZZ_CHECK(valid_config, "a layer was built from an invalid config");
  // The calls only for layers the harness can afford (the constructor saw every size): each call of a layer
  // allocates O(num_experts) per rank whatever n is (up to 2^20 since M1 was fixed).
  if (c.hidden <= 4096 && c.max_tokens_per_rank <= 4096 && c.num_experts <= 4096) run_calls(*layer, c, in);
  return 0;
}
