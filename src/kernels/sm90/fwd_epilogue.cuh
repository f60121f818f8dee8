// Forward epilogue, per MMA thread: O / l to the output in its element type and the LSE, for the query
// tile's rows before seqlen_q.
#pragma once

#include <cmath>

#include "kernels/sm90/fwd_config.cuh"
#include "kernels/sm90/gemm.cuh"

namespace dash::sm90 {

template <class Config>
struct ForwardEpilogue {
  using Element = typename Config::Element;
  using Params = typename Config::Params;
  using SharedStorage = typename Config::SharedStorage;
  static constexpr int kBlockM = Config::kBlockM;

  // O / l in the output type and LSE = (m * c + log2 l) ln 2 (natural log); -inf and O = 0 for rows that
  // see no key. Rows past seqlen_q are not written.
  //
  // Invariant: the quad shuffles run in every lane, before any lane leaves its row. A row past
  // seqlen_q can share a warp with rows before it (seqlen_q need not be a multiple of 8), and a
  // full-mask shuffle that some lanes skip is undefined behaviour: on the H200 it hung the kernel.
  template <class Out>
  __device__ static void store(const Params& p, SharedStorage& smem, const ForwardTileRecord& tile,
                               const Out& out_frag, const float* row_max, const float* row_sum, int thread) {
    typename Config::TiledMmaO mma_o;
    constexpr int kRows = decltype(size<0>(accumulator_rows_by_columns(out_frag.layout())))::value;
    constexpr float kLn2 = 0.6931471805599453f;
    float sum[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      // Each row's sum is spread over the four threads of a quad.
      sum[r] = row_sum[r];
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    }
    const int row0 = tile.q_tile * kBlockM;
    const int valid_rows = p.tiles.mask.seqlen_q - row0;
    Element* o_tile = p.out + tile.batch * p.out_strides[0] + tile.head * p.out_strides[2] + row0 * p.out_strides[1];
    const auto inverse_sum = [&](int r) { return sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f; };
    if constexpr (Config::kStagedO) {
      store_accumulator_rows_staged<Config, Element, kBlockM, Config::kHeadDim>(
          mma_o, thread, out_frag, smem.o_staging.data(), o_tile, p.out_strides[1], valid_rows, inverse_sum);
    } else {
      store_accumulator_rows<Element, kBlockM, Config::kHeadDim>(mma_o, thread, out_frag, o_tile, p.out_strides[1],
                                                                 valid_rows, inverse_sum);
    }

    // LSE: written by the thread that holds column 0 of the row.
    Tensor coords_frag = mma_o.get_thread_slice(thread).partition_C(
        make_identity_tensor(Shape<Int<kBlockM>, Int<Config::kHeadDim>>{}));
    Tensor coords = make_tensor(coords_frag.data(), accumulator_rows_by_columns(coords_frag.layout()));
    float* lse = p.lse + (static_cast<int64_t>(tile.batch) * p.tiles.heads_q + tile.head) * p.tiles.mask.seqlen_q + row0;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = get<0>(coords(r, 0));
      if (row >= valid_rows || get<1>(coords(r, 0)) != 0) continue;
      lse[row] = sum[r] > 0.0f ? fmaf(row_max[r], p.scale_log2, __log2f(sum[r])) * kLn2 : -INFINITY;
    }
  }
};

}  // namespace dash::sm90
