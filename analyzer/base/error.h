// Analyzer errors. Everything the CLI reports as "bad input" (exit 2) derives from
// InputError; the message is one line, ready to print.
#pragma once

#include <stdexcept>
#include <string>

namespace gpuheap {

class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class NotATraceError : public InputError {
 public:
  using InputError::InputError;
};
// Not a trace because it holds nothing: empty, cut inside its header, or a header with no
// whole process record after it (as opposed to garbage, e.g. a bad magic).
class EmptyTraceError : public NotATraceError {
 public:
  using NotATraceError::NotATraceError;
};
class VersionError : public InputError {
 public:
  using InputError::InputError;
};
class CorruptTraceError : public InputError {
 public:
  CorruptTraceError(const std::string& msg, std::uint64_t offset) : InputError(msg), offset_(offset) {}
  std::uint64_t offset() const { return offset_; }

 private:
  std::uint64_t offset_;
};
class UsageError : public InputError {
 public:
  using InputError::InputError;
};

}  // namespace gpuheap
