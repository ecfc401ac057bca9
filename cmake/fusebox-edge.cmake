# fusebox_edge_configuration(<target>...): builds the targets in fusebox's edge configuration
# (issue 23; docs/architecture.md, "Edge builds"): programs of static shapes from
# <fusebox/cpu.hpp> without C++ exceptions or RTTI (an error goes to fusebox::set_error_handler's
# handler), without threads of fusebox's own (FUSEBOX_NO_THREADS; options::pool takes the
# program's pool) and without reading the environment (FUSEBOX_NO_ENVIRONMENT). A unit of such a
# target that includes <fusebox/jit.hpp>, <fusebox/cuda.hpp>, <fusebox/data.hpp> or
# <fusebox/fusebox.hpp> is a build error saying so.
#
#   add_executable(sensor_model main.cpp)
#   target_link_libraries(sensor_model PRIVATE fusebox::fusebox)
#   fusebox_edge_configuration(sensor_model)
function(fusebox_edge_configuration)
  foreach(target IN LISTS ARGN)
    if(NOT TARGET ${target})
      message(FATAL_ERROR "fusebox_edge_configuration(): '${target}' is not a target")
    endif()
    target_compile_definitions(${target} PRIVATE FUSEBOX_NO_THREADS FUSEBOX_NO_ENVIRONMENT)
    target_compile_options(${target} PRIVATE "$<$<CXX_COMPILER_ID:GNU,Clang,AppleClang>:-fno-exceptions;-fno-rtti>")
  endforeach()
endfunction()
