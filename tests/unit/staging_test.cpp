// The staged GPU route's protocol (transports/staging.hpp) with host-memory fakes: a copy engine whose copies
// happen only when done() says so, after a random number of polls (so a slot reused too early would corrupt
// data), and a wire that delivers chunk headers to the target in a shuffled order. Checks: every byte lands,
// each transfer completes after all of its bytes and in put order, at most `slots` chunks are in flight, a
// stalled target stops the origin, and every error names the transfer and the chunk.
#include "transports/staging.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ubep/error.hpp"

namespace ubep::detail::staging {
namespace {

class FakeEngine : public CopyEngine {
 public:
  explicit FakeEngine(unsigned seed, int max_delay) : rng_(seed), max_delay_(max_delay) {}
  Ticket to_host(void* host, const void* device, std::size_t bytes) override { return start(host, device, bytes); }
  Ticket to_device(void* device, const void* host, std::size_t bytes) override { return start(device, host, bytes); }
  bool done(Ticket t) override {
    Copy& c = copies_.at(t);
    if (c.done) return true;
    if (t == fail_ticket) throw Error(Errc::internal, "fake copy " + std::to_string(t) + " failed");
    if (c.polls-- > 0) return false;
    if (c.bytes) std::memcpy(c.dst, c.src, c.bytes);  // the copy happens now, not when it was started
    c.done = true;
    return true;
  }
  Ticket fail_ticket = 0;
  Ticket issued() const { return next_ - 1; }

 private:
  struct Copy {
    void* dst;
    const void* src;
    std::size_t bytes;
    int polls;
    bool done = false;
  };
  Ticket start(void* dst, const void* src, std::size_t bytes) {
    copies_.emplace(next_, Copy{dst, src, bytes, std::uniform_int_distribution<int>(0, max_delay_)(rng_)});
    return next_++;
  }
  std::mt19937 rng_;
  int max_delay_;
  Ticket next_ = 1;
  std::map<Ticket, Copy> copies_;
};

// Data into the target's slot at once (a put), the header queued; deliver() hands queued headers to the target
// in a random order.
class FakeWire : public Wire {
 public:
  FakeWire(std::vector<std::vector<std::byte>>& target_slots, unsigned seed)
      : target_slots_(target_slots), rng_(seed) {}
  void send(int slot, const void* src, const ChunkHeader& h) override {
    if (h.bytes) std::memcpy(target_slots_.at(slot).data(), src, h.bytes);
    arrivals_.push_back({slot, h});
  }
  std::vector<int> credits() override { return std::exchange(credits_, {}); }
  void deliver(Target& t) {
    std::shuffle(arrivals_.begin(), arrivals_.end(), rng_);
    for (const auto& [slot, h] : std::exchange(arrivals_, {})) t.arrive(slot, h);
  }
  std::vector<int> credits_;

 private:
  std::vector<std::vector<std::byte>>& target_slots_;
  std::mt19937 rng_;
  std::vector<std::pair<int, ChunkHeader>> arrivals_;
};

struct Rig {
  Config config;
  FakeEngine origin_engine, target_engine;
  std::vector<std::vector<std::byte>> origin_slots, target_slots;
  FakeWire wire;
  Origin origin;
  Target target;
  std::vector<ChunkHeader> completed;
  std::function<void(const ChunkHeader&)> on_complete;  // called at each completion, after recording it

