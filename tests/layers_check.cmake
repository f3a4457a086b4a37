# Note [Layers the build enforces] (CMakeLists.txt): every #include "<layer>/..." of src/<layer>/ names the
# layer itself or one it may use. A backend plug-in (src/backend/<name>, Note [Backends as plug-ins] in
# src/backend/registry.h) is the layer backend_<name>: its files are not the base's, and an include of
# "backend/<name>/..." uses that layer, not the base. Run by ctest (layers_include_order):
#   cmake -DROOT=<repository> -DLAYERS=<build>/layers.cmake -P tests/layers_check.cmake
include(${LAYERS})
# The layer an include path "a/b/..." names.
function(layer_of path out)
  string(REGEX REPLACE "^([a-z_]+)/.*" "\\1" first "${path}")
  set(layer ${first})
  if(path MATCHES "^backend/([a-z_]+)/")  # every folder of src/backend is a plug-in, built or not
    set(layer backend_${CMAKE_MATCH_1})
  endif()
  set(${out} ${layer} PARENT_SCOPE)
endfunction()

set(bad "")
foreach(layer ${FLATPEAK_LAYERS})
  if(layer MATCHES "^backend_(.*)")
    set(dir ${ROOT}/src/backend/${CMAKE_MATCH_1})
  else()
    set(dir ${ROOT}/src/${layer})
  endif()
  file(GLOB_RECURSE files ${dir}/*.h ${dir}/*.cpp ${dir}/*.cu ${dir}/*.cuh)
  foreach(f ${files})
    file(RELATIVE_PATH rel ${ROOT}/src ${f})
    layer_of(${rel} owner)
    if(NOT owner STREQUAL layer)
      continue()  # a plug-in's file, checked as its own layer
    endif()
    file(STRINGS ${f} lines REGEX "^#include \"[a-z_]+/")
    foreach(line ${lines})
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" path "${line}")
      layer_of(${path} used)
      list(FIND FLATPEAK_USES_${layer} ${used} at)
      if(NOT used STREQUAL layer AND at EQUAL -1)
        string(APPEND bad "  src/${rel}: ${line} (${layer} may use: ${FLATPEAK_USES_${layer}})\n")
      endif()
    endforeach()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "includes against the layer order (Note [Layers the build enforces] in CMakeLists.txt):\n${bad}")
endif()
message(STATUS "every #include of src/ follows the layer order")
