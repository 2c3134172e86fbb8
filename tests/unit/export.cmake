# Exports and the HTML report (analyzer/export/: export_*.cpp, flame.cpp, report_html.cpp): the CLI
# end to end. test_export checks torch-snapshot with python3's pickle
# (export/check_torch_snapshot.py); test_report_html loads the page in headless Chromium and
# fails when no Chromium is installed (scripts/setup.sh installs it).
foreach(t test_export test_report_html)
  add_executable(${t} ${CMAKE_CURRENT_SOURCE_DIR}/${t}.cpp)
  target_link_libraries(${t} PRIVATE gpuheap_analyzer GTest::gtest GTest::gtest_main)
  target_compile_options(${t} PRIVATE ${GPUHEAP_SAN_FLAGS})
  target_link_options(${t} PRIVATE ${GPUHEAP_SAN_FLAGS})
  target_compile_definitions(${t} PRIVATE GPUHEAP_CLI="$<TARGET_FILE:gpuheap_cli>"
                             GPUHEAP_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                             GPUHEAP_GEN_TRACE="$<TARGET_FILE:gpuheap_gen_trace>"
                             GPUHEAP_TEST_OUT="${CMAKE_BINARY_DIR}/test-output")
  add_dependencies(${t} gpuheap_cli gpuheap_gen_trace)
  gtest_discover_tests(${t} DISCOVERY_TIMEOUT 60)
endforeach()
