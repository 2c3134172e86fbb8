# Flags of all in-process code: no exceptions (nothing may throw into the user's job),
# initial-exec TLS (the recursion guard must not allocate on first use), hidden symbols.
set(GPUHEAP_INPROC_FLAGS -fno-exceptions -fno-semantic-interposition -ftls-model=initial-exec -Wall -Wextra -Wno-deprecated-declarations
    ${GPUHEAP_SAN_FLAGS})
function(gpuheap_inproc_library name)
  add_library(${name} STATIC ${ARGN})
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON CXX_VISIBILITY_PRESET hidden
                                           VISIBILITY_INLINES_HIDDEN ON)
  target_include_directories(${name} PUBLIC ${CMAKE_SOURCE_DIR})
  target_compile_definitions(${name} PRIVATE _GNU_SOURCE)
  target_compile_options(${name} PRIVATE ${GPUHEAP_INPROC_FLAGS})
endfunction()
