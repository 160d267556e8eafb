// interp/interp.cpp - the numeric oracle: per-rank and single-device runs of a program, assembled and compared.
//
// Both runs go through one Runner: the single-device run is the same program on a mesh whose every axis
// has size 1, so every collective and conversion is the identity there by construction. Per-rank values
// carry the layout a real runtime would track (the global shape and, per dim, the mesh axes that shard it;
// DTensor keeps the same metadata): elementwise ops read a whole operand as its local slice, Reshape
// computes local target shapes, a vocab-sharded Embedding masks its lookup. The layout is only a means to
// run the ops; the verdict comes from the assembled numbers, so a wrong layout decision shows up as a
// difference, never as agreement.
#include "interp/interp.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <numeric>
#include <sstream>

#include "interp/tensor.h"

namespace spmd {

std::string_view verdict_name(OracleVerdict v) {
  switch (v) {
    case OracleVerdict::Agree: return "agree";
    case OracleVerdict::Differ: return "differ";
    case OracleVerdict::GlobalError: return "single-device run fails";
    case OracleVerdict::Skipped: return "skipped";
  }
  return "?";
}

namespace {

using namespace interp;

struct BudgetError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A taint that starts with this marks a value outside the promise altogether (Reinterpret): not even
// the agreement of ranks on an R output is checked. Other taints (V) still get that check.
constexpr char kExcluded = '!';

// A value on one rank: its local data and the layout a runtime tracks for it.
struct Val {
  Tensor t;
  Shape gshape;                      // global shape
  std::vector<std::uint32_t> mask;   // per dim: the mesh axes that shard it (mesh order = outer major)
  std::string taint;                 // single-device run only: why the global value is undefined
  bool defined = false;
};

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
double unit(std::uint64_t h) { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)

bool is_int(DType d) { return d == DType::I64 || d == DType::I32 || d == DType::I8 || d == DType::Bool; }

std::string coord_text(const Program& p, const std::vector<std::int64_t>& c) {
  std::string s = "{";
  for (std::size_t a = 0; a < c.size(); ++a) s += (a ? ", " : "") + p.mesh[a].name + ": " + std::to_string(c[a]);
  return s + "}";
}

// ---- the runner: one mesh (the real one, or all ones for the single-device run) ----------------
class Runner {
 public:
  Runner(const Program& p, const std::vector<std::int64_t>& vars, std::vector<std::int64_t> axis_sizes, bool global, const OracleOptions& o,
         std::int64_t& work, std::vector<std::int64_t> real_sizes = {})
      : p_(p), vars_(vars), sizes_(std::move(axis_sizes)), real_sizes_(std::move(real_sizes)), global_(global), opt_(o), work_(work) {
    if (real_sizes_.empty()) real_sizes_ = sizes_;
    ranks_ = 1;
    for (auto s : sizes_) ranks_ *= s;
    env_.assign(static_cast<std::size_t>(ranks_), std::vector<Val>(p.names.size()));
  }

  std::int64_t ranks() const { return ranks_; }
  const std::vector<std::int64_t>& sizes() const { return sizes_; }
  std::vector<std::int64_t> coords(std::int64_t r) const {
    std::vector<std::int64_t> c(sizes_.size());
    for (int a = static_cast<int>(sizes_.size()) - 1; a >= 0; --a) {
      c[static_cast<std::size_t>(a)] = r % sizes_[static_cast<std::size_t>(a)];
      r /= sizes_[static_cast<std::size_t>(a)];
    }
    return c;
  }
  std::int64_t rank_of(const std::vector<std::int64_t>& c) const {
    std::int64_t r = 0;
    for (std::size_t a = 0; a < sizes_.size(); ++a) r = r * sizes_[a] + c[a];
    return r;
  }
  Val& at(std::int64_t r, NameId n) { return env_[static_cast<std::size_t>(r)][static_cast<std::size_t>(n)]; }

  // Number of parts and this rank's part index for a set of axes (flattened in mesh order).
  void part(std::uint32_t axes, const std::vector<std::int64_t>& c, std::int64_t& n, std::int64_t& idx) const {
    n = 1, idx = 0;
    for (std::size_t a = 0; a < sizes_.size(); ++a)
      if (axes & (1u << a)) n *= sizes_[a], idx = idx * sizes_[a] + c[a];
  }
  void block(std::int64_t gsize, std::uint32_t axes, const std::vector<std::int64_t>& c, std::int64_t& lo, std::int64_t& hi) const {
    std::int64_t n, idx;
    part(axes, c, n, idx);
    chunk_range(gsize, n, idx, lo, hi);
  }
  Shape local_shape(const Val& v, const std::vector<std::int64_t>& c) const {
    Shape s(v.gshape.size());
    for (std::size_t d = 0; d < s.size(); ++d) {
      std::int64_t lo, hi;
      block(v.gshape[d], v.mask[d], c, lo, hi);
      s[d] = hi - lo;
    }
    return s;
  }

  // ---- inputs ---------------------------------------------------------------------------------
  void declare(const TensorDecl& t, std::int64_t range, std::uint64_t seed) {
    Shape g;
    for (ExprId e : t.shape) g.push_back(eval(e, "a dim of " + p_.name(t.name)));
    check_size(g);
    std::uint64_t key = mix(seed ^ std::hash<std::string>{}(p_.name(t.name)));
    for (std::int64_t r = 0; r < ranks_; ++r) {
      auto c = coords(r);
      Val v;
      v.defined = true;
      v.gshape = g;
      v.mask.assign(g.size(), 0);
      std::uint64_t pv = key;
      for (std::size_t a = 0; a < sizes_.size(); ++a) {
        Placement pl = t.placement[a];
        if (pl.is_s() && pl.dim >= 0 && pl.dim < static_cast<int>(g.size())) v.mask[static_cast<std::size_t>(pl.dim)] |= 1u << a;
        if (pl.is_p() || pl.is_v()) pv = mix(pv ^ (static_cast<std::uint64_t>(a) << 40) ^ static_cast<std::uint64_t>(c[a] + 1));
      }
      if (global_) {
        for (std::size_t a = 0; a < t.placement.size() && a < p_.mesh.size(); ++a)
          if (t.placement[a].is_v()) v.taint = p_.name(t.name) + " is declared V over " + p_.mesh[a].name;
      }
      Shape ls = local_shape(v, c);
      v.t = Tensor(ls);
      Shape lo(g.size());
      for (std::size_t d = 0; d < g.size(); ++d) {
        std::int64_t h;
        block(g[d], v.mask[d], c, lo[d], h);
      }
      Shape gst = strides_of(g);
      Shape idx(ls.size(), 0);
      for (std::size_t w = 0; w < v.t.data.size(); ++w) {
        std::int64_t flat = 0;
        for (std::size_t d = 0; d < ls.size(); ++d) flat += (lo[d] + idx[d]) * gst[d];
        std::uint64_t h = mix(pv ^ static_cast<std::uint64_t>(flat));
        if (t.dtype == DType::Bool) range = 2;
        v.t.data[w] = is_int(t.dtype) ? static_cast<double>(h % static_cast<std::uint64_t>(std::max<std::int64_t>(1, range)))
                                      : unit(h) * 4.0 - 2.0;  // [-2, 2): integer casts are not all 0
        for (int d = static_cast<int>(ls.size()) - 1; d >= 0; --d) {
          if (++idx[static_cast<std::size_t>(d)] < ls[static_cast<std::size_t>(d)]) break;
          idx[static_cast<std::size_t>(d)] = 0;
        }
      }
      at(r, t.name) = std::move(v);
    }
  }

  // ---- the op loop (a scheduler over per-rank op lists, so per-rank programs can plug in) --------
  void run(std::uint64_t seed) {
    seed_ = seed;
    std::vector<int> prog(p_.ops.size());
    std::iota(prog.begin(), prog.end(), 0);
    std::vector<std::size_t> pc(static_cast<std::size_t>(ranks_), 0);
    auto group_op = [&](const Op& op) {
      return op_info(op.kind).category == OpCategory::collective || (op.kind == OpKind::CrossEntropyLoss && op.attrs.vocab_parallel);
    };
    for (;;) {
      bool progress = false, done = true;
      for (std::int64_t r = 0; r < ranks_; ++r) {
        auto& i = pc[static_cast<std::size_t>(r)];
        while (i < prog.size()) {
          const Op& op = p_.ops[static_cast<std::size_t>(prog[i])];
          if (group_op(op)) break;
          if (op.kind == OpKind::Recv && !global_ && queue(op, r, true).empty()) break;
          step_local(prog[i], r);
          ++i;
          progress = true;
        }
        if (i < prog.size()) done = false;
      }
      if (done) return;
      for (std::int64_t r = 0; r < ranks_; ++r) {
        auto i = pc[static_cast<std::size_t>(r)];
        if (i >= prog.size() || !group_op(p_.ops[static_cast<std::size_t>(prog[i])])) continue;
        int oi = prog[i];
        auto members = group(p_.ops[static_cast<std::size_t>(oi)], r);
        bool ready = std::all_of(members.begin(), members.end(), [&](std::int64_t m) {
          auto j = pc[static_cast<std::size_t>(m)];
          return j < prog.size() && prog[j] == oi;
        });
        if (!ready) continue;
        step_group(oi, members);
        for (auto m : members) ++pc[static_cast<std::size_t>(m)];
        progress = true;
      }
      if (!progress) throw InterpError("no rank can make progress (a Recv with no matching Send, or a collective some ranks never reach)");
    }
  }

