// spatial/obligations.h - shape obligations over size expressions, decided directly when concrete
// and by Z3 (proof by refutation) when symbolic.
//
// A concrete obligation is decided on the spot and never reaches the solver. A symbolic one is
// queued (deduplicated) and discharged by solve(). Sizes with a finite `in` set are enumerated
// (up to 4,096 combinations) and decided without Z3 when that suffices (all sizes finite, or a
// divisor that is a known factor of the dividend). What is left is one Z3 query per obligation: its
// negation, instantiated with every open combination of the finite sizes, under the constraints of
// the sizes it mentions only (no other size is asserted, so the cost of a query does not grow with
// the program). sat gives a counterexample, unsat a proof, unknown (e.g. a timeout) an error that
// says the obligation could not be proved, never a pass. The Z3 context is made by the first query.
#pragma once
#include <cstdint>
#include <string>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "ir/diagnostic.h"
#include "ir/expr.h"

namespace spmd {

enum class OblKind : std::uint8_t { Divisible, Equal, Positive, ExactDiv };

struct Obligation {
  OblKind kind;
  ExprId a, b;          // Divisible: a % b == 0; Equal: a == b; Positive: a >= 1; ExactDiv: a is a Div node
  CheckId id;
  Loc loc;
  int op = -1;
  std::string tensor;
  std::string what;     // what must hold, in words, e.g. "dim 1 of w1 (4*H) must be divisible by tp (T)"
  std::vector<Note> notes;
};

enum class Decision : std::uint8_t { Holds, Fails, Deferred };

class Obligations {
 public:
  // `var_locs[i]` is where symbolic size i is declared (for notes on counterexamples).
  Obligations(ExprPool& pool, const std::vector<SizeVar>& vars, std::vector<Loc> var_locs, unsigned timeout_ms)
      : pool_(pool), vars_(vars), var_locs_(std::move(var_locs)), timeout_ms_(timeout_ms) {}

  // Decides a claim now when both sides are concrete; Deferred when it mentions symbolic sizes.
  Decision decide(OblKind k, ExprId a, ExprId b) const;
  // True the first time a (symbolic) claim is seen; then push() its description for solve().
  bool first_time(OblKind k, ExprId a, ExprId b);
  void push(Obligation o) { pending_.push_back(std::move(o)); }
  const std::vector<Obligation>& pending() const { return pending_; }
  // Discharges the queued obligations, appending a diagnostic for each that fails or is unknown.
  void solve(std::vector<Diagnostic>& out);
  // The value of a concrete expression (nullopt when symbolic; a variable with one allowed value, as a generalized
  // size has, counts as concrete here, so rules that need a number behave as on the concrete program).
  std::optional<std::int64_t> concrete(ExprId e) const;

 private:
  ExprPool& pool_;
  const std::vector<SizeVar>& vars_;
  std::vector<Loc> var_locs_;
  unsigned timeout_ms_;
  std::vector<Obligation> pending_;
  std::set<std::tuple<int, ExprId, ExprId>> seen_;
};

// The words for a failing obligation given the values of its sides, e.g. "4100 is not divisible by 8".
std::string failure_words(OblKind k, std::int64_t a, std::int64_t b);

}  // namespace spmd
