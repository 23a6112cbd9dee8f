# A backend is one folder with one registration: a source file whose static initializer calls
# register_backend (core/results/run_point.hpp) with the backend's facts, its run function and its
# availability check. muonbed_backend_registration(LIBRARY SOURCE) compiles it as an object
# library over LIBRARY (a static library would drop an object nothing refers to) and lists it in
# the global MUONBED_BACKEND_REGISTRATIONS, which the CLI links whole (experiments/CMakeLists.txt):
# adding a backend changes no list elsewhere.
function(muonbed_backend_registration library source)
  add_library(${library}_registration OBJECT ${source})
  target_link_libraries(${library}_registration PUBLIC ${library} PRIVATE muonbed_options)
  set_property(GLOBAL APPEND PROPERTY MUONBED_BACKEND_REGISTRATIONS ${library}_registration)
endfunction()