  int failed_op = -1;  // the op a thrown InterpError came from
  // When set (a shape-only pre-run with all integer inputs 0), records the range integer inputs must take:
  // Embedding ids index the table's rows, labels the logits' vocab.
  std::vector<std::int64_t>* int_range = nullptr;

 private:
  std::int64_t eval(ExprId e, const std::string& what) const {
    auto v = p_.exprs.eval(e, vars_);
    if (!v || *v < 0) throw InterpError(what + " (" + p_.expr_str(e) + ") has no value under these sizes");
    return *v;
  }
  void check_size(const Shape& s) const {
    std::int64_t n = 1;
    for (auto d : s) {
      if (d > opt_.max_elements || (n *= std::max<std::int64_t>(d, 1)) > opt_.max_elements)
        throw BudgetError("a tensor of shape " + shape_text(s) + " exceeds the interpreter's limit of " + std::to_string(opt_.max_elements) + " elements");
    }
  }
  void charge(std::int64_t n) {
    work_ += n;
    if (work_ > opt_.max_work) throw BudgetError("the run exceeds the interpreter's work limit (" + std::to_string(opt_.max_work) + " element operations)");
  }

  const Val& in(int op, std::int64_t r, int i) {
    const Op& o = p_.ops[static_cast<std::size_t>(op)];
    NameId n = p_.ins(o)[static_cast<std::size_t>(i)];
    const Val& v = at(r, n);
    if (!v.defined) throw InterpError("reads '" + p_.name(n) + "', which nothing defines");
    return v;
  }
  int n_in(int op) const { return p_.ops[static_cast<std::size_t>(op)].n_in; }
  std::string taint_of(int op, std::int64_t r) {
    std::string t;
    for (int i = 0; i < n_in(op); ++i) {
      const Val& v = in(op, r, i);
      if (!v.taint.empty() && (t.empty() || v.taint[0] == kExcluded)) t = v.taint;
    }
    return t;
  }
  void set_out(int op, std::int64_t r, int k, Val v, const std::string& taint) {
    const Op& o = p_.ops[static_cast<std::size_t>(op)];
    v.defined = true;
    if (v.taint.empty() || (!taint.empty() && taint[0] == kExcluded)) v.taint = taint;
    if (v.mask.size() != v.gshape.size()) v.mask.resize(v.gshape.size(), 0);
    check_size(v.gshape);
    Shape want = local_shape(v, coords(r));
    if (want != v.t.shape)
      throw InterpError("the local result has shape " + shape_text(v.t.shape) + ", but its layout (global " + shape_text(v.gshape) + ") needs " +
                        shape_text(want) + " on rank " + coord_text(p_, coords(r)));
    charge(v.t.numel() + 1);
    at(r, p_.outs(o)[static_cast<std::size_t>(k)]) = std::move(v);
  }

  // Slices `v` so that dim d holds the block of `target[d]` (the operand's own block must contain it).
  Tensor align(const Val& v, const std::vector<std::uint32_t>& target, const std::vector<std::int64_t>& c, const std::string& what) const {
    Tensor t = v.t;
    for (std::size_t d = 0; d < v.gshape.size(); ++d) {
      if (target[d] == v.mask[d] || v.gshape[d] == 1) continue;
      std::int64_t lo, hi, olo, ohi;
      block(v.gshape[d], target[d], c, lo, hi);
      block(v.gshape[d], v.mask[d], c, olo, ohi);
      if (lo < olo || hi > ohi)
        throw InterpError(what + " holds [" + std::to_string(olo) + ", " + std::to_string(ohi) + ") of dim " + std::to_string(d) + " on rank " +
                          coord_text(p_, c) + ", but the other operand needs [" + std::to_string(lo) + ", " + std::to_string(hi) +
                          "): no local slice gives it");
      t = slice(t, static_cast<int>(d), lo - olo, hi - olo);
    }
    return t;
  }

  // Right-aligned union of the masks of two operands (broadcast dims of size 1 carry no shard).
  static std::vector<std::uint32_t> union_masks(const Val& x, const Val& y, std::size_t r, std::size_t skip_tail = 0) {
    std::vector<std::uint32_t> m(r, 0);
    for (std::size_t k = 0; k + skip_tail < r; ++k) {
      auto pick = [&](const Val& v) -> std::uint32_t {
        std::size_t rv = v.gshape.size() - skip_tail;
        if (k + rv < r - skip_tail) return 0;
        std::size_t d = k + rv - (r - skip_tail);
        return v.gshape[d] == 1 ? 0 : v.mask[d];
      };
      m[k] = pick(x) | pick(y);
    }
    return m;
  }
  // The masks of `v`'s dims taken from an output-shaped mask (right-aligned).
  static std::vector<std::uint32_t> slice_target(const Val& v, const std::vector<std::uint32_t>& out, std::size_t skip_tail = 0) {
    std::vector<std::uint32_t> t = v.mask;
    std::size_t rv = v.gshape.size() - skip_tail, r = out.size() - skip_tail;
    for (std::size_t d = 0; d < rv; ++d)
      if (v.gshape[d] != 1) t[d] = out[d + r - rv];
    return t;
  }

  std::vector<int> norm_dims(std::uint32_t list, int rank, bool default_last) const {
    std::vector<int> dims;
    if (list == kNoIndex) {
      if (default_last && rank > 0) dims.push_back(rank - 1);
      return dims;
    }
    for (int d : p_.int_lists[list]) {
      if (d < -rank || d >= rank) throw InterpError("dim " + std::to_string(d) + " out of range for rank " + std::to_string(rank));
      d = d < 0 ? d + rank : d;
      if (std::find(dims.begin(), dims.end(), d) != dims.end()) throw InterpError("dim listed twice");
      dims.push_back(d);
    }
    std::sort(dims.begin(), dims.end());
    return dims;
  }
  static int norm_dim(int d, int rank) {
    if (d == kUnset) d = -1;
    if (d < -rank || d >= rank) throw InterpError("dim " + std::to_string(d) + " out of range for rank " + std::to_string(rank));
    return d < 0 ? d + rank : d;
  }