  static std::vector<void*> pointers(std::vector<std::vector<std::byte>>& v) {
    std::vector<void*> p;
    for (auto& b : v) p.push_back(b.data());
    return p;
  }
  Rig(Config c, unsigned seed, int max_delay)
      : config(c),
        origin_engine(seed, max_delay),
        target_engine(seed + 1, max_delay),
        origin_slots(c.slots, std::vector<std::byte>(c.chunk_bytes)),
        target_slots(c.slots, std::vector<std::byte>(c.chunk_bytes)),
        wire(target_slots, seed + 2),
        origin(c, origin_engine, wire, pointers(origin_slots)),
        target(
            c, target_engine, pointers(target_slots), [this](int slot) { wire.credits_.push_back(slot); },
            [this](const ChunkHeader& h) {
              completed.push_back(h);
              if (on_complete) on_complete(h);
            }) {}
  // Runs both sides until both are idle (or `steps` run out).
  void run(int steps = 1000000) {
    for (int i = 0; i < steps && !(origin.idle() && target.idle()); ++i) {
      origin.progress();
      wire.deliver(target);
      target.progress();
    }
  }
};

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

TEST(Staging, EveryByteLandsAndTransfersCompleteInPutOrderAfterTheirData) {
  const Config c{4096, 3};
  const std::vector<std::size_t> sizes{0, 1, 4095, 4096, 4097, 10 * 4096 + 7, 0, 3 * 4096, 12345};
  for (unsigned seed = 1; seed <= 30; ++seed) {
    Rig rig(c, seed, seed % 5);
    std::vector<std::vector<std::byte>> src, dst;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      src.push_back(pattern(sizes[i], seed * 100 + static_cast<unsigned>(i)));
      dst.emplace_back(sizes[i], std::byte{0});
    }
    // At each completion, the transfer's destination already holds all of its bytes.
    std::vector<bool> complete_when_signalled;
    rig.on_complete = [&](const ChunkHeader& h) {
      const std::size_t i = h.signal;
      complete_when_signalled.push_back(dst[i] == src[i]);
    };
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      rig.origin.put(src[i].data(), reinterpret_cast<std::uint64_t>(dst[i].data()), sizes[i], i);
    }
    rig.run();
    ASSERT_TRUE(rig.origin.idle() && rig.target.idle()) << "seed " << seed << ": " << rig.origin.pending();
    ASSERT_EQ(rig.completed.size(), sizes.size()) << "seed " << seed;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_EQ(rig.completed[i].signal, i) << "seed " << seed << ": completion order";
      EXPECT_EQ(rig.completed[i].transfer, i + 1);
      EXPECT_TRUE(complete_when_signalled[i]) << "seed " << seed << ": transfer " << i << " completed before its data";
      EXPECT_EQ(dst[i], src[i]) << "seed " << seed << ": transfer " << i;
    }
    EXPECT_LE(rig.origin.max_in_flight(), c.slots);
    EXPECT_EQ(rig.origin.max_in_flight(), c.slots) << "the pipeline never filled its slots";
  }
}

TEST(Staging, AStalledTargetStopsTheOriginAtItsSlots) {
  const Config c{1024, 2};
  Rig rig(c, 7, 0);
  const auto src = pattern(10 * 1024, 3);
  std::vector<std::byte> dst(src.size());
  rig.origin.put(src.data(), reinterpret_cast<std::uint64_t>(dst.data()), src.size(), 0);
  for (int i = 0; i < 100; ++i) rig.origin.progress();  // the target never drains: no credit comes back
  EXPECT_EQ(rig.origin.max_in_flight(), 2);
  EXPECT_FALSE(rig.origin.progress()) << "the origin moved with every slot awaiting a credit";
  const std::string p = rig.origin.pending();
  EXPECT_NE(p.find("transfer 1 at offset 0 (1024 of 10240 bytes) (slot 0, awaiting its credit)"), std::string::npos)
      << p;
  EXPECT_NE(p.find("transfer 1 queued from offset 2048 of 10240"), std::string::npos) << p;
  rig.run();  // now the target drains
  EXPECT_EQ(dst, src);
  EXPECT_EQ(rig.completed.size(), 1u);
}

