// A main() for the libFuzzer targets in the regular (gcc, uninstrumented) build, so that every
// target runs in CI for a bounded time: each file of the seed corpus once, then random
// mutations of them (bit flips, boundary values, inserted, deleted, repeated and spliced bytes)
// until the time is up. Not coverage-guided: the long, guided runs are tests/fuzz/run.sh's
// (clang, libFuzzer, sanitizers). A crash (a signal) writes the input that caused it to
// $FUZZ_CHECK_CRASH_DIR (default: the current directory) and names the file on stderr.
//
//   <target>_fuzz_check [--seconds=S] [--seed=N] CORPUS_DIR...
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

namespace {

constexpr size_t kMaxInputBytes = 1 << 20;
constexpr size_t kMaxMutatedBytes = 64 << 10;  // as run.sh's -max_len

// The input being run, for the crash handler (which may only make async-signal-safe calls).
const std::string* g_current = nullptr;
char g_crash_path[4096];

void OnCrash(int signal) {
  const int fd = open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0 && g_current != nullptr) {
    ssize_t ignored = write(fd, g_current->data(), g_current->size());
    (void)ignored;
    close(fd);
  }
  const char message[] = "fuzz_check: crashed; the input is at ";
  ssize_t ignored = write(2, message, sizeof(message) - 1);
  ignored = write(2, g_crash_path, strlen(g_crash_path));
  ignored = write(2, "\n", 1);
  (void)ignored;
  ::signal(signal, SIG_DFL);
  raise(signal);
}

void Run(const std::string& input) {
  g_current = &input;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  g_current = nullptr;
}

std::string Mutate(const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  std::string out = corpus[rng() % corpus.size()];
  const int rounds = 1 + static_cast<int>(rng() % 8);
  static const uint64_t kBoundaries[] = {0,          1,          0x7f,         0x80,
                                         0xff,       0x7fff,     0xffff,       0x7fffffff,
                                         0xffffffff, 0x80000000, ~uint64_t{0}, uint64_t{1} << 62};
  for (int r = 0; r < rounds; ++r) {
    const size_t n = out.size();
    switch (rng() % 7) {
      case 0:  // flip a bit
        if (n > 0) out[rng() % n] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1: {  // a boundary value, 1, 2, 4 or 8 bytes wide
        const size_t width = size_t{1} << (rng() % 4);
        if (n >= width) {
          const uint64_t v = kBoundaries[rng() % std::size(kBoundaries)];
          std::memcpy(&out[rng() % (n - width + 1)], &v, width);
        }
        break;
      }
      case 2: {  // insert random bytes
        std::string bytes(1 + rng() % 16, '\0');
        for (char& c : bytes) c = static_cast<char>(rng());
        out.insert(n == 0 ? 0 : rng() % (n + 1), bytes);
        break;
      }
      case 3:  // delete a range
        if (n > 0) {
          const size_t at = rng() % n;
          out.erase(at, 1 + rng() % std::min<size_t>(n - at, 64));
        }
        break;
      case 4:  // repeat a range
        if (n > 0) {
          const size_t at = rng() % n;
          const std::string piece = out.substr(at, 1 + rng() % std::min<size_t>(n - at, 64));
          out.insert(rng() % (n + 1), piece);
        }
        break;
      case 5: {  // splice another input's tail
        const std::string& other = corpus[rng() % corpus.size()];
        if (!other.empty() && n > 0)
          out = out.substr(0, rng() % n) + other.substr(rng() % other.size());
        break;
      }
      case 6:  // cut the end
        if (n > 0) out.resize(rng() % n);
        break;
    }
    if (out.size() > kMaxMutatedBytes) out.resize(kMaxMutatedBytes);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 5;
  uint64_t seed = 1;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--seconds=", 0) == 0) {
      seconds = std::atof(arg.c_str() + 10);
    } else if (arg.rfind("--seed=", 0) == 0) {
      seed = std::strtoull(arg.c_str() + 7, nullptr, 10);
    } else {
      dirs.push_back(arg);
    }
  }
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  const char* crash_dir = std::getenv("FUZZ_CHECK_CRASH_DIR");
  std::snprintf(g_crash_path, sizeof(g_crash_path), "%s/crash-%d",
                crash_dir != nullptr ? crash_dir : ".", static_cast<int>(getpid()));
  for (int s : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) ::signal(s, OnCrash);

  std::vector<std::string> corpus;
  for (const std::string& dir : dirs) {
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
      if (!entry.is_regular_file() || entry.file_size() > kMaxInputBytes) continue;
      std::ifstream in(entry.path(), std::ios::binary);
      corpus.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    if (error) {
      std::fprintf(stderr, "fuzz_check: cannot read the corpus '%s': %s\n", dir.c_str(),
                   error.message().c_str());
      return 2;
    }
  }
  if (corpus.empty()) {
    std::fprintf(stderr, "fuzz_check: no seed inputs; name the corpus directories\n");
    return 2;
  }
  for (const std::string& input : corpus) Run(input);
  std::mt19937_64 rng(seed);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int64_t runs = static_cast<int64_t>(corpus.size());
  while (std::chrono::steady_clock::now() < end) {
    Run(Mutate(corpus, rng));
    ++runs;
  }
  std::printf("fuzz_check: %zu seeds, %lld inputs in %.0f s, no crash\n", corpus.size(),
              static_cast<long long>(runs), seconds);
  return 0;
}
