// Fuzz target: the hwloc-XML-driven placement (topology/local.cpp: HostLayout, place_of, the NUMALatency
// and GPU/NIC lookups, build_topology) and the distance classes, costs and schedules built on it
// (topology/topology.cpp, describe.cpp).
// Input: an hwloc XML topology. HostLayout reads XML from a path only, so the bytes go into an in-memory
// file (memfd) that hwloc opens as /proc/self/fd/N (what hwloc_topology_set_xmlbuffer would do, on ubep's path);
// hwloc's own XML reader is used (HWLOC_LIBXML=0). Property: loading either gives a layout or throws ubep::Error; on a
// layout, place_of() of single PUs, pairs, halves, the whole machine (unbound) and CPUs outside it returns records
// whose indices are -1 or valid, whose strings are NUL-terminated, and build_topology() of them (on two hosts) gives
// classes that are self on the diagonal and symmetric, node or closer on one host and system across hosts, costs that
// are finite, non-negative and 0 only for self, and schedules that are permutations of the ranks.
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>

#include "fuzz_common.hpp"
#include "topology/local.hpp"
#include "ubep/topology.hpp"

namespace {

using ubep::Distance;
using ubep::detail::HostLayout;
using ubep::detail::PlaceRecord;

int g_fd = -1;

// The PUs of an all_pus() list, at most `max` of them (an XML may claim millions of PUs).
std::vector<int> first_pus(const std::string& list, std::size_t max) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos < list.size() && out.size() < max) {
    std::size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(pos, end - pos);
    pos = end + 1;
    char* rest = nullptr;
    const long a = std::strtol(item.c_str(), &rest, 10);
    long b = a;
    if (*rest == '-') b = rest[1] ? std::strtol(rest + 1, nullptr, 10) : a + static_cast<long>(max);  // "N-": infinite
    for (long c = a; c <= b && out.size() < max && c >= 0 && c < (1L << 24); ++c) out.push_back(static_cast<int>(c));
  }
  return out;
}

bool terminated(const char* s, std::size_t cap) { return std::memchr(s, '\0', cap) != nullptr; }

void check_record(const PlaceRecord& r, const HostLayout& layout, bool bound) {
  UBEP_FUZZ_CHECK(
      terminated(r.cpuset, sizeof r.cpuset) && terminated(r.nic, sizeof r.nic) && terminated(r.error, sizeof r.error),
      "unterminated string in a PlaceRecord");
  for (int v : {r.package, r.numa, r.l3, r.core, r.pu}) UBEP_FUZZ_CHECK(v >= -1, "index below -1");
  UBEP_FUZZ_CHECK(r.gpu >= -1 && r.gpu < layout.num_gpus(), "gpu " + std::to_string(r.gpu));
  UBEP_FUZZ_CHECK(r.num_numa >= 0 && r.num_numa <= ubep::detail::kMaxNumaLatency, "num_numa");
  if (!bound || !r.bound) {
    UBEP_FUZZ_CHECK(r.package == -1 && r.numa == -1 && r.l3 == -1 && r.core == -1 && r.pu == -1,
                    "unbound record with a place");
  }
}

void check_topology(const ubep::Topology& topo, int per_host) {
  const int n = topo.size();
  for (int a = 0; a < n; ++a) {
    UBEP_FUZZ_CHECK(topo.distance(a, a) == Distance::self && topo.cost(a, a) == 0, "self");
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      const Distance d = topo.distance(a, b);
      UBEP_FUZZ_CHECK(d == topo.distance(b, a), "distance not symmetric");
      const bool same_host = a / per_host == b / per_host;
      UBEP_FUZZ_CHECK(
          same_host ? (d != Distance::self && d <= Distance::node) : d == Distance::system,
          "class " + std::string(ubep::to_string(d)) + " for ranks " + std::to_string(a) + ", " + std::to_string(b));
      const double c = topo.cost(a, b);
      UBEP_FUZZ_CHECK(std::isfinite(c) && c > 0, "cost " + std::to_string(c));
    }
    for (auto kind : {ubep::ScheduleKind::linear, ubep::ScheduleKind::shifted, ubep::ScheduleKind::topology}) {
      std::vector<int> order = ubep::schedule(topo, a, kind);
      std::sort(order.begin(), order.end());
      for (int i = 0; i < n; ++i) UBEP_FUZZ_CHECK(static_cast<int>(order.size()) == n && order[i] == i, "schedule");
    }
    const std::vector<int> peers = topo.peers_by_distance(a);
    UBEP_FUZZ_CHECK(static_cast<int>(peers.size()) == n - 1 && std::count(peers.begin(), peers.end(), a) == 0,
                    "peers_by_distance");
  }
  UBEP_FUZZ_CHECK(!ubep::describe_topology(topo, ubep::ScheduleKind::topology, false).empty(), "describe");
  UBEP_FUZZ_CHECK(!ubep::describe_topology(topo, ubep::ScheduleKind::topology, true).empty(), "describe json");
}

