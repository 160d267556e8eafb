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

enum class EOp : std::uint8_t { Const, Var, Add, Sub, Mul, Div };

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

  const ENode& node(ExprId id) const { return nodes_[static_cast<std::size_t>(id)]; }
  bool is_const(ExprId id) const { return node(id).op == EOp::Const; }
  std::int64_t value(ExprId id) const { return node(id).c; }
  std::size_t size() const { return nodes_.size(); }

  // Value under an assignment of the variables (nullopt: division by zero, inexact or overflow).
  std::optional<std::int64_t> eval(ExprId id, const std::vector<std::int64_t>& vars) const;
  // Adds the indices of the variables `id` mentions to `out` (deduplicated by the caller).
  void collect_vars(ExprId id, std::vector<int>& out) const;
  // Writes `id` as text using the variable names.
  std::string str(ExprId id, const std::vector<SizeVar>& vars) const;
  // Visits every Div and Sub node under `id` (for exactness and positivity obligations).
  void visit(ExprId id, const std::function<void(ExprId)>& fn) const;

  // As a product c * f1 * f2 ... (factors sorted); non-product terms are single factors.
  void monomial(ExprId id, std::int64_t& coef, std::vector<ExprId>& factors) const;

  // Parses "4*H + 2" etc.; `lookup` maps a name to its expression or nullopt (then ExprError).
  ExprId parse(std::string_view text, const std::function<std::optional<ExprId>(std::string_view)>& lookup);

 private:
  ExprId intern(ENode n);
  std::vector<ENode> nodes_;
  std::unordered_map<std::uint64_t, std::vector<ExprId>> index_;
};

}  // namespace spmd
