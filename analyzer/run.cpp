// `gpuheap run`: start a command with libgpuheap.so preloaded and report where its traces
// went (each traced process appends its trace path to GPUHEAP_PATH_FILE when it creates
// the file, at its first event).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>

#include <fmt/format.h>

#include "analyzer/commands.h"
#include "analyzer/error.h"
#include "analyzer/reader.h"

extern char** environ;

namespace gpuheap {

namespace {

bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Whether a listed trace is worth naming: it exists and holds more than its opening records
// (the preload creates a file at the first event, but the disk may have filled right then, or
// the file may have been removed since). A file that cannot be read as a trace is named: the
// user should see it, and `gpuheap summary` says what is wrong with it.
bool holds_events(const std::string& path) {
  if (!is_file(path)) return false;
  try {
    TraceReader in(path);
    format::Record r;
    while (in.next(r)) {
      using T = format::RecordType;
      if (r.type != T::process && r.type != T::module && r.type != T::module_unload && r.type != T::end) return true;
    }
    return false;
  } catch (const EmptyTraceError&) {
    return false;  // a header at most: nothing to name
  } catch (const std::exception&) {
    return true;
  }
}

void prepend_env(const char* name, const std::string& value, char sep) {
  const char* old = std::getenv(name);
  std::string v = value;
  if (old && *old) v += sep + std::string(old);
  ::setenv(name, v.c_str(), 1);
}

}  // namespace

std::string self_dir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<std::size_t>(n));
  auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

std::string find_preload_library() {
  std::string dir = self_dir();
  for (const auto& c : {dir + "/libgpuheap.so", dir + "/../lib/libgpuheap.so"})
    if (is_file(c)) return c;
  return {};
}

int run_traced(const RunOptions& opt) {
  if (opt.command.empty()) throw UsageError("run: no command given (usage: gpuheap run [options] -- CMD [ARGS...])");
  std::string lib = find_preload_library();
  if (lib.empty())
    throw UsageError(fmt::format("run: libgpuheap.so not found next to the gpuheap binary ({}) or in its ../lib",
                                 self_dir()));
  char tmpl[] = "/tmp/gpuheap-paths-XXXXXX";
  if (const char* td = std::getenv("TMPDIR"); td && *td) {
    // mkstemp needs a writable buffer; TMPDIR overrides /tmp like everywhere else.
  }
  std::string path_tmpl = std::string(std::getenv("TMPDIR") && *std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                          "/gpuheap-paths-XXXXXX";
  std::vector<char> tbuf(path_tmpl.begin(), path_tmpl.end());
  tbuf.push_back('\0');
  int pfd = ::mkstemp(tbuf.data());
  if (pfd < 0) {
    std::strcpy(tmpl, "/tmp/gpuheap-paths-XXXXXX");
    pfd = ::mkstemp(tmpl);
    if (pfd < 0) throw InputError(fmt::format("run: cannot create a temporary file: {}", std::strerror(errno)));
    tbuf.assign(tmpl, tmpl + sizeof tmpl);
  }
  ::close(pfd);
  std::string path_file(tbuf.data());

  prepend_env("LD_PRELOAD", lib, ':');
  ::setenv("GPUHEAP_PATH_FILE", path_file.c_str(), 1);
  if (!opt.output.empty()) ::setenv("GPUHEAP_OUTPUT", opt.output.c_str(), 1);
  if (opt.no_stacks) ::setenv("GPUHEAP_STACKS", "0", 1);
  if (opt.no_pool) ::setenv("GPUHEAP_POOL", "0", 1);
  if (!opt.limit.empty()) ::setenv("GPUHEAP_LIMIT", opt.limit.c_str(), 1);
  if (opt.simulate) prepend_env("LD_LIBRARY_PATH", self_dir() + "/simcuda", ':');
  if (!opt.keep_framework_pools) {
    // Framework caching allocators hide allocations from cudaMalloc; switch off the ones
    // that have an environment switch so gpuheap sees every tensor. A value the user set
    // explicitly wins.
    std::string set;
    if (!std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING")) {
      ::setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", 1);
      set += "PYTORCH_NO_CUDA_MEMORY_CACHING=1 ";
    }
    if (!std::getenv("XLA_PYTHON_CLIENT_ALLOCATOR")) {
      ::setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform", 1);
      set += "XLA_PYTHON_CLIENT_ALLOCATOR=platform ";
    }
    std::fprintf(stderr,
                 "gpuheap: framework pools off: set %s(CuPy's pool has no environment switch and stays on); "
                 "--framework-pools=keep leaves them alone\n",
                 set.empty() ? "nothing, already set by you " : set.c_str());
  }

  // Like system(): the child gets ^C; gpuheap waits and still reports the trace paths.
  struct sigaction ign {}, old_int {}, old_quit {};
  ign.sa_handler = SIG_IGN;
  ::sigemptyset(&ign.sa_mask);
  ::sigaction(SIGINT, &ign, &old_int);
  ::sigaction(SIGQUIT, &ign, &old_quit);
  pid_t pid = ::fork();
  if (pid < 0) throw InputError(fmt::format("run: fork failed: {}", std::strerror(errno)));
  if (pid == 0) {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGQUIT, &old_quit, nullptr);
    std::vector<char*> argv;
    for (const auto& a : opt.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "gpuheap: cannot execute %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(errno == ENOENT ? 127 : 126);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGQUIT, &old_quit, nullptr);

  std::ifstream in(path_file);
  std::string line;
  std::set<std::string> seen;
  while (std::getline(in, line))
    if (!line.empty() && seen.insert(line).second && holds_events(line))
      std::fprintf(stderr, "gpuheap: trace written to %s\n", line.c_str());
  ::unlink(path_file.c_str());
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace gpuheap
