// tests/difftest.cpp - random SPMD programs, and the checker judged against the numeric oracle.
#include "tests/difftest.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "cli/run.h"
#include "ir/loader.h"
#include "spatial/spatial.h"

namespace spmd::test {

namespace {

struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    s += 0x9e3779b97f4a7c15ULL;
    std::uint64_t x = s;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }
  int below(int n) { return n <= 0 ? 0 : static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
  double unit() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  bool chance(double p) { return unit() < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[static_cast<std::size_t>(below(static_cast<int>(v.size())))]; }
};

using Dims = std::vector<std::int64_t>;

struct GVal {
  std::string name;
  Dims shape;
  bool integer = false;
};

std::string dims_text(const Dims& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

class Gen {
 public:
  explicit Gen(std::uint64_t seed) : rng_{seed * 0x2545F4914F6CDD1DULL + 17} {}

  std::string run() {
    static const std::vector<std::vector<std::pair<std::string, int>>> meshes = {
        {{"tp", 2}}, {{"tp", 4}}, {{"tp", 3}}, {{"dp", 2}, {"tp", 2}}, {{"dp", 2}, {"tp", 3}}, {{"dp", 2}, {"tp", 4}}, {{"dp", 2}, {"cp", 2}, {"tp", 2}},
        {{"dp", 2}, {"tp", 1}}};  // an axis of one rank (tp 1): a cut there is no cut
    mesh_ = rng_.pick(meshes);
    int n_inputs = 1 + rng_.below(2);
    for (int i = 0; i < n_inputs; ++i) new_input(random_shape(2 + rng_.below(2)), false);
    probe();
    int steps = 2 + rng_.below(8);
    for (int s = 0; s < steps; ++s) {
      bool kept_error = false;
      for (int attempt = 0; attempt < 8; ++attempt) {
        auto saved = std::make_tuple(decls_.size(), ops_.size(), vals_.size());
        add_op();
        if (probe()) break;
        if (rng_.chance(0.2)) {
          kept_error = true;
          break;
        }
        decls_.resize(std::get<0>(saved));
        ops_.resize(std::get<1>(saved));
        vals_.resize(std::get<2>(saved));
        probe();
      }
      if (kept_error) break;
    }
    // Outputs: the last value and up to two others; usually no placement (assembled by the inferred one).
    std::vector<std::string> outs;
    std::set<std::string> chosen;
    auto add_out = [&](const GVal& v) {
      if (!chosen.insert(v.name).second) return;
      auto it = pl_.find(v.name);
      double r = rng_.unit();
      if (r < 0.65 || it == pl_.end()) outs.push_back(v.name + ": {}");
      else if (r < 0.9) outs.push_back(v.name + ": {placement: " + pl_text(it->second, v.shape.size()) + "}");
      else {
        Placements p{};
        for (std::size_t a = 0; a < mesh_.size(); ++a) p[a] = random_placement(static_cast<int>(v.shape.size()));
        outs.push_back(v.name + ": {placement: " + pl_text(p, v.shape.size()) + "}");
      }
    };
    add_out(vals_.back());
    for (int k = rng_.below(3); k > 0; --k) add_out(rng_.pick(vals_));
    return yaml(outs);
  }

 private:
  // ---- text -----------------------------------------------------------------------------------
  std::string pl_text(const Placements& p, std::size_t rank) const {
    std::string s = "{";
    for (std::size_t a = 0; a < mesh_.size(); ++a) {
      Placement x = p[a];
      if (x.is_s() && (x.dim < 0 || static_cast<std::size_t>(x.dim) >= rank)) x = Placement::r();
      s += (a ? ", " : "") + mesh_[a].first + ": " + to_string(x);
    }
    std::string o;  // the shard order of dims cut out of mesh order (`order:`)
    for (int d = 0; d < static_cast<int>(rank); ++d) {
      int axes[kMaxAxes];
      int n = shard_order(p.data(), static_cast<int>(mesh_.size()), d, axes);
      if (n < 2 || !p[static_cast<std::size_t>(axes[0])].ord) continue;
      for (int k = 0; k < n; ++k) o += (o.empty() ? "" : ", ") + mesh_[static_cast<std::size_t>(axes[k])].first;
    }
    if (!o.empty()) s += ", order: [" + o + "]";
    return s + "}";
  }
  std::string yaml(const std::vector<std::string>& outs) const {
    std::string s = "mesh: {";
    for (std::size_t a = 0; a < mesh_.size(); ++a) s += (a ? ", " : "") + mesh_[a].first + ": " + std::to_string(mesh_[a].second);
    s += "}\ntensors:\n";
    for (const auto& d : decls_) s += "  " + d + "\n";
    s += "ops:\n";
    for (const auto& o : ops_) s += "  - " + o + "\n";
    if (!outs.empty()) {
      s += "outputs:\n";
      for (const auto& o : outs) s += "  " + o + "\n";
    }
    return s;
  }

  // Loads the program with every value as an output; records the placements the checker infers.
  // True when the checker reports no spatial error (partial-output of the probe outputs aside).
  bool probe() {
    std::vector<std::string> outs;
    for (const auto& v : vals_) outs.push_back(v.name + ": {}");
    pl_.clear();
    try {
      Program p = load_program_string(yaml(outs), "gen.yaml");
      std::vector<std::optional<Placements>> inferred;
      SpatialOptions so;
      so.inferred_outputs = &inferred;
      auto diags = check_spatial(p, so);
      for (std::size_t k = 0; k < p.outputs.size() && k < inferred.size(); ++k)
        if (inferred[k]) pl_[p.name(p.outputs[k].name)] = *inferred[k];
      for (const auto& d : diags)
        if (d.severity == Severity::Error && d.id != CheckId::PartialOutput) return false;
      return true;
    } catch (const LoadError&) {
      return false;
    }
  }

  // ---- values ---------------------------------------------------------------------------------
  std::int64_t random_dim() {
    static const std::vector<std::int64_t> sizes = {2, 4, 4, 6, 8, 8, 12, 3, 5, 16};
    return rng_.pick(sizes);
  }
  Dims random_shape(int rank) {
    Dims d;
    for (int i = 0; i < rank; ++i) d.push_back(random_dim());
    return d;
  }
  Placement random_placement(int rank, ReduceOp* pop = nullptr) {
    double r = rng_.unit();
    if (r < 0.42 || rank == 0) return Placement::r();
    if (r < 0.72) return Placement::s(rng_.below(rank));
    if (r < 0.85) {
      ReduceOp op = rng_.chance(0.55) ? ReduceOp::Sum : rng_.pick(std::vector<ReduceOp>{ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min});
      if (pop) {
        // Mostly one reduction kind per tensor; now and then mixed kinds over several axes (their global value
        // reduces the innermost axis first, and only some reduction orders compute it).
        if (*pop == static_cast<ReduceOp>(255) || rng_.chance(0.35)) *pop = op;
        op = *pop;
      }
      return Placement::p(op);
    }
    if (r < 0.93) return Placement::i();
    return Placement::v();
  }
  std::string fresh(const char* prefix) { return prefix + std::to_string(counter_++); }

  // Declares a new input; `like` copies the placement of an existing value on some axes.
  std::string new_input(const Dims& shape, bool integer, const GVal* like = nullptr, std::optional<Placements> forced = std::nullopt,
                        bool uneven = false) {
    std::string name = fresh(integer ? "ids" : "x");
    Placements p{};
    ReduceOp pop = static_cast<ReduceOp>(255);
    for (std::size_t a = 0; a < mesh_.size(); ++a) {
      p[a] = integer ? (rng_.chance(0.7) ? Placement::r() : Placement::s(rng_.below(static_cast<int>(shape.size()))))
                     : random_placement(static_cast<int>(shape.size()), &pop);
      if (like && rng_.chance(0.6)) {
        auto it = pl_.find(like->name);
        if (it != pl_.end()) {
          Placement q = it->second[a];
          int shift = static_cast<int>(shape.size()) - static_cast<int>(like->shape.size());
          if (q.is_s()) q.dim = static_cast<std::int16_t>(q.dim + shift);
          if (!q.is_s() || (q.dim >= 0 && q.dim < static_cast<int>(shape.size()))) p[a] = q.is_p() ? Placement::r() : q;
        }
      }
    }
    for (int dd = 0; dd < static_cast<int>(shape.size()) && !integer; ++dd) {  // now and then a dim cut out of mesh order
      int axes[kMaxAxes];
      for (auto& q : p)
        if (q.is_s(dd)) q.ord = 0;  // a copied placement's order is redrawn here
      int n = shard_order(p.data(), static_cast<int>(mesh_.size()), dd, axes);
      if (n < 2 || !rng_.chance(0.4)) continue;
      std::reverse(axes, axes + n);
      set_shard_order(p.data(), static_cast<int>(mesh_.size()), dd, axes, n);
    }
    if (forced) p = *forced;
    // An input cut unevenly along a dim declares the torch.chunk layout half of the time (else the declaration is
    // the shape-mismatch): a short dim leaves a rank an empty slice (3 over 4), which reductions and broadcasts
    // must handle (issue 23); a dim cut by several axes is cut by each in turn (DTensor's nested shards)
    if (!integer && !uneven && rng_.chance(0.5))
      for (int dd = 0; dd < static_cast<int>(shape.size()); ++dd) {
        int cut = 0;
        std::int64_t k = 1;
        for (std::size_t a = 0; a < mesh_.size(); ++a)
          if (p[a].is_s(dd)) ++cut, k *= mesh_[a].second;
        if (cut >= 1 && shape[static_cast<std::size_t>(dd)] % k) uneven = true;
      }
    std::string d = name + ": {shape: " + dims_text(shape) + ", placement: " + pl_text(p, shape.size());
    if (integer) d += ", dtype: i64";
    if (uneven) d += ", uneven: true";
    d += "}";
    decls_.push_back(d);
    vals_.push_back({name, shape, integer});
    return name;
  }

  const GVal* pick_value(const std::function<bool(const GVal&)>& ok) {
    std::vector<const GVal*> c;
    for (const auto& v : vals_)
      if (!v.integer && ok(v)) c.push_back(&v);
    if (c.empty()) return nullptr;
    if (rng_.chance(0.6)) return c[c.size() - 1 - static_cast<std::size_t>(rng_.below(std::min<int>(3, static_cast<int>(c.size()))))];
    return rng_.pick(c);
  }
  std::optional<Placement> pl_of(const GVal& v, std::size_t a) const {
    auto it = pl_.find(v.name);
    if (it == pl_.end()) return std::nullopt;
    return it->second[a];
  }
  std::string axis_attr(std::size_t a) {
    if (mesh_.size() > 2 && rng_.chance(0.04)) {  // every axis, in a random order (the group is in mesh order anyway)
      std::vector<std::size_t> all;
      for (std::size_t b = 0; b < mesh_.size(); ++b) all.push_back(b);
      if (rng_.chance(0.5)) std::reverse(all.begin(), all.end());
      return axes_text(all);
    }
    if (mesh_.size() > 1 && rng_.chance(0.12)) {
      std::size_t b = (a + 1 + static_cast<std::size_t>(rng_.below(static_cast<int>(mesh_.size()) - 1))) % mesh_.size();
      return rng_.chance(0.8) ? axes_text({std::min(a, b), std::max(a, b)}) : axes_text({std::max(a, b), std::min(a, b)});
    }
    return mesh_[a].first;
  }
  std::string axes_text(const std::vector<std::size_t>& axes) const {
    if (axes.size() == 1) return mesh_[axes[0]].first;
    std::string s = "[";
    for (std::size_t i = 0; i < axes.size(); ++i) s += (i ? ", " : "") + mesh_[axes[i]].first;
    return s + "]";
  }
  // The axes (mesh order) on which v is sharded along dim d.
  std::vector<std::size_t> shard_axes(const GVal& v, int d) const {
    std::vector<std::size_t> out;
    for (std::size_t a = 0; a < mesh_.size(); ++a) {
      auto q = pl_of(v, a);
      if (q && q->is_s(d)) out.push_back(a);
    }
    return out;
  }
  std::string rop_text() { return rng_.pick(std::vector<std::string>{"avg", "max", "min"}); }
  void emit(const std::string& op, const std::vector<std::string>& ins, const std::vector<GVal>& outs, const std::string& attrs = "") {
    std::string s = "{op: " + op + ", in: [";
    for (std::size_t i = 0; i < ins.size(); ++i) s += (i ? ", " : "") + ins[i];
    s += "], out: ";
    if (outs.size() == 1) s += outs[0].name;
    else {
      s += "[";
      for (std::size_t i = 0; i < outs.size(); ++i) s += (i ? ", " : "") + outs[i].name;
      s += "]";
    }
    if (!attrs.empty()) s += ", " + attrs;
    s += "}";
    ops_.push_back(s);
    for (const auto& o : outs) vals_.push_back(o);
  }

  // ---- ops ------------------------------------------------------------------------------------
  void add_op() {
    static const std::vector<std::pair<int, int>> weights = {{0, 10}, {1, 14}, {2, 14}, {3, 8}, {4, 4}, {5, 7}, {6, 4}, {7, 8},
                                                             {8, 22}, {9, 5}, {10, 1}, {11, 3}, {12, 3}, {13, 3}, {14, 2}, {15, 2}, {16, 10}, {17, 4}, {18, 5},
                                                             {19, 12}, {20, 9}};
    int total = 0;
    for (auto [k, w] : weights) total += w;
    int r = rng_.below(total), kind = 0;
    for (auto [k, w] : weights) {
      if (r < w) {
        kind = k;
        break;
      }
      r -= w;
    }
    switch (kind) {
      case 0: return unary_op();
      case 1: return binary_op();
      case 2: return matmul_op();
      case 3: return reduce_op();
      case 4: return softmax_op();
      case 5: return norm_op();
      case 6: return transpose_op();
      case 7: return reshape_op();
      case 8: return collective_op();
      case 9: return convert_op(false);
      case 10: return convert_op(true);
      case 11: return embedding_op();
      case 12: return ce_op();
      case 13: return attention_op();
      case 14: return topk_op();
      case 15: return amax_op();
      case 16: return cp_op();
      case 17: return moe_op();
      case 18: return fp8_op();
      case 19: return tensor_op();
      case 20: return mask_op();
      default: return amax_op();
    }
  }

  // The tensor ops of issue 10: Slice (often not on shard boundaries, sometimes the whole dim), Split, Concat,
  // Stack, Pad (zeros or a value), RoPE at positions from Arange (replicated, converted to S(0), of the
  // wrong length now and then, or a declared tensor of any placement), IndexSelect, IndexAdd, and scale
  // constants written as expressions of mesh sizes.
  void tensor_op() {
    const GVal* x = pick_value([](const GVal& v) { return !v.shape.empty(); });
    if (!x) return;
    GVal xv = *x;
    int r = static_cast<int>(xv.shape.size());
    int d = rng_.below(r);
    std::int64_t n = xv.shape[static_cast<std::size_t>(d)];
    auto with = [&](std::int64_t v) {
      Dims s = xv.shape;
      s[static_cast<std::size_t>(d)] = v;
      return s;
    };
    auto num = [](std::int64_t v) { return std::to_string(v); };
    switch (rng_.below(9)) {
      case 0: {
        std::int64_t start = rng_.chance(0.3) ? 0 : rng_.below(static_cast<int>(n));
        std::int64_t end = start + 1 + rng_.below(static_cast<int>(n - start));
        if (rng_.chance(0.25)) start = 0, end = n;
        return emit("Slice", {xv.name}, {GVal{fresh("sl"), with(end - start)}},
                    "dim: " + num(d) + (start || rng_.chance(0.5) ? ", start: " + num(start) : "") + ", end: " + num(end));
      }
      case 1: {
        int k = n >= 3 && rng_.chance(0.4) ? 3 : 2;
        if (n < k) return;
        std::vector<GVal> outs;
        std::string attrs = "dim: " + num(d);
        if (n % k == 0 && rng_.chance(0.5)) {
          for (int j = 0; j < k; ++j) outs.push_back(GVal{fresh("sp"), with(n / k)});
        } else {
          std::int64_t left = n;
          std::string sizes;
          for (int j = 0; j < k; ++j) {
            std::int64_t s = j + 1 == k ? left : 1 + rng_.below(static_cast<int>(left - (k - j - 1)));
            left -= s;
            outs.push_back(GVal{fresh("sp"), with(s)});
            sizes += (j ? ", " : "") + num(s);
          }
          attrs += ", sizes: [" + sizes + "]";
        }
        return emit("Split", {xv.name}, outs, attrs);
      }
      case 2: {
        const GVal* y = rng_.chance(0.4) ? pick_value([&](const GVal& v) {
          if (v.shape.size() != xv.shape.size() || v.name == xv.name) return false;
          for (int e = 0; e < r; ++e)
            if (e != d && v.shape[static_cast<std::size_t>(e)] != xv.shape[static_cast<std::size_t>(e)]) return false;
          return true;
        })
                                          : nullptr;
        std::string yn = y ? y->name : new_input(with(random_dim()), false, &xv);
        std::int64_t m = y ? y->shape[static_cast<std::size_t>(d)] : vals_.back().shape[static_cast<std::size_t>(d)];
        std::vector<std::string> ins = {xv.name, yn};
        if (rng_.chance(0.5)) std::swap(ins[0], ins[1]);
        return emit("Concat", ins, {GVal{fresh("cat"), with(n + m)}}, "dim: " + num(d));
      }
      case 3: {
        const GVal* y = rng_.chance(0.4) ? pick_value([&](const GVal& v) { return v.shape == xv.shape && v.name != xv.name; }) : nullptr;
        std::string yn = y ? y->name : new_input(xv.shape, false, &xv);
        int sd = rng_.below(r + 1);
        Dims s = xv.shape;
        s.insert(s.begin() + sd, 2);
        return emit("Stack", {xv.name, yn}, {GVal{fresh("st"), s}}, "dim: " + num(sd));
      }
      case 4: {
        std::int64_t before = rng_.below(3), after = rng_.below(3);
        if (!before && !after && rng_.chance(0.7)) after = 1;
        std::string value = rng_.pick(std::vector<std::string>{"", "", ", value: 1.5", ", value: -1"});
        return emit("Pad", {xv.name}, {GVal{fresh("pd"), with(before + n + after)}},
                    "dim: " + num(d) + (before ? ", before: " + num(before) : "") + (after ? ", after: " + num(after) : "") + value);
      }
      case 5: {
        if (r < 2 || xv.shape.back() % 2) return;
        int sd = rng_.below(r - 1);
        std::int64_t s = xv.shape[static_cast<std::size_t>(sd)];
        std::string pos;
        double c = rng_.unit();
        if (c < 0.7) {
          GVal ar{fresh("pos"), {s}, false};
          std::int64_t len = s;
          auto sharded = shard_axes(xv, sd);
          if (c < 0.1 && !sharded.empty() && s % mesh_[sharded[0]].second == 0) len = s / mesh_[sharded[0]].second;  // the local-positions bug
          ar.shape = {len};
          emit("Arange", {}, {ar}, "end: " + num(len) + (rng_.chance(0.3) ? ", dtype: f32" : ""));
          pos = ar.name;
          if (!sharded.empty() && rng_.chance(0.5)) {
            GVal cv{fresh("pos"), {len}, false};
            emit("Convert", {pos}, {cv}, "axis: " + mesh_[sharded.back()].first + ", to: S(0)");
            pos = cv.name;
          }
        } else {
          pos = new_input({s}, false, &xv);
        }
        return emit("RoPE", {xv.name, pos}, {GVal{fresh("rp"), xv.shape}},
                    "dim: " + num(sd) + (rng_.chance(0.3) ? ", inverse: true" : "") + (rng_.chance(0.3) ? ", theta: 100" : ""));
      }
      case 6: {
        std::int64_t k = random_dim();
        std::string ids = new_input({k}, true);
        return emit("IndexSelect", {xv.name, ids}, {GVal{fresh("is"), with(k)}}, "dim: " + num(d));
      }
      case 7: {
        std::int64_t k = random_dim();
        if (rng_.chance(0.3)) {
          // a per-rank scatter (tokens-per-expert): this rank's rows and their indices, cut alike over one axis, into
          // a target whole along dim d that is mostly a per-rank buffer (P or V), sometimes replicated
          std::size_t a = static_cast<std::size_t>(rng_.below(static_cast<int>(mesh_.size())));
          k *= mesh_[a].second;
          Placements pi{}, ps{}, px{};
          pi[a] = Placement::s(0);
          ps[a] = Placement::s(d);
          px[a] = rng_.pick(std::vector<Placement>{Placement::p(), Placement::v(), Placement::r()});
          std::string target = new_input(xv.shape, false, nullptr, px);
          std::string ids = new_input({k}, true, nullptr, pi);
          std::string src = new_input(with(k), false, nullptr, ps);
          return emit("IndexAdd", {target, ids, src}, {GVal{fresh("ia"), xv.shape}}, "dim: " + num(d));
        }
        std::string ids = new_input({k}, true, nullptr, Placements{});
        std::string src = new_input(with(k), false, &xv);
        return emit("IndexAdd", {xv.name, ids, src}, {GVal{fresh("ia"), xv.shape}}, "dim: " + num(d));
      }
      default: {
        std::size_t a = static_cast<std::size_t>(rng_.below(static_cast<int>(mesh_.size())));
        std::string e = rng_.chance(0.5) ? "1/" + mesh_[a].first : "-2/(" + mesh_[a].first + "*" + mesh_[(a + 1) % mesh_.size()].first + ")";
        const char* op = rng_.pick(std::vector<const char*>{"Multiply", "Div", "LossScale"});
        return emit(op, {xv.name}, {GVal{fresh("sc"), xv.shape}}, std::string(op == std::string("LossScale") ? "scale: " : "scalar: ") + e);
      }
    }
  }

  void unary_op() {
    const GVal* x = pick_value([](const GVal&) { return true; });
    if (!x) return;
    GVal o{fresh("u"), x->shape};
    std::string xn = x->name;
    // Log, Sqrt and Rsqrt only after an Exp, so their inputs are in their domain
    auto after_exp = [&](const char* f) {
      GVal e{fresh("u"), x->shape};
      emit("Exp", {xn}, {e});
      return emit(f, {e.name}, {o});
    };
    switch (rng_.below(16)) {
      case 14: return emit("Sin", {xn}, {o});
      case 15: return emit("Cos", {xn}, {o});
      case 9: return emit("Neg", {xn}, {o});
      case 10: return emit("Exp", {xn}, {o});
      case 11: return after_exp("Log");
      case 12: return after_exp("Sqrt");
      case 13: return after_exp("Rsqrt");
      case 0: return emit("GELU", {xn}, {o});
      case 1: return emit("SiLU", {xn}, {o});
      case 2: return emit("ReLU", {xn}, {o});
      case 3: return emit("Cast", {xn}, {o}, rng_.pick(std::vector<std::string>{"dtype: bf16", "dtype: bf16", "dtype: i32", "dtype: i8", "dtype: bool"}));
      case 4: return emit("LossScale", {xn}, {o}, rng_.pick(std::vector<std::string>{"scale: 2.5", "scale: 2.5", "scale: -0.5", "scale: 0"}));
      case 5: {  // integer values (with zeros and negatives), so a later cast to bool can tell a max of bools from a bool of the max
        GVal i{fresh("u"), x->shape};
        emit("Cast", {xn}, {i}, "dtype: i32");
        return emit("Cast", {i.name}, {o}, rng_.chance(0.7) ? "dtype: bool" : "dtype: bf16");
      }
      case 6: return emit("FP8Quantize", {xn}, {o});
      case 7: return emit("FP8Dequantize", {xn}, {o});
      default: return emit("Dropout", {xn}, {o}, rng_.chance(0.5) ? "p: 0.25" : "p: 0.25, rng: per_rank");
    }
  }

  void binary_op() {
    const GVal* x = pick_value([](const GVal&) { return true; });
    if (!x) return;
    GVal xv = *x;
    const char* kinds[] = {"Add", "Sub", "Multiply", "Div", "Maximum", "Minimum", "Where"};
    std::string k = kinds[rng_.below(7)];
    GVal o{fresh("e"), xv.shape};
    double r = rng_.unit();
    if (k == "Where") {  // a mask with zeros: an input cast to i32 (values round to 0 often), then to bool
      std::string m0 = new_input(xv.shape, false, &xv);
      GVal mi{fresh("mk"), xv.shape}, mb{fresh("mk"), xv.shape};
      emit("Cast", {m0}, {mi}, "dtype: i32");
      emit("Cast", {mi.name}, {mb}, "dtype: bool");
      const GVal* y = pick_value([&](const GVal& v) { return v.shape == xv.shape && v.name != xv.name && v.name != mb.name && v.name != mi.name; });
      std::string yn = y && rng_.chance(0.5) ? y->name : new_input(xv.shape, false, &xv);
      return rng_.chance(0.5) ? emit(k, {mb.name, xv.name, yn}, {o}) : emit(k, {mb.name, yn, xv.name}, {o});
    }
    if (r < 0.15) {
      std::vector<std::string> scalars{"scalar: 1.5", "scalar: 1.5", "scalar: -2", "scalar: 0"};
      if (k == "Div") scalars.back() = "scalar: -0.5";
      return emit(k, {xv.name}, {o}, rng_.pick(scalars));
    }
    if (r < 0.5) {
      const GVal* y = pick_value([&](const GVal& v) { return v.shape == xv.shape && v.name != xv.name; });
      if (y) {
        std::string yn = y->name;
        return rng_.chance(0.5) ? emit(k, {xv.name, yn}, {o}) : emit(k, {yn, xv.name}, {o});
      }
    }
    Dims s = xv.shape;
    if (!s.empty() && rng_.chance(0.4)) s.erase(s.begin(), s.begin() + 1 + rng_.below(static_cast<int>(s.size())));  // a bias: a suffix
    if (s.empty() && !xv.shape.empty()) s = {xv.shape.back()};
    std::string y;
    if (s.size() >= 2 && rng_.chance(0.12)) {
      // a keepdim-style operand: one dim of size 1 broadcast against x's, sometimes sharded (torch.chunk: one rank
      // holds the element, the others an empty slice; issue 23)
      int k = rng_.below(static_cast<int>(s.size()));
      s[static_cast<std::size_t>(k)] = 1;
      std::optional<Placements> forced;
      if (rng_.chance(0.6)) {
        Placements p{};
        p[static_cast<std::size_t>(rng_.below(static_cast<int>(mesh_.size())))] = Placement::s(k);
        forced = p;
      }
      y = new_input(s, false, &xv, forced, true);
    } else {
      y = new_input(s, false, &xv);
    }
    return rng_.chance(0.7) ? emit(k, {xv.name, y}, {o}) : emit(k, {y, xv.name}, {o});
  }

  void matmul_op() {
    const GVal* x = pick_value([](const GVal& v) { return v.shape.size() >= 2; });
    if (!x) {
      x = pick_value([](const GVal& v) { return v.shape.size() == 1; });
      if (!x) return;
    }
    GVal xv = *x;
    if (xv.shape.size() == 1) {  // make a rank-2 A from scratch
      std::string a = new_input({random_dim(), xv.shape[0]}, false);
      xv = vals_.back();
      (void)a;
    }
    std::int64_t k = xv.shape.back(), n = random_dim();
    Dims bs = {k, n};
    bool batched = xv.shape.size() >= 3 && rng_.chance(0.2);
    if (batched) {
      bs.assign(xv.shape.begin(), xv.shape.end() - 2);
      bs.push_back(k);
      bs.push_back(n);
    }
    std::string b;
    const GVal* existing = rng_.chance(0.25) ? pick_value([&](const GVal& v) { return v.shape.size() == 2 && v.shape[0] == k && v.name != xv.name; }) : nullptr;
    if (existing && !batched) {
      b = existing->name;
      n = existing->shape[1];
    } else {
      Placements p{};
      int rb = static_cast<int>(bs.size());
      for (std::size_t a = 0; a < mesh_.size(); ++a) {
        auto q = pl_of(xv, a);
        double r = rng_.unit();
        if (q && q->is_s(static_cast<int>(xv.shape.size()) - 1) && r < 0.75) p[a] = Placement::s(rb - 2);
        else if (q && q->is_s() && batched && q->dim < static_cast<int>(xv.shape.size()) - 2 && r < 0.6) p[a] = *q;
        else if (r < 0.5) p[a] = Placement::r();
        else if (r < 0.75) p[a] = Placement::s(rb - 1);
        else if (r < 0.85) p[a] = Placement::s(rb - 2);
        else if (r < 0.92) p[a] = q && q->is_i() ? Placement::i() : Placement::p();
        else p[a] = random_placement(rb);
      }
      b = new_input(bs, false, nullptr, p);
    }
    Dims os(xv.shape.begin(), xv.shape.end() - 1);
    os.push_back(n);
    emit("MatMul", {xv.name, b}, {GVal{fresh("m"), os}});
  }

  void reduce_op() {
    const GVal* x = pick_value([](const GVal& v) { return !v.shape.empty(); });
    if (!x) return;
    GVal xv = *x;
    int r = static_cast<int>(xv.shape.size());
    std::vector<int> dims = {rng_.below(r)};
    if (r >= 2 && rng_.chance(0.3)) {
      int d2 = rng_.below(r);
      if (d2 != dims[0]) dims.push_back(d2);
    }
    std::sort(dims.begin(), dims.end());
    bool keep = rng_.chance(0.3);
    Dims os;
    for (int d = 0; d < r; ++d) {
      bool red = std::find(dims.begin(), dims.end(), d) != dims.end();
      if (!red) os.push_back(xv.shape[static_cast<std::size_t>(d)]);
      else if (keep) os.push_back(1);
    }
    std::string ds = "[";
    for (std::size_t i = 0; i < dims.size(); ++i) ds += (i ? ", " : "") + std::to_string(dims[i]);
    ds += "]";
    const char* kinds[] = {"Sum", "Mean", "ReduceMax", "ReduceMin", "LogSumExp"};
    emit(rng_.chance(0.4) ? kinds[rng_.below(2)] : kinds[rng_.below(5)], {xv.name}, {GVal{fresh("r"), os}}, "dims: " + ds + (keep ? ", keepdim: true" : ""));
  }

  void softmax_op() {
    const GVal* x = pick_value([](const GVal& v) { return !v.shape.empty(); });
    if (!x) return;
    GVal xv = *x;
    emit("Softmax", {xv.name}, {GVal{fresh("sm"), xv.shape}}, "dim: " + std::to_string(rng_.below(static_cast<int>(xv.shape.size()))));
  }

  void norm_op() {
    const GVal* x = pick_value([](const GVal& v) { return !v.shape.empty(); });
    if (!x) return;
    GVal xv = *x;
    bool ln = rng_.chance(0.5);
    bool two = xv.shape.size() >= 2 && rng_.chance(0.2);
    Dims ws = two ? Dims{xv.shape[xv.shape.size() - 2], xv.shape.back()} : Dims{xv.shape.back()};
    std::vector<std::string> ins = {xv.name};
    auto weight = [&] {
      Placements p{};
      if (rng_.chance(0.25))
        for (std::size_t a = 0; a < mesh_.size(); ++a) p[a] = random_placement(static_cast<int>(ws.size()));
      return new_input(ws, false, nullptr, p);
    };
    if (rng_.chance(0.6)) {
      ins.push_back(weight());
      if (ln && rng_.chance(0.4)) ins.push_back(weight());
    }
    emit(ln ? "LayerNorm" : "RMSNorm", ins, {GVal{fresh("n"), xv.shape}}, two ? "dims: [-2, -1]" : "");
  }

  void transpose_op() {
    const GVal* x = pick_value([](const GVal& v) { return v.shape.size() >= 2; });
    if (!x) return;
    GVal xv = *x;
    int r = static_cast<int>(xv.shape.size());
    int d0 = rng_.below(r), d1 = (d0 + 1 + rng_.below(r - 1)) % r;
    Dims os = xv.shape;
    std::swap(os[static_cast<std::size_t>(d0)], os[static_cast<std::size_t>(d1)]);
    emit("Transpose", {xv.name}, {GVal{fresh("t"), os}}, fmt::format("dims: [{}, {}]", d0, d1));
  }

  void reshape_op() {
    const GVal* x = pick_value([](const GVal& v) { return !v.shape.empty(); });
    if (!x) return;
    GVal xv = *x;
    Dims os = xv.shape;
    int r = static_cast<int>(os.size());
    double c = rng_.unit();
    if (r >= 2 && c < 0.3) {  // merge two adjacent dims
      int d = rng_.below(r - 1);
      os[static_cast<std::size_t>(d)] *= os[static_cast<std::size_t>(d) + 1];
      os.erase(os.begin() + d + 1);
    } else if (r >= 2 && c < 0.55) {  // regroup two adjacent dims: [6, 4] -> [4, 6], [12, 2] -> [8, 3]
      int d = rng_.below(r - 1);
      std::int64_t a = os[static_cast<std::size_t>(d)], n = a * os[static_cast<std::size_t>(d) + 1];
      std::vector<std::int64_t> fs;
      for (std::int64_t f = 2; f < n; ++f)
        if (n % f == 0 && f != a) fs.push_back(f);
      if (fs.empty()) return;
      std::int64_t f = fs[static_cast<std::size_t>(rng_.below(static_cast<int>(fs.size())))];
      os[static_cast<std::size_t>(d)] = f;
      os[static_cast<std::size_t>(d) + 1] = n / f;
    } else if (r < 4 && c < 0.85) {  // split a dim
      int d = rng_.below(r);
      std::int64_t n = os[static_cast<std::size_t>(d)];
      std::int64_t f = n % 2 == 0 && n > 2 ? 2 : n % 3 == 0 && n > 3 ? 3 : 0;
      if (!f) return;
      if (rng_.chance(0.5)) f = n / f;
      os[static_cast<std::size_t>(d)] = n / f;
      os.insert(os.begin() + d + 1, f);
    } else {  // flatten
      std::int64_t n = 1;
      for (auto v : os) n *= v;
      os = {n};
    }
    std::string t = "shape: " + dims_text(os);
    emit("Reshape", {xv.name}, {GVal{fresh("v"), os}}, t);
  }

  void collective_op() {
    const GVal* x = pick_value([](const GVal& v) { return !v.shape.empty(); });
    if (!x) return;
    GVal xv = *x;
    std::size_t a = static_cast<std::size_t>(rng_.below(static_cast<int>(mesh_.size())));
    auto q = pl_of(xv, a);
    int r = static_cast<int>(xv.shape.size());
    std::string ax = "axis: " + axis_attr(a);
    GVal o{fresh("c"), xv.shape};
    auto reduce_attr = [](Placement p) { return p.is_p() && p.op != ReduceOp::Sum ? fmt::format(", reduce: {}", reduce_name(p.op)) : std::string(); };
    bool wrong = !q || rng_.chance(0.12);
    // A shard-creating op asks for the torch.chunk layout now and then (`uneven: true`), and the ZeRO ops stand
    // for their plain collectives (ZeROGatherParam: AllGather, ZeROScatterGrad: ReduceScatter, ZeROPartitionOptState:
    // Convert R -> S(d)).
    auto unev = [&]() { return rng_.chance(0.25) ? std::string(", uneven: true") : std::string(); };
    auto rs_name = [&]() { return rng_.chance(0.3) ? "ZeROScatterGrad" : "ReduceScatter"; };
    if (!wrong && q->is_p()) {
      double c = rng_.unit();
      if (c < 0.6) return emit("AllReduce", {xv.name}, {o}, ax + reduce_attr(*q) + (rng_.chance(0.1) ? ", dst: I" : ""));
      if (c < 0.92) return emit(rs_name(), {xv.name}, {o}, ax + fmt::format(", dim: {}", rng_.below(r)) + reduce_attr(*q) + unev());
      return emit("Reduce", {xv.name}, {o}, ax + ", dst: 0" + reduce_attr(*q));
    }
    if (!wrong && q->is_s()) {
      double c = rng_.unit();
      if (c < 0.2) return emit("ZeROGatherParam", {xv.name}, {o}, ax + (q->dim || rng_.chance(0.5) ? fmt::format(", dim: {}", q->dim) : std::string()));
      if (c < 0.65 || r < 2) return emit("AllGather", {xv.name}, {o}, ax + fmt::format(", dim: {}", q->dim) + (rng_.chance(0.1) ? ", dst: I" : ""));
      if (c < 0.95) {
        int s = (q->dim + 1 + rng_.below(r - 1)) % r;
        auto sh = shard_axes(xv, q->dim);  // every axis sharding concat_dim at once: one group in mesh order
        if (sh.size() > 1 && rng_.chance(0.5)) {
          if (rng_.chance(0.3)) std::reverse(sh.begin(), sh.end());
          ax = "axis: " + axes_text(sh);
        }
        std::string u = unev();
        return emit("AllToAll", {xv.name}, {o}, ax + fmt::format(", split_dim: {}, concat_dim: {}", s, q->dim) + u + split_sizes(xv, s, ax, !u.empty()));
      }
      return emit("Gather", {xv.name}, {o}, ax + fmt::format(", dim: {}, dst: 0", q->dim));
    }
    if (!wrong && (q->is_r() || q->is_i())) {
      double c = rng_.unit();
      if (c < 0.1) return emit("ZeROPartitionOptState", {xv.name}, {o}, ax + fmt::format(", dim: {}", rng_.below(r)) + unev());
      if (c < 0.28) return emit("Convert", {xv.name}, {o}, ax + fmt::format(", to: S({})", rng_.below(r)) + unev());
      if (c < 0.42) return emit("Scatter", {xv.name}, {o}, ax + fmt::format(", dim: {}, src: 0", rng_.below(r)) + unev());
      if (c < 0.52) return emit("Broadcast", {xv.name}, {o}, ax + ", src: 0");
      if (c < 0.6 && q->is_i()) return emit("Convert", {xv.name}, {o}, ax + ", to: R");
      if (c < 0.68) return emit("Convert", {xv.name}, {o}, "axis: " + mesh_[a].first + ", to: V");
      if (c < 0.76) return emit("Convert", {xv.name}, {o}, "axis: " + mesh_[a].first + ", to: " + rng_.pick(std::vector<std::string>{"P(avg)", "P(max)", "P(min)", "P"}));
      if (c < 0.84) return emit(rs_name(), {xv.name}, {o}, ax + fmt::format(", dim: {}, reduce: {}", rng_.below(r), rop_text()) + unev());
      if (c < 0.93) return emit("AllReduce", {xv.name}, {o}, ax + ", reduce: " + rop_text());
      return emit("AllReduce", {xv.name}, {o}, ax);
    }
    if (!wrong && q->is_v()) {
      double c = rng_.unit();
      std::string rop = rng_.chance(0.6) ? "" : ", reduce: " + rop_text();
      if (c < 0.45) return emit("AllReduce", {xv.name}, {o}, ax + rop);
      if (c < 0.7) return emit(rs_name(), {xv.name}, {o}, ax + fmt::format(", dim: {}", rng_.below(r)) + rop + unev());
      if (c < 0.85) return emit("Convert", {xv.name}, {o}, "axis: " + mesh_[a].first + ", to: " + rng_.pick(std::vector<std::string>{"P", "P", "P(avg)", "P(max)"}));
      return emit("Broadcast", {xv.name}, {o}, ax + ", src: 1");
    }
    // a random collective, whatever the input
    switch (rng_.below(9)) {
      case 6: return emit("ZeROGatherParam", {xv.name}, {o}, ax + fmt::format(", dim: {}", rng_.below(r)));
      case 7: return emit("ZeROScatterGrad", {xv.name}, {o}, ax + fmt::format(", dim: {}", rng_.below(r)) + unev());
      case 8: return emit("ZeROPartitionOptState", {xv.name}, {o}, ax + fmt::format(", dim: {}", rng_.below(r)) + unev());
      case 0: return emit("AllReduce", {xv.name}, {o}, ax);
      case 1: return emit("AllGather", {xv.name}, {o}, ax + fmt::format(", dim: {}", rng_.below(r)));
      case 2: return emit("ReduceScatter", {xv.name}, {o}, ax + fmt::format(", dim: {}", rng_.below(r)));
      case 3: return emit("Broadcast", {xv.name}, {o}, ax + ", src: 0");
      case 4:
        if (r >= 2) return emit("AllToAll", {xv.name}, {o}, ax + fmt::format(", split_dim: 0, concat_dim: {}", r - 1));
        return emit("Scatter", {xv.name}, {o}, ax + ", dim: 0");
      default: return emit("Scatter", {xv.name}, {o}, ax + fmt::format(", dim: {}", rng_.below(r)));
    }
  }

  // AllToAll's explicit `split_sizes` now and then (only for a one-axis group): the blocks of the output's
  // S(split_dim) (even, or torch.chunk's with `uneven`) of each rank's piece of the dim, or a skewed list
  // (DeepSpeed#8316's [4, 4, 4, 0]) that adds up to it, or one that does not.
  std::string split_sizes(const GVal& x, int s, const std::string& ax, bool uneven) {
    std::size_t a = 0;
    while (a < mesh_.size() && "axis: " + mesh_[a].first != ax) ++a;
    if (a == mesh_.size() || !rng_.chance(0.3)) return "";
    std::int64_t n = x.shape[static_cast<std::size_t>(s)], g = mesh_[a].second;
    for (std::size_t b : shard_axes(x, s)) {  // the sizes split each rank's piece of the dim (all_to_all_single's local tensor)
      if (n % mesh_[b].second) return "";
      n /= mesh_[b].second;
    }
    std::int64_t step = (n + g - 1) / g;
    std::vector<std::int64_t> sizes;
    for (std::int64_t i = 0; i < g; ++i) sizes.push_back(uneven || n % g ? std::max<std::int64_t>(0, std::min(n, (i + 1) * step) - std::min(n, i * step)) : n / g);
    double c = rng_.unit();
    if (c < 0.25 && g > 1 && sizes[0] > 0) sizes[0] -= 1, sizes[static_cast<std::size_t>(g - 1)] += 1;  // skewed: adds up, wrong blocks
    else if (c < 0.35) sizes[0] += 1;                                                                  // does not add up
    std::string t;
    for (auto v : sizes) t += (t.empty() ? "" : ", ") + std::to_string(v);
    return ", split_sizes: [" + t + "]";
  }

  // Masks, counts, running sums and gates (issues 21 and 23): Sigmoid, comparisons (with a scalar or a tensor,
  // float or integer data), And/Or/Not of masks, OneHot and Bincount of ids (replicated or sharded), CumSum along
  // a random dim (sharded now and then), Detach.
  void mask_op() {
    switch (rng_.below(7)) {
      case 0: {
        const GVal* x = pick_value([](const GVal&) { return true; });
        if (!x) return;
        GVal xv = *x;
        return emit(rng_.chance(0.8) ? "Sigmoid" : "Detach", {xv.name}, {GVal{fresh("sg"), xv.shape}});
      }
      case 1: {
        const GVal* x = pick_value([](const GVal&) { return true; });
        if (!x) return;
        GVal xv = *x;
        const char* op = rng_.pick(std::vector<const char*>{"Eq", "Ne", "Lt", "Le", "Gt", "Ge"});
        GVal o{fresh("mk"), xv.shape};
        if (rng_.chance(0.5)) return emit(op, {xv.name}, {o}, rng_.pick(std::vector<std::string>{"scalar: 0", "scalar: 0.5", "scalar: -1"}));
        std::string y = new_input(xv.shape, false, &xv);
        return rng_.chance(0.5) ? emit(op, {xv.name, y}, {o}) : emit(op, {y, xv.name}, {o});
      }
      case 2: {  // comparisons of integer ids, combined into a range mask
        std::int64_t k = random_dim();
        std::string ids = new_input({k, random_dim()}, true);
        Dims s = vals_.back().shape;
        GVal lo{fresh("mk"), s}, hi{fresh("mk"), s}, m{fresh("mk"), s};
        emit("Ge", {ids}, {lo}, "scalar: 1");
        emit("Lt", {ids}, {hi}, "scalar: 3");
        emit(rng_.chance(0.7) ? "And" : "Or", {lo.name, hi.name}, {m});
        if (rng_.chance(0.3)) emit("Not", {m.name}, {GVal{fresh("mk"), s}});
        return;
      }
      case 3: {  // And/Or/Not of masks made from float data (bool, possibly pending a max after a monotone comparison)
        const GVal* x = pick_value([](const GVal&) { return true; });
        if (!x) return;
        GVal xv = *x;
        GVal a{fresh("mk"), xv.shape}, b{fresh("mk"), xv.shape};
        emit("Gt", {xv.name}, {a}, "scalar: 0");
        std::string y = new_input(xv.shape, false, &xv);
        emit("Le", {y}, {b}, "scalar: 0.5");
        if (rng_.chance(0.3)) return emit("Not", {a.name}, {GVal{fresh("mk"), xv.shape}});
        return emit(rng_.chance(0.5) ? "And" : "Or", {a.name, b.name}, {GVal{fresh("mk"), xv.shape}});
      }
      case 4: {
        std::int64_t c = rng_.pick(std::vector<std::int64_t>{3, 4, 8});
        std::string ids = new_input({random_dim(), random_dim()}, true);
        Dims s = vals_.back().shape;
        return emit("OneHot", {ids}, {GVal{fresh("oh"), {s[0], s[1], c}}}, fmt::format("classes: {}{}", c, rng_.chance(0.5) ? ", dtype: f32" : ""));
      }
      case 5: {
        std::int64_t c = rng_.pick(std::vector<std::int64_t>{3, 4, 8});
        std::string ids = new_input({random_dim(), random_dim()}, true);
        return emit("Bincount", {ids}, {GVal{fresh("bc"), {c}}}, fmt::format("length: {}", c));
      }
      default: {
        const GVal* x = pick_value([](const GVal& v) { return !v.shape.empty(); });
        if (!x) return;
        GVal xv = *x;
        int d = rng_.below(static_cast<int>(xv.shape.size()));
        return emit("CumSum", {xv.name}, {GVal{fresh("cs"), xv.shape}}, fmt::format("dim: {}{}", d, rng_.chance(0.3) ? ", reverse: true" : ""));
      }
    }
  }

  void convert_op(bool reinterpret) {
    const GVal* x = pick_value([](const GVal& v) { return !v.shape.empty(); });
    if (!x) return;
    GVal xv = *x;
    std::size_t a = static_cast<std::size_t>(rng_.below(static_cast<int>(mesh_.size())));
    auto q = pl_of(xv, a);
    std::string to;
    if (reinterpret) to = rng_.pick(std::vector<std::string>{"R", "P", "V", "I"});
    else if (q && q->is_i()) to = "R";
    else if (q && q->is_v()) to = rng_.chance(0.8) ? "P" : "P(max)";
    else if (q && q->is_r()) {
      double c = rng_.unit();
      to = c < 0.4 ? "V" : c < 0.75 ? fmt::format("S({})", rng_.below(static_cast<int>(xv.shape.size()))) : rng_.pick(std::vector<std::string>{"P(avg)", "P(max)", "P(min)", "P"});
    } else to = rng_.pick(std::vector<std::string>{"R", "I", "V", "P", "P(max)", "S(0)"});
    if (!reinterpret && rng_.chance(0.15)) {  // a guard: the inferred placement, with one axis asked to be something else now and then
      auto it = pl_.find(xv.name);
      if (it != pl_.end()) {
        Placements p = it->second;
        if (rng_.chance(0.5)) {
          Placement& t = p[a];
          if (t.is_r() || t.is_p()) t = Placement::p(rng_.pick(std::vector<ReduceOp>{ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}));
          else t = random_placement(static_cast<int>(xv.shape.size()));
        }
        return emit("SPMDGuard", {xv.name}, {GVal{fresh("g"), xv.shape}}, "placement: " + pl_text(p, xv.shape.size()));
      }
    }
    emit(reinterpret ? "Reinterpret" : "Convert", {xv.name}, {GVal{fresh("k"), xv.shape}}, "axis: " + mesh_[a].first + ", to: " + to);
  }

  void embedding_op() {
    Dims ids = {random_dim(), random_dim()};
    std::int64_t vocab = rng_.pick(std::vector<std::int64_t>{8, 12, 16}), h = random_dim();
    Placements p{};
    for (std::size_t a = 0; a < mesh_.size(); ++a) {
      double r = rng_.unit();
      p[a] = r < 0.4 ? Placement::s(0) : r < 0.6 ? Placement::s(1) : r < 0.95 ? Placement::r() : Placement::p();
    }
    std::string idn = new_input(ids, true);
    std::string w = new_input({vocab, h}, false, nullptr, p);
    emit("Embedding", {idn, w}, {GVal{fresh("emb"), {ids[0], ids[1], h}}});
  }

  void ce_op() {
    const GVal* x = pick_value([](const GVal& v) { return v.shape.size() >= 2 && v.shape.back() >= 2; });
    if (!x) return;
    GVal xv = *x;
    Dims ls(xv.shape.begin(), xv.shape.end() - 1);
    // labels sharded like the logits' leading dims (mostly)
    Placements p{};
    bool vp = false;
    for (std::size_t a = 0; a < mesh_.size(); ++a) {
      auto q = pl_of(xv, a);
      if (q && q->is_s() && q->dim < static_cast<int>(ls.size()) && rng_.chance(0.8)) p[a] = *q;
      if (q && q->is_s(static_cast<int>(xv.shape.size()) - 1)) vp = true;
    }
    std::string lb = new_input(ls, true, nullptr, p);
    std::string red = rng_.pick(std::vector<std::string>{"", ", reduction: sum", ", reduction: none"});
    Dims os = red == ", reduction: none" ? ls : Dims{};
    std::string attrs = (vp || rng_.chance(0.1)) && rng_.chance(0.85) ? "vocab_parallel: true" : "vocab_parallel: false";
    emit("CrossEntropyLoss", {xv.name, lb}, {GVal{fresh("loss"), os}}, attrs + red);
  }

  void attention_op() {
    std::int64_t b = rng_.pick(std::vector<std::int64_t>{2, 4}), h = rng_.pick(std::vector<std::int64_t>{2, 4, 6}), s = rng_.pick(std::vector<std::int64_t>{4, 6, 8}),
                 d = rng_.pick(std::vector<std::int64_t>{2, 4});
    Dims shape = {b, h, s, d};
    Dims kv = shape;  // grouped-query attention now and then: fewer kv heads, each shared by h / kv[1] query heads
    if (rng_.chance(0.35)) kv[1] = h == 2 ? 1 : rng_.pick(h == 4 ? std::vector<std::int64_t>{1, 2} : std::vector<std::int64_t>{1, 2, 3});
    std::array<Placements, 3> p{};
    for (std::size_t a = 0; a < mesh_.size(); ++a) {
      int pat = rng_.below(7);  // 5: q's heads cut, k and v whole (GQA's kv heads replicated over tp)
      for (int i = 0; i < 3; ++i) {
        Placement x = pat == 0 ? Placement::r() : pat == 1 ? Placement::s(1) : pat == 2 ? Placement::s(0) : pat == 3 ? (i == 0 ? Placement::s(2) : Placement::r())
                    : pat == 4 ? (i == 2 ? Placement::s(3) : Placement::r())
                    : pat == 5 ? (i == 0 ? Placement::s(1) : Placement::r())
                               : random_placement(4);
        p[static_cast<std::size_t>(i)][a] = x;
      }
    }
    std::string q = new_input(shape, false, nullptr, p[0]), k = new_input(kv, false, nullptr, p[1]), v = new_input(kv, false, nullptr, p[2]);
    std::string attrs = rng_.chance(0.3) ? "causal: true" : "";
    if (rng_.chance(0.25)) attrs += std::string(attrs.empty() ? "" : ", ") + rng_.pick(std::vector<std::string>{"scale: 0.3", "scale: 1.5", "scale: 1/sqrt(8)"});
    emit("FlashAttention", {q, k, v}, {GVal{fresh("att"), shape}}, attrs);
  }

  // Context parallelism over one axis: all-gather-KV attention with `cp`, RingAttention, a hand-rolled ring of
  // RingRotate and RingAttentionStep (sometimes a step missing, a wrong `step`, v not rotated, or the partial
  // outputs summed without the rescale), or a LoadBalance; sequences in zigzag order through LoadBalance.
  void cp_op() {
    int a = rng_.below(static_cast<int>(mesh_.size()));
    const std::string ax = mesh_[static_cast<std::size_t>(a)].first;
    int n = mesh_[static_cast<std::size_t>(a)].second;
    if (rng_.chance(0.2)) {
      const GVal* x = pick_value([](const GVal& v) { return v.shape.size() >= 2; });
      if (!x) return;
      GVal xv = *x;
      emit("LoadBalance", {xv.name}, {GVal{fresh("lb"), xv.shape}},
           fmt::format("axis: {}, dim: {}{}", ax, rng_.below(static_cast<int>(xv.shape.size())), rng_.chance(0.3) ? ", direction: inverse" : ""));
      return;
    }
    std::int64_t b = 2, h = rng_.pick(std::vector<std::int64_t>{2, 4}), d = rng_.pick(std::vector<std::int64_t>{2, 4});
    std::int64_t s = n * rng_.pick(std::vector<std::int64_t>{2, 2, 4, 3}) + (rng_.chance(0.1) ? 1 : 0);  // now and then uneven
    Dims shape = {b, h, s, d}, lshape = {b, h, s, 1};
    int kind = rng_.chance(0.5) ? 2 : rng_.below(2);
    bool zz = rng_.chance(0.4), causal = rng_.chance(0.7);
    std::string attn = std::string(causal ? ", causal: true" : "") + (rng_.chance(zz ? 0.85 : 0.15) ? ", order: zigzag" : "");
    Dims kv = shape;  // grouped-query attention now and then: fewer kv heads
    if (rng_.chance(0.35)) kv[1] = h == 2 ? 1 : rng_.pick(std::vector<std::int64_t>{1, 2});
    Placements other{};
    std::uint32_t q_only = 0;  // other axes that cut q's heads only (GQA's kv heads replicated there)
    for (std::size_t c = 0; c < mesh_.size(); ++c) {
      other[c] = rng_.chance(0.7) ? Placement::r() : rng_.chance(0.8) ? Placement::s(1) : random_placement(4);
      if (other[c].is_s(1) && rng_.chance(0.4)) q_only |= 1u << c;
    }
    // q, k, v: sharded on the sequence over the axis (k, v whole for the all-gather-KV kind), the same on the others
    auto input = [&](bool seq_sharded, bool is_q = false) {
      Placements p = other;
      for (std::size_t c = 0; c < mesh_.size(); ++c)
        if (!is_q && (q_only >> c & 1u)) p[c] = Placement::r();
      p[static_cast<std::size_t>(a)] = rng_.chance(0.9) ? Placement::r() : random_placement(4);
      bool reorder = zz && p[static_cast<std::size_t>(a)].is_r();
      const Dims& xs = is_q ? shape : kv;
      std::string x = new_input(xs, false, nullptr, p);
      if (reorder) {
        std::string y = fresh("zz");
        emit("LoadBalance", {x}, {GVal{y, xs}}, fmt::format("axis: {}, dim: 2", ax));
        x = y;
      }
      if (seq_sharded && p[static_cast<std::size_t>(a)].is_r()) {
        std::string y = fresh("cs");
        emit("Convert", {x}, {GVal{y, xs}}, fmt::format("axis: {}, from: R, to: S(2)", ax));
        x = y;
      }
      return x;
    };
    std::string q = input(true, true);
    if (kind == 0) {
      std::string k = input(false), v = input(false);
      std::string at = (rng_.chance(0.85) ? ", cp: " + ax : std::string()) + attn;
      emit("FlashAttention", {q, k, v}, {GVal{fresh("att"), shape}}, at.empty() ? at : at.substr(2));
      return;
    }
    std::string k = input(true), v = input(true);
    if (kind == 1) {
      emit("RingAttention", {q, k, v}, {GVal{fresh("ring"), shape}}, "axis: " + ax + attn);
      return;
    }
    int steps = rng_.chance(0.85) ? n : 1 + rng_.below(n + 1);
    std::string o, l, prev_o;
    for (int st = 0; st < steps; ++st) {
      if (st > 0) {
        std::string k2 = fresh("rk"), v2 = fresh("rv");
        std::string dir = rng_.chance(0.05) ? ", direction: prev" : "";
        emit("RingRotate", {k}, {GVal{k2, kv}}, "axis: " + ax + dir);
        if (!rng_.chance(0.05)) emit("RingRotate", {v}, {GVal{v2, kv}}, "axis: " + ax + dir), v = v2;
        k = k2;
      }
      int step_attr = rng_.chance(0.05) ? st + 1 : st;
      std::string o2 = fresh("ro"), l2 = fresh("rl");
      bool unrescaled = st > 0 && rng_.chance(0.08);
      std::vector<std::string> ins = {q, k, v};
      if (st > 0 && !unrescaled) ins.push_back(o), ins.push_back(l);
      emit("RingAttentionStep", ins, {GVal{o2, shape}, GVal{l2, lshape}}, fmt::format("axis: {}, step: {}{}", ax, step_attr, attn));
      if (unrescaled) {
        std::string sum = fresh("sum");
        emit("Add", {o, o2}, {GVal{sum, shape}});
        o2 = sum;
      }
      o = o2, l = l2;
    }
  }

  void topk_op() {
    const GVal* x = pick_value([](const GVal& v) { return !v.shape.empty() && v.shape.back() >= 2; });
    if (!x) return;
    GVal xv = *x;
    int k = 1 + rng_.below(static_cast<int>(std::min<std::int64_t>(3, xv.shape.back())));
    Dims os = xv.shape;
    os.back() = k;
    GVal idx{fresh("topi"), os, true};
    emit("TopKGate", {xv.name}, {GVal{fresh("topv"), os}, idx}, fmt::format("k: {}", k));
  }

  // A mixture-of-experts layer: tokens (usually split over the expert axis), routing by TopKGate or declared
  // indices, MoEDispatch (dropless, capacity, capacity factor; weighted or not), ExpertCompute, MoECombine
  // (usually by the same indices over the same axis).
  void moe_op() {
    std::size_t a = static_cast<std::size_t>(rng_.below(static_cast<int>(mesh_.size())));
    std::int64_t n = mesh_[a].second;
    bool lead = rng_.chance(0.3);
    std::int64_t T = n * rng_.pick(std::vector<std::int64_t>{1, 2, 3}) + (rng_.chance(0.05) ? 1 : 0), H = rng_.pick(std::vector<std::int64_t>{2, 4});
    std::int64_t E = n * rng_.pick(std::vector<std::int64_t>{1, 2}) + (rng_.chance(0.05) ? 1 : 0);
    std::int64_t K = 1 + rng_.below(static_cast<int>(std::min<std::int64_t>(2, E)));
    int nl = lead ? 1 : 0;
    Dims xs = lead ? Dims{2, T, H} : Dims{T, H};
    Placements px{};
    for (std::size_t b = 0; b < mesh_.size(); ++b) {
      double r = rng_.unit();
      if (b == a) px[b] = r < 0.85 ? Placement::s(nl) : random_placement(nl + 2);
      else px[b] = r < 0.55 ? Placement::r() : r < 0.7 && lead ? Placement::s(0) : r < 0.8 ? Placement::s(nl + 1) : random_placement(nl + 2);
    }
    std::string x = new_input(xs, false, nullptr, px);
    Placements pr{};
    for (std::size_t b = 0; b < mesh_.size(); ++b)
      pr[b] = rng_.chance(0.08) ? random_placement(nl + 2) : px[b].is_s() && px[b].dim <= nl ? px[b] : Placement::r();
    Dims rs = xs;
    rs.back() = K;
    std::string idx, w;
    if (rng_.chance(0.6)) {
      Dims ls = xs;
      ls.back() = E;
      std::string lg = new_input(ls, false, nullptr, pr);
      idx = fresh("gi"), w = fresh("gw");
      emit("TopKGate", {lg}, {GVal{w, rs}, GVal{idx, rs, true}}, fmt::format("k: {}", K));
    } else {
      idx = new_input(rs, true, nullptr, pr);
      w = new_input(rs, false, nullptr, pr);
    }
    std::int64_t C = T;
    std::string attrs = "axis: " + (rng_.chance(0.05) ? axis_attr(a) : mesh_[a].first);
    double r = rng_.unit();
    if (r < 0.4) {
      attrs += ", dropless: true";
      if (rng_.chance(0.1)) C = std::max<std::int64_t>(n, T - n);
    } else if (r < 0.7) {
      std::int64_t per = T / n;
      C = n * ((per * K + E - 1) / E);
      if (rng_.chance(0.1)) C += n;
      attrs += ", capacity_factor: 1.0";
    } else {
      C = n * rng_.pick(std::vector<std::int64_t>{1, 2}) + (rng_.chance(0.05) ? 1 : 0);
    }
    attrs += fmt::format(", buffer: [{}, {}]", E, C);
    bool wd = rng_.chance(0.3);
    std::vector<std::string> din = {x, idx};
    if (wd) din.push_back(w);
    Dims bs = lead ? Dims{2, E, C, H} : Dims{E, C, H};
    std::string buf = fresh("buf");
    emit("MoEDispatch", din, {GVal{buf, bs}}, attrs);
    std::string y = buf;
    std::int64_t F = H;
    if (rng_.chance(0.6)) {
      F = rng_.pick(std::vector<std::int64_t>{2, 4});
      Placements pw{};
      for (std::size_t b = 0; b < mesh_.size(); ++b) {
        double q = rng_.unit();
        if (b == a) pw[b] = q < 0.85 ? Placement::s(0) : Placement::r();
        else pw[b] = q < 0.6 ? Placement::r() : q < 0.75 ? Placement::s(2) : q < 0.9 ? Placement::s(1) : random_placement(3);
      }
      std::string wt = new_input(Dims{E, H, F}, false, nullptr, pw);
      Dims hs = bs;
      hs.back() = F;
      y = fresh("eh");
      emit("ExpertCompute", {buf, wt}, {GVal{y, hs}});
      if (rng_.chance(0.4)) {
        std::string a2 = fresh("ea");
        emit("SiLU", {y}, {GVal{a2, hs}});
        y = a2;
      }
    }
    if (rng_.chance(0.15)) return;
    std::vector<std::string> cin = {y, rng_.chance(0.05) ? new_input(rs, true, nullptr, pr) : idx};
    if (!wd && rng_.chance(0.8)) cin.push_back(w);
    Dims os = lead ? Dims{2, T, F} : Dims{T, F};
    emit("MoECombine", cin, {GVal{fresh("moe"), os}}, "axis: " + (rng_.chance(0.07) ? mesh_[static_cast<std::size_t>(rng_.below(static_cast<int>(mesh_.size())))].first : mesh_[a].first));
  }

  void amax_op() {
    const GVal* x = pick_value([](const GVal&) { return true; });
    if (!x) return;
    GVal xv = *x;
    emit("AmaxUpdate", {xv.name}, {GVal{fresh("amax"), {}}});
  }

  // A scalar placement for a declared FP8 scale or amax history: mostly agreed (R), else per-rank or wrong.
  Placements scale_placements(int rank) {
    Placements p{};
    for (std::size_t a = 0; a < mesh_.size(); ++a) {
      double r = rng_.unit();
      p[a] = r < 0.6 ? Placement::r()
             : r < 0.7 ? Placement::v()
             : r < 0.8 ? Placement::p(ReduceOp::Max)
             : r < 0.87 ? Placement::p(ReduceOp::Min)
             : r < 0.93 ? Placement::p()
             : rank > 0 ? Placement::s(0)
                        : Placement::i();
    }
    return p;
  }

  // FP8: a scale from an amax (reduced over some of the axes its tensor is sharded over, or none), maybe
  // through an amax history, or a declared scale, or none; a quantize, maybe an FP8 collective, a dequantize
  // with the same scale (mostly) or another one.
  void fp8_op() {
    const GVal* x = pick_value([](const GVal&) { return true; });
    if (!x) return;
    GVal xv = *x;
    std::string scale;
    double c = rng_.unit();
    if (c < 0.6) {
      const GVal* src = rng_.chance(0.8) ? x : pick_value([](const GVal&) { return true; });
      GVal sv = src ? *src : xv;
      GVal amax{fresh("amax"), {}};
      emit("AmaxUpdate", {sv.name}, {amax});
      std::string a = amax.name;
      std::vector<std::size_t> sharded;
      for (std::size_t b = 0; b < mesh_.size(); ++b) {
        auto q = pl_of(sv, b);
        if (q && q->is_s() && (rng_.chance(0.7) || sharded.empty())) sharded.push_back(b);
      }
      if (!sharded.empty() && rng_.chance(0.65)) {
        GVal r{fresh("amax"), {}};
        emit("AllReduce", {a}, {r}, "axis: " + axes_text(sharded) + ", reduce: max");
        a = r.name;
      }
      if (rng_.chance(0.4)) {
        std::int64_t len = rng_.pick(std::vector<std::int64_t>{1, 2, 4});
        std::string h = new_input({len}, false, nullptr, rng_.chance(0.7) ? Placements{} : scale_placements(1));
        GVal h2{fresh("hist"), {len}};
        emit("AmaxHistory", {h, a}, {h2});
        a = h2.name;
        if (rng_.chance(0.2)) {
          GVal r{fresh("hist"), {len}};
          emit("AllReduce", {a}, {r}, "axis: " + axis_attr(static_cast<std::size_t>(rng_.below(static_cast<int>(mesh_.size())))) + ", reduce: max");
          a = r.name;
        }
      }
      GVal s{fresh("scale"), {}};
      std::string attrs = rng_.pick(std::vector<std::string>{"", "", "dtype: fp8_e5m2", "margin: 1", "algo: most_recent", "dtype: fp8_e4m3, margin: 2"});
      emit("FP8Scale", {a}, {s}, attrs);
      scale = s.name;
    } else if (c < 0.85) {
      scale = new_input({}, false, nullptr, scale_placements(0));
    }
    GVal q{fresh("q"), xv.shape};
    std::vector<std::string> ins = {xv.name};
    if (!scale.empty()) ins.push_back(scale);
    emit("FP8Quantize", ins, {q}, rng_.chance(0.3) ? "dtype: fp8_e5m2" : "");
    if (!rng_.chance(0.75)) return;
    std::string cur = q.name;
    if (rng_.chance(0.55)) {  // an FP8 collective on the quantized data
      std::size_t a = static_cast<std::size_t>(rng_.below(static_cast<int>(mesh_.size())));
      auto pq = pl_of(xv, a);
      GVal g{fresh("qc"), xv.shape};
      int r = static_cast<int>(xv.shape.size());
      if (pq && pq->is_s() && pq->dim < r) {
        if (r >= 2 && rng_.chance(0.3)) emit("AllToAll", {cur}, {g}, fmt::format("axis: {}, split_dim: {}, concat_dim: {}", mesh_[a].first, (pq->dim + 1) % r, pq->dim));
        else emit("AllGather", {cur}, {g}, fmt::format("axis: {}, dim: {}", mesh_[a].first, pq->dim));
      } else if (pq && pq->is_r() && r >= 1) {
        emit("Broadcast", {cur}, {g}, fmt::format("axis: {}, src: 0", mesh_[a].first));
      } else {
        emit("AllReduce", {cur}, {g}, fmt::format("axis: {}", mesh_[a].first));
      }
      cur = g.name;
    }
    std::vector<std::string> dins = {cur};
    double d = rng_.unit();
    if (d < 0.85) {
      if (!scale.empty()) dins.push_back(scale);
    } else if (d < 0.95) {
      dins.push_back(new_input({}, false, nullptr, scale_placements(0)));
    } else if (scale.empty()) {
      dins.push_back(new_input({}, false, nullptr, Placements{}));
    }
    emit("FP8Dequantize", dins, {GVal{fresh("dq"), xv.shape}});
  }

  Rng rng_;
  std::vector<std::pair<std::string, int>> mesh_;
  std::vector<std::string> decls_, ops_;
  std::vector<GVal> vals_;
  std::map<std::string, Placements> pl_;
  int counter_ = 0;
};

// ---- judging and minimizing ------------------------------------------------------------------------
bool is_bad(OracleVerdict v) { return v == OracleVerdict::Differ || v == OracleVerdict::GlobalError; }

// Removes single lines of the tensors/ops/outputs sections while `keep` holds.
std::string minimize(const std::string& text, const std::function<bool(const std::string&)>& keep) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  auto join = [](const std::vector<std::string>& ls) {
    std::string s;
    for (const auto& l : ls) s += l + "\n";
    return s;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t i = lines.size(); i-- > 0;) {
      if (lines[i].rfind("  ", 0) != 0) continue;  // section headers stay
      auto cand = lines;
      cand.erase(cand.begin() + static_cast<std::ptrdiff_t>(i));
      // drop a section header left empty
      for (std::size_t j = 0; j + 1 <= cand.size(); ++j)
        if (cand[j] == "outputs:" && (j + 1 == cand.size() || cand[j + 1].rfind("  ", 0) != 0)) {
          cand.erase(cand.begin() + static_cast<std::ptrdiff_t>(j));
          break;
        }
      std::string t = join(cand);
      if (keep(t)) {
        lines = std::move(cand);
        changed = true;
      }
    }
  }
  return join(lines);
}

