// The one writer of output files (core/base/output_files.hpp) and the process helpers
// (core/base/process.hpp): what is replaced atomically, what is written through, what is refused,
// and that nothing else is touched. Each case checks the file system afterwards, not only the
// message.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/base/errors.hpp"
#include "core/base/output_files.hpp"
#include "core/base/process.hpp"
#include "core/config/src/yaml_util.hpp"
#include "tests/common/temp_dir.hpp"

using namespace muonbed;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void put(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace

TEST_CASE("write_output_file replaces a regular file atomically, keeping its mode",
          "[core][files]") {
  testing::TempDir dir("files");
  const std::string path = dir / "a.json";
  put(path, "old");
  ::chmod(path.c_str(), 0600);
  write_output_file(path, "new");
  CHECK(slurp(path) == "new");
  struct stat info {};
  REQUIRE(::stat(path.c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0600);
  // No temporary file is left beside it.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++entries;
  CHECK(entries == 1);
  // A new file in a folder that does not exist yet.
  write_output_file(dir / "sub/b.json", "b");
  CHECK(slurp(dir / "sub/b.json") == "b");
}

TEST_CASE("write_output_file writes through character devices and descriptors", "[core][files]") {
  write_output_file("/dev/null", "discarded");
  struct stat info {};
  REQUIRE(::stat("/dev/null", &info) == 0);
  CHECK(S_ISCHR(info.st_mode));  // never replaced by a regular file (as root it could be)

  testing::TempDir dir("files");
  // /dev/fd/N: the descriptor, at its offset (a shell redirection's file is appended to).
  const std::string log = dir / "log.txt";
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, "head\n", 5) == 5);
  write_output_file("/dev/fd/" + std::to_string(fd), "body\n");
  ::close(fd);
  CHECK(slurp(log) == "head\nbody\n");
}

TEST_CASE("write_output_file follows symbolic links and keeps them", "[core][files]") {
  testing::TempDir dir("files");
  put(dir / "real.json", "old");
  fs::create_directory(dir / "d");
  fs::create_symlink("../real.json", dir / "d/l1");
  fs::create_symlink("d/l1", dir / "l2");
  write_output_file(dir / "l2", "new");
  CHECK(fs::is_symlink(dir / "l2"));
  CHECK(fs::is_symlink(dir / "d/l1"));
  CHECK(slurp(dir / "real.json") == "new");
  // A link into a folder that does not exist is refused, and stays a link.
  fs::create_symlink("nowhere/x.json", dir / "dangling");
  CHECK_THROWS_WITH(write_output_file(dir / "dangling", "x"), Contains("is a symbolic link to") &&
                                                                  Contains("nowhere/x.json'") &&
                                                                  Contains("fix:"));
  CHECK(fs::is_symlink(dir / "dangling"));
  // A link loop.
  fs::create_symlink("loop2", dir / "loop1");
  fs::create_symlink("loop1", dir / "loop2");
  CHECK_THROWS_WITH(write_output_file(dir / "loop1", "x"), Contains("symbolic link"));
}

TEST_CASE("write_output_file refuses folders, sockets, FIFOs without a reader and inputs",
          "[core][files]") {
  testing::TempDir dir("files");
  fs::create_directory(dir / "folder");
  CHECK_THROWS_WITH(write_output_file(dir / "folder", "x"), Contains("cannot write"));
  CHECK(fs::is_directory(dir / "folder"));

  const std::string sock = dir / "sock";
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  CHECK_THROWS_WITH(write_output_file(sock, "x"), Contains("a socket"));
  CHECK(fs::is_socket(sock));
  ::close(s);

  const std::string fifo = dir / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  CHECK_THROWS_WITH(write_output_file(fifo, "x"), Contains("no process is reading"));
  CHECK(fs::is_fifo(fifo));

  // A file this process read as an input (read_text_file records it), by any name.
  const std::string input = dir / "exp.yaml";
  put(input, "name: x\n");
  (void)yaml_util::read_text_file(input, "experiment file");
  fs::create_symlink("exp.yaml", dir / "alias.yaml");
  CHECK_THROWS_WITH(write_output_file(input, "y"), Contains("an input of this command"));
  CHECK_THROWS_WITH(write_output_file(dir / "alias.yaml", "y"),
                    Contains("the input '" + input + "'"));
  CHECK_THROWS_WITH(check_output_file(input, "--out"), Contains("--out") && Contains("input"));
  CHECK(slurp(input) == "name: x\n");
  // Once deleted, its inode number may be reused by a new file: that file is no input.
  fs::remove(input);
  put(dir / "fresh.yaml", "z");
  CHECK_NOTHROW(write_output_file(dir / "fresh.yaml", "w"));
}