  // ---- compute ops ----------------------------------------------------------------------------
  void step_local(int oi, std::int64_t r) {
    failed_op = oi;
    const Op& op = p_.ops[static_cast<std::size_t>(oi)];
    const OpAttrs& at = op.attrs;
    auto c = coords(r);
    std::string taint = global_ ? taint_of(oi, r) : "";
    switch (op.kind) {
      case OpKind::MatMul: return matmul(oi, r, c, taint);
      case OpKind::Add:
      case OpKind::Sub:
      case OpKind::Multiply: return elementwise(oi, r, c, taint);
      case OpKind::SiLU:
      case OpKind::GELU:
      case OpKind::ReLU:
      case OpKind::FP8Quantize:
      case OpKind::Cast:
      case OpKind::LossScale:
      case OpKind::FP8Dequantize: {
        Val v = in(oi, r, 0);
        DType dt = at.has_dtype ? at.dtype : DType::F32;
        v.t = unary(v.t, [&](double x) {
          switch (op.kind) {
            case OpKind::SiLU: return x / (1 + std::exp(-x));
            case OpKind::GELU: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
            case OpKind::ReLU: return x > 0 ? x : 0.0;
            case OpKind::FP8Quantize: {  // e4m3-like: 3 mantissa bits, round to nearest
              if (x == 0 || !std::isfinite(x)) return x;
              int e = std::ilogb(x);
              double q = std::ldexp(1.0, e - 3);
              return std::round(x / q) * q;
            }
            case OpKind::Cast:
              if (!at.has_dtype || !is_int(dt)) return x;
              return dt == DType::Bool ? (x != 0 ? 1.0 : 0.0) : std::trunc(x);
            case OpKind::LossScale: return x * at.number;
            default: return x;
          }
        });
        return set_out(oi, r, 0, std::move(v), taint);
      }
      case OpKind::Dropout: return dropout(oi, r, c, taint);
      case OpKind::LayerNorm:
      case OpKind::RMSNorm: return norm(oi, r, c, taint);
      case OpKind::Softmax: {
        Val v = in(oi, r, 0);
        int d = norm_dim(at.dim, v.t.rank());
        for_each_group(v.t, {d}, softmax_line);
        return set_out(oi, r, 0, std::move(v), taint);
      }
      case OpKind::Sum:
      case OpKind::Mean: return reduce_dims(oi, r, taint);
      case OpKind::FlashAttention: return attention(oi, r, taint);
      case OpKind::Embedding: return embedding(oi, r, c, taint);
      case OpKind::CrossEntropyLoss: return cross_entropy(oi, {r});
      case OpKind::TopKGate: return topk(oi, r, taint);
      case OpKind::AmaxUpdate: {
        const Val& x = in(oi, r, 0);
        Val v;
        v.t = Tensor({}, 0.0);
        for (double e : x.t.data) v.t.data[0] = std::max(v.t.data[0], std::abs(e));
        return set_out(oi, r, 0, std::move(v), taint);
      }
      case OpKind::Reshape: return reshape(oi, r, taint);
      case OpKind::Transpose: {
        Val v = in(oi, r, 0);
        const auto& dims = p_.int_lists[at.dims];
        if (dims.size() != 2) throw InterpError("Transpose takes two dims");
        int d0 = norm_dim(dims[0], v.t.rank()), d1 = norm_dim(dims[1], v.t.rank());
        v.t = transpose(v.t, d0, d1);
        std::swap(v.gshape[static_cast<std::size_t>(d0)], v.gshape[static_cast<std::size_t>(d1)]);
        std::swap(v.mask[static_cast<std::size_t>(d0)], v.mask[static_cast<std::size_t>(d1)]);
        return set_out(oi, r, 0, std::move(v), taint);
      }
      case OpKind::Reinterpret:
        return set_out(oi, r, 0, in(oi, r, 0), global_ ? std::string(1, kExcluded) + "it passes through Reinterpret, which changes the global value on purpose" : "");
      case OpKind::Convert: return convert(oi, r, c, taint);
      case OpKind::SPMDGuard:
        if (op.n_out) set_out(oi, r, 0, in(oi, r, 0), taint);
        return;
      case OpKind::Send: {
        if (global_) return;
        Val v = in(oi, r, 0);
        std::int64_t dst = peer(op, r);
        queues_[{r, dst}].push_back(std::move(v));
        return;
      }
      case OpKind::Recv: {
        Shape g;
        if (at.shape == kNoIndex) throw InterpError("Recv needs `shape:`");
        for (ExprId e : p_.shapes[at.shape]) g.push_back(eval(e, "a dim of a Recv"));
        Val v;
        v.gshape = g;
        v.mask.assign(g.size(), 0);
        if (at.placements != kNoIndex)
          for (std::size_t a = 0; a < p_.mesh.size(); ++a) {
            Placement pl = p_.placement_maps[at.placements][a];
            if (pl.is_s()) v.mask[static_cast<std::size_t>(norm_dim(pl.dim, static_cast<int>(g.size())))] |= 1u << a;
          }
        if (global_) {
          v.t = Tensor(local_shape(v, c), 0.0);
          return set_out(oi, r, 0, std::move(v), "it is received point-to-point, which has no single-device meaning");
        }
        auto& q = queue(op, r, true);
        Val got = std::move(q.front());
        q.pop_front();
        v.t = std::move(got.t);
        return set_out(oi, r, 0, std::move(v), "");
      }
      case OpKind::Wait:
      case OpKind::WaitAll: return;  // async values are available at their op; a Wait moves no data
      // Opaque ops (OverlapRegion, a schedule's Step) and the gradient ops of derived backwards have no
      // numeric kernel yet: the program is skipped with the reason, never counted as agreement.
      default: throw InterpError(std::string(op_name(op.kind)) + " has no numeric kernel in the oracle");
    }
  }

  std::int64_t peer(const Op& op, std::int64_t r) const {
    auto c = coords(r);
    if (op.attrs.coords == kNoIndex) throw InterpError("point-to-point op without `peer`");
    for (auto [a, v] : p_.coords[op.attrs.coords]) {
      if (v >= sizes_[static_cast<std::size_t>(a)]) throw InterpError("peer coordinate " + std::to_string(v) + " is outside axis " + p_.mesh[static_cast<std::size_t>(a)].name);
      c[static_cast<std::size_t>(a)] = v;
    }
    return rank_of(c);
  }
  std::deque<Val>& queue(const Op& op, std::int64_t r, bool incoming) {
    std::int64_t q = peer(op, r);
    return incoming ? queues_[{q, r}] : queues_[{r, q}];
  }

  static void softmax_line(std::vector<double>& x) {
    double m = -INFINITY;
    for (double v : x) m = std::max(m, v);
    double s = 0;
    for (double& v : x) s += (v = std::exp(v - m));
    for (double& v : x) v /= s;
  }

  void elementwise(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
    const Op& op = p_.ops[static_cast<std::size_t>(oi)];
    auto f = [&](double a, double b) { return op.kind == OpKind::Add ? a + b : op.kind == OpKind::Sub ? a - b : a * b; };
    if (op.n_in == 1) {
      Val v = in(oi, r, 0);
      double s = op.attrs.number;
      v.t = unary(v.t, [&](double a) { return f(a, s); });
      return set_out(oi, r, 0, std::move(v), taint);
    }
    const Val& x = in(oi, r, 0);
    const Val& y = in(oi, r, 1);
    Val o;
    o.gshape = broadcast_shapes(x.gshape, y.gshape);
    o.mask = union_masks(x, y, o.gshape.size());
    Tensor xl = align(x, slice_target(x, o.mask), c, p_.name(p_.ins(op)[0]));
    Tensor yl = align(y, slice_target(y, o.mask), c, p_.name(p_.ins(op)[1]));
    o.t = binary(xl, yl, f);
    set_out(oi, r, 0, std::move(o), taint);
  }

  void matmul(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
    const Op& op = p_.ops[static_cast<std::size_t>(oi)];
    const Val& A = in(oi, r, 0);
    const Val& B = in(oi, r, 1);
    if (A.gshape.size() < 2 || B.gshape.size() < 2) throw InterpError("MatMul needs rank >= 2");
    Shape ab(A.gshape.begin(), A.gshape.end() - 2), bb(B.gshape.begin(), B.gshape.end() - 2);
    Val o;
    o.gshape = broadcast_shapes(ab, bb);
    std::size_t nb = o.gshape.size();
    o.gshape.push_back(A.gshape[A.gshape.size() - 2]);
    o.gshape.push_back(B.gshape.back());
    o.mask = union_masks(A, B, o.gshape.size(), 2);
    o.mask[nb] = A.mask[A.gshape.size() - 2];
    o.mask[nb + 1] = B.mask.back();
    auto target = [&](const Val& v) {
      auto t = slice_target(v, o.mask, 2);
      return t;
    };
    Tensor al = align(A, target(A), c, p_.name(p_.ins(op)[0]));
    Tensor bl = align(B, target(B), c, p_.name(p_.ins(op)[1]));
    charge(numel_of(al.shape) * bl.shape.back());
    o.t = interp::matmul(al, bl);
    set_out(oi, r, 0, std::move(o), taint);
  }

  void dropout(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
    const Op& op = p_.ops[static_cast<std::size_t>(oi)];
    Val v = in(oi, r, 0);
    double p = op.attrs.has_number ? op.attrs.number : 0.1;
    std::string t = taint;
    if (op.attrs.rng_per_rank && global_) t = "Dropout with `rng: per_rank` draws a different mask on every rank";
    // The mask is a function of the element's global position (and of the rank with rng: per_rank).
    std::uint64_t key = mix(seed_ * 7919 + static_cast<std::uint64_t>(oi));
    if (op.attrs.rng_per_rank) key = mix(key ^ static_cast<std::uint64_t>(r + 1));
    Shape lo(v.gshape.size());
    for (std::size_t d = 0; d < lo.size(); ++d) {
      std::int64_t h;
      block(v.gshape[d], v.mask[d], c, lo[d], h);
    }
    Shape gst = strides_of(v.gshape);
    Shape idx(v.t.shape.size(), 0);
    for (auto& x : v.t.data) {
      std::int64_t flat = 0;
      for (std::size_t d = 0; d < idx.size(); ++d) flat += (lo[d] + idx[d]) * gst[d];
      x = unit(mix(key ^ static_cast<std::uint64_t>(flat))) < p ? 0.0 : x / (1 - p);
      for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
        if (++idx[static_cast<std::size_t>(d)] < v.t.shape[static_cast<std::size_t>(d)]) break;
        idx[static_cast<std::size_t>(d)] = 0;
      }
    }
    set_out(oi, r, 0, std::move(v), t);
  }

  void norm(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
    const Op& op = p_.ops[static_cast<std::size_t>(oi)];
    Val v = in(oi, r, 0);
    auto dims = norm_dims(op.attrs.dims, v.t.rank(), true);
    double eps = op.attrs.has_number ? op.attrs.number : 1e-5;
    bool rms = op.kind == OpKind::RMSNorm;
    for_each_group(v.t, dims, [&](std::vector<double>& x) {
      if (x.empty()) return;
      double mean = 0, var = 0;
      if (!rms) {
        for (double e : x) mean += e;
        mean /= static_cast<double>(x.size());
      }
      for (double e : x) var += (e - mean) * (e - mean);
      var /= static_cast<double>(x.size());
      for (double& e : x) e = (e - mean) / std::sqrt(var + eps);
    });
    // weight (and bias) span the normalized dims: each rank reads its own block of them.
    for (int i = 1; i < op.n_in; ++i) {
      const Val& w = in(oi, r, i);
      if (w.gshape.size() != dims.size()) throw InterpError("a norm weight must have the shape of the normalized dims");
      std::vector<std::uint32_t> target(dims.size());
      for (std::size_t k = 0; k < dims.size(); ++k) target[k] = v.mask[static_cast<std::size_t>(dims[k])];
      Tensor wl = align(w, target, c, p_.name(p_.ins(op)[static_cast<std::size_t>(i)]));
      // Move the weight's dims to the normalized positions: broadcast by reshaping to rank(x) with ones.
      Shape ws(v.t.shape.size(), 1);
      for (std::size_t k = 0; k < dims.size(); ++k) ws[static_cast<std::size_t>(dims[k])] = wl.shape[k];
      wl = interp::reshape(wl, ws);
      v.t = binary(v.t, wl, [&](double a, double b) { return i == 1 ? a * b : a + b; });
    }
    set_out(oi, r, 0, std::move(v), taint);
  }

