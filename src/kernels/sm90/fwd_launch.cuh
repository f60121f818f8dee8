// Host side of the forward pass for one (head dim, element type): the tile shape for the problem's shape
// (schedule/tile_config.hpp), TMA descriptors, parameters, and the launch (for the kernels that take their tiles from
// the counter, the counter is zeroed on the stream first; a varlen batch's padding rows are cleared and its sequences
// over the maxima poisoned after, varlen_padding.cuh, in out's element type: float32 with args.out_fp32, which takes
// no TMA descriptor). Returns the launches' cudaError_t value, or the tensor whose TMA descriptor the driver would
// refuse and the rule it breaks (kernels::LaunchResult), found from the tensors' geometry before any descriptor is
// encoded, in which case nothing is encoded or launched.
#pragma once

#include <cuda_runtime.h>

#include "kernels/kernel_params.hpp"
#include "kernels/sm90/fwd_config.cuh"
#include "kernels/sm90/fwd_kernel.cuh"
#include "kernels/sm90/gmem_tensors.cuh"
#include "kernels/sm90/varlen_padding.cuh"

namespace dash::sm90 {

// The paired kernels' launch (Config::kPaired): clusters of two CTAs, as many as run at once on the SMs the call
// may use (a cluster takes two SMs of one GPC, so fewer may fit than half the SMs), and no more than the pairs of
// tiles. The deal needs both CTAs of a pair to load the same key/value tiles: every tile equally long (a full mask)
// and an even number of query tiles per head, which forward_may_pair ensured; a problem without them is refused
// rather than launched into a wait that never ends.
template <class Config>
cudaError_t launch_pairs(const typename Config::Params& p, int tiles, int resident, cudaStream_t stream) {
  constexpr int kPair = Config::kClusterCtas;
  if (!forward_deals_tiles(p.tiles.mask) || p.tiles.q_tiles() % kPair != 0) return cudaErrorInvalidValue;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kPair;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(Config::kThreads);
  config.dynamicSmemBytes = Config::kSharedBytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  config.gridDim = dim3(static_cast<unsigned>(kPair));  // the query reads the cluster's shape, not the grid's size
  cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, forward_kernel<Config>, &config);
  if (err != cudaSuccess) return err;
  if (clusters * kPair > resident) clusters = resident / kPair;
  if (clusters * kPair > tiles) clusters = tiles / kPair;
  if (clusters < 1) return cudaErrorInvalidConfiguration;
  config.gridDim = dim3(static_cast<unsigned>(clusters * kPair));
  return cudaLaunchKernelEx(&config, forward_kernel<Config>, p);
}

template <int kHeadDim, class Element, bool kSoftcap, int kBlockQ, int kBlockKv, bool kLeftBounded = false,
          bool kVarlen = false, bool kPaired = false, bool kDealsTiles = false>
