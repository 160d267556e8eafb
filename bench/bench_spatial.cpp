// bench/bench_spatial.cpp - times the spatial check on generated transformer programs.
//
// usage: spmd_bench [OPS...]          (default: 10000 100000 1000000)
//        spmd_bench --yaml OPS > f.yaml  (the same program as YAML, to time `spmdcheck check` end to end)
//        spmd_bench --json OPS > f.json  (the same program as JSON, the form a generator writes)
//        spmd_bench --block OPS > f.yaml (the same program with every op in block style, one key per line)
//        spmd_bench --load FILE...       (load each file, then check it: load and check times, peak RSS)
//        spmd_bench --events FILE...     (the parsing floor: only the parse events of each file, JSON or YAML)
//        spmd_bench --temporal [OPS...]  (temporal check of generated async-overlap programs, 2 streams + comm)
//        spmd_bench --schedule STAGES MICROBATCHES VIRTUAL (generate, validate, lower and check an interleaved 1F1B)
//        spmd_bench --pipeline [EVENTS...] (temporal check of an 8-stage pipeline: 8 ranks x 2 streams, p2p, both models)
//        spmd_bench --backward [OPS...]  (derive the backward of the transformer and check the training step)
//        spmd_bench --training-yaml OPS > f.yaml (the training program as YAML: `spmdcheck check f.yaml` end to end)
//        spmd_bench --training-json OPS > f.json (the same training program as JSON, the form a generator writes)
//        spmd_bench --equiv-llama LAYERS [bug] [train] > f.yaml (issue 11: a Llama stack on {dp: 2, tp: 8, cp: 2} with its
//                   single-device `spec:`, for `spmdcheck equiv`; `bug`: the attention scale applied twice)
//        spmd_bench --equiv-llama LAYERS [bug] [train] real > f.yaml (the same at Llama-3-405B's dims with an LM head)
//        spmd_bench --mla [bug] > f.yaml (issue 20: a DeepSeek-V3 MLA training block at its published dims on {dp: 2, tp: 8})
//        spmd_bench --ranks-local [RANKS...] (spatial and temporal check of per-rank programs with rank-local names)
//        spmd_bench --ranks-local-yaml RANKS > f.yaml (the same program as YAML)
//        spmd_bench --phases FILE [--backward] (time each phase of `spmdcheck check FILE`: load, spatial, temporal, training)
//        spmd_bench --symbolic [LAYERS...] (spatial check of layers with their own symbolic sizes: Z3 obligations)
//        spmd_bench --symbolic-z3 [LAYERS...] (the same with one obligation per layer that only Z3 proves)
//        spmd_bench --symbolic-yaml LAYERS [wrong] > f.yaml (the same program as YAML; `wrong`: one layer fails)
//        spmd_bench --ranks RANKS LAYERS COLLECTIVE [--yaml|--temporal-only] (per-rank programs with rank-local names: spatial and
//                   temporal check times in memory, or the program as YAML to time `spmdcheck check`)
// For each target op count it builds a dp x tp transformer program in memory, runs check_spatial
// once to warm up (allocations) and then times it, printing ops, time, ns/op and peak RSS.
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "bench/forms.h"
#include "bench/equiv_llama.h"
#include "bench/mla.h"
#include "bench/generator.h"
#include "bench/ranks.h"
#include "ir/doc.h"
#include "ir/loader.h"
#include "ir/source_file.h"
#include "ir/printer.h"
#include "schedules/schedule.h"
#include "spatial/spatial.h"
#include "temporal/temporal.h"

