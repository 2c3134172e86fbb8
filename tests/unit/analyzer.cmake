# Analyzer unit tests (synthetic traces built in-test) and CLI tests (run the built binary).
include(GoogleTest)
foreach(t test_model test_model_edges test_model_replay test_phases test_categories test_report test_site_lists test_check test_analyzer_cli test_diff test_library_label test_labels test_progress test_replay test_replay_pending test_replay_torch test_live test_ranks)
  add_executable(${t} ${CMAKE_CURRENT_SOURCE_DIR}/${t}.cpp)
  target_link_libraries(${t} PRIVATE gpuheap_analyzer GTest::gtest GTest::gtest_main)
  target_compile_options(${t} PRIVATE ${GPUHEAP_SAN_FLAGS})
  target_link_options(${t} PRIVATE ${GPUHEAP_SAN_FLAGS})
  target_compile_definitions(${t} PRIVATE GPUHEAP_CLI="$<TARGET_FILE:gpuheap_cli>")
  gtest_discover_tests(${t} DISCOVERY_TIMEOUT 60)
endforeach()
add_dependencies(test_analyzer_cli gpuheap_cli)
add_dependencies(test_ranks gpuheap_cli)
# The kept real traces (format versions 2 and 3, tests/gpu/traces) are read as they were.
target_compile_definitions(test_ranks PRIVATE GPUHEAP_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_dependencies(test_categories gpuheap_cli)
# The shipped example trace against the GPU run's truth (bench/results).
target_compile_definitions(test_categories PRIVATE GPUHEAP_SOURCE_DIR="${CMAKE_SOURCE_DIR}")

# Event blocks (format version 7) on the shipped traces, recoded compact and compressed.
add_executable(test_blocks ${CMAKE_CURRENT_SOURCE_DIR}/test_blocks.cpp)
target_link_libraries(test_blocks PRIVATE gpuheap_analyzer GTest::gtest GTest::gtest_main)
target_compile_options(test_blocks PRIVATE ${GPUHEAP_SAN_FLAGS})
target_link_options(test_blocks PRIVATE ${GPUHEAP_SAN_FLAGS})
target_compile_definitions(test_blocks PRIVATE GPUHEAP_CLI="$<TARGET_FILE:gpuheap_cli>"
                           GPUHEAP_RECODE="$<TARGET_FILE:gpuheap_recode_trace>" GPUHEAP_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_dependencies(test_blocks gpuheap_cli gpuheap_recode_trace)
gtest_discover_tests(test_blocks DISCOVERY_TIMEOUT 60)

# The default summary view of the shipped example traces (issue 17).
add_executable(test_summary_view ${CMAKE_CURRENT_SOURCE_DIR}/test_summary_view.cpp)
target_link_libraries(test_summary_view PRIVATE gpuheap_analyzer GTest::gtest GTest::gtest_main)
target_compile_definitions(test_summary_view PRIVATE GPUHEAP_CLI="$<TARGET_FILE:gpuheap_cli>"
                           GPUHEAP_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_dependencies(test_summary_view gpuheap_cli)
gtest_discover_tests(test_summary_view DISCOVERY_TIMEOUT 60)
add_dependencies(test_diff gpuheap_cli)
add_dependencies(test_replay gpuheap_cli)
# The real traces kept in tests/gpu/traces are replayed in place.
target_compile_definitions(test_replay PRIVATE GPUHEAP_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
if(TARGET gpuheap)
  add_dependencies(test_analyzer_cli gpuheap)
endif()

# Python line tables (analyzer/symbolize/pyframes.cpp) against the running python3's own co_lines().
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_executable(test_pyframes ${CMAKE_CURRENT_SOURCE_DIR}/test_pyframes.cpp)
target_link_libraries(test_pyframes PRIVATE gpuheap_analyzer GTest::gtest GTest::gtest_main)
target_compile_options(test_pyframes PRIVATE ${GPUHEAP_SAN_FLAGS})
target_link_options(test_pyframes PRIVATE ${GPUHEAP_SAN_FLAGS})
target_compile_definitions(test_pyframes PRIVATE PYTHON3_EXE="${Python3_EXECUTABLE}"
                           PYFRAMES_DATA="${CMAKE_CURRENT_SOURCE_DIR}/pyframes_data")
gtest_discover_tests(test_pyframes DISCOVERY_TIMEOUT 60)