kernels::LaunchResult launch_forward_tiles(const kernels::ForwardParams& params, cudaStream_t stream) {
  const ForwardArgs& a = params.args;
  using Config =
      ForwardConfig<kHeadDim, Element, kBlockQ, kBlockKv, kSoftcap, kLeftBounded, kVarlen, kPaired, kDealsTiles>;
  const AttentionShape& shape = a.shape;
  typename Config::Params p{};
  const auto gmem = [&](const void* data, int64_t seqlen, int64_t total_rows, int64_t heads, const Strides& strides) {
    return make_gmem_call_tensor<Element, kHeadDim, kVarlen>(data, seqlen, total_rows, heads, shape.batch, strides);
  };
  const GmemTensor<Element> q = gmem(a.q.data, shape.seqlen_q, a.varlen.total_q, shape.heads_q, a.q.strides);
  const GmemTensor<Element> k = gmem(a.k.data, shape.seqlen_k, a.varlen.total_k, shape.heads_kv, a.k.strides);
  const GmemTensor<Element> v = gmem(a.v.data, shape.seqlen_k, a.varlen.total_k, shape.heads_kv, a.v.strides);
  const GmemTensor<Element> o = gmem(a.out.data, shape.seqlen_q, a.varlen.total_q, shape.heads_q, a.out.strides);
  // Before any descriptor is encoded: the driver's refusal would only be printed, and the kernel would get it.
  // A float32 out takes no descriptor: the epilogue stores it from the fragment (fwd_epilogue.cuh).
  TmaRefusal refusal = first_tma_refusal<Element>({{q, "q"}, {k, "k"}, {v, "v"}});
  if constexpr (Config::kStagedO) {
    if (refusal.tensor == nullptr && !a.out_fp32) refusal = first_tma_refusal<Element>({{o, "out"}});
  }
  if (refusal.tensor != nullptr) return refused(refusal);
  const auto kv_tile_layout = take<0, 2>(typename Config::SmemLayoutKV{});
  p.tma_q = make_tma_copy(SM90_TMA_LOAD{}, q, typename Config::SmemLayoutQ{});
  p.tma_k = make_tma_copy(typename Config::TmaKVLoad{}, k, kv_tile_layout, Int<Config::kClusterCtas>{});
  p.tma_v = make_tma_copy(typename Config::TmaKVLoad{}, v, kv_tile_layout, Int<Config::kClusterCtas>{});
  if constexpr (Config::kStagedO) {
    if (!a.out_fp32) p.tma_o = make_tma_copy(SM90_TMA_STORE{}, o, take<0, 2>(typename Config::SmemLayoutO{}));
  }
  if constexpr (kVarlen) {
    const VarlenBatch& packed = a.varlen;
    p.packed = PackedBatch{packed.cu_seqlens_q,
                           packed.cu_seqlens_k,
                           static_cast<int>(packed.total_q),
                           static_cast<int>(packed.total_k),
                           static_cast<int>(shape.seqlen_q),
                           static_cast<int>(shape.seqlen_k),
                           packed.keys_within_queries};
  }
  p.out = a.out_fp32 ? nullptr : static_cast<Element*>(a.out.data);
  p.out_f32 = a.out_fp32 ? static_cast<float*>(a.out.data) : nullptr;
  copy_strides(p.out_strides, a.out.strides);
  p.lse = a.lse;
  p.tile_counter = Config::kDealsTiles ? nullptr : params.tile_counter;
  // The planner's canonical mask (mask.hpp), so the forward and the backward run one mask.
  const MaskShape mask = canonical_mask(static_cast<int>(shape.seqlen_q), static_cast<int>(shape.seqlen_k),
                                        shape.causal, shape.window_left, shape.window_right);
  const int heads_per_group = forward_heads_per_group(
      mask.causal, shape.seqlen_k, kHeadDim, static_cast<int>(sizeof(Element)), static_cast<int>(shape.heads_q),
      static_cast<int>(shape.heads_kv), static_cast<int>(shape.batch));
  p.tiles = ForwardTileOrder{
      mask,           Config::kBlockM, Config::kBlockN, static_cast<int>(shape.heads_q), static_cast<int>(shape.batch),
      heads_per_group};
  p.heads_kv = static_cast<int>(shape.heads_kv);
  p.scale_log2 = shape.softmax_scale * kLog2e;
  if constexpr (kSoftcap) {
    // The mainloop keeps tanh(S * scale / softcap), the capped score over softcap: the softmax's exponent
    // scale becomes softcap * log2(e), and the LSE comes out in capped-score units.
    p.scale_log2 = shape.softcap * kLog2e;
    p.softcap_in = shape.softmax_scale / shape.softcap;
  }

  if constexpr (!Config::kDealsTiles) {
    const cudaError_t err = cudaMemsetAsync(params.tile_counter, 0, sizeof(int), stream);
    if (err != cudaSuccess) return launched(err);
  }
  auto kernel = forward_kernel<Config>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kSharedBytes);
  if (err != cudaSuccess) return launched(err);
  const int tiles = p.tiles.num_tiles();
  const int resident = params.num_sms * Config::kCtasPerSm;  // CTAs that run at once on the SMs the call may use
  if constexpr (Config::kPaired) {
    err = launch_pairs<Config>(p, tiles, resident, stream);
    if (err != cudaSuccess) return launched(err);
  } else {
    const int grid = tiles < resident ? tiles : resident;
    kernel<<<grid, Config::kThreads, Config::kSharedBytes, stream>>>(p);
  }
  if constexpr (kVarlen) {
    err = cudaGetLastError();
    if (err != cudaSuccess) return launched(err);
    // out's padding rows cleared and over-long sequences poisoned in its own element type.
    const auto finish = [&](auto element) {
      using OutElement = decltype(element);
      const PaddingRows<OutElement> rows[] = {
          padding_rows<OutElement>(a.out, shape.heads_q, kHeadDim, a.varlen.total_q, /*keys=*/false, a.lse)};
      return launched(finish_varlen_rows(
          rows, sequence_guard(shape, a.varlen, params.fault, kernels::FaultPass::kForward), stream));
    };
    return a.out_fp32 ? finish(float{}) : finish(Element{});
  }
  return launched(cudaGetLastError());
}

// The dense kernels of one tile shape without a left window bound, for masks of either kind: the dealt kernel where
// every tile is equally long (a full mask), else the counter's (forward_tile_order.hpp says why). The short and wide
// tiles and the CTA pairs run under a full mask only and launch their dealt kernel directly: no counter kernel of
// theirs is compiled.
template <int kHeadDim, class Element, bool kSoftcap, int kBlockQ, int kBlockKv>
kernels::LaunchResult launch_dealt_or_counted(const kernels::ForwardParams& params, const MaskShape& mask,
                                              cudaStream_t stream) {
  if (forward_deals_tiles(mask)) {
    return launch_forward_tiles<kHeadDim, Element, kSoftcap, kBlockQ, kBlockKv, false, false, false, true>(params,
                                                                                                           stream);
  }
  return launch_forward_tiles<kHeadDim, Element, kSoftcap, kBlockQ, kBlockKv>(params, stream);
}

