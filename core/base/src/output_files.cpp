// The one writer of muonbed's output files (see core/base/output_files.hpp).
#include "core/base/output_files.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "core/base/errors.hpp"

namespace muonbed {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void path_failure(const std::string& what, const std::string& path, int error) {
  throw Error(what + " '" + path + "': " + std::strerror(error) +
              "; fix: " + path_error_fix(error, true));
}

struct InputFiles {
  std::mutex mutex;
  std::map<std::pair<dev_t, ino_t>, std::string> files;  // identity -> the path it was read as
};

InputFiles& inputs() {
  static InputFiles registry;
  return registry;
}

// The input recorded at the identity of `info`, or nullptr. An entry whose path no longer leads
// to that identity is stale (the input was deleted and its inode number reused, as a long-lived
// process such as a test binary sees): it is dropped.
const std::string* input_at(const struct stat& info) {
  InputFiles& r = inputs();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.files.find({info.st_dev, info.st_ino});
  if (it == r.files.end()) return nullptr;
  struct stat now {};
  if (::stat(it->second.c_str(), &now) != 0 || now.st_dev != info.st_dev ||
      now.st_ino != info.st_ino) {
    r.files.erase(it);
    return nullptr;
  }
  return &it->second;
}

void write_all(int fd, const std::string& text, const std::string& path,
               const std::function<void()>& on_error) {
  std::size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;
      on_error();
      path_failure("writing failed for", path, error);
    }
    written += static_cast<std::size_t>(n);
  }
}

// Where a path leads: itself, or the file its symbolic links (any number) end at. A dangling
// link and a link loop are refused: writing would create a file nobody asked for, or fail.
fs::path resolve_links(const fs::path& path) {
  fs::path at = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat info {};
    if (::lstat(at.c_str(), &info) != 0 || !S_ISLNK(info.st_mode)) return at;
    std::error_code ec;
    const fs::path next = fs::read_symlink(at, ec);
    if (ec) path_failure("cannot read the symbolic link", at.string(), ec.value());
    at = next.is_absolute() ? next : at.parent_path() / next;
    struct stat target {};
    if (::lstat(at.c_str(), &target) != 0 && errno == ENOENT) {
      struct stat parent {};
      const fs::path folder = at.has_parent_path() ? at.parent_path() : fs::path(".");
      if (::stat(folder.c_str(), &parent) != 0 || !S_ISDIR(parent.st_mode))
        throw Error("'" + path.string() + "' is a symbolic link to '" + at.string() +
                    "', whose folder does not exist; fix: create the folder, point the link "
                    "elsewhere, or write to another path");
      return at;  // a link to a file not yet written: written at the link's target, link kept
    }
  }
  path_failure("cannot follow the symbolic link", path.string(), ELOOP);
}

void write_through(const std::string& path, const std::string& shown, const std::string& text,
                   bool fifo) {
  // A FIFO with no reader would block open() forever: O_NONBLOCK turns that into ENXIO.
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC | (fifo ? O_NONBLOCK : 0));
  if (fd < 0) {
    const int error = errno;
    if (fifo && error == ENXIO)
      throw Error("cannot write '" + shown +
                  "': it is a named pipe (FIFO) that no process is reading; fix: start the "
                  "reader first (e.g. cat " +
                  shown + "), or write to a regular file");
    path_failure("cannot write", shown, error);
  }
  if (fifo) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  write_all(fd, text, shown, [fd] { ::close(fd); });
  if (::close(fd) != 0 && errno != EINTR) path_failure("writing failed for", shown, errno);
}

// The descriptor a path names: /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N; else -1.
int descriptor_name(const std::string& path) {
  if (path == "/dev/stdout") return STDOUT_FILENO;
  if (path == "/dev/stderr") return STDERR_FILENO;
  for (const char* prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    const std::string p = prefix;
    if (path.size() > p.size() && path.compare(0, p.size(), p) == 0 &&
        path.find_first_not_of("0123456789", p.size()) == std::string::npos &&
        path.size() - p.size() <= 6)
      return std::stoi(path.substr(p.size()));
  }
  return -1;
}

}  // namespace

