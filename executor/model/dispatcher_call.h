// Calls a LibTorch operator by name through the dispatcher, its arguments
// matched to the operator's schema by name at run time.
//
// Private ATen operators (aten::_flash_attention_forward and its backward)
// change their signatures between LibTorch versions: arguments are added
// (scale, window sizes, seqused_k, alibi_slopes, block_table, num_splits)
// and returns renamed (philox_seed, philox_offset -> rng_state, unused). A
// direct C++ call compiles against one version only. Here the caller names
// its arguments, each with the names it has had, and BindArguments builds
// the boxed stack of whatever schema the linked LibTorch has:
//   - a schema argument the caller gives: its value, type-checked;
//   - one it does not give: the schema's default, or None when the type is
//     optional; otherwise an error naming the argument and the schema;
//   - a caller argument the schema lacks: dropped when marked optional (a
//     value that equals the operator's behaviour without it, such as the
//     default scale), else an error naming it.
// So one build runs on every supported version and names what is missing.
#ifndef VARIPIPE_EXECUTOR_MODEL_DISPATCHER_CALL_H_
#define VARIPIPE_EXECUTOR_MODEL_DISPATCHER_CALL_H_

#include <torch/torch.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace varipipe::executor {

// One argument of a call: the names it has had in the operator's versions
// (the first is the current one), its value, and whether a schema without
// it is acceptable.
struct NamedArgument {
  NamedArgument(std::initializer_list<std::string> names, c10::IValue value,
                bool required = true)
      : names(names), value(std::move(value)), required(required) {}
  std::vector<std::string> names;
  c10::IValue value;
  bool required = true;
};

// The boxed argument stack for `schema` (see the file comment), or
// InvalidArgument naming the argument and the schema.
absl::StatusOr<std::vector<c10::IValue>> BindArguments(const c10::FunctionSchema& schema,
                                                       const std::vector<NamedArgument>& args);

// The results of a call, readable by position or by any of a return's names
// (returns of older schemas may be unnamed; then only by position).
class OperatorResults {
 public:
  OperatorResults(c10::FunctionSchema schema, std::vector<c10::IValue> values)
      : schema_(std::move(schema)), values_(std::move(values)) {}
  size_t size() const { return values_.size(); }
  const c10::IValue& at(size_t index) const { return values_.at(index); }
  // The return called by one of `names`, or NotFound listing the schema's
  // returns.
  absl::StatusOr<c10::IValue> Named(std::initializer_list<std::string_view> names) const;

 private:
  c10::FunctionSchema schema_;
  std::vector<c10::IValue> values_;
};

// The schema of operator `name` ("aten::_flash_attention_forward") with
// `overload` ("" for the default), or NotFound naming the operator and the
// linked LibTorch version.
absl::StatusOr<c10::FunctionSchema> OperatorSchema(std::string_view name,
                                                   std::string_view overload = "");

// Whether the linked LibTorch registers operator `name`.
bool HasOperator(std::string_view name, std::string_view overload = "");

// Binds `args` to the operator's schema and calls it. Errors: NotFound (no
// such operator), InvalidArgument (arguments do not fit), Internal (the
// operator threw; its message is kept).
absl::StatusOr<OperatorResults> CallOperator(std::string_view name, std::string_view overload,
                                             const std::vector<NamedArgument>& args);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_DISPATCHER_CALL_H_
