// The option table and parser (preload/core/options.h): every option with valid, invalid and
// boundary values, the single-value parsers, and README.md's variable table against the
// option table (names and defaults), so the two cannot drift.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "preload/core/options.h"

namespace d = gpuheap::preload;

namespace {

std::map<std::string, std::string> g_env;
std::vector<std::string> g_warnings;

const char* fake_getenv(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}
void collect(const char* line) { g_warnings.emplace_back(line); }

d::Settings parse(std::map<std::string, std::string> env) {
  g_env = std::move(env);
  g_warnings.clear();
  d::Settings s;
  int invalid = d::read_settings(&s, fake_getenv, collect);
  EXPECT_EQ(invalid, static_cast<int>(g_warnings.size()));
  return s;
}

// The numeric value an option landed in (booleans 0/1, durations in ns).
std::uint64_t value_of(const d::Settings& s, d::OptionId id) {
  using I = d::OptionId;
  switch (id) {
    case I::disable: return s.disable;
    case I::quiet: return s.quiet;
    case I::pool: return s.pool;
    case I::stacks: return s.stacks;
    case I::stack_depth: return static_cast<std::uint64_t>(s.stack_depth);
    case I::free_stacks: return s.free_stacks;
    case I::python_stacks: return s.python_stacks;
    case I::stack_cache: return s.stack_cache;
    case I::flush_ms: return s.flush_ns;
    case I::seal_us: return s.seal_ns;
    case I::strict_fences: return s.strict_fences;
    case I::unsafe_reuse: return s.unsafe_reuse;
    case I::release_threshold: return s.release_threshold;
    case I::aggregate: return s.aggregate;
    case I::follow_fork: return s.follow_fork;
    case I::output:
    case I::path_file:
    case I::buffer_mb:
    case I::limit:
    case I::follow_fork_root: break;
  }
  return 0;
}

constexpr std::uint64_t kUs = 1000, kMs = 1000 * kUs, kS = 1000 * kMs;

struct Case {
  const char* name;
  const char* value;
  bool valid;
  std::uint64_t expect;  // numeric options: the value used (the default when invalid)
};

// Every numeric option: valid spellings, boundaries on both sides, garbage.
const Case kCases[] = {
    // booleans (default 0)
    {"GPUHEAP_FREE_STACKS", "1", true, 1},
    {"GPUHEAP_FREE_STACKS", "on", true, 1},
    {"GPUHEAP_FREE_STACKS", "TRUE", true, 1},
    {"GPUHEAP_FREE_STACKS", "Yes", true, 1},
    {"GPUHEAP_FREE_STACKS", "0", true, 0},
    {"GPUHEAP_FREE_STACKS", "2", false, 0},
    {"GPUHEAP_FREE_STACKS", "enabled", false, 0},
    {"GPUHEAP_QUIET", "1", true, 1},
    {"GPUHEAP_QUIET", "yes", true, 1},
    {"GPUHEAP_QUIET", "oN", true, 1},
    {"GPUHEAP_QUIET", "no", true, 0},
    {"GPUHEAP_QUIET", "y", false, 0},
    {"GPUHEAP_QUIET", "-1", false, 0},
    {"GPUHEAP_STRICT_FENCES", "1", true, 1},
    {"GPUHEAP_STRICT_FENCES", "off", true, 0},
    {"GPUHEAP_STRICT_FENCES", "FALSE", true, 0},
    {"GPUHEAP_STRICT_FENCES", "01", false, 0},
    {"GPUHEAP_UNSAFE_REUSE", "true", true, 1},
    {"GPUHEAP_UNSAFE_REUSE", "no", true, 0},
    {"GPUHEAP_UNSAFE_REUSE", "maybe", false, 0},
    {"GPUHEAP_DISABLE", "yes", true, 1},
    {"GPUHEAP_DISABLE", "off", true, 0},
    {"GPUHEAP_DISABLE", "x", false, 0},
    // booleans (default 1)
    {"GPUHEAP_POOL", "off", true, 0},
    {"GPUHEAP_POOL", "No", true, 0},
    {"GPUHEAP_POOL", "1", true, 1},
    {"GPUHEAP_POOL", "nope", false, 1},
    {"GPUHEAP_STACKS", "off", true, 0},
    {"GPUHEAP_STACKS", "0", true, 0},
    {"GPUHEAP_STACKS", "false", true, 0},
    {"GPUHEAP_STACKS", " off ", true, 0},
    {"GPUHEAP_STACKS", "o", false, 1},
    {"GPUHEAP_PYTHON_STACKS", "0", true, 0},
    {"GPUHEAP_PYTHON_STACKS", "yes", true, 1},
    {"GPUHEAP_PYTHON_STACKS", "python", false, 1},
    {"GPUHEAP_STACK_CACHE", "0", true, 0},
    {"GPUHEAP_STACK_CACHE", "cache", false, 1},
    {"GPUHEAP_FOLLOW_FORK", "0", true, 0},
    {"GPUHEAP_FOLLOW_FORK", "OFF", true, 0},
    {"GPUHEAP_FOLLOW_FORK", "on", true, 1},
    {"GPUHEAP_FOLLOW_FORK", "10", false, 1},
    // integer 1..256
    {"GPUHEAP_STACK_DEPTH", "1", true, 1},
    {"GPUHEAP_STACK_DEPTH", "256", true, 256},
    {"GPUHEAP_STACK_DEPTH", "32", true, 32},
    {"GPUHEAP_STACK_DEPTH", "0", false, 64},
    {"GPUHEAP_STACK_DEPTH", "257", false, 64},
    {"GPUHEAP_STACK_DEPTH", "-5", false, 64},
    {"GPUHEAP_STACK_DEPTH", "12abc", false, 64},
    {"GPUHEAP_STACK_DEPTH", "99999999999999999999999", false, 64},
    // durations
    {"GPUHEAP_FLUSH_MS", "1", true, 1 * kMs},
    {"GPUHEAP_FLUSH_MS", "60000", true, 60 * kS},
    {"GPUHEAP_FLUSH_MS", "60s", true, 60 * kS},
    {"GPUHEAP_FLUSH_MS", "500us", false, 20 * kMs},
    {"GPUHEAP_FLUSH_MS", "1000us", true, 1 * kMs},
    {"GPUHEAP_FLUSH_MS", "0", false, 20 * kMs},
    {"GPUHEAP_FLUSH_MS", "60001", false, 20 * kMs},
    {"GPUHEAP_FLUSH_MS", "fast", false, 20 * kMs},
    {"GPUHEAP_FLUSH_MS", "1.5", false, 20 * kMs},
    {"GPUHEAP_FLUSH_MS", "5min", false, 20 * kMs},
    {"GPUHEAP_SEAL_US", "0", true, 0},
    {"GPUHEAP_SEAL_US", "5000000", true, 5 * kS},
    {"GPUHEAP_SEAL_US", "2ms", true, 2 * kMs},
    {"GPUHEAP_SEAL_US", "3600s", true, 3600 * kS},
    {"GPUHEAP_SEAL_US", "3601s", false, 200 * kUs},
    {"GPUHEAP_SEAL_US", "abc", false, 200 * kUs},
    {"GPUHEAP_SEAL_US", "-1", false, 200 * kUs},
    {"GPUHEAP_SEAL_US", "18446744073709551615", false, 200 * kUs},
    {"GPUHEAP_SEAL_US", "100NS", true, 100},
    // size (default none = 0)
    {"GPUHEAP_RELEASE_THRESHOLD", "1b", true, 1},
    {"GPUHEAP_RELEASE_THRESHOLD", "1", false, 0},  // a unit is required, as in GPUHEAP_LIMIT
    {"GPUHEAP_RELEASE_THRESHOLD", "0", true, 0},
    {"GPUHEAP_RELEASE_THRESHOLD", "512MiB", true, 512ull << 20},
    {"GPUHEAP_RELEASE_THRESHOLD", "2GB", true, 2'000'000'000},
    {"GPUHEAP_RELEASE_THRESHOLD", "1.5g", true, 3ull << 29},
    {"GPUHEAP_RELEASE_THRESHOLD", "8gib", true, 8ull << 30},
    {"GPUHEAP_RELEASE_THRESHOLD", "-1", false, 0},
    {"GPUHEAP_RELEASE_THRESHOLD", "10 parsecs", false, 0},
    {"GPUHEAP_RELEASE_THRESHOLD", "inf", false, 0},
    {"GPUHEAP_RELEASE_THRESHOLD", "99999999TiB", false, 0},
    {"GPUHEAP_AGGREGATE", "64MiB", true, 64ull << 20},
    {"GPUHEAP_AGGREGATE", "256KiB", true, 256ull << 10},
    {"GPUHEAP_AGGREGATE", "0", true, 0},
    {"GPUHEAP_AGGREGATE", "64", false, 0},  // a unit is required
    {"GPUHEAP_AGGREGATE", "lots", false, 0},
};

}  // namespace

TEST(Options, TableIsComplete) {
  std::set<std::string> names;
  for (const auto& s : d::kOptionTable) {
    EXPECT_EQ(std::strncmp(s.name, "GPUHEAP_", 8), 0) << s.name;
    EXPECT_TRUE(names.insert(s.name).second) << "twice: " << s.name;
    EXPECT_EQ(d::find_option(s.name), &s);
    EXPECT_TRUE(s.doc && *s.doc && s.default_text && *s.default_text) << s.name;
  }
  // 18th: GPUHEAP_FOLLOW_FORK_ROOT (issue #17), 19th: GPUHEAP_STACK_CACHE (#36), 20th: GPUHEAP_AGGREGATE (#36)
  EXPECT_EQ(names.size(), 20u);
  EXPECT_EQ(d::kOptionTable[0].id, d::OptionId::disable);  // read first: nothing else when set
}

TEST(Options, UnsetAndEmptyGiveTheDefaults) {
  std::map<std::string, std::string> empty;
  for (const auto& s : d::kOptionTable) empty[s.name] = "";
  for (const auto& env : {std::map<std::string, std::string>{}, empty}) {
    d::Settings s = parse(env);
    EXPECT_TRUE(g_warnings.empty());
    for (const auto& o : d::kOptionTable) EXPECT_EQ(value_of(s, o.id), o.def) << o.name;
    EXPECT_EQ(s.output, nullptr);
    EXPECT_STREQ(s.path_file, "");
    EXPECT_STREQ(s.limit, "");
  }
}

TEST(Options, DefaultsInTableMatchTheStruct) {
  d::Settings s;
  for (const auto& o : d::kOptionTable) EXPECT_EQ(value_of(s, o.id), o.def) << o.name;
}

TEST(Options, EveryNumericOptionValidInvalidAndBoundary) {
  std::set<std::string> valid_seen, invalid_seen;
  for (const Case& c : kCases) {
    const d::OptionSpec* spec = d::find_option(c.name);
    ASSERT_TRUE(spec) << c.name;
    d::Settings s = parse({{c.name, c.value}});
    EXPECT_EQ(value_of(s, spec->id), c.expect) << c.name << "=" << c.value;
    if (c.valid) {
      EXPECT_TRUE(g_warnings.empty()) << c.name << "=" << c.value << ": " << (g_warnings.empty() ? "" : g_warnings[0]);
      valid_seen.insert(c.name);
    } else {
      ASSERT_EQ(g_warnings.size(), 1u) << c.name << "=" << c.value;
      // One line naming the variable, the value and what is used instead.
      EXPECT_NE(g_warnings[0].find(c.name), std::string::npos) << g_warnings[0];
      EXPECT_NE(g_warnings[0].find(std::string("\"") + c.value + "\""), std::string::npos) << g_warnings[0];
      EXPECT_NE(g_warnings[0].find(std::string("using the default ") + spec->default_text), std::string::npos)
          << g_warnings[0];
      EXPECT_EQ(g_warnings[0].find('\n'), std::string::npos);
      invalid_seen.insert(c.name);
    }
  }
  // Every option with a value to parse has both kinds of case above or below.
  for (const auto& o : d::kOptionTable) {
    if (o.type == d::OptionType::text || o.type == d::OptionType::limit || o.type == d::OptionType::ignored) continue;
    EXPECT_TRUE(valid_seen.count(o.name)) << o.name;
    EXPECT_TRUE(invalid_seen.count(o.name)) << o.name;
  }
}

TEST(Options, DisableStopsReadingTheRest) {
  d::Settings s = parse({{"GPUHEAP_DISABLE", "1"}, {"GPUHEAP_POOL", "bogus"}, {"GPUHEAP_STACKS", "0"}});
  EXPECT_TRUE(s.disable);
  EXPECT_TRUE(g_warnings.empty());
  EXPECT_TRUE(s.stacks);  // not read
  s = parse({{"GPUHEAP_DISABLE", "0"}, {"GPUHEAP_POOL", "bogus"}, {"GPUHEAP_STACKS", "0"}});
  EXPECT_FALSE(s.disable);
  EXPECT_EQ(g_warnings.size(), 1u);
  EXPECT_FALSE(s.stacks);
}

TEST(Options, SeveralInvalidValuesOneWarningEach) {
  d::Settings s = parse({{"GPUHEAP_POOL", "x"}, {"GPUHEAP_SEAL_US", "y"}, {"GPUHEAP_LIMIT", "z"}});
  ASSERT_EQ(g_warnings.size(), 3u);
  EXPECT_TRUE(s.pool);
  EXPECT_EQ(s.seal_ns, 200 * kUs);
}

TEST(Options, Output) {
  d::Settings s = parse({{"GPUHEAP_OUTPUT", "/tmp/x.%p.trace"}});
  ASSERT_NE(s.output, nullptr);
  EXPECT_STREQ(s.output, "/tmp/x.%p.trace");
  // Not shortened here: the pattern's expansion reports one that is too long (recorder.cpp).
  std::string big(5000, 'a');
  s = parse({{"GPUHEAP_OUTPUT", big}});
  EXPECT_TRUE(g_warnings.empty());
  EXPECT_EQ(std::strlen(s.output), 5000u);
}

TEST(Options, PathFile) {
  d::Settings s = parse({{"GPUHEAP_PATH_FILE", "/tmp/list"}});
  EXPECT_STREQ(s.path_file, "/tmp/list");
  std::string edge(4095, 'p');  // the longest that fits
  s = parse({{"GPUHEAP_PATH_FILE", edge}});
  EXPECT_TRUE(g_warnings.empty());
  EXPECT_EQ(s.path_file, edge);
  s = parse({{"GPUHEAP_PATH_FILE", edge + "p"}});  // a cut name would be another file: none
  ASSERT_EQ(g_warnings.size(), 1u);
  EXPECT_NE(g_warnings[0].find("GPUHEAP_PATH_FILE=\"ppp"), std::string::npos);
  EXPECT_NE(g_warnings[0].find("...\""), std::string::npos);  // the value is shortened
  EXPECT_LT(g_warnings[0].size(), 400u);
  EXPECT_STREQ(s.path_file, "");
}

TEST(Options, Limit) {
  for (const char* ok : {"8GiB", "0.5", "1.0", ".25", "0:8GiB,1:12GiB", "63:1b", " 2gb ", "4096b", "1:0.5"}) {
    d::Settings s = parse({{"GPUHEAP_LIMIT", ok}});
    EXPECT_TRUE(g_warnings.empty()) << ok;
    EXPECT_STREQ(s.limit, ok);
  }
  // A number without a unit must be a fraction with a point in (0, 1]: "1.5" was a 1-byte
  // cap and "2" a 2-byte cap before round 2 (issue 18).
  for (const char* bad : {"lots", "0", "64:1GiB", "-1GiB", "0:", "1.5x", "nan", "0.0", "1.5", "2", "1", "63:1",
                          "0:8GiB,3", "1.0001", "5.", "inf"}) {
    d::Settings s = parse({{"GPUHEAP_LIMIT", bad}});
    ASSERT_EQ(g_warnings.size(), 1u) << bad;
    EXPECT_NE(g_warnings[0].find("GPUHEAP_LIMIT"), std::string::npos);
    EXPECT_NE(g_warnings[0].find("using the default none (no cap)"), std::string::npos) << g_warnings[0];
    EXPECT_STREQ(s.limit, "");
  }
  d::Settings s = parse({{"GPUHEAP_LIMIT", std::string(1020, '1') + "GiB"}});  // longer than kept
  EXPECT_EQ(g_warnings.size(), 1u);
  EXPECT_STREQ(s.limit, "");
}

TEST(Options, BufferMbIsAcceptedAndIgnored) {
  for (const char* v : {"2", "256", "0", "garbage"}) {
    parse({{"GPUHEAP_BUFFER_MB", v}});
    EXPECT_TRUE(g_warnings.empty()) << v;
  }
}

TEST(Options, WarningMasksControlCharacters) {
  parse({{"GPUHEAP_POOL", "a\nb\x1b"}});
  ASSERT_EQ(g_warnings.size(), 1u);
  EXPECT_NE(g_warnings[0].find("\"a?b?\""), std::string::npos) << g_warnings[0];
}

TEST(Options, ParseBool) {
  bool b = false;
  for (const char* t : {"1", "true", "TRUE", "True", "yes", "YES", "on", "On"}) {
    b = false;
    EXPECT_TRUE(gpuheap::common::parse_bool(t, &b) && b) << t;
  }
  for (const char* f : {"0", "false", "FALSE", "no", "No", "off", "OFF"}) {
    b = true;
    EXPECT_TRUE(gpuheap::common::parse_bool(f, &b) && !b) << f;
  }
  for (const char* x : {"", "2", "t", "f", "onn", "yes please", " 1"})
    EXPECT_FALSE(gpuheap::common::parse_bool(x, &b)) << x;
}

TEST(Options, ParseSizeAndDuration) {
  std::uint64_t v = 0;
  EXPECT_TRUE(gpuheap::common::parse_size("1k", &v) && v == 1024);
  EXPECT_TRUE(gpuheap::common::parse_size("1KB", &v) && v == 1000);
  EXPECT_TRUE(gpuheap::common::parse_size("3TiB", &v) && v == 3ull << 40);
  EXPECT_TRUE(gpuheap::common::parse_size("7b", &v) && v == 7);
  EXPECT_FALSE(gpuheap::common::parse_size("", &v));
  EXPECT_FALSE(gpuheap::common::parse_size("+5", &v));
  EXPECT_FALSE(gpuheap::common::parse_size("5 k", &v));
  EXPECT_TRUE(gpuheap::common::parse_duration("7", kMs, &v) && v == 7 * kMs);
  EXPECT_TRUE(gpuheap::common::parse_duration("7S", kMs, &v) && v == 7 * kS);
  EXPECT_TRUE(gpuheap::common::parse_duration("7us", kMs, &v) && v == 7 * kUs);
  EXPECT_FALSE(gpuheap::common::parse_duration("", kMs, &v));
  EXPECT_FALSE(gpuheap::common::parse_duration("ms", kMs, &v));
  EXPECT_FALSE(gpuheap::common::parse_duration("20000000000s", kMs, &v));  // overflows u64 ns
  EXPECT_TRUE(gpuheap::common::parse_uint("18446744073709551615", &v) && v == UINT64_MAX);
  EXPECT_FALSE(gpuheap::common::parse_uint("18446744073709551616", &v));
}

// README.md's "Environment variables it reads" table lists exactly the option table's
// names, with the same defaults.
TEST(Options, ReadmeTableMatchesOptionTable) {
  std::ifstream in(std::string(GPUHEAP_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in) << "README.md";
  std::map<std::string, std::string> readme;
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("| variable | default |", 0) == 0) in_table = true;
    else if (in_table && line.rfind("|", 0) != 0) break;
    if (!in_table || line.rfind("| `GPUHEAP_", 0) != 0) continue;
    std::vector<std::string> cols;
    std::stringstream ss(line.substr(1));
    for (std::string c; std::getline(ss, c, '|');) {
      while (!c.empty() && c.front() == ' ') c.erase(0, 1);
      while (!c.empty() && c.back() == ' ') c.pop_back();
      if (c.size() >= 2 && c.front() == '`' && c.back() == '`') c = c.substr(1, c.size() - 2);
      cols.push_back(c);
    }
    ASSERT_GE(cols.size(), 3u) << line;
    EXPECT_TRUE(readme.emplace(cols[0], cols[1]).second) << "twice in README: " << cols[0];
  }
  ASSERT_FALSE(readme.empty()) << "no variable table found in README.md";
  for (const auto& o : d::kOptionTable) {
    auto it = readme.find(o.name);
    if (it == readme.end()) {
      ADD_FAILURE() << o.name << " is missing from README.md's table";
      continue;
    }
    EXPECT_EQ(it->second, o.default_text) << o.name;
  }
  for (const auto& [name, def] : readme) EXPECT_TRUE(d::find_option(name.c_str())) << name << " is not an option";
}

