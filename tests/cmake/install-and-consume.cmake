# Run as: cmake -DPARAMS=<file> -DCONFIG=<config> -P install-and-consume.cmake
# PARAMS sets BUILD_DIR, WORK_DIR, CONSUMER_SOURCE_DIR, CONSUMER_GENERATOR,
# CONSUMER_MAKE_PROGRAM, CONSUMER_CXX_COMPILER, CONSUMER_PREFIX_PATH, EXPECTED_OUTPUT.
#
# 1. cmake --install the build tree into WORK_DIR/prefix;
# 2. configure conan/test_package against that prefix (plus the original CMAKE_PREFIX_PATH,
#    for xsimd and Hana on machines where they live in a staged prefix), build it, run it;
# 3. check that fusebox came from WORK_DIR/prefix (not from the source or build tree), that the
#    program printed EXPECTED_OUTPUT, and that the installed targets carry no -march flag.

include("${PARAMS}")

function(run_step what)
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT result EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "install_and_consume: ${what} failed (${result})\n  ${command}\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/consumer")
file(REMOVE_RECURSE "${WORK_DIR}/prefix" "${consumer_build}")

set(config_args "")
set(build_type "Release")
if(CONFIG)
  set(config_args --config "${CONFIG}")
  set(build_type "${CONFIG}")
endif()

run_step("install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" ${config_args})

set(make_program_arg "")
if(CONSUMER_MAKE_PROGRAM)
  set(make_program_arg "-DCMAKE_MAKE_PROGRAM=${CONSUMER_MAKE_PROGRAM}")
endif()
# CMAKE_PREFIX_PATH is a list: through run_step's ARGN a ';' would split it into two arguments,
# so it goes in through an initial-cache file instead of -D.
set(prefix_path "${prefix}")
if(CONSUMER_PREFIX_PATH)
  list(APPEND prefix_path ${CONSUMER_PREFIX_PATH})
endif()
file(CONFIGURE OUTPUT "${WORK_DIR}/consumer-init.cmake" @ONLY CONTENT [==[
set(CMAKE_PREFIX_PATH [=[@prefix_path@]=] CACHE STRING "")
]==])
run_step("configure of conan/test_package"
  "${CMAKE_COMMAND}" -C "${WORK_DIR}/consumer-init.cmake"
  -S "${CONSUMER_SOURCE_DIR}" -B "${consumer_build}"
  -G "${CONSUMER_GENERATOR}" ${make_program_arg}
  "-DCMAKE_CXX_COMPILER=${CONSUMER_CXX_COMPILER}"
  "-DCMAKE_BUILD_TYPE=${build_type}"
  # Never pick up a fusebox registered elsewhere on this machine.
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)

# The consumer must have found the package we just installed.
file(STRINGS "${consumer_build}/CMakeCache.txt" fusebox_dir_line REGEX "^fusebox_DIR:")
string(REGEX REPLACE "^fusebox_DIR:[^=]*=" "" fusebox_dir "${fusebox_dir_line}")
cmake_path(IS_PREFIX prefix "${fusebox_dir}" NORMALIZE from_prefix)
if(NOT from_prefix)
  message(FATAL_ERROR "install_and_consume: the consumer found fusebox in '${fusebox_dir}', not under ${prefix}")
endif()

# -march=native is for our own tests only; an installed target must not impose it.
file(GLOB_RECURSE target_files "${prefix}/fusebox-targets*.cmake")
if(NOT target_files)
  message(FATAL_ERROR "install_and_consume: no fusebox-targets.cmake under ${prefix}")
endif()
foreach(f IN LISTS target_files)
  file(READ "${f}" contents)
  if(contents MATCHES "-march")
    message(FATAL_ERROR "install_and_consume: ${f} carries a -march flag")
  endif()
endforeach()

run_step("build of conan/test_package" "${CMAKE_COMMAND}" --build "${consumer_build}" ${config_args})

# Single-config generators put the program at the top of the build dir, multi-config ones in
# a per-config subdirectory.
set(program "${consumer_build}/test_package")
if(NOT EXISTS "${program}" AND EXISTS "${consumer_build}/${build_type}/test_package")
  set(program "${consumer_build}/${build_type}/test_package")
endif()
run_step("run of test_package" "${program}")
string(FIND "${step_output}" "${EXPECTED_OUTPUT}" found_at)   # literal, not a regex
if(found_at EQUAL -1)
  message(FATAL_ERROR "install_and_consume: test_package printed\n${step_output}\nexpected it to contain '${EXPECTED_OUTPUT}'")
endif()
message(STATUS "install_and_consume: installed to ${prefix}; conan/test_package found ${fusebox_dir} and printed: ${step_output}")
