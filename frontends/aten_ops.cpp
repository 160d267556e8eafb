// frontends/aten_ops.cpp - the op table of FX (aten and _c10d_functional) ops: one row per op, its parameters
// (the schema's names, so keyword arguments bind) and the spmdcheck op or short decomposition it becomes.
// Comparisons and sigmoid are temporary decompositions (frontends/decompose.h).
#include <algorithm>
#include <numeric>

#include "frontends/custom_ops.h"
#include "frontends/decompose.h"
#include "frontends/lower.h"

namespace spmd::frontends {

namespace {

using Attrs = std::vector<std::pair<std::string, std::string>>;

Operand operand(Ctx& c, std::string_view p, const std::string& dtype) {
  const PyVal& x = c.v(p);
  Operand o;
  if (x.k == PyVal::K::Name) return tensor_operand(c.T(p));
  if (!x.is_num()) c.fail_at(x, "argument '" + std::string(p) + "' of " + c.node().target + " must be a tensor or a number");
  bool int_data = dtype == "i64" || dtype == "i32" || dtype == "i8";
  if (!x.expr.empty() || (int_data && x.k == PyVal::K::Int && x.i > 1)) {  // a rank-varying int, or an int that may be a size (a vocab bound)
    o.t = c.scalar_tensor(p, "i64");
    o.dtype = "i64";
    return o;
  }
  o.num = x.num();
  o.dtype = dtype;
  return o;
}

// add/sub/mul/div/maximum/minimum.Tensor and .Scalar: self op (other * alpha).
void arith(Ctx& c, const std::string& op, bool commutes, bool has_alpha) {
  std::string dt = out_dtype(c, c.is_tensor("self") ? c.ty("self").dtype : "f32");
  Operand a = operand(c, "self", dt), b = operand(c, "other", dt);
  if (has_alpha && c.has("alpha") && c.F("alpha") != 1) {
    double al = c.F("alpha");
    if (b.num) {
      *b.num *= al;
    } else {
      std::string s = c.tmp("a");
      c.emit("Multiply", {b.t}, {s}, {{"scalar", num_text(al)}});
      b.t = s;
    }
  }
  if (op == "Div" && c.is_param("rounding_mode") && c.has("rounding_mode")) c.fail("div with rounding_mode is not supported yet");
  auto shape = binary(c, op, a, b, c.out(), commutes);
  c.result({dt, shape});
}

void unary(Ctx& c, const std::string& op) {
  const Value& x = c.T("self");
  c.emit(op, {x.ir}, {c.out()});
  c.result({out_dtype(c, x.type.dtype), x.type.shape});
}

// ---- comparisons (temporary decompositions: see the header) --------------------------------------

void compare(Ctx& c, const std::string& kind) {
  std::string dt = c.ty("self").dtype;
  Operand a = operand(c, "self", dt), b = operand(c, "other", dt);
  c.result({"bool", compare_into(c, kind, a, b, c.out())});
}

void logical(Ctx& c, const std::string& kind) {
  // bitwise ops are the logical ones on bool masks only; logical ops read any other dtype as nonzero
  const bool bitwise = c.node().target.rfind("aten.bitwise_", 0) == 0;
  auto mask = [&](const char* p) {
    const Value& v = c.T(p);
    if (v.type.dtype == "bool") return v.ir;
    if (bitwise) c.fail(c.node().target + " of " + type_text(v.type) + " is not supported yet (only of bool masks)");
    std::string m = c.tmp("b");
    c.emit("Cast", {v.ir}, {m}, {{"dtype", "bool"}});
    return m;
  };
  const Value& a = c.T("self");
  if (kind == "not") {
    not_of(c, mask("self"), c.out());
    c.result({"bool", a.type.shape});
    return;
  }
  const Value& b = c.T("other");
  auto shape = broadcast_shape(a.type.shape, b.type.shape, c);
  std::string ma = mask("self"), mb = mask("other");
  if (kind == "and") {
    c.emit("Multiply", {ma, mb}, {c.out()});
  } else {
    std::string s = c.tmp("s");
    c.emit("Add", {ma, mb}, {s});
    c.emit("Cast", {s}, {c.out()}, {{"dtype", "bool"}});
  }
  c.result({"bool", shape});
}

// ---- shapes ---------------------------------------------------------------------------------------

std::vector<std::int64_t> resolve_shape(Ctx& c, std::vector<std::int64_t> s, std::int64_t n) {
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer >= 0) c.fail("only one dim of a shape may be -1");
      infer = static_cast<int>(i);
    } else if (s[i] < 0) {
      c.fail("negative size " + std::to_string(s[i]) + " in a shape");
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || n % known) c.fail("cannot infer the -1 dim: " + std::to_string(n) + " elements do not divide by " + std::to_string(known));
    s[static_cast<std::size_t>(infer)] = n / known;
  }
  if (numel(s) != n) c.fail("shape " + shape_text(s) + " has " + std::to_string(numel(s)) + " elements, the input has " + std::to_string(n));
  return s;
}

void reshape_to(Ctx& c, const Value& x, const std::vector<std::int64_t>& s) {
  if (s == x.type.shape) {
    c.alias(0, x);
    return;
  }
  c.emit("Reshape", {x.ir}, {c.out()}, {{"shape", shape_text(s)}});
  c.result({out_dtype(c, x.type.dtype), s});
}

void view(Ctx& c) {
  const Value& x = c.T("self");
  reshape_to(c, x, resolve_shape(c, c.Is("size"), numel(x.type.shape)));
}

void permute(Ctx& c) {
  const Value& x = c.T("self");
  auto shape = permute_into(c, x, c.Is("dims"), c.out());
  if (shape.empty() && !x.type.shape.empty()) return c.alias(0, x);  // the identity
  c.result({out_dtype(c, x.type.dtype), shape});
}

void expand(Ctx& c) {
  const Value& x = c.T("self");
  auto s = c.Is("size");
  std::size_t n = s.size(), r = x.type.shape.size();
  if (n < r) c.fail("expand to rank " + std::to_string(n) + " from rank " + std::to_string(r));
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t have = i < n - r ? 1 : x.type.shape[i - (n - r)];
    if (s[i] == -1) {
      if (i < n - r) c.fail("expand: -1 for a new leading dim");
      s[i] = have;
    }
    if (have != 1 && have != s[i]) c.fail("expand of a dim of size " + std::to_string(have) + " to " + std::to_string(s[i]));
  }
  if (s == x.type.shape) return c.alias(0, x);
  c.emit("Expand", {x.ir}, {c.out()}, {{"shape", shape_text(s)}});
  c.result({out_dtype(c, x.type.dtype), s});
}

void unsqueeze(Ctx& c) {
  const Value& x = c.T("self");
  auto s = x.type.shape;
  int d = c.dim("dim", s.size() + 1);
  s.insert(s.begin() + d, 1);
  reshape_to(c, x, s);
}

