# Searches for each optional dependency the options ask for and sets MUONBED_HAVE_<X>.

# --- SimGrid ---------------------------------------------------------------------------------
set(found_simgrid OFF)
if(NOT MUONBED_WITH_SIMGRID STREQUAL "OFF")
  find_package(SimGrid 3.32)
  set(found_simgrid ${SimGrid_FOUND})
endif()
muonbed_feature_result(MUONBED_WITH_SIMGRID "${found_simgrid}"
  "sudo apt-get install libsimgrid-dev (SimGrid >= 3.32)")

# --- MPI -------------------------------------------------------------------------------------
set(found_mpi OFF)
if(NOT MUONBED_WITH_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS CXX QUIET)
  set(found_mpi ${MPI_CXX_FOUND})
endif()
muonbed_feature_result(MUONBED_WITH_MPI "${found_mpi}"
  "sudo apt-get install libopenmpi-dev openmpi-bin")
if(MUONBED_HAVE_MPI)
  find_program(MUONBED_MPIEXEC NAMES mpirun mpiexec)
endif()

# --- CUDA + cuBLAS + NCCL ----------------------------------------------------------------------
set(found_cuda OFF)
if(NOT MUONBED_WITH_CUDA STREQUAL "OFF")
  # nvcc is found through CUDACXX or PATH; the usual install prefix is tried too.
  if(NOT DEFINED ENV{CUDACXX} AND NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    find_package(CUDAToolkit QUIET)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib
                 /usr/local/cuda/lib64)
    if(CUDAToolkit_FOUND AND TARGET CUDA::cublas AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(found_cuda ON)
    endif()
  endif()
endif()
muonbed_feature_result(MUONBED_WITH_CUDA "${found_cuda}"
  "install the CUDA Toolkit with cuBLAS and NCCL, put nvcc on PATH or set CUDACXX")
if(MUONBED_HAVE_CUDA)
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  # CMake 3.25 knows no CUDA20 dialect for nvcc; the .cu files are compiled as C++17.
  set(CMAKE_CUDA_STANDARD 17)
  enable_language(CUDA)
  add_library(muonbed_nccl INTERFACE)
  target_include_directories(muonbed_nccl INTERFACE ${NCCL_INCLUDE_DIR})
  target_link_libraries(muonbed_nccl INTERFACE ${NCCL_LIBRARY})
endif()

foreach(part CUDA MPI SIMGRID)
  if(MUONBED_HAVE_${part})
    set(MUONBED_HAVE_${part}_01 1)
  else()
    set(MUONBED_HAVE_${part}_01 0)
  endif()
endforeach()
