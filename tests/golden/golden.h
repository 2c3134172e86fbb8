// Golden-test helpers: runs golden_prog under the preload (tests/preload/run_prog.h), runs the
// gpuheap CLI on its traces, and the PyTorch table-cell formatting the text summary must use.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/preload/run_prog.h"

namespace gpuheap::golden {

using nlohmann::json;
constexpr std::int64_t KiB = 1024, MiB = 1024 * 1024;

struct CliRun {
  int status = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// build/gpuheap ARGS..., stdout and stderr captured through files (no pipe deadlock).
inline CliRun cli(const std::vector<std::string>& args) {
  CliRun r;
  std::string dir = test::make_dir();
  std::string out = dir + "/out", err = dir + "/err", exe = test::kBuild + "/gpuheap";
  std::vector<std::string> a{exe};
  a.insert(a.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1);
    dup2(e, 2);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

inline json summary_json(const std::vector<std::string>& traces) {
  std::vector<std::string> args{"summary", "--json"};
  args.insert(args.end(), traces.begin(), traces.end());
  auto r = cli(args);
  EXPECT_EQ(r.status, 0) << r.err;
  return json::parse(r.out, nullptr, false);
}

inline std::string summary_text(const std::vector<std::string>& traces) {
  std::vector<std::string> args{"summary"};
  args.insert(args.end(), traces.begin(), traces.end());
  auto r = cli(args);
  EXPECT_EQ(r.status, 0) << r.err;
  return r.out;
}

// `gpuheap run --simulate --no-pool -o DIR/np.%p.trace -- golden_prog MODE` in a fresh DIR: the
// CLI's result and the traces DIR then holds (the pass-through path, through the CLI).
struct NoPoolRun {
  CliRun cli;
  std::string dir;
  std::vector<std::string> traces;
};
inline NoPoolRun run_without_pool(const std::string& mode) {
  NoPoolRun r;
  r.dir = test::make_dir();
  r.cli = cli(
      {"run", "--simulate", "--no-pool", "-o", r.dir + "/np.%p.trace", "--", test::kProgs + "/golden_prog", mode});
  r.traces = test::traces_in(r.dir);
  return r;
}

// golden_prog MODE under the preload; its "line NAME N" output parsed.
struct Prog {
  test::ProgRun run;
  std::map<std::string, int> lines;
  std::string trace() const { return run.traces.empty() ? std::string() : run.traces[0]; }
};

inline Prog run_prog(const std::string& mode, std::vector<std::string> env = {}) {
  Prog p;
  p.run = test::run("golden_prog", {mode}, std::move(env));
  std::istringstream in(p.run.out);
  std::string word, name;
  int n = 0;
  while (in >> word >> name >> n)
    if (word == "line") p.lines[name] = n;
  return p;
}

// torch.cuda.memory_summary()'s _format_size / _format_count (torch/cuda/memory.py): the
// unit is chosen from pref (the row's "all" value) and the value integer-divided.
inline std::string torch_size(std::int64_t sz, std::int64_t pref) {
  const char* prefixes[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int p = 0;
  while (p < 5 && pref >= 768 * 1024) sz /= 1024, pref /= 1024, ++p;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%6lld %s", static_cast<long long>(sz), prefixes[p]);
  return buf;
}
inline std::string torch_count(std::int64_t n, std::int64_t pref) {
  const char* prefixes[] = {" ", "K", "M"};
  int p = 0;
  while (p < 2 && pref >= 750 * 1000) n /= 1000, pref /= 1000, ++p;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%7lld %s ", static_cast<long long>(n), prefixes[p]);
  return buf;
}

// One table row: " NAME (21 wide) | cur | peak | tot alloc | tot freed ".
inline std::string row(const std::string& name, const std::string& c1, const std::string& c2, const std::string& c3,
                       const std::string& c4) {
  char buf[256];
  std::snprintf(buf, sizeof buf, " %-21s | %s | %s | %s | %s ", name.c_str(), c1.c_str(), c2.c_str(), c3.c_str(),
                c4.c_str());
  return buf;
}

// The expected STAT object.
inline json stat(std::int64_t cur, std::int64_t peak, std::int64_t alloc, std::int64_t freed) {
  return {{"current", cur}, {"peak", peak}, {"allocated", alloc}, {"freed", freed}};
}
inline json drop_pools(json j) {
  j.erase("large_pool");
  j.erase("small_pool");
  return j;
}

// The innermost visible frame of a site.
inline const json& top_frame(const json& site) { return site.at("stack").at(0); }
inline std::string basename(const std::string& p) { return p.substr(p.rfind('/') + 1); }

}  // namespace gpuheap::golden
