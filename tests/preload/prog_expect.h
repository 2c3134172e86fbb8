// EXPECT(c) for the test programs that run under LD_PRELOAD: when c is false, prints
// "PROGRAM: expectation c failed at line N" on stderr and returns 11 from the calling function
// (the ctest drivers read that exit status and line). One definition for every program.
#pragma once

#include <cerrno>  // program_invocation_short_name (glibc, _GNU_SOURCE)
#include <cstdio>

#define EXPECT(c) \
  do { \
    if (!(c)) { \
      std::fprintf(stderr, "%s: expectation %s failed at line %d\n", program_invocation_short_name, #c, __LINE__); \
      return 11; \
    } \
  } while (0)
