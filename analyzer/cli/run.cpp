// `gpuheap run`: start a command with libgpuheap.so preloaded and report where its traces
// went (each traced process appends its trace path to GPUHEAP_PATH_FILE when it creates
// the file, at its first event, or "!PID MESSAGE" when its tracing failed).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/base/text_safe.h"
#include "analyzer/cli/commands.h"
#include "analyzer/live/discover.h"
#include "analyzer/live/view.h"
#include "analyzer/trace/reader.h"
#include "common/outpath_pattern.h"
#include "common/parse.h"

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

// `run`'s own status when the command exited 0 but a traced process could not write its
// trace (docs/cli.md).
constexpr int kExitNoTrace = 3;

// The list of trace paths (GPUHEAP_PATH_FILE) lives in a directory of our own: mkdtemp
// creates it mode 0700, so no other user can plant a symlink, FIFO or file in it, and the
// list itself is created O_EXCL|O_NOFOLLOW. remove() deletes both: the preload never
// creates the list (O_APPEND without O_CREAT), so a process that outlives the command
// cannot re-create it.
struct PathList {
  std::string dir, file;
  void remove() {
    if (!file.empty()) ::unlink(file.c_str());
    if (!dir.empty()) ::rmdir(dir.c_str());
    file.clear(), dir.clear();
  }
  ~PathList() { remove(); }
};

PathList make_path_list() {
  const char* td = std::getenv("TMPDIR");
  PathList l;
  for (const std::string& base : {std::string(td && *td ? td : "/tmp"), std::string("/tmp")}) {
    std::string tmpl = base + "/gpuheap-run-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) continue;
    l.dir = buf.data();
    l.file = l.dir + "/paths";
    int fd = ::open(l.file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::close(fd);
      return l;
    }
    l.file.clear();
    l.remove();
  }
  throw InputError(fmt::format("run: cannot create a private temporary directory: {}", std::strerror(errno)));
}

std::string current_dir() {
  char buf[PATH_MAX];
  return ::getcwd(buf, sizeof buf) ? std::string(buf) : std::string();
}

// The pattern resolved once, here, in the directory run started in (docs/cli.md), by the
// preload's own rule (common/outpath_pattern.h: the directory's '%' doubled, leading "./" dropped, "" = the
// default pattern): a wrapper that changes directory before the traced program starts
// (`sh -c 'cd /tmp && prog'`, pyenv shims) must not move the traces, and the preload then
// finds an absolute pattern and exports nothing itself. The pattern unchanged when there is
// no working directory.
std::string absolute_pattern(const std::string& pattern, const std::string& cwd) {
  char buf[PATH_MAX + 256];
  if (common::absolute_output_pattern(pattern.c_str(), cwd.c_str(), buf, sizeof buf) < 0) return pattern;
  return buf;
}

// The file a pattern names when it has no per-process conversion (%p %h %r %n): "-o NAME"
// as memray and nsys read it. "" for a pattern, whose names the preload makes unique.
std::string fixed_name(const std::string& pattern) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') {
      out += pattern[i];
    } else if (i + 1 < pattern.size() && pattern[i + 1] == '%') {
      out += '%', ++i;
    } else if (i + 1 < pattern.size() && std::strchr("phrn", pattern[i + 1])) {
      return {};
    } else {
      out += '%';  // an unknown conversion is kept literally (outpath.h)
    }
  }
  return out;
}

// Whether `path` exists as something a trace would replace: anything but a device, FIFO or
// socket (those the preload refuses with its own message, outpath.h special_file_kind).
bool exists_as_file(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return false;
  return !S_ISCHR(st.st_mode) && !S_ISBLK(st.st_mode) && !S_ISFIFO(st.st_mode) && !S_ISSOCK(st.st_mode);
}

