// cli/main.cpp - the spmdcheck executable.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "cli/driver.h"

namespace {

// A million-op program touches about 700 MiB of fresh memory: in 4 KiB pages that is 190,000 page faults and
// as many TLB misses, more than half of the run. glibc backs its heap with transparent huge pages only when the
// tunable glibc.malloc.hugetlb=1 is set at startup (the kernel's THP mode here is "madvise"), so for a large
// input file the process sets it and runs itself again, once. Measured on the 10^6-op JSON file: 195,000 ->
// 10,000 page faults, user time 2.9 s -> 1.3 s (docs/performance.md). Small inputs run as they are, but for
// `equiv`, whose values take up to --max-memory whatever the file's size: its tensors are allocated and freed op by
// op, each a fresh mapping (the DeepSeek-V2-Lite step: 0.90 of the wall time with huge pages, side by side).
void ask_for_huge_pages(int argc, char** argv) {
  constexpr off_t kLarge = 8 << 20;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.hugetlb")) return;  // already set, by this or by the user
  bool large = false;
  for (int i = 1; i < argc && !large; ++i) {
    struct stat st {};
    large = std::strcmp(argv[i], "equiv") == 0 ||
            (argv[i][0] != '-' && stat(argv[i], &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= kLarge);
  }
  if (!large) return;
  std::string value = tunables && *tunables ? std::string(tunables) + ":glibc.malloc.hugetlb=1" : "glibc.malloc.hugetlb=1";
  if (setenv("GLIBC_TUNABLES", value.c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only on failure: then run without
}

}  // namespace

int main(int argc, char** argv) {
  ask_for_huge_pages(argc, argv);
  return spmd::cli_main(argc, argv);
}
