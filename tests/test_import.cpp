// tests/test_import.cpp - the frontends (docs/import.md): small FX and HLO texts written here for the mapped ops
// and every error path, imported and checked as `spmdcheck check SEQ_DIR RANKS_DIR` does. Most cases are pairs
// of two formulations of one computation (the sequential graph in one form, the ranks' in another), so a wrong
// mapping of either op shows up as a value-mismatch; the corpus of docs/import.md is in test_import_corpus.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/driver.h"
#include "frontends/frontends.h"
#include "ir/loader.h"

#include "tests/helpers.h"

using namespace spmd;

namespace {

namespace fs = std::filesystem;

using test::Run;
using test::run;

std::string base() { return std::string(SPMD_BINARY_DIR) + "/import-tests/"; }

// A GraphModule.print_readable() text: `sig` the typed parameters, `body` one node per line (each gets a
// `# File: /m.py:<line>` comment, line = 100 + its index), `ret` the returned names.
std::string fx(const std::string& sig, const std::vector<std::string>& body, const std::string& ret) {
  std::string s = "import torch\n\nclass GraphModule(torch.nn.Module):\n    def forward(self, " + sig + "):\n";
  for (std::size_t i = 0; i < body.size(); ++i)
    s += "        # File: /m.py:" + std::to_string(100 + i) + " in forward, code: ...\n        " + body[i] + "\n";
  return s + "        return [" + ret + "]\n";
}

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

// Writes case `name`: the sequential graph and one graph per rank; returns {seq_dir, ranks_dir}.
std::pair<std::string, std::string> graphs(const std::string& name, const std::string& seq, const std::vector<std::string>& ranks) {
  std::string d = base() + name;
  fs::remove_all(d);
  write(d + "/seq/fw.g0.r0.py", seq);
  for (std::size_t r = 0; r < ranks.size(); ++r) write(d + "/ranks/fw.g0.r" + std::to_string(r) + ".py", ranks[r]);
  return {d + "/seq", d + "/ranks"};
}

Run check(const std::string& name, const std::string& seq, const std::vector<std::string>& ranks, std::vector<std::string> extra = {}) {
  auto [s, r] = graphs(name, seq, ranks);
  std::vector<std::string> args = {"check", s, r};
  args.insert(args.end(), extra.begin(), extra.end());
  return run(args);
}

// The same text on every rank.
std::vector<std::string> same(const std::string& t, int n) { return std::vector<std::string>(static_cast<std::size_t>(n), t); }

bool has(const Run& r, const std::string& s) { return r.out.find(s) != std::string::npos; }

std::string relation(const std::string& name, const std::string& text) {
  std::string p = base() + name + ".relation.yaml";
  write(p, text);
  return p;
}

// The column- then row-parallel MLP of a tensor-parallel layer.
const std::string kMlpSeq = fx(R"(w1: "f32[16, 8]", w2: "f32[8, 16]", x: "f32[4, 8]")",
                               {R"(t: "f32[8, 16]" = torch.ops.aten.t.default(w1))", R"(mm: "f32[4, 16]" = torch.ops.aten.mm.default(x, t))",
                                R"(gelu: "f32[4, 16]" = torch.ops.aten.gelu.default(mm))", R"(t_1: "f32[16, 8]" = torch.ops.aten.t.default(w2))",
                                R"(mm_1: "f32[4, 8]" = torch.ops.aten.mm.default(gelu, t_1))"},
                               "mm_1");

std::string mlp_rank(bool reduce, bool wait_late = false) {
  std::vector<std::string> b = {R"(t: "f32[8, 8]" = torch.ops.aten.t.default(w1))", R"(mm: "f32[4, 8]" = torch.ops.aten.mm.default(x, t))",
                                R"(gelu: "f32[4, 8]" = torch.ops.aten.gelu.default(mm))", R"(t_1: "f32[8, 8]" = torch.ops.aten.t.default(w2))",
                                R"(mm_1: "f32[4, 8]" = torch.ops.aten.mm.default(gelu, t_1))"};
  if (!reduce) return fx(R"(w1: "f32[8, 8]", w2: "f32[8, 8]", x: "f32[4, 8]")", b, "mm_1");
  b.push_back(R"(all_reduce: "f32[4, 8]" = torch.ops._c10d_functional.all_reduce.default(mm_1, 'sum', '0'))");
  if (wait_late) b.push_back(R"(neg: "f32[4, 8]" = torch.ops.aten.neg.default(all_reduce))");
  b.push_back(R"(wait_tensor: "f32[4, 8]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce))");
  return fx(R"(w1: "f32[8, 8]", w2: "f32[8, 8]", x: "f32[4, 8]")", b, wait_late ? "wait_tensor, neg" : "wait_tensor");
}

}  // namespace

TEST_CASE("import: a tensor-parallel MLP is proved equivalent; placements are inferred from the shapes") {
  Run r = check("mlp", kMlpSeq, same(mlp_rank(true), 2));
  CHECK(r.code == 0);
  CHECK(r.out.empty());
  auto [s, k] = graphs("mlp_yaml", kMlpSeq, same(mlp_rank(true), 2));
  auto imp = frontends::import_program({"fx", s, k, "", {}, ""});
  CHECK(imp.local_view);
  CHECK(imp.yaml.find("w1: {shape: [s16, s8], dtype: f32, placement: {tp: S(0)}}") != std::string::npos);
  CHECK(imp.yaml.find("w2: {shape: [s8_2, s16], dtype: f32, placement: {tp: S(1)}}") != std::string::npos);
  CHECK(imp.yaml.find("{op: AllReduce, in: mm_1, out: all_reduce, axis: tp, reduce: sum, handle: h_all_reduce") != std::string::npos);
  Program p = load_program_string(imp.yaml, "mlp.yaml");  // an ordinary program
  CHECK(p.local_view);
  CHECK(p.has_spec);
}

TEST_CASE("import: a graph that returns pytree.tree_unflatten([...], self._out_spec) (a heap-use-after-free under ASan before)") {
  auto unflatten = [](std::string g) {
    auto at = g.rfind("return [");
    auto end = g.find("]\n", at);
    return g.substr(0, at) + "return pytree.tree_unflatten([" + g.substr(at + 8, end - at - 8) + ", None, None, None], self._out_spec)\n";
  };
  std::string seq = unflatten(fx(R"(x: "f32[4, 8]")", {R"(y: "f32[4, 8]" = torch.ops.aten.neg.default(x))"}, "y"));
  std::string rank = unflatten(fx(R"(x: "f32[4, 8]")", {R"(y: "f32[4, 8]" = torch.ops.aten.neg.default(x))"}, "y"));
  REQUIRE(seq.find("tree_unflatten([y, None, None, None], self._out_spec)") != std::string::npos);  // longer than the call's arguments
  Run r = check("tree_unflatten", seq, {rank, rank});
  CHECK(r.code == 0);
  CHECK(r.out.empty());
}

TEST_CASE("import: a missing all-reduce is a value-mismatch at the model's line, naming the reduction and the spec's op") {
  Run r = check("mlp_bug", kMlpSeq, same(mlp_rank(false), 2));
  CHECK(r.code == 1);
  CHECK(r.out.rfind("/m.py:104: error[value-mismatch]", 0) == 0);  // mm_1 = gelu @ w2.t(): the line of the op, first
  CHECK(has(r, "a reduction (AllReduce over tp) is missing after MatMul writing mm_1"));
  CHECK(has(r, "ranks/fw.g0.r0.py:"));                               // the captured graph's line second
  CHECK(has(r, "note: the spec computes it whole here: MatMul writing seq_mm_1"));
}

TEST_CASE("import: a use of a collective's result before its wait_tensor is a missing-wait at the model's line") {
  Run r = check("mlp_wait", kMlpSeq, same(mlp_rank(true, true), 2), {"--relation", relation("mlp_wait", "outputs: {mm_1: wait_tensor}\n")});
  CHECK(r.code == 1);
  CHECK(has(r, "/m.py:106: error[missing-wait]: Neg reads all_reduce"));
}

