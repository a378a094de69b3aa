#include "transports/mpi_rma.hpp"

#include <algorithm>
#include <climits>
#include <string>

#include "base/mpi_check.hpp"
#include "base/poll.hpp"
#include "ubep/error.hpp"

namespace ubep::detail {
namespace {
// MPI counts are int: move large transfers in chunks of 1 GiB.
constexpr std::size_t kChunk = std::size_t{1} << 30;
constexpr int kSignalTag = 0x7573;     // signal messages (their communicator carries nothing else)
constexpr std::uint64_t kWake = 0xff;  // a message that changes no word: an atomic landed (SimGrid builds)
}  // namespace

std::string check_signal_message(std::uint64_t offset, std::uint64_t op, std::size_t heap_bytes, std::uint64_t wake) {
  if (op == wake) return {};
  if (op != static_cast<std::uint64_t>(AtomicOp::add) && op != static_cast<std::uint64_t>(AtomicOp::set)) {
    return "field 'op' = " + std::to_string(op) + ": a signal is add or set";
  }
  if (offset % 8 != 0 || offset > heap_bytes || heap_bytes - offset < 8) {
    return "field 'offset' = " + std::to_string(offset) + ": not an aligned word of the " + std::to_string(heap_bytes) +
           "-byte heap";
  }
  return {};
}

MpiRmaTransport::MpiRmaTransport(MPI_Win win, int rank, int nranks, bool signal_put, bool bounded, bool all,
                                 std::vector<std::uint8_t> off_host, std::chrono::duration<double> timeout,
                                 const PollPolicy& poll, MPI_Comm chan, char* base, std::size_t heap_bytes)
    : win_(win),
      rank_(rank),
      dirty_(nranks, 0),
      data_dirty_(nranks, 0),
      fenced_(nranks, 0),
      signal_put_(signal_put),
      word_updates_(nranks),
      bounded_(std::move(off_host)),
      blocking_(bounded, timeout, poll, rank),
      chan_(chan),
      base_(base),
      sent_(nranks, 0),
      heap_bytes_(heap_bytes),
      timeout_(timeout),
      poll_(poll) {
  if (all) bounded_.assign(nranks, 1);
}

MpiRmaTransport::~MpiRmaTransport() = default;

void MpiRmaTransport::close() noexcept {
  if (recv_ != MPI_REQUEST_NULL) {  // local teardown: errors cannot be reported from here
    MPI_Cancel(&recv_);
    MPI_Wait(&recv_, MPI_STATUS_IGNORE);
  }
  // Sends their targets never received (finalize() applies every message first, so only after a failure): MPI
  // owns them; their buffers stay allocated for the life of the process.
  for (std::size_t i = 0; i < send_reqs_.size(); ++i) {
    int done = 0;
    if (send_reqs_[i] != MPI_REQUEST_NULL && MPI_Test(&send_reqs_[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done)
      continue;
    if (send_reqs_[i] != MPI_REQUEST_NULL) MPI_Request_free(&send_reqs_[i]);
    (void)send_bufs_[i].release();
  }
  send_reqs_.clear();
  send_bufs_.clear();
  send_to_.clear();
  chan_ = MPI_COMM_NULL;
}

std::size_t MpiRmaTransport::reap_messages(const char* what) {
  if (send_reqs_.empty()) return 0;
  int done = 0;
  UBEP_MPI_CHECK(rank_, what,
                 MPI_Testall(static_cast<int>(send_reqs_.size()), send_reqs_.data(), &done, MPI_STATUSES_IGNORE));
  if (done) {
    for (auto& b : send_bufs_) free_bufs_.push_back(std::move(b));
    send_reqs_.clear();
    send_bufs_.clear();
    send_to_.clear();
    return 0;
  }
  // Some are still in flight: keep those (MPI_Testall leaves the completed ones as MPI_REQUEST_NULL? not
  // promised when it returns false, so test them one by one).
  std::size_t kept = 0;
  for (std::size_t i = 0; i < send_reqs_.size(); ++i) {
    int one = send_reqs_[i] == MPI_REQUEST_NULL ? 1 : 0;
    if (!one) UBEP_MPI_CHECK(rank_, what, MPI_Test(&send_reqs_[i], &one, MPI_STATUS_IGNORE));
    if (one) {
      free_bufs_.push_back(std::move(send_bufs_[i]));
      continue;
    }
    send_reqs_[kept] = send_reqs_[i];
    send_bufs_[kept] = std::move(send_bufs_[i]);
    send_to_[kept] = send_to_[i];
    ++kept;
  }
  send_reqs_.resize(kept);
  send_bufs_.resize(kept);
  send_to_.resize(kept);
  return kept;
}

void MpiRmaTransport::send_message(std::uint64_t offset, std::uint64_t op, std::uint64_t value, int pe,
                                   const char* what) {
  std::string late;  // the deadline passed waiting for a free send: said after this one went out
  if (send_reqs_.size() >= kMaxSignalSends && reap_messages(what) >= kMaxSignalSends) {
    const auto start = std::chrono::steady_clock::now();
    Backoff backoff(poll_);
    while (reap_messages(what) >= kMaxSignalSends) {
      int flag = 0;  // MPI's progress: a peer's sends to this rank complete too (it may wait for them)
      UBEP_MPI_CHECK(rank_, what, MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, chan_, &flag, MPI_STATUS_IGNORE));
      backoff.pause();
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (timeout_.count() > 0 && waited > timeout_.count()) {
        std::vector<int> behind;
        for (int to : send_to_) {
          if (std::find(behind.begin(), behind.end(), to) == behind.end()) behind.push_back(to);
        }
        std::string ranks;
        for (int to : behind) ranks += " " + std::to_string(to);
        late = std::to_string(send_reqs_.size()) + " signal messages still unreceived after " + std::to_string(waited) +
               " s (UBEP_WAIT_TIMEOUT), to rank" + ranks +
               ", not progressing MPI (stalled, dead, or computing without calling ubep); this signal to rank " +
               std::to_string(pe) + " was sent all the same (none is lost)";
        break;
      }
    }
  }
  std::unique_ptr<std::array<std::uint64_t, 3>> buf;
  if (free_bufs_.empty()) {
    buf = std::make_unique<std::array<std::uint64_t, 3>>();
  } else {
    buf = std::move(free_bufs_.back());
    free_bufs_.pop_back();
  }
  *buf = {offset, op, value};
  MPI_Request req = MPI_REQUEST_NULL;
  UBEP_MPI_CHECK(rank_, what, MPI_Isend(buf->data(), 3, MPI_UINT64_T, pe, kSignalTag, chan_, &req));
  send_reqs_.push_back(req);
  send_bufs_.push_back(std::move(buf));
  send_to_.push_back(pe);
  ++sent_[pe];
  if (!late.empty()) throw Error(Errc::timeout, "ubep: rank " + std::to_string(rank_) + ": " + what + ": " + late);
}

std::size_t MpiRmaTransport::deliver(bool block) {
  if (chan_ == MPI_COMM_NULL) return 0;
  std::size_t n = 0;
  for (;;) {
    if (recv_ == MPI_REQUEST_NULL) {
      UBEP_MPI_CHECK(rank_, "signal (receive)",
                     MPI_Irecv(inbox_, 3, MPI_UINT64_T, MPI_ANY_SOURCE, kSignalTag, chan_, &recv_));
    }
    int done = 0;
    MPI_Status st{};
    if (block && n == 0) {
      UBEP_MPI_CHECK(rank_, "signal (wait for a message)", MPI_Wait(&recv_, &st));
      done = 1;
    } else {
      UBEP_MPI_CHECK(rank_, "signal (receive)", MPI_Test(&recv_, &done, &st));
    }
    if (!done) return n;
    ++applied_;
    ++n;
    // A message is input: its word must be a whole, aligned word of this heap, its op a signal's (or the wake).
    const std::uint64_t off = inbox_[0], op = inbox_[1];
    if (const std::string why = check_signal_message(off, op, heap_bytes_, kWake); !why.empty()) {
      throw Error(Errc::protocol,
                  "ubep: rank " + std::to_string(rank_) + ": signal (message): a signal message from rank " +
                      std::to_string(st.MPI_SOURCE) + " breaks the protocol: " + why + "; it was dropped");
    }
    if (op != kWake) apply_posted(base_, off, static_cast<AtomicOp>(op), inbox_[2]);
    if (block) return n;  // the caller checks its condition before waiting again
  }
}

void MpiRmaTransport::blocking(const char* what, int pe, bool always, std::function<void()> fn, bool* started) {
  // Handing a call to the worker costs a thread switch (several microseconds on a shared core): only
  // calls that can wait for the target pay it.
  if (always || bounded_[pe]) {
    blocking_.run(what, pe, std::move(fn), started);
  } else {
    if (started) *started = true;
    fn();
  }
}

void MpiRmaTransport::before_op(int pe) {
  if (any_fenced_ && fenced_[pe]) flush(pe);
}

void MpiRmaTransport::mark(int pe, bool data) {
  if (!dirty_[pe]) {
    dirty_[pe] = 1;
    dirty_list_.push_back(pe);
  }
  if (data) data_dirty_[pe] = 1;
}

void MpiRmaTransport::clear(int pe) {
  dirty_[pe] = data_dirty_[pe] = fenced_[pe] = 0;
  word_updates_[pe].clear();
}

const std::uint64_t* MpiRmaTransport::operand(std::uint64_t value) {
  // Operands live until a flush; a stream of signals with no data in between must not grow them forever.
  if (operands_.size() >= 4096) flush_all();
  operands_.push_back(value);
  return &operands_.back();
}

void MpiRmaTransport::order_word_update(std::size_t offset, int pe, bool by_put, bool record) {
  std::vector<WordUpdate>& words = word_updates_[pe];
  auto it = std::find_if(words.begin(), words.end(), [&](const WordUpdate& w) { return w.offset == offset; });
  if (it != words.end() && (it->by_put || by_put)) {
    flush(pe);  // clears the record of pe
    it = words.end();
  }
  if (!record) return;
  if (it == words.end()) {
    words.push_back({offset, by_put});
  } else {
    it->by_put = it->by_put || by_put;
  }
}

const std::uint64_t* MpiRmaTransport::prepare_word_update(std::size_t offset, std::uint64_t value, int pe,
                                                          bool by_put) {
  // Release semantics: data still in flight to pe must land before the word changes.
  if (data_dirty_[pe]) flush(pe);
  order_word_update(offset, pe, by_put, true);
  const std::uint64_t* origin = operand(value);
  before_op(pe);
  return origin;
}

void MpiRmaTransport::flush_checked(int pe, const char* what) {
  blocking(what, pe, false, [win = win_, pe, rank = rank_] { UBEP_MPI_CHECK(rank, "flush", MPI_Win_flush(pe, win)); });
}

void MpiRmaTransport::issue_put(std::size_t offset, const void* src, std::size_t bytes, int pe) {
  before_op(pe);
  const char* p = static_cast<const char*>(src);
  for (std::size_t done = 0; done < bytes; done += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, bytes - done));
    UBEP_MPI_CHECK(rank_, "put",
                   MPI_Put(p + done, n, MPI_BYTE, pe, static_cast<MPI_Aint>(offset + done), n, MPI_BYTE, win_));
  }
  if (bytes) mark(pe, true);
}

