# Unit tests for the caching pool (pool/pool.cpp) on host-memory upstreams.
add_executable(test_pool
  ${CMAKE_CURRENT_LIST_DIR}/test_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_pool_safety.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_pool_free_index.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_pool_owned.cpp)
target_compile_options(test_pool PRIVATE ${GPUHEAP_SAN_FLAGS})
target_link_options(test_pool PRIVATE ${GPUHEAP_SAN_FLAGS})
target_link_libraries(test_pool PRIVATE gpuheap_pool GTest::gtest GTest::gtest_main Threads::Threads)
include(GoogleTest)
gtest_discover_tests(test_pool DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)
