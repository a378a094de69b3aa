#include "transports/staging.hpp"

#include <algorithm>
#include <utility>

#include "ubep/error.hpp"

namespace ubep::detail::staging {
namespace {

std::string describe(const ChunkHeader& h) {
  return "transfer " + std::to_string(h.transfer) + " at offset " + std::to_string(h.offset) + " (" +
         std::to_string(h.bytes) + " of " + std::to_string(h.total) + " bytes)";
}

void check_config(const Config& c, std::size_t host_slots, const char* side) {
  if (c.chunk_bytes == 0 || c.slots <= 0 || host_slots != static_cast<std::size_t>(c.slots)) {
    throw Error(Errc::invalid_argument, std::string("ubep: GPU staging (") + side + "): chunk of " +
                                            std::to_string(c.chunk_bytes) + " bytes, " + std::to_string(c.slots) +
                                            " slots, " + std::to_string(host_slots) +
                                            " host buffers: needs a chunk > 0 and one buffer per slot (>= 1)");
  }
}

}  // namespace

// ---- Origin --------------------------------------------------------------------------------------------

Origin::Origin(Config config, CopyEngine& engine, Wire& wire, std::vector<void*> host_slots)
    : config_(config), engine_(engine), wire_(wire) {
  check_config(config_, host_slots.size(), "origin");
  for (void* h : host_slots) {
    Slot s;
    s.host = h;
    slots_.push_back(s);
  }
}

std::uint64_t Origin::put(const void* src, std::uint64_t dest, std::uint64_t bytes, std::uint64_t signal) {
  if (src == nullptr && bytes > 0) {
    throw Error(Errc::invalid_argument, "ubep: GPU staging: put of " + std::to_string(bytes) + " bytes from null");
  }
  const std::uint64_t id = next_id_++;
  queue_.push_back(Transfer{id, static_cast<const std::byte*>(src), dest, bytes, signal, 0});
  return id;
}

bool Origin::progress() {
  bool changed = false;
  for (int slot : wire_.credits()) {
    if (slot < 0 || slot >= static_cast<int>(slots_.size()) || slots_[slot].state != SlotState::sent) {
      throw Error(Errc::protocol,
                  "ubep: GPU staging: a credit for slot " + std::to_string(slot) + ", which is not awaiting one");
    }
    slots_[slot].state = SlotState::free;
    --in_flight_;
    changed = true;
  }
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    Slot& s = slots_[i];
    if (s.state != SlotState::copying) continue;
    bool done = false;
    try {
      done = engine_.done(s.ticket);
    } catch (const Error& e) {
      throw Error(e.code(), std::string(e.what()) + " (GPU staging, device to host: " + describe(s.header) + ")",
                  e.native());
    }
    if (!done) continue;
    wire_.send(i, s.host, s.header);
    s.state = SlotState::sent;
    changed = true;
  }
  for (int i = 0; i < static_cast<int>(slots_.size()) && !queue_.empty(); ++i) {
    Slot& s = slots_[i];
    if (s.state != SlotState::free) continue;
    Transfer& t = queue_.front();
    const std::uint64_t n = std::min<std::uint64_t>(config_.chunk_bytes, t.bytes - t.next);
    s.header = ChunkHeader{t.id, t.next, n, t.bytes, t.dest, t.signal};
    s.ticket = engine_.to_host(s.host, t.src + t.next, n);
    s.state = SlotState::copying;
    max_in_flight_ = std::max(max_in_flight_, ++in_flight_);
    t.next += n;
    if (t.next >= t.bytes) queue_.pop_front();  // an empty transfer is its one empty chunk
    changed = true;
  }
  return changed;
}

bool Origin::idle() const { return queue_.empty() && in_flight_ == 0; }

std::string Origin::pending() const {
  std::string out;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.state == SlotState::free) continue;
    out += (out.empty() ? "" : "; ") + describe(s.header) + " (slot " + std::to_string(i) +
           (s.state == SlotState::copying ? ", copying to host)" : ", awaiting its credit)");
  }
  for (const Transfer& t : queue_) {
    out += (out.empty() ? "" : "; ") + std::string("transfer ") + std::to_string(t.id) + " queued from offset " +
           std::to_string(t.next) + " of " + std::to_string(t.bytes);
  }
  return out;
}

// ---- Target --------------------------------------------------------------------------------------------

