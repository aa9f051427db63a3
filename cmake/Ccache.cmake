# Uses ccache for C and C++ when it is installed. The sloppiness settings let
# ccache serve objects built with precompiled headers (the LibTorch PCH);
# CCACHE_BASEDIR makes paths relative to the source tree, so fresh clones
# (CI) reuse what earlier builds compiled.
find_program(VARIPIPE_CCACHE ccache)
if(VARIPIPE_CCACHE)
  set(_launcher ${CMAKE_COMMAND} -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      "CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}"
      ${VARIPIPE_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${_launcher})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${_launcher})
  set(VARIPIPE_CCACHE_STATUS "ccache")
else()
  set(VARIPIPE_CCACHE_STATUS "no ccache")
endif()