TEST_CASE("write_output_file: a failed validation leaves the old file untouched", "[core][files]") {
  testing::TempDir dir("files");
  const std::string path = dir / "profile.yaml";
  put(path, "good");
  WriteOptions o;
  o.what = "cluster profile";
  std::string seen;
  o.validate = [&](const std::string& temp) {
    seen = slurp(temp);
    throw Error("line 3: not a profile");
  };
  CHECK_THROWS_WITH(write_output_file(path, "bad", o), Contains("did not read back") &&
                                                           Contains("the old file is unchanged") &&
                                                           Contains("line 3: not a profile"));
  CHECK(seen == "bad");  // the validator read the new content from the temporary file
  CHECK(slurp(path) == "good");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++entries;
  CHECK(entries == 1);  // and the temporary file is gone
}

TEST_CASE("write_output_file never opens what stands at its temporary name", "[core][files]") {
  testing::TempDir dir("files");
  put(dir / "victim", "keep");
  fs::create_symlink(dir / "victim", dir.path() / temp_file_name("j.json", ::getpid()));
  CHECK_THROWS_WITH(write_output_file(dir / "j.json", "x"),
                    Contains("exists and is not a regular file"));
  CHECK(slurp(dir / "victim") == "keep");
  CHECK_FALSE(fs::exists(dir / "j.json"));
}

TEST_CASE("is_live_muonbed_process: this process, dead pids, other programs", "[core][files]") {
  CHECK(is_live_muonbed_process(::getpid()));
  CHECK_FALSE(is_live_muonbed_process(0));
  CHECK_FALSE(is_live_muonbed_process(-5));
  const pid_t child = ::fork();
  if (child == 0) {
    ::execl("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  REQUIRE(child > 0);
  ::usleep(200000);                             // let it exec: its name is then "sleep"
  CHECK_FALSE(is_live_muonbed_process(child));  // alive, but not muonbed: a leftover's pid
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK_FALSE(is_live_muonbed_process(child));  // gone
}

TEST_CASE("env_number and env_choice parse strictly", "[core][process]") {
  const char* name = "MUONBED_TEST_NUMBER";
  ::unsetenv(name);
  CHECK_FALSE(env_number(name, 1, 10, true, "3").has_value());
  ::setenv(name, "", 1);
  CHECK_FALSE(env_number(name, 1, 10, true, "3").has_value());
  ::setenv(name, "7", 1);
  CHECK(env_number(name, 1, 10, true, "3") == 7.0);
  ::setenv(name, "2.5", 1);
  CHECK(env_number(name, 0.1, 10, false, "3") == 2.5);
  for (const char* bad : {"4abc", "inf", "nan", "0x10", " 4", "1e308", "2.5", "-1", "11"}) {
    INFO(bad);
    ::setenv(name, bad, 1);
    CHECK_THROWS_WITH(env_number(name, 1, 10, true, "3"),
                      Contains(std::string(name) + "='" + bad + "'") && Contains("1..10") &&
                          Contains(std::string(name) + "=3"));
  }
  ::setenv(name, "yes", 1);
  CHECK_THROWS_WITH(env_choice(name, {"0", "1"}), Contains("is not one of 0, 1"));
  ::setenv(name, "1", 1);
  CHECK(env_choice(name, {"0", "1"}) == std::string("1"));
  ::unsetenv(name);
}

TEST_CASE("shell_quote round-trips any text through /bin/sh", "[core][process]") {
  for (const std::string& text :
       {std::string("plain-path/a.yaml"), std::string("it's"), std::string("two words"),
        std::string("x\nname: evil"), std::string("$(rm -rf /)"), std::string(""),
        std::string("'\"\\`")}) {
    INFO(text);
    const std::string command = "printf '%s' " + shell_quote(text);
    FILE* pipe = ::popen(command.c_str(), "r");
    REQUIRE(pipe != nullptr);
    std::string got;
    char buffer[256];
    while (const std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) got.append(buffer, n);
    ::pclose(pipe);
    CHECK(got == text);
  }
  CHECK(shell_words({"muonbed", "calibrate", "--note", "it's a VM"}) ==
        "muonbed calibrate --note 'it'\\''s a VM'");
}

TEST_CASE("spawn_process: its own process group, stopped on an interrupt", "[core][process]") {
  const pid_t pid = spawn_process({"/bin/sh", "-c", "sleep 30 & sleep 30; wait"});
  REQUIRE(pid > 0);
  ::usleep(200000);
  CHECK(::getpgid(pid) == pid);  // a group of its own: muonbed's signals to it reach its children
  // No interrupt: an ordinary exit status comes back.
  const pid_t quick = spawn_process({"/bin/sh", "-c", "exit 3"});
  const int status = wait_process(quick);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 3);
  CHECK(describe_wait_status(status) == "exited with code 3");
  ::kill(-pid, SIGKILL);
  int ignored = 0;
  ::waitpid(pid, &ignored, 0);
}
