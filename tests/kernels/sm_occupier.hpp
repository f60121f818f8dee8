// A stand-in for the communication kernels of a training step, for the GPU tests of sm_margin: it holds some SMs
// of the current GPU with one spinning CTA each, on a stream of its own, until it is released (or a time bound
// passes, so a failing test cannot leave the GPU busy forever). Each CTA takes the most shared memory a block may
// have, so no two share an SM and no DASH CTA (which needs most of an SM's shared memory and registers) fits
// beside one: while held, those SMs are exactly what another kernel cannot use.
//
// It is CUDA code (sm_occupier.cu); a build without DASH_BUILD_KERNELS links sm_occupier_unavailable.cpp, whose
// SmOccupier says why it cannot run, and the tests that need it skip.
#pragma once

#include <string>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace dash::testing {

class SmOccupier {
 public:
  SmOccupier() = default;
  SmOccupier(const SmOccupier&) = delete;
  SmOccupier& operator=(const SmOccupier&) = delete;
  // Releases the CTAs, waits (up to the time bound) for them to leave, frees what start() allocated.
  ~SmOccupier();

  // Empty if this build can hold SMs, else why not.
  static std::string unavailable_reason();

  // Launches `sms` spinning CTAs on a new non-blocking stream and waits until all of them run, for at most
  // `start_seconds`; each leaves at release() or after `hold_seconds` at the latest. Empty on success, else what
  // failed (then nothing is held). Allocate every buffer a test needs before: cudaMalloc and cudaFree may wait
  // for the whole device, held SMs included.
  std::string start(int sms, double hold_seconds, double start_seconds);

  // Whether every CTA is still spinning: none has left for its time bound, and release() was not called.
  bool holding() const;

  // Lets the CTAs leave; waits for them (true if they left within `seconds`). Idempotent.
  bool release(double seconds = 30.0);

 private:
  // How many of the per-CTA flags from `first` on are set.
  int count(int first) const;

  volatile int* host_flags_ = nullptr;  // [0] release, then per CTA: started, then per CTA: left on its time bound
  volatile int* device_flags_ = nullptr;
  int ctas_ = 0;
  cudaStream_t stream_ = nullptr;
  bool running_ = false;
};

}  // namespace dash::testing