TEST_CASE("import: Megatron's vocab-parallel embedding, with rank-varying vocab ranges, is one local-view program") {
  // rank r holds rows [4r, 4r + 4) of a table of 8: ids outside are masked to 0 and their rows zeroed, then summed
  auto rank = [](int r, int lo) {
    std::string a = std::to_string(lo), b = std::to_string(lo + 4);
    (void)r;
    return fx(R"(w: "f32[4, 6]", ids: "i64[3, 5]")",
              {R"(lt: "b8[3, 5]" = torch.ops.aten.lt.Scalar(ids, )" + a + ")", R"(ge: "b8[3, 5]" = torch.ops.aten.ge.Scalar(ids, )" + b + ")",
               R"(bitwise_or: "b8[3, 5]" = torch.ops.aten.bitwise_or.Tensor(lt, ge))", R"(clone: "i64[3, 5]" = torch.ops.aten.clone.default(ids))",
               R"(sub: "i64[3, 5]" = torch.ops.aten.sub.Tensor(clone, )" + a + ")", "_tensor_constant0 = self._tensor_constant0",
               R"(lift_fresh_copy: "i64[]" = torch.ops.aten.lift_fresh_copy.default(_tensor_constant0))",
               R"(index_put: "i64[3, 5]" = torch.ops.aten.index_put.default(sub, [bitwise_or], lift_fresh_copy))",
               R"(index: "f32[3, 5, 6]" = torch.ops.aten.index.Tensor(w, [index_put]))", "_tensor_constant1 = self._tensor_constant1",
               R"(lift_fresh_copy_1: "f32[]" = torch.ops.aten.lift_fresh_copy.default(_tensor_constant1))",
               R"(slice_1: "f32[3, 5, 6]" = torch.ops.aten.slice.Tensor(index, 1, 0, 9223372036854775807))",
               R"(index_put_1: "f32[3, 5, 6]" = torch.ops.aten.index_put.default(slice_1, [bitwise_or], lift_fresh_copy_1))",
               R"(slice_scatter: "f32[3, 5, 6]" = torch.ops.aten.slice_scatter.default(index, index_put_1, 1, 0, 9223372036854775807))",
               R"(all_reduce: "f32[3, 5, 6]" = torch.ops._c10d_functional.all_reduce.default(slice_scatter, 'sum', '3'))",
               R"(wait_tensor: "f32[3, 5, 6]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce))"},
              "wait_tensor");
  };
  std::string seq = fx(R"(w: "f32[8, 6]", ids: "i64[3, 5]")", {R"(embedding: "f32[3, 5, 6]" = torch.ops.aten.embedding.default(w, ids))"}, "embedding");
  std::string rel = relation("vocab", "constants: 0\n");
  Run ok = check("vocab", seq, {rank(0, 0), rank(1, 4)}, {"--relation", rel});
  CHECK(ok.code == 0);
  CHECK(!has(ok, "error"));  // (equal on every trial; the comparisons' integer casts are value choices until issue 21's Lt/Ge)
  auto [s, k] = graphs("vocab_yaml", seq, {rank(0, 0), rank(1, 4)});
  auto imp = frontends::import_program({"fx", s, k, rel, {}, ""});
  CHECK(imp.local_view);
  CHECK(imp.yaml.find("start: '(s8/TP)*axis_index(tp)'") != std::string::npos);  // the vocab start of each rank, named
  // rank 1 reads the first range too: its rows are never looked up, the first's twice; found at the vocab range's line
  Run bad = check("vocab_bug", seq, {rank(0, 0), rank(1, 0)}, {"--relation", rel});
  CHECK(bad.code == 1);
  CHECK(bad.out.rfind("/m.py:100: error[value-mismatch]", 0) == 0);
  // ranks whose graphs differ in a constant that is not affine in the rank are per-rank programs
  std::string seq3 = fx(R"(w: "f32[12, 6]", ids: "i64[3, 5]")", {R"(embedding: "f32[3, 5, 6]" = torch.ops.aten.embedding.default(w, ids))"}, "embedding");
  auto [s3, k3] = graphs("vocab_perrank", seq3, {rank(0, 0), rank(1, 4), rank(2, 9)});
  auto imp3 = frontends::import_program({"fx", s3, k3, rel, {}, ""});
  CHECK(!imp3.local_view);
  CHECK(imp3.yaml.find("programs:") != std::string::npos);
}

TEST_CASE("import: two formulations of each mapped op agree (and a wrong one does not)") {
  struct Pair {
    const char* name;
    std::string sig;
    std::vector<std::string> a, b;  // the sequential graph's body and the rank's
    std::string ra, rb;             // returned names
  };
  const std::string m = R"(x: "f32[4, 6]", y: "f32[4, 6]", z: "f32[6, 4]", i: "i64[4, 6]")";
  std::vector<Pair> pairs = {
      {"lt_vs_not_ge", m, {R"(lt: "b8[4, 6]" = torch.ops.aten.lt.Scalar(i, 2))", R"(w: "f32[4, 6]" = torch.ops.aten.where.self(lt, x, y))"},
       {R"(ge: "b8[4, 6]" = torch.ops.aten.ge.Scalar(i, 2))", R"(n: "b8[4, 6]" = torch.ops.aten.logical_not.default(ge))",
        R"(w: "f32[4, 6]" = torch.ops.aten.where.self(n, x, y))"},
       "w", "w"},
      {"gt_vs_le", m, {R"(c: "b8[4, 6]" = torch.ops.aten.gt.Tensor(x, y))", R"(w: "f32[4, 6]" = torch.ops.aten.where.self(c, x, y))"},
       {R"(c: "b8[4, 6]" = torch.ops.aten.le.Tensor(x, y))", R"(w: "f32[4, 6]" = torch.ops.aten.where.self(c, y, x))"}, "w", "w"},
      {"eq_vs_ne", m, {R"(c: "b8[4, 6]" = torch.ops.aten.eq.Scalar(i, 1))", R"(w: "f32[4, 6]" = torch.ops.aten.masked_fill.Scalar(x, c, 3.0))"},
       {R"(c: "b8[4, 6]" = torch.ops.aten.ne.Scalar(i, 1))", R"(f: "f32[4, 6]" = torch.ops.aten.full.default([4, 6], 3.0))",
        R"(w: "f32[4, 6]" = torch.ops.aten.where.self(c, x, f))"},
       "w", "w"},
      {"or_and", m,
       {R"(a: "b8[4, 6]" = torch.ops.aten.lt.Scalar(i, 1))", R"(b: "b8[4, 6]" = torch.ops.aten.ge.Scalar(i, 3))",
        R"(o: "b8[4, 6]" = torch.ops.aten.bitwise_or.Tensor(a, b))", R"(w: "f32[4, 6]" = torch.ops.aten.where.self(o, x, y))"},
       {R"(a: "b8[4, 6]" = torch.ops.aten.ge.Scalar(i, 1))", R"(b: "b8[4, 6]" = torch.ops.aten.lt.Scalar(i, 3))",
        R"(o: "b8[4, 6]" = torch.ops.aten.bitwise_and.Tensor(a, b))", R"(w: "f32[4, 6]" = torch.ops.aten.where.self(o, y, x))"},
       "w", "w"},
      // logical ops read other dtypes as nonzero: logical_or(i, i - 1) is true everywhere (one of them is nonzero)
      {"logical_nonzero", m, {R"(w: "f32[4, 6]" = torch.ops.aten.clone.default(x))"},
       {R"(d: "i64[4, 6]" = torch.ops.aten.sub.Tensor(i, 1))", R"(o: "b8[4, 6]" = torch.ops.aten.logical_or.default(i, d))",
        R"(a: "b8[4, 6]" = torch.ops.aten.logical_and.default(o, o))", R"(w: "f32[4, 6]" = torch.ops.aten.where.self(a, x, y))"},
       "w", "w"},
      {"permute_vs_transposes", R"(x: "f32[2, 3, 4]")", {R"(p: "f32[4, 2, 3]" = torch.ops.aten.permute.default(x, [2, 0, 1]))"},
       {R"(a: "f32[4, 3, 2]" = torch.ops.aten.transpose.int(x, 0, 2))", R"(p: "f32[4, 2, 3]" = torch.ops.aten.transpose.int(a, 1, 2))"}, "p", "p"},
      {"views", R"(x: "f32[2, 3, 4]")",
       {R"(v: "f32[6, 4]" = torch.ops.aten.view.default(x, [-1, 4]))", R"(u: "f32[6, 1, 4]" = torch.ops.aten.unsqueeze.default(v, 1))",
        R"(s: "f32[6, 4]" = torch.ops.aten.squeeze.dim(u, 1))"},
       {R"(c: "f32[2, 3, 4]" = torch.ops.aten.clone.default(x))", R"(d: "f32[2, 3, 4]" = torch.ops.aten.detach.default(c))",
        R"(s: "f32[6, 4]" = torch.ops.aten._unsafe_view.default(d, [6, 4]))"},
       "s", "s"},
      {"addmm_vs_mm_add", R"(b: "f32[4]", x: "f32[3, 6]", w: "f32[6, 4]")",
       {R"(a: "f32[3, 4]" = torch.ops.aten.addmm.default(b, x, w, beta = 2.0, alpha = 0.5))"},
       {R"(m: "f32[3, 4]" = torch.ops.aten.mm.default(x, w))", R"(h: "f32[3, 4]" = torch.ops.aten.mul.Scalar(m, 0.5))",
        R"(a: "f32[3, 4]" = torch.ops.aten.add.Tensor(h, b, alpha = 2))"},
       "a", "a"},
      {"baddbmm_beta0", R"(e: "f32[2, 3, 3]", q: "f32[2, 3, 4]", k: "f32[2, 4, 3]")",
       {R"(s: "f32[2, 3, 3]" = torch.ops.aten.baddbmm.default(e, q, k, beta = 0.0, alpha = 0.25))"},
       {R"(m: "f32[2, 3, 3]" = torch.ops.aten.bmm.default(q, k))", R"(s: "f32[2, 3, 3]" = torch.ops.aten.div.Tensor(m, 4))"}, "s", "s"},
      {"slices", R"(x: "f32[5, 6]", y: "f32[5, 2]")",
       {R"(s: "f32[5, 6]" = torch.ops.aten.slice_scatter.default(x, y, 1, 3, 5))"},
       {R"(a: "f32[5, 3]" = torch.ops.aten.slice.Tensor(x, 1, 0, 3))", R"(b: "f32[5, 1]" = torch.ops.aten.slice.Tensor(x, 1, -1, 9223372036854775807))",
        R"(s: "f32[5, 6]" = torch.ops.aten.cat.default([a, y, b], 1))"},
       "s", "s"},
      {"split_select", R"(x: "f32[6, 4]")",
       {R"(sp = torch.ops.aten.split_with_sizes.default(x, [2, 4]))", R"(g: "f32[4, 4]" = sp[1])", R"(r: "f32[4]" = torch.ops.aten.select.int(g, 0, 1))"},
       {R"(sp = torch.ops.aten.split.Tensor(x, 3))", R"(g: "f32[3, 4]" = sp[1])", R"(r: "f32[4]" = torch.ops.aten.select.int(g, 0, 0))"}, "r", "r"},
      {"softmax_vs_exp", R"(x: "f32[3, 5]")", {R"(s: "f32[3, 5]" = torch.ops.aten._softmax.default(x, -1, False))"},
       {R"(e: "f32[3, 5]" = torch.ops.aten.exp.default(x))", R"(t: "f32[3, 1]" = torch.ops.aten.sum.dim_IntList(e, [1], True))",
        R"(s: "f32[3, 5]" = torch.ops.aten.div.Tensor(e, t))"},
       "s", "s"},
      {"sigmoid", R"(x: "f32[3, 5]")", {R"(s: "f32[3, 5]" = torch.ops.aten.sigmoid.default(x))"},
       {R"(n: "f32[3, 5]" = torch.ops.aten.neg.default(x))", R"(e: "f32[3, 5]" = torch.ops.aten.exp.default(n))",
        R"(a: "f32[3, 5]" = torch.ops.aten.add.Tensor(e, 1))", R"(s: "f32[3, 5]" = torch.ops.aten.reciprocal.default(a))"},
       "s", "s"},
      {"mean_sum_pow", R"(x: "f32[3, 5]")",
       {R"(p: "f32[3, 5]" = torch.ops.aten.pow.Tensor_Scalar(x, 2))", R"(s: "f32[]" = torch.ops.aten.mean.default(p))"},
       {R"(p: "f32[3, 5]" = torch.ops.aten.mul.Tensor(x, x))", R"(t: "f32[3]" = torch.ops.aten.sum.dim_IntList(p, [-1]))",
        R"(u: "f32[]" = torch.ops.aten.sum.default(t))", R"(s: "f32[]" = torch.ops.aten.div.Tensor(u, 15))"},
       "s", "s"},
      {"rsub", R"(x: "f32[3, 5]")", {R"(s: "f32[3, 5]" = torch.ops.aten.rsub.Scalar(x, 2.0))"},
       {R"(n: "f32[3, 5]" = torch.ops.aten.neg.default(x))", R"(s: "f32[3, 5]" = torch.ops.aten.add.Tensor(n, 2.0))"}, "s", "s"},
      {"expand", R"(x: "f32[3, 1]", y: "f32[3, 4]")", {R"(e: "f32[3, 4]" = torch.ops.aten.expand.default(x, [-1, 4]))", R"(s: "f32[3, 4]" = torch.ops.aten.mul.Tensor(e, y))"},
       {R"(s: "f32[3, 4]" = torch.ops.aten.mul.Tensor(y, x))"}, "s", "s"},
      {"gather_rows", R"(x: "f32[4, 6]", i: "i64[4]")",
       {R"(a: "i64[4]" = torch.ops.aten.arange.start(0, 4))", R"(g: "f32[4]" = torch.ops.aten.index.Tensor(x, [a, i]))"},
       {R"(f: "f32[24]" = torch.ops.aten.view.default(x, [24]))", R"(a: "i64[4]" = torch.ops.aten.arange.default(4))",
        R"(o: "i64[4]" = torch.ops.aten.mul.Tensor(a, 6))", R"(j: "i64[4]" = torch.ops.aten.add.Tensor(o, i))", R"(g: "f32[4]" = torch.ops.aten.index.Tensor(f, [j]))"},
       "g", "g"},
      {"index_put_mask", R"(x: "f32[3, 4, 2]", i: "i64[3, 4]")",
       {R"(m: "b8[3, 4]" = torch.ops.aten.ge.Scalar(i, 2))", R"(z: "f32[]" = torch.ops.aten.scalar_tensor.default(0.5))",
        R"(p: "f32[3, 4, 2]" = torch.ops.aten.index_put.default(x, [m], z))"},
       {R"(m: "b8[3, 4]" = torch.ops.aten.ge.Scalar(i, 2))", R"(u: "b8[3, 4, 1]" = torch.ops.aten.unsqueeze.default(m, -1))",
        R"(p: "f32[3, 4, 2]" = torch.ops.aten.masked_fill.Scalar(x, u, 0.5))"},
       "p", "p"},
      {"layer_norm", R"(x: "f32[3, 8]", w: "f32[8]", b: "f32[8]")",
       {R"(ln = torch.ops.aten.native_layer_norm.default(x, [8], w, b, 1e-05))", R"(y: "f32[3, 8]" = ln[0])"},
       {R"(ln = torch.ops.apex.fused_layer_norm_affine_fwd.default(x, w, b, [8], 1e-05))", R"(y: "f32[3, 8]" = ln[0])"}, "y", "y"},
      {"dropout_identity", R"(x: "f32[3, 8]")", {R"(d = torch.ops.aten.native_dropout.default(x, 0.1, True))", R"(y: "f32[3, 8]" = d[0])"},
       {R"(y: "f32[3, 8]" = torch.ops.aten.alias.default(x))"}, "y", "y"},
      {"amax_max", R"(x: "f32[3, 8]")", {R"(m = torch.ops.aten.max.dim(x, 1))", R"(y: "f32[3]" = m[0])"},
       {R"(y: "f32[3]" = torch.ops.aten.amax.default(x, [1]))"}, "y", "y"},
  };
  for (const auto& pr : pairs) {
    std::string name = pr.name;
    CAPTURE(name);
    Run r = check("op_" + name, fx(pr.sig, pr.a, pr.ra), {fx(pr.sig, pr.b, pr.rb)});
    CHECK(r.code == 0);
    CHECK(r.err.empty());
    // comparisons (integer casts, until issue 21's Lt/Ge) and max choose by value: equal on every trial, not a proof
    if (r.out.find("chooses by value") == std::string::npos) CHECK(r.out.empty());
    CHECK(!has(r, "error"));
  }
  // and a formulation that is wrong (the mask inverted) is a mismatch
  Run bad = check("op_wrong", fx(m, {R"(lt: "b8[4, 6]" = torch.ops.aten.lt.Scalar(i, 2))", R"(w: "f32[4, 6]" = torch.ops.aten.where.self(lt, x, y))"}, "w"),
                  {fx(m, {R"(ge: "b8[4, 6]" = torch.ops.aten.ge.Scalar(i, 2))", R"(w: "f32[4, 6]" = torch.ops.aten.where.self(ge, x, y))"}, "w")});
  CHECK(bad.code == 1);
  CHECK(has(bad, "error[value-mismatch]"));
}

