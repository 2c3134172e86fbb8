# The context table (preload/core/contexts.h, header-only over the state type) and the fork
# order (preload/core/fork.cpp, in the recorder core), without a GPU.
if(TARGET gpuheap_recorder_core)
  add_executable(test_contexts ${CMAKE_CURRENT_LIST_DIR}/test_contexts.cpp)
  target_include_directories(test_contexts PRIVATE ${CUDA_INCLUDE_DIR})
  target_link_libraries(test_contexts PRIVATE gpuheap_recorder_core GTest::gtest_main Threads::Threads)
  target_compile_options(test_contexts PRIVATE ${GPUHEAP_SAN_FLAGS})
  target_link_options(test_contexts PRIVATE ${GPUHEAP_SAN_FLAGS})
  include(GoogleTest)
  gtest_discover_tests(test_contexts)
endif()