void note_input_file(int fd, const std::string& path) {
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) return;
  InputFiles& r = inputs();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.files.insert_or_assign(std::make_pair(info.st_dev, info.st_ino), path);
}

void forget_input_files() {
  InputFiles& r = inputs();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.files.clear();
}

bool is_input_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && input_at(info) != nullptr;
}

void write_output_file(const std::string& path, const std::string& text,
                       const WriteOptions& options) {
  if (path.empty()) throw Error("the " + options.what + " path is empty; fix: give a file name");
  // A name of one of this process's open files (--json /dev/stdout > file): written to that
  // descriptor, at its offset, as a shell redirection expects; never opened anew or replaced.
  if (const int fd = descriptor_name(path); fd >= 0) {
    struct stat open_file {};
    if (::fstat(fd, &open_file) != 0) path_failure("cannot write", path, errno);
    std::cout.flush();  // what the program printed before comes first
    std::cerr.flush();
    std::fflush(nullptr);
    write_all(fd, text, path, [] {});
    return;
  }
  // What the path leads to, as the kernel resolves it (this also follows /proc's links such as
  // /dev/stdout -> /proc/self/fd/1 -> a pipe, which have no path of their own).
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && (S_ISCHR(info.st_mode) || S_ISFIFO(info.st_mode))) {
    if (const std::string* input = input_at(info))
      throw Error("'" + path + "' is the input '" + *input + "' of this command; fix: write the " +
                  options.what + " to another file");
    return write_through(path, path, text, S_ISFIFO(info.st_mode));
  }
  const fs::path target = resolve_links(fs::path(path));
  const bool exists = ::stat(target.c_str(), &info) == 0;
  if (exists) {
    if (const std::string* input = input_at(info))
      throw Error("'" + path + "' is " +
                  (*input == path ? std::string("an input") : "the input '" + *input + "'") +
                  " of this command; writing the " + options.what +
                  " there would replace it; fix: write to another file");
    if (S_ISCHR(info.st_mode) || S_ISFIFO(info.st_mode))
      return write_through(target.string(), path, text, S_ISFIFO(info.st_mode));
    if (S_ISDIR(info.st_mode)) path_failure("cannot write", path, EISDIR);
    if (!S_ISREG(info.st_mode))
      throw Error("cannot write '" + path + "': it is " +
                  (S_ISBLK(info.st_mode)    ? "a block device"
                   : S_ISSOCK(info.st_mode) ? "a socket"
                                            : "not a regular file") +
                  ", which muonbed never replaces; fix: write to a regular file");
  }
  if (target.has_parent_path()) prepare_folder(target.parent_path().string());
  // Same folder as the target, so rename() is atomic; pid keeps concurrent writers apart. The
  // name is muonbed's own (temp_file_name), so cleanup never mistakes a user's file for it.
  // O_EXCL | O_NOFOLLOW: whatever stands at that name (a link planted there) is never opened.
  const fs::path temp = target.parent_path() / temp_file_name(target.filename().string(), getpid());
  const mode_t mode = exists ? (info.st_mode & 07777) : 0644;
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0 && errno == EEXIST) {
    // Our own name with our own pid: a leftover of an earlier process with this pid. Only a
    // regular file is removed; anything else there is not ours.
    struct stat old {};
    if (::lstat(temp.c_str(), &old) == 0 && S_ISREG(old.st_mode) && ::unlink(temp.c_str()) == 0)
      fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    else
      throw Error("cannot write '" + path + "': '" + temp.string() +
                  "' (muonbed's temporary name for it) exists and is not a regular file; fix: "
                  "remove it if it is yours, or write elsewhere");
  }
  if (fd < 0) path_failure("cannot write", path, errno);
  if (exists) (void)::fchmod(fd, mode);  // the umask must not widen or narrow a user's file
  const auto drop = [&] { ::unlink(temp.c_str()); };
  write_all(fd, text, path, [&] {
    ::close(fd);
    drop();
  });
  if (::close(fd) != 0) {
    const int error = errno;
    drop();
    path_failure("writing failed for", path, error);
  }
  if (options.validate) {
    try {
      options.validate(temp.string());
    } catch (const std::exception& e) {
      drop();
      throw Error("the new " + options.what + " for '" + path +
                  "' did not read back, so it was not written (" +
                  (exists ? "the old file is unchanged" : "no file was made") + "): " + e.what());
    }
  }
  if (::rename(temp.c_str(), target.c_str()) != 0) {
    const int error = errno;  // before unlink() may change it
    drop();
    path_failure("cannot move the finished file to", path, error);
  }
}