TEST_CASE("import: sequence parallelism (all_gather / reduce_scatter on dim 0) is equivalent") {
  std::string seq = fx(R"(x: "f32[8, 3]", w: "f32[3, 4]")", {R"(m: "f32[8, 4]" = torch.ops.aten.mm.default(x, w))"}, "m");
  // rank: gather the sequence, column-parallel... no: w whole, scatter back the rows after a reduce of halves
  std::string rank = fx(R"(x: "f32[4, 3]", w: "f32[3, 4]")",
                        {R"(ag: "f32[8, 3]" = torch.ops._c10d_functional.all_gather_into_tensor.default(x, 2, '5'))",
                         R"(wt: "f32[8, 3]" = torch.ops._c10d_functional.wait_tensor.default(ag))", R"(m: "f32[8, 4]" = torch.ops.aten.mm.default(wt, w))",
                         R"(h: "f32[8, 4]" = torch.ops.aten.div.Tensor(m, 2))",
                         R"(rs: "f32[4, 4]" = torch.ops._c10d_functional.reduce_scatter_tensor.default(h, 'sum', 2, '5'))",
                         R"(w2: "f32[4, 4]" = torch.ops._c10d_functional.wait_tensor.default(rs))"},
                        "w2");
  Run r = check("sp", seq, same(rank, 2), {"--relation", relation("sp", "outputs: {m: w2}\n")});
  CHECK(r.code == 0);
  CHECK(r.out.empty());
}

TEST_CASE("import: the relation file gives what shapes cannot say, and names the ambiguous input otherwise") {
  std::string seq = fx(R"(x: "f32[8, 6]")", {R"(n: "f32[8, 6]" = torch.ops.aten.neg.default(x))"}, "n");
  std::string rank = fx(R"(x: "f32[4, 3]")", {R"(n: "f32[4, 3]" = torch.ops.aten.neg.default(x))"}, "n");
  Run amb = check("ambiguous", seq, same(rank, 2));
  CHECK(amb.code == 2);
  CHECK(has(amb, "seq/fw.g0.r0.py:4:"));
  CHECK(has(amb, "cannot infer how input x relates to the ranks' inputs"));
  CHECK(has(amb, "inputs: {x: S(0)}"));
  // a given placement must fit the shapes
  std::string seq2 = fx(R"(x: "f32[8, 6]")", {R"(n: "f32[8, 6]" = torch.ops.aten.neg.default(x))"}, "n");
  std::string rank2 = fx(R"(x: "f32[4, 6]")", {R"(n: "f32[4, 6]" = torch.ops.aten.neg.default(x))"}, "n");
  Run misfit = check("misfit", seq2, same(rank2, 2), {"--relation", relation("misfit", "inputs: {x: S(1)}\n")});
  CHECK(misfit.code == 2);
  CHECK(has(misfit, "misfit.relation.yaml:1:"));
  CHECK(has(misfit, "error: placement S(1) of x does not fit its shapes"));
  Run badkey = check("badkey", seq2, same(rank2, 2), {"--relation", relation("badkey", "input: {x: R}\n")});
  CHECK(badkey.code == 2);
  CHECK(has(badkey, "badkey.relation.yaml:1:1: error: unknown key 'input' in a relation file"));
  // several process groups need names
  std::string r3 = fx(R"(x: "f32[4, 6]")",
                      {R"(a: "f32[4, 6]" = torch.ops._c10d_functional.all_reduce.default(x, 'sum', '1'))",
                       R"(b: "f32[4, 6]" = torch.ops._c10d_functional.wait_tensor.default(a))",
                       R"(c: "f32[4, 6]" = torch.ops._c10d_functional.all_reduce.default(b, 'sum', '2'))",
                       R"(d: "f32[4, 6]" = torch.ops._c10d_functional.wait_tensor.default(c))"},
                      "d");
  Run groups = check("groups", seq2, same(r3, 2));
  CHECK(groups.code == 2);
  CHECK(has(groups, "process groups '1', '2': name the mesh axis of each in a relation file"));
}