void squeeze(Ctx& c, bool all) {
  const Value& x = c.T("self");
  auto s = x.type.shape;
  if (all) {
    s.erase(std::remove(s.begin(), s.end(), 1), s.end());
  } else {
    auto dims = c.Is("dim");
    std::vector<bool> drop(s.size());
    for (auto d : dims) {
      std::int64_t k = d < 0 ? d + static_cast<std::int64_t>(s.size()) : d;
      if (k < 0 || k >= static_cast<std::int64_t>(s.size())) c.fail("squeeze dim " + std::to_string(d) + " out of range");
      drop[static_cast<std::size_t>(k)] = s[static_cast<std::size_t>(k)] == 1;
    }
    std::vector<std::int64_t> t;
    for (std::size_t i = 0; i < s.size(); ++i)
      if (!drop[i]) t.push_back(s[i]);
    s = t;
  }
  reshape_to(c, x, s);
}

// clone, detach, alias, lift_fresh_copy, _to_copy (a dtype change is a Cast).
void identity(Ctx& c) {
  const Value& x = c.T("self");
  std::string dt = x.type.dtype;
  if (c.node().target == "aten._to_copy.default" && c.has("dtype")) {
    const PyVal& d = c.v("dtype");
    static const std::pair<const char*, const char*> names[] = {{"torch.float32", "f32"}, {"torch.float", "f32"}, {"torch.float16", "f16"}, {"torch.half", "f16"},
                                                                {"torch.bfloat16", "bf16"}, {"torch.float64", "f64"}, {"torch.double", "f64"}, {"torch.int64", "i64"},
                                                                {"torch.long", "i64"}, {"torch.int32", "i32"}, {"torch.int", "i32"}, {"torch.bool", "bool"},
                                                                {"torch.int8", "i8"}, {"torch.uint8", "i8"}};
    std::string want;
    for (const auto& [k, v] : names)
      if (d.k == PyVal::K::Name && d.s == k) want = v;
    if (want.empty()) c.fail_at(d, "unsupported dtype in _to_copy");
    bool to_int = want == "i64" || want == "i32" || want == "i8" || want == "bool";
    bool from_int = dt == "i64" || dt == "i32" || dt == "i8" || dt == "bool";
    if (want != dt && (to_int != from_int || want == "bool")) {
      c.emit("Cast", {x.ir}, {c.out()}, {{"dtype", want}});
      c.result({want, x.type.shape});
      return;
    }
    if (want != dt) {  // a float precision change: the value check computes in reals, so the value is the same
      c.emit("Cast", {x.ir}, {c.out()}, {{"dtype", want}});
      c.result({want, x.type.shape});
      return;
    }
  }
  if (x.ir.empty() && x.scalar) {
    Value v = x;
    v.ir = c.full({}, *x.scalar, out_dtype(c, "f32"));
    c.alias(0, v);
    return;
  }
  c.alias(0, x);
}

// copy(dst, src): dst's shape filled with src (broadcast).
void copy(Ctx& c) {
  const Value& dst = c.T("self");
  const Value& src = c.T("src");
  if (src.type.shape == dst.type.shape) return c.alias(0, src);
  broadcast_shape(src.type.shape, dst.type.shape, c);
  c.emit("Expand", {src.ir}, {c.out()}, {{"shape", shape_text(dst.type.shape)}});
  c.result({dst.type.dtype, dst.type.shape});
}

// ---- contractions ---------------------------------------------------------------------------------

std::vector<std::int64_t> matmul_shape(Ctx& c, const TensorType& a, const TensorType& b) {
  if (a.shape.size() < 2 || b.shape.size() < 2) c.fail("mm/bmm need operands of rank 2 or more, got " + type_text(a) + " and " + type_text(b));
  auto k1 = a.shape.back(), k2 = b.shape[b.shape.size() - 2];
  if (k1 != k2) c.fail("contracting dims differ: " + type_text(a) + " x " + type_text(b));
  if (b.shape.size() > 2 && std::vector<std::int64_t>(a.shape.begin(), a.shape.end() - 2) != std::vector<std::int64_t>(b.shape.begin(), b.shape.end() - 2))
    c.fail("batch dims differ: " + type_text(a) + " x " + type_text(b));
  auto s = a.shape;
  s.back() = b.shape.back();
  return s;
}

void mm(Ctx& c) {
  const Value& a = c.T("self");
  const Value& b = c.T("mat2");
  auto s = matmul_shape(c, a.type, b.type);
  c.emit("MatMul", {a.ir, b.ir}, {c.out()});
  c.result({out_dtype(c, a.type.dtype), s});
}

// addmm / baddbmm: beta * self + alpha * (m1 @ m2); beta = 0 ignores self (as torch does).
void addmm(Ctx& c, const char* m1, const char* m2) {
  const Value& x = c.T("self");
  const Value& a = c.T(m1);
  const Value& b = c.T(m2);
  auto s = matmul_shape(c, a.type, b.type);
  double alpha = c.F("alpha"), beta = c.F("beta");
  std::string prod = beta == 0 && alpha == 1 ? c.out() : c.tmp("m");
  c.emit("MatMul", {a.ir, b.ir}, {prod});
  std::string scaled = prod;
  if (alpha != 1) {
    scaled = beta == 0 ? c.out() : c.tmp("s");
    c.emit("Multiply", {prod}, {scaled}, {{"scalar", num_text(alpha)}});
  }
  if (beta != 0) {
    broadcast_shape(x.type.shape, s, c);
    std::string bx = x.ir;
    if (beta != 1) {
      bx = c.tmp("b");
      c.emit("Multiply", {x.ir}, {bx}, {{"scalar", num_text(beta)}});
    }
    c.emit("Add", {scaled, bx}, {c.out()});
  }
  c.result({out_dtype(c, a.type.dtype), s});
}

// ---- reductions and normalization -----------------------------------------------------------------

std::vector<int> reduce_dims(Ctx& c, const Value& x, bool all) {
  std::size_t r = x.type.shape.size();
  std::vector<int> d;
  if (all || !c.has("dim") || (c.v("dim").is_seq() && c.v("dim").items.empty())) {
    for (std::size_t i = 0; i < r; ++i) d.push_back(static_cast<int>(i));
    return d;
  }
  for (auto k : c.Is("dim")) {
    std::int64_t n = k < 0 ? k + static_cast<std::int64_t>(r) : k;
    if (n < 0 || n >= static_cast<std::int64_t>(r)) c.fail("dim " + std::to_string(k) + " out of range for rank " + std::to_string(r));
    d.push_back(static_cast<int>(n));
  }
  return d;
}

