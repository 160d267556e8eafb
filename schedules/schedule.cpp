// schedules/schedule.cpp - CSV import, validation, lowering and trace of pipeline schedules (the grid: grid.cpp).
#include "schedules/schedule.h"

#include "ir/memory.h"
#include "ir/ranks.h"
#include "ir/source_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>

namespace spmd {

namespace {

constexpr int kMaxIndex = 1 << 20;  // stages, microbatches and ranks in a schedule

struct TypeName {
  const char* text;
  ActionType type;
  bool has_mb;
};
// Longest first, so SEND_F is not read as S...
const TypeName kTypes[] = {{"REDUCE_GRAD", ActionType::ReduceGrad, false}, {"UNSHARD", ActionType::Unshard, false},
                           {"RESHARD", ActionType::Reshard, false},       {"SEND_F", ActionType::SendF, true},
                           {"RECV_F", ActionType::RecvF, true},           {"SEND_B", ActionType::SendB, true},
                           {"RECV_B", ActionType::RecvB, true},           {"F", ActionType::F, true},
                           {"I", ActionType::I, true},                    {"W", ActionType::W, true},
                           {"B", ActionType::B, true}};

const char* type_text(ActionType t) {
  for (const auto& n : kTypes)
    if (n.type == t) return n.text;
  return "OVERLAP_F_B";
}

bool is_compute(ActionType t) { return t == ActionType::F || t == ActionType::I || t == ActionType::W || t == ActionType::B; }

class CsvParser {
 public:
  CsvParser(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(Loc l, const std::string& msg) { throw LoadError(l, msg); }

  int number(const std::string& s, std::size_t& i, Loc l, const std::string& cell, const char* what) {
    std::size_t start = i;
    long long v = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      v = v * 10 + (s[i] - '0');
      if (v >= kMaxIndex) fail(l, fmt::format("`{}`: the {} is too large (at most {})", cell, what, kMaxIndex - 1));
      ++i;
    }
    if (i == start) return -1;
    return static_cast<int>(v);
  }

  Action simple(const std::string& s, Loc l, const std::string& cell) {
    Action a;
    a.loc = l;
    std::size_t i = 0;
    a.stage = number(s, i, l, cell, "stage");
    if (a.stage < 0)
      fail(l, fmt::format("`{}` is not an action: expected {{stage}}{{TYPE}}{{microbatch}} such as 0F3, 1SEND_B2 or 0UNSHARD", cell));
    const TypeName* t = nullptr;
    for (const auto& n : kTypes)
      if (s.compare(i, std::string(n.text).size(), n.text) == 0) {
        t = &n;
        break;
      }
    if (!t) {
      std::vector<std::string> names;
      for (const auto& n : kTypes) names.push_back(n.text);
      std::string word = s.substr(i, 64);
      while (!word.empty() && std::isdigit(static_cast<unsigned char>(word.back()))) word.pop_back();
      auto best = did_you_mean(word, names);
      fail(l, fmt::format("`{}`: unknown action type `{}`{} (types: F, I, W, B, SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD, REDUCE_GRAD)", cell,
                          excerpt(word, 24), best ? fmt::format("; did you mean {}?", *best) : ""));
    }
    i += std::string(t->text).size();
    if (t->type == ActionType::B && i < s.size() && s[i] == 'W')
      fail(l, fmt::format("`{}`: `BW` is not an action type of PyTorch's schedule grammar (a legacy token for a combined backward); write "
                          "the full backward as {}B{} or split it into {}I{} and {}W{}",
                          cell, a.stage, excerpt(s.substr(i + 1), 24), a.stage, excerpt(s.substr(i + 1), 24), a.stage, excerpt(s.substr(i + 1), 24)));
    a.type = t->type;
    if (t->has_mb) {
      a.mb = number(s, i, l, cell, "microbatch");
      if (a.mb < 0) fail(l, fmt::format("`{}`: {} needs a microbatch number, e.g. {}{}0", cell, t->text, a.stage, t->text));
    }
    if (i != s.size())
      fail(l, t->has_mb ? fmt::format("`{}`: unexpected `{}` after the microbatch", cell, excerpt(s.substr(i), 24))
                        : fmt::format("`{}`: {} takes no microbatch (unexpected `{}`)", cell, t->text, excerpt(s.substr(i), 24)));
    return a;
  }

  // `text`: the cell as written; messages quote at most 40 bytes of it (a cell may be a megabyte long).
  Action action(const std::string& text, Loc l) {
    const std::string cell = excerpt(text, 40);
    if (text.front() != '(') return simple(text, l, cell);
    static const std::string tail = ")OVERLAP_F_B";
    auto semi = text.find(';');
    if (semi == std::string::npos || text.size() < tail.size() || text.compare(text.size() - tail.size(), tail.size(), tail) != 0 ||
        semi > text.size() - tail.size())
      fail(l, fmt::format("`{}`: an overlapped pair is written (F;B)OVERLAP_F_B, e.g. (0F7;7B3)OVERLAP_F_B", cell));
    Action f = simple(text.substr(1, semi - 1), l, cell);
    Action b = simple(text.substr(semi + 1, text.size() - tail.size() - semi - 1), l, cell);
    if (f.type != ActionType::F || (b.type != ActionType::B && b.type != ActionType::I))
      fail(l, fmt::format("`{}`: OVERLAP_F_B pairs a forward (F) with a backward (B or I)", cell));
    f.type2 = b.type;
    f.stage2 = b.stage;
    f.mb2 = b.mb;
    f.type = ActionType::OverlapFB;
    return f;
  }

