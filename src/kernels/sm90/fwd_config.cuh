// Forward kernel configuration for one (head dim, element type, tile shape): wgmma tilings, shared-memory
// layouts, shared storage, TMA types and device parameters.
//
// Warp roles: warpgroup 0 warp 0 loads Q once per tile and streams K, V; each MMA warpgroup owns 64
// query rows of the tile and runs the online softmax (three MMA warpgroups and 512 threads on the 192-row
// tiles, two and 384 on the 128-row ones; schedule/tile_config.hpp says which shapes take which).
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
#include "schedule/forward_tile_order.hpp"
#include "schedule/tile_config.hpp"
#include "schedule/varlen.hpp"

namespace dash::sm90 {

using namespace cute;

// What the loader tells the MMA warpgroups about each query tile (schedule/forward_tile_order.hpp);
// kv_tiles == kEndOfTiles when the CTA has no more tiles.
using ForwardTileRecord = ForwardTile;
inline constexpr int kEndOfTiles = -1;

// The varlen kernels' record: a query tile of one sequence, with the sequence's own mask (the plan's with the
// sequence's lengths) and where its query rows start in the packed q, out and LSE. kv_first and kv_tiles are the
// sequence's.
struct PackedForwardTileRecord : ForwardTile {
  MaskShape mask;
  int q_offset;
};

// The forward's warp roles for query tiles of kBlockQ rows: one MMA warpgroup per 64 rows, and two CTAs per SM for
// the short tiles' one (schedule/tile_config.hpp).
template <int kBlockQ>
using ForwardWarpRoles = WarpRoles<kBlockQ / kMmaWarpGroupRows, forward_ctas_per_sm(kBlockQ)>;

// kBlockQ_ x kBlockKv_: one of the forward's tile shapes (schedule/tile_config.hpp), chosen per shape at
// launch.
// kSoftcap_: the softcap kernels (fwd_mainloop.cuh caps the scores); the others compile without a trace of it.
// kLeftBounded_: the kernels for a sliding window with a left bound, whose masked steps also hide the keys before
// each row's first; the others carry no left-end test.
// kVarlen_: the kernels of packed varlen batches (schedule/varlen.hpp): the loader reads each tile's sequence from
// cu_seqlens and loads its rows at the sequence's offset, the mainloop runs the sequence's mask, and the epilogue
// stores a warpgroup's O rows with TMA where they all lie in the sequence, and the sequence's last, partial rows
// with predicated stores (a TMA store clips only at the tensor's end, and the next sequence's rows follow). The
// dense kernels compile as before.
// kPaired_: the CTA pairs (schedule/tile_config.hpp, forward_may_pair): thread-block clusters of two CTAs, each loading
// half of every K and V tile into both by TMA multicast, so their K and V rings are MulticastRings; the launch runs
// them only on dense full-mask problems with an even number of query tiles per head, which the round-robin deal
// gives each pair as one head's neighbouring tiles, so that both CTAs load the same key/value tiles in one order.
// kDealsTiles_: the CTAs deal the tiles among themselves round robin (ForwardTileOrder::dealt_tile) rather than take
// them from the global counter, which the launch must zero first; the launch runs these kernels where every tile is
// equally long (forward_deals_tiles). A compile-time choice: the dealt indices follow from blockIdx.x and
// gridDim.x, which the compiler keeps in uniform registers with all that derives from them, where a run-time choice
// beside the counter's atomic result kept them in vector registers and made the loader spill (docs/HISTORY.md).
template <int kHeadDim_, class Element_, int kBlockQ_, int kBlockKv_, bool kSoftcap_ = false,
          bool kLeftBounded_ = false, bool kVarlen_ = false, bool kPaired_ = false, bool kDealsTiles_ = false>
struct ForwardConfig : ForwardWarpRoles<kBlockQ_> {
  // The counts this configuration's own layouts use (names of a dependent base need declaring).
  using Roles = ForwardWarpRoles<kBlockQ_>;
  using Roles::kCtasPerSm;
  using Roles::kMmaThreads;
  using Roles::kMmaWarpGroups;
  using Roles::kThreads;
  using Roles::kWarpGroupThreads;
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kSoftcap = kSoftcap_;
  static constexpr bool kLeftBounded = kLeftBounded_;
  static constexpr bool kVarlen = kVarlen_;
  using TileRecord = std::conditional_t<kVarlen, PackedForwardTileRecord, ForwardTileRecord>;
  static constexpr bool kDealsTiles = kDealsTiles_;
  static_assert(!kDealsTiles || forward_may_deal_tiles(kVarlen, kLeftBounded),
                "only dense kernels without a left window bound deal their tiles");
  static constexpr bool kPaired = kPaired_;
  static constexpr int kClusterCtas = kPaired ? kForwardPairCtas : 1;
  static_assert(!kPaired ||
                    (kDealsTiles && !kSoftcap && forward_has_paired_ctas(kHeadDim_) && kBlockQ_ == kForwardBlockQ),
                "CTA pairs only where forward_may_pair allows them, on tiles the CTAs deal among themselves");
  static constexpr int kBlockM = kBlockQ_;
  static constexpr int kBlockN = kBlockKv_;
  static constexpr int kStages = 2;  // key/value pipeline depth
  static constexpr int kTileSlots = 2;
  static_assert(kBlockM == kMmaWarpGroupRows * kMmaWarpGroups, "each MMA warpgroup owns 64 query rows");

  using BlockM = Int<kBlockM>;
  using BlockN = Int<kBlockN>;
  using HeadDim = Int<kHeadDim>;
  using Stages = Int<kStages>;
  using WarpGroups = Layout<Shape<Int<kMmaWarpGroups>, _1, _1>>;

