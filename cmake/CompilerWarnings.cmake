# varipipe_warnings: the warning set every project target compiles with.
# Generated protobuf code and imported third-party headers are not affected
# (they are separate targets or SYSTEM include directories).
option(VARIPIPE_WERROR "Treat compiler warnings as errors" OFF)
add_library(varipipe_warnings INTERFACE)
target_compile_options(varipipe_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${VARIPIPE_WERROR}>>:-Werror>)
