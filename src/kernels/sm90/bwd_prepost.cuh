// The small kernels around the backward main kernel.
//   preprocess:  dpsum = rowsum(dO o O) and LSE * log2(e) per query row (padded to whole tiles), zeroed
//                semaphores and dispatch counter, and, for unordered sums only, zeroed dQ accumulators
//                (an ordered sum's rank-0 contribution stores, see bwd_dq_writer.cuh);
//   postprocess: dQ = scale * dQ_accum, converted, undoing the fragment order of the accumulator; a dQ
//                tile that no contribution reached (its rows see no key) is 0. If the main kernel gave up its dQ
//                order (buffers.order_abandoned, bwd_dq_writer.cuh), dq, dk and dv are wrong or unvouched for:
//                every element of all three becomes NaN instead, so no optimizer step can use them unseen. The
//                postprocess runs after every other kernel that writes them (bwd_launch.cuh); the check costs
//                each block one load of the flag;
//   split sum:   for GQA groups split over several jobs, dK and dV = sum of the splits, in split order.
// Varlen kernels (Config::kVarlen, and the split sum's kVarlen): the grids are the maximum problem's, each block reads
// its sequence from cu_seqlens (packed_sequence) and touches only that sequence's packed rows; workspace rows past
// the sequence's end get LSE +inf and dpsum 0, as rows past seqlen_q do in a dense batch.
#pragma once

#include <bit>
#include <cmath>
#include <type_traits>

#include <cutlass/array.h>

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/gemm.cuh"
#include "kernels/sm90/primitives.cuh"

