#include "transports/mpi_rma.hpp"

#include <algorithm>
#include <climits>

#include "runtime/mpi_check.hpp"

namespace ubep::detail {
namespace {
// MPI counts are int: move large transfers in chunks of 1 GiB.
constexpr std::size_t kChunk = std::size_t{1} << 30;
}  // namespace

MpiRmaTransport::MpiRmaTransport(MPI_Win win, int rank, int nranks, bool signal_put)
    : win_(win),
      rank_(rank),
      dirty_(nranks, 0),
      data_dirty_(nranks, 0),
      fenced_(nranks, 0),
      signal_put_(signal_put),
      signal_words_(nranks) {}

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
  signal_words_[pe].clear();
}

const std::uint64_t* MpiRmaTransport::operand(std::uint64_t value) {
  // Operands live until a flush; a stream of signals with no data in between must not grow them forever.
  if (operands_.size() >= 4096) flush_all();
  operands_.push_back(value);
  return &operands_.back();
}

void MpiRmaTransport::after_signal_put(std::size_t offset, int pe) {
  // MPI orders neither two puts nor a put and an accumulate to one word: flush the earlier signal put.
  const std::vector<std::size_t>& words = signal_words_[pe];
  if (std::find(words.begin(), words.end(), offset) != words.end()) flush(pe);
}

const std::uint64_t* MpiRmaTransport::prepare_word_update(std::size_t offset, std::uint64_t value, int pe) {
  // Release semantics: data still in flight to pe must land before the word changes.
  if (data_dirty_[pe]) flush(pe);
  after_signal_put(offset, pe);
  const std::uint64_t* origin = operand(value);
  before_op(pe);
  return origin;
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
  if (bytes) UBEP_MPI_CHECK(rank_, "put", MPI_Win_flush_local(pe, win_));
}

void MpiRmaTransport::put_nbi(std::size_t offset, const void* src, std::size_t bytes, int pe) {
  issue_put(offset, src, bytes, pe);
}

void MpiRmaTransport::get(void* dst, std::size_t offset, std::size_t bytes, int pe) {
  issue_get(dst, offset, bytes, pe);
  if (bytes) UBEP_MPI_CHECK(rank_, "get", MPI_Win_flush_local(pe, win_));
}

void MpiRmaTransport::get_nbi(void* dst, std::size_t offset, std::size_t bytes, int pe) {
  issue_get(dst, offset, bytes, pe);
}

std::uint64_t MpiRmaTransport::fetch_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand,
                                            std::uint64_t compare, int pe) {
  after_signal_put(offset, pe);
  before_op(pe);
  std::uint64_t result = 0;
  const auto disp = static_cast<MPI_Aint>(offset);
  switch (op) {
    case AtomicOp::fetch_add:
      UBEP_MPI_CHECK(rank_, "atomic_fetch_add",
                     MPI_Fetch_and_op(&operand, &result, MPI_UINT64_T, pe, disp, MPI_SUM, win_));
      break;
    case AtomicOp::swap:
      UBEP_MPI_CHECK(rank_, "atomic_swap",
                     MPI_Fetch_and_op(&operand, &result, MPI_UINT64_T, pe, disp, MPI_REPLACE, win_));
      break;
    case AtomicOp::fetch:
      UBEP_MPI_CHECK(rank_, "atomic_fetch",
                     MPI_Fetch_and_op(nullptr, &result, MPI_UINT64_T, pe, disp, MPI_NO_OP, win_));
      break;
    case AtomicOp::compare_swap:
      UBEP_MPI_CHECK(rank_, "atomic_compare_swap",
                     MPI_Compare_and_swap(&operand, &compare, &result, MPI_UINT64_T, pe, disp, win_));
      break;
    default: throw Error(Errc::internal, "ubep: mpi transport: not a fetching atomic");
  }
  mark(pe, false);
  UBEP_MPI_CHECK(rank_, "atomic", MPI_Win_flush_local(pe, win_));
  return result;
}

void MpiRmaTransport::post_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) {
  const std::uint64_t* value = prepare_word_update(offset, operand, pe);
  const MPI_Op mop = op == AtomicOp::add ? MPI_SUM : MPI_REPLACE;
  UBEP_MPI_CHECK(rank_, "signal/atomic",
                 MPI_Accumulate(value, 1, MPI_UINT64_T, pe, static_cast<MPI_Aint>(offset), 1, MPI_UINT64_T, mop, win_));
  mark(pe, false);
}

void MpiRmaTransport::post_signal(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) {
  if (op != AtomicOp::set || !signal_put_) return post_atomic(op, offset, operand, pe);
  // A set signal as one 8-byte put: prepare_word_update completes the data first, so the word changes
  // only after the data is in place, without the remote lock osc ucx takes for every accumulate. The
  // target reads the aligned word with an atomic load and sees the old or the new value.
  const std::uint64_t* value = prepare_word_update(offset, operand, pe);
  UBEP_MPI_CHECK(rank_, "signal",
                 MPI_Put(value, 1, MPI_UINT64_T, pe, static_cast<MPI_Aint>(offset), 1, MPI_UINT64_T, win_));
  signal_words_[pe].push_back(offset);
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
  UBEP_MPI_CHECK(rank_, "flush", MPI_Win_flush(pe, win_));
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
  for (int pe : dirty_list_) UBEP_MPI_CHECK(rank_, "quiet", MPI_Win_flush(pe, win_));
  for (int pe : dirty_list_) clear(pe);
  dirty_list_.clear();
  operands_.clear();
  any_fenced_ = false;
}

void MpiRmaTransport::flush_data() {
  if (dirty_list_.empty()) return;
  const std::vector<int> peers = dirty_list_;
  for (int pe : peers) {
    if (data_dirty_[pe]) flush(pe);
  }
}

void MpiRmaTransport::progress(MPI_Comm comm) {
  UBEP_MPI_CHECK(rank_, "progress", MPI_Win_sync(win_));
  int flag = 0;
  UBEP_MPI_CHECK(rank_, "progress", MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, MPI_STATUS_IGNORE));
}

}  // namespace ubep::detail
