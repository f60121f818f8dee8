// wgmma helpers shared by the forward and backward kernels: issuing a warpgroup GEMM over all
// k-blocks, partitioning shared-memory operands by a warp-uniform warpgroup index, reusing an
// accumulator fragment as a register A operand, storing accumulator rows to global memory in paired
// stores (or transposed), and the fast exp2.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "kernels/sm90/warp_roles.cuh"

namespace dash::sm90 {

using namespace cute;

// The widest GMMA K-major swizzle atom whose width divides kColumns: the 128-byte swizzle (64 16-bit columns)
// wherever it fits, as at head dims 64, 128, 192 and 256, else the 64-byte (32 columns) or the 32-byte (16) one,
// as at d = 96, whose rows are not whole 128-byte atoms. wgmma and TMA read every one of them conflict-free;
// the narrower ones only take more TMA boxes per tile (one per atom width).
template <class Element, int kColumns>
CUTE_HOST_DEVICE constexpr auto k_major_swizzle_atom() {
  if constexpr (kColumns % size<1>(GMMA::Layout_K_SW128_Atom<Element>{}) == 0) {
    return GMMA::Layout_K_SW128_Atom<Element>{};
  } else if constexpr (kColumns % size<1>(GMMA::Layout_K_SW64_Atom<Element>{}) == 0) {
    return GMMA::Layout_K_SW64_Atom<Element>{};
  } else {
    static_assert(kColumns % size<1>(GMMA::Layout_K_SW32_Atom<Element>{}) == 0,
                  "rows must be whole 32-byte swizzle atoms (16 16-bit columns)");
    return GMMA::Layout_K_SW32_Atom<Element>{};
  }
}
template <class Element, int kColumns>
using KMajorSwizzleAtom = decltype(k_major_swizzle_atom<Element, kColumns>());

// C (+)= A B over every k-block, issued asynchronously as one wgmma batch; the caller waits with
// warpgroup_wait<N>() before reading C. With kZeroInit the first k-block overwrites C.
template <bool kZeroInit, class TiledMma, class TensorA, class TensorB, class TensorC>
__device__ __forceinline__ void warpgroup_gemm(TiledMma& mma, const TensorA& a, const TensorB& b, TensorC& c) {
  // A is either a shared-memory descriptor (SS wgmma) or a register fragment (RS wgmma).
  constexpr bool kAInRegisters = !is_same_v<typename TensorA::engine_type, ViewEngine<GMMA::DescriptorIterator>>;
  if constexpr (kAInRegisters) warpgroup_fence_operand(const_cast<TensorA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kAInRegisters) warpgroup_fence_operand(const_cast<TensorA&>(a));
}

// Block i of mode kMode (1 or 2) of a warpgroup GEMM's operand (MMA, M, K) or (MMA, N, K) or accumulator
// (MMA, M, N): the same tensor with that mode cut to block i alone. warpgroup_gemm over such blocks computes only
// those rows or columns and fences only their accumulator registers, so a caller that stores each block of an
// accumulator before computing the next keeps one block live.
template <int kMode, class T>
__device__ __forceinline__ auto mode_block(T&& t, int i) {
  static_assert(kMode == 1 || kMode == 2, "modes 1 and 2 are the GEMM's rows or columns");
  if constexpr (kMode == 1) {
    return make_tensor(t(_, i, _).data(), make_layout(layout<0>(t), Layout<_1>{}, layout<2>(t)));
  } else {
    return make_tensor(t(_, _, i).data(), make_layout(layout<0>(t), layout<1>(t), Layout<_1>{}));
  }
}

// The warpgroup index of MMA thread `thread`, made warp-uniform. The compiler cannot prove that
// thread / 128 is the same across a warp; a value from lane 0 it can, so what derives from it stays in
// uniform registers.
__device__ __forceinline__ int uniform_warp_group(int thread, int warp_group_threads) {
  return __shfl_sync(0xffffffffu, thread / warp_group_threads, 0);
}

// The slice of `mma` that partitions shared-memory operands (A and B descriptors) for warpgroup
// `warp_group`. Every thread of a warpgroup issues the same descriptors, so slicing by the warpgroup's
// first thread instead of by this thread keeps them uniform: no R2UR moves before each wgmma.
// Register fragments and coordinates (partition_C) still need the thread's own slice.
template <class TiledMma>
__device__ __forceinline__ auto warpgroup_operand_slice(const TiledMma& mma, int warp_group, int warp_group_threads) {
  return mma.get_thread_slice(warp_group * warp_group_threads);
}

// The accumulator layout of a 64 x N wgmma, ((2, 2, N/8), M, N'), re-read as the register A operand
// of a 64 x K wgmma with K = N: ((2, 2, 2), M, (N/16, N')). Both give each thread the same rows and
// column pairs, so the conversion moves no data.
template <class AccumulatorLayout>
__device__ __forceinline__ auto accumulator_as_operand_a(AccumulatorLayout acc) {
  auto values = layout<0>(acc);                                       // (2, 2, N/8)
  auto col_blocks = logical_divide(layout<2>(values), Layout<_2>{});  // ((2), (N/16))
  return make_layout(make_layout(layout<0>(values), layout<1>(values), layout<0>(col_blocks)), layout<1>(acc),
                     make_layout(layout<1>(col_blocks), layout<2>(acc)));
}

// An uninitialised register A operand of element type T for accumulator fragment `acc`, and a view of
// it in the accumulator's layout, so that operand_in_accumulator_layout(op, acc)(i) is acc(i)'s slot.
template <class T, class Accumulator>
__device__ __forceinline__ auto make_operand_a_for(const Accumulator& acc) {
  return make_tensor<T>(accumulator_as_operand_a(acc.layout()));
}
template <class Operand, class Accumulator>
__device__ __forceinline__ auto operand_in_accumulator_layout(Operand& operand, const Accumulator& acc) {
  return make_tensor(operand.data(), acc.layout());
}

// acc's values in element type T into their slots of `operand` (make_operand_a_for(acc)), two at a time: one
// packed conversion (F2FP.PACK_AB) per pair of neighbouring columns, which share a 32-bit register of the operand.
// Both fragments are compact and in the same storage order, so storage index k of one is slot k of the other.
// Element-wise casts leave the pairing to the compiler, and in the varlen forward kernels it converted each value
// alone and merged the halves with PRMT: 32 F2FP and 32 PRMT more per 128x128 step (sass_report.sh).
template <class T, class Accumulator, class Operand>
__device__ __forceinline__ void convert_to_operand(const Accumulator& acc, Operand& operand) {
  constexpr int kValues = decltype(size(acc))::value;
  static_assert(kValues % 2 == 0 && decltype(cosize(acc.layout()))::value == kValues &&
                    decltype(cosize(operand.layout()))::value == kValues,
                "compact fragments of pairs");
  using Converter = cutlass::NumericArrayConverter<T, float, 2>;
  CUTE_UNROLL
  for (int k = 0; k < kValues; k += 2) {
    const cutlass::Array<float, 2> pair{acc.data()[k], acc.data()[k + 1]};
    reinterpret_cast<cutlass::Array<T, 2>&>(operand.data()[k]) = Converter{}(pair);
  }
}

// Converts an fp32 accumulator fragment to a register A operand of element type T.
template <class T, class Accumulator>
__device__ __forceinline__ auto make_operand_a(const Accumulator& acc) {
  Tensor operand = make_operand_a_for<T>(acc);
  convert_to_operand<T>(acc, operand);
  return operand;
}

// 2^x with the hardware approximation (relative error ~2^-22), flushing denormals; exp2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// tanh(x) with the hardware approximation (MUFU.TANH; the PTX ISA gives a maximum relative error of about
// 2^-11), for the softcap kernels: a capped score softcap * tanh(.) is off by at most about softcap * 2^-11.
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// log2(x) with the hardware approximation (absolute error ~2^-22 near 1, relative elsewhere); log2(0) = -inf.
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The accumulator layout ((2, 2, N/8), M, N') of a 64 x N wgmma viewed as (rows, columns) of this
// thread's values: ((2, M), (2, N/8, N')). Row r and r + 8 of each 16-row slab belong to the thread.
template <class AccumulatorLayout>
__device__ __forceinline__ auto accumulator_rows_by_columns(AccumulatorLayout acc) {
  auto values = layout<0>(acc);
  return make_layout(make_layout(layout<1>(values), layout<1>(acc)),
                     make_layout(layout<0>(values), layout<2>(values), layout<2>(acc)));
}

// Stores this thread's part of a (kRows x kCols) fp32 accumulator tile of `mma` to the row-major tile
// at `tile` (row stride `row_stride` elements) as T, each row r multiplied by row_scale(r) (r indexes
// the thread's rows); rows at or past `valid_rows` are skipped. The destination is partitioned like
// the accumulator, so each row's address is computed once and its columns sit at constant offsets:
// one store per pair of adjacent columns (32 bits for 16-bit T, 64 bits for float).
template <class T, int kRows, int kCols, class TiledMma, class Accumulator, class RowScale>
__device__ __forceinline__ void store_accumulator_rows(const TiledMma& mma, int thread, const Accumulator& acc_frag,
                                                       T* tile, int64_t row_stride, int valid_rows,
                                                       RowScale row_scale) {
  using Pair = cutlass::AlignedArray<T, 2>;
  auto thr = mma.get_thread_slice(thread);
  Tensor dst_frag = thr.partition_C(
      make_tensor(make_gmem_ptr(tile), make_layout(Shape<Int<kRows>, Int<kCols>>{}, make_stride(row_stride, _1{}))));
  Tensor coords_frag = thr.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kCols>>{}));
  Tensor dst = make_tensor(dst_frag.data(), accumulator_rows_by_columns(dst_frag.layout()));
  Tensor coords = make_tensor(coords_frag.data(), accumulator_rows_by_columns(coords_frag.layout()));
  Tensor acc = make_tensor(acc_frag.data(), accumulator_rows_by_columns(acc_frag.layout()));
  CUTE_UNROLL
  for (int r = 0; r < size<0>(acc); ++r) {
    if (get<0>(coords(r, 0)) >= valid_rows) continue;
    const float scale = row_scale(r);
    CUTE_UNROLL
    for (int c = 0; c < size<1>(acc); c += 2) {
      Pair pair;
      pair[0] = static_cast<T>(acc(r, c) * scale);
      pair[1] = static_cast<T>(acc(r, c + 1) * scale);
      *reinterpret_cast<Pair*>(&dst(r, c)) = pair;
    }
  }
}

