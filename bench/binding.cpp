#include "bench/binding.hpp"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#include "bench/osu_harness.hpp"

namespace ubep::bench {
namespace {

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

/// The same for every process of one running kernel (network namespaces included), different per host.
std::uint64_t host_key() {
  std::string id = first_line("/proc/sys/kernel/random/boot_id");
  if (id.empty()) {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    id = name;
  }
  return fnv1a(id);
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

/// One CPU per physical core among `cpus`: the first of each (package, core) pair, in CPU order (so
/// two ranks never get the two hardware threads of one core).
std::vector<int> first_cpu_per_core(const std::vector<int>& cpus) {
  std::set<std::pair<std::string, std::string>> seen;
  std::vector<int> out;
  for (int c : cpus) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    std::string package = first_line(dir + "physical_package_id"), core = first_line(dir + "core_id");
    if (core.empty()) core = "cpu" + std::to_string(c);  // no topology in sysfs: every CPU its own core
    if (seen.insert({package, core}).second) out.push_back(c);
  }
  return out;
}

/// Binds every thread of this process to `cpu`; false when the calling thread could not be bound.
bool bind_process(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (DIR* d = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(d)) {
      const int tid = std::atoi(e->d_name);
      if (tid > 0) sched_setaffinity(tid, sizeof set, &set);  // a thread that just ended: nothing to do
    }
    closedir(d);
  }
  return sched_setaffinity(0, sizeof set, &set) == 0;
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return out.empty() ? "?" : out;
}

}  // namespace

Binding bind_ranks(const std::string& mode, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const std::vector<int> cpus = allowed_cpus();
  // Per rank: its host and the CPU set it arrived with.
  const std::uint64_t mine[2] = {host_key(), fnv1a(cpu_list(cpus))};
  std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(size));
  UBEP_BENCH_MPI(MPI_Allgather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, comm));
  int host_ranks = 0, host_index = 0;
  bool same_set = true;
  for (int r = 0; r < size; ++r) {
    if (all[2 * r] != mine[0]) continue;
    if (r < rank) ++host_index;
    ++host_ranks;
    same_set = same_set && all[2 * r + 1] == mine[1];
  }
  const std::vector<int> cores = first_cpu_per_core(cpus);
  const std::string counts = std::to_string(host_ranks) + " rank(s) on this host, " + std::to_string(cores.size()) +
                             " core(s) in their CPU set " + cpu_list(cpus);

  Binding out;
  out.mode = mode;
  bool bound = false;
  if (mode == "none") {
    out.by = same_set ? "none" : "launcher";
    out.summary = "as launched (--bind none; " + counts + ")";
  } else if (!same_set) {
    out.by = "launcher";
    out.summary = "the launcher's: the ranks arrived bound to different CPUs, kept (--bind auto)";
  } else if (static_cast<int>(cores.size()) >= host_ranks) {
    bound = bind_process(cores[static_cast<std::size_t>(host_index)]);
    out.by = "ubep";
    out.summary = "one core per rank, set by the benchmark (--bind auto: " + counts + "; --bind none keeps the launch)";
  } else {
    out.by = "none";
    out.summary = "unbound: " + counts + ", fewer cores than ranks (--bind auto binds only when each rank can own one)";
  }
  int all_bound = !bound && out.by == "ubep" ? 0 : 1;  // a failed sched_setaffinity on any rank: say so
  UBEP_BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, &all_bound, 1, MPI_INT, MPI_MIN, comm));
  if (!all_bound) {
    out.by = "none";
    out.summary = "unbound: sched_setaffinity failed on some rank (" + counts + ")";
  }

  // Rank 0 learns every rank's CPUs after binding.
  constexpr int kWidth = 64;
  char text[kWidth] = {};
  std::snprintf(text, sizeof text, "%s", cpu_list(allowed_cpus()).c_str());
  std::vector<char> gathered(rank == 0 ? static_cast<std::size_t>(kWidth) * size : 1);
  UBEP_BENCH_MPI(MPI_Gather(text, kWidth, MPI_CHAR, gathered.data(), kWidth, MPI_CHAR, 0, comm));
  if (rank == 0) {
    for (int r = 0; r < size; ++r) out.cpus.emplace_back(gathered.data() + static_cast<std::size_t>(r) * kWidth);
  }
  return out;
}

}  // namespace ubep::bench
