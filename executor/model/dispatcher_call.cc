#include "executor/model/dispatcher_call.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/version.h>

#include <algorithm>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace varipipe::executor {
namespace {

std::string SchemaText(const c10::FunctionSchema& schema) {
  std::ostringstream text;
  text << schema;
  return text.str();
}

// Whether `value` may be passed where the schema expects `type`. Integers
// fill SymInt arguments (their boxed form is an int).
bool Accepts(const c10::TypePtr& type, const c10::IValue& value) {
  switch (type->kind()) {
    case c10::TypeKind::OptionalType:
      return value.isNone() ||
             Accepts(type->expectRef<c10::OptionalType>().getElementType(), value);
    case c10::TypeKind::TensorType:
      return value.isTensor();
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      return value.isInt();
    case c10::TypeKind::FloatType:
      return value.isDouble();
    case c10::TypeKind::BoolType:
      return value.isBool();
    default:
      return value.type()->isSubtypeOf(*type);
  }
}

bool HasName(const NamedArgument& arg, const std::string& name) {
  return std::find(arg.names.begin(), arg.names.end(), name) != arg.names.end();
}

std::string Names(const NamedArgument& arg) { return absl::StrJoin(arg.names, "/"); }

}  // namespace

absl::StatusOr<std::vector<c10::IValue>> BindArguments(const c10::FunctionSchema& schema,
                                                       const std::vector<NamedArgument>& args) {
  std::vector<bool> used(args.size(), false);
  std::vector<c10::IValue> stack;
  stack.reserve(schema.arguments().size());
  for (const c10::Argument& formal : schema.arguments()) {
    size_t given = args.size();
    for (size_t i = 0; i < args.size(); ++i) {
      if (HasName(args[i], formal.name())) {
        if (given != args.size()) {
          return absl::InvalidArgumentError(absl::StrCat("arguments ", Names(args[given]), " and ",
                                                         Names(args[i]), " both fill '",
                                                         formal.name(), "' of ",
                                                         SchemaText(schema)));
        }
        given = i;
      }
    }
    if (given != args.size()) {
      used[given] = true;
      if (!Accepts(formal.type(), args[given].value)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "argument '", formal.name(), "' of ", schema.name(), " is ", formal.type()->str(),
            "; given a ", args[given].value.tagKind(), " (schema: ", SchemaText(schema), ")"));
      }
      stack.push_back(args[given].value);
    } else if (formal.default_value().has_value()) {
      stack.push_back(*formal.default_value());
    } else if (formal.type()->kind() == c10::TypeKind::OptionalType) {
      stack.emplace_back();  // None
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(schema.name(), " in LibTorch ", TORCH_VERSION, " needs argument '",
                       formal.name(), "' (", formal.type()->str(),
                       "), which the caller does not supply (schema: ", SchemaText(schema), ")"));
    }
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (used[i] || !args[i].required) continue;
    return absl::InvalidArgumentError(absl::StrCat(schema.name(), " in LibTorch ", TORCH_VERSION,
                                                   " has no argument ", Names(args[i]),
                                                   " (schema: ", SchemaText(schema), ")"));
  }
  return stack;
}

absl::StatusOr<c10::IValue> OperatorResults::Named(
    std::initializer_list<std::string_view> names) const {
  const std::vector<c10::Argument>& returns = schema_.returns();
  for (size_t i = 0; i < returns.size() && i < values_.size(); ++i) {
    for (std::string_view name : names) {
      if (!returns[i].name().empty() && returns[i].name() == name) return values_[i];
    }
  }
  const std::vector<std::string> wanted(names.begin(), names.end());
  return absl::NotFoundError(absl::StrCat(schema_.name(), " returns no ", absl::StrJoin(wanted, "/"),
                                          " (schema: ", SchemaText(schema_), ")"));
}

absl::StatusOr<c10::FunctionSchema> OperatorSchema(std::string_view name,
                                                   std::string_view overload) {
  const c10::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findSchema(
      c10::OperatorName(std::string(name), std::string(overload)));
  if (!op.has_value()) {
    return absl::NotFoundError(absl::StrCat("LibTorch ", TORCH_VERSION, " has no operator ",
                                            std::string(name), overload.empty() ? "" : ".",
                                            std::string(overload)));
  }
  return op->schema();
}

bool HasOperator(std::string_view name, std::string_view overload) {
  return OperatorSchema(name, overload).ok();
}

absl::StatusOr<OperatorResults> CallOperator(std::string_view name, std::string_view overload,
                                             const std::vector<NamedArgument>& args) {
  const c10::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findSchema(
      c10::OperatorName(std::string(name), std::string(overload)));
  if (!op.has_value()) return OperatorSchema(name, overload).status();
  absl::StatusOr<std::vector<c10::IValue>> stack = BindArguments(op->schema(), args);
  if (!stack.ok()) return stack.status();
  try {
    op->callBoxed(&*stack);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(std::string(name), " failed: ", e.what_without_backtrace()));
  }
  return OperatorResults(op->schema(), std::move(*stack));
}

}  // namespace varipipe::executor
