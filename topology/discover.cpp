// gather_topology: local discovery, one allgather, the optional switch file and latency probe.
#include "topology/discover.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "topology/local.hpp"
#include "topology/slurm.hpp"
#include "ubep/error.hpp"

namespace ubep::detail {
namespace {

void check_mpi(int rc, int rank, const char* call) { ubep::check_mpi(rc, rank, "gather_topology", call); }

std::vector<int> my_affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// The CPUs a process may run on when nobody binds it. Under an XML/synthetic override the layout
// describes another machine, so the reference is this machine's online CPUs.
std::vector<int> unbound_reference(const HostLayout& layout) {
  if (!layout.overridden()) {
    std::string all = layout.all_pus();
    if (!all.empty()) return parse_cpu_list(all);
  }
  std::ifstream online("/sys/devices/system/cpu/online");
  std::string list;
  if (online >> list) {
    try {
      return parse_cpu_list(list);
    } catch (const std::exception&) {
    }
  }
  std::vector<int> cpus;
  for (long c = 0; c < sysconf(_SC_NPROCESSORS_ONLN); ++c) cpus.push_back(static_cast<int>(c));
  return cpus;
}

std::string vnode_spec(const std::vector<int>& vnode_of_rank) {
  std::map<int, std::vector<int>> members;
  for (std::size_t r = 0; r < vnode_of_rank.size(); ++r) members[vnode_of_rank[r]].push_back(static_cast<int>(r));
  std::string spec;
  for (const auto& [node, ranks] : members) {
    if (!spec.empty()) spec += '|';
    spec += format_int_list(ranks);
  }
  return spec;
}

// The switch file is read by rank 0 and broadcast, so every rank parses the same bytes and a bad
// file fails on all ranks with the same message instead of leaving some in a collective.
std::vector<std::vector<int>> switch_hops(MPI_Comm comm, int rank, const std::string& path,
                                          const std::vector<RankPlace>& places) {
  std::string text;
  long long len = -1;
  if (rank == 0) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::stringstream buf;
      buf << in.rdbuf();
      text = buf.str();
      len = static_cast<long long>(text.size());
    }
  }
  check_mpi(MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, comm), rank, "MPI_Bcast (topology file size)");
  if (len < 0)
    throw Error(Errc::invalid_argument, "ubep: UBEP_TOPOLOGY_FILE=" + path + ": rank 0 cannot read the file");
  text.resize(static_cast<std::size_t>(len));
  if (len > 0)
    check_mpi(MPI_Bcast(text.data(), static_cast<int>(len), MPI_CHAR, 0, comm), rank, "MPI_Bcast (topology file)");
  std::istringstream in(text);
  return node_hops(SwitchTree::parse(in, path), places);
}

// A few ping-pongs per distance class between sampled pairs; every pair of a class then gets that
// class's measured one-way latency (microseconds). Short by design: a handful of round trips per pair.
void probe(MPI_Comm comm, int rank, Topology& topo) {
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(comm, &dup), rank, "MPI_Comm_dup (topology probe)");
  struct Free {
    MPI_Comm* c;
    ~Free() { MPI_Comm_free(c); }
  } free_dup{&dup};
  check_mpi(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN), rank, "MPI_Comm_set_errhandler (topology probe)");
  const int n = topo.size();
  constexpr int kClasses = 8, kWarmup = 2, kIters = 8;
  std::vector<std::pair<int, int>> pairs[kClasses];
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) {
      auto& list = pairs[static_cast<int>(topo.distance(a, b))];
      if (list.size() < 2) list.emplace_back(a, b);
    }
  std::array<double, kClasses * 2> sums{};  // [class] = total latency, [kClasses + class] = samples
  for (int c = 1; c < kClasses; ++c) {
    for (auto [a, b] : pairs[c]) {
      if (rank != a && rank != b) continue;
      const int peer = rank == a ? b : a;
      char byte[8] = {};
      std::vector<double> trips;
      for (int i = 0; i < kWarmup + kIters; ++i) {
        const double t0 = MPI_Wtime();
        if (rank == a) {
          check_mpi(MPI_Send(byte, 8, MPI_BYTE, peer, 7, dup), rank, "MPI_Send (topology probe)");
          check_mpi(MPI_Recv(byte, 8, MPI_BYTE, peer, 7, dup, MPI_STATUS_IGNORE), rank, "MPI_Recv (topology probe)");
        } else {
          check_mpi(MPI_Recv(byte, 8, MPI_BYTE, peer, 7, dup, MPI_STATUS_IGNORE), rank, "MPI_Recv (topology probe)");
          check_mpi(MPI_Send(byte, 8, MPI_BYTE, peer, 7, dup), rank, "MPI_Send (topology probe)");
        }
        if (i >= kWarmup) trips.push_back(MPI_Wtime() - t0);
      }
      if (rank == a) {
        std::nth_element(trips.begin(), trips.begin() + kIters / 2, trips.end());
        sums[c] += trips[kIters / 2] / 2 * 1e6;
        sums[kClasses + c] += 1;
      }
    }
  }
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_DOUBLE, MPI_SUM, dup), rank,
            "MPI_Allreduce (topology probe)");
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      const int c = static_cast<int>(topo.distance(a, b));
      if (a != b && sums[kClasses + c] > 0) topo.set_cost(a, b, sums[c] / sums[kClasses + c]);
    }
}

}  // namespace

