# Run as: cmake -DPARAMS=<file> -DCONFIG=<config> -DFORM=<form> -P install-and-consume.cmake
# PARAMS sets BUILD_DIR, WORK_DIR, SOURCE_DIR, CONSUMER_SOURCE_DIR, FROM_SOURCE_CONSUMER_DIR,
# CONSUMER_GENERATOR, CONSUMER_MAKE_PROGRAM, CONSUMER_CXX_COMPILER(_ID), CONSUMER_PREFIX_PATH,
# EXPECTED_OUTPUT.
#
# Builds and runs a small consumer of fusebox in one of the three ways README.md's "Use it in
# your project" shows (FORM):
#   package       (CTest install_and_consume) cmake --install the build tree into
#                 WORK_DIR/prefix, then configure conan/test_package against that prefix (plus the
#                 original CMAKE_PREFIX_PATH, for xsimd and Hana where they live in a staged
#                 prefix), build it, run it; check that fusebox came from WORK_DIR/prefix (not from
#                 the source or build tree) and that the installed targets carry no -march flag.
#   subdirectory  (install_and_consume.subdirectory) tests/cmake/consumer with add_subdirectory of
#                 SOURCE_DIR, and a second unit in a library: fusebox_precompile_headers() makes one
#                 precompiled header there that both units read (checked below);
#   fetchcontent  (install_and_consume.fetchcontent) tests/cmake/consumer with FetchContent,
#                 FETCHCONTENT_SOURCE_DIR_FUSEBOX=SOURCE_DIR (no network);
# the last two check that fusebox came from SOURCE_DIR, not from a package, and did not add its
# own tests to the consumer's build. Every form checks that the program printed EXPECTED_OUTPUT.
# Consumers build at -O1: the point is that they configure, compile, link and run.
#
# Measured on the 2-core CI machine, Release, CPU seconds (user + system, children included):
# package 6.3, subdirectory 10.0, fetchcontent 10.1 (each of the last two: a configure of fusebox
# as a subproject and one -O1 compile of main.cpp, then from fusebox.hpp); wall 36, 57 and 56 s at
# load average 7.7, 5-21 s at 4-5. From cpu.hpp, idle: fetchcontent 5.8, subdirectory 12.3 (the
# precompiled header 7.3 of it). Only `package` holds the build-tree lock.

include("${PARAMS}")
if(NOT FORM)
  set(FORM package)
endif()

set(run_step_context "install_and_consume (${FORM})")
include("${CMAKE_CURRENT_LIST_DIR}/run-step.cmake")

function(cache_value build_dir name out_var)
  file(STRINGS "${build_dir}/CMakeCache.txt" line REGEX "^${name}:")
  string(REGEX REPLACE "^${name}:[^=]*=" "" value "${line}")
  set(${out_var} "${value}" PARENT_SCOPE)
endfunction()

set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/consumer-${FORM}")
file(REMOVE_RECURSE "${consumer_build}")

set(config_args "")
set(build_type "Release")
if(CONFIG)
  set(config_args --config "${CONFIG}")
  set(build_type "${CONFIG}")
endif()
string(TOUPPER "${build_type}" build_type_upper)

# CMAKE_PREFIX_PATH is a list: through run_step's ARGN a ';' would split it into two arguments,
# so it goes in through an initial-cache file instead of -D.
set(prefix_path "")
# fusebox_precompile_headers() is tried in one form (tests/cmake/consumer/CMakeLists.txt says why).
set(precompiled_header OFF)
if(FORM STREQUAL "subdirectory")
  set(precompiled_header ON)
endif()
if(FORM STREQUAL "package")
  file(REMOVE_RECURSE "${prefix}")
  run_step("install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" ${config_args})
  set(prefix_path "${prefix}")
  set(source "${CONSUMER_SOURCE_DIR}")
  set(program_name test_package)
elseif(FORM STREQUAL "subdirectory" OR FORM STREQUAL "fetchcontent")
  set(source "${FROM_SOURCE_CONSUMER_DIR}")
  set(program_name consumer)
else()
  message(FATAL_ERROR "install_and_consume: FORM is '${FORM}'; expected package, subdirectory or fetchcontent")
endif()
if(CONSUMER_PREFIX_PATH)
  list(APPEND prefix_path ${CONSUMER_PREFIX_PATH})
endif()
file(CONFIGURE OUTPUT "${WORK_DIR}/consumer-${FORM}-init.cmake" @ONLY CONTENT [==[
set(CMAKE_PREFIX_PATH [=[@prefix_path@]=] CACHE STRING "")
set(CMAKE_CXX_FLAGS_@build_type_upper@ "-O1" CACHE STRING "")
set(FUSEBOX_FROM [=[@FORM@]=] CACHE STRING "")
set(CMAKE_EXPORT_COMPILE_COMMANDS ON CACHE BOOL "")
set(CONSUMER_PRECOMPILED_HEADER @precompiled_header@ CACHE BOOL "")
set(FUSEBOX_SOURCE_DIR [=[@SOURCE_DIR@]=] CACHE PATH "")
set(FETCHCONTENT_SOURCE_DIR_FUSEBOX [=[@SOURCE_DIR@]=] CACHE PATH "")
]==])

