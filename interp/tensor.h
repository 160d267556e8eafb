// interp/tensor.h - a dense tensor of Num (interp/num.h: a float64 and its field lanes) (row-major) and the data-movement helpers the interpreter needs.
//
// Shapes are small (the oracle runs on small instantiations), so the helpers favour clarity over speed.
// Every helper that can be handed mismatched shapes throws InterpError; the interpreter turns that into
// a located "the run fails" result, never a crash.
#pragma once
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "interp/num.h"
#include "ir/diagnostic.h"

namespace spmd::interp {

using Shape = std::vector<std::int64_t>;

// A failure of the numeric run (mismatched local shapes, an id out of range...). Never a program bug in
// the interpreter itself: those are logic_errors.
struct InterpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An interpreter limit reached (a tensor too large, the work or the memory budget used up): the run stops and the
// caller reports the program as not checked, with the reason (never a verdict from a partial run).
struct BudgetError : std::runtime_error {
  using std::runtime_error::runtime_error;
  BudgetError(const std::string& what, bool over_bytes) : std::runtime_error(what), bytes(over_bytes) {}
  Loc loc;  // the op (or the declaration) that hit the limit, when known (the Runner fills it in)
  bool bytes = false;  // over the bytes of values held at once (not the work or a tensor's elements)
};

// ---- the thread's allocation limits (docs/performance.md, "Bounded memory") ------------------------------------
// Every element buffer is charged against them before its memory is touched: at most `max_elements` per tensor and
// `max_bytes` of buffers live on the thread at once (shared copies count once). Over a limit: BudgetError. A Runner
// sets them from its OracleOptions; the defaults are OracleOptions' own.
struct AllocLimits {
  std::int64_t max_elements = std::int64_t{1} << 22;
  std::int64_t max_bytes = std::int64_t{800} << 20;
};
void set_alloc_limits(const AllocLimits& limits);
const AllocLimits& alloc_limits();
std::int64_t live_bytes();  // bytes of element buffers live on this thread (or its byte count's threads)
std::int64_t peak_bytes();  // the most live at once since the thread started (or since reset_peak_bytes)
void reset_peak_bytes();
// The bytes a thread's buffers hold, charged where a buffer is made and credited where it is freed. A thread counts
// its own unless it shares another's (share_byte_count): two threads of one trial, which hand values to each other,
// then count against one budget.
struct ByteCount {
  std::atomic<std::int64_t> live{0}, peak{0};
};
ByteCount* byte_count();
// This thread counts against `c` (nullptr: its own count again), with the allocation limits `limits`.
void share_byte_count(ByteCount* c, const AllocLimits& limits);
// Throws BudgetError when a tensor of shape `s` would exceed the element limit (the message names the shape).
void check_elements(const std::vector<std::int64_t>& s);
[[noreturn]] void throw_too_large(const std::vector<std::int64_t>& s, std::int64_t limit);
// Throws BudgetError: a run past `limit` element operations (OracleOptions::max_work).
[[noreturn]] void throw_over_work(std::int64_t limit);

// Large element buffers (>= 1 MiB) are recycled through a thread-local cache instead of going back to the kernel:
// the oracle's big tensors are above glibc's mmap threshold, and a fresh mapping per op made page faults most of
// the run's time.
void* buffer_alloc(std::size_t bytes);
void buffer_free(void* p, std::size_t bytes);
// Keeps freed heap memory in the process (glibc mallopt, once per process): every Runner calls it.
void tune_heap();

// The elements of a Tensor: a reference-counted buffer of Num shared by copies and copied on the first write
// through a shared handle (copy on write). Reads never copy; the non-const operator[], data(), begin() and end()
// make this handle's own copy first when the buffer is shared, so hold a non-const pointer or reference into it
// only while no copy of the tensor is made. A new buffer is charged against the allocation limits before its
// memory is touched (BudgetError).
class NumBuffer {
 public:
  using value_type = Num;
  using iterator = Num*;
  using const_iterator = const Num*;
  struct Uninit {};

