// frontends/decompose.h - short decompositions shared by the op tables (aten_ops.cpp, hlo_ops.cpp).
//
// Temporary decompositions, until the op table has these ops (issue 21's comparison ops, Sigmoid):
//   ge(a, b) = min(max(a - b + 1, 0), 1) for integer data (HLO), else Cast((a - b + K) / K, i64) with K = 2^40 (exact for |a - b| < 2^40: trunc of a value in [1, 2) or
//   (0, 1)), lt = 1 - ge, eq = 1 - Cast(a - b, bool), ne = Cast(a - b, bool), or = Cast(a + b, bool),
//   and = a * b, not = 1 - a, sigmoid(x) = 1 / (1 + exp(-x)). Every one is exact in the value check's number
//   domain (integer casts give exact constants), so plan and spec agree in every field lane.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "frontends/lower.h"

namespace spmd::frontends {

// An operand of an elementwise op: a tensor, or a scalar (`num` set) that may be folded into the op.
struct Operand {
  std::string t;
  std::optional<double> num;
  std::vector<std::int64_t> shape;
  std::string dtype;
};
Operand tensor_operand(const Value& v);  // a constant 0-d tensor becomes a number

std::int64_t numel(const std::vector<std::int64_t>& s);
std::string out_dtype(Ctx& c, const std::string& dflt, std::size_t k = 0);  // the annotated dtype of result k, else dflt
std::string dims_text(const std::vector<int>& d);
// Writes `op` of a and b (either may be a scalar) into `out`; returns the result shape.
std::vector<std::int64_t> binary(Ctx& c, const std::string& op, const Operand& a, const Operand& b, const std::string& out, bool commutes);
// Cast((a - b + K) / K, i64): 1 where a >= b, else 0; `shape` receives the broadcast shape.
// exact: integer operands as min(max(a - b + 1, 0), 1) (no cast, which the value check counts as a choice by
// value); used by the HLO table. The FX table keeps the cast form for now: with it, localization of Megatron's
// vocab-range masks names the missing reduction (tests/test_import.cpp, corpus); see docs/import.md.
std::string ge_of(Ctx& c, const Operand& a, const Operand& b, std::vector<std::int64_t>& shape, bool exact = false);
std::string not_of(Ctx& c, const std::string& x, const std::string& out);  // 1 - x
bool integral(const Operand& o);  // integer (or bool) data, or an integer scalar: comparisons need no cast
// The bool mask `a kind b` (lt, le, gt, ge, eq, ne) into `out`; returns its shape.
std::vector<std::int64_t> compare_into(Ctx& c, const std::string& kind, const Operand& a, const Operand& b, const std::string& out, bool exact = false);
void transpose(Ctx& c, const Value& x, int a, int b, const std::string& out);
// x's dims permuted (out[i] = x's dim dims[i]) into `out` as a chain of Transposes; returns the shape, or {} when
// the permutation is the identity (nothing emitted).
std::vector<std::int64_t> permute_into(Ctx& c, const Value& x, const std::vector<std::int64_t>& dims, const std::string& out);
std::string sigmoid_of(Ctx& c, const Value& x, const std::string& out);  // 1 / (1 + exp(-x))

}  // namespace spmd::frontends
