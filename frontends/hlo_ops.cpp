// frontends/hlo_ops.cpp - the op table of HLO instructions: one row per opcode, its operands and attributes (as
// the text prints them: `dimensions={0,2}`, `slice={[0:256], [1024:1280]}`), and the spmdcheck ops it becomes.
// Shapes are explicit in HLO (no implicit broadcast), so rows mostly check the result type against the
// operation. Custom calls are `custom-call.<target>` in the mapping files (frontends/custom_ops.yaml).
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "frontends/decompose.h"
#include "frontends/lower.h"

namespace spmd::frontends {

namespace {

using Attrs = std::vector<std::pair<std::string, std::string>>;

// {1,2} / {} -> [1, 2]
// The integers of attribute `attr` ({0,1}); with `rank` >= 0 they are dims of a rank-`rank` array: each in
// [0, rank), none twice.
std::vector<std::int64_t> int_list(Ctx& c, const char* attr, bool required = true, std::int64_t rank = -1) {
  const PyVal* v = c.node().kwarg(attr);
  if (!v) {
    if (required) c.fail(c.node().target + " needs attribute " + attr);
    return {};
  }
  std::vector<std::int64_t> out;
  std::string num;
  for (char ch : v->s + ",") {
    if (std::isdigit(static_cast<unsigned char>(ch)) || ch == '-') num += ch;
    else if (!num.empty()) out.push_back(std::stoll(num)), num.clear();
  }
  if (rank >= 0)
    for (std::size_t i = 0; i < out.size(); ++i)
      if (out[i] < 0 || out[i] >= rank || std::find(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(i), out[i]) != out.begin() + static_cast<std::ptrdiff_t>(i))
        c.fail(std::string("attribute ") + attr + " " + ints_text(out) + " names a dim twice or one outside [0, " + std::to_string(rank) + ")");
  return out;
}

std::string attr(Ctx& c, const char* a) {
  const PyVal* v = c.node().kwarg(a);
  return v ? v->s : std::string();
}

const TensorType& type_of(Ctx& c) {
  const TensorType* t = c.annotated(0);
  if (!t) c.fail(c.node().target + " has no array type");
  return *t;
}

// The result is `x` reshaped (no op when the shapes are equal).
void reshaped(Ctx& c, const Value& x, const std::vector<std::int64_t>& s) {
  if (numel(s) != numel(x.type.shape)) c.fail("reshape of " + type_text(x.type) + " to " + shape_text(s) + " changes the element count");
  if (s == x.type.shape) return c.alias(0, x);
  c.emit("Reshape", {x.ir}, {c.out()}, {{"shape", shape_text(s)}});
  c.result({type_of(c).dtype, s});
}

std::string fresh_reshape(Ctx& c, const Value& x, const std::vector<std::int64_t>& s) {
  if (s == x.type.shape) return x.ir;
  std::string o = c.tmp("r");
  c.emit("Reshape", {x.ir}, {o}, {{"shape", shape_text(s)}});
  return o;
}

// x permuted into a new temporary (or x itself for the identity)
Value permuted(Ctx& c, const Value& x, const std::vector<std::int64_t>& perm) {
  std::string o = c.tmp("t");
  auto s = permute_into(c, x, perm, o);
  if (s.empty() && !x.type.shape.empty()) return x;
  Value v = x;
  v.ir = o, v.type.shape = s;
  return v;
}

void elementwise(Ctx& c, const std::string& op) {
  const Value& a = c.T("x");
  const Value& b = c.T("y");
  if (a.type.shape != b.type.shape) c.fail(c.node().target + " of " + type_text(a.type) + " and " + type_text(b.type) + ": HLO operands must have one shape");
  auto s = binary(c, op, tensor_operand(a), tensor_operand(b), c.out(), op == "Add" || op == "Multiply" || op == "Maximum" || op == "Minimum");
  c.result({type_of(c).dtype, a.type.shape});
  (void)s;
}

// divide(e, broadcast(reduce_add(e, d))) with e = exponential(subtract(x, broadcast(reduce_max(x, d)))): XLA's
// softmax along d. The max only keeps exp in range (exp(x - m) / sum exp(x - m) is softmax(x) for every m), so
// the divide is Softmax(x, d) and the max, read by nothing else, is dropped: a max reduction would make the value
// check's verdict a choice by value. Reshapes that keep the shape are looked through.
const Node* softmax_input(Ctx& c, int& dim) {
  auto def = [&](const PyVal& v) -> const Node* {
    const Node* n = c.producer(v);
    while (n && (n->target == "reshape" || n->target == "bitcast" || n->target == "copy") && n->args.size() == 1 && n->type) {
      const Node* m = c.producer(n->args[0]);
      if (!m || !m->type || m->type->shape != n->type->shape) break;
      n = m;
    }
    return n;
  };
  auto kw = [](const Node* n, const char* k) { const PyVal* v = n->kwarg(k); return v ? v->s : std::string(); };
  auto one_dim = [&](const Node* r, const char* reducer, double init) -> int {  // reduce over one dim with its identity
    if (!r || r->target != "reduce" || r->args.size() != 2 || kw(r, "reducer") != reducer) return -1;
    const Node* i = c.producer(r->args[1]);
    if (!i || i->target != "constant" || i->args.empty() || i->args[0].f != init) return -1;
    std::string d = kw(r, "dimensions");
    if (d.size() < 3 || d.find(',') != std::string::npos) return -1;
    return std::atoi(d.c_str() + 1);
  };
  // broadcast(r) back over dim d: dimensions = every dim but d, in order
  auto back = [&](const Node* b, int d, std::size_t rank) -> const Node* {
    if (!b || b->target != "broadcast" || b->args.size() != 1) return nullptr;
    std::string want = "{";
    for (std::size_t i = 0, k = 0; i < rank; ++i)
      if (static_cast<int>(i) != d) want += (k++ ? "," : "") + std::to_string(i);
    if (kw(b, "dimensions") != want + "}") return nullptr;
    return def(b->args[0]);
  };
  const Node& n = c.node();
  if (n.args.size() != 2 || !n.type) return nullptr;
  std::size_t rank = n.type->shape.size();
  const Node* e = def(n.args[0]);
  if (!e || e->target != "exponential" || e->args.size() != 1) return nullptr;
  const Node* s = def(e->args[0]);
  if (!s || s->target != "subtract" || s->args.size() != 2) return nullptr;
  // the sum: reduce_add(e) over d, broadcast back
  const Node* sb = c.producer(n.args[1]);
  int d = -1;
  for (int k = 0; k < static_cast<int>(rank) && d < 0; ++k)
    if (const Node* r = back(sb, k, rank); r && one_dim(r, "add", 0) == k && r->args[0].s == n.args[0].s) d = k;
  if (d < 0) return nullptr;
  const Node* mx = back(c.producer(s->args[1]), d, rank);
  if (one_dim(mx, "maximum", -HUGE_VAL) != d || mx->args[0].s != s->args[0].s) return nullptr;
  dim = d;
  return s;
}

void unary(Ctx& c, const std::string& op) {
  const Value& x = c.T("x");
  c.emit(op, {x.ir}, {c.out()});
  c.result({type_of(c).dtype, x.type.shape});
}

// broadcast(x), dimensions={...}: x's dim i is the result's dim dims[i]; the others grow.
void broadcast(Ctx& c) {
  const Value& x = c.T("x");
  const TensorType& t = type_of(c);
  auto dims = int_list(c, "dimensions", false, static_cast<std::int64_t>(t.shape.size()));
  if (dims.size() != x.type.shape.size()) c.fail("broadcast's dimensions list " + ints_text(dims) + " does not match the operand's rank");
  if (x.scalar && x.type.shape.empty()) {  // a constant broadcast: a Full of the result's shape
    c.emit("Full", {}, {c.out()}, {{"shape", shape_text(t.shape)}, {"value", num_text(*x.scalar)}, {"dtype", t.dtype}});
    c.result(t);
    return;
  }
  // x's dims in increasing order of their place in the result, then 1 at each new dim, then grown
  std::vector<std::int64_t> order(dims.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return dims[static_cast<std::size_t>(a)] < dims[static_cast<std::size_t>(b)]; });
  Value v = permuted(c, x, order);
  std::vector<std::int64_t> s(t.shape.size(), 1);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    auto d = static_cast<std::size_t>(dims[i]);
    if (d >= s.size() || (x.type.shape[i] != t.shape[d] && x.type.shape[i] != 1)) c.fail("broadcast of " + type_text(x.type) + " to " + type_text(t) + " along " + ints_text(dims));
    s[d] = x.type.shape[i];
  }
  std::string r = fresh_reshape(c, v, s);
  if (s == t.shape) {
    Value w = v;
    w.ir = r, w.type.shape = s;
    return c.alias(0, w);
  }
  c.emit("Expand", {r}, {c.out()}, {{"shape", shape_text(t.shape)}});
  c.result(t);
}

