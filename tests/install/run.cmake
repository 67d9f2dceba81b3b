# SPDX-License-Identifier: Apache-2.0
# The Install.* test: installs the fulgur build FULGUR_BUILD_DIR into a
# temporary prefix, then configures, builds and runs the outside program of
# this folder twice: against the installed package (find_package), and with
# add_subdirectory of the source tree FULGUR_SOURCE_DIR. Every step is
# bounded by STEP_TIMEOUT seconds and prints its duration.
#   cmake -DFULGUR_SOURCE_DIR=... -DFULGUR_BUILD_DIR=... -DWORK_DIR=... -DCXX=... [-DCCACHE=...]
#         [-DCOPIES_LIBTORCH=ON] [-DCOPIES_PLUGIN=ON] -P run.cmake
foreach(v FULGUR_SOURCE_DIR FULGUR_BUILD_DIR WORK_DIR CXX)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run.cmake needs -D${v}=...")
  endif()
endforeach()
set(STEP_TIMEOUT 1200)
set(consumer ${CMAKE_CURRENT_LIST_DIR})
set(common -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX})
if(CCACHE)
  list(APPEND common -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE})
endif()

function(step what)
  string(TIMESTAMP t0 "%s")
  execute_process(COMMAND ${ARGN} TIMEOUT ${STEP_TIMEOUT} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(TIMESTAMP t1 "%s")
  math(EXPR dt "${t1} - ${t0}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}) after ${dt} s:\n${out}")
  endif()
  message(STATUS "${what}: ${dt} s")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# run_app(<what> <command>...): runs the outside program (the command's last word is the program,
# or its wrapper's) with the runs folder as its argument.
function(run_app what)
  step("${what}: run" ${ARGN} ${WORK_DIR}/runs)
  if(NOT step_output MATCHES "fulgur consumer: 4 steps")
    message(FATAL_ERROR "${what}: the program did not train 4 steps:\n${step_output}")
  endif()
  set(step_output "${step_output}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

step("install" ${CMAKE_COMMAND} --install ${FULGUR_BUILD_DIR} --prefix ${prefix})
# The checkout's libtorch and CPU plugin are copied into the package; ones elsewhere are not.
set(expected lib/libfulgur.a include/fulgur/trainer.h lib/cmake/fulgur/fulgurConfig.cmake
             lib/cmake/fulgur/fulgurConfigVersion.cmake lib/cmake/fulgur/fulgurTargets.cmake
             lib/cmake/fulgur/FulgurLibtorch.cmake bin/fulgur-plot)
if(COPIES_LIBTORCH)
  list(APPEND expected lib/fulgur/libtorch/lib/libtorch_cpu.so lib/fulgur/libtorch/share/cmake/Torch/TorchConfigVersion.cmake)
endif()
if(COPIES_PLUGIN)
  list(APPEND expected lib/fulgur/pjrt/xla_cpu_pjrt.so)
endif()
foreach(f IN LISTS expected)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install: ${prefix}/${f} is missing")
  endif()
endforeach()

# fulgur-plot comes with the package and runs from it.
step("installed fulgur-plot" ${prefix}/bin/fulgur-plot --version)
if(NOT step_output MATCHES "^fulgur-plot \\(fulgur ")
  message(FATAL_ERROR "installed fulgur-plot --version printed:\n${step_output}")
endif()

# The outside project sets no C++ standard: the package's targets carry the one libtorch needs.
step("find_package: configure" ${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/find ${common}
     -DCMAKE_PREFIX_PATH=${prefix})
step("find_package: build" ${CMAKE_COMMAND} --build ${WORK_DIR}/find)
# The program needs nothing of the checkout: it names no path inside it, and it trains on xla
# with the source tree hidden (an empty tmpfs over it, in a mount namespace of its own; root only).
execute_process(COMMAND ldd ${WORK_DIR}/find/app OUTPUT_VARIABLE libs)
string(FIND "${libs}" "${FULGUR_SOURCE_DIR}/" at)
if(NOT at EQUAL -1)
  message(FATAL_ERROR "find_package: the program loads libraries from the checkout:\n${libs}")
endif()
execute_process(COMMAND id -u OUTPUT_VARIABLE uid OUTPUT_STRIP_TRAILING_WHITESPACE)
if(uid STREQUAL "0")
  run_app("find_package, checkout hidden" unshare --mount --propagation private sh -c
          "mount -t tmpfs none \"$0\" && exec \"$@\"" ${FULGUR_SOURCE_DIR} ${WORK_DIR}/find/app)
else()
  message(STATUS "find_package: not root, so the checkout is not hidden for the run")
  run_app("find_package" ${WORK_DIR}/find/app)
endif()
if(NOT step_output MATCHES "on xla")
  message(FATAL_ERROR "find_package: the program did not train on xla:\n${step_output}")
endif()

# The add_subdirectory build compiles the library again, with its
# precompiled header, in a folder of its own: its objects miss ccache (a PCH
# holds its build folder's paths and a timestamp), about 300 CPU-seconds. It
# has no CMAKE_BUILD_TYPE (no optimization: the program trains four steps of
# a tiny model).
step("add_subdirectory: configure" ${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/sub -G Ninja
     -DCMAKE_CXX_COMPILER=${CXX} -DFULGUR_SOURCE_DIR=${FULGUR_SOURCE_DIR})
if(EXISTS ${WORK_DIR}/sub/fulgur/tests OR EXISTS ${WORK_DIR}/sub/fulgur/examples OR EXISTS ${WORK_DIR}/sub/fulgur/bench)
  message(FATAL_ERROR "add_subdirectory: fulgur configured its tests, examples or bench as a subproject")
endif()
step("add_subdirectory: build" ${CMAKE_COMMAND} --build ${WORK_DIR}/sub)
run_app("add_subdirectory" ${WORK_DIR}/sub/app)