  NumBuffer() = default;
  NumBuffer(std::size_t n, const Num& fill);
  NumBuffer(std::size_t n, Uninit);  // every element must be written before it is read
  NumBuffer(const NumBuffer& o) noexcept : h_(o.h_) {
    if (h_) h_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  NumBuffer(NumBuffer&& o) noexcept : h_(o.h_) { o.h_ = nullptr; }
  NumBuffer& operator=(const NumBuffer& o) noexcept {
    NumBuffer t(o);
    std::swap(h_, t.h_);
    return *this;
  }
  NumBuffer& operator=(NumBuffer&& o) noexcept {
    NumBuffer t(std::move(o));
    std::swap(h_, t.h_);
    return *this;
  }
  ~NumBuffer() {
    if (h_ && h_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) destroy();
  }

  std::size_t size() const { return h_ ? h_->n : 0; }
  bool empty() const { return size() == 0; }
  const Num& operator[](std::size_t i) const { return elems()[i]; }
  Num& operator[](std::size_t i) {
    own();
    return elems()[i];
  }
  const Num& at(std::size_t i) const {
    if (i >= size()) throw std::out_of_range("NumBuffer::at");
    return elems()[i];
  }
  const Num* data() const { return h_ ? elems() : nullptr; }
  Num* data() {
    own();
    return h_ ? elems() : nullptr;
  }
  const Num* begin() const { return data(); }
  const Num* end() const { return data() + size(); }
  Num* begin() { return data(); }
  Num* end() { return data() + size(); }
  // Whether another handle shares this buffer (tests; a write through this handle would copy first).
  bool shared() const { return h_ && h_->refs.load(std::memory_order_acquire) > 1; }

 private:
  struct Header {  // (the count is atomic: two threads of a trial may hold handles to one buffer, reading it)
    std::atomic<std::size_t> refs;
    std::size_t n;
  };
  Header* h_ = nullptr;
  Num* elems() const { return reinterpret_cast<Num*>(h_ + 1); }
  void own() {
    if (h_ && h_->refs.load(std::memory_order_acquire) > 1) unshare();
  }
  void allocate(std::size_t n);
  void unshare();
  void destroy();
};

struct Tensor {
  Shape shape;
  NumBuffer data;