void MpiRmaTransport::issue_get(void* dst, std::size_t offset, std::size_t bytes, int pe) {
  before_op(pe);
  char* p = static_cast<char*>(dst);
  for (std::size_t done = 0; done < bytes; done += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, bytes - done));
    UBEP_MPI_CHECK(rank_, "get",
                   MPI_Get(p + done, n, MPI_BYTE, pe, static_cast<MPI_Aint>(offset + done), n, MPI_BYTE, win_));
  }
  if (bytes) mark(pe, true);
}

void MpiRmaTransport::put(std::size_t offset, const void* src, std::size_t bytes, int pe) {
  issue_put(offset, src, bytes, pe);
  if (bytes) flush_local(pe, "MPI_Win_flush_local (put)");
}

void MpiRmaTransport::put_nbi(std::size_t offset, const void* src, std::size_t bytes, int pe) {
  issue_put(offset, src, bytes, pe);
}

void MpiRmaTransport::get(void* dst, std::size_t offset, std::size_t bytes, int pe) {
  issue_get(dst, offset, bytes, pe);
  if (bytes) flush_local(pe, "MPI_Win_flush_local (get)");
}

void MpiRmaTransport::get_nbi(void* dst, std::size_t offset, std::size_t bytes, int pe) {
  issue_get(dst, offset, bytes, pe);
}

