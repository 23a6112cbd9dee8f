# Finds SimGrid (Debian ships only a pkg-config file). Defines SimGrid::SimGrid, SimGrid_VERSION.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PC_SIMGRID QUIET simgrid)
endif()
find_path(SimGrid_INCLUDE_DIR simgrid/s4u.hpp HINTS ${PC_SIMGRID_INCLUDE_DIRS})
find_library(SimGrid_LIBRARY simgrid HINTS ${PC_SIMGRID_LIBRARY_DIRS})
if(SimGrid_INCLUDE_DIR AND EXISTS "${SimGrid_INCLUDE_DIR}/simgrid/version.h")
  file(STRINGS "${SimGrid_INCLUDE_DIR}/simgrid/version.h" version_lines
       REGEX "#define SIMGRID_VERSION_(MAJOR|MINOR|PATCH)")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define SIMGRID_VERSION_${part} ([0-9]+).*" "\\1" SimGrid_${part}
           "${version_lines}")
  endforeach()
  set(SimGrid_VERSION "${SimGrid_MAJOR}.${SimGrid_MINOR}.${SimGrid_PATCH}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(SimGrid REQUIRED_VARS SimGrid_LIBRARY SimGrid_INCLUDE_DIR
                                  VERSION_VAR SimGrid_VERSION)
if(SimGrid_FOUND AND NOT TARGET SimGrid::SimGrid)
  add_library(SimGrid::SimGrid UNKNOWN IMPORTED)
  set_target_properties(SimGrid::SimGrid PROPERTIES IMPORTED_LOCATION "${SimGrid_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${SimGrid_INCLUDE_DIR}")
endif()
mark_as_advanced(SimGrid_INCLUDE_DIR SimGrid_LIBRARY)