void transpose(Ctx& c) {
  const Value& x = c.T("x");
  auto dims = int_list(c, "dimensions", true, static_cast<std::int64_t>(x.type.shape.size()));
  if (dims.size() != x.type.shape.size()) c.fail("transpose's dimensions " + ints_text(dims) + " are not a permutation of the operand's dims");
  auto s = permute_into(c, x, dims, c.out());
  if (s.empty() && !x.type.shape.empty()) return c.alias(0, x);
  c.result({type_of(c).dtype, s});
}

// dot: batch dims, then the lhs's free dims, then the rhs's, as a batched MatMul of [B.., M, K] x [B.., K, N].
void dot(Ctx& c) {
  const Value& a = c.T("x");
  const Value& b = c.T("y");
  const auto rank_a = static_cast<std::int64_t>(a.type.shape.size()), rank_b = static_cast<std::int64_t>(b.type.shape.size());
  auto lb = int_list(c, "lhs_batch_dims", false, rank_a), lc = int_list(c, "lhs_contracting_dims", false, rank_a);
  auto rb = int_list(c, "rhs_batch_dims", false, rank_b), rc = int_list(c, "rhs_contracting_dims", false, rank_b);
  if (lb.size() != rb.size() || lc.size() != rc.size()) c.fail("dot's batch or contracting dims do not pair up");
  for (auto d : lc)
    if (std::find(lb.begin(), lb.end(), d) != lb.end()) c.fail("dot's lhs dim " + std::to_string(d) + " is both a batch and a contracting dim");
  for (auto d : rc)
    if (std::find(rb.begin(), rb.end(), d) != rb.end()) c.fail("dot's rhs dim " + std::to_string(d) + " is both a batch and a contracting dim");
  auto free_of = [](std::size_t rank, const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& y) {
    std::vector<std::int64_t> f;
    for (std::size_t d = 0; d < rank; ++d)
      if (std::find(x.begin(), x.end(), static_cast<std::int64_t>(d)) == x.end() && std::find(y.begin(), y.end(), static_cast<std::int64_t>(d)) == y.end())
        f.push_back(static_cast<std::int64_t>(d));
    return f;
  };
  auto lf = free_of(a.type.shape.size(), lb, lc), rf = free_of(b.type.shape.size(), rb, rc);
  auto size = [](const Value& v, const std::vector<std::int64_t>& ds) {
    std::int64_t n = 1;
    for (auto d : ds) n *= v.type.shape[static_cast<std::size_t>(d)];
    return n;
  };
  std::vector<std::int64_t> batch, out;
  for (std::size_t i = 0; i < lb.size(); ++i) {
    auto x = a.type.shape[static_cast<std::size_t>(lb[i])], y = b.type.shape[static_cast<std::size_t>(rb[i])];
    if (x != y) c.fail("dot's batch dims differ: " + type_text(a.type) + " x " + type_text(b.type));
    batch.push_back(x);
  }
  for (std::size_t i = 0; i < lc.size(); ++i)
    if (a.type.shape[static_cast<std::size_t>(lc[i])] != b.type.shape[static_cast<std::size_t>(rc[i])])
      c.fail("dot's contracting dims differ: " + type_text(a.type) + " x " + type_text(b.type));
  out = batch;
  for (auto d : lf) out.push_back(a.type.shape[static_cast<std::size_t>(d)]);
  for (auto d : rf) out.push_back(b.type.shape[static_cast<std::size_t>(d)]);
  std::vector<std::int64_t> pa = lb, pb = rb;
  pa.insert(pa.end(), lf.begin(), lf.end()), pa.insert(pa.end(), lc.begin(), lc.end());
  pb.insert(pb.end(), rc.begin(), rc.end()), pb.insert(pb.end(), rf.begin(), rf.end());
  Value ta = permuted(c, a, pa), tb = permuted(c, b, pb);
  auto ma = batch, mb = batch;
  ma.push_back(size(a, lf)), ma.push_back(size(a, lc));
  mb.push_back(size(b, rc)), mb.push_back(size(b, rf));
  std::string ra = fresh_reshape(c, ta, ma), rb2 = fresh_reshape(c, tb, mb);
  auto mo = batch;
  mo.push_back(ma[ma.size() - 2]), mo.push_back(mb.back());
  if (mo == out) {
    c.emit("MatMul", {ra, rb2}, {c.out()});
  } else {
    std::string m = c.tmp("m");
    c.emit("MatMul", {ra, rb2}, {m});
    c.emit("Reshape", {m}, {c.out()}, {{"shape", shape_text(out)}});
  }
  c.result({type_of(c).dtype, out});
}