std::uint64_t MpiRmaTransport::fetch_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand,
                                            std::uint64_t compare, int pe) {
  if (op != AtomicOp::fetch_add && op != AtomicOp::swap && op != AtomicOp::fetch && op != AtomicOp::compare_swap) {
    throw Error(Errc::internal, "ubep: mpi transport: not a fetching atomic");
  }
  order_word_update(offset, pe, false, false);  // complete on return: nothing to record
  before_op(pe);
  // Operand, compare value and result live in the caller's scratch words: if the call outlives a
  // timeout, MPI still reads and writes live memory.
  std::uint64_t* w = blocking_.scratch();
  w[0] = 0;
  w[1] = operand;
  w[2] = compare;
  const auto disp = static_cast<MPI_Aint>(offset);
  blocking("fetching atomic (MPI_Fetch_and_op/MPI_Compare_and_swap + MPI_Win_flush_local)", pe, true,
           [w, op, disp, pe, win = win_, rank = rank_] {
             switch (op) {
               case AtomicOp::fetch_add:
                 UBEP_MPI_CHECK(rank, "atomic_fetch_add",
                                MPI_Fetch_and_op(&w[1], &w[0], MPI_UINT64_T, pe, disp, MPI_SUM, win));
                 break;
               case AtomicOp::swap:
                 UBEP_MPI_CHECK(rank, "atomic_swap",
                                MPI_Fetch_and_op(&w[1], &w[0], MPI_UINT64_T, pe, disp, MPI_REPLACE, win));
                 break;
               case AtomicOp::fetch:
                 UBEP_MPI_CHECK(rank, "atomic_fetch",
                                MPI_Fetch_and_op(nullptr, &w[0], MPI_UINT64_T, pe, disp, MPI_NO_OP, win));
                 break;
               default:
                 UBEP_MPI_CHECK(rank, "atomic_compare_swap",
                                MPI_Compare_and_swap(&w[1], &w[2], &w[0], MPI_UINT64_T, pe, disp, win));
                 break;
             }
             UBEP_MPI_CHECK(rank, "atomic", MPI_Win_flush_local(pe, win));
           });
  mark(pe, false);
  return w[0];
}

