// Host side of the backward pass for one (head dim, element type): builds the TMA descriptors and
// kernel parameters from the API's BackwardParams and enqueues preprocess, main kernel, postprocess
// (and the GQA split sum; for a varlen batch, the clearing of its padding rows, varlen_padding.cuh) on the
// stream. Returns a cudaError_t value.
#pragma once

#include <cuda_runtime.h>

#include "kernels/kernel_params.hpp"
#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/gmem_tensors.cuh"
#include "kernels/sm90/bwd_kernel.cuh"
#include "kernels/sm90/bwd_prepost.cuh"
#include "kernels/sm90/varlen_padding.cuh"

namespace dash::sm90 {

// kVarlen: a packed varlen batch (args.varlen) on a varlen plan (plan_varlen_backward): the maximum problem's grids
// and workspace, the descriptors over the packed rows, each sequence read from cu_seqlens in the kernels.
template <int kHeadDim, class Element, bool kSoftcap, bool kVarlen = false>
int launch_backward(const kernels::BackwardParams& params, cudaStream_t stream) {
  const BackwardArgs& a = params.args;
  using Config = BackwardConfig<kHeadDim, Element, kSoftcap, kVarlen>;
  const AttentionShape& shape = a.shape;
  const TiledProblem& problem = params.plan.problem;

  typename Config::Params p{};
  const auto q_tile_layout = take<0, 2>(typename Config::SmemLayoutQ{});
  PackedBatch packed{};
  if constexpr (kVarlen) {
    const VarlenBatch& v = a.varlen;
    p.tma_q = make_tma_copy(SM90_TMA_LOAD{}, make_gmem_packed<Element, kHeadDim>(a.q.data, v.total_q, shape.heads_q, a.q.strides), q_tile_layout);
    p.tma_dout = make_tma_copy(SM90_TMA_LOAD{}, make_gmem_packed<Element, kHeadDim>(a.dout.data, v.total_q, shape.heads_q, a.dout.strides), q_tile_layout);
    p.tma_k = make_tma_copy(SM90_TMA_LOAD{}, make_gmem_packed<Element, kHeadDim>(a.k.data, v.total_k, shape.heads_kv, a.k.strides), typename Config::SmemLayoutKV{});
    p.tma_v = make_tma_copy(SM90_TMA_LOAD{}, make_gmem_packed<Element, kHeadDim>(a.v.data, v.total_k, shape.heads_kv, a.v.strides), typename Config::SmemLayoutKV{});
    packed = PackedBatch{v.cu_seqlens_q, v.cu_seqlens_k, static_cast<int>(v.total_q), static_cast<int>(v.total_k),
                         static_cast<int>(shape.seqlen_q), static_cast<int>(shape.seqlen_k), v.keys_within_queries};
    p.packed = packed;
  } else {
    p.tma_q = make_tma_copy(SM90_TMA_LOAD{}, make_gmem_bshd<Element, kHeadDim>(a.q.data, shape.seqlen_q, shape.heads_q, shape.batch, a.q.strides), q_tile_layout);
    p.tma_dout = make_tma_copy(SM90_TMA_LOAD{}, make_gmem_bshd<Element, kHeadDim>(a.dout.data, shape.seqlen_q, shape.heads_q, shape.batch, a.dout.strides), q_tile_layout);
    p.tma_k = make_tma_copy(SM90_TMA_LOAD{}, make_gmem_bshd<Element, kHeadDim>(a.k.data, shape.seqlen_k, shape.heads_kv, shape.batch, a.k.strides), typename Config::SmemLayoutKV{});
    p.tma_v = make_tma_copy(SM90_TMA_LOAD{}, make_gmem_bshd<Element, kHeadDim>(a.v.data, shape.seqlen_k, shape.heads_kv, shape.batch, a.v.strides), typename Config::SmemLayoutKV{});
  }
  p.plan = params.plan;
  p.buffers = params.buffers;
  p.wait_bound_ns = params.wait_bound_ns;
  p.wait_timeout = params.wait_timeout;
  p.dk = static_cast<Element*>(a.dk.data);
  p.dv = static_cast<Element*>(a.dv.data);
  copy_strides(p.dk_strides, a.dk.strides);
  copy_strides(p.dv_strides, a.dv.strides);
  p.seqlen_q = static_cast<int>(shape.seqlen_q);
  p.seqlen_k = static_cast<int>(shape.seqlen_k);
  p.heads_q = static_cast<int>(shape.heads_q);
  p.heads_kv = static_cast<int>(shape.heads_kv);
  p.batch = static_cast<int>(shape.batch);
  p.softmax_scale = shape.softmax_scale;
  p.scale_log2 = shape.softmax_scale * kLog2e;
  if constexpr (kSoftcap) {
    // As in the forward (fwd_launch.cuh): P = exp2(tanh(S * scale / softcap) * softcap * log2(e) - LSE * log2(e)).
    p.scale_log2 = shape.softcap * kLog2e;
    p.softcap_in = shape.softmax_scale / shape.softcap;
    p.softcap_rcp_log2 = 1.0f / p.scale_log2;
  }

  PrepostParams pp{};
  pp.out = a.out.data;
  pp.dout = a.dout.data;
  pp.lse = a.lse;
  pp.dq = a.dq.data;
  copy_strides(pp.out_strides, a.out.strides);
  copy_strides(pp.dout_strides, a.dout.strides);
  copy_strides(pp.dq_strides, a.dq.strides);
  pp.seqlen_q = p.seqlen_q;
  pp.heads_q = p.heads_q;
  pp.real_q_tiles = problem.real_q_tiles();
  pp.softmax_scale = shape.softmax_scale;
  pp.sums_in_order = sums_in_order(params.plan);
  pp.buffers = params.buffers;
  pp.packed = packed;

  const dim3 tiles(static_cast<unsigned>(problem.real_q_tiles()), static_cast<unsigned>(shape.heads_q),
                   static_cast<unsigned>(shape.batch));
  backward_preprocess_kernel<Config><<<tiles, kPrepostThreads, 0, stream>>>(pp);

  auto kernel = backward_kernel<Config>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kSharedBytes);
  if (err != cudaSuccess) return err;
  kernel<<<params.plan.num_ctas, Config::kThreads, Config::kSharedBytes, stream>>>(p);

