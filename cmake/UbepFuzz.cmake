# Fuzzing (UBEP_FUZZ=ON): libFuzzer through clang, in a build tree of its own (scripts/fuzz.sh).
# Everything built after this file is included (the library layers and tests/fuzz) is compiled with
# libFuzzer's coverage instrumentation plus ASan and UBSan; UBSan aborts on the first report, so that
# undefined behaviour is a crash libFuzzer records. The fuzz targets themselves link -fsanitize=fuzzer
# (tests/fuzz/CMakeLists.txt), which brings libFuzzer's main.
include_guard(GLOBAL)

if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "ubep: UBEP_FUZZ=ON needs clang (libFuzzer), but the C++ compiler is "
                      "${CMAKE_CXX_COMPILER_ID} (${CMAKE_CXX_COMPILER}). Configure a separate build tree with "
                      "CC=clang CXX=clang++ (apt-get install clang), or run scripts/fuzz.sh.")
endif()

set(UBEP_FUZZ_COMPILE_FLAGS -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
                            -fno-omit-frame-pointer -g)
set(UBEP_FUZZ_LINK_FLAGS -fsanitize=address,undefined)

# libclang_rt.fuzzer must be there, or every target fails to link much later with an obscure message.
include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_FLAGS "-fsanitize=fuzzer,address,undefined")
check_cxx_source_compiles(
  "#include <cstddef>\n#include <cstdint>\nextern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }"
  UBEP_FUZZ_LIBFUZZER_WORKS)
unset(CMAKE_REQUIRED_FLAGS)
if(NOT UBEP_FUZZ_LIBFUZZER_WORKS)
  message(FATAL_ERROR "ubep: UBEP_FUZZ=ON: clang cannot link -fsanitize=fuzzer,address,undefined "
                      "(libclang_rt.fuzzer missing? apt-get install clang)")
endif()

add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${UBEP_FUZZ_COMPILE_FLAGS}>")  # not for nvcc (transports/cuda/)
add_link_options(${UBEP_FUZZ_LINK_FLAGS})

# How long each CTest `fuzz` test runs its target, in seconds (scripts/fuzz.sh passes its argument).
set(UBEP_FUZZ_TIME 10 CACHE STRING "Seconds each fuzz test runs its target (ctest -L fuzz)")
message(STATUS "ubep: fuzzing build (libFuzzer + ASan + UBSan), ${UBEP_FUZZ_TIME} s per target under ctest -L fuzz")