TEST_CASE("import: located errors for unreadable graphs and unmapped ops") {
  std::string ok = fx(R"(x: "f32[4]")", {R"(n: "f32[4]" = torch.ops.aten.neg.default(x))"}, "n");
  // an op no table maps
  Run unknown = check("unknown", ok, {fx(R"(x: "f32[4]")", {R"(n: "f32[4]" = torch.ops.aten.frobnicate.default(x))"}, "n")});
  CHECK(unknown.code == 2);
  CHECK(has(unknown, "ranks/fw.g0.r0.py:6:9: error: unsupported op 'aten.frobnicate.default' (node n)"));
  // a malformed line
  Run bad = check("malformed", ok, {fx(R"(x: "f32[4]")", {R"(n: "f32[4]" = torch.ops.aten.neg.default(x)))"}, "n")});
  CHECK(bad.code == 2);
  CHECK(has(bad, "ranks/fw.g0.r0.py:6:"));
  CHECK(has(bad, "unexpected text after the node's expression"));
  // an annotation that contradicts the op
  Run shape = check("contradicts", ok, {fx(R"(x: "f32[4]")", {R"(n: "f32[5]" = torch.ops.aten.neg.default(x))"}, "n")});
  CHECK(shape.code == 2);
  CHECK(has(shape, "ranks/fw.g0.r0.py:6:9: error: the annotation f32[5] contradicts aten.neg.default, which gives shape [4] here"));
  std::string mm_ok = fx(R"(x: "f32[4, 2]", w: "f32[3, 5]")", {R"(n: "f32[4, 2]" = torch.ops.aten.neg.default(x))"}, "n");
  Run mm = check("contradicts_mm", mm_ok, {fx(R"(x: "f32[4, 2]", w: "f32[3, 5]")", {R"(n: "f32[4, 5]" = torch.ops.aten.mm.default(x, w))"}, "n")});
  CHECK(mm.code == 2);
  CHECK(has(mm, "error: contracting dims differ: f32[4, 2] x f32[3, 5]"));
  // a bitwise op of integers (only bool masks are mapped)
  std::string iok = fx(R"(x: "i64[4]")", {R"(n: "i64[4]" = torch.ops.aten.neg.default(x))"}, "n");
  Run bits = check("bitwise_int", iok, {fx(R"(x: "i64[4]")", {R"(n: "i64[4]" = torch.ops.aten.bitwise_and.Tensor(x, x))"}, "n")});
  CHECK(bits.code == 2);
  CHECK(has(bits, "ranks/fw.g0.r0.py:6:9: error: aten.bitwise_and.Tensor of i64[4] is not supported yet (only of bool masks)"));
  // a truncated file
  std::string cut = ok.substr(0, ok.find("        return"));
  Run trunc = check("truncated", ok, {cut});
  CHECK(trunc.code == 2);
  CHECK(has(trunc, "error: forward ends without a return statement (a truncated file?)"));
  // a lifted constant without its value
  Run cst = check("constant", ok,
                  {fx(R"(x: "f32[4]")",
                      {"_tensor_constant0 = self._tensor_constant0", R"(l: "f32[]" = torch.ops.aten.lift_fresh_copy.default(_tensor_constant0))",
                       R"(n: "f32[4]" = torch.ops.aten.add.Tensor(x, l))"},
                      "n")});
  CHECK(cst.code == 2);
  CHECK(has(cst, "the value of self._tensor_constant0 is not in the graph dump"));
  // a data-dependent shape
  Run dyn = check("dynamic", ok, {fx(R"(x: "f32[4]")", {R"(n: "i64[u0, 1]" = torch.ops.aten.nonzero.default(x))"}, "n")});
  CHECK(dyn.code == 2);
  CHECK(has(dyn, "has a shape with the symbolic dim 'u0'"));
  // not a print_readable dump at all
  Run none = check("notfx", ok, {"x = 1\n"});
  CHECK(none.code == 2);
  CHECK(has(none, "no `def forward(...)` found"));
  // a ranks' input the sequential graph lacks
  Run extra = check("extra_input", ok, {fx(R"(x: "f32[4]", q: "f32[4]")", {R"(n: "f32[4]" = torch.ops.aten.add.Tensor(x, q))"}, "n")});
  CHECK(extra.code == 2);
  CHECK(has(extra, "the ranks' input q has no input of the same name in the sequential graph"));
}

TEST_CASE("import: custom ops come from mapping files, with located errors") {
  std::string seq = fx(R"(x: "f32[4]")", {R"(n: "f32[4]" = torch.ops.aten.neg.default(x))"}, "n");
  std::string rank = fx(R"(x: "f32[4]")", {R"(n: "f32[4]" = torch.ops.mylib.negate.default(x))"}, "n");
  Run missing = check("custom_missing", seq, {rank});
  CHECK(missing.code == 2);
  CHECK(has(missing, "unsupported op 'mylib.negate.default'"));
  std::string ops = relation("custom_ops", "ops:\n  mylib.negate.default:\n    params: x\n    shapes: {out: x}\n    ops:\n      - {op: Neg, in: [$x], out: $out}\n");
  Run ok = check("custom_ok", seq, {rank}, {"--ops", ops});
  CHECK(ok.code == 0);
  std::string typo = relation("custom_typo", "ops:\n  mylib.negate.default:\n    params: x\n    ops:\n      - {op: Negg, in: [$x], out: $out}\n");
  Run bad = check("custom_typo", seq, {rank}, {"--ops", typo});
  CHECK(bad.code == 2);
  CHECK(has(bad, "custom_typo.relation.yaml:5:"));
  CHECK(has(bad, "error: unknown op 'Negg' in the template of 'mylib.negate.default'; did you mean 'Neg'?"));
}

TEST_CASE("import: microbatches cut from the batch by the relation; a per-microbatch mean is located at its line") {
  std::string seq = fx(R"(x: "f32[8]")", {R"(s: "f32[]" = torch.ops.aten.sum.default(x))", R"(d: "f32[]" = torch.ops.aten.div.Tensor(s, 8))"}, "d");
  std::string rank = fx(R"(a: "f32[4]", b: "f32[4]")",
                        {R"(m: "f32[]" = torch.ops.aten.mean.default(a))", R"(n: "f32[]" = torch.ops.aten.mean.default(b))",
                         R"(t: "f32[]" = torch.ops.aten.add.Tensor(m, n))"},
                        "t");
  std::string rel = relation("microbatch", "rank_inputs:\n  a: {slice: x, dim: 0, start: 0, end: 4}\n  b: {slice: x, dim: 0, start: 4, end: 8}\noutputs: {d: t}\n");
  Run r = check("microbatch", seq, {rank}, {"--relation", rel});
  CHECK(r.code == 1);
  CHECK(r.out.rfind("/m.py:100: error[value-mismatch]", 0) == 0);  // the first mean
  std::string fixed = fx(R"(a: "f32[4]", b: "f32[4]")",
                         {R"(m: "f32[]" = torch.ops.aten.sum.default(a))", R"(n: "f32[]" = torch.ops.aten.sum.default(b))",
                          R"(u: "f32[]" = torch.ops.aten.add.Tensor(m, n))", R"(t: "f32[]" = torch.ops.aten.div.Tensor(u, 8))"},
                         "t");
  CHECK(check("microbatch_fixed", seq, {fixed}, {"--relation", rel}).code == 0);
}

TEST_CASE("import: `spmdcheck import fx` writes the program; JSON names the model's file") {
  auto [s, k] = graphs("cli", kMlpSeq, same(mlp_rank(false), 2));
  std::string out = base() + "cli.yaml";
  Run r = run({"import", "fx", s, k, "-o", out});
  CHECK(r.code == 0);
  CHECK(has(r, "2 ranks, one local-view program"));
  Run j = run({"check", "--format", "json", out});
  CHECK(j.code == 1);
  CHECK(j.out.find("\"file\": \"/m.py\"") != std::string::npos);
  Run e = run({"equiv", out});
  CHECK(e.code == 1);
  CHECK(e.out.rfind("/m.py:104: error[value-mismatch]", 0) == 0);
}