void MpiRmaTransport::wake(int pe) {
  // A simulated rank waiting for this word blocks until a message comes (deliver): once the atomic is
  // complete at pe, tell it to look again. Real MPI builds poll the word and need no message.
  if (!UBEP_SIMGRID || chan_ == MPI_COMM_NULL) return;
  flush(pe);
  send_message(0, kWake, 0, pe, "atomic (wake message)");
}

void MpiRmaTransport::post_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) {
  const std::uint64_t* value = prepare_word_update(offset, operand, pe, false);
  const MPI_Op mop = op == AtomicOp::add ? MPI_SUM : MPI_REPLACE;
  const auto disp = static_cast<MPI_Aint>(offset);
  // osc ucx takes a remote lock for every accumulate: it can wait for the target like a flush.
  bool started = false;
  try {
    blocking(
        "MPI_Accumulate", pe, false,
        [value, mop, disp, pe, win = win_, rank = rank_] {
          UBEP_MPI_CHECK(rank, "signal/atomic",
                         MPI_Accumulate(value, 1, MPI_UINT64_T, pe, disp, 1, MPI_UINT64_T, mop, win));
        },
        &started);
  } catch (...) {
    if (started) {  // it stays pending inside MPI, and completes there
      ++updates_issued_;
      mark(pe, false);
    }
    throw;
  }
  ++updates_issued_;
  mark(pe, false);
  wake(pe);
}

