#include "ubep/options.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "ubep/config.hpp"
#include "ubep/error.hpp"

namespace ubep {
namespace {

[[noreturn]] void bad(const char* what, const std::string& value, const std::string& why) {
  throw Error(Errc::invalid_argument, std::string("ubep: ") + what + "='" + value + "': " + why);
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

std::uint64_t parse_uint(const std::string& text, const char* what) {
  std::string t = trim(text);
  if (t.empty() || !std::isdigit(static_cast<unsigned char>(t[0]))) bad(what, text, "expected a non-negative integer");
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(t.c_str(), &end, 10);
  if (errno == ERANGE || end != t.c_str() + t.size()) bad(what, text, "expected a non-negative integer");
  return v;
}

std::uint32_t parse_u32(const std::string& text, const char* what) {
  std::uint64_t v = parse_uint(text, what);
  if (v > 0xffffffffULL) bad(what, text, "value too large");
  return static_cast<std::uint32_t>(v);
}

bool parse_bool(const std::string& text, const char* what) {
  std::string t = trim(text);
  if (t == "1" || t == "yes" || t == "true" || t == "on") return true;
  if (t == "0" || t == "no" || t == "false" || t == "off" || t.empty()) return false;
  bad(what, text, "expected 0 or 1");
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, sep)) {
    item = trim(item);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

}  // namespace

std::size_t parse_size(const std::string& text, const char* what) {
  std::string t = trim(text);
  std::size_t shift = 0;
  if (!t.empty()) {
    switch (std::toupper(static_cast<unsigned char>(t.back()))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      default: break;
    }
    if (shift) t.pop_back();
    if (!t.empty() && (t.back() == 'i' || t.back() == 'I')) bad(what, text, "use K, M, G or T (powers of 2)");
  }
  std::uint64_t v = parse_uint(t, what);
  if (shift && v > (~std::uint64_t{0} >> shift)) bad(what, text, "size overflows 64 bits");
  return static_cast<std::size_t>(v << shift);
}

PollPolicy PollPolicy::parse(const std::string& text) {
  PollPolicy p;
  std::string t = trim(text);
  if (t.empty() || t == "adaptive") return p;
  if (t == "spin") {
    p.spin = 0xffffffffu;
    p.yield = 0;
    return p;
  }
  if (t == "yield") {
    p.spin = 0;
    p.yield = 0xffffffffu;
    return p;
  }
  for (const std::string& kv : split(t, ',')) {
    auto eq = kv.find('=');
    if (eq == std::string::npos) bad("UBEP_POLL", text, "expected adaptive, spin, yield or key=value pairs");
    std::string key = trim(kv.substr(0, eq));
    std::string val = kv.substr(eq + 1);
    if (key == "spin")
      p.spin = parse_u32(val, "UBEP_POLL spin");
    else if (key == "yield")
      p.yield = parse_u32(val, "UBEP_POLL yield");
    else if (key == "sleep_max_us")
      p.sleep_max_us = parse_u32(val, "UBEP_POLL sleep_max_us");
    else if (key == "progress_every")
      p.progress_every = parse_u32(val, "UBEP_POLL progress_every");
    else
      bad("UBEP_POLL", text, "unknown key '" + key + "' (spin, yield, sleep_max_us, progress_every)");
  }
  if (p.progress_every == 0) bad("UBEP_POLL", text, "progress_every must be at least 1");
  return p;
}

std::vector<std::string> Options::default_transports() {
  if (UBEP_SIMGRID) return {"self", "mpi"};  // every byte between ranks crosses the simulated network
  if (UBEP_HAVE_UCX) return {"self", "shm", "ucx", "mpi"};
  return {"self", "shm", "mpi"};
}

Options Options::from_env() {
  Options o;
  if (const char* v = env("UBEP_HEAP_SIZE")) {
    o.heap_size = parse_size(v, "UBEP_HEAP_SIZE");
    if (o.heap_size == 0) bad("UBEP_HEAP_SIZE", v, "must be positive");
  }
  if (const char* v = env("UBEP_WAIT_TIMEOUT")) {
    char* end = nullptr;
    double s = std::strtod(v, &end);
    if (end == v || *end != '\0' || !std::isfinite(s) || s < 0) bad("UBEP_WAIT_TIMEOUT", v, "expected seconds >= 0");
    o.wait_timeout = std::chrono::duration<double>(s);
  }
  if (const char* v = env("UBEP_POLL")) o.poll = PollPolicy::parse(v);
  if (const char* v = env("UBEP_TRANSPORTS")) {
    o.transports = split(v, ',');
    for (const std::string& t : o.transports) {
      if (t != "self" && t != "shm" && t != "mpi" && t != "ucx")
        bad("UBEP_TRANSPORTS", v, "unknown transport '" + t + "' (self, shm, mpi, ucx)");
    }
    if (o.transports.empty()) bad("UBEP_TRANSPORTS", v, "no transport named");
  }
  if (const char* v = env("UBEP_PROGRESS_THREAD")) {
    if (trim(v) == "auto") {
      o.progress_thread = false;
      o.ucx_progress_thread = true;
    } else {
      o.progress_thread = parse_bool(v, "UBEP_PROGRESS_THREAD (auto, 1 or 0)");
      o.ucx_progress_thread = o.progress_thread;
    }
  }
  if (const char* v = env("UBEP_GPU")) o.gpu = parse_bool(v, "UBEP_GPU");
  if (const char* v = env("UBEP_GPU_EMULATE")) o.gpu_emulate = parse_bool(v, "UBEP_GPU_EMULATE");
  if (const char* v = env("UBEP_GPU_MPI_WINDOW")) {
    o.gpu_mpi_window = trim(v);
    if (o.gpu_mpi_window != "auto" && o.gpu_mpi_window != "1" && o.gpu_mpi_window != "0") {
      bad("UBEP_GPU_MPI_WINDOW", v, "expected auto, 1 or 0");
    }
  }
  if (const char* v = env("UBEP_GPU_STAGING_CHUNK")) {
    o.gpu_staging_chunk = parse_size(v, "UBEP_GPU_STAGING_CHUNK");
    if (o.gpu_staging_chunk == 0) bad("UBEP_GPU_STAGING_CHUNK", v, "must be positive");
  }
  if (const char* v = env("UBEP_GPU_HEAP_SIZE")) {
    o.gpu_heap_size = parse_size(v, "UBEP_GPU_HEAP_SIZE");
    if (o.gpu_heap_size == 0) bad("UBEP_GPU_HEAP_SIZE", v, "must be positive");
  }
  if (const char* v = env("UBEP_PROGRESS_INTERVAL_US")) {
    o.progress_interval_us = parse_u32(v, "UBEP_PROGRESS_INTERVAL_US");
  }
  if (const char* v = env("UBEP_VIRTUAL_NODES")) o.virtual_nodes = trim(v);
  if (const char* v = env("UBEP_SCHEDULE")) {
    o.schedule = trim(v);
    if (o.schedule != "linear" && o.schedule != "shifted" && o.schedule != "topology") {
      bad("UBEP_SCHEDULE", v, "expected linear, shifted or topology");
    }
  }
  if (const char* v = env("UBEP_TOPOLOGY_FILE")) o.topology_file = v;
  if (const char* v = env("UBEP_TOPOLOGY_PROBE")) o.topology_probe = parse_bool(v, "UBEP_TOPOLOGY_PROBE");
  if (const char* v = env("UBEP_RUN_AHEAD")) {
    o.run_ahead = parse_u32(v, "UBEP_RUN_AHEAD");
    if (o.run_ahead == 0 || o.run_ahead > 64) bad("UBEP_RUN_AHEAD", v, "expected 1..64");
  }
  if (const char* v = env("UBEP_MPI_SIGNAL")) {
    const std::string t = trim(v);
    if (t != "put" && t != "accumulate" && t != "message") {
      bad("UBEP_MPI_SIGNAL", v, "expected put, accumulate or message");
    }
    o.mpi_signal_put = t == "put";
    o.mpi_signal_message = t == "message";
  }
  if (const char* v = env("UBEP_UCX_MODE")) {
    o.ucx_mode = trim(v);
    if (o.ucx_mode != "auto" && o.ucx_mode != "am" && o.ucx_mode != "rdma") {
      bad("UBEP_UCX_MODE", v, "expected auto, am or rdma");
    }
  }
  if (const char* v = env("UBEP_MPI_BOUNDED")) {
    o.mpi_bounded = trim(v);
    if (o.mpi_bounded != "auto" && o.mpi_bounded != "all" && o.mpi_bounded != "off") {
      bad("UBEP_MPI_BOUNDED", v, "expected auto, all or off");
    }
  }
  return o;
}

std::vector<std::string> Options::describe() const {
  std::vector<std::string> out;
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
    return s;
  };
  out.push_back("UBEP_HEAP_SIZE=" + std::to_string(heap_size));
  char timeout[32];  // %.17g reads back as the same double (std::to_string printed 1e-7 as 0.000000: "never")
  std::snprintf(timeout, sizeof timeout, "%.17g", wait_timeout.count());
  out.push_back(std::string("UBEP_WAIT_TIMEOUT=") + timeout);
  out.push_back("UBEP_POLL=spin=" + std::to_string(poll.spin) + ",yield=" + std::to_string(poll.yield) +
                ",sleep_max_us=" + std::to_string(poll.sleep_max_us) +
                ",progress_every=" + std::to_string(poll.progress_every));
  out.push_back("UBEP_TRANSPORTS=" + join(transports));
  out.push_back(std::string("UBEP_PROGRESS_THREAD=") + (progress_thread ? "1" : ucx_progress_thread ? "auto" : "0"));
  out.push_back("UBEP_PROGRESS_INTERVAL_US=" + std::to_string(progress_interval_us));
  out.push_back(std::string("UBEP_GPU=") + (gpu ? "1" : "0"));
  out.push_back("UBEP_GPU_HEAP_SIZE=" + std::to_string(gpu_heap_size));
  out.push_back("UBEP_GPU_STAGING_CHUNK=" + std::to_string(gpu_staging_chunk));
  out.push_back(std::string("UBEP_GPU_EMULATE=") + (gpu_emulate ? "1" : "0"));
  out.push_back("UBEP_GPU_MPI_WINDOW=" + gpu_mpi_window);
  out.push_back("UBEP_VIRTUAL_NODES=" + virtual_nodes);
  out.push_back("UBEP_SCHEDULE=" + schedule);
  out.push_back("UBEP_TOPOLOGY_FILE=" + topology_file);
  out.push_back(std::string("UBEP_TOPOLOGY_PROBE=") + (topology_probe ? "1" : "0"));
  out.push_back("UBEP_RUN_AHEAD=" + std::to_string(run_ahead));
  out.push_back(std::string("UBEP_MPI_SIGNAL=") + (mpi_signal_message ? "message"
                                                   : mpi_signal_put   ? "put"
                                                                      : "accumulate"));
  out.push_back("UBEP_MPI_BOUNDED=" + mpi_bounded);
  out.push_back("UBEP_UCX_MODE=" + ucx_mode);
  return out;
}

}  // namespace ubep
