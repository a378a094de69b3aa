#include "transports/ucx/wire.hpp"

namespace ubep::detail::ucx_wire {
namespace {

std::string field(const char* name, std::uint64_t value, const std::string& why) {
  return std::string("field '") + name + "' = " + std::to_string(value) + ": " + why;
}

/// [offset, offset + bytes) inside the heap, without overflow.
bool in_heap(std::uint64_t offset, std::uint64_t bytes, std::size_t heap) {
  return offset <= heap && bytes <= heap - offset;
}

/// An 8-byte aligned word inside the heap.
std::string check_word(const char* name, std::uint64_t offset, std::size_t heap) {
  if (offset % 8 != 0) return field(name, offset, "a 64-bit word's offset must be 8-byte aligned");
  if (!in_heap(offset, 8, heap))
    return field(name, offset, "the word is outside the " + std::to_string(heap) + "-byte heap");
  return {};
}

bool posted(std::uint8_t op) { return op == op_add || op == op_set; }
bool fetching(std::uint8_t op) {
  return op == op_fetch_add || op == op_compare_swap || op == op_swap || op == op_fetch;
}

}  // namespace

std::string kind_name(std::uint8_t kind) {
  switch (kind) {
    case put_data: return "put_data";
    case put_signal: return "put_signal";
    case atomic_post: return "atomic_post";
    case get_req: return "get_req";
    case get_reply: return "get_reply";
    case fetch_req: return "fetch_req";
    case fetch_reply: return "fetch_reply";
    case flush_req: return "flush_req";
    case flush_reply: return "flush_reply";
    default: break;
  }
  return "kind " + std::to_string(kind);
}

std::string check_message(const Msg& m, std::size_t length, bool rndv, const Limits& limits) {
  if (m.version != kVersion) {
    return field("version", m.version,
                 "this rank speaks wire version " + std::to_string(kVersion) +
                     " (a peer built from another ubep version, or a corrupt message)");
  }
  if (limits.nranks <= 0 || m.src >= static_cast<std::uint32_t>(limits.nranks)) {
    return field("src", m.src, "not a rank of this context [0, " + std::to_string(limits.nranks) + ")");
  }
  const std::size_t heap = limits.heap_bytes;
  const bool answer = is_answer(m.kind);
  if (m.kind < put_data || m.kind > flush_reply) return field("kind", m.kind, "unknown message kind");
  if (answer && m.seq != 0) return field("seq", m.seq, "an answer carries no sequence number");
  if (!answer && m.seq == 0) return field("seq", m.seq, "a " + kind_name(m.kind) + " must carry a sequence number");
  if (rndv && m.kind != put_data && m.kind != put_signal && m.kind != get_reply) {
    return field("kind", m.kind, kind_name(m.kind) + " cannot arrive by rendezvous (it has no payload)");
  }
  const bool payload = m.kind == put_data || m.kind == put_signal || m.kind == get_reply;
  if (!payload && length != 0) {
    return field("length", length, kind_name(m.kind) + " carries no payload");
  }
  switch (m.kind) {
    case put_data:
    case put_signal:
      if (m.bytes != length) return field("bytes", m.bytes, "the payload is " + std::to_string(length) + " bytes");
      if (!in_heap(m.offset, m.bytes, heap)) {
        return field(
            "offset", m.offset,
            "[offset, +" + std::to_string(m.bytes) + " bytes) is outside the " + std::to_string(heap) + "-byte heap");
      }
      if (m.kind == put_signal) {
        if (!posted(m.op)) return field("op", m.op, "a signal is add or set");
        return check_word("compare (the signal's offset)", m.compare, heap);
      }
      return {};
    case atomic_post:
      if (!posted(m.op)) return field("op", m.op, "a posted atomic is add or set");
      return check_word("offset", m.offset, heap);
    case fetch_req:
      if (!fetching(m.op)) return field("op", m.op, "a fetching atomic is fetch_add, compare_swap, swap or fetch");
      if (m.token == 0) return field("token", m.token, "a request needs a token");
      return check_word("offset", m.offset, heap);
    case get_req:
      if (m.token == 0) return field("token", m.token, "a request needs a token");
      if (!in_heap(m.offset, m.bytes, heap)) {
        return field(
            "offset", m.offset,
            "[offset, +" + std::to_string(m.bytes) + " bytes) is outside the " + std::to_string(heap) + "-byte heap");
      }
      return {};
    case flush_req:
    case get_reply:
    case fetch_reply:
    case flush_reply:
      if (m.token == 0) return field("token", m.token, "a request or answer needs a token");
      return {};
    default: break;
  }
  return field("kind", m.kind, "unknown message kind");
}

}  // namespace ubep::detail::ucx_wire
