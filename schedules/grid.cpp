// schedules/grid.cpp - a pipeline schedule as a terminal grid (folded to 100 columns) and as CSV text.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "schedules/schedule.h"

namespace spmd {

std::string schedule_grid(const Schedule& s, const std::vector<Loc>& blocked) {
  constexpr std::size_t kLineWidth = 100;  // a wider grid is folded into bands of steps, each with its own header
  std::size_t width = 2;
  std::size_t cols = 0;
  for (const auto& row : s.rows) {
    cols = std::max(cols, row.size());
    for (const auto& a : row)
      if (a) width = std::max(width, action_text(*a).size() + 2);
  }
  width = std::min<std::size_t>(width, 28);
  auto is_blocked = [&](const Action& a) {
    return std::any_of(blocked.begin(), blocked.end(), [&](Loc l) { return l.line == a.loc.line && l.col == a.loc.col; });
  };
  // Each row's cells; a row with a blocked cell stops there (the rank runs no further).
  std::vector<std::vector<std::string>> cells(s.rows.size());
  std::vector<std::size_t> stop(s.rows.size(), SIZE_MAX);  // index of the blocked cell
  for (std::size_t r = 0; r < s.rows.size(); ++r)
    for (const auto& a : s.rows[r]) {
      std::string t = a ? action_text(*a) : ".";
      if (t.size() > width) t = t.substr(0, width - 1) + "~";
      bool b = a && is_blocked(*a);
      cells[r].push_back(b ? ">" + t + "<" : t);
      if (b) {
        stop[r] = cells[r].size() - 1;
        break;
      }
    }
  std::size_t shown = 0;
  for (const auto& c : cells) shown = std::max(shown, c.size());
  if (!blocked.empty()) cols = std::min(cols, shown);  // the deadlock grid ends where the last rank stops
  std::size_t band = std::max<std::size_t>(1, (kLineWidth - 10) / (width + 1));
  std::string out;
  auto trim = [](std::string line) {
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return line;
  };
  for (std::size_t from = 0; from < std::max<std::size_t>(cols, 1); from += band) {
    std::size_t to = std::min(cols, from + band);
    std::string head = fmt::format("{:>8} |", "step");
    for (std::size_t c = from; c < to; ++c) head += fmt::format(" {:<{}}", c, width);
    out += (from ? "\n" : "") + trim(head) + "\n";
    for (std::size_t r = 0; r < s.rows.size(); ++r) {
      std::string line = fmt::format("{:>8} |", fmt::format("rank {}", r));
      for (std::size_t c = from; c < to && c < cells[r].size(); ++c) line += fmt::format(" {:<{}}", cells[r][c], width);
      if (stop[r] >= from && stop[r] < to) line = trim(line) + "  (blocked)";
      else if (stop[r] < from) line += fmt::format("  (blocked at step {})", stop[r]);
      out += trim(line) + "\n";
    }
  }
  return out;
}

std::string schedule_csv(const Schedule& s) {
  std::string out;
  for (const auto& row : s.rows) {
    for (std::size_t k = 0; k < row.size(); ++k) out += (k ? "," : "") + (row[k] ? action_text(*row[k]) : std::string());
    out += "\n";
  }
  return out;
}

}  // namespace spmd