  Schedule parse(const std::string& text) {
    Schedule s;
    s.source = source_;
    std::vector<std::string> lines;
    std::string line;
    std::istringstream in(text);
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(line);
    }
    while (!lines.empty() && lines.back().find_first_not_of(" \t,") == std::string::npos) lines.pop_back();
    if (lines.empty()) fail({1, 1}, "empty schedule: expected one row of actions per pipeline rank");
    if (lines.size() > static_cast<std::size_t>(kMaxScheduleRanks))
      fail({static_cast<std::uint32_t>(kMaxScheduleRanks + 1), 1},
           fmt::format("the schedule has {} rows (pipeline ranks); at most {} are supported (the deadlock check's vector clocks grow with "
                       "the square of the ranks)",
                       lines.size(), kMaxScheduleRanks));
    std::size_t cells = 0, actions = 0;  // bounded while reading: a 64 MiB file of commas would be 64 million empty cells
    for (std::size_t r = 0; r < lines.size(); ++r) {
      const std::string& ln = lines[r];
      std::vector<std::optional<Action>> row;
      std::size_t pos = 0;
      for (;;) {
        std::size_t end = ln.find(',', pos);
        std::string cell = ln.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
        std::size_t lead = cell.find_first_not_of(" \t");
        std::size_t col = pos + (lead == std::string::npos ? 0 : lead) + 1;
        if (++cells > kMaxScheduleCells)
          fail({static_cast<std::uint32_t>(r + 1), static_cast<std::uint32_t>(col)},
               fmt::format("the schedule has more than {} cells (actions and empty cells); at most {} actions are supported", kMaxScheduleCells,
                           kMaxScheduleActions));
        if (lead == std::string::npos) {
          row.push_back(std::nullopt);  // a bubble
        } else {
          cell = cell.substr(lead, cell.find_last_not_of(" \t") - lead + 1);
          Action a = action(cell, {static_cast<std::uint32_t>(r + 1), static_cast<std::uint32_t>(col)});
          if (++actions > kMaxScheduleActions)
            fail(a.loc, fmt::format("the schedule has more than {} actions (each is lowered to about 4 ops and checked in about 1 KB)",
                                    kMaxScheduleActions));
          if (static_cast<std::int64_t>(actions * lines.size()) > kMaxScheduleRankActions)
            fail(a.loc, fmt::format("the schedule has {} rows (pipeline ranks), so it may have at most {} actions: the deadlock check affords {} "
                                    "ranks x actions (its vector clocks grow with both: each rank hears of every rank before it)",
                                    lines.size(), kMaxScheduleRankActions / static_cast<std::int64_t>(lines.size()), kMaxScheduleRankActions));
          s.has_comms |= a.type == ActionType::SendF || a.type == ActionType::RecvF || a.type == ActionType::SendB || a.type == ActionType::RecvB;
          row.push_back(a);
        }
        if (end == std::string::npos) break;
        pos = end + 1;
      }
      while (!row.empty() && !row.back()) row.pop_back();
      s.rows.push_back(std::move(row));
    }
    return s;
  }

 private:
  std::string source_;
};

}  // namespace

std::string action_text(const Action& a) {
  if (a.type == ActionType::OverlapFB)
    return fmt::format("({}F{};{}{}{})OVERLAP_F_B", a.stage, a.mb, a.stage2, type_text(a.type2), a.mb2);
  if (a.mb < 0) return fmt::format("{}{}", a.stage, type_text(a.type));
  return fmt::format("{}{}{}", a.stage, type_text(a.type), a.mb);
}

namespace {

void finish(Schedule& s) {
  s.stages = 0;
  s.microbatches = 0;
  for (const auto& row : s.rows)
    for (const auto& a : row)
      if (a) {
        s.stages = std::max({s.stages, a->stage + 1, a->stage2 + 1});
        s.microbatches = std::max({s.microbatches, a->mb + 1, a->mb2 + 1});
      }
}

}  // namespace

Schedule parse_schedule_csv(const std::string& text, const std::string& source) {
  Schedule s = CsvParser(source).parse(text);
  finish(s);
  // Validation and lowering keep a table per (stage, microbatch): bound it, and the actions, before they allocate.
  std::size_t actions = 0;
  const Action* widest = nullptr;  // the cell with the largest stage or microbatch
  for (const auto& row : s.rows)
    for (const auto& a : row)
      if (a) {
        ++actions;
        if (!widest || std::max({a->stage, a->stage2}) == s.stages - 1 || std::max({a->mb, a->mb2}) == s.microbatches - 1) widest = &*a;
        if (actions > kMaxScheduleActions)
          throw LoadError(a->loc, fmt::format("the schedule has more than {} actions (each is lowered to about 4 ops and checked in about 1 KB)",
                                              kMaxScheduleActions));
      }
  std::size_t table = static_cast<std::size_t>(std::max(1, s.stages)) * static_cast<std::size_t>(std::max(1, s.microbatches));
  if (table > kMaxScheduleActions && widest)
    throw LoadError(widest->loc, fmt::format("the schedule names {} stages x {} microbatches = {} (stage, microbatch) pairs, more than the {} "
                                             "supported: stage and microbatch numbers must be dense from 0",
                                             s.stages, s.microbatches, table, kMaxScheduleActions));
  return s;
}

Schedule load_schedule_csv(const std::string& path) {
  return parse_schedule_csv(read_input_file(path, kMaxCsvBytes), path);  // refuses devices, pipes, > 64 MiB
}

// ---- validation --------------------------------------------------------------------------------

