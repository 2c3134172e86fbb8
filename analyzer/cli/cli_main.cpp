// gpuheap CLI: the subcommands, one file each (cmd_*.cpp, command.h). Exit 2 on bad input or
// usage.
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "analyzer/base/error.h"
#include "analyzer/base/text_safe.h"
#include "analyzer/cli/command.h"
#include "analyzer/symbolize/symbolize.h"

using namespace gpuheap;

namespace {

// Log lines name files and modules from traces: each message is escaped once, here.
class EscapedPayload : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    auto s = text_safe(std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(s.data(), s.data() + s.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<EscapedPayload>(); }
};

// `verbose`: set by -v on the commands that symbolize.
int real_main(int argc, char** argv, bool& verbose) {
  CLI::App app{"gpuheap: GPU memory profiler (trace with `run`, analyze with summary/check/diff)"};
  app.set_version_flag("--version", std::string(GPUHEAP_VERSION));
  app.require_subcommand(1);
  // In the order of the help's list (a braced list is evaluated in order).
  const std::vector<cli::Command> commands{cli::add_run(app, verbose),
                                           cli::add_dump(app),
                                           cli::add_summary(app, verbose),
                                           cli::add_check(app, verbose),
                                           cli::add_diff(app, verbose),
                                           cli::add_export(app, verbose),
                                           cli::add_report(app, verbose),
                                           cli::add_symbolize(app, verbose),
                                           cli::add_compress(app),
                                           cli::add_replay(app, verbose),
                                           cli::add_top(app)};
  // After `run --`, CLI11 2.1 hands the rest of the line back to the app (cmd_run.cpp).
  // Set after the subcommands were added, so they do not inherit it; any leftover outside
  // `run` is refused below.
  app.prefix_command();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  for (const auto& c : commands) {
    if (!*c.app) continue;
    if (!c.takes_program && !app.remaining().empty())
      throw UsageError(fmt::format("unexpected argument(s): {}", fmt::join(app.remaining(), " ")));
    return c.run();
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  auto logger = spdlog::stderr_color_st("gpuheap");
  auto fmt = std::make_unique<spdlog::pattern_formatter>();
  fmt->add_flag<EscapedPayload>('*').set_pattern("gpuheap: %^%l%$: %*");
  logger->set_formatter(std::move(fmt));
  spdlog::set_default_logger(logger);
  bool verbose = false;
  try {
    int rc = real_main(argc, argv, verbose);
    report_missing_modules(verbose);  // once for the whole command
    return rc;
  } catch (const InputError& e) {
    report_missing_modules(verbose);
    spdlog::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("internal error: {}", e.what());
    return 2;
  }
}
