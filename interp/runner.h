// interp/runner.h - the oracle's Runner: one simulated mesh running a program per rank (private to interp/).
//
// step_local() in runner.cpp is the one dispatch over OpKind for per-rank ops, step_group() in ops_collectives.cpp
// the one for ops that run across a group of ranks; each op's numeric meaning is a member defined in the file
// of its op family (ops_*.cpp).
#pragma once
#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <initializer_list>
#include <map>
#include <numeric>
#include <sstream>

#include "interp/interp.h"
#include "interp/tensor.h"

namespace spmd::interp {

// A taint that starts with this marks a value outside the promise altogether (Reinterpret): not even
// the agreement of ranks on an R output is checked. Other taints (V) still get that check.
constexpr char kExcluded = '!';

// The extent an op's kernel reads its input k against as indices, from the global shapes of its inputs (`ins`): an
// Embedding's or EmbeddingGrad's ids the table's rows, a CrossEntropyLoss's or CrossEntropyGrad's labels the logits'
// last dim. -1 for any other input (one read as no index, or against an extent no shape gives: OneHot's classes, MoE
// routing). The kernels note their ranges by it (Runner::int_range), and the value check learns an integer input's
// range from the types with it instead of a pre-run (equiv/equiv.cpp).
std::int64_t index_extent(OpKind kind, int k, const std::vector<Shape>& ins);
// Narrows the range of name n (`ranges[n]`, -1: none yet) to `limit`: an integer input takes the smallest extent any
// of its readers indexes.
inline void narrow_range(std::vector<std::int64_t>& ranges, NameId n, std::int64_t limit) {
  auto& r = ranges[static_cast<std::size_t>(n)];
  r = r < 0 ? limit : std::min(r, limit);
}

// A value on one rank: its local data and the layout a runtime tracks for it.
struct Val {
  Tensor t;
  Shape gshape;                      // global shape
  std::vector<std::uint32_t> mask;   // per dim: the mesh axes that shard it (mesh order = outer major)
  // Per dim (empty: none): 0 when its axes cut it in mesh order, else its shard order packed (axis + 1 per
  // 4 bits, major first in the low bits): DTensor's _StridedShard, a `order:` placement (ir/placement.h).
  std::vector<std::uint32_t> ord;
  std::string taint;                 // single-device run only: why the global value is undefined
  std::uint32_t vlabel = 0;          // single-device run only: axes the program labels V (a declaration, Convert to V)
  bool defined = false;
};

inline std::uint32_t ord_of(const Val& v, std::size_t d) { return d < v.ord.size() ? v.ord[d] : 0; }
// The packed shard order of dim d of a placement (0: mesh order).
inline std::uint32_t pack_order(const Placements& pl, int n_axes, int d) {
  int axes[kMaxAxes];
  int n = shard_order(pl.data(), n_axes, d, axes);
  if (n < 2 || !pl[static_cast<std::size_t>(axes[0])].ord) return 0;
  std::uint32_t w = 0;
  for (int k = n - 1; k >= 0; --k) w = (w << 4) | static_cast<std::uint32_t>(axes[k] + 1);
  return w;
}
// The packed order without `axes` (0 once what is left is in mesh order).
inline std::uint32_t drop_from_order(std::uint32_t w, std::uint32_t axes) {
  std::uint32_t out = 0, shift = 0;
  int last = -1;
  bool mesh = true;
  for (; w; w >>= 4) {
    int a = static_cast<int>(w & 15u) - 1;
    if (axes & (1u << a)) continue;
    mesh &= a > last;
    last = a;
    out |= static_cast<std::uint32_t>(a + 1) << shift, shift += 4;
  }
  return mesh ? 0 : out;
}

// The packed order of a dim cut by `mask` (order `w`, 0: mesh order) once `added` axes cut its local piece
// (innermost, in mesh order among themselves); 0 when the result is mesh order.
inline std::uint32_t add_to_order(std::uint32_t w, std::uint32_t mask, std::uint32_t added) {
  int list[32], n = 0;
  if (w)
    for (; w; w >>= 4) list[n++] = static_cast<int>(w & 15u) - 1;
  else
    for (int a = 0; a < 32; ++a)
      if (mask & (1u << a)) list[n++] = a;
  for (int a = 0; a < 32; ++a)
    if ((added & (1u << a)) && !(mask & (1u << a))) list[n++] = a;
  bool mesh = true;
  for (int i = 1; i < n; ++i) mesh &= list[i - 1] < list[i];
  if (mesh) return 0;
  std::uint32_t out = 0;
  for (int i = n - 1; i >= 0; --i) out = (out << 4) | static_cast<std::uint32_t>(list[i] + 1);
  return out;
}

inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
inline double unit(std::uint64_t h) { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)

// The forward Dropout whose mask a PointwiseGrad of Dropout (`grad`, one of `ops`) must reproduce: the one Dropout
// of `ops` reading the gradient's x; -1 when there is none or more than one (then it has no value kernel).
int dropout_forward(const Program& p, const std::vector<Op>& ops, const Op& grad);

// Per NameId: the declared inputs drawn non-negative (the exp_avg_sq that AdamWUpdate in `p`'s ops or spec ops read).
std::vector<char> nonnegative_inputs(const Program& p);

// The single-device run's taint of a result that leaves the reals where its inputs did not (ops_elementwise.cpp).
std::string leaves_reals(bool global, const Tensor& out, std::initializer_list<const Tensor*> ins, const std::string& taint);

inline bool is_int(DType d) { return d == DType::I64 || d == DType::I32 || d == DType::I8 || d == DType::Bool; }

inline std::string coord_text(const Program& p, const std::vector<std::int64_t>& c) {
  std::string s = "{";
  for (std::size_t a = 0; a < c.size(); ++a) s += (a ? ", " : "") + p.mesh[a].name + ": " + std::to_string(c[a]);
  return s + "}";
}

// The geometry of an attention call (ops_cp.cpp): q, k, v in `layout`, their sizes and element offsets, and the
// score scale 1/sqrt(D). attn_shape throws (naming the op `nm`) when the local shapes or positions do not fit.
struct AttnShape {
  int b = 0, h = 1, s = 2, dd = 3;
  std::int64_t B = 0, HQ = 0, SQ = 0, D = 0, HK = 0, SK = 0, DV = 0;
  Num scale;
  std::size_t at(const Tensor& t, std::int64_t bi, std::int64_t hi, std::int64_t si, std::int64_t di) const {
    std::int64_t pos[4];
    pos[b] = bi, pos[h] = hi, pos[s] = si, pos[dd] = di;
    std::int64_t off = 0;
    for (int d = 0; d < 4; ++d) off = off * t.shape[static_cast<std::size_t>(d)] + pos[d];
    return static_cast<std::size_t>(off);
  }
};
// `real_d` (> 0): the head dim the default score scale 1/sqrt(D) uses when the run is at reduced sizes
// (Runner::real_shapes); `scale`: the softmax scale of the scores (an op's `scale:`), 0 for the default.
AttnShape attn_shape(AttnLayout layout, const std::string& nm, const Tensor& q, const Tensor& k, const Tensor& v,
                     const std::vector<std::int64_t>& qpos, const std::vector<std::int64_t>& kpos, std::int64_t real_d = 0, double scale = 0);
// Query row i of head hi (batch bi): w[j] = exp(scaled score - m), 0 where the causal mask kpos[j] > qpos[i] hides
// key j, m the stabilizer (interp/num.h); returns z = sum of w. The one definition of attention's probabilities
// (w / z), shared by the forward and its gradient.
Num attn_row(const AttnShape& g, bool causal, const Tensor& q, const Tensor& k, const std::vector<std::int64_t>& qpos,
             const std::vector<std::int64_t>& kpos, std::int64_t bi, std::int64_t hi, std::int64_t i, std::vector<Num>& w, Num& m);

// Attention kernel (ops_cp.cpp): q over k, v in `layout`, causal mask kpos[j] > qpos[i]; the output and, when
// asked, the log-sum-exp per query row. `nm` names the op in errors.
void attend_kernel(AttnLayout layout, bool causal, const std::string& nm, const Tensor& q, const Tensor& k, const Tensor& v,
                   const std::vector<std::int64_t>& qpos, const std::vector<std::int64_t>& kpos, Tensor& out, Tensor* lse, std::int64_t real_d = 0,
                   double scale = 0);
// Ring attention's log-sum-exp merge of a step (o, l) into the accumulator (O, L), in place in (o, l).
void lse_merge(const Tensor& O, const Tensor& L, Tensor& o, Tensor& l);

// ---- the runner: one mesh (the real one, or all ones for the single-device run) ----------------
class Runner {
 public:
  Runner(const Program& p, const std::vector<std::int64_t>& vars, std::vector<std::int64_t> axis_sizes, bool global, const OracleOptions& o,
         std::int64_t& work, std::vector<std::int64_t> real_sizes = {});

