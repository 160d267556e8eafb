// spatial/checker.h - the spatial checker's state and rules (private to spatial/; the entry point is spatial.h).
//
// One Checker walks the ops in order; apply() in rules.cpp is the one exhaustive switch over OpKind, and
// each rule is a member defined in the file of its op family (rules_*.cpp).
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <functional>
#include <iterator>
#include <numeric>
#include <set>
#include <unordered_map>
#include <stdexcept>
#include <type_traits>

#include "ir/ranks.h"
#include "spatial/obligations.h"
#include "spatial/spatial.h"

namespace spmd::detail {

struct Value {
  std::array<ExprId, kMaxRank> shape{};
  std::uint8_t rank = 0;
  Placements pl{};
  std::array<std::int32_t, kMaxAxes> origin;  // where this axis's placement arose (Checker::origins_), -1 = nowhere
  DType dtype = DType::F32;
  bool defined = false;
  bool poisoned = false;
  bool uneven = false;
  std::uint8_t strict = 0;  // dims whose shard this op created: they must divide evenly even if the input is uneven
  // Axes (bitmask) on which a V value holds per-rank values with no single-device counterpart (a declared V,
  // per-rank Dropout, Reduce, Gather, AllToAll of V, a Recv). A V axis without the bit holds, on every rank,
  // the whole value computed from replicated ones (Convert R -> V): reading those copies as summands
  // counts it once per rank.
  std::uint32_t fresh = 0;
  // FP8 (spatial/rules_fp8.cpp). `def` names this value (each declaration and op output gets its own). FP8
  // data remembers the scale it was quantized with (fp8_scale: that value's def; -1 unknown, -2 none, a plain
  // cast, -3 data of several scales mixed), the axes over which the value is in per-rank units (fp8_local: a
  // per-rank scale), those its input already was in (fp8_under, what FP8Dequantize gives back), the
  // FP8Quantize op, and the amax tensor the scale came from (fp8_amax, a NameId; scales carry it, for the fix).
  // fp8_amax_op is the AmaxUpdate that made that amax and fp8_amax_pmax the axes its result was P(max) over
  // (the machine fix reduces it right after that op).
  std::int32_t def = -1, fp8_scale = -1, fp8_qop = -1, fp8_amax = -1, fp8_amax_op = -1;
  std::uint32_t fp8_local = 0, fp8_under = 0, fp8_amax_pmax = 0;
  // Context parallelism (rules_cp.cpp): the dims in zigzag order over zz_axis (LoadBalance); a block RingRotate
  // moved (rank r holds the block of rank r - ring_shift along ring_axis, its dim ring_dim sharded there before);
  // a partial attention output of RingAttentionStep (ring_seen: the rotations of the key blocks merged in).
  std::int8_t zz_axis = -1;
  std::uint8_t zz_dims = 0;
  std::int8_t ring_axis = -1;
  std::int8_t ring_dim = -1;
  std::int32_t ring_shift = 0;
  std::uint64_t ring_seen = 0;
  Value() { origin.fill(-1); }
  std::span<const ExprId> dims() const { return {shape.data(), rank}; }
};

struct Origin {
  Loc loc;
  NameId tensor;       // the value the placement arose on (its text only when a note or the types need it)
  Placement pl;
  int axis;
  std::uint32_t why;   // how it arose: an index into Checker::whys_, kNoIndex for a declaration (or a moved shard)
  int op = -1;         // the op that created it, -1 for a declaration
  // An op that moved a shard of its input `from` (placement `before`) to another dim: "Reshape maps S(1) of x to
  // S(2)", written only when a note or the types need it.
  Placement before{};
  int from = -1;
  const Op* moved_by = nullptr;
};

// A message built only when a rule needs it (a report or a deferred obligation): a string, or a function that
// makes one. Rules on the hot path pass a lambda, so a million ops that pass format nothing.
class Lazy {
 public:
  Lazy(const std::string& s) : s_(&s) {}  // NOLINT(google-explicit-constructor)
  Lazy(const char* s) : c_(s) {}          // NOLINT(google-explicit-constructor)
  template <class F, std::enable_if_t<std::is_invocable_r_v<std::string, const F&> && !std::is_convertible_v<const F&, std::string>, int> = 0>
  Lazy(const F& f) : ctx_(&f), fn_([](const void* c) { return (*static_cast<const F*>(c))(); }) {}  // NOLINT(google-explicit-constructor)
  std::string str() const { return s_ ? *s_ : c_ ? std::string(c_) : fn_(ctx_); }

