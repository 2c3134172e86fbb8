# `cmake --install BUILD [--prefix PREFIX]` (README "Install"):
#   PREFIX/bin/gpuheap                      the CLI
#   PREFIX/lib/gpuheap/libgpuheap.so        the preload, with its bundled libunwind beside it
#                                           (RUNPATH $ORIGIN); `gpuheap run` looks in
#                                           ../lib/gpuheap relative to its own executable
#   PREFIX/include/gpuheap.h                the C API (preload/gpuheap.h)
#   PREFIX/share/doc/gpuheap/               README.md, LICENSE, docs/*.md
#   PREFIX/share/gpuheap/python/            the pytest plugin (pytest_gpuheap.py, pyproject.toml)
# The simulated CUDA runtime (tests/simcuda) is a test tool and is not installed.
# The preload's directory is fixed (not CMAKE_INSTALL_LIBDIR) because run.cpp finds it by
# that relative path.
set(GPUHEAP_INSTALL_PRELOAD_DIR lib/gpuheap)

install(TARGETS gpuheap_cli RUNTIME DESTINATION bin)
if(TARGET gpuheap)
  install(TARGETS gpuheap LIBRARY DESTINATION ${GPUHEAP_INSTALL_PRELOAD_DIR})
  # The libunwind objects bundle_deps.cmake copied next to the built .so (only what is
  # there at install time: none when libunwind was linked statically).
  install(CODE "
    file(GLOB _gpuheap_bundled \"${CMAKE_BINARY_DIR}/libunwind*.so*\")
    if(_gpuheap_bundled)
      file(INSTALL \${_gpuheap_bundled}
           DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${GPUHEAP_INSTALL_PRELOAD_DIR}\")
    endif()")
endif()
# OPTIONAL: a tree without the C API yet installs without it.
install(FILES ${CMAKE_SOURCE_DIR}/preload/gpuheap.h DESTINATION include OPTIONAL)
file(GLOB _gpuheap_docs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/docs/*.md)
install(FILES ${CMAKE_SOURCE_DIR}/README.md ${CMAKE_SOURCE_DIR}/LICENSE ${_gpuheap_docs}
        DESTINATION share/doc/gpuheap)
install(FILES ${CMAKE_SOURCE_DIR}/python/pytest_gpuheap/pytest_gpuheap.py
              ${CMAKE_SOURCE_DIR}/python/pytest_gpuheap/pyproject.toml
              ${CMAKE_SOURCE_DIR}/python/pytest_gpuheap/README.md
        DESTINATION share/gpuheap/python)
