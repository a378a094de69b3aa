// ucx: UCP to every peer, in one of two modes per peer (chosen at setup, UBEP_UCX_MODE).
// What users get from it: docs/ROUTES.md, "The ucx route".
//
// am (TCP, shared memory, any endpoint without one lane for hardware RMA and atomics). Every operation
// is one active message {kind, offsets, value} + payload on the endpoint to the peer (transports/ucx/wire.hpp);
// the target's handler (run inside its ucp_worker_progress) checks the header, then writes the data into its
// heap and applies signals and atomics with CPU atomics (release), so they are atomic with respect to
// load/store atomics on the same words. get and fetching atomics are request/reply.
// Ordering. Every stream message carries a sequence number per (source, target); the target applies them in
// that order, holding back any that arrives early (UCP does not promise the order of active messages on one
// endpoint across lanes and rails). A message too large for eager delivery arrives as a rendezvous descriptor
// whose data lands later, and later messages from that source wait behind it. Hence everything to one peer is
// one ordered stream and fence() is free. flush(pe) sends a counted request that the target answers only when
// every earlier message from this rank has been applied (ucp_ep_flush over tcp would not prove that), and
// waits for that answer, for the local completion of every send, and for every get reply from pe.
//
// rdma (an endpoint with one lane carrying RMA and atomics, e.g. rc/dc on InfiniBand or RoCE; or
// forced). The heap is mapped once (ucp_mem_map) and its packed rkey exchanged over MPI at setup.
// put/get are ucp_put_nbx/ucp_get_nbx, atomics ucp_atomic_op_nbx, and every signal or non-fetching
// atomic is preceded by ucp_worker_fence, so it lands after the data. flush(pe) is ucp_ep_flush_nbx.
// The atomics are UCX's (the NIC's on hardware lanes): atomic with respect to each other, not with
// respect to CPU atomics on the same word (hence rdma is chosen only per peer, and docs/ROUTES.md says what
// holds where).
//
// Progress. In am mode (and in rdma mode emulated in software) the target must progress its worker for
// messages to land: the runtime calls progress() in every wait, poll and collective, and its progress thread
// calls thread_pass() whenever the worker's event fd says something arrived (threaded transports). Every wait
// here polls with the back-off and the deadline given at construction (UBEP_WAIT_TIMEOUT) and throws
// Errc::timeout naming the peer. A wait that times out leaves its operation in flight, tracked as any other
// (a later quiet() completes it): nothing stays marked as waited for.
//
// Failures. A peer whose endpoint fails (UCX's error callback, a send that fails) is unreachable: operations to
// it throw Errc::unreachable at once, answers owed to it are dropped. A message that fails a check
// (wire.hpp, sequence numbers, answer tokens) isolates its source: its later messages are dropped and operations
// to it throw Errc::protocol. Either error is also thrown once by this rank's next call into the transport (on
// the caller's thread: the progress thread never throws, it keeps the error for the caller).
#pragma once

#include <mpi.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "transports/transport.hpp"
#include "transports/ucx/wire.hpp"
#include "ubep/options.hpp"

namespace ubep::detail {

class UcxTransport final : public Transport {
 public:
  using Msg = ucx_wire::Msg;

