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

}  // namespace

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
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
