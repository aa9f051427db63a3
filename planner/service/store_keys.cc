#include "planner/service/store_keys.h"

#include "absl/strings/str_cat.h"
#include "common/auth/job_token.h"

namespace varipipe::service {
namespace {

// The names after P: (and before :<number> for the numbered keys), used by
// both the C++ accessors and LuaKeys.
constexpr char kConfig[] = "config";
constexpr char kConfigHash[] = "config_hash";
constexpr char kStageLayout[] = "stage_layout";
constexpr char kClaimed[] = "claimed";
constexpr char kUnpublished[] = "unpublished";
constexpr char kOpen[] = "open";
constexpr char kEvents[] = "events";
constexpr char kProgress[] = "progress";
constexpr char kReports[] = "reports";
constexpr char kPublished[] = "published";
constexpr char kAcknowledged[] = "acknowledged";
constexpr char kCalibration[] = "calibration";
constexpr char kPredictions[] = "predictions";
constexpr char kLease[] = "lease";
constexpr char kPlan[] = "plan";
constexpr char kFetched[] = "fetched";
constexpr char kAcks[] = "acks";
constexpr char kReported[] = "reported";
constexpr const char* kJobKeys[] = {
    kConfig,   kConfigHash, kStageLayout, kClaimed,      kUnpublished, kOpen,       kEvents,
    kProgress, kReports,    kPublished,   kAcknowledged, kCalibration, kPredictions};
constexpr const char* kNumberedKeys[] = {kLease, kPlan, kFetched, kAcks, kReported};
constexpr char kRankFieldPrefix[] = "rank:";

}  // namespace

StoreKeys::StoreKeys(const std::string& key_prefix, const std::string& job_id)
    : key_prefix_(key_prefix), job_id_(job_id), prefix_(absl::StrCat(key_prefix, ":", job_id)) {}

std::string StoreKeys::Of(const char* name) const { return absl::StrCat(prefix_, ":", name); }

std::string StoreKeys::Of(const char* name, uint64_t index) const {
  return absl::StrCat(prefix_, ":", name, ":", index);
}

std::string StoreKeys::Config() const { return Of(kConfig); }
std::string StoreKeys::ConfigHash() const { return Of(kConfigHash); }
std::string StoreKeys::Token() const { return JobTokenKey(key_prefix_, job_id_); }
std::string StoreKeys::StageLayout() const { return Of(kStageLayout); }
std::string StoreKeys::Claimed() const { return Of(kClaimed); }
std::string StoreKeys::Unpublished() const { return Of(kUnpublished); }
std::string StoreKeys::Open() const { return Of(kOpen); }
std::string StoreKeys::Events() const { return Of(kEvents); }
std::string StoreKeys::Progress() const { return Of(kProgress); }
std::string StoreKeys::Reports() const { return Of(kReports); }
std::string StoreKeys::Published() const { return Of(kPublished); }
std::string StoreKeys::Acknowledged() const { return Of(kAcknowledged); }
std::string StoreKeys::Calibration() const { return Of(kCalibration); }
std::string StoreKeys::Predictions() const { return Of(kPredictions); }
std::string StoreKeys::Lease(uint64_t iteration) const { return Of(kLease, iteration); }
std::string StoreKeys::Plan(uint64_t iteration) const { return Of(kPlan, iteration); }
std::string StoreKeys::Fetched(uint64_t iteration) const { return Of(kFetched, iteration); }
std::string StoreKeys::Acks(uint64_t iteration) const { return Of(kAcks, iteration); }
std::string StoreKeys::Reported(int rank) const {
  return Of(kReported, static_cast<uint64_t>(rank));
}

std::string StoreKeys::PlanRankField(int rank) { return absl::StrCat(kRankFieldPrefix, rank); }

std::string StoreKeys::LuaKeys() {
  std::string lua = "local K = {}\n";
  for (const char* name : kJobKeys) absl::StrAppend(&lua, "K.", name, " = p .. ':", name, "'\n");
  for (const char* name : kNumberedKeys) {
    absl::StrAppend(&lua, "K.", name, " = function(i) return p .. ':", name, ":' .. i end\n");
  }
  absl::StrAppend(&lua, "K.rank_field = function(r) return '", kRankFieldPrefix, "' .. r end\n");
  absl::StrAppend(&lua, "K.summary_field = '", kPlanSummaryField, "'\n");
  return lua;
}

}  // namespace varipipe::service
