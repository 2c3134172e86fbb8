// Output path patterns and exclusive, never-clobbering, never-following file creation.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "preload/core/stderr_line.h"
#include "preload/record/outpath.h"

using gpuheap::common::absolute_output_pattern;
using gpuheap::common::expand_output_pattern;
using gpuheap::common::OutpathVars;
using gpuheap::preload::create_trace_file;
using gpuheap::preload::current_outpath_vars;

namespace {

std::string expand(const char* pattern, const OutpathVars& v) {
  char out[512];
  long n = expand_output_pattern(pattern, v, out, sizeof out);
  EXPECT_GE(n, 0);
  EXPECT_EQ(static_cast<std::size_t>(n), std::string(out).size());
  return out;
}

struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/gpuheap-outpath-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
};

OutpathVars vars(const char* rank) {
  OutpathVars v;
  v.pid = 4242, v.hostname = "node7", v.rank = rank, v.program = "python3";
  return v;
}

}  // namespace

TEST(Outpath, EveryConversion) {
  EXPECT_EQ(expand("t.%p.trace", vars("3")), "t.4242.trace");
  EXPECT_EQ(expand("%h-%r-%n", vars("3")), "node7-3-python3");
  EXPECT_EQ(expand("/x/%n.%h.%p.%r.trace", vars("12")), "/x/python3.node7.4242.12.trace");
  EXPECT_EQ(expand("%p%p", vars(nullptr)), "42424242");
}

TEST(Outpath, DefaultPattern) {
  EXPECT_EQ(expand(nullptr, vars(nullptr)), "./gpuheap.python3.4242.trace");
  EXPECT_EQ(expand("", vars(nullptr)), "./gpuheap.python3.4242.trace");
}

TEST(Outpath, PercentLiteralAndUnknownConversions) {
  EXPECT_EQ(expand("100%%.%p", vars(nullptr)), "100%.4242");
  EXPECT_EQ(expand("%%p", vars(nullptr)), "%p");
  EXPECT_EQ(expand("a%xb", vars(nullptr)), "a%xb");
  EXPECT_EQ(expand("end%", vars(nullptr)), "end%");
  EXPECT_EQ(expand("%%%p%", vars(nullptr)), "%4242%");
}

TEST(Outpath, RankSetAndUnset) {
  EXPECT_EQ(expand("r%r.trace", vars("0")), "r0.trace");
  EXPECT_EQ(expand("r%r.trace", vars(nullptr)), "r.trace");
  EXPECT_EQ(expand("r%r.trace", vars("")), "r.trace");
}

TEST(Outpath, SubstitutedValuesCannotChangeDirectory) {
  EXPECT_EQ(expand("/t/%r.trace", vars("../../etc/x")), "/t/.._.._etc_x.trace");
}

TEST(Outpath, TooLongFails) {
  char out[8];
  EXPECT_EQ(expand_output_pattern("abcdefgh", vars(nullptr), out, sizeof out), -1);
  EXPECT_EQ(expand_output_pattern("abcdefg", vars(nullptr), out, sizeof out), 7);
  EXPECT_EQ(expand_output_pattern("%p%p", vars(nullptr), out, sizeof out), -1);
}

TEST(Outpath, CurrentProcessVars) {
  char host[256], prog[256];
  OutpathVars v;
  setenv("RANK", "5", 1);
  current_outpath_vars(&v, host, sizeof host, prog, sizeof prog);
  EXPECT_EQ(v.pid, static_cast<long>(getpid()));
  EXPECT_STREQ(v.rank, "5");
  EXPECT_STREQ(v.program, "test_outpath");
  char h[256];
  gethostname(h, sizeof h);
  EXPECT_STREQ(v.hostname, h);
  unsetenv("RANK");
  current_outpath_vars(&v, host, sizeof host, prog, sizeof prog);
  EXPECT_EQ(v.rank, nullptr);
}

TEST(Outpath, ExistingFileGetsNumericSuffix) {
  TempDir d;
  std::string p = d.path + "/gpuheap.x.7.trace";
  char got[512];
  int fd1 = create_trace_file(p.c_str(), got, sizeof got);
  ASSERT_GE(fd1, 0);
  EXPECT_EQ(std::string(got), p);
  int fd2 = create_trace_file(p.c_str(), got, sizeof got);
  ASSERT_GE(fd2, 0);
  EXPECT_EQ(std::string(got), d.path + "/gpuheap.x.7.1.trace");
  int fd3 = create_trace_file(p.c_str(), got, sizeof got);
  ASSERT_GE(fd3, 0);
  EXPECT_EQ(std::string(got), d.path + "/gpuheap.x.7.2.trace");
  // The first file was not clobbered: still ours, still writable by fd1.
  ASSERT_EQ(write(fd1, "abc", 3), 3);
  struct stat st;
  ASSERT_EQ(stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 3);
  close(fd1), close(fd2), close(fd3);
  // No extension: ".N" is appended. A dot-file's leading dot is not an extension.
  std::string q = d.path + "/noext";
  ASSERT_GE(fd1 = create_trace_file(q.c_str(), got, sizeof got), 0);
  ASSERT_GE(fd2 = create_trace_file(q.c_str(), got, sizeof got), 0);
  EXPECT_EQ(std::string(got), q + ".1");
  close(fd1), close(fd2);
  std::string h = d.path + "/.hidden";
  ASSERT_GE(fd1 = create_trace_file(h.c_str(), got, sizeof got), 0);
  ASSERT_GE(fd2 = create_trace_file(h.c_str(), got, sizeof got), 0);
  EXPECT_EQ(std::string(got), h + ".1");
  close(fd1), close(fd2);
}

