// interp/ops_moe.cpp - the numeric oracle: mixture-of-experts token exchange.
//
// Ops: MoEDispatch, MoECombine (run across the group of their axis, from step_group). ExpertCompute is a batched
// MatMul (runner.cpp). Each rank routes its own tokens literally, as Megatron's and DeepSpeed's dispatchers do:
// per expert, its tokens in order take the rank's C/n capacity slots (the rest are dropped), then an all-to-all
// sends expert block j to rank j, which lays the n source ranks' slots side by side. The single-device run sees
// all tokens at once and routes them in the n groups of the real mesh, so a correct program agrees slot by slot.
#include "interp/runner.h"

namespace spmd::interp {

namespace {

std::int64_t prod(const Shape& s, std::size_t from, std::size_t to) {
  std::int64_t n = 1;
  for (std::size_t d = from; d < to; ++d) n *= s[d];
  return n;
}

}  // namespace

// The capacity slot of every (batch, token, choice) of one member's tokens, or -1 when dropped: G groups of
// tokens each fill c slots per expert, group g at [g*c, (g+1)*c).
std::vector<std::int64_t> Runner::moe_slots(const Val& idx, std::int64_t E, std::int64_t G, std::int64_t c, NameId idx_name) {
  note_range(idx_name, E);
  const Shape& s = idx.t.shape;
  std::size_t nl = s.size() - 2;
  std::int64_t B = prod(s, 0, nl), T = s[nl], K = s[nl + 1];
  if (G <= 0 || T % G)
    throw InterpError("MoE routing of " + std::to_string(T) + " local tokens cannot form " + std::to_string(G) + " capacity groups");
  std::int64_t per = T / G;
  std::vector<std::int64_t> slot(static_cast<std::size_t>(B * T * K), -1);
  std::vector<std::int64_t> count(static_cast<std::size_t>(E));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t g = 0; g < G; ++g) {
      std::fill(count.begin(), count.end(), 0);
      for (std::int64_t t = g * per; t < (g + 1) * per; ++t)
        for (std::int64_t j = 0; j < K; ++j) {
          std::size_t at = static_cast<std::size_t>((b * T + t) * K + j);
          std::int64_t e = as_index(idx.t.data[at], E, "a MoE routing index");
          std::int64_t sl = count[static_cast<std::size_t>(e)]++;
          if (sl < c) slot[at] = g * c + sl;
        }
    }
  charge(B * T * K);
  return slot;
}