namespace {

// The compute steps of one action (an overlapped pair is two).
struct Step {
  ActionType type;
  int stage, mb;
};
std::vector<Step> steps(const Action& a) {
  if (a.type == ActionType::OverlapFB) return {{ActionType::F, a.stage, a.mb}, {a.type2, a.stage2, a.mb2}};
  return {{a.type, a.stage, a.mb}};
}

class Validator {
 public:
  explicit Validator(const Schedule& s) : s_(s) {}

  std::vector<Diagnostic> run() {
    stage_map();
    if (!diags_.empty()) return std::move(diags_);  // everything below needs one rank per stage
    coverage_and_order();
    comms();
    sharding_and_grad_sync();
    sort_and_cap(diags_, diags_.size());
    return std::move(diags_);
  }

  std::vector<int> stage_rank;

 private:
  void report(CheckId id, Loc l, std::string msg, std::vector<Note> notes = {}) {
    Diagnostic d;
    d.id = id;
    d.loc = l;
    d.message = std::move(msg);
    d.notes = std::move(notes);
    diags_.push_back(std::move(d));
  }
  Loc where(int rank) const {
    // The end of a rank's row: where a missing action would go.
    const auto& row = s_.rows[static_cast<std::size_t>(rank)];
    for (auto it = row.rbegin(); it != row.rend(); ++it)
      if (*it) return it->value().loc;
    return {static_cast<std::uint32_t>(rank + 1), 1};
  }

  void stage_map() {
    stage_rank.assign(static_cast<std::size_t>(s_.stages), -1);
    std::vector<Loc> first(static_cast<std::size_t>(s_.stages));
    for (std::size_t r = 0; r < s_.rows.size(); ++r)
      for (const auto& a : s_.rows[r])
        if (a)
          for (const Step& st : steps(*a)) {
            if (!is_compute(st.type)) continue;
            int& owner = stage_rank[static_cast<std::size_t>(st.stage)];
            if (owner < 0) {
              owner = static_cast<int>(r);
              first[static_cast<std::size_t>(st.stage)] = a->loc;
            } else if (owner != static_cast<int>(r) && !reported_stage_.count(st.stage)) {
              reported_stage_.insert({st.stage, true});
              report(CheckId::ScheduleInvalid, a->loc,
                     fmt::format("{} runs stage {} on rank {}, but stage {} already computes on rank {}: a stage belongs to one rank",
                                 action_text(*a), st.stage, r, st.stage, owner),
                     {{first[static_cast<std::size_t>(st.stage)], fmt::format("stage {} computes on rank {} here", st.stage, owner)}});
            }
          }
    for (int st = 0; st < s_.stages; ++st)
      if (stage_rank[static_cast<std::size_t>(st)] < 0) {
        Loc l{1, 1};
        for (const auto& row : s_.rows)
          for (const auto& a : row)
            if (a && (a->stage == st || a->stage2 == st) && l.line == 1 && l.col == 1) l = a->loc;
        report(CheckId::ScheduleInvalid, l,
               fmt::format("stage {} has no compute action (F, B, I or W) on any rank, but the schedule names stages up to {}: the stage "
                           "does not exist or its work is missing",
                           st, s_.stages - 1));
      }
  }