  void reduce_dims(int oi, std::int64_t r, const std::string& taint) {
    const Op& op = p_.ops[static_cast<std::size_t>(oi)];
    const Val& x = in(oi, r, 0);
    auto dims = norm_dims(op.attrs.dims, x.t.rank(), false);
    Val o;
    o.t = reduce(x.t, dims, op.attrs.keepdim, 0.0, [](double a, double b) { return a + b; });
    if (op.kind == OpKind::Mean) {
      std::int64_t n = 1;
      for (int d : dims) n *= x.t.shape[static_cast<std::size_t>(d)];
      for (auto& e : o.t.data) e = n ? e / static_cast<double>(n) : NAN;
    }
    for (std::size_t d = 0; d < x.gshape.size(); ++d) {
      bool red = std::find(dims.begin(), dims.end(), static_cast<int>(d)) != dims.end();
      if (red && !op.attrs.keepdim) continue;
      o.gshape.push_back(red ? 1 : x.gshape[d]);
      o.mask.push_back(red ? 0 : x.mask[d]);
    }
    set_out(oi, r, 0, std::move(o), taint);
  }

  void attention(int oi, std::int64_t r, const std::string& taint) {
    const Op& op = p_.ops[static_cast<std::size_t>(oi)];
    int b = 0, h = 1, s = 2, dd = 3;
    if (op.attrs.layout == AttnLayout::BSHD) s = 1, h = 2;
    if (op.attrs.layout == AttnLayout::SBHD) s = 0, b = 1, h = 2;
    const Val& q = in(oi, r, 0);
    const Val& k = in(oi, r, 1);
    const Val& v = in(oi, r, 2);
    if (q.t.rank() != 4 || k.t.rank() != 4 || v.t.rank() != 4) throw InterpError("FlashAttention needs rank-4 q, k, v");
    auto L = [](const Tensor& t, int d) { return t.shape[static_cast<std::size_t>(d)]; };
    std::int64_t B = L(q.t, b), HQ = L(q.t, h), SQ = L(q.t, s), D = L(q.t, dd), HK = L(k.t, h), SK = L(k.t, s), DV = L(v.t, dd);
    if (L(k.t, b) != B || L(v.t, b) != B || L(k.t, dd) != D || L(v.t, s) != SK || L(v.t, h) != HK || HK == 0 || HQ % HK != 0)
      throw InterpError("FlashAttention local shapes do not fit: q " + shape_text(q.t.shape) + ", k " + shape_text(k.t.shape) + ", v " + shape_text(v.t.shape));
    Val o;
    o.gshape = q.gshape;
    o.mask = q.mask;
    o.gshape[static_cast<std::size_t>(dd)] = v.gshape[static_cast<std::size_t>(dd)];
    o.mask[static_cast<std::size_t>(dd)] = v.mask[static_cast<std::size_t>(dd)];
    Shape os = q.t.shape;
    os[static_cast<std::size_t>(dd)] = DV;
    o.t = Tensor(os);
    auto idx = [&](const Tensor& t, std::int64_t bi, std::int64_t hi, std::int64_t si, std::int64_t di) {
      std::int64_t pos[4];
      pos[b] = bi, pos[h] = hi, pos[s] = si, pos[dd] = di;
      std::int64_t off = 0;
      for (int d = 0; d < 4; ++d) off = off * t.shape[static_cast<std::size_t>(d)] + pos[d];
      return static_cast<std::size_t>(off);
    };
    charge(B * HQ * SQ * SK * (D + DV));
    double scale = D ? 1.0 / std::sqrt(static_cast<double>(D)) : 1.0;
    std::vector<double> w(static_cast<std::size_t>(SK));
    for (std::int64_t bi = 0; bi < B; ++bi)
      for (std::int64_t hi = 0; hi < HQ; ++hi) {
        std::int64_t kh = hi / (HQ / HK);
        for (std::int64_t i = 0; i < SQ; ++i) {
          double m = -INFINITY;
          for (std::int64_t j = 0; j < SK; ++j) {
            double sc = 0;
            for (std::int64_t d = 0; d < D; ++d) sc += q.t.data[idx(q.t, bi, hi, i, d)] * k.t.data[idx(k.t, bi, kh, j, d)];
            w[static_cast<std::size_t>(j)] = op.attrs.causal && j > i ? -INFINITY : sc * scale;
            m = std::max(m, w[static_cast<std::size_t>(j)]);
          }
          double z = 0;
          for (auto& e : w) z += (e = std::isinf(e) ? 0.0 : std::exp(e - m));
          for (std::int64_t d = 0; d < DV; ++d) {
            double acc = 0;
            for (std::int64_t j = 0; j < SK; ++j) acc += w[static_cast<std::size_t>(j)] * v.t.data[idx(v.t, bi, kh, j, d)];
            o.t.data[idx(o.t, bi, hi, i, d)] = z > 0 ? acc / z : 0.0;
          }
        }
      }
    set_out(oi, r, 0, std::move(o), taint);
  }

  void note_range(NameId n, std::int64_t limit) {
    if (!int_range) return;
    auto& r = (*int_range)[static_cast<std::size_t>(n)];
    r = r < 0 ? limit : std::min(r, limit);
  }

  static std::int64_t as_index(double x, std::int64_t limit, const char* what) {
    if (!(x >= 0) || x != std::floor(x) || x >= static_cast<double>(limit))
      throw InterpError(std::string(what) + " value " + std::to_string(x) + " is not an index below " + std::to_string(limit));
    return static_cast<std::int64_t>(x);
  }

  void embedding(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
    const Val& ids = in(oi, r, 0);
    const Val& w = in(oi, r, 1);
    if (w.gshape.size() != 2) throw InterpError("Embedding weight must be [vocab, hidden]");
    note_range(p_.ins(p_.ops[static_cast<std::size_t>(oi)])[0], w.gshape[0]);
    std::int64_t lo, hi;
    block(w.gshape[0], w.mask[0], c, lo, hi);
    std::int64_t hl = w.t.shape[1];
    Val o;
    o.gshape = ids.gshape;
    o.gshape.push_back(w.gshape[1]);
    o.mask = ids.mask;
    o.mask.push_back(w.mask[1]);
    Shape s = ids.t.shape;
    s.push_back(hl);
    o.t = Tensor(s);
    for (std::size_t i = 0; i < ids.t.data.size(); ++i) {
      std::int64_t id = as_index(ids.t.data[i], w.gshape[0], "an Embedding id");
      if (id < lo || id >= hi) continue;  // masked lookup: another rank holds this row
      std::copy_n(w.t.data.begin() + static_cast<std::ptrdiff_t>((id - lo) * hl), hl, o.t.data.begin() + static_cast<std::ptrdiff_t>(i) * hl);
    }
    set_out(oi, r, 0, std::move(o), taint);
  }