void reduce(Ctx& c, const std::string& op, bool all) {
  const Value& x = c.T("self");
  auto d = reduce_dims(c, x, all);
  bool keep = !all && c.has("keepdim") && c.v("keepdim").b;
  std::vector<std::int64_t> s;
  for (std::size_t i = 0; i < x.type.shape.size(); ++i) {
    bool red = std::find(d.begin(), d.end(), static_cast<int>(i)) != d.end();
    if (!red) s.push_back(x.type.shape[i]);
    else if (keep) s.push_back(1);
  }
  if (d.empty()) return c.alias(0, x);
  Attrs at = {{"dims", dims_text(d)}};
  if (keep) at.emplace_back("keepdim", "true");
  c.emit(op, {x.ir}, {c.out()}, at);
  c.result({out_dtype(c, x.type.dtype), s});
}

// max.dim: (values, indices); only the values are mapped.
void max_dim(Ctx& c) {
  if (c.needs(1)) c.fail("the indices of max.dim (argmax) are not supported yet; only its values are");
  const Value& x = c.T("self");
  int d = c.dim("dim", x.type.shape.size());
  bool keep = c.v("keepdim").b;
  auto s = x.type.shape;
  if (keep) s[static_cast<std::size_t>(d)] = 1;
  else s.erase(s.begin() + d);
  Attrs at = {{"dims", "[" + std::to_string(d) + "]"}};
  if (keep) at.emplace_back("keepdim", "true");
  c.emit("ReduceMax", {x.ir}, {c.out(0)}, at);
  c.result(0, {x.type.dtype, s});
}

void softmax(Ctx& c) {
  const Value& x = c.T("self");
  int d = c.dim("dim", x.type.shape.size());
  c.emit("Softmax", {x.ir}, {c.out()}, {{"dim", std::to_string(d)}});
  c.result({out_dtype(c, x.type.dtype), x.type.shape});
}

void softmax_backward(Ctx& c) {
  const Value& dy = c.T("grad_output");
  const Value& y = c.T("output");
  int d = c.dim("dim", y.type.shape.size());
  c.emit("NormGrad", {dy.ir, y.ir}, {c.out()}, {{"of", "Softmax"}, {"dims", "[" + std::to_string(d) + "]"}});
  c.result({out_dtype(c, dy.type.dtype), dy.type.shape});
}

void layer_norm(Ctx& c) {
  if (c.needs(1) || c.needs(2)) c.fail("the mean and rstd results of native_layer_norm are not supported yet (they feed a hand-written backward)");
  const Value& x = c.T("input");
  auto ns = c.Is("normalized_shape");
  std::size_t r = x.type.shape.size();
  if (ns.size() > r) c.fail("normalized_shape has more dims than the input");
  std::vector<int> d;
  for (std::size_t i = r - ns.size(); i < r; ++i) d.push_back(static_cast<int>(i));
  std::vector<std::string> ins = {x.ir};
  if (c.has("weight")) ins.push_back(c.t("weight"));
  if (c.has("bias")) {
    if (!c.has("weight")) c.fail("layer norm with a bias and no weight is not supported");
    ins.push_back(c.t("bias"));
  }
  c.emit("LayerNorm", ins, {c.out(0)}, {{"dims", dims_text(d)}, {"eps", num_text(c.F("eps"))}});
  c.result(0, {x.type.dtype, x.type.shape});
}

// native_dropout: the value check assumes the ranks' masks are the sequential model's (docs/import.md), so the
// dropout is the identity on values; the mask is all ones.
void dropout(Ctx& c) {
  const Value& x = c.T("input");
  c.alias(0, x);
  if (c.needs(1)) {
    Value m;
    m.ir = c.full(x.type.shape, 1, "bool");
    m.type = {"bool", x.type.shape};
    c.alias(1, m);
  }
}

// ---- indexing ---------------------------------------------------------------------------------------

// self[indices]: one index tensor (embedding-style lookup), or [arange(0, n), idx] (a per-row pick, as a
// cross-entropy reads the target logit): one-hot of idx times self, summed.
void index(Ctx& c) {
  const Value& x = c.T("self");
  const PyVal& li = c.v("indices");
  if (!li.is_seq() || li.items.empty()) c.fail_at(li, "index expects a list of index tensors");
  std::vector<const Value*> idx;
  for (const auto& e : li.items) {
    if (e.k == PyVal::K::None) c.fail_at(e, "index with None (a skipped dim) is not supported yet");
    idx.push_back(&c.tensor_at(e));
  }
  if (idx.size() == 1 && idx[0]->type.dtype != "bool") {
    const Value& ids = *idx[0];
    auto s = ids.type.shape;
    for (std::size_t i = 1; i < x.type.shape.size(); ++i) s.push_back(x.type.shape[i]);
    if (x.type.shape.size() == 2) {
      c.emit("Embedding", {ids.ir, x.ir}, {c.out()});
    } else {
      std::string flat = c.tmp("f"), sel = c.tmp("s");
      c.emit("Reshape", {ids.ir}, {flat}, {{"shape", "[" + std::to_string(numel(ids.type.shape)) + "]"}});
      c.emit("IndexSelect", {x.ir, flat}, {sel}, {{"dim", "0"}});
      c.emit("Reshape", {sel}, {c.out()}, {{"shape", shape_text(s)}});
    }
    c.result({x.type.dtype, s});
    return;
  }
  if (idx.size() == 2 && x.type.shape.size() == 2 && idx[0]->arange0 && idx[0]->type.shape.size() == 1 && idx[0]->type.shape[0] == x.type.shape[0] &&
      idx[1]->type.shape == idx[0]->type.shape) {
    std::int64_t n = x.type.shape[0], v = x.type.shape[1];
    std::string col = c.tmp("i"), pos = c.tmp("v"), d = c.tmp("d"), ne = c.tmp("z"), oh = c.tmp("o"), pr = c.tmp("p");
    c.emit("Reshape", {idx[1]->ir}, {col}, {{"shape", "[" + std::to_string(n) + ", 1]"}});
    c.emit("Arange", {}, {pos}, {{"end", std::to_string(v)}});
    c.emit("Sub", {col, pos}, {d});
    c.emit("Cast", {d}, {ne}, {{"dtype", "bool"}});
    not_of(c, ne, oh);
    c.emit("Multiply", {x.ir, oh}, {pr});
    c.emit("Sum", {pr}, {c.out()}, {{"dims", "[1]"}});
    c.result({x.type.dtype, {n}});
    return;
  }
  c.fail("this form of index (" + std::to_string(idx.size()) + " index tensors into " + type_text(x.type) +
         ") is not supported yet: one index tensor, or [arange(0, n), idx] into a matrix");
}

