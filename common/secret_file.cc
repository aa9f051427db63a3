#include "common/secret_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

namespace varipipe {

absl::Status WriteSecretFile(const std::string& path, absl::string_view contents) {
  std::string temporary = absl::StrCat(path, ".tmp.XXXXXX");
  std::vector<char> name(temporary.begin(), temporary.end());
  name.push_back('\0');
  // mkstemp opens with O_CREAT | O_EXCL and mode 0600 (before the umask,
  // which can only remove bits).
  const int fd = mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create a temporary file for ", path));
  temporary = name.data();
  const auto fail = [&](absl::string_view what) {
    const int error = errno;
    close(fd);
    unlink(temporary.c_str());
    return ErrnoToStatus(error, absl::StrCat(what, " ", path));
  };
  if (fchmod(fd, 0600) != 0) return fail("chmod 0600");
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("write");
    written += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) return fail("fsync");
  if (close(fd) != 0) {
    const int error = errno;
    unlink(temporary.c_str());
    return ErrnoToStatus(error, absl::StrCat("close ", path));
  }
  if (rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(temporary.c_str());
    return ErrnoToStatus(error, absl::StrCat("rename into ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view flag) {
  const std::string named = flag.empty() ? path : absl::StrCat(flag, " ", path);
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) return ErrnoToStatus(errno, named);
  if ((info.st_mode & S_IRWXO) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: other users may read this secret file (mode %04o); chmod o-rwx it",
                        named, info.st_mode & 07777));
  }
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return Annotate(text.status(), named);
  std::string line = text->substr(0, text->find('\n'));
  absl::StripAsciiWhitespace(&line);
  if (line.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(named, ": the file is empty"));
  }
  return line;
}

}  // namespace varipipe