  void coverage_and_order() {
    // Per (stage, mb): where F, I, W, B ran (row index, position) in order.
    struct Seen {
      int f = -1, i = -1, w = -1, b = -1;
      Loc lf, li, lw, lb;
    };
    std::vector<Seen> seen(static_cast<std::size_t>(s_.stages) * static_cast<std::size_t>(s_.microbatches));
    auto at = [&](int st, int mb) -> Seen& { return seen[static_cast<std::size_t>(st) * static_cast<std::size_t>(s_.microbatches) + static_cast<std::size_t>(mb)]; };
    for (std::size_t r = 0; r < s_.rows.size(); ++r) {
      int pos = 0;
      for (const auto& a : s_.rows[r]) {
        if (!a) continue;
        for (const Step& st : steps(*a)) {
          if (!is_compute(st.type)) continue;
          ++pos;
          Seen& x = at(st.stage, st.mb);
          std::string name = fmt::format("{}{}{}", st.stage, type_text(st.type), st.mb);
          int* slot = st.type == ActionType::F ? &x.f : st.type == ActionType::I ? &x.i : st.type == ActionType::W ? &x.w : &x.b;
          Loc* lslot = st.type == ActionType::F ? &x.lf : st.type == ActionType::I ? &x.li : st.type == ActionType::W ? &x.lw : &x.lb;
          if (*slot >= 0) {
            report(CheckId::ScheduleInvalid, a->loc, fmt::format("{} runs twice: stage {} repeats microbatch {}'s {}", name, st.stage, st.mb, type_text(st.type)),
                   {{*lslot, "the first time is here"}});
            continue;
          }
          *slot = pos;
          *lslot = a->loc;
          if ((st.type == ActionType::B || st.type == ActionType::I) && x.f < 0)
            report(CheckId::ScheduleInvalid, a->loc,
                   fmt::format("{} runs a backward of microbatch {} on stage {} before its forward {}F{}", name, st.mb, st.stage, st.stage, st.mb));
          if (st.type == ActionType::W && x.i < 0 && x.b < 0)
            report(CheckId::ScheduleInvalid, a->loc,
                   fmt::format("{} computes the weight gradient of microbatch {} on stage {} before its input gradient {}I{} (W needs I first)",
                               name, st.mb, st.stage, st.stage, st.mb));
          // Neighbour stages on the same rank hand off locally: the producer must come first.
          if (st.type == ActionType::F && st.stage > 0 && stage_rank[static_cast<std::size_t>(st.stage - 1)] == static_cast<int>(r) &&
              at(st.stage - 1, st.mb).f < 0)
            report(CheckId::ScheduleInvalid, a->loc,
                   fmt::format("{} needs the activation of {}F{}, which runs later on the same rank", name, st.stage - 1, st.mb));
          if ((st.type == ActionType::B || st.type == ActionType::I) && st.stage + 1 < s_.stages &&
              stage_rank[static_cast<std::size_t>(st.stage + 1)] == static_cast<int>(r) && at(st.stage + 1, st.mb).b < 0 && at(st.stage + 1, st.mb).i < 0)
            report(CheckId::ScheduleInvalid, a->loc,
                   fmt::format("{} needs the gradient from stage {}'s backward of microbatch {}, which runs later on the same rank", name,
                               st.stage + 1, st.mb));
        }
      }
    }
    for (int st = 0; st < s_.stages; ++st)
      for (int mb = 0; mb < s_.microbatches; ++mb) {
        const Seen& x = at(st, mb);
        int owner = stage_rank[static_cast<std::size_t>(st)];
        Loc l = where(owner);
        if (x.f < 0)
          report(CheckId::ScheduleInvalid, l, fmt::format("stage {} (rank {}) never runs the forward {}F{} of microbatch {}", st, owner, st, mb, mb));
        // B followed by W (and no I) is the legacy zero-bubble spelling (PyTorch <= 2.5): B is the input gradient.
        bool split = x.i >= 0 || x.w >= 0;
        if (x.b >= 0 && x.i >= 0)
          report(CheckId::ScheduleInvalid, x.lb, fmt::format("stage {} runs both {}B{} and {}I{}: the input gradient of microbatch {} is computed twice", st,
                                                             st, mb, st, mb, mb));
        else if (x.b >= 0 && x.w >= 0 && x.w < x.b)
          report(CheckId::ScheduleInvalid, x.lw, fmt::format("{}W{} runs before {}B{}: W needs the input gradient first", st, mb, st, mb));
        else if (x.b >= 0 && split) {
        }
        else if (!split && x.b < 0)
          report(CheckId::ScheduleInvalid, l,
                 fmt::format("stage {} (rank {}) never runs the backward of microbatch {} ({}B{}, or {}I{} and {}W{})", st, owner, mb, st, mb, st, mb,
                             st, mb));
        else if (split && x.i < 0)
          report(CheckId::ScheduleInvalid, x.lw, fmt::format("stage {} runs {}W{} but never {}I{}", st, st, mb, st, mb));
        else if (split && x.w < 0)
          report(CheckId::ScheduleInvalid, x.li, fmt::format("stage {} runs {}I{} but never {}W{}: the weight gradient of microbatch {} is missing", st,
                                                             st, mb, st, mb, mb));
      }
  }

  void comms() {
    if (!s_.has_comms) return;
    for (std::size_t r = 0; r < s_.rows.size(); ++r) {
      std::map<std::pair<int, int>, bool> recv_f, recv_b, ran_f, ran_b;
      for (const auto& a : s_.rows[r]) {
        if (!a) continue;
        int st = a->stage;
        bool send = a->type == ActionType::SendF || a->type == ActionType::SendB;
        bool recv = a->type == ActionType::RecvF || a->type == ActionType::RecvB;
        if (send || recv) {
          bool fwd = a->type == ActionType::SendF || a->type == ActionType::RecvF;
          int peer_stage = fwd == send ? st + 1 : st - 1;
          if (stage_rank[static_cast<std::size_t>(st)] != static_cast<int>(r)) {
            report(CheckId::ScheduleInvalid, a->loc,
                   fmt::format("{} is on rank {}, but stage {} computes on rank {}", action_text(*a), r, st, stage_rank[static_cast<std::size_t>(st)]));
            continue;
          }
          if (peer_stage < 0 || peer_stage >= s_.stages) {
            report(CheckId::ScheduleInvalid, a->loc,
                   fmt::format("{} {} stage {}, which does not exist (stages 0 to {})", action_text(*a), send ? "sends to" : "receives from", peer_stage,
                               s_.stages - 1));
            continue;
          }
          if (send && !(fwd ? ran_f : ran_b).count({st, a->mb}))
            report(CheckId::ScheduleInvalid, a->loc,
                   fmt::format("{} sends the {} of microbatch {} before stage {} computes it", action_text(*a), fwd ? "activation" : "gradient", a->mb, st));
          if (recv) (fwd ? recv_f : recv_b)[{st, a->mb}] = true;
          continue;
        }
        for (const Step& x : steps(*a)) {
          if (x.type == ActionType::F) {
            ran_f[{x.stage, x.mb}] = true;
            if (x.stage > 0 && stage_rank[static_cast<std::size_t>(x.stage - 1)] != static_cast<int>(r) && !recv_f.count({x.stage, x.mb}))
              report(CheckId::ScheduleInvalid, a->loc,
                     fmt::format("{}F{} runs without receiving its input: no {}RECV_F{} before it on rank {} (stage {} is on rank {})", x.stage, x.mb,
                                 x.stage, x.mb, r, x.stage - 1, stage_rank[static_cast<std::size_t>(x.stage - 1)]));
          }
          if (x.type == ActionType::B || x.type == ActionType::I) {
            ran_b[{x.stage, x.mb}] = true;
            if (x.stage + 1 < s_.stages && stage_rank[static_cast<std::size_t>(x.stage + 1)] != static_cast<int>(r) && !recv_b.count({x.stage, x.mb}))
              report(CheckId::ScheduleInvalid, a->loc,
                     fmt::format("{}{}{} runs without receiving its gradient: no {}RECV_B{} before it on rank {} (stage {} is on rank {})", x.stage,
                                 type_text(x.type), x.mb, x.stage, x.mb, r, x.stage + 1, stage_rank[static_cast<std::size_t>(x.stage + 1)]));
          }
        }
      }
    }
  }

