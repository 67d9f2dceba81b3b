# SPDX-License-Identifier: Apache-2.0
# fulgur_find_libtorch(): finds a libtorch 2.x and defines the imported target fulgur::libtorch
# (libtorch_cpu and libc10, their headers, the definitions and the C++ standard they need).
#
# Used by fulgur's own build and by the installed package (fulgurConfig.cmake), so that an
# outside project gets the libtorch fulgur was built with. TorchConfig.cmake itself is not used:
# the `torch` wheel's copy needs a CUDA toolkit to configure, although libtorch_cpu runs
# without one.
#
# Where libtorch is looked for, first found wins:
#   FULGUR_LIBTORCH       a libtorch folder (include/, lib/, share/cmake/Torch/): pytorch.org's
#                         archive, or a Python environment's site-packages/torch
#   Torch_DIR             that folder's share/cmake/Torch
#   CMAKE_PREFIX_PATH     entries that are such a folder or its share/cmake (torch.utils.cmake_prefix_path)
#   DEFAULT <dir>         the caller's default (the checkout's .venv/libtorch, or the libtorch an
#                         installed fulgur was built with)
# REQUIRE_VERSION <v>: any other version is refused (an installed fulgur must be linked with the
# libtorch it was compiled against).
#
# A libtorch with CUDA (lib/libtorch_cuda.so and lib/libc10_cuda.so, as in pytorch.org's CUDA
# archives and the CUDA `torch` wheels) is linked with them as well, without --as-needed: nothing
# in fulgur calls into them by name, but loading them is what registers libtorch's CUDA kernels,
# allocator and generators. FULGUR_LIBTORCH_CUDA=OFF leaves them out (a CPU-only build of a CUDA
# libtorch). fulgur's code does not need CUDA headers for any of it.
#
# Sets FULGUR_LIBTORCH_ROOT, FULGUR_LIBTORCH_VERSION and FULGUR_LIBTORCH_HAS_CUDA in the caller's
# scope.

# The range this code is built and tested on: the lowest and the highest version (inclusive,
# by major.minor) that compile fulgur and pass its tests.
set(FULGUR_LIBTORCH_MIN_VERSION 2.11)
set(FULGUR_LIBTORCH_MAX_VERSION 2.15)

