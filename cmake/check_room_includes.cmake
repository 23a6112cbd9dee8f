# Checks that every room of core/ includes only itself and the rooms below it (core/README.md),
# the ctest core.rooms_include_downward. The rooms below each room come from the table
# core/CMakeLists.txt writes (ROOMS: set(room_below_<room> "<rooms>") lines), the same lists its
# libraries link, so the include rule and the target graph cannot drift apart. A folder of core/
# missing from the table fails too: a new room states what it stands on.
#   cmake -DCORE_DIR=<source>/core -DROOMS=<build>/core/rooms.cmake -P check_room_includes.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT CORE_DIR OR NOT ROOMS)
  message(FATAL_ERROR "usage: cmake -DCORE_DIR=<core folder> -DROOMS=<rooms.cmake> -P "
                      "check_room_includes.cmake")
endif()
include(${ROOMS})

# Every room below `room`, directly or through the rooms it stands on.
function(rooms_below room out)
  set(result "")
  foreach(below IN LISTS room_below_${room})
    rooms_below(${below} deeper)
    list(APPEND result ${below} ${deeper})
  endforeach()
  list(REMOVE_DUPLICATES result)
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

set(problems "")
set(checked 0)
file(GLOB entries RELATIVE ${CORE_DIR} ${CORE_DIR}/*)
foreach(room IN LISTS entries)
  if(NOT IS_DIRECTORY ${CORE_DIR}/${room})
    continue()
  endif()
  if(NOT DEFINED room_below_${room})
    string(APPEND problems "core/${room}/ is not a room of core/CMakeLists.txt; fix: declare it "
                           "with muonbed_room(${room} BELOW <rooms it stands on>)\n")
    continue()
  endif()
  rooms_below(${room} allowed)
  list(JOIN allowed ", " allowed_text)
  if(NOT allowed_text)
    set(allowed_text "none")
  endif()
  file(GLOB_RECURSE files RELATIVE ${CORE_DIR} ${CORE_DIR}/${room}/*.hpp ${CORE_DIR}/${room}/*.cpp)
  foreach(file IN LISTS files)
    math(EXPR checked "${checked} + 1")
    file(STRINGS ${CORE_DIR}/${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"core/")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"core/([^/\"]+)/.*" "\\1" target "${line}")
      if(target STREQUAL room OR target IN_LIST allowed)
        continue()
      endif()
      string(STRIP "${line}" line)
      string(APPEND problems "core/${file}: ${line}: room '${room}' includes room '${target}', "
                             "which is not below it (below it: ${allowed_text}); fix: move what it needs "
                             "down, or pass it in from above\n")
    endforeach()
  endforeach()
endforeach()

if(problems)
  message(FATAL_ERROR "core/ rooms include upward or sideways:\n${problems}")
endif()
message(STATUS "core/ rooms include only downward (${checked} files)")
