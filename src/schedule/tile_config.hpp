// Tile shapes of the sm90 kernels, per head dim. The schedule model plans in units of these tiles, so
// the host planner and the kernels must agree on them: both read them from here.
//
// Backward: each CTA owns one key/value tile of block_kv rows (split between two MMA warpgroups of 64
// rows each) and visits query tiles of block_q rows. block_kv is a multiple of block_q, which the
// symmetric shift schedule needs (its stride is block_kv / block_q).
#pragma once

#include "schedule/host_device.hpp"

namespace dash {

struct TileShape {
  int block_q;
  int block_kv;
};

DASH_HOST_DEVICE constexpr TileShape backward_tile_shape(int head_dim) {
  // d=64: 128x128 keeps the S/dP accumulators at 64 registers per thread each.
  // d=128: dK and dV alone take 128 registers per thread, so the query tile shrinks to 64 rows.
  return head_dim <= 64 ? TileShape{128, 128} : TileShape{64, 128};
}

DASH_HOST_DEVICE constexpr TileShape forward_tile_shape(int /*head_dim*/) { return TileShape{128, 128}; }

DASH_HOST_DEVICE constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace dash