// `-o NAME` refuses an existing NAME (memray's rule): a second run must not leave NAME.1
// beside the trace the user meant to replace, nor a run's trace be mistaken for the last
// one's. Once compressed the trace is NAME.zst: that one existing counts too. --force
// removes NAME now and lets the finishing step replace NAME.zst.
void check_fixed_output(const std::string& name, const RunOptions& opt) {
  std::vector<std::string> existing;
  if (exists_as_file(name)) existing.push_back(name);
  if (opt.finish.compress && exists_as_file(name + ".zst")) existing.push_back(name + ".zst");
  if (existing.empty()) return;
  if (!opt.force) {
    // The pattern to suggest: %p where the preload would put its suffix (outpath.h).
    std::string given = opt.output;
    std::size_t base = given.rfind('/') == std::string::npos ? 0 : given.rfind('/') + 1;
    std::size_t dot = given.rfind('.');
    if (dot == std::string::npos || dot <= base) dot = given.size();
    throw UsageError(fmt::format("run: {} exists; --force replaces it (or give a pattern: -o {}.%p{})", existing[0],
                                 given.substr(0, dot), given.substr(dot)));
  }
  struct stat st {};
  if (::lstat(name.c_str(), &st) == 0 && (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) && ::unlink(name.c_str()) != 0)
    throw InputError(fmt::format("run: cannot remove {}: {}", name, std::strerror(errno)));
}

// A path as one shell word: quoted when it holds anything but [A-Za-z0-9_./+,:@%=-]; with a
// control character (a newline), as $'...' so that the line stays one line.
std::string shell_word(const std::string& p) {
  bool plain = !p.empty();
  for (char c : p)
    if (!std::isalnum(static_cast<unsigned char>(c)) && !std::strchr("_./+,:@%=-", c)) plain = false;
  if (plain) return p;
  bool control = false;
  for (char c : p) control |= static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  if (control) {  // bash's $'...': the line stays one line, the word the same path
    std::string out = "$'";
    for (char c : p) {
      auto u = static_cast<unsigned char>(c);
      if (c == '\\' || c == '\'') out += '\\', out += c;
      else if (c == '\n') out += "\\n";
      else if (c == '\t') out += "\\t";
      else if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
      else out += c;
    }
    return out + "'";
  }
  std::string out = "'";
  for (char c : p) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The preload's own boolean rule (common/parse.h: 1/0, true/false, yes/no, on/off, any case), so
// `run` and the preload read GPUHEAP_QUIET alike.
bool env_true(const char* name) {
  const char* text = std::getenv(name);
  bool v = false;
  return text && common::parse_bool(text, &v) && v;
}

// Signals a supervisor, a batch scheduler, `Popen.terminate()` or a terminal sends to `run`
// go on to the program, as timeout(1) and nsys do: run then waits for it, finishes its
// traces and exits with its status. One that the kernel sent to the terminal's foreground
// process group (^C, ^\, a hangup: si_code SI_KERNEL) already reached the program when it
// is in our group, and is not sent a second time (a second SIGINT would interrupt a Python
// program's KeyboardInterrupt handling). A signal ignored when run started (nohup's SIGHUP)
// stays ignored, for the program too.
constexpr int kForwarded[] = {SIGTERM, SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2};
volatile sig_atomic_t g_child = 0;

void forward_signal(int sig, siginfo_t* info, void*) {
  int saved = errno;
  pid_t child = g_child;
  bool group_got_it = info && info->si_code == SI_KERNEL && ::getpgid(child) == ::getpgrp();
  if (child > 0 && !group_got_it) ::kill(child, sig);
  errno = saved;
}

struct Forwarding {
  struct sigaction old[std::size(kForwarded)]{};
  sigset_t blocked{}, prev{};
  // Installed (and the signals blocked) before fork: none arrives before the child's pid is
  // known; the child restores all, then execs.
  void install() {
    ::sigemptyset(&blocked);
    for (int s : kForwarded) ::sigaddset(&blocked, s);
    ::sigprocmask(SIG_BLOCK, &blocked, &prev);
    for (std::size_t i = 0; i < std::size(kForwarded); ++i) {
      ::sigaction(kForwarded[i], nullptr, &old[i]);
      if (old[i].sa_handler == SIG_IGN) continue;
      struct sigaction fw {};
      fw.sa_sigaction = forward_signal;
      fw.sa_flags = SA_SIGINFO | SA_RESTART;
      ::sigfillset(&fw.sa_mask);
      ::sigaction(kForwarded[i], &fw, nullptr);
    }
  }
  void started(pid_t child) {
    g_child = child;
    ::sigprocmask(SIG_SETMASK, &prev, nullptr);
  }
  void restore() {
    for (std::size_t i = 0; i < std::size(kForwarded); ++i) ::sigaction(kForwarded[i], &old[i], nullptr);
    ::sigprocmask(SIG_SETMASK, &prev, nullptr);
    g_child = 0;
  }
};

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
  // Build tree (next to gpuheap), installed layout (cmake --install: PREFIX/bin/gpuheap and
  // PREFIX/lib/gpuheap/libgpuheap.so), and a plain PREFIX/lib.
  for (const auto& c : {dir + "/libgpuheap.so", dir + "/../lib/gpuheap/libgpuheap.so", dir + "/../lib/libgpuheap.so"})
    if (is_file(c)) return c;
  return {};
}