std::vector<int> parse_virtual_nodes(const std::string& spec, int nranks) {
  if (spec.empty()) return {};
  auto fail = [&](const std::string& why) {
    return Error(Errc::invalid_argument, "ubep: UBEP_VIRTUAL_NODES=" + spec + ": " + why);
  };
  if (nranks < 1) throw fail("needs at least one rank, got " + std::to_string(nranks));
  std::vector<int> node(nranks, -1);
  if (spec.find_first_not_of("0123456789") == std::string::npos) {
    if (spec.size() > 9) throw fail("too many nodes");
    const int count = std::stoi(spec);
    if (count < 1 || count > nranks)
      throw fail("the node count must be in [1, " + std::to_string(nranks) + "] for " + std::to_string(nranks) +
                 " ranks");
    // Consecutive blocks; the first (nranks % count) nodes take one rank more.
    const int base = nranks / count, extra = nranks % count;
    for (int k = 0, r = 0; k < count; ++k)
      for (int i = 0; i < base + (k < extra ? 1 : 0); ++i) node[r++] = k;
    return node;
  }
  std::stringstream groups(spec);
  std::string group;
  int k = 0;
  while (std::getline(groups, group, '|')) {
    if (group.empty()) throw fail("node " + std::to_string(k) + " has no ranks");
    std::vector<int> ranks;
    try {
      ranks = parse_cpu_list(group, nranks - 1);  // a rank beyond the job fails before anything is expanded
    } catch (const std::out_of_range& e) {
      throw fail("rank " + std::string(e.what()) + " does not exist (" + std::to_string(nranks) + " ranks)");
    } catch (const std::exception&) {
      throw fail("bad rank list '" + group + "' (expected e.g. 0,1|2-3)");
    }
    // "," has no rank either: parse_cpu_list skips empty items (found by fuzz_virtual_nodes).
    if (ranks.empty()) throw fail("node " + std::to_string(k) + " has no ranks");
    for (int r : ranks) {
      if (node[r] >= 0) throw fail("rank " + std::to_string(r) + " is listed twice");
      node[r] = k;
    }
    ++k;
  }
  if (!spec.empty() && spec.back() == '|') throw fail("node " + std::to_string(k) + " has no ranks");
  for (int r = 0; r < nranks; ++r)
    if (node[r] < 0) throw fail("rank " + std::to_string(r) + " is in no node");
  return node;
}

Topology gather_topology(MPI_Comm comm, const Options& options, std::span<const int> vnode_of_rank) {
  int rank = 0, size = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), -1, "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size), rank, "MPI_Comm_size");
  if (!vnode_of_rank.empty() && static_cast<int>(vnode_of_rank.size()) != size)
    throw Error(Errc::invalid_argument,
                "ubep: rank " + std::to_string(rank) + ": gather_topology: virtual node map has " +
                    std::to_string(vnode_of_rank.size()) + " entries for " + std::to_string(size) + " ranks");

  // Local discovery must not throw before the allgather, or the other ranks would wait forever:
  // a failure travels in the record and every rank throws it afterwards.
  PlaceRecord rec{};
  std::vector<std::string> overrides;
  try {
    HostLayout layout = HostLayout::load_this_host();
    const std::vector<int> cpus = my_affinity();
    const std::vector<int> all = unbound_reference(layout);
    const bool bound = !cpus.empty() && !std::includes(cpus.begin(), cpus.end(), all.begin(), all.end());
    rec = layout.place_of(cpus, bound);
  } catch (const std::exception& e) {
    std::memset(&rec, 0, sizeof rec);
    copy_fixed(rec.error, sizeof rec.error, e.what(), true);
  }
  std::string host;
  if (!vnode_of_rank.empty()) {
    host = "vnode" + std::to_string(vnode_of_rank[rank]);
  } else {
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    check_mpi(MPI_Get_processor_name(name, &len), rank, "MPI_Get_processor_name");
    host.assign(name, len);
  }
  copy_fixed(rec.host, sizeof rec.host, host);
  rec.host_key = hash_name(host);

  std::vector<PlaceRecord> records(size);
  check_mpi(MPI_Allgather(&rec, sizeof rec, MPI_BYTE, records.data(), sizeof rec, MPI_BYTE, comm), rank,
            "MPI_Allgather");
  for (int r = 0; r < size; ++r)
    if (records[r].error[0] != '\0')
      throw Error(Errc::internal, "ubep: rank " + std::to_string(r) + ": topology discovery failed: " +
                                      std::string(records[r].error, strnlen(records[r].error, sizeof rec.error)));

  if (const char* xml = std::getenv("HWLOC_XMLFILE"); xml && *xml)
    overrides.push_back(std::string("HWLOC_XMLFILE=") + xml);
  if (const char* syn = std::getenv("HWLOC_SYNTHETIC"); syn && *syn)
    overrides.push_back(std::string("HWLOC_SYNTHETIC=") + syn);
  if (!vnode_of_rank.empty()) {
    const std::string spec = options.virtual_nodes.empty()
                                 ? vnode_spec(std::vector<int>(vnode_of_rank.begin(), vnode_of_rank.end()))
                                 : options.virtual_nodes;
    overrides.push_back("UBEP_VIRTUAL_NODES=" + spec + " (emulated nodes)");
  }

  std::vector<std::vector<int>> hops;
  if (!options.topology_file.empty())
    hops = switch_hops(comm, rank, options.topology_file, places_from_records(records));
  Topology topo = build_topology(records, hops, std::move(overrides));
  if (options.topology_probe) probe(comm, rank, topo);
  return topo;
}

}  // namespace ubep::detail
