#include "transports/node_fds.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <utility>

#include "base/log.hpp"
#include "base/mpi_check.hpp"
#include "ubep/error.hpp"

namespace ubep::detail {
namespace {

// Closes what it holds unless released: the listener, a connection, the fds received before a throw.
class Fds {
 public:
  explicit Fds(std::size_t n) : fds_(n, -1) {}
  Fds(const Fds&) = delete;
  Fds& operator=(const Fds&) = delete;
  ~Fds() {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  int& operator[](std::size_t i) { return fds_[i]; }
  std::vector<int> release() { return std::exchange(fds_, {}); }

 private:
  std::vector<int> fds_;
};

// What the exchange's non-blocking collectives read and write: on the heap, so that a collective still pending
// inside MPI after a timeout writes into live memory (it is then kept for the life of the process).
struct Buffers {
  struct {
    int ok;
    int rank;
  } mine{}, first{};
  std::uint64_t tag = 0;
  MPI_Request req = MPI_REQUEST_NULL;
};

struct Exchange {
  int world_rank;
  const char* call;

  // Waits for buf's request until the deadline (no timeout when <= 0).
  void wait(std::unique_ptr<Buffers>& buf, const char* what, std::chrono::duration<double> timeout) const {
    const auto start = std::chrono::steady_clock::now();
    for (unsigned polls = 0;; ++polls) {
      int done = 0;
      UBEP_MPI_CHECK(world_rank, call, MPI_Test(&buf->req, &done, MPI_STATUS_IGNORE));
      if (done) return;
      if (timeout.count() > 0 && (polls & 63) == 0 && std::chrono::steady_clock::now() - start > timeout) {
        (void)buf.release();  // MPI still owns the request and its buffers
        throw Error(Errc::timeout, message_prefix(world_rank, call) + "waited " + std::to_string(timeout.count()) +
                                       " s (UBEP_WAIT_TIMEOUT) in " + what +
                                       " of the fd exchange: a node peer has not joined it");
      }
      if (polls > 256) sched_yield();
    }
  }

  [[noreturn]] void sys_fail(const std::string& what) const {
    const int err = errno;
    throw Error(Errc::internal, message_prefix(world_rank, call) + "exchanging fds with node peers: " + what + ": " +
                                    std::strerror(err));
  }
};

// The abstract socket of node rank `r`: "\0ubep-fds-<job tag>-<r>" (no file; gone when its socket closes).
sockaddr_un address(std::uint64_t tag, int r, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string name = "ubep-fds-" + std::to_string(tag) + "-" + std::to_string(r);
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

}  // namespace

std::vector<int> exchange_node_fds(MPI_Comm node_comm, int my_fd, int world_rank, const char* call,
                                   std::chrono::duration<double> timeout,
                                   const std::function<void(const std::string&)>& on_listen) {
  const Exchange ex{world_rank, call};
  int n = 0, me = 0;
  UBEP_MPI_CHECK(world_rank, call, MPI_Comm_size(node_comm, &n));
  UBEP_MPI_CHECK(world_rank, call, MPI_Comm_rank(node_comm, &me));

  // Every rank fails together when one gives an fd that is not open, before any socket exists.
  auto buf = std::make_unique<Buffers>();
  buf->mine = {my_fd == -1 || ::fcntl(my_fd, F_GETFD) != -1 ? 1 : 0, world_rank};
  UBEP_MPI_CHECK(world_rank, call,
                 MPI_Iallreduce(&buf->mine, &buf->first, 1, MPI_2INT, MPI_MINLOC, node_comm, &buf->req));
  ex.wait(buf, "MPI_Iallreduce (every fd open)", timeout);
  if (!buf->first.ok) {
    const bool mine_ok = buf->mine.ok != 0;
    throw Error(Errc::invalid_argument,
                message_prefix(world_rank, call) + "rank " + std::to_string(buf->first.rank) +
                    (mine_ok ? " gave" : " (this rank) gave") + " a file descriptor that is not open" +
                    (mine_ok ? "" : " (fd " + std::to_string(my_fd) + ")") + "; no fd was exchanged");
  }

  // One name per exchange: node rank 0 draws it (pid and 64 random bits), so two jobs or two exchanges on
  // one host never meet.
  if (me == 0) {
    std::random_device rd;
    buf->tag = ((static_cast<std::uint64_t>(rd()) << 32) | rd()) ^ static_cast<std::uint64_t>(::getpid());
  }
  UBEP_MPI_CHECK(world_rank, call, MPI_Ibcast(&buf->tag, 1, MPI_UINT64_T, 0, node_comm, &buf->req));
  ex.wait(buf, "MPI_Ibcast (the socket names)", timeout);
  const std::uint64_t tag = buf->tag;
  // Who may connect: the node ranks' pids (SO_PEERCRED names the process at the other end of a connection).
  auto pids = std::make_unique<std::vector<std::int64_t>>(static_cast<std::size_t>(n) + 1, 0);
  (*pids)[static_cast<std::size_t>(n)] = static_cast<std::int64_t>(::getpid());
  UBEP_MPI_CHECK(world_rank, call,
                 MPI_Iallgather(pids->data() + n, 1, MPI_INT64_T, pids->data(), 1, MPI_INT64_T, node_comm, &buf->req));
  try {
    ex.wait(buf, "MPI_Iallgather (the node ranks' pids)", timeout);
  } catch (...) {
    (void)pids.release();  // MPI still writes into it
    throw;
  }

  Fds listener(1);
  listener[0] = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener[0] < 0) ex.sys_fail("socket(AF_UNIX)");
  socklen_t len = 0;
  sockaddr_un self = address(tag, me, len);
  if (::bind(listener[0], reinterpret_cast<sockaddr*>(&self), len) != 0) ex.sys_fail("bind (abstract socket)");
  if (::listen(listener[0], n + 16) != 0) ex.sys_fail("listen");
  if (on_listen) on_listen("ubep-fds-" + std::to_string(tag) + "-" + std::to_string(me));
  // Every rank listens before any connects (a connect then never blocks: the backlog holds every peer).
  UBEP_MPI_CHECK(world_rank, call, MPI_Ibarrier(node_comm, &buf->req));
  ex.wait(buf, "MPI_Ibarrier (every rank listens)", timeout);

  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    Fds conn(1);
    conn[0] = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (conn[0] < 0) ex.sys_fail("socket(AF_UNIX)");
    sockaddr_un peer = address(tag, p, len);
    if (::connect(conn[0], reinterpret_cast<sockaddr*>(&peer), len) != 0) {
      ex.sys_fail("connect to node rank " + std::to_string(p));
    }
    std::int32_t from = me;
    iovec iov{&from, sizeof from};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (my_fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &my_fd, sizeof(int));
    }
    if (::sendmsg(conn[0], &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof from)) {
      ex.sys_fail("sendmsg to node rank " + std::to_string(p));
    }
  }