// The mask of index_put / masked_fill broadcast against x: trailing dims of size 1 for an index_put mask.
std::string mask_for(Ctx& c, const Value& m, const Value& x, bool leading) {
  if (m.type.dtype != "bool") c.fail("the mask of " + c.node().target + " must be a bool tensor, got " + type_text(m.type));
  if (!leading || m.type.shape.size() == x.type.shape.size()) {
    broadcast_shape(m.type.shape, x.type.shape, c);
    return m.ir;
  }
  if (m.type.shape.size() > x.type.shape.size() || !std::equal(m.type.shape.begin(), m.type.shape.end(), x.type.shape.begin()))
    c.fail("the mask " + type_text(m.type) + " does not index the leading dims of " + type_text(x.type));
  auto s = m.type.shape;
  s.resize(x.type.shape.size(), 1);
  std::string r = c.tmp("m");
  c.emit("Reshape", {m.ir}, {r}, {{"shape", shape_text(s)}});
  return r;
}

// index_put(x, [mask], v): x with v where mask holds (a masked fill).
void index_put(Ctx& c) {
  const Value& x = c.T("self");
  bool acc = c.has("accumulate") && c.v("accumulate").b;
  const PyVal& li = c.v("indices");
  if (li.is_seq() && li.items.size() == 2 && x.type.shape.size() == 2) {  // x[arange(0, n), idx] = v (or += v): one element per row
    const Value& rows = c.tensor_at(li.items[0]);
    const Value& idx = c.tensor_at(li.items[1]);
    const Value& v = c.T("values");
    std::int64_t n = x.type.shape[0];
    if (rows.arange0 && rows.type.shape == std::vector<std::int64_t>{n} && idx.type.shape == rows.type.shape && (v.type.shape.empty() || v.type.shape == rows.type.shape)) {
      std::string col = c.tmp("i"), pos = c.tmp("v"), d = c.tmp("d"), ne = c.tmp("z"), oh = c.tmp("o"), vc = v.ir;
      c.emit("Reshape", {idx.ir}, {col}, {{"shape", "[" + std::to_string(n) + ", 1]"}});
      c.emit("Arange", {}, {pos}, {{"end", std::to_string(x.type.shape[1])}});
      c.emit("Sub", {col, pos}, {d});
      c.emit("Cast", {d}, {ne}, {{"dtype", "bool"}});
      not_of(c, ne, oh);
      if (!v.type.shape.empty()) {
        vc = c.tmp("c");
        c.emit("Reshape", {v.ir}, {vc}, {{"shape", "[" + std::to_string(n) + ", 1]"}});
      }
      if (acc) {  // the rows differ, so accumulating adds v once at each row's element
        std::string add = c.tmp("a");
        c.emit("Multiply", {oh, vc}, {add});
        c.emit("Add", {x.ir, add}, {c.out()});
      } else {
        c.emit("Where", {oh, vc, x.ir}, {c.out()});
      }
      c.result({x.type.dtype, x.type.shape});
      return;
    }
  }
  if (acc) c.fail("index_put with accumulate=True is supported for [arange(0, n), idx] into a matrix only");
  if (!li.is_seq() || li.items.size() != 1) c.fail_at(li, "index_put with " + std::to_string(li.items.size()) + " index tensors is not supported yet (one bool mask, or [arange(0, n), idx] into a matrix, is)");
  const Value& m = c.tensor_at(li.items[0]);
  std::string mask = mask_for(c, m, x, true);
  const Value& v = c.T("values");
  broadcast_shape(v.type.shape, x.type.shape, c);
  c.emit("Where", {mask, v.ir, x.ir}, {c.out()});
  c.result({x.type.dtype, x.type.shape});
}

void masked_fill(Ctx& c) {
  const Value& x = c.T("self");
  const Value& m = c.T("mask");
  std::string mask = mask_for(c, m, x, false);
  std::string val = c.is_tensor("value") ? c.t("value") : c.full({}, c.F("value"), x.type.dtype);
  c.emit("Where", {mask, val, x.ir}, {c.out()});
  c.result({x.type.dtype, broadcast_shape(m.type.shape, x.type.shape, c)});
}

struct Range {
  std::string start, end;
  std::int64_t len = 0;
  bool whole = false;
};

// slice's (start, end) on a dim of size n: None and out-of-range ends clamp as Python does.
Range slice_range(Ctx& c, std::int64_t n) {
  if (c.has("step") && c.I("step") != 1) c.fail("slice with a step other than 1 is not supported yet");
  Range r;
  const PyVal* s = c.has("start") ? &c.v("start") : nullptr;
  const PyVal* e = c.has("end") ? &c.v("end") : nullptr;
  if ((s && !s->expr.empty()) || (e && !e->expr.empty())) {  // rank-varying offsets (local view)
    if (!s || !e || s->k != PyVal::K::Int || e->k != PyVal::K::Int || e->i - s->i <= 0 || s->i < 0 || e->i > n)
      c.rank_varying("a rank-varying slice needs both bounds in range");
    r.start = c.size("start"), r.end = c.size("end"), r.len = e->i - s->i;
    return r;
  }
  std::int64_t a = s ? c.I("start") : 0, b = e ? c.I("end") : n;
  if (a < 0) a += n;
  if (b < 0) b += n;
  a = std::clamp<std::int64_t>(a, 0, n), b = std::clamp<std::int64_t>(b, a, n);
  r.start = std::to_string(a), r.end = std::to_string(b), r.len = b - a, r.whole = a == 0 && b == n;
  return r;
}

void slice(Ctx& c) {
  const Value& x = c.T("self");
  int d = c.dim("dim", x.type.shape.size());
  Range r = slice_range(c, x.type.shape[static_cast<std::size_t>(d)]);
  if (r.whole) return c.alias(0, x);
  auto s = x.type.shape;
  s[static_cast<std::size_t>(d)] = r.len;
  c.emit("Slice", {x.ir}, {c.out()}, {{"dim", std::to_string(d)}, {"start", r.start}, {"end", r.end}});
  c.result({x.type.dtype, s});
}

// slice_scatter(x, src, dim, start, end): x with src written over [start, end) of dim.
void slice_scatter(Ctx& c) {
  const Value& x = c.T("self");
  const Value& src = c.T("src");
  int d = c.dim("dim", x.type.shape.size());
  auto du = static_cast<std::size_t>(d);
  std::int64_t n = x.type.shape[du];
  Range r = slice_range(c, n);
  auto want = x.type.shape;
  want[du] = r.len;
  if (src.type.shape != want) c.fail("slice_scatter's source " + type_text(src.type) + " does not fill [" + r.start + ", " + r.end + ") of " + type_text(x.type));
  if (r.whole) return c.alias(0, src);
  if (r.start != std::to_string(std::stoll(r.start)) || r.end != std::to_string(std::stoll(r.end)))
    c.rank_varying("slice_scatter at rank-varying offsets");
  std::vector<std::string> parts;
  std::int64_t a = std::stoll(r.start), b = std::stoll(r.end);
  if (a > 0) {
    parts.push_back(c.tmp("l"));
    c.emit("Slice", {x.ir}, {parts.back()}, {{"dim", std::to_string(d)}, {"start", "0"}, {"end", std::to_string(a)}});
  }
  parts.push_back(src.ir);
  if (b < n) {
    parts.push_back(c.tmp("r"));
    c.emit("Slice", {x.ir}, {parts.back()}, {{"dim", std::to_string(d)}, {"start", std::to_string(b)}, {"end", std::to_string(n)}});
  }
  c.emit("Concat", parts, {c.out()}, {{"dim", std::to_string(d)}});
  c.result({x.type.dtype, x.type.shape});
}

