#pragma once
// Assertions for internal invariants only (never for user input: that gets a Status).
#include <cstdio>
#include <cstdlib>

#define ORIGAMI_CHECK(cond)                                                              \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "origami: internal check failed at %s:%d: %s\n", __FILE__,   \
                   __LINE__, #cond);                                                     \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

#define ORIGAMI_CHECK_MSG(cond, msg)                                                     \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "origami: internal check failed at %s:%d: %s (%s)\n",        \
                   __FILE__, __LINE__, #cond, msg);                                      \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)
