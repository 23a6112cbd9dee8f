// invalid_utf8_at (core/base/errors.hpp) against hand-made byte strings: the well-formed sequences
// of RFC 3629 pass, and each kind of malformed one is found at its first byte.
#include <catch2/catch.hpp>

#include <string>

#include "core/base/errors.hpp"

using muonbed::invalid_utf8_at;

TEST_CASE("well-formed UTF-8 passes", "[utf8]") {
  CHECK(invalid_utf8_at("") == std::string::npos);
  CHECK(invalid_utf8_at("llama-7b: plain ASCII") == std::string::npos);
  CHECK(invalid_utf8_at("\xC3\xA9t\xC3\xA9") == std::string::npos);  // "été"
  CHECK(invalid_utf8_at("\xE2\x82\xAC 5") == std::string::npos);     // U+20AC
  CHECK(invalid_utf8_at("\xF0\x9F\x9A\x80") == std::string::npos);   // U+1F680
  CHECK(invalid_utf8_at("\xF4\x8F\xBF\xBF") == std::string::npos);   // U+10FFFF, the last
  CHECK(invalid_utf8_at("\xED\x9F\xBF") == std::string::npos);       // U+D7FF
  CHECK(invalid_utf8_at("\xEE\x80\x80") == std::string::npos);       // U+E000
}

TEST_CASE("malformed UTF-8 is found at its first byte", "[utf8]") {
  CHECK(invalid_utf8_at("llam\xFF-cpu") == 4);      // never a UTF-8 byte
  CHECK(invalid_utf8_at("caf\xE9") == 3);           // Latin-1 "é"
  CHECK(invalid_utf8_at("ab\x80") == 2);            // a lone continuation byte
  CHECK(invalid_utf8_at("\xC0\xAF") == 0);          // overlong "/"
  CHECK(invalid_utf8_at("\xC1\xBF") == 0);          // overlong
  CHECK(invalid_utf8_at("x\xE0\x9F\xBF") == 1);     // overlong 3-byte form
  CHECK(invalid_utf8_at("\xF0\x8F\xBF\xBF") == 0);  // overlong 4-byte form
  CHECK(invalid_utf8_at("\xED\xA0\x80") == 0);      // a UTF-16 surrogate (U+D800)
  CHECK(invalid_utf8_at("\xF4\x90\x80\x80") == 0);  // above U+10FFFF
  CHECK(invalid_utf8_at("\xF5\x80\x80\x80") == 0);  // never a lead byte
  CHECK(invalid_utf8_at("ok\xE2\x82") == 2);        // truncated at the end
  CHECK(invalid_utf8_at("\xE2\x82x") == 0);         // a continuation missing
  CHECK(invalid_utf8_at("\xC3\xA9\xC3") == 2);      // the second sequence truncated
}
