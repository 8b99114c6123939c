# CUDA detection: whether this build compiles the CUDA engine (kernels/cuda/, troupe_cuda).
#
# TROUPE_CUDA is AUTO (the default), ON or OFF. AUTO builds the CUDA parts when nvcc and NCCL
# are found and skips them with a message otherwise; ON makes a missing toolkit a configure
# error; OFF never looks. The CPU build is complete either way: troupe_cuda is a library beside
# troupe_kernels that its own tests (tests/cuda/) and the troupe CLI link when it is built (a
# topology's device = "cuda" then runs on it; without it, troupe says it was built without the
# CUDA engine). Sets TROUPE_CUDA_ENABLED, and, when enabled, the imported target troupe_nccl.
#
# The architectures default to "90;100" (Hopper and Blackwell: one -gencode each, to keep nvcc
# time small); set CMAKE_CUDA_ARCHITECTURES to change them.
set(TROUPE_CUDA AUTO CACHE STRING "Build the CUDA engine: AUTO (when nvcc and NCCL are found), ON, OFF")
set_property(CACHE TROUPE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(TROUPE_CUDA_ENABLED OFF)

macro(_troupe_cuda_skip why)
  if(TROUPE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TROUPE_CUDA=ON but ${why}")
  endif()
  message(STATUS "CUDA engine: skipped (${why}); the CPU build is complete without it")
endmacro()

if(TROUPE_CUDA STREQUAL "OFF")
  message(STATUS "CUDA engine: off (TROUPE_CUDA=OFF)")
elseif(TROUPE_PYTHON_ONLY)
  message(STATUS "CUDA engine: not part of the Python-only build")
else()
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER)
    # Debian's toolkit from NVIDIA lives here and is often not on PATH.
    find_program(_troupe_nvcc nvcc HINTS ENV CUDACXX PATHS /usr/local/cuda/bin NO_CACHE)
    if(_troupe_nvcc)
      set(CMAKE_CUDA_COMPILER ${_troupe_nvcc})
    endif()
  endif()
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    _troupe_cuda_skip("no nvcc found (set CUDACXX or put nvcc on PATH)")
  else()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "90;100")
    endif()
    enable_language(CUDA)
    # CMake 3.25 knows no C++20 flag for nvcc: the .cu files are C++17 (their headers too).
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    find_path(TROUPE_NCCL_INCLUDE_DIR nccl.h
      HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
    find_library(TROUPE_NCCL_LIBRARY nccl
      HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME PATH_SUFFIXES lib lib64)
    if(NOT TROUPE_NCCL_INCLUDE_DIR OR NOT TROUPE_NCCL_LIBRARY)
      _troupe_cuda_skip("nvcc ${CMAKE_CUDA_COMPILER_VERSION} found but not NCCL (nccl.h, libnccl)")
    elseif(NOT TARGET CUDA::cublasLt)
      _troupe_cuda_skip("nvcc ${CMAKE_CUDA_COMPILER_VERSION} found but not cuBLASLt")
    else()
      add_library(troupe_nccl UNKNOWN IMPORTED)
      set_target_properties(troupe_nccl PROPERTIES
        IMPORTED_LOCATION ${TROUPE_NCCL_LIBRARY}
        INTERFACE_INCLUDE_DIRECTORIES ${TROUPE_NCCL_INCLUDE_DIR})
      set(TROUPE_CUDA_ENABLED ON)
      message(STATUS "CUDA engine: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                     "architectures ${CMAKE_CUDA_ARCHITECTURES}, NCCL ${TROUPE_NCCL_LIBRARY})")
    endif()
  endif()
endif()
