// exchange_node_fds (transports/node_fds.hpp): the fd exchange node peers will use for the GPU heap (issue 15),
// tested with memfds: every peer's memory mapped through the fd it sent, -1 for "none", a closed fd failing
// every rank together before anything is sent, no fd left open after many exchanges, and a local process that is
// not a node rank ignored (issue 34: SO_PEERCRED) even when it connects first and claims to be a peer.
#include "transports/node_fds.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/mpi/test_util.hpp"
#include "ubep/error.hpp"

namespace ubep {
namespace {

constexpr std::size_t kBytes = 8192;
constexpr std::chrono::duration<double> kTimeout{60.0};

struct Node {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 0, world = 0;
  Node() {
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world, MPI_INFO_NULL, &comm);
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
  }
  ~Node() { MPI_Comm_free(&comm); }
};

int memfd_with_pattern(int node_rank) {
  const int fd = ::memfd_create("ubep-node-fds-test", MFD_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, kBytes), 0);
  std::vector<std::uint8_t> bytes(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) bytes[i] = test::pattern(node_rank, i);
  EXPECT_EQ(::pwrite(fd, bytes.data(), kBytes, 0), static_cast<ssize_t>(kBytes));
  return fd;
}

// Maps fd and checks node rank r's pattern in it.
void expect_pattern(int fd, int r) {
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  ASSERT_EQ(static_cast<std::size_t>(st.st_size), kBytes) << "fd of node rank " << r;
  void* p = ::mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  const auto* b = static_cast<const std::uint8_t*>(p);
  std::size_t bad = kBytes;
  for (std::size_t i = 0; i < kBytes && bad == kBytes; ++i) {
    if (b[i] != test::pattern(r, i)) bad = i;
  }
  EXPECT_EQ(bad, kBytes) << "node rank " << r << "'s memory differs at byte " << bad;
  ::munmap(p, kBytes);
}

std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

TEST(NodeFds, EveryPeerMapsTheMemoryEachSent) {
  Node node;
  const int mine = memfd_with_pattern(node.rank);
  std::vector<int> fds = detail::exchange_node_fds(node.comm, mine, node.world, "test", kTimeout);
  ASSERT_EQ(fds.size(), static_cast<std::size_t>(node.size));
  for (int r = 0; r < node.size; ++r) {
    ASSERT_GE(fds[r], 0) << "node rank " << r;
    expect_pattern(fds[r], r);
  }
  // This rank's own entry is a new descriptor of the same file.
  struct stat a {
  }, b{};
  ASSERT_EQ(::fstat(mine, &a), 0);
  ASSERT_EQ(::fstat(fds[node.rank], &b), 0);
  EXPECT_NE(fds[node.rank], mine);
  EXPECT_EQ(a.st_ino, b.st_ino);
  for (int fd : fds) ::close(fd);
  ::close(mine);
}

TEST(NodeFds, RanksWithoutAnFdGiveMinusOne) {
  Node node;
  const int mine = node.rank % 2 ? -1 : memfd_with_pattern(node.rank);
  std::vector<int> fds = detail::exchange_node_fds(node.comm, mine, node.world, "test", kTimeout);
  ASSERT_EQ(fds.size(), static_cast<std::size_t>(node.size));
  for (int r = 0; r < node.size; ++r) {
    if (r % 2) {
      EXPECT_EQ(fds[r], -1) << "node rank " << r;
    } else {
      ASSERT_GE(fds[r], 0) << "node rank " << r;
      expect_pattern(fds[r], r);
      ::close(fds[r]);
    }
  }
  if (mine >= 0) ::close(mine);
}

TEST(NodeFds, AClosedFdFailsEveryRankTogetherAndLosesNothing) {
  Node node;
  const int closed = 1 << 20;  // far above any open descriptor
  const int mine = node.rank == 0 ? closed : memfd_with_pattern(node.rank);
  int first_world = node.world;  // node rank 0's world rank
  MPI_Bcast(&first_world, 1, MPI_INT, 0, node.comm);
  const std::string who = node.rank == 0 ? "rank " + std::to_string(first_world) + " (this rank) gave"
                                         : "rank " + std::to_string(first_world) + " gave";
  test::expect_error(Errc::invalid_argument,
                     [&] { (void)detail::exchange_node_fds(node.comm, mine, node.world, "test", kTimeout); },
                     {"ubep: rank " + std::to_string(node.world) + ": test: ", who, "not open",
                      node.rank == 0 ? "(fd " + std::to_string(closed) + ")" : "", "no fd was exchanged"});
  // The next exchange works.
  const int good = memfd_with_pattern(node.rank);
  std::vector<int> fds = detail::exchange_node_fds(node.comm, good, node.world, "test", kTimeout);
  for (int r = 0; r < node.size; ++r) {
    expect_pattern(fds[r], r);
    ::close(fds[r]);
  }
  ::close(good);
  if (mine != closed) ::close(mine);
}

// Sends {claimed node rank, fd} to the abstract socket `name` as a node peer would; 0 when it went out.
int send_claim(const std::string& name, std::int32_t claimed, int fd) {
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return 1;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), len) != 0) return 2;
  iovec iov{&claimed, sizeof claimed};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  return ::sendmsg(s, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof claimed) ? 0 : 3;
}

// Any local process can read the socket's name in /proc/net/unix and connect. One that is not a node rank (a child
// process, so another pid) connects to node rank 0's socket before every peer, claiming to be node rank 1, with an
// fd of other memory: the exchange must close it unread and take node rank 1's real fd. Before: the forged fd was
// taken for node rank 1, and rank 1's real message then failed the exchange.
TEST(NodeFds, OtherLocalProcessesAreIgnored) {
  Node node;
  if (node.size < 2) GTEST_SKIP() << "needs two ranks on one node";
  const int mine = memfd_with_pattern(node.rank);
  const int forged = memfd_with_pattern(1000);
  int intruder_rc = -1;
  const auto intrude = [&](const std::string& name) {
    if (node.rank != 0) return;
    const pid_t child = ::fork();
    if (child == 0) _exit(send_claim(name, 1, forged));
    int status = 0;
    ::waitpid(child, &status, 0);  // its connection waits in the backlog before any peer's
    intruder_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 100;
  };
  std::vector<int> fds = detail::exchange_node_fds(node.comm, mine, node.world, "test", kTimeout, intrude);
  if (node.rank == 0) EXPECT_EQ(intruder_rc, 0) << "the intruder could not connect: the test proves nothing";
  ASSERT_EQ(fds.size(), static_cast<std::size_t>(node.size));
  for (int r = 0; r < node.size; ++r) {
    expect_pattern(fds[r], r);
    ::close(fds[r]);
  }
  ::close(mine);
  ::close(forged);
}

TEST(NodeFds, ManyExchangesLeaveNoFdOpen) {
  Node node;
  const std::size_t before = open_fds();
  for (int i = 0; i < 50; ++i) {
    const int mine = memfd_with_pattern(node.rank);
    std::vector<int> fds = detail::exchange_node_fds(node.comm, mine, node.world, "test", kTimeout);
    for (int fd : fds) ::close(fd);
    ::close(mine);
  }
  EXPECT_EQ(open_fds(), before);
}

}  // namespace
}  // namespace ubep