// slice(x), slice={[a:b], [c:d:1], ...}
void slice(Ctx& c) {
  const Value& x = c.T("x");
  std::string spec = attr(c, "slice");
  std::vector<std::array<std::int64_t, 3>> ranges;
  for (std::size_t p = spec.find('['); p != std::string::npos; p = spec.find('[', p + 1)) {
    std::array<std::int64_t, 3> r{0, 0, 1};
    auto e = spec.find(']', p);
    std::string body = spec.substr(p + 1, e - p - 1);
    int k = 0;
    std::string num;
    for (char ch : body + ":") {
      if (ch == ':') r[static_cast<std::size_t>(k++)] = std::stoll(num), num.clear();
      else if (ch != ' ') num += ch;
      if (k > 2) break;
    }
    if (k < 2) c.fail("slice bound '[" + body + "]' is not [start:limit] or [start:limit:stride]");
    ranges.push_back(r);
  }
  if (ranges.size() != x.type.shape.size()) c.fail("slice has " + std::to_string(ranges.size()) + " ranges for a rank-" + std::to_string(x.type.shape.size()) + " operand");
  Value v = x;
  std::vector<std::size_t> cut;
  for (std::size_t d = 0; d < ranges.size(); ++d) {
    if (ranges[d][2] != 1) c.fail("slice with a stride other than 1 is not supported yet");
    if (ranges[d][0] < 0 || ranges[d][0] > ranges[d][1] || ranges[d][1] > x.type.shape[d]) c.fail("slice range out of bounds");
    if (ranges[d][0] != 0 || ranges[d][1] != x.type.shape[d]) cut.push_back(d);
  }
  if (cut.empty()) return c.alias(0, x);
  for (std::size_t k = 0; k < cut.size(); ++k) {
    std::size_t d = cut[k];
    std::string o = k + 1 == cut.size() ? c.out() : c.tmp("s");
    c.emit("Slice", {v.ir}, {o}, {{"dim", std::to_string(d)}, {"start", std::to_string(ranges[d][0])}, {"end", std::to_string(ranges[d][1])}});
    v.ir = o;
    v.type.shape[d] = ranges[d][1] - ranges[d][0];
  }
  c.result({type_of(c).dtype, v.type.shape});
}

