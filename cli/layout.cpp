// cli/layout.cpp - tensor layouts over the mesh, as text grids and SVG.
#include "cli/layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "ir/printer.h"

namespace spmd {

namespace {

constexpr int kMaxSide = 16;        // blocks drawn per side
constexpr int kMaxLines = 6;        // holder lines per cell before they are elided
constexpr std::size_t kLineWidth = 100;  // a text grid wider than this leaves out middle columns
constexpr std::int64_t kMaxRanks = 4096;
constexpr std::int64_t kMaxUnits = 1 << 16;  // pieces of a zigzag dim (each rank's are enumerated)


// The axes that shard dim d, in mesh order (the first is the outer one, as in DTensor).
std::vector<int> shard_axes(const Program& p, const ValueType& t, int d) {
  std::vector<int> v;
  for (int a = 0; a < p.axis_count(); ++a)
    if (t.pl[static_cast<std::size_t>(a)].is_s(d)) v.push_back(a);
  return v;
}

std::string dim_text(const Program& p, const ExprPool& ex, ExprId e) { return ex.str(e, p.vars); }

}  // namespace

std::string html_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string zigzag_text(const Program& p, const ValueType& t) {
  if (!t.zz_dims || t.zz_axis < 0 || t.zz_axis >= p.axis_count()) return "";
  std::string s;
  for (int d = 0; d < t.rank; ++d)
    if (t.zz_dims >> d & 1u) s += fmt::format("{}dim {}", s.empty() ? "" : ", ", d);
  return s + fmt::format(" in zigzag order over {}", p.mesh[static_cast<std::size_t>(t.zz_axis)].name);
}

std::string local_shape(const Program& p, const ExprPool& ex, const ValueType& t) {
  std::string s = "[";
  for (int d = 0; d < t.rank; ++d) {
    ExprId e = t.shape[static_cast<std::size_t>(d)];
    std::vector<int> axes = shard_axes(p, t, d);
    std::string dim = dim_text(p, ex, e);
    if (!axes.empty()) {
      bool concrete = ex.is_const(e);
      std::int64_t n = 1;
      std::string div;
      for (int a : axes) {
        ExprId sz = p.mesh[static_cast<std::size_t>(a)].size;
        if (ex.is_const(sz)) n *= ex.value(sz);
        else concrete = false, div += (div.empty() ? "" : "*") + ex.str(sz, p.vars);
      }
      if (concrete) {
        std::int64_t g = ex.value(e);
        dim = g % n == 0 ? std::to_string(g / n) : fmt::format("{}..{}", g / n, (g + n - 1) / n);
      } else {
        std::string den = div.empty() ? std::to_string(n) : (n > 1 ? std::to_string(n) + "*" + div : div);
        bool simple = dim.find_first_of("+-*/ ") == std::string::npos;
        dim = (simple ? dim : "(" + dim + ")") + "/" + (den.find('*') == std::string::npos ? den : "(" + den + ")");
      }
    }
    s += (d ? ", " : "") + dim;
  }
  return s + "]";
}

namespace {

// The global chunk at position j of a dim in zigzag order over N ranks (2N chunks): rank i holds positions 2i and
// 2i+1, which are global chunks i and 2N-1-i.
std::int64_t zigzag_chunk(std::int64_t j, std::int64_t chunks) { return j % 2 == 0 ? j / 2 : chunks - 1 - (j - 1) / 2; }

// How one drawn dim is cut: the axes that shard it in their shard order (major first), and, when the dim is in
// zigzag order over an axis (LoadBalance), the 2N chunks of that order. The dim is drawn in `units` pieces in
// global order (the blocks, or with zigzag the finer of the blocks and the chunks); a rank holds the units
// `held` returns, which for a strided or zigzag layout are not its block's contiguous range.
struct Cut {
  int dim = -1;
  std::vector<int> axes;   // shard order, major first
  std::int64_t blocks = 1; // product of their sizes
  std::int64_t chunks = 0; // zigzag: 2N chunks over the zigzag axis (0: not zigzag)
  std::int64_t units = 1;
  // The units (global order) the rank at `coord` holds, ascending.
  std::vector<std::int64_t> held(const std::vector<std::int64_t>& size, const std::vector<std::int64_t>& coord) const {
    std::int64_t b = 0;
    for (int a : axes) b = b * size[static_cast<std::size_t>(a)] + coord[static_cast<std::size_t>(a)];
    std::int64_t per = units / blocks;
    std::vector<std::int64_t> out;
    for (std::int64_t q = b * per; q < (b + 1) * per; ++q) {
      if (!chunks) {
        out.push_back(q);
        continue;
      }
      std::int64_t k = units / chunks;
      out.push_back(zigzag_chunk(q / k, chunks) * k + q % k);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

std::int64_t lcm64(std::int64_t a, std::int64_t b) { return a / std::gcd(a, b) * b; }

}  // namespace

Layout tensor_layout(const Program& p, const ExprPool& ex, const ValueType& t, const std::string& name) {
  Layout l;
  l.name = name;
  std::string shape = "[";
  for (int d = 0; d < t.rank; ++d) shape += (d ? ", " : "") + dim_text(p, ex, t.shape[static_cast<std::size_t>(d)]);
  shape += "]";
  bool zz = t.zz_dims && t.zz_axis >= 0 && t.zz_axis < p.axis_count();
  std::string zz_text = zigzag_text(p, t);
  l.shape_dtype = fmt::format("{} {}", shape, dtype_name(t.dtype));
  l.placements = placements_text(p, t.pl) + (zz_text.empty() ? "" : "  " + zz_text);
  l.summary = l.shape_dtype + "  " + l.placements;
  // Mesh sizes must be concrete to enumerate ranks.
  std::vector<std::int64_t> size(static_cast<std::size_t>(p.axis_count()));
  std::int64_t ranks = 1;
  for (int a = 0; a < p.axis_count(); ++a) {
    ExprId s = p.mesh[static_cast<std::size_t>(a)].size;
    if (!ex.is_const(s)) {
      l.why_not = fmt::format("mesh axis {} has a symbolic size, so its ranks cannot be drawn", p.mesh[static_cast<std::size_t>(a)].name);
      return l;
    }
    size[static_cast<std::size_t>(a)] = ex.value(s);
    ranks *= ex.value(s);
    if (ranks > kMaxRanks) {
      l.why_not = fmt::format("the mesh has more than {} ranks; no picture", kMaxRanks);
      return l;
    }
  }
  std::vector<int> sharded;  // dims with a shard, in dim order
  for (int d = 0; d < t.rank; ++d)
    if (!shard_axes(p, t, d).empty()) sharded.push_back(d);
  auto cut_of = [&](int d) {
    Cut c;
    c.dim = d;
    if (d < 0) return c;
    int axes[kMaxAxes];
    int n = shard_order(t.pl.data(), p.axis_count(), d, axes);
    c.axes.assign(axes, axes + n);
    for (int a : c.axes) c.blocks *= size[static_cast<std::size_t>(a)];
    c.units = c.blocks;
    if (zz && (t.zz_dims >> d & 1u)) {
      std::int64_t chunks = 2 * size[static_cast<std::size_t>(t.zz_axis)];
      if (lcm64(c.blocks, chunks) <= kMaxUnits) c.chunks = chunks, c.units = lcm64(c.blocks, chunks);
      else l.notes.push_back(fmt::format("dim {} is in zigzag order, which is not drawn for this many blocks", d));
    }
    return c;
  };
  Cut row = cut_of(sharded.size() > 0 ? sharded[0] : -1), col = cut_of(sharded.size() > 1 ? sharded[1] : -1);
  l.rows = static_cast<int>(std::min<std::int64_t>(row.units, kMaxSide));
  l.cols = static_cast<int>(std::min<std::int64_t>(col.units, kMaxSide));
  auto label_for = [&](const Cut& c) {
    std::string axes;
    for (int a : c.axes) axes += (axes.empty() ? "" : " x ") + p.mesh[static_cast<std::size_t>(a)].name;
    std::string s = fmt::format("dim {} ({}) split {} ways over {}", c.dim, dim_text(p, ex, t.shape[static_cast<std::size_t>(c.dim)]), c.blocks, axes);
    if (c.axes.size() > 1 && t.pl[static_cast<std::size_t>(c.axes[0])].ord)
      s += fmt::format(" ({} major: a strided shard, not mesh order)", p.mesh[static_cast<std::size_t>(c.axes[0])].name);
    if (c.chunks)
      s += fmt::format(", in zigzag order: {} chunks, rank i of {} holds chunks i and {}-i", c.chunks, p.mesh[static_cast<std::size_t>(t.zz_axis)].name,
                       c.chunks - 1);
    return s;
  };
  auto heads_for = [&](const Cut& c, int shown) {
    std::vector<std::string> h;
    ExprId e = t.shape[static_cast<std::size_t>(c.dim)];
    for (int i = 0; i < shown; ++i) {
      if (ex.is_const(e) && ex.value(e) % c.units == 0) {
        std::int64_t b = ex.value(e) / c.units;
        h.push_back(fmt::format("{}:{}", i * b, (i + 1) * b));
      } else {
        h.push_back(fmt::format("{} {}", c.chunks ? "chunk" : "block", i));
      }
    }
    return h;
  };
  if (row.dim >= 0) l.row_label = label_for(row), l.row_heads = heads_for(row, l.rows);
  if (col.dim >= 0) l.col_label = label_for(col), l.col_heads = heads_for(col, l.cols);
  if (row.units > kMaxSide || col.units > kMaxSide) l.notes.push_back(fmt::format("only the first {} blocks a side are drawn", kMaxSide));
  if (zz)
    for (int d = 0; d < t.rank; ++d)
      if ((t.zz_dims >> d & 1u) && d != row.dim && d != col.dim) {
        std::int64_t c = 2 * size[static_cast<std::size_t>(t.zz_axis)];
        std::string seq;
        for (std::int64_t j = 0; j < std::min<std::int64_t>(c, kMaxSide); ++j) seq += fmt::format("{}{}", j ? ", " : "", zigzag_chunk(j, c));
        l.notes.push_back(fmt::format("dim {} is in zigzag order over {} (LoadBalance): its {} chunks lie in the order {}{}", d,
                                      p.mesh[static_cast<std::size_t>(t.zz_axis)].name, c, seq, c > kMaxSide ? ", ..." : ""));
      }
  // Holders per cell, by enumerating every rank (row-major over the mesh axes).
  std::vector<std::set<std::string>> holders(static_cast<std::size_t>(l.rows * l.cols));
  std::vector<std::vector<std::string>> order(holders.size());
  bool any_p = false;
  std::vector<std::int64_t> coord(size.size(), 0);
  for (std::int64_t r = 0; r < ranks; ++r) {
    std::int64_t rest = r;
    for (int a = p.axis_count() - 1; a >= 0; --a) coord[static_cast<std::size_t>(a)] = rest % size[static_cast<std::size_t>(a)], rest /= size[static_cast<std::size_t>(a)];
    std::string who, prefix;
    bool wild_all = true;
    for (int a = 0; a < p.axis_count(); ++a) {
      const Placement& pl = t.pl[static_cast<std::size_t>(a)];
      const std::string& an = p.mesh[static_cast<std::size_t>(a)].name;
      std::string part;
      if (pl.is_r() || pl.is_i()) {
        part = size[static_cast<std::size_t>(a)] > 1 ? an + "*" : "";
      } else {
        wild_all = false;
        part = an + std::to_string(coord[static_cast<std::size_t>(a)]);
        if (pl.is_p()) any_p = true, prefix = "+ ";
      }
      if (!part.empty()) who += (who.empty() ? "" : " ") + part;
    }
    if (wild_all) who = ranks > 1 ? fmt::format("all {} ranks", ranks) : "the one rank";
    bool is_v = false;
    for (int a = 0; a < p.axis_count(); ++a) is_v |= t.pl[static_cast<std::size_t>(a)].is_v();
    std::string line = prefix + who + (is_v ? " (own value)" : "");
    std::vector<std::int64_t> rows_held = row.dim >= 0 ? row.held(size, coord) : std::vector<std::int64_t>{0};
    std::vector<std::int64_t> cols_held = col.dim >= 0 ? col.held(size, coord) : std::vector<std::int64_t>{0};
    for (std::int64_t br : rows_held)
      for (std::int64_t bc : cols_held) {
        if (br >= l.rows || bc >= l.cols) continue;
        auto& set = holders[static_cast<std::size_t>(br * l.cols + bc)];
        if (set.insert(line).second) order[static_cast<std::size_t>(br * l.cols + bc)].push_back(line);
      }
  }
  for (int i = 0; i < l.rows * l.cols; ++i) {
    LayoutCell c;
    auto& lines = order[static_cast<std::size_t>(i)];
    if (any_p && !lines.empty()) {
      for (int a = 0; a < p.axis_count(); ++a)
        if (t.pl[static_cast<std::size_t>(a)].is_p()) {
          c.lines.push_back(fmt::format("{} of:", to_string(t.pl[static_cast<std::size_t>(a)])));
          break;
        }
    }
    if (static_cast<int>(lines.size()) > kMaxLines) {
      std::size_t n = lines.size();
      for (int k = 0; k < kMaxLines - 2; ++k) c.lines.push_back(lines[static_cast<std::size_t>(k)]);
      c.lines.push_back(fmt::format("... {} more", n - static_cast<std::size_t>(kMaxLines - 1)));
      c.lines.push_back(lines.back());
    } else {
      c.lines.insert(c.lines.end(), lines.begin(), lines.end());
    }
    c.color = i;
    l.cells.push_back(std::move(c));
  }
  for (int a = 0; a < p.axis_count(); ++a) {
    const Placement& pl = t.pl[static_cast<std::size_t>(a)];
    const std::string& an = p.mesh[static_cast<std::size_t>(a)].name;
    switch (pl.kind) {
      case PKind::R: l.notes.push_back(fmt::format("{}: R, every {} coordinate holds the same block ({}*)", an, an, an)); break;
      case PKind::I:
        l.notes.push_back(fmt::format("{}: I, every {} coordinate holds the same block ({}*), and so does its gradient (nothing to sum)", an, an, an));
        break;
      case PKind::V: l.notes.push_back(fmt::format("{}: V, each {} coordinate holds its own value of the block (not a shard, not a summand)", an, an)); break;
      case PKind::P:
        l.notes.push_back(fmt::format("{}: {}, the block is the {} of the stacked summands (+), one per {} coordinate", an, to_string(pl),
                                      reduce_name(pl.op), an));
        break;
      case PKind::S:
        if (pl.dim != row.dim && pl.dim != col.dim)
          l.notes.push_back(fmt::format("{}: S({}), a dim not drawn: each holder keeps only the block of dim {} its {} coordinate names", an, pl.dim, pl.dim, an));
        break;
    }
  }
  l.drawable = true;
  return l;
}

std::string layout_text(const Layout& l, bool color) {
  std::string s = fmt::format("{}: {}\n", l.name, l.summary);
  if (!l.drawable) return s + "  (" + l.why_not + ")\n";
  static const int palette[] = {153, 223, 194, 217, 189, 229, 152, 224, 158, 219, 187, 195, 230, 183, 157, 216};
  std::vector<std::size_t> width(static_cast<std::size_t>(l.cols), 0);
  for (int c = 0; c < l.cols; ++c) {
    std::size_t w = c < static_cast<int>(l.col_heads.size()) ? l.col_heads[static_cast<std::size_t>(c)].size() : 0;
    for (int r = 0; r < l.rows; ++r)
      for (const auto& line : l.cells[static_cast<std::size_t>(r * l.cols + c)].lines) w = std::max(w, line.size());
    width[static_cast<std::size_t>(c)] = w + 2;
  }
  std::size_t lw = 0;
  for (const auto& h : l.row_heads) lw = std::max(lw, h.size());
  std::string pad(lw ? lw + 1 : 0, ' ');
  // Columns drawn: all when the grid fits kLineWidth; else the first ones that fit, "..." and the last one.
  constexpr int kDots = -1;
  constexpr std::size_t kDotsWidth = 5;
  std::vector<int> cols;
  std::size_t total = pad.size() + 1;
  for (auto w : width) total += w + 1;
  if (total <= kLineWidth || l.cols < 3) {
    for (int c = 0; c < l.cols; ++c) cols.push_back(c);
  } else {
    std::size_t used = pad.size() + 1 + (kDotsWidth + 1) + (width.back() + 1);
    for (int c = 0; c < l.cols - 1 && (c == 0 || used + width[static_cast<std::size_t>(c)] + 1 <= kLineWidth); ++c) {
      cols.push_back(c);
      used += width[static_cast<std::size_t>(c)] + 1;
    }
    cols.push_back(kDots);
    cols.push_back(l.cols - 1);
  }
  auto w_of = [&](int c) { return c == kDots ? kDotsWidth : width[static_cast<std::size_t>(c)]; };
  if (!l.col_label.empty()) s += "  columns: " + l.col_label + "\n";
  if (!l.row_label.empty()) s += "  rows: " + l.row_label + "\n";
  std::string border = pad + "+";
  for (int c : cols) border += std::string(w_of(c), '-') + "+";
  if (!l.col_heads.empty()) {
    std::string h = pad + " ";
    for (int c : cols) h += fmt::format(" {:<{}}", c == kDots ? "..." : l.col_heads[static_cast<std::size_t>(c)], w_of(c));
    while (!h.empty() && h.back() == ' ') h.pop_back();
    s += h + "\n";
  }
  s += border + "\n";
  for (int r = 0; r < l.rows; ++r) {
    std::size_t height = 1;
    for (int c = 0; c < l.cols; ++c) height = std::max(height, l.cells[static_cast<std::size_t>(r * l.cols + c)].lines.size());
    for (std::size_t k = 0; k < height; ++k) {
      std::string head = k == 0 && r < static_cast<int>(l.row_heads.size()) ? l.row_heads[static_cast<std::size_t>(r)] : "";
      s += lw ? fmt::format("{:>{}} |", head, lw) : "|";
      for (int c : cols) {
        if (c == kDots) {
          s += fmt::format(" {:<{}}|", k == 0 ? "..." : "", kDotsWidth - 1);
          continue;
        }
        const auto& cell = l.cells[static_cast<std::size_t>(r * l.cols + c)];
        std::string text = k < cell.lines.size() ? cell.lines[k] : "";
        std::string body = fmt::format(" {:<{}}", text, width[static_cast<std::size_t>(c)] - 1);
        if (color) body = fmt::format("\x1b[48;5;{}m\x1b[38;5;16m{}\x1b[0m", palette[cell.color % 16], body);
        s += body + "|";
      }
      s += "\n";
    }
    s += border + "\n";
  }
  if (cols.size() < static_cast<std::size_t>(l.cols))
    s += fmt::format("  column blocks {} to {} (of 0 to {}) are left out to keep lines within {} characters (spmdcheck report draws them all)\n", cols[cols.size() - 3] + 1,
                     l.cols - 2, l.cols - 1, kLineWidth);
  for (const auto& n : l.notes) s += "  " + n + "\n";
  return s;
}

std::string layout_key(const Layout& l) {
  std::string k = l.placements + "\n" + l.why_not + "\n" + l.row_label + "\n" + l.col_label + "\n";
  for (const auto& h : l.row_heads) k += h + "\t";
  for (const auto& h : l.col_heads) k += h + "\t";
  for (const auto& c : l.cells) {
    for (const auto& line : c.lines) k += line + "\t";
    k += "\n";
  }
  for (const auto& n : l.notes) k += n + "\n";
  return k;
}

std::string layout_svg(const Layout& l) {
  if (!l.drawable) return fmt::format("<p class=\"nolayout\">{}: {}</p>", html_escape(l.name), html_escape(l.why_not));
  const int ch = 7, lh = 15, padx = 8, pady = 6;
  std::size_t maxlen = 6;
  std::size_t maxlines = 1;
  for (const auto& c : l.cells) {
    maxlines = std::max(maxlines, c.lines.size());
    for (const auto& line : c.lines) maxlen = std::max(maxlen, line.size());
  }
  for (const auto& h : l.col_heads) maxlen = std::max(maxlen, h.size());
  std::size_t rowhead = 0;
  for (const auto& h : l.row_heads) rowhead = std::max(rowhead, h.size());
  int cw = static_cast<int>(maxlen) * ch + 2 * padx, chh = static_cast<int>(maxlines) * lh + 2 * pady;
  int left = static_cast<int>(rowhead) * ch + 12, top = l.col_heads.empty() ? 4 : 20;
  int w = left + l.cols * cw + 4, h = top + l.rows * chh + 4;
  std::string s = fmt::format("<svg class=\"layout\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" "
                              "aria-label=\"layout of {}\">",
                              w, h, w, h, html_escape(l.name));
  for (int c = 0; c < static_cast<int>(l.col_heads.size()); ++c)
    s += fmt::format("<text x=\"{}\" y=\"14\" class=\"head\">{}</text>", left + c * cw + padx, html_escape(l.col_heads[static_cast<std::size_t>(c)]));
  for (int r = 0; r < l.rows; ++r) {
    if (r < static_cast<int>(l.row_heads.size()))
      s += fmt::format("<text x=\"2\" y=\"{}\" class=\"head\">{}</text>", top + r * chh + pady + 11, html_escape(l.row_heads[static_cast<std::size_t>(r)]));
    for (int c = 0; c < l.cols; ++c) {
      const auto& cell = l.cells[static_cast<std::size_t>(r * l.cols + c)];
      int x = left + c * cw, y = top + r * chh;
      int hue = (205 + cell.color * 67) % 360;
      s += fmt::format("<g class=\"block\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"hsl({},70%,85%)\" stroke=\"#333\"/>", x, y, cw, chh, hue);
      for (std::size_t k = 0; k < cell.lines.size(); ++k)
        s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>", x + padx, y + pady + 11 + static_cast<int>(k) * lh, html_escape(cell.lines[k]));
      s += "</g>";
    }
  }
  return s + "</svg>";
}

}  // namespace spmd
