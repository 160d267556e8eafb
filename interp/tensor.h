// interp/tensor.h - a dense tensor of Num (interp/num.h: a float64 and its field lanes) (row-major) and the data-movement helpers the interpreter needs.
//
// Shapes are small (the oracle runs on small instantiations), so the helpers favour clarity over speed.
// Every helper that can be handed mismatched shapes throws InterpError; the interpreter turns that into
// a located "the run fails" result, never a crash.
#pragma once
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "interp/num.h"

namespace spmd::interp {

using Shape = std::vector<std::int64_t>;

// A failure of the numeric run (mismatched local shapes, an id out of range...). Never a program bug in
// the interpreter itself: those are logic_errors.
struct InterpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Large element buffers (>= 1 MiB) are recycled through a thread-local cache instead of going back to the kernel:
// a Num is 64 bytes, so the oracle's big tensors are above glibc's mmap threshold, and a fresh mapping per op
// made page faults most of the run's time.
void* buffer_alloc(std::size_t bytes);
void buffer_free(void* p, std::size_t bytes);
template <class T>
struct BufferAlloc {
  using value_type = T;
  BufferAlloc() = default;
  template <class U>
  BufferAlloc(const BufferAlloc<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(buffer_alloc(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) { buffer_free(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const BufferAlloc<U>&) const { return true; }
};

struct Tensor {
  Shape shape;
  std::vector<Num, BufferAlloc<Num>> data;

  Tensor() = default;
  explicit Tensor(Shape s, const Num& fill = Num());
  std::int64_t numel() const { return static_cast<std::int64_t>(data.size()); }
  int rank() const { return static_cast<int>(shape.size()); }
};

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
// z = f(x, y) elementwise with broadcasting.
Tensor binary(const Tensor& x, const Tensor& y, const std::function<Num(const Num&, const Num&)>& f);
// y = f(x) elementwise.
Tensor unary(const Tensor& x, const std::function<Num(const Num&)>& f);
// Reduces over `dims` (sorted, unique) with `init` and `f`; keepdim leaves size-1 dims.
Tensor reduce(const Tensor& t, const std::vector<int>& dims, bool keepdim, const Num& init, const std::function<Num(const Num&, const Num&)>& f);
// Applies `fn` to every 1-D line along `dims` (the lines are the dims listed, flattened in order): fn gets a
// gathered copy and writes the result back in place.
void for_each_group(Tensor& t, const std::vector<int>& dims, const std::function<void(std::vector<Num>&)>& fn);
// Batched matrix product A[..., m, k] x B[..., k, n] with broadcast batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);

// The range [lo, hi) of a dim of size n held by part `idx` of `parts` (torch.chunk: ceil(n/parts) each until
// the dim runs out).
void chunk_range(std::int64_t n, std::int64_t parts, std::int64_t idx, std::int64_t& lo, std::int64_t& hi);

}  // namespace spmd::interp
