# Recorder area: trace format, output paths, the in-process recorder.
include(GoogleTest)

add_executable(test_format test_format.cpp)
target_link_libraries(test_format PRIVATE gpuheap_format GTest::gtest_main)
target_compile_options(test_format PRIVATE ${GPUHEAP_SAN_FLAGS})
target_link_options(test_format PRIVATE ${GPUHEAP_SAN_FLAGS})
gtest_discover_tests(test_format)

add_executable(test_format_compact test_format_compact.cpp)
target_link_libraries(test_format_compact PRIVATE gpuheap_format GTest::gtest_main)
target_compile_options(test_format_compact PRIVATE ${GPUHEAP_SAN_FLAGS})
target_link_options(test_format_compact PRIVATE ${GPUHEAP_SAN_FLAGS})
gtest_discover_tests(test_format_compact)

add_executable(test_format_block test_format_block.cpp)
target_link_libraries(test_format_block PRIVATE gpuheap_format GTest::gtest_main)
target_compile_options(test_format_block PRIVATE ${GPUHEAP_SAN_FLAGS})
target_link_options(test_format_block PRIVATE ${GPUHEAP_SAN_FLAGS})
gtest_discover_tests(test_format_block)

if(TARGET gpuheap_outpath)
  add_executable(test_outpath test_outpath.cpp)
  target_link_libraries(test_outpath PRIVATE gpuheap_outpath GTest::gtest_main)
  target_compile_options(test_outpath PRIVATE ${GPUHEAP_SAN_FLAGS})
  target_link_options(test_outpath PRIVATE ${GPUHEAP_SAN_FLAGS})
  gtest_discover_tests(test_outpath)
endif()

if(TARGET gpuheap_recorder_core)
  foreach(t test_recorder test_recorder_files test_recorder_process test_recorder_perf test_stackcache)
    add_executable(${t} ${t}.cpp)
    target_link_libraries(${t} PRIVATE gpuheap_recorder_core GTest::gtest_main Threads::Threads)
    target_compile_options(${t} PRIVATE ${GPUHEAP_SAN_FLAGS})
    target_link_options(${t} PRIVATE ${GPUHEAP_SAN_FLAGS})
  endforeach()
  gtest_discover_tests(test_recorder)
  gtest_discover_tests(test_recorder_files)
  # Frame pointers in the test's own frames: the cache checks every saved rbp near the stack, so
  # a caller that keeps a stack address of its own in rbp (-fomit-frame-pointer) is not served.
  target_compile_options(test_stackcache PRIVATE -fno-omit-frame-pointer)
  gtest_discover_tests(test_stackcache)
  # TSan does not support threads started after a multi-threaded fork (die_after_fork).
  if(NOT GPUHEAP_SANITIZE MATCHES "thread")
    gtest_discover_tests(test_recorder_process)
  endif()
  # Timing test: serial, so the numbers are not distorted by other tests on 2 cores.
  if(GPUHEAP_SANITIZE)
    # Sanitizers multiply the cost of every record: the timing bounds only mean something
    # in the optimized build; the counts are still checked.
    target_compile_definitions(test_recorder_perf PRIVATE GPUHEAP_SANITIZED=1)
  endif()
  gtest_discover_tests(test_recorder_perf PROPERTIES RUN_SERIAL TRUE)
endif()
