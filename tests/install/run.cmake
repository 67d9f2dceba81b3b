# The Install.* test: installs the fulgur build FULGUR_BUILD_DIR into a
# temporary prefix, then configures, builds and runs the outside program of
# this folder twice: against the installed package (find_package), and with
# add_subdirectory of the source tree FULGUR_SOURCE_DIR. Every step is
# bounded by STEP_TIMEOUT seconds and prints its duration.
#   cmake -DFULGUR_SOURCE_DIR=... -DFULGUR_BUILD_DIR=... -DWORK_DIR=... -DCXX=... [-DCCACHE=...] -P run.cmake
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