  void topk(int oi, std::int64_t r, const std::string& taint) {
    const Op& op = p_.ops[static_cast<std::size_t>(oi)];
    const Val& x = in(oi, r, 0);
    if (x.t.rank() < 1) throw InterpError("TopKGate needs an expert dim");
    std::int64_t E = x.t.shape.back(), K = op.attrs.k;
    if (K > E) throw InterpError("TopKGate k = " + std::to_string(K) + " exceeds the " + std::to_string(E) + " local experts");
    Val vals, idxs;
    vals.gshape = idxs.gshape = x.gshape;
    vals.gshape.back() = idxs.gshape.back() = K;
    vals.mask = idxs.mask = x.mask;
    vals.mask.back() = idxs.mask.back() = 0;
    Shape s = x.t.shape;
    s.back() = K;
    vals.t = idxs.t = Tensor(s);
    std::int64_t rows = E ? x.t.numel() / E : 0;
    std::vector<double> line(static_cast<std::size_t>(E));
    std::vector<std::int64_t> order(static_cast<std::size_t>(E));
    for (std::int64_t row = 0; row < rows; ++row) {
      std::copy_n(x.t.data.begin() + row * E, E, line.begin());
      softmax_line(line);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](auto a, auto b2) { return line[static_cast<std::size_t>(a)] > line[static_cast<std::size_t>(b2)]; });
      for (std::int64_t j = 0; j < K; ++j) {
        vals.t.data[static_cast<std::size_t>(row * K + j)] = line[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])];
        idxs.t.data[static_cast<std::size_t>(row * K + j)] = static_cast<double>(order[static_cast<std::size_t>(j)]);
      }
    }
    set_out(oi, r, 0, std::move(vals), taint);
    set_out(oi, r, 1, std::move(idxs), taint);
  }

  // Reshape: a shard on an input dim moves to the first output dim of its group (the dims whose sizes
  // multiply to the same product); local target shapes follow from that layout.
  void reshape(int oi, std::int64_t r, const std::string& taint) {
    const Op& op = p_.ops[static_cast<std::size_t>(oi)];
    const Val& x = in(oi, r, 0);
    Val o;
    for (ExprId e : p_.shapes[op.attrs.shape]) o.gshape.push_back(eval(e, "a dim of a Reshape target"));
    if (numel_of(o.gshape) != numel_of(x.gshape))
      throw InterpError("Reshape of " + shape_text(x.gshape) + " to " + shape_text(o.gshape) + " changes the element count");
    o.mask.assign(o.gshape.size(), 0);
    std::size_t i = 0, j = 0, ri = x.gshape.size(), rj = o.gshape.size();
    while (i < ri) {
      if (x.gshape[i] == 1) {
        ++i;
        continue;
      }
      while (j < rj && o.gshape[j] == 1) ++j;
      if (j >= rj) break;
      std::size_t i0 = i, j0 = j;
      std::int64_t pi = x.gshape[i++], pj = o.gshape[j++];
      while (pi != pj) {
        if (pi < pj && i < ri) pi *= x.gshape[i++];
        else if (pj < pi && j < rj) pj *= o.gshape[j++];
        else break;
      }
      for (std::size_t k = i0; k < i; ++k) o.mask[j0] |= x.mask[k];
    }
    o.t = interp::reshape(x.t, local_shape(o, coords(r)));
    set_out(oi, r, 0, std::move(o), taint);
  }

  void convert(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
    const Op& op = p_.ops[static_cast<std::size_t>(oi)];
    Val v = in(oi, r, 0);
    Placement to = op.attrs.to;
    std::string t = taint;
    if (to.is_s()) {
      int d = norm_dim(to.dim, v.t.rank());
      std::uint32_t axes = op.attrs.axes & ~v.mask[static_cast<std::size_t>(d)];
      std::int64_t n, idx, lo, hi;
      part(axes, c, n, idx);
      chunk_range(v.t.shape[static_cast<std::size_t>(d)], n, idx, lo, hi);
      v.t = slice(v.t, d, lo, hi);
      v.mask[static_cast<std::size_t>(d)] |= axes;
    } else if (to.is_p() && !global_) {
      // S(d) -> P: each rank's shard in its slot of a zero tensor, so the sum over the axes is the whole.
      for (int d = 0; d < v.t.rank(); ++d) {
        std::uint32_t axes = op.attrs.axes & v.mask[static_cast<std::size_t>(d)];
        if (!axes) continue;
        std::int64_t n, idx, lo, hi;
        part(axes, c, n, idx);
        std::int64_t piece = v.t.shape[static_cast<std::size_t>(d)], full = piece * n;
        chunk_range(full, n, idx, lo, hi);
        Shape zs = v.t.shape;
        zs[static_cast<std::size_t>(d)] = full;
        Tensor z(zs, 0.0);
        std::int64_t outer = 1, inner = 1;
        for (int k = 0; k < d; ++k) outer *= v.t.shape[static_cast<std::size_t>(k)];
        for (int k = d + 1; k < v.t.rank(); ++k) inner *= v.t.shape[static_cast<std::size_t>(k)];
        for (std::int64_t o = 0; o < outer; ++o)
          for (std::int64_t i = 0; i < piece; ++i)
            for (std::int64_t q = 0; q < inner; ++q)
              z.data[static_cast<std::size_t>((o * full + lo + i) * inner + q)] = v.t.data[static_cast<std::size_t>((o * piece + i) * inner + q)];
        v.t = std::move(z);
        v.mask[static_cast<std::size_t>(d)] &= ~axes;
      }
    } else if (to.is_v() && global_) {
      t = "Convert to V gives per-rank values with no global value";
    }
    set_out(oi, r, 0, std::move(v), t);
  }

  // ---- collectives (and the vocab-parallel loss, whose max and sum all-reduce inside) ----------------
  std::vector<std::int64_t> group(const Op& op, std::int64_t r) {
    std::uint32_t axes = op.attrs.axes;
    if (op.kind == OpKind::CrossEntropyLoss && !axes) {
      // No `axis`: the axes that shard the vocab; with none, the group a vocab-parallel kernel uses
      // anyway (Megatron's tensor-parallel group: the axis named tp, else the whole mesh).
      NameId lg = p_.ins(op)[0];
      const Val& v = at(r, lg);
      if (v.defined && !v.mask.empty()) axes = v.mask.back();
      for (std::size_t a = 0; a < p_.mesh.size() && !axes; ++a)
        if (p_.mesh[a].name == "tp") axes = 1u << a;
      if (!axes) axes = (1u << p_.mesh.size()) - 1;
    }
    auto c = coords(r);
    std::vector<std::int64_t> m;
    for (std::int64_t q = 0; q < ranks_; ++q) {
      auto cq = coords(q);
      bool same = true;
      for (std::size_t a = 0; a < sizes_.size(); ++a)
        if (!(axes & (1u << a)) && cq[a] != c[a]) same = false;
      if (same) m.push_back(q);
    }
    return m;
  }

  static double combine(ReduceOp op, double a, double b) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return a + b;
      case ReduceOp::Max: return std::max(a, b);
      case ReduceOp::Min: return std::min(a, b);
    }
    return a;
  }
  Tensor reduce_all(const std::vector<const Val*>& xs, ReduceOp op) {
    Tensor acc = xs[0]->t;
    for (std::size_t k = 1; k < xs.size(); ++k) {
      if (xs[k]->t.shape != acc.shape)
        throw InterpError("ranks hold different local shapes (" + shape_text(acc.shape) + " and " + shape_text(xs[k]->t.shape) + ") for one reduction");
      for (std::size_t e = 0; e < acc.data.size(); ++e) acc.data[e] = combine(op, acc.data[e], xs[k]->t.data[e]);
    }
    if (op == ReduceOp::Avg)
      for (auto& e : acc.data) e /= static_cast<double>(xs.size());
    charge(acc.numel() * static_cast<std::int64_t>(xs.size()));
    return acc;
  }
  static Tensor nan_like(const Tensor& t) { return Tensor(t.shape, NAN); }

  void step_group(int oi, const std::vector<std::int64_t>& members) {
    failed_op = oi;
    const Op& op = p_.ops[static_cast<std::size_t>(oi)];
    if (op.kind == OpKind::CrossEntropyLoss) return cross_entropy(oi, members);
    const OpAttrs& at = op.attrs;
    std::size_t n = members.size();
    std::vector<const Val*> xs;
    for (auto m : members) xs.push_back(&in(oi, m, 0));
    std::string taint = global_ ? taint_of(oi, members[0]) : "";
    std::vector<Val> outs(n);
    std::uint32_t axes = at.axes;
    auto src_member = [&](const char* what) -> std::size_t {
      std::size_t s = at.rank < 0 ? 0 : static_cast<std::size_t>(at.rank);
      if (n == 1) return 0;  // the single-device run: the identity
      if (s >= n) throw InterpError(std::string(what) + " rank " + std::to_string(s) + " is outside a group of " + std::to_string(n));
      return s;
    };
    auto dim_of = [&](int d, const Val& v) { return norm_dim(d, static_cast<int>(v.gshape.size())); };
    switch (op.kind) {
      case OpKind::AllReduce: {
        Tensor red = reduce_all(xs, at.rop);
        for (std::size_t k = 0; k < n; ++k) outs[k] = *xs[k], outs[k].t = red;
        break;
      }
      case OpKind::AllGather: {
        int d = dim_of(at.dim, *xs[0]);
        std::vector<Tensor> parts;
        for (auto* x : xs) parts.push_back(x->t);
        Tensor all = concat(parts, d);
        for (std::size_t k = 0; k < n; ++k) outs[k] = *xs[k], outs[k].t = all, outs[k].mask[static_cast<std::size_t>(d)] &= ~axes;
        break;
      }
      case OpKind::ReduceScatter: {
        int d = dim_of(at.dim, *xs[0]);
        Tensor red = reduce_all(xs, at.rop);
        for (std::size_t k = 0; k < n; ++k) {
          std::int64_t lo, hi;
          chunk_range(red.shape[static_cast<std::size_t>(d)], static_cast<std::int64_t>(n), static_cast<std::int64_t>(k), lo, hi);
          outs[k] = *xs[k], outs[k].t = slice(red, d, lo, hi), outs[k].mask[static_cast<std::size_t>(d)] |= axes;
        }
        break;
      }
      case OpKind::Broadcast: {
        std::size_t s = src_member("Broadcast source");
        for (std::size_t k = 0; k < n; ++k) outs[k] = *xs[s];
        break;
      }
      case OpKind::Reduce: {
        std::size_t s = src_member("Reduce destination");
        Tensor red = reduce_all(xs, at.rop);
        for (std::size_t k = 0; k < n; ++k) outs[k] = *xs[k], outs[k].t = k == s ? red : nan_like(red);
        if (global_) taint = "Reduce leaves its result on one rank only (V)";
        break;
      }
      case OpKind::Gather: {
        std::size_t s = src_member("Gather destination");
        int d = dim_of(at.dim, *xs[0]);
        std::vector<Tensor> parts;
        for (auto* x : xs) parts.push_back(x->t);
        Tensor all = concat(parts, d);
        for (std::size_t k = 0; k < n; ++k)
          outs[k] = *xs[k], outs[k].t = k == s ? all : nan_like(all), outs[k].mask[static_cast<std::size_t>(d)] &= ~axes;
        if (global_) taint = "Gather leaves its result on one rank only (V)";
        break;
      }
      case OpKind::Scatter: {
        std::size_t s = src_member("Scatter source");
        int d = dim_of(at.dim, *xs[s]);
        for (std::size_t k = 0; k < n; ++k) {
          std::int64_t lo, hi;
          chunk_range(xs[s]->t.shape[static_cast<std::size_t>(d)], static_cast<std::int64_t>(n), static_cast<std::int64_t>(k), lo, hi);
          outs[k] = *xs[s], outs[k].t = slice(xs[s]->t, d, lo, hi), outs[k].mask[static_cast<std::size_t>(d)] |= axes;
        }
        break;
      }
      case OpKind::AllToAll: {
        // S(concat) -> S(split) moves the shard; on values the axes do not shard along concat_dim (V) each rank's
        // split dim shrinks and its concat dim grows (the global shape of a V is its per-rank shape).
        int sd = dim_of(at.dim, *xs[0]), cd = dim_of(at.dim2, *xs[0]);
        bool moves = (xs[0]->mask[static_cast<std::size_t>(cd)] & axes) == axes;
        if (global_ && !moves && sd != cd && !taint.empty()) {
          // A V value has no single-device meaning, but later ops need its per-rank shape: split by the real group.
          std::int64_t g = 1;
          for (std::size_t a = 0; a < real_sizes_.size(); ++a)
            if (axes & (1u << a)) g *= real_sizes_[a];
          Val v = *xs[0];
          if (v.gshape[static_cast<std::size_t>(sd)] % g) throw InterpError("AllToAll cannot split dim " + std::to_string(sd) + " into " + std::to_string(g));
          v.gshape[static_cast<std::size_t>(sd)] /= g;
          v.gshape[static_cast<std::size_t>(cd)] *= g;
          v.t = Tensor(v.gshape, 0.0);
          outs[0] = std::move(v);
          break;
        }
        for (std::size_t k = 0; k < n; ++k) {
          std::vector<Tensor> parts;
          for (std::size_t j = 0; j < n; ++j) {
            std::int64_t lo, hi;
            chunk_range(xs[j]->t.shape[static_cast<std::size_t>(sd)], static_cast<std::int64_t>(n), static_cast<std::int64_t>(k), lo, hi);
            parts.push_back(slice(xs[j]->t, sd, lo, hi));
          }
          outs[k] = *xs[k], outs[k].t = concat(parts, cd);
          if (moves || sd == cd) {
            outs[k].mask[static_cast<std::size_t>(cd)] &= ~axes;
            outs[k].mask[static_cast<std::size_t>(sd)] |= axes;
          } else {
            outs[k].gshape[static_cast<std::size_t>(sd)] /= static_cast<std::int64_t>(n);
            outs[k].gshape[static_cast<std::size_t>(cd)] *= static_cast<std::int64_t>(n);
          }
        }
        break;
      }
      default: throw std::logic_error("step_group: not a collective: " + std::string(op_name(op.kind)));
    }
    for (std::size_t k = 0; k < n; ++k) {
      outs[k].taint.clear();
      set_out(oi, members[k], 0, std::move(outs[k]), taint);
    }
  }

  // Softmax cross-entropy per token; with vocab_parallel the vocab dim is split over the group and the
  // max, the sum of exponentials and the target logit are all-reduced (Megatron's
  // vocab_parallel_cross_entropy: rank g owns labels [g * local_vocab, (g + 1) * local_vocab)).
  void cross_entropy(int oi, const std::vector<std::int64_t>& members) {
    const Op& op = p_.ops[static_cast<std::size_t>(oi)];
    std::size_t n = members.size();
    struct Part {
      Tensor lg, lb;
      Val tok;
      std::vector<double> mx, se, tgt;
    };
    std::vector<Part> parts(n);
    std::int64_t T = -1;
    for (std::size_t k = 0; k < n; ++k) {
      std::int64_t r = members[k];
      auto c = coords(r);
      const Val& lg = in(oi, r, 0);
      const Val& lb = in(oi, r, 1);
      if (lg.gshape.empty() || lb.gshape.size() + 1 != lg.gshape.size()) throw InterpError("CrossEntropyLoss labels must have the logits' shape without the vocab dim");
      note_range(p_.ins(op)[1], lg.gshape.back());
      Part& P = parts[k];
      P.tok.gshape = lb.gshape;
      P.tok.mask.assign(lb.gshape.size(), 0);
      for (std::size_t d = 0; d < lb.gshape.size(); ++d) P.tok.mask[d] = lb.mask[d] | (lg.gshape[d] == 1 ? 0 : lg.mask[d]);
      std::vector<std::uint32_t> tl = lg.mask;
      for (std::size_t d = 0; d < lb.gshape.size(); ++d) tl[d] = P.tok.mask[d];
      P.lg = align(lg, tl, c, p_.name(p_.ins(op)[0]));
      P.lb = align(lb, P.tok.mask, c, p_.name(p_.ins(op)[1]));
      Shape ts(P.lg.shape.begin(), P.lg.shape.end() - 1);
      if (ts != P.lb.shape) throw InterpError("CrossEntropyLoss local logits " + shape_text(P.lg.shape) + " and labels " + shape_text(P.lb.shape) + " do not fit");
      std::int64_t t = P.lb.numel();
      if (T >= 0 && t != T) throw InterpError("ranks of one vocab-parallel group hold different token counts");
      T = t;
      std::int64_t V = P.lg.shape.back();
      std::int64_t off = static_cast<std::int64_t>(k) * V;  // Megatron: vocab_start_index = rank * partition_vocab_size
      P.mx.assign(static_cast<std::size_t>(t), -INFINITY);
      P.se.assign(static_cast<std::size_t>(t), 0);
      P.tgt.assign(static_cast<std::size_t>(t), 0);
      for (std::int64_t i = 0; i < t; ++i)
        for (std::int64_t v = 0; v < V; ++v) P.mx[static_cast<std::size_t>(i)] = std::max(P.mx[static_cast<std::size_t>(i)], P.lg.data[static_cast<std::size_t>(i * V + v)]);
      for (std::int64_t i = 0; i < t; ++i) {
        std::int64_t label = as_index(P.lb.data[static_cast<std::size_t>(i)], lg.gshape.back(), "a CrossEntropyLoss label");
        if (!op.attrs.vocab_parallel && label >= V) throw InterpError("a label indexes past the " + std::to_string(V) + " local logits");
        if (label >= off && label < off + V) P.tgt[static_cast<std::size_t>(i)] = P.lg.data[static_cast<std::size_t>(i * V + label - off)];
      }
      charge(t * V);
    }
    // all-reduce max, then the sums
    std::vector<double> gmax(static_cast<std::size_t>(T), -INFINITY), gse(static_cast<std::size_t>(T), 0), gtgt(static_cast<std::size_t>(T), 0);
    for (auto& P : parts)
      for (std::size_t i = 0; i < gmax.size(); ++i) gmax[i] = std::max(gmax[i], P.mx[i]);
    for (auto& P : parts) {
      std::int64_t V = P.lg.shape.back();
      for (std::size_t i = 0; i < gmax.size(); ++i) {
        for (std::int64_t v = 0; v < V; ++v) gse[i] += std::exp(P.lg.data[i * static_cast<std::size_t>(V) + static_cast<std::size_t>(v)] - gmax[i]);
        gtgt[i] += P.tgt[i];
      }
    }
    std::string taint = global_ ? taint_of(oi, members[0]) : "";
    for (std::size_t k = 0; k < n; ++k) {
      Part& P = parts[k];
      Val o = P.tok;
      o.t = Tensor(P.lb.shape);
      for (std::size_t i = 0; i < gmax.size(); ++i) o.t.data[i] = std::log(gse[i]) + gmax[i] - gtgt[i];
      if (op.attrs.reduction != Reduction::None) {
        double s = 0;
        for (double e : o.t.data) s += e;
        if (op.attrs.reduction == Reduction::Mean) s = o.t.data.empty() ? NAN : s / static_cast<double>(o.t.data.size());
        o.t = Tensor({}, s);
        o.gshape.clear();
        o.mask.clear();
      }
      set_out(oi, members[k], 0, std::move(o), taint);
    }
  }

  const Program& p_;
  const std::vector<std::int64_t>& vars_;
  std::vector<std::int64_t> sizes_;
  std::vector<std::int64_t> real_sizes_;  // the real mesh (the single-device run needs it for the per-rank shapes of V values)
  bool global_;
  const OracleOptions& opt_;
  std::int64_t& work_;
  std::int64_t ranks_ = 1;
  std::uint64_t seed_ = 0;
  std::vector<std::vector<Val>> env_;
  std::map<std::pair<std::int64_t, std::int64_t>, std::deque<Val>> queues_;
};

