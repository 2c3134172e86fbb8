// Loaded by nothing in the analyzer, ever: its constructor creates the file named by
// $GPUHEAP_TEST_MARKER, so a test can tell whether anything dlopen'ed or preloaded it.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void gpuheap_test_marker_ctor(void) {
  const char* p = getenv("GPUHEAP_TEST_MARKER");
  if (p == NULL || *p == '\0') return;
  int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) close(fd);
}