// The job's rank (format v4 identity record), from the launcher's variables: torchrun's
// first, then Open MPI, PMI, Slurm; the local rank and size from the same family only.
TEST(Options, RankIdentityFromTheLauncher) {
  using gpuheap::format::RankSource;
  auto s = parse({{"RANK", "3"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"}, {"SLURM_PROCID", "0"}});
  ASSERT_TRUE(s.have_identity);
  EXPECT_EQ(s.identity.rank, 3);
  EXPECT_EQ(s.identity.local_rank, 1);
  EXPECT_EQ(s.identity.world_size, 8);
  EXPECT_EQ(s.identity.source, RankSource::torchrun);
  EXPECT_TRUE(g_warnings.empty());

  s = parse({{"SLURM_PROCID", "5"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS", "6"}, {"LOCAL_RANK", "4"}});
  ASSERT_TRUE(s.have_identity);
  EXPECT_EQ(s.identity.rank, 5);
  EXPECT_EQ(s.identity.local_rank, 1);
  EXPECT_EQ(s.identity.world_size, 6);
  EXPECT_EQ(s.identity.source, RankSource::slurm);

  s = parse({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"PMI_RANK", "9"}});
  ASSERT_TRUE(s.have_identity);
  EXPECT_EQ(s.identity.rank, 2);
  EXPECT_EQ(s.identity.local_rank, -1);
  EXPECT_EQ(s.identity.world_size, 4);
  EXPECT_EQ(s.identity.source, RankSource::ompi);

  s = parse({{"PMI_RANK", "9"}, {"PMI_SIZE", "x"}, {"MPI_LOCALRANKID", "0"}});
  ASSERT_TRUE(s.have_identity);
  EXPECT_EQ(s.identity.rank, 9);
  EXPECT_EQ(s.identity.local_rank, 0);
  EXPECT_EQ(s.identity.world_size, -1);  // not a number: unknown
  EXPECT_EQ(s.identity.source, RankSource::pmi);

  // Not a rank: a later family's, or none (and never a warning: the variables are the launcher's).
  s = parse({{"RANK", "-1"}, {"SLURM_PROCID", "7"}});
  ASSERT_TRUE(s.have_identity);
  EXPECT_EQ(s.identity.rank, 7);
  EXPECT_EQ(s.identity.source, RankSource::slurm);
  EXPECT_FALSE(parse({{"RANK", "2147483648"}}).have_identity);
  EXPECT_FALSE(parse({{"RANK", ""}, {"LOCAL_RANK", "0"}}).have_identity);
  EXPECT_FALSE(parse({}).have_identity);
  EXPECT_FALSE(parse({{"GPUHEAP_DISABLE", "1"}, {"RANK", "0"}}).have_identity);
  EXPECT_TRUE(g_warnings.empty());
}
