// interp/tensor.cpp - dense tensors of Num: slicing, concatenation, broadcasting, reductions, matmul.
#include "interp/tensor.h"

#include <algorithm>
#include <bit>

namespace spmd::interp {

namespace {

constexpr std::size_t kPooled = std::size_t{1} << 20;  // buffers from 1 MiB are cached
constexpr std::size_t kCacheCap = std::size_t{1} << 30;  // at most 1 GiB kept per thread

struct BufferCache {
  std::vector<std::pair<std::size_t, void*>> free;  // (size class, block)
  std::size_t bytes = 0;
  ~BufferCache() {
    for (auto& [c, p] : free) ::operator delete(p);
  }
};
thread_local BufferCache cache;

std::size_t size_class(std::size_t bytes) { return std::bit_ceil(bytes); }

}  // namespace

void* buffer_alloc(std::size_t bytes) {
  if (bytes < kPooled) return ::operator new(bytes);
  std::size_t c = size_class(bytes);
  for (std::size_t i = cache.free.size(); i-- > 0;)
    if (cache.free[i].first == c) {
      void* p = cache.free[i].second;
      cache.free.erase(cache.free.begin() + static_cast<std::ptrdiff_t>(i));
      cache.bytes -= c;
      return p;
    }
  return ::operator new(c);
}

void buffer_free(void* p, std::size_t bytes) {
  if (bytes < kPooled) return ::operator delete(p);
  std::size_t c = size_class(bytes);
  if (cache.bytes + c > kCacheCap) return ::operator delete(p);
  cache.free.emplace_back(c, p);
  cache.bytes += c;
}

Tensor::Tensor(Shape s, const Num& fill) : shape(std::move(s)), data(static_cast<std::size_t>(numel_of(shape)), fill) {}

std::int64_t numel_of(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_text(const Shape& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

Shape strides_of(const Shape& s) {
  Shape st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[static_cast<std::size_t>(i)] = st[static_cast<std::size_t>(i) + 1] * s[static_cast<std::size_t>(i) + 1];
  return st;
}

namespace {

// outer = product of dims before d, inner = product after d.
void split_at(const Shape& s, int d, std::int64_t& outer, std::int64_t& inner) {
  outer = inner = 1;
  for (int i = 0; i < d; ++i) outer *= s[static_cast<std::size_t>(i)];
  for (int i = d + 1; i < static_cast<int>(s.size()); ++i) inner *= s[static_cast<std::size_t>(i)];
}

}  // namespace

Tensor slice(const Tensor& t, int d, std::int64_t lo, std::int64_t hi) {
  if (d < 0 || d >= t.rank() || lo < 0 || hi < lo || hi > t.shape[static_cast<std::size_t>(d)])
    throw InterpError("cannot take [" + std::to_string(lo) + ", " + std::to_string(hi) + ") of dim " + std::to_string(d) + " of a tensor of shape " +
                      shape_text(t.shape));
  Shape s = t.shape;
  std::int64_t n = s[static_cast<std::size_t>(d)];
  s[static_cast<std::size_t>(d)] = hi - lo;
  Tensor out(s);
  std::int64_t outer, inner;
  split_at(t.shape, d, outer, inner);
  std::size_t w = 0;
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = lo; i < hi; ++i)
      for (std::int64_t k = 0; k < inner; ++k) out.data[w++] = t.data[static_cast<std::size_t>((o * n + i) * inner + k)];
  return out;
}

Tensor concat(const std::vector<Tensor>& parts, int d) {
  if (parts.empty()) throw InterpError("nothing to concatenate");
  Shape s = parts[0].shape;
  if (d < 0 || d >= static_cast<int>(s.size())) throw InterpError("cannot concatenate along dim " + std::to_string(d) + " of shape " + shape_text(s));
  std::int64_t total = 0;
  for (const auto& p : parts) {
    Shape a = p.shape, b = s;
    if (a.size() != b.size()) throw InterpError("cannot concatenate shapes " + shape_text(p.shape) + " and " + shape_text(s));
    a[static_cast<std::size_t>(d)] = b[static_cast<std::size_t>(d)] = 0;
    if (a != b) throw InterpError("cannot concatenate shapes " + shape_text(p.shape) + " and " + shape_text(s) + " along dim " + std::to_string(d));
    total += p.shape[static_cast<std::size_t>(d)];
  }
  s[static_cast<std::size_t>(d)] = total;
  Tensor out(s);
  std::int64_t outer, inner;
  split_at(s, d, outer, inner);
  std::size_t w = 0;
  for (std::int64_t o = 0; o < outer; ++o)
    for (const auto& p : parts) {
      std::int64_t n = p.shape[static_cast<std::size_t>(d)] * inner;
      std::copy_n(p.data.begin() + static_cast<std::ptrdiff_t>(o * n), n, out.data.begin() + static_cast<std::ptrdiff_t>(w));
      w += static_cast<std::size_t>(n);
    }
  return out;
}

Tensor transpose(const Tensor& t, int d0, int d1) {
  if (d0 < 0 || d1 < 0 || d0 >= t.rank() || d1 >= t.rank()) throw InterpError("transpose dims out of range for " + shape_text(t.shape));
  Shape s = t.shape;
  std::swap(s[static_cast<std::size_t>(d0)], s[static_cast<std::size_t>(d1)]);
  Tensor out(s);
  Shape in_st = strides_of(t.shape);
  std::swap(in_st[static_cast<std::size_t>(d0)], in_st[static_cast<std::size_t>(d1)]);
  Shape idx(s.size(), 0);
  for (std::size_t w = 0; w < out.data.size(); ++w) {
    std::int64_t off = 0;
    for (std::size_t k = 0; k < s.size(); ++k) off += idx[k] * in_st[k];
    out.data[w] = t.data[static_cast<std::size_t>(off)];
    for (int k = static_cast<int>(s.size()) - 1; k >= 0; --k) {
      if (++idx[static_cast<std::size_t>(k)] < s[static_cast<std::size_t>(k)]) break;
      idx[static_cast<std::size_t>(k)] = 0;
    }
  }
  return out;
}

Tensor reshape(const Tensor& t, const Shape& s) {
  if (numel_of(s) != t.numel()) throw InterpError("cannot reshape " + shape_text(t.shape) + " (" + std::to_string(t.numel()) + " elements) to " + shape_text(s));
  Tensor out = t;
  out.shape = s;
  return out;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  std::size_t r = std::max(a.size(), b.size());
  Shape s(r);
  for (std::size_t k = 0; k < r; ++k) {
    std::int64_t x = k + a.size() >= r ? a[k + a.size() - r] : 1;
    std::int64_t y = k + b.size() >= r ? b[k + b.size() - r] : 1;
    if (x != y && x != 1 && y != 1) throw InterpError("shapes " + shape_text(a) + " and " + shape_text(b) + " do not broadcast");
    s[k] = x == 1 ? y : x;
  }
  return s;
}

namespace {

// Strides of `s` viewed as a right-aligned operand of shape `out` (0 on broadcast dims).
Shape bstrides(const Shape& s, const Shape& out) {
  Shape st = strides_of(s), r(out.size(), 0);
  for (std::size_t k = 0; k < s.size(); ++k) {
    std::size_t o = k + out.size() - s.size();
    r[o] = s[k] == 1 ? 0 : st[k];
  }
  return r;
}

}  // namespace

Tensor binary(const Tensor& x, const Tensor& y, const std::function<Num(const Num&, const Num&)>& f) {
  Shape s = broadcast_shapes(x.shape, y.shape);
  Tensor out(s);
  Shape sx = bstrides(x.shape, s), sy = bstrides(y.shape, s);
  Shape idx(s.size(), 0);
  std::int64_t ox = 0, oy = 0;
  for (std::size_t w = 0; w < out.data.size(); ++w) {
    out.data[w] = f(x.data[static_cast<std::size_t>(ox)], y.data[static_cast<std::size_t>(oy)]);
    for (int k = static_cast<int>(s.size()) - 1; k >= 0; --k) {
      auto uk = static_cast<std::size_t>(k);
      ox += sx[uk], oy += sy[uk];
      if (++idx[uk] < s[uk]) break;
      ox -= sx[uk] * s[uk], oy -= sy[uk] * s[uk];
      idx[uk] = 0;
    }
  }
  return out;
}

Tensor unary(const Tensor& x, const std::function<Num(const Num&)>& f) {
  Tensor out = x;
  for (auto& v : out.data) v = f(v);
  return out;
}

void for_each_group(Tensor& t, const std::vector<int>& dims, const std::function<void(std::vector<Num>&)>& fn) {
  Shape st = strides_of(t.shape);
  std::vector<int> rest;
  for (int d = 0; d < t.rank(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) rest.push_back(d);
  // Offsets of the elements of one group, relative to its first element.
  std::vector<std::int64_t> offs{0};
  for (int d : dims) {
    std::vector<std::int64_t> next;
    for (auto o : offs)
      for (std::int64_t i = 0; i < t.shape[static_cast<std::size_t>(d)]; ++i) next.push_back(o + i * st[static_cast<std::size_t>(d)]);
    offs = std::move(next);
  }
  std::int64_t groups = 1;
  for (int d : rest) groups *= t.shape[static_cast<std::size_t>(d)];
  std::vector<Num> buf(offs.size());
  Shape idx(rest.size(), 0);
  for (std::int64_t g = 0; g < groups; ++g) {
    std::int64_t base = 0;
    for (std::size_t k = 0; k < rest.size(); ++k) base += idx[k] * st[static_cast<std::size_t>(rest[k])];
    for (std::size_t j = 0; j < offs.size(); ++j) buf[j] = t.data[static_cast<std::size_t>(base + offs[j])];
    fn(buf);
    for (std::size_t j = 0; j < offs.size(); ++j) t.data[static_cast<std::size_t>(base + offs[j])] = buf[j];
    for (int k = static_cast<int>(rest.size()) - 1; k >= 0; --k) {
      if (++idx[static_cast<std::size_t>(k)] < t.shape[static_cast<std::size_t>(rest[static_cast<std::size_t>(k)])]) break;
      idx[static_cast<std::size_t>(k)] = 0;
    }
  }
}

Tensor reduce(const Tensor& t, const std::vector<int>& dims, bool keepdim, const Num& init, const std::function<Num(const Num&, const Num&)>& f) {
  Shape keep;
  for (int d = 0; d < t.rank(); ++d) {
    bool red = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!red) keep.push_back(t.shape[static_cast<std::size_t>(d)]);
    else if (keepdim) keep.push_back(1);
  }
  Tensor out(keep, init);
  Shape st_out(t.shape.size(), 0);
  {
    Shape os = strides_of(keep);
    std::size_t k = 0;
    for (int d = 0; d < t.rank(); ++d) {
      bool red = std::find(dims.begin(), dims.end(), d) != dims.end();
      if (red && !keepdim) continue;
      st_out[static_cast<std::size_t>(d)] = red ? 0 : os[k];
      ++k;
    }
  }
  Shape idx(t.shape.size(), 0);
  std::int64_t o = 0;
  for (std::size_t r = 0; r < t.data.size(); ++r) {
    out.data[static_cast<std::size_t>(o)] = f(out.data[static_cast<std::size_t>(o)], t.data[r]);
    for (int k = t.rank() - 1; k >= 0; --k) {
      auto uk = static_cast<std::size_t>(k);
      o += st_out[uk];
      if (++idx[uk] < t.shape[uk]) break;
      o -= st_out[uk] * t.shape[uk];
      idx[uk] = 0;
    }
  }
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (a.rank() < 2 || b.rank() < 2) throw InterpError("matmul needs rank >= 2, got " + shape_text(a.shape) + " and " + shape_text(b.shape));
  std::int64_t m = a.shape[a.shape.size() - 2], k = a.shape.back(), k2 = b.shape[b.shape.size() - 2], n = b.shape.back();
  if (k != k2) throw InterpError("matmul contracts " + std::to_string(k) + " with " + std::to_string(k2) + " (shapes " + shape_text(a.shape) + " and " + shape_text(b.shape) + ")");
  Shape ab(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  Shape batch = broadcast_shapes(ab, bb);
  Shape os = batch;
  os.push_back(m);
  os.push_back(n);
  Tensor out(os);
  Shape sa = bstrides(ab, batch), sb = bstrides(bb, batch);
  std::int64_t nb = numel_of(batch);
  Shape idx(batch.size(), 0);
  for (std::int64_t bi = 0; bi < nb; ++bi) {
    std::int64_t oa = 0, ob = 0;
    for (std::size_t q = 0; q < batch.size(); ++q) oa += idx[q] * sa[q], ob += idx[q] * sb[q];
    const Num* pa = a.data.data() + oa * m * k;
    const Num* pb = b.data.data() + ob * k * n;
    Num* po = out.data.data() + bi * m * n;
    if (!num::on()) {  // the oracle's path: the real values only
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t p = 0; p < k; ++p) {
          double x = pa[i * k + p].d;
          for (std::int64_t j = 0; j < n; ++j) po[i * n + j].d += x * pb[p * n + j].d;
        }
    } else {
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t p = 0; p < k; ++p) {
          const Num& x = pa[i * k + p];
          for (std::int64_t j = 0; j < n; ++j) po[i * n + j] += x * pb[p * n + j];
        }
    }
    for (int q = static_cast<int>(batch.size()) - 1; q >= 0; --q) {
      if (++idx[static_cast<std::size_t>(q)] < batch[static_cast<std::size_t>(q)]) break;
      idx[static_cast<std::size_t>(q)] = 0;
    }
  }
  return out;
}

void chunk_range(std::int64_t n, std::int64_t parts, std::int64_t idx, std::int64_t& lo, std::int64_t& hi) {
  std::int64_t c = (n + parts - 1) / parts;
  lo = std::min(n, idx * c);
  hi = std::min(n, lo + c);
}

}  // namespace spmd::interp
