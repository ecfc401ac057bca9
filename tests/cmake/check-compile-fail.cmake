# Run as: cmake -DPARAMS=<file> -DCONFIG=<config> -P check-compile-fail.cmake
# PARAMS sets BUILD_DIR, TARGET and REGEX (written by fusebox_add_compile_fail).
# Passes only if building TARGET fails AND the build output matches REGEX: a build that fails
# for another reason (a typo, a missing header) must not count as the expected failure.

include("${PARAMS}")

set(config_args "")
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()

execute_process(
  COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}" ${config_args}
  RESULT_VARIABLE result
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)   # same variable: compiler diagnostics may arrive on either stream

if(result EQUAL 0)
  message(FATAL_ERROR "compile-fail: target ${TARGET} built, but it must not compile.\n${output}")
endif()
if(NOT output MATCHES "${REGEX}")
  message(FATAL_ERROR "compile-fail: target ${TARGET} failed to build as expected, but the "
    "output does not match the expected regex\n  ${REGEX}\nso it failed for another reason:\n${output}")
endif()
message(STATUS "compile-fail: ${TARGET} failed to compile, as it must, with a diagnostic matching: ${REGEX}")
