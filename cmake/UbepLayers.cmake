# The layers of libubep, enforced by the compiler (docs/ARCHITECTURE.md).
#
# Each layer is an OBJECT library whose only include path is its own include scope: a directory in the
# build tree holding symbolic links to exactly the headers the layer may see,
#   <scope>/<layer>/...      -> the source directory of the layer itself and of each layer below it
#                               that it may use privately (LAYERS, transitively);
#   <scope>/ubep/<header>    -> the public headers of those layers and of the layers whose public API
#                               it uses (API, transitively).
# Includes keep their usual spelling ("transports/mpi_rma.hpp", "ubep/options.hpp"), but a header of a
# layer above is simply not there: `#include "runtime/state.hpp"` in a transport fails to compile with
# "No such file or directory". tests/layering/ proves it for every rule.
include_guard(GLOBAL)

set(UBEP_LAYER_SCOPES ${PROJECT_BINARY_DIR}/layers)
set_property(GLOBAL PROPERTY UBEP_LAYERS "")

# _ubep_layer_closure(<out> <layers>...): the layers and everything below them, by LAYERS and API.
function(_ubep_layer_closure out kinds)
  set(todo ${ARGN})
  set(seen)
  while(todo)
    list(POP_FRONT todo layer)
    if(layer IN_LIST seen)
      continue()
    endif()
    get_property(known GLOBAL PROPERTY UBEP_LAYERS)
    if(NOT layer IN_LIST known)
      message(FATAL_ERROR "ubep: unknown layer '${layer}' (define the layers bottom-up)")
    endif()
    list(APPEND seen ${layer})
    foreach(kind IN LISTS kinds)
      get_property(below GLOBAL PROPERTY UBEP_LAYER_${layer}_${kind})
      list(APPEND todo ${below})
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

# ubep_include_scope(<scope> [SELF <dir>] [LAYERS <layer>...] [API <layer>...] [HEADERS <public>...])
# Builds the include scope <scope> and returns its directory in UBEP_SCOPE_DIR: links to the source
# directory SELF (relative to the project root), to the private headers of LAYERS and the layers they
# use privately, and to the public headers of all of those, of API and of the layers below API, plus
# HEADERS (public headers owned by <scope> itself).
function(ubep_include_scope scope)
  cmake_parse_arguments(ARG "" "SELF" "LAYERS;API;HEADERS" ${ARGN})
  _ubep_layer_closure(private "LAYERS" ${ARG_LAYERS})
  _ubep_layer_closure(visible "LAYERS;API" ${ARG_LAYERS} ${ARG_API})
  set(headers ${ARG_HEADERS})
  foreach(layer IN LISTS visible)
    get_property(h GLOBAL PROPERTY UBEP_LAYER_${layer}_HEADERS)
    list(APPEND headers ${h})
  endforeach()
  set(dirs ${ARG_SELF})
  foreach(layer IN LISTS private)
    list(APPEND dirs ${layer})
  endforeach()

  set(root ${UBEP_LAYER_SCOPES}/${scope})
  file(REMOVE_RECURSE ${root})
  file(MAKE_DIRECTORY ${root}/ubep)
  foreach(dir IN LISTS dirs)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${dir} ${root}/${dir} SYMBOLIC)
  endforeach()
  foreach(header IN LISTS headers)
    if(IS_ABSOLUTE ${header})
      set(path ${header})
    else()
      set(path ${PROJECT_SOURCE_DIR}/include/ubep/${header})
    endif()
    get_filename_component(name ${path} NAME)
    file(CREATE_LINK ${path} ${root}/ubep/${name} SYMBOLIC)
  endforeach()
  set(UBEP_SCOPE_DIR ${root} PARENT_SCOPE)
endfunction()

# ubep_layer(<name> SOURCES <file>... [HEADERS <public header>...] [LAYERS <layer>...] [API <layer>...]
#            [LINK <library>...])
# An OBJECT library ubep_<name> from <name>/SOURCES, compiled in its own include scope, its objects
# linked into libubep. HEADERS are the public headers (include/ubep/) the layer owns; LAYERS the layers
# below whose private headers it includes; API the layers whose public headers only it includes. LINK
# are its dependencies (usage requirements here, link items of libubep).
function(ubep_layer name)
  cmake_parse_arguments(ARG "" "" "SOURCES;HEADERS;LAYERS;API;LINK" ${ARGN})
  set_property(GLOBAL APPEND PROPERTY UBEP_LAYERS ${name})
  set_property(GLOBAL PROPERTY UBEP_LAYER_${name}_HEADERS ${ARG_HEADERS})
  set_property(GLOBAL PROPERTY UBEP_LAYER_${name}_LAYERS ${ARG_LAYERS})
  set_property(GLOBAL PROPERTY UBEP_LAYER_${name}_API ${ARG_API})
  set_property(GLOBAL PROPERTY UBEP_LAYER_${name}_LINK ${ARG_LINK})
  ubep_include_scope(${name} LAYERS ${name} ${ARG_LAYERS} API ${ARG_API})

  set(target ubep_${name})
  list(TRANSFORM ARG_SOURCES PREPEND ${PROJECT_SOURCE_DIR}/${name}/)
  add_library(${target} OBJECT ${ARG_SOURCES})
  target_compile_features(${target} PRIVATE cxx_std_20)
  target_compile_options(${target} PRIVATE ${UBEP_WARNINGS})
  target_include_directories(${target} PRIVATE ${UBEP_SCOPE_DIR})
  # MPI everywhere (mpi.h is part of the public API); the rest only where a layer asks for it, so that
  # hwloc or nlohmann-json never reach a layer that does not name them.
  target_link_libraries(${target} PRIVATE MPI::MPI_CXX ${ARG_LINK})
  target_sources(ubep PRIVATE $<TARGET_OBJECTS:${target}>)
  foreach(lib IN LISTS ARG_LINK)
    # Link items of libubep; header-only BUILD_INTERFACE items stay out of the installed package.
    target_link_libraries(ubep PRIVATE ${lib})
  endforeach()
endfunction()

# ubep_layer_scope(<target> <layer>): compiles <target> in the include scope of <layer> (for the
# layering tests, which must see exactly what the layer sees), with the layer's dependencies.
function(ubep_layer_scope target layer)
  target_include_directories(${target} PRIVATE ${UBEP_LAYER_SCOPES}/${layer})
  get_property(link GLOBAL PROPERTY UBEP_LAYER_${layer}_LINK)
  target_link_libraries(${target} PRIVATE MPI::MPI_CXX ${link})
endfunction()
