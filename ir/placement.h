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

// Four bytes (it is copied everywhere): kind, reduce op, dim, and the shard order of a dim cut by several axes.
struct Placement {
  PKind kind = PKind::R;
  ReduceOp op = ReduceOp::Sum;  // meaningful for P
  std::int8_t dim = 0;          // meaningful for S (normalized to >= 0 once the rank is known; |dim| < 128)
  // Meaningful for S: 0 when the axes that shard this dim cut it in mesh order (outer axis major, the
  // default); otherwise this axis's 1-based position in the dim's shard order (1 = major), the same for no
  // two axes of the dim (DTensor's _StridedShard, JAX's P(('z', 'y'))). See shard_order below.
  std::uint8_t ord = 0;

  static Placement r() { return {PKind::R, ReduceOp::Sum, 0, 0}; }
  static Placement i() { return {PKind::I, ReduceOp::Sum, 0, 0}; }
  static Placement v() { return {PKind::V, ReduceOp::Sum, 0, 0}; }
  static Placement p(ReduceOp op = ReduceOp::Sum) { return {PKind::P, op, 0, 0}; }
  static Placement s(int d) { return {PKind::S, ReduceOp::Sum, static_cast<std::int8_t>(d), 0}; }

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
    if (a.kind == PKind::S) return a.dim == b.dim && a.ord == b.ord;
    return true;
  }
};
static_assert(sizeof(Placement) == 4, "Placement is copied everywhere: keep it four bytes");

// ---- shard order: several axes on one dim ------------------------------------------------------------
// The axes (mesh indices) that shard dim d in `pl` (one entry per mesh axis), major first, into `out`;
// returns how many. With every ord 0 that is mesh order.
int shard_order(const Placement* pl, int n_axes, int d, int* out);
// Writes the shard order of dim d: `axes` (major first) must be exactly the axes that are S(d) in `pl`.
// Mesh order is stored as ord 0 on every one of them (the canonical form, so == compares layouts).
void set_shard_order(Placement* pl, int n_axes, int d, const int* axes, int n);
// Whether some dim of `pl` has a shard order other than mesh order.
bool has_strided(const Placement* pl, int n_axes);

// ---- torch.chunk blocks --------------------------------------------------------------------------------
// The range [lo, hi) of a dim of size n held by part `idx` of `parts` (torch.chunk: ceil(n/parts) each until
// the dim runs out).
void chunk_range(std::int64_t n, std::int64_t parts, std::int64_t idx, std::int64_t& lo, std::int64_t& hi);
// The block [lo, hi) of a dim of size n that the rank with coordinates `coord` holds when the axes `order[0..k)`
// cut it one after another, each cutting the block the ones before it left as torch.chunk does (DTensor's nested
// Shard placements: 6 over dp 2 x tp 4 is 3, 3 and then 1, 1, 1, 0 each); `size` and `coord` are indexed by axis.
// An even cut gives the flat block.
void nested_chunk(std::int64_t n, const int* order, int k, const std::int64_t* size, const std::int64_t* coord, std::int64_t& lo,
                  std::int64_t& hi);

// ---- what commutes with a pending reduction (the one place this is decided) ------------------------
// A pointwise map f applied to a value pending under op (every rank applies it to its own summand) keeps
// the value when f(op_r x_r) = op'_r f(x_r): then the result is pending under op'.
//   sum  needs f additive (f(a + b) = f(a) + f(b): linear, no offset);
//   avg  needs f affine (f(x) = c x + d, c and d the same on every rank of the axis);
//   max, min need f monotone: non-decreasing keeps them, non-increasing swaps them (max <-> min).
// Floating-point rounding is outside the promise, so a cast to a float dtype is the identity here;
// a cast to an integer dtype truncates (monotone, not affine); a cast to bool (x != 0) is neither.
struct PointwiseMap {
  bool additive = false;
  bool affine = false;
  int monotone = 0;  // +1 non-decreasing, -1 non-increasing, 0 neither (or unknown)
  static PointwiseMap identity() { return {true, true, +1}; }
  static PointwiseMap scale(double c) { return {true, true, c < 0 ? -1 : +1}; }       // c x (c = 0: constant 0, both)
  static PointwiseMap offset(int slope) { return {false, true, slope}; }             // x + b, x - b (+1); b - x (-1)
  static PointwiseMap times_unknown_sign() { return {true, true, 0}; }               // x * y, y a replicated tensor
  static PointwiseMap monotone_up() { return {false, false, +1}; }                   // ReLU, integer casts
  static PointwiseMap monotone_down() { return {false, false, -1}; }                 // Rsqrt (on its domain)
  static PointwiseMap opaque() { return {}; }                                        // GELU, SiLU, cast to bool, ...
};
// The reduction the result is pending under, or nullopt when f does not commute with op.
std::optional<ReduceOp> reduce_through(PointwiseMap f, ReduceOp op);

// Whether reducing over one axis with a and over another with b gives the same value in either order:
// sum and avg commute (both linear), and each op with itself; sum or avg with max or min, and max with
// min, do not. A value pending over several axes means the reduction of the innermost axis first
// (docs/semantics.md, section 1), so an outer axis may be reduced first only when this holds.
bool reductions_commute(ReduceOp a, ReduceOp b);

// "R", "I", "V", "P(sum)", "P(avg)", "S(1)". P(sum) prints as "P(sum)".
std::string to_string(Placement p);

// Parses R, I, V, P, P(sum|avg|max|min), S(d) and the DTensor spellings Replicate(), Shard(d),
// Partial(), Partial(avg). Returns nullopt on bad text; `error` then says why.
std::optional<Placement> parse_placement(std::string_view text, std::string* error);

}  // namespace spmd
