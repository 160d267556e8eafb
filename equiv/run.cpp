// equiv/run.cpp - one run of a plan and its model on drawn inputs, with the stage cuts (docs/equivalence.md,
// "Stages" and "Pipelines"): the inputs declared on the plan's ranks and assembled for the model, both programs run,
// each cut point's lanes replaced by a random function of them once plan and spec agree there, every op's value
// recorded when localization asks (the spec on a second thread beside the plan when the trial has the machine to
// itself: Setup::split); and the cut points of a pipelined plan.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "equiv/equiv_impl.h"
#include "equiv/pipeline.h"
#include "equiv/training.h"
#include "interp/num.h"
#include "interp/runner.h"

namespace spmd::equiv_detail {
namespace {

constexpr std::uint64_t kCutKey = 0x5ea9e0c07ULL;

// The cut: the lanes of every element replaced by a random function of them, keyed by the cut point (the same in
// both runs); the double stays. Downstream of a verified cut the exact lanes see a fresh variable (degree 1); an
// exact constant (degree 0) stays as it is. A value equal bit for bit to the one `memo` (if any) holds for this point gets the same result, its
// evaluations counted.
void cut_lanes(Tensor& t, int c, CutMemo* memo) {
  const auto tag = static_cast<std::uint32_t>(c) + 1;  // downstream random functions are this stage's own
  const std::size_t n = t.data.size();
  if (memo)
    for (const auto& [src, out] : memo->done)
      if (src.shape == t.shape && (n == 0 || std::memcmp(src.data.data(), std::as_const(t).data.data(), n * sizeof(Num)) == 0)) {
        num::count_evaluations(tag, n);
        t = out;
        return;
      }
  const Tensor src = t;
  t = Tensor::uninit(src.shape);
  Num* o = t.data.data();
  bool plain = true;
  for (std::size_t i = 0; i < n; ++i) {
    const Num& e = src.data[i];
    if (e.deg == 0) {  // an exact constant (integer data, positions, masks of them): no degree to cut, and a
      o[i] = e;        // comparison downstream still decides on exact data (Runner::inexact_choice)
      continue;
    }
    plain &= num::plain(e);
    Num r;  // no log part, degree 1
    r.d = e.d;
    r.tag = tag;
    for (int l = 0; l < kLanes; ++l) {
      Fp x = e.pure(l);
      r.f[l] = num::rf(kCutKey + static_cast<std::uint64_t>(c), &x, 1, l, r.tag);
    }
    r.deg = 1;
    o[i] = r;
  }
  if (!memo || !plain) return;  // (a log part's purification counts evaluations of its own)
  constexpr std::size_t kKept = 8;
  if (memo->done.size() < kKept)
    memo->done.emplace_back(src, t);
  else
    memo->done[memo->next++ % kKept] = {src, t};
}

void round_to_small_ints(Val& v, DType dt) {
  if (is_int(dt)) return;
  for (auto& e : v.t.data) e.d = std::clamp(std::round(e.d * 1.25), -2.0, 2.0);
}


// The bytes of n per-rank Val slots (held whatever they hold: a pipeline rank's op has one rank's value).
std::int64_t slot_bytes(std::int64_t n) { return n * static_cast<std::int64_t>(sizeof(Val)); }

// Charges n slots to the run's byte budget with the live values, before they are made; over it, `what` is too large.
void charge_slots(Run& run, std::int64_t n, const char* what) {
  run.record_bytes += slot_bytes(n);
  if (live_bytes() + run.record_bytes > alloc_limits().max_bytes)
    throw BudgetError(std::string("the run is too large for the interpreter: ") + what + " would hold more than " +
                      std::to_string(alloc_limits().max_bytes >> 20) + " MiB", true);
}

struct WindowDone {};  // thrown by a run recording some ops once it has them all
struct Stopped {};     // thrown by the spec's run on its thread once the plan's has failed

// The spec's run on its thread and the plan's: which cut points the spec has written, and when it is done (under
// the mutex, which orders the spec's writes of Run::model_cut before the plan's reads).
struct SpecSync {
  std::mutex mu;
  std::vector<char> ready;                  // per cut point: the spec's value is in Run::model_cut
  std::vector<int> order;                   // the points in the order the spec wrote them
  bool done = false;
  std::atomic<std::int64_t> published{0};   // order's size (the plan's thread looks again when it grows)
  std::atomic<bool> stop{false};            // the plan's run failed: the spec's stops
  std::atomic<bool> spec_failed{false};     // the spec's run failed: the plan's stops (the spec's failure is the run's)
  void publish(int c) {
    std::lock_guard<std::mutex> lock(mu);
    ready[static_cast<std::size_t>(c)] = 1;
    order.push_back(c);
    published.store(static_cast<std::int64_t>(order.size()), std::memory_order_release);
  }
  bool is_ready(std::size_t c) {
    std::lock_guard<std::mutex> lock(mu);
    return done || ready[c];
  }
  // the points written since the first `from`
  std::vector<int> since(std::size_t from) {
    std::lock_guard<std::mutex> lock(mu);
    return from < order.size() ? std::vector<int>(order.begin() + static_cast<std::ptrdiff_t>(from), order.end()) : std::vector<int>{};
  }
  void finish() {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
};

}  // namespace

std::unique_ptr<Run> run_once(Setup& s, std::uint64_t seed, bool small_ints, bool record, std::int64_t& work, bool cut) {
  auto run = std::make_unique<Run>();
  const Program& p = s.p;
  // The spec on a second thread beside the plan (Setup::split): a run recording nothing, in the lanes without sets
  // (whose recorded sets the two runs would not share).
  const bool split = s.split && !record && num::on() && !num::lane_params().sets;
  run->model_work = work;  // (the spec's own counter when it runs on its thread: added to `work` after it)
  run->plan = std::make_unique<Runner>(p, s.inst.vars, s.inst.mesh, false, s.oo, work);
  run->model = std::make_unique<Runner>(s.model, s.inst.vars, std::vector<std::int64_t>(s.inst.mesh.size(), 1), true, s.oo, split ? run->model_work : work,
                                        s.inst.mesh);
  Runner& dist = *run->plan;
  Runner& one = *run->model;
  if (!s.value_mesh.empty()) dist.set_value_sizes(s.value_mesh);
  dist.real_shapes = s.plan_real;
  one.real_shapes = s.model_real;
  try {
    for (std::size_t i = 0; i < p.tensors.size(); ++i) {
      const TensorDecl& t = p.tensors[i];
      std::int64_t range = s.ranges[static_cast<std::size_t>(t.name)];
      dist.declare(t, range, seed);
      one.declare(s.model.tensors[i], range, seed);
      if (small_ints)
        for (std::int64_t r = 0; r < dist.ranks(); ++r) round_to_small_ints(dist.at(r, t.name), t.dtype);
    }
    // A pipeline's microbatch inputs: part k of each rank's block of the batch input (the microbatch split is lineage).
    if (s.pair)
      for (const auto& mb : s.pair->microbatches)
        for (std::int64_t r = 0; r < dist.ranks(); ++r) {
          const Tensor& src = dist.at(r, mb.source).t;
          std::int64_t n = src.shape[static_cast<std::size_t>(mb.dim)];
          dist.at(r, mb.name).t = slice(src, mb.dim, n * mb.part / mb.parts, n * (mb.part + 1) / mb.parts);
        }
    for (const auto& t : p.tensors) {
      Assembled a = assemble(p, dist, t.name, t.placement, s.oo);
      if (a.ok) one.at(0, t.name).t = std::move(a.t);
    }
  } catch (const BudgetError&) {
    throw;  // too large to run: not checked (check_pair)
  } catch (const std::runtime_error& e) {
    run->failure = std::string("the inputs cannot be built: ") + e.what();
    return run;
  }
  cut = cut && num::on() && s.n_cuts > 0;
  if (record) {
    run->model_vals.assign(s.model.ops.size(), {});
    run->plan_vals.assign(p.ops.size(), {});
  }
  if (cut) {
    run->model_cut.assign(static_cast<std::size_t>(s.n_cuts), {});
    charge_slots(*run, s.n_cuts * dist.ranks(), "its stage cuts' per-rank slots");  // a slot per cut and rank
    run->plan_cut.assign(static_cast<std::size_t>(s.n_cuts), std::vector<Val>(static_cast<std::size_t>(dist.ranks())));
    run->cut_left.assign(static_cast<std::size_t>(s.n_cuts), dist.ranks());
    run->cut_ok = s.cut_off;  // (a point not cut needs no check)
    run->cut_memo.assign(static_cast<std::size_t>(s.n_cuts), {});
    // A pipeline's point: one write per instance on each rank whose program writes it (a Recv's copy is not one);
    // every such rank writes each microbatch's once, or the point is not checked (so it does not hold).
    if (std::any_of(s.cut_mb.begin(), s.cut_mb.end(), [](char m) { return m != 0; })) {
      run->plan_cut_mb.resize(static_cast<std::size_t>(s.n_cuts));
      std::vector<std::vector<std::int64_t>> writes(static_cast<std::size_t>(s.n_cuts));
      for (std::size_t c = 0; c < s.cut_mb.size(); ++c)
        if (s.cut_mb[c]) run->cut_left[c] = 0, writes[c].assign(static_cast<std::size_t>(dist.ranks()), 0);
      for (std::int64_t r = 0; r < dist.ranks(); ++r) {
        auto [from, to] = dist.op_range(r);
        for (std::uint32_t oi = from; oi < to; ++oi) {
          const Op& op = p.ops[oi];
          if (op.kind == OpKind::Recv) continue;
          for (std::size_t k = 0; k < op.n_out; ++k)
            if (int c = s.plan_cut[static_cast<std::size_t>(p.outs(op)[k])]; c >= 0 && s.cut_mb[static_cast<std::size_t>(c)] && s.plan_final[op.first + op.n_in + k])
              ++writes[static_cast<std::size_t>(c)][static_cast<std::size_t>(r)];
        }
      }
      for (std::size_t c = 0; c < s.cut_mb.size(); ++c) {
        if (!s.cut_mb[c]) continue;
        MbCut& m = run->plan_cut_mb[c];
        std::int64_t holders = 0;
        for (std::int64_t w : writes[c]) {
          if (w == 0) continue;
          ++holders;
          m.failed |= w != s.n_mb;
        }
        run->cut_left[c] = holders * s.n_mb;
        m.inst.assign(static_cast<std::size_t>(s.n_mb), {});
        m.left.assign(static_cast<std::size_t>(s.n_mb), holders);
      }
    }
  }
  run->windowed = record && !s.record_plan.empty();
  // A run recording some ops only stops once it has them all (the spec's, then the plan's on every rank running them).
  std::int64_t model_left = 0, plan_left = 0;
  if (run->windowed) {
    for (char m : s.record_model) model_left += m;
    for (std::int64_t r = 0; r < dist.ranks(); ++r) {
      auto [from, to] = dist.op_range(r);
      for (std::uint32_t oi = from; oi < to; ++oi) plan_left += s.record_plan[oi];
    }
  }
  if ((!record || run->windowed) && !s.plan_keep.empty()) dist.free_dead(s.plan_keep), one.free_dead(s.model_keep);
  // A cut point is checked once the spec has written it and the plan's every rank (every instance of a pipeline's
  // point) has: on one thread the spec ran first; beside it, a check whose spec value is not written yet waits (its
  // plan values held) and is taken once it is. The first point found not to hold is the first the plan completed.
  SpecSync sync;
  if (split) sync.ready.assign(static_cast<std::size_t>(s.n_cuts), 0);
  auto ready = [&](std::size_t c) { return !split || sync.is_ready(c); };
  std::vector<std::int64_t> complete_at(cut ? static_cast<std::size_t>(s.n_cuts) : 0, -1);
  std::int64_t completed = 0;
  std::size_t seen = 0;  // the points written by the spec that the plan's thread has looked at
  std::vector<std::vector<std::size_t>> pending_mb(complete_at.size());  // per point: microbatch instances waiting
  std::vector<char> pending_finish(complete_at.size(), 0);                // points complete in the plan, waiting
  std::size_t n_pending = 0;
  auto finish = [&, r = run.get()](std::size_t cu) {
    if (cu < s.cut_mb.size() && s.cut_mb[cu]) {
      const MbCut& m = r->plan_cut_mb[cu];
      r->cut_ok[cu] = !m.failed && m.checked == s.n_mb;
      r->plan_cut_mb[cu] = MbCut{};
    } else {
      r->cut_ok[cu] = cut_holds(s, r->plan_cut[cu], r->model_cut[cu]);
      r->plan_cut[cu].clear();
    }
    const int c = static_cast<int>(cu);
    if (!r->cut_ok[cu] && (r->first_failed_cut < 0 || complete_at[cu] < complete_at[static_cast<std::size_t>(r->first_failed_cut)])) r->first_failed_cut = c;
    r->model_cut[cu] = Tensor();
  };
  auto check_now = [&, r = run.get()](std::size_t cu, std::size_t k) {
    mb_cut_step(s, r->plan_cut_mb[cu], k, r->model_cut[cu]);
    r->record_bytes -= slot_bytes(dist.ranks());
  };
  // the waiting instances of point cu, in the order they were written (its spec value is written)
  auto flush = [&](std::size_t cu) {
    n_pending -= pending_mb[cu].size();
    for (std::size_t k : std::exchange(pending_mb[cu], {})) check_now(cu, k);
  };
  auto check_instance = [&](std::size_t cu, std::size_t k) {
    if (!ready(cu)) return pending_mb[cu].push_back(k), void(++n_pending);
    flush(cu);
    check_now(cu, k);
  };
  auto complete = [&](std::size_t cu) {  // every rank has written the point (every instance)
    complete_at[cu] = completed++;
    if (!ready(cu)) return pending_finish[cu] = 1, void(++n_pending);
    flush(cu);
    finish(cu);
  };
  // the waiting checks of point cu, once the spec has written it
  auto take = [&](std::size_t cu) {
    flush(cu);
    if (pending_finish[cu]) pending_finish[cu] = 0, --n_pending, finish(cu);
  };
  // the points the spec has written since the plan's thread last looked (every point once it is done)
  auto take_pending = [&](bool all) {
    if (all) {
      for (std::size_t cu = 0; cu < pending_mb.size(); ++cu) take(cu);
      return;
    }
    std::vector<int> fresh = sync.since(seen);
    seen += fresh.size();
    for (int c : fresh) take(static_cast<std::size_t>(c));
  };
  if (record || cut) {
    one.after_op = [&, r = run.get()](int oi, std::int64_t) {
      const Op& op = s.model.ops[static_cast<std::size_t>(oi)];
      if (record && (s.record_model.empty() || s.record_model[static_cast<std::size_t>(oi)])) {
        auto& slot = r->model_vals[static_cast<std::size_t>(oi)];
        slot.clear();
        for (NameId n : s.model.outs(op)) slot.push_back(one.at(0, n).t);
        if (r->windowed && --model_left == 0) throw WindowDone{};
      }
      if (cut)
        for (NameId n : s.model.outs(op))
          if (int c = s.model_cut[static_cast<std::size_t>(n)]; c >= 0 && !s.cut_off[static_cast<std::size_t>(c)] && s.model_last[static_cast<std::size_t>(n)] == oi) {
            cut_lanes(one.at(0, n).t, c, nullptr);
            r->model_cut[static_cast<std::size_t>(c)] = one.at(0, n).t;  // (compared after the cut: no copy)
            if (split) sync.publish(c);  // (this thread does not touch the handle again: the plan's thread drops it)
          }
      if (split && sync.stop.load(std::memory_order_relaxed)) throw Stopped{};
    };
    dist.after_op = [&, r = run.get()](int oi, std::int64_t rank) {
      const Op& op = p.ops[static_cast<std::size_t>(oi)];
      if (record && (s.record_plan.empty() || s.record_plan[static_cast<std::size_t>(oi)])) {
        auto& slot = r->plan_vals[static_cast<std::size_t>(oi)];
        if (slot.empty()) {
          // (ops x ranks of slots in all)
          charge_slots(*r, static_cast<std::int64_t>(op.n_out) * dist.ranks(), "recording every value of every rank");
          slot.assign(op.n_out, std::vector<Val>(static_cast<std::size_t>(dist.ranks()))), r->plan_order.push_back(oi);
        }
        int k = 0;
        for (NameId n : p.outs(op)) slot[static_cast<std::size_t>(k++)][static_cast<std::size_t>(rank)] = dist.at(rank, n);
        if (r->windowed && --plan_left == 0) throw WindowDone{};
      }
      if (cut && op.kind != OpKind::Recv)  // a received value is its Send's, already cut on the sender (per-rank programs)
        for (std::size_t k = 0; k < op.n_out; ++k)
          if (NameId n = p.outs(op)[k]; s.plan_cut[static_cast<std::size_t>(n)] >= 0 && s.plan_final[op.first + op.n_in + k]) {
            int c = s.plan_cut[static_cast<std::size_t>(n)];
            auto cu = static_cast<std::size_t>(c);
            if (s.cut_off[cu]) continue;
            const bool mb = s.cut_mb[cu];
            if (mb) {  // an instance of a pipeline's point: microbatch k is checked once every holder has written it
              int k = s.pair->mb[static_cast<std::size_t>(oi)];
              MbCut& m = r->plan_cut_mb[cu];
              if (k < 0 || k >= s.n_mb) continue;  // (never: such a name is no point; unchecked, the run is redone without cuts)
              auto ku = static_cast<std::size_t>(k);
              if (m.inst[ku].empty()) {  // a slot per rank, charged while held
                charge_slots(*r, dist.ranks(), "its stage cuts' per-rank slots");
                m.inst[ku].resize(static_cast<std::size_t>(dist.ranks()));
              }
              if (r->cut_memo[cu].mb != k) r->cut_memo[cu] = CutMemo{}, r->cut_memo[cu].mb = k;  // (replicas of one instance)
              cut_lanes(dist.at(rank, n).t, c, &r->cut_memo[cu]);
              m.inst[ku][static_cast<std::size_t>(rank)] = dist.at(rank, n);
              if (--m.left[ku] == 0) check_instance(cu, ku);
            } else {
              cut_lanes(dist.at(rank, n).t, c, &r->cut_memo[cu]);
              r->plan_cut[cu][static_cast<std::size_t>(rank)] = dist.at(rank, n);
            }
            if (--r->cut_left[cu] == 0) {  // every rank has it (every instance): check it now and drop the copies
              r->cut_memo[cu] = CutMemo{};
              complete(cu);
            }
          }
      if (split && n_pending > 0 && static_cast<std::size_t>(sync.published.load(std::memory_order_acquire)) != seen) take_pending(false);
      if (split && sync.spec_failed.load(std::memory_order_relaxed)) throw Stopped{};
    };
  }
  // The spec, then the plan: a failure is the run's (a BudgetError goes to the caller: too large to run).
  auto fail = [&](Runner* side, const std::runtime_error& e) {
    run->plan_failed = side == &dist;
    run->failure = std::string(run->plan_failed ? "the plan's" : "the spec's") + " run fails: " + e.what();
    run->failed_op = side->failed_op;
  };
  if (split) {
    // The spec on its thread: the same lanes and byte count (each side's values are the trial's), its own work
    // counter; its random-function evaluations are counted here after it (pairs of the two runs' can collide).
    std::exception_ptr spec_error;
    std::vector<std::uint64_t> spec_evals;
    bool spec_field_failed = false;
    const num::LaneParams lanes = num::lane_params();
    ByteCount* bytes = byte_count();
    const AllocLimits limits = alloc_limits();
    const std::int64_t work0 = work;
    std::thread th;
    try {
      s.split_ran = true;  // (before the thread: a budget error on either side may follow at once)
      th = std::thread([&] {
        share_byte_count(bytes, limits);
        {
          num::Lanes guard(lanes);
          try {
            one.run(seed);
          } catch (...) {
            spec_error = std::current_exception();
            sync.spec_failed.store(true, std::memory_order_relaxed);
          }
          spec_evals = num::tag_evaluations();
          spec_field_failed = num::trial_failed();
        }
        sync.finish();
        share_byte_count(nullptr, AllocLimits{});
      });
    } catch (const std::system_error&) {  // no second thread: the spec on this one first, as without split
      s.split_ran = false;
      try {
        one.run(seed);
      } catch (const BudgetError&) {
        throw;
      } catch (const std::runtime_error& e) {
        fail(&one, e);
        return run;
      }
      sync.finish();
    }
    std::exception_ptr plan_error;
    try {
      dist.run(seed);
    } catch (...) {
      plan_error = std::current_exception();
      sync.stop.store(true, std::memory_order_relaxed);
    }
    if (th.joinable()) {  // (the spec's thread finishes its run; without it, the spec ran first on this one)
      th.join();
      // (what the spec's thread freed is in the one malloc arena both threads share, interp/tensor.cpp tune_heap:
      // the next run reuses it)
    }
    num::add_evaluations(spec_evals);
    if (spec_field_failed) num::mark_failed();
    const std::int64_t spec_used = run->model_work - work0;
    // the spec's error first (the plan's was made beside it): as when the spec runs first
    for (auto [side, err] : {std::pair{&one, spec_error}, std::pair{&dist, plan_error}}) {
      if (!err) continue;
      try {
        std::rethrow_exception(err);
      } catch (const Stopped&) {
        continue;  // (stopped after the plan's own error)
      } catch (const BudgetError&) {
        throw;
      } catch (const std::runtime_error& e) {
        fail(side, e);
        return run;
      }
    }
    work += spec_used;
    if (work > s.oo.max_work) throw_over_work(s.oo.max_work);
    take_pending(true);
    return run;
  }
  for (Runner* side : {&one, &dist}) {
    try {
      side->run(seed);
    } catch (const WindowDone&) {  // every op it records is recorded: the rest is not needed
      continue;
    } catch (const BudgetError&) {
      throw;
    } catch (const std::runtime_error& e) {
      fail(side, e);
      return run;
    }
  }
  return run;
}

// A pipelined plan's stage cut points (docs/equivalence.md, "Pipelines"): a value of the one-microbatch step that the
// spec writes under its name (or a `lineage:` pair), whose instances `<name>@mb<k>` are whole per microbatch: every op
// writing one is an instance of a step op for its microbatch (a Recv's copy aside; nothing the lowering adds), none
// leaves a pending sum (the step's type of its last write has no P or V), and the plan never writes `<name>` itself.
void pipeline_cuts(Setup& s, const TrainingPair& tp, const std::vector<char>& excluded, const std::vector<NameId>& spec_of) {
  const Program& p = s.p;
  std::vector<char> bad(p.names.size(), 0);
  std::vector<std::vector<NameId>> inst(p.names.size());
  auto base_of = [&](NameId n) -> NameId {
    const std::string& nm = p.name(n);
    auto at = nm.rfind("@mb");
    if (at == std::string::npos || at + 3 == nm.size() ||
        !std::all_of(nm.begin() + static_cast<std::ptrdiff_t>(at + 3), nm.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      return -1;
    auto it = p.name_ids.find(nm.substr(0, at));
    return it == p.name_ids.end() ? -1 : it->second;
  };
  std::vector<NameId> base(p.names.size(), -2);  // -2: not computed yet
  for (std::size_t oi = 0; oi < p.ops.size(); ++oi) {
    const Op& op = p.ops[oi];
    auto outs = p.outs(op);
    for (std::size_t k = 0; k < outs.size(); ++k) {
      auto nu = static_cast<std::size_t>(outs[k]);
      if (base[nu] == -2) base[nu] = base_of(outs[k]);
      NameId b = base[nu];
      if (b < 0) continue;
      auto bu = static_cast<std::size_t>(b);
      if (op.kind == OpKind::Recv) continue;  // a copy of the sender's instance, cut there
      int f = oi < tp.family.size() ? tp.family[oi] : -1;
      bool instance = f >= 0 && oi < tp.mb.size() && tp.mb[oi] >= 0 && !(oi < tp.generated.size() && tp.generated[oi]);
      if (!instance) {
        bad[bu] = 1;
        continue;
      }
      if (inst[bu].empty() || std::find(inst[bu].begin(), inst[bu].end(), outs[k]) == inst[bu].end()) inst[bu].push_back(outs[k]);
      if (s.plan_final[op.first + op.n_in + k] && static_cast<std::size_t>(f) < tp.plan_types.out_base.size()) {
        const auto& pl = tp.plan_types.out(static_cast<std::size_t>(f), static_cast<int>(k)).pl;
        for (const auto& x : pl) bad[bu] |= x.is_p() || x.is_v();
      }
    }
  }
  // Each point keeps the spec's value from the spec's run until the plan has written its last instance, so the
  // points are chosen smallest first within a quarter of the run's byte budget (the residual stream and its
  // gradient, at every layer, before the wide attention and MLP values).
  std::vector<std::size_t> cand;
  for (std::size_t b = 0; b < p.names.size(); ++b) {
    if (inst[b].empty() || bad[b] || s.plan_last[b] >= 0 || excluded[b]) continue;
    auto m = static_cast<std::size_t>(spec_of[b]);
    if (s.model_last[m] < 0 || excluded[m] || s.model_cut[m] >= 0 || m >= s.model_elems.size() || s.model_elems[m] < 0) continue;
    cand.push_back(b);
  }
  std::stable_sort(cand.begin(), cand.end(), [&](std::size_t a, std::size_t b) {
    return s.model_elems[static_cast<std::size_t>(spec_of[a])] < s.model_elems[static_cast<std::size_t>(spec_of[b])];
  });
  std::int64_t bytes = 0;
  for (std::size_t b : cand) {
    auto m = static_cast<std::size_t>(spec_of[b]);
    bytes += s.model_elems[m] * static_cast<std::int64_t>(sizeof(Num));
    if (bytes > s.oo.max_bytes / 4) break;
    int c = s.n_cuts++;
    s.model_cut[m] = c;
    for (NameId n : inst[b]) s.plan_cut[static_cast<std::size_t>(n)] = c;
    s.cut_mb.push_back(1);
  }
  for (const auto& mb : tp.microbatches) s.n_mb = std::max(s.n_mb, mb.parts);
}

}  // namespace spmd::equiv_detail
