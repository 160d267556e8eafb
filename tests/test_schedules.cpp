// tests/test_schedules.cpp - pipeline schedules: every published file's verdict, the CSV grammar,
// generated schedules over a grid, mutations caught with the right ID, grad-sync-early, the trace.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "schedules/schedule.h"
#include "temporal/temporal.h"

using namespace spmd;

namespace {

// The published schedules, copied into the repository with their source and licence (tests/data/pipelining/README.md).
const std::string kData = std::string(SPMD_SOURCE_DIR) + "/tests/data/pipelining/";
// The corpus they were copied from: ../shared beside the repository in the project's workspace (or $SPMD_SHARED_DIR);
// absent in a plain clone.
std::string corpus_dir() {
  const char* env = std::getenv("SPMD_SHARED_DIR");
  return (env && *env ? std::string(env) : std::string(SPMD_SOURCE_DIR) + "/../shared") + "/data/pipelining/";
}

std::set<std::string> verdict(const Schedule& s, P2PModel model) {
  std::set<std::string> ids;
  for (const auto& d : validate_schedule(s)) ids.insert(std::string(check_name(d.id)));
  if (ids.count("schedule-invalid")) return ids;
  TemporalOptions o;
  o.p2p_model = model;
  for (const auto& d : check_temporal(lower_schedule(s, model), o)) ids.insert(std::string(check_name(d.id)));
  return ids;
}

const std::set<std::string> kClean;
const std::set<std::string> kDeadlock{"deadlock"};

}  // namespace

TEST_CASE("published schedules: pass under eager; the hand-made deadlocks are found") {
  for (const char* f : {"pytorch_zb1p_2rank_2stagep_compute.csv", "pytorch_dualpipev_4rank_10mb.csv", "torchtitan_example.csv",
                        "torchtitan_interleaved1f1b_8ranks_16mb.csv", "torchtitan_2rank.csv", "torchtitan_4rank.csv", "torchtitan_8rank.csv"}) {
    CAPTURE(f);
    CHECK(verdict(load_schedule_csv(kData + f), P2PModel::Eager) == kClean);
  }
  Schedule recv_first = load_schedule_csv(kData + "deadlock_recv_first_2rank.csv");
  CHECK(verdict(recv_first, P2PModel::Eager) == kDeadlock);
  CHECK(verdict(recv_first, P2PModel::Rendezvous) == kDeadlock);
  Schedule send_send = load_schedule_csv(kData + "rendezvous_send_send_2rank.csv");
  CHECK(verdict(send_send, P2PModel::Eager) == kClean);
  CHECK(verdict(send_send, P2PModel::Rendezvous) == kDeadlock);
}

TEST_CASE("the legacy BW token and malformed actions are located errors") {
  try {
    load_schedule_csv(kData + "pytorch_zb1p_2rank_2stagep_comms.csv");
    FAIL("BW must be rejected");
  } catch (const LoadError& e) {
    CHECK(e.loc.line == 1);
    CHECK(e.loc.col == 80);
    CHECK(std::string(e.what()).find("`2BW0`") != std::string::npos);
  }
  auto err = [](const std::string& text) -> std::string {
    try {
      parse_schedule_csv(text, "t.csv");
    } catch (const LoadError& e) {
      return std::to_string(e.loc.line) + ":" + std::to_string(e.loc.col) + " " + e.what();
    }
    return "";
  };
  CHECK(err("0F0,0X1\n").rfind("1:5 ", 0) == 0);
  CHECK(err("0F0,0SEND_G1\n").find("unknown action type") != std::string::npos);
  CHECK(err("0F0\n0F\n").rfind("2:1 ", 0) == 0);                       // F needs a microbatch
  CHECK(err("0UNSHARD1\n").find("takes no microbatch") != std::string::npos);
  CHECK(err("(0F0;1F0)OVERLAP_F_B\n").find("pairs a forward") != std::string::npos);
  CHECK(err("F0\n").find("is not an action") != std::string::npos);
  CHECK(err("").find("empty schedule") != std::string::npos);
  CHECK(err("0F99999999\n").find("too large") != std::string::npos);
  CHECK(err("0F0,,0B0\n\n").empty());  // bubbles and trailing empty lines are fine
}