void concatenate(Ctx& c) {
  if (c.node().args.empty()) c.fail("concatenate of no operands");
  auto s = c.tensor_at(c.node().args[0]).type.shape;
  auto dims = int_list(c, "dimensions", true, static_cast<std::int64_t>(s.size()));
  if (dims.size() != 1) c.fail("concatenate needs one dimension");
  for (const auto& a : c.node().args)
    if (c.tensor_at(a).type.shape.size() != s.size()) c.fail("concatenate of operands of different ranks");
  std::vector<std::string> ins;
  s[static_cast<std::size_t>(dims[0])] = 0;
  for (const auto& a : c.node().args) {
    const Value& v = c.tensor_at(a);
    ins.push_back(v.ir);
    s[static_cast<std::size_t>(dims[0])] += v.type.shape[static_cast<std::size_t>(dims[0])];
  }
  if (ins.size() > 8) c.fail("concatenate of more than 8 operands is not supported yet");
  c.emit("Concat", ins, {c.out()}, {{"dim", std::to_string(dims[0])}});
  c.result({type_of(c).dtype, s});
}

// reduce(x, init), dimensions={..}, to_apply=%r: the reducer's root names the reduction
void reduce(Ctx& c) {
  const Value& x = c.T("x");
  auto init = c.constant("init");
  std::string r = attr(c, "reducer");
  auto dims = int_list(c, "dimensions", true, static_cast<std::int64_t>(x.type.shape.size()));
  std::vector<int> d(dims.begin(), dims.end());
  std::vector<std::int64_t> s;
  for (std::size_t i = 0; i < x.type.shape.size(); ++i)
    if (std::find(dims.begin(), dims.end(), static_cast<std::int64_t>(i)) == dims.end()) s.push_back(x.type.shape[i]);
  const char* op = r == "add" ? "Sum" : r == "maximum" ? "ReduceMax" : r == "minimum" ? "ReduceMin" : nullptr;
  if (!op) c.fail("reduce with the combiner '" + r + "' is not supported yet (add, maximum, minimum are)");
  double neutral = r == "add" ? 0 : r == "maximum" ? -HUGE_VAL : HUGE_VAL;
  if (!init || *init != neutral) c.fail("reduce with an init value other than its combiner's identity is not supported yet");
  if (d.empty()) return c.alias(0, x);
  c.emit(op, {x.ir}, {c.out()}, {{"dims", dims_text(d)}});
  c.result({type_of(c).dtype, s});
}

