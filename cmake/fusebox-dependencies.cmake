# Dependency fix-ups shared by the build tree (CMakeLists.txt) and the installed package
# (fusebox-config.cmake), so a consumer resolves xsimd and Hana exactly as our own tests do.
#
# Expects find_package(xsimd) (or find_dependency) to have run already. Leaves behind:
#   - the `xsimd` target, without a dangling `xtl` link item;
#   - `fusebox::hana`, an INTERFACE IMPORTED target carrying the Boost.Hana include directory,
#     when the headers were found (callers check `if(TARGET fusebox::hana)` and report).
# It never fails by itself: the top-level CMakeLists.txt stops with FATAL_ERROR, the package
# config reports fusebox_FOUND FALSE, so that find_package(fusebox QUIET) stays quiet.

# Debian 12's xsimdTargets.cmake lists `xtl` in INTERFACE_LINK_LIBRARIES but its config never
# looks for xtl (and xsimd needs xtl only with XSIMD_ENABLE_XTL_COMPLEX). Left as is, `xtl`
# would reach the link line as `-lxtl` and fail. Drop it unless someone really defined xtl.
if(TARGET xsimd AND NOT TARGET xtl)
  get_target_property(_fusebox_xsimd_links xsimd INTERFACE_LINK_LIBRARIES)
  if(_fusebox_xsimd_links)
    list(REMOVE_ITEM _fusebox_xsimd_links xtl)
    set_target_properties(xsimd PROPERTIES INTERFACE_LINK_LIBRARIES "${_fusebox_xsimd_links}")
  endif()
  unset(_fusebox_xsimd_links)
endif()

# Boost.Hana is header-only and self-contained. Search for the header rather than
# find_package(Boost): a staged prefix (CMAKE_PREFIX_PATH=.deps/usr, used on machines without
# libboost-dev) holds only include/boost/hana*, with no BoostConfig.cmake and no
# boost/version.hpp for FindBoost to read. find_path also sees Conan's CMAKE_INCLUDE_PATH.
if(NOT TARGET fusebox::hana)
  find_path(FUSEBOX_HANA_INCLUDE_DIR boost/hana.hpp
    DOC "Directory that contains boost/hana.hpp")
  if(FUSEBOX_HANA_INCLUDE_DIR)
    add_library(fusebox::hana INTERFACE IMPORTED)
    set_target_properties(fusebox::hana PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${FUSEBOX_HANA_INCLUDE_DIR}")
  endif()
endif()