// The forward of a dense batch, or with kVarlen of a packed varlen batch (args.varlen): the kernel
// forward_kernel_choice picks (schedule/tile_config.hpp says why), with the tile order, grid and mask of the maximum
// problem, each tile fitted to its sequence in the kernel. The `if constexpr` guards compile only the kernels the
// choice can pick for this instance: no short, tall or wide varlen kernel, no short or wide softcap kernel. A left
// bound takes kernels of their own (fwd_config.cuh): testing it at run time in the others' masked steps cost 3-4% at
// 512-1024 causal tokens (same-run A/B on the H200, docs/HISTORY.md), and branching between two sets of step loops in
// one kernel made the d = 128 kernels spill. The paired kernels (forward_may_pair) are compiled only in builds with
// DASH_FORWARD_PAIRED_CTAS.
template <int kHeadDim, class Element, bool kSoftcap, bool kVarlen = false>
kernels::LaunchResult launch_forward(const kernels::ForwardParams& params, cudaStream_t stream) {
  const AttentionShape& shape = params.args.shape;
  const MaskShape mask = canonical_mask(static_cast<int>(shape.seqlen_q), static_cast<int>(shape.seqlen_k),
                                        shape.causal, shape.window_left, shape.window_right);
  const ForwardKernelChoice choice =
      forward_kernel_choice(kHeadDim, mask.causal, mask.window.left >= 0, mask.window.right >= 0, kSoftcap, kVarlen,
                            shape.seqlen_q, shape.seqlen_k);
  constexpr TileShape kBase = forward_base_tile_shape(kHeadDim);
  constexpr bool kDealt = true;  // the kernels launched only under a full mask (launch_dealt_or_counted)
  if (choice.left_bounded) {
    return launch_forward_tiles<kHeadDim, Element, kSoftcap, kBase.block_q, kBase.block_kv, true, kVarlen>(params,
                                                                                                           stream);
  }
  if constexpr (forward_has_short_tiles(kHeadDim) && !kSoftcap && !kVarlen) {
    if (choice.tile.block_q == kForwardShortBlockQ) {
      constexpr TileShape kShort = forward_short_tile_shape();
      return launch_forward_tiles<kHeadDim, Element, kSoftcap, kShort.block_q, kShort.block_kv, false, false, false,
                                  kDealt>(params, stream);
    }
  }
  if constexpr (forward_has_tall_tiles(kHeadDim) && !kVarlen) {
    if (choice.tile.block_q == kForwardTallBlockQ) {
      return launch_dealt_or_counted<kHeadDim, Element, kSoftcap, kForwardTallBlockQ, kBase.block_kv>(params, mask,
                                                                                                      stream);
    }
  }
  if constexpr (kForwardPairedCtasBuilt && forward_has_paired_ctas(kHeadDim) && !kSoftcap && !kVarlen) {
    // A pair takes two SMs: with an sm_margin that leaves one, the unpaired kernel runs.
    if (choice.paired && params.num_sms >= kForwardPairCtas) {
      constexpr bool kPaired = true;
      if constexpr (forward_has_wide_tiles(kHeadDim)) {
        if (choice.tile.block_kv == kForwardWideBlockKv) {
          return launch_forward_tiles<kHeadDim, Element, kSoftcap, kForwardBlockQ, kForwardWideBlockKv, false, false,
                                      kPaired, kDealt>(params, stream);
        }
      }
      return launch_forward_tiles<kHeadDim, Element, kSoftcap, kBase.block_q, kBase.block_kv, false, false, kPaired,
                                  kDealt>(params, stream);
    }
  }
  if constexpr (forward_has_wide_tiles(kHeadDim) && !kSoftcap && !kVarlen) {
    if (choice.tile.block_kv == kForwardWideBlockKv) {
      return launch_forward_tiles<kHeadDim, Element, kSoftcap, kForwardBlockQ, kForwardWideBlockKv, false, false, false,
                                  kDealt>(params, stream);
    }
  }
  if constexpr (kVarlen) {
    return launch_forward_tiles<kHeadDim, Element, kSoftcap, kBase.block_q, kBase.block_kv, false, true>(params,
                                                                                                         stream);
  } else {
    return launch_dealt_or_counted<kHeadDim, Element, kSoftcap, kBase.block_q, kBase.block_kv>(params, mask, stream);
  }
}

template <int kHeadDim, class Element, bool kSoftcap>
kernels::LaunchResult launch_forward_varlen(const kernels::ForwardParams& params, cudaStream_t stream) {
  return launch_forward<kHeadDim, Element, kSoftcap, true>(params, stream);
}

}  // namespace dash::sm90