 private:
  const std::string* s_ = nullptr;
  const char* c_ = nullptr;
  const void* ctx_ = nullptr;
  std::string (*fn_)(const void*) = nullptr;
};

class Checker {
 public:
  Checker(const Program& p, const SpatialOptions& o);
  std::vector<Diagnostic> run();

 private:
  // ---- context helpers ----------------------------------------------------------------------
  int axes() const { return p_.axis_count(); }
  const std::string& axn(int a) const { return p_.mesh[static_cast<std::size_t>(a)].name; }
  ExprId axis_size(int a) const { return p_.mesh[static_cast<std::size_t>(a)].size; }
  std::string axsize(int a) const { return dstr(axis_size(a)); }
  std::string opname() const { return std::string(op_name(op_->kind)); }
  const Value& in(int i) const { return *in_[static_cast<std::size_t>(i)]; }
  int n_in() const { return static_cast<int>(in_.size()); }
  const std::string& iname(int i) const { return p_.name(p_.ins(*op_)[static_cast<std::size_t>(i)]); }
  std::string oname(int i) const;
  NameId oid(int i) const;  // the NameId oname(i) names
  Loc here() const { return op_->loc; }
  const OpAttrs& at() const { return op_->attrs; }
  std::string ps(Placement pl) const { return to_string(pl); }
  std::string dstr(ExprId e) const { return pool_.str(e, p_.vars); }
  std::string sstr(std::span<const ExprId> shape) const;
  void report(CheckId id, std::string msg, const std::string& tensor, std::vector<Note> notes = {});

  Note fix(const std::string& text) const { return {here(), "fix: " + text}; }

  void origin_note(std::vector<Note>& notes, const Value& v, int a) const;
  std::string why_of(const Origin& org) const;  // how the placement arose (empty: declared)
  int new_origin(Loc l, NameId tensor, Placement pl, int a, std::string why);
  void set_new(Value& v, int a, Placement pl, std::string why);
  void set_from(Value& v, int a, Placement pl, int i);

  static Placement pl_of(const Value& v, int a) { return v.pl[static_cast<std::size_t>(a)]; }
  static std::uint32_t v_axes(const Value& v) {
    std::uint32_t m = 0;
    for (int a = 0; a < kMaxAxes; ++a)
      if (v.pl[static_cast<std::size_t>(a)].is_v()) m |= 1u << a;
    return m;
  }
  // V over a, holding on every rank the whole value computed from replicated ones (not per-rank values).
  static bool whole_v(const Value& v, int a) { return pl_of(v, a).is_v() && !((v.fresh >> a) & 1u); }
  // A value of placement `got` is also a valid `want` with no data moved: R is P(avg), P(max) and P(min)
  // (reducing equal copies with those gives the value back), but not P(sum) (N copies add up to N times it).
  static bool satisfies(Placement got, Placement want) { return got == want || (got.is_r() && want.is_p() && want.op != ReduceOp::Sum); }
  Placement pin(int i, int a) const { return pl_of(in(i), a); }

  Value& out(int i = 0) { return out_[static_cast<std::size_t>(i)]; }
  void set_shape(Value& v, std::span<const ExprId> s);
  int norm_dim(int d, int rank, const std::string& what, const std::string& tensor);
  std::string fix_allreduce(const std::string& t, int a, Placement p = Placement::p()) const;
  std::string fix_allgather(const std::string& t, int a, int d) const;

  // ---- obligations --------------------------------------------------------------------------
  bool same_dim(ExprId a, ExprId b, const Lazy& what, const std::string& tensor);
  std::uint32_t shard_mask(const Value& v, int d) const;
  ExprId mask_size(std::uint32_t m);
  std::string mask_names(std::uint32_t m) const;
  bool check_local(Value& v, const std::string& name, Loc loc, std::vector<Note> notes = {});
  void check_expr(ExprId e, Loc loc, const std::string& what);
  void declare_sizes();

  // ---- declarations -------------------------------------------------------------------------
  void declare(const TensorDecl& t, std::size_t slot);
  static ValueType type_of(const Value& v);
  // Appends v's type (and, when SpatialTypes::want_origins, its origin per axis) to the types' lists.
  void record(bool decl, const Value& v);