void select(Ctx& c) {
  const Value& x = c.T("self");
  int d = c.dim("dim", x.type.shape.size());
  std::int64_t n = x.type.shape[static_cast<std::size_t>(d)], i = c.I("index");
  if (i < 0) i += n;
  if (i < 0 || i >= n) c.fail("select index out of range");
  std::string s = c.tmp("s");
  c.emit("Slice", {x.ir}, {s}, {{"dim", std::to_string(d)}, {"start", std::to_string(i)}, {"end", std::to_string(i + 1)}});
  auto shape = x.type.shape;
  shape.erase(shape.begin() + d);
  c.emit("Reshape", {s}, {c.out()}, {{"shape", shape_text(shape)}});
  c.result({x.type.dtype, shape});
}

void split(Ctx& c, bool sizes) {
  const Value& x = c.T("self");
  int d = c.dim("dim", x.type.shape.size());
  std::int64_t n = x.type.shape[static_cast<std::size_t>(d)];
  std::vector<std::int64_t> ps;
  if (sizes) {
    ps = c.Is("split_sizes");
  } else {
    std::int64_t k = c.I("split_size");
    if (k <= 0) c.fail("split size must be positive");
    for (std::int64_t a = 0; a < n; a += k) ps.push_back(std::min(k, n - a));
  }
  if (std::accumulate(ps.begin(), ps.end(), std::int64_t{0}) != n) c.fail("split sizes " + ints_text(ps) + " do not add up to the dim's " + std::to_string(n));
  if (ps.size() > 8) c.fail("a split into more than 8 pieces is not supported yet");
  std::vector<std::string> outs;
  for (std::size_t k = 0; k < ps.size(); ++k) outs.push_back(c.out(k));
  if (ps.size() == 1) {
    c.alias(0, x);
    return;
  }
  c.emit("Split", {x.ir}, outs, {{"dim", std::to_string(d)}, {"sizes", ints_text(ps)}});
  for (std::size_t k = 0; k < ps.size(); ++k) {
    auto s = x.type.shape;
    s[static_cast<std::size_t>(d)] = ps[k];
    c.result(k, {x.type.dtype, s});
  }
}

void cat(Ctx& c, bool stack) {
  const PyVal& l = c.v("tensors");
  if (!l.is_seq() || l.items.empty()) c.fail_at(l, "cat/stack expects a non-empty list of tensors");
  std::vector<const Value*> xs;
  for (const auto& e : l.items) xs.push_back(&c.tensor_at(e));
  std::size_t r = xs[0]->type.shape.size();
  int d = c.dim("dim", stack ? r + 1 : r);
  auto s = xs[0]->type.shape;
  if (stack) s.insert(s.begin() + d, static_cast<std::int64_t>(xs.size()));
  for (std::size_t k = 1; k < xs.size(); ++k) {
    auto a = xs[k]->type.shape;
    if (a.size() != r) c.fail("cat/stack of tensors of different ranks");
    for (std::size_t i = 0; i < r; ++i)
      if (a[i] != xs[0]->type.shape[i] && (stack || static_cast<int>(i) != d)) c.fail("cat/stack of tensors whose shapes differ off the joined dim");
    if (!stack) s[static_cast<std::size_t>(d)] += a[static_cast<std::size_t>(d)];
  }
  if (xs.size() == 1 && !stack) return c.alias(0, *xs[0]);
  // more than 8 pieces: joined 8 at a time (cat is associative)
  std::vector<std::string> names;
  for (auto* x : xs) names.push_back(x->ir);
  const char* op = stack ? "Stack" : "Concat";
  if (stack && names.size() > 8) c.fail("stack of more than 8 tensors is not supported yet");
  while (names.size() > 8) {
    std::string t = c.tmp("j");
    c.emit(op, std::vector<std::string>(names.begin(), names.begin() + 8), {t}, {{"dim", std::to_string(d)}});
    names.erase(names.begin(), names.begin() + 8);
    names.insert(names.begin(), t);
  }
  c.emit(op, names, {c.out()}, {{"dim", std::to_string(d)}});
  c.result({xs[0]->type.dtype, s});
}

void embedding(Ctx& c) {
  const Value& w = c.T("weight");
  const Value& ids = c.T("indices");
  if (w.type.shape.size() != 2) c.fail("embedding weight must be a matrix, got " + type_text(w.type));
  auto s = ids.type.shape;
  s.push_back(w.type.shape[1]);
  c.emit("Embedding", {ids.ir, w.ir}, {c.out()});
  c.result({w.type.dtype, s});
}

void embedding_backward(Ctx& c) {
  const Value& dy = c.T("grad_output");
  const Value& ids = c.T("indices");
  if (c.has("scale_grad_by_freq") && c.v("scale_grad_by_freq").b) c.fail("embedding_dense_backward with scale_grad_by_freq is not supported yet");
  if (c.I("padding_idx") != -1) c.fail("embedding_dense_backward with a padding_idx is not supported yet");
  std::int64_t rows = c.I("num_weights"), h = dy.type.shape.empty() ? 0 : dy.type.shape.back();
  std::string w = c.full({rows, h}, 0, dy.type.dtype);  // the table's shape, read for its layout only
  c.emit("EmbeddingGrad", {dy.ir, ids.ir, w}, {c.out()});
  c.result({dy.type.dtype, {rows, h}});
}

// ---- constants ------------------------------------------------------------------------------------

std::string dtype_kw(Ctx& c, const std::string& dflt) {
  if (const TensorType* a = c.annotated()) return a->dtype;
  return dflt;
}

void constant(Ctx& c, std::string_view size_param, std::optional<double> value, std::string_view value_param) {
  std::vector<std::int64_t> s;
  if (size_param == "like") s = c.ty("self").shape;
  else s = c.Is(size_param);
  double v = value ? *value : c.F(value_param);
  std::string dt = dtype_kw(c, size_param == "like" ? c.ty("self").dtype : "f32");
  c.emit("Full", {}, {c.out()}, {{"shape", shape_text(s)}, {"value", num_text(v)}, {"dtype", dt}});
  c.result({dt, s});
  if (s.empty()) c.set_scalar(0, v);
}

