// Shapes every entry point must refuse before it queries a device or plans: the cases that crashed
// (heads_kv = 0 divided by zero, heads_q = 2^33 overflowed the planner's ints), threw (batch = -1 sized a
// vector) or answered "ok" with a made-up workspace size (batch = 0, head dim 7). Shared by the tests of the
// C++ API and of the C ABI, so both layers are held to one list.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dash/attention.hpp"

namespace dash::testing {

// A valid shape the rejected cases start from: each breaks one rule of it.
inline AttentionShape valid_workspace_shape() {
  AttentionShape shape;
  shape.batch = 2;
  shape.seqlen_q = 256;
  shape.seqlen_k = 384;
  shape.heads_q = 8;
  shape.heads_kv = 2;
  shape.head_dim = 128;
  shape.dtype = DType::kBF16;
  shape.softmax_scale = 1.0f / std::sqrt(128.0f);
  shape.causal = true;
  return shape;
}

struct RejectedShape {
  std::string name;  // the test's name suffix
  std::function<void(AttentionShape&)> bend;
  StatusCode code;
  std::string message;  // the whole expected message
};

inline constexpr float kTinySoftcap = 1e-40f;

inline std::string printed(float value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

inline std::vector<RejectedShape> rejected_shapes() {
  return {
      {"HeadsKvZero", [](AttentionShape& s) { s.heads_kv = 0; }, StatusCode::kInvalidArgument,
       "shape.heads_kv must be > 0, got 0"},
      {"HeadsQTwoToThe33", [](AttentionShape& s) { s.heads_q = int64_t{1} << 33; }, StatusCode::kNotSupported,
       "shape.heads_q must be <= 65535 (the backward's preprocess, postprocess and split-sum kernels launch it as a "
       "grid dimension, which CUDA caps at 65535), got 8589934592"},
      {"BatchNegative", [](AttentionShape& s) { s.batch = -1; }, StatusCode::kInvalidArgument,
       "shape.batch must be > 0, got -1"},
      {"BatchZero", [](AttentionShape& s) { s.batch = 0; }, StatusCode::kInvalidArgument,
       "shape.batch must be > 0, got 0"},
      {"HeadDim7", [](AttentionShape& s) { s.head_dim = 7; }, StatusCode::kNotSupported,
       "shape.head_dim must be one of {64, 96, 128, 192, 256}, got 7"},
      // The sliding window and softcap (FlashAttention's window_size and softcap).
      {"WindowLeftMinus2", [](AttentionShape& s) { s.window_left = -2; }, StatusCode::kInvalidArgument,
       "shape.window_left must be >= -1 (-1 leaves that side of the sliding window open), got -2"},
      {"WindowRightMinus2", [](AttentionShape& s) { s.window_right = -2; }, StatusCode::kInvalidArgument,
       "shape.window_right must be >= -1 (-1 leaves that side of the sliding window open), got -2"},
      {"SoftcapNegative", [](AttentionShape& s) { s.softcap = -1.0f; }, StatusCode::kInvalidArgument,
       "shape.softcap must be finite and >= 0 (0: no capping), got -1"},
      {"SoftcapNaN", [](AttentionShape& s) { s.softcap = std::nanf(""); }, StatusCode::kInvalidArgument,
       "shape.softcap must be finite and >= 0 (0: no capping), got nan"},
      {"SoftcapInfinite", [](AttentionShape& s) { s.softcap = INFINITY; }, StatusCode::kInvalidArgument,
       "shape.softcap must be finite and >= 0 (0: no capping), got inf"},
      // A subnormal softcap: softmax_scale / softcap overflows (printed as the library prints floats).
      {"SoftcapTooSmallForTheScale", [](AttentionShape& s) { s.softcap = kTinySoftcap; }, StatusCode::kInvalidArgument,
       "shape.softcap must be 0 or large enough that softmax_scale / softcap is finite, got softcap " +
           printed(kTinySoftcap) + " with softmax_scale " + printed(valid_workspace_shape().softmax_scale)},
  };
}

// "HeadsKvZero" etc., for INSTANTIATE_TEST_SUITE_P.
inline std::string rejected_shape_name(const ::testing::TestParamInfo<RejectedShape>& info) { return info.param.name; }

}  // namespace dash::testing
