// Discovery of this rank's place with hwloc, and turning gathered records into a Topology.
#include "topology/local.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string_view>
#include <type_traits>

#include "base/gpu.hpp"
#include "topology/model.hpp"
#include "topology/slurm.hpp"
#include "ubep/config.hpp"
#include "ubep/error.hpp"

#if UBEP_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace ubep::detail {

std::uint64_t hash_name(const std::string& s) noexcept {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

void copy_fixed(char* dst, std::size_t cap, const std::string& s, bool ellipsis) {
  std::string v = s;
  if (v.size() >= cap) {
    v.resize(cap - 1);
    if (ellipsis && cap > 4) v.replace(cap - 4, 3, "...");
  }
  std::memset(dst, 0, cap);
  std::memcpy(dst, v.data(), v.size());
}

std::vector<int> parse_cpu_list(const std::string& list, int max_value) {
  // Digits only: std::stoi would take "1x" for 1, " 1" and "+1" too (found by fuzz_virtual_nodes).
  auto number = [&](const std::string& item, std::string_view digits) {
    int v = 0;
    const char* end = digits.data() + digits.size();
    const auto [stop, ec] = std::from_chars(digits.data(), end, v);
    if (digits.empty() || digits[0] == '-' || ec != std::errc() || stop != end)
      throw std::invalid_argument("bad cpu list item '" + item + "' in '" + list + "'");
    if (v > max_value) throw std::out_of_range(std::to_string(v));
    return v;
  };
  std::vector<std::pair<int, int>> ranges;
  std::size_t pos = 0;
  while (pos < list.size()) {
    std::size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const std::string_view view(item);
    const auto dash = view.find('-');
    const int a = number(item, view.substr(0, dash));
    const int b = dash == std::string_view::npos ? a : number(item, view.substr(dash + 1));
    if (b < a) throw std::invalid_argument("bad cpu list item '" + item + "' in '" + list + "'");
    ranges.emplace_back(a, b);
  }
  std::vector<int> cpus;
  for (auto [a, b] : ranges)
    for (int c = a;; ++c) {
      cpus.push_back(c);
      if (c == b) break;  // b may be INT_MAX
    }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

namespace {
PlaceRecord empty_record() {
  PlaceRecord r;
  std::memset(&r, 0, sizeof r);
  r.package = r.numa = r.l3 = r.core = r.pu = r.gpu = -1;
  return r;
}
}  // namespace

#if UBEP_HAVE_HWLOC

struct HostLayout::Impl {
  hwloc_topology_t topo = nullptr;
  struct Nic {
    hwloc_obj_t pci;
    std::string name;
  };
  std::vector<hwloc_obj_t> gpus;  // PCI objects, in CUDA device order
  std::vector<Nic> nics;
  ~Impl() {
    if (topo) hwloc_topology_destroy(topo);
  }
};

namespace {

class Bitmap {
 public:
  Bitmap() : b_(hwloc_bitmap_alloc()) {}
  ~Bitmap() { hwloc_bitmap_free(b_); }
  Bitmap(const Bitmap&) = delete;
  Bitmap& operator=(const Bitmap&) = delete;
  operator hwloc_bitmap_t() const { return b_; }

 private:
  hwloc_bitmap_t b_;
};

hwloc_obj_t locality_of(hwloc_obj_t io) { return hwloc_get_non_io_ancestor_obj(nullptr, io); }

bool is_nvidia_gpu(hwloc_obj_t pci) {
  const unsigned cls = pci->attr->pcidev.class_id;
  return pci->attr->pcidev.vendor_id == 0x10de && (cls == 0x0302 || cls == 0x0300);
}

// Hops up from `a` and from `b` to their first common ancestor (I/O objects included, which
// hwloc_get_common_ancestor_obj does not handle).
int io_distance(hwloc_obj_t a, hwloc_obj_t b) {
  std::vector<hwloc_obj_t> up;
  for (hwloc_obj_t o = a; o; o = o->parent) up.push_back(o);
  int climbed = 0;
  for (hwloc_obj_t o = b; o; o = o->parent, ++climbed) {
    auto it = std::find(up.begin(), up.end(), o);
    if (it != up.end()) return climbed + static_cast<int>(it - up.begin());
  }
  return 1 << 20;
}

void scan_io(HostLayout::Impl& impl, bool use_cuda) {
  hwloc_topology_t topo = impl.topo;
  // CUDA's device order, when CUDA is up already (someone asked for a GPU: topology never initializes it, so a
  // host-only job leaves the driver alone) and this is the real machine, whose devices it can match.
  if (use_cuda && detail::gpu::asked()) {
    const std::vector<std::string> ids = detail::gpu::pci_bus_ids();
    for (const std::string& busid : ids) {
      hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(topo, busid.c_str());
      if (!pci) break;
      impl.gpus.push_back(pci);
    }
    if (impl.gpus.size() != ids.size()) impl.gpus.clear();
  }
  if (impl.gpus.empty()) {
    // PCI bus order, which is CUDA's order under CUDA_DEVICE_ORDER=PCI_BUS_ID (and for identical GPUs).
    for (hwloc_obj_t pci = nullptr; (pci = hwloc_get_next_pcidev(topo, pci));)
      if (is_nvidia_gpu(pci)) impl.gpus.push_back(pci);
  }
  // One NIC per PCI function, named after its RDMA device (mlx5_0) when it has one, else its netdev.
  std::map<hwloc_obj_t, std::pair<std::string, bool>> by_pci;
  for (hwloc_obj_t os = nullptr; (os = hwloc_get_next_osdev(topo, os));) {
    // hwloc stores an XML's osdev_type unchecked, and loading a value outside the enum is undefined
    // behaviour (UBSan, found by fuzz_hwloc_placement): read the bits as an integer.
    using Bits = std::underlying_type_t<hwloc_obj_osdev_type_t>;
    Bits type = 0;
    static_assert(sizeof type == sizeof os->attr->osdev.type);
    std::memcpy(&type, &os->attr->osdev.type, sizeof type);
    const bool rdma = type == static_cast<Bits>(HWLOC_OBJ_OSDEV_OPENFABRICS);
    if (!rdma && type != static_cast<Bits>(HWLOC_OBJ_OSDEV_NETWORK)) continue;
    hwloc_obj_t pci = os->parent;
    if (!pci || pci->type != HWLOC_OBJ_PCI_DEVICE || !os->name) continue;
    auto it = by_pci.find(pci);
    if (it == by_pci.end() || (rdma && !it->second.second)) by_pci[pci] = {os->name, rdma};
  }
  for (hwloc_obj_t pci = nullptr; (pci = hwloc_get_next_pcidev(topo, pci));)
    if (auto it = by_pci.find(pci); it != by_pci.end()) impl.nics.push_back({pci, it->second.first});
}

int covering_index(hwloc_topology_t topo, hwloc_const_bitmap_t set, hwloc_obj_type_t type) {
  for (hwloc_obj_t o = hwloc_get_obj_covering_cpuset(topo, set); o; o = o->parent)
    if (o->type == type) return static_cast<int>(o->logical_index);
  return -1;
}

int numa_index(hwloc_topology_t topo, hwloc_const_bitmap_t set) {
  for (hwloc_obj_t n = nullptr; (n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n));)
    if (n->cpuset && !hwloc_bitmap_iszero(n->cpuset) && hwloc_bitmap_isincluded(set, n->cpuset))
      return static_cast<int>(n->logical_index);
  return -1;
}

}  // namespace

HostLayout::HostLayout() = default;
HostLayout::HostLayout(HostLayout&&) noexcept = default;
HostLayout& HostLayout::operator=(HostLayout&&) noexcept = default;
HostLayout::~HostLayout() = default;

namespace {
std::unique_ptr<HostLayout::Impl> load_impl(const char* xml, const char* synthetic) {
  auto impl = std::make_unique<HostLayout::Impl>();
  if (hwloc_topology_init(&impl->topo) != 0) throw Error(Errc::internal, "ubep: hwloc_topology_init failed");
  hwloc_topology_set_io_types_filter(impl->topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (xml && hwloc_topology_set_xml(impl->topo, xml) != 0)
    throw Error(Errc::invalid_argument, std::string("ubep: hwloc cannot read the XML topology '") + xml + "'");
  if (synthetic && hwloc_topology_set_synthetic(impl->topo, synthetic) != 0)
    throw Error(Errc::invalid_argument, std::string("ubep: hwloc rejects the synthetic topology '") + synthetic + "'");
  if (hwloc_topology_load(impl->topo) != 0) throw Error(Errc::internal, "ubep: hwloc_topology_load failed");
  return impl;
}
}  // namespace

HostLayout HostLayout::load_this_host() {
  HostLayout layout;
  const char* xml = std::getenv("HWLOC_XMLFILE");
  const char* synthetic = std::getenv("HWLOC_SYNTHETIC");
  layout.overridden_ = (xml && *xml) || (synthetic && *synthetic);
  // hwloc applies these variables itself; loading without explicit sources keeps its precedence rules.
  layout.impl_ = load_impl(nullptr, nullptr);
  scan_io(*layout.impl_, !layout.overridden_);
  return layout;
}

HostLayout HostLayout::from_xml(const std::string& path) {
  HostLayout layout;
  layout.overridden_ = true;
  layout.impl_ = load_impl(path.c_str(), nullptr);
  scan_io(*layout.impl_, false);
  return layout;
}

HostLayout HostLayout::from_synthetic(const std::string& description) {
  HostLayout layout;
  layout.overridden_ = true;
  layout.impl_ = load_impl(nullptr, description.c_str());
  scan_io(*layout.impl_, false);
  return layout;
}

std::string HostLayout::all_pus() const {
  if (!impl_) return {};
  char* text = nullptr;
  hwloc_bitmap_list_asprintf(&text, hwloc_topology_get_allowed_cpuset(impl_->topo));
  std::string out = text ? text : "";
  std::free(text);
  return out;
}

int HostLayout::num_gpus() const { return impl_ ? static_cast<int>(impl_->gpus.size()) : 0; }

PlaceRecord HostLayout::place_of(const std::vector<int>& cpus, bool bound) const {
  PlaceRecord rec = empty_record();
  rec.bound = bound ? 1 : 0;
  if (!impl_) return rec;
  hwloc_topology_t topo = impl_->topo;
  Bitmap set;
  for (int c : cpus) hwloc_bitmap_set(set, static_cast<unsigned>(c));
  hwloc_bitmap_and(set, set, hwloc_topology_get_complete_cpuset(topo));
  if (hwloc_bitmap_iszero(set)) {
    // Affinity outside the layout (an override describing another machine): the place is unknown.
    rec.bound = 0;
    hwloc_bitmap_copy(set, hwloc_topology_get_complete_cpuset(topo));
  }
  if (rec.bound) {
    rec.package = covering_index(topo, set, HWLOC_OBJ_PACKAGE);
    rec.l3 = covering_index(topo, set, HWLOC_OBJ_L3CACHE);
    rec.core = covering_index(topo, set, HWLOC_OBJ_CORE);
    rec.pu = covering_index(topo, set, HWLOC_OBJ_PU);
    rec.numa = numa_index(topo, set);
    char* text = nullptr;
    hwloc_bitmap_list_asprintf(&text, set);
    copy_fixed(rec.cpuset, sizeof rec.cpuset, text ? text : "", true);
    std::free(text);
  }
  if (rec.numa >= 0) {
    unsigned nr = 1;
    hwloc_distances_s* dist = nullptr;
    if (hwloc_distances_get_by_name(topo, "NUMALatency", &nr, &dist, 0) == 0 && nr >= 1) {
      const unsigned nb = dist->nbobjs;
      int self = -1;
      for (unsigned i = 0; i < nb; ++i)
        if (dist->objs[i]->type == HWLOC_OBJ_NUMANODE && static_cast<int>(dist->objs[i]->logical_index) == rec.numa)
          self = static_cast<int>(i);
      if (self >= 0 && nb <= static_cast<unsigned>(kMaxNumaLatency)) {
        for (unsigned j = 0; j < nb; ++j) {
          const unsigned idx = dist->objs[j]->logical_index;
          if (idx < static_cast<unsigned>(kMaxNumaLatency))
            rec.numa_latency[idx] = static_cast<std::uint32_t>(dist->values[self * nb + j]);
        }
        rec.num_numa = static_cast<std::int32_t>(nb);
      }
      hwloc_distances_release(topo, dist);
    }
  }
  // Nearest GPU: among the GPUs whose locality holds the whole set, those with the tightest locality;
  // ranks spread over them by the position of their first PU inside that locality.
  hwloc_obj_t gpu_pci = nullptr;
  {
    std::vector<int> best;
    int best_weight = 0;
    for (int g = 0; g < static_cast<int>(impl_->gpus.size()); ++g) {
      hwloc_obj_t loc = locality_of(impl_->gpus[g]);
      if (!loc || !hwloc_bitmap_isincluded(set, loc->cpuset)) continue;
      const int w = hwloc_bitmap_weight(loc->cpuset);
      if (best.empty() || w < best_weight) {
        best = {g};
        best_weight = w;
      } else if (w == best_weight && hwloc_bitmap_isequal(loc->cpuset, locality_of(impl_->gpus[best[0]])->cpuset)) {
        best.push_back(g);
      }
    }
    if (!best.empty()) {
      hwloc_const_bitmap_t loc = locality_of(impl_->gpus[best[0]])->cpuset;
      const int first = hwloc_bitmap_first(set);
      int pos = 0;
      for (int b = hwloc_bitmap_first(loc); b >= 0 && b < first; b = hwloc_bitmap_next(loc, b)) ++pos;
      const int pick = best[static_cast<std::size_t>(pos) * best.size() / static_cast<std::size_t>(best_weight)];
      rec.gpu = pick;
      gpu_pci = impl_->gpus[pick];
    }
  }
  // Nearest NIC: the one sharing the closest PCI ancestor with our GPU (GPUDirect path), else the first
  // whose locality holds the set.
  const HostLayout::Impl::Nic* nic = nullptr;
  int best = 1 << 30;
  for (const auto& candidate : impl_->nics) {
    hwloc_obj_t loc = locality_of(candidate.pci);
    if (gpu_pci) {
      const int d = io_distance(gpu_pci, candidate.pci);
      if (d < best) {
        best = d;
        nic = &candidate;
      }
    } else if (loc && hwloc_bitmap_isincluded(set, loc->cpuset)) {
      nic = &candidate;
      break;
    }
  }
  if (nic) copy_fixed(rec.nic, sizeof rec.nic, nic->name);
  return rec;
}

#else  // !UBEP_HAVE_HWLOC

struct HostLayout::Impl {};
HostLayout::HostLayout() = default;
HostLayout::HostLayout(HostLayout&&) noexcept = default;
HostLayout& HostLayout::operator=(HostLayout&&) noexcept = default;
HostLayout::~HostLayout() = default;
HostLayout HostLayout::load_this_host() {
  HostLayout layout;
  const char* xml = std::getenv("HWLOC_XMLFILE");
  const char* synthetic = std::getenv("HWLOC_SYNTHETIC");
  layout.overridden_ = (xml && *xml) || (synthetic && *synthetic);
  return layout;
}
HostLayout HostLayout::from_xml(const std::string&) {
  throw Error(Errc::unsupported, "ubep: this build has no hwloc: cannot read XML topologies");
}
HostLayout HostLayout::from_synthetic(const std::string&) {
  throw Error(Errc::unsupported, "ubep: this build has no hwloc: cannot build synthetic topologies");
}
std::string HostLayout::all_pus() const { return {}; }
int HostLayout::num_gpus() const { return 0; }
PlaceRecord HostLayout::place_of(const std::vector<int>& cpus, bool bound) const {
  PlaceRecord rec = empty_record();
  rec.bound = bound ? 1 : 0;
  if (bound) {
    copy_fixed(rec.cpuset, sizeof rec.cpuset, format_int_list(cpus), true);
    // Without hwloc only the CPU itself is known (its OS index stands in for the PU index).
    if (cpus.size() == 1) rec.pu = cpus[0];
  }
  return rec;
}

#endif

std::vector<RankPlace> places_from_records(const std::vector<PlaceRecord>& records) {
  std::vector<RankPlace> places;
  std::map<std::pair<std::uint64_t, std::string>, int> node_of_host;
  for (std::size_t r = 0; r < records.size(); ++r) {
    const PlaceRecord& rec = records[r];
    RankPlace p;
    p.rank = static_cast<int>(r);
    p.host = std::string(rec.host, strnlen(rec.host, sizeof rec.host));
    auto key = std::make_pair(rec.host_key, p.host);
    auto it = node_of_host.emplace(key, static_cast<int>(node_of_host.size())).first;
    p.node = it->second;
    p.bound = rec.bound != 0;
    p.cpuset = std::string(rec.cpuset, strnlen(rec.cpuset, sizeof rec.cpuset));
    p.package = rec.package;
    p.numa = rec.numa;
    p.l3 = rec.l3;
    p.core = rec.core;
    p.pu = rec.pu;
    p.gpu = rec.gpu;
    p.nic = std::string(rec.nic, strnlen(rec.nic, sizeof rec.nic));
    places.push_back(std::move(p));
  }
  return places;
}

std::vector<std::vector<int>> node_hops(const SwitchTree& tree, const std::vector<RankPlace>& places) {
  int nodes = 0;
  for (const RankPlace& p : places) nodes = std::max(nodes, p.node + 1);
  std::vector<std::string> host(nodes);
  for (const RankPlace& p : places) host[p.node] = p.host;
  std::vector<std::vector<int>> hops(nodes, std::vector<int>(nodes, 0));
  for (int a = 0; a < nodes; ++a)
    for (int b = 0; b < nodes; ++b) hops[a][b] = a == b ? 0 : tree.hops(host[a], host[b]);
  return hops;
}

Topology build_topology(const std::vector<PlaceRecord>& records, const std::vector<std::vector<int>>& hops,
                        std::vector<std::string> overrides) {
  Topology topo(places_from_records(records), hops, std::move(overrides));
  const int n = topo.size();
  // NUMALatency scales the model cost by the latency ratio to the rank's own NUMA node (10 -> 21 on a
  // typical 2-socket server), for bound ranks on the same node whose NUMA nodes are known.
  for (int a = 0; a < n; ++a) {
    const PlaceRecord& ra = records[a];
    if (!ra.bound || ra.numa < 0 || ra.numa >= ra.num_numa || ra.numa_latency[ra.numa] == 0) continue;
    for (int b = 0; b < n; ++b) {
      const PlaceRecord& rb = records[b];
      if (a == b || topo.node_of(a) != topo.node_of(b) || !rb.bound || rb.numa < 0 || rb.numa >= ra.num_numa) continue;
      const double ratio = static_cast<double>(ra.numa_latency[rb.numa]) / ra.numa_latency[ra.numa];
      if (ratio > 0) topo.set_cost(a, b, topo.cost(a, b) * ratio);
    }
  }
  return topo;
}

}  // namespace ubep::detail
