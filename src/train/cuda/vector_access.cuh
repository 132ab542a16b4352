// Kernels that move V consecutive channels a thread (V = 4, 2 or 1): one
// aligned vector load and one vector store per V elements, and the host-side
// choice of V from the channel count and the pointers' alignment. Used by the
// NHWC batch norm kernels (bn_nhwc_support.cuh) and the NHWC max pooling
// (max_pool.cuh). Internal to src/train/cuda/; include from .cu files only.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "kernel_support.cuh"

namespace ddprun::train::cuda {

// V consecutive elements, loaded and stored as one aligned access.
template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};
template <class T, int V>
__device__ Vec<T, V> ldv(const void* p, size_t i) {
  return *reinterpret_cast<const Vec<T, V>*>(static_cast<const T*>(p) + i);
}
// The store is one vector st.global of 32-bit words, written in PTX. A plain
// store of the Vec (or of a uint4/float4 built from it) at p + (row * c + ch)
// compiled to one scalar store per element: nvcc 13.0 splits a vector store
// whose 64-bit index is a product with a run-time value (its PTX: st.global.f32
// x4, .v2.u16 x2), and every output of these kernels (y, g, dx) was written at
// a quarter of the width, four store instructions per 16 or 8 bytes (the SASS:
// STG.E.U16 / STG.E). __stwb/__stcg are not split but come out as strong
// stores (STG.E.64.STRONG.SM/.GPU); this is the plain STG.E.64/.128. The
// asm is volatile (never dropped: it has no outputs) and its "memory" clobber
// keeps it ordered with the kernel's other accesses (y may be x: read before
// written). tests/cuda/ptx_vector_width_test.py checks the PTX of every
// kernel that uses it (bn_nhwc.cu, bn_nhwc_sums.cu).
__device__ inline void storeWords(void* q, const unsigned (&w)[4]) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(q), "r"(w[0]), "r"(w[1]),
               "r"(w[2]), "r"(w[3])
               : "memory");
}
__device__ inline void storeWords(void* q, const unsigned (&w)[2]) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(q), "r"(w[0]), "r"(w[1]) : "memory");
}
__device__ inline void storeWords(void* q, const unsigned (&w)[1]) {
  asm volatile("st.global.u32 [%0], %1;" ::"l"(q), "r"(w[0]) : "memory");
}
template <class T>
__device__ unsigned storedBits(float f) {
  if constexpr (sizeof(T) == 4) {
    return __float_as_uint(f);
  } else {
    const T v = fromFloat<T>(f);
    unsigned short u;
    memcpy(&u, &v, sizeof u);
    return u;
  }
}
template <class T, int V>
__device__ void stv(void* p, size_t i, const float (&f)[V]) {
  T* q = static_cast<T*>(p) + i;
  constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
  if constexpr (V < kPerWord) {
    *q = fromFloat<T>(f[0]);  // one 16-bit element
  } else {
    constexpr int kWords = V / kPerWord;
    unsigned w[kWords];
#pragma unroll
    for (int j = 0; j < kWords; ++j) {
      if constexpr (kPerWord == 1)
        w[j] = storedBits<T>(f[j]);
      else  // little-endian: the lower address in the low half
        w[j] = storedBits<T>(f[2 * j]) | storedBits<T>(f[2 * j + 1]) << 16;
    }
    storeWords(q, w);
  }
}
template <class T, int V>
__device__ void toFloats(const Vec<T, V>& in, float (&f)[V]) {
#pragma unroll
  for (int k = 0; k < V; ++k) f[k] = toFloat(in.v[k]);
}

// The widest V in {4, 2, 1} dividing c with every non-null pointer aligned to V elements.
inline int vectorWidth(int64_t c, size_t elem, std::initializer_list<const void*> ptrs) {
  for (int v : {4, 2}) {
    if (c % v != 0) continue;
    bool ok = true;
    for (const void* p : ptrs)
      if (p && reinterpret_cast<uintptr_t>(p) % (elem * v) != 0) ok = false;
    if (ok) return v;
  }
  return 1;
}
template <class F>
void withWidth(int v, F&& f) {
  if (v == 4)
    f(std::integral_constant<int, 4>{});
  else if (v == 2)
    f(std::integral_constant<int, 2>{});
  else
    f(std::integral_constant<int, 1>{});
}
}  // namespace ddprun::train::cuda
