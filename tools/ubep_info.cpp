// ubep-info: what this build is and, under mpirun, how every rank reaches every other (like ucx_info /
// ompi_info). Rank 0 prints; the others only contribute their rows.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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

// A table cell: a '|' would end it.
std::string cell(const std::string& text) {
  std::string out;
  for (const char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

// The settings table as the Markdown of docs/SETTINGS.md: the settings for use, then those for testing.
void print_settings_table() {
  const ubep::Options defaults;
  for (const bool testing : {false, true}) {
    std::cout << (testing ? "\n### For testing\n\n" : "")
              << "| variable | takes | default | every rank agrees | meaning |\n|---|---|---|---|---|\n";
    for (const ubep::Setting& row : ubep::settings()) {
      if (row.testing != testing) continue;
      const std::string value = row.value(defaults);
      std::cout << "| `" << row.name << "` | " << cell(row.type) << " | "
                << (value.empty() ? "empty" : "`" + cell(value) + "`") << " | " << (row.collective ? "yes" : "no")
                << " | " << cell(row.meaning) << " |\n";
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ubep-info: build, MPI, route table and topology of a ubep job (run it under mpirun)"};
  bool topology = false, json = false, settings = false;
  app.add_flag("--topology", topology, "print placement, distance classes and schedules");
  app.add_flag("--json", json, "machine-readable output");
  app.add_flag("--settings", settings, "print the table of UBEP_* settings (Markdown, docs/SETTINGS.md) and exit");
  CLI11_PARSE(app, argc, argv);
  if (settings) {  // no MPI needed
    print_settings_table();
    return 0;
  }

  try {
    ubep::Context ctx;  // initializes MPI
    const ubep::RuntimeInfo info = ctx.info();
    const int n = ctx.size();
    std::vector<int> row(n), matrix(static_cast<std::size_t>(n) * n);
    for (int pe = 0; pe < n; ++pe) row[pe] = static_cast<int>(info.routes[pe]);
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
    const auto sched = ctx.options().schedule;

    if (ctx.rank() == 0) {
      // rank 0's GPUs: ubep-info asks CUDA (a job does only under UBEP_GPU=1 or when it asks itself)
      const ubep::GpuStatus& gpu = ubep::gpu_status();
      nlohmann::json j;
      j["version"] = UBEP_VERSION_STRING;
      j["build"] = {{"hwloc", UBEP_HAVE_HWLOC == 1}, {"cuda", UBEP_HAVE_CUDA == 1}};
      j["gpu"] = {{"available", gpu.available},
                  {"devices", gpu.devices},
                  {"cuda_error", gpu.cuda_error},
                  {"reason", gpu.reason}};
      j["mpi"] = {{"library", lib},
                  {"standard", std::to_string(major) + "." + std::to_string(minor)},
                  {"thread_level", thread_level_name(ctx.thread_level())},
                  {"node_window_model", info.node_window_model},
                  {"world_window_model", info.world_window_model}};
      j["ranks"] = n;
      j["nodes"] = ctx.topology().num_nodes();
      j["atomics"] = ctx.atomics_through_mpi() ? "mpi" : info.ucx.empty() ? "load/store" : "ucx";
      j["transports"] = info.transports;  // rank 0's
      if (!info.ucx.empty()) {
        j["ucx"] = info.ucx;
        j["ucx_peers"] = info.ucx_peers;  // rank 0's endpoints
      }
      j["progress_thread"] = info.progress_thread;  // rank 0's
      j["gpu_heap"] = info.gpu_heap;                // rank 0's
      j["gpu_peers"] = info.gpu_peers;              // how GPU-heap data reaches each pe from rank 0
      j["options"] = ctx.options().describe();
      j["routes"] = nlohmann::json::array();
      for (int r = 0; r < n; ++r) {
        nlohmann::json rr = nlohmann::json::array();
        for (int pe = 0; pe < n; ++pe) rr.push_back(ubep::to_string(static_cast<ubep::Route>(matrix[r * n + pe])));
        j["routes"].push_back(rr);
      }
      if (topology) j["topology"] = nlohmann::json::parse(ubep::describe_topology(ctx.topology(), sched, true));
      if (json) {
        std::cout << j.dump(2) << "\n";
      } else {
        std::cout << "# ubep " << UBEP_VERSION_STRING << " (hwloc " << (UBEP_HAVE_HWLOC ? "yes" : "no") << ", cuda "
                  << (UBEP_HAVE_CUDA ? "yes" : "no") << ")\n"
                  << "# MPI library:    " << lib << "\n"
                  << "# MPI standard:   " << major << "." << minor << "\n"
                  << "# thread level:   " << thread_level_name(ctx.thread_level()) << "\n"
                  << "# window model:   node " << info.node_window_model << ", world " << info.world_window_model
                  << "\n"
                  << "# ranks / nodes:  " << n << " / " << ctx.topology().num_nodes() << "\n"
                  << "# GPU:            " << gpu.reason << " (rank 0)\n"
                  << "# atomics:        "
                  << (ctx.atomics_through_mpi() ? "mpi (some peer is off-node or forced)"
                      : info.ucx.empty()        ? "load/store"
                      : info.ucx.find("mode am") != std::string::npos
                          ? "ucx (am: the target applies them with CPU atomics)"
                          : "ucx (UCX atomics to rdma-mode ranks, CPU atomics at am-mode targets)")
                  << "\n"
                  << "# transports:    ";
        for (const auto& t : info.transports) std::cout << " " << t;
        std::cout << " (rank 0)\n";
        if (!info.ucx.empty()) {
          std::cout << "# ucx:            " << info.ucx << "\n";
          for (int pe = 0; pe < n; ++pe) std::cout << "# ucx to rank " << pe << ":  " << info.ucx_peers[pe] << "\n";
        }
        std::cout << "# progress thread: " << info.progress_thread << " (rank 0)\n";
        std::cout << "# GPU heap:       " << info.gpu_heap << " (rank 0)\n";
        for (int pe = 0; pe < n; ++pe) std::cout << "# GPU data to rank " << pe << ": " << info.gpu_peers[pe] << "\n";
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
        if (topology) std::cout << ubep::describe_topology(ctx.topology(), sched, false);
      }
    }
    ctx.finalize();
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
