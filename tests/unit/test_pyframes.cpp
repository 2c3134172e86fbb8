// analyzer/symbolize/pyframes.cpp: the line of a Python frame from its code object's co_linetable.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "analyzer/symbolize/pyframes.h"

namespace gpuheap {
namespace {

std::string unhex(const std::string& h) {
  std::string out;
  if (h == "-") return out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

// The running python3's location tables (3.11+ format) against its own co_lines().
TEST(PyLines, MatchTheInterpretersOwnAnswerForEveryCodeUnit) {
  std::string cmd = std::string(PYTHON3_EXE) + " " + PYFRAMES_DATA + "/lines.py";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[65536];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  std::istringstream in(out);
  std::string word;
  int major = 0, minor = 0;
  ASSERT_TRUE(in >> word && word == "python");
  ASSERT_EQ(std::sscanf((in >> word, word).c_str(), "%d.%d", &major, &minor), 2);
  if (minor < 11) GTEST_SKIP() << "python3 is 3." << minor << ": this test needs the 3.11+ location table";
  std::string line;
  std::getline(in, line);
  std::size_t codes = 0, units = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    int first = 0;
    std::string table;
    ls >> first >> table;
    std::string t = unhex(table);
    std::uint32_t u = 0;
    for (int want; ls >> want; ++u)
      ASSERT_EQ(py_line(minor, first, t, u), want) << "code at line " << first << ", unit " << u << ": " << table;
    ++codes, units += u;
  }
  EXPECT_GE(codes, 15u);
  EXPECT_GT(units, 1000u);
}

// 3.10's table: (address delta in bytes, signed line delta) pairs, -128 = no line, a zero
// line delta continuing the line. Constructed after CPython 3.10's Objects/lnotab_notes.txt.
TEST(PyLines, Python310AddressLinePairs) {
  const std::string t{'\x06', '\x01', '\x04', '\x00', '\x02', '\x02', '\x08', '\x80', '\x04', '\xff'};
  const int first = 10;
  // bytes [0,6) -> 11, [6,10) -> 11, [10,12) -> 13, [12,20) none, [20,24) -> 12; lasti is in
  // code units (2 bytes).
  const int want[] = {11, 11, 11, 11, 11, 13, 0, 0, 0, 0, 12, 12, 0};
  for (std::uint32_t u = 0; u < sizeof want / sizeof *want; ++u) EXPECT_EQ(py_line(10, first, t, u), want[u]) << u;
}

// 3.11+ entries built by hand: each code's line delta rule, and entry lengths.
TEST(PyLines, LocationTableCodes) {
  std::string t;
  t += '\xf0', t += '\x02', t += '\x00', t += '\x00', t += '\x00';  // long form (14), len 1: +1 (svarint 2)
  t += '\xe9', t += '\x04';                                         // no-column (13), len 2: +2
  t += '\xe2', t += '\x01', t += '\x05';                            // one-line (12: +2), len 3
  t += '\x83', t += '\x07';                                         // short form (0), len 4: same line
  t += '\xf8';                                                      // no location (15), len 1
  t += '\xe8', t += '\x03';                                         // no-column, len 1: svarint 3 = -1
  const int first = 100;
  // units: 0 -> 101; 1-2 -> 103; 3-5 -> 105; 6-9 -> 105; 10 none; 11 -> 104
  const int want[] = {101, 103, 103, 105, 105, 105, 105, 105, 105, 105, 0, 104, 0};
  for (int minor : {11, 12, 13})
    for (std::uint32_t u = 0; u < sizeof want / sizeof *want; ++u) EXPECT_EQ(py_line(minor, first, t, u), want[u]) << u;
}

TEST(PyLines, NotStartedFrameIsItsFirstLineAndDamageIsNoLine) {
  EXPECT_EQ(py_line(12, 42, "", format::kPyNoLasti), 42);
  EXPECT_EQ(py_line(12, 42, "", 0), 0);
  EXPECT_EQ(py_line(12, 42, std::string("\x01\x02", 2), 0), 0);        // not at an entry
  EXPECT_EQ(py_line(12, 42, std::string("\xf0\x7f", 2), 0), 42 - 31);  // varint cut short: no overread
  EXPECT_EQ(py_line(10, 42, std::string("\x04", 1), 0), 0);            // odd-length 3.10 table
}

TEST(PyLines, FramesNameCodeRecordsAndUnknownIds) {
  std::unordered_map<std::uint32_t, PyCode> codes;
  codes[3] = PyCode{3, 12, 7, "/m/model.py", "Net.forward", std::string("\xd8\x02", 2)};
  Frame f = py_frame_of(codes, format::py_frame(3, 0));
  EXPECT_EQ(f.function, "Net.forward");
  EXPECT_EQ(f.file, "/m/model.py");
  EXPECT_EQ(f.line, 8);
  EXPECT_EQ(f.module, "python");
  EXPECT_EQ(py_frame_of(codes, format::py_frame(4, 0)).function, "<unknown Python code 4>");
  Frame native;
  native.module = "/usr/lib/x86_64-linux-gnu/libpython3.12.so.1.0";
  EXPECT_TRUE(is_interpreter_frame(native));
  native.module = "/opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_python.so";
  EXPECT_FALSE(is_interpreter_frame(native));
}

}  // namespace
}  // namespace gpuheap
