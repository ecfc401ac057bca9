# fusebox_edge_program(<target> <source>...): a program of the edge configuration (issue 23):
# static shapes from <fusebox/cpu.hpp>, no exceptions, no RTTI, no thread of fusebox's own
# (FUSEBOX_NO_THREADS), no environment read (FUSEBOX_NO_ENVIRONMENT), warnings as errors. Used for
# this machine's build (tests/CMakeLists.txt) and for the aarch64 one (tests/edge/CMakeLists.txt).
function(fusebox_edge_program target)
  add_executable(${target} ${ARGN})
  target_link_libraries(${target} PRIVATE fusebox::fusebox)
  target_compile_definitions(${target} PRIVATE FUSEBOX_NO_THREADS FUSEBOX_NO_ENVIRONMENT)
  target_compile_options(${target} PRIVATE
    "$<$<CXX_COMPILER_ID:GNU,Clang,AppleClang>:-fno-exceptions;-fno-rtti;-Wall;-Wextra;-Werror>")
endfunction()
