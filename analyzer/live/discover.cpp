#include "analyzer/live/discover.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <set>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/base/safe_file.h"
#include "format/trace.h"

namespace gpuheap::live {

namespace {

constexpr unsigned char kZstdMagic[4] = {0x28, 0xB5, 0x2F, 0xFD};
constexpr std::size_t kMaxProcs = 4096;  // descendants of a PID looked at

// The bytes of a small file (/proc's report size 0: read to the end), at most `max`.
std::string read_small(const std::string& path, std::size_t max = 1u << 20) {
  std::string out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return out;
  char buf[4096];
  ssize_t n;
  while (out.size() < max && (n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}

bool is_digits(const std::string& s) {
  return !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(c); });
}

// A gpuheap trace: starts with the header's magic, or is a zstd stream (a finished trace
// `gpuheap run` compressed) whose name says .zst. Never TRACE.roll: a rolling window's next
// segment being written, renamed over TRACE once whole (its follower moves to it then).
bool looks_like_trace(const std::string& path) {
  if (path.size() > 5 && path.compare(path.size() - 5, 5, ".roll") == 0) return false;
  std::uint64_t size = 0;
  std::string why;
  int fd = open_regular(path, &size, &why);
  if (fd < 0) return false;
  unsigned char head[8] = {};
  ssize_t got = ::pread(fd, head, sizeof head, 0);
  ::close(fd);
  if (got == 8 && std::memcmp(head, format::kMagic, 8) == 0) return true;
  return got >= 4 && std::memcmp(head, kZstdMagic, 4) == 0 && path.size() > 4 &&
         path.compare(path.size() - 4, 4, ".zst") == 0;
}

std::string environ_value(pid_t pid, const std::string& name) {
  const std::string env = read_small(fmt::format("/proc/{}/environ", pid));
  const std::string key = name + "=";
  for (std::size_t at = 0; at < env.size();) {
    std::size_t end = env.find('\0', at);
    if (end == std::string::npos) end = env.size();
    if (env.compare(at, key.size(), key) == 0) return env.substr(at + key.size(), end - at - key.size());
    at = end + 1;
  }
  return {};
}

// The pid and its descendants, breadth first (the kernel's per-thread children lists).
std::vector<pid_t> with_descendants(pid_t pid) {
  std::vector<pid_t> out{pid};
  for (std::size_t i = 0; i < out.size() && out.size() < kMaxProcs; ++i) {
    const std::string task = fmt::format("/proc/{}/task", out[i]);
    DIR* d = ::opendir(task.c_str());
    if (!d) continue;
    while (dirent* e = ::readdir(d)) {
      if (!is_digits(e->d_name)) continue;
      std::string kids = read_small(task + "/" + e->d_name + "/children");
      for (std::size_t at = 0; at < kids.size();) {
        std::size_t sp = kids.find(' ', at);
        if (sp == std::string::npos) sp = kids.size();
        std::string w = kids.substr(at, sp - at);
        if (is_digits(w)) out.push_back(static_cast<pid_t>(std::stol(w)));
        at = sp + 1;
      }
    }
    ::closedir(d);
  }
  return out;
}

// The traces a process has open (traced with LD_PRELOAD, no `gpuheap run`).
std::vector<std::string> open_traces(pid_t pid) {
  std::vector<std::string> out;
  const std::string fds = fmt::format("/proc/{}/fd", pid);
  DIR* d = ::opendir(fds.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (!is_digits(e->d_name)) continue;
    char buf[PATH_MAX];
    ssize_t n = ::readlink((fds + "/" + e->d_name).c_str(), buf, sizeof buf - 1);
    if (n <= 0 || buf[0] != '/') continue;
    std::string p(buf, static_cast<std::size_t>(n));
    if (looks_like_trace(p)) out.push_back(p);
  }
  ::closedir(d);
  return out;
}

void resolve_pid(pid_t pid, Sources& s) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) throw UsageError(fmt::format("top: no process {}", pid));
  s.root = pid;
  const auto procs = with_descendants(pid);
  for (pid_t p : procs) {
    std::string list = environ_value(p, "GPUHEAP_PATH_FILE");
    struct stat st {};
    if (!list.empty() && ::lstat(list.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      s.path_list = list;
      return;
    }
  }
  for (pid_t p : procs)
    for (auto& t : open_traces(p)) s.files.push_back(t);
  if (s.files.empty())
    throw UsageError(
        fmt::format("top: process {} leads to no gpuheap trace (no `gpuheap run` path list in its environment or its "
                    "children's, no trace open)",
                    pid));
}

// The newest path list of this user's `gpuheap run`s (run.cpp make_path_list: a 0700
// directory gpuheap-run-XXXXXX under $TMPDIR or /tmp).
std::string newest_path_list() {
  std::string best;
  timespec best_t{};
  const char* td = std::getenv("TMPDIR");
  std::set<std::string> bases{std::string(td && *td ? td : "/tmp"), "/tmp"};
  for (const auto& base : bases) {
    DIR* d = ::opendir(base.c_str());
    if (!d) continue;
    while (dirent* e = ::readdir(d)) {
      if (std::strncmp(e->d_name, "gpuheap-run-", 12) != 0) continue;
      std::string list = base + "/" + e->d_name + "/paths";
      struct stat st {};
      if (::lstat(list.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::getuid()) continue;
      if (best.empty() || st.st_mtim.tv_sec > best_t.tv_sec ||
          (st.st_mtim.tv_sec == best_t.tv_sec && st.st_mtim.tv_nsec > best_t.tv_nsec))
        best = list, best_t = st.st_mtim;
    }
    ::closedir(d);
  }
  return best;
}

}  // namespace

// One line of the path list as the preload writes it (preload/record/outpath.h,
// append_to_path_file): `\n` a newline, `\\` a backslash; any other backslash
// is kept (a line of an older preload, which wrote paths as they were).
std::string path_list_entry(const std::string& line) {
  std::string out;
  for (std::size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\\' && i + 1 < line.size() && (line[i + 1] == 'n' || line[i + 1] == '\\'))
      out += line[++i] == 'n' ? '\n' : '\\';
    else out += line[i];
  }
  return out;
}

Sources resolve_targets(const std::vector<std::string>& targets) {
  Sources s;
  if (targets.empty()) {
    s.path_list = newest_path_list();
    if (s.path_list.empty())
      throw UsageError("top: no running `gpuheap run` of yours found; name its PID, a directory or the traces");
    return s;
  }
  for (const auto& t : targets) {
    struct stat st {};
    if (::stat(t.c_str(), &st) != 0) {
      if (is_digits(t)) resolve_pid(static_cast<pid_t>(std::stol(t)), s);
      else throw UsageError(fmt::format("top: {}: no such file, directory or process", t));
    } else if (S_ISDIR(st.st_mode)) {
      s.dirs.push_back(t);
    } else {
      s.files.push_back(t);
    }
  }
  return s;
}

std::vector<std::string> list_entries(Sources& s, std::vector<std::string>& found) {
  std::vector<std::string> failures;
  if (!s.path_list.empty()) {
    const std::string text = read_small(s.path_list, 64u << 20);
    std::size_t at = s.list_read;
    while (at < text.size()) {
      std::size_t nl = text.find('\n', at);
      if (nl == std::string::npos) break;  // a line is whole or not yet written
      std::string line = path_list_entry(text.substr(at, nl - at));
      at = nl + 1;
      if (line.empty()) continue;
      if (line[0] != '!') {
        found.push_back(line);
        continue;
      }
      std::size_t sp = line.find(' ');
      failures.push_back(fmt::format("tracing failed in process {}: {}", line.substr(1, sp - 1),
                                     sp == std::string::npos ? "" : line.substr(sp + 1)));
    }
    s.list_read = at;
  }
  for (const auto& dir : s.dirs) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) continue;
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') names.push_back(dir + "/" + e->d_name);
    ::closedir(d);
    std::sort(names.begin(), names.end());
    for (const auto& n : names)
      if (looks_like_trace(n)) found.push_back(n);
  }
  return failures;
}

bool sources_complete(const Sources& s) {
  if (s.root > 0) return process_gone(static_cast<std::uint32_t>(s.root));
  if (!s.path_list.empty()) {
    struct stat st {};
    return ::lstat(s.path_list.c_str(), &st) != 0;
  }
  return true;
}

std::string describe_sources(const Sources& s) {
  std::string out;
  if (!s.path_list.empty()) out = "run list " + s.path_list;
  for (const auto& d : s.dirs) out += (out.empty() ? "" : ", ") + std::string("dir ") + d;
  if (!s.files.empty()) out += (out.empty() ? "" : ", ") + fmt::format("{} trace file(s)", s.files.size());
  if (s.root > 0) out += fmt::format(" (pid {})", s.root);
  return out;
}

bool process_gone(std::uint32_t pid) {
  if (pid == 0 || pid > INT_MAX) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return true;
  const std::string stat = read_small(fmt::format("/proc/{}/stat", pid), 4096);
  const std::size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  const char state = stat[paren + 2];
  return state == 'Z' || state == 'X';
}

std::string this_host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return {};
  return buf;
}

}  // namespace gpuheap::live
