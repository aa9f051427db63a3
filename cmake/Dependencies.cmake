# Finds every dependency and prints one configure line listing them with
# their versions. All come from Debian packages (deploy/install-deps.sh)
# except CUDA and NCCL, which are looked up in CUDA's standard location.

set(_vp_missing_hint "run deploy/install-deps.sh to install the Debian packages Varipipe needs")

find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(hiredis CONFIG QUIET)
if(NOT TARGET hiredis::hiredis)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
  add_library(hiredis::hiredis ALIAS PkgConfig::HIREDIS)
endif()
find_package(spdlog CONFIG REQUIRED)
# nlohmann-json3-dev (header only): safetensors headers and Hugging Face
# config.json files (common/checkpoint).
find_package(nlohmann_json CONFIG QUIET)
if(NOT TARGET nlohmann_json::nlohmann_json)
  message(FATAL_ERROR "nlohmann_json not found (nlohmann-json3-dev): ${_vp_missing_hint}")
endif()
# libsentencepiece-dev: text tokenization in varipipe-convert-jsonl, inside
# the module libvaripipe_sentencepiece.so only (common/tokenizer).
pkg_check_modules(SENTENCEPIECE IMPORTED_TARGET sentencepiece)
if(NOT SENTENCEPIECE_FOUND)
  message(FATAL_ERROR "sentencepiece not found (libsentencepiece-dev): ${_vp_missing_hint}")
endif()
# cpp-httplib (libcpp-httplib-dev: a header plus a shared library) for the
# --metrics_listen endpoints.
find_package(PkgConfig REQUIRED)
pkg_check_modules(CPP_HTTPLIB IMPORTED_TARGET cpp-httplib)
if(NOT CPP_HTTPLIB_FOUND)
  message(FATAL_ERROR "cpp-httplib not found (libcpp-httplib-dev): ${_vp_missing_hint}")
