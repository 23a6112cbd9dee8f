// Every file muonbed writes goes through write_output_file: results, traces, manifests, plans,
// profiles, --json copies. Users run muonbed as root on shared machines, so the writer never
// replaces what is not a file of its own making:
//
//   the target is              muonbed
//   absent or a regular file   writes a temporary file beside it (its own name, created with
//                              O_EXCL | O_NOFOLLOW, mode of the file it replaces), optionally
//                              validates it, then renames it over the target: readers see the
//                              old content or the new, never half of it
//   a character device / FIFO  writes through it in place, never replacing it (--json /dev/null,
//                              --json /dev/stdout, a named pipe with a reader; a FIFO nobody
//                              reads is refused, never waited on)
//   a symbolic link            follows it: the file it points to is written as above and the
//                              link stays; a dangling link is refused
//   a folder, block device,    refused with the path and the fix
//   socket
//   a file this command read   refused (calibrate --experiment X --out X): every input file is
//   (same device and inode)    recorded by note_input_file (read_text_file does it)
//
// Temporary files are named "<file name>.muonbed-tmp-<writer pid>" (temp_file_name) so that
// cleanup can recognise them, and only them.
#pragma once

#include <functional>
#include <string>

namespace muonbed {

// Records the file open as `fd` (read from `path`) as an input of this command: no output of
// the same command may replace it.
void note_input_file(int fd, const std::string& path);
// Forgets every input recorded so far: a long-lived process that runs one command after another
// (a test binary) starts each with a clean slate; a command never calls it.
void forget_input_files();
// True when `path` resolves to a file this command recorded as an input.
bool is_input_file(const std::string& path);

struct WriteOptions {
  // Called with the temporary file's path before it replaces the target (regular files only):
  // throw to keep the old file untouched (the temporary one is removed and the error passes on
  // with "the old file is unchanged").
  std::function<void(const std::string& temp_path)> validate;
  // What the file is, for messages ("results file", "cluster profile").
  std::string what = "file";
};

void write_output_file(const std::string& path, const std::string& text,
                       const WriteOptions& options = {});
// write_output_file with default options (kept: the name every caller knows).
void write_file_atomically(const std::string& path, const std::string& text);

// Before a command's work: whether write_output_file could write `path` later (a folder there,
// a missing or unwritable folder, a dangling link, an input of this command: Error with the fix;
// a descriptor, character device or FIFO: fine, written through then). `option` names it in
// messages ("--json").
void check_output_file(const std::string& path, const std::string& option);

// Creates `folder` (and its parents) unless it exists; throws Error with the system's reason and
// the fix when it cannot, or when the path is not a folder (a file, a symbolic link loop).
void prepare_folder(const std::string& folder);
// prepare_folder, then proves the folder writable by creating and removing a file in it: a
// command checks its output folders this way before any work.
void check_writable_folder(const std::string& folder);

// Temporary files of write_output_file: "<file name>.muonbed-tmp-<writer pid>" in the target's
// folder. Only names of this form (for a file muonbed writes) are ever cleaned up.
inline constexpr const char* kTempMarker = ".muonbed-tmp-";
std::string temp_file_name(const std::string& file_name, long pid);
// True when `name` is such a temporary file; sets the target's file name and the writer's pid.
bool parse_temp_file_name(const std::string& name, std::string& file_name, long& pid);
// True when process `pid` is alive and is a muonbed program (its executable's name starts with
// "muonbed", or it is this process): a temporary file of any other pid is a leftover, whatever
// now runs under that number.
bool is_live_muonbed_process(long pid);

}  // namespace muonbed
