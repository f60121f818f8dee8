// The JSON text of dash-attn's --json modes. Strings are always valid UTF-8, whatever bytes they come from (a
// command-line argument may hold any): every byte that does not begin a well-formed UTF-8 sequence (RFC 3629: no
// overlong forms, no surrogates, nothing past U+10FFFF) becomes U+FFFD, the replacement character.
#include "json.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace dash::cli {
namespace {

// Enough for any double printed by std::to_chars in its shortest form.
constexpr size_t kNumberBuffer = 32;
// Control characters below this must be escaped in JSON strings, as \u00XX.
constexpr unsigned char kFirstPrintable = 0x20;
constexpr size_t kUnicodeEscape = sizeof("\\u0000");

// Bytes from kFirstNonAscii up belong to multibyte sequences; continuation bytes lie in [kContinuationFirst,
// kContinuationLast].
constexpr unsigned char kFirstNonAscii = 0x80;
constexpr unsigned char kContinuationFirst = 0x80;
constexpr unsigned char kContinuationLast = 0xBF;
// U+FFFD in UTF-8: what an ill-formed byte becomes.
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// The length of the well-formed UTF-8 sequence of more than one byte at text[i], or 0 when the bytes there are not
// one (Unicode's table of well-formed byte sequences: the second byte's range depends on the first).
size_t multibyte_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  size_t length = 0;
  unsigned char low = kContinuationFirst, high = kContinuationLast;  // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // no overlong forms
    if (lead == 0xF4) high = 0x8F;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (byte(i + k) < kContinuationFirst || byte(i + k) > kContinuationLast) return 0;
  }
  return length;
}

}  // namespace

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (static_cast<unsigned char>(c) >= kFirstNonAscii) {
      const size_t length = multibyte_length(text, i);
      if (length == 0) {
        out += kReplacement;
      } else {
        out.append(text.substr(i, length));
        i += length - 1;
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < kFirstPrintable) {
          char escaped[kUnicodeEscape];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char buffer[kNumberBuffer];
  const auto [end, ec] = std::to_chars(buffer, buffer + kNumberBuffer, value);
  return ec == std::errc() ? std::string(buffer, end) : "null";
}

std::string json_bool(bool value) { return value ? "true" : "false"; }

std::string json_array(const std::vector<std::string>& encoded_values) {
  std::string out = "[";
  for (size_t i = 0; i < encoded_values.size(); ++i) out += (i ? "," : "") + encoded_values[i];
  return out + "]";
}

JsonObject& JsonObject::add(std::string_view key, std::string encoded_value) {
  if (!body_.empty()) body_ += ",";
  body_ += json_string(key) + ":" + encoded_value;
  return *this;
}

}  // namespace dash::cli
