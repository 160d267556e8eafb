// interp/ops_mask.cpp - the numeric oracle: counts and running sums.
//
// Ops: OneHot, Bincount, CumSum (the comparisons and And/Or/Not are elementwise: ops_elementwise.cpp). Ids index
// by their real value (as_index); a one-hot or a count is an exact integer, decided by value (Runner::decide).
#include "interp/runner.h"

namespace spmd::interp {

// OneHot(ids, classes: C): ids[..., C], 1 at each id. The new last dim is whole; the ids' layout carries over.
void Runner::one_hot(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const Val& ids = in(oi, r, 0);
  std::int64_t C = size_of(op, "classes", 1);
  note_range(p_.ins(op)[0], C);
  Val o;
  o.gshape = ids.gshape;
  o.gshape.push_back(C);
  o.mask = ids.mask;
  o.mask.push_back(0);
  o.ord = ids.ord;
  if (!o.ord.empty()) o.ord.push_back(0);
  Shape ls = ids.t.shape;
  ls.push_back(C);
  check_size(ls);
  o.t = Tensor(ls, 0.0);
  for (std::size_t e = 0; e < ids.t.data.size(); ++e) {
    std::int64_t at = as_index(ids.t.data[e], C, "OneHot id");
    for (std::int64_t j = 0; j < C; ++j) o.t.data[e * static_cast<std::size_t>(C) + static_cast<std::size_t>(j)] = decide(oi, j == at, ids.t.data[e], nullptr);
  }
  set_out(oi, r, 0, std::move(o), taint);
}

// Bincount(ids, length: L): counts[L] of the ids this rank holds (sharded ids: each rank's own counts, whose sum
// over the ranks is the whole count).
void Runner::bincount(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const Val& ids = in(oi, r, 0);
  std::int64_t L = size_of(op, "length", 1);
  note_range(p_.ins(op)[0], L);
  check_size({L});
  std::vector<std::int64_t> count(static_cast<std::size_t>(L), 0);
  for (const Num& id : ids.t.data) {
    decide(oi, true, id, nullptr);  // a count of float data chooses by value
    ++count[static_cast<std::size_t>(as_index(id, L, "Bincount id"))];
  }
  Val o;
  o.gshape = {L};
  o.mask = {0};
  o.t = Tensor({L}, 0.0);
  for (std::int64_t j = 0; j < L; ++j) o.t.data[static_cast<std::size_t>(j)] = Num(static_cast<double>(count[static_cast<std::size_t>(j)]));
  charge(ids.t.numel());
  set_out(oi, r, 0, std::move(o), taint);
}

// CumSum(x, dim, reverse): the running sum along the rank's local dim (a sharded dim gives each rank the running
// sum of its own block, which the assembly shows to be wrong: the checker asks for the dim whole).
void Runner::cumsum(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  Val v = in(oi, r, 0);
  int d = norm_dim(op.attrs.dim, v.t.rank());
  const bool rev = op.attrs.reverse;
  for_each_group(v.t, {d}, [rev](std::vector<Num>& line) {
    if (line.empty()) return;
    if (!rev)
      for (std::size_t i = 1; i < line.size(); ++i) line[i] = line[i - 1] + line[i];
    else
      for (std::size_t i = line.size() - 1; i-- > 0;) line[i] = line[i + 1] + line[i];
  });
  set_out(oi, r, 0, std::move(v), taint);
}

}  // namespace spmd::interp