  void sharding_and_grad_sync() {
    for (std::size_t r = 0; r < s_.rows.size(); ++r) {
      const auto& row = s_.rows[r];
      std::map<int, bool> unsharded, uses_unshard;
      for (const auto& a : row)
        if (a && a->type == ActionType::Unshard) uses_unshard[a->stage] = true;
      // Last backward (B or W) position per stage on this row.
      std::map<int, std::pair<std::size_t, Loc>> last_bw;
      for (std::size_t k = 0; k < row.size(); ++k)
        if (row[k])
          for (const Step& x : steps(*row[k]))
            if (x.type == ActionType::B || x.type == ActionType::W) last_bw[x.stage] = {k, row[k]->loc};
      for (std::size_t k = 0; k < row.size(); ++k) {
        if (!row[k]) continue;
        const Action& a = *row[k];
        if (a.type == ActionType::Unshard) unsharded[a.stage] = true;
        if (a.type == ActionType::Reshard) unsharded[a.stage] = false;
        if (a.type == ActionType::ReduceGrad) {
          auto it = last_bw.find(a.stage);
          if (it != last_bw.end() && it->second.first > k) {
            const Action& last = *row[it->second.first];
            report(CheckId::GradSyncEarly, a.loc,
                   fmt::format("{} reduces stage {}'s gradient over the data-parallel group before the stage's last backward ({}): the reduced "
                               "gradient misses that microbatch's contribution",
                               action_text(a), a.stage, action_text(last)),
                   {{it->second.second, "the last backward of the stage runs here"},
                    {a.loc, fmt::format("fix: move {} after {}", action_text(a), action_text(last))}});
          }
        }
        for (const Step& x : steps(a))
          if (is_compute(x.type) && uses_unshard.count(x.stage) && !unsharded[x.stage])
            report(CheckId::ScheduleInvalid, a.loc,
                   fmt::format("{}{}{} computes with stage {}'s parameters while they are sharded (no {}UNSHARD since the last {}RESHARD)", x.stage,
                               type_text(x.type), x.mb, x.stage, x.stage, x.stage));
      }
    }
  }

  const Schedule& s_;
  std::vector<Diagnostic> diags_;
  std::map<int, bool> reported_stage_;
};

}  // namespace

std::vector<Diagnostic> validate_schedule(const Schedule& s) { return Validator(s).run(); }

// ---- lowering ----------------------------------------------------------------------------------

// Stage -> rank: the first rank whose row computes the stage (-1: none). Validation reports a stage
// computed on two ranks; lowering goes on with the first owner.
std::vector<int> stage_owners(const Schedule& s) {
  std::vector<int> owner(static_cast<std::size_t>(s.stages), -1);
  for (std::size_t r = 0; r < s.rows.size(); ++r)
    for (const auto& a : s.rows[r])
      if (a)
        for (const Step& x : steps(*a))
          if (is_compute(x.type) && owner[static_cast<std::size_t>(x.stage)] < 0) owner[static_cast<std::size_t>(x.stage)] = static_cast<int>(r);
  return owner;
}

Schedule with_comms(const Schedule& s) {
  if (s.has_comms) return s;
  std::vector<int> owner = stage_owners(s);
  auto remote = [&](int st, int r) { return st >= 0 && st < s.stages && owner[static_cast<std::size_t>(st)] >= 0 && owner[static_cast<std::size_t>(st)] != r; };
  Schedule out = s;
  out.has_comms = true;
  for (std::size_t r = 0; r < s.rows.size(); ++r) {
    std::vector<std::optional<Action>> row;
    int rr = static_cast<int>(r);
    for (const auto& a : s.rows[r]) {
      if (!a) {
        row.push_back(a);
        continue;
      }
      auto comm = [&](ActionType t, int st, int mb) {
        Action c;
        c.type = t;
        c.stage = st;
        c.mb = mb;
        c.loc = a->loc;  // reported at the compute step it serves
        row.push_back(c);
      };
      std::vector<Step> xs = steps(*a);
      // Receives before the step, sends after it (an overlapped pair: both receives, both steps, both sends).
      for (const Step& x : xs) {
        if (x.type == ActionType::F && remote(x.stage - 1, rr)) comm(ActionType::RecvF, x.stage, x.mb);
        if ((x.type == ActionType::B || x.type == ActionType::I) && remote(x.stage + 1, rr)) comm(ActionType::RecvB, x.stage, x.mb);
      }
      row.push_back(a);
      for (const Step& x : xs) {
        if (x.type == ActionType::F && remote(x.stage + 1, rr)) comm(ActionType::SendF, x.stage, x.mb);
        if ((x.type == ActionType::B || x.type == ActionType::I) && remote(x.stage - 1, rr)) comm(ActionType::SendB, x.stage, x.mb);
      }
    }
    out.rows[r] = std::move(row);
  }
  return out;
}