void Runner::moe(int oi, const std::vector<std::int64_t>& members) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  bool dispatch = op.kind == OpKind::MoEDispatch;
  auto n = static_cast<std::int64_t>(members.size());
  // capacity groups per member: the single-device run holds every rank's tokens
  const std::int64_t G = global_ ? ranks_over(op.attrs.axes, real_sizes_) : 1;
  std::string taint = global_ ? taint_of(oi, members[0]) : "";
  NameId idx_name = p_.ins(op)[1];
  bool weighted = op.n_in == 3;
  std::vector<Val> outs(static_cast<std::size_t>(n));
  auto check_routing = [&](const Val& idx, const Val* w, const Shape& data, std::size_t nl, std::int64_t T) {
    if (idx.t.rank() != static_cast<int>(nl) + 2) throw InterpError("MoE routing indices must be [..., T, k]");
    for (std::size_t d = 0; d < nl; ++d)
      if (idx.t.shape[d] != data[d])
        throw InterpError("MoE routing and data local batch dims differ: " + shape_text(idx.t.shape) + " vs " + shape_text(data));
    if (T >= 0 && idx.t.shape[nl] != T)
      throw InterpError("MoE routing covers " + std::to_string(idx.t.shape[nl]) + " local tokens, the data " + std::to_string(T));
    if (w && w->t.shape != idx.t.shape)
      throw InterpError("MoE routing weights " + shape_text(w->t.shape) + " do not match the indices " + shape_text(idx.t.shape));
  };
  if (dispatch) {
    const auto& buf = p_.shapes[op.attrs.shape];
    std::int64_t E = eval(buf[0], "the expert count of MoEDispatch"), C = eval(buf[1], "the capacity of MoEDispatch");
    if (C % (n * G) || E % n)
      throw InterpError("MoEDispatch cannot split " + std::to_string(E) + " experts and " + std::to_string(C) + " slots over " +
                        std::to_string(n * G) + " ranks");
    std::int64_t c = C / (n * G);
    std::vector<Tensor> local(static_cast<std::size_t>(n));
    const Val* x0 = nullptr;
    for (std::int64_t k = 0; k < n; ++k) {
      const Val& x = in(oi, members[static_cast<std::size_t>(k)], 0);
      const Val& idx = in(oi, members[static_cast<std::size_t>(k)], 1);
      const Val* w = weighted ? &in(oi, members[static_cast<std::size_t>(k)], 2) : nullptr;
      if (x.t.rank() < 2) throw InterpError("MoEDispatch tokens must be [..., T, H]");
      std::size_t nl = x.t.shape.size() - 2;
      check_routing(idx, w, x.t.shape, nl, x.t.shape[nl]);
      std::int64_t B = prod(x.t.shape, 0, nl), T = x.t.shape[nl], H = x.t.shape[nl + 1], K = idx.t.shape[nl + 1];
      auto slot = moe_slots(idx, E, G, c, idx_name);
      Shape ls(x.t.shape.begin(), x.t.shape.begin() + static_cast<std::ptrdiff_t>(nl));
      ls.push_back(E), ls.push_back(G * c), ls.push_back(H);
      check_size(ls);
      Tensor L(ls);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t j = 0; j < K; ++j) {
            std::size_t at = static_cast<std::size_t>((b * T + t) * K + j);
            if (slot[at] < 0) continue;
            std::int64_t e = static_cast<std::int64_t>(idx.t.data[at].d);
            const Num wt = w ? w->t.data[at] : Num(1.0);
            std::int64_t dst = ((b * E + e) * G * c + slot[at]) * H, src = (b * T + t) * H;
            for (std::int64_t h = 0; h < H; ++h) L.data[static_cast<std::size_t>(dst + h)] = wt * x.t.data[static_cast<std::size_t>(src + h)];
          }
      charge(L.numel());
      local[static_cast<std::size_t>(k)] = std::move(L);
      if (k == 0) x0 = &x;
    }
    std::size_t nl = x0->gshape.size() - 2;
    for (std::int64_t j = 0; j < n; ++j) {
      const Val& x = in(oi, members[static_cast<std::size_t>(j)], 0);
      Val o;
      o.gshape.assign(x.gshape.begin(), x.gshape.begin() + static_cast<std::ptrdiff_t>(nl));
      o.gshape.push_back(E), o.gshape.push_back(C), o.gshape.push_back(x.gshape[nl + 1]);
      o.mask.assign(x.mask.begin(), x.mask.begin() + static_cast<std::ptrdiff_t>(nl));
      o.mask.push_back(op.attrs.axes), o.mask.push_back(0), o.mask.push_back(x.mask[nl + 1]);
      if (n == 1) {
        o.t = std::move(local[0]);
      } else {  // expert block j of every member, the members' slots side by side
        std::vector<Tensor> parts;
        for (std::int64_t k = 0; k < n; ++k)
          parts.push_back(slice(local[static_cast<std::size_t>(k)], static_cast<int>(nl), j * (E / n), (j + 1) * (E / n)));
        o.t = concat(parts, static_cast<int>(nl) + 1);
      }
      outs[static_cast<std::size_t>(j)] = std::move(o);
    }
  } else {
    const Val& y0 = in(oi, members[0], 0);
    if (y0.t.rank() < 3) throw InterpError("MoECombine expert outputs must be [..., E, C, H]");
    std::size_t nl = y0.t.shape.size() - 3;
    std::int64_t El = y0.t.shape[nl], Cl = y0.t.shape[nl + 1], E = El * n;
    if (Cl % (n * G)) throw InterpError("MoECombine cannot split " + std::to_string(Cl) + " capacity slots over " + std::to_string(n * G) + " ranks");
    std::int64_t c = Cl / (n * G);
    for (std::int64_t k = 0; k < n; ++k) {
      const Val& y = in(oi, members[static_cast<std::size_t>(k)], 0);
      if (y.t.shape != y0.t.shape) throw InterpError("MoECombine ranks hold expert outputs of different shapes");
    }
    for (std::int64_t k = 0; k < n; ++k) {
      const Val& idx = in(oi, members[static_cast<std::size_t>(k)], 1);
      const Val* w = weighted ? &in(oi, members[static_cast<std::size_t>(k)], 2) : nullptr;
      check_routing(idx, w, y0.t.shape, nl, -1);
      // member k's slots of every expert: from rank j, expert block j
      Tensor Bk;
      if (n == 1) {
        Bk = y0.t;
      } else {
        std::vector<Tensor> parts;
        for (std::int64_t j = 0; j < n; ++j)
          parts.push_back(slice(in(oi, members[static_cast<std::size_t>(j)], 0).t, static_cast<int>(nl) + 1, k * c, (k + 1) * c));
        Bk = concat(parts, static_cast<int>(nl));
      }
      std::int64_t B = prod(idx.t.shape, 0, nl), T = idx.t.shape[nl], K = idx.t.shape[nl + 1], H = y0.t.shape[nl + 2], GC = G * c;
      auto slot = moe_slots(idx, E, G, c, idx_name);
      Shape os(idx.t.shape.begin(), idx.t.shape.begin() + static_cast<std::ptrdiff_t>(nl));
      os.push_back(T), os.push_back(H);
      Tensor O(os);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t j = 0; j < K; ++j) {
            std::size_t at = static_cast<std::size_t>((b * T + t) * K + j);
            if (slot[at] < 0) continue;
            std::int64_t e = static_cast<std::int64_t>(idx.t.data[at].d);
            const Num wt = w ? w->t.data[at] : Num(1.0);
            std::int64_t src = ((b * E + e) * GC + slot[at]) * H, dst = (b * T + t) * H;
            for (std::int64_t h = 0; h < H; ++h) O.data[static_cast<std::size_t>(dst + h)] += wt * Bk.data[static_cast<std::size_t>(src + h)];
          }
      charge(O.numel() * K);
      const Val& y = in(oi, members[static_cast<std::size_t>(k)], 0);
      Val o;
      o.gshape.assign(y.gshape.begin(), y.gshape.begin() + static_cast<std::ptrdiff_t>(nl));
      o.gshape.push_back(idx.gshape[nl]), o.gshape.push_back(y.gshape[nl + 2]);
      o.mask.assign(y.mask.begin(), y.mask.begin() + static_cast<std::ptrdiff_t>(nl));
      o.mask.push_back(idx.mask[nl]), o.mask.push_back(y.mask[nl + 2]);
      o.t = std::move(O);
      outs[static_cast<std::size_t>(k)] = std::move(o);
    }
  }
  for (std::int64_t k = 0; k < n; ++k) set_out(oi, members[static_cast<std::size_t>(k)], 0, std::move(outs[static_cast<std::size_t>(k)]), taint);
}

}  // namespace spmd::interp
