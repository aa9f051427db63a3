# VARIPIPE_FUZZ: libFuzzer targets for the readers of untrusted bytes
# (tests/fuzz/). Every project source is compiled with coverage
# instrumentation for libFuzzer and with AddressSanitizer and
# UndefinedBehaviorSanitizer; an undefined-behaviour report aborts like a
# crash. Needs Clang (the `fuzz` preset uses Debian's clang-14 with its
# compiler-rt, deploy/install-deps.sh).
option(VARIPIPE_FUZZ "Build the libFuzzer targets in tests/fuzz (Clang only)" OFF)
if(NOT VARIPIPE_FUZZ)
  return()
endif()
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "VARIPIPE_FUZZ=ON needs Clang (libFuzzer), not "
          "${CMAKE_CXX_COMPILER_ID}: configure with the `fuzz` preset "
          "(cmake --preset fuzz) or -DCMAKE_CXX_COMPILER=clang++-14")
endif()
set(VARIPIPE_SANITIZE -fsanitize=address,undefined)
add_compile_options(${VARIPIPE_SANITIZE} -fsanitize=fuzzer-no-link
                    -fno-sanitize-recover=all -fno-omit-frame-pointer)
add_link_options(${VARIPIPE_SANITIZE})
