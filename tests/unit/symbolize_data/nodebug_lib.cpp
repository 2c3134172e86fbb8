// Helper library for test_symbolize, built with -g0 and not stripped: the symbolizer must
// name its functions from the ELF symbol table alone (.symtab, including the local one).
#include "symtest_libs.h"

__attribute__((noinline)) static void nodebug_local(symtest_cb cb, void* arg) {
  cb(arg);
  asm volatile("" ::: "memory");
}

extern "C" __attribute__((noinline)) void symtest_nodebug_entry(symtest_cb cb, void* arg) {
  nodebug_local(cb, arg);
  asm volatile("" ::: "memory");
}