namespace {

// The simulated CUDA runtime beside the preload: build/simcuda of a build tree, and
// gpuheap/lib/gpuheap/simcuda of the wheel (cmake --install does not install it).
std::string simcuda_dir(const std::string& lib) { return lib.substr(0, lib.rfind('/')) + "/simcuda"; }

// The environment the program runs in: the preload, the path list, the options as the
// preload's variables, and framework caching allocators off unless kept.
void prepare_environment(const RunOptions& opt, bool quiet, const std::string& pattern, const std::string& lib,
                         const std::string& path_file) {
  prepend_env("LD_PRELOAD", lib, ':');
  // NVTX ranges become phases: NVTX's loader dlopens this path (the preload, already loaded)
  // and calls its InitializeInjectionNvtx2. Another tool the user chose wins.
  ::setenv("NVTX_INJECTION64_PATH", lib.c_str(), 0);
  ::setenv("GPUHEAP_PATH_FILE", path_file.c_str(), 1);
  if (!pattern.empty()) ::setenv("GPUHEAP_OUTPUT", pattern.c_str(), 1);
  if (quiet) ::setenv("GPUHEAP_QUIET", "1", 1);
  // GPUHEAP_FOLLOW_FORK=0 traces the process started here (runtime.cpp claims it at load): a
  // marker inherited from an enclosing traced job must not name another process.
  ::unsetenv("GPUHEAP_FOLLOW_FORK_ROOT");
  if (opt.no_stacks) ::setenv("GPUHEAP_STACKS", "0", 1);
  if (opt.no_pool) ::setenv("GPUHEAP_POOL", "0", 1);
  if (!opt.limit.empty()) ::setenv("GPUHEAP_LIMIT", opt.limit.c_str(), 1);
  if (!opt.aggregate.empty()) ::setenv("GPUHEAP_AGGREGATE", opt.aggregate.c_str(), 1);
  if (opt.simulate) prepend_env("LD_LIBRARY_PATH", simcuda_dir(lib), ':');
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
    if (!quiet)
      std::fprintf(stderr,
                   "gpuheap: framework pools off: set %s(CuPy's pool has no environment switch and stays on); "
                   "--framework-pools=keep leaves them alone\n",
                   set.empty() ? "nothing, already set by you " : set.c_str());
  }
}

// --live: the file the program's stdout and stderr go to, so that they do not run through
// the view (memray's --live keeps them apart the same way). Created here, never over an
// existing file.
int open_live_output(const RunOptions& opt, std::string* name) {
  *name = opt.live_output.empty() ? fmt::format("gpuheap-live.{}.out", ::getpid()) : opt.live_output;
  int fd = ::open(name->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) throw UsageError(fmt::format("run --live: cannot create {}: {}", *name, std::strerror(errno)));
  return fd;
}

// The child's side of the fork: the output file and /dev/null (the view reads the terminal)
// in place of the standard descriptors under --live, then the program.
[[noreturn]] void exec_program(const RunOptions& opt, int live_out) {
  if (live_out >= 0) {
    int nul = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nul < 0 || ::dup2(nul, 0) < 0 || ::dup2(live_out, 1) < 0 || ::dup2(live_out, 2) < 0) ::_exit(126);
  }
  std::vector<char*> argv;
  for (const auto& a : opt.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  std::fprintf(stderr, "gpuheap: cannot execute %s: %s\n", argv[0], std::strerror(errno));
  ::_exit(errno == ENOENT ? 127 : 126);
}