set(make_program_arg "")
if(CONSUMER_MAKE_PROGRAM)
  set(make_program_arg "-DCMAKE_MAKE_PROGRAM=${CONSUMER_MAKE_PROGRAM}")
endif()
run_step("configure of ${source}"
  "${CMAKE_COMMAND}" -C "${WORK_DIR}/consumer-${FORM}-init.cmake"
  -S "${source}" -B "${consumer_build}"
  -G "${CONSUMER_GENERATOR}" ${make_program_arg}
  "-DCMAKE_CXX_COMPILER=${CONSUMER_CXX_COMPILER}"
  "-DCMAKE_BUILD_TYPE=${build_type}"
  # Never pick up a fusebox registered elsewhere on this machine.
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)

if(FORM STREQUAL "package")
  # The consumer must have found the package we just installed.
  cache_value("${consumer_build}" fusebox_DIR fusebox_dir)
  cmake_path(IS_PREFIX prefix "${fusebox_dir}" NORMALIZE from_prefix)
  if(NOT from_prefix)
    message(FATAL_ERROR "install_and_consume: the consumer found fusebox in '${fusebox_dir}', not under ${prefix}")
  endif()
  set(came_from "${fusebox_dir}")

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
else()
  # fusebox's project() ran inside the consumer, from our source tree, as a subproject: its
  # tests and examples stay out of the consumer's build (PROJECT_IS_TOP_LEVEL defaults).
  cache_value("${consumer_build}" fusebox_SOURCE_DIR fusebox_source)
  cache_value("${consumer_build}" fusebox_DIR fusebox_dir)
  cache_value("${consumer_build}" FUSEBOX_BUILD_TESTS fusebox_tests)
  cmake_path(COMPARE "${fusebox_source}" EQUAL "${SOURCE_DIR}" same_source)
  if(NOT same_source)
    message(FATAL_ERROR "install_and_consume (${FORM}): fusebox's source dir is '${fusebox_source}', not ${SOURCE_DIR}")
  endif()
  if(fusebox_dir AND NOT fusebox_dir MATCHES "NOTFOUND$")
    message(FATAL_ERROR "install_and_consume (${FORM}): the consumer found a fusebox package in '${fusebox_dir}'")
  endif()
  if(fusebox_tests)
    message(FATAL_ERROR "install_and_consume (${FORM}): FUSEBOX_BUILD_TESTS is '${fusebox_tests}' in a consumer")
  endif()
  set(came_from "${fusebox_source}")
endif()

run_step("build of ${source}" "${CMAKE_COMMAND}" --build "${consumer_build}" ${config_args})
if(precompiled_header AND CONSUMER_CXX_COMPILER_ID STREQUAL "GNU")
  # fusebox_precompile_headers(consumer_part consumer): one precompiled header, made by the first
  # target, force-included in both units (compile_commands.json); GCC's -Winvalid-pch, which the
  # helper adds, names one it found and could not use.
  file(GLOB_RECURSE made "${consumer_build}/*.gch")
  list(LENGTH made made_count)
  file(READ "${consumer_build}/compile_commands.json" commands)
  string(JSON entries LENGTH "${commands}")
  set(readers "")
  math(EXPR last "${entries} - 1")
  foreach(i RANGE ${last})
    string(JSON file GET "${commands}" ${i} file)
    string(JSON command GET "${commands}" ${i} command)
    get_filename_component(file "${file}" NAME)
    if(file MATCHES "^(main|part)\\.cpp$" AND command MATCHES "-include [^ ]*consumer_part\\.dir/cmake_pch\\.hxx")
      list(APPEND readers "${file}")
    endif()
  endforeach()
  list(LENGTH readers reader_count)
  if(NOT made_count EQUAL 1 OR NOT reader_count EQUAL 2 OR step_output MATCHES "invalid-pch|not used because")
    message(FATAL_ERROR "install_and_consume (${FORM}): fusebox_precompile_headers() made ${made_count} "
      "precompiled headers (${made}), expected 1; main.cpp and part.cpp should read consumer_part's, "
      "these do: '${readers}'; or GCC could not use it:\n${step_output}")
  endif()
endif()

# Single-config generators put the program at the top of the build dir, multi-config ones in
# a per-config subdirectory.
set(program "${consumer_build}/${program_name}")
if(NOT EXISTS "${program}" AND EXISTS "${consumer_build}/${build_type}/${program_name}")
  set(program "${consumer_build}/${build_type}/${program_name}")
endif()
run_step("run of ${program_name}" "${program}")
string(FIND "${step_output}" "${EXPECTED_OUTPUT}" found_at)   # literal, not a regex
if(found_at EQUAL -1)
  message(FATAL_ERROR "install_and_consume (${FORM}): ${program_name} printed\n${step_output}\nexpected it to contain '${EXPECTED_OUTPUT}'")
endif()
message(STATUS "install_and_consume (${FORM}): ${source} took fusebox from ${came_from} and printed: ${step_output}")