// The corpus of docs/import.md (GraphGuard's captured graphs, ../shared/data/fx): skipped with a message when absent.
TEST_CASE("import corpus: GPT at tensor parallel 2, 4, 8 against 1 and the HLO Llama at 2 against 1 agree; the four bug cases are found at the model's line" *
          doctest::test_suite("corpus")) {
  // ../shared/data/fx beside the repository (or beside the worktrees' folder), or $SPMDCHECK_CORPUS
  std::string corpus = std::string(SPMD_SOURCE_DIR) + "/../shared/data/fx";
  std::error_code ec;
  if (!fs::is_directory(corpus, ec)) corpus = std::string(SPMD_SOURCE_DIR) + "/../../shared/data/fx";
  if (const char* env = std::getenv("SPMDCHECK_CORPUS"); env && *env) corpus = env;
  if (!fs::is_directory(corpus, ec)) {
    MESSAGE("skipped: the outside corpus " << corpus << " is absent (a clone on its own; docs/import.md)");
    return;
  }
  std::string rel = std::string(SPMD_SOURCE_DIR) + "/relations/";
  for (int layers : {1, 2, 4, 8})
    for (int tp : {2, 4, 8}) {
      std::string l = std::to_string(layers);
      CAPTURE(tp);
      CAPTURE(layers);
      Run r = run({"check", corpus + "/gpt/paral1_layer" + l, corpus + "/gpt/paral" + std::to_string(tp) + "_layer" + l, "--relation", rel + "gpt.yaml", "--reduce"});
      CHECK(r.code == 0);
      CHECK(r.out.empty());  // proved equivalent: the vocab-parallel max as the max of a set (no value-unproved warning)
    }
  for (int layers : {1, 2, 4, 8}) {  // transformers-neuronx Llama as XLA HLO, TP 2 against 1
    std::string l = std::to_string(layers);
    CAPTURE(layers);
    Run r = run({"check", corpus + "/aws_llama/tp1_layer" + l, corpus + "/aws_llama/tp2_layer" + l, "--relation", rel + "aws_llama.yaml", "--reduce"});
    CHECK(r.code == 0);
    CHECK(r.out.empty());  // proved equivalent (no value-unproved warning)
  }
  // the corpus's broken variant: the K block sliced from Q's columns (every returned value is compared: the KV cache)
  Run broken = run({"check", corpus + "/aws_llama/tp1_layer1", corpus + "/aws_llama/tp2_layer1.broken", "--relation", rel + "aws_llama.yaml", "--reduce"});
  CHECK(broken.code == 1);
  CHECK(has(broken, "error[value-mismatch]"));
  struct Bug {
    const char* dir;
    const char* seq;
    const char* ranks;
    const char* at;  // the model's line of the op that goes wrong
  };
  for (const Bug& b : {Bug{"bug_grad_accumulation", "1step", "2step.bug", "/opt/tiger/transformers/tests/trainer/test_trainer_simple.py:100: error[value-mismatch]"},
                       Bug{"bug_missing_allreduce_under_wrong_config", "tp1", "tp2.bug", "megatron/core/tensor_parallel/layers.py:697: error[value-mismatch]"},
                       Bug{"bug_missing_switchmlp_allreduce", "tp1", "tp2.bug", "megatron/legacy/model/transformer.py:262: error[value-mismatch]"},
                       Bug{"bug_missing_layernorm_allreduce", "tp1", "tp2.bug", "torch/_library/custom_ops.py:675: error[value-mismatch]"}}) {
    std::string d = corpus + "/" + b.dir;
    CAPTURE(std::string(b.dir));
    Run r = run({"check", d + "/" + b.seq, d + "/" + b.ranks, "--relation", rel + b.dir + ".yaml", "--reduce"});
    CHECK(r.code == 1);
    CHECK(r.out.substr(0, r.out.find('\n')).find(b.at) != std::string::npos);
    CHECK(has(r, "note: the spec computes it"));
  }
}

// ---- HLO ----------------------------------------------------------------------------------------------------

