// cli/layout.h - the layout of one tensor over the mesh: which rank holds which block.
//
// A picture like jax.debug.visualize_array_sharding: the tensor's blocks as a grid (rows: its first
// sharded dim, columns: its second), each cell naming the ranks that hold it. An R or I axis is one
// block held by every coordinate ("tp *"); a P axis stacks the summands each rank holds ("+ tp0",
// "+ tp1", ...); a V axis marks a block whose value differs per rank. Drawn as text (optionally with
// ANSI colours) for `spmdcheck explain --tensor` and as SVG for `spmdcheck report`.
#pragma once
#include <string>
#include <vector>

#include "ir/program.h"
#include "spatial/spatial.h"

namespace spmd {

struct LayoutCell {
  std::vector<std::string> lines;  // who holds this block, one holder (or summand) per line
  int color = 0;                   // a block number: equal blocks, equal colours
};

struct Layout {
  std::string name;                    // the tensor
  std::string summary;                 // "[8, 1024, 4096] f32  tp: S(2), dp: R": shape_dtype and placements
  std::string shape_dtype;             // "[8, 1024, 4096] f32"
  std::string placements;              // "tp: S(2), dp: R" (and the zigzag order, if any)
  bool drawable = false;               // false: `why_not` says why there is no picture
  std::string why_not;
  std::string row_label, col_label;    // "dim 0 (B = 8) split over dp"; empty: not split
  std::vector<std::string> row_heads, col_heads;  // per row / column: the index range of the block
  int rows = 1, cols = 1;
  std::vector<LayoutCell> cells;       // row-major
  std::vector<std::string> notes;      // legend lines (P, V, more dims, cut rows)
};

// The layout of a value of type `t` (exprs: the pool its shape refers to). Draws at most 16 blocks a side.
Layout tensor_layout(const Program& p, const ExprPool& exprs, const ValueType& t, const std::string& name);

// Local shape on a rank ("[8, 1024, 1024]"; "S/4" for a symbolic size; "ceil(10/4)" when uneven).
std::string local_shape(const Program& p, const ExprPool& exprs, const ValueType& t);

// "dim 1 in zigzag order over cp" when LoadBalance put dims of the value in zigzag order, else "".
std::string zigzag_text(const Program& p, const ValueType& t);

// Text made safe inside HTML or SVG (& < > ").
std::string html_escape(const std::string& s);

std::string layout_text(const Layout& l, bool color);
// What the picture shows, apart from the tensor's name and its undrawn dims: equal keys, equal pictures.
std::string layout_key(const Layout& l);
std::string layout_svg(const Layout& l);

}  // namespace spmd
