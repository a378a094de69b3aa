# Multi-node tests over emulated nodes (tests/multinode/emulate.sh): include() this from tests/CMakeLists.txt.
#
# Registers multinode.selftest (the harness's own test) and defines
#   ubep_add_multinode_test(<name> TARGET <exe target> NODES <N> RANKS_PER_NODE <K>
#                           [ENV VAR=value ...] [TIMEOUT s] [ARGS ...] [EMULATE_ARGS ...] [SERIAL])
# which runs `emulate.sh --nodes N --ranks-per-node K -- $<TARGET_FILE:exe> ARGS...` with label `multinode`.
# EMULATE_ARGS go to emulate.sh (e.g. --switches 2 --rate 1gbit). SERIAL sets RUN_SERIAL (not needed for
# correctness: concurrent runs use distinct namespaces and subnets; see docs/MULTINODE.md).
# Emulation needs root and working `ip netns`; elsewhere nothing is registered (one configure message) and
# ubep_add_multinode_test() does nothing. -DUBEP_MULTINODE_TESTS=OFF turns them off everywhere.
include_guard(GLOBAL)

option(UBEP_MULTINODE_TESTS "Register tests across emulated nodes (needs root and ip netns)" ON)
set(UBEP_MULTINODE_DIR ${CMAKE_CURRENT_LIST_DIR} CACHE INTERNAL "")
set(UBEP_MULTINODE_ENABLED FALSE CACHE INTERNAL "")

if(UBEP_MULTINODE_TESTS)
  execute_process(COMMAND id -u OUTPUT_VARIABLE _ubep_mn_uid OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _ubep_mn_rc ERROR_QUIET)
  find_program(UBEP_IP_EXECUTABLE ip PATHS /usr/sbin /sbin)
  if(NOT _ubep_mn_rc EQUAL 0 OR NOT _ubep_mn_uid STREQUAL "0")
    message(STATUS "ubep: multinode tests not registered: emulating nodes needs root (uid is ${_ubep_mn_uid})")
  elseif(NOT UBEP_IP_EXECUTABLE)
    message(STATUS "ubep: multinode tests not registered: the 'ip' command (iproute2) is missing")
  else()
    execute_process(COMMAND ${UBEP_IP_EXECUTABLE} netns list RESULT_VARIABLE _ubep_mn_rc
                    OUTPUT_QUIET ERROR_QUIET)
    if(NOT _ubep_mn_rc EQUAL 0)
      message(STATUS "ubep: multinode tests not registered: 'ip netns' does not work here")
    else()
      set(UBEP_MULTINODE_ENABLED TRUE CACHE INTERNAL "")
    endif()
  endif()
endif()

# Which MPI launches: the one this build directory uses (UbepTesting.cmake sets UBEP_MPIEXEC_IS_OPENMPI).
if(DEFINED UBEP_MPIEXEC_IS_OPENMPI)
  set(_ubep_mn_is_ompi ${UBEP_MPIEXEC_IS_OPENMPI})
elseif(MPIEXEC_EXECUTABLE)
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _ubep_mn_v ERROR_VARIABLE _ubep_mn_v)
  if(_ubep_mn_v MATCHES "Open MPI|OpenRTE")
    set(_ubep_mn_is_ompi TRUE)
  else()
    set(_ubep_mn_is_ompi FALSE)
  endif()
else()
  set(_ubep_mn_is_ompi TRUE)
endif()
if(_ubep_mn_is_ompi)
  set(UBEP_MULTINODE_MPI openmpi CACHE INTERNAL "")
else()
  set(UBEP_MULTINODE_MPI mpich CACHE INTERNAL "")
endif()

if(UBEP_MULTINODE_ENABLED)
  message(STATUS "ubep: multinode tests registered (emulated nodes, ${UBEP_MULTINODE_MPI}; label multinode)")
  # The self-test builds hello.c itself with mpicc / mpicc.mpich; ~80 s for Open MPI on 2 cores, more with
  # MPICH. Its own emulate.sh runs all carry --timeout, so a hang never reaches CTest's SIGKILL.
  add_test(NAME multinode.selftest COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/selftest.sh)
  set_tests_properties(multinode.selftest PROPERTIES LABELS multinode TIMEOUT 400 SKIP_RETURN_CODE 77
                                                     PROCESSORS 4)
endif()

function(ubep_add_multinode_test name)
  cmake_parse_arguments(ARG "SERIAL" "TARGET;NODES;RANKS_PER_NODE;TIMEOUT" "ENV;ARGS;EMULATE_ARGS" ${ARGN})
  if(NOT UBEP_MULTINODE_ENABLED)
    return()
  endif()
  if(NOT ARG_TARGET OR NOT ARG_NODES OR NOT ARG_RANKS_PER_NODE)
    message(FATAL_ERROR "ubep_add_multinode_test(${name}): TARGET, NODES and RANKS_PER_NODE are required")
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 240)
  endif()
  if(UBEP_MULTINODE_MPI STREQUAL "mpich" AND ARG_TIMEOUT GREATER 180)
    set(ARG_TIMEOUT 180)  # the suites take under 30 s with MPICH; a hang in MPI_Finalize (below) waits this long
  endif()
  # emulate.sh kills the job and removes its namespaces before CTest would SIGKILL it (which no trap sees),
  # after printing the ranks' stacks (at most 25 s).
  math(EXPR _inner "${ARG_TIMEOUT} - 45")
  if(_inner LESS 10)
    set(_inner 10)
  endif()
  math(EXPR _np "${ARG_NODES} * ${ARG_RANKS_PER_NODE}")
  set(_env GTEST_COLOR=no UBEP_WAIT_TIMEOUT=60 ${ARG_ENV})
  add_test(NAME ${name}
           COMMAND bash ${UBEP_MULTINODE_DIR}/emulate.sh --mpi ${UBEP_MULTINODE_MPI} --nodes ${ARG_NODES}
                   --ranks-per-node ${ARG_RANKS_PER_NODE} --timeout ${_inner} ${ARG_EMULATE_ARGS}
                   -- $<TARGET_FILE:${ARG_TARGET}> ${ARG_ARGS})
  set_tests_properties(${name} PROPERTIES
    LABELS multinode TIMEOUT ${ARG_TIMEOUT} SKIP_RETURN_CODE 77 PROCESSORS ${_np}
    ENVIRONMENT "${_env}")
  if(ARG_SERIAL)
    set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE)
  endif()
  if(UBEP_MULTINODE_MPI STREQUAL "mpich")
    # MPICH 4.0.2 sometimes hangs in MPI_Finalize across nodes after every rank passed (pmodels/mpich#6596,
    # fixed in 4.2; docs/MULTINODE.md "Known problems"): judge the run by the verdict line that
    # tests/mpi/mpi_main.cpp prints before MPI_Finalize, not by the exit status of the killed job.
    set_tests_properties(${name} PROPERTIES PASS_REGULAR_EXPRESSION "all ranks passed"
                                            FAIL_REGULAR_EXPRESSION "FAILED on at least one rank;\\[  FAILED  \\]")
  endif()
endfunction()
