# cmake -DFILES="a;b" -P check_no_cuda_needed.cmake: fails when an ELF file in FILES needs a CUDA library
# (libcudart, libcuda) at run time: ubep links the CUDA runtime statically and reaches the driver through
# cudaGetDriverEntryPointByVersion only (docs/ARCHITECTURE.md, "Dependencies").
foreach(file IN LISTS FILES)
  execute_process(COMMAND readelf -d ${file} OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "readelf -d ${file} failed (${rc})")
  endif()
  if(NOT dyn MATCHES "\\(NEEDED\\)")
    message(FATAL_ERROR "readelf -d ${file} lists no NEEDED entry at all: not the dynamic ELF file expected")
  endif()
  string(REGEX MATCHALL "Shared library: \\[libcuda[^]]*\\]" cuda "${dyn}")
  if(cuda)
    message(FATAL_ERROR "${file} needs ${cuda}: a machine without the CUDA driver or toolkit could not start it")
  endif()
  message(STATUS "${file}: no CUDA library needed")
endforeach()
