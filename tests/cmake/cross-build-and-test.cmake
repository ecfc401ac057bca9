# Run as: cmake -DSOURCE_DIR=<project> -DBUILD_DIR=<dir> -DTOOLCHAIN_FILE=<file> -DFUSEBOX_SOURCE_DIR=<checkout>
#               -DGENERATOR=<generator> [-DMAKE_PROGRAM=<program>] [-DFLAGS=<-O level>] -P cross-build-and-test.cmake
# Configures the project at SOURCE_DIR with the toolchain file (a cross build), builds it with
# CMAKE_BUILD_PARALLEL_LEVEL jobs (default 2) and runs its tests, which CTest starts through the
# toolchain's emulator (qemu). The build directory is kept between runs: a second run rebuilds only
# what changed. Used by the aarch64 tests (tests/edge/CMakeLists.txt).
foreach(v SOURCE_DIR BUILD_DIR TOOLCHAIN_FILE FUSEBOX_SOURCE_DIR GENERATOR)
  if(NOT ${v})
    message(FATAL_ERROR "cross-build-and-test: ${v} is not set")
  endif()
endforeach()

set(run_step_context "cross-build-and-test")
include("${CMAKE_CURRENT_LIST_DIR}/run-step.cmake")

set(make_program_arg "")
if(MAKE_PROGRAM)
  set(make_program_arg "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
run_step("configure of ${SOURCE_DIR}"
  "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BUILD_DIR}" -G "${GENERATOR}" ${make_program_arg}
  "-DCMAKE_TOOLCHAIN_FILE=${TOOLCHAIN_FILE}" "-DFUSEBOX_SOURCE_DIR=${FUSEBOX_SOURCE_DIR}"
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=${FLAGS}")
set(jobs "$ENV{CMAKE_BUILD_PARALLEL_LEVEL}")
if(NOT jobs)
  set(jobs 2)
endif()
run_step("build of ${SOURCE_DIR}" "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --parallel ${jobs})
run_step("tests of ${SOURCE_DIR}" "${CMAKE_CTEST_COMMAND}" --test-dir "${BUILD_DIR}" --output-on-failure -V)
message(STATUS "${step_output}")