void check_output_file(const std::string& path, const std::string& option) {
  if (path.empty()) throw Error(option + " is empty; fix: give a file name");
  if (descriptor_name(path) >= 0) return;
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) {
    if (const std::string* input = input_at(info))
      throw Error(option + " '" + path + "' is " +
                  (*input == path ? std::string("an input") : "the input '" + *input + "'") +
                  " of this command; fix: write to another file");
    if (S_ISCHR(info.st_mode) || S_ISFIFO(info.st_mode)) return;
    if (S_ISDIR(info.st_mode))
      throw Error(option + " '" + path + "' is a folder; fix: give a file name, e.g. " + option +
                  " " + (fs::path(path) / "out.json").string());
  }
  const fs::path target = resolve_links(fs::path(path));
  check_writable_folder(target.has_parent_path() ? target.parent_path().string() : ".");
}

void write_file_atomically(const std::string& path, const std::string& text) {
  write_output_file(path, text);
}

void prepare_folder(const std::string& folder) {
  const fs::path dir = folder.empty() ? fs::path(".") : fs::path(folder);
  struct stat existing {};
  if (::stat(dir.c_str(), &existing) == 0 && !S_ISDIR(existing.st_mode))
    throw Error("'" + dir.string() +
                "' is a file, not a folder; fix: choose another folder (e.g. --output DIR), or "
                "move that file away");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) path_failure("cannot create the folder", dir.string(), ec.value());
  struct stat info {};
  if (::stat(dir.c_str(), &info) != 0) path_failure("cannot use the folder", dir.string(), errno);
  if (!S_ISDIR(info.st_mode)) path_failure("cannot use the folder", dir.string(), ENOTDIR);
}

void check_writable_folder(const std::string& folder) {
  prepare_folder(folder);
  // Writing is the only sure test (permissions, read-only mounts, ACLs, a full disk's quota).
  const fs::path probe =
      (folder.empty() ? fs::path(".") : fs::path(folder)) / temp_file_name(".probe", getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 && errno != EEXIST) path_failure("cannot write into the folder", folder, errno);
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
  }
}

std::string temp_file_name(const std::string& file_name, long pid) {
  return file_name + kTempMarker + std::to_string(pid);
}

bool parse_temp_file_name(const std::string& name, std::string& file_name, long& pid) {
  const std::size_t at = name.rfind(kTempMarker);
  if (at == std::string::npos || at == 0) return false;
  const std::string digits = name.substr(at + std::string_view(kTempMarker).size());
  if (digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return false;
  file_name = name.substr(0, at);
  pid = std::stol(digits);
  return true;
}

bool is_live_muonbed_process(long pid) {
  if (pid <= 0) return false;
  if (pid == static_cast<long>(::getpid())) return true;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  // Alive (or not ours to signal): is it muonbed? /proc/PID/comm holds the executable's name
  // (15 characters at most): "muonbed", "muonbed-gpu-wo...".
  const std::string comm = "/proc/" + std::to_string(pid) + "/comm";
  const int fd = ::open(comm.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // gone meanwhile, or no /proc: not provably muonbed
  char name[32] = {};
  const ssize_t n = ::read(fd, name, sizeof name - 1);
  ::close(fd);
  return n >= 7 && std::string_view(name, 7) == "muonbed";
}

}  // namespace muonbed
