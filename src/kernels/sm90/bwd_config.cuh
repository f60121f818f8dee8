// Backward kernel configuration for one (head dim, element type): tile sizes, wgmma tilings, shared-
// memory layouts, the shared storage, the TMA types and the device parameters.
//
// Warp roles (384 threads): warpgroup 0 is the producer (warp 0 loads, warp 1 writes dQ partials),
// warpgroups 1 and 2 compute. Up to d = 128 MMA warpgroup w owns key/value rows [64w, 64w + 64) of the job's tile;
// at d = 192 and 256 (kSplitsKeys) both work on the 64x96 or 64x80 tile and split its keys: warpgroup w computes S
// and dP for keys [wn, wn + n) (n = 48 or 40), dV^T and dK^T for those keys over all of head_dim (swapped GEMMs),
// and dQ for head_dim columns [w d/2, (w + 1) d/2).
// Q (with the LSE) and dO (with dpsum) share one ring of stages, except at d = 192, where dO has one stage against Q's
// two and a ring of its own, which leaves its stage as soon as its last GEMM, dV's, is done (StepRings). At d = 256
// both have one stage; P and dS share one buffer (kSharesPdS).
// Invariants: shared storage within the 227 KiB a CTA may use (static_assert); the loader, the MMA warpgroups and
// the dQ writer walk the same jobs and steps (bwd_loader.cuh); the d <= 128 types are those of before the splits.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "kernels/kernel_params.hpp"
#include "kernels/sm90/gemm.cuh"
#include "kernels/sm90/gmem_tensors.cuh"
#include "kernels/sm90/pipeline.cuh"
#include "kernels/sm90/primitives.cuh"
#include "kernels/sm90/warp_roles.cuh"
#include "schedule/mask.hpp"
#include "schedule/tile_config.hpp"
#include "schedule/varlen.hpp"

