# Locates CUTLASS/CuTe headers for the sm90 kernels.
#
# Order of preference:
#   1. -DDASH_CUTLASS_DIR=<dir> or the environment variable DASH_CUTLASS_DIR: a CUTLASS checkout or
#      install already on the machine (the directory that holds include/cute and include/cutlass).
#   2. The pinned nvidia-cutlass wheel named in cmake/cutlass.lock, downloaded from PyPI by pip with
#      --require-hashes (so a changed file is refused) and unpacked into the build tree once.
# Defines the INTERFACE target dash::cutlass.

set(DASH_CUTLASS_DIR "$ENV{DASH_CUTLASS_DIR}" CACHE PATH
    "CUTLASS root holding include/cute; empty = fetch the pinned nvidia-cutlass wheel")

function(dash_fetch_pinned_cutlass out_include_dir)
  set(lock_file "${PROJECT_SOURCE_DIR}/cmake/cutlass.lock")
  file(STRINGS "${lock_file}" requirement REGEX "^nvidia-cutlass==")
  string(REGEX MATCH "==([0-9.]+)" _ "${requirement}")
  set(version "${CMAKE_MATCH_1}")
  set(root "${CMAKE_BINARY_DIR}/_deps/cutlass-${version}")
  set(include_dir "${root}/cutlass_library/source/include")
  if(NOT EXISTS "${include_dir}/cute/tensor.hpp")
    find_package(Python3 REQUIRED COMPONENTS Interpreter)
    message(STATUS "Fetching pinned CUTLASS headers: ${requirement}")
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -m pip download --quiet --no-deps --only-binary=:all:
              --require-hashes -r "${lock_file}" -d "${root}/wheel"
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "Could not download ${requirement} from PyPI (pip exit ${rc}):\n${err}\n"
                          "Set DASH_CUTLASS_DIR to a local CUTLASS to build offline.")
    endif()
    file(GLOB wheel "${root}/wheel/nvidia_cutlass-${version}-*.whl")
    file(ARCHIVE_EXTRACT INPUT "${wheel}" DESTINATION "${root}" PATTERNS "cutlass_library/source/include/*")
    if(NOT EXISTS "${include_dir}/cute/tensor.hpp")
      message(FATAL_ERROR "The wheel ${wheel} holds no cutlass_library/source/include/cute")
    endif()
  endif()
  set(${out_include_dir} "${include_dir}" PARENT_SCOPE)
endfunction()

if(DASH_CUTLASS_DIR)
  set(DASH_CUTLASS_INCLUDE_DIR "${DASH_CUTLASS_DIR}/include")
  if(NOT EXISTS "${DASH_CUTLASS_INCLUDE_DIR}/cute/tensor.hpp")
    message(FATAL_ERROR "DASH_CUTLASS_DIR=${DASH_CUTLASS_DIR} has no include/cute/tensor.hpp")
  endif()
else()
  dash_fetch_pinned_cutlass(DASH_CUTLASS_INCLUDE_DIR)
endif()
message(STATUS "CUTLASS headers: ${DASH_CUTLASS_INCLUDE_DIR}")

add_library(dash_cutlass INTERFACE)
add_library(dash::cutlass ALIAS dash_cutlass)
target_include_directories(dash_cutlass SYSTEM INTERFACE "${DASH_CUTLASS_INCLUDE_DIR}")
