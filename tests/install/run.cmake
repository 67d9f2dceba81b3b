# The Install.* test: installs the fulgur build FULGUR_BUILD_DIR into a
# temporary prefix, then configures, builds and runs the outside program of
# this folder against the installed package (find_package), and configures
# it with add_subdirectory of the source tree FULGUR_SOURCE_DIR in a fresh
# build dir (see the end for why it is not built that way here). Every step is bounded by
# STEP_TIMEOUT seconds and prints its duration.
#   cmake -DFULGUR_SOURCE_DIR=... -DFULGUR_BUILD_DIR=... -DWORK_DIR=... -DCXX=... [-DCCACHE=...] -P run.cmake
foreach(v FULGUR_SOURCE_DIR FULGUR_BUILD_DIR WORK_DIR CXX)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run.cmake needs -D${v}=...")
  endif()
endforeach()
set(STEP_TIMEOUT 600)
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

function(run_app what exe)
  step("${what}: run" ${exe} ${WORK_DIR}/runs)
  if(NOT step_output MATCHES "fulgur consumer: 4 steps")
    message(FATAL_ERROR "${what}: the program did not train 4 steps:\n${step_output}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

step("install" ${CMAKE_COMMAND} --install ${FULGUR_BUILD_DIR} --prefix ${prefix})
foreach(f lib/libfulgur.a include/fulgur/trainer.h lib/cmake/fulgur/fulgurConfig.cmake
          lib/cmake/fulgur/fulgurConfigVersion.cmake lib/cmake/fulgur/fulgurTargets.cmake)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install: ${prefix}/${f} is missing")
  endif()
endforeach()

step("find_package: configure" ${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/find ${common}
     -DCMAKE_PREFIX_PATH=${prefix})
step("find_package: build" ${CMAKE_COMMAND} --build ${WORK_DIR}/find)
run_app("find_package" ${WORK_DIR}/find/app)

step("add_subdirectory: configure" ${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/sub ${common}
     -DFULGUR_SOURCE_DIR=${FULGUR_SOURCE_DIR})
if(EXISTS ${WORK_DIR}/sub/fulgur/tests OR EXISTS ${WORK_DIR}/sub/fulgur/examples OR EXISTS ${WORK_DIR}/sub/fulgur/bench)
  message(FATAL_ERROR "add_subdirectory: fulgur configured its tests, examples or bench as a subproject")
endif()
# Building the program this way compiles the library's ~40 files again
# (10-16 minutes on two busy cores, past what CI can spend on one test), so
# the test stops at the configure: fulgur is found as a subproject, with no
# tests, examples or bench of its own. The build and run were checked by hand.
