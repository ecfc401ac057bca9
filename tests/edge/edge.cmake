# fusebox_edge_program(<target> <source>...): a test program of the edge configuration (issue 23;
# fusebox_edge_configuration(), cmake/fusebox-edge.cmake: no exceptions, RTTI, threads of fusebox's
# own or environment), warnings as errors. Used for this machine's build (tests/CMakeLists.txt)
# and for the aarch64 one (tests/edge/CMakeLists.txt).
function(fusebox_edge_program target)
  add_executable(${target} ${ARGN})
  target_link_libraries(${target} PRIVATE fusebox::fusebox)
  fusebox_edge_configuration(${target})
  target_compile_options(${target} PRIVATE "$<$<CXX_COMPILER_ID:GNU,Clang,AppleClang>:-Wall;-Wextra;-Werror>")
endfunction()
