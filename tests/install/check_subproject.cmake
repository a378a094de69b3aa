# cmake -P script: configures and builds subproject/ (ubep through add_subdirectory), runs its consumer,
# and checks that the configure step never looked for the tools' or tests' dependencies.
file(REMOVE_RECURSE ${WORK_DIR})
include(${CMAKE_CURRENT_LIST_DIR}/run.cmake)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR} -G ${GENERATOR} -DUBEP_SOURCE_DIR=${UBEP_SOURCE_DIR}
    -DCMAKE_BUILD_TYPE=Release -DMPI_CXX_COMPILER=${MPI_CXX_COMPILER})
file(STRINGS ${WORK_DIR}/CMakeCache.txt looked REGEX "^(CLI11_DIR|GTest_DIR|benchmark_DIR):")
if(looked)
  message(FATAL_ERROR "a subproject build looked for the tools' or tests' dependencies: ${looked}")
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR})
foreach(target ubep-info rma_test ubep_moe_bench)
  if(EXISTS ${WORK_DIR}/ubep/tools/${target} OR EXISTS ${WORK_DIR}/ubep/tests/mpi/${target}
     OR EXISTS ${WORK_DIR}/ubep/bench/${target})
    message(FATAL_ERROR "a subproject build built ${target}")
  endif()
endforeach()
run(${MPIEXEC} -n 2 ${MPIEXEC_EXTRA} ${WORK_DIR}/consumer)
if(NOT last_output MATCHES "consumer ok: 2 ranks")
  message(FATAL_ERROR "subproject consumer printed: ${last_output}")
endif()
message(STATUS "ubep as a subproject: library only, no CLI11/GoogleTest/Google Benchmark looked for; consumer ran")