RunReport judge(const std::string& text, std::uint64_t seed) {
  RunOptions o;
  o.seed = seed;
  o.scale = false;
  return run_program_text(text, "gen.yaml", o);
}

}  // namespace

std::string generate_program(std::uint64_t seed) { return Gen(seed).run(); }

DiffStats run_difftest(std::uint64_t seed, int count, int seeds, bool verbose) {
  DiffStats st;
  for (int i = 0; i < count; ++i) {
    std::string text = generate_program(seed + static_cast<std::uint64_t>(i));
    ++st.programs;
    RunReport first = judge(text, 0);
    if (first.load_error) {
      st.soundness.push_back("generator produced an unloadable program (" + std::string(first.load_error->what()) + "):\n" + text);
      continue;
    }
    bool pass = first.checker_ids.empty();
    std::vector<RunReport> reps{first};
    for (int s = 1; s < seeds; ++s) reps.push_back(judge(text, static_cast<std::uint64_t>(s)));
    auto any_bad = std::any_of(reps.begin(), reps.end(), [](const RunReport& r) { return is_bad(r.oracle.verdict); });
    auto all_agree = std::all_of(reps.begin(), reps.end(), [](const RunReport& r) { return r.oracle.verdict == OracleVerdict::Agree; });
    // A false alarm needs evidence: every output compared with its single-device value on every seed.
    auto fully_compared = [](const RunReport& r) { return r.oracle.verdict == OracleVerdict::Agree && r.oracle.notes.empty() && r.oracle.rank_checked == 0; };
    bool all_compared = std::all_of(reps.begin(), reps.end(), fully_compared);
    if (pass) {
      ++st.passed;
      if (any_bad) {
        auto keep = [&](const std::string& t) {
          for (int s = 0; s < seeds; ++s) {
            RunReport r = judge(t, static_cast<std::uint64_t>(s));
            if (!r.load_error && r.checker_ids.empty() && is_bad(r.oracle.verdict)) return true;
          }
          return false;
        };
        std::string small = minimize(text, keep);
        RunReport why = judge(small, 0);
        for (int s = 1; s < seeds && !is_bad(why.oracle.verdict); ++s) why = judge(small, static_cast<std::uint64_t>(s));
        st.soundness.push_back(fmt::format("program {} (seed {}): the checker passes it but {}\n{}", i, seed + static_cast<std::uint64_t>(i), why.oracle.message, small));
      } else if (all_agree) {
        ++st.agree;
      } else {
        ++st.skipped;
        for (const auto& r : reps)
          if (r.oracle.verdict == OracleVerdict::Skipped) {
            std::string reason = r.oracle.message.substr(0, r.oracle.message.find(':'));
            ++st.skip_reasons[reason];
            break;
          }
      }
    } else {
      ++st.rejected;
      if (any_bad) {
        ++st.true_positive;
      } else if (all_compared) {
        ++st.false_alarm_candidates;
        std::string ids;
        for (const auto& id : first.checker_ids) ids += (ids.empty() ? "" : ", ") + id;
        std::string key = ids + (first.first_op.empty() ? "" : " at " + first.first_op);
        auto& slot = st.false_alarms[key];
        ++slot.first;
        if (slot.second.empty()) {
          auto keep = [&](const std::string& t) {
            RunReport r = judge(t, 0);
            if (r.load_error || r.checker_ids != first.checker_ids || r.first_op != first.first_op || !fully_compared(r)) return false;
            for (int s = 1; s < seeds; ++s)
              if (!fully_compared(judge(t, static_cast<std::uint64_t>(s)))) return false;
            return true;
          };
          slot.second = minimize(text, keep);
        }
      } else {
        ++st.skipped;
      }
    }
    if (verbose && (i + 1) % 500 == 0) fmt::print(stderr, "{} programs: {} passed, {} rejected, {} soundness, {} false-alarm candidates\n", i + 1, st.passed, st.rejected, st.soundness.size(), st.false_alarm_candidates);
  }
  return st;
}

std::string render_stats(const DiffStats& s) {
  std::string t = fmt::format(
      "{} programs: {} passed by the checker ({} agree numerically, {} skipped, {} refuted), {} rejected ({} refuted numerically, {} false-alarm "
      "candidates, {} not comparable)\n",
      s.programs, s.passed, s.agree, s.passed - s.agree - static_cast<int>(s.soundness.size()), s.soundness.size(), s.rejected, s.true_positive,
      s.false_alarm_candidates, s.rejected - s.true_positive - s.false_alarm_candidates);
  for (const auto& [k, v] : s.skip_reasons) t += fmt::format("  skipped: {} x {}\n", v, k);
  for (const auto& b : s.soundness) t += "SOUNDNESS: " + b + "\n";
  for (const auto& [k, v] : s.false_alarms) t += fmt::format("false-alarm candidate x{}: {}\n{}", v.first, k, v.second);
  return t;
}

}  // namespace spmd::test
