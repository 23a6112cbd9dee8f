// MUONBED_HD marks small inline helpers (bf16 rounding, the counter-based generator, torch's lerp)
// that CPU code and CUDA kernels share, so both sides compute the very same formula. The headers
// that use it stay plain C++17 with no CUDA include: nvcc compiles the .cu files as C++17.
#pragma once

#if defined(__CUDACC__)
#define MUONBED_HD __host__ __device__
#else
#define MUONBED_HD
#endif
