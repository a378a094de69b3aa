# Runs one libFuzzer target for a short fixed time (ctest -L fuzz): a fresh copy of the seed corpus in
# the build tree is the corpus libFuzzer reads and extends; crashes land in WORK/artifacts/.
#   cmake -DFUZZER=<exe> -DSEEDS=<seed dir> -DWORK=<scratch dir> "-DARGS=<libFuzzer flags>" -P run_fuzzer.cmake
foreach(var FUZZER SEEDS WORK ARGS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_fuzzer.cmake: -D${var}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/artifacts)
file(COPY ${SEEDS}/ DESTINATION ${WORK}/corpus)
separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND ${FUZZER} ${args} -artifact_prefix=${WORK}/artifacts/ ${WORK}/corpus RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(GLOB found ${WORK}/artifacts/*)
  message(FATAL_ERROR "${FUZZER} failed (exit ${rc}); reproducer(s): ${found}\n"
                      "rerun one with: ${FUZZER} <file>")
endif()
