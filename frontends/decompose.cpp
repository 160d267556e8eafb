// frontends/decompose.cpp - decompositions the op tables share: elementwise ops of tensors and scalars, the
// temporary comparison decompositions (see decompose.h), permutations as swaps, sigmoid.
#include "frontends/decompose.h"

#include <cmath>

#include <algorithm>
#include <numeric>

namespace spmd::frontends {

namespace {
constexpr double kCmp = 1099511627776.0;  // 2^40
}  // namespace

std::int64_t numel(const std::vector<std::int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), std::int64_t{1}, [](std::int64_t a, std::int64_t b) { return a * b; });
}

std::string out_dtype(Ctx& c, const std::string& dflt, std::size_t k) {
  const TensorType* a = c.annotated(k);
  return a ? a->dtype : dflt;
}

Operand tensor_operand(const Value& v) {
  Operand o;
  if (v.scalar && v.type.shape.empty()) {
    o.num = *v.scalar;
    o.dtype = v.type.dtype;
    return o;
  }
  o.t = v.ir, o.shape = v.type.shape, o.dtype = v.type.dtype;
  return o;
}

// Writes `op` of a and b (either may be a scalar) into `out`; returns the result shape.
std::vector<std::int64_t> binary(Ctx& c, const std::string& op, const Operand& a, const Operand& b, const std::string& out, bool commutes) {
  if (a.num && b.num) {  // both scalars: a 0-d constant
    double x = *a.num, y = *b.num;
    double r = op == "Add" ? x + y : op == "Sub" ? x - y : op == "Multiply" ? x * y : op == "Div" ? x / y : op == "Maximum" ? std::max(x, y) : std::min(x, y);
    std::string f = c.full({}, r, a.dtype.empty() ? "f32" : a.dtype);
    c.emit("Reshape", {f}, {out}, {{"shape", "[]"}});
    return {};
  }
  if (b.num) {
    if (op == "Div" && *b.num == 0) c.fail("division by the constant 0");
    c.emit(op, {a.t}, {out}, {{"scalar", num_text(*b.num)}});
    return a.shape;
  }
  if (a.num) {
    if (commutes) {
      c.emit(op, {b.t}, {out}, {{"scalar", num_text(*a.num)}});
    } else if (op == "Sub") {  // s - b = (-b) + s
      std::string n = c.tmp("n");
      c.emit("Neg", {b.t}, {n});
      c.emit("Add", {n}, {out}, {{"scalar", num_text(*a.num)}});
    } else {  // s / b
      std::string f = c.full({}, *a.num, b.dtype);
      c.emit(op, {f, b.t}, {out});
    }
    return b.shape;
  }
  c.emit(op, {a.t, b.t}, {out});
  return broadcast_shape(a.shape, b.shape, c);
}

// Integer data: min(max(a - b + 1, 0), 1), exact for integers and no cast (which the value check counts as a choice
// by value); else Cast((a - b + K) / K, i64). 1 where a >= b, else 0.
bool integral(const Operand& o) {
  if (o.num) return std::floor(*o.num) == *o.num && std::abs(*o.num) < 1e15;
  return o.dtype == "i64" || o.dtype == "i32" || o.dtype == "i8" || o.dtype == "bool";
}

std::string ge_of(Ctx& c, const Operand& a, const Operand& b, std::vector<std::int64_t>& shape, bool exact) {
  const bool ints = exact && integral(a) && integral(b);
  const double k = ints ? 1 : kCmp;
  std::string d = c.tmp("d"), q = c.tmp("q"), r = c.tmp("g");
  if (b.num) {
    c.emit("Add", {a.t}, {d}, {{"scalar", num_text(k - *b.num)}});
    shape = a.shape;
  } else if (a.num) {
    std::string n = c.tmp("n");
    c.emit("Neg", {b.t}, {n});
    c.emit("Add", {n}, {d}, {{"scalar", num_text(*a.num + k)}});
    shape = b.shape;
  } else {
    std::string s = c.tmp("s");
    c.emit("Sub", {a.t, b.t}, {s});
    c.emit("Add", {s}, {d}, {{"scalar", num_text(k)}});
    shape = broadcast_shape(a.shape, b.shape, c);
  }
  if (ints) {
    c.emit("Maximum", {d}, {q}, {{"scalar", "0"}});
    c.emit("Minimum", {q}, {r}, {{"scalar", "1"}});
    return r;
  }
  c.emit("Div", {d}, {q}, {{"scalar", num_text(kCmp)}});
  c.emit("Cast", {q}, {r}, {{"dtype", "i64"}});
  return r;
}

std::string not_of(Ctx& c, const std::string& x, const std::string& out) {
  std::string n = c.tmp("n");
  c.emit("Neg", {x}, {n});
  c.emit("Add", {n}, {out}, {{"scalar", "1"}});
  return out;
}

