# Cross-compiling for 64-bit ARM Linux (aarch64, NEON) with Debian's cross toolchain
# (packages g++-aarch64-linux-gnu; qemu-user to run the result here):
#
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=<fusebox>/cmake/toolchains/aarch64-linux-gnu.cmake
#
# The programs run on an aarch64 machine, or on this one through qemu-aarch64, which CMake's
# add_test and ctest use by themselves (CMAKE_CROSSCOMPILING_EMULATOR).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(FUSEBOX_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${FUSEBOX_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${FUSEBOX_CROSS_TRIPLE}-g++)

# The target's libraries and headers are under /usr/aarch64-linux-gnu; programs (the build's
# tools) are the build machine's.
set(CMAKE_FIND_ROOT_PATH /usr/${FUSEBOX_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
# fusebox's dependencies are header-only and the same for every architecture (Debian installs
# xsimd and Boost.Hana once, in /usr/include, with their CMake packages in /usr/share and /usr/lib):
# found on the build machine too.
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# xsimd's package is in the build machine's multiarch directory (/usr/lib/x86_64-linux-gnu/cmake),
# where a search for aarch64 does not look.
if(NOT xsimd_DIR)
  file(GLOB FUSEBOX_XSIMD_PACKAGE /usr/lib/*-linux-gnu*/cmake/xsimd)
  if(FUSEBOX_XSIMD_PACKAGE)
    list(GET FUSEBOX_XSIMD_PACKAGE 0 FUSEBOX_XSIMD_PACKAGE)
    set(xsimd_DIR "${FUSEBOX_XSIMD_PACKAGE}" CACHE PATH "xsimd's CMake package (header-only: any architecture's)")
  endif()
endif()

# /usr/include also holds the build machine's C library headers: the target's own come first.
# It is searched after them (-idirafter), and CMake must not put it in front with -isystem when a
# package names it (xsimd's does): it is "implicit" for this compiler.
# (A toolchain file is read more than once: append once.)
if(NOT CMAKE_CXX_FLAGS_INIT MATCHES "-idirafter /usr/include")
  string(APPEND CMAKE_CXX_FLAGS_INIT " -idirafter /usr/include")
endif()
list(APPEND CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES /usr/include)

find_program(FUSEBOX_QEMU_AARCH64 qemu-aarch64)
if(FUSEBOX_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${FUSEBOX_QEMU_AARCH64} -L /usr/${FUSEBOX_CROSS_TRIPLE})
endif()
