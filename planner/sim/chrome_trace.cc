#include "planner/sim/chrome_trace.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace varipipe::planner {
namespace {

// JSON string escaping for the few characters a title may contain.
std::string Quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(&out, absl::StrFormat("\\u%04x", c));
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string ChromeTraceJson(const SimulationResult& result, const std::string& title,
                            int first_rank) {
  std::string json = absl::StrCat("{\"otherData\":{\"title\":", Quote(title),
                                  "},\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
  bool first = true;
  const auto add = [&](const std::string& event) {
    if (!first) json += ",\n";
    first = false;
    json += event;
  };
  std::set<uint32_t> devices;
  for (const TimedOp& t : result.ops) devices.insert(t.device);
  for (const TimedTransfer& t : result.transfers) devices.insert(t.from);
  for (uint32_t d : devices) {
    add(absl::StrFormat(
        R"j({"name":"process_name","ph":"M","pid":%d,"args":{"name":"device %d (rank %d)"}})j", d,
        d, first_rank + static_cast<int>(d)));
    add(absl::StrFormat(
        R"j({"name":"thread_name","ph":"M","pid":%d,"tid":0,"args":{"name":"compute"}})j", d));
    add(absl::StrFormat(
        R"j({"name":"thread_name","ph":"M","pid":%d,"tid":1,"args":{"name":"comm"}})j", d));
  }
  for (const TimedOp& t : result.ops) {
    const char* name = t.op.kind == OpKind::kForward    ? "F"
                       : t.op.kind == OpKind::kBackward ? "B"
                                                        : "W";
    const char* category = t.op.kind == OpKind::kForward    ? "forward"
                           : t.op.kind == OpKind::kBackward ? "backward"
                                                            : "weight_grad";
    add(absl::StrFormat(
        R"j({"name":"%s mb%d s%d","cat":"%s","ph":"X","pid":%d,"tid":0,"ts":%.3f,"dur":%.3f,"args":{"micro_batch":%d,"stage":%d}})j",
        name, t.op.micro_batch, t.op.stage, category, t.device, t.start_ms * 1e3,
        (t.end_ms - t.start_ms) * 1e3, t.op.micro_batch, t.op.stage));
  }
  for (const TimedTransfer& t : result.transfers) {
    const bool fwd = t.producer.kind == OpKind::kForward;
    add(absl::StrFormat(
        R"j({"name":"%s mb%d s%d->d%d","cat":"comm","ph":"X","pid":%d,"tid":1,"ts":%.3f,"dur":%.3f,"args":{"micro_batch":%d,"bytes":%.0f,"to_device":%d}})j",
        fwd ? "send act" : "send grad", t.producer.micro_batch, t.producer.stage, t.to, t.from,
        t.start_ms * 1e3, (t.end_ms - t.start_ms) * 1e3, t.producer.micro_batch, t.bytes, t.to));
  }
  json += "]}\n";
  return json;
}

}  // namespace varipipe::planner