  backward_postprocess_kernel<Config><<<tiles, Config::kMmaThreads, 0, stream>>>(pp);

  if (problem.group_splits > 1) {
    SplitSumParamsOf<kVarlen> sp{};
    sp.dk_accum = params.buffers.dk_accum;
    sp.dv_accum = params.buffers.dv_accum;
    sp.dk = a.dk.data;
    sp.dv = a.dv.data;
    copy_strides(sp.dk_strides, a.dk.strides);
    copy_strides(sp.dv_strides, a.dv.strides);
    sp.splits = problem.group_splits;
    sp.batch = p.batch;
    sp.heads_kv = p.heads_kv;
    sp.seqlen_k = p.seqlen_k;
    sp.padded_rows = problem.num_kv_tiles() * problem.block_kv;
    sp.head_dim = kHeadDim;
    if constexpr (kVarlen) sp.packed = packed;
    const int rows_per_block = kPrepostThreads / kHeadDim;
    const dim3 grid(static_cast<unsigned>((shape.seqlen_k + rows_per_block - 1) / rows_per_block),
                    static_cast<unsigned>(shape.heads_kv), static_cast<unsigned>(shape.batch));
    sum_dkv_splits_kernel<Element, kVarlen><<<grid, kPrepostThreads, 0, stream>>>(sp);
  }
  if constexpr (kVarlen) {
    const VarlenBatch& v = a.varlen;
    const PaddingRows<Element> padding[] = {
        padding_rows<Element>(a.dq, shape.heads_q, kHeadDim, v.total_q, v.cu_seqlens_q, shape.batch),
        padding_rows<Element>(a.dk, shape.heads_kv, kHeadDim, v.total_k, v.cu_seqlens_k, shape.batch),
        padding_rows<Element>(a.dv, shape.heads_kv, kHeadDim, v.total_k, v.cu_seqlens_k, shape.batch)};
    return clear_padding_rows(padding, stream);
  }
  return cudaGetLastError();
}

// The backward of a packed varlen batch on a varlen plan.
template <int kHeadDim, class Element, bool kSoftcap>
int launch_backward_varlen(const kernels::BackwardParams& params, cudaStream_t stream) {
  return launch_backward<kHeadDim, Element, kSoftcap, true>(params, stream);
}

}  // namespace dash::sm90
