# The one definition of what the kernels are written for: the head dims and the element types. Every other view is
# derived from these lists: DASH_HEAD_DIMS and DASH_DTYPES default to them and must be subsets of them; the C++ view
# (kSupportedHeadDims, src/api/supported.hpp.in) is generated from them at configure time; Python's view
# (python/dash_attn/_library.py) is checked against them by CTest (repository_check). A new head dim is added here
# and given its tiles in src/schedule/tile_config.hpp (CONTRIBUTING.md, "Add a head dim").
set(DASH_SUPPORTED_HEAD_DIMS 64 96 128 192 256)
# Element type names as DType spells them in upper case (bf16 -> DType::kBF16).
set(DASH_SUPPORTED_DTYPES bf16 fp16)