void MpiRmaTransport::post_signal(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) {
  if (chan_ != MPI_COMM_NULL) {
    // The data completes first (release); MPI keeps the messages of one origin in order, so nothing about
    // the word is recorded. MPI_Send of 24 bytes returns once buffered (eager), without the target.
    if (data_dirty_[pe]) flush(pe);
    before_op(pe);
    ++updates_issued_;  // send_message sends it even when it then throws
    send_message(offset, static_cast<std::uint64_t>(op), operand, pe, "signal (message)");
    return;
  }
  if (op != AtomicOp::set || !signal_put_) return post_atomic(op, offset, operand, pe);
  // A set signal as one 8-byte put: prepare_word_update completes the data first, so the word changes
  // only after the data is in place, without the remote lock osc ucx takes for every accumulate. The
  // target reads the aligned word with an atomic load and sees the old or the new value.
  const std::uint64_t* value = prepare_word_update(offset, operand, pe, true);
  UBEP_MPI_CHECK(rank_, "signal",
                 MPI_Put(value, 1, MPI_UINT64_T, pe, static_cast<MPI_Aint>(offset), 1, MPI_UINT64_T, win_));
  ++updates_issued_;
  mark(pe, false);
}

void MpiRmaTransport::fence() {
  for (int pe : dirty_list_) {
    fenced_[pe] = 1;
    any_fenced_ = true;
  }
}

void MpiRmaTransport::flush(int pe) {
  if (!dirty_[pe]) return;
  flush_checked(pe, "MPI_Win_flush");
  clear(pe);
  dirty_list_.erase(std::find(dirty_list_.begin(), dirty_list_.end(), pe));
  if (dirty_list_.empty()) {
    operands_.clear();
    any_fenced_ = false;
  }
}

void MpiRmaTransport::flush_all() {
  if (dirty_list_.empty()) return;
  // One MPI_Win_flush per peer in flight, not MPI_Win_flush_all: with Open MPI 4.1.4's osc ucx,
  // flush_all after thousands of puts to several peers sometimes returned before the puts to one peer
  // had landed (rma_test NonBlockingManyOutstandingThenQuiet, np4, forced mpi route: 1 run in 6).
  // A peer whose flush timed out stays in the list (cleared only once flushed), so a later quiet retries it.
  while (!dirty_list_.empty()) {
    const int pe = dirty_list_.back();
    flush_checked(pe, "MPI_Win_flush (quiet)");
    clear(pe);
    dirty_list_.pop_back();
  }
  dirty_list_.clear();
  operands_.clear();
  any_fenced_ = false;
}

void MpiRmaTransport::flush_local(int pe, const char* what) {
  blocking(what, pe, false,
           [win = win_, pe, rank = rank_] { UBEP_MPI_CHECK(rank, "flush_local", MPI_Win_flush_local(pe, win)); });
}

void MpiRmaTransport::flush_data() {
  if (dirty_list_.empty()) return;
  const std::vector<int> peers = dirty_list_;
  for (int pe : peers) {
    if (data_dirty_[pe]) flush(pe);
  }
}

void MpiRmaTransport::progress(MPI_Comm comm) {
  if (chan_ != MPI_COMM_NULL) {  // the receive's test progresses MPI too
    deliver(false);
    reap_messages("progress");
    return;
  }
  UBEP_MPI_CHECK(rank_, "progress", MPI_Win_sync(win_));
  int flag = 0;
  UBEP_MPI_CHECK(rank_, "progress", MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, MPI_STATUS_IGNORE));
}

}  // namespace ubep::detail