// Stores this thread's part of a (kRows x kCols) fp32 accumulator tile of `mma` transposed, element (r, c) to
// tile[c * column_stride + r] as T, multiplied by `scale`; columns at or past `valid_columns` are skipped. For the
// swapped GEMMs' dK^T and dV^T, whose columns are rows of dK and dV. A thread's neighbouring values are two
// columns, so each goes alone: a warp's store fills 16 bytes of four rows. Once per job, against the steps' GEMMs.
template <class T, int kRows, int kCols, class TiledMma, class Accumulator>
__device__ __forceinline__ void store_accumulator_transposed(const TiledMma& mma, int thread, const Accumulator& acc,
                                                             T* tile, int64_t column_stride, int valid_columns,
                                                             float scale) {
  auto thr = mma.get_thread_slice(thread);
  Tensor dst = thr.partition_C(
      make_tensor(make_gmem_ptr(tile), make_layout(Shape<Int<kRows>, Int<kCols>>{}, make_stride(_1{}, column_stride))));
  Tensor coords = thr.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kCols>>{}));
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) {
    if (get<1>(coords(i)) < valid_columns) dst(i) = static_cast<T>(acc(i) * scale);
  }
}

// Offset of (row, column) in a row-major kCols-wide staging tile of 16-bit elements whose 16-byte chunks
// are XOR-swizzled by row % 8. The 8 rows one paired store of a warp touches then hit 8 different chunks
// of the 32 banks, and so do the 8 threads that read one chunk each of a row: no bank conflicts on
// either side, and no padding.
// Rows of 96 columns (12 chunks) swizzle within groups of 4 chunks instead, by row % 4: a paired store of a
// warp then hits each chunk of a group twice, a two-way bank conflict, still without padding.
template <int kCols>
__device__ __forceinline__ int staged_offset(int row, int column) {
  constexpr int kChunk = 8;  // 16-bit elements per 16 bytes
  constexpr int kRowChunks = kCols / kChunk;
  constexpr int kSwizzledChunks = kRowChunks % 8 == 0 ? 8 : 4;  // chunks one XOR permutes
  static_assert(kCols % (kSwizzledChunks * kChunk) == 0, "the swizzle permutes whole groups of chunks of every row");
  return row * kCols + (((column / kChunk) ^ (row % kSwizzledChunks)) * kChunk) + column % kChunk;
}

