# Compiler flags of the fuzz build (ORIGAMI_FUZZ=ON), included by the top-level CMakeLists.txt
# before any library is defined: every library the harnesses link is instrumented for coverage
# (fuzzer-no-link) and checked by AddressSanitizer + UndefinedBehaviorSanitizer; an undefined-
# behaviour report aborts, so libFuzzer keeps the input as a crash.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "ORIGAMI_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++")
endif()
if(ORIGAMI_SANITIZE)
  message(FATAL_ERROR "ORIGAMI_FUZZ already builds with ASan + UBSan; leave ORIGAMI_SANITIZE off")
endif()
add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
                    -fno-omit-frame-pointer -gline-tables-only)
add_link_options(-fsanitize=address,undefined)
