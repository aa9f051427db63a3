#include "common/logging.h"

#include <memory>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, log_level, "info", "Log level: trace, debug, info, warn, error or off");

namespace varipipe {
namespace {

constexpr char kPattern[] = "[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v";

}  // namespace

absl::Status InitLogging(absl::string_view name) {
  const std::string level_name = absl::GetFlag(FLAGS_log_level);
  const spdlog::level::level_enum level = spdlog::level::from_str(level_name);
  // from_str() maps unknown names to "off"; only "off" itself may do that.
  if (level == spdlog::level::off && level_name != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_level: unknown level '", level_name,
                     "' (use trace, debug, info, warn, error or off)"));
  }
  SetLoggerName(name);
  spdlog::set_level(level);
  return absl::OkStatus();
}

void SetLoggerName(absl::string_view name) {
  auto logger = std::make_shared<spdlog::logger>(
      std::string(name), std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  logger->set_pattern(kPattern);
  if (auto previous = spdlog::default_logger(); previous != nullptr) {
    logger->set_level(previous->level());
  }
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace varipipe