TEST(Outpath, SymlinkIsNeverFollowed) {
  TempDir d;
  std::string target = d.path + "/victim";
  int t = open(target.c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(t, 0);
  ASSERT_EQ(write(t, "keep", 4), 4);
  close(t);
  std::string link = d.path + "/gpuheap.trace";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  std::string dangling = d.path + "/dangling.trace";
  ASSERT_EQ(symlink((d.path + "/nowhere").c_str(), dangling.c_str()), 0);
  char got[512];
  int fd = create_trace_file(link.c_str(), got, sizeof got);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(std::string(got), d.path + "/gpuheap.1.trace");
  ASSERT_EQ(write(fd, "new", 3), 3);
  close(fd);
  struct stat st;
  ASSERT_EQ(stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 4) << "the symlink's target was written";
  // A dangling symlink must not create its target either.
  fd = create_trace_file(dangling.c_str(), got, sizeof got);
  ASSERT_GE(fd, 0);
  close(fd);
  EXPECT_EQ(std::string(got), d.path + "/dangling.1.trace");
  EXPECT_NE(access((d.path + "/nowhere").c_str(), F_OK), 0);
}

TEST(Outpath, ModeIs0600WhateverTheUmask) {
  TempDir d;
  for (mode_t mask : {022, 0, 077, 0277}) {
    mode_t old = umask(mask);
    std::string p = d.path + "/m" + std::to_string(mask) + ".trace";
    char got[512];
    int fd = create_trace_file(p.c_str(), got, sizeof got);
    umask(old);
    ASSERT_GE(fd, 0);
    struct stat st;
    ASSERT_EQ(fstat(fd, &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u) << "umask " << mask;
    close(fd);
  }
}

TEST(Outpath, MissingDirectoryReportsErrno) {
  char got[512];
  EXPECT_EQ(create_trace_file("/nonexistent-gpuheap-dir/x.trace", got, sizeof got), -ENOENT);
}

// Issue #17: a relative pattern is resolved once against the starting directory, whose '%'
// must stay literal through the later expansion.
TEST(Outpath, AbsolutePatternKeepsTheDirectoryLiteral) {
  char out[256];
  EXPECT_EQ(absolute_output_pattern("t.%p.trace", "/w/d", out, sizeof out), 15);
  EXPECT_STREQ(out, "/w/d/t.%p.trace");
  EXPECT_GT(absolute_output_pattern(nullptr, "/w/", out, sizeof out), 0);
  EXPECT_STREQ(out, "/w/gpuheap.%n.%p.trace");  // the default, "./" dropped
  EXPECT_GT(absolute_output_pattern("/abs/%p", "/w", out, sizeof out), 0);
  EXPECT_STREQ(out, "/abs/%p");
  EXPECT_GT(absolute_output_pattern("x.%p", "/a/100%p", out, sizeof out), 0);
  EXPECT_STREQ(out, "/a/100%%p/x.%p");
  OutpathVars v;
  v.pid = 7;
  char expanded[256];
  ASSERT_GT(expand_output_pattern(out, v, expanded, sizeof expanded), 0);
  EXPECT_STREQ(expanded, "/a/100%p/x.7");
  EXPECT_EQ(absolute_output_pattern("x", "relative", out, sizeof out), -1);
  EXPECT_EQ(absolute_output_pattern("x.trace", "/very/long/dir", out, 8), -1);
  EXPECT_STREQ(out, "");
}

// The path list stays one entry a line whatever a path holds (issue 33): a newline is
// written \n and a backslash \\ (gpuheap run decodes both); a line that would not fit whole is
// not written at all. Escaped, the preload's messages stay one line too (append_escaped).
TEST(Outpath, PathListEscapesNewlinesAndBackslashes) {
  TempDir d;
  std::string list = d.path + "/paths";
  int fd = open(list.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_TRUE(gpuheap::preload::append_to_path_file(list.c_str(), "", "/t/two\nlines\\x.trace"));
  ASSERT_TRUE(gpuheap::preload::append_to_path_file(list.c_str(), "!12 ", "plain"));
  EXPECT_FALSE(gpuheap::preload::append_to_path_file(list.c_str(), "", std::string(2200, '\n').c_str()));
  char buf[256] = {};
  fd = open(list.c_str(), O_RDONLY);
  ASSERT_GT(read(fd, buf, sizeof buf - 1), 0);
  close(fd);
  EXPECT_STREQ(buf, "/t/two\\nlines\\\\x.trace\n!12 plain\n");
  char line[32];
  std::size_t n = gpuheap::preload::append_escaped(line, sizeof line, 0, "a\nb\\c\x1b\t");
  EXPECT_EQ(std::string(line, n), "a\\nb\\\\c\\x1b\\t");
  n = gpuheap::preload::append_escaped(line, 6, 0, "abcd\n");  // "\n" does not fit whole: cut before it
  EXPECT_EQ(std::string(line, n), "abcd");
}
