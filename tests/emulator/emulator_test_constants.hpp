// What the emulator's tests (test_emulator.cpp, test_varlen_emulator.cpp) share: the tolerance of their float32
// tiles against the float64 reference, and the small head dim and tiles that give many tiles on shapes the CPU
// runs in milliseconds.
#pragma once

#include "schedule/tile_config.hpp"

namespace dash {

// Float32 tiles over inputs in [-1, 1] with at most a few hundred keys per row: the worst normwise error seen is
// about 1e-6; ten times that leaves room for other shapes, and still fails loudly on any real mistake (a missing
// or doubled contribution is an O(1) error).
inline constexpr double kFloat32Tolerance = 1e-5;
inline constexpr int kHeadDim = 16;
inline constexpr TileShape kSmallTiles{16, 32};

}  // namespace dash