TEST(Staging, CopyFailuresNameTheTransferAndTheChunk) {
  const Config c{1024, 2};
  const auto src = pattern(4096, 5);
  std::vector<std::byte> dst(src.size());
  {
    Rig rig(c, 11, 0);
    rig.origin.put(src.data(), reinterpret_cast<std::uint64_t>(dst.data()), src.size(), 0);
    rig.origin_engine.fail_ticket = 2;  // the second device-to-host copy: offset 1024
    try {
      rig.run();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::internal);
      EXPECT_NE(std::string(e.what()).find("fake copy 2 failed (GPU staging, device to host: transfer 1 at offset 1024 "
                                           "(1024 of 4096 bytes))"),
                std::string::npos)
          << e.what();
    }
  }
  {
    Rig rig(c, 12, 0);
    rig.origin.put(src.data(), reinterpret_cast<std::uint64_t>(dst.data()), src.size(), 0);
    rig.target_engine.fail_ticket = 1;
    try {
      rig.run();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("(GPU staging, host to device: transfer 1 at offset"), std::string::npos)
          << e.what();
    }
  }
}

TEST(Staging, BadConfigsAndContradictoryChunksAreRejected) {
  FakeEngine engine(1, 0);
  std::vector<std::byte> a(64), b(64);
  std::vector<std::vector<std::byte>> slots(1, std::vector<std::byte>(64));
  FakeWire wire(slots, 1);
  EXPECT_THROW(Origin(Config{0, 1}, engine, wire, {a.data()}), Error);
  EXPECT_THROW(Origin(Config{64, 2}, engine, wire, {a.data()}), Error);

  Target t(
      Config{64, 2}, engine, {a.data(), b.data()}, [](int) {}, [](const ChunkHeader&) {});
  std::vector<std::byte> dst(256);
  const auto d = reinterpret_cast<std::uint64_t>(dst.data());
  const auto rejects = [&](int slot, ChunkHeader h, const char* why) {
    try {
      t.arrive(slot, h);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::protocol);  // a header is the peer's: a protocol violation
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  rejects(2, ChunkHeader{1, 0, 64, 256, d, 0}, "no such slot");
  rejects(0, ChunkHeader{1, 0, 65, 256, d, 0}, "larger than a slot");
  rejects(0, ChunkHeader{1, 224, 64, 256, d, 0}, "past the transfer's end");
  t.arrive(0, ChunkHeader{1, 0, 64, 256, d, 0});
  rejects(0, ChunkHeader{1, 64, 64, 256, d, 0}, "still being drained");
  rejects(1, ChunkHeader{1, 64, 64, 512, d, 0}, "differ from the transfer's first chunk");
  // Issue 34: offsets that wrap around, forged transfer ids, destinations the target does not own.
  rejects(1, ChunkHeader{2, ~std::uint64_t{0} - 8, 64, 256, d, 0}, "past the transfer's end");
  rejects(1, ChunkHeader{std::uint64_t{1} << 40, 0, 64, 256, d, 0}, "too far ahead");
  t.set_dest_check([&](const ChunkHeader& h) {
    return h.dest == d && h.total <= dst.size() ? std::string() : std::string("field 'dest': not ours");
  });
  rejects(1, ChunkHeader{2, 0, 64, 4096, d, 0}, "not ours");
  rejects(1, ChunkHeader{2, 0, 64, 64, d + 8, 0}, "not ours");
  EXPECT_EQ(check_get_request(GetRequest{0, 64, 0, 3}, 3, 1024), "");
  EXPECT_NE(check_get_request(GetRequest{0, 64, 0, 4}, 3, 1024).find("'seq'"), std::string::npos);
  EXPECT_NE(check_get_request(GetRequest{1000, 64, 0, 3}, 3, 1024).find("'src'"), std::string::npos);
  EXPECT_NE(check_get_request(GetRequest{8, ~std::uint64_t{0}, 0, 3}, 3, 1024).find("'src'"), std::string::npos);
  EXPECT_NE(check_get_request(GetRequest{0, 8, kAbsolute | 8, 3}, 3, 1024).find("'dest'"), std::string::npos);
}

}  // namespace
}  // namespace ubep::detail::staging