// ---- size instantiation ---------------------------------------------------------------------------
struct Instantiation {
  std::vector<std::int64_t> vars;
  std::vector<std::int64_t> mesh;
  bool even = true;  // every declared shape has a value and every declared shard divides evenly (or is declared uneven)
};

std::vector<Instantiation> instantiations(const Program& p, const OracleOptions& o) {
  std::vector<std::vector<std::int64_t>> cand;
  for (const auto& v : p.vars) {
    std::vector<std::int64_t> c;
    if (!v.in.empty()) {
      for (auto x : v.in)
        if (x >= v.min && x <= v.max && x % v.multiple_of == 0) c.push_back(x);
    } else {
      std::int64_t first = (v.min + v.multiple_of - 1) / v.multiple_of * v.multiple_of;
      for (std::int64_t x = first, k = 0; x <= v.max && k < 4; x += v.multiple_of, ++k) c.push_back(x);
    }
    if (c.size() > 6) c.resize(6);
    cand.push_back(std::move(c));
  }
  // Every combination (capped), smallest first.
  std::vector<std::vector<int>> combos{{}};
  for (const auto& c : cand) {
    std::vector<std::vector<int>> next;
    for (const auto& base : combos)
      for (int i = 0; i < static_cast<int>(c.size()) && next.size() < 4096; ++i) {
        auto b = base;
        b.push_back(i);
        next.push_back(std::move(b));
      }
    combos = std::move(next);
  }
  std::stable_sort(combos.begin(), combos.end(), [](const auto& a, const auto& b) {
    return std::accumulate(a.begin(), a.end(), 0) < std::accumulate(b.begin(), b.end(), 0);
  });
  std::vector<Instantiation> out;
  for (const auto& cb : combos) {
    Instantiation in;
    for (std::size_t k = 0; k < cb.size(); ++k) in.vars.push_back(cand[k][static_cast<std::size_t>(cb[k])]);
    bool ok = true;
    std::int64_t ranks = 1;
    for (const auto& ax : p.mesh) {
      auto v = p.exprs.eval(ax.size, in.vars);
      if (!v || *v < 1) ok = false;
      else in.mesh.push_back(*v), ranks *= *v;
    }
    if (!ok || ranks > o.max_ranks) continue;
    // Declared shapes must fit the interpreter; one that has no value (an inexact division) is kept: the
    // single-device run then fails there, which is the evidence.
    for (const auto& t : p.tensors) {
      std::int64_t elems = 1;
      for (std::size_t d = 0; d < t.shape.size(); ++d) {
        auto v = p.exprs.eval(t.shape[d], in.vars);
        if (!v || *v < 1) {
          in.even = false;
          continue;
        }
        elems = std::min(elems * *v, o.max_elements + 1);
        std::int64_t parts = 1;
        for (std::size_t a = 0; a < p.mesh.size(); ++a)
          if (t.placement[a].is_s(static_cast<int>(d))) parts *= in.mesh[a];
        if (!t.uneven && *v % parts != 0) in.even = false;
      }
      if (elems > o.max_elements) ok = false;
    }
    if (ok) out.push_back(std::move(in));
    if (out.size() >= 64) break;
  }
  return out;
}