  // ---- the op loop --------------------------------------------------------------------------
  void step(int i);
  void undefined(NameId n);
  void apply();

  // ---- shared rule pieces -------------------------------------------------------------------
  bool invariant_ok(std::initializer_list<int> which);
  Note invariant_fix(int inv, int other, int a, Fix& f) const;
  void partial_misuse(int i, int a, const std::string& why, const std::string& fix_text = "");
  void sharded_dim(int i, int a, int d, const std::string& why);
  // A shard of input `i` over axis `a` created on the wrong dim by a ReduceScatter, Scatter or AllToAll of
  // this program, where dim `want` was needed: the fix is that op's `dim:` (a note and a machine fix).
  bool scatter_dim_fix(const Value& v, int a, int want, std::vector<Note>& notes, Fix& fix) const;
  void layout_conflict(const std::string& msg, const std::string& tensor, int i, int a, const std::string& fix_text);
  void illegal(const std::string& msg, int a, const std::string& fix_text);
  bool broadcast_shape(const Value& x, const Value& y, Value& o);
  bool broadcast_shards_ok(const Value& o);
  static Placement shift(Placement pl, int ri, int ro);
  bool slice_ok(int i, int a, int d, int other);

  // ---- compute rules ------------------------------------------------------------------------
  bool map_partials(Value& o, int i, PointwiseMap f, const std::string& what, const std::string& fix_text = "");
  void nonlinear();
  void step_rule();
  void linear();
  void loss_scale();
  void dropout();
  Value* broadcast_pair(bool number_ok);
  void add_like(bool multiply);
  bool combine_layout(Value& o, int a, int i, Placement x, int j, Placement y, int ro);
  void math_unary();
  void div_minmax();
  void where();
  void matmul();
  bool attr_dims(int rank, std::vector<int>& dims, const std::string& tensor);
  void norm();
  void softmax();
  void reduce_dims();
  void attention();
  bool attention_shapes(int& b, int& h, int& s, int& dd, int q0 = 0);
  bool cp_sequence_even(int qi, int s, int a);
  // The fix of a sequence a ring or context parallelism cuts unevenly (cp_sequence_even, RingRotate).
  static constexpr const char* kPadSequenceFix = "make the sequence divisible by the ranks that cut it (pad it), as context parallelism requires";
  bool cp_ok(int qi, int s);
  bool vocab_cut_evenly(int li, int vd, int a);
  bool kv_heads_held_whole(int a, int h, int ki = 1);  // ki: the input index of k (v follows)
  bool heads_cut_evenly(int h, int qi, int ki);
  void embedding();
  void cross_entropy();
  void topk();
  // ---- masks, counts, running sums (rules_mask.cpp) --------------------------------------------
  PointwiseMap mask_map(int i) const;
  void mask_op();
  void one_hot();
  void bincount();
  void cumsum();
  void detach();
  bool split_sizes_ok(int s);

  // ---- collectives --------------------------------------------------------------------------
  std::vector<int> coll_axes(bool innermost_first) const;
  bool can_add_shard(const Value& v, int d, int a);
  bool can_remove_shard(const Value& v, int d, int a);
  bool rank_in_group();
  bool reduction_ok(int a, ReduceOp rop);
  void all_reduce();
  void all_gather();
  void reduce_scatter();
  void broadcast();
  void reduce();
  void all_to_all();
  void scatter();
  void gather();
  // ZeRO / FSDP (rules_zero.cpp)
  void zero_gather();
  void zero_scatter();
  void zero_partition();
  // optimizer (rules_optim.cpp)
  void optimizer_update();
  void grad_norm_sq();
  void clip_coef();
  bool recv_waits(int i) const;
  void recv();

  std::uint32_t line_of(int op) const { return p_.ops[static_cast<std::size_t>(op)].loc.line; }

  std::string type_str(const Value& v) const;
  std::string type_difference(const Value& a, const Value& b, bool placements = true);
  void defer_equal(const Value& a, const Value& b, CheckId id, const std::string& what_a, const std::string& what_b);
  void check_declared(const Value& sent, int send_op);
  void compare_collectives(const std::vector<CollectivePair>& pairs, const RankSpace& space);

  // ---- shape ops ----------------------------------------------------------------------------
  void transpose();

