// Entry points of the helper libraries test_symbolize links against.
#pragma once

extern "C" {
using symtest_cb = void (*)(void*);

// Calls cb(arg) from an always_inline function expanded into this one (inline_lib.cpp).
__attribute__((visibility("default"))) void symtest_inline_entry(symtest_cb cb, void* arg);
// Lines (in inline_lib.cpp) of the cb call and of the call to the inlined function.
__attribute__((visibility("default"))) extern const int symtest_leaf_call_line;
__attribute__((visibility("default"))) extern const int symtest_entry_call_line;

// Calls cb(arg) through a file-local function; the library has no debug info.
__attribute__((visibility("default"))) void symtest_nodebug_entry(symtest_cb cb, void* arg);
}