  /// Collective over `comm`: a UCP context and worker, worker addresses exchanged, an endpoint to every
  /// rank (itself included), and one request/answer with every peer so that all endpoints are wired up;
  /// unless `mode` is "am", the heap [base, base + heap_bytes) mapped and its rkey exchanged. `mode`:
  /// UBEP_UCX_MODE (auto, am, rdma); the mode of each peer is then fixed. `threaded`: a progress thread
  /// calls thread_pass() beside the caller's thread; every entry point then takes one lock (the worker runs in
  /// UCS_THREAD_MODE_SERIALIZED), and the worker has an event fd (UCP_FEATURE_WAKEUP) the thread sleeps on.
  /// `threaded` must be the same on every rank (the UCP features choose the lanes).
  UcxTransport(MPI_Comm comm, int rank, int nranks, char* base, std::size_t heap_bytes, const std::string& mode,
               std::chrono::duration<double> timeout, const PollPolicy& poll, bool threaded, std::size_t eager_max);
  /// Local: drops every message that still arrives, cancels the receives in flight (a get's destination may
  /// be freed already), closes the endpoints (force), destroys the worker and the context. Never
  /// communicates.
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  const char* name() const noexcept override { return "ucx"; }
  void put(std::size_t offset, const void* src, std::size_t bytes, int pe) override;
  void put_nbi(std::size_t offset, const void* src, std::size_t bytes, int pe) override;
  void get(void* dst, std::size_t offset, std::size_t bytes, int pe) override;
  void get_nbi(void* dst, std::size_t offset, std::size_t bytes, int pe) override;
  std::uint64_t fetch_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, std::uint64_t compare,
                             int pe) override;
  void post_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) override;
  /// A signal behind every earlier operation to pe (am: the next message of the stream; rdma: a fence, then
  /// the update: a set is an 8-byte put). Returns at once: it waits for no earlier send.
  void post_signal(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) override;
  /// am: one active message: the handler writes the data, then applies the signal (a rendezvous applies
  /// it when the data is in); with wait_local, waits for the local completion of this message only.
  /// rdma: put, fence, signal (the put locally complete before the signal is issued, in both cases).
  bool put_with_signal(std::size_t offset, const void* src, std::size_t bytes, AtomicOp op, std::size_t sig_offset,
                       std::uint64_t value, int pe, bool wait_local) override;
  void fence() override;
  void flush(int pe) override;
  void flush_all() override;
  /// Every send and get to pe locally complete: no message, it waits for UCX's requests (and am get
  /// replies).
  void flush_local(int pe) override;
  /// Flushes every peer other than pe with data (puts) in flight: one round trip for all of them.
  void order_before_signal(int pe) override;
  bool outstanding() const noexcept override { return !dirty_list_.empty(); }
  /// Progresses the worker: runs the handlers of arrived messages, continues rendezvous receives, and
  /// sends the answers they owe. Cheap when nothing arrived. Throws the error kept for this rank (a failed
  /// peer, a protocol violation), once.
  /// Returns whether a message for this rank landed (applied, answered, or queued in its source's order).
  bool progress();
  bool poll() override { return progress(); }
  void poll_keeping_errors() noexcept override;

  // ---- the progress thread (threaded transports) ----
  /// The worker's event file descriptor: readable when something may have arrived after arm() said "sleep".
  int event_fd() const noexcept { return efd_; }
  /// The thread's pass: progress() without throwing (an error is kept for the caller's thread).
  void thread_pass() noexcept;
  /// Arms the worker's event fd; true when the thread may sleep on it (nothing arrived since the last pass).
  bool arm() noexcept;
  /// Local work in flight (sends, rendezvous receives, answers awaited): the thread then sleeps briefly only.
  bool busy() noexcept;
  /// How often the caller's thread has progressed the worker (progress(), poll_keeping_errors()): while this moves,
  /// the caller serves the worker itself and the thread stays away from it (no wake-ups, no lock to contend for).
  std::uint64_t app_polls() const noexcept { return app_polls_.load(std::memory_order_relaxed); }

  /// "UCX 1.13.1, mode am (active messages)", for ubep-info.
  std::string describe() const override;
  /// The mode used to reach pe ("am" or "rdma") and why, and pe's lanes as UCX reports them
  /// ("tcp/eth0[rma_bw am am_bw]; ..."), for ubep-info.
  std::string describe_peer(int pe) const override;
  bool rdma(int pe) const { return rdma_[pe] != 0; }

  /// Called by UCX for every arrived message (public for the handler; not an interface).
  ucs_status_t on_message(const Msg& m, void* data, std::size_t length, bool rndv);
  /// Called by UCX when the endpoint to pe fails (public for the callback; not an interface).
  void on_endpoint_error(int pe, ucs_status_t status);
  struct EndpointArg {  // the argument of an endpoint's error callback
    UcxTransport* self;
    int pe;
  };
  /// Tests only: sends `m` (as is: no sequence number or version of ours) and `bytes` of `payload` to pe, as a
  /// corrupt or forged peer would; waits for its local completion.
  void send_raw_for_testing(int pe, const Msg& m, const void* payload, std::size_t bytes);
  /// Tests only: takes the next sequence number of the stream to pe (for a message sent by send_raw_for_testing).
  std::uint64_t take_sequence_for_testing(int pe);
  /// Tests only: the next get reply received by rendezvous completes as failed (UCS_ERR_ENDPOINT_TIMEOUT), as when
  /// its peer's endpoint fails mid-transfer.
  void fail_next_get_reply_for_testing();

 private:
  struct Send {  // a send in flight: its header (or atomic operands) must live until UCX completes it
    Msg hdr;
    void* req;
    int pe;
    bool held = false;          // a blocking call waits for it and erases it (cleared when that wait times out)
    std::uint64_t operand = 0;  // rdma atomics: the operand and the reply buffer
    std::uint64_t reply = 0;
  };
  struct Incoming {  // a stream message that cannot be applied yet: early, or behind an unfinished rendezvous
    Msg m;
    std::vector<std::byte> data;  // eager payload, copied
    void* desc = nullptr;         // rendezvous descriptor (not yet received)
    void* req = nullptr;          // the rendezvous receive in progress
    bool rndv = false;
  };
  struct Source {                             // the stream from one source
    std::uint64_t next = 1;                   // the sequence number applied next
    std::deque<Incoming> backlog;             // in order, behind an unfinished rendezvous
    std::map<std::uint64_t, Incoming> early;  // arrived before their turn
  };
  struct Pending {          // what this rank waits for: a get, a fetching atomic, a flush answer
    std::uint8_t kind = 0;  // the answer expected (wire Kind)
    void* dst = nullptr;
    std::size_t bytes = 0;
    std::uint64_t value = 0;
    void* req = nullptr;  // rendezvous receive of a get reply
    void* desc = nullptr;
    int pe = 0;
    bool done = false;
    bool keep = false;    // a waiter erases it (blocking get, atomics, flushes); else erased when answered
    bool failed = false;  // done, but its reply never (fully) arrived: the waiter throws Errc::unreachable
  };

  /// Operations in flight (sends not locally complete plus answers awaited) before a new one first waits
  /// for half of them: 10^6 put_nbi before one quiet() stay bounded in memory (about 400 bytes each) and
  /// progress() never walks an unbounded list; an rdma peer is flushed every kMaxInFlight operations (UCX
  /// queues completed-at-once RMA internally). The waits have the UBEP_WAIT_TIMEOUT deadline.
  static constexpr std::size_t kMaxInFlight = 16384;
  /// How far ahead of its turn a stream message may arrive (more is a protocol violation, not a reordering).
  static constexpr std::uint64_t kReorderWindow = 1u << 20;
  void throttle(int pe, const char* what);
  /// A stream message (numbered here) or an answer: throttled first unless it is an answer.
  void send(int pe, Msg hdr, const void* buf, std::size_t bytes, bool wait_local, const char* what);
  void send_now(int pe, const Msg& hdr, const void* buf, std::size_t bytes, bool wait_local, const char* what);
  /// The parameters of an active message of `bytes` payload: eager up to eager_max_, rendezvous above it.
  ucp_request_param_t send_param(std::size_t bytes) const;
  /// A request answered by `answer`: throttled, then registered (token, gets counted), then sent; nothing stays
  /// registered when the throttle or the send throws. Returns the token.
  std::uint64_t request(int pe, Msg m, std::uint8_t answer, void* dst, std::size_t dst_bytes, bool keep,
                        const char* what);
  /// Waits for the answer to `token` (kept for the caller); on a timeout the entry is left to its answer
  /// (erased when it comes), so nothing waits for it any more.
  void await(const char* what, int pe, std::uint64_t token);
  /// Tracks the request of `s` (the newest entry of sends_); with wait_local, waits for it and erases it.
  /// Returns s.reply when it waited (or the operation completed in the call).
  std::uint64_t track(Send& s, void* req, bool wait_local, const char* what);
  // rdma mode: one UCP RMA or atomic operation to pe; the request is tracked like a send.
  void rdma_put(std::size_t offset, const void* src, std::size_t bytes, int pe, bool wait_local, const char* what);
  void rdma_get(void* dst, std::size_t offset, std::size_t bytes, int pe, bool wait, const char* what);
  /// Fetching (reply returned, waited for) or not (posted; fenced behind every earlier operation).
  std::uint64_t rdma_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, std::uint64_t compare, int pe,
                            bool fetching, const char* what);
  /// A signal behind a fence: a set is an 8-byte put (only signals and waits touch the word), an add an
  /// atomic.
  void rdma_signal(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe);
  void choose_modes(const std::string& mode);
  void flush_peers(const std::vector<int>& peers, const char* what);  // in parallel; clears their marks
  void* flush_ep(int pe);                                             // ucp_ep_flush_nbx, started
  void finish_flush(void* req, int pe);                               // frees it; throws if it failed
  void map_heap(MPI_Comm comm, std::size_t heap_bytes);
  /// Every rank's `bytes` bytes at `mine`, concatenated in rank order; displs[i] = where rank i's start.
  std::vector<char> allgather(MPI_Comm comm, const void* mine, std::size_t bytes, std::vector<int>& displs) const;
  void send_put(std::size_t offset, const void* src, std::size_t bytes, int pe, bool wait_local, const char* what);
  Msg header(std::uint8_t kind) const;
  ucs_status_t on_answer(const Msg& m, void* data, std::size_t length, bool rndv);
  void apply(const Msg& m, const void* data, std::size_t length);
  void answer(int to, Msg reply, const void* buf, std::size_t bytes);
  /// Applies what each source's stream allows, in order; starts and finishes rendezvous receives.
  void drain();
  void drain_source(int src);
  void reap_sends();
  bool sends_done(int pe);                    // every send to pe locally complete
  bool flushed(int pe, std::uint64_t token);  // pe answered `token`, and nothing to it is in flight
  std::uint64_t expect(std::uint8_t kind, void* dst, std::size_t bytes, int pe);
  void wait(const char* what, int pe, const std::function<bool()>& done);
  void mark(int pe);
  void unmark(int pe);  // flushed: nothing to pe in flight
  /// Throws Errc::unreachable / Errc::protocol when pe failed or was isolated (for every operation to pe).
  void check_peer(int pe, const char* what) const;
  /// A get whose reply was received by rendezvous with `status`: done, and failed (the error kept) unless UCS_OK.
  void finish_get(Pending& p, ucs_status_t status);
  /// Keeps `error` for the caller's thread (the first one only, until thrown).
  void keep_error(std::exception_ptr error);
  /// The caller's thread: throws the kept error, once.
  void raise_kept();
  /// A message from `src` broke the protocol: isolates src, keeps Errc::protocol for the caller.
  void violation(int src, const Msg& m, const std::string& what);
  [[noreturn]] void fail(const char* what, ucs_status_t status) const;

  /// Holds the lock of a threaded transport for one entry point (recursive: waits progress inside).
  std::unique_lock<std::recursive_mutex> guard() {
    return threaded_ ? std::unique_lock<std::recursive_mutex>(mu_) : std::unique_lock<std::recursive_mutex>();
  }

  int rank_;
  int nranks_;
  bool threaded_;
  std::recursive_mutex mu_;
  char* base_;
  std::size_t heap_bytes_;
  std::chrono::duration<double> timeout_;
  const PollPolicy& poll_;
  ucp_context_h context_ = nullptr;
  ucp_mem_h mem_ = nullptr;                 // the heap, mapped (modes other than am)
  std::vector<ucp_rkey_h> rkeys_;           // per pe: its heap's rkey
  std::vector<std::uint64_t> remote_base_;  // per pe: its heap's address
  std::vector<std::uint8_t> rdma_;          // per pe: 1 = rdma mode
  std::vector<std::string> lanes_;          // per pe: its lanes, for describe_peer
  std::vector<std::string> why_;            // per pe: why this mode
  bool any_rdma_ = false;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::vector<ucp_ep_h> eps_;
  std::vector<EndpointArg> ep_args_;
  std::list<Send> sends_;
  std::vector<Source> sources_;         // per source
  std::vector<int> backlogged_;         // sources with a backlog or early messages
  std::vector<std::uint64_t> seq_out_;  // per pe: the last sequence number sent
  struct Answer {
    int to;
    Msg m;
    const void* buf;
    std::size_t bytes;
  };
  std::vector<Answer> owed_;
  std::unordered_map<std::uint64_t, Pending> pending_;  // by token
  std::vector<int> gets_in_flight_;                     // per pe
  std::vector<std::size_t> rdma_unflushed_;             // per rdma pe: operations since throttle() flushed it
  std::uint64_t next_token_ = 1;
  std::vector<std::uint8_t> dirty_;
  std::vector<std::uint8_t> data_dirty_;  // per pe: puts issued since its last flush
  std::vector<int> dirty_list_;
  std::vector<std::uint64_t> get_rndv_tokens_;  // get answers arrived by rendezvous, to receive
  bool in_progress_ = false;
  std::size_t eager_max_;                       // UBEP_UCX_EAGER_MAX: the protocol flag of each send
  std::uint64_t landed_ = 0;                    // messages for this rank that passed the checks (progress())
  bool in_thread_ = false;                      // the progress thread's pass is running: errors are kept, never thrown
  std::atomic<std::uint64_t> app_polls_{0};     // see app_polls()
  bool fail_next_get_reply_ = false;            // fail_next_get_reply_for_testing
  bool closing_ = false;                        // the destructor runs: every arriving message is dropped
  std::vector<std::string> failed_;             // per pe: why it is unreachable (empty: reachable)
  std::vector<std::string> isolated_;           // per pe: the protocol violation that isolated it (empty: none)
  std::vector<std::uint64_t> dropped_answers_;  // per pe: answers owed to it that could not go (it failed)
  std::exception_ptr kept_;                     // the error the caller's thread throws next
};

// Shared by the files that implement UcxTransport (transports/ucx/: setup, sending, operations, rdma, flush,
// handlers, progress, peer_errors).

/// The active-message id of every ubep message: the handler set up at construction, every send.
inline constexpr unsigned kAmId = 7;

/// The status of a request as a UCX call returned it: a null request completed in the call (UCS_OK).
inline ucs_status_t request_status(void* req) { return req ? ucp_request_check_status(req) : UCS_OK; }

}  // namespace ubep::detail