void arange(Ctx& c, bool has_start) {
  if (c.is_param("step") && c.has("step") && c.I("step") != 1) c.fail("arange with a step other than 1 is not supported yet");
  std::string start = has_start ? c.size("start") : "0", end = c.size("end");
  const PyVal& e = c.v("end");
  std::int64_t len = e.i - (has_start ? c.v("start").i : 0);
  if (len < 0) c.fail("arange with end before start");
  Attrs at = {{"end", end}};
  if (start != "0") at.emplace(at.begin(), "start", start);
  std::string dt = dtype_kw(c, "i64");
  at.emplace_back("dtype", dt);
  c.emit("Arange", {}, {c.out()}, at);
  c.result({dt, {len}});
  if (start == "0") c.set_arange0(0);
}

// ---- activations and their gradients --------------------------------------------------------------

void gelu(Ctx& c, bool grad) {
  if (c.has("approximate") && c.S("approximate") != "none") c.fail("gelu with approximate='" + c.S("approximate") + "' is not supported yet (only the exact erf form)");
  if (!grad) return unary(c, "GELU");
  const Value& dy = c.T("grad_output");
  const Value& x = c.T("self");
  c.emit("PointwiseGrad", {dy.ir, x.ir}, {c.out()}, {{"of", "GELU"}});
  c.result({dy.type.dtype, broadcast_shape(dy.type.shape, x.type.shape, c)});
}

void sigmoid(Ctx& c) {
  const Value& x = c.T("self");
  sigmoid_of(c, x, c.out());
  c.result({x.type.dtype, x.type.shape});
}

// sigmoid_backward(dy, y) = dy * y * (1 - y)
void sigmoid_backward(Ctx& c) {
  const Value& dy = c.T("grad_output");
  const Value& y = c.T("output");
  std::string om = c.tmp("o"), p = c.tmp("p");
  not_of(c, y.ir, om);
  c.emit("Multiply", {y.ir, om}, {p});
  c.emit("Multiply", {dy.ir, p}, {c.out()});
  c.result({dy.type.dtype, broadcast_shape(dy.type.shape, y.type.shape, c)});
}

void pow_scalar(Ctx& c) {
  const Value& x = c.T("self");
  double e = c.F("exponent");
  if (e == 1) return c.alias(0, x);
  if (e == 2) c.emit("Multiply", {x.ir, x.ir}, {c.out()});
  else if (e == 0.5) c.emit("Sqrt", {x.ir}, {c.out()});
  else if (e == -0.5) c.emit("Rsqrt", {x.ir}, {c.out()});
  else c.fail("pow with exponent " + num_text(e) + " is not supported yet (1, 2, 0.5 and -0.5 are)");
  c.result({x.type.dtype, x.type.shape});
}

void where(Ctx& c) {
  const Value& m = c.T("condition");
  Operand a = operand(c, "self", "f32"), b = operand(c, "other", "f32");
  std::string at = a.t.empty() ? c.full({}, *a.num, b.dtype) : a.t, bt = b.t.empty() ? c.full({}, *b.num, a.dtype) : b.t;
  c.emit("Where", {m.ir, at, bt}, {c.out()});
  auto s = broadcast_shape(m.type.shape, broadcast_shape(a.shape, b.shape, c), c);
  c.result({a.t.empty() ? b.dtype : a.dtype, s});
}

// ---- collectives: issued asynchronously, completed by wait_tensor ----------------------------------

std::string reduce_of(Ctx& c, const std::string& op) {
  if (op == "sum" || op == "avg" || op == "max" || op == "min") return op;
  if (op == "SUM" || op == "AVG" || op == "MAX" || op == "MIN") {
    std::string s = op;
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  }
  c.fail("unsupported reduction '" + op + "' (sum, avg, max and min are)");
}

void collective(Ctx& c, const std::string& op, Attrs at, std::vector<std::int64_t> shape) {
  const Value& x = c.T("input");
  std::string h = "h_" + c.out();
  at.emplace(at.begin(), "axis", c.axis_of_group(c.v("group_name")));
  at.emplace_back("handle", h);
  c.emit(op, {x.ir}, {c.out()}, at);
  c.result({x.type.dtype, shape});
  c.set_handle(0, h);
}

void all_reduce(Ctx& c) { collective(c, "AllReduce", {{"reduce", reduce_of(c, c.S("reduce_op"))}}, c.ty("input").shape); }
void all_gather(Ctx& c) {
  auto s = c.ty("input").shape;
  if (s.empty()) c.fail("all_gather_into_tensor of a 0-d tensor");
  s[0] *= c.I("group_size");
  collective(c, "AllGather", {{"dim", "0"}}, s);
}
void reduce_scatter(Ctx& c) {
  auto s = c.ty("input").shape;
  std::int64_t n = c.I("group_size");
  if (s.empty() || n <= 0 || s[0] % n) c.fail("reduce_scatter_tensor of dim 0 of size " + (s.empty() ? std::string("-") : std::to_string(s[0])) + " over " + std::to_string(n) + " ranks");
  s[0] /= n;
  collective(c, "ReduceScatter", {{"dim", "0"}, {"reduce", reduce_of(c, c.S("reduce_op"))}}, s);
}
void broadcast(Ctx& c) { collective(c, "Broadcast", {{"src", std::to_string(c.I("src"))}}, c.ty("input").shape); }

void wait_tensor(Ctx& c) {
  const Value& x = c.T("tensor");
  if (!x.handle.empty()) c.emit("Wait", {}, {}, {{"handle", x.handle}});
  Value v = x;
  v.handle.clear();
  c.alias(0, v);
}

void sym_size(Ctx& c) {
  const Value& x = c.T("self");
  int d = c.dim("dim", x.type.shape.size());
  c.set_int(0, x.type.shape[static_cast<std::size_t>(d)]);
}

// auto_functionalized(op, **kwargs): a mutating custom op made functional; lowered by the custom table when the
// op leaves its arguments unchanged (a logging op): element 0 is its result (none), the rest are the bases.
void auto_functionalized(Ctx& c);

