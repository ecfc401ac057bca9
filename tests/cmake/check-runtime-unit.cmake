# Every header with code for the implementation unit (FUSEBOX_RUNTIME_BODIES blocks or
# FUSEBOX_RUNTIME_INSTANCE lines, include/fusebox/core/linkage.hpp) must be reached from the unit
# that fusebox_add_runtime() generates: a header it misses links in header-only programs and fails
# to link with FUSEBOX_EXTERN_RUNTIME. Lists the includes of that unit with the compiler's -M; -MG
# takes a header it cannot find (xsimd, Boost.Hana outside the system paths) as found: only
# fusebox's own are looked for.
#   cmake -DCXX=<compiler> -DINCLUDE_DIR=<include/> -DRUNTIME_SOURCE=<generated .cpp> -P check-runtime-unit.cmake
foreach(var CXX INCLUDE_DIR RUNTIME_SOURCE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check-runtime-unit.cmake: ${var} is not set")
  endif()
endforeach()
execute_process(
  COMMAND "${CXX}" -std=c++20 -M -MG -DFUSEBOX_EXTERN_RUNTIME -DFUSEBOX_IMPLEMENTATION -I "${INCLUDE_DIR}" "${RUNTIME_SOURCE}"
  OUTPUT_VARIABLE depends ERROR_VARIABLE errors RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${CXX} -M ${RUNTIME_SOURCE} failed:\n${errors}")
endif()
file(GLOB_RECURSE headers RELATIVE "${INCLUDE_DIR}" "${INCLUDE_DIR}/fusebox/*.hpp")
set(missing "")
foreach(header IN LISTS headers)
  file(STRINGS "${INCLUDE_DIR}/${header}" uses REGEX "^#(if FUSEBOX_RUNTIME_BODIES|ifdef FUSEBOX_RUNTIME_INSTANCE)" LIMIT_COUNT 1)
  if(uses AND NOT depends MATCHES "include/${header}")
    list(APPEND missing "${header}")
  endif()
endforeach()
if(missing)
  list(JOIN missing "\n  " missing)
  message(FATAL_ERROR "the implementation unit (${RUNTIME_SOURCE}) does not include:\n  ${missing}\n"
                      "include each from an entry header that fusebox/fusebox.hpp, train.hpp or data.hpp includes")
endif()
message(STATUS "the implementation unit reaches every header with run-time definitions")
