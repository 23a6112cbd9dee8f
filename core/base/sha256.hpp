// SHA-256 (FIPS 180-4), for the content checksums and point identities of result files: the
// same digest Python's hashlib computes, so analysis/plot.py verifies what muonbed wrote.
#pragma once

#include <string>
#include <string_view>

namespace muonbed {

// The digest of `data` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view data);

}  // namespace muonbed