void compare(Ctx& c) {
  static const std::pair<const char*, const char*> dirs[] = {{"LT", "lt"}, {"LE", "le"}, {"GT", "gt"}, {"GE", "ge"}, {"EQ", "eq"}, {"NE", "ne"}};
  std::string dir = attr(c, "direction"), kind;
  for (const auto& [k, v] : dirs)
    if (dir == k) kind = v;
  if (kind.empty()) c.fail("compare direction '" + dir + "' is not supported");
  const Value& a = c.T("x");
  const Value& b = c.T("y");
  c.result({"bool", compare_into(c, kind, tensor_operand(a), tensor_operand(b), c.out(), true)});
}

void logical(Ctx& c, bool is_and) {
  const Value& a = c.T("x");
  const Value& b = c.T("y");
  if (a.type.dtype != "bool" || b.type.dtype != "bool")
    c.fail(std::string("bitwise ") + (is_and ? "and" : "or") + " of " + type_text(a.type) + " and " + type_text(b.type) + " is not supported yet (only of pred masks)");
  c.emit(is_and ? "Multiply" : "Maximum", {a.ir, b.ir}, {c.out()});  // 0/1 masks: and is the product, or the max
  c.result({"bool", a.type.shape});
}

void convert(Ctx& c) {
  const Value& x = c.T("x");
  const TensorType& t = type_of(c);
  if (t.dtype == x.type.dtype) return c.alias(0, x);
  c.emit("Cast", {x.ir}, {c.out()}, {{"dtype", t.dtype}});
  c.result(t);
}

void constant(Ctx& c) {
  const TensorType& t = type_of(c);
  double v = c.node().args.empty() ? 0 : c.node().args[0].f;
  if (!std::isfinite(v)) {  // -inf as a max's init: a value, not a tensor (a Full would not be finite)
    Value s;
    s.scalar = v;
    s.type = t;
    c.alias(0, s);
    return;
  }
  c.emit("Full", {}, {c.out()}, {{"shape", shape_text(t.shape)}, {"value", num_text(v)}, {"dtype", t.dtype}});
  c.result(t);
  if (t.shape.empty()) c.set_scalar(0, v);
}

void iota(Ctx& c) {
  const TensorType& t = type_of(c);
  auto d = static_cast<std::size_t>(std::stoll(attr(c, "iota_dimension").empty() ? "0" : attr(c, "iota_dimension")));
  if (d >= t.shape.size()) c.fail("iota_dimension out of range");
  std::string a = c.tmp("a");
  c.emit("Arange", {}, {t.shape.size() == 1 ? c.out() : a}, {{"end", std::to_string(t.shape[d])}, {"dtype", t.dtype}});
  if (t.shape.size() == 1) return c.result(t);
  std::vector<std::int64_t> s(t.shape.size(), 1);
  s[d] = t.shape[d];
  std::string r = c.tmp("r");
  c.emit("Reshape", {a}, {r}, {{"shape", shape_text(s)}});
  c.emit("Expand", {r}, {c.out()}, {{"shape", shape_text(t.shape)}});
  c.result(t);
}

