// Test helper: runs a program from tests/preload under LD_PRELOAD=libgpuheap.so on the
// simulated CUDA runtime, with its traces in a fresh directory; captures stdout and stderr.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/test_tmpdir.h"

extern char** environ;

namespace gpuheap::test {

inline const std::string kBuild = GPUHEAP_BUILD_DIR;
inline const std::string kProgs = PRELOAD_PROG_DIR;

inline bool small_scale() {
  const char* s = std::getenv("GPUHEAP_TEST_SCALE");
  return s && std::strcmp(s, "small") == 0;
}

struct ProgRun {
  int status = -1;  // exit code, or 128+signal
  std::string dir;  // where traces went
  std::vector<std::string> traces;
  std::string out;  // stdout
  std::string err;  // stderr
};

inline std::string make_dir() { return gpuheap::test::temp_dir("gpuheap-preload"); }

inline std::vector<std::string> traces_in(const std::string& dir) {
  std::vector<std::string> v;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::strstr(e->d_name, ".trace")) v.push_back(dir + "/" + e->d_name);
    closedir(d);
  }
  std::sort(v.begin(), v.end());
  return v;
}

// Starts PROG with the preload (unless preload=false); on_start(pid, stdout_fd) may
// interact with it (e.g. kill it). Returns exit status and traces.
template <class OnStart>
inline ProgRun run_with(const std::string& prog, std::vector<std::string> args, std::vector<std::string> env,
                        bool preload, OnStart on_start) {
  ProgRun r;
  r.dir = make_dir();
  std::vector<std::string> envs;
  std::string preload_first;  // an LD_PRELOAD= entry of `env`: loaded before libgpuheap.so
  for (auto& e : env) {
    if (e.rfind("LD_PRELOAD=", 0) == 0) preload_first = e.substr(11) + " ";
    else envs.push_back(e);  // before the test's own: getenv() returns the first match
  }
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "LD_PRELOAD=", 11) && std::strncmp(*e, "LD_LIBRARY_PATH=", 16) &&
        std::strncmp(*e, "GPUHEAP_", 8))
      envs.push_back(*e);
  }
  envs.push_back("LD_LIBRARY_PATH=" + kBuild + "/simcuda");
  if (preload) envs.push_back("LD_PRELOAD=" + preload_first + kBuild + "/libgpuheap.so");
  envs.push_back("GPUHEAP_OUTPUT=" + r.dir + "/t.%p.trace");
  envs.push_back("GPUHEAP_QUIET=1");
  std::vector<char*> envp, argv;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string path = prog[0] == '/' ? prog : kProgs + "/" + prog;  // absolute: an interpreter
  argv.push_back(path.data());
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int pipefd[2];
  if (pipe(pipefd) != 0) return r;
  std::string err_path = r.dir + "/stderr.txt";
  pid_t pid = fork();
  if (pid == 0) {
    int efd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (efd >= 0) dup2(efd, 2);
    dup2(pipefd[1], 1);
    close(pipefd[0]);
    close(pipefd[1]);
    execve(path.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  close(pipefd[1]);
  on_start(pid, pipefd[0]);
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) r.out.append(buf, static_cast<std::size_t>(n));
  close(pipefd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.traces = traces_in(r.dir);
  if (FILE* f = std::fopen(err_path.c_str(), "r")) {
    char eb[4096];
    std::size_t m;
    while ((m = std::fread(eb, 1, sizeof eb, f)) > 0) r.err.append(eb, m);
    std::fclose(f);
  }
  return r;
}

inline ProgRun run(const std::string& prog, std::vector<std::string> args = {}, std::vector<std::string> env = {},
                   bool preload = true) {
  return run_with(prog, std::move(args), std::move(env), preload, [](pid_t, int) {});
}

// A shell command line's exit status and stdout (append 2>&1 to capture stderr too).
struct CmdRun {
  int status = -1;
  std::string out;
};
inline CmdRun run_cmd(const std::string& cmd) {
  CmdRun r;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return r;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) r.out.append(buf, n);
  int st = pclose(f);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// `cd DIR && gpuheap run --simulate ARGS` with stdout and stderr together. GPUHEAP_* variables
// of the environment the tests run in are dropped.
inline CmdRun run_in(const std::string& dir, const std::string& args) {
  return run_cmd("cd '" + dir +
                 "' && env -u GPUHEAP_OUTPUT -u GPUHEAP_QUIET -u GPUHEAP_FOLLOW_FORK -u "
                 "GPUHEAP_FOLLOW_FORK_ROOT " +
                 kBuild + "/gpuheap run --simulate " + args + " 2>&1");
}

}  // namespace gpuheap::test