template <class Roles, class T, int kRows, int kCols, class TiledMma, class Accumulator, class RowScale>
__device__ __forceinline__ void store_accumulator_rows_staged(const TiledMma& mma, int thread,
                                                              const Accumulator& acc_frag, T* staging, T* tile,
                                                              int64_t row_stride, int valid_rows, RowScale row_scale) {
  using Pair = cutlass::AlignedArray<T, 2>;
  using Vector = cutlass::AlignedArray<T, 16 / sizeof(T)>;
  constexpr int kThreads = Roles::kWarpGroupThreads;
  static_assert(kRows == kMmaWarpGroupRows * Roles::kMmaWarpGroups, "each MMA warpgroup owns 64 rows");
  static_assert(sizeof(T) == 2, "staged_offset swizzles 16-bit elements");
  const int warp_group = uniform_warp_group(thread, kThreads);
  Tensor coords_frag = mma.get_thread_slice(thread).partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kCols>>{}));
  Tensor coords = make_tensor(coords_frag.data(), accumulator_rows_by_columns(coords_frag.layout()));
  Tensor acc = make_tensor(acc_frag.data(), accumulator_rows_by_columns(acc_frag.layout()));
  cutlass::arch::NamedBarrier::sync(kThreads, Roles::kWarpGroupBarrierBase + warp_group);
  CUTE_UNROLL
  for (int r = 0; r < size<0>(acc); ++r) {
    const float scale = row_scale(r);
    const int row = get<0>(coords(r, 0));
    CUTE_UNROLL
    for (int c = 0; c < size<1>(acc); c += 2) {
      Pair pair;
      pair[0] = static_cast<T>(acc(r, c) * scale);
      pair[1] = static_cast<T>(acc(r, c + 1) * scale);
      *reinterpret_cast<Pair*>(staging + staged_offset<kCols>(row, get<1>(coords(r, c)))) = pair;
    }
  }
  cutlass::arch::NamedBarrier::sync(kThreads, Roles::kWarpGroupBarrierBase + warp_group);
  constexpr int kRowVectors = kCols / Vector::kElements;
  constexpr int kVectorsPerThread = kMmaWarpGroupRows * kRowVectors / kThreads;
  static_assert(kVectorsPerThread * kThreads == kMmaWarpGroupRows * kRowVectors, "rows split evenly over the threads");
  const int lane = thread % kThreads;
  CUTE_UNROLL
  for (int k = 0; k < kVectorsPerThread; ++k) {
    const int i = k * kThreads + lane;
    const int r = warp_group * kMmaWarpGroupRows + i / kRowVectors;
    const int column = i % kRowVectors * Vector::kElements;
    if (r < valid_rows) {
      *reinterpret_cast<Vector*>(tile + r * row_stride + column) =
          *reinterpret_cast<const Vector*>(staging + staged_offset<kCols>(r, column));
    }
  }
}

}  // namespace dash::sm90