  std::int64_t ranks() const { return ranks_; }
  const std::vector<std::int64_t>& sizes() const { return sizes_; }
  // The mesh a group's size is read from where it is a value: a group average's divisor, a sharded dim's real local
  // extent. It is `sizes()` unless the value check runs on a reduced mesh (equiv/reduce.h, "mesh reduction"): then it
  // is the declared mesh, so an average over 2 ranks standing for 512 divides by 512, as every count does under
  // shape reduction.
  const std::vector<std::int64_t>& value_sizes() const { return value_sizes_; }
  void set_value_sizes(std::vector<std::int64_t> v) { value_sizes_ = std::move(v); }
  const std::vector<std::int64_t>& coords(std::int64_t r) const { return coords_[static_cast<std::size_t>(r)]; }
  std::int64_t rank_of(const std::vector<std::int64_t>& c) const;
  // Rank r's value of name n (default-constructed, undefined, on first access). Values live in each rank's own
  // store, made on first use: a rank of a pipeline's per-rank programs touches its stage's names only, so the store
  // is not ranks x names values (64 x 200,000 x 144 bytes for Llama-3-405B's lowered step).
  Val& at(std::int64_t r, NameId n) {
    std::int32_t& s = slot_[static_cast<std::size_t>(r) * names_ + static_cast<std::size_t>(n)];
    auto& vals = env_[static_cast<std::size_t>(r)];
    if (s < 0) s = static_cast<std::int32_t>(vals.size()), vals.emplace_back();
    return vals[static_cast<std::size_t>(s)];
  }

