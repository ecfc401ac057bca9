# Precompiled headers for the tests (GCC). Included once from tests/CMakeLists.txt.
#
# Most test files begin with <catch2/catch.hpp> and <fusebox/fusebox.hpp>: about 3.5 s of
# parsing on the 2-core CI machine before the first line of the test, in some 50 test builds and
# 30 compile-fail builds. Each of those reuses one precompiled header, made once per set of
# compile options (in practice once per -O level: GCC takes a precompiled header only when the
# options match, which CMake's REUSE_FROM does not check).
#
#   fusebox_test_pch(<target>)
#       Marks a target; at the end of tests/CMakeLists.txt (when options added after the target
#       was made, such as its -O level, are known) it gets the precompiled header of its options,
#       if each of its sources includes <fusebox/fusebox.hpp> itself and at least four files
#       share those options. The header is Catch2 and fusebox, made with the tests' warnings; the
#       compile-fail builds (no warnings, no Catch2 of their own) read it too: GCC lets warning
#       options differ, and Catch2's macros are names no fusebox file uses.
#
# The header is force-included (-include) before a file's first line, so a test must not define
# a macro that a fusebox header reads before including it: no header reads one today except
# FUSEBOX_HOST_CXX and FUSEBOX_JIT_XSIMD_INCLUDE, which come from the command line, and there GCC
# refuses a precompiled header made without the same definition and parses the headers itself
# (-Winvalid-pch says so). FUSEBOX_TEST_PCH=OFF builds every test without.

option(FUSEBOX_TEST_PCH "Build the tests with precompiled headers (GCC only)" ON)

function(fusebox_test_pch target)
  if(ARGN)
    message(FATAL_ERROR "fusebox_test_pch(${target}): unexpected arguments ${ARGN}")
  endif()
  set_property(DIRECTORY APPEND PROPERTY FUSEBOX_TEST_PCH_TARGETS "${target}")
endfunction()

function(_fusebox_test_pch_apply)
  if(NOT FUSEBOX_TEST_PCH OR NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    return()
  endif()
  get_property(marked DIRECTORY PROPERTY FUSEBOX_TEST_PCH_TARGETS)

  # Which donor each target would use: one per option list.
  set(keys "")
  foreach(target IN LISTS marked)

    set(includes_umbrella TRUE)
    get_target_property(sources ${target} SOURCES)
    foreach(source IN LISTS sources)
      get_filename_component(source "${source}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
      file(STRINGS "${source}" umbrella
           REGEX "^#include <fusebox/fusebox\\.hpp>" LIMIT_COUNT 1)
      if(NOT umbrella)
        set(includes_umbrella FALSE)
      endif()
    endforeach()
    if(NOT includes_umbrella)
      continue()
    endif()

    # The donor's options are the target's, verbatim. GCC only here, so
    # "$<$<CXX_COMPILER_ID:GNU,...>:-O1>" and "-O1" are the same option.
    get_target_property(target_options ${target} COMPILE_OPTIONS)
    set(options "")
    foreach(option IN LISTS target_options)
      string(REGEX REPLACE "^\\$<\\$<CXX_COMPILER_ID:[^>]*GNU[^>]*>:(.*)>$" "\\1" option "${option}")
      list(APPEND options "${option}")
    endforeach()
    # A header is precompiled with code generation on; the compile-fail builds that take it stop
    # before code generation (-fsyntax-only), which GCC does not require to match.
    list(REMOVE_ITEM options -fsyntax-only)
    string(SHA1 key "${options}")
    string(SUBSTRING "${key}" 0 8 key)
    string(TOLOWER "fusebox_test_pch_${key}" key)
    if(NOT key IN_LIST keys)
      list(APPEND keys ${key})
      set(options_${key} "${options}")
      set(targets_${key} "")
    endif()
    list(APPEND targets_${key} ${target})
  endforeach()

  # A precompiled header costs about three files' parsing to make (and 200 MB): only where at
  # least four files use it.
  set(donors 0)
  foreach(donor IN LISTS keys)
    list(LENGTH targets_${donor} n)
    if(n LESS 4)
      continue()
    endif()
    set(source "${CMAKE_CURRENT_BINARY_DIR}/pch/${donor}.cpp")
    file(CONFIGURE OUTPUT "${source}" CONTENT "// The precompiled header is all this target makes.\n")
    add_library(${donor} OBJECT "${source}")
    target_link_libraries(${donor} PRIVATE fusebox::fusebox fusebox_native_flags)
    target_link_libraries(${donor} PRIVATE fusebox_test_warnings Catch2::Catch2 fusebox_test_extern_runtime)
    target_precompile_headers(${donor} PRIVATE <catch2/catch.hpp> <fusebox/fusebox.hpp>)
    if(options_${donor})
      target_compile_options(${donor} PRIVATE ${options_${donor}})
    endif()
    foreach(target IN LISTS targets_${donor})
      target_precompile_headers(${target} REUSE_FROM ${donor})
    endforeach()
    math(EXPR donors "${donors} + 1")
  endforeach()
  message(STATUS "fusebox: tests share ${donors} precompiled header(s)")
endfunction()

cmake_language(DEFER CALL _fusebox_test_pch_apply)