// ---- assembly ---------------------------------------------------------------------------------------
struct Assembled {
  bool ok = false;        // a value was assembled
  bool undefined = false; // V somewhere: no assembled value
  std::string problem;    // ranks disagree on R/I, or the pieces do not fit
  Tensor t;
};

bool close(double a, double b, double tol) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::abs(a - b) <= tol;
}
double max_abs(const Tensor& t) {
  double m = 0;
  for (double e : t.data)
    if (std::isfinite(e)) m = std::max(m, std::abs(e));
  return m;
}

Assembled assemble(const Program& p, Runner& run, NameId name, const Placements& pl, const OracleOptions& o) {
  Assembled res;
  const auto& sizes = run.sizes();
  std::size_t axes = sizes.size();
  // pieces over the remaining (outer) axes, row-major
  std::vector<Tensor> cur;
  for (std::int64_t r = 0; r < run.ranks(); ++r) {
    const Val& v = run.at(r, name);
    if (!v.defined) return res.problem = "rank " + coord_text(p, run.coords(r)) + " never computes it", res;
    cur.push_back(v.t);
  }
  int rank = cur[0].rank();
  for (int a = static_cast<int>(axes) - 1; a >= 0; --a) {
    std::int64_t n = sizes[static_cast<std::size_t>(a)];
    Placement pa = pl[static_cast<std::size_t>(a)];
    const std::string& an = p.mesh[static_cast<std::size_t>(a)].name;
    if (pa.is_v()) return res.undefined = true, res.problem = "it is V over " + an + ", which has no assembled value", res;
    std::vector<Tensor> next;
    for (std::size_t g = 0; g < cur.size(); g += static_cast<std::size_t>(n)) {
      std::vector<Tensor> members(cur.begin() + static_cast<std::ptrdiff_t>(g), cur.begin() + static_cast<std::ptrdiff_t>(g) + n);
      auto where = [&](std::int64_t m) {
        // coordinates of member m: the outer axes from the group index, this axis m, inner axes already assembled
        std::vector<std::string> parts;
        std::int64_t gi = static_cast<std::int64_t>(g) / n;
        std::vector<std::int64_t> outer(static_cast<std::size_t>(a));
        for (int b = a - 1; b >= 0; --b) outer[static_cast<std::size_t>(b)] = gi % sizes[static_cast<std::size_t>(b)], gi /= sizes[static_cast<std::size_t>(b)];
        std::string s = "{";
        for (int b = 0; b < a; ++b) s += p.mesh[static_cast<std::size_t>(b)].name + ": " + std::to_string(outer[static_cast<std::size_t>(b)]) + ", ";
        s += an + ": " + std::to_string(m);
        for (std::size_t b = static_cast<std::size_t>(a) + 1; b < axes; ++b) s += ", " + p.mesh[b].name + ": *";
        return s + "}";
      };
      if (pa.is_s()) {
        int d = pa.dim < 0 ? pa.dim + rank : pa.dim;
        if (d < 0 || d >= rank) return res.problem = "it is declared S(" + std::to_string(pa.dim) + ") over " + an + " but has rank " + std::to_string(rank), res;
        try {
          next.push_back(concat(members, d));
        } catch (const InterpError& e) {
          return res.problem = std::string("its pieces over ") + an + " do not concatenate: " + e.what(), res;
        }
      } else if (pa.is_p()) {
        Tensor acc = members[0];
        for (std::int64_t m = 1; m < n; ++m) {
          if (members[static_cast<std::size_t>(m)].shape != acc.shape)
            return res.problem = "ranks " + where(0) + " and " + where(m) + " hold pieces of different shapes (" + shape_text(acc.shape) + " and " +
                                 shape_text(members[static_cast<std::size_t>(m)].shape) + ") for a P value",
                   res;
          for (std::size_t e = 0; e < acc.data.size(); ++e) {
            double x = members[static_cast<std::size_t>(m)].data[e];
            acc.data[e] = pa.op == ReduceOp::Max ? std::max(acc.data[e], x) : pa.op == ReduceOp::Min ? std::min(acc.data[e], x) : acc.data[e] + x;
          }
        }
        if (pa.op == ReduceOp::Avg)
          for (auto& e : acc.data) e /= static_cast<double>(n);
        next.push_back(std::move(acc));
      } else {  // R or I: every rank must hold the same value
        double tol = o.atol + o.rtol * max_abs(members[0]);
        for (std::int64_t m = 1; m < n; ++m) {
          const Tensor& x = members[static_cast<std::size_t>(m)];
          if (x.shape != members[0].shape)
            return res.problem = "ranks " + where(0) + " and " + where(m) + " hold different shapes (" + shape_text(members[0].shape) + " and " +
                                 shape_text(x.shape) + ") of a value that is " + to_string(pa) + " over " + an,
                   res;
          for (std::size_t e = 0; e < x.data.size(); ++e)
            if (!close(x.data[e], members[0].data[e], tol)) {
              std::ostringstream s;
              s << "ranks " << where(0) << " and " << where(m) << " disagree on a value that is " << to_string(pa) << " over " << an << ": element " << e
                << " is " << members[0].data[e] << " vs " << x.data[e];
              return res.problem = s.str(), res;
            }
        }
        next.push_back(members[0]);
      }
    }
    cur = std::move(next);
  }
  res.ok = true;
  res.t = std::move(cur[0]);
  return res;
}

