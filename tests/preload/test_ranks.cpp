// Ranks on the simulated runtime (issue 35): processes started as a launcher starts them
// (torchrun's RANK/LOCAL_RANK/WORLD_SIZE, srun's SLURM_*) write an identity record right
// after their process record, and `gpuheap summary` shows them in its per-rank table and
// selects them with --rank.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/preload/run_prog.h"
#include "tests/preload/trace_file.h"

using namespace gpuheap::test;

namespace {

// The second record of the trace, where the identity record goes, and whether it is one.
struct Second {
  bool identity = false;
  gpuheap::format::IdentityRecord id;
};
Second second_record(const std::string& path) {
  TraceFile t = load_trace(path);
  Second s;
  EXPECT_TRUE(t.ok && t.process_first) << path;
  std::size_t n = 0;
  walk_records(t.bytes.data(), t.bytes.size(), gpuheap::format::kFileHeaderSize, [&](const gpuheap::format::Record& r) {
    if (n++ == 1 && r.type == gpuheap::format::RecordType::identity) s.identity = true, s.id = r.identity;
  });
  return s;
}

// No launcher variable: empty ones come first in the child's environment (getenv returns
// the first), whatever the test's own environment holds.
const std::vector<std::string> kNoLauncher = {"RANK=", "OMPI_COMM_WORLD_RANK=", "PMI_RANK=", "SLURM_PROCID="};

std::string one_trace(std::vector<std::string> env) {
  auto r = run("prog_api", {}, std::move(env));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.traces.size(), 1u) << r.err;
  return r.traces.empty() ? std::string() : r.traces[0];
}

CmdRun cli(const std::string& args) { return run_cmd("env -u LD_PRELOAD " + kBuild + "/gpuheap " + args + " 2>&1"); }

// Two ranks of one job, each holding 40 MiB on its device 0 at the same time: rank 0 on
// host_a allocates and waits; rank 1 on host_b runs whole meanwhile; then rank 0 frees.
// The hostnames come from the fake_hostname shim. Returns "TRACE0 TRACE1".
std::string two_ranks(const std::string& host_a, const std::string& host_b) {
  const std::string shim = "LD_PRELOAD=" + kProgs + "/libfake_hostname.so";
  const std::string go = make_dir() + "/go";
  ProgRun b;
  auto a = run_with(
      "prog_hold", {"40", go}, {shim, "FAKE_HOSTNAME=" + host_a, "RANK=0", "LOCAL_RANK=0", "WORLD_SIZE=2"}, true,
      [&](pid_t, int out) {
        std::string line;  // rank 0 holds its memory once it said so
        char c;
        while (line != "held" && read(out, &c, 1) == 1) line = c == '\n' ? line : line + c;
        b = run("prog_hold", {"40"}, {shim, "FAKE_HOSTNAME=" + host_b, "RANK=1", "LOCAL_RANK=0", "WORLD_SIZE=2"});
        close(open(go.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600));
      });
  EXPECT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(a.traces.size(), 1u) << a.err;
  EXPECT_EQ(b.traces.size(), 1u) << b.err;
  if (a.traces.size() != 1 || b.traces.size() != 1) return {};
  EXPECT_EQ(load_trace(b.traces[0]).process.hostname, host_b);
  return a.traces[0] + " " + b.traces[0];
}

}  // namespace