namespace dash::sm90 {

using namespace cute;

// What the loader tells the other roles about each job and each step (see bwd_loader.cuh).
struct JobRecord {
  int num_steps;  // kEndOfWork when the CTA has no more work
  int batch;
  int head_kv;
  int split;
  int kv_tile;
  int head;  // schedule head
};
inline constexpr int kEndOfWork = -1;

// The varlen kernels' job record: a job of one sequence, with the sequence's mask (the plan's with the sequence's
// lengths) and its first key row in the packed k, v, dk and dv.
struct PackedJobRecord : JobRecord {
  MaskShape mask;
  int k_offset;
};

struct StepRecord {
  int q_tile;    // real query tile of this step
  int dq_index;  // dQ tile (and semaphore) the partial goes to
  int rank;      // its position in that tile's summation order, or kUnordered
};

// The backward's warp roles: one MMA warpgroup per 64 key/value rows, or two splitting the keys of one tile.
template <int kHeadDim>
using BackwardWarpRoles =
    WarpRoles<backward_splits_keys(kHeadDim) ? 2 : backward_tile_shape(kHeadDim).block_kv / kMmaWarpGroupRows>;

// kSoftcap_: the softcap kernels (bwd_scores.cuh caps the recomputed scores and multiplies dS by tanh's derivative);
// the others compile without a trace of it.
// kVarlen_: the kernels of packed varlen batches (schedule/varlen.hpp): the loader fits each unit's jobs to its
// sequence's lengths read from cu_seqlens and loads the sequence's rows at its offsets, the MMA warpgroups run the
// sequence's mask and store dK and dV clipped at its end, the pre- and postprocess kernels map the packed rows. dQ
// tiles, semaphores and the LSE and dpsum rows of the workspace keep the maximum problem's numbering. The dense
// kernels compile as before.
template <int kHeadDim_, class Element_, bool kSoftcap_ = false, bool kVarlen_ = false>
struct BackwardConfig : BackwardWarpRoles<kHeadDim_> {
  static_assert(has_backward_kernel(kHeadDim_), "no backward kernel at this head dim (schedule/tile_config.hpp)");
  // The counts this configuration's own layouts use (names of a dependent base need declaring).
  using Roles = BackwardWarpRoles<kHeadDim_>;
  using Roles::kMmaThreads;
  using Roles::kMmaWarpGroups;
  using Roles::kThreads;
  using Roles::kWarpGroupThreads;
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kSoftcap = kSoftcap_;
  static constexpr bool kVarlen = kVarlen_;
  using JobRecordType = std::conditional_t<kVarlen, PackedJobRecord, JobRecord>;
  static constexpr int kBlockM = backward_tile_shape(kHeadDim).block_q;
  static constexpr int kBlockN = backward_tile_shape(kHeadDim).block_kv;
  // d = 192 and 256: the warpgroups split the 64x96 or 64x80 tile's keys (file comment).
  static constexpr bool kSplitsKeys = backward_splits_keys(kHeadDim);
  // Query pipeline depth: two stages everywhere. At d = 256 the second fits because the dQ partials go to the dQ
  // writer by column blocks through a ring of two (kdQBufferStages), 32 KiB where a whole partial pair took 64; with
  // one Q stage the next step's Q could load only once dK^T was done, and the MMA warpgroups waited on it for 12.6% of
  // their stall samples (Nsight Compute, d = 256, 4096 tokens, full). Both changes together: backward
  // 1.055-1.066x at d = 256 (docs/HISTORY.md).
  static constexpr int kStages = 2;
  // dO pipeline depth: one stage at d = 192 too, where a second (24 KiB) would need 240 KiB.
  static constexpr int kdOStages = kSplitsKeys ? 1 : kStages;
  static constexpr int kStepRing = 8;  // step records in flight; must exceed kStages + 1 (bwd_loader.cuh)
  static constexpr int kJobSlots = 2;
  static_assert(kSplitsKeys ? kBlockM == 64 && kMmaWarpGroups == 2 && kBlockN % (8 * kMmaWarpGroups) == 0
                            : kBlockN == kMmaWarpGroupRows * kMmaWarpGroups,
                "each MMA warpgroup owns 64 key/value rows, or both share the tile and split its keys into wgmma "
                "widths (multiples of 8)");
  static_assert(kStepRing > kStages + 1, "the step ring must outlive the dQ writer's lag");
  // Keys per MMA warpgroup in the key split.
  static constexpr int kKeyColumns = kBlockN / kMmaWarpGroups;

  using BlockM = Int<kBlockM>;
  using BlockN = Int<kBlockN>;
  using HeadDim = Int<kHeadDim>;
  using Stages = Int<kStages>;
  using dOStages = Int<kdOStages>;
  using WarpGroups = Layout<Shape<Int<kMmaWarpGroups>, _1, _1>>;

