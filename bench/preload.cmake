# Preload benchmark program (run through scripts/bench-preload.sh, not ctest).
find_package(benchmark QUIET)
if(benchmark_FOUND AND EXISTS "${CUDA_ROOT}/lib64/libcudart.so")
  add_executable(bench_preload ${CMAKE_CURRENT_SOURCE_DIR}/bench_preload.cpp)
  target_include_directories(bench_preload PRIVATE ${CUDA_INCLUDE_DIR})
  target_link_libraries(bench_preload PRIVATE benchmark::benchmark "${CUDA_ROOT}/lib64/libcudart.so")
  target_compile_options(bench_preload PRIVATE -O2 -g -fno-omit-frame-pointer)
  set_target_properties(bench_preload PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
endif()
