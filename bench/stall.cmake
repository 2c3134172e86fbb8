# Tail-latency program for the trace sink under writeback (run by scripts/bench-stall.sh).
if(EXISTS "${CUDA_ROOT}/lib64/libcudart.so")
  add_executable(bench_stall ${CMAKE_CURRENT_SOURCE_DIR}/bench_stall.cpp)
  target_include_directories(bench_stall PRIVATE ${CUDA_INCLUDE_DIR})
  target_link_libraries(bench_stall PRIVATE "${CUDA_ROOT}/lib64/libcudart.so" Threads::Threads)
  target_compile_options(bench_stall PRIVATE -O2 -g -fno-omit-frame-pointer)
  set_target_properties(bench_stall PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
endif()