namespace {

// An HLO module text: `header` after `HloModule m` (e.g. ", replica_count=2"), an `%add` reducer, then the ENTRY
// computation with `body` one instruction per line (each gets metadata source line 100 + its index; the last is
// the ROOT).
std::string hlo(const std::vector<std::string>& body, const std::string& header = "") {
  std::string s = "HloModule m" + header + "\n\n%add (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n"
                  "  ROOT %s = f32[] add(%a, %b)\n}\n\n%max (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n"
                  "  ROOT %s = f32[] maximum(%a, %b)\n}\n\nENTRY %main () -> f32[] {\n";
  for (std::size_t i = 0; i < body.size(); ++i)
    s += std::string("  ") + (i + 1 == body.size() ? "ROOT " : "") + body[i] + ", metadata={op_type=\"x\" source_file=\"/h.py\" source_line=" + std::to_string(100 + i) + "}\n";
  return s + "}\n";
}

Run check_hlo(const std::string& name, const std::string& seq, const std::string& ranks, std::vector<std::string> extra = {}) {
  std::string d = base() + name;
  fs::remove_all(d);
  write(d + "/seq/graph.0.hlo", seq);
  write(d + "/ranks/graph.0.hlo", ranks);
  std::vector<std::string> args = {"check", d + "/seq", d + "/ranks"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run(args);
}

const std::string kHloMlpSeq = hlo({"%x = f32[4,8]{1,0} parameter(0)", "%w1 = f32[8,16]{1,0} parameter(1)", "%w2 = f32[16,8]{1,0} parameter(2)",
                                    "%h = f32[4,16]{1,0} dot(%x, %w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
                                    "%g = f32[4,16]{1,0} logistic(%h)", "%m = f32[4,16]{1,0} multiply(%h, %g)",
                                    "%y = f32[4,8]{1,0} dot(%m, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}"});

std::string hlo_mlp_rank(bool reduce) {
  std::vector<std::string> b = {"%x = f32[4,8]{1,0} parameter(0)", "%w1 = f32[8,8]{1,0} parameter(1)", "%w2 = f32[8,8]{1,0} parameter(2)",
                                "%h = f32[4,8]{1,0} dot(%x, %w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
                                "%g = f32[4,8]{1,0} logistic(%h)", "%m = f32[4,8]{1,0} multiply(%h, %g)",
                                "%y = f32[4,8]{1,0} dot(%m, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}"};
  if (reduce) b.push_back("%ar = f32[4,8]{1,0} all-reduce(%y), replica_groups={{0,1}}, to_apply=%add");
  return hlo(b, reduce ? "" : ", replica_count=2");
}

}  // namespace

TEST_CASE("import hlo: a tensor-parallel MLP is proved equivalent; a missing all-reduce is located at the model's line") {
  Run ok = check_hlo("hlo_mlp", kHloMlpSeq, hlo_mlp_rank(true));
  CHECK(ok.code == 0);
  CHECK(ok.out.empty());
  Run bug = check_hlo("hlo_mlp_bug", kHloMlpSeq, hlo_mlp_rank(false));  // the device count from the header
  CHECK(bug.code == 1);
  CHECK(bug.out.rfind("/h.py:106: error[value-mismatch]", 0) == 0);  // %y: the op that should have been reduced
  CHECK(has(bug, "a reduction (AllReduce over tp) is missing after MatMul writing y"));
  CHECK(has(bug, "ranks/graph.0.hlo:"));
  // no collective and no header: the relation says how many devices
  std::string plain = hlo_mlp_rank(false);
  plain.replace(plain.find(", replica_count=2"), 17, "");
  Run dev = check_hlo("hlo_mlp_devices", kHloMlpSeq, plain, {"--relation", relation("hlo_devices", "devices: 2\n")});
  CHECK(dev.code == 1);
  CHECK(has(dev, "error[value-mismatch]"));
  // every value the module returns is compared (a KV cache beside the logits), by position
  auto two = [](const std::string& s, const char* second) {
    std::string t = s.substr(0, s.rfind("ROOT "));
    std::string last = s.substr(s.rfind("ROOT ") + 5);
    std::string name = last.substr(0, last.find(' '));
    return t + last.substr(0, last.find('\n') + 1).insert(0, "") + "  %n2 = f32[4,8]{1,0} " + second + "(%x)\n  ROOT %t = (f32[4,8]{1,0}, f32[4,8]{1,0}) tuple(" + name + ", %n2)\n}\n";
  };
  Run both = check_hlo("hlo_two_outputs", two(kHloMlpSeq, "negate"), two(hlo_mlp_rank(true), "negate"));
  CHECK(both.code == 0);
  CHECK(both.out.empty());
  Run second = check_hlo("hlo_two_outputs_bad", two(kHloMlpSeq, "negate"), two(hlo_mlp_rank(true), "exponential"));
  CHECK(second.code == 1);
  CHECK(has(second, "error[value-mismatch]"));
  CHECK(has(second, "n2"));
  Run bad_dev = check_hlo("hlo_mlp_devices_bad", kHloMlpSeq, hlo_mlp_rank(true), {"--relation", relation("hlo_devices_bad", "devices: 4\n")});
  CHECK(bad_dev.code == 2);
  CHECK(has(bad_dev, "`devices: 4` contradicts the module"));
}

TEST_CASE("import hlo: sequence parallelism (all-gather / reduce-scatter along dim 0) is equivalent; a wrong scale and a wrong annotation are found") {
  std::string seq = hlo({"%x = f32[8,3]{1,0} parameter(0)", "%w = f32[3,4]{1,0} parameter(1)",
                         "%m = f32[8,4]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}"});
  auto rank = [](const char* combine, const char* gathered) {
    return hlo({"%x = f32[4,3]{1,0} parameter(0)", "%w = f32[3,4]{1,0} parameter(1)",
                std::string("%ag = ") + gathered + " all-gather(%x), channel_id=1, replica_groups={{0,1}}, dimensions={0}, use_global_device_ids=true",
                "%m = f32[8,4]{1,0} dot(%ag, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}", "%c = f32[] constant(2)",
                "%cb = f32[8,4]{1,0} broadcast(%c), dimensions={}", std::string("%h = f32[8,4]{1,0} ") + combine + "(%m, %cb)",
                "%rs = f32[4,4]{1,0} reduce-scatter(%h), channel_id=2, replica_groups={{0,1}}, dimensions={0}, to_apply=%add"});
  };
  Run ok = check_hlo("hlo_sp", seq, rank("divide", "f32[8,3]{1,0}"));
  CHECK(ok.code == 0);
  CHECK(ok.out.empty());  // proved: each device's block of the halved sum of the two identical products
  Run bad = check_hlo("hlo_sp_bad", seq, rank("multiply", "f32[8,3]{1,0}"));
  CHECK(bad.code == 1);
  CHECK(bad.out.rfind("/h.py:106: error[value-mismatch]", 0) == 0);  // located at the scale, the model's line
  Run ann = check_hlo("hlo_sp_annotation", seq, rank("divide", "f32[6,3]{1,0}"));
  CHECK(ann.code == 2);
  CHECK(has(ann, "error: the annotation f32[6, 3] contradicts all-gather, which gives shape [8, 3] here"));
}

TEST_CASE("import hlo: all-to-all and collective-permute (a shift by one around the devices) are read; a wrong one is found") {
  std::string seq = hlo({"%x = f32[4,8]{1,0} parameter(0)", "%y = f32[4,8]{1,0} negate(%x)"});
  // all-to-all along one dim twice is the identity
  auto a2a = [](bool twice) {
    std::vector<std::string> b = {"%x = f32[2,8]{1,0} parameter(0)", "%a = f32[2,8]{1,0} all-to-all(%x), channel_id=1, replica_groups={{0,1}}, dimensions={1}",
                                  "%n = f32[2,8]{1,0} negate(%a)"};
    if (twice) b.push_back("%b = f32[2,8]{1,0} all-to-all(%n), channel_id=2, replica_groups={{0,1}}, dimensions={1}");
    return hlo(b, ", replica_count=2");
  };
  Run ok = check_hlo("hlo_a2a", seq, a2a(true));
  CHECK(ok.code == 0);
  CHECK(ok.out.empty());
  Run once = check_hlo("hlo_a2a_once", seq, a2a(false));
  CHECK(once.code == 1);
  CHECK(once.out.rfind("/h.py:101: error[value-mismatch]", 0) == 0);  // the all-to-all
  // ppermute to the next device, then back: the identity; next twice is not
  auto perm = [](const char* back) {
    return hlo({"%x = f32[1,8]{1,0} parameter(0)",
                "%a = f32[1,8]{1,0} collective-permute(%x), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}",
                "%n = f32[1,8]{1,0} negate(%a)", std::string("%b = f32[1,8]{1,0} collective-permute(%n), channel_id=2, source_target_pairs=") + back},
               ", replica_count=4");
  };
  Run ring = check_hlo("hlo_permute", seq, perm("{{1,0},{2,1},{3,2},{0,3}}"));
  CHECK(ring.code == 0);
  CHECK(ring.out.empty());
  Run twice = check_hlo("hlo_permute_twice", seq, perm("{{0,1},{1,2},{2,3},{3,0}}"));
  CHECK(twice.code == 1);
  CHECK(has(twice, "error[value-mismatch]"));
  Run other = check_hlo("hlo_permute_other", seq, perm("{{0,2},{1,3},{2,0},{3,1}}"));
  CHECK(other.code == 2);
  CHECK(has(other, "/ranks/graph.0.hlo:"));
  CHECK(has(other, "error: collective-permute other than a shift by one around all devices"));
}

TEST_CASE("import hlo: fusion and call computations (the optimized module of compile().as_text()) are inlined where they are used") {
  // the tensor-parallel MLP of kHloMlpSeq, its first half fused (or called), the model's lines inside the fusion
  auto module = [](const std::string& use, bool reduce) {
    std::string s = "HloModule m, replica_count=2\n\n%add (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n"
                    "  ROOT %s = f32[] add(%a, %b)\n}\n\n"
                    "%fused_computation.3 (param_0.1: f32[4,8], param_1.2: f32[8,8]) -> f32[4,8] {\n"
                    "  %param_1.2 = f32[8,8]{1,0} parameter(1)\n  %param_0.1 = f32[4,8]{1,0} parameter(0)\n"
                    "  %dot.1 = f32[4,8]{1,0} dot(%param_0.1, %param_1.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, "
                    "metadata={op_type=\"dot\" source_file=\"/m.py\" source_line=200}\n"
                    "  %logistic.1 = f32[4,8]{1,0} logistic(%dot.1), metadata={op_type=\"x\" source_file=\"/m.py\" source_line=201}\n"
                    "  ROOT %multiply.1 = f32[4,8]{1,0} multiply(%dot.1, %logistic.1), metadata={op_type=\"x\" source_file=\"/m.py\" source_line=202}\n}\n\n"
                    "ENTRY %main () -> f32[4,8] {\n  %x = f32[4,8]{1,0} parameter(0)\n  %w1 = f32[8,8]{1,0} parameter(1)\n  %w2 = f32[8,8]{1,0} parameter(2)\n  " +
                    use +
                    "\n  %y = f32[4,8]{1,0} dot(%fusion.7, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_type=\"dot\" source_file=\"/m.py\" "
                    "source_line=203}\n";
    s += reduce ? "  ROOT %ar = f32[4,8]{1,0} all-reduce(%y), replica_groups={{0,1}}, to_apply=%add\n}\n" : "  ROOT %z = f32[4,8]{1,0} negate(%y)\n}\n";
    return s;
  };
  const std::string fusion = "%fusion.7 = f32[4,8]{1,0} fusion(%x, %w1), kind=kLoop, calls=%fused_computation.3";
  const std::string call = "%fusion.7 = f32[4,8]{1,0} call(%x, %w1), to_apply=%fused_computation.3";
  Run ok = check_hlo("hlo_fusion", kHloMlpSeq, module(fusion, true));
  CHECK(ok.code == 0);
  CHECK(ok.out.empty());
  Run called = check_hlo("hlo_call", kHloMlpSeq, module(call, true));
  CHECK(called.code == 0);
  CHECK(called.out.empty());
  // a wrong plan is located at the model's line of an op inside the fusion or after it
  std::string bad = module(fusion, true);
  bad.replace(bad.find("multiply(%dot.1, %logistic.1)"), 29, "add(%dot.1, %logistic.1)     ");
  Run wrong = check_hlo("hlo_fusion_wrong", kHloMlpSeq, bad);
  CHECK(wrong.code == 1);
  CHECK(wrong.out.rfind("/m.py:202: error[value-mismatch]", 0) == 0);
  // errors: an undefined computation, operands that do not match its parameters, a multi-output fusion
  std::string undefined = module("%fusion.7 = f32[4,8]{1,0} fusion(%x, %w1), kind=kLoop, calls=%nowhere", true);
  Run u = check_hlo("hlo_fusion_undefined", kHloMlpSeq, undefined);
  CHECK(u.code == 2);
  CHECK(has(u, "error: fusion of %nowhere, which is not a computation defined before this instruction"));
  Run arity = check_hlo("hlo_fusion_arity", kHloMlpSeq, module("%fusion.7 = f32[4,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_computation.3", true));
  CHECK(arity.code == 2);
  CHECK(has(arity, "error: fusion of %fused_computation.3 passes 1 operands to a computation of 2 parameters"));
  std::string multi = module(fusion, true);
  multi.replace(multi.find("  ROOT %multiply.1"), 8, "  %multiply.1");
  multi.replace(multi.find("\n}\n\nENTRY"), 1, "\n  ROOT %t = (f32[4,8]{1,0}, f32[4,8]{1,0}) tuple(%multiply.1, %dot.1)\n");
  Run m = check_hlo("hlo_fusion_multi", kHloMlpSeq, multi);
  CHECK(m.code == 2);
  CHECK(has(m, "returns a tuple (a multi-output fusion), is not supported yet"));
}

TEST_CASE("import hlo: inputs the fuzzer found (scripts/fuzz.sh import) are located errors") {
  std::string seq = hlo({"%x = f32[4,8]{1,0} parameter(0)", "%y = f32[4,8]{1,0} negate(%x)"});
  // a dot naming a dim its operand does not have (read past the shape before)
  std::string seq_dot = hlo({"%x = f32[4,8]{1,0} parameter(0)", "%w = f32[8,8]{1,0} parameter(1)",
                             "%y = f32[4,8]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}"});
  Run dims = check_hlo("hlo_fuzz_dot_dims", seq_dot,
                       hlo({"%x = f32[4,8]{1,0} parameter(0)", "%w = f32[8,8]{1,0} parameter(1)",
                            "%y = f32[4,8]{1,0} dot(%x, %w), lhs_contracting_dims={7}, rhs_contracting_dims={0}"}, ", replica_count=2"));
  CHECK(dims.code == 2);
  CHECK(has(dims, "error: attribute lhs_contracting_dims [7] names a dim twice or one outside [0, 2)"));
  // a shape cut at the end of its line, the next line starting with digits (strtoll read on past the line)
  std::string cut = hlo({"%x = f32[4,8]{1,0} parameter(0)", "%y = f32[4,8]{1,0} negate(%x)"}, ", replica_count=2");
  cut.replace(cut.find("%y = f32["), 9, "%y = f32[\n12");
  Run line = check_hlo("hlo_fuzz_shape_line", seq, cut);
  CHECK(line.code == 2);
  CHECK(has(line, "error: expected a dimension size"));
  // an integer attribute too large for an integer
  Run big = check_hlo("hlo_fuzz_big_int", seq,
                      hlo({"%x = f32[4,8]{1,0} parameter(0)", "%y = f32[8,4]{1,0} transpose(%x), dimensions={1,99999999999999999999999}"}, ", replica_count=2"));
  CHECK(big.code == 2);
  CHECK(has(big, "transpose: an integer attribute or operand is out of range"));
}

TEST_CASE("import hlo: two formulations of each mapped op agree (and a wrong one does not)") {
  auto pair = [](const std::string& name, const std::vector<std::string>& a, const std::vector<std::string>& b) {
    CAPTURE(name);
    return check_hlo("hlo_pair_" + name, hlo(a, ", replica_count=2"), hlo(b, ", replica_count=2"));
  };
  // dot contracting the rhs's dim 1 = transpose, then dot
  Run dot = pair("dot", {"%x = f32[4,8]{1,0} parameter(0)", "%w = f32[6,8]{1,0} parameter(1)", "%y = f32[4,6]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={1}"},
                 {"%x = f32[4,8]{1,0} parameter(0)", "%w = f32[6,8]{1,0} parameter(1)", "%t = f32[8,6]{0,1} transpose(%w), dimensions={1,0}",
                  "%y = f32[4,6]{1,0} dot(%x, %t), lhs_contracting_dims={1}, rhs_contracting_dims={0}"});
  CHECK(dot.code == 0);
  // batched dot = reshape, dot per batch via batch dims
  Run bdot = pair("bdot",
                  {"%x = f32[2,4,8]{2,1,0} parameter(0)", "%w = f32[2,8,3]{2,1,0} parameter(1)",
                   "%y = f32[2,4,3]{2,1,0} dot(%x, %w), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}"},
                  {"%x = f32[2,4,8]{2,1,0} parameter(0)", "%w = f32[2,8,3]{2,1,0} parameter(1)", "%wt = f32[2,3,8]{2,1,0} transpose(%w), dimensions={0,2,1}",
                   "%y2 = f32[2,3,4]{2,1,0} dot(%wt, %x), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={2}",
                   "%y = f32[2,4,3]{2,1,0} transpose(%y2), dimensions={0,2,1}"});
  CHECK(bdot.code == 0);
  // reduce(add) of a broadcast along a new dim = 3 * x
  Run red = pair("reduce", {"%x = f32[4]{0} parameter(0)", "%c = f32[] constant(3)", "%b = f32[4]{0} broadcast(%c), dimensions={}", "%y = f32[4]{0} multiply(%x, %b)"},
                 {"%x = f32[4]{0} parameter(0)", "%b = f32[4,3]{1,0} broadcast(%x), dimensions={0}", "%z = f32[] constant(0)",
                  "%y = f32[4]{0} reduce(%b, %z), dimensions={1}, to_apply=%add"});
  CHECK(red.code == 0);
  // select(compare GT) = maximum; LT picks the minimum (wrong)
  std::vector<std::string> mx = {"%x = f32[4]{0} parameter(0)", "%y = f32[4]{0} parameter(1)", "%m = f32[4]{0} maximum(%x, %y)"};
  auto sel = [](const char* dir) {
    return std::vector<std::string>{"%x = f32[4]{0} parameter(0)", "%y = f32[4]{0} parameter(1)", std::string("%p = pred[4]{0} compare(%x, %y), direction=") + dir,
                                    "%m = f32[4]{0} select(%p, %x, %y)"};
  };
  Run gt = pair("select", mx, sel("GT"));
  CHECK(gt.code == 0);
  CHECK(!has(gt, "error"));
  // integer data: comparisons without a cast, so the verdict is a proof (equal, not only on drawn trials)
  auto isel = [](const char* dir, const char* a, const char* b) {
    return std::vector<std::string>{"%x = s32[4]{0} parameter(0)", "%y = s32[4]{0} parameter(1)", std::string("%p = pred[4]{0} compare(%x, %y), direction=") + dir,
                                    std::string("%m = s32[4]{0} select(%p, ") + a + ", " + b + ")"};
  };
  std::vector<std::string> imx = {"%x = s32[4]{0} parameter(0)", "%y = s32[4]{0} parameter(1)", "%m = s32[4]{0} maximum(%x, %y)"};
  std::vector<std::string> iy = {"%x = s32[4]{0} parameter(0)", "%y = s32[4]{0} parameter(1)", "%m = s32[4]{0} copy(%y)"};
  // (the same choice at ties: x >= y ? x : y is x < y ? y : x, and x > y ? x : y is x <= y ? y : x)
  Run ige = pair("iselect_ge", isel("GE", "%x", "%y"), isel("LT", "%y", "%x"));
  CHECK(ige.code == 0);
  CHECK(ige.out.empty());
  Run igt = pair("iselect_gt", isel("GT", "%x", "%y"), isel("LE", "%y", "%x"));
  CHECK(igt.code == 0);
  CHECK(igt.out.empty());
  Run ieq = pair("iselect_eq", iy, isel("EQ", "%x", "%y"));
  CHECK(ieq.code == 0);
  CHECK(ieq.out.empty());
  Run ine = pair("iselect_ne", iy, isel("NE", "%y", "%x"));
  CHECK(ine.code == 0);
  CHECK(ine.out.empty());
  Run ibad = pair("iselect_bad", imx, isel("LT", "%x", "%y"));
  CHECK(ibad.code == 1);
  CHECK(has(ibad, "error[value-mismatch]"));
  Run lt = pair("select_bad", mx, sel("LT"));
  CHECK(lt.code == 1);
  CHECK(has(lt, "/h.py:102: error[value-mismatch]"));  // the compare, whose mask the spec never computes
  // slice and concatenate back = x; reshape there and back = x; convert f32 -> f32 = x
  Run cat = pair("concat", {"%x = f32[4,6]{1,0} parameter(0)", "%y = f32[4,6]{1,0} negate(%x)"},
                 {"%x = f32[4,6]{1,0} parameter(0)", "%a = f32[4,2]{1,0} slice(%x), slice={[0:4], [0:2]}", "%b = f32[4,4]{1,0} slice(%x), slice={[0:4], [2:6]}",
                  "%c = f32[4,6]{1,0} concatenate(%a, %b), dimensions={1}", "%r = f32[24]{0} reshape(%c)", "%s = f32[4,6]{1,0} reshape(%r)",
                  "%v = f32[4,6]{1,0} convert(%s)", "%y = f32[4,6]{1,0} negate(%v)"});
  CHECK(cat.code == 0);
  // gather of rows at iota = the rows (IndexSelect); a broadcast to a new leading dim
  Run ga = pair("gather", {"%x = f32[5,3]{1,0} parameter(0)", "%y = f32[5,3]{1,0} exponential(%x)"},
                {"%x = f32[5,3]{1,0} parameter(0)", "%i = s32[5]{0} iota(), iota_dimension=0",
                 "%g = f32[5,3]{1,0} gather(%x, %i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,3}",
                 "%y = f32[5,3]{1,0} exponential(%g)"});
  CHECK(ga.code == 0);
  // the softmax as XLA writes it (max, subtract, exp, sum, divide) and the rest of the unary table
  std::vector<std::string> sm = {"%x = f32[2,4]{1,0} parameter(0)", "%ninf = f32[] constant(-inf)",
                                 "%mx = f32[2]{0} reduce(%x, %ninf), dimensions={1}, to_apply=%max", "%mb = f32[2,4]{1,0} broadcast(%mx), dimensions={0}",
                                 "%d = f32[2,4]{1,0} subtract(%x, %mb)", "%e = f32[2,4]{1,0} exponential(%d)", "%z = f32[] constant(0)",
                                 "%s = f32[2]{0} reduce(%e, %z), dimensions={1}, to_apply=%add", "%sb = f32[2,4]{1,0} broadcast(%s), dimensions={0}",
                                 "%p = f32[2,4]{1,0} divide(%e, %sb)", "%q = f32[2,4]{1,0} sine(%p)", "%k = f32[2,4]{1,0} cosine(%q)",
                                 "%l = f32[2,4]{1,0} add(%k, %p)", "%t = f32[2,4]{1,0} sqrt(%l)", "%u = f32[2,4]{1,0} rsqrt(%t)", "%v = f32[2,4]{1,0} log(%u)"};
  Run soft = pair("softmax", sm, sm);
  CHECK(soft.code == 0);
  CHECK(!has(soft, "error"));
  // XLA's softmax is Softmax (no max reduction left: a max would make the verdict a choice by value); without the
  // max subtracted it is the same value; a sum over the other dim is not a softmax
  std::vector<std::string> sm2(sm.begin(), sm.begin() + 10), plain = sm2, other = sm2;
  plain[4] = "%d = f32[2,4]{1,0} add(%x, %mb0)", plain.insert(plain.begin() + 4, "%mb0 = f32[2,4]{1,0} broadcast(%z0), dimensions={}"),
  plain.insert(plain.begin() + 4, "%z0 = f32[] constant(0)");
  other[7] = "%s = f32[4]{0} reduce(%e, %z), dimensions={0}, to_apply=%add", other[8] = "%sb = f32[2,4]{1,0} broadcast(%s), dimensions={1}";
  Run nomax = pair("softmax_nomax", sm2, plain);
  CHECK(nomax.code == 0);
  CHECK(!has(nomax, "error"));
  CHECK(!has(nomax, "not proved"));
  auto imp = frontends::import_program({"hlo", base() + "hlo_pair_softmax_nomax/seq", base() + "hlo_pair_softmax_nomax/ranks", "", {}, ""});
  CHECK(imp.yaml.find("op: Softmax, in: x, out: seq_p, dim: 1") != std::string::npos);
  CHECK(imp.yaml.find("ReduceMax") == std::string::npos);
  Run wrong = pair("softmax_other_dim", sm2, other);
  CHECK(wrong.code == 1);
  CHECK(has(wrong, "error[value-mismatch]"));
}

TEST_CASE("import hlo: located errors for unreadable modules and unmapped opcodes") {
  std::string ok = hlo({"%x = f32[4]{0} parameter(0)", "%y = f32[4]{0} negate(%x)"}, ", replica_count=2");
  Run unknown = check_hlo("hlo_unknown", ok, hlo({"%x = f32[4]{0} parameter(0)", "%y = c64[4]{0} fft(%x), fft_type=FFT, fft_length={4}"}, ", replica_count=2"));
  CHECK(unknown.code == 2);
  CHECK(has(unknown, "ranks/graph.0.hlo:"));
  CHECK(has(unknown, "unknown element type 'c64'"));
  Run unmapped = check_hlo("hlo_unmapped", ok, hlo({"%x = f32[4]{0} parameter(0)", "%y = f32[4]{0} cbrt(%x)"}, ", replica_count=2"));
  CHECK(unmapped.code == 2);
  CHECK(has(unmapped, "ranks/graph.0.hlo:17:3: error: unsupported op 'cbrt' (node y)"));
  Run malformed = check_hlo("hlo_malformed", ok, hlo({"%x = f32[4]{0} parameter(0)", "%y f32[4]{0} negate(%x)"}, ", replica_count=2"));
  CHECK(malformed.code == 2);
  CHECK(has(malformed, "ranks/graph.0.hlo:17:"));
  CHECK(has(malformed, "expected '=' after the instruction name"));
  Run shape = check_hlo("hlo_contradicts", ok, hlo({"%x = f32[4]{0} parameter(0)", "%y = f32[5]{0} negate(%x)"}, ", replica_count=2"));
  CHECK(shape.code == 2);
  CHECK(has(shape, "ranks/graph.0.hlo:17:3: error: the annotation f32[5] contradicts negate, which gives shape [4] here"));
  Run dot = check_hlo("hlo_contradicts_dot", hlo({"%x = f32[4,2]{1,0} parameter(0)", "%w = f32[3,5]{1,0} parameter(1)", "%y = f32[4,2]{1,0} negate(%x)"}, ", replica_count=2"),
                      hlo({"%x = f32[4,2]{1,0} parameter(0)", "%w = f32[3,5]{1,0} parameter(1)", "%y = f32[4,5]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}"},
                          ", replica_count=2"));
  CHECK(dot.code == 2);
  CHECK(has(dot, "error: dot's contracting dims differ: f32[4, 2] x f32[3, 5]"));
  std::string cut = ok.substr(0, ok.rfind('}'));
  Run trunc = check_hlo("hlo_truncated", ok, cut);
  CHECK(trunc.code == 2);
  CHECK(has(trunc, "error: the ENTRY computation does not end (a truncated file?)"));
  Run cut_line = check_hlo("hlo_truncated_line", ok, ok.substr(0, ok.find("negate(") + 9));
  CHECK(cut_line.code == 2);
  CHECK(has(cut_line, "ranks/graph.0.hlo:17:"));
  Run none = check_hlo("hlo_none", ok, "x = 1\n");
  CHECK(none.code == 2);
  CHECK(has(none, "no `HloModule` header: not HLO module text"));
  Run bits = check_hlo("hlo_bitwise", hlo({"%x = s32[4]{0} parameter(0)", "%y = s32[4]{0} negate(%x)"}, ", replica_count=2"),
                       hlo({"%x = s32[4]{0} parameter(0)", "%y = s32[4]{0} and(%x, %x)"}, ", replica_count=2"));
  CHECK(bits.code == 2);
  CHECK(has(bits, "ranks/graph.0.hlo:17:3: error: bitwise and of i32[4] and i32[4] is not supported yet (only of pred masks)"));
  Run arr = check_hlo("hlo_array", ok, hlo({"%x = f32[4]{0} parameter(0)", "%c = f32[4]{0} constant({1, 2, 3, 4})", "%y = f32[4]{0} add(%x, %c)"}, ", replica_count=2"));
  CHECK(arr.code == 2);
  CHECK(has(arr, "holds an array literal, which is not supported yet"));
}

TEST_CASE("import hlo: `spmdcheck import hlo` writes the program, located at the model's line") {
  std::string d = base() + "hlo_cli";
  fs::remove_all(d);
  write(d + "/seq/graph.0.hlo", kHloMlpSeq);
  write(d + "/ranks/graph.0.hlo", hlo_mlp_rank(true));
  std::string out = d + "/out.yaml";
  Run r = run({"import", "hlo", d + "/seq", d + "/ranks", "-o", out});
  CHECK(r.code == 0);
  Program p = load_program_file(out);
  CHECK(p.local_view);
  CHECK(p.has_spec);
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  CHECK(ss.str().find("AllReduce") != std::string::npos);
  CHECK(ss.str().find("/h.py:107") != std::string::npos);
  Run e = run({"equiv", out});
  CHECK(e.code == 0);
}

TEST_CASE("import hlo: all-reduce-start / all-reduce-done go through the temporal checks; a use before the done is a missing-wait") {
  auto rank = [](bool early) {
    std::vector<std::string> b = {"%x = f32[4,8]{1,0} parameter(0)", "%w1 = f32[8,8]{1,0} parameter(1)", "%w2 = f32[8,8]{1,0} parameter(2)",
                                  "%h = f32[4,8]{1,0} dot(%x, %w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
                                  "%g = f32[4,8]{1,0} logistic(%h)", "%m = f32[4,8]{1,0} multiply(%h, %g)",
                                  "%y = f32[4,8]{1,0} dot(%m, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
                                  "%s = f32[4,8]{1,0} all-reduce-start(%y), replica_groups={{0,1}}, to_apply=%add"};
    if (early) b.push_back("%n = f32[4,8]{1,0} negate(%s)");
    b.push_back("%d = f32[4,8]{1,0} all-reduce-done(%s)");
    b.push_back(early ? "%t = (f32[4,8]{1,0}, f32[4,8]{1,0}) tuple(%d, %n)" : "%t = f32[4,8]{1,0} copy(%d)");
    return hlo(b);
  };
  Run ok = check_hlo("hlo_async", kHloMlpSeq, rank(false));
  CHECK(ok.code == 0);
  CHECK(ok.out.empty());
  Run early = check_hlo("hlo_async_early", kHloMlpSeq, rank(true), {"--relation", relation("hlo_async_early", "outputs: {y: d}\n")});
  CHECK(early.code == 1);
  CHECK(has(early, "/h.py:108: error[missing-wait]: Neg reads s"));
  Run done = check_hlo("hlo_done_alone", kHloMlpSeq, hlo({"%x = f32[4,8]{1,0} parameter(0)", "%d = f32[4,8]{1,0} all-reduce-done(%x)"}, ", replica_count=2"));
  CHECK(done.code == 2);
  CHECK(has(done, "all-reduce-done of 'x', which is not an all-reduce-start"));
}

TEST_CASE("import hlo: a fused QKV weight sharded block by block (relation `blocked:`)") {
  // seq: w = [Q (8) | K (2) | V (2)]; each of 2 devices holds [Q_r (4) | K_r (1) | V_r (1)]
  auto mod = [](const char* w, const char* y, const std::vector<std::string>& slices, const std::string& header) {
    std::vector<std::string> b = {"%x = f32[2,4]{1,0} parameter(0)", std::string("%w = ") + w + " parameter(1)",
                                  std::string("%y = ") + y + " dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}"};
    b.insert(b.end(), slices.begin(), slices.end());
    std::string q = slices[0].substr(0, slices[0].find(' ')), k = slices[1].substr(0, slices[1].find(' '));
    std::string tq = slices[0].substr(slices[0].find("= ") + 2, slices[0].find(' ', slices[0].find("= ") + 2) - slices[0].find("= ") - 2);
    std::string tk = slices[1].substr(slices[1].find("= ") + 2, slices[1].find(' ', slices[1].find("= ") + 2) - slices[1].find("= ") - 2);
    b.push_back("%t = (" + tq + ", " + tk + ") tuple(" + q + ", " + k + ")");
    return hlo(b, header);
  };
  std::string seq = mod("f32[4,12]{1,0}", "f32[2,12]{1,0}", {"%q = f32[2,8]{1,0} slice(%y), slice={[0:2], [0:8]}", "%k = f32[2,2]{1,0} slice(%y), slice={[0:2], [8:10]}"}, "");
  auto rank = [&](const char* kslice) {
    return mod("f32[4,6]{1,0}", "f32[2,6]{1,0}", {"%q = f32[2,4]{1,0} slice(%y), slice={[0:2], [0:4]}", std::string("%k = f32[2,1]{1,0} slice(%y), slice={[0:2], ") + kslice + "}"},
               ", replica_count=2");
  };
  std::string rel = relation("blocked", "blocked:\n  - {shape: [4, 12], dim: 1, sizes: [8, 2, 2]}\n");
  Run ok = check_hlo("hlo_blocked", seq, rank("[4:5]"), {"--relation", rel});
  CHECK(ok.code == 0);
  CHECK(ok.out.empty());
  Run bad = check_hlo("hlo_blocked_bad", seq, rank("[0:1]"), {"--relation", rel});  // K taken from Q's columns
  CHECK(bad.code == 1);
  CHECK(has(bad, "error[value-mismatch]"));
  Run sum = check_hlo("hlo_blocked_sum", seq, rank("[4:5]"), {"--relation", relation("blocked_sum", "blocked:\n  - {shape: [4, 12], dim: 1, sizes: [8, 2, 1]}\n")});
  CHECK(sum.code == 2);
  CHECK(has(sum, "blocked_sum.relation.yaml:2:"));
  CHECK(has(sum, "the blocks' sizes do not add up to the dim"));
  // without the relation, w [4, 12] held as [4, 6] is inferred S(1) (contiguous halves): not what the ranks compute
  Run none = check_hlo("hlo_blocked_none", seq, rank("[4:5]"));
  CHECK(none.code == 1);
  CHECK(has(none, "error[value-mismatch]"));
}
