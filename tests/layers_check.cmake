# Note [Layers the build enforces] (CMakeLists.txt): every #include "<layer>/..." of src/<layer>/ names the
# layer itself or one it may use. Run by ctest (layers_include_order):
#   cmake -DROOT=<repository> -DLAYERS=<build>/layers.cmake -P tests/layers_check.cmake
include(${LAYERS})
set(bad "")
foreach(layer ${FLATPEAK_LAYERS})
  file(GLOB_RECURSE files ${ROOT}/src/${layer}/*.h ${ROOT}/src/${layer}/*.cpp ${ROOT}/src/${layer}/*.cu
       ${ROOT}/src/${layer}/*.cuh)
  foreach(f ${files})
    file(STRINGS ${f} lines REGEX "^#include \"[a-z_]+/")
    foreach(line ${lines})
      string(REGEX REPLACE "^#include \"([a-z_]+)/.*" "\\1" used "${line}")
      list(FIND FLATPEAK_USES_${layer} ${used} at)
      if(NOT used STREQUAL layer AND at EQUAL -1)
        file(RELATIVE_PATH rel ${ROOT} ${f})
        string(APPEND bad "  ${rel}: ${line} (${layer} may use: ${FLATPEAK_USES_${layer}})\n")
      endif()
    endforeach()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "includes against the layer order (Note [Layers the build enforces] in CMakeLists.txt):\n${bad}")
endif()
message(STATUS "every #include of src/ follows the layer order")