std::vector<std::int64_t> compare_into(Ctx& c, const std::string& kind, const Operand& a, const Operand& b, const std::string& o, bool exact) {
  std::vector<std::int64_t> shape;
  if (kind == "ge" || kind == "lt") {
    std::string g = ge_of(c, a, b, shape, exact);
    if (kind == "ge") c.emit("Reshape", {g}, {o}, {{"shape", shape_text(shape)}});
    else not_of(c, g, o);
  } else if (kind == "le" || kind == "gt") {  // a <= b is b >= a
    std::string g = ge_of(c, b, a, shape, exact);
    if (kind == "le") c.emit("Reshape", {g}, {o}, {{"shape", shape_text(shape)}});
    else not_of(c, g, o);
  } else if (exact && integral(a) && integral(b)) {  // eq, ne of integers: ne = min(max(a - b, b - a), 1), eq = 1 - ne
    std::string d = c.tmp("d"), n = c.tmp("n"), m = c.tmp("m"), z = c.tmp("z");
    shape = binary(c, "Sub", a, b, d, false);
    c.emit("Neg", {d}, {n});
    c.emit("Maximum", {d, n}, {m});
    c.emit("Minimum", {m}, {kind == "ne" ? o : z}, {{"scalar", "1"}});
    if (kind == "eq") not_of(c, z, o);
  } else {  // eq, ne: Cast(a - b, bool)
    std::string d = c.tmp("d");
    shape = binary(c, "Sub", a, b, d, false);
    if (kind == "ne") {
      c.emit("Cast", {d}, {o}, {{"dtype", "bool"}});
    } else {
      std::string z = c.tmp("z");
      c.emit("Cast", {d}, {z}, {{"dtype", "bool"}});
      not_of(c, z, o);
    }
  }
  return shape;
}

void transpose(Ctx& c, const Value& x, int a, int b, const std::string& out) {
  c.emit("Transpose", {x.ir}, {out}, {{"dims", "[" + std::to_string(a) + ", " + std::to_string(b) + "]"}});
}

std::vector<std::int64_t> permute_into(Ctx& c, const Value& x, const std::vector<std::int64_t>& dims, const std::string& out) {
  std::size_t r = x.type.shape.size();
  if (dims.size() != r) c.fail("permute needs " + std::to_string(r) + " dims, got " + std::to_string(dims.size()));
  std::vector<int> want(r), cur(r);
  std::vector<bool> seen(r);
  for (std::size_t i = 0; i < r; ++i) {
    std::int64_t d = dims[i] < 0 ? dims[i] + static_cast<std::int64_t>(r) : dims[i];
    if (d < 0 || d >= static_cast<std::int64_t>(r) || seen[static_cast<std::size_t>(d)]) c.fail("permute dims " + ints_text(dims) + " are not a permutation");
    seen[static_cast<std::size_t>(d)] = true;
    want[i] = static_cast<int>(d);
    cur[i] = static_cast<int>(i);
  }
  std::vector<std::int64_t> shape(r);
  for (std::size_t i = 0; i < r; ++i) shape[i] = x.type.shape[static_cast<std::size_t>(want[i])];
  // a sequence of swaps (selection): position i gets dim want[i]
  std::vector<std::pair<int, int>> swaps;
  for (std::size_t i = 0; i < r; ++i) {
    auto j = static_cast<std::size_t>(std::find(cur.begin(), cur.end(), want[i]) - cur.begin());
    if (j != i) {
      swaps.emplace_back(static_cast<int>(i), static_cast<int>(j));
      std::swap(cur[i], cur[j]);
    }
  }
  if (swaps.empty()) return {};
  Value v = x;
  for (std::size_t k = 0; k < swaps.size(); ++k) {
    std::string o = k + 1 == swaps.size() ? out : c.tmp("p");
    transpose(c, v, swaps[k].first, swaps[k].second, o);
    v.ir = o;
  }
  return shape;
}

// sigmoid(x) = 1 / (1 + exp(-x))
std::string sigmoid_of(Ctx& c, const Value& x, const std::string& out) {
  std::string n = c.tmp("n"), e = c.tmp("e"), d = c.tmp("d");
  c.emit("Neg", {x.ir}, {n});
  c.emit("Exp", {n}, {e});
  c.emit("Add", {e}, {d}, {{"scalar", "1"}});
  std::string one = c.full({}, 1, x.type.dtype);
  c.emit("Div", {one, d}, {out});
  return out;
}

std::string dims_text(const std::vector<int>& d) {
  std::string o = "[";
  for (std::size_t i = 0; i < d.size(); ++i) o += (i ? ", " : "") + std::to_string(d[i]);
  return o + "]";
}

}  // namespace spmd::frontends
