// Options::from_env and the settings table: every UBEP_* variable parses its documented values and rejects the rest
// with an error naming the variable and the value.
#include "ubep/options.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ubep/error.hpp"

namespace ubep {
namespace {

class Env {
 public:
  Env(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~Env() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

std::string error_of(const char* name, const char* value) {
  Env e(name, value);
  try {
    (void)Options::from_env();
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::invalid_argument);
    return err.what();
  }
  return "(no error)";
}

TEST(Options, MpiSignal) {
  {
    Env e("UBEP_MPI_SIGNAL", "accumulate");
    EXPECT_EQ(Options::from_env().mpi_signal, MpiSignal::accumulate);
  }
  {
    Env e("UBEP_MPI_SIGNAL", " put ");
    EXPECT_TRUE(Options::from_env().mpi_signal == MpiSignal::put);
  }
  {
    Env e("UBEP_MPI_SIGNAL", "message");
    EXPECT_EQ(Options::from_env().mpi_signal, MpiSignal::message);
    bool found = false;
    for (const std::string& line : Options::from_env().describe()) found = found || line == "UBEP_MPI_SIGNAL=message";
    EXPECT_TRUE(found);
  }
  unsetenv("UBEP_MPI_SIGNAL");
  EXPECT_EQ(Options::from_env().mpi_signal, MpiSignal::put) << "the default is put (message only in SimGrid builds)";
  const std::string what = error_of("UBEP_MPI_SIGNAL", "cas");
  EXPECT_NE(what.find("UBEP_MPI_SIGNAL"), std::string::npos) << what;
  EXPECT_NE(what.find("cas"), std::string::npos) << what;
}

TEST(Options, MpiBounded) {
  unsetenv("UBEP_MPI_BOUNDED");
  EXPECT_EQ(Options::from_env().mpi_bounded, MpiBounded::automatic) << "the default is auto";
  for (const auto& [text, want] : {std::pair{"all", MpiBounded::all}, std::pair{"off", MpiBounded::off},
                                   std::pair{" auto ", MpiBounded::automatic}}) {
    Env e("UBEP_MPI_BOUNDED", text);
    EXPECT_EQ(Options::from_env().mpi_bounded, want) << text;
  }
  const std::string what = error_of("UBEP_MPI_BOUNDED", "some");
  EXPECT_NE(what.find("UBEP_MPI_BOUNDED"), std::string::npos) << what;
  Env e("UBEP_MPI_BOUNDED", "all");
  bool found = false;
  for (const std::string& line : Options::from_env().describe()) found = found || line == "UBEP_MPI_BOUNDED=all";
  EXPECT_TRUE(found);
}

TEST(Options, GpuMpiWindow) {
  unsetenv("UBEP_GPU_MPI_WINDOW");
  EXPECT_EQ(Options::from_env().gpu_mpi_window, GpuMpiWindow::automatic) << "the default is auto";
  for (const auto& [text, want] : {std::pair{"1", GpuMpiWindow::on}, std::pair{"0", GpuMpiWindow::off},
                                   std::pair{" auto ", GpuMpiWindow::automatic}}) {
    Env e("UBEP_GPU_MPI_WINDOW", text);
    EXPECT_EQ(Options::from_env().gpu_mpi_window, want) << text;
  }
  const std::string what = error_of("UBEP_GPU_MPI_WINDOW", "yes");
  EXPECT_NE(what.find("UBEP_GPU_MPI_WINDOW"), std::string::npos) << what;
  EXPECT_NE(what.find("auto, 1 or 0"), std::string::npos) << what;
  Env e("UBEP_GPU_MPI_WINDOW", "0");
  bool found = false;
  for (const std::string& line : Options::from_env().describe()) found = found || line == "UBEP_GPU_MPI_WINDOW=0";
  EXPECT_TRUE(found);
}

TEST(Options, DescribeListsEveryVariable) {
  Env e("UBEP_MPI_SIGNAL", "accumulate");
  bool found = false;
  for (const std::string& line : Options::from_env().describe()) found = found || line == "UBEP_MPI_SIGNAL=accumulate";
  EXPECT_TRUE(found);
}

TEST(Options, GpuHeapSize) {
  EXPECT_EQ(Options{}.gpu_heap_size, std::size_t{1} << 30);
  {
    Env e("UBEP_GPU_HEAP_SIZE", "96M");
    const Options o = Options::from_env();
    EXPECT_EQ(o.gpu_heap_size, std::size_t{96} << 20);
    bool found = false;
    for (const std::string& line : o.describe()) found = found || line == "UBEP_GPU_HEAP_SIZE=96M";
    EXPECT_TRUE(found);
  }
  EXPECT_EQ(Options::from_env().gpu_heap_size, std::size_t{1} << 30);
}

TEST(Options, RejectsBadValues) {
  for (const auto& [name, value] : {std::pair{"UBEP_RUN_AHEAD", "0"}, std::pair{"UBEP_SCHEDULE", "random"},
                                    std::pair{"UBEP_WAIT_TIMEOUT", "-1"}, std::pair{"UBEP_TRANSPORTS", "tcp"},
                                    std::pair{"UBEP_GPU_HEAP_SIZE", "0"}, std::pair{"UBEP_GPU_HEAP_SIZE", "lots"},
                                    std::pair{"UBEP_UCX_EAGER_MAX", "eager"}, std::pair{"UBEP_UCX_EAGER_MAX", "-1"}}) {
    const std::string what = error_of(name, value);
    EXPECT_NE(what.find(name), std::string::npos) << what;
  }
}

// The settings table defines each variable once; from_env() and describe() are generated from it.
TEST(Settings, TableDefinesEachVariableOnce) {
  const Options defaults;
  const std::vector<std::string> lines = defaults.describe();
  ASSERT_EQ(lines.size(), settings().size());
  std::set<std::string> names;
  std::size_t i = 0;
  for (const Setting& row : settings()) {
    const std::string name = row.name;
    EXPECT_EQ(name.rfind("UBEP_", 0), 0u) << name;
    EXPECT_TRUE(names.insert(name).second) << name << " twice in the table";
    EXPECT_EQ(lines[i++], name + "=" + row.value(defaults)) << "describe() follows the table's order";
    EXPECT_STRNE(row.type, "") << name;
    EXPECT_GT(std::string(row.meaning).size(), 20u) << name;
    EXPECT_EQ(&setting(name), &row);
    Options parsed;
    row.parse(parsed, row.value(defaults));
    EXPECT_EQ(parsed, defaults) << name << ": the default's text reads back as the default";
  }
  EXPECT_THROW((void)setting("UBEP_NOT_A_SETTING"), Error);
  // What every rank must agree on, and what is for testing only.
  for (const char* name : {"UBEP_HEAP_SIZE", "UBEP_TRANSPORTS", "UBEP_MPI_SIGNAL", "UBEP_GPU_HEAP_SIZE"})
    EXPECT_TRUE(setting(name).collective) << name;
  for (const char* name :
       {"UBEP_WAIT_TIMEOUT", "UBEP_POLL", "UBEP_SCHEDULE", "UBEP_MOE_KERNELS", "UBEP_MOE_RELAY_THREAD"})
    EXPECT_FALSE(setting(name).collective) << name;
  for (const Setting& row : settings()) {
    const std::string name = row.name;
    EXPECT_EQ(row.testing, name == "UBEP_GPU_EMULATE" || name == "UBEP_VIRTUAL_NODES") << name;
  }
}

// Settings away from their defaults read back, through describe() and the environment, as equal settings.
TEST(Settings, DescribeReadsBack) {
  Options o;
  o.heap_size = 3 * 1024 + 1;
  o.wait_timeout = std::chrono::duration<double>(1e-7);
  o.poll = PollPolicy::parse("spin=3,yield=5");
  o.transports = {"self", "mpi"};
  o.ucx_mode = UcxMode::rdma;
  o.ucx_eager_max = 0;
  o.progress_thread = ProgressThread::off;
  o.gpu_mpi_window = GpuMpiWindow::on;
  o.schedule = ScheduleKind::shifted;
  o.mpi_signal = MpiSignal::accumulate;
  o.mpi_bounded = MpiBounded::all;
  o.moe_kernels = MoeKernels::portable;
  o.moe_relay_thread = true;
  o.virtual_nodes = "0,1|2,3";
  o.gpu_heap_size = std::size_t{5} << 30;
  std::vector<std::unique_ptr<Env>> env;
  for (const std::string& line : o.describe()) {
    const auto eq = line.find('=');
    env.push_back(std::make_unique<Env>(line.substr(0, eq).c_str(), line.substr(eq + 1).c_str()));
  }
  EXPECT_EQ(Options::from_env(), o);
  EXPECT_EQ(setting("UBEP_GPU_HEAP_SIZE").value(o), "5G");
  EXPECT_EQ(setting("UBEP_HEAP_SIZE").value(o), "3073");
  EXPECT_EQ(setting("UBEP_UCX_EAGER_MAX").value(o), "0");
}

// UBEP_UCX_EAGER_MAX takes a size (0: every payload by rendezvous) or auto (UCX's thresholds); 1M by default.
TEST(Settings, UcxEagerMaxTakesSizeOrAuto) {
  EXPECT_EQ(Options{}.ucx_eager_max, std::size_t{1} << 20);
  EXPECT_EQ(setting("UBEP_UCX_EAGER_MAX").value(Options{}), "1M");
  for (const auto& [text, value] : {std::pair{"auto", kUcxEagerAuto}, std::pair{"0", std::size_t{0}},
                                    std::pair{"64K", std::size_t{64} << 10}, std::pair{"1000", std::size_t{1000}}}) {
    Env e("UBEP_UCX_EAGER_MAX", text);
    EXPECT_EQ(Options::from_env().ucx_eager_max, value) << text;
  }
  Options o;
  o.ucx_eager_max = kUcxEagerAuto;
  EXPECT_EQ(setting("UBEP_UCX_EAGER_MAX").value(o), "auto");
  EXPECT_FALSE(setting("UBEP_UCX_EAGER_MAX").collective);
}

// A bad value names the variable, the value and what it takes.
TEST(Settings, ChoicesNameWhatTheyTake) {
  const std::string what = error_of("UBEP_UCX_MODE", "fast");
  EXPECT_NE(what.find("UBEP_UCX_MODE='fast'"), std::string::npos) << what;
  EXPECT_NE(what.find("auto, am or rdma"), std::string::npos) << what;
  Env e("UBEP_PROGRESS_THREAD", "0");
  EXPECT_EQ(Options::from_env().progress_thread, ProgressThread::off);
}

}  // namespace
}  // namespace ubep