  // The warpgroups' layout over a GEMM's (M, N, K) when they split N (the key split's GEMMs, and dQ at 64 rows).
  using WarpGroupsAlongN = Layout<Shape<_1, Int<kMmaWarpGroups>, _1>>;
  // S^T = K Q^T and dP^T = V dO^T: (kBlockN x kBlockM) over head_dim; the warpgroups split the key rows. In the key
  // split S = Q K^T and dP = dO V^T instead, (kBlockM x kBlockN) with the query rows as M, and the warpgroups split
  // the keys (64 x 48 or 64 x 40 each): 96 or 80 key rows are no whole number of 64-row wgmma tiles.
  using TiledMmaSdP = std::conditional_t<
      kSplitsKeys,
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<BlockM, Int<kKeyColumns>, HeadDim>>(),
                              WarpGroupsAlongN{})),
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<_64, BlockM, HeadDim>>(),
                              WarpGroups{}))>;
  // dV += P^T dO and dK += dS^T Q: (kBlockN x head_dim) over kBlockM. Up to d = 128 each warpgroup's own key rows
  // with A (P^T, dS^T) from registers. In the key split the swapped GEMMs dV^T += dO^T P and dK^T += Q^T dS:
  // (head_dim x kBlockN), each warpgroup all of head_dim (three or four 64-row wgmma tiles) for its keys, A (dO^T,
  // Q^T) the MN-major view of dO and Q, B its own keys of P and dS.
  using TiledMmadKV = std::conditional_t<
      kSplitsKeys,
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kKeyColumns>, BlockM>,
                                                   GMMA::Major::MN, GMMA::Major::K>(),
                              WarpGroupsAlongN{})),
      decltype(make_tiled_mma(
          GMMA::rs_op_selector<Element, Element, float, Shape<_64, HeadDim, BlockM>, GMMA::Major::K, GMMA::Major::MN>(),
          WarpGroups{}))>;
  // The shape of dK and dV's accumulator tiles: transposed in the key split.
  using dKVAccumulatorShape = std::conditional_t<kSplitsKeys, Shape<HeadDim, BlockN>, Shape<BlockN, HeadDim>>;
  // dQ = dS K: (kBlockM x head_dim) over kBlockN. With 128 query rows the warpgroups split the rows,
  // with 64 they split head_dim; either way each computes a 64-row partial (64 x 48 at d = 96, 64 x 96 and
  // 64 x 128 at 192 and 256). At d = 256 a warpgroup's 128 columns are four blocks of kdQColumns = 32, head_dim
  // columns [32w + 64b, 32w + 64b + 32) for b = 0..3, computed and stored one after the other: beside dK^T's and
  // dV^T's 160 registers, blocks of 64 columns (32 registers) made ptxas spill an accumulator tile and serialize
  // every wgmma, as did all 128 columns at once (64).
  static constexpr bool kdQSplitsRows = kBlockM == 64 * kMmaWarpGroups;
  static constexpr int kdQColumnBlocks = head_dim_settings(kHeadDim).backward_dq_column_blocks;
  static constexpr int kdQColumns = (kdQSplitsRows ? kHeadDim : kHeadDim / kMmaWarpGroups) / kdQColumnBlocks;
  using dQAtomShape = Shape<_64, Int<kdQColumns>, BlockN>;
  using dQWarpGroups = std::conditional_t<kdQSplitsRows, WarpGroups, WarpGroupsAlongN>;
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, dQAtomShape, GMMA::Major::MN, GMMA::Major::MN>(), dQWarpGroups{}));
  // The dQ partials a step hands to the dQ writer: one per warpgroup.
  static constexpr int kdQPartials = kMmaWarpGroups;
  static constexpr int kdQPartialFloats = kBlockM * kHeadDim / kdQPartials;  // one partial
  // The hand-off to the dQ writer goes by column blocks (a block of each warpgroup's partial per position of the dq
  // ring), kdQBufferStages blocks in flight: at d = 256 the writer reduces the first blocks while the MMA warpgroups
  // compute the next, where the whole partials (one stage) made them wait for the writer to drain the previous
  // step's for 19% of their stall samples (Nsight Compute, as above). Elsewhere one block, one stage: the whole
  // partial. At d = 192 three blocks of 32 columns through the same ring ran 0.90-0.93x (docs/HISTORY.md): its
  // 96-column dQ GEMM split into three N = 32 GEMMs costs more than the earlier hand-off gives back.
  static constexpr int kdQBlockFloats = kdQPartialFloats / kdQColumnBlocks;  // one warpgroup's block
  static constexpr int kdQBufferStages = kdQColumnBlocks > 1 ? 2 : 1;
  // Position of column block `block` of step `steps`'s dQ partials in the dq ring.
  __device__ static int dq_position(int steps, int block) { return steps * kdQColumnBlocks + block; }
  // Position of the last column block of step `steps`'s dQ partials.
  __device__ static int dq_last_position(int steps) { return dq_position(steps, kdQColumnBlocks - 1); }

  // Shared memory. Q, dO, K, V are K-major (head_dim contiguous) as TMA writes them; the MN-major B
  // operands are transposed views of the same bytes. Rows take the widest swizzle that divides them (gemm.cuh);
  // K's must also divide each warpgroup's kdQColumns, where its wgmma B operand of dQ = dS K starts: the 128-byte
  // swizzle at d = 64 and 128, the 32-byte one at d = 96 (48 columns per warpgroup), the 64-byte one at 192 (96,
  // where warpgroup 1's columns start mid-atom of a 128-byte swizzle) and 256 (blocks of 32; V shares K's layout,
  // and S = Q K^T and dP = dO V^T read them K-major either way). In the key split
  // (d = 192 and 256) Q and dO are also read as the MN-major A operands of dK^T += Q^T dS and dV^T += dO^T P, 64
  // head_dim rows per wgmma tile, whole 128-byte swizzle atoms.
  using SmemLayoutQ = decltype(tile_to_shape(KMajorSwizzleAtom<Element, kHeadDim>{}, Shape<BlockM, HeadDim, Stages>{}));
  using SmemLayoutdO =
      decltype(tile_to_shape(KMajorSwizzleAtom<Element, kHeadDim>{}, Shape<BlockM, HeadDim, dOStages>{}));
  using SmemLayoutKV = decltype(tile_to_shape(KMajorSwizzleAtom<Element, kdQColumns>{}, Shape<BlockN, HeadDim>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_layout(Shape<HeadDim, BlockM, Stages>{}, Stride<BlockM, _1, Int<kBlockM * kHeadDim>>{})));
  using SmemLayoutdOt = decltype(composition(
      SmemLayoutdO{}, make_layout(Shape<HeadDim, BlockM, dOStages>{}, Stride<BlockM, _1, Int<kBlockM * kHeadDim>>{})));
  using SmemLayoutKt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<HeadDim, BlockN>{}, Stride<BlockN, _1>{})));
  // dS, read as the MN-major A operand of dQ = dS K and written through its transpose dS^T (query columns
  // contiguous either way). One buffer per query/dO stage. In the key split P (kKeySplitP) and dS (kKeySplitdS),
  // written from S and dP's (query, key) accumulators with the transposing stmatrix, and read through the transposed
  // view as the K-major B operands of dV^T and dK^T: two buffers at d = 192, one that P and dS share at d = 256
  // (kSharesPdS), where a second would need 228 KiB. Each warpgroup's dV^T GEMM reads only its own keys' columns of
  // P, so dS may overwrite them once that GEMM is complete (bwd_mainloop_key_split.cuh).
  static constexpr bool kSharesPdS = head_dim_settings(kHeadDim).backward_shares_p_ds;
  static constexpr int kdSBuffers = !kSplitsKeys ? kStages : kSharesPdS ? 1 : 2;
  static constexpr int kKeySplitP = 0;
  static constexpr int kKeySplitdS = kSharesPdS ? 0 : 1;
  using SmemLayoutdS =
      decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{}, Shape<BlockM, BlockN, Int<kdSBuffers>>{}));
  using SmemLayoutdSt =
      decltype(composition(SmemLayoutdS{}, make_layout(Shape<BlockN, BlockM, Int<kdSBuffers>>{},
                                                       Stride<BlockM, _1, Int<kBlockM * kBlockN>>{})));

  struct SharedStorage {
    alignas(1024) array_aligned<Element, cosize_v<SmemLayoutKV>> k;
    alignas(1024) array_aligned<Element, cosize_v<SmemLayoutKV>> v;
    alignas(1024) array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) array_aligned<Element, cosize_v<SmemLayoutdO>> dout;
    alignas(1024) array_aligned<Element, cosize_v<SmemLayoutdS>> ds;  // and P in the key split
    // dQ partials' blocks: (stage, partial, the block in fragment order).
    alignas(128) array_aligned<float, kdQBufferStages * kdQPartials * kdQBlockFloats> dq;
    alignas(16) float lse_log2[kStages][kBlockM];
    alignas(16) float dpsum[kdOStages][kBlockM];
    StepRecord steps[kStepRing];
    RecordRing<JobRecordType, kJobSlots> jobs;             // loader -> MMA warpgroups and dQ writer
    StepRings<kStages, kdOStages> step_rings;              // loader -> MMA warpgroups: Q, LSE, dO, dpsum (per step)
    PipelineRing<1> kv_stages;                             // loader -> MMA warpgroups: K, V (per job)
    PipelineRing<kdQBufferStages> dq_stages[kdQPartials];  // MMA warpgroup -> dQ writer: its dQ partial's column
                                                           // blocks (per step)
  };
  static constexpr int kSharedBytes = sizeof(SharedStorage);
  static_assert(kSharedBytes <= kMaxSharedBytesPerBlock, "shared storage exceeds what one CTA may use");

  // The shared storage's tiles as both mainloops read them: Q, dO, K and V as TMA writes them (K-major), their
  // transposed views (the MN-major operands) and dS (P and dS in the key split), as dQ's A operand and transposed.
  template <class Layout>
  using SmemTensor = decltype(make_tensor(make_smem_ptr(static_cast<Element*>(nullptr)), Layout{}));
  struct SharedTensors {
    __device__ explicit SharedTensors(SharedStorage& smem)
        : q(make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQ{})),
          dout(make_tensor(make_smem_ptr(smem.dout.data()), SmemLayoutdO{})),
          k(make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutKV{})),
          v(make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutKV{})),
          qt(make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQt{})),
          doutt(make_tensor(make_smem_ptr(smem.dout.data()), SmemLayoutdOt{})),
          kt(make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutKt{})),
          ds(make_tensor(make_smem_ptr(smem.ds.data()), SmemLayoutdS{})),
          dst(make_tensor(make_smem_ptr(smem.ds.data()), SmemLayoutdSt{})) {}
    SmemTensor<SmemLayoutQ> q;
    SmemTensor<SmemLayoutdO> dout;
    SmemTensor<SmemLayoutKV> k;
    SmemTensor<SmemLayoutKV> v;
    SmemTensor<SmemLayoutQt> qt;
    SmemTensor<SmemLayoutdOt> doutt;
    SmemTensor<SmemLayoutKt> kt;
    SmemTensor<SmemLayoutdS> ds;
    SmemTensor<SmemLayoutdSt> dst;
  };

  // Each ring's stage: a 64-row tile and one float per row (the LSE, dpsum).
  static constexpr uint32_t kQStageBytes = kBlockM * kHeadDim * sizeof(Element) + kBlockM * sizeof(float);
  static constexpr uint32_t kdOStageBytes = kQStageBytes;
  static constexpr uint32_t kKVBytes = 2 * kBlockN * kHeadDim * sizeof(Element);

  // TMA over (seqlen, head_dim, heads, batch) tensors with arbitrary strides.
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor<Element>{}, take<0, 2>(SmemLayoutQ{})));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor<Element>{}, SmemLayoutKV{}));

  struct Params {
    TmaQ tma_q;
    TmaQ tma_dout;
    TmaKV tma_k;
    TmaKV tma_v;
    SchedulePlan plan;
    kernels::BackwardBuffers buffers;
    long long wait_bound_ns;      // kernels::BackwardParams's, for the dQ writer
    kernels::FaultRecord* fault;  // kernels::BackwardParams's: where a wait that gave up says so
    Element* dk;
    Element* dv;
    int64_t dk_strides[3];  // batch, seq, head (dim stride is 1)
    int64_t dv_strides[3];
    int seqlen_q;
    int seqlen_k;
    int heads_q;
    int heads_kv;
    int batch;
    float softmax_scale;
    float scale_log2;        // softmax_scale * log2(e); softcap * log2(e) in the softcap kernels
    float softcap_in;        // softcap kernels: softmax_scale / softcap, what S^T is multiplied by before the tanh
    float softcap_rcp_log2;  // softcap kernels: 1 / (softcap * log2(e)), from P's exponent back to the tanh where
                             // the MMA warpgroups keep no slope (bwd_scores.cuh, kKeepsSlope)
    // Varlen kernels: cu_seqlens and the bounds each sequence is clamped to; plan, seqlen_q, seqlen_k and batch are
    // then the maximum problem's, and the descriptors span the packed rows.
    std::conditional_t<kVarlen, PackedBatch, NoPackedBatch> packed;
  };
};

}  // namespace dash::sm90
