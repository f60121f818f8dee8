// gtest assertions on a dash::Status, shared by the API's validation tests: a refusal is judged by its code and by
// the parts of its message that name the argument and the rule, an acceptance by ok().
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "dash/attention.hpp"

namespace dash::testing {

// Success if `status` has `code` and its message contains each of `parts`.
inline ::testing::AssertionResult fails_with(const Status& status, StatusCode code,
                                             std::initializer_list<std::string_view> parts) {
  if (status.code() != code) {
    return ::testing::AssertionFailure() << "expected " << status_code_name(code) << ", got " << status.to_string();
  }
  for (std::string_view part : parts) {
    if (status.message().find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks '" << part << "': " << status.message();
    }
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult is_ok(const Status& status) {
  if (status.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << status.to_string();
}

}  // namespace dash::testing