  Tensor() = default;
  explicit Tensor(Shape s, const Num& fill = Num());
  // A tensor whose every element the caller writes before reading any (no fill pass).
  static Tensor uninit(Shape s);
  std::int64_t numel() const { return static_cast<std::int64_t>(data.size()); }
  int rank() const { return static_cast<int>(shape.size()); }
};

// The element count of `s` (saturating at INT64_MAX: a shape can describe more elements than a word counts).
std::int64_t numel_of(const Shape& s);
std::string shape_text(const Shape& s);
// Row-major strides of `s`.
Shape strides_of(const Shape& s);

// Elements [lo, hi) of dim `d`.
Tensor slice(const Tensor& t, int d, std::int64_t lo, std::int64_t hi);
// Concatenation along dim `d`; every other dim must agree.
Tensor concat(const std::vector<Tensor>& parts, int d);
// Swaps dims d0 and d1.
Tensor transpose(const Tensor& t, int d0, int d1);
// Same data, new shape (element counts must agree).
Tensor reshape(const Tensor& t, const Shape& s);
// NumPy broadcasting of two shapes (right-aligned); throws when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Strides of `s` viewed as a right-aligned operand of shape `out` (0 on broadcast dims).
Shape broadcast_strides(const Shape& s, const Shape& out);

// The element loops below take the scalar function as a template parameter, so it is inlined (a std::function per
// element was a large part of an oracle run).

// z = f(x, y) elementwise with broadcasting.
template <class F>
Tensor binary(const Tensor& x, const Tensor& y, F&& f) {
  if (x.shape == y.shape) {
    Tensor out = Tensor::uninit(x.shape);
    Num* o = out.data.data();
    for (std::size_t w = 0; w < out.data.size(); ++w) o[w] = f(x.data[w], y.data[w]);
    return out;
  }
  Shape s = broadcast_shapes(x.shape, y.shape);
  Tensor out = Tensor::uninit(s);
  Shape sx = broadcast_strides(x.shape, s), sy = broadcast_strides(y.shape, s);
  Shape idx(s.size(), 0);
  std::int64_t ox = 0, oy = 0;
  Num* o = out.data.data();
  for (std::size_t w = 0; w < out.data.size(); ++w) {
    o[w] = f(x.data[static_cast<std::size_t>(ox)], y.data[static_cast<std::size_t>(oy)]);
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

// z = f(x) broadcast to the shape broadcast_shapes(x.shape, s) (what binary(x, a tensor of shape s, ...) gives when f
// ignores its second operand), without a tensor of shape s.
template <class F>
Tensor broadcast_map(const Tensor& x, const Shape& s, F&& f) {
  Shape os = broadcast_shapes(x.shape, s);
  Tensor out = Tensor::uninit(os);
  Shape sx = broadcast_strides(x.shape, os);
  Shape idx(os.size(), 0);
  std::int64_t ox = 0;
  Num* o = out.data.data();
  for (std::size_t w = 0; w < out.data.size(); ++w) {
    o[w] = f(x.data[static_cast<std::size_t>(ox)]);
    for (int k = static_cast<int>(os.size()) - 1; k >= 0; --k) {
      auto uk = static_cast<std::size_t>(k);
      ox += sx[uk];
      if (++idx[uk] < os[uk]) break;
      ox -= sx[uk] * os[uk];
      idx[uk] = 0;
    }
  }
  return out;
}

// y = f(x) elementwise.
template <class F>
Tensor unary(const Tensor& x, F&& f) {
  Tensor out = Tensor::uninit(x.shape);
  Num* o = out.data.data();
  for (std::size_t w = 0; w < out.data.size(); ++w) o[w] = f(x.data[w]);
  return out;
}

// The output shape of a reduction of `t` over `dims` and, per dim of t, the output stride (0 on reduced dims).
void reduce_layout(const Tensor& t, const std::vector<int>& dims, bool keepdim, Shape& out, Shape& st_out);

// Reduces over `dims` (sorted, unique) with `init` and `f`; keepdim leaves size-1 dims.
template <class F>
Tensor reduce(const Tensor& t, const std::vector<int>& dims, bool keepdim, const Num& init, F&& f) {
  Shape keep, st_out;
  reduce_layout(t, dims, keepdim, keep, st_out);
  Tensor out(keep, init);
  if (t.data.size() == 0 || t.rank() == 0) {
    if (t.data.size()) out.data[0] = f(out.data[0], t.data[0]);
    return out;
  }
  Num* od = out.data.data();
  const Num* in = t.data.data();
  // In input order (each output folds its elements in that order), a run of the last dim at a time.
  const auto last = static_cast<std::size_t>(t.rank() - 1);
  const std::int64_t row = t.shape[last], step = st_out[last];
  Shape idx(t.shape.size(), 0);
  std::int64_t o = 0;
  for (std::size_t r = 0; r < t.data.size(); r += static_cast<std::size_t>(row)) {
    for (std::int64_t j = 0; j < row; ++j) od[o + j * step] = f(od[o + j * step], in[r + static_cast<std::size_t>(j)]);
    for (int k = static_cast<int>(last) - 1; k >= 0; --k) {
      auto uk = static_cast<std::size_t>(k);
      o += st_out[uk];
      if (++idx[uk] < t.shape[uk]) break;
      o -= st_out[uk] * t.shape[uk];
      idx[uk] = 0;
    }
  }
  return out;
}

// The groups of a tensor of shape `s` along `dims`: the flat offset of each group's first element (`bases`), and the
// offsets of a group's elements relative to it (`offs`, the dims listed flattened in order).
void group_layout(const Shape& s, const std::vector<int>& dims, std::vector<std::int64_t>& bases, std::vector<std::int64_t>& offs);

// Applies `fn` to every 1-D line along `dims` (the lines are the dims listed, flattened in order): fn gets a
// gathered copy (a std::vector<Num>&) and writes the result back in place.
template <class F>
void for_each_group(Tensor& t, const std::vector<int>& dims, F&& fn) {
  std::vector<std::int64_t> bases, offs;
  group_layout(t.shape, dims, bases, offs);
  std::vector<Num> buf(offs.size());
  Num* d = t.data.data();
  for (auto base : bases) {
    for (std::size_t j = 0; j < offs.size(); ++j) buf[j] = d[base + offs[j]];
    fn(buf);
    for (std::size_t j = 0; j < offs.size(); ++j) d[base + offs[j]] = buf[j];
  }
}
// Batched matrix product A[..., m, k] x B[..., k, n] with broadcast batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);


}  // namespace spmd::interp