Program lower_schedule(const Schedule& s, P2PModel model, std::vector<LoweredStep>* steps_out) {
  Program p;
  LoweredStep cur{ActionType::F, -1, -1};  // what the ops being emitted stand for
  p.file = s.source;
  p.title = "schedule";
  std::size_t n_actions = 0;
  for (const auto& row : s.rows) n_actions += row.size();
  reserve_huge(p.ops, 4 * n_actions + 16);
  reserve_huge(p.operands, 12 * n_actions + 16);
  std::size_t n_names = 2 * static_cast<std::size_t>(std::max(1, s.stages)) * static_cast<std::size_t>(std::max(1, s.microbatches)) + 16;
  p.name_ids.reserve(n_names);
  reserve_huge(p.names, n_names);
  int ranks = static_cast<int>(s.rows.size());
  p.mesh.push_back({"pp", p.exprs.constant(std::max(1, ranks)), {1, 1}});
  p.has_p2p_model = true;
  p.p2p_model = model;
  p.per_rank = true;
  std::vector<int> owner = stage_owners(s);
  auto decl = [&](const std::string& n, bool param) {
    TensorDecl t;
    t.name = p.intern(n);
    t.shape = {p.exprs.constant(16), p.exprs.constant(64)};
    t.param = param;
    p.tensors.push_back(std::move(t));
  };
  decl("x", false);
  std::vector<NameId> weight, wgrad;
  for (int st = 0; st < s.stages; ++st) {
    decl(fmt::format("w{}", st), true);
    decl(fmt::format("gw{}", st), false);
    weight.push_back(p.intern(fmt::format("w{}", st)));
    wgrad.push_back(p.intern(fmt::format("gw{}", st)));
  }
  std::vector<std::uint32_t> peer(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    peer[static_cast<std::size_t>(r)] = static_cast<std::uint32_t>(p.coords.size());
    p.coords.push_back({{0, r}});
  }
  // Names are made once per (stage, microbatch): a = activation out of F, g = gradient out of B/I.
  std::size_t cells = static_cast<std::size_t>(std::max(1, s.stages)) * static_cast<std::size_t>(std::max(1, s.microbatches));
  std::vector<NameId> act_ids(cells, -1), grad_ids(cells, -1), handle_ids(2 * cells, -1);
  auto cell = [&](int st, int mb) { return static_cast<std::size_t>(st) * static_cast<std::size_t>(s.microbatches) + static_cast<std::size_t>(mb); };
  auto act = [&](int st, int mb) {
    NameId& n = act_ids[cell(st, mb)];
    if (n < 0) n = p.intern(fmt::format("a{}_{}", st, mb));
    return n;
  };
  auto grad = [&](int st, int mb) {
    NameId& n = grad_ids[cell(st, mb)];
    if (n < 0) n = p.intern(fmt::format("g{}_{}", st, mb));
    return n;
  };
  auto add = [&](OpKind k, std::initializer_list<NameId> ins, std::initializer_list<NameId> outs, Loc l) -> Op& {
    Op o;
    o.kind = k;
    o.loc = l;
    if (steps_out) steps_out->push_back(cur);
    return p.add_op(o, std::span<const NameId>(ins.begin(), ins.size()), std::span<const NameId>(outs.begin(), outs.size()));
  };
  auto send = [&](NameId what, int to, Loc l) { add(OpKind::Send, {what}, {}, l).attrs.coords = peer[static_cast<std::size_t>(to)]; };
  auto recv = [&](NameId what, int from, Loc l) {
    Op& o = add(OpKind::Recv, {}, {what}, l);
    o.attrs.coords = peer[static_cast<std::size_t>(from)];
    o.attrs.matches = what;
  };
  auto rank_of = [&](int st) { return st >= 0 && st < s.stages ? owner[static_cast<std::size_t>(st)] : -1; };
  int last = s.stages - 1;
  // Compute-only: what each rank sends on each (src, dst) pair, in order. A receiver posts its irecvs
  // in that order (as early as needed) and waits for each right before the step that consumes it,
  // as PyTorch's runtime does; the sends follow the step that produces them.
  struct Item {
    NameId tensor, handle;
    LoweredStep what;  // the Recv it needs
  };
  std::unordered_map<std::int64_t, std::vector<Item>> items;  // (src, dst) -> what src sends, in order
  std::vector<std::size_t> item_index;                         // tensor (NameId) -> its position on its pair (kNone: not sent)
  constexpr std::size_t kNone = ~std::size_t{0};
  std::unordered_map<std::int64_t, std::size_t> posted;       // (src, dst) -> items whose irecv is posted
  auto pair_key = [&](int a, int b) { return std::int64_t{a} * (1 << 20) + b; };
  if (!s.has_comms)
    for (int r = 0; r < ranks; ++r)
      for (const auto& a : s.rows[static_cast<std::size_t>(r)])
        if (a)
          for (const Step& x : steps(*a)) {
            int to = -1;
            NameId t = -1;
            if (x.type == ActionType::F && rank_of(x.stage + 1) >= 0 && rank_of(x.stage + 1) != r) to = rank_of(x.stage + 1), t = act(x.stage, x.mb);
            if ((x.type == ActionType::B || x.type == ActionType::I) && x.stage > 0 && rank_of(x.stage - 1) != r)
              to = rank_of(x.stage - 1), t = grad(x.stage, x.mb);
            if (to < 0) continue;
            auto& v = items[pair_key(r, to)];
            if (static_cast<std::size_t>(t) >= item_index.size()) item_index.resize(std::max(p.names.size(), static_cast<std::size_t>(t) + 1), kNone);
            if (item_index[static_cast<std::size_t>(t)] == kNone) item_index[static_cast<std::size_t>(t)] = v.size();
            LoweredStep what = x.type == ActionType::F ? LoweredStep{ActionType::RecvF, x.stage, x.mb} : LoweredStep{ActionType::RecvB, x.stage, x.mb};
            v.push_back({t, t, what});  // the handle of a receive is named after the tensor it receives
          }
  auto need = [&](NameId t, int from, int r, Loc l) {
    std::size_t at = static_cast<std::size_t>(t) < item_index.size() ? item_index[static_cast<std::size_t>(t)] : kNone;
    auto ch = items.find(pair_key(from, r));
    if (at == kNone || ch == items.end() || at >= ch->second.size() || ch->second[at].tensor != t) {
      recv(t, from, l);  // never sent to this rank: a blocking receive that nothing matches
      return;
    }
    std::size_t& k = posted[pair_key(from, r)];
    LoweredStep saved = cur;
    for (; k <= at; ++k) {
      cur = ch->second[k].what;
      recv(ch->second[k].tensor, from, l);
      p.ops.back().attrs.handle = ch->second[k].handle;
    }
    cur = ch->second[at].what;
    add(OpKind::Wait, {}, {}, l).attrs.handle = ch->second[at].handle;
    cur = saved;
  };
  for (int r = 0; r < ranks; ++r) {
    RankProgram rp;
    rp.loc = {static_cast<std::uint32_t>(r + 1), 1};
    rp.selector = {{0, r}};
    rp.first_op = static_cast<std::uint32_t>(p.ops.size());
    for (const auto& a : s.rows[static_cast<std::size_t>(r)]) {
      if (!a) continue;
      Loc l = a->loc;
      auto label_of = [&] { return p.intern(action_text(*a)); };
      // What each lowered op carries: a Send/Recv the stage whose activation (F) or input gradient (B) it is.
      cur = {a->type, a->stage, a->mb};
      if (a->type == ActionType::RecvF) cur.stage = a->stage - 1;
      if (a->type == ActionType::RecvB) cur.stage = a->stage + 1;
      switch (a->type) {
        case ActionType::SendF:
          if (rank_of(a->stage + 1) >= 0) send(act(a->stage, a->mb), rank_of(a->stage + 1), l);
          continue;
        case ActionType::RecvF:
          if (rank_of(a->stage - 1) >= 0) recv(act(a->stage - 1, a->mb), rank_of(a->stage - 1), l);
          continue;
        case ActionType::SendB:
          if (rank_of(a->stage - 1) >= 0) send(grad(a->stage, a->mb), rank_of(a->stage - 1), l);
          continue;
        case ActionType::RecvB:
          if (rank_of(a->stage + 1) >= 0) recv(grad(a->stage + 1, a->mb), rank_of(a->stage + 1), l);
          continue;
        case ActionType::Unshard:
        case ActionType::Reshard: {
          NameId w = p.intern(fmt::format("w{}", a->stage));
          add(OpKind::Step, {w}, {w}, l).attrs.label = label_of();
          continue;
        }
        case ActionType::ReduceGrad: {
          NameId g = p.intern(fmt::format("gw{}", a->stage));
          add(OpKind::Step, {g}, {g}, l).attrs.label = label_of();
          continue;
        }
        case ActionType::F:
        case ActionType::I:
        case ActionType::W:
        case ActionType::B:
        case ActionType::OverlapFB: break;
      }
      for (const Step& x : steps(*a)) {
        NameId w = weight[static_cast<std::size_t>(x.stage)];
        NameId xl = -1;  // the cell's position names the step in reports
        cur = {x.type, x.stage, x.mb};
        if (x.type == ActionType::F) {
          NameId in = x.stage == 0 ? p.intern("x") : act(x.stage - 1, x.mb);
          int from = rank_of(x.stage - 1);
          if (!s.has_comms && x.stage > 0 && from >= 0 && from != r) need(in, from, r, l);
          add(OpKind::Step, {in, w}, {act(x.stage, x.mb)}, l).attrs.label = xl;
          int to = rank_of(x.stage + 1);
          cur = {ActionType::SendF, x.stage, x.mb};
          if (!s.has_comms && to >= 0 && to != r) send(act(x.stage, x.mb), to, l);
        } else if (x.type == ActionType::B || x.type == ActionType::I) {
          NameId in = x.stage == last ? act(x.stage, x.mb) : grad(x.stage + 1, x.mb);
          int from = rank_of(x.stage + 1);
          if (!s.has_comms && x.stage < last && from >= 0 && from != r) need(in, from, r, l);
          add(OpKind::Step, {in, act(x.stage, x.mb), w}, {grad(x.stage, x.mb)}, l).attrs.label = xl;
          int to = rank_of(x.stage - 1);
          cur = {ActionType::SendB, x.stage, x.mb};
          if (!s.has_comms && x.stage > 0 && to >= 0 && to != r) send(grad(x.stage, x.mb), to, l);
        } else {
          NameId in = x.stage == last ? act(x.stage, x.mb) : grad(x.stage + 1, x.mb);
          NameId gw = wgrad[static_cast<std::size_t>(x.stage)];
          add(OpKind::Step, {in, gw}, {gw}, l).attrs.label = xl;
        }
      }
    }
    rp.n_ops = static_cast<std::uint32_t>(p.ops.size()) - rp.first_op;
    p.programs.push_back(std::move(rp));
  }
  return p;
}

