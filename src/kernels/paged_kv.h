// The paged view of a KV cache, shared by every attention kernel and its CPU twin.
//
// The pool holds `slots` token rows ([slots, Hkv, D] per layer, for keys and for values), grouped in
// pages of `page_size` consecutive slots: page p is slots p * page_size .. (p + 1) * page_size - 1.
// Request b's context (kv_len(b) tokens, in position order) lives in the pages
//   page_indices[page_indptr[b]] .. page_indices[page_indptr[b + 1] - 1],
// every one full except the last, which holds last_page_len[b] tokens (1 .. page_size). A request
// with no pages has no context (kv_len 0; its last_page_len is ignored).
// Token j of request b is row paged_kv_slot(...) of the pool: the one row-address function that every
// kernel and its CPU twin use. Indices are int32; the slot, multiplied by a row's width, becomes a
// 64-bit element offset.
#pragma once

#include <cstdint>

#include "core/tensor.h"

#if defined(__CUDACC__)
#define KILN_PAGED_HD __host__ __device__ __forceinline__
#else
#define KILN_PAGED_HD inline
#endif

namespace kiln {

// Device-side arrays (on the backend's device, i32) describing B requests' contexts.
struct PagedKV {
  Tensor page_indptr;    // [B + 1]
  Tensor page_indices;   // [P]  page ids, P >= page_indptr[B]
  Tensor last_page_len;  // [B]
  int32_t page_size = 0;
};

// Tokens in request b's context.
KILN_PAGED_HD int32_t paged_kv_len(const int32_t* page_indptr, const int32_t* last_page_len, int32_t page_size,
                                   int32_t b) {
  const int32_t pages = page_indptr[b + 1] - page_indptr[b];
  return pages <= 0 ? 0 : (pages - 1) * page_size + last_page_len[b];
}

// Pool row of token j of the request whose pages start at page_indices[first_page].
KILN_PAGED_HD int64_t paged_kv_slot(const int32_t* page_indices, int32_t first_page, int32_t page_size, int32_t j) {
  return static_cast<int64_t>(page_indices[first_page + j / page_size]) * page_size + j % page_size;
}

}  // namespace kiln
