# Copies the libunwind shared objects libgpuheap.so needs next to it (RPATH $ORIGIN), so the
# build directory can be carried to a machine without libunwind.
execute_process(COMMAND ldd ${LIB} OUTPUT_VARIABLE deps)
string(REGEX MATCHALL "[^ \t\n]*/libunwind[^ \t\n]*\\.so[^ \t\n]*" paths "${deps}")
foreach(p ${paths})
  get_filename_component(name ${p} NAME)
  file(REAL_PATH ${p} real)
  if(NOT "${real}" STREQUAL "${OUT}/${name}")
    file(COPY_FILE ${real} ${OUT}/${name} ONLY_IF_DIFFERENT)
  endif()
endforeach()
# libunwind depends on liblzma; it exists on every Ubuntu/Debian, so it is not bundled.
