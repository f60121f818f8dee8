// DASH: bitwise-reproducible attention for LLM training on Hopper GPUs.
#pragma once

#include "dash/attention.hpp"
#include "dash/status.hpp"
