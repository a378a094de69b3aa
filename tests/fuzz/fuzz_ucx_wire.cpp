// Fuzz target: the ucx route's wire checks (transports/ucx/wire.hpp, check_message), what every arrived active
// message passes before the target acts on it (issue 34, "The wire is input").
// Input: the 56-byte header, then 8 bytes of payload length, one byte of flags (rendezvous), 2 bytes of rank count
// and 4 of heap size.
// Property: check_message never crashes; when it passes, what the handler then does stays inside the heap: the
// payload of a put lands in [offset, offset + bytes) inside it (bytes == the payload's length), a signal or atomic
// word is aligned and inside it, a get reads inside it, the source is a rank, and only payload-carrying kinds come
// by rendezvous. The handler's writes are replayed on a heap of exactly that size (ASan sees any byte outside).
// When it fails, the reason names a field.
#include <cstring>
#include <vector>

#include "fuzz_common.hpp"
#include "transports/ucx/wire.hpp"

namespace {
using namespace ubep::detail::ucx_wire;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ubep::fuzz::Bytes in(data, size);
  Msg m{};
  auto* raw = reinterpret_cast<std::uint8_t*>(&m);
  for (std::size_t i = 0; i < sizeof m; ++i) raw[i] = in.u8();
  const std::uint64_t length = in.u32() | (static_cast<std::uint64_t>(in.u32()) << 32);
  const bool rndv = (in.u8() & 1) != 0;
  Limits limits;
  limits.nranks = static_cast<int>(in.u16() % 4097);
  limits.heap_bytes = in.u32() % (1u << 16);  // the replay heap stays small
  const std::string why = check_message(m, length, rndv, limits);
  (void)kind_name(m.kind);
  if (!why.empty()) {
    UBEP_FUZZ_CHECK(why.rfind("field '", 0) == 0, "a rejection that names no field: " + why);
    return 0;
  }
  UBEP_FUZZ_CHECK(m.version == kVersion, "another version accepted");
  UBEP_FUZZ_CHECK(m.src < static_cast<std::uint32_t>(limits.nranks), "a source outside the ranks accepted");
  UBEP_FUZZ_CHECK(m.kind >= put_data && m.kind <= flush_reply, "an unknown kind accepted");
  UBEP_FUZZ_CHECK(!rndv || m.kind == put_data || m.kind == put_signal || m.kind == get_reply,
                  "a rendezvous of a kind without payload accepted");
  std::vector<std::uint8_t> heap(limits.heap_bytes);
  const auto word_ok = [&](std::uint64_t off) {
    UBEP_FUZZ_CHECK(off % 8 == 0, "a misaligned word accepted");
    UBEP_FUZZ_CHECK(off <= heap.size() && heap.size() - off >= 8, "a word outside the heap accepted");
    std::uint64_t w = 0;
    std::memcpy(&w, heap.data() + off, 8);  // what the handler's atomic touches
    ++w;
    std::memcpy(heap.data() + off, &w, 8);
  };
  switch (m.kind) {
    case put_data:
    case put_signal:
      UBEP_FUZZ_CHECK(m.bytes == length, "a payload length that differs from the header accepted");
      UBEP_FUZZ_CHECK(m.offset <= heap.size() && m.bytes <= heap.size() - m.offset, "a put outside the heap accepted");
      if (m.bytes) std::memset(heap.data() + m.offset, 0xab, m.bytes);  // the handler's memcpy
      if (m.kind == put_signal) {
        UBEP_FUZZ_CHECK(m.op == op_add || m.op == op_set, "a signal op other than add or set accepted");
        word_ok(m.compare);
      }
      break;
    case atomic_post:
      UBEP_FUZZ_CHECK(m.op == op_add || m.op == op_set, "a posted op other than add or set accepted");
      UBEP_FUZZ_CHECK(length == 0, "an atomic with a payload accepted");
      word_ok(m.offset);
      break;
    case fetch_req:
      UBEP_FUZZ_CHECK(m.op <= op_fetch, "a fetch op that is not fetching accepted");
      word_ok(m.offset);
      break;
    case get_req: {
      UBEP_FUZZ_CHECK(m.offset <= heap.size() && m.bytes <= heap.size() - m.offset, "a get outside the heap accepted");
      volatile std::uint8_t sum = 0;
      for (std::uint64_t i = 0; i < m.bytes; ++i) sum = sum + heap[m.offset + i];  // the reply's read
      break;
    }
    default: UBEP_FUZZ_CHECK(m.token != 0, "a request or answer without a token accepted"); break;
  }
  return 0;
}