Schedule program_schedule(const Program& p, const std::string& path) {
  const ScheduleSpec& sp = p.schedule;
  if (!sp.kind.empty()) {
    try {
      return generate_schedule(sp.kind, static_cast<int>(sp.ranks), static_cast<int>(sp.microbatches), static_cast<int>(sp.virtual_stages));
    } catch (const std::invalid_argument& e) {
      throw LoadError(sp.kind_loc, e.what());
    }
  }
  std::filesystem::path csv = std::filesystem::path(path).parent_path() / sp.csv;
  Schedule s;
  try {
    s = load_schedule_csv(csv.string());
  } catch (const LoadError& e) {
    throw LoadError(sp.csv_loc, e.loc.line ? fmt::format("in {}:{}:{}: {}", csv.string(), e.loc.line, e.loc.col, e.what()) : e.what());
  }
  if (static_cast<std::int64_t>(s.rows.size()) != sp.ranks)
    throw LoadError(sp.csv_loc, fmt::format("{} has {} rows (pipeline ranks), but mesh axis {} has size {}", sp.csv, s.rows.size(),
                                            p.mesh[static_cast<std::size_t>(sp.axis)].name, sp.ranks));
  return s;
}

// ---- views -------------------------------------------------------------------------------------

std::string schedule_trace(const Schedule& s) {
  // Unit-time simulation: each compute step takes 1 (B takes 2), communication 0; a step starts when
  // its rank is free and its input exists (the previous stage's F, the next stage's B/I).
  int ranks = static_cast<int>(s.rows.size());
  std::vector<double> clock(static_cast<std::size_t>(ranks), 0);
  std::vector<std::size_t> pc(static_cast<std::size_t>(ranks), 0);
  std::map<std::tuple<int, int, int>, std::pair<double, int>> done;  // (kind 0=F 1=B, stage, mb) -> (end time, rank)
  struct Slice {
    int rank;
    double ts, dur;
    std::string name;
  };
  std::vector<Slice> slices;
  struct Flow {
    int src, dst;
    double ts_src, ts_dst;
  };
  std::vector<Flow> flows;
  auto dep = [&](const Step& x) -> std::optional<std::tuple<int, int, int>> {
    if (x.type == ActionType::F && x.stage > 0) return std::make_tuple(0, x.stage - 1, x.mb);
    if ((x.type == ActionType::B || x.type == ActionType::I) && x.stage + 1 < s.stages) return std::make_tuple(1, x.stage + 1, x.mb);
    return std::nullopt;
  };
  bool force = false;
  for (;;) {
    bool progress = false, pending = false;
    for (int r = 0; r < ranks; ++r) {
      const auto& row = s.rows[static_cast<std::size_t>(r)];
      auto& k = pc[static_cast<std::size_t>(r)];
      while (k < row.size()) {
        if (!row[k]) {
          clock[static_cast<std::size_t>(r)] += 1;  // a bubble
          ++k;
          continue;
        }
        const Action& a = *row[k];
        double start = clock[static_cast<std::size_t>(r)];
        bool wait = false;
        for (const Step& x : steps(a))
          if (auto d = dep(x)) {
            auto it = done.find(*d);
            if (it == done.end()) wait = true;
            else start = std::max(start, it->second.first);
          }
        if (wait && !force) break;
        double dur = 0;
        for (const Step& x : steps(a)) dur += x.type == ActionType::B ? 2 : is_compute(x.type) ? 1 : 0.25;
        slices.push_back({r, start, dur, action_text(a)});
        for (const Step& x : steps(a)) {
          if (auto d = dep(x)) {
            auto it = done.find(*d);
            if (it != done.end() && it->second.second != r) flows.push_back({it->second.second, r, it->second.first, start});
          }
          if (x.type == ActionType::F) done[{0, x.stage, x.mb}] = {start + dur, r};
          if (x.type == ActionType::B || x.type == ActionType::I) done[{1, x.stage, x.mb}] = {start + dur, r};
        }
        clock[static_cast<std::size_t>(r)] = start + dur;
        ++k;
        progress = true;
        force = false;
      }
      pending |= k < row.size();
    }
    if (!pending) break;
    force = !progress;
  }
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  auto emit = [&](const std::string& e) {
    out += (first ? "  " : ",\n  ") + e;
    first = false;
  };
  emit(fmt::format("{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {{\"name\": \"pipeline {}\"}}}}", s.source));
  for (int r = 0; r < ranks; ++r)
    emit(fmt::format("{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": {}, \"args\": {{\"name\": \"rank {}\"}}}}", r, r));
  constexpr double kUnit = 1000;  // one step = 1 ms
  for (const auto& sl : slices)
    emit(fmt::format("{{\"name\": \"{}\", \"cat\": \"step\", \"ph\": \"X\", \"pid\": 0, \"tid\": {}, \"ts\": {:.0f}, \"dur\": {:.0f}}}", sl.name, sl.rank,
                     sl.ts * kUnit, std::max(1.0, sl.dur * kUnit)));
  for (std::size_t i = 0; i < flows.size(); ++i) {
    const Flow& f = flows[i];
    emit(fmt::format("{{\"name\": \"p2p\", \"cat\": \"p2p\", \"ph\": \"s\", \"id\": {}, \"pid\": 0, \"tid\": {}, \"ts\": {:.0f}}}", i, f.src,
                     f.ts_src * kUnit - 1));
    emit(fmt::format("{{\"name\": \"p2p\", \"cat\": \"p2p\", \"ph\": \"f\", \"bp\": \"e\", \"id\": {}, \"pid\": 0, \"tid\": {}, \"ts\": {:.0f}}}", i,
                     f.dst, f.ts_dst * kUnit));
  }
  out += "\n]}\n";
  return out;
}

}  // namespace spmd
