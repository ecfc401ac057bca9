# run_step(<what> <command> <arg>...): for the scripts that drive nested builds
# (install-and-consume.cmake, cross-build-and-test.cmake). Runs the command; when it fails, stops
# the script with a message that starts with ${run_step_context} and shows the command and its
# output; otherwise leaves the output in step_output.
function(run_step what)
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT result EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "${run_step_context}: ${what} failed (${result})\n  ${command}\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()