namespace dash::sm90 {

inline constexpr int kPrepostThreads = 256;

struct PrepostParams {
  const void* out;
  const void* dout;
  const float* lse;
  void* dq;
  int64_t out_strides[3];  // batch, seq, head
  int64_t dout_strides[3];
  int64_t dq_strides[3];
  int seqlen_q;
  int heads_q;
  int real_q_tiles;
  float softmax_scale;
  bool sums_in_order;  // the schedule's dQ sums are ordered (sums_in_order(plan))
  kernels::BackwardBuffers buffers;
  PackedBatch packed;  // varlen kernels only: cu_seqlens and their bounds
  // What the postprocess fills with NaN when the launch gave up its dQ order: dk and dv as (kv_batch, kv_rows,
  // heads_kv, head_dim) tensors, a packed batch's as (1, total_k, heads_kv, head_dim).
  void* dk;
  void* dv;
  int64_t dk_strides[3];  // batch, seq, head
  int64_t dv_strides[3];
  int kv_batch;
  int kv_rows;
  int heads_kv;
};

// Every element of the (batch, rows, heads, head_dim) tensor at `data` becomes NaN; the grid's blocks, numbered
// `block` of `blocks`, share them.
template <class Element, int kHeadDim>
__device__ void fill_nan(void* data, const int64_t (&strides)[3], int batch, int rows, int heads, int block,
                         int blocks) {
  const int64_t count = static_cast<int64_t>(batch) * rows * heads * kHeadDim;
  for (int64_t i = static_cast<int64_t>(block) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(blocks) * blockDim.x) {
    const int64_t column = i % kHeadDim, head = i / kHeadDim % heads, row = i / kHeadDim / heads % rows,
                  b = i / kHeadDim / heads / rows;
    static_cast<Element*>(data)[b * strides[0] + row * strides[1] + head * strides[2] + column] = Element(NAN);
  }
}

// Where one (batch, head) slice's query rows are: how many, the row of the first in the tensors (0 in a dense
// batch, the sequence's offset in a packed one, whose batch strides are 0), and the LSE index of the first.
struct SliceRows {
  int seqlen_q;
  int64_t first_row;
  int64_t lse_first;
};

template <bool kVarlen>
__device__ SliceRows slice_rows(const PrepostParams& p, int batch, int head) {
  if constexpr (kVarlen) {
    const PackedSequence sequence = packed_sequence(p.packed, batch);
    return {sequence.lengths.seqlen_q, sequence.q_offset,
            static_cast<int64_t>(head) * p.packed.total_q + sequence.q_offset};
  } else {
    return {p.seqlen_q, 0, (static_cast<int64_t>(batch) * p.heads_q + head) * p.seqlen_q};
  }
}

// Grid (query tiles, heads_q, batch). Each row's dot product is split over kRowThreads adjacent lanes
// that each read 16 bytes of O and of dO; every lane of a warp runs the same rows, so the shuffles
// that sum a row are convergent (rows past seqlen_q contribute 0 rather than leave). kRowThreads is the
// power of two the butterfly sum needs, at least a row's 16-byte vectors: at d = 96 (12 vectors) 16 lanes, of
// which the last 4 read nothing and add 0.
template <class Config>
__global__ void __launch_bounds__(kPrepostThreads) backward_preprocess_kernel(const PrepostParams p) {
  using Element = typename Config::Element;
  using Vector = cutlass::AlignedArray<Element, 16 / sizeof(Element)>;
  constexpr int kBlockM = Config::kBlockM;
  constexpr int kRowVectors = Config::kHeadDim / Vector::kElements;
  constexpr int kRowThreads = std::bit_ceil(static_cast<unsigned>(kRowVectors));
  constexpr int kRowsPerPass = kPrepostThreads / kRowThreads;
  static_assert(kRowThreads <= 32 && kBlockM % kRowsPerPass == 0, "a row's lanes share a warp; rows split evenly");
  const int tile = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int64_t dq_tile = (static_cast<int64_t>(batch) * p.heads_q + head) * p.real_q_tiles + tile;
  const int64_t row_base = dq_tile * kBlockM;
  const int column = static_cast<int>(threadIdx.x) % kRowThreads * Vector::kElements;
  const SliceRows rows = slice_rows<Config::kVarlen>(p, batch, head);
  const auto* out = static_cast<const Element*>(p.out) + batch * p.out_strides[0] + head * p.out_strides[2] +
                    rows.first_row * p.out_strides[1] + column;
  const auto* dout = static_cast<const Element*>(p.dout) + batch * p.dout_strides[0] + head * p.dout_strides[2] +
                     rows.first_row * p.dout_strides[1] + column;
  for (int r = static_cast<int>(threadIdx.x) / kRowThreads; r < kBlockM; r += kRowsPerPass) {
    const int row = tile * kBlockM + r;
    float sum = 0.0f;
    const bool reads = kRowThreads == kRowVectors || column < Config::kHeadDim;  // a lane past the row reads nothing
    if (row < rows.seqlen_q && reads) {
      const Vector o = *reinterpret_cast<const Vector*>(out + row * p.out_strides[1]);
      const Vector d = *reinterpret_cast<const Vector*>(dout + row * p.dout_strides[1]);
      CUTE_UNROLL
      for (int i = 0; i < Vector::kElements; ++i) sum += static_cast<float>(o[i]) * static_cast<float>(d[i]);
    }
    for (int offset = kRowThreads / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (column == 0) {
      const float lse = row < rows.seqlen_q ? p.lse[rows.lse_first + row] : -INFINITY;
      // +inf makes every P of a row that sees no key (or lies past seqlen_q) exactly 0.
      p.buffers.lse_log2[row_base + r] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      p.buffers.dpsum[row_base + r] = sum;
    }
  }
  if (!p.sums_in_order) {
    float4* accum = reinterpret_cast<float4*>(p.buffers.dq_accum + dq_tile * kBlockM * Config::kHeadDim);
    for (int i = threadIdx.x; i < kBlockM * Config::kHeadDim / 4; i += kPrepostThreads)
      accum[i] = make_float4(0, 0, 0, 0);
  }
  if (threadIdx.x == 0) {
    p.buffers.dq_semaphores[dq_tile] = 0;
    if (dq_tile == 0) {
      *p.buffers.unit_counter = 0;
      *p.buffers.order_abandoned = 0;
    }
  }
}

// Grid (query tiles, heads_q, batch), one thread per MMA thread of the main kernel. The tile goes through
// shared memory so that both sides of it are coalesced: each thread reads its fragment-order float4s,
// writes the scaled, converted pairs to their (row, column) there, and after the barrier every thread
// stores 16-byte row segments. Writing the pairs straight to global memory scatters 4-byte stores over 8
// rows per instruction, half-filled sectors that made this kernel 3.6x slower (Nsight Compute).
template <class Config>
__global__ void __launch_bounds__(Config::kMmaThreads) backward_postprocess_kernel(const PrepostParams p) {
  using Element = typename Config::Element;
  using Vector = cutlass::AlignedArray<Element, 16 / sizeof(Element)>;
  using ElementPair = cutlass::AlignedArray<Element, 2>;
  constexpr int kBlockM = Config::kBlockM;
  constexpr int kHeadDim = Config::kHeadDim;
  __shared__ alignas(16) Element staged[kBlockM * kHeadDim];  // swizzled by staged_offset (gemm.cuh)

  const int tile = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int64_t dq_tile = (static_cast<int64_t>(batch) * p.heads_q + head) * p.real_q_tiles + tile;
  const int thread = threadIdx.x;
  typename Config::TiledMmadQ mma_dq;
  // Each partial is one warpgroup's fragment: thread t converts that of warpgroup t / 128 as its lane t % 128 held
  // it.
  static_assert(Config::kdQPartials * Config::kWarpGroupThreads == Config::kMmaThreads, "a partial per warpgroup");
  const int warp_group = thread / Config::kWarpGroupThreads;
  const int lane = thread % Config::kWarpGroupThreads;
  Tensor coords =
      mma_dq.get_thread_slice(thread).partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  const float4* partial = reinterpret_cast<const float4*>(p.buffers.dq_accum + dq_tile * kBlockM * kHeadDim +
                                                          warp_group * Config::kdQPartialFloats);
  // An ordered sum never wrote (nor zeroed) a tile no contribution reached; its semaphore is still 0.
  const bool reached = !p.sums_in_order || p.buffers.dq_semaphores[dq_tile] > 0;
  // Only an ordered sum waits, and so can give up its order.
  const bool abandoned = p.sums_in_order && *p.buffers.order_abandoned != 0;
  // Fragment elements (2i, 2i + 1) are adjacent columns of one row.
  constexpr int kFragmentVectors = decltype(size(coords))::value / 4;
  CUTE_UNROLL
  for (int i = 0; i < kFragmentVectors; ++i) {
    const float4 v = reached ? partial[i * Config::kWarpGroupThreads + lane] : make_float4(0, 0, 0, 0);
    const float values[4] = {v.x, v.y, v.z, v.w};
    CUTE_UNROLL
    for (int j = 0; j < 4; j += 2) {
      ElementPair pair;
      pair[0] = static_cast<Element>(values[j] * p.softmax_scale);
      pair[1] = static_cast<Element>(values[j + 1] * p.softmax_scale);
      const auto at = coords(4 * i + j);
      const int row = get<0>(at), column = get<1>(at);
      *reinterpret_cast<ElementPair*>(staged + staged_offset<kHeadDim>(row, column)) = pair;
    }
  }
  __syncthreads();

  const SliceRows rows = slice_rows<Config::kVarlen>(p, batch, head);
  auto* dq =
      static_cast<Element*>(p.dq) + batch * p.dq_strides[0] + head * p.dq_strides[2] + rows.first_row * p.dq_strides[1];
  constexpr int kRowVectors = kHeadDim / Vector::kElements;
  constexpr int kStoresPerThread = kBlockM * kRowVectors / Config::kMmaThreads;
  static_assert(kStoresPerThread * Config::kMmaThreads == kBlockM * kRowVectors, "every thread stores as many vectors");
  CUTE_UNROLL
  for (int k = 0; k < kStoresPerThread; ++k) {
    const int i = k * Config::kMmaThreads + thread;
    const int r = i / kRowVectors, column = i % kRowVectors * Vector::kElements;
    const int row = tile * kBlockM + r;
    if (row < rows.seqlen_q) {
      Vector value = *reinterpret_cast<const Vector*>(staged + staged_offset<kHeadDim>(r, column));
      if (abandoned) value.fill(Element(NAN));
      *reinterpret_cast<Vector*>(dq + row * p.dq_strides[1] + column) = value;
    }
  }
  if (abandoned) {
    const int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int blocks = gridDim.x * gridDim.y * gridDim.z;
    fill_nan<Element, kHeadDim>(p.dk, p.dk_strides, p.kv_batch, p.kv_rows, p.heads_kv, block, blocks);
    fill_nan<Element, kHeadDim>(p.dv, p.dv_strides, p.kv_batch, p.kv_rows, p.heads_kv, block, blocks);
  }
}

struct SplitSumParams {
  const float* dk_accum;
  const float* dv_accum;
  void* dk;
  void* dv;
  int64_t dk_strides[3];
  int64_t dv_strides[3];
  int splits;
  int batch;
  int heads_kv;
  int seqlen_k;
  int padded_rows;  // rows per (split, batch, head) in the accumulators
  int head_dim;
};

// The varlen split sum's parameters: the dense ones and cu_seqlens with their bounds (a type of its own, so that
// the dense kernel's parameters stay as they were).
struct PackedSplitSumParams : SplitSumParams {
  PackedBatch packed;
};

template <bool kVarlen>
using SplitSumParamsOf = std::conditional_t<kVarlen, PackedSplitSumParams, SplitSumParams>;

// Grid (ceil(seqlen_k / rows per block), heads_kv, batch); sums splits 0, 1, ... in that order. kVarlen: the rows
// of sequence `batch`, stored from its offset in the packed dk and dv (whose batch strides are 0).
template <class Element, bool kVarlen = false>
__global__ void __launch_bounds__(kPrepostThreads) sum_dkv_splits_kernel(const SplitSumParamsOf<kVarlen> p) {
  const int head = blockIdx.y, batch = blockIdx.z;
  const int rows_per_block = kPrepostThreads / p.head_dim;
  const int row = blockIdx.x * rows_per_block + static_cast<int>(threadIdx.x) / p.head_dim;
  const int col = static_cast<int>(threadIdx.x) % p.head_dim;
  int out_row = row;  // the row of dk and dv the sum goes to
  if constexpr (kVarlen) {
    const PackedSequence sequence = packed_sequence(p.packed, batch);
    if (row >= sequence.lengths.seqlen_k) return;
    out_row = sequence.k_offset + row;
  }
  if (row >= p.seqlen_k || threadIdx.x >= rows_per_block * p.head_dim) return;
  const int64_t split_stride = static_cast<int64_t>(p.batch) * p.heads_kv * p.padded_rows * p.head_dim;
  const int64_t at = ((static_cast<int64_t>(batch) * p.heads_kv + head) * p.padded_rows + row) * p.head_dim + col;
  float dk = 0.0f, dv = 0.0f;
  for (int s = 0; s < p.splits; ++s) {
    dk += p.dk_accum[s * split_stride + at];
    dv += p.dv_accum[s * split_stride + at];
  }
  static_cast<Element*>(p.dk)[batch * p.dk_strides[0] + out_row * p.dk_strides[1] + head * p.dk_strides[2] + col] =
      static_cast<Element>(dk);
  static_cast<Element*>(p.dv)[batch * p.dv_strides[0] + out_row * p.dv_strides[1] + head * p.dv_strides[2] + col] =
      static_cast<Element>(dv);
}

}  // namespace dash::sm90