  // Rational monomials (num/den * f1*f2... / g1*g2...) for grouping reshape dims: B/4 * 4 == B.
  struct Mono {
    std::int64_t num = 1, den = 1;
    std::vector<ExprId> f, g;  // sorted factors above and below the line
    bool ok = true;            // false after an overflow: compares unequal to everything
    bool operator==(const Mono& o) const { return ok && o.ok && num == o.num && den == o.den && f == o.f && g == o.g; }
  };
  static void normalize(Mono& m);
  static Mono times(const Mono& x, const Mono& y);
  static Mono inverse(Mono m);
  Mono mono(ExprId e) const;
  static bool divides(const Mono& x, const Mono& y);
  bool is_one(ExprId e) const { return pool_.is_const(e) && pool_.value(e) == 1; }
  // Some rank holds no element of dim d of v (a torch.chunk shard of a short dim: 3 over 4 ranks gives 1, 1, 1, 0;
  // several axes cut it one after another, each the pieces the previous left: 5 over 2 x 2 gives 2, 1, 1, 1); true
  // also when the sizes are symbolic and the dim is uneven, as that cannot be ruled out.
  bool empty_shard(const Value& v, int d) {
    std::uint32_t m = shard_mask(v, d);
    if (!v.uneven || !m) return false;
    ExprId n = v.shape[static_cast<std::size_t>(d)];
    if (!pool_.is_const(n) || !pool_.is_const(mask_size(m))) return true;
    int order[kMaxAxes];
    int cut = shard_order(v.pl.data(), axes(), d, order);
    std::vector<std::int64_t> pieces{pool_.value(n)};  // the distinct piece sizes so far (torch.chunk makes at most 3)
    for (int i = 0; i < cut; ++i) {
      if (!pool_.is_const(axis_size(order[i]))) return true;
      std::int64_t k = std::max<std::int64_t>(pool_.value(axis_size(order[i])), 1);
      std::vector<std::int64_t> next;
      for (std::int64_t p : pieces) {
        std::int64_t c = (p + k - 1) / k;  // the first chunks' size; then the partial one, then empty ones
        for (std::int64_t j : {std::int64_t{0}, std::min(c ? p / c : 0, k - 1), k - 1}) {
          std::int64_t size = std::clamp<std::int64_t>(p - j * c, 0, c);
          if (std::find(next.begin(), next.end(), size) == next.end()) next.push_back(size);
        }
      }
      pieces = std::move(next);
    }
    return std::find(pieces.begin(), pieces.end(), 0) != pieces.end();
  }

  // Dim d of v is cut unevenly (torch.chunk): v carries `uneven` and d's size is not provably divisible by the
  // ranks of the axes that shard it. `uneven: true` permits uneven shards; it does not make an even dim uneven.
  bool uneven_dim(const Value& v, int d) {
    std::uint32_t m = shard_mask(v, d);
    return v.uneven && m && obl_.decide(OblKind::Divisible, v.shape[static_cast<std::size_t>(d)], mask_size(m)) != Decision::Holds;
  }

  void reshape();
  bool prefix_whole_per_rank(const Value& x, int from, int to);

  // ---- tensor ops (rules_tensor.cpp) ---------------------------------------------------------
  ExprId size_arg(const char* attr, ExprId dflt);
  bool at_most(ExprId lo, ExprId hi, const std::string& what, const std::string& tensor);
  bool dim_whole(int i, int d, const std::string& why, const std::string& extra = "");
  bool join_layout(Value& o, const std::vector<int>& which, int ro, const std::function<Placement(int, int)>& pl);
  void slice_op();
  void split_op();
  void concat_op(bool stack);
  void pad_op();
  void arange();
  void full();
  void rope();
  void index_select();
  void index_add();

  // ---- SPMD conversions ---------------------------------------------------------------------
  Placement norm_target(Placement t, int rank, bool& ok);
  bool from_ok(int a);
  void convert();
  void reinterpret();
  void guard();

  // ---- FP8 (rules_fp8.cpp) -------------------------------------------------------------------
  void amax();
  void amax_history();
  void fp8_scale();
  void fp8_quantize();
  void fp8_dequantize();
  bool fp8_scale_ok(int i, std::uint32_t& per_rank);
  bool fp8_exchange_ok();                      // a collective may not exchange per-rank-scaled FP8 data
  void fp8_carry(Value& v) const;              // FP8 tags flow from the inputs into other ops' outputs
  bool fp8_output_ok(const OutputDecl& od, const Value& v);
  std::string fp8_amax_fix(const Value& v, std::uint32_t mask) const;
  Fix fp8_machine_fix(const Value& v, std::uint32_t mask) const;

