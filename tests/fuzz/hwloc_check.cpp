// The helper of fuzz_hwloc_placement (not a fuzz target): loads each hwloc XML file named on stdin, one
// path per line, the way ubep's HostLayout does (the same I/O filter, then destroy), and answers "ok" per
// file. hwloc's XML reader crashes on some malformed inputs (finding H1 in docs/reliability/fuzz.md): when
// it does, this process dies instead of the fuzzer, which then skips the input and starts a new helper.
// Built without instrumentation: it only runs hwloc.
#include <hwloc.h>

#include <cstdio>
#include <iostream>
#include <string>

int main() {
  std::string path;
  while (std::getline(std::cin, path)) {
    hwloc_topology_t topo = nullptr;
    if (hwloc_topology_init(&topo) == 0) {
      hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
      if (hwloc_topology_set_xml(topo, path.c_str()) == 0) hwloc_topology_load(topo);
      hwloc_topology_destroy(topo);
    }
    std::cout << "ok" << std::endl;
  }
  return 0;
}
