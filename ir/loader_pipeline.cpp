// ir/loader_pipeline.cpp - a pipeline `schedule:` whose stages run real ops (docs/schedules.md, "Stages").
//
// schedule: {kind: 1F1B, axis: pp, microbatches: 4, stages: [{use: M, in: [...], out: [...]}, ...],
//            batch: {x: 0, labels: {dim: 0, order: [...]}}, merge: {loss: sum}, steps: 1, scale_grads: false}
// Each stage is a module instance expanded once into its own op list (PipelineStage); the schedule decides when it
// runs. Stages chain: a stage reads declared tensors and the outputs of the stage before it, and every output of a
// stage but the last is read by the next one (the schedule sends exactly those).
#include "ir/loader_impl.h"

namespace spmd::load_detail {

namespace {

std::string stage_text(std::size_t k) { return "stage " + std::to_string(k); }

}  // namespace

void Loader::load_stages(N n) {
  ScheduleSpec& sp = p_.schedule;
  N stages = n["stages"];
  if (!stages.IsDefined()) {
    for (const char* k : {"batch", "merge", "steps", "scale_grads"})
      if (n[k].IsDefined())
        fail(n.key_node(k), std::string("`") + k + "` of `schedule` needs `stages:` (the module each stage runs); without stages the schedule's steps are opaque");
    return;
  }
  sp.stages_loc = n.key_node("stages").loc();
  if (!stages.IsSequence() || stages.size() == 0)
    fail(stages, "`stages` of `schedule` must be a non-empty list of module instances, one per stage, e.g. - {use: block, in: [x, w0], out: [h]}");
  std::vector<char> declared(p_.names.size(), 0);
  for (const auto& t : p_.tensors) declared[static_cast<std::size_t>(t.name)] = 1;
  auto is_declared = [&](NameId id) { return static_cast<std::size_t>(id) < declared.size() && declared[static_cast<std::size_t>(id)]; };
  std::vector<int> producer(p_.names.size(), -1);  // name -> the stage that outputs it
  auto produced_by = [&](NameId id) { return static_cast<std::size_t>(id) < producer.size() ? producer[static_cast<std::size_t>(id)] : -1; };
  for (N item : stages) {
    std::size_t k = sp.stages.size();
    bool inline_ops = item.IsMap() && item.key_node("ops").IsDefined() && !item.key_node("use").IsDefined();
    if (!item.IsMap() || item.key_node("op").IsDefined() || !(inline_ops || item.key_node("use").IsDefined() || item.key_node("repeat").IsDefined()))
      fail(item, stage_text(k) + " must be a module instance like {use: block, in: [x, w0], out: [h]} (write the stage's layers once, as a module), "
                                  "or its ops written out: {in: [...], out: [...], ops: [...]}");
    sp.stages.emplace_back();
    sp.stages.back().loc = item.loc();
    if (inline_ops) for_each_key(item, {"in", "out", "ops"}, stage_text(k), [](N, N) {});
    auto ins = load_names(item["in"], "`in` of " + stage_text(k), true);
    auto outs = load_names(item["out"], "`out` of " + stage_text(k), true);
    if (outs.empty()) fail(item.key_node("out").IsDefined() ? item["out"] : item, stage_text(k) + " needs `out`: what it sends to the next stage (the last stage: its loss)");
    target_ = &sp.stages.back().ops;
    if (inline_ops) {  // the names as written (what `spmdcheck` prints for an expanded stage)
      N ops = item["ops"];
      if (!ops.IsSequence()) fail(ops, "`ops` of " + stage_text(k) + " must be a list of ops");
      for (N op : ops) load_item(op);
    } else {
      load_instance(item);
    }
    target_ = &p_.ops;
    // Declarations an instance adds (module `tensors:`) are the stage's own weights.
    declared.resize(p_.names.size(), 0);
    for (const auto& t : p_.tensors) declared[static_cast<std::size_t>(t.name)] = 1;
    producer.resize(p_.names.size(), -1);
    // The chain: a stage reads declared tensors and the outputs of the stage before it.
    N in_node = item["in"].IsDefined() ? item["in"] : item;
    bool reads_previous = false;
    for (std::size_t j = 0; j < ins.size(); ++j) {
      NameId id = ins[j];
      int from = produced_by(id);
      N at = in_node.IsSequence() && j < in_node.size() ? in_node[j] : in_node;
      if (is_declared(id) && from < 0) continue;
      if (from >= 0 && static_cast<std::size_t>(from) + 1 == k) {
        reads_previous = true;
        continue;
      }
      if (from >= 0)
        fail(at, "stage modules do not chain: " + stage_text(k) + " reads '" + p_.name(id) + "', an output of " + stage_text(static_cast<std::size_t>(from)) +
                     "; a stage reads declared tensors and the outputs of the stage right before it (pass the value through the stages between)");
      std::vector<std::string> cands;
      for (const auto& t : p_.tensors) cands.push_back(p_.name(t.name));
      if (k > 0)
        for (NameId o : sp.stages[k - 1].outs) cands.push_back(p_.name(o));
      fail(at, "stage modules do not chain: " + stage_text(k) + " reads '" + p_.name(id) + "', which is neither a declared tensor nor an output of " +
                   (k > 0 ? stage_text(k - 1) : std::string("a stage before it (stage 0 reads declared tensors only)")) + suggestion(p_.name(id), cands));
    }
    if (k > 0 && !reads_previous)
      fail(in_node, "stage modules do not chain: " + stage_text(k) + " reads none of the outputs of " + stage_text(k - 1) + " (" +
                        join([&] {
                          std::vector<std::string> v;
                          for (NameId o : sp.stages[k - 1].outs) v.push_back(p_.name(o));
                          return v;
                        }()) +
                        "): the schedule sends them to it");
    N out_node = item["out"];
    for (std::size_t j = 0; j < outs.size(); ++j) {
      N at = out_node.IsSequence() && j < out_node.size() ? out_node[j] : out_node;
      if (is_declared(outs[j])) fail(at, stage_text(k) + " outputs '" + p_.name(outs[j]) + "', a declared tensor: a stage's outputs are new values");
      if (produced_by(outs[j]) >= 0) fail(at, stage_text(k) + " outputs '" + p_.name(outs[j]) + "', which " + stage_text(static_cast<std::size_t>(produced_by(outs[j]))) + " outputs too");
      producer[static_cast<std::size_t>(outs[j])] = static_cast<int>(k);
    }
    sp.stages.back().ins = std::move(ins);
    sp.stages.back().outs = std::move(outs);
  }
  // Every output of a stage but the last is read by the next one: the schedule sends exactly those.
  for (std::size_t k = 0; k + 1 < sp.stages.size(); ++k)
    for (NameId o : sp.stages[k].outs)
      if (std::find(sp.stages[k + 1].ins.begin(), sp.stages[k + 1].ins.end(), o) == sp.stages[k + 1].ins.end())
        fail_at(sp.stages[k + 1].loc, "stage modules do not chain: " + stage_text(k + 1) + " does not read '" + p_.name(o) + "', an output of " + stage_text(k) +
                                          " (the schedule sends every output of a stage to the next one; drop it from `out` of " + stage_text(k) + " or read it)");
  if (!sp.kind.empty() && static_cast<std::int64_t>(sp.stages.size()) != sp.ranks * sp.virtual_stages)
    fail(stages, "the schedule has " + std::to_string(sp.ranks * sp.virtual_stages) + " stages (" + std::to_string(sp.ranks) + " ranks x " +
                     std::to_string(sp.virtual_stages) + " virtual stages), but `stages` lists " + std::to_string(sp.stages.size()));
  // steps, scale_grads
  if (N st = n["steps"]; st.IsDefined()) {
    sp.steps = attr_int(st, "`steps` of `schedule`", 1, 1 << 16);
    sp.steps_loc = n.key_node("steps").loc();
  }
  if (N sg = n["scale_grads"]; sg.IsDefined()) {
    sp.scale_grads = load_bool(sg, "`scale_grads` of `schedule`");
    sp.scale_grads_loc = n.key_node("scale_grads").loc();
  }
  if (sp.microbatches * sp.steps > (1 << 20)) fail(n, "`steps` x `microbatches` must be at most 2^20");
  // batch: {name: dim} or {name: {dim: d, order: [...]}}
  if (N b = n["batch"]; b.IsDefined() && !b.IsNull()) {
    if (!b.IsMap()) fail(b, "`batch` of `schedule` must map each batch input to the dim it is cut along, e.g. {x: 0, labels: 0}");
    for_each_key(b, {}, "`batch` of `schedule`", [&](N k, N v) {
      auto it = p_.name_ids.find(k.Scalar());
      if (it == p_.name_ids.end() || !is_declared(it->second)) {
        std::vector<std::string> cands;
        for (const auto& t : p_.tensors) cands.push_back(p_.name(t.name));
        fail(k, "'" + k.Scalar() + "' in `batch` is not a declared tensor" + suggestion(k.Scalar(), cands));
      }
      const TensorDecl* decl = nullptr;
      for (const auto& t : p_.tensors)
        if (t.name == it->second) decl = &t;
      BatchSplit bs;
      bs.name = it->second;
      bs.loc = k.loc();
      N dim = v;
      if (v.IsMap()) {
        for_each_key(v, {"dim", "order"}, "batch input '" + k.Scalar() + "'", [](N, N) {});
        if (!v["dim"].IsDefined()) fail(v, "batch input '" + k.Scalar() + "' needs `dim` (the dim it is cut along)");
        dim = v["dim"];
        if (N o = v["order"]; o.IsDefined()) {
          if (!o.IsSequence()) fail(o, "`order` of batch input '" + k.Scalar() + "' must be a list: the part each microbatch reads, in microbatch order");
          for (N x : o) bs.order.push_back(attr_int(x, "an entry of `order`", 0, (1 << 20) - 1));
        }
      }
      auto rank = static_cast<std::int64_t>(decl->shape.size());
      std::int64_t d = attr_int(dim, "the dim of batch input '" + k.Scalar() + "'", -rank, rank - 1);
      bs.dim = static_cast<int>(d < 0 ? d + rank : d);
      if (rank == 0) fail(dim, "batch input '" + k.Scalar() + "' is a scalar: it has no dim to cut into microbatches");
      for (const auto& other : sp.batch)
        if (other.name == bs.name) fail(k, "batch input '" + k.Scalar() + "' is listed twice");
      sp.batch.push_back(std::move(bs));
    });
  }
  // merge: {output: sum | mean | dim}
  const PipelineStage& last = sp.stages.back();
  if (N m = n["merge"]; m.IsDefined() && !m.IsNull()) {
    if (!m.IsMap()) fail(m, "`merge` of `schedule` must map last-stage outputs to how they are gathered over microbatches: sum, mean or a dim to concatenate");
    for_each_key(m, {}, "`merge` of `schedule`", [&](N k, N v) {
      auto it = p_.name_ids.find(k.Scalar());
      if (it == p_.name_ids.end() || std::find(last.outs.begin(), last.outs.end(), it->second) == last.outs.end()) {
        std::vector<std::string> cands;
        for (NameId o : last.outs) cands.push_back(p_.name(o));
        fail(k, "'" + k.Scalar() + "' in `merge` is not an output of the last stage" + suggestion(k.Scalar(), cands) + " (its outputs: " + join(cands) + ")");
      }
      MergeSpec ms;
      ms.name = it->second;
      ms.loc = k.loc();
      std::int64_t d = 0;
      if (v.IsScalar() && v.Scalar() == "sum") ms.kind = MergeSpec::Sum;
      else if (v.IsScalar() && v.Scalar() == "mean") ms.kind = MergeSpec::Mean;
      else if (v.IsScalar() && parse_int(v.Scalar(), d)) ms.kind = MergeSpec::Concat, ms.dim = static_cast<int>(d);
      else fail(v, "merge of '" + k.Scalar() + "' must be sum, mean, or the dim its microbatches are concatenated along, got " + kind_of(v) +
                       (v.IsScalar() ? suggestion(v.Scalar(), {"sum", "mean"}) : ""));
      sp.merge.push_back(ms);
    });
  }
}

void Loader::check_pipeline(N root) {
  const ScheduleSpec& sp = p_.schedule;
  if (!sp.present || sp.stages.empty()) return;
  N key = find_key(root, "schedule");
  if (p_.loss < 0)
    fail(key, "a schedule with `stages` needs a `loss:`: the output of the last stage each microbatch's backward starts from (e.g. loss: loss)");
  const PipelineStage& last = sp.stages.back();
  if (std::find(last.outs.begin(), last.outs.end(), p_.loss) == last.outs.end())
    fail_at(p_.loss_loc, "loss '" + p_.name(p_.loss) + "' is not an output of the last stage (line " + std::to_string(last.loc.line) +
                             "): each microbatch's backward starts from the last stage's loss");
  if (p_.has_backward)
    fail_at(p_.backward_loc, "a pipelined schedule derives each stage's backward (its B, I and W steps): a hand-written `backward:` is not supported with `stages`");
  for (const auto& o : p_.outputs)
    if (std::none_of(sp.merge.begin(), sp.merge.end(), [&](const MergeSpec& m) { return m.name == o.name; }) &&
        std::none_of(p_.tensors.begin(), p_.tensors.end(), [&](const TensorDecl& t) { return t.name == o.name; }))
      fail_at(o.loc, "output '" + p_.name(o.name) + "' of a pipelined schedule must be a last-stage output gathered by `merge:` of `schedule` "
                                                   "(e.g. merge: {" + p_.name(o.name) + ": sum}); parameter gradients are compared without being listed");
}

}  // namespace spmd::load_detail