const Row kRows[] = {
    // views and copies
    {"aten.view.default", "self, size", view},
    {"aten._unsafe_view.default", "self, size", view},
    {"aten.reshape.default", "self, shape", [](Ctx& c) {
       const Value& x = c.T("self");
       reshape_to(c, x, resolve_shape(c, c.Is("shape"), numel(x.type.shape)));
     }},
    {"aten.t.default", "self", [](Ctx& c) {
       const Value& x = c.T("self");
       if (x.type.shape.size() < 2) return c.alias(0, x);
       transpose(c, x, 0, 1, c.out());
       c.result({x.type.dtype, {x.type.shape[1], x.type.shape[0]}});
     }},
    {"aten.transpose.int", "self, dim0, dim1", [](Ctx& c) {
       const Value& x = c.T("self");
       int a = c.dim("dim0", x.type.shape.size()), b = c.dim("dim1", x.type.shape.size());
       if (a == b) return c.alias(0, x);
       auto s = x.type.shape;
       std::swap(s[static_cast<std::size_t>(a)], s[static_cast<std::size_t>(b)]);
       transpose(c, x, a, b, c.out());
       c.result({x.type.dtype, s});
     }},
    {"aten.permute.default", "self, dims", permute},
    {"aten.expand.default", "self, size, *, implicit=False", expand},
    {"aten.unsqueeze.default", "self, dim", unsqueeze},
    {"aten.squeeze.dim", "self, dim", [](Ctx& c) { squeeze(c, false); }},
    {"aten.squeeze.dims", "self, dim", [](Ctx& c) { squeeze(c, false); }},
    {"aten.squeeze.default", "self", [](Ctx& c) { squeeze(c, true); }},
    {"aten.clone.default", "self, *, memory_format=None", identity},
    {"aten.detach.default", "self", identity},
    {"aten.alias.default", "self", identity},
    {"aten.lift_fresh_copy.default", "self", identity},
    {"aten._to_copy.default", "self, *, dtype=None", identity},
    {"aten.copy.default", "self, src, non_blocking=False", copy},
    // contractions
    {"aten.mm.default", "self, mat2", mm},
    {"aten.bmm.default", "self, mat2", mm},
    {"aten.addmm.default", "self, mat1, mat2, *, beta=1, alpha=1", [](Ctx& c) { addmm(c, "mat1", "mat2"); }},
    {"aten.baddbmm.default", "self, batch1, batch2, *, beta=1, alpha=1", [](Ctx& c) { addmm(c, "batch1", "batch2"); }},
    // elementwise
    {"aten.add.Tensor", "self, other, *, alpha=1", [](Ctx& c) { arith(c, "Add", true, true); }},
    {"aten.add.Scalar", "self, other, alpha=1", [](Ctx& c) { arith(c, "Add", true, true); }},
    {"aten.sub.Tensor", "self, other, *, alpha=1", [](Ctx& c) { arith(c, "Sub", false, true); }},
    {"aten.sub.Scalar", "self, other, alpha=1", [](Ctx& c) { arith(c, "Sub", false, true); }},
    {"aten.rsub.Scalar", "other, self, alpha=1", [](Ctx& c) { arith(c, "Sub", false, true); }},
    {"aten.rsub.Tensor", "other, self, *, alpha=1", [](Ctx& c) { arith(c, "Sub", false, true); }},
    {"aten.mul.Tensor", "self, other", [](Ctx& c) { arith(c, "Multiply", true, false); }},
    {"aten.mul.Scalar", "self, other", [](Ctx& c) { arith(c, "Multiply", true, false); }},
    {"aten.div.Tensor", "self, other", [](Ctx& c) { arith(c, "Div", false, false); }},
    {"aten.div.Scalar", "self, other", [](Ctx& c) { arith(c, "Div", false, false); }},
    {"aten.div.Tensor_mode", "self, other, *, rounding_mode=None", [](Ctx& c) { arith(c, "Div", false, false); }},
    {"aten.maximum.default", "self, other", [](Ctx& c) { arith(c, "Maximum", true, false); }},
    {"aten.minimum.default", "self, other", [](Ctx& c) { arith(c, "Minimum", true, false); }},
    {"aten.neg.default", "self", [](Ctx& c) { unary(c, "Neg"); }},
    {"aten.exp.default", "self", [](Ctx& c) { unary(c, "Exp"); }},
    {"aten.log.default", "self", [](Ctx& c) { unary(c, "Log"); }},
    {"aten.sqrt.default", "self", [](Ctx& c) { unary(c, "Sqrt"); }},
    {"aten.rsqrt.default", "self", [](Ctx& c) { unary(c, "Rsqrt"); }},
    {"aten.relu.default", "self", [](Ctx& c) { unary(c, "ReLU"); }},
    {"aten.silu.default", "self", [](Ctx& c) { unary(c, "SiLU"); }},
    {"aten.gelu.default", "self, *, approximate='none'", [](Ctx& c) { gelu(c, false); }},
    {"aten.gelu_backward.default", "grad_output, self, *, approximate='none'", [](Ctx& c) { gelu(c, true); }},
    {"aten.sigmoid.default", "self", sigmoid},
    {"aten.reciprocal.default", "self", [](Ctx& c) {
       const Value& x = c.T("self");
       c.emit("Div", {c.full({}, 1, x.type.dtype), x.ir}, {c.out()});
       c.result({x.type.dtype, x.type.shape});
     }},
    {"aten.sigmoid_backward.default", "grad_output, output", sigmoid_backward},
    {"aten.pow.Tensor_Scalar", "self, exponent", pow_scalar},
    {"aten.where.self", "condition, self, other", where},
    {"aten.lt.Scalar", "self, other", [](Ctx& c) { compare(c, "lt"); }},
    {"aten.lt.Tensor", "self, other", [](Ctx& c) { compare(c, "lt"); }},
    {"aten.le.Scalar", "self, other", [](Ctx& c) { compare(c, "le"); }},
    {"aten.le.Tensor", "self, other", [](Ctx& c) { compare(c, "le"); }},
    {"aten.gt.Scalar", "self, other", [](Ctx& c) { compare(c, "gt"); }},
    {"aten.gt.Tensor", "self, other", [](Ctx& c) { compare(c, "gt"); }},
    {"aten.ge.Scalar", "self, other", [](Ctx& c) { compare(c, "ge"); }},
    {"aten.ge.Tensor", "self, other", [](Ctx& c) { compare(c, "ge"); }},
    {"aten.eq.Scalar", "self, other", [](Ctx& c) { compare(c, "eq"); }},
    {"aten.eq.Tensor", "self, other", [](Ctx& c) { compare(c, "eq"); }},
    {"aten.ne.Scalar", "self, other", [](Ctx& c) { compare(c, "ne"); }},
    {"aten.ne.Tensor", "self, other", [](Ctx& c) { compare(c, "ne"); }},
    {"aten.bitwise_or.Tensor", "self, other", [](Ctx& c) { logical(c, "or"); }},
    {"aten.logical_or.default", "self, other", [](Ctx& c) { logical(c, "or"); }},
    {"aten.bitwise_and.Tensor", "self, other", [](Ctx& c) { logical(c, "and"); }},
    {"aten.logical_and.default", "self, other", [](Ctx& c) { logical(c, "and"); }},
    {"aten.bitwise_not.default", "self", [](Ctx& c) { logical(c, "not"); }},
    {"aten.logical_not.default", "self", [](Ctx& c) { logical(c, "not"); }},
    // normalization, softmax, dropout
    {"aten._softmax.default", "self, dim, half_to_float", softmax},
    {"aten._softmax_backward_data.default", "grad_output, output, dim, input_dtype", softmax_backward},
    {"aten.native_layer_norm.default", "input, normalized_shape, weight, bias, eps", layer_norm},
    {"aten.native_dropout.default", "input, p, train", dropout},
    {"aten.native_dropout_backward.default", "grad_output, mask, scale", [](Ctx& c) { c.alias(0, c.T("grad_output")); }},
    // reductions
    {"aten.sum.dim_IntList", "self, dim, keepdim=False, *, dtype=None", [](Ctx& c) { reduce(c, "Sum", false); }},
    {"aten.sum.default", "self, *, dtype=None", [](Ctx& c) { reduce(c, "Sum", true); }},
    {"aten.mean.dim", "self, dim, keepdim=False, *, dtype=None", [](Ctx& c) { reduce(c, "Mean", false); }},
    {"aten.mean.default", "self, *, dtype=None", [](Ctx& c) { reduce(c, "Mean", true); }},
    {"aten.amax.default", "self, dim=[], keepdim=False", [](Ctx& c) { reduce(c, "ReduceMax", false); }},
    {"aten.amin.default", "self, dim=[], keepdim=False", [](Ctx& c) { reduce(c, "ReduceMin", false); }},
    {"aten.max.dim", "self, dim, keepdim=False", max_dim},
    // indexing, slicing, joining
    {"aten.embedding.default", "weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False", embedding},
    {"aten.embedding_dense_backward.default", "grad_output, indices, num_weights, padding_idx, scale_grad_by_freq", embedding_backward},
    {"aten.index.Tensor", "self, indices", index},
    {"aten.index_put.default", "self, indices, values, accumulate=False", index_put},
    {"aten.masked_fill.Scalar", "self, mask, value", masked_fill},
    {"aten.masked_fill.Tensor", "self, mask, value", masked_fill},
    {"aten.slice.Tensor", "self, dim=0, start=None, end=None, step=1", slice},
    {"aten.slice_scatter.default", "self, src, dim=0, start=None, end=None, step=1", slice_scatter},
    {"aten.select.int", "self, dim, index", select},
    {"aten.split_with_sizes.default", "self, split_sizes, dim=0", [](Ctx& c) { split(c, true); }},
    {"aten.split.Tensor", "self, split_size, dim=0", [](Ctx& c) { split(c, false); }},
    {"aten.cat.default", "tensors, dim=0", [](Ctx& c) { cat(c, false); }},
    {"aten.stack.default", "tensors, dim=0", [](Ctx& c) { cat(c, true); }},
    // constants and positions
    {"aten.zeros.default", "size, *, dtype=None", [](Ctx& c) { constant(c, "size", 0.0, ""); }},
    {"aten.ones.default", "size, *, dtype=None", [](Ctx& c) { constant(c, "size", 1.0, ""); }},
    {"aten.full.default", "size, fill_value, *, dtype=None", [](Ctx& c) { constant(c, "size", std::nullopt, "fill_value"); }},
    {"aten.empty.memory_format", "size, *, dtype=None", [](Ctx& c) { constant(c, "size", 0.0, ""); }},
    {"aten.new_zeros.default", "self, size, *, dtype=None", [](Ctx& c) { constant(c, "size", 0.0, ""); }},
    {"aten.new_ones.default", "self, size, *, dtype=None", [](Ctx& c) { constant(c, "size", 1.0, ""); }},
    {"aten.new_empty.default", "self, size, *, dtype=None", [](Ctx& c) { constant(c, "size", 0.0, ""); }},
    {"aten.new_empty_strided.default", "self, size, stride, *, dtype=None", [](Ctx& c) { constant(c, "size", 0.0, ""); }},
    {"aten.zeros_like.default", "self, *, dtype=None", [](Ctx& c) { constant(c, "like", 0.0, ""); }},
    {"aten.ones_like.default", "self, *, dtype=None", [](Ctx& c) { constant(c, "like", 1.0, ""); }},
    {"aten.empty_like.default", "self, *, dtype=None", [](Ctx& c) { constant(c, "like", 0.0, ""); }},
    {"aten.full_like.default", "self, fill_value, *, dtype=None", [](Ctx& c) { constant(c, "like", std::nullopt, "fill_value"); }},
    {"aten.scalar_tensor.default", "s, *, dtype=None", [](Ctx& c) {
       std::string dt = dtype_kw(c, "f32");
       c.emit("Full", {}, {c.out()}, {{"shape", "[]"}, {"value", num_text(c.F("s"))}, {"dtype", dt}});
       c.result({dt, {}});
       c.set_scalar(0, c.F("s"));
     }},
    {"aten.arange.start", "start, end, *, dtype=None", [](Ctx& c) { arange(c, true); }},
    {"aten.arange.start_step", "start, end, step=1, *, dtype=None", [](Ctx& c) { arange(c, true); }},
    {"aten.arange.default", "end, *, dtype=None", [](Ctx& c) { arange(c, false); }},
    {"aten.sym_size.int", "self, dim", sym_size},
    // collectives
    {"_c10d_functional.all_reduce.default", "input, reduce_op, group_name", all_reduce},
    {"_c10d_functional.all_gather_into_tensor.default", "input, group_size, group_name", all_gather},
    {"_c10d_functional.reduce_scatter_tensor.default", "input, reduce_op, group_size, group_name", reduce_scatter},
    {"_c10d_functional.broadcast.default", "input, src, group_name", broadcast},
    {"_c10d_functional.wait_tensor.default", "tensor", wait_tensor},
    {"higher_order.auto_functionalized", "_mutable_op, **", auto_functionalized},
    {"higher_order.auto_functionalized_v2", "_mutable_op, **", auto_functionalized},
};

void auto_functionalized(Ctx& c) {
  const PyVal& op = c.v("_mutable_op");
  std::string target = op.s.rfind("torch.ops.", 0) == 0 ? op.s.substr(10) : op.s;
  // element 0 is the op's own result (none for an op that only mutates); the others are the updated bases
  std::vector<std::string> bases;
  const PyVal* all = c.node().kwarg("_all_bases");
  if (!all) c.fail("auto_functionalized of " + target + " without _all_bases is not supported yet");
  if (!custom_op_is_identity(c, target)) c.fail("auto_functionalized of '" + target + "': only mutating ops that leave their arguments unchanged (`identity: true` in a mapping file) are supported");
  for (std::size_t k = 0; k < all->items.size(); ++k) {
    const Value& b = c.tensor_at(all->items[k]);
    if (c.needs(k + 1)) c.alias(k + 1, b);
  }
}

}  // namespace

std::span<const Row> aten_rows() { return kRows; }

}  // namespace spmd::frontends
