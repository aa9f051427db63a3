// Logging for every Varipipe binary, on top of spdlog.
//
// Binaries call InitBinary() (common/binary_main.h), which calls
// InitLogging(); libraries log through spdlog's default logger:
//
//   spdlog::info("planned iteration {} in {:.2f} ms", iteration, ms);
//
// Lines go to stderr as "[time] [program] [level] message". The level comes
// from --log_level (trace, debug, info, warn, error, off).
#ifndef VARIPIPE_COMMON_LOGGING_H_
#define VARIPIPE_COMMON_LOGGING_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fmt/format.h"

ABSL_DECLARE_FLAG(std::string, log_level);

namespace varipipe {

// Makes spdlog's default logger write to stderr with `name` (program name,
// later with the rank) in every line, at the level of --log_level.
// Returns InvalidArgument for an unknown level name.
absl::Status InitLogging(absl::string_view name);

// Changes the name shown in log lines, e.g. "executor[rank 3]".
void SetLoggerName(absl::string_view name);

}  // namespace varipipe

// Debian's Abseil has its own string_view type (not std::string_view); these
// let log lines format it and absl::Status directly.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view value, FormatContext& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(value.data(), value.size()),
                                                    ctx);
  }
};

template <>
struct fmt::formatter<absl::Status> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(const absl::Status& status, FormatContext& ctx) const {
    const std::string text = status.ToString();
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(text), ctx);
  }
};

#endif  // VARIPIPE_COMMON_LOGGING_H_