  // S = Q K^T: (kBlockM x kBlockN) over head_dim.
  using TiledMmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, BlockN, HeadDim>>(), WarpGroups{}));
  // O += P V: (kBlockM x head_dim) over kBlockN, P from registers.
  using TiledMmaO = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, HeadDim, BlockN>, GMMA::Major::K, GMMA::Major::MN>(),
      WarpGroups{}));

  // Rows of head_dim elements, in the widest swizzle that divides them (gemm.cuh: 128 bytes but at d = 96).
  using SwizzleAtom = KMajorSwizzleAtom<Element, kHeadDim>;
  using SmemLayoutQ = decltype(tile_to_shape(SwizzleAtom{}, Shape<BlockM, HeadDim>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SwizzleAtom{}, Shape<BlockN, HeadDim, Stages>{}));
  // V^T: the MN-major B operand of O += P V, a view of V's bytes.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{}, make_layout(Shape<HeadDim, BlockN, Stages>{}, Stride<BlockN, _1, Int<kBlockN * kHeadDim>>{})));

  // O leaves through a staging tile and a TMA store where shared memory allows it, and otherwise straight from the
  // accumulator fragment (128x176 at d = 128: Q, K and V take 208 KiB). Staging it in the V ring instead, as FA3
  // does, made the next tile's first V wait for the epilogue and all MMA warpgroups meet before it: 3-10% slower
  // at 1024-16384 keys (A/B, docs/HISTORY.md). Each MMA warpgroup stages its own 64 rows in the 128-byte
  // swizzled layout (64-byte at d = 96) that its TMA store reads.
  using SmemLayoutO =
      decltype(tile_to_shape(SwizzleAtom{}, Shape<Int<kMmaWarpGroupRows>, HeadDim, Int<kMmaWarpGroups>>{}));
  struct NoStaging {};

  // The K and V rings, and the arrivals that release one of their stages: every MMA thread's, or in a pair each MMA
  // warpgroup's of both CTAs (MulticastRing).
  using KvRing =
      std::conditional_t<kPaired, MulticastRing<kStages, kClusterCtas, kWarpGroupThreads>, PipelineRing<kStages>>;
  static constexpr int kKvReleaseArrivals = kPaired ? kMmaWarpGroups * kClusterCtas : kMmaThreads;

  template <bool kStaged>
  struct Storage {
    alignas(1024) array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) array_aligned<Element, cosize_v<SmemLayoutKV>> k;
    alignas(1024) array_aligned<Element, cosize_v<SmemLayoutKV>> v;
    std::conditional_t<kStaged, array_aligned<Element, cosize_v<SmemLayoutO>, 1024>, NoStaging> o_staging;
    RecordRing<TileRecord, kTileSlots> tiles;  // loader -> MMA warpgroups
    PipelineRing<1> q_stages;                  // loader -> MMA warpgroups: Q (per query tile)
    // K and V of each key/value tile visited, in rings of their own: K_j is free once S_j is done, while
    // V_j is read until O += P_j V_j, which the mainloop issues one tile later (fwd_mainloop.cuh).
    KvRing k_stages;  // loader -> MMA warpgroups (of both CTAs of a pair)
    KvRing v_stages;  // loader -> MMA warpgroups (of both CTAs of a pair)
  };
  static constexpr bool kStagedO = fits_shared_memory(sizeof(Storage<true>), kCtasPerSm);
  using SharedStorage = Storage<kStagedO>;
  static constexpr int kSharedBytes = sizeof(SharedStorage);
  static_assert(fits_shared_memory(kSharedBytes, kCtasPerSm),
                "shared storage exceeds what one CTA may use, or what the CTAs meant to share an SM may");
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKVTileBytes = kBlockN * kHeadDim * sizeof(Element);  // one K or V tile

  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor<Element>{}, SmemLayoutQ{}));
  // K and V: in a pair, each CTA's TMA loads its half of the tile (CuTe splits the box) into both CTAs.
  using TmaKVLoad = std::conditional_t<kPaired, SM90_TMA_LOAD_MULTICAST, SM90_TMA_LOAD>;
  using TmaKV =
      decltype(make_tma_copy(TmaKVLoad{}, GmemTensor<Element>{}, take<0, 2>(SmemLayoutKV{}), Int<kClusterCtas>{}));
  // One MMA warpgroup's 64 rows of O, from its staging tile; none without staging.
  using TmaO = std::conditional_t<
      kStagedO, decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensor<Element>{}, take<0, 2>(SmemLayoutO{}))), NoStaging>;

  struct Params {
    TmaQ tma_q;
    TmaKV tma_k;
    TmaKV tma_v;
    TmaO tma_o;
    Element* out;
    // Null, or out itself as float32 (ForwardArgs::out_fp32): the epilogue then stores O / l unrounded from the
    // accumulator fragment, never through the staging tile and tma_o (a run-time branch of the epilogue alone, so
    // the step loop and the instance count stay as they are). out_strides are then in float32 elements.
    float* out_f32;
    int64_t out_strides[3];  // batch, seq, head
    float* lse;
    int* tile_counter;       // zeroed by the launch; null where the CTAs deal the tiles (kDealsTiles)
    ForwardTileOrder tiles;  // the mask, the tile shape, heads_q and batch
    int heads_kv;
    float scale_log2;  // softmax_scale * log2(e); softcap * log2(e) in the softcap kernels
    float softcap_in;  // softcap kernels: softmax_scale / softcap, what S is multiplied by before the tanh
    // Varlen kernels: cu_seqlens and the bounds each sequence is clamped to; tiles.mask and tiles.batch are then
    // the maximum problem's (its tile order), and the q, k, v, out descriptors span the packed rows.
    std::conditional_t<kVarlen, PackedBatch, NoPackedBatch> packed;
  };
};

}  // namespace dash::sm90
