# Test helpers: one gtest executable per source, and MPI tests registered once per rank count and route.
include_guard(GLOBAL)

# Open MPI needs --oversubscribe to run more ranks than cores; MPICH must not get the flag.
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _ubep_mpiexec_version
                ERROR_VARIABLE _ubep_mpiexec_version)
if(_ubep_mpiexec_version MATCHES "Open MPI|OpenRTE")
  set(UBEP_MPIEXEC_IS_OPENMPI TRUE)
  set(UBEP_MPIEXEC_EXTRA --oversubscribe)
else()
  set(UBEP_MPIEXEC_IS_OPENMPI FALSE)
  set(UBEP_MPIEXEC_EXTRA)
endif()

# The environment every MPI test runs with: run as root, no colour, a wait timeout well below the
# CTest timeout so a hang ends with ubep's report rather than CTest's kill.
# Open MPI: one-sided through osc ucx (sm for shared windows). The default osc rdma over btl vader
# crashes in MPI_Compare_and_swap (Open MPI 4.1, ompi issues 11349 and 9146) and fails across TCP nodes.
set(UBEP_TEST_ENV GTEST_COLOR=no UBEP_WAIT_TIMEOUT=60)
if(UBEP_MPIEXEC_IS_OPENMPI)
  list(APPEND UBEP_TEST_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
       OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_osc=ucx,sm)
endif()

# ubep_add_unit_test(<name> <source>): a one-process gtest executable, label `unit`.
function(ubep_add_unit_test name source)
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE ubep::ubep GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  add_test(NAME ${name} COMMAND ${name})
  # Sanitized builds run the exhaustive schedule checks about 50x slower: they check memory errors on a
  # smaller exhaustive range (UBEP_TEST_SANITIZED), the default build checks the whole range.
  if(UBEP_SANITIZE OR UBEP_TSAN)
    target_compile_definitions(${name} PRIVATE UBEP_TEST_SANITIZED=1)
  endif()
  if(UBEP_SANITIZE)
    set(timeout 900)
  else()
    set(timeout 120)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS unit TIMEOUT ${timeout} ENVIRONMENT "${UBEP_TEST_ENV}")
endfunction()

# ubep_add_mpi_test(<name> SOURCES ... [NP 2 3 4] [ROUTES default mpi] [TIMEOUT s] [LABELS ...]
#                   [ENV VAR=value ...] [SUFFIX .tag])
# Registers <name>.np<N> for the default route and <name>.np<N>.<route> for each forced route (route
# names are UBEP_TRANSPORTS values; ucx_thread = ucx with UBEP_PROGRESS_THREAD=1; ucx_rdma = ucx with
# UBEP_UCX_MODE=rdma). The default ROUTES are default, mpi, and ucx in builds with UCX.
function(ubep_add_mpi_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT;SUFFIX" "SOURCES;NP;ROUTES;LABELS;ENV" ${ARGN})
  if(NOT ARG_NP)
    set(ARG_NP 2 3 4)
  endif()
  if(NOT ARG_ROUTES)
    set(ARG_ROUTES default mpi)
    if(UBEP_HAVE_UCX)
      list(APPEND ARG_ROUTES ucx)
    endif()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 180)
  endif()
  if(NOT TARGET ${name})
    add_executable(${name} ${ARG_SOURCES})
    target_link_libraries(${name} PRIVATE ubep::ubep ubep_gtest_mpi_main)
    target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  endif()
  foreach(np IN LISTS ARG_NP)
    foreach(route IN LISTS ARG_ROUTES)
      set(test_name ${name}.np${np}${ARG_SUFFIX})
      set(env ${UBEP_TEST_ENV} ${ARG_ENV})
      if(route STREQUAL "ucx_thread")  # every operation over UCX, a progress thread driving the worker
        set(test_name ${test_name}.${route})
        list(APPEND env UBEP_TRANSPORTS=ucx UBEP_PROGRESS_THREAD=1)
      elseif(route STREQUAL "ucx_rdma")  # every operation over UCX's put, fence and atomics
        set(test_name ${test_name}.${route})
        list(APPEND env UBEP_TRANSPORTS=ucx UBEP_UCX_MODE=rdma)
      elseif(NOT route STREQUAL "default")
        set(test_name ${test_name}.${route})
        list(APPEND env UBEP_TRANSPORTS=${route})
      endif()
      add_test(NAME ${test_name}
               COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${UBEP_MPIEXEC_EXTRA}
                       ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
      set_tests_properties(${test_name} PROPERTIES LABELS "mpi;${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                                                   ENVIRONMENT "${env}" PROCESSORS ${np})
    endforeach()
  endforeach()
endfunction()
