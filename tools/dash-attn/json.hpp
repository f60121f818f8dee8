// Minimal JSON output for the --json modes of dash-attn (no JSON library is available): escaped
// strings, always valid UTF-8 (ill-formed bytes become U+FFFD), finite numbers, and objects and arrays assembled
// from already-encoded values.
#pragma once

#include <concepts>
#include <string>
#include <string_view>
#include <vector>

namespace dash::cli {

std::string json_string(std::string_view text);
// Shortest text that reads back as the same double; null for NaN and infinities, which JSON lacks.
std::string json_number(double value);
template <std::integral T>
std::string json_number(T value) {
  return std::to_string(value);
}
std::string json_bool(bool value);
std::string json_array(const std::vector<std::string>& encoded_values);

// Keys in insertion order; values are already JSON text.
class JsonObject {
 public:
  JsonObject& add(std::string_view key, std::string encoded_value);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

}  // namespace dash::cli