namespace {
long peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && (std::string(argv[1]) == "--yaml" || std::string(argv[1]) == "--json" || std::string(argv[1]) == "--block")) {
    spmd::bench::GenOptions g;
    g.layers = static_cast<int>(std::max(1L, std::atol(argv[2]) / 22));
    std::string text = spmd::print_program(spmd::bench::make_transformer(g));
    if (std::string(argv[1]) == "--json") text = spmd::bench::yaml_to_json(text);
    if (std::string(argv[1]) == "--block") text = spmd::bench::yaml_to_block(text);
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  if (argc >= 3 && std::string(argv[1]) == "--events") {
    for (int i = 2; i < argc; ++i) {
      std::string text = spmd::read_input_file(argv[i]);
      auto t0 = std::chrono::steady_clock::now();
      auto src = spmd::looks_like_json(text) ? spmd::json_events(text) : spmd::yaml_events(text);
      spmd::Event e;
      std::size_t n = 0;
      do src->next(e), ++n;
      while (e.type != spmd::EvType::StreamEnd);
      auto t1 = std::chrono::steady_clock::now();
      std::printf("%s: %zu events in %.1f ms\n", argv[i], n, std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    return 0;
  }
  if (argc >= 3 && std::string(argv[1]) == "--load") {
    // CPU time of this process: on a shared machine wall time measures the neighbours.
    auto cpu_ms = [] {
      timespec ts{};
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
      return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
    };
    std::printf("%-28s %10s %14s %14s %14s\n", "file", "ops", "load (CPU ms)", "check (CPU ms)", "peak RSS (MiB)");
    for (int i = 2; i < argc; ++i) {
      double t0 = cpu_ms();
      spmd::Program p = spmd::load_program_file(argv[i]);
      double t1 = cpu_ms();
      auto d = spmd::check_spatial(p);
      double t2 = cpu_ms();
      if (!d.empty()) {
        std::fprintf(stderr, "%s: expected clean, got %s\n", argv[i], d[0].message.c_str());
        return 1;
      }
      std::printf("%-28s %10zu %14.1f %14.1f %14ld\n", argv[i], p.ops.size(), t1 - t0, t2 - t1, peak_rss_mib());
    }
    return 0;
  }
  if ((argc == 5 || argc == 6) && std::string(argv[1]) == "--ranks") {
    using clock = std::chrono::steady_clock;
    auto ms = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    auto t0 = clock::now();
    spmd::Program p = spmd::bench::make_rank_local(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]) != 0);
    if (argc == 6 && std::string(argv[5]) == "--yaml") {
      std::fputs(spmd::print_program(p).c_str(), stdout);
      return 0;
    }
    auto t1 = clock::now();
    std::vector<spmd::Diagnostic> s;
    if (argc == 5) s = spmd::check_spatial(p);  // `--temporal-only` skips it
    auto t2 = clock::now();
    auto d = spmd::check_temporal(p);
    auto t3 = clock::now();
    if (!s.empty() || !d.empty()) {
      std::fprintf(stderr, "the rank-local program is expected to be clean: %s\n", (!s.empty() ? s : d)[0].message.c_str());
      return 1;
    }
    std::printf("ranks %s, ops %zu: build %.1f ms, spatial %.1f ms, temporal %.1f ms, peak RSS %ld MiB\n", argv[2], p.ops.size(), ms(t0, t1), ms(t1, t2),
                ms(t2, t3), peak_rss_mib());
    return 0;
  }
  if (argc >= 3 && argc <= 6 && std::string(argv[1]) == "--equiv-llama") {
    bool bug = false, train = false, real = false;
    for (int a = 3; a < argc; ++a) bug |= std::string(argv[a]) == "bug", train |= std::string(argv[a]) == "train", real |= std::string(argv[a]) == "real";
    std::fputs(spmd::bench::make_equiv_llama_yaml(std::max(1, std::atoi(argv[2])), bug, train, real).c_str(), stdout);
    return 0;
  }
  if (argc >= 2 && argc <= 3 && std::string(argv[1]) == "--mla") {
    std::fputs(spmd::bench::make_mla_yaml(argc == 3 && std::string(argv[2]) == "bug").c_str(), stdout);
    return 0;
  }
  if (argc == 3 && (std::string(argv[1]) == "--training-yaml" || std::string(argv[1]) == "--training-json")) {
    spmd::bench::GenOptions g;
    g.layers = static_cast<int>(std::max(1L, std::atol(argv[2]) / 22));
    std::string text = spmd::print_program(spmd::bench::make_training(g));
    if (std::string(argv[1]) == "--training-json") text = spmd::bench::yaml_to_json(text);
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  if ((argc == 3 || argc == 4) && std::string(argv[1]) == "--symbolic-yaml") {
    std::fputs(spmd::print_program(spmd::bench::make_symbolic(std::atoi(argv[2]), argc == 4)).c_str(), stdout);
    return 0;
  }
  if ((argc == 3 || argc == 4) && std::string(argv[1]) == "--phases") {
    using clock = std::chrono::steady_clock;
    auto ms = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    auto t0 = clock::now();
    spmd::Program p = spmd::load_program_file(argv[2]);
    auto t1 = clock::now();
    std::printf("load %.1f ms (%zu ops), RSS %ld MiB\n", ms(t0, t1), p.ops.size(), peak_rss_mib());
    bool training = p.train || p.has_backward || argc == 4;
    spmd::SpatialTypes types;
    spmd::SpatialOptions so;
    if (training) so.types = &types;
    auto sd = spmd::check_spatial(p, so);
    auto t2 = clock::now();
    auto td = spmd::check_temporal(p);
    auto t3 = clock::now();
    std::printf("spatial %.1f ms, temporal %.1f ms, RSS %ld MiB (%zu findings)\n", ms(t1, t2), ms(t2, t3), peak_rss_mib(), sd.size() + td.size());
    if (training) {
      spmd::TrainingOptions to;
      to.forward_types = &types;
      to.forward_ok = std::none_of(sd.begin(), sd.end(), [](const spmd::Diagnostic& d) { return d.severity == spmd::Severity::Error; });
      spmd::ForwardUndo undo;  // in place, as `spmdcheck check` does (cli/check_file.cpp)
      spmd::TrainingCheck t = spmd::check_training_in_place(p, undo, to);
      auto t4 = clock::now();
      std::size_t n = 0, step_ops = p.ops.size();
      if (t.built) n = spmd::check_temporal(p).size();
      spmd::restore_forward(p, undo);
      auto t5 = clock::now();
      std::printf("training (derive + backward spatial) %.1f ms, training temporal + restore %.1f ms, step ops %zu, RSS %ld MiB (%zu findings)\n",
                  ms(t3, t4), ms(t4, t5), step_ops, peak_rss_mib(), t.diags.size() + n);
    }
    std::printf("total %.1f ms\n", ms(t0, clock::now()));
    return 0;
  }
  if (argc == 3 && std::string(argv[1]) == "--ranks-local-yaml") {
    std::fputs(spmd::print_program(spmd::bench::make_rank_local(std::atoi(argv[2]))).c_str(), stdout);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--ranks-local") {
    std::vector<int> rs;
    for (int i = 2; i < argc; ++i) rs.push_back(std::atoi(argv[i]));
    if (rs.empty()) rs = {256, 1024};
    std::printf("%8s %8s %12s %14s %14s\n", "ranks", "ops", "spatial (ms)", "temporal (ms)", "peak RSS (MiB)");
    for (int r : rs) {
      spmd::Program p = spmd::bench::make_rank_local(r);
      auto t0 = std::chrono::steady_clock::now();
      auto sd = spmd::check_spatial(p);
      auto t1 = std::chrono::steady_clock::now();
      auto td = spmd::check_temporal(p);
      auto t2 = std::chrono::steady_clock::now();
      if (!sd.empty() || !td.empty()) {
        std::fprintf(stderr, "rank-local program is expected to be clean, got: %s\n", (sd.empty() ? td : sd)[0].message.c_str());
        return 1;
      }
      auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
      std::printf("%8d %8zu %12.1f %14.1f %14ld\n", r, p.ops.size(), ms(t0, t1), ms(t1, t2), peak_rss_mib());
    }
    return 0;
  }
  if (argc > 1 && (std::string(argv[1]) == "--symbolic" || std::string(argv[1]) == "--symbolic-z3")) {
    bool z3 = std::string(argv[1]) == "--symbolic-z3";
    std::vector<int> ls;
    for (int i = 2; i < argc; ++i) ls.push_back(std::atoi(argv[i]));
    if (ls.empty()) ls = {64, 128, 256};
    std::printf("%8s %8s %12s %14s %14s\n", "layers", "ops", "check (ms)", "ms / layer", "peak RSS (MiB)");
    for (int l : ls) {
      spmd::Program p = spmd::bench::make_symbolic(l, false, z3);
      auto t0 = std::chrono::steady_clock::now();
      auto diags = spmd::check_spatial(p);
      auto t1 = std::chrono::steady_clock::now();
      if (!diags.empty()) {
        std::fprintf(stderr, "symbolic program is expected to be clean, got %zu diagnostics: %s\n", diags.size(), diags[0].message.c_str());
        return 1;
      }
      double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
      std::printf("%8d %8zu %12.1f %14.2f %14ld\n", l, p.ops.size(), ms, ms / l, peak_rss_mib());
    }
    return 0;
  }
  if (argc == 5 && std::string(argv[1]) == "--schedule") {
    // Wall time per phase, and the process's CPU time (user + sys) per phase: on a shared machine the
    // wall time measures the neighbours as well.
    using clock = std::chrono::steady_clock;
    auto ms = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    auto cpu_ms = [] {
      timespec ts{};
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
      return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
    };
    double c0 = cpu_ms();
    auto t0 = clock::now();
    spmd::Schedule s = spmd::generate_schedule("Interleaved1F1B", std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]));
    auto t1 = clock::now();
    double c1 = cpu_ms();
    auto v = spmd::validate_schedule(s);
    auto t2 = clock::now();
    double c2 = cpu_ms();
    spmd::Program p = spmd::lower_schedule(s, spmd::P2PModel::Eager);
    auto t3 = clock::now();
    double c3 = cpu_ms();
    auto d = spmd::check_temporal(p);
    auto t4 = clock::now();
    double c4 = cpu_ms();
    if (!v.empty() || !d.empty()) {
      std::fprintf(stderr, "generated schedule is expected to be clean\n");
      return 1;
    }
    std::printf("actions per rank %zu, lowered ops %zu\ngenerate %.1f ms, validate %.1f ms, lower %.1f ms, temporal %.1f ms, total %.1f ms, peak RSS %ld MiB\n",
                s.rows[0].size(), p.ops.size(), ms(t0, t1), ms(t1, t2), ms(t2, t3), ms(t3, t4), ms(t0, t4), peak_rss_mib());
    std::printf("CPU (user + sys): generate %.1f ms, validate %.1f ms, lower %.1f ms, temporal %.1f ms, total %.1f ms\n", c1 - c0, c2 - c1,
                c3 - c2, c4 - c3, c4 - c0);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--pipeline") {
    std::vector<long> ts;
    for (int i = 2; i < argc; ++i) ts.push_back(std::atol(argv[i]));
    if (ts.empty()) ts = {10'000, 100'000, 1'000'000};
    std::printf("%10s %8s %14s %14s %14s\n", "events", "ranks", "eager (ms)", "rendezv. (ms)", "peak RSS (MiB)");
    for (long t : ts) {
      spmd::Program p = spmd::bench::make_pipeline(8, static_cast<int>(std::max(1L, t / 88)));
      double ms[2];
      for (int k = 0; k < 2; ++k) {
        spmd::TemporalOptions o;
        o.p2p_model = k == 0 ? spmd::P2PModel::Eager : spmd::P2PModel::Rendezvous;
        auto t0 = std::chrono::steady_clock::now();
        auto diags = spmd::check_temporal(p, o);
        auto t1 = std::chrono::steady_clock::now();
        if (!diags.empty()) {
          std::fprintf(stderr, "pipeline program is expected to be clean, got %zu diagnostics: %s\n", diags.size(), diags[0].message.c_str());
          return 1;
        }
        ms[k] = std::chrono::duration<double, std::milli>(t1 - t0).count();
      }
      std::printf("%10zu %8d %14.1f %14.1f %14ld\n", p.ops.size(), 8, ms[0], ms[1], peak_rss_mib());
    }
    return 0;
  }
  bool temporal = argc > 1 && std::string(argv[1]) == "--temporal";
  bool backward = argc > 1 && std::string(argv[1]) == "--backward";
  std::vector<long> targets;
  for (int i = temporal || backward ? 2 : 1; i < argc; ++i) targets.push_back(std::atol(argv[i]));
  if (backward) {
    if (targets.empty()) targets = {10'000, 100'000, 1'000'000};
    std::printf("%12s %14s %16s %12s %14s\n", "forward ops", "training ops", "fwd+bwd check ms", "ns/fwd op", "peak RSS (MiB)");
    for (long t : targets) {
      spmd::bench::GenOptions g;
      g.layers = static_cast<int>(std::max(1L, t / 22));
      spmd::Program p = spmd::bench::make_training(g);
      // As `spmdcheck check --backward` does: the forward's spatial check (its types), then the training step.
      auto t0 = std::chrono::steady_clock::now();
      spmd::SpatialTypes ft;
      spmd::SpatialOptions so;
      so.types = &ft;
      auto fd = spmd::check_spatial(p, so);
      spmd::TrainingOptions to;
      to.forward_types = &ft;
      to.forward_ok = fd.empty();
      spmd::TrainingCheck r = spmd::check_training(p, to);
      auto t1 = std::chrono::steady_clock::now();
      if (!fd.empty() || !r.built || !r.diags.empty()) {
        std::fprintf(stderr, "training program is expected to be clean, got %zu diagnostics: %s\n", fd.size() + r.diags.size(),
                     !fd.empty() ? fd[0].message.c_str() : r.diags.empty() ? "(not built)" : r.diags[0].message.c_str());
        return 1;
      }
      double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
      std::printf("%12zu %14zu %16.1f %12.1f %14ld\n", p.ops.size(), r.program.ops.size(), ms, ms * 1e6 / static_cast<double>(p.ops.size()),
                  peak_rss_mib());
    }
    return 0;
  }
  if (temporal) {
    if (targets.empty()) targets = {10'000, 100'000, 1'000'000};
    std::printf("%10s %12s %10s %14s\n", "events", "check (ms)", "ns/event", "peak RSS (MiB)");
    for (long t : targets) {
      spmd::Program p = spmd::bench::make_overlap(static_cast<int>(std::max(1L, t / 8)));
      auto t0 = std::chrono::steady_clock::now();
      auto diags = spmd::check_temporal(p);
      auto t1 = std::chrono::steady_clock::now();
      if (!diags.empty()) {
        std::fprintf(stderr, "overlap program is expected to be clean, got %zu diagnostics: %s\n", diags.size(), diags[0].message.c_str());
        return 1;
      }
      double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
      std::printf("%10zu %12.1f %10.1f %14ld\n", p.ops.size(), ms, ms * 1e6 / static_cast<double>(p.ops.size()), peak_rss_mib());
    }
    return 0;
  }
  if (targets.empty()) targets = {10'000, 100'000, 1'000'000};
  std::printf("%10s %10s %12s %10s %14s\n", "ops", "layers", "check (ms)", "ns/op", "peak RSS (MiB)");
  for (long t : targets) {
    spmd::bench::GenOptions g;
    g.layers = static_cast<int>(std::max(1L, t / 22));  // 22 ops per layer
    spmd::Program p = spmd::bench::make_transformer(g);
    auto t0 = std::chrono::steady_clock::now();
    auto diags = spmd::check_spatial(p);
    auto t1 = std::chrono::steady_clock::now();
    double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    if (!diags.empty()) {
      std::fprintf(stderr, "generated program is expected to be clean, got %zu diagnostics: %s\n", diags.size(), diags[0].message.c_str());
      return 1;
    }
    std::printf("%10zu %10d %12.1f %10.1f %14ld\n", p.ops.size(), g.layers, ms, ms * 1e6 / static_cast<double>(p.ops.size()), peak_rss_mib());
  }
  return 0;
}
