// ir/memory.h - transparent huge pages for the few large arrays of a big program.
//
// On this project's machines a fresh 4 KiB page costs a page fault (several microseconds under a
// hypervisor), and a million-op program touches hundreds of MiB of them. Linux backs a region marked
// MADV_HUGEPAGE with 2 MiB pages on first touch (when THP is "madvise" or "always"), 512 times fewer
// faults. Call it on a vector's storage right after reserve(), before anything is written there.
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

namespace spmd {

// Marks the whole 2 MiB pages inside [p, p + bytes) for huge pages; smaller regions are left alone. Only
// advice: a kernel without THP ignores it, and the contents are unchanged.
inline void advise_huge_pages(const void* p, std::size_t bytes) {
  constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
  if (bytes < 2 * kHuge) return;
  std::uintptr_t a = (reinterpret_cast<std::uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  std::uintptr_t b = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE);
}

// reserve(n) on huge pages: the new storage is advised before the elements already there move into it.
template <class T>
void reserve_huge(std::vector<T>& v, std::size_t n) {
  if (n <= v.capacity()) return;
  std::vector<T> w;
  w.reserve(n);
  advise_huge_pages(w.data(), w.capacity() * sizeof(T));
  w.insert(w.end(), std::make_move_iterator(v.begin()), std::make_move_iterator(v.end()));
  v.swap(w);
}

}  // namespace spmd
