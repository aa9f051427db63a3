# Uses ccache for C and C++ when it is installed. The sloppiness settings let
# ccache serve objects built with precompiled headers (the LibTorch PCH).
find_program(VARIPIPE_CCACHE ccache)
if(VARIPIPE_CCACHE)
  set(_launcher ${CMAKE_COMMAND} -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      ${VARIPIPE_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${_launcher})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${_launcher})
  set(VARIPIPE_CCACHE_STATUS "ccache")
else()
  set(VARIPIPE_CCACHE_STATUS "no ccache")
endif()