Target::Target(Config config, CopyEngine& engine, std::vector<void*> host_slots, std::function<void(int)> credit,
               std::function<void(const ChunkHeader&)> complete)
    : config_(config),
      engine_(engine),
      slots_(std::move(host_slots)),
      busy_(slots_.size(), false),
      credit_(std::move(credit)),
      complete_(std::move(complete)) {
  check_config(config_, slots_.size(), "target");
}

std::string check_get_request(const GetRequest& q, std::uint64_t expected_seq, std::uint64_t heap_bytes) {
  if (q.seq != expected_seq) {
    return "field 'seq' = " + std::to_string(q.seq) + ": expected " + std::to_string(expected_seq);
  }
  if (q.src > heap_bytes || q.bytes > heap_bytes - q.src) {
    return "field 'src' = " + std::to_string(q.src) + ": [src, +" + std::to_string(q.bytes) +
           " bytes) is outside the " + std::to_string(heap_bytes) + "-byte GPU heap";
  }
  if (q.dest & kAbsolute) return "field 'dest' = " + std::to_string(q.dest) + ": has the bit the server sets";
  return {};
}

void Target::arrive(int slot, const ChunkHeader& h) {
  const auto bad = [&](const std::string& why) {
    throw Error(Errc::protocol, "ubep: GPU staging: slot " + std::to_string(slot) + ": " + describe(h) + ": " + why);
  };
  // A transfer id is at most this far ahead of the next one to complete (the origin has at most one per slot in
  // flight, and ids are consecutive): more is a forged id, which would grow landing_ without bound.
  constexpr std::uint64_t kWindow = std::uint64_t{1} << 20;
  if (slot < 0 || slot >= static_cast<int>(slots_.size())) bad("no such slot");
  if (busy_[slot]) bad("the slot is still being drained");
  if (h.bytes > config_.chunk_bytes) {
    bad("field 'bytes': larger than a slot (" + std::to_string(config_.chunk_bytes) + " bytes)");
  }
  if (h.offset > h.total || h.bytes > h.total - h.offset || (h.bytes == 0 && h.total != 0)) {
    bad("field 'offset': past the transfer's end");
  }
  if (h.transfer < next_complete_) bad("field 'transfer': that transfer is complete already");
  if (h.transfer - next_complete_ >= kWindow) bad("field 'transfer': too far ahead of the transfers in flight");
  auto it = landing_.find(h.transfer);
  if (it == landing_.end()) {
    if (check_dest_) {
      if (const std::string why = check_dest_(h); !why.empty()) bad(why);
    }
    it = landing_.emplace(h.transfer, Landing{h}).first;
  }
  Landing& l = it->second;
  if (l.first.total != h.total || l.first.dest != h.dest || l.first.signal != h.signal) {
    bad("its total, destination or signal differ from the transfer's first chunk");
  }
  if (h.bytes > h.total - l.arrived) bad("more bytes than the transfer holds arrived");
  const CopyEngine::Ticket t = engine_.to_device(reinterpret_cast<void*>(h.dest + h.offset), slots_[slot], h.bytes);
  l.arrived += h.bytes;
  busy_[slot] = true;
  copying_.push_back(Busy{slot, t, h});
}

bool Target::progress() {
  bool changed = false;
  for (auto it = copying_.begin(); it != copying_.end();) {
    bool done = false;
    try {
      done = engine_.done(it->ticket);
    } catch (const Error& e) {
      throw Error(e.code(), std::string(e.what()) + " (GPU staging, host to device: " + describe(it->header) + ")",
                  e.native());
    }
    if (!done) {
      ++it;
      continue;
    }
    landing_.at(it->header.transfer).landed += it->header.bytes;
    busy_[it->slot] = false;
    credit_(it->slot);  // the slot's bytes are on the device: the origin may refill it
    it = copying_.erase(it);
    changed = true;
  }
  // In id order: the origin's put order.
  for (auto it = landing_.find(next_complete_); it != landing_.end() && it->second.landed == it->second.first.total &&
                                                it->second.arrived == it->second.first.total;
       it = landing_.find(next_complete_)) {
    // An empty transfer completes once its empty chunk has passed through a slot (above).
    if (it->second.first.total == 0 && std::any_of(copying_.begin(), copying_.end(), [&](const Busy& b) {
          return b.header.transfer == next_complete_;
        })) {
      break;
    }
    complete_(it->second.first);
    landing_.erase(it);
    ++next_complete_;
    changed = true;
  }
  return changed;
}

bool Target::idle() const { return copying_.empty() && landing_.empty(); }

}  // namespace ubep::detail::staging
