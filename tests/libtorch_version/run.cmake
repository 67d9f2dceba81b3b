# SPDX-License-Identifier: Apache-2.0
# The Configure.* test: fulgur's configure refuses a libtorch outside the supported range, and a
# folder that is no libtorch, with a message naming the version (or what is missing) and the
# range. Each case configures the source tree against a fake libtorch (a TorchConfigVersion.cmake
# and two empty libraries) in a fresh build folder, and must fail before anything is built.
#   cmake -DFULGUR_SOURCE_DIR=... -DWORK_DIR=... -P run.cmake
foreach(v FULGUR_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run.cmake needs -D${v}=...")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})

function(fake_libtorch dir version)
  file(WRITE ${dir}/share/cmake/Torch/TorchConfigVersion.cmake "set(PACKAGE_VERSION \"${version}\")\n")
  file(WRITE ${dir}/share/cmake/Torch/TorchConfig.cmake "")
  file(WRITE ${dir}/lib/libtorch_cpu.so "")
  file(WRITE ${dir}/lib/libc10.so "")
endfunction()

# expect_refused(<case> <expected substrings...> ARGS <configure arguments...>)
function(expect_refused name)
  cmake_parse_arguments(arg "" "" "WANT;ARGS" ${ARGN})
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${FULGUR_SOURCE_DIR} -B ${WORK_DIR}/build-${name} -G Ninja
                          -DFULGUR_BUILD_TESTS=OFF -DFULGUR_BUILD_EXAMPLES=OFF -DFULGUR_BUILD_BENCH=OFF ${arg_ARGS}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 120)
  if(rc EQUAL 0)
    message(FATAL_ERROR "${name}: configure succeeded:\n${out}")
  endif()
  string(REGEX REPLACE "[ \n]+" " " flat "${out}")  # CMake wraps long messages
  foreach(w IN LISTS arg_WANT)
    string(FIND "${flat}" "${w}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${name}: the message does not say '${w}':\n${out}")
    endif()
  endforeach()
  message(STATUS "${name}: refused as expected")
endfunction()

fake_libtorch(${WORK_DIR}/torch-1.13 1.13.1)
expect_refused(old WANT "libtorch '1.13.1'" "${WORK_DIR}/torch-1.13" "is not supported" "2.11 to 2.15"
               ARGS -DFULGUR_LIBTORCH=${WORK_DIR}/torch-1.13)
fake_libtorch(${WORK_DIR}/torch-3.0 3.0.0)
expect_refused(new_via_torch_dir WANT "libtorch '3.0.0'" "(from Torch_DIR)" "2.11 to 2.15"
               ARGS -DTorch_DIR=${WORK_DIR}/torch-3.0/share/cmake/Torch)
file(MAKE_DIRECTORY ${WORK_DIR}/empty)
expect_refused(not_a_libtorch WANT "no libtorch at '${WORK_DIR}/empty'" "lib/libtorch_cpu.so" "scripts/install-deps"
               ARGS -DFULGUR_LIBTORCH=${WORK_DIR}/empty)
