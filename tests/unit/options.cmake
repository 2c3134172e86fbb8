# The option table and parser (preload/core/options.cpp), and README.md's table against it.
include(GoogleTest)
add_executable(test_options test_options.cpp)
target_link_libraries(test_options PRIVATE gpuheap_options GTest::gtest_main)
target_compile_definitions(test_options PRIVATE GPUHEAP_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
target_compile_options(test_options PRIVATE ${GPUHEAP_SAN_FLAGS})
target_link_options(test_options PRIVATE ${GPUHEAP_SAN_FLAGS})
gtest_discover_tests(test_options)
