// The ucx route's wire format in am mode, and its checks (no UCX here: tests/fuzz/fuzz_ucx_wire.cpp drives
// check_message with arbitrary bytes).
//
// Every message is one UCP active message: a Msg header, then a payload (the data of a put, a get's reply). A
// peer is untrusted input (docs/RELIABILITY.md, "Trust"): the target checks every header before it acts on it, and a
// message that fails a check is dropped, its source isolated (its later messages dropped, operations to it
// refused with Errc::protocol) and the application told by its next call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ubep::detail::ucx_wire {

/// Changes whenever the header or the meaning of a field changes: a peer built from another version is refused.
inline constexpr std::uint16_t kVersion = 0x5b02;

/// Stream messages are applied by the target in the order the source sent them (their `seq`); answers are
/// matched to the request that asked for them (their `token`) and carry seq 0.
enum Kind : std::uint8_t {
  put_data = 1,  // offset, bytes: the payload, written at heap offset `offset`
  put_signal,    // put_data, then the signal: `op` (add, set) with `value` on the word at heap offset `compare`
  atomic_post,   // `op` (add, set) with `value` on the word at `offset`; no answer
  get_req,       // `bytes` from `offset`, answered by get_reply (token)
  get_reply,     // the payload: exactly the bytes asked for
  fetch_req,     // a fetching `op` with `value` (and `compare`) on the word at `offset`, answered by fetch_reply
  fetch_reply,   // `value`: the old value
  flush_req,     // answered by flush_reply once every earlier message of the stream is applied
  flush_reply,
};

/// The operations of atomic_post, put_signal and fetch_req: AtomicOp's values (transports/transport.hpp).
enum Op : std::uint8_t { op_fetch_add, op_compare_swap, op_swap, op_fetch, op_add, op_set };

struct Msg {
  std::uint32_t src;      ///< the sender's rank
  std::uint8_t kind;      ///< Kind
  std::uint8_t op;        ///< Op, for the kinds that apply one
  std::uint16_t version;  ///< kVersion
  std::uint64_t seq;      ///< stream messages: 1, 2, ... per (source, target); answers 0
  std::uint64_t offset;   ///< heap offset of the data or word
  std::uint64_t value;    ///< signal or atomic operand; fetch_reply: the old value
  std::uint64_t compare;  ///< compare_swap: the expected value; put_signal: the signal's heap offset
  std::uint64_t token;    ///< requests and answers: the requester's id of the request
  std::uint64_t bytes;    ///< put_data, put_signal: the payload; get_req: bytes asked for
};
static_assert(sizeof(Msg) == 56, "the wire header has a fixed layout");

constexpr bool is_answer(std::uint8_t kind) noexcept {
  return kind == get_reply || kind == fetch_reply || kind == flush_reply;
}

/// What this rank accepts, for check_message.
struct Limits {
  int nranks = 0;              ///< ranks of the context
  std::size_t heap_bytes = 0;  ///< this rank's symmetric heap
};

/// The checks of one arrived message that need nothing but the message itself: version, source rank, kind, op,
/// every offset and length within the heap (without overflow), 8-byte words aligned, the payload's length
/// against the header, a rendezvous only where a payload can be large. Returns an empty string when it passes,
/// else what is wrong, naming the field ("field 'offset' = 123: ..."). The stateful checks (sequence numbers,
/// answer tokens, a reply's length against its request) are the transport's.
std::string check_message(const Msg& m, std::size_t length, bool rndv, const Limits& limits);

/// "put_data", "get_reply", ..., or "kind 200" for an unknown kind.
std::string kind_name(std::uint8_t kind);

}  // namespace ubep::detail::ucx_wire
