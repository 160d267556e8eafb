// tests/difftest_main.cpp - the long differential run: spmd_difftest [--count N] [--seed S] [--seeds K].
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/difftest.h"

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  int count = 10000, seeds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--count") count = std::atoi(argv[i + 1]);
    else if (a == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--seeds") seeds = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: spmd_difftest [--count N] [--seed S] [--seeds K]\n");
      return 2;
    }
  }
  auto st = spmd::test::run_difftest(seed, count, seeds, true);
  std::fputs(spmd::test::render_stats(st).c_str(), stdout);
  return st.soundness.empty() ? 0 : 1;
}
