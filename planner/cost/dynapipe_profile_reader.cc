#include "planner/cost/dynapipe_profile_reader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace varipipe::planner {
namespace {

namespace fs = std::filesystem;

constexpr double kMiB = 1 << 20;
constexpr double kInf = std::numeric_limits<double>::infinity();

struct FileKey {
  uint32_t tp = 1;
  Recompute recompute = Recompute::kNone;
  uint32_t b = 0;
  uint32_t encoder_s = 0;  // GPT: the sequence length
  uint32_t decoder_s = 0;  // GPT: 0
};

// Averages of the values seen for one grid point.
struct PointSum {
  CostValues sum;
  int count = 0;
  void Add(const CostValues& v) {
    sum += v;
    ++count;
  }
  CostValues Mean() const {
    return {sum.forward_ms / count, sum.backward_ms / count, sum.stored_bytes / count,
            sum.peak_bytes / count};
  }
};

using PointKey = std::tuple<uint32_t, uint32_t, uint32_t>;  // b, encoder_s, s
using GridKey = std::tuple<int, int, uint32_t>;             // component, recompute, tp

absl::Status Malformed(const fs::path& file, int line, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(file.string(), line > 0 ? absl::StrCat(":", line) : "", ": ", why));
}

using PointMap = std::map<GridKey, std::map<PointKey, PointSum>>;

// The profile files of a directory, sorted.
absl::StatusOr<std::vector<fs::path>> ProfileFiles(const std::string& directory) {
  std::error_code error;
  if (!fs::is_directory(directory, error)) {
    return absl::NotFoundError(absl::StrCat(directory, ": not a directory of DynaPipe profiles"));
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.rfind("microbench_", 0) == 0) files.push_back(entry.path());
  }
  if (error) return absl::UnavailableError(absl::StrCat(directory, ": ", error.message()));
  if (files.empty()) {
    return absl::NotFoundError(
        absl::StrCat(directory, ": no microbench_*.txt files (DynaPipe profile directory)"));
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The file name's point; the first file fixes the model's dimensions (in
// *s), later ones must agree.
absl::StatusOr<FileKey> ParseFileName(const fs::path& file, DynaPipeProfileSummary& s,
                                      fs::path& first_file) {
  static const std::regex kName(
      R"(^microbench_tp(\d+)_hs(\d+)_ah(\d+)_kv(\d+)_ffhs(\d+)_(?:encsl(\d+)_decsl(\d+)|sl(\d+))_mbs(\d+)(_rc_selective|_rc_full_uniform|_rc_full)?\.txt$)");
  const std::string name = file.filename().string();
  std::smatch m;
  if (!std::regex_match(name, m, kName)) {
    return Malformed(file, 0,
                     "file name does not follow microbench_tp{tp}_hs{h}_ah{heads}_kv{kv}_"
                     "ffhs{ffn}_(encsl{S}_decsl{T}|sl{S})_mbs{b}[_rc_selective|_rc_full]"
                     ".txt");
  }
  // Every number must fit 32 bits (std::stoul would throw beyond 64 and
  // truncate beyond 32).
  uint32_t numbers[10] = {};
  for (int group = 1; group <= 9; ++group) {
    if (m[group].matched && !absl::SimpleAtoi(m[group].str(), &numbers[group])) {
      return Malformed(file, 0,
                       absl::StrCat("number ", m[group].str(), " in the file name is too large"));
    }
  }
  const auto num = [&](int group) { return numbers[group]; };
  const bool t5 = m[6].matched;
  FileKey key;
  key.tp = num(1);
  key.b = num(9);
  key.encoder_s = t5 ? num(6) : num(8);
  key.decoder_s = t5 ? num(7) : 0;
  const std::string rc = m[10].matched ? m[10].str() : "";
  key.recompute = rc.empty()              ? Recompute::kNone
                  : rc == "_rc_selective" ? Recompute::kSelective
                                          : Recompute::kFull;
  if (key.tp == 0 || key.b == 0 || key.encoder_s == 0 || (t5 && key.decoder_s == 0)) {
    return Malformed(file, 0, "tp, mbs and sequence lengths must be positive");
  }
  if (s.files == 0) {
    s.encoder_decoder = t5;
    s.hidden = num(2);
    s.heads = num(3);
    s.kv_channels = num(4);
    s.ffn = num(5);
    first_file = file;
  } else if (t5 != s.encoder_decoder || num(2) != s.hidden || num(3) != s.heads ||
             num(4) != s.kv_channels || num(5) != s.ffn) {
    return Malformed(
        file, 0,
        absl::StrCat("model dimensions or kind differ from ", first_file.filename().string(),
                     " (one directory must profile one model)"));
  }
  ++s.files;
  return key;
}

// The 'name: value unit' lines of one file. Comment lines ('#', as the
// configuration header DynaPipe's profiler writes first) and other lines
// that are not 'name: value unit' are skipped and counted in `skipped`; a
// known name with a wrong unit or value is an error.
absl::StatusOr<std::map<std::string, double>> ReadValues(const fs::path& file, int* skipped) {
  std::ifstream in(file);
  if (!in) return Malformed(file, 0, "cannot be read");
  std::map<std::string, double> values;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty()) continue;
    const std::vector<absl::string_view> parts = absl::StrSplit(text, ' ', absl::SkipEmpty());
    double value = 0;
    if (absl::StartsWith(text, "#") || parts.size() != 3 || !absl::EndsWith(parts[0], ":") ||
        !absl::SimpleAtod(parts[1], &value)) {
      ++*skipped;
      continue;
    }
    const std::string key_name(absl::StripSuffix(parts[0], ":"));
    const absl::string_view unit = parts[2];
    const bool is_time =
        absl::StartsWith(key_name, "forward_") || absl::StartsWith(key_name, "backward_");
    const bool is_memory =
        absl::EndsWith(key_name, "_activation") || absl::StartsWith(key_name, "model_");
    if ((is_time && unit != "ms") || (is_memory && unit != "MB")) {
      return Malformed(file, number,
                       absl::StrCat("unit of ", key_name, " must be ", is_time ? "ms" : "MB",
                                    ", got '", unit, "'"));
    }
    if (!(value >= 0) || value == kInf) {
      return Malformed(file, number,
                       absl::StrCat(key_name, " must be a finite value >= 0, got ", parts[1]));
    }
    values[key_name] = value;
  }
  return values;
}

