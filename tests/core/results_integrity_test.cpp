// What proves a result file belongs to a run: its point identity and a SHA-256 checksum of its
// content; non-finite numbers are refused at write time; a failed write reports the system's own
// reason (never "Success") and the fix.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <string>

#include "core/base/errors.hpp"
#include "core/base/sha256.hpp"
#include "core/results/results.hpp"
#include "tests/common/temp_dir.hpp"

using namespace muonbed;
using Catch::Contains;

namespace {

ResultRecord small_record() {
  ResultRecord r;
  r.backend = "analytic";
  r.fidelity = "closed_form";
  r.timestamp = "2026-01-01T00:00:00Z";
  r.provenance.experiment = "exp";
  r.provenance.point = "strategy.name=owner";
  r.provenance.resolved_config =
      "name: exp\nstrategy: {name: owner}\noutput: out\nbackend: [sim]\n";
  r.setup.world_size = 1;
  r.step.average_s = 0.25;
  r.step.worst_s = 0.5;
  r.step.patterns = {{0, 1, 0.25}};
  r.ranks.resize(1);
  return r;
}

}  // namespace

TEST_CASE("sha256 matches the FIPS 180-4 test vectors", "[results][checksum]") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 bytes: the padding needs a second block.
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex(std::string(1000000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("a result file's checksum catches any edit", "[results][checksum]") {
  const std::string text = result_to_json(small_record());
  REQUIRE(verify_checksum(text));
  const ResultRecord back = result_from_json(text);
  CHECK(back.checksum.size() == 64);
  CHECK(back.step.average_s == 0.25);
  // A hand edit of one number (a 356,259,983x speedup starts like this) is refused.
  std::string edited = text;
  const std::size_t at = edited.find("\"average_s\": 0.25");
  REQUIRE(at != std::string::npos);
  edited.replace(at, 17, "\"average_s\": 0.0000000007");
  CHECK_FALSE(verify_checksum(edited));
  CHECK_THROWS_WITH(result_from_json(edited), Contains("checksum does not match"));
  // So is a removed or truncated checksum, or text after it.
  CHECK_FALSE(verify_checksum(text.substr(0, text.size() / 2)));
  CHECK_FALSE(verify_checksum(text + "{}"));
  std::string no_sum = text;
  no_sum.replace(no_sum.rfind("\"checksum\""), 10, "\"checksun\"");
  CHECK_THROWS_WITH(result_from_json(no_sum), Contains("checksum"));
}

TEST_CASE("the point identity names experiment, point, backend and configuration",
          "[results][checksum]") {
  const std::string config = "name: e\nstrategy: {name: owner}\noutput: a\nbackend: [sim]\n";
  const std::string id = point_identity("e", "p=1", "sim", config);
  CHECK(id.size() == 16);
  CHECK(id == point_identity("e", "p=1", "sim", config));
  // Where results go and which backends run do not change a result.
  CHECK(id == point_identity("e", "p=1", "sim",
                             "name: e\nstrategy: {name: owner}\noutput: b\nbackend: [analytic]\n"));
  CHECK(id != point_identity("e", "p=2", "sim", config));
  CHECK(id != point_identity("f", "p=1", "sim", config));
  CHECK(id != point_identity("e", "p=1", "analytic", config));
  CHECK(id != point_identity("e", "p=1", "sim", "name: e\nstrategy: {name: sequential}\n"));
  // The record carries it.
  const ResultRecord back = result_from_json(result_to_json(small_record()));
  CHECK(back.provenance.point_id == point_identity("exp", "strategy.name=owner", "analytic",
                                                   small_record().provenance.resolved_config));
}

TEST_CASE("non-finite numbers are refused, never written as null", "[results][checksum]") {
  for (const double bad :
       {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    ResultRecord r = small_record();
    r.ranks[0].worst.compute_s = bad;
    CHECK_THROWS_WITH(result_to_json(r), Contains("ranks[0].worst.compute_s") &&
                                             Contains("non-finite") && Contains("fix:"));
  }
}

TEST_CASE("failed writes report the system's reason and the fix", "[results][paths]") {
  testing::TempDir dir("write");
  { std::ofstream(dir / "plain") << "a file"; }
  // A file where a folder should be.
  try {
    write_file_atomically(dir / "plain/result.json", "{}");
    FAIL("expected an Error");
  } catch (const Error& e) {
    const std::string message = e.what();
    CHECK_THAT(message, Contains("is a file, not a folder") && Contains("fix:"));
    CHECK_THAT(message, !Contains("Success"));
  }
  // A folder where the file should go: the rename fails with the real reason.
  std::filesystem::create_directories(dir.path() / "taken.json");
  try {
    write_file_atomically(dir / "taken.json", "{}");
    FAIL("expected an Error");
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()), Contains("Is a directory") && !Contains("Success"));
  }
  // A name longer than the file system allows.
  try {
    write_file_atomically(dir / std::string(300, 'x'), "{}");
    FAIL("expected an Error");
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()),
               Contains("File name too long") && Contains("shorter file and folder names"));
  }
  // Nothing is left behind by the failures, and a good write works.
  write_file_atomically(dir / "sub/ok.json", "{}");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::recursive_directory_iterator(dir.path()))
    ++entries;
  CHECK(entries == 4);  // plain, taken.json, sub, sub/ok.json
}

TEST_CASE("output folders are checked before any work", "[results][paths]") {
  testing::TempDir dir("folders");
  { std::ofstream(dir / "file") << "x"; }
  CHECK_THROWS_WITH(check_writable_folder(dir / "file"), Contains("is a file, not a folder"));
  std::filesystem::create_symlink(dir / "loop_b", dir / "loop_a");
  std::filesystem::create_symlink(dir / "loop_a", dir / "loop_b");
  CHECK_THROWS_WITH(check_writable_folder(dir / "loop_a/x"),
                    Contains("Too many levels of symbolic links") && Contains("fix:"));
  CHECK_NOTHROW(check_writable_folder(dir / "new/deeper"));
  CHECK(std::filesystem::is_directory(dir.path() / "new/deeper"));
  CHECK(std::filesystem::is_empty(dir.path() / "new/deeper"));  // the probe is gone
}
