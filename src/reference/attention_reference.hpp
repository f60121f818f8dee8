// Reference layer: plain CPU attention, forward and backward, in float32 or float64. The ground truth
// every kernel and the emulator are checked against; written for clarity, not speed.
//
// Tensors are packed (B, S, H, D) arrays; lse is packed (B, Hq, Sq) and holds natural-log
// logsumexp of each row of scaled scores (-inf for a row that sees no key, whose output is 0).
// The mask and the GQA head mapping follow include/dash/attention.hpp.
#pragma once

#include "dash/attention.hpp"

namespace dash::reference {

template <class T>
void attention_forward(const AttentionShape& shape, const T* q, const T* k, const T* v, T* out, T* lse);

// Gradients of L = sum(out * dout) given the forward's out and lse.
template <class T>
void attention_backward(const AttentionShape& shape, const T* q, const T* k, const T* v, const T* out,
                        const T* dout, const T* lse, T* dq, T* dk, T* dv);

}  // namespace dash::reference
