// ir/diagnostic.cpp - ordering and capping of diagnostics.
#include "ir/diagnostic.h"

#include <algorithm>
#include <tuple>

namespace spmd {

std::size_t sort_and_cap(std::vector<Diagnostic>& diags, std::size_t cap) {
  std::stable_sort(diags.begin(), diags.end(), [](const Diagnostic& a, const Diagnostic& b) {
    return std::tie(a.loc.line, a.loc.col) < std::tie(b.loc.line, b.loc.col);
  });
  if (diags.size() <= cap) return 0;
  std::size_t dropped = diags.size() - cap;
  diags.resize(cap);
  return dropped;
}

}  // namespace spmd