// gather of whole slices at indices along one dim (index_vector_dim past the indices' dims): IndexSelect
void gather(Ctx& c) {
  const Value& x = c.T("x");
  const Value& idx = c.T("indices");
  const TensorType& t = type_of(c);
  const auto xr = static_cast<std::int64_t>(x.type.shape.size());
  auto start = int_list(c, "start_index_map", true, xr), collapsed = int_list(c, "collapsed_slice_dims", true, xr), sizes = int_list(c, "slice_sizes");
  if (sizes.size() != x.type.shape.size()) c.fail("gather's slice_sizes " + ints_text(sizes) + " do not match the operand's rank");
  auto ivd = std::stoll(attr(c, "index_vector_dim").empty() ? "-1" : attr(c, "index_vector_dim"));
  if (start.size() != 1 || collapsed != start || ivd != static_cast<std::int64_t>(idx.type.shape.size()))
    c.fail("this form of gather is not supported yet (whole slices at indices along one collapsed dim)");
  auto d = static_cast<std::size_t>(start[0]);
  for (std::size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] != (i == d ? 1 : x.type.shape[i])) c.fail("gather of partial slices is not supported yet");
  std::string flat = fresh_reshape(c, idx, {numel(idx.type.shape)}), sel = c.tmp("g");
  c.emit("IndexSelect", {x.ir, flat}, {sel}, {{"dim", std::to_string(d)}});
  auto s = x.type.shape;
  s[d] = numel(idx.type.shape);
  // the result: the index dims first, then x's other dims in order (offset_dims)
  std::vector<std::int64_t> perm = {static_cast<std::int64_t>(d)};
  for (std::size_t i = 0; i < s.size(); ++i)
    if (i != d) perm.push_back(static_cast<std::int64_t>(i));
  Value v;
  v.ir = sel, v.type = {x.type.dtype, s};
  Value p = permuted(c, v, perm);
  reshaped(c, p, t.shape);
}

// all-reduce; all-reduce-start (async: its result is read only after the all-reduce-done naming it)
void all_reduce(Ctx& c, bool async) {
  const Value& x = c.T("x");
  std::string r = attr(c, "reducer");
  const char* red = r == "add" ? "sum" : r == "maximum" ? "max" : r == "minimum" ? "min" : nullptr;
  if (!red) c.fail("all-reduce with the combiner '" + r + "' is not supported yet");
  PyVal g;
  g.k = PyVal::K::Str;
  g.s = "replicas";
  Attrs at = {{"axis", c.axis_of_group(g)}, {"reduce", red}};
  std::string h = "h_" + c.out();
  if (async) at.emplace_back("handle", h);
  c.emit("AllReduce", {x.ir}, {c.out()}, at);
  c.result({type_of(c).dtype, x.type.shape});
  if (async) c.set_handle(0, h);
}

// all-gather(x), dimensions={d} and reduce-scatter(x), dimensions={d}, to_apply=add: the device group's pieces
// concatenated along d, and the group's sum cut along d (each device its block, in group order)
void gather_scatter(Ctx& c, bool gather) {
  const Value& x = c.T("x");
  auto dims = int_list(c, "dimensions");
  if (dims.size() != 1 || dims[0] < 0 || static_cast<std::size_t>(dims[0]) >= x.type.shape.size())
    c.fail(std::string(gather ? "all-gather" : "reduce-scatter") + " needs one dimension of its operand");
  PyVal g;
  g.k = PyVal::K::Str;
  g.s = "replicas";
  Attrs at = {{"axis", c.axis_of_group(g)}, {"dim", std::to_string(dims[0])}};
  if (!gather) {
    std::string r = attr(c, "reducer");
    const char* red = r == "add" ? "sum" : r == "maximum" ? "max" : r == "minimum" ? "min" : nullptr;
    if (!red) c.fail("reduce-scatter with the combiner '" + r + "' is not supported yet");
    at.emplace_back("reduce", red);
  }
  // the group's size: the first of `replica_groups={{0,1},{2,3}}` (all devices when empty: read from the result)
  const auto d = static_cast<std::size_t>(dims[0]);
  std::int64_t n = 0;
  if (c.has("replica_groups")) {
    const std::string& rg = c.v("replica_groups").s;
    std::size_t open = rg.find('{', rg.find('{') + 1), close = rg.find('}');
    if (open != std::string::npos && close != std::string::npos && open < close)
      n = static_cast<std::int64_t>(std::count(rg.begin() + static_cast<std::ptrdiff_t>(open), rg.begin() + static_cast<std::ptrdiff_t>(close), ',')) + 1;
  }
  const TensorType& ann = type_of(c);
  if (ann.shape.size() != x.type.shape.size()) c.fail("the result's rank differs from the operand's");
  if (n == 0) n = gather ? (x.type.shape[d] ? ann.shape[d] / x.type.shape[d] : 1) : (ann.shape[d] ? x.type.shape[d] / ann.shape[d] : 1);
  TensorType t{ann.dtype, x.type.shape};
  if (!gather && (n <= 0 || t.shape[d] % n)) c.fail("reduce-scatter of dim " + std::to_string(d) + " of size " + std::to_string(t.shape[d]) + " over " + std::to_string(n) + " devices");
  t.shape[d] = gather ? t.shape[d] * n : t.shape[d] / n;
  c.emit(gather ? "AllGather" : "ReduceScatter", {x.ir}, {c.out()}, at);
  c.result(t);
}