TEST_CASE("a CSV's cells and rows x actions are bounded while it is read (the deadlock check's vector clocks grow with both)") {
  // 4,000 rows: at most 50,000 actions. The 50,001st (on the last row) is the located error; 50,000 parse.
  auto table = [](int first_row_actions) {
    std::string t;
    for (int i = 0; i < first_row_actions; ++i) t += i ? ",0F0" : "0F0";
    t += std::string(3'998, '\n') + "\n0B0\n";
    return t;
  };
  CHECK(parse_schedule_csv(table(49'999), "t.csv").rows.size() == 4'000);
  try {
    parse_schedule_csv(table(50'000), "t.csv");
    FAIL("50,001 actions on 4,000 rows must be rejected");
  } catch (const LoadError& e) {
    CHECK(e.loc.line == 4'000);
    CHECK(e.loc.col == 1);
    CHECK(std::string(e.what()).find("at most 50000 actions") != std::string::npos);
  }
  // Empty cells are counted too, while the row is read (60 million commas took 2.5 GiB before the action count).
  try {
    parse_schedule_csv("0F0" + std::string(2'000'000, ',') + "0B0\n", "t.csv");
    FAIL("2,000,001 cells must be rejected");
  } catch (const LoadError& e) {
    CHECK(e.loc.line == 1);
    CHECK(std::string(e.what()).find("more than 2000000 cells") != std::string::npos);
  }
}

TEST_CASE("generated schedules pass over a grid of stages, microbatches and virtual stages") {
  for (const char* kind : {"GPipe", "1F1B", "ZBH1", "Interleaved1F1B"})
    for (int p : {1, 2, 3, 4, 8})
      for (int m : {1, 2, 3, 4, 8, 16})
        for (int v : {1, 2, 3}) {
          if (std::string(kind) != "Interleaved1F1B" && v > 1) continue;
          if (std::string(kind) == "Interleaved1F1B" && v > 1 && m % p != 0) {
            CHECK_THROWS_AS(generate_schedule(kind, p, m, v), std::invalid_argument);
            continue;
          }
          CAPTURE(kind);
          CAPTURE(p);
          CAPTURE(m);
          CAPTURE(v);
          Schedule s = generate_schedule(kind, p, m, v);
          CHECK(verdict(s, P2PModel::Eager) == kClean);
          CHECK(verdict(with_comms(s), P2PModel::Eager) == kClean);  // the lowered form reads back the same
        }
  // Blocking sends (rendezvous): 1F1B's steady state deadlocks, GPipe on 2 ranks does not.
  CHECK(verdict(generate_schedule("1F1B", 4, 8), P2PModel::Rendezvous) == kDeadlock);
}

TEST_CASE("mutations of a generated schedule are caught with the right ID") {
  Schedule base = generate_schedule("1F1B", 4, 8);
  {  // drop an action
    Schedule s = base;
    s.rows[1].erase(s.rows[1].begin() + 2);
    CHECK(verdict(s, P2PModel::Eager) == std::set<std::string>{"schedule-invalid"});
  }
  {  // duplicate one
    Schedule s = base;
    s.rows[2].insert(s.rows[2].begin() + 3, s.rows[2][3]);
    CHECK(verdict(s, P2PModel::Eager) == std::set<std::string>{"schedule-invalid"});
  }
  {  // reorder two microbatches on one rank (lowered form): FIFO delivers the other activation
    Schedule s = with_comms(base);
    for (auto& a : s.rows[1])
      if (a && (a->type == ActionType::RecvF || a->type == ActionType::F || a->type == ActionType::SendF) && a->mb <= 1) a->mb = 1 - a->mb;
    CHECK(verdict(s, P2PModel::Eager) == std::set<std::string>{"p2p-mismatch"});
  }
  {  // in a compute-only schedule the receives follow the sender's order: reordering is not a FIFO error
    Schedule s = base;
    std::swap(s.rows[0][0], s.rows[0][1]);
    CHECK(verdict(s, P2PModel::Eager) == kClean);
  }
  {  // swap a send with a receive in the lowered schedule: the receive now waits for itself
    Schedule s = with_comms(base);
    auto& row = s.rows[0];
    std::size_t send = 0, recv = 0;
    for (std::size_t k = 0; k < row.size(); ++k) {
      if (row[k] && row[k]->type == ActionType::SendF && !send) send = k + 1;
      if (row[k] && row[k]->type == ActionType::RecvB && send && !recv) recv = k + 1;
    }
    REQUIRE(send);
    REQUIRE(recv);
    // Move the first RECV_B in front of the first SEND_F.
    auto r = row[recv - 1];
    row.erase(row.begin() + static_cast<long>(recv - 1));
    row.insert(row.begin() + static_cast<long>(send - 1), r);
    CHECK(verdict(s, P2PModel::Eager) == kDeadlock);
  }
  {  // a backward before its forward
    Schedule s = base;
    auto& row = s.rows[3];  // last stage: F0 B0 F1 B1 ...
    std::swap(row[0], row[1]);
    CHECK(verdict(s, P2PModel::Eager) == std::set<std::string>{"schedule-invalid"});
  }
  {  // a stage computed on two ranks
    Schedule s = base;
    s.rows[0].push_back(s.rows[1][0]);
    CHECK(verdict(s, P2PModel::Eager).count("schedule-invalid"));
  }
}

TEST_CASE("grad-sync-early: REDUCE_GRAD before the stage's last backward") {
  CHECK(verdict(parse_schedule_csv("0F0,0F1,0B0,0B1,0REDUCE_GRAD\n", "t.csv"), P2PModel::Eager) == kClean);
  CHECK(verdict(parse_schedule_csv("0F0,0F1,0B0,0REDUCE_GRAD,0B1\n", "t.csv"), P2PModel::Eager) == std::set<std::string>{"grad-sync-early"});
  CHECK(verdict(parse_schedule_csv("0F0,0I0,0REDUCE_GRAD,0W0\n", "t.csv"), P2PModel::Eager) == std::set<std::string>{"grad-sync-early"});
  // W after I; UNSHARD before compute.
  CHECK(verdict(parse_schedule_csv("0F0,0W0,0I0\n", "t.csv"), P2PModel::Eager) == std::set<std::string>{"schedule-invalid"});
  CHECK(verdict(parse_schedule_csv("0UNSHARD,0F0,0B0,0RESHARD\n", "t.csv"), P2PModel::Eager) == kClean);
  CHECK(verdict(parse_schedule_csv("0UNSHARD,0F0,0RESHARD,0B0\n", "t.csv"), P2PModel::Eager) == std::set<std::string>{"schedule-invalid"});
}

TEST_CASE("the grid and the Chrome trace") {
  Schedule s = generate_schedule("1F1B", 2, 2);
  std::string grid = schedule_grid(s);
  CHECK(grid.find("rank 0 | 0F0") != std::string::npos);
  auto j = nlohmann::json::parse(schedule_trace(s));
  REQUIRE(j.contains("traceEvents"));
  int slices = 0, flows = 0;
  for (const auto& e : j["traceEvents"]) {
    slices += e["ph"] == "X";
    flows += e["ph"] == "s";
  }
  CHECK(slices == 8);
  CHECK(flows == 4);  // F0, F1 forward; B0, B1 backward
  // The deadlock grid marks the blocked cells and stops each row there.
  std::string g = schedule_grid(load_schedule_csv(kData + "deadlock_recv_first_2rank.csv"), {{1, 1}, {2, 1}});
  CHECK(g.find(">0RECV_B0<  (blocked)") != std::string::npos);
  CHECK(g.find("0SEND_F0") == std::string::npos);
}

TEST_CASE("the copies in tests/data/pipelining are the published files (skipped without ../shared)" * doctest::test_suite("corpus")) {
  namespace fs = std::filesystem;
  const std::string corpus = corpus_dir();
  if (!fs::is_directory(corpus)) {
    MESSAGE("skipped: the outside corpus " << corpus << " is absent (a clone on its own); the copies in tests/data/pipelining are used");
    return;
  }
  auto slurp = [](const fs::path& f) {
    std::ifstream in(f, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  int compared = 0;
  for (const auto& e : fs::directory_iterator(corpus)) {
    if (e.path().extension() != ".csv") continue;
    CAPTURE(e.path().filename().string());
    fs::path copy = fs::path(kData) / e.path().filename();
    REQUIRE(fs::exists(copy));  // every schedule of the corpus has its copy
    CHECK(slurp(copy) == slurp(e.path()));
    ++compared;
  }
  CHECK(compared >= 10);
}