  Fds out(static_cast<std::size_t>(n));
  std::vector<bool> got(static_cast<std::size_t>(n), false);
  got[static_cast<std::size_t>(me)] = true;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const uid_t uid = ::geteuid();
  std::size_t intruders = 0;  // connections of processes other than the node ranks, closed unread
  for (int received = 0; received < n - 1;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd pfd{listener[0], POLLIN, 0};
    const int ready =
        ::poll(&pfd, 1, timeout.count() > 0 ? static_cast<int>(std::max<long long>(left.count(), 0)) : -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) ex.sys_fail("poll");
    if (ready == 0) {
      std::string missing;
      for (int p = 0; p < n; ++p) {
        if (!got[static_cast<std::size_t>(p)]) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
      }
      throw Error(Errc::timeout,
                  message_prefix(world_rank, call) + "waited " + std::to_string(timeout.count()) +
                      " s (UBEP_WAIT_TIMEOUT) for the fds of node ranks " + missing + " of " + std::to_string(n) +
                      (intruders ? "; " + std::to_string(intruders) + " connection(s) of other processes were ignored"
                                 : std::string()));
    }
    Fds conn(1);
    conn[0] = ::accept4(listener[0], nullptr, nullptr, SOCK_CLOEXEC);
    if (conn[0] < 0) ex.sys_fail("accept");
    // Before reading a byte: the peer process must be ours (uid) and one of the node ranks (pid).
    ucred cred{};
    socklen_t cred_len = sizeof cred;
    if (::getsockopt(conn[0], SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) ex.sys_fail("getsockopt(SO_PEERCRED)");
    const auto peer = std::find(pids->begin(), pids->begin() + n, static_cast<std::int64_t>(cred.pid));
    if (cred.uid != uid || peer == pids->begin() + n || peer == pids->begin() + me) {
      ++intruders;  // closed unread (Fds)
      continue;
    }
    const int peer_rank = static_cast<int>(peer - pids->begin());
    std::int32_t from = -1;
    iovec iov{&from, sizeof from};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t got_bytes = ::recvmsg(conn[0], &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    if (got_bytes < 0) ex.sys_fail("recvmsg");
    int fd = -1;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
    }
    if (got_bytes != static_cast<ssize_t>(sizeof from) || from != peer_rank || got[static_cast<std::size_t>(from)] ||
        (msg.msg_flags & MSG_CTRUNC)) {
      if (fd >= 0) ::close(fd);
      throw Error(Errc::protocol, message_prefix(world_rank, call) + "exchanging fds with node peers: a message of " +
                                      std::to_string(got_bytes) + " bytes from node rank " + std::to_string(peer_rank) +
                                      " (pid " + std::to_string(cred.pid) + ") claims node rank " +
                                      std::to_string(from) + " (of " + std::to_string(n) +
                                      "), which is not that peer, or its fd came already");
    }
    got[static_cast<std::size_t>(from)] = true;
    out[static_cast<std::size_t>(from)] = fd;
    ++received;
  }
  if (my_fd >= 0) {
    out[static_cast<std::size_t>(me)] = ::fcntl(my_fd, F_DUPFD_CLOEXEC, 0);
    if (out[static_cast<std::size_t>(me)] < 0) ex.sys_fail("dup of this rank's fd");
  }
  return out.release();
}

}  // namespace ubep::detail