// --live, after the view: where the program's output went, and its last lines (memray's
// --live shows the program's output once the view is gone, too). Only the file's tail is
// read, so a job that logged gigabytes costs nothing here.
void show_live_output(const std::string& name) {
  constexpr std::size_t kTailBytes = 8192, kTailLines = 20;
  std::string tail;
  int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  struct stat st {};
  if (fd >= 0 && ::fstat(fd, &st) == 0) {
    const auto size = static_cast<std::uint64_t>(st.st_size);
    const std::uint64_t from = size > kTailBytes ? size - kTailBytes : 0;
    tail.resize(static_cast<std::size_t>(size - from));
    const ssize_t got = ::pread(fd, tail.data(), tail.size(), static_cast<off_t>(from));
    tail.resize(got > 0 ? static_cast<std::size_t>(got) : 0);
    if (from > 0 && tail.find('\n') != std::string::npos) tail.erase(0, tail.find('\n') + 1);  // a whole first line
  }
  if (fd >= 0) ::close(fd);
  std::size_t at = tail.size(), lines = 0;
  if (at > 0 && tail[at - 1] == '\n') --at;
  while (at > 0 && lines < kTailLines)
    if (tail[--at] == '\n' && ++lines == kTailLines) ++at;
  tail.erase(0, at);
  std::fprintf(stderr, "gpuheap: the program's output is in %s%s\n", text_safe(name).c_str(),
               tail.empty() ? " (empty)" : "; its last lines:");
  for (std::size_t i = 0; i < tail.size();) {  // line by line: text_safe writes a newline as \n
    std::size_t nl = tail.find('\n', i);
    if (nl == std::string::npos) nl = tail.size();
    std::fprintf(stderr, "  %s\n", text_safe(std::string_view(tail).substr(i, nl - i)).c_str());
    i = nl + 1;
  }
}

// --live: the view follows the run's path list while the program runs, reaping it without
// blocking; the view ends with the job (or, on a terminal, when the user quits: run then
// waits for the program as without --live). The wait status.
int wait_live(pid_t pid, const std::string& path_file, const std::string& out_name) {
  int status = 0;
  bool exited = false;
  live::Job job(path_file, pid);
  live::ViewOptions v;
  v.program_output = out_name;
  v.tick = [&] {
    if (!exited && ::waitpid(pid, &status, WNOHANG) == pid) exited = true, job.program_exited();
  };
  try {
    live::run_view(job, v);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpuheap: the live view stopped: %s\n", e.what());
  }
  if (!exited) {
    std::fprintf(stderr, "gpuheap: view closed; waiting for the program (pid %d, output in %s)\n",
                 static_cast<int>(pid), text_safe(out_name).c_str());
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  show_live_output(out_name);
  return status;
}

// Starts the program and waits for it. It gets ^C and what is sent to run (Forwarding); run
// waits and still reports the trace paths. The wait status.
int run_program(const RunOptions& opt, const std::string& path_file) {
  std::string out_name;
  const int live_out = opt.live ? open_live_output(opt, &out_name) : -1;
  Forwarding fw;
  fw.install();
  pid_t pid = ::fork();
  if (pid < 0) {
    fw.restore();
    if (live_out >= 0) ::close(live_out);
    throw InputError(fmt::format("run: fork failed: {}", std::strerror(errno)));
  }
  if (pid == 0) {
    fw.restore();
    exec_program(opt, live_out);
  }
  fw.started(pid);
  int status = 0;
  if (live_out >= 0) {
    ::close(live_out);
    status = wait_live(pid, path_file, out_name);
  } else {
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  fw.restore();
  return status;
}

struct ListedTraces {
  std::vector<std::string> failures, written, gone;
};

// Lines are trace paths, or "!PID MESSAGE" for a process whose tracing failed
// (preload/record/recorder.cpp). The list is read through a descriptor opened inside our
// private directory, then removed with it: a process that outlives the command finds no
// list and never re-creates one (preload/record/outpath.h).
ListedTraces read_path_list(PathList& list) {
  std::string text;
  if (int fd = ::open(list.file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC); fd >= 0) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
    ::close(fd);
  }
  list.remove();
  std::set<std::string> seen;
  ListedTraces out;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t nl = text.find('\n', at);
    if (nl == std::string::npos) break;  // a line is whole or was never written
    std::string line = live::path_list_entry(text.substr(at, nl - at));
    at = nl + 1;
    if (line.empty() || !seen.insert(line).second) continue;
    if (line[0] == '!') out.failures.push_back(line.substr(1));
    else if (!exists_as_file(line)) out.gone.push_back(line);  // removed while the program ran
    else if (holds_events(line)) out.written.push_back(line);
  }
  return out;
}

