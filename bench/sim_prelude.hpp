// Force-included into the benchmarks of a SimGrid build (bench/CMakeLists.txt). SMPI's mpi.h defines
// function-like macros for exit() and friends, which break CLI11's App::exit member; the benchmarks
// return from main and never call exit, so the macro is dropped here, once, before any other header.
#pragma once
#include <mpi.h>
#undef exit
