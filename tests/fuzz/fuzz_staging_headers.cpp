// Fuzz target: the staged GPU route's checks of what a peer writes (transports/staging.hpp): chunk headers as the
// target sees them (Target::arrive, with the destination check the runtime installs) and get requests as the server
// reads them from its ring (check_get_request) (issue 34, "The wire is input").
// Input: a chunk size and slot count, then a sequence of steps: a chunk header into a slot, a progress pass, or a get
// request.
// Property: arrive() either throws Errc::protocol naming what is wrong, or copies the chunk inside the fake device
// memory (replayed with memcpy on a buffer of exactly that size: ASan sees any byte outside) and completes each
// transfer at most once, with every byte landed; a get request that passes reads inside the heap.
#include <cstring>
#include <set>
#include <vector>

#include "fuzz_common.hpp"
#include "transports/staging.hpp"

namespace {
using namespace ubep::detail::staging;

constexpr std::size_t kDevice = 1u << 14;

struct Engine final : CopyEngine {
  std::vector<std::uint8_t>& device;
  explicit Engine(std::vector<std::uint8_t>& d) : device(d) {}
  Ticket to_host(void*, const void*, std::size_t) override { return 1; }
  Ticket to_device(void* dst, const void* src, std::size_t bytes) override {
    const auto off = reinterpret_cast<std::uintptr_t>(dst);  // an offset into `device`, as the runtime's engine
    UBEP_FUZZ_CHECK(off <= device.size() && bytes <= device.size() - off,
                    "a copy outside the device memory: offset " + std::to_string(off));
    if (bytes) std::memcpy(device.data() + off, src, bytes);
    return 1;
  }
  bool done(Ticket) override { return true; }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ubep::fuzz::Bytes in(data, size);
  const Config config{static_cast<std::size_t>(in.u16() % 4096 + 1), in.u8() % 4 + 1};
  std::vector<std::uint8_t> device(kDevice);
  std::vector<std::vector<std::uint8_t>> slots(config.slots, std::vector<std::uint8_t>(config.chunk_bytes, 7));
  std::vector<void*> slot_ptrs;
  for (auto& s : slots) slot_ptrs.push_back(s.data());
  Engine engine(device);
  std::set<std::uint64_t> completed;
  Target target(
      config, engine, slot_ptrs, [](int) {},
      [&](const ChunkHeader& h) {
        UBEP_FUZZ_CHECK(completed.insert(h.transfer).second,
                        "transfer " + std::to_string(h.transfer) + " completed twice");
      });
  target.set_dest_check([](const ChunkHeader& h) {
    return h.dest <= kDevice && h.total <= kDevice - h.dest ? std::string() : std::string("field 'dest': outside");
  });
  const auto u64 = [&] { return in.u32() | (static_cast<std::uint64_t>(in.u32()) << 32); };
  for (int step = 0; step < 64 && !in.empty(); ++step) {
    const std::uint8_t what = in.u8() % 3;
    if (what == 0) {
      const int slot = static_cast<int>(in.u8() % (config.slots + 1));
      ChunkHeader h;
      h.transfer = in.u8() % 2 ? in.u8() : u64();
      h.offset = in.u8() % 2 ? in.u16() : u64();
      h.bytes = in.u8() % 2 ? in.u16() : u64();
      h.total = in.u8() % 2 ? in.u16() : u64();
      h.dest = in.u8() % 2 ? in.u16() : u64();
      h.signal = in.u8();
      try {
        target.arrive(slot, h);
      } catch (const ubep::Error& e) {
        UBEP_FUZZ_CHECK(e.code() == ubep::Errc::protocol, std::string("not a protocol error: ") + e.what());
        ubep::fuzz::check_message(e, "GPU staging");
      }
    } else if (what == 1) {
      target.progress();
    } else {
      GetRequest q{u64(), u64(), u64(), in.u8()};
      const std::uint64_t expected = in.u8();
      const std::string why = check_get_request(q, expected, kDevice);
      if (why.empty()) {
        UBEP_FUZZ_CHECK(q.seq == expected, "a get request out of sequence accepted");
        UBEP_FUZZ_CHECK(q.src <= kDevice && q.bytes <= kDevice - q.src, "a get request outside the heap accepted");
        UBEP_FUZZ_CHECK(!(q.dest & kAbsolute), "a get request with the absolute bit accepted");
      } else {
        UBEP_FUZZ_CHECK(why.rfind("field '", 0) == 0, "a rejection that names no field: " + why);
      }
    }
  }
  return 0;
}