  void part(std::uint32_t axes, const std::vector<std::int64_t>& c, std::int64_t& n, std::int64_t& idx, std::uint32_t ord = 0) const;
  // The ranks of the mesh axes in `axes`, sized by `mesh` (sizes_, value_sizes_ or real_sizes_).
  static std::int64_t ranks_over(std::uint32_t axes, const std::vector<std::int64_t>& mesh);
  void block(std::int64_t gsize, std::uint32_t axes, const std::vector<std::int64_t>& c, std::int64_t& lo, std::int64_t& hi, std::uint32_t ord = 0) const;
  Shape local_shape(const Val& v, const std::vector<std::int64_t>& c) const;

  // ---- inputs ---------------------------------------------------------------------------------
  void declare(const TensorDecl& t, std::int64_t range, std::uint64_t seed);

  // ---- the op loop: a scheduler over per-rank op lists ----------------------------------------------
  // Each rank runs its program (Program::programs: the one whose selector its coordinates match; an `ops:`
  // program is every op on every rank) until it blocks at a collective or at a Recv whose Send has not run.
  // A collective runs once every member of its group is at a collective of that group: they match by group
  // and sequence number, as NCCL and the temporal checks do, so members may run different programs and name
  // the tensor differently. Sends queue per (src, dst), FIFO. Every op (async or not) takes effect at its
  // position in its program: handles and Waits order nothing for values.
  void run(std::uint64_t seed);
  // The ops rank `r` runs: [first, end) of the program's ops.
  std::pair<std::uint32_t, std::uint32_t> op_range(std::int64_t r) const { return range_[static_cast<std::size_t>(r)]; }

  // Frees each value once no later op reads it (per rank, after the op that reads it last and after `after_op`),
  // except the names marked in `keep` (NameId -> 1: the outputs and inputs a caller reads after the run): a run
  // then holds its live values, not every value it computed. Off unless called before run().
  void free_dead(std::vector<char> keep);