  // ---- gradient ops (the VJPs derived backward programs are made of) --------------------------
  void expand();
  bool same_shape(int i, int j);
  void pointwise_grad();
  void norm_grad();
  void attention_grad();
  void embedding_grad();
  void cross_entropy_grad();
  void topk_grad();

  // ---- mixture of experts (rules_moe.cpp) ---------------------------------------------------
  struct MoEDispatchRecord {
    int op;              // the MoEDispatch
    std::uint32_t axes;  // its axis
    ExprId E, C;         // its buffer
    bool weighted;       // it applied the routing weights
  };
  int moe_axis();
  bool moe_leading(int i, int j, int nl);
  bool moe_routing_ok(int a, int first, int data, int nl);
  void moe_dispatch();
  void moe_combine();
  void expert_compute();
  void moe_gate_grad();
  // ---- context parallelism (rules_cp.cpp) ----------------------------------------------------
  bool is_cp_op() const;
  void carry_cp_tags(Value& v) const;
  bool cp_inputs_ok();
  int cp_axis();
  std::optional<std::int64_t> ring_size(int a);
  bool cp_order_ok(int i, int a, int s);
  int zz_of(int i, int d) const;
  bool same_order(int i, int di, int j, int dj);
  bool orders_ok(const Value& o);
  bool cp_other_axis(int a, int ring, int b, int h, int dd, Value& o);
  void ring_rotate();
  void ring_attention_step();
  void ring_attention();
  void load_balance();

  // ---- postconditions -----------------------------------------------------------------------
  // `outs`: (index into Program::outputs, slot) of the outputs the program holds, by index.
  void check_outputs(const std::vector<std::pair<std::uint32_t, std::uint32_t>>& outs);

  // ---- value tables -------------------------------------------------------------------------
  // One program is indexed by NameId. Per-rank programs (disjoint op ranges) each keep a table of the
  // names they use only, so the tables add up to the program's size, not programs x names.
  std::size_t slot(std::uint32_t operand) const { return local_ ? oslot_[operand] : static_cast<std::size_t>(p_.operands[operand]); }
  NameId slot_name(std::size_t k) const { return local_ ? (*slot_names_)[k] : static_cast<NameId>(k); }

  const Program& p_;
  ExprPool pool_;
  Obligations obl_;
  std::vector<Diagnostic> diags_;
  std::vector<Value> env_;
  std::vector<Origin> origins_;
  std::vector<std::string> whys_;  // Origin::why texts (append only: origins of several programs' states point here)
  std::array<ExprId, 1u << kMaxAxes> mask_sizes_;  // mask_size by mask, -1 until asked
  bool local_ = false;
  std::vector<std::uint32_t> oslot_;                 // per operand: its slot in its program's table (local_)
  const std::vector<NameId>* slot_names_ = nullptr;  // the running program's slot -> name (local_)
  int op_idx_ = -1;
  const Op* op_ = nullptr;
  std::vector<const Value*> in_;
  std::array<Value, 8> out_{};  // Split has up to 8 outputs
  bool failed_ = false;
  std::int32_t next_def_ = 0;  // Value::def of the next declaration or op output
  std::unordered_map<int, std::vector<int>> recv_sends_;  // Recv op -> the Send ops it pairs with (on some rank)
  std::unordered_map<int, Value> sent_;                   // Send op -> the value it sends, once reached
  std::unordered_map<int, Value> watched_;                // collective op -> its input (ops matched across programs)
  SpatialTypes* types_ = nullptr;
  bool recording_decls_ = true;
  std::vector<std::optional<Placements>>* inferred_ = nullptr;
  std::vector<ShapeClaim>* claims_ = nullptr;
  const SpatialTypes* prefix_ = nullptr;  // types of ops [0, prefix_ops_), checked before
  std::size_t prefix_ops_ = 0;
  std::size_t no_grad_from_ = static_cast<std::size_t>(-1);
  std::vector<Value> no_grad_in_;  // the inputs of an op past no_grad_from_, I read as R
  std::unordered_map<NameId, MoEDispatchRecord> moe_dispatches_;
  std::unordered_map<NameId, ExprId> topk_experts_;  // TopKGate indices -> the experts they pick among  // routing indices -> the latest MoEDispatch by them
};

}  // namespace spmd::detail
