// File descriptors between the ranks of one node: how node peers will map each other's GPU heap (cuMemCreate
// allocations exported as POSIX fds, issue 15). Each rank listens on an abstract Unix socket and every rank
// sends its fd to every node peer with SCM_RIGHTS. Abstract socket names live in the network namespace, so
// the ranks of one emulated node (tests/multinode/emulate.sh) meet and those of two do not, as real nodes.
// Nothing here knows about CUDA: any fd travels (the tests send memfds).
//
// Trust. Any local process can find an abstract socket's name (/proc/net/unix) and connect to it, so every
// connection is checked with SO_PEERCRED before a byte of it is read: its uid must be this process's, and its pid
// the pid of the node rank its message claims to be (the ranks exchange their pids over MPI first). A connection
// from any other process is closed unread and ignored; a node peer's malformed message is Errc::protocol.
#pragma once

#include <mpi.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace ubep::detail {

/// Collective over `node_comm` (ranks of one host and network namespace): gives `my_fd` (an open fd, or -1
/// for none) to every other rank of node_comm and returns, indexed by node rank, the fd each one gave, received
/// into this process (the caller owns and closes them; -1 where that rank gave none; this rank's own entry is
/// a dup of my_fd). `world_rank` and `call` name this rank and the public call in errors. Throws ubep::Error:
/// invalid_argument when my_fd is not open here (every rank fails together, before anything is sent);
/// timeout when a peer's fd has not arrived within `timeout` (naming the node ranks still missing, and how many
/// connections of other processes were ignored); protocol when a node peer's message is malformed; internal
/// on a socket error (naming the system call and errno). Every fd received before a throw is closed.
/// `on_listen` (tests only) runs once this rank's socket listens, with its abstract name (without the leading
/// NUL), before any peer connects.
std::vector<int> exchange_node_fds(MPI_Comm node_comm, int my_fd, int world_rank, const char* call,
                                   std::chrono::duration<double> timeout,
                                   const std::function<void(const std::string&)>& on_listen = {});

}  // namespace ubep::detail
