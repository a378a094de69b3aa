// ubep-info: what this build is and, under mpirun, how every rank reaches every other (like ucx_info /
// ompi_info). Rank 0 prints; the others only contribute their rows.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/state.hpp"
#include "topology/discover.hpp"
#include "ubep/ubep.hpp"

namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

std::string memory_model(MPI_Win win) {
  if (win == MPI_WIN_NULL) return "none";
  int* model = nullptr;
  int flag = 0;
  MPI_Win_get_attr(win, MPI_WIN_MODEL, &model, &flag);
  if (!flag) return "unknown";
  return *model == MPI_WIN_UNIFIED ? "MPI_WIN_UNIFIED" : "MPI_WIN_SEPARATE";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ubep-info: build, MPI, route table and topology of a ubep job (run it under mpirun)"};
  bool topology = false, json = false;
  app.add_flag("--topology", topology, "print placement, distance classes and schedules");
  app.add_flag("--json", json, "machine-readable output");
  CLI11_PARSE(app, argc, argv);

  try {
    ubep::Context ctx;  // initializes MPI
    ubep::detail::State& st = ctx.state();
    const int n = ctx.size();
    std::vector<int> row(n), matrix(static_cast<std::size_t>(n) * n);
    for (int pe = 0; pe < n; ++pe) row[pe] = static_cast<int>(ctx.route(pe));
    if (MPI_Gather(row.data(), n, MPI_INT, matrix.data(), n, MPI_INT, 0, ctx.comm()) != MPI_SUCCESS) {
      throw ubep::Error(ubep::Errc::mpi, "ubep-info: MPI_Gather of the route table failed");
    }

    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0, major = 0, minor = 0;
    MPI_Get_library_version(version, &len);
    MPI_Get_version(&major, &minor);
    std::string lib(version, len);
    while (!lib.empty() && (lib.back() == '\n' || lib.back() == ' ' || lib.back() == '\0')) lib.pop_back();
    if (auto nl = lib.find('\n'); nl != std::string::npos) lib = lib.substr(0, nl);
    const auto sched = ubep::parse_schedule(ctx.options().schedule);

    if (ctx.rank() == 0) {
      nlohmann::json j;
      j["version"] = UBEP_VERSION_STRING;
      j["build"] = {{"hwloc", UBEP_HAVE_HWLOC == 1}, {"cuda", UBEP_HAVE_CUDA == 1}};
      j["mpi"] = {{"library", lib},
                  {"standard", std::to_string(major) + "." + std::to_string(minor)},
                  {"thread_level", thread_level_name(ctx.thread_level())},
                  {"node_window_model", memory_model(st.node_win)},
                  {"world_window_model", memory_model(st.world_win)}};
      j["ranks"] = n;
      j["nodes"] = ctx.topology().num_nodes();
      j["atomics"] = ctx.atomics_through_mpi() ? "mpi" : "load/store";
      j["options"] = ctx.options().describe();
      j["routes"] = nlohmann::json::array();
      for (int r = 0; r < n; ++r) {
        nlohmann::json rr = nlohmann::json::array();
        for (int pe = 0; pe < n; ++pe) rr.push_back(ubep::to_string(static_cast<ubep::Route>(matrix[r * n + pe])));
        j["routes"].push_back(rr);
      }
      if (topology) j["topology"] = nlohmann::json::parse(ubep::detail::describe_topology(ctx.topology(), sched, true));
      if (json) {
        std::cout << j.dump(2) << "\n";
      } else {
        std::cout << "# ubep " << UBEP_VERSION_STRING << " (hwloc " << (UBEP_HAVE_HWLOC ? "yes" : "no") << ", cuda "
                  << (UBEP_HAVE_CUDA ? "yes" : "no") << ")\n"
                  << "# MPI library:    " << lib << "\n"
                  << "# MPI standard:   " << major << "." << minor << "\n"
                  << "# thread level:   " << thread_level_name(ctx.thread_level()) << "\n"
                  << "# window model:   node " << memory_model(st.node_win) << ", world " << memory_model(st.world_win)
                  << "\n"
                  << "# ranks / nodes:  " << n << " / " << ctx.topology().num_nodes() << "\n"
                  << "# atomics:        "
                  << (ctx.atomics_through_mpi() ? "mpi (some peer is off-node or forced)" : "load/store") << "\n";
        for (const auto& line : ctx.options().describe()) std::cout << "# " << line << "\n";
        std::cout << "# route table (row = origin rank, column = target rank)\n      ";
        for (int pe = 0; pe < n; ++pe) std::cout << " " << std::setw(4) << pe;
        std::cout << "\n";
        for (int r = 0; r < n; ++r) {
          std::cout << std::setw(6) << r;
          for (int pe = 0; pe < n; ++pe)
            std::cout << " " << std::setw(4) << ubep::to_string(static_cast<ubep::Route>(matrix[r * n + pe]));
          std::cout << "\n";
        }
        if (topology) std::cout << ubep::detail::describe_topology(ctx.topology(), sched, false);
      }
    }
    ctx.finalize();
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
