// ir/placement.cpp - parsing and printing placements, shard orders, torch.chunk blocks.
#include "ir/placement.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <utility>

namespace spmd {

std::string_view reduce_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "sum";
}

std::optional<ReduceOp> parse_reduce(std::string_view t) {
  if (t == "sum") return ReduceOp::Sum;
  if (t == "avg" || t == "mean") return ReduceOp::Avg;
  if (t == "max") return ReduceOp::Max;
  if (t == "min") return ReduceOp::Min;
  return std::nullopt;
}

std::optional<ReduceOp> reduce_through(PointwiseMap f, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return f.additive ? std::optional<ReduceOp>(op) : std::nullopt;
    case ReduceOp::Avg: return f.affine ? std::optional<ReduceOp>(op) : std::nullopt;
    case ReduceOp::Max:
    case ReduceOp::Min: {
      if (f.monotone == 0) return std::nullopt;
      if (f.monotone > 0) return op;
      return op == ReduceOp::Max ? ReduceOp::Min : ReduceOp::Max;
    }
  }
  return std::nullopt;
}

bool reductions_commute(ReduceOp a, ReduceOp b) {
  auto linear = [](ReduceOp x) { return x == ReduceOp::Sum || x == ReduceOp::Avg; };
  return a == b || (linear(a) && linear(b));
}

std::string to_string(Placement p) {
  switch (p.kind) {
    case PKind::R: return "R";
    case PKind::I: return "I";
    case PKind::V: return "V";
    case PKind::P: return "P(" + std::string(reduce_name(p.op)) + ")";
    case PKind::S: return "S(" + std::to_string(p.dim) + ")";
  }
  return "?";
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits "Name(arg)" into name and arg; `has_parens` tells whether parentheses were present.
bool split_call(std::string_view s, std::string_view& name, std::string_view& arg, bool& has_parens) {
  auto open = s.find('(');
  if (open == std::string_view::npos) {
    name = s;
    arg = {};
    has_parens = false;
    return true;
  }
  if (s.back() != ')') return false;
  name = trim(s.substr(0, open));
  arg = trim(s.substr(open + 1, s.size() - open - 2));
  has_parens = true;
  return true;
}

}  // namespace

std::optional<Placement> parse_placement(std::string_view text, std::string* error) {
  auto fail = [&](std::string why) -> std::optional<Placement> {
    if (error) *error = std::move(why);
    return std::nullopt;
  };
  std::string_view s = trim(text);
  std::string_view name, arg;
  bool parens = false;
  if (s.empty() || !split_call(s, name, arg, parens))
    return fail("bad placement '" + std::string(text) + "'; expected R, I, V, P, P(sum|avg|max|min) or S(d)");
  if ((name == "R" || name == "Replicate") && arg.empty()) return Placement::r();
  if ((name == "I" || name == "Invariant") && arg.empty()) return Placement::i();
  if ((name == "V" || name == "Varying") && arg.empty()) return Placement::v();
  if (name == "P" || name == "Partial") {
    if (arg.empty()) return Placement::p(ReduceOp::Sum);
    auto op = parse_reduce(arg);
    if (!op) return fail("bad reduce op '" + std::string(arg) + "' in placement '" + std::string(text) + "'; expected sum, avg, max or min");
    return Placement::p(*op);
  }
  if (name == "S" || name == "Shard") {
    if (!parens || arg.empty()) return fail("placement '" + std::string(text) + "' needs a dim, e.g. S(0)");
    int d = 0;
    auto res = std::from_chars(arg.data(), arg.data() + arg.size(), d);
    if (res.ec != std::errc() || res.ptr != arg.data() + arg.size() || d < -64 || d > 64)
      return fail("bad dim '" + std::string(arg) + "' in placement '" + std::string(text) + "'");
    return Placement::s(d);
  }
  return fail("bad placement '" + std::string(text) + "'; expected R, I, V, P, P(sum|avg|max|min) or S(d)");
}

void chunk_range(std::int64_t n, std::int64_t parts, std::int64_t idx, std::int64_t& lo, std::int64_t& hi) {
  std::int64_t c = (n + parts - 1) / parts;
  lo = std::min(n, idx * c);
  hi = std::min(n, lo + c);
}

void nested_chunk(std::int64_t n, const int* order, int k, const std::int64_t* size, const std::int64_t* coord, std::int64_t& lo,
                  std::int64_t& hi) {
  lo = 0, hi = n;
  for (int i = 0; i < k; ++i) {
    std::int64_t l, h;
    chunk_range(hi - lo, size[order[i]], coord[order[i]], l, h);
    hi = lo + h, lo += l;
  }
}

int shard_order(const Placement* pl, int n_axes, int d, int* out) {
  int n = 0;
  for (int a = 0; a < n_axes; ++a)
    if (pl[a].is_s(d)) out[n++] = a;
  // ord 0 (mesh order) sorts by mesh index; explicit positions by position (insertion sort: n <= 8)
  for (int i = 1; i < n; ++i)
    for (int j = i; j > 0; --j) {
      auto key = [&](int a) { return pl[a].ord ? pl[a].ord : 64 + a; };
      if (key(out[j]) < key(out[j - 1])) std::swap(out[j], out[j - 1]);
      else break;
    }
  return n;
}

void set_shard_order(Placement* pl, int n_axes, int d, const int* axes, int n) {
  bool mesh = true;
  for (int i = 1; i < n; ++i) mesh &= axes[i - 1] < axes[i];
  for (int a = 0; a < n_axes; ++a)
    if (pl[a].is_s(d)) pl[a].ord = 0;
  if (mesh) return;
  for (int i = 0; i < n; ++i) pl[axes[i]].ord = static_cast<std::uint8_t>(i + 1);
}

bool has_strided(const Placement* pl, int n_axes) {
  for (int a = 0; a < n_axes; ++a)
    if (pl[a].is_s() && pl[a].ord) return true;
  return false;
}

}  // namespace spmd