function(fulgur_find_libtorch)
  cmake_parse_arguments(arg "GLOBAL" "DEFAULT;REQUIRE_VERSION" "" ${ARGN})
  if(TARGET fulgur::libtorch)
    return()
  endif()

  set(root "")
  set(from "")
  if(FULGUR_LIBTORCH)
    set(root "${FULGUR_LIBTORCH}")
    set(from "FULGUR_LIBTORCH")
  elseif(Torch_DIR)
    get_filename_component(root "${Torch_DIR}/../../.." ABSOLUTE)
    set(from "Torch_DIR")
  else()
    foreach(prefix IN LISTS CMAKE_PREFIX_PATH)
      if(EXISTS "${prefix}/share/cmake/Torch/TorchConfigVersion.cmake")
        set(root "${prefix}")
      elseif(EXISTS "${prefix}/Torch/TorchConfigVersion.cmake")
        get_filename_component(root "${prefix}/../.." ABSOLUTE)
      endif()
      if(root)
        set(from "CMAKE_PREFIX_PATH")
        break()
      endif()
    endforeach()
  endif()
  if(NOT root)
    set(root "${arg_DEFAULT}")
    set(from "the default")
  endif()
  get_filename_component(root "${root}" ABSOLUTE)

  set(version_file "${root}/share/cmake/Torch/TorchConfigVersion.cmake")
  if(NOT EXISTS "${version_file}" OR NOT EXISTS "${root}/lib/libtorch_cpu.so" OR NOT EXISTS "${root}/lib/libc10.so")
    message(FATAL_ERROR "fulgur: no libtorch at '${root}' (from ${from}): it needs share/cmake/Torch/"
                        "TorchConfigVersion.cmake, lib/libtorch_cpu.so and lib/libc10.so. Run scripts/install-deps for "
                        "the pinned libtorch (.venv/libtorch), or set -DFULGUR_LIBTORCH=<libtorch folder, or a Python "
                        "environment's site-packages/torch>.")
  endif()
  file(STRINGS "${version_file}" version_line REGEX "set\\(PACKAGE_VERSION \"[^\"]*\"\\)" LIMIT_COUNT 1)
  string(REGEX REPLACE ".*\"([^\"]*)\".*" "\\1" version "${version_line}")
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" major_minor "${version}")
  if(NOT major_minor OR major_minor VERSION_LESS FULGUR_LIBTORCH_MIN_VERSION
     OR major_minor VERSION_GREATER FULGUR_LIBTORCH_MAX_VERSION)
    message(FATAL_ERROR "fulgur: libtorch '${version}' at '${root}' (from ${from}) is not supported: fulgur builds "
                        "on libtorch ${FULGUR_LIBTORCH_MIN_VERSION} to ${FULGUR_LIBTORCH_MAX_VERSION}. Point "
                        "FULGUR_LIBTORCH at another libtorch, or run scripts/install-deps for the pinned one.")
  endif()
  if(arg_REQUIRE_VERSION AND NOT version VERSION_EQUAL arg_REQUIRE_VERSION)
    message(FATAL_ERROR "fulgur: this fulgur was built with libtorch ${arg_REQUIRE_VERSION}, but '${root}' (from "
                        "${from}) is libtorch ${version}: two libtorch versions cannot be linked into one program. "
                        "Unset FULGUR_LIBTORCH / Torch_DIR, or rebuild fulgur against this libtorch.")
  endif()

  # Headers of 2.12 and later use C++20.
  if(major_minor VERSION_GREATER_EQUAL 2.12)
    set(standard cxx_std_20)
  else()
    set(standard cxx_std_17)
  endif()
  # A libtorch built with the pre-C++11 string ABI says so in its TorchConfig.cmake.
  set(flags "")
  file(STRINGS "${root}/share/cmake/Torch/TorchConfig.cmake" flags_line REGEX "set\\(TORCH_CXX_FLAGS \"[^\"]*\"\\)")
  if(flags_line)
    string(REGEX REPLACE ".*\"([^\"]*)\".*" "\\1" flags "${flags_line}")
    separate_arguments(flags UNIX_COMMAND "${flags}")
  endif()

  set(global "")
  if(arg_GLOBAL)
    set(global GLOBAL)
  endif()
  add_library(fulgur::c10 SHARED IMPORTED ${global})
  set_target_properties(fulgur::c10 PROPERTIES IMPORTED_LOCATION "${root}/lib/libc10.so")
  add_library(fulgur::torch_cpu SHARED IMPORTED ${global})
  set_target_properties(fulgur::torch_cpu PROPERTIES IMPORTED_LOCATION "${root}/lib/libtorch_cpu.so")
  set(links "fulgur::torch_cpu;fulgur::c10")
  set(has_cuda OFF)
  if(EXISTS "${root}/lib/libtorch_cuda.so" AND EXISTS "${root}/lib/libc10_cuda.so"
     AND NOT (DEFINED FULGUR_LIBTORCH_CUDA AND NOT FULGUR_LIBTORCH_CUDA))
    set(has_cuda ON)
    set(links "-Wl,--no-as-needed;${root}/lib/libtorch_cuda.so;${root}/lib/libc10_cuda.so;-Wl,--as-needed;${links}")
  endif()
  add_library(fulgur::libtorch INTERFACE IMPORTED ${global})
  set_target_properties(fulgur::libtorch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${root}/include;${root}/include/torch/csrc/api/include"
    # c10d's headers declare the Gloo process group only with these, as libtorch was built.
    INTERFACE_COMPILE_DEFINITIONS "USE_DISTRIBUTED;USE_C10D_GLOO"
    INTERFACE_COMPILE_OPTIONS "${flags}"
    INTERFACE_COMPILE_FEATURES "${standard}"
    INTERFACE_LINK_LIBRARIES "${links}")
  if(has_cuda)
    set(cuda_note ", with CUDA (libtorch_cuda)")
  else()
    set(cuda_note ", CPU only")
  endif()
  message(STATUS "fulgur: libtorch ${version} at ${root} (from ${from}), ${standard}${cuda_note}")
  set(FULGUR_LIBTORCH_HAS_CUDA "${has_cuda}" PARENT_SCOPE)
  set(FULGUR_LIBTORCH_ROOT "${root}" PARENT_SCOPE)
  set(FULGUR_LIBTORCH_VERSION "${version}" PARENT_SCOPE)
endfunction()