// One file's point of one component's grid.
absl::Status AddComponentPoint(const fs::path& file, const FileKey& key, bool t5,
                               const std::map<std::string, double>& values, Component c,
                               absl::string_view prefix, bool memory, PointMap& points) {
  const auto get = [&](const std::string& k) -> absl::StatusOr<double> {
    const auto it = values.find(k);
    if (it == values.end()) return Malformed(file, 0, absl::StrCat("has no '", k, ":' line"));
    return it->second;
  };
  absl::StatusOr<double> fw = get(absl::StrCat("forward_", prefix));
  absl::StatusOr<double> bw = get(absl::StrCat("backward_", prefix));
  if (!fw.ok()) return fw.status();
  if (!bw.ok()) return bw.status();
  CostValues v{*fw, *bw, 0, 0};
  if (memory) {
    absl::StatusOr<double> stored = get(absl::StrCat(prefix, "_activation"));
    absl::StatusOr<double> peak = get(absl::StrCat("peak_", prefix, "_activation"));
    if (!stored.ok()) return stored.status();
    if (!peak.ok()) return peak.status();
    v.stored_bytes = *stored * kMiB;
    v.peak_bytes = std::max(*peak, *stored) * kMiB;
  }
  PointKey point;
  switch (c) {
    case Component::kDecoderLayer:
      point = {key.b, key.encoder_s, key.decoder_s};
      break;
    case Component::kPostprocess:
      point = {key.b, 0, t5 ? key.decoder_s : key.encoder_s};
      break;
    default:
      point = {key.b, 0, key.encoder_s};
  }
  points[{static_cast<int>(c), static_cast<int>(key.recompute), key.tp}][point].Add(v);
  return absl::OkStatus();
}

// Every component's point and parameter count of one file.
absl::Status AddFile(const fs::path& file, const FileKey& key, bool t5, PointMap& points,
                     std::map<int, PointSum>& parameters, int* skipped_lines) {
  absl::StatusOr<std::map<std::string, double>> values = ReadValues(file, skipped_lines);
  if (!values.ok()) return values.status();
  if (absl::Status st = AddComponentPoint(file, key, t5, *values, Component::kEncoderLayer,
                                          "encoder", true, points);
      !st.ok()) {
    return st;
  }
  if (t5) {
    if (absl::Status st = AddComponentPoint(file, key, t5, *values, Component::kDecoderLayer,
                                            "decoder", true, points);
        !st.ok()) {
      return st;
    }
  }
  if (absl::Status st = AddComponentPoint(file, key, t5, *values, Component::kPostprocess,
                                          "postprocess", false, points);
      !st.ok()) {
    return st;
  }
  for (const auto& [k, v] : *values) {
    if (absl::StartsWith(k, "model_embedding")) {
      parameters[static_cast<int>(Component::kEmbedding)].Add({v, 0, 0, 0});
    } else if (absl::StartsWith(k, "model_encoder")) {
      parameters[static_cast<int>(Component::kEncoderLayer)].Add({v, 0, 0, 0});
    } else if (absl::StartsWith(k, "model_decoder")) {
      parameters[static_cast<int>(Component::kDecoderLayer)].Add({v, 0, 0, 0});
    }
  }
  return absl::OkStatus();
}