endif()
# promtool (prometheus) checks the metrics endpoints' output in tests.
find_program(VARIPIPE_PROMTOOL promtool)
find_program(VARIPIPE_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
find_program(VARIPIPE_REDIS_SERVER redis-server)

if(VARIPIPE_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
  find_package(benchmark CONFIG REQUIRED)
endif()

# --- LibTorch, Gloo, MPI (executor) ---------------------------------------
if(VARIPIPE_WITH_TORCH)
  find_package(Torch CONFIG QUIET)
  if(NOT Torch_FOUND)
    message(FATAL_ERROR "LibTorch not found (${_vp_missing_hint}); "
            "or set -DVARIPIPE_WITH_TORCH=OFF to build without the executor, "
            "or -DCMAKE_PREFIX_PATH=<libtorch> for another LibTorch")
  endif()
  # PyTorch's wheels carry Gloo inside libtorch_cpu with its headers in
  # LibTorch's include directory; linking a second Gloo next to that one
  # would put two copies in one process (deploy/gpu/run-on-gpu.sh).
  option(VARIPIPE_GLOO_FROM_TORCH "Use the Gloo inside LibTorch instead of a Gloo package" OFF)
  if(VARIPIPE_GLOO_FROM_TORCH)
    find_path(VARIPIPE_GLOO_INCLUDE_DIR gloo/transport/tcp/device.h
              HINTS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
    if(NOT VARIPIPE_GLOO_INCLUDE_DIR OR NOT TARGET torch_cpu)
      message(FATAL_ERROR "VARIPIPE_GLOO_FROM_TORCH=ON but this LibTorch has no Gloo headers "
              "(gloo/transport/tcp/device.h in ${TORCH_INCLUDE_DIRS}) or no torch_cpu target")
    endif()
    add_library(gloo INTERFACE IMPORTED)
    set_target_properties(gloo PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES ${VARIPIPE_GLOO_INCLUDE_DIR}
      INTERFACE_LINK_LIBRARIES torch_cpu)
    set(Gloo_VERSION "from LibTorch")
  else()
    find_package(Gloo CONFIG REQUIRED)
  endif()
  # Debian's Gloo config names the library but not the threads it needs.
  find_package(MPI COMPONENTS CXX)
endif()

# --- CUDA and NCCL (optional) ---------------------------------------------
set(_allowed AUTO ON OFF)
string(TOUPPER "${VARIPIPE_WITH_CUDA}" VARIPIPE_WITH_CUDA)
if(NOT VARIPIPE_WITH_CUDA IN_LIST _allowed)
  message(FATAL_ERROR "VARIPIPE_WITH_CUDA must be AUTO, ON or OFF (got '${VARIPIPE_WITH_CUDA}')")
endif()
set(VARIPIPE_HAVE_CUDA OFF)
if(NOT VARIPIPE_WITH_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_path(VARIPIPE_NCCL_INCLUDE_DIR nccl.h
              HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include
                    $ENV{NCCL_HOME}/include)
    find_library(VARIPIPE_NCCL_LIBRARY nccl
                 HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64
                       $ENV{NCCL_HOME}/lib)
  endif()
  if(CUDAToolkit_FOUND AND VARIPIPE_NCCL_INCLUDE_DIR AND VARIPIPE_NCCL_LIBRARY)
    set(VARIPIPE_HAVE_CUDA ON)
    file(STRINGS ${VARIPIPE_NCCL_INCLUDE_DIR}/nccl.h _nccl_ver
         REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) [0-9]+")
    string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*"
           "\\1.\\2.\\3" VARIPIPE_NCCL_VERSION "${_nccl_ver}")
    add_library(varipipe::nccl UNKNOWN IMPORTED)
    set_target_properties(varipipe::nccl PROPERTIES
      IMPORTED_LOCATION ${VARIPIPE_NCCL_LIBRARY}
      INTERFACE_INCLUDE_DIRECTORIES ${VARIPIPE_NCCL_INCLUDE_DIR})
    target_link_libraries(varipipe::nccl INTERFACE CUDA::cudart)
  elseif(VARIPIPE_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "VARIPIPE_WITH_CUDA=ON but the CUDA Toolkit or NCCL was not found "
            "(looked in CUDAToolkit_ROOT='${CUDAToolkit_ROOT}' and NCCL_HOME); "
            "use AUTO or OFF to build without them")
  endif()
endif()

# --- The one configure line -----------------------------------------------
set(_deps
  "absl ${absl_VERSION}"
  "protobuf ${Protobuf_VERSION}"
  "gRPC ${gRPC_VERSION}"
  "hiredis ${hiredis_VERSION}${HIREDIS_VERSION}"
  "spdlog ${spdlog_VERSION}"
  "nlohmann_json ${nlohmann_json_VERSION}"
  "sentencepiece ${SENTENCEPIECE_VERSION}")
if(VARIPIPE_BUILD_TESTS)
  list(APPEND _deps "GTest ${GTest_VERSION}" "benchmark ${benchmark_VERSION}")
endif()
if(VARIPIPE_WITH_TORCH)
  list(APPEND _deps "LibTorch ${Torch_VERSION}" "Gloo ${Gloo_VERSION}")
  if(MPI_CXX_FOUND)
    # The implementation's own version ("Open MPI 4.1.4"), not only the MPI
    # standard's.
    set(_mpi_lib "")
    if(MPIEXEC_EXECUTABLE)
      execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version
                      OUTPUT_VARIABLE _mpi_out ERROR_QUIET)
      string(REGEX MATCH "\\(([^)]+)\\) ([0-9.]+)" _ "${_mpi_out}")
      if(CMAKE_MATCH_1)
        # Open MPI's mpirun reports its runtime layer, OpenRTE.
        string(REPLACE "OpenRTE" "Open MPI" _mpi_name "${CMAKE_MATCH_1}")
        set(_mpi_lib "${_mpi_name} ${CMAKE_MATCH_2}, ")
      endif()
    endif()
    list(APPEND _deps "${_mpi_lib}MPI ${MPI_CXX_VERSION}")
  else()
    list(APPEND _deps "MPI not found")
  endif()
else()
  list(APPEND _deps "LibTorch off")
endif()
if(VARIPIPE_HAVE_CUDA)
  list(APPEND _deps "CUDA ${CUDAToolkit_VERSION}" "NCCL ${VARIPIPE_NCCL_VERSION}")
else()
  list(APPEND _deps "CUDA/NCCL off (VARIPIPE_WITH_CUDA=${VARIPIPE_WITH_CUDA})")
endif()
if(VARIPIPE_REDIS_SERVER)
  execute_process(COMMAND ${VARIPIPE_REDIS_SERVER} --version
                  OUTPUT_VARIABLE _redis_ver OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  string(REGEX MATCH "v=([0-9.]+)" _ "${_redis_ver}")
  list(APPEND _deps "redis-server ${CMAKE_MATCH_1}")
else()
  list(APPEND _deps "redis-server not found (Redis tests will fail)")
endif()
list(APPEND _deps "cpp-httplib ${CPP_HTTPLIB_VERSION}")
if(VARIPIPE_PROMTOOL)
  list(APPEND _deps "promtool")
else()
  list(APPEND _deps "promtool not found (metrics tests will fail)")
endif()
find_program(VARIPIPE_TORCHRUN torchrun)
if(VARIPIPE_TORCHRUN)
  list(APPEND _deps "torchrun")
else()
  list(APPEND _deps "torchrun not found")
endif()
execute_process(COMMAND ${CMAKE_MAKE_PROGRAM} --version
                OUTPUT_VARIABLE _make_ver OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
get_filename_component(_make_name "${CMAKE_MAKE_PROGRAM}" NAME)
list(APPEND _deps "${_make_name} ${_make_ver}")
if(VARIPIPE_CCACHE)
  execute_process(COMMAND ${VARIPIPE_CCACHE} --version
                  OUTPUT_VARIABLE _ccache_ver ERROR_QUIET)
  string(REGEX MATCH "version ([0-9.]+)" _ "${_ccache_ver}")
  list(APPEND _deps "ccache ${CMAKE_MATCH_1}")
else()
  list(APPEND _deps "no ccache")
endif()
list(JOIN _deps ", " _deps_line)
message(STATUS "Varipipe dependencies: ${_deps_line}")