// The exact paths and the next command, as heaptrack does (absolute: the preload resolves
// every path against the directory run started in).
void print_finished(const std::vector<std::string>& finished) {
  std::string words;
  for (const auto& p : finished) {
    std::fprintf(stderr, "gpuheap: trace written to %s\n", text_safe(p).c_str());
    words += " " + shell_word(p);
  }
  std::fprintf(stderr, "Now run: gpuheap summary%s\n", words.c_str());
}

// Last, so they are what a CI log ends with: a trace that could not be written must not
// pass as a job that made no GPU allocation. The exit status.
int report_lost(const ListedTraces& listed, const RunOptions& opt, int rc) {
  const auto& failures = listed.failures;
  const auto& gone = listed.gone;
  const char* level = opt.allow_no_trace ? "warning" : "error";
  for (const auto& f : failures) {
    std::size_t sp = f.find(' ');
    std::fprintf(stderr, "gpuheap: %s: tracing failed in process %s: %s\n", level, text_safe(f.substr(0, sp)).c_str(),
                 sp == std::string::npos ? "" : text_safe(f.substr(sp + 1)).c_str());
  }
  // A trace its process created and announced, gone now (its directory removed while the
  // program ran): not written, as far as the user is concerned (docs/cli.md: exit 3).
  for (const auto& g : gone)
    std::fprintf(stderr, "gpuheap: %s: trace %s was removed before the command ended\n", level, text_safe(g).c_str());
  std::size_t lost = failures.size() + gone.size();
  if (lost && !opt.allow_no_trace && rc == 0) {
    std::fprintf(stderr,
                 "gpuheap: error: %zu process%s could not write %s trace; exit status %d "
                 "(--allow-no-trace: the command's own status)\n",
                 lost, lost == 1 ? "" : "es", lost == 1 ? "its" : "their", kExitNoTrace);
    return kExitNoTrace;
  }
  return rc;
}

}  // namespace

int run_traced(const RunOptions& opt) {
  if (opt.command.empty())
    throw UsageError("run: no program given (usage: gpuheap run [OPTIONS] [--] PROGRAM [ARGS...])");
  const bool quiet = opt.quiet || env_true("GPUHEAP_QUIET");
  // -o, else a GPUHEAP_OUTPUT you exported, else the preload's default: made absolute here
  // and exported, so the preload need not setenv in its constructor.
  const char* env_out = std::getenv("GPUHEAP_OUTPUT");
  std::string pattern = !opt.output.empty() ? opt.output : env_out ? env_out : "";
  std::string cwd = current_dir();
  pattern = absolute_pattern(pattern, cwd);
  if (!opt.output.empty()) {
    std::string name = fixed_name(pattern);
    if (!name.empty()) check_fixed_output(name, opt);
  }
  std::string lib = find_preload_library();
  if (lib.empty())
    throw UsageError(
        fmt::format("run: libgpuheap.so not found next to the gpuheap binary ({}), in its ../lib/gpuheap or ../lib",
                    self_dir()));
  // Without the simulated runtime the program would meet the real one (or none) and the
  // trace would not be the simulated run that was asked for.
  if (opt.simulate && !is_file(simcuda_dir(lib) + "/libcudart.so.13"))
    throw UsageError(
        fmt::format("run --simulate: no simulated CUDA runtime in {} (it is in a build tree and "
                    "the wheel; cmake --install does not install it)",
                    simcuda_dir(lib)));
  PathList list = make_path_list();
  const std::string& path_file = list.file;

  prepare_environment(opt, quiet, pattern, lib, path_file);
  int status = run_program(opt, path_file);
  ListedTraces listed = read_path_list(list);
  // Symbolized and compressed once the program is gone (analyzer/cli/run_finish.h).
  std::vector<std::string> finished = finish_traces(listed.written, opt.finish);
  if (!quiet && !finished.empty()) print_finished(finished);
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  return report_lost(listed, opt, rc);
}

}  // namespace gpuheap
