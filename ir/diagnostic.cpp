// ir/diagnostic.cpp - ordering and capping of diagnostics.
#include "ir/diagnostic.h"

#include <algorithm>
#include <tuple>

namespace spmd {

const char* fix_kind_name(FixKind k) {
  switch (k) {
    case FixKind::None: return "none";
    case FixKind::InsertBefore: return "insert_before";
    case FixKind::InsertAfter: return "insert_after";
    case FixKind::Replace: return "replace";
    case FixKind::Append: return "append";
    case FixKind::Move: return "move";
  }
  return "none";
}

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
