// Scratch files for fuzz targets whose reader takes a path: one private
// directory per process (under $VARIPIPE_FUZZ_TMPDIR, else /dev/shm when it
// exists, else $TMPDIR or /tmp), removed at exit. Inputs are written into it
// before each call. A file is replaced rather than truncated (ext4 flushes a
// truncated file's data, which would cost milliseconds per input).
#ifndef VARIPIPE_TESTS_FUZZ_FUZZ_SCRATCH_H_
#define VARIPIPE_TESTS_FUZZ_FUZZ_SCRATCH_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace varipipe::fuzz {

class Scratch {
 public:
  // The process's directory (created on first use).
  static const std::string& Dir() {
    static const std::string* const dir = [] {
      std::string base = "/tmp";
      std::error_code error;
      if (const char* dir = std::getenv("VARIPIPE_FUZZ_TMPDIR"); dir != nullptr && *dir != '\0') {
        base = dir;
      } else if (std::filesystem::is_directory("/dev/shm", error) &&
                 access("/dev/shm", W_OK) == 0) {
        base = "/dev/shm";
      } else if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp != '\0') {
        base = tmp;
      }
      std::string pattern = base + "/varipipe-fuzz-XXXXXX";
      if (mkdtemp(pattern.data()) == nullptr) {
        std::perror("varipipe fuzz: mkdtemp");
        std::abort();
      }
      auto* path = new std::string(pattern);
      std::atexit([] { std::filesystem::remove_all(Dir()); });
      return path;
    }();
    return *dir;
  }

  // Writes `data` to `name` in the directory; returns the file's path.
  static std::string Write(const std::string& name, const uint8_t* data, size_t size) {
    const std::string path = Dir() + "/" + name;
    std::error_code error;
    std::filesystem::remove(path, error);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    out.close();
    if (!out) {
      std::perror(("varipipe fuzz: write " + path).c_str());
      std::abort();
    }
    return path;
  }

  // Removes every file of the directory.
  static void Clear() {
    for (const auto& entry : std::filesystem::directory_iterator(Dir())) {
      std::filesystem::remove_all(entry.path());
    }
  }
};

}  // namespace varipipe::fuzz

#endif  // VARIPIPE_TESTS_FUZZ_FUZZ_SCRATCH_H_