// The case on the simulated runtime: two ranks on two hosts, each under the limit on
// its own GPU, pass `check --max-reserved`; merged by device index (as before: the same
// processes recorded on one host show it) their simultaneous 80 MiB failed it.
TEST(Ranks, TwoHostsEachUnderTheLimitPassCheck) {
  const std::string hosts = two_ranks("node-a", "node-b");
  const std::string one_host = two_ranks("node-a", "node-a");
  ASSERT_FALSE(hosts.empty() || one_host.empty());

  auto two = cli("check -q --max-reserved 64MiB " + hosts);
  EXPECT_EQ(two.status, 0) << two.out;
  EXPECT_NE(two.out.find("ok: peak reserved bytes 40.0 MiB (41943040 B) on device 0 of host node-"), std::string::npos)
      << two.out;
  auto same = cli("check -q --max-reserved 64MiB " + one_host);
  EXPECT_EQ(same.status, 1) << same.out;
  EXPECT_NE(same.out.find("FAIL: peak reserved bytes 80.0 MiB (83886080 B) on device 0 (ranks 0, 1) exceeds"),
            std::string::npos)
      << same.out;

  auto s = cli("summary -q " + hosts);
  ASSERT_EQ(s.status, 0) << s.out;
  EXPECT_NE(s.out.find("\n      0 node-a                0 "), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("\n      1 node-b                0 "), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("  device 0 of host node-a (rank 0): peak allocated 40.0 MiB"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("  device 0 of host node-b (rank 1): peak allocated 40.0 MiB"), std::string::npos) << s.out;
  // --host keeps one host's process: alone, as one trace.
  auto b = cli("summary -q --host node-b " + hosts);
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_EQ(b.out.find("Processes:"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("on node-b"), std::string::npos) << b.out;
}

TEST(Ranks, LaunchersVariablesBecomeTheIdentityRecord) {
  const std::string t0 = one_trace({"RANK=0", "LOCAL_RANK=0", "WORLD_SIZE=2"});
  const std::string t1 = one_trace({"RANK=1", "LOCAL_RANK=1", "WORLD_SIZE=2"});
  const std::string ts = one_trace(
      {"RANK=", "OMPI_COMM_WORLD_RANK=", "PMI_RANK=", "SLURM_PROCID=3", "SLURM_LOCALID=1", "SLURM_NTASKS=4"});
  const std::string tn = one_trace(kNoLauncher);
  ASSERT_FALSE(t0.empty() || t1.empty() || ts.empty() || tn.empty());

  auto s1 = second_record(t1);
  ASSERT_TRUE(s1.identity);
  EXPECT_EQ(s1.id.rank, 1);
  EXPECT_EQ(s1.id.local_rank, 1);
  EXPECT_EQ(s1.id.world_size, 2);
  EXPECT_EQ(s1.id.source, gpuheap::format::RankSource::torchrun);
  auto ss = second_record(ts);
  ASSERT_TRUE(ss.identity);
  EXPECT_EQ(ss.id.rank, 3);
  EXPECT_EQ(ss.id.local_rank, 1);
  EXPECT_EQ(ss.id.world_size, 4);
  EXPECT_EQ(ss.id.source, gpuheap::format::RankSource::slurm);
  EXPECT_FALSE(second_record(tn).identity);
  // A rank that is not a number is no rank, and the launcher's variables are never warned about.
  auto bad = run("prog_api", {}, {"RANK=abc", "OMPI_COMM_WORLD_RANK=-1", "PMI_RANK=", "SLURM_PROCID=99999999999"});
  EXPECT_EQ(bad.status, 0) << bad.err;
  ASSERT_EQ(bad.traces.size(), 1u) << bad.err;
  EXPECT_FALSE(second_record(bad.traces[0]).identity);
  EXPECT_EQ(bad.err.find("gpuheap"), std::string::npos) << bad.err;

  // The per-rank table, in rank order whatever the order of the files, and --rank.
  auto s = cli("summary -q " + ts + " " + t1 + " " + tn + " " + t0);
  ASSERT_EQ(s.status, 0) << s.out;
  ASSERT_EQ(s.out.rfind("Processes: 4 traces", 0), 0u) << s.out;
  const auto r0 = s.out.find("\n      0 "), r1 = s.out.find("\n      1 "), r3 = s.out.find("\n      3 "),
             rn = s.out.find("\n      - ");
  ASSERT_NE(r0, std::string::npos) << s.out;
  EXPECT_LT(r0, r1);
  EXPECT_LT(r1, r3);
  EXPECT_LT(r3, rn);
  EXPECT_NE(s.out.find("Spread across 4 processes:"), std::string::npos) << s.out;
  auto one = cli("summary -q --json --rank 3 " + ts + " " + t1 + " " + t0);
  ASSERT_EQ(one.status, 0) << one.out;
  EXPECT_EQ(one.out.find("\"processes\""), std::string::npos) << one.out;  // one trace: no merged document
  EXPECT_NE(one.out.find("\"pid\": " + std::to_string(load_trace(ts).process.pid)), std::string::npos) << one.out;
}