  int failed_op = -1;  // the op a thrown InterpError came from
  // Called after op `op` ran on rank `rank` (for a collective: once per member), when set (equiv/ records values).
  std::function<void(int op, std::int64_t rank)> after_op;
  std::int64_t failed_rank = 0;  // and the rank (the first member for a collective)
  // Shape reduction (equiv/reduce.h, docs/equivalence.md "Shape reduction"): when the run is at reduced sizes, the
  // real (declared) global shape of every input of every op (per op, per input; an empty shape: unknown). A kernel
  // that uses an extent as a value (a Mean's count, a norm's 1/N, cross-entropy's token count, attention's
  // 1/sqrt(D), RoPE's D) reads it through real_count, so the reduced run computes each element by the formula the
  // real program uses, over fewer elements. Null: no reduction (the extents are the real ones).
  const std::vector<std::vector<Shape>>* real_shapes = nullptr;
  // The first op that chose by comparing values that are not exact constants (a mask of float data, with the lanes
  // on): the exact lanes only follow such a choice (equiv/ never proves a program that makes one). -1: none.
  int inexact_choice = -1;
  // When set (a shape-only pre-run with all integer inputs 0), records the range integer inputs must take:
  // Embedding ids index the table's rows, labels the logits' vocab (index_extent), OneHot's ids its classes.
  std::vector<std::int64_t>* int_range = nullptr;

 private:
  std::int64_t eval(ExprId e, const std::string& what) const;
  // The real extent of dim d of input k of op oi (value v) on the rank at c: the real global extent (real_shapes,
  // else v's) cut as v's dim is cut there. Without a reduction it is v's local extent.
  std::int64_t real_count(int oi, int k, const Val& v, std::size_t d, const std::vector<std::int64_t>& c) const;
  // The same for a dim of global extent `reduced` cut by `mask`, given its real global extent (or -1: unknown).
  std::int64_t real_local(std::int64_t real, std::int64_t reduced, std::uint32_t mask, std::uint32_t ord, const std::vector<std::int64_t>& c) const;
  std::int64_t real_global(int oi, int k, std::size_t d) const;
  // Local view (Program::local_view, docs/format.md "Local view"): a value is just the rank's array, so its
  // layout is reset to "whole, unsharded" (global shape = local shape) whenever it is stored.
  static void make_local(Val& v);
  void check_size(const Shape& s) const;
  void charge(std::int64_t n);
  const Val& in(int op, std::int64_t r, int i);
  int n_in(int op) const { return p_.ops[static_cast<std::size_t>(op)].n_in; }
  std::string taint_of(int op, std::int64_t r);
  void set_out(int op, std::int64_t r, int k, Val v, const std::string& taint);
  // `ones`: a dim of size 1 is a broadcast dim and is never cut (elementwise ops); false where no dim broadcasts
  // (Concat, Stack), so a size-1 dim is cut like any other (torch.chunk gives one rank the element).
  Tensor align(const Val& v, const std::vector<std::uint32_t>& target, const std::vector<std::int64_t>& c, const std::string& what,
               bool ones = true) const;
  static std::vector<std::uint32_t> union_masks(const Val& x, const Val& y, std::size_t r, std::size_t skip_tail = 0);
  static std::vector<std::uint32_t> slice_target(const Val& v, const std::vector<std::uint32_t>& out, std::size_t skip_tail = 0);
  std::vector<int> norm_dims(std::uint32_t list, int rank, bool default_last) const;
  static int norm_dim(int d, int rank);