// all-to-all(x), dimensions={d}: each device cuts its operand into one block per device along d, sends block i to
// device i and concatenates what it receives along d in device order (jax.lax.all_to_all with split_axis =
// concat_axis)
void all_to_all(Ctx& c) {
  const Value& x = c.T("x");
  if (!c.has("dimensions")) c.fail("all-to-all of a tuple of operands (no `dimensions`) is not supported yet");
  auto dims = int_list(c, "dimensions");
  if (dims.size() != 1 || dims[0] < 0 || static_cast<std::size_t>(dims[0]) >= x.type.shape.size()) c.fail("all-to-all needs one dimension of its operand");
  PyVal g;
  g.k = PyVal::K::Str;
  g.s = "replicas";
  std::string d = std::to_string(dims[0]);
  c.emit("AllToAll", {x.ir}, {c.out()}, {{"axis", c.axis_of_group(g)}, {"split_dim", d}, {"concat_dim", d}});
  c.result({type_of(c).dtype, x.type.shape});
}

// collective-permute(x), source_target_pairs={{0,1},{1,2},...}: a shift by one around every device (ring attention's
// ppermute) is a RingRotate to the next (or the previous) device; any other permutation is not supported yet
void collective_permute(Ctx& c) {
  const Value& x = c.T("x");
  std::vector<std::int64_t> ids = int_list(c, "source_target_pairs");
  const auto n = static_cast<std::int64_t>(ids.size() / 2);
  std::vector<char> seen(static_cast<std::size_t>(n), 0);
  bool next = n > 0 && ids.size() % 2 == 0, prev = next;
  for (std::size_t i = 0; i + 1 < ids.size() && (next || prev); i += 2) {
    std::int64_t src = ids[i], dst = ids[i + 1];
    if (src < 0 || src >= n || seen[static_cast<std::size_t>(src)]) next = prev = false;
    else seen[static_cast<std::size_t>(src)] = 1;
    next = next && dst == (src + 1) % n;
    prev = prev && dst == (src + n - 1) % n;
  }
  if (!next && !prev)
    c.fail("collective-permute other than a shift by one around all devices ({0,1},{1,2},...,{n-1,0} or its reverse) is not supported yet");
  PyVal g;
  g.k = PyVal::K::Str;
  g.s = "replicas";
  c.emit("RingRotate", {x.ir}, {c.out()}, {{"axis", c.axis_of_group(g)}, {"direction", next ? "next" : "prev"}});
  c.result({type_of(c).dtype, x.type.shape});
}

// all-reduce-done(%start): the wait that completes the start
void all_reduce_done(Ctx& c) {
  const Value& x = c.T("x");
  if (x.handle.empty()) c.fail("all-reduce-done of '" + c.node().args[0].s + "', which is not an all-reduce-start");
  c.emit("Wait", {}, {}, {{"handle", x.handle}});
  Value v = x;
  v.handle.clear();
  c.alias(0, v);
}

