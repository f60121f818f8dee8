// Host side of the backward pass for one (head dim, element type): builds the TMA descriptors and
// kernel parameters from the API's BackwardParams and enqueues preprocess, main kernel, the GQA split sum,
// postprocess (which fills dq, dk and dv with NaN if the main kernel gave up its dQ order, so it runs after every
// kernel that writes them) and, for a varlen batch, the kernel that clears its padding rows and poisons its sequences
// over the maxima (varlen_padding.cuh), on the stream. Returns the launches' cudaError_t value, or the tensor whose
// TMA descriptor the driver would refuse and the rule it breaks (kernels::LaunchResult), found from the tensors'
// geometry before any descriptor is encoded, in which case nothing is encoded or launched.
#pragma once

#include <cuda_runtime.h>

#include "kernels/kernel_params.hpp"
#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/bwd_kernel.cuh"
#include "kernels/sm90/bwd_prepost.cuh"
#include "kernels/sm90/gmem_tensors.cuh"
#include "kernels/sm90/varlen_padding.cuh"

namespace dash::sm90 {

// kVarlen: a packed varlen batch (args.varlen) on a varlen plan (plan_varlen_backward): the maximum problem's grids
// and workspace, the descriptors over the packed rows, each sequence read from cu_seqlens in the kernels.
template <int kHeadDim, class Element, bool kSoftcap, bool kVarlen = false>
kernels::LaunchResult launch_backward(const kernels::BackwardParams& params, cudaStream_t stream) {
  const BackwardArgs& a = params.args;
  using Config = BackwardConfig<kHeadDim, Element, kSoftcap, kVarlen>;
  const AttentionShape& shape = a.shape;
  const TiledProblem& problem = params.plan.problem;

  typename Config::Params p{};
  const auto gmem = [&](const void* data, int64_t seqlen, int64_t total_rows, int64_t heads, const Strides& strides) {
    return make_gmem_call_tensor<Element, kHeadDim, kVarlen>(data, seqlen, total_rows, heads, shape.batch, strides);
  };
  const GmemTensor<Element> q = gmem(a.q.data, shape.seqlen_q, a.varlen.total_q, shape.heads_q, a.q.strides);
  const GmemTensor<Element> dout = gmem(a.dout.data, shape.seqlen_q, a.varlen.total_q, shape.heads_q, a.dout.strides);
  const GmemTensor<Element> k = gmem(a.k.data, shape.seqlen_k, a.varlen.total_k, shape.heads_kv, a.k.strides);
  const GmemTensor<Element> v = gmem(a.v.data, shape.seqlen_k, a.varlen.total_k, shape.heads_kv, a.v.strides);
  // Before any descriptor is encoded: the driver's refusal would only be printed, and the kernel would get it.
  if (const TmaRefusal refusal = first_tma_refusal<Element>({{q, "q"}, {dout, "dout"}, {k, "k"}, {v, "v"}});
      refusal.tensor != nullptr) {
    return refused(refusal);
  }
  const auto q_tile_layout = take<0, 2>(typename Config::SmemLayoutQ{});
  p.tma_q = make_tma_copy(SM90_TMA_LOAD{}, q, q_tile_layout);
  p.tma_dout = make_tma_copy(SM90_TMA_LOAD{}, dout, q_tile_layout);
  p.tma_k = make_tma_copy(SM90_TMA_LOAD{}, k, typename Config::SmemLayoutKV{});
  p.tma_v = make_tma_copy(SM90_TMA_LOAD{}, v, typename Config::SmemLayoutKV{});
  PackedBatch packed{};
  if constexpr (kVarlen) {
    const VarlenBatch& vb = a.varlen;
    packed = PackedBatch{vb.cu_seqlens_q,
                         vb.cu_seqlens_k,
                         static_cast<int>(vb.total_q),
                         static_cast<int>(vb.total_k),
                         static_cast<int>(shape.seqlen_q),
                         static_cast<int>(shape.seqlen_k),
                         vb.keys_within_queries};
    p.packed = packed;
  }
  p.plan = params.plan;
  p.buffers = params.buffers;
  p.wait_bound_ns = params.wait_bound_ns;
  p.fault = params.fault;
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
  pp.dk = a.dk.data;
  pp.dv = a.dv.data;
  copy_strides(pp.dk_strides, a.dk.strides);
  copy_strides(pp.dv_strides, a.dv.strides);
  pp.kv_batch = kVarlen ? 1 : p.batch;  // a packed dk's rows are all its sequences' (its batch stride is 0)
  pp.kv_rows = kVarlen ? static_cast<int>(a.varlen.total_k) : p.seqlen_k;
  pp.heads_kv = p.heads_kv;

  const dim3 tiles(static_cast<unsigned>(problem.real_q_tiles()), static_cast<unsigned>(shape.heads_q),
                   static_cast<unsigned>(shape.batch));
  backward_preprocess_kernel<Config><<<tiles, kPrepostThreads, 0, stream>>>(pp);

  auto kernel = backward_kernel<Config>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kSharedBytes);
  if (err != cudaSuccess) return launched(err);
  kernel<<<params.plan.num_ctas, Config::kThreads, Config::kSharedBytes, stream>>>(p);

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
  // Last of the kernels that write dq, dk and dv: it poisons all three if the main kernel gave up its order.
  backward_postprocess_kernel<Config><<<tiles, Config::kMmaThreads, 0, stream>>>(pp);

  if constexpr (kVarlen) {
    const VarlenBatch& v = a.varlen;
    const PaddingRows<Element> rows[] = {
        padding_rows<Element>(a.dq, shape.heads_q, kHeadDim, v.total_q, /*keys=*/false),
        padding_rows<Element>(a.dk, shape.heads_kv, kHeadDim, v.total_k, /*keys=*/true),
        padding_rows<Element>(a.dv, shape.heads_kv, kHeadDim, v.total_k, /*keys=*/true)};
    return launched(
        finish_varlen_rows(rows, sequence_guard(shape, v, params.fault, kernels::FaultPass::kBackward), stream));
  }
  return launched(cudaGetLastError());
}

// The backward of a packed varlen batch on a varlen plan.
template <int kHeadDim, class Element, bool kSoftcap>
kernels::LaunchResult launch_backward_varlen(const kernels::BackwardParams& params, cudaStream_t stream) {
  return launch_backward<kHeadDim, Element, kSoftcap, true>(params, stream);
}

}  // namespace dash::sm90
