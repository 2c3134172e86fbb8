# Pool hot-path benchmark (host upstream): allocate+deallocate pairs, 1 and 16 threads.
find_package(benchmark REQUIRED)
add_executable(bench_pool ${CMAKE_CURRENT_LIST_DIR}/bench_pool.cpp)
target_link_libraries(bench_pool PRIVATE gpuheap_pool benchmark::benchmark Threads::Threads)
