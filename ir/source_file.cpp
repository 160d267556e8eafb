// ir/source_file.cpp - capped reads of input files.
#include "ir/source_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <istream>
#include <memory>

#include "ir/diagnostic.h"

namespace spmd {

namespace {
std::string mib(std::size_t n) { return n >= (std::size_t{1} << 20) ? std::to_string(n >> 20) + " MiB" : std::to_string(n) + " bytes"; }
}  // namespace

std::string read_input_file(const std::string& path, std::size_t cap) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) throw LoadError({}, "cannot open file '" + path + "' (no such file, or not readable)");
  if (S_ISDIR(st.st_mode)) throw LoadError({}, "'" + path + "' is a directory, not a file");
  if (!S_ISREG(st.st_mode))
    throw LoadError({}, "'" + path + "' is not a regular file (a device, pipe or socket); give a file on disk");
  if (static_cast<std::size_t>(st.st_size) > cap)
    throw LoadError({}, "'" + path + "' has " + mib(static_cast<std::size_t>(st.st_size)) + ", more than the limit of " + mib(cap));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw LoadError({}, "cannot open file '" + path + "'");
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = std::fread(text.data(), 1, text.size(), f.get());
  text.resize(got);
  // The file may have grown since stat: read on, still capped.
  char buf[65536];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f.get())) {
    if (text.size() + n > cap) throw LoadError({}, "'" + path + "' has more than the limit of " + mib(cap));
    text.append(buf, n);
  }
  return text;
}

std::string read_input_stream(std::istream& in, const std::string& name, int fd, std::size_t cap) {
  struct stat st {};
  if (fd >= 0 && ::fstat(fd, &st) == 0) {
    if (S_ISREG(st.st_mode) && static_cast<std::size_t>(st.st_size) > cap)
      throw LoadError({}, name + " has " + mib(static_cast<std::size_t>(st.st_size)) + ", more than the limit of " + mib(cap));
    if ((S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) && !::isatty(fd))
      throw LoadError({}, name + " is a device, not a program; give a file or a pipe");
    if (S_ISDIR(st.st_mode)) throw LoadError({}, name + " is a directory, not a file");
  }
  std::string text;
  text.reserve(std::min<std::size_t>(cap, std::size_t{1} << 20));
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    auto n = static_cast<std::size_t>(in.gcount());
    if (text.size() + n > cap) throw LoadError({}, name + " has more than the limit of " + mib(cap));
    text.append(buf, n);
  }
  return text;
}

}  // namespace spmd
