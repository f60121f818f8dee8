// Reference layer: plain CPU attention, forward and backward, in float32 or float64. The ground truth
// every kernel and the emulator are checked against; written for clarity, not speed.
//
// Tensors are packed (B, S, H, D) arrays; lse is packed (B, Hq, Sq) and holds natural-log
// logsumexp of each row of scaled scores (-inf for a row that sees no key, whose output is 0).
// The mask (schedule/mask.hpp: full, causal, FlashAttention's sliding window alone or with causal) and the
// GQA head mapping follow include/dash/attention.hpp. softcap > 0 caps each scaled score s to
// softcap * tanh(s / softcap) before the softmax (Gemma 2's logit softcapping, FlashAttention's `softcap`), and the
// backward multiplies dS by its derivative 1 - tanh^2; 0 leaves the scores as they are. The window and softcap
// are arguments of their own, and the shape's window_left, window_right and softcap fields are not read: the
// emulator and the planner's tests pass windows directly, the GPU harness the shape's (reference_window).
#pragma once

#include "dash/types.hpp"
#include "schedule/mask.hpp"

namespace dash::reference {

template <class T>
void attention_forward(const AttentionShape& shape, const T* q, const T* k, const T* v, T* out, T* lse,
                       SlidingWindow window = {}, double softcap = 0.0);

// Gradients of L = sum(out * dout) given the forward's out and lse (computed under the same window and softcap).
template <class T>
void attention_backward(const AttentionShape& shape, const T* q, const T* k, const T* v, const T* out, const T* dout,
                        const T* lse, T* dq, T* dk, T* dv, SlidingWindow window = {}, double softcap = 0.0);

}  // namespace dash::reference
