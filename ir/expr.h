// ir/expr.h - size expressions: hash-consed integer terms over named sizes (+ - * /).
//
// Constants fold eagerly, so a shape built only from concrete sizes is a list of constants and the
// spatial checks decide it without a solver. Symbolic sizes stay as variables for Z3.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace spmd {

using ExprId = std::int32_t;

// The largest size a program may state, and the largest value any size expression may reach.
inline constexpr std::int64_t kMaxSize = std::int64_t{1} << 40;
inline constexpr std::int64_t kMaxValue = std::int64_t{1} << 62;

// AxisIndex / AxisSize (local view only, docs/format.md "Local view"): the calling rank's coordinate on mesh axis
// `a` (axis_index(NAME)) and that axis' size (the axis name written as a size). They are not size variables:
// evaluating one needs an AxisEnv, and every evaluator without it (eval without an env, the Z3 translation,
// the spatial checks) throws AxisExprError instead of using some value.
enum class EOp : std::uint8_t { Const, Var, Add, Sub, Mul, Div, AxisIndex, AxisSize };

struct ENode {
  EOp op;
  std::int32_t a = -1, b = -1;  // operands (Add/Sub/Mul/Div) or the variable index (Var: a)
  std::int64_t c = 0;           // the value (Const)
  std::uint32_t depth = 1;      // longest path to a leaf
  std::uint32_t terms = 1;      // leaves counted with multiplicity (saturating): the size once written out
};

// Bounds that keep every recursive walk over an expression short (hostile inputs are rejected).
inline constexpr std::uint32_t kMaxExprDepth = 128;
inline constexpr std::uint32_t kMaxExprTerms = 4096;

// A symbolic size and the values it may take.
struct SizeVar {
  std::string name;
  std::int64_t min = 1;
  std::int64_t max = kMaxSize;
  std::int64_t multiple_of = 1;
  std::vector<std::int64_t> in;  // when non-empty: the finite set of allowed values
  // A concrete size loaded as a variable for shape reduction (LoadOptions::generalize_sizes): `in` holds its one
  // declared value. Anything that needs a number where a size is used as a value (a scale expression, a Mean's
  // count in a derived backward) takes that declared value; only tensor extents follow the instantiation.
  bool general = false;
};

// The rank an expression is evaluated for: its coordinate and the size of each mesh axis.
struct AxisEnv {
  const std::vector<std::int64_t>* coords = nullptr;
  const std::vector<std::int64_t>* sizes = nullptr;
};

// An axis_index / axis size reached by code that has no rank to evaluate it for (a program error caught too late,
// or a pass that should have skipped a local-view program): never silently a value.
struct AxisExprError : std::logic_error {
  using std::logic_error::logic_error;
};

struct ExprError : std::runtime_error {
  std::size_t offset;  // character offset in the parsed text
  ExprError(std::size_t off, const std::string& msg) : std::runtime_error(msg), offset(off) {}
};

class ExprPool {
 public:
  ExprId constant(std::int64_t v);
  ExprId var(int index);
  ExprId add(ExprId a, ExprId b);
  ExprId sub(ExprId a, ExprId b);
  ExprId mul(ExprId a, ExprId b);
  ExprId div(ExprId a, ExprId b);
  // axis_index(name) and the size of mesh axis `name` (local view); `axis` is its index in the mesh.
  ExprId axis_index(int axis, const std::string& name);
  ExprId axis_size(int axis, const std::string& name);
  // Whether `id` mentions an AxisIndex or AxisSize node.
  bool has_axis(ExprId id) const;

  const ENode& node(ExprId id) const { return nodes_[static_cast<std::size_t>(id)]; }
  bool is_const(ExprId id) const { return node(id).op == EOp::Const; }
  std::int64_t value(ExprId id) const { return node(id).c; }
  std::size_t size() const { return nodes_.size(); }

  // Value under an assignment of the variables (nullopt: division by zero, inexact or overflow). An AxisIndex or
  // AxisSize node needs `env` (a rank): without one it throws AxisExprError.
  std::optional<std::int64_t> eval(ExprId id, const std::vector<std::int64_t>& vars, const AxisEnv& env = {}) const;
  // The value of `id` when every variable it mentions has exactly one allowed value (`in` of size one, as a
  // generalized concrete size has); nullopt otherwise (or on division by zero, inexact division, overflow).
  std::optional<std::int64_t> single_value(ExprId id, const std::vector<SizeVar>& vars) const;
  // Adds the indices of the variables `id` mentions to `out` (deduplicated by the caller).
  void collect_vars(ExprId id, std::vector<int>& out) const;
  // Writes `id` as text using the variable names.
  std::string str(ExprId id, const std::vector<SizeVar>& vars) const;
  // Visits every Div and Sub node under `id` (for exactness and positivity obligations).
  void visit(ExprId id, const std::function<void(ExprId)>& fn) const;

  // As a product c * f1 * f2 ... (factors sorted); non-product terms are single factors.
  void monomial(ExprId id, std::int64_t& coef, std::vector<ExprId>& factors) const;

  // Parses "4*H + 2" etc.; `lookup` maps a name to its expression or nullopt (then ExprError). A call
  // `f(NAME)` (axis_index(tp)) goes to `call(f, NAME, offset of NAME)`, which returns its expression or throws;
  // without `call` it is an ExprError.
  using CallFn = std::function<ExprId(std::string_view fn, std::string_view arg, std::size_t offset)>;
  ExprId parse(std::string_view text, const std::function<std::optional<ExprId>(std::string_view)>& lookup, const CallFn* call = nullptr);

 private:
  ExprId intern(ENode n);
  bool linear(ExprId e, std::int64_t sign, std::vector<std::pair<ExprId, std::int64_t>>& terms, std::int64_t& c) const;
  ExprId combine(ExprId a, ExprId b, std::int64_t sign);
  std::vector<ENode> nodes_;
  std::vector<std::string> axis_names_;  // by mesh axis index, for str()
  std::unordered_map<std::uint64_t, std::vector<ExprId>> index_;
};

}  // namespace spmd
