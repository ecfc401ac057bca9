# tests/cmake/check-static-symbols.cmake: runs PROGRAM (a static CPU program built from
# <fusebox/cpu.hpp>), then lists its symbols with NM and fails on any that belong to code such a
# program must not link (issue 22): the run-time path (kernel store, host compiler, disk cache,
# generated programs), the CUDA back end, dlopen, std::filesystem.
# With -DEDGE=ON (the edge configuration, issue 23: tests/edge/edge.cmake) it also fails on
# exception-handling code (a throw, a catch, the personality routine unwinding needs), on threads
# started (std::thread, pthread_create) and on reads of the environment (getenv).
# A cross-compiled PROGRAM runs through EMULATOR (its arguments separated by '|': qemu-aarch64|-L|<root>).
#   cmake -DPROGRAM=<binary> -DNM=<nm> [-DEDGE=ON] [-DEMULATOR=<command>] -P check-static-symbols.cmake
string(REPLACE "|" ";" emulator "${EMULATOR}")
execute_process(COMMAND ${emulator} "${PROGRAM}" RESULT_VARIABLE run_status OUTPUT_VARIABLE run_out ERROR_VARIABLE run_err)
if(NOT run_status EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} failed (${run_status}):\n${run_out}\n${run_err}")
endif()
execute_process(COMMAND "${NM}" -C "${PROGRAM}" RESULT_VARIABLE nm_status OUTPUT_VARIABLE symbols ERROR_VARIABLE nm_err)
if(NOT nm_status EQUAL 0)
  message(FATAL_ERROR "${NM} -C ${PROGRAM} failed: ${nm_err}")
endif()
string(REPLACE "\n" ";" lines "${symbols}")
set(found "")
foreach(line IN LISTS lines)
  if(line MATCHES "fusebox::jit::(kernel_store|host_compiler|disk_cache|program|cuda_program|dynamic_function|shared_library)"
     OR line MATCHES "fusebox::cuda::(detail|driver|open_first|nvrtc|tensor)"
     OR line MATCHES " U dlopen| U dlsym|std::filesystem::"
     OR (EDGE AND line MATCHES "__cxa_throw|__cxa_begin_catch|__cxa_rethrow|__gxx_personality|std::thread|pthread_create| U getenv| U secure_getenv"))
    list(APPEND found "${line}")
  endif()
endforeach()
if(found)
  list(LENGTH found n)
  list(SUBLIST found 0 20 shown)
  string(REPLACE ";" "\n  " shown "${shown}")
  message(FATAL_ERROR "${PROGRAM} links ${n} symbol(s) of code a static CPU program must not carry, e.g.:\n  ${shown}")
endif()
if(EDGE)
  message(STATUS "${PROGRAM}: ran, and links no run-time path, CUDA, dlopen, filesystem, exception, thread or getenv code:\n${run_out}")
else()
  message(STATUS "${PROGRAM}: ran, and links no run-time path, CUDA, dlopen or filesystem code")
endif()
