#include "kernels/kernel_params.hpp"

namespace dash::kernels {
namespace {

size_t align_up(size_t bytes) {
  return (bytes + BackwardWorkspace::kAlignment - 1) / BackwardWorkspace::kAlignment * BackwardWorkspace::kAlignment;
}

}  // namespace

BackwardWorkspace BackwardWorkspace::layout(const AttentionShape& shape, const TiledProblem& problem) {
  const size_t rows_q = static_cast<size_t>(problem.real_q_tiles()) * problem.block_q;
  const size_t rows_k = static_cast<size_t>(problem.num_kv_tiles()) * problem.block_kv;
  const size_t heads_q = static_cast<size_t>(shape.batch) * shape.heads_q;
  const size_t dim = static_cast<size_t>(shape.head_dim);
  BackwardWorkspace w;
  size_t offset = 0;
  auto take = [&offset](size_t bytes) {
    const size_t at = offset;
    offset += align_up(bytes);
    return at;
  };
  w.dq_accum = take(heads_q * rows_q * dim * sizeof(float));
  w.dq_semaphores = take(heads_q * problem.real_q_tiles() * sizeof(int));
  w.lse_log2 = take(heads_q * rows_q * sizeof(float));
  w.dpsum = take(heads_q * rows_q * sizeof(float));
  const size_t split_accum =
      problem.group_splits > 1 ? static_cast<size_t>(problem.group_splits) * shape.batch * shape.heads_kv * rows_k * dim
                               : 0;
  w.dk_accum = take(split_accum * sizeof(float));
  w.dv_accum = take(split_accum * sizeof(float));
  w.unit_counter = take(sizeof(int));
  w.order_abandoned = take(sizeof(int));
  w.total_bytes = offset;
  return w;
}

BackwardBuffers BackwardWorkspace::carve(void* workspace) const {
  char* base = static_cast<char*>(workspace);
  BackwardBuffers b{};
  b.dq_accum = reinterpret_cast<float*>(base + dq_accum);
  b.dq_semaphores = reinterpret_cast<int*>(base + dq_semaphores);
  b.lse_log2 = reinterpret_cast<float*>(base + lse_log2);
  b.dpsum = reinterpret_cast<float*>(base + dpsum);
  b.dk_accum = dk_accum == dv_accum ? nullptr : reinterpret_cast<float*>(base + dk_accum);
  b.dv_accum = dk_accum == dv_accum ? nullptr : reinterpret_cast<float*>(base + dv_accum);
  b.unit_counter = reinterpret_cast<int*>(base + unit_counter);
  b.order_abandoned = reinterpret_cast<int*>(base + order_abandoned);
  return b;
}

}  // namespace dash::kernels