  // ---- compute ops ----------------------------------------------------------------------------
  void step_local(int oi, std::int64_t r);
  void pointwise(int oi, std::int64_t r, const std::string& taint);
  void softmax(int oi, std::int64_t r, const std::string& taint);
  void transpose_dims(int oi, std::int64_t r, const std::string& taint);
  void send(int oi, std::int64_t r);
  void recv(int oi, std::int64_t r, const std::vector<std::int64_t>& c);
  std::int64_t peer(const Op& op, std::int64_t r) const;
  std::deque<Val>& queue(const Op& op, std::int64_t r, bool incoming);
  static void softmax_line(std::vector<Num>& x);
  void where(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void elementwise(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void matmul(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void dropout(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void norm(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void reduce_dims(int oi, std::int64_t r, const std::string& taint);
  void attention(int oi, std::int64_t r, const std::string& taint);
  // The query and key positions of FlashAttention or AttentionGrad on the rank at `c`: 0.. locally, or with `cp`
  // and causal the global positions of this rank's q block (k and v whole; zigzag with order 1).
  void attn_positions(const Op& op, const std::vector<std::int64_t>& c, std::int64_t SQ, std::int64_t SK, std::vector<std::int64_t>& qpos,
                      std::vector<std::int64_t>& kpos);

  // ---- gradient ops of derived backwards (ops_grad.cpp) ------------------------------------------
  void pointwise_grad(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void norm_grad(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void attention_grad(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void embedding_grad(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void topk_grad(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void cross_entropy_grad(int oi, const std::vector<std::int64_t>& members);
  void moe_gate_grad(int oi, const std::vector<std::int64_t>& members);

  // ---- context parallelism (ops_cp.cpp) -------------------------------------------------------
  static std::int64_t cp_position(std::int64_t g, std::int64_t len, std::int64_t n, bool zigzag);
  std::int64_t cp_ring(const Op& op, int& axis) const;
  void attend(const Op& op, const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<std::int64_t>& qpos,
              const std::vector<std::int64_t>& kpos, Tensor& out, Tensor* lse);
  void ring_group(int oi, const std::vector<std::int64_t>& members);
  void ring_step(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void load_balance(int oi, std::int64_t r, const std::string& taint);
  void note_range(NameId n, std::int64_t limit);
  // note_range for every input of op oi that index_extent gives an extent for, from the inputs' global shapes on rank r.
  void note_index_ranges(int oi, std::int64_t r);
  static std::int64_t as_index(const Num& x, std::int64_t limit, const char* what);
  void embedding(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void topk(int oi, std::int64_t r, const std::string& taint);
  void reshape(int oi, std::int64_t r, const std::string& taint);
  void expand(int oi, std::int64_t r, const std::string& taint);
  void convert(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  // ZeRO (ops_zero.cpp); ZeROGatherParam and ZeROScatterGrad run in step_group as AllGather and ReduceScatter
  void zero_partition(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  // ---- optimizer (ops_optim.cpp); GradNormSq runs in step_group ------------------------------------
  void optimizer_update(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void clip_coef(int oi, std::int64_t r, const std::string& taint);
  void grad_norm_sq(int oi, const std::vector<std::int64_t>& members);

  // ---- FP8 (ops_fp8.cpp) ------------------------------------------------------------------------
  void amax(int oi, std::int64_t r, const std::string& taint);
  void amax_history(int oi, std::int64_t r, const std::string& taint);
  void fp8_scale(int oi, std::int64_t r, const std::string& taint);
  void fp8_quantize(int oi, std::int64_t r, const std::string& taint);
  void fp8_dequantize(int oi, std::int64_t r, const std::string& taint);
  // ---- tensor ops (ops_tensor.cpp) ----------------------------------------------------------------
  std::int64_t size_of(const Op& op, const char* attr, std::int64_t dflt) const;
  std::uint32_t live(std::uint32_t m) const;
  static void local_cut(std::int64_t n, std::int64_t parts, std::int64_t& lo, std::int64_t& hi, const char* what);
  void slice_op(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void split_op(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void concat_op(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint, bool stack);
  void pad_op(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void arange(int oi, std::int64_t r, const std::string& taint);
  void full(int oi, std::int64_t r, const std::string& taint);
  void rope(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  void index_select(int oi, std::int64_t r, const std::string& taint);
  void index_add(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint);
  // ---- masks, counts, running sums (ops_mask.cpp; the comparisons are elementwise, ops_elementwise.cpp) ----
  void chose(int oi, const Num& a, const Num* b);  // op oi chose by the values a (and b): records an inexact choice
  Num decide(int oi, bool v, const Num& a, const Num* b);
  Num scalar_of(const Op& op) const;
  void one_hot(int oi, std::int64_t r, const std::string& taint);
  void bincount(int oi, std::int64_t r, const std::string& taint);
  void cumsum(int oi, std::int64_t r, const std::string& taint);

  // ---- collectives (and the vocab-parallel loss, whose max and sum all-reduce inside) ----------------
  std::vector<std::int64_t> group(const Op& op, std::int64_t r);
  static Num combine(ReduceOp op, const Num& a, const Num& b);
  Tensor reduce_all(const std::vector<const Val*>& xs, ReduceOp op, std::uint32_t axes);
  static Tensor nan_like(const Tensor& t) { return Tensor(t.shape, NAN); }

  void step_group(int oi, const std::vector<std::int64_t>& members);
  // The op member k of a collective runs (its own op when the members run different programs).
  int member_op(int oi, std::size_t k) const { return member_ops_ ? (*member_ops_)[k] : oi; }
  void cross_entropy(int oi, const std::vector<std::int64_t>& members);
  // ---- mixture of experts (ops_moe.cpp) -------------------------------------------------------
  std::vector<std::int64_t> moe_slots(const Val& idx, std::int64_t E, std::int64_t G, std::int64_t c, NameId idx_name);
  void moe(int oi, const std::vector<std::int64_t>& members);

  const Program& p_;
  const std::vector<std::int64_t>& vars_;
  std::vector<std::int64_t> sizes_;
  std::vector<std::int64_t> value_sizes_;  // value_sizes()
  std::vector<std::int64_t> real_sizes_;  // the real mesh (the single-device run needs it for the per-rank shapes of V values)
  bool global_;
  const OracleOptions& opt_;
  std::int64_t& work_;
  std::uint32_t vlabel_in_ = 0;  // the union of the current op's inputs' V labels (single-device run)
  std::int64_t ranks_ = 1;
  std::uint64_t seed_ = 0;
  std::size_t names_ = 0;
  std::vector<std::int32_t> slot_;       // rank * names_ + NameId -> its index in env_[rank] (-1: not made yet)
  std::vector<std::deque<Val>> env_;     // per rank (a deque: a Val& stays valid while others are made)
  std::vector<std::vector<std::int64_t>> coords_;  // rank -> its mesh coordinates
  std::vector<char> nonneg_;  // per NameId: an input drawn non-negative (an AdamW exp_avg_sq; ops_optim.cpp)
  std::map<std::pair<std::int64_t, std::int64_t>, std::deque<Val>> queues_;
  // free_dead: NameId -> the last op reading it (-1: none), and the names kept whatever their last reader
  void declare_values(const TensorDecl& t, std::int64_t range, std::uint64_t seed);
  void run_ops(std::uint64_t seed);
  std::vector<int> last_read_;
  std::vector<char> keep_;
  void release_dead(int oi, std::int64_t r);
  std::vector<std::pair<std::uint32_t, std::uint32_t>> range_;  // per rank: the ops of its program
  const std::vector<int>* member_ops_ = nullptr;                  // step_group across per-rank programs: each member's op
  // AttentionGrad's q, k and v gradients of one attention (the same dy, q, k, v and attributes: a derived backward's
  // three ops) come from one pass of the kernel, which recomputes P and dP once instead of three times: the first of
  // them computes every gradient its group asks for and leaves the others here, per rank, with its inputs' tensors
  // (held, so a buffer's address names its value) until its siblings take them.
  struct AttnGradShare {
    int group = -1;
    Tensor dy, q, k, v;
    std::vector<std::int64_t> qpos, kpos;
    std::vector<std::uint32_t> ym;  // the layout dy is aligned to (q's shards, v's head dim)
    std::int64_t real_d = 0;        // the head dim the softmax scale reads
    Tensor out[3];
    std::uint8_t left = 0;  // the gradients (bit wrt) computed and not yet taken
  };
  std::vector<int> attn_group_;            // per op: its AttentionGrad group (-1: none); empty without AttentionGrad
  std::vector<std::uint8_t> attn_wrts_;    // per group: the gradients its ops ask for (bit wrt)
  std::map<std::int64_t, AttnGradShare> attn_share_;  // per rank
};

}  // namespace spmd::interp
