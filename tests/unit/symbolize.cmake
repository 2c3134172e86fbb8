# Offline symbolizer (analyzer/symbolize/: symbolize*.cpp, debuginfo.cpp) tests. They link
# that room alone (and the rooms below it), not the rest of the analyzer.
include(GoogleTest)
pkg_check_modules(LIBDW REQUIRED IMPORTED_TARGET libdw)
pkg_check_modules(LIBELF REQUIRED IMPORTED_TARGET libelf)
pkg_check_modules(LIBUNWIND REQUIRED IMPORTED_TARGET libunwind)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(ZLIB REQUIRED)

set(_symtest_data ${CMAKE_CURRENT_SOURCE_DIR}/symbolize_data)

# -O2 with an always_inline function (inlined frames); linked at a non-zero p_vaddr so the
# load bias differs from the mapping start, like a prelinked library.
add_library(symtest_inline SHARED ${_symtest_data}/inline_lib.cpp)
target_compile_options(symtest_inline PRIVATE -O2 -g)
target_link_options(symtest_inline PRIVATE -Wl,--build-id -Wl,-Ttext-segment=0x40000000)
# The same library under gpuheap's name: frames in it must be hidden.
set(SYMTEST_HIDDEN_COPY ${CMAKE_CURRENT_BINARY_DIR}/libgpuheap_symtest_copy.so)
add_custom_command(TARGET symtest_inline POST_BUILD
                   COMMAND ${CMAKE_COMMAND} -E copy $<TARGET_FILE:symtest_inline> ${SYMTEST_HIDDEN_COPY})

# No debug info, not stripped: names come from .symtab only.
add_library(symtest_nodebug SHARED ${_symtest_data}/nodebug_lib.cpp)
target_compile_options(symtest_nodebug PRIVATE -O1 -g0)
target_link_options(symtest_nodebug PRIVATE -Wl,--build-id)

add_executable(test_symbolize
  test_symbolize.cpp
  test_symbolize_perf.cpp
  symtest_static_cudart.cpp)
# Exact call-site lines need unoptimized test code; the symbolizer itself keeps the build's
# optimization level so the performance check measures what users run.
set_source_files_properties(test_symbolize.cpp PROPERTIES COMPILE_OPTIONS "-O0;-g")
set_source_files_properties(symtest_static_cudart.cpp PROPERTIES COMPILE_OPTIONS "-O0;-g0")
target_include_directories(test_symbolize PRIVATE ${CMAKE_SOURCE_DIR} ${_symtest_data})
target_compile_definitions(test_symbolize PRIVATE SYMTEST_HIDDEN_COPY="${SYMTEST_HIDDEN_COPY}")
target_compile_options(test_symbolize PRIVATE ${GPUHEAP_SAN_FLAGS})
target_link_options(test_symbolize PRIVATE ${GPUHEAP_SAN_FLAGS} -Wl,--build-id)
target_link_libraries(test_symbolize PRIVATE
  gpuheap_analyzer_symbolize symtest_inline symtest_nodebug
  PkgConfig::LIBDW PkgConfig::LIBELF PkgConfig::LIBUNWIND
  spdlog::spdlog fmt::fmt ZLIB::ZLIB ${CMAKE_DL_LIBS} GTest::gtest Threads::Threads)
gtest_discover_tests(test_symbolize DISCOVERY_MODE PRE_TEST)