const Row kRows[] = {
    {"reshape", "x", [](Ctx& c) { reshaped(c, c.T("x"), type_of(c).shape); }},
    {"bitcast", "x", [](Ctx& c) { reshaped(c, c.T("x"), type_of(c).shape); }},
    {"copy", "x", [](Ctx& c) { c.alias(0, c.T("x")); }},
    {"broadcast", "x, dimensions", broadcast},
    {"transpose", "x, dimensions", transpose},
    {"convert", "x", convert},
    {"constant", "value", constant},
    {"iota", "iota_dimension", iota},
    {"dot", "x, y, lhs_batch_dims, lhs_contracting_dims, rhs_batch_dims, rhs_contracting_dims", dot},
    {"add", "x, y", [](Ctx& c) { elementwise(c, "Add"); }},
    {"subtract", "x, y", [](Ctx& c) { elementwise(c, "Sub"); }},
    {"multiply", "x, y", [](Ctx& c) { elementwise(c, "Multiply"); }},
    {"divide", "x, y", [](Ctx& c) {
       int d = -1;
       if (const Node* s = softmax_input(c, d)) {
         const Value& x = c.tensor_at(s->args[0]);
         c.emit("Softmax", {x.ir}, {c.out()}, {{"dim", std::to_string(d)}});
         return c.result({type_of(c).dtype, x.type.shape});
       }
       elementwise(c, "Div");
     }},
    {"maximum", "x, y", [](Ctx& c) { elementwise(c, "Maximum"); }},
    {"minimum", "x, y", [](Ctx& c) { elementwise(c, "Minimum"); }},
    {"negate", "x", [](Ctx& c) { unary(c, "Neg"); }},
    {"exponential", "x", [](Ctx& c) { unary(c, "Exp"); }},
    {"log", "x", [](Ctx& c) { unary(c, "Log"); }},
    {"sqrt", "x", [](Ctx& c) { unary(c, "Sqrt"); }},
    {"rsqrt", "x", [](Ctx& c) { unary(c, "Rsqrt"); }},
    {"sine", "x", [](Ctx& c) { unary(c, "Sin"); }},
    {"cosine", "x", [](Ctx& c) { unary(c, "Cos"); }},
    {"logistic", "x", [](Ctx& c) {
       const Value& x = c.T("x");
       sigmoid_of(c, x, c.out());
       c.result({type_of(c).dtype, x.type.shape});
     }},
    {"compare", "x, y, direction, type", compare},
    {"select", "pred, x, y", [](Ctx& c) {
       const Value& p = c.T("pred");
       const Value& a = c.T("x");
       const Value& b = c.T("y");
       c.emit("Where", {p.ir, a.ir, b.ir}, {c.out()});
       c.result({type_of(c).dtype, a.type.shape});
     }},
    {"and", "x, y", [](Ctx& c) { logical(c, true); }},
    {"or", "x, y", [](Ctx& c) { logical(c, false); }},
    {"not", "x", [](Ctx& c) {
       const Value& x = c.T("x");
       if (x.type.dtype != "bool") c.fail("bitwise not of integers is not supported yet");
       not_of(c, x.ir, c.out());
       c.result({"bool", x.type.shape});
     }},
    {"slice", "x, slice", slice},
    {"concatenate", "x, dimensions, **", concatenate},
    {"reduce", "x, init, dimensions, reducer", reduce},
    {"gather", "x, indices, offset_dims, collapsed_slice_dims, start_index_map, index_vector_dim, slice_sizes, indices_are_sorted=false", gather},
    {"all-reduce", "x, replica_groups, reducer", [](Ctx& c) { all_reduce(c, false); }},
    {"all-reduce-start", "x, replica_groups, reducer", [](Ctx& c) { all_reduce(c, true); }},
    {"all-reduce-done", "x", all_reduce_done},
    {"all-gather", "x, replica_groups, dimensions", [](Ctx& c) { gather_scatter(c, true); }},
    {"reduce-scatter", "x, replica_groups, dimensions, reducer", [](Ctx& c) { gather_scatter(c, false); }},
    {"all-to-all", "x, replica_groups, dimensions", all_to_all},
    {"collective-permute", "x, source_target_pairs", collective_permute},
};

}  // namespace

std::span<const Row> hlo_rows() { return kRows; }

}  // namespace spmd::frontends