// One grid from its points (missing points: infinite, outside the grid).
absl::Status AddGrid(const std::string& directory, const GridKey& grid_key,
                     const std::map<PointKey, PointSum>& grid_points, CostModel& model,
                     std::vector<std::string>* repairs) {
  const auto [component, recompute, tp] = grid_key;
  std::set<uint32_t> b_axis;
  std::set<uint32_t> e_axis;
  std::set<uint32_t> s_axis;
  for (const auto& [p, unused] : grid_points) {
    b_axis.insert(std::get<0>(p));
    if (component == static_cast<int>(Component::kDecoderLayer)) e_axis.insert(std::get<1>(p));
    s_axis.insert(std::get<2>(p));
  }
  std::vector<CostValues> values;
  for (uint32_t b : b_axis) {
    for (uint32_t e : e_axis.empty() ? std::set<uint32_t>{0} : e_axis) {
      for (uint32_t sl : s_axis) {
        const auto it = grid_points.find({b, e, sl});
        values.push_back(it == grid_points.end() ? CostValues{kInf, kInf, kInf, kInf}
                                                 : it->second.Mean());
      }
    }
  }
  const Component c = static_cast<Component>(component);
  const Recompute r = static_cast<Recompute>(recompute);
  // The DP needs non-decreasing grids: repaired by the documented rule
  // (profile_grid.h), and the description says where.
  const std::vector<uint32_t> b(b_axis.begin(), b_axis.end()), e(e_axis.begin(), e_axis.end()),
      sl(s_axis.begin(), s_axis.end());
  double CostValues::*fields[] = {&CostValues::forward_ms, &CostValues::backward_ms,
                                  &CostValues::stored_bytes, &CostValues::peak_bytes};
  for (double CostValues::*field : fields) {
    std::vector<double> column;
    for (const CostValues& v : values) column.push_back(v.*field);
    if (std::any_of(column.begin(), column.end(), [](double v) { return !(v >= 0); })) continue;
    std::string first;
    if (const int raised = RaiseToRunningMaxima(b, e, sl, column, &first); raised > 0) {
      repairs->push_back(absl::StrCat(ComponentName(c), " recompute ", RecomputeName(r), ": ",
                                      raised, " raised, first at ", first));
      for (size_t i = 0; i < values.size(); ++i) values[i].*field = column[i];
    }
  }
  absl::StatusOr<ProfileGrid> grid =
      ProfileGrid::Create({b_axis.begin(), b_axis.end()}, {s_axis.begin(), s_axis.end()},
                          {e_axis.begin(), e_axis.end()}, std::move(values),
                          absl::StrCat(directory, ": ", ComponentName(c), " (recompute ",
                                       RecomputeName(r), ", tp ", tp, ")"));
  if (!grid.ok()) return grid.status();
  return model.SetGrid(c, r, tp, *std::move(grid));
}

}  // namespace

absl::StatusOr<CostModel> ReadDynaPipeProfileDirectory(const std::string& directory,
                                                       DynaPipeProfileSummary* summary) {
  absl::StatusOr<std::vector<fs::path>> files = ProfileFiles(directory);
  if (!files.ok()) return files.status();
  PointMap points;
  std::map<int, PointSum> parameters;  // component -> MB (forward_ms slot)
  DynaPipeProfileSummary s;
  fs::path first_file;
  for (const fs::path& file : *files) {
    absl::StatusOr<FileKey> key = ParseFileName(file, s, first_file);
    if (!key.ok()) return key.status();
    if (absl::Status st =
            AddFile(file, *key, s.encoder_decoder, points, parameters, &s.skipped_lines);
        !st.ok()) {
      return st;
    }
  }
  CostModel model;
  model.set_description(absl::StrCat("DynaPipe profiles from ", directory, " (", s.files,
                                     " files, ", s.skipped_lines,
                                     " comment or unknown lines skipped)"));
  std::vector<std::string> repairs;
  for (const auto& [grid_key, grid_points] : points) {
    if (absl::Status st = AddGrid(directory, grid_key, grid_points, model, &repairs); !st.ok()) {
      return st;
    }
  }
  if (!repairs.empty()) {
    model.set_description(absl::StrCat(
        model.description(),
        " [values raised to keep the grids monotone: ", absl::StrJoin(repairs, "; "), "]"));
  }
  // 16-bit parameters: 2 bytes each.
  for (const auto& [component, sum] : parameters) {
    model.SetParameters(static_cast<Component>(component), sum.Mean().forward_ms * kMiB / 2);
  }
  ModelDims profiled;
  profiled.kind = s.encoder_decoder ? ModelKind::kT5 : ModelKind::kGpt;
  profiled.hidden = s.hidden;
  profiled.heads = s.heads;
  profiled.kv_channels = s.kv_channels;
  profiled.ffn = s.ffn;
  // DynaPipe profiles Megatron-LM's GPT and T5 layers ("kv" in the file
  // names is kv_channels): MEGATRON, multi-head, so a LLAMA job is refused.
  profiled.architecture = Architecture::kMegatron;
  profiled.kv_heads = s.heads;
  // DynaPipe's file names do not say which attention kernel was measured.
  model.set_profiled_dims(profiled, /*attention_kernel_known=*/false);
  // The LM head on the last stage holds a copy of the (tied) embedding.
  model.SetParameters(Component::kPostprocess, model.Parameters(Component::kEmbedding));
  if (summary != nullptr) *summary = s;
  return model;
}

}  // namespace varipipe::planner