// Which ranks hold element `flat` of an output assembled by `pl` (for messages).
std::string holders(const Program& p, const std::vector<std::int64_t>& sizes, const Shape& gshape, std::int64_t flat, const Placements& pl) {
  Shape st = strides_of(gshape), idx(gshape.size());
  for (std::size_t d = 0; d < gshape.size(); ++d) idx[d] = st[d] ? (flat / st[d]) % std::max<std::int64_t>(gshape[d], 1) : 0;
  std::string s = "{";
  // Dims sharded by several axes: outer major. Walk axes in mesh order, narrowing each dim's range.
  std::vector<std::int64_t> lo(gshape.size(), 0), hi(gshape.begin(), gshape.end());
  for (std::size_t a = 0; a < sizes.size(); ++a) {
    std::string v;
    Placement pa = pl[a];
    if (pa.is_s()) {
      auto d = static_cast<std::size_t>(pa.dim < 0 ? pa.dim + static_cast<int>(gshape.size()) : pa.dim);
      if (d < gshape.size()) {
        std::int64_t n = hi[d] - lo[d];
        for (std::int64_t k = 0; k < sizes[a]; ++k) {
          std::int64_t l, h;
          chunk_range(n, sizes[a], k, l, h);
          if (idx[d] >= lo[d] + l && idx[d] < lo[d] + h) {
            v = std::to_string(k);
            hi[d] = lo[d] + h, lo[d] += l;
            break;
          }
        }
      }
    } else if (pa.is_p()) {
      v = "all (" + to_string(pa) + ")";
    } else {
      v = "any";
    }
    s += (a ? ", " : "") + p.mesh[a].name + ": " + v;
  }
  return s + "}";
}

std::string index_text(const Shape& gshape, std::int64_t flat) {
  Shape st = strides_of(gshape);
  std::string s = "[";
  for (std::size_t d = 0; d < gshape.size(); ++d) s += (d ? ", " : "") + std::to_string(st[d] ? (flat / st[d]) % std::max<std::int64_t>(gshape[d], 1) : 0);
  return s + "]";
}

std::string op_where(const Program& p, int oi) {
  if (oi < 0) return "the inputs";
  const Op& op = p.ops[static_cast<std::size_t>(oi)];
  return "op " + std::to_string(oi) + " (" + std::string(op_name(op.kind)) + ", line " + std::to_string(op.loc.line) + ")";
}

}  // namespace

OracleResult run_oracle(const Program& p, const OracleOptions& o) {
  OracleResult res;
  // What the oracle cannot run is skipped with the reason (never counted as agreement): per-rank
  // programs and schedules (one program per set of ranks), and ops with no numeric kernel.
  if (p.per_rank || p.schedule.present) {
    res.message = p.schedule.present ? "a pipeline schedule has opaque steps and no single-device meaning" : "per-rank programs are not interpreted yet";
    return res;
  }
  for (const auto& op : p.ops)
    if (op.kind == OpKind::OverlapRegion || op.kind == OpKind::Step || op_info(op.kind).category == OpCategory::gradient) {
      res.message = std::string(op_name(op.kind)) + " (line " + std::to_string(op.loc.line) + ") has no numeric kernel in the oracle";
      return res;
    }
  auto insts = instantiations(p, o);
  if (insts.empty()) {
    res.message = "no small instantiation of the sizes fits the interpreter (at most " + std::to_string(o.max_ranks) + " ranks and " +
                  std::to_string(o.max_elements) + " elements per tensor)";
    return res;
  }
  // Seed k runs the k-th smallest instantiation: for a program the checker proves for every allowed size
  // all of them are valid; for one with a counterexample, some seed reaches it.
  const Instantiation& inst = insts[o.seed % insts.size()];
  for (std::size_t k = 0; k < p.vars.size(); ++k) res.sizes += (k ? ", " : "") + p.vars[k].name + " = " + std::to_string(inst.vars[k]);
  std::int64_t work = 0;
  Runner dist(p, inst.vars, inst.mesh, false, o, work);
  Runner one(p, inst.vars, std::vector<std::int64_t>(inst.mesh.size(), 1), true, o, work, inst.mesh);
  // A shape-only pre-run (integer inputs all 0) learns the ranges integer inputs must take.
  std::vector<std::int64_t> ranges(p.names.size(), -1);
  {
    std::int64_t w0 = 0;
    Runner pre(p, inst.vars, std::vector<std::int64_t>(inst.mesh.size(), 1), true, o, w0, inst.mesh);
    pre.int_range = &ranges;
    try {
      for (const auto& t : p.tensors) pre.declare(t, 1, o.seed);
      pre.run(o.seed);
    } catch (const std::runtime_error&) {
    }
    for (auto& r : ranges) r = r < 0 ? 4 : std::max<std::int64_t>(r, 1);
  }
  // The single-device run first: if the program itself fails there, per-rank numbers mean nothing.
  try {
    for (const auto& t : p.tensors) {
      one.declare(t, ranges[static_cast<std::size_t>(t.name)], o.seed);
      dist.declare(t, ranges[static_cast<std::size_t>(t.name)], o.seed);
    }
  } catch (const BudgetError& e) {
    res.message = e.what();
    return res;
  } catch (const InterpError& e) {
    res.verdict = OracleVerdict::GlobalError;
    res.message = std::string("the inputs cannot be built under ") + (res.sizes.empty() ? "these sizes" : res.sizes) + ": " + e.what();
    return res;
  }
  // The single-device inputs are the assembly of the per-rank ones (so P and V inputs get their global value).
  for (const auto& t : p.tensors) {
    Val& g = one.at(0, t.name);
    Assembled a = assemble(p, dist, t.name, t.placement, o);
    if (a.ok) g.t = std::move(a.t);
    else if (g.taint.empty()) g.taint = p.name(t.name) + " has no single-device value (" + a.problem + ")";
  }
  try {
    one.run(o.seed);
  } catch (const BudgetError& e) {
    res.message = e.what();
    return res;
  } catch (const InterpError& e) {
    res.verdict = OracleVerdict::GlobalError;
    res.message = "the single-device run fails at " + op_where(p, one.failed_op) + ": " + e.what();
    return res;
  }
  try {
    dist.run(o.seed);
  } catch (const BudgetError& e) {
    res.message = e.what();
    return res;
  } catch (const InterpError& e) {
    res.verdict = OracleVerdict::Differ;
    res.message = "the per-rank run fails at " + op_where(p, dist.failed_op) + ": " + e.what();
    return res;
  }
  bool differ = false;
  for (std::size_t k = 0; k < p.outputs.size(); ++k) {
    const OutputDecl& od = p.outputs[k];
    const std::string& name = p.name(od.name);
    Placements pl{};
    if (k < o.assemble.size() && o.assemble[k]) pl = *o.assemble[k];
    else if (od.has_placement) pl = od.placement;
    const Val& g = one.at(0, od.name);
    if (g.defined && !g.taint.empty() && g.taint[0] == kExcluded) {
      res.notes.push_back("output " + name + " is not compared: " + g.taint.substr(1));
      continue;
    }
    Assembled a = assemble(p, dist, od.name, pl, o);
    if (!a.ok) {
      if (a.undefined) {
        res.notes.push_back("output " + name + " is not compared: " + a.problem);
        continue;
      }
      res.verdict = OracleVerdict::Differ;
      res.message = "output " + name + " cannot be assembled by its placement: " + a.problem;
      return res;
    }
    if (!g.defined || !g.taint.empty()) {
      ++res.rank_checked;
      res.notes.push_back("output " + name + " is compared across ranks only: its single-device value is undefined (" +
                          (g.defined ? g.taint : std::string("never computed")) + ")");
      continue;
    }
    ++res.compared;
    if (a.t.shape != g.t.shape) {
      res.verdict = OracleVerdict::Differ;
      res.message = "output " + name + " assembles to shape " + shape_text(a.t.shape) + " but the single-device value has shape " + shape_text(g.t.shape);
      return res;
    }
    double tol = o.atol + o.rtol * std::max(max_abs(g.t), max_abs(a.t));
    double worst = 0;
    std::int64_t first = -1;
    for (std::size_t e = 0; e < g.t.data.size(); ++e) {
      double x = a.t.data[e], y = g.t.data[e];
      double d = std::isnan(x) != std::isnan(y) ? INFINITY : std::isnan(x) ? 0.0 : std::abs(x - y);
      worst = std::max(worst, d);
      if (first < 0 && !close(x, y, tol)) first = static_cast<std::int64_t>(e);
    }
    res.max_diff = std::max(res.max_diff, worst);
    if (first >= 0 && !differ) {
      differ = true;
      std::ostringstream s;
      s.precision(6);
      s << "output " << name << " differs at " << index_text(g.t.shape, first) << ": per-rank " << a.t.data[static_cast<std::size_t>(first)]
        << ", single-device " << g.t.data[static_cast<std::size_t>(first)] << " (held by ranks " << holders(p, dist.sizes(), g.t.shape, first, pl)
        << "); largest difference " << worst;
      res.message = s.str();
    }
  }
  if (differ) {
    res.verdict = OracleVerdict::Differ;
    return res;
  }
  if (res.compared + res.rank_checked == 0) {
    res.message = p.outputs.empty() ? "the program declares no outputs" : "no output has a comparable value";
    return res;
  }
  res.verdict = OracleVerdict::Agree;
  res.message = std::to_string(res.compared) + " output" + (res.compared == 1 ? " agrees" : "s agree");
  if (res.rank_checked) res.message += ", " + std::to_string(res.rank_checked) + " checked across ranks only";
  return res;
}

}  // namespace spmd
