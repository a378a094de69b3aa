// Options::from_env: every UBEP_* variable parses its documented values and rejects the rest with an
// error naming the variable and the value.
#include "ubep/options.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <string>
#include <utility>

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
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

 private:
  const char* name_;
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
    EXPECT_FALSE(Options::from_env().mpi_signal_put);
  }
  {
    Env e("UBEP_MPI_SIGNAL", " put ");
    EXPECT_TRUE(Options::from_env().mpi_signal_put);
  }
  {
    Env e("UBEP_MPI_SIGNAL", "message");
    EXPECT_TRUE(Options::from_env().mpi_signal_message);
    EXPECT_FALSE(Options::from_env().mpi_signal_put);
    bool found = false;
    for (const std::string& line : Options::from_env().describe()) found = found || line == "UBEP_MPI_SIGNAL=message";
    EXPECT_TRUE(found);
  }
  unsetenv("UBEP_MPI_SIGNAL");
  EXPECT_TRUE(Options::from_env().mpi_signal_put) << "the default is put";
  EXPECT_FALSE(Options::from_env().mpi_signal_message) << "messages are the default only in SimGrid builds";
  const std::string what = error_of("UBEP_MPI_SIGNAL", "cas");
  EXPECT_NE(what.find("UBEP_MPI_SIGNAL"), std::string::npos) << what;
  EXPECT_NE(what.find("cas"), std::string::npos) << what;
}

TEST(Options, MpiBounded) {
  unsetenv("UBEP_MPI_BOUNDED");
  EXPECT_EQ(Options::from_env().mpi_bounded, "auto") << "the default is auto";
  for (const auto& [text, want] : {std::pair{"all", "all"}, std::pair{"off", "off"}, std::pair{" auto ", "auto"}}) {
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
  EXPECT_EQ(Options::from_env().gpu_mpi_window, "auto") << "the default is auto";
  for (const auto& [text, want] : {std::pair{"1", "1"}, std::pair{"0", "0"}, std::pair{" auto ", "auto"}}) {
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
    for (const std::string& line : o.describe()) found = found || line == "UBEP_GPU_HEAP_SIZE=100663296";
    EXPECT_TRUE(found);
  }
  EXPECT_EQ(Options::from_env().gpu_heap_size, std::size_t{1} << 30);
}

TEST(Options, RejectsBadValues) {
  for (const auto& [name, value] : {std::pair{"UBEP_RUN_AHEAD", "0"}, std::pair{"UBEP_SCHEDULE", "random"},
                                    std::pair{"UBEP_WAIT_TIMEOUT", "-1"}, std::pair{"UBEP_TRANSPORTS", "tcp"},
                                    std::pair{"UBEP_GPU_HEAP_SIZE", "0"}, std::pair{"UBEP_GPU_HEAP_SIZE", "lots"}}) {
    const std::string what = error_of(name, value);
    EXPECT_NE(what.find(name), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace ubep
