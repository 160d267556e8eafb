// ir/placement.h - the placement of a tensor on one mesh axis: R, I, V, P(op) or S(d).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace spmd {

enum class ReduceOp : std::uint8_t { Sum, Avg, Max, Min };
std::string_view reduce_name(ReduceOp op);
std::optional<ReduceOp> parse_reduce(std::string_view text);

enum class PKind : std::uint8_t { R, I, V, P, S };

struct Placement {
  PKind kind = PKind::R;
  ReduceOp op = ReduceOp::Sum;  // meaningful for P
  std::int16_t dim = 0;         // meaningful for S (normalized to >= 0 once the rank is known)

  static Placement r() { return {PKind::R, ReduceOp::Sum, 0}; }
  static Placement i() { return {PKind::I, ReduceOp::Sum, 0}; }
  static Placement v() { return {PKind::V, ReduceOp::Sum, 0}; }
  static Placement p(ReduceOp op = ReduceOp::Sum) { return {PKind::P, op, 0}; }
  static Placement s(int d) { return {PKind::S, ReduceOp::Sum, static_cast<std::int16_t>(d)}; }

  bool is_r() const { return kind == PKind::R; }
  bool is_i() const { return kind == PKind::I; }
  bool is_v() const { return kind == PKind::V; }
  bool is_p() const { return kind == PKind::P; }
  bool is_s() const { return kind == PKind::S; }
  bool is_s(int d) const { return kind == PKind::S && dim == d; }
  // V or S(d): different data per rank.
  bool varying() const { return kind == PKind::V || kind == PKind::S; }
  // P(sum) and P(avg) commute with linear maps; P(max) and P(min) do not.
  bool linear_partial() const { return kind == PKind::P && (op == ReduceOp::Sum || op == ReduceOp::Avg); }

  friend bool operator==(const Placement& a, const Placement& b) {
    if (a.kind != b.kind) return false;
    if (a.kind == PKind::P) return a.op == b.op;
    if (a.kind == PKind::S) return a.dim == b.dim;
    return true;
  }
};

// "R", "I", "V", "P(sum)", "P(avg)", "S(1)". P(sum) prints as "P(sum)".
std::string to_string(Placement p);

// Parses R, I, V, P, P(sum|avg|max|min), S(d) and the DTensor spellings Replicate(), Shard(d),
// Partial(), Partial(avg). Returns nullopt on bad text; `error` then says why.
std::optional<Placement> parse_placement(std::string_view text, std::string* error);

}  // namespace spmd
