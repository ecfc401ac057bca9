# fusebox_precompile_headers(<target>... [HEADERS <header>...]): fusebox's headers parsed once for
# the targets' units, not once per unit (issue 22). Without it every unit that includes
# <fusebox/cpu.hpp> parses 2-3 CPU-s of headers (the standard library, xsimd, Hana, fusebox) before
# its first line; with it the first target makes one precompiled header (6-9 CPU-s at -O2, once per
# configuration, remade only when a header changes) and each unit loads it in 0.7-1.0 CPU-s
# (docs/benchmarks.md, runs AK and AL).
#
#   fusebox_precompile_headers(my_models my_app my_tests HEADERS fusebox/cpu.hpp)
#
# HEADERS are fusebox's entry headers the units include (default fusebox/fusebox.hpp); every unit
# of the targets sees them, force-included before its first line. The first target makes the
# precompiled header and is built first, so it must link none of the others (name a library
# before the programs that link it); the others reuse it (CMake's REUSE_FROM), so all must be compiled with the
# same options: the same -march and -O, the same definitions (FUSEBOX_EXTERN_RUNTIME included:
# link fusebox_add_runtime()'s library to all or none), or the compiler ignores the header and
# parses fusebox again; with GCC, -Winvalid-pch (added here) says when it does. A macro that
# configures fusebox belongs on the command line (target_compile_definitions), not in a source
# file before its #include, which now comes after the force-included headers.
#
# GCC 12 drops a header's diagnostic pragmas when it reads it precompiled, and its AVX-512
# intrinsics raise false -Wmaybe-uninitialized/-Wuninitialized warnings in units built with -Wall
# at -O2 (docs/architecture.md, "Build cost"): targets that build with those warnings and
# -march for AVX-512 see them from fusebox's kernels, as they would with xsimd included directly.
function(fusebox_precompile_headers)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "" "HEADERS")
  set(targets ${arg_UNPARSED_ARGUMENTS})
  if(NOT targets)
    message(FATAL_ERROR "fusebox_precompile_headers(): name at least one target")
  endif()
  set(headers ${arg_HEADERS})
  if(NOT headers)
    set(headers fusebox/fusebox.hpp)
  endif()
  set(includes "")
  foreach(header IN LISTS headers)
    if(NOT header MATCHES "^fusebox/[A-Za-z0-9_/]+\\.hpp$")
      message(FATAL_ERROR "fusebox_precompile_headers(${targets}): HEADERS takes fusebox's headers "
        "as they are included, e.g. fusebox/cpu.hpp; got '${header}'")
    endif()
    list(APPEND includes "<${header}>")
  endforeach()
  foreach(target IN LISTS targets)
    if(NOT TARGET ${target})
      message(FATAL_ERROR "fusebox_precompile_headers(): '${target}' is not a target")
    endif()
  endforeach()

  list(POP_FRONT targets maker)
  target_precompile_headers(${maker} PRIVATE ${includes})
  foreach(target IN LISTS targets)
    target_precompile_headers(${target} REUSE_FROM ${maker})
  endforeach()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    foreach(target IN ITEMS ${maker} ${targets})
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Winvalid-pch>)
    endforeach()
  endif()
endfunction()