// hwloc 2.9's XML reader trusts its input: a few changed bytes of a valid XML crash hwloc_topology_load
// (NULL dereferences in hwloc_bitmap_or and in the object tree; finding H1 in docs/reliability/fuzz.md, not
// ubep's code). So each input is first loaded by hwloc alone in a helper process (hwloc_check, next to this
// binary, kept running across inputs); inputs that kill it are skipped and a new helper is started, so that
// the fuzzer gets past hwloc to ubep's code. Inputs hwloc needs more than 0.5 s for are skipped as well.
class Checker {
 public:
  bool survives(const std::string& path) {
    if (pid_ < 0) start();
    const std::string line = path + "\n";
    char answer[3] = {};
    if (write(to_, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && read_all(answer, 3)) return true;
    stop();  // it died on this input, or took too long
    return false;
  }

 private:
  // hwloc also takes seconds on some small inputs (finding H2): those would be timeouts in hwloc, not ubep,
  // so a helper that has not answered within 0.2 s (a valid XML takes it a few ms) is killed.
  bool read_all(char* buf, std::size_t n) {
    for (std::size_t got = 0; got < n;) {
      pollfd p{from_, POLLIN, 0};
      const int ready = poll(&p, 1, 200);
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) {
        kill(pid_, SIGKILL);
        return false;
      }
      const ssize_t r = read(from_, buf + got, n - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      got += static_cast<std::size_t>(r);
    }
    return true;
  }
  void start() {
    char self[4096] = {};
    if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) std::abort();
    std::string helper = self;
    helper = helper.substr(0, helper.rfind('/') + 1) + "hwloc_check";
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) std::abort();
    // posix_spawn, not fork: copying this sanitized process's page tables costs more than the load.
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    char* argv[] = {helper.data(), nullptr};
    if (posix_spawn(&pid_, helper.c_str(), &fa, nullptr, argv, environ) != 0) {
      std::fprintf(stderr, "ubep fuzz: cannot run the helper %s\n", helper.c_str());
      std::abort();
    }
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }
  void stop() {
    close(to_);
    close(from_);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
};

Checker g_checker;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("HWLOC_LIBXML", "0", 1);  // hwloc's built-in XML reader: the same on every machine
  unsetenv("HWLOC_XMLFILE");
  unsetenv("HWLOC_SYNTHETIC");
  signal(SIGPIPE, SIG_IGN);  // a helper that died is noticed by the failed write or read
  g_fd = memfd_create("ubep-fuzz-xml", 0);
  if (g_fd < 0) std::abort();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > (1 << 16)) return 0;  // corpus files stay small; hwloc's load time grows with the XML
  if (ftruncate(g_fd, 0) != 0 || pwrite(g_fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  const std::string path = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(g_fd);
  if (!g_checker.survives(path)) return 0;
  HostLayout layout;
  try {
    layout = HostLayout::from_xml(path);
  } catch (const ubep::Error& e) {
    UBEP_FUZZ_CHECK(e.code() == ubep::Errc::invalid_argument || e.code() == ubep::Errc::internal, e.what());
    ubep::fuzz::check_message(e, "hwloc");
    return 0;
  }
  UBEP_FUZZ_CHECK(layout.overridden(), "an XML layout is an override");
  const std::vector<int> pus = first_pus(layout.all_pus(), 64);
  // Single PUs, neighbour pairs, the first half, everything (unbound), CPUs outside the layout.
  std::vector<std::pair<std::vector<int>, bool>> sets;
  for (std::size_t i = 0; i < pus.size() && i < 8; ++i) sets.push_back({{pus[i]}, true});
  if (pus.size() >= 2) sets.push_back({{pus[0], pus[1]}, true});
  if (pus.size() >= 4) sets.push_back({std::vector<int>(pus.begin(), pus.begin() + pus.size() / 2), true});
  sets.push_back({pus, false});
  sets.push_back({{1 << 20}, true});
  sets.push_back({{}, true});
  std::vector<PlaceRecord> recs;
  for (const auto& [cpus, bound] : sets) {
    PlaceRecord r = layout.place_of(cpus, bound);
    check_record(r, layout, bound);
    ubep::detail::copy_fixed(r.host, sizeof r.host, "h0");
    r.host_key = ubep::detail::hash_name("h0");
    recs.push_back(r);
  }
  // The same ranks on a second host.
  const int per_host = static_cast<int>(recs.size());
  for (int i = 0; i < per_host; ++i) {
    PlaceRecord r = recs[i];
    ubep::detail::copy_fixed(r.host, sizeof r.host, "h1");
    r.host_key = ubep::detail::hash_name("h1");
    recs.push_back(r);
  }
  const ubep::Topology topo = ubep::detail::build_topology(recs, {}, {"HWLOC_XMLFILE=fuzz.xml"});
  UBEP_FUZZ_CHECK(topo.num_nodes() == 2, "two hosts, " + std::to_string(topo.num_nodes()) + " nodes");
  check_topology(topo, per_host);
  return 0;
}
