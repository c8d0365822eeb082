// The ``fused`` LookHere backend's CPU kernels: exact, tile-sparse attention whose bias is
// read from the layer's relative table inside the softmax pass.
//
// Tokens. The H x W patch grid is cut into tiles of th x tw patches (the last row / column
// of tiles may be smaller), numbered row-major (t = ty * nTx + tx); inside a tile the
// patches are row-major ("tile order"). J global prefix tokens (CLS, Jumbo) come first in
// the model's sequence, with bias 0 to and from everything; this kernel computes the patch
// queries (the prefix queries are one plain SDPA call in Python).
//
// Plan (made in Python, fused.py): for every head group and query tile, the runs of
// consecutive key tiles holding a key that some query of the tile can see
// (``runs[run_ptr[g, qt] .. run_ptr[g, qt + 1])``, each ``first, last + 1``).
//
// Packed keys. A head's keys and values are copied once per call into "slots": the J
// prefix keys, then every tile, each part padded with zero keys to a multiple of the
// vector width V (16 floats with AVX-512). Keys are stored both as rows (``[slot][dp]``)
// and as panels of V slots (``[panel][dp][V]``, what the score product reads); the head
// dimension d is padded with zeros to ``dp``, a multiple of V. Padded slots get the bias
// -inf, so they take no part.
//
// Forward, per (batch, head, query tile), an online softmax over blocks of whole tiles
// (<= max_keys slots; the prefix keys are the first block):
//   S = Q K^T (micro-kernel on the panels), then per query row: the row's bias read from
//   the table (a key tile's row is one contiguous run of it) by the pass that adds it with
//   the scale and takes the row maximum; P = exp(S - m), rounded to bfloat16 in the same
//   pass where the products take bfloat16; acc = acc * exp(m_old - m) + P V. The key
//   blocks go nearest first (after the prefix keys). Where P is bfloat16 and a block is
//   whole 8 x 8 tiles without a key term (section "bfloat16 rows of whole 8 x 8 tiles"),
//   the passes read S and the bias and store only P, and after the first block of tiles
//   one pass serves: P = exp(S - m) against the running maximum m, kept where the block's
//   own maximum stays within LAZY_RESCALE of it (else the block is redone in two passes).
// Backward, per (batch, head): the flash-attention backward over the same blocks with the
//   global log-sum-exp; dK / dV accumulated in slots and written back at the end; where
//   asked (learnable slopes that train), each dS also added to the table entry (and key
//   term) its bias was read from, per sample (bias_grad_block).
//
// The three products are register-blocked micro-kernels over at::vec::Vectorized (no
// packing per call, which a BLAS call would do for every block).
//
// Reduced precision. bfloat16 / float16 q, k, v (and dout, out in the backward) are read
// in their own dtype and converted to float32 as they are packed (keys, values: once per
// head) or copied into the query block; scores, the bias table (float32), the online
// softmax and every accumulator stay float32; the output and dq, dk, dv are written back
// in the input dtype, the log-sum-exp in float32. No float32 copy of a whole tensor is
// made. The products are the float32 FMA micro-kernels, except for bfloat16 where the
// build targets AVX-512 and the CPU has AVX512-BF16: there the native bfloat16 products
// (section "Native bfloat16 products") take bfloat16 operands with float32 sums, in one
// of two implementations: our VDPBF16PS micro-kernels, or PyTorch's
// ``at::native::cpublas::brgemm`` (oneDNN's micro-kernel: AMX tiles where the CPU has them,
// AVX-512 elsewhere; section "bfloat16 products through brgemm"). Python picks one.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>
#include <vector>

// The AVX-512 build has the native bfloat16 code (section "Native bfloat16 products"); it
// runs only where the CPU has AVX512-BF16 (checked at run time, native_bf16_available()).
#if defined(CPU_CAPABILITY_AVX512) && (defined(__GNUC__) || defined(__clang__))
#define LH_NATIVE_BF16 1
#include <immintrin.h>
#define LH_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#endif

namespace {

template <typename T>
using Vec = at::vec::Vectorized<T>;

// The kernels' buffers (keys and values in tile order, the query tile, the score /
// probability blocks, the accumulators; forward and backward) start on a 64-byte cache
// line. malloc aligns to 16 bytes only, and where a buffer started 16, 32 or 48 bytes into
// a line, every row of the key / value layouts, the query tile and the score blocks (each
// a whole number of lines long) straddled one more line than it fills, and where in a line
// malloc's blocks fell changed from process to process: a ViT-B bf16 frame of 1024 x 2048
// against timm's went from 0.813-0.879x to 0.734x (lh180) and from 0.745-0.750x to 0.677x
// (lh90) on AMX, 2 threads (docs/performance.md, "Buffers on cache lines", the commands).
constexpr std::size_t kCacheLine = 64;

template <typename E>
struct CacheLineAllocator {
  using value_type = E;
  constexpr CacheLineAllocator() noexcept = default;
  template <typename U>
  constexpr CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  E* allocate(std::size_t n) {
    return static_cast<E*>(::operator new(n * sizeof(E), std::align_val_t(kCacheLine)));
  }
  void deallocate(E* p, std::size_t) { ::operator delete(p, std::align_val_t(kCacheLine)); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};

// A std::vector whose data starts on a cache line (CacheLineAllocator).
template <typename E>
using Buffer = std::vector<E, CacheLineAllocator<E>>;

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

// ---------------------------------------------------------------------------------------
// Micro-kernels (row-major matrices; dp and slot counts are multiples of V)
// ---------------------------------------------------------------------------------------

// C[r][p*V + l] = sum_c A[r][c] * Bp[p][c][l] for R rows x P panels.
template <typename T, int R, int P>
inline void qk_tile(const T* A, int lda, const T* Bp, int dp, T* C, int ldc) {
  constexpr int V = Vec<T>::size();
  Vec<T> acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = Vec<T>(T(0));
  for (int c = 0; c < dp; ++c) {
    Vec<T> b[P];
    for (int p = 0; p < P; ++p) b[p] = Vec<T>::loadu(Bp + (int64_t)p * dp * V + c * V);
    for (int r = 0; r < R; ++r) {
      const Vec<T> a(A[(int64_t)r * lda + c]);
      for (int p = 0; p < P; ++p) acc[r][p] = at::vec::fmadd(a, b[p], acc[r][p]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p].store(C + (int64_t)r * ldc + p * V);
}

template <typename T, int P>
inline void qk_rows(int rows, const T* A, int lda, const T* Bp, int dp, T* C, int ldc) {
  switch (rows) {
    case 8: return qk_tile<T, 8, P>(A, lda, Bp, dp, C, ldc);
    case 7: return qk_tile<T, 7, P>(A, lda, Bp, dp, C, ldc);
    case 6: return qk_tile<T, 6, P>(A, lda, Bp, dp, C, ldc);
    case 5: return qk_tile<T, 5, P>(A, lda, Bp, dp, C, ldc);
    case 4: return qk_tile<T, 4, P>(A, lda, Bp, dp, C, ldc);
    case 3: return qk_tile<T, 3, P>(A, lda, Bp, dp, C, ldc);
    case 2: return qk_tile<T, 2, P>(A, lda, Bp, dp, C, ldc);
    default: return qk_tile<T, 1, P>(A, lda, Bp, dp, C, ldc);
  }
}

// C (n x ns) = A (n x dp) * B^T, B given as panels of V slots: ns / V panels.
template <typename T>
void gemm_panels(const T* A, int n, int dp, const T* Bp, int ns, T* C, int ldc) {
  constexpr int V = Vec<T>::size();
  const int panels = ns / V;
  for (int p = 0; p < panels; p += 2) {
    const T* b = Bp + (int64_t)p * dp * V;
    for (int r = 0; r < n; r += 8) {
      const int rows = std::min(8, n - r);
      if (p + 1 < panels)
        qk_rows<T, 2>(rows, A + (int64_t)r * dp, dp, b, dp, C + (int64_t)r * ldc + p * V, ldc);
      else
        qk_rows<T, 1>(rows, A + (int64_t)r * dp, dp, b, dp, C + (int64_t)r * ldc + p * V, ldc);
    }
  }
}

// C[r][cb + n*V ..] += alpha * sum_j A[r][j] * B[j][cb + n*V ..], R rows x NV vectors.
template <typename T, int R, int NV>
inline void av_tile(const T* A, int lda, const T* B, int ldb, int k, T* C, int ldc, T alpha) {
  constexpr int V = Vec<T>::size();
  Vec<T> acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NV; ++n) acc[r][n] = Vec<T>(T(0));
  for (int j = 0; j < k; ++j) {
    Vec<T> b[NV];
    for (int n = 0; n < NV; ++n) b[n] = Vec<T>::loadu(B + (int64_t)j * ldb + n * V);
    for (int r = 0; r < R; ++r) {
      const Vec<T> a(A[(int64_t)r * lda + j]);
      for (int n = 0; n < NV; ++n) acc[r][n] = at::vec::fmadd(a, b[n], acc[r][n]);
    }
  }
  const Vec<T> va(alpha);
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NV; ++n) {
      T* c = C + (int64_t)r * ldc + n * V;
      at::vec::fmadd(acc[r][n], va, Vec<T>::loadu(c)).store(c);
    }
}

template <typename T, int NV>
inline void av_rows(int rows, const T* A, int lda, const T* B, int ldb, int k, T* C, int ldc,
                    T alpha) {
  switch (rows) {
    case 4: return av_tile<T, 4, NV>(A, lda, B, ldb, k, C, ldc, alpha);
    case 3: return av_tile<T, 3, NV>(A, lda, B, ldb, k, C, ldc, alpha);
    case 2: return av_tile<T, 2, NV>(A, lda, B, ldb, k, C, ldc, alpha);
    default: return av_tile<T, 1, NV>(A, lda, B, ldb, k, C, ldc, alpha);
  }
}

// C (n x dp) += alpha * A (n x k, lda) * B (k x dp, row-major).
template <typename T>
void gemm_rows(const T* A, int lda, int n, int k, const T* B, int dp, T* C, T alpha) {
  constexpr int V = Vec<T>::size();
  for (int cb = 0; cb < dp; cb += 4 * V) {
    const int nv = std::min(4, (dp - cb) / V);
    for (int r = 0; r < n; r += 4) {
      const int rows = std::min(4, n - r);
      const T* a = A + (int64_t)r * lda;
      T* c = C + (int64_t)r * dp + cb;
      switch (nv) {
        case 4: av_rows<T, 4>(rows, a, lda, B + cb, dp, k, c, dp, alpha); break;
        case 3: av_rows<T, 3>(rows, a, lda, B + cb, dp, k, c, dp, alpha); break;
        case 2: av_rows<T, 2>(rows, a, lda, B + cb, dp, k, c, dp, alpha); break;
        default: av_rows<T, 1>(rows, a, lda, B + cb, dp, k, c, dp, alpha); break;
      }
    }
  }
}

// C[j][cb + n*V ..] += alpha * sum_r A[r][j] * B[r][cb + n*V ..], JR slots x NV vectors.
template <typename T, int JR, int NV>
inline void tb_tile(const T* A, int lda, const T* B, int ldb, int n_rows, T* C, int ldc,
                    T alpha) {
  constexpr int V = Vec<T>::size();
  Vec<T> acc[JR][NV];
  for (int j = 0; j < JR; ++j)
    for (int n = 0; n < NV; ++n) acc[j][n] = Vec<T>(T(0));
  for (int r = 0; r < n_rows; ++r) {
    Vec<T> b[NV];
    for (int n = 0; n < NV; ++n) b[n] = Vec<T>::loadu(B + (int64_t)r * ldb + n * V);
    for (int j = 0; j < JR; ++j) {
      const Vec<T> a(A[(int64_t)r * lda + j]);
      for (int n = 0; n < NV; ++n) acc[j][n] = at::vec::fmadd(a, b[n], acc[j][n]);
    }
  }
  const Vec<T> va(alpha);
  for (int j = 0; j < JR; ++j)
    for (int n = 0; n < NV; ++n) {
      T* c = C + (int64_t)j * ldc + n * V;
      at::vec::fmadd(acc[j][n], va, Vec<T>::loadu(c)).store(c);
    }
}

// C (ns x dp) += alpha * A^T * B with A (n x ns, lda), B (n x dp).
template <typename T>
void gemm_t(const T* A, int lda, int n, int ns, const T* B, int dp, T* C, T alpha) {
  constexpr int V = Vec<T>::size();
  for (int cb = 0; cb < dp; cb += 4 * V) {
    const int nv = std::min(4, (dp - cb) / V);
    for (int j = 0; j < ns; j += 4) {  // ns is a multiple of V >= 4... or of 4 for double
      const T* a = A + j;
      T* c = C + (int64_t)j * dp + cb;
      switch (nv) {
        case 4: tb_tile<T, 4, 4>(a, lda, B + cb, dp, n, c, dp, alpha); break;
        case 3: tb_tile<T, 4, 3>(a, lda, B + cb, dp, n, c, dp, alpha); break;
        case 2: tb_tile<T, 4, 2>(a, lda, B + cb, dp, n, c, dp, alpha); break;
        default: tb_tile<T, 4, 1>(a, lda, B + cb, dp, n, c, dp, alpha); break;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Row passes
// ---------------------------------------------------------------------------------------

template <typename T>
inline Vec<T> vexp(const Vec<T>& x) {
  if constexpr (std::is_same_v<T, float>) {
    return x.exp_u20();
  } else {
    T tmp[Vec<T>::size()];
    x.store(tmp);
    for (int i = 0; i < Vec<T>::size(); ++i) tmp[i] = std::exp(tmp[i]);
    return Vec<T>::loadu(tmp);
  }
}

#ifdef LH_NATIVE_BF16
// exp(x - m) for 16 float32 scores x (m finite), for the bfloat16 P of the native products:
// 2^t with t = (x - m) log2(e) (one FMA, off = -m log2(e)), t = k + f (k integer,
// |f| <= 1/2), 2^f by its degree-6 Taylor polynomial
// (relative error < 2e-7; at::vec's exp_u20 is documented at 20 ULP), 2^k by VSCALEFPS.
// Lanes with t < -126 (-inf scores: masked keys, padding; results below float32's smallest
// normal) give exactly 0, so no denormal or underflow is ever made: each costs a microcode
// assist (a version that clamped t at -160 instead and let VSCALEFPS underflow was slower
// than exp_u20; this one is ~20 % faster on one ViT-B bf16 layer, docs/performance.md).
// NaN stays NaN (an unordered compare keeps the lane; VMAXPS returns its second operand).
// 13 instructions for 16 values. (The float32 paths keep exp_u20: no faster with this one.)
inline __m512 exp_minus_avx512_v(__m512 x, __m512 l2e, __m512 off) {
  const __m512 t0 = _mm512_fmadd_ps(x, l2e, off);
  const __mmask16 keep = _mm512_cmp_ps_mask(t0, _mm512_set1_ps(-126.f), _CMP_NLT_UQ);
  const __m512 t = _mm512_max_ps(_mm512_set1_ps(-126.f), t0);
  const __m512 k = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, k);
  __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(1.5403530e-4f), f, _mm512_set1_ps(1.3333558e-3f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(9.6181291e-3f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(5.5504109e-2f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(2.4022651e-1f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(6.9314718e-1f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(1.f));
  return _mm512_maskz_scalef_ps(keep, q, k);
}

// exp_minus_avx512_v of 16 scores read from s.
inline __m512 exp_minus_avx512(const float* s, __m512 l2e, __m512 off) {
  return exp_minus_avx512_v(_mm512_loadu_ps(s), l2e, off);
}
#endif

// s[0..n) = exp(s - m); returns the sum (m finite). n is a multiple of V.
template <typename T>
inline T exp_sum(T* s, int n, T m) {
  constexpr int V = Vec<T>::size();
  const Vec<T> vm(m);
  Vec<T> vsum(T(0));
  for (int j = 0; j < n; j += V) {
    Vec<T> x = vexp<T>(Vec<T>::loadu(s + j) - vm);
    x.store(s + j);
    vsum = vsum + x;
  }
  T tmp[V];
  vsum.store(tmp);
  T sum = 0;
  for (int i = 0; i < V; ++i) sum += tmp[i];
  return sum;
}

#ifdef LH_NATIVE_BF16
// exp_store for bfloat16 P: exp_minus_avx512 and the CPU's own rounding to bfloat16,
// VCVTNE2PS2BF16 (round to nearest even, one instruction per 32 values; values below
// 2^-126 become 0). Only where the native products run (AVX512-BF16).
LH_BF16 float exp_store_bf16(const float* s, c10::BFloat16* p, int n, float m) {
  const __m512 l2e = _mm512_set1_ps(1.44269504f), off = _mm512_set1_ps(-m * 1.44269504f);
  __m512 sum = _mm512_setzero_ps();
  int j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512 x0 = exp_minus_avx512(s + j, l2e, off), x1 = exp_minus_avx512(s + j + 16, l2e, off);
    sum = _mm512_add_ps(sum, _mm512_add_ps(x0, x1));
    _mm512_storeu_si512((void*)(p + j), (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
  }
  if (j < n) {  // 16 left (n is a multiple of 16)
    const __m512 x0 = exp_minus_avx512(s + j, l2e, off);
    sum = _mm512_add_ps(sum, x0);
    _mm256_storeu_si256((__m256i*)(p + j), (__m256i)_mm512_cvtneps_pbh(x0));
  }
  return _mm512_reduce_add_ps(sum);
}
#endif

// p[0..n) = exp(s - m) rounded to P's type (p may be s); returns the sum of the unrounded
// values (m finite). n is a multiple of V. With a reduced P (the bfloat16 products' operand)
// this is the pass that rounds it: the float32 probabilities are never stored.
template <typename T, typename P>
inline T exp_store(T* s, P* p, int n, T m) {
  if constexpr (std::is_same_v<P, T>) {
    return exp_sum<T>(s, n, m);
#ifdef LH_NATIVE_BF16
  } else if constexpr (std::is_same_v<P, c10::BFloat16>) {
    return exp_store_bf16(s, p, n, m);  // the native products' path: the CPU has AVX512-BF16
#endif
  } else {
    static_assert(std::is_same_v<T, float>, "reduced probabilities from float32 scores");
    constexpr int V = Vec<T>::size();
    const Vec<T> vm(m);
    Vec<T> vsum(T(0));
    int j = 0;
    for (; j + 2 * V <= n; j += 2 * V) {
      const Vec<T> x0 = vexp<T>(Vec<T>::loadu(s + j) - vm);
      const Vec<T> x1 = vexp<T>(Vec<T>::loadu(s + j + V) - vm);
      vsum = vsum + x0;
      vsum = vsum + x1;
      at::vec::convert_from_float<P>(x0, x1).store(p + j);
    }
    if (j < n) {
      const Vec<T> x0 = vexp<T>(Vec<T>::loadu(s + j) - vm);
      vsum = vsum + x0;
      at::vec::convert_from_float<P>(x0, Vec<T>(T(0))).store(p + j, V);
    }
    T tmp[V];
    vsum.store(tmp);
    T sum = 0;
    for (int i = 0; i < V; ++i) sum += tmp[i];
    return sum;
  }
}

// dst[0..n) = src[0..n) converted to the compute type (a plain copy when they agree).
template <typename IT, typename T>
inline void load_row(T* dst, const IT* src, int n) {
  if constexpr (std::is_same_v<IT, T>) {
    std::memcpy(dst, src, sizeof(T) * n);
  } else {
    at::vec::convert<IT, T>(src, dst, n);
  }
}

// dst[0..n) = src[0..n) rounded to the storage type.
template <typename T, typename IT>
inline void store_row(IT* dst, const T* src, int n) {
  if constexpr (std::is_same_v<IT, T>) {
    std::memcpy(dst, src, sizeof(T) * n);
  } else {
    at::vec::convert<T, IT>(src, dst, n);
  }
}

// ---------------------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------------------

// The tiles of an H x W grid and the padded key slots.
struct Tiles {
  int H, W, th, tw, n, J, Jp, V, slots;
  std::vector<int> y0, x0, rows, cols, start, slot;  // start: tile order; slot: padded
  std::vector<int> order;                            // tile-order position -> patch

  Tiles(int H_, int W_, int th_, int tw_, int J_, int V_)
      : H(H_), W(W_), th(th_), tw(tw_), J(J_), V(V_) {
    const int nty = (H + th - 1) / th, ntx = (W + tw - 1) / tw;
    n = nty * ntx;
    Jp = round_up(J, V);
    start.push_back(0);
    slot.push_back(Jp);
    for (int ty = 0; ty < nty; ++ty)
      for (int tx = 0; tx < ntx; ++tx) {
        int a = ty * th, b = tx * tw, r = std::min(th, H - a), c = std::min(tw, W - b);
        y0.push_back(a);
        x0.push_back(b);
        rows.push_back(r);
        cols.push_back(c);
        start.push_back(start.back() + r * c);
        slot.push_back(slot.back() + round_up(r * c, V));
        for (int i = 0; i < r; ++i)
          for (int j = 0; j < c; ++j) order.push_back((a + i) * W + b + j);
      }
    slots = slot.back();
  }
  int size(int t) const { return start[t + 1] - start[t]; }
  int max_tile() const {
    int m = 0;
    for (int t = 0; t < n; ++t) m = std::max(m, size(t));
    return m;
  }
};

// A block of key slots: the prefix slots, or whole tiles t0 .. t1 - 1.
struct Block {
  bool prefix;
  int t0, t1, s0, ns;  // first slot, slot count
};

struct Plan {
  const int* run_ptr;     // (G, nQT + 1)
  const int* runs;        // (R, 2)
  const int* head_group;  // (heads,)
  int nqt;
};

// The blocks of (group, query tile): the prefix keys, then the runs cut at max_keys.
void blocks_of(const Tiles& tl, const Plan& plan, int g, int qt, int max_keys,
               std::vector<Block>& out) {
  out.clear();
  if (tl.J > 0) out.push_back({true, 0, 0, 0, tl.Jp});
  const int* rp = plan.run_ptr + (int64_t)g * (plan.nqt + 1);
  for (int r = rp[qt]; r < rp[qt + 1]; ++r) {
    int a = plan.runs[2 * r], b = plan.runs[2 * r + 1];
    while (a < b) {
      int e = a + 1;
      while (e < b && tl.slot[e + 1] - tl.slot[a] <= max_keys) ++e;
      out.push_back({false, a, e, tl.slot[a], tl.slot[e] - tl.slot[a]});
      a = e;
    }
  }
}

// The forward's order of the blocks: the prefix keys first, then the blocks of tiles by
// their distance to query tile qt (the nearest tile's, in tiles; ties keep the plan's
// order). The bias falls with the distance, so the first block of tiles sets a running
// maximum the later ones seldom exceed (see LAZY_RESCALE). Any order gives the same
// softmax; the backward keeps the plan's.
void nearest_first(const Tiles& tl, int qt, std::vector<Block>& blocks) {
  const int ty = tl.y0[qt] / tl.th, tx = tl.x0[qt] / tl.tw;
  auto distance = [&](const Block& b) {
    if (b.prefix) return -1;
    int d = std::numeric_limits<int>::max();
    for (int t = b.t0; t < b.t1; ++t)
      d = std::min(d, std::max(std::abs(tl.y0[t] / tl.th - ty), std::abs(tl.x0[t] / tl.tw - tx)));
    return d;
  };
  std::stable_sort(blocks.begin(), blocks.end(),
                   [&](const Block& a, const Block& b) { return distance(a) < distance(b); });
}

// The table entry of query (qy, qx) against the first patch of key tile t: the tile's
// row r is the run of cols entries from + r * (2W - 1) (what every bias read and the bias
// gradient address).
template <typename T>
inline T* tile_bias(T* table_h, const Tiles& tl, int t, int qy, int qx) {
  return table_h + (int64_t)(tl.y0[t] - qy + tl.H - 1) * (2 * tl.W - 1) +
         (tl.x0[t] - qx + tl.W - 1);
}

#if defined(CPU_CAPABILITY_AVX512)
// Two 8-float table rows as one 16-float vector (lo in the low half).
inline Vec<float> join8(__m256 lo, __m256 hi) {
  return Vec<float>(_mm512_castpd_ps(
      _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1)));
}
#endif

// row[0..blk.ns) = row * scale + the bias of query (qy, qx) against the block's slots
// (-inf on padding); returns max(mx, the row's maximum). The bias is read from the table
// in the pass itself: a key tile's row is one contiguous run of the table's row
// (qy - y, qx - x of the tile's first patch), and the key term, where there is one, is
// added to it before the scale's FMA. With AVX-512 an 8-patch-wide tile row is half a
// vector: two tile rows are read as one (two 8-float loads of the table); other widths
// take masked vectors.
template <typename T>
inline T scale_bias_max(T* row, const Tiles& tl, const Block& blk, const T* table_h,
                        const T* key_h, int qy, int qx, T scale, T mx) {
  constexpr int V = Vec<T>::size();
  const T blocked = -std::numeric_limits<T>::infinity();
  const Vec<T> vs(scale), vblocked(blocked);
  Vec<T> vmax(mx);
  if (blk.prefix) {  // bias 0 to the prefix keys, -inf on their padding
    for (int j = 0; j < blk.ns; j += V) {
      const Vec<T> x = Vec<T>::set(vblocked, Vec<T>::loadu(row + j) * vs,
                                   std::max(0, std::min(V, tl.J - j)));
      x.store(row + j);
      vmax = at::vec::maximum(vmax, x);
    }
  } else {
    const int W2 = 2 * tl.W - 1;
    T* dst = row;
    for (int t = blk.t0; t < blk.t1; ++t) {
      const int rows = tl.rows[t], cols = tl.cols[t], padded = tl.slot[t + 1] - tl.slot[t];
      const T* b = tile_bias(table_h, tl, t, qy, qx);
      const T* e = key_h ? key_h + tl.start[t] : nullptr;
      int done = 0;  // slots written
#if defined(CPU_CAPABILITY_AVX512)
      if constexpr (std::is_same_v<T, float> && V == 16) {
        if (cols == 8 && rows == 8 && !e) {  // a whole 8 x 8 tile, no key term: unrolled
          Vec<T> x[4];
          for (int r = 0; r < 4; ++r) {
            const Vec<T> bias = join8(_mm256_loadu_ps(b + 2 * r * W2),
                                      _mm256_loadu_ps(b + (2 * r + 1) * W2));
            x[r] = at::vec::fmadd(Vec<T>::loadu(dst + 16 * r), vs, bias);
            x[r].store(dst + 16 * r);
          }
          vmax = at::vec::maximum(vmax, at::vec::maximum(at::vec::maximum(x[0], x[1]),
                                                         at::vec::maximum(x[2], x[3])));
          done = 64;
        } else if (cols == 8) {
          for (int r = 0; r < rows; r += 2, b += 2 * W2) {
            const __m256 lo = _mm256_loadu_ps(b);
            const __m256 hi = r + 1 < rows ? _mm256_loadu_ps(b + W2) : _mm256_set1_ps(blocked);
            Vec<T> bias = join8(lo, hi);
            if (e) bias = bias + Vec<T>::loadu(e + r * 8, r + 1 < rows ? 16 : 8);
            const Vec<T> x = at::vec::fmadd(Vec<T>::loadu(dst + r * 8), vs, bias);
            x.store(dst + r * 8);
            vmax = at::vec::maximum(vmax, x);
          }
          done = round_up(rows * 8, 16);
        }
      }
#endif
      if (done == 0) {
        for (int r = 0; r < rows; ++r, b += W2)
          for (int c = 0; c < cols; c += V) {
            const int cnt = std::min(V, cols - c);
            T* sp = dst + r * cols + c;
            Vec<T> bias = Vec<T>::loadu(b + c, cnt);
            if (e) bias = bias + Vec<T>::loadu(e + r * cols + c, cnt);
            const Vec<T> x = at::vec::fmadd(Vec<T>::loadu(sp, cnt), vs, bias);
            x.store(sp, cnt);
            vmax = at::vec::maximum(vmax, Vec<T>::set(vblocked, x, cnt));
          }
        done = rows * cols;
      }
      std::fill(dst + done, dst + padded, blocked);
      dst += padded;
    }
  }
  T tmp[V];
  vmax.store(tmp);
  // a NaN score (NaN or infinite inputs) makes the maximum NaN, so that it reaches the
  // output as it does in the reference (std::max would drop it, and a row of NaN scores
  // would look like a row that sees nothing: zeros)
  for (int i = 0; i < V; ++i) mx = (tmp[i] > mx || std::isnan(tmp[i])) ? tmp[i] : mx;
  return mx;
}

// One head's keys / values in slots: rows [slots][dp] and/or panels [slots / V][dp][V].
template <typename IT, typename T>
void pack_head(const IT* src, int64_t ld, const Tiles& tl, int d, int dp, T* rows, T* panels) {
  const int V = tl.V;
  auto put = [&](int s, const IT* x) {
    if (rows) load_row<IT, T>(rows + (int64_t)s * dp, x, d);
    if (panels) {
      T* p = panels + (int64_t)(s / V) * dp * V + (s % V);
      for (int c = 0; c < d; ++c) p[c * V] = static_cast<T>(x[c]);
    }
  };
  for (int j = 0; j < tl.J; ++j) put(j, src + j * ld);
  for (int t = 0; t < tl.n; ++t)
    for (int i = 0; i < tl.size(t); ++i)
      put(tl.slot[t] + i, src + (int64_t)(tl.J + tl.order[tl.start[t] + i]) * ld);
}

// ---------------------------------------------------------------------------------------
// Native bfloat16 products (AVX512-BF16: VDPBF16PS)
// ---------------------------------------------------------------------------------------
// Where the build targets AVX-512 and the CPU has AVX512-BF16 (checked at run time), the
// five products of bfloat16 attention take bfloat16 operands and accumulate in float32
// with VDPBF16PS (a float32 lane += a0 * b0 + a1 * b1 of two bfloat16 pairs: half the
// instructions of the float32 FMA kernels, half the bytes per operand). Operands are
// stored in pairs along the summed index:
//   - key / value *panels* ``[slots / 16][dp / 2][16][2]``: 16 slots, channel pairs (QK^T,
//     dO V^T: sum over channels);
//   - slot *pairs* ``[slots / 2][dp][2]`` (P V, dS K: sum over slots);
//   - row *pairs* ``[rows / 2][n][2]`` of P, dS, Q, dO (P^T dO, dS^T Q: sum over query rows).
// Scores, bias, softmax, the log-sum-exp and every accumulator stay float32; P and dS are
// rounded to bfloat16 once, as operands of the products (as flash attention does on GPUs).
// (LH_NATIVE_BF16 / LH_BF16: defined at the top, with the includes.)

using bf16 = c10::BFloat16;

// True where this build has the native bfloat16 products and the CPU runs them.
bool native_bf16_available() {
#ifdef LH_NATIVE_BF16
  static const bool ok = __builtin_cpu_supports("avx512bf16");
  return ok;
#else
  return false;
#endif
}

// One row of a query tile, packed as key slot s of a head: into the slot-pair layout and / or
// the panel layout (either may be null). Padding is never written: the buffers start at 0.
inline void put_slot_bf16(const bf16* x, int s, int d, int dp, bf16* pairs, bf16* panels) {
  if (pairs) {
    bf16* p = pairs + (int64_t)(s / 2) * dp * 2 + (s & 1);
    for (int c = 0; c < d; ++c) p[2 * c] = x[c];
  }
  if (panels) {
    bf16* p = panels + (int64_t)(s / 16) * dp * 16 + (s % 16) * 2;
    for (int c = 0; c < d; ++c) p[(c / 2) * 32 + (c & 1)] = x[c];
  }
}

// One head's keys or values in slots, bfloat16: slot pairs and / or panels (see above).
void pack_head_bf16(const bf16* src, int64_t ld, const Tiles& tl, int d, int dp, bf16* pairs,
                    bf16* panels) {
  for (int j = 0; j < tl.J; ++j) put_slot_bf16(src + j * ld, j, d, dp, pairs, panels);
  for (int t = 0; t < tl.n; ++t)
    for (int i = 0; i < tl.size(t); ++i)
      put_slot_bf16(src + (int64_t)(tl.J + tl.order[tl.start[t] + i]) * ld, tl.slot[t] + i, d,
                    dp, pairs, panels);
}

// dst = rows x n float32 (ld ld) as row pairs [ceil(rows / 2)][ldo][2] bfloat16 (n % 16 ==
// 0, ldo >= n; the odd last row pairs with zeros).
void to_row_pairs_bf16(const float* src, int ld, int rows, int n, bf16* dst, int ldo);
// C (n x ns, ldc) = A (n x dp bfloat16 rows, lda) * B^T, B as panels: ns / 16 panels.
void qk_bf16(const bf16* A, int lda, int n, int dp, const bf16* Bp, int ns, float* C, int ldc);
// C (n x dp) += alpha * A (n x k bfloat16, lda) * B, B as k / 2 slot pairs (k even).
void av_bf16(const bf16* A, int lda, int n, int k, const bf16* B, int dp, float* C,
             float alpha);
// C (ns x dp) += alpha * A^T * B, A as row pairs [n / 2][lda][2], B as row pairs
// [n / 2][dp][2] (n even).
void tb_bf16(const bf16* Ap, int lda, int n, int ns, const bf16* Bp, int dp, float* C,
             float alpha);

#ifdef LH_NATIVE_BF16
LH_BF16 inline __m512bh bcast_pair(const bf16* p) {
  int32_t x;
  std::memcpy(&x, p, sizeof(x));
  return (__m512bh)_mm512_set1_epi32(x);
}
LH_BF16 inline __m512bh load_pairs(const bf16* p) {
  return (__m512bh)_mm512_loadu_si512((const void*)p);
}

template <int R, int P>
LH_BF16 inline void qk_tile_bf16(const bf16* A, int lda, const bf16* Bp, int dp, float* C,
                                 int ldc) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  for (int c = 0; c < dp; c += 2) {
    __m512bh b[P];
    for (int p = 0; p < P; ++p) b[p] = load_pairs(Bp + (int64_t)p * dp * 16 + c * 16);
    for (int r = 0; r < R; ++r) {
      const __m512bh a = bcast_pair(A + (int64_t)r * lda + c);
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], a, b[p]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(C + (int64_t)r * ldc + p * 16, acc[r][p]);
}

template <int P>
LH_BF16 inline void qk_rows_bf16(int rows, const bf16* A, int lda, const bf16* Bp, int dp,
                                 float* C, int ldc) {
  switch (rows) {
    case 8: return qk_tile_bf16<8, P>(A, lda, Bp, dp, C, ldc);
    case 7: return qk_tile_bf16<7, P>(A, lda, Bp, dp, C, ldc);
    case 6: return qk_tile_bf16<6, P>(A, lda, Bp, dp, C, ldc);
    case 5: return qk_tile_bf16<5, P>(A, lda, Bp, dp, C, ldc);
    case 4: return qk_tile_bf16<4, P>(A, lda, Bp, dp, C, ldc);
    case 3: return qk_tile_bf16<3, P>(A, lda, Bp, dp, C, ldc);
    case 2: return qk_tile_bf16<2, P>(A, lda, Bp, dp, C, ldc);
    default: return qk_tile_bf16<1, P>(A, lda, Bp, dp, C, ldc);
  }
}

LH_BF16 void qk_bf16(const bf16* A, int lda, int n, int dp, const bf16* Bp, int ns, float* C,
                     int ldc) {
  const int panels = ns / 16;
  for (int p = 0; p < panels; p += 2) {
    const bf16* b = Bp + (int64_t)p * dp * 16;
    for (int r = 0; r < n; r += 8) {
      const int rows = std::min(8, n - r);
      if (p + 1 < panels)
        qk_rows_bf16<2>(rows, A + (int64_t)r * lda, lda, b, dp, C + (int64_t)r * ldc + p * 16,
                        ldc);
      else
        qk_rows_bf16<1>(rows, A + (int64_t)r * lda, lda, b, dp, C + (int64_t)r * ldc + p * 16,
                        ldc);
    }
  }
}

// C[r][n*16 ..] += alpha * sum_j A[r][j] * B[j][n*16 ..], R rows x NV vectors; B is the slot
// pairs from the first channel of the column block (pair j / 2 at j * dp).
template <int R, int NV>
LH_BF16 inline void av_tile_bf16(const bf16* A, int lda, const bf16* B, int dp, int k,
                                 float* C, int ldc, float alpha) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_setzero_ps();
  for (int j = 0; j < k; j += 2) {
    __m512bh b[NV];
    for (int n = 0; n < NV; ++n) b[n] = load_pairs(B + (int64_t)j * dp + n * 32);
    for (int r = 0; r < R; ++r) {
      const __m512bh a = bcast_pair(A + (int64_t)r * lda + j);
      for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], a, b[n]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NV; ++n) {
      float* c = C + (int64_t)r * ldc + n * 16;
      _mm512_storeu_ps(c, _mm512_fmadd_ps(acc[r][n], va, _mm512_loadu_ps(c)));
    }
}

template <int NV>
LH_BF16 inline void av_rows_bf16(int rows, const bf16* A, int lda, const bf16* B, int dp, int k,
                                 float* C, int ldc, float alpha) {
  switch (rows) {
    case 4: return av_tile_bf16<4, NV>(A, lda, B, dp, k, C, ldc, alpha);
    case 3: return av_tile_bf16<3, NV>(A, lda, B, dp, k, C, ldc, alpha);
    case 2: return av_tile_bf16<2, NV>(A, lda, B, dp, k, C, ldc, alpha);
    default: return av_tile_bf16<1, NV>(A, lda, B, dp, k, C, ldc, alpha);
  }
}

LH_BF16 void av_bf16(const bf16* A, int lda, int n, int k, const bf16* B, int dp, float* C,
                     float alpha) {
  for (int cb = 0; cb < dp; cb += 64) {
    const int nv = std::min(4, (dp - cb) / 16);
    for (int r = 0; r < n; r += 4) {
      const int rows = std::min(4, n - r);
      const bf16* a = A + (int64_t)r * lda;
      const bf16* b = B + cb * 2;
      float* c = C + (int64_t)r * dp + cb;
      switch (nv) {
        case 4: av_rows_bf16<4>(rows, a, lda, b, dp, k, c, dp, alpha); break;
        case 3: av_rows_bf16<3>(rows, a, lda, b, dp, k, c, dp, alpha); break;
        case 2: av_rows_bf16<2>(rows, a, lda, b, dp, k, c, dp, alpha); break;
        default: av_rows_bf16<1>(rows, a, lda, b, dp, k, c, dp, alpha); break;
      }
    }
  }
}

// C[j][n*16 ..] += alpha * sum_r A[r][j] * B[r][n*16 ..], JR slots x NV vectors; A and B as
// row pairs (pair r / 2 at r * lda and r * dp).
template <int JR, int NV>
LH_BF16 inline void tb_tile_bf16(const bf16* Ap, int lda, const bf16* Bp, int dp, int n,
                                 float* C, int ldc, float alpha) {
  __m512 acc[JR][NV];
  for (int j = 0; j < JR; ++j)
    for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_setzero_ps();
  for (int r = 0; r < n; r += 2) {
    __m512bh b[NV];
    for (int v = 0; v < NV; ++v) b[v] = load_pairs(Bp + (int64_t)r * dp + v * 32);
    for (int j = 0; j < JR; ++j) {
      const __m512bh a = bcast_pair(Ap + (int64_t)r * lda + 2 * j);
      for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_dpbf16_ps(acc[j][v], a, b[v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
  for (int j = 0; j < JR; ++j)
    for (int v = 0; v < NV; ++v) {
      float* c = C + (int64_t)j * ldc + v * 16;
      _mm512_storeu_ps(c, _mm512_fmadd_ps(acc[j][v], va, _mm512_loadu_ps(c)));
    }
}

LH_BF16 void tb_bf16(const bf16* Ap, int lda, int n, int ns, const bf16* Bp, int dp, float* C,
                     float alpha) {
  for (int cb = 0; cb < dp; cb += 64) {
    const int nv = std::min(4, (dp - cb) / 16);
    for (int j = 0; j < ns; j += 4) {  // ns is a multiple of 16
      const bf16* a = Ap + 2 * j;
      const bf16* b = Bp + cb * 2;
      float* c = C + (int64_t)j * dp + cb;
      switch (nv) {
        case 4: tb_tile_bf16<4, 4>(a, lda, b, dp, n, c, dp, alpha); break;
        case 3: tb_tile_bf16<4, 3>(a, lda, b, dp, n, c, dp, alpha); break;
        case 2: tb_tile_bf16<4, 2>(a, lda, b, dp, n, c, dp, alpha); break;
        default: tb_tile_bf16<4, 1>(a, lda, b, dp, n, c, dp, alpha); break;
      }
    }
  }
}

LH_BF16 void to_row_pairs_bf16(const float* src, int ld, int rows, int n, bf16* dst,
                               int ldo) {
  for (int r = 0; r < rows; r += 2) {
    const float* a = src + (int64_t)r * ld;
    const float* b = r + 1 < rows ? a + ld : nullptr;
    bf16* o = dst + (int64_t)r * ldo;  // pair r / 2 at (r / 2) * ldo * 2
    for (int j = 0; j < n; j += 16) {
      const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(a + j)));
      __m512i hi = _mm512_setzero_si512();
      if (b) hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(b + j)));
      _mm512_storeu_si512((void*)(o + 2 * j), _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}
#else
// This build has no native bfloat16 products: native_bf16_available() is false, and the
// callers check it before they reach these.
[[noreturn]] void no_native_bf16() {
  TORCH_CHECK(false, "fused LookHere attention: this build has no native bfloat16 products");
}
void to_row_pairs_bf16(const float*, int, int, int, bf16*, int) { no_native_bf16(); }
void qk_bf16(const bf16*, int, int, int, const bf16*, int, float*, int) { no_native_bf16(); }
void av_bf16(const bf16*, int, int, int, const bf16*, int, float*, float) { no_native_bf16(); }
void tb_bf16(const bf16*, int, int, int, const bf16*, int, float*, float) { no_native_bf16(); }
#endif

// ---------------------------------------------------------------------------------------
// bfloat16 products through brgemm (oneDNN's micro-kernel, AMX tiles where present)
// ---------------------------------------------------------------------------------------
// ``at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, add_C, A, B, C, is_vnni=true)``:
// C (M x N float32, ldc) (+)= A (M x K bfloat16 rows, lda) B, with B in the VNNI layout
// ``[K / 2][ldb][2]`` (pairs along the summed index) -- the layout our operands already
// have: a key panel ``[dp / 2][16][2]`` is B of Q K^T for 16 slots (ldb 16), the slot pairs
// ``[slots / 2][dp][2]`` are B of P V and dS K, and the row pairs of P and dS B of the two
// products summed over query rows, computed transposed (dV^T += dO^T P, dK^T += Q^T dS:
// brgemm reads its A in rows, and dO^T, Q^T are made once per query tile). oneDNN
// generates the kernel per shape for the CPU it runs on: AMX tiles on CPUs with AMX, AVX-512
// (VDPBF16PS where present) elsewhere, the same calls and layouts on both. PyTorch runs
// it where its oneDNN has the micro-kernel API and the CPU has AVX-512; elsewhere the call
// raises, and brgemm_bf16_available() (small products checked exactly) says no.
namespace brg = at::native::cpublas;

// Whether brgemm takes bfloat16 operands in the VNNI layout here: the AVX-512 build (its
// slots are padded to 16, a whole key panel) on a CPU with AVX512-BF16 (the operands are
// rounded with its instructions, as for the native products; every CPU with AMX has it)
// and five small products, one of each kind of call the kernels make, compared exactly
// with the float32 sums (quarters of small integers: exact in both). On a CPU with AMX
// they run on its tiles, so a layout or shape the tiles take otherwise turns the brgemm
// products off there instead of giving wrong results.
bool brgemm_bf16_available() {
  static const bool ok = [] {
    if (Vec<float>::size() != 16 || !native_bf16_available()) return false;
    // the kernels' kinds of call: the prefix keys' scores (N 16, K dp, ldb = all slots),
    // a block of scores from keys across all slots (ldb > N; both with ldc > N: the rows
    // of padded_row), a P V block (lda > K: P's padded rows, ldb = ldc = N = dp, added to
    // C), the backward's dS K block (the same, not added), a transposed dV / dK block
    // (N > 64, ldb > N, ldc > N, odd M, K not a multiple of 32, added);
    // {M, N, K, lda, ldb, ldc, add_C}
    const int shapes[5][7] = {{7, 16, 64, 64, 48, 32, 0},
                              {13, 48, 64, 64, 80, 64, 0},
                              {5, 32, 48, 64, 32, 32, 1},
                              {7, 32, 48, 64, 32, 32, 0},
                              {17, 80, 18, 20, 96, 112, 1}};
    try {
      for (const auto& sh : shapes) {
        const int M = sh[0], N = sh[1], K = sh[2], lda = sh[3], ldb = sh[4], ldc = sh[5];
        const bool add = sh[6];
        std::vector<bf16> a((size_t)M * lda), b((size_t)(K / 2) * ldb * 2);
        std::vector<float> c((size_t)M * ldc), ref((size_t)M * ldc);
        for (size_t i = 0; i < c.size(); ++i) c[i] = ref[i] = add ? float(i % 3) : 0.f;
        for (int m = 0; m < M; ++m)
          for (int k = 0; k < K; ++k) a[m * lda + k] = bf16(float((m * K + k) % 7 - 3) * 0.25f);
        for (int k = 0; k < K; ++k)
          for (int n = 0; n < N; ++n) {
            const float x = float((k * N + n) % 5 - 2) * 0.25f;
            b[(k / 2) * ldb * 2 + n * 2 + (k & 1)] = bf16(x);
            for (int m = 0; m < M; ++m) ref[m * ldc + n] += float(a[m * lda + k]) * x;
          }
        brg::brgemm(M, N, K, lda, ldb, ldc, add, a.data(), b.data(), c.data(), true);
        if (!std::equal(c.begin(), c.end(), ref.begin())) {
          brg::brgemm_release(true);
          return false;
        }
      }
      brg::brgemm_release(true);
    } catch (const std::exception&) {
      return false;  // no oneDNN micro-kernel in this torch, or a CPU without AVX-512
    }
    return true;
  }();
  return ok;
}

// Whether this CPU packs bfloat16 for AMX tiles (PyTorch's own test for AMX, as its flash
// attention uses it).
bool amx_bf16_available() { return brg::could_pack(at::kBFloat16); }

// One head's keys (or values) in the VNNI layout brgemm takes as B of a product summed over
// channels, across all slots: ``[dp / 2][slots][2]`` (slot s, channel c at
// ``((c / 2) * slots + s) * 2 + c % 2``), so that any block of slots s0 .. s0 + ns is one B
// (from ``dst + 2 * s0``, ldb = slots) and its scores one brgemm call. (Panels of 16 slots
// took one call per panel: a kernel lookup per 16 scores per row block, and A re-read for
// each, which on AMX cost more than the tiles' products.) Padding is never written.
void pack_head_vnni(const bf16* src, int64_t ld, const Tiles& tl, int d, bf16* dst) {
  const int64_t pair_row = 2 * (int64_t)tl.slots;
  auto put = [&](const bf16* x, int s) {
    bf16* p = dst + 2 * (int64_t)s;
    for (int c = 0; c < d; ++c) p[(c / 2) * pair_row + (c & 1)] = x[c];
  };
  for (int j = 0; j < tl.J; ++j) put(src + j * ld, j);
  for (int t = 0; t < tl.n; ++t)
    for (int i = 0; i < tl.size(t); ++i)
      put(src + (int64_t)(tl.J + tl.order[tl.start[t] + i]) * ld, tl.slot[t] + i);
}

// C (n x ns, ldc) = A (n x dp bfloat16 rows, lda) * B^T for the slots s0 .. s0 + ns of B in
// the VNNI layout of pack_head_vnni (``slots`` slots in all): one brgemm call.
void qk_brgemm(const bf16* A, int lda, int n, int dp, const bf16* Bv, int slots, int s0,
               int ns, float* C, int ldc) {
  brg::brgemm(n, ns, dp, lda, slots, ldc, false, A, Bv + 2 * (int64_t)s0, C, true);
}

#if defined(LH_NATIVE_BF16)
// ---------------------------------------------------------------------------------------
// bfloat16 rows of whole 8 x 8 tiles
// ---------------------------------------------------------------------------------------
// Where P is bfloat16 (the native products) and a block is whole 8 x 8 key tiles with no
// key term (the common case: every tile of a grid of multiples of 8), a row's passes read
// the scores and the bias and store nothing but P: the scores S (float32, written by the
// product) are not rewritten with the bias, which on AMX left the passes bound by the
// traffic of S. After the row's first block of tiles, one pass: P = exp(S - m) against the
// running maximum m of the earlier blocks, with the block's own maximum b taken alongside;
// it stands where b <= m + LAZY_RESCALE (P and the sums then hold values up to
// e^LAZY_RESCALE, far inside float32 / bfloat16's range, and lose nothing: rounding is
// relative), else the block is redone in two passes with the new maximum. The key blocks
// go nearest first (forward_impl), so the first block of tiles holds the largest bias
// (0 at distance 0) and the later ones seldom exceed its maximum.
constexpr float LAZY_RESCALE = 20.f;

// Whether the block is whole 8 x 8 key tiles (no padding, not the prefix keys).
inline bool whole_8x8(const Tiles& tl, const Block& blk) {
  if (blk.prefix) return false;
  for (int t = blk.t0; t < blk.t1; ++t)
    if (tl.rows[t] != 8 || tl.cols[t] != 8) return false;
  return true;
}

// The bias of query (qy, qx) against tile rows 2i, 2i + 1 of key tile t: 16 floats, two
// 8-float runs of the table.
LH_BF16 inline __m512 bias16_8x8(const float* table_h, const Tiles& tl, int t, int qy, int qx,
                                 int i) {
  const int W2 = 2 * tl.W - 1;
  const float* b = tile_bias(table_h, tl, t, qy, qx) + 2 * i * W2;
  return join8(_mm256_loadu_ps(b), _mm256_loadu_ps(b + W2));
}

// max(mx, the row's largest S * scale + bias), NaN if any is NaN (or mx is); nothing stored.
LH_BF16 float row_max_8x8_bf16(const float* row, const Tiles& tl, const Block& blk,
                               const float* table_h, int qy, int qx, float scale, float mx) {
  const __m512 vs = _mm512_set1_ps(scale);
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 nan = 0;
  for (int t = blk.t0; t < blk.t1; ++t, row += 64)
    for (int i = 0; i < 4; ++i) {
      const __m512 x =
          _mm512_fmadd_ps(_mm512_loadu_ps(row + 16 * i), vs, bias16_8x8(table_h, tl, t, qy, qx, i));
      nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
      vmax = _mm512_max_ps(vmax, x);
    }
  if (nan) return std::numeric_limits<float>::quiet_NaN();
  const float m = _mm512_reduce_max_ps(vmax);
  return m > mx ? m : mx;  // a NaN mx stays
}

// P = exp(S * scale + bias - m) rounded to bfloat16 (NaN stays NaN, -inf gives 0); returns
// the sum of the unrounded values and, with kMax, the row's largest S * scale + bias in
// *bmax (NaN if any is NaN).
template <bool kMax>
LH_BF16 float row_exp_8x8_bf16(const float* row, c10::BFloat16* p, const Tiles& tl,
                               const Block& blk, const float* table_h, int qy, int qx,
                               float scale, float m, float* bmax) {
  const __m512 vs = _mm512_set1_ps(scale);
  const __m512 l2e = _mm512_set1_ps(1.44269504f), off = _mm512_set1_ps(-m * 1.44269504f);
  __m512 sum = _mm512_setzero_ps(), vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 nan = 0;
  for (int t = blk.t0; t < blk.t1; ++t, row += 64, p += 64)
    for (int i = 0; i < 4; i += 2) {
      const __m512 x0 = _mm512_fmadd_ps(_mm512_loadu_ps(row + 16 * i), vs,
                                        bias16_8x8(table_h, tl, t, qy, qx, i));
      const __m512 x1 = _mm512_fmadd_ps(_mm512_loadu_ps(row + 16 * i + 16), vs,
                                        bias16_8x8(table_h, tl, t, qy, qx, i + 1));
      if constexpr (kMax) {
        nan |= _mm512_cmp_ps_mask(x0, x1, _CMP_UNORD_Q);
        vmax = _mm512_max_ps(vmax, _mm512_max_ps(x0, x1));
      }
      const __m512 e0 = exp_minus_avx512_v(x0, l2e, off), e1 = exp_minus_avx512_v(x1, l2e, off);
      sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
      _mm512_storeu_si512((void*)(p + 16 * i), (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
    }
  if constexpr (kMax)
    *bmax = nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(vmax);
  return _mm512_reduce_add_ps(sum);
}
#endif

// ---------------------------------------------------------------------------------------
// Softmax blocks (shared by both product kinds)
// ---------------------------------------------------------------------------------------
// The row stride (elements) of a block of score / probability rows up to ``width`` wide,
// forward and backward: the row rounded up to whole 64-byte cache lines (every row then
// starts on a line of its Buffer) plus one line. A row of 1024 float32 scores is 4096
// bytes, and rows 4096 bytes apart all fall in one set of the L1 cache: the scores
// product's stores of 16-row tiles (AMX) evicted each other, and that product took ~2x its
// time (bf16 forward on AMX, one thread: the whole kernel ~10 % slower).
template <typename E>
inline int padded_row(int width) {
  constexpr int line = (int)(kCacheLine / sizeof(E));
  return round_up(width, line) + line;
}

// Forward, one block of scores s (nq x ns, rows lds apart): per query row the bias added
// with the scale, the running maximum mrow and sum lrow updated; p (nq x ns, rows ldp
// apart; may be s) holds exp(S - m) in P's type afterwards and alpha the factor the row's
// accumulator is to be multiplied by (1: unchanged). ``lazy``: a block after the rows'
// first block of tiles (the one-pass exp of section "bfloat16 rows of whole 8 x 8 tiles"
// may stand).
template <typename T, typename P>
void online_softmax_block(T* s, int lds, P* p, int ldp, int nq, int ns, const Tiles& tl,
                          const Block& blk, const T* table_h, const T* key_h, const int* qy,
                          const int* qx, T scale, T* mrow, T* lrow, T* alpha, bool lazy) {
  const T lowest = -std::numeric_limits<T>::infinity();
#if defined(LH_NATIVE_BF16)
  constexpr bool kRows8x8 = std::is_same_v<T, float> && std::is_same_v<P, c10::BFloat16>;
  const bool rows_8x8 = kRows8x8 && !key_h && whole_8x8(tl, blk);
#endif
  for (int r = 0; r < nq; ++r) {
    T* row = s + (int64_t)r * lds;
    P* prow = p + (int64_t)r * ldp;
#if defined(LH_NATIVE_BF16)
    if constexpr (kRows8x8) {
      if (rows_8x8) {
        if (lazy && std::isfinite(mrow[r])) {  // one pass against the running maximum
          float bmax;
          const float sum = row_exp_8x8_bf16<true>(row, prow, tl, blk, table_h, qy[r], qx[r],
                                                   scale, mrow[r], &bmax);
          if (!(bmax > mrow[r] + LAZY_RESCALE)) {  // NaN stands: it is in the sum
            alpha[r] = 1;
            lrow[r] += sum;
            continue;
          }
        }
        const float mnew =
            row_max_8x8_bf16(row, tl, blk, table_h, qy[r], qx[r], scale, mrow[r]);
        if (mnew == lowest) {  // nothing seen yet
          std::fill(prow, prow + ns, P(0));
          alpha[r] = 1;
          continue;
        }
        alpha[r] = mnew == mrow[r] ? T(1) : std::exp(mrow[r] - mnew);
        lrow[r] = lrow[r] * alpha[r] + row_exp_8x8_bf16<false>(row, prow, tl, blk, table_h,
                                                               qy[r], qx[r], scale, mnew,
                                                               nullptr);
        mrow[r] = mnew;
        continue;
      }
    }
#endif
    const T mnew = scale_bias_max<T>(row, tl, blk, table_h, key_h, qy[r], qx[r], scale, mrow[r]);
    if (mnew == lowest) {  // nothing seen yet
      std::fill(prow, prow + ns, P(0));
      alpha[r] = 1;
      continue;
    }
    alpha[r] = mnew == mrow[r] ? T(1) : std::exp(mrow[r] - mnew);  // exp(0) without the call
    lrow[r] = lrow[r] * alpha[r] + exp_store<T, P>(row, prow, ns, mnew);
    mrow[r] = mnew;
  }
}

// acc[r] *= alpha[r] (rows of dp) where alpha[r] != 1.
template <typename T>
void rescale_rows(T* acc, int nq, int dp, const T* alpha) {
  constexpr int V = Vec<T>::size();
  for (int r = 0; r < nq; ++r)
    if (alpha[r] != T(1)) {
      T* a = acc + (int64_t)r * dp;
      const Vec<T> va(alpha[r]);
      for (int c = 0; c < dp; c += V) (Vec<T>::loadu(a + c) * va).store(a + c);
    }
}

// The normalised output rows and their log-sum-exp, written to the model's token rows.
template <typename T, typename IT>
void write_rows(const Tiles& tl, int qt, int nq, int dp, int d, T* acc, const T* mrow,
                const T* lrow, IT* oh, int64_t ostride, T* lh, int64_t lstride) {
  const T lowest = -std::numeric_limits<T>::infinity();
  for (int r = 0; r < nq; ++r) {
    const int64_t row = tl.J + tl.order[tl.start[qt] + r];
    IT* o = oh + row * ostride;
    T* a = acc + (int64_t)r * dp;
    if (!(lrow[r] == 0)) {  // NaN included: it propagates, as in the reference
      const T inv = T(1) / lrow[r];
      for (int c = 0; c < d; ++c) a[c] *= inv;
      store_row<T, IT>(o, a, d);
      lh[row * lstride] = mrow[r] + std::log(lrow[r]);
    } else {
      for (int c = 0; c < d; ++c) o[c] = IT(0);
      lh[row * lstride] = lowest;
    }
  }
}

// Backward, one block: s (nq x ns, rows lds apart) from Q K^T to P = exp(S * scale + bias -
// lse).
template <typename T>
void probs_block(T* s, int lds, int nq, int ns, const Tiles& tl, const Block& blk,
                 const T* table_h, const T* key_h, const int* qy, const int* qx, T scale,
                 const T* lrow) {
  const T lowest = -std::numeric_limits<T>::infinity();
  for (int r = 0; r < nq; ++r) {
    T* row = s + (int64_t)r * lds;
    if (lrow[r] == lowest) {
      std::fill(row, row + ns, T(0));
      continue;
    }
    scale_bias_max<T>(row, tl, blk, table_h, key_h, qy[r], qx[r], scale, lowest);
    exp_sum<T>(row, ns, lrow[r]);
  }
}

// Backward, one block: p (P) to dS = P * (dP - delta), row by row (rows lds apart).
template <typename T>
void dscores_block(T* p, const T* dprob, int lds, int nq, int ns, const T* delta) {
  constexpr int V = Vec<T>::size();
  for (int r = 0; r < nq; ++r) {
    T* pr = p + (int64_t)r * lds;
    const T* g = dprob + (int64_t)r * lds;
    const Vec<T> dl(delta[r]);
    for (int c = 0; c < ns; c += V) (Vec<T>::loadu(pr + c) * (Vec<T>::loadu(g + c) - dl)).store(pr + c);
  }
}

// Backward, one block: the bias's gradients from dS (nq x ns, rows lds apart), the
// transpose of bias_row: each score's dS added to the table entry its bias was read from
// and, where there is a key term (dkey_h not null, tile order), to its key's entry. The
// prefix keys' bias is the constant 0; padded slots were never read.
template <typename T>
void bias_grad_block(T* dtab_h, T* dkey_h, const T* ds, int lds, int nq, const Tiles& tl,
                     const Block& blk, const int* qy, const int* qx) {
  if (blk.prefix) return;
  const int W2 = 2 * tl.W - 1;
  for (int r = 0; r < nq; ++r) {
    const T* src = ds + (int64_t)r * lds;
    for (int t = blk.t0; t < blk.t1; ++t) {
      const int rows = tl.rows[t], cols = tl.cols[t];
      T* b = tile_bias(dtab_h, tl, t, qy[r], qx[r]);
      const T* x = src + (tl.slot[t] - blk.s0);
      if (dkey_h) {
        T* e = dkey_h + tl.start[t];
        for (int i = 0; i < rows * cols; ++i) e[i] += x[i];
      }
      for (int i = 0; i < rows; ++i, b += W2, x += cols)
        for (int c = 0; c < cols; ++c) b[c] += x[c];
    }
  }
}

// ---------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------
// The forward's products, one policy per kind. KT: the element type of the packed keys /
// values and of the query block.
//   FloatProducts: float32 / float64 FMA kernels (bf16 / fp16 inputs converted as packed);
//   NativeBf16Products: VDPBF16PS (keys as panels, values as slot pairs, P rounded to bf16).
template <typename T, typename IT>
struct FloatProducts {
  using KT = T;
  using PT = T;  // P in place of the scores
  static void pack_keys(const IT* src, int64_t ld, const Tiles& tl, int d, int dp, KT* dst) {
    pack_head<IT, T>(src, ld, tl, d, dp, nullptr, dst);
  }
  static void pack_values(const IT* src, int64_t ld, const Tiles& tl, int d, int dp, KT* dst) {
    pack_head<IT, T>(src, ld, tl, d, dp, dst, nullptr);
  }
  // S (nq x ns, rows lds apart) = Q K^T for the key slots s0 .. s0 + ns of a head's
  // packed keys kh
  static void scores(const KT* q, int nq, int dp, const KT* kh, int, int s0, int ns, T* s,
                     int lds) {
    gemm_panels<T>(q, nq, dp, kh + (int64_t)s0 * dp, ns, s, lds);
  }
  // acc (nq x dp) += P V, P (nq x ns) with rows ldp apart
  static void accumulate(const T* p, int ldp, int nq, int ns, const KT* v, int dp, T* acc) {
    gemm_rows<T>(p, ldp, nq, ns, v, dp, acc, T(1));
  }
  static void release() {}
};

struct NativeBf16Products {
  using KT = bf16;
  using PT = bf16;  // P rounded to bf16 by the softmax pass, into a buffer of its own
  static void pack_keys(const bf16* src, int64_t ld, const Tiles& tl, int d, int dp, bf16* dst) {
    pack_head_bf16(src, ld, tl, d, dp, nullptr, dst);
  }
  static void pack_values(const bf16* src, int64_t ld, const Tiles& tl, int d, int dp,
                          bf16* dst) {
    pack_head_bf16(src, ld, tl, d, dp, dst, nullptr);
  }
  static void scores(const bf16* q, int nq, int dp, const bf16* kh, int, int s0, int ns,
                     float* s, int lds) {
    qk_bf16(q, dp, nq, dp, kh + (int64_t)s0 * dp, ns, s, lds);
  }
  static void accumulate(const bf16* p, int ldp, int nq, int ns, const bf16* v, int dp,
                         float* acc) {
    av_bf16(p, ldp, nq, ns, v, dp, acc, 1.f);
  }
  static void release() {}
};

// The same operands and roundings through brgemm (keys in the VNNI layout across all
// slots, values as slot pairs).
struct BrgemmBf16Products : NativeBf16Products {
  static void pack_keys(const bf16* src, int64_t ld, const Tiles& tl, int d, int, bf16* dst) {
    pack_head_vnni(src, ld, tl, d, dst);
  }
  static void scores(const bf16* q, int nq, int dp, const bf16* kh, int slots, int s0, int ns,
                     float* s, int lds) {
    qk_brgemm(q, dp, nq, dp, kh, slots, s0, ns, s, lds);
  }
  static void accumulate(const bf16* p, int ldp, int nq, int ns, const bf16* v, int dp,
                         float* acc) {
    brg::brgemm(nq, dp, ns, ldp, dp, dp, true, p, v, acc, true);
  }
  static void release() { brg::brgemm_release(true); }  // the AMX tile state, per thread
};

template <typename T, typename IT, typename Products>
void forward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& table, const c10::optional<at::Tensor>& key_term,
                  const Plan& plan, const Tiles& tl, double scale_d, int max_keys,
                  int64_t gather_bytes, at::Tensor& out, at::Tensor& lse) {
  using KT = typename Products::KT;
  using PT = typename Products::PT;
  constexpr int V = Vec<T>::size();
  constexpr bool kRoundsP = !std::is_same_v<PT, T>;  // P needs a buffer of its own
  const int64_t B = q.size(0), heads = q.size(1), N = (int64_t)tl.H * tl.W;
  const int d = (int)q.size(3), dp = round_up(d, V), J = tl.J;
  const T scale = (T)scale_d;
  const IT* qp = q.data_ptr<IT>();
  const T* tp = table.data_ptr<T>();
  const T* kt = key_term ? key_term->data_ptr<T>() : nullptr;
  IT* op = out.data_ptr<IT>();
  T* lp = lse.data_ptr<T>();
  const int64_t tab = (int64_t)(2 * tl.H - 1) * (2 * tl.W - 1);
  const int64_t BH = B * heads;
  const int64_t head_bytes = 2 * (int64_t)tl.slots * dp * sizeof(KT);
  const int64_t phase = std::min<int64_t>(BH, std::max<int64_t>(1, gather_bytes / head_bytes));
  const int64_t per = (int64_t)tl.slots * dp;
  Buffer<KT> kpan(phase * per, KT(0)), vrow(phase * per, KT(0));  // the padding stays 0
  const int max_tile = tl.max_tile();
  const int width = std::max(round_up(max_keys, V), std::max(round_up(max_tile, V), tl.Jp));
  // the rows of the S and P buffers: a cache line longer than the widest block (padded_row;
  // ldp == lds where P is written in place of S)
  const int lds = padded_row<T>(width), ldp = padded_row<PT>(width);

  for (int64_t p0 = 0; p0 < BH; p0 += phase) {
    const int64_t p1 = std::min(BH, p0 + phase);
    at::parallel_for(0, p1 - p0, 1, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        const int64_t bh = p0 + i, bb = bh / heads, h = bh % heads;
        Products::pack_keys(k.data_ptr<IT>() + bb * k.stride(0) + h * k.stride(1), k.stride(2),
                            tl, d, dp, kpan.data() + i * per);
        Products::pack_values(v.data_ptr<IT>() + bb * v.stride(0) + h * v.stride(1),
                              v.stride(2), tl, d, dp, vrow.data() + i * per);
      }
    });
    const int64_t items = (p1 - p0) * plan.nqt;
    std::atomic<int64_t> next(0);
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
      Buffer<KT> qb((size_t)max_tile * dp, KT(0));
      Buffer<PT> pb(kRoundsP ? (size_t)max_tile * ldp : 0);
      Buffer<T> acc((size_t)max_tile * dp), sb((size_t)max_tile * lds),
          mrow(max_tile), lrow(max_tile), alpha(max_tile);
      std::vector<int> qy(max_tile), qx(max_tile);
      std::vector<Block> blocks;
      for (int64_t it; (it = next.fetch_add(1)) < items;) {
        const int64_t i = it / plan.nqt, bh = p0 + i, bb = bh / heads, h = bh % heads;
        const int qt = (int)(it % plan.nqt);
        const int nq = tl.size(qt);
        const IT* qh = qp + bb * q.stride(0) + h * q.stride(1);
        for (int r = 0; r < nq; ++r) {
          const int patch = tl.order[tl.start[qt] + r];
          load_row<IT, KT>(qb.data() + (int64_t)r * dp, qh + (J + patch) * q.stride(2), d);
          qy[r] = patch / tl.W;
          qx[r] = patch % tl.W;
          mrow[r] = -std::numeric_limits<T>::infinity();
          lrow[r] = 0;
        }
        std::fill(acc.begin(), acc.begin() + (int64_t)nq * dp, T(0));
        blocks_of(tl, plan, plan.head_group[h], qt, max_keys, blocks);
        nearest_first(tl, qt, blocks);
        const T* table_h = tp + h * tab;
        const T* key_h = kt ? kt + h * N : nullptr;
        const KT* kh = kpan.data() + i * per;
        const KT* vh = vrow.data() + i * per;
        bool lazy = false;  // after the first block of tiles
        for (const Block& blk : blocks) {
          const int ns = blk.ns;
          T* s = sb.data();
          PT* p;
          if constexpr (kRoundsP) p = pb.data(); else p = s;
          Products::scores(qb.data(), nq, dp, kh, tl.slots, blk.s0, ns, s, lds);
          online_softmax_block<T, PT>(s, lds, p, ldp, nq, ns, tl, blk, table_h, key_h,
                                      qy.data(), qx.data(), scale, mrow.data(), lrow.data(),
                                      alpha.data(), lazy);
          lazy = lazy || !blk.prefix;
          rescale_rows<T>(acc.data(), nq, dp, alpha.data());
          Products::accumulate(p, ldp, nq, ns, vh + (int64_t)blk.s0 * dp, dp, acc.data());
        }
        write_rows<T, IT>(tl, qt, nq, dp, d, acc.data(), mrow.data(), lrow.data(),
                          op + bb * out.stride(0) + h * out.stride(1), out.stride(2),
                          lp + bb * lse.stride(0) + h * lse.stride(1), lse.stride(2));
      }
      Products::release();
    });
  }
}


// ---------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------
// Items of the backward: (batch, head) pairs, heads with more visible key slots first.
std::vector<int64_t> backward_items(const Plan& plan, const Tiles& tl, int64_t B,
                                    int64_t heads) {
  std::vector<int64_t> cost(heads, 0);
  for (int64_t h = 0; h < heads; ++h) {
    const int* rp = plan.run_ptr + (int64_t)plan.head_group[h] * (plan.nqt + 1);
    for (int qt = 0; qt < plan.nqt; ++qt)
      for (int r = rp[qt]; r < rp[qt + 1]; ++r)
        cost[h] += (int64_t)(tl.slot[plan.runs[2 * r + 1]] - tl.slot[plan.runs[2 * r]]) *
                   tl.size(qt);
  }
  std::vector<int64_t> items;
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t h = 0; h < heads; ++h) items.push_back(bb * heads + h);
  std::stable_sort(items.begin(), items.end(),
                   [&](int64_t a, int64_t b) { return cost[a % heads] > cost[b % heads]; });
  return items;
}

// One head's dK / dV (float32 slots) written back to the model's token rows.
template <typename T, typename IT>
void write_key_grads(const Tiles& tl, int dp, int d, const T* dkh, const T* dvh, IT* dk_out,
                     int64_t dk_stride, IT* dv_out, int64_t dv_stride) {
  for (int t = 0; t < tl.n; ++t)
    for (int i = 0; i < tl.size(t); ++i) {
      const int64_t row = tl.J + tl.order[tl.start[t] + i];
      const int64_t sl = (int64_t)(tl.slot[t] + i) * dp;
      store_row<T, IT>(dk_out + row * dk_stride, dkh + sl, d);
      store_row<T, IT>(dv_out + row * dv_stride, dvh + sl, d);
    }
  for (int j = 0; j < tl.J; ++j) {
    store_row<T, IT>(dk_out + j * dk_stride, dkh + (int64_t)j * dp, d);
    store_row<T, IT>(dv_out + j * dv_stride, dvh + (int64_t)j * dp, d);
  }
}

// The backward's products and the operands they read, one set per thread: one head's
// keys and values packed, the query tile's Q and dO rows.
//   FloatBackward: float32 / float64 FMA kernels (bf16 / fp16 inputs converted as loaded).
//   NativeBf16Backward: VDPBF16PS; keys also as slot pairs (dS K), Q, dO, P and dS also as
//   row pairs (P^T dO, dS^T Q), P and dS rounded to bf16 as operands.
template <typename T, typename IT>
struct FloatBackward {
  Buffer<T> krow, kpan, vpan, qb, dob;
  FloatBackward(int64_t per, int max_tile, int dp, int)
      : krow(per, T(0)), kpan(per, T(0)), vpan(per, T(0)), qb((size_t)max_tile * dp, T(0)),
        dob((size_t)max_tile * dp, T(0)) {}
  void pack(const IT* kh, int64_t kld, const IT* vh, int64_t vld, const Tiles& tl, int d,
            int dp) {
    pack_head<IT, T>(kh, kld, tl, d, dp, krow.data(), kpan.data());
    pack_head<IT, T>(vh, vld, tl, d, dp, nullptr, vpan.data());
  }
  // row r of the query tile: its q and dO
  void load(int r, const IT* x, const IT* gx, int d, int dp) {
    load_row<IT, T>(qb.data() + (int64_t)r * dp, x, d);
    load_row<IT, T>(dob.data() + (int64_t)r * dp, gx, d);
  }
  void pad(int, int, int) {}  // no row pairs
  // S = Q K^T (the float32 blocks S, P, dP, dS: rows lds apart, padded_row)
  void scores(int nq, int dp, int64_t off, int ns, T* s, int lds) {
    gemm_panels<T>(qb.data(), nq, dp, kpan.data() + off, ns, s, lds);
  }
  // dV += P^T dO
  void dv(const T* p, int lds, int nq, int ns, int dp, int64_t off, T* dvh) {
    gemm_t<T>(p, lds, nq, ns, dob.data(), dp, dvh + off, T(1));
  }
  // dP = dO V^T
  void dprob(int nq, int dp, int64_t off, int ns, T* dprob, int lds) {
    gemm_panels<T>(dob.data(), nq, dp, vpan.data() + off, ns, dprob, lds);
  }
  // dQ += scale dS K ; dK += scale dS^T Q
  void dq_dk(const T* ds, int lds, int nq, int ns, int dp, int64_t off, T* dqb, T* dkh,
             T scale) {
    gemm_rows<T>(ds, lds, nq, ns, krow.data() + off, dp, dqb, scale);
    gemm_t<T>(ds, lds, nq, ns, qb.data(), dp, dkh, scale);
  }
  void keys(T*, T*, int, T) {}  // dK, dV are accumulated in place
  void release() {}
};

struct NativeBf16Backward {
  Buffer<bf16> kpan, kpair, vpan, qb, dob, qpair, dopair, ppair, dsb, dspair;
  // the rows of dsb (dS in bf16 rows) and the pairs of rows of ppair / dspair (P and dS as
  // row pairs, whose elements are pairs of bf16): padded_row
  int ldb16, ldpair;
  NativeBf16Backward(int64_t per, int max_tile, int dp, int width)
      : kpan(per, bf16(0.f)), kpair(per, bf16(0.f)), vpan(per, bf16(0.f)),
        qb((size_t)max_tile * dp, bf16(0.f)), dob((size_t)max_tile * dp, bf16(0.f)),
        qpair((size_t)round_up(max_tile, 2) * dp, bf16(0.f)),
        dopair((size_t)round_up(max_tile, 2) * dp, bf16(0.f)),
        ppair((size_t)round_up(max_tile, 2) * padded_row<float>(width)),
        dsb((size_t)max_tile * padded_row<bf16>(width)),
        dspair((size_t)round_up(max_tile, 2) * padded_row<float>(width)),
        ldb16(padded_row<bf16>(width)), ldpair(padded_row<float>(width)) {}
  // dsb = dS rounded to bf16, rows ldb16 apart
  void round_ds(const float* ds, int lds, int nq, int ns) {
    for (int r = 0; r < nq; ++r)
      store_row<float, bf16>(dsb.data() + (int64_t)r * ldb16, ds + (int64_t)r * lds, ns);
  }
  void pack(const bf16* kh, int64_t kld, const bf16* vh, int64_t vld, const Tiles& tl, int d,
            int dp) {
    pack_head_bf16(kh, kld, tl, d, dp, kpair.data(), kpan.data());
    pack_head_bf16(vh, vld, tl, d, dp, nullptr, vpan.data());
  }
  void load(int r, const bf16* x, const bf16* gx, int d, int dp) {
    std::memcpy(qb.data() + (int64_t)r * dp, x, sizeof(bf16) * d);
    std::memcpy(dob.data() + (int64_t)r * dp, gx, sizeof(bf16) * d);
    bf16* qpr = qpair.data() + (int64_t)(r / 2) * dp * 2 + (r & 1);
    bf16* dpr = dopair.data() + (int64_t)(r / 2) * dp * 2 + (r & 1);
    for (int c = 0; c < d; ++c) {
      qpr[2 * c] = x[c];
      dpr[2 * c] = gx[c];
    }
  }
  // an odd tile's partner row in the row pairs: zeros
  void pad(int nq, int d, int dp) {
    if (nq % 2 == 0) return;
    bf16* qpr = qpair.data() + (int64_t)(nq / 2) * dp * 2 + 1;
    bf16* dpr = dopair.data() + (int64_t)(nq / 2) * dp * 2 + 1;
    for (int c = 0; c < d; ++c) qpr[2 * c] = dpr[2 * c] = bf16(0.f);
  }
  void scores(int nq, int dp, int64_t off, int ns, float* s, int lds) {
    qk_bf16(qb.data(), dp, nq, dp, kpan.data() + off, ns, s, lds);
  }
  void dv(const float* p, int lds, int nq, int ns, int dp, int64_t off, float* dvh) {
    to_row_pairs_bf16(p, lds, nq, ns, ppair.data(), ldpair);
    tb_bf16(ppair.data(), ldpair, round_up(nq, 2), ns, dopair.data(), dp, dvh + off, 1.f);
  }
  void dprob(int nq, int dp, int64_t off, int ns, float* dprob, int lds) {
    qk_bf16(dob.data(), dp, nq, dp, vpan.data() + off, ns, dprob, lds);
  }
  void dq_dk(const float* ds, int lds, int nq, int ns, int dp, int64_t off, float* dqb,
             float* dkh, float scale) {
    round_ds(ds, lds, nq, ns);
    av_bf16(dsb.data(), ldb16, nq, ns, kpair.data() + off, dp, dqb, scale);
    to_row_pairs_bf16(ds, lds, nq, ns, dspair.data(), ldpair);
    tb_bf16(dspair.data(), ldpair, round_up(nq, 2), ns, qpair.data(), dp, dkh, scale);
  }
  void keys(float*, float*, int, float) {}  // dK, dV are accumulated in place
  void release() {}
};

// The same products through brgemm. brgemm reads its A in rows, so the two products summed
// over query rows are computed transposed, with P and dS as B in row pairs (the layout the
// native products use): dV^T += dO^T P and dK^T += Q^T dS, dO^T and Q^T made once per
// query tile, dV^T and dK^T (channels x slots) held here and handed back transposed, dK
// scaled, by keys(). dQ += scale (dS K) through a scratch block (brgemm has no alpha).
struct BrgemmBf16Backward : NativeBf16Backward {
  int ldt, slots = 0;  // ldt: the query rows of qT / doT (the largest tile, rounded to even)
  Buffer<bf16> qT, doT;         // (dp, ldt)
  Buffer<float> dkT, dvT, tmp;  // (dp, slots), (max_tile, dp)
  BrgemmBf16Backward(int64_t per, int max_tile, int dp, int width)
      : NativeBf16Backward(per, max_tile, dp, width), ldt(round_up(max_tile, 2)),
        qT((size_t)dp * ldt, bf16(0.f)), doT((size_t)dp * ldt, bf16(0.f)), dkT(per), dvT(per),
        tmp((size_t)max_tile * dp) {}
  // keys as slot pairs (B of dS K) and, in kpan / vpan, keys and values in the VNNI layout
  // across all slots (B of Q K^T, dO V^T: one call per block)
  void pack(const bf16* kh, int64_t kld, const bf16* vh, int64_t vld, const Tiles& tl, int d,
            int dp) {
    pack_head_bf16(kh, kld, tl, d, dp, kpair.data(), nullptr);
    pack_head_vnni(kh, kld, tl, d, kpan.data());
    pack_head_vnni(vh, vld, tl, d, vpan.data());
    slots = tl.slots;
    std::fill(dkT.begin(), dkT.end(), 0.f);
    std::fill(dvT.begin(), dvT.end(), 0.f);
  }
  void load(int r, const bf16* x, const bf16* gx, int d, int dp) {
    NativeBf16Backward::load(r, x, gx, d, dp);
    for (int c = 0; c < d; ++c) {
      qT[(int64_t)c * ldt + r] = x[c];
      doT[(int64_t)c * ldt + r] = gx[c];
    }
  }
  void pad(int nq, int d, int dp) {
    NativeBf16Backward::pad(nq, d, dp);
    if (nq % 2 == 0) return;
    for (int c = 0; c < d; ++c) qT[(int64_t)c * ldt + nq] = doT[(int64_t)c * ldt + nq] = bf16(0.f);
  }
  void scores(int nq, int dp, int64_t off, int ns, float* s, int lds) {
    qk_brgemm(qb.data(), dp, nq, dp, kpan.data(), slots, (int)(off / dp), ns, s, lds);
  }
  void dv(const float* p, int lds, int nq, int ns, int dp, int64_t off, float*) {
    to_row_pairs_bf16(p, lds, nq, ns, ppair.data(), ldpair);
    brg::brgemm(dp, ns, round_up(nq, 2), ldt, ldpair, slots, true, doT.data(), ppair.data(),
                dvT.data() + off / dp, true);
  }
  void dprob(int nq, int dp, int64_t off, int ns, float* dprob, int lds) {
    qk_brgemm(dob.data(), dp, nq, dp, vpan.data(), slots, (int)(off / dp), ns, dprob, lds);
  }
  void dq_dk(const float* ds, int lds, int nq, int ns, int dp, int64_t off, float* dqb,
             float*, float scale) {
    round_ds(ds, lds, nq, ns);
    brg::brgemm(nq, dp, ns, ldb16, dp, dp, false, dsb.data(), kpair.data() + off, tmp.data(),
                true);
    for (int64_t i = 0; i < (int64_t)nq * dp; ++i) dqb[i] += scale * tmp[i];
    to_row_pairs_bf16(ds, lds, nq, ns, dspair.data(), ldpair);
    brg::brgemm(dp, ns, round_up(nq, 2), ldt, ldpair, slots, true, qT.data(), dspair.data(),
                dkT.data() + off / dp, true);
  }
  // dK = scale dK^T transposed, dV = dV^T transposed, into the slot rows (slots x dp)
  void keys(float* dkh, float* dvh, int dp, float scale) {
    for (int c = 0; c < dp; ++c) {
      const float* k = dkT.data() + (int64_t)c * slots;
      const float* v = dvT.data() + (int64_t)c * slots;
      for (int j = 0; j < slots; ++j) {
        dkh[(int64_t)j * dp + c] = scale * k[j];
        dvh[(int64_t)j * dp + c] = v[j];
      }
    }
  }
  void release() { brg::brgemm_release(true); }
};

// The flash backward per (batch, head): P recomputed from the global log-sum-exp, dK, dV
// accumulated in slot order, dQ per query tile; with dtable, each dS also added to the
// table entry (and key-term entry) its bias was read from.
template <typename T, typename IT, typename Products>
void backward_impl(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                   const at::Tensor& table, const c10::optional<at::Tensor>& key_term,
                   const Plan& plan, const Tiles& tl, double scale_d, int max_keys,
                   at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, T* dtable, T* dkey) {
  constexpr int V = Vec<T>::size();
  const int64_t B = q.size(0), heads = q.size(1), N = (int64_t)tl.H * tl.W;
  const int d = (int)q.size(3), dp = round_up(d, V), J = tl.J;
  const T scale = (T)scale_d;
  const int64_t tab = (int64_t)(2 * tl.H - 1) * (2 * tl.W - 1);
  const T* tp = table.data_ptr<T>();
  const T* kt = key_term ? key_term->data_ptr<T>() : nullptr;
  const int max_tile = tl.max_tile();
  const int width = std::max(round_up(max_keys, V), std::max(round_up(max_tile, V), tl.Jp));
  const int lds = padded_row<T>(width);  // the rows of the S / P / dS and dP blocks
  const std::vector<int64_t> items = backward_items(plan, tl, B, heads);
  std::atomic<int64_t> next(0);
  const int64_t n_items = (int64_t)items.size();
  const int64_t per = (int64_t)tl.slots * dp;
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    Products ops(per, max_tile, dp, width);
    Buffer<T> dkh(per), dvh(per), dqb((size_t)max_tile * dp), s((size_t)max_tile * lds),
        dprob((size_t)max_tile * lds), lrow(max_tile), delta(max_tile);
    std::vector<int> qy(max_tile), qx(max_tile);
    std::vector<Block> blocks;
    for (int64_t it; (it = next.fetch_add(1)) < n_items;) {
      const int64_t bh = items[it], bb = bh / heads, h = bh % heads;
      const int g = plan.head_group[h];
      const IT* qh = q.data_ptr<IT>() + bb * q.stride(0) + h * q.stride(1);
      const IT* doh = dout.data_ptr<IT>() + bb * dout.stride(0) + h * dout.stride(1);
      const IT* oh = out.data_ptr<IT>() + bb * out.stride(0) + h * out.stride(1);
      const T* lh = lse.data_ptr<T>() + bb * lse.stride(0) + h * lse.stride(1);
      IT* dqh = dq.data_ptr<IT>() + bb * dq.stride(0) + h * dq.stride(1);
      ops.pack(k.data_ptr<IT>() + bb * k.stride(0) + h * k.stride(1), k.stride(2),
               v.data_ptr<IT>() + bb * v.stride(0) + h * v.stride(1), v.stride(2), tl, d, dp);
      std::fill(dkh.begin(), dkh.end(), T(0));
      std::fill(dvh.begin(), dvh.end(), T(0));
      const T* table_h = tp + h * tab;
      const T* key_h = kt ? kt + h * N : nullptr;
      for (int qt = 0; qt < plan.nqt; ++qt) {
        const int nq = tl.size(qt);
        for (int r = 0; r < nq; ++r) {
          const int patch = tl.order[tl.start[qt] + r];
          const int64_t row = J + patch;
          const IT* x = qh + row * q.stride(2);
          const IT* gx = doh + row * dout.stride(2);
          const IT* o = oh + row * out.stride(2);
          ops.load(r, x, gx, d, dp);
          T acc = 0;  // delta = rowsum(dO * O)
          for (int c = 0; c < d; ++c) acc += static_cast<T>(gx[c]) * static_cast<T>(o[c]);
          delta[r] = acc;
          lrow[r] = lh[row * lse.stride(2)];
          qy[r] = patch / tl.W;
          qx[r] = patch % tl.W;
        }
        ops.pad(nq, d, dp);
        std::fill(dqb.begin(), dqb.begin() + (int64_t)nq * dp, T(0));
        blocks_of(tl, plan, g, qt, max_keys, blocks);
        for (const Block& blk : blocks) {
          const int ns = blk.ns;
          const int64_t off = (int64_t)blk.s0 * dp;
          ops.scores(nq, dp, off, ns, s.data(), lds);
          probs_block<T>(s.data(), lds, nq, ns, tl, blk, table_h, key_h, qy.data(), qx.data(),
                         scale, lrow.data());
          // dV += P^T dO ; dP = dO V^T ; dS = P (dP - delta)
          ops.dv(s.data(), lds, nq, ns, dp, off, dvh.data());
          ops.dprob(nq, dp, off, ns, dprob.data(), lds);
          dscores_block<T>(s.data(), dprob.data(), lds, nq, ns, delta.data());
          if (dtable)
            bias_grad_block<T>(dtable + bh * tab, dkey ? dkey + bh * N : nullptr, s.data(), lds,
                               nq, tl, blk, qy.data(), qx.data());
          // dQ += scale dS K ; dK += scale dS^T Q
          ops.dq_dk(s.data(), lds, nq, ns, dp, off, dqb.data(), dkh.data() + off, scale);
        }
        for (int r = 0; r < nq; ++r) {
          const int patch = tl.order[tl.start[qt] + r];
          store_row<T, IT>(dqh + (J + patch) * dq.stride(2), dqb.data() + (int64_t)r * dp, d);
        }
      }
      ops.keys(dkh.data(), dvh.data(), dp, scale);
      write_key_grads<T, IT>(tl, dp, d, dkh.data(), dvh.data(),
                             dk.data_ptr<IT>() + bb * dk.stride(0) + h * dk.stride(1),
                             dk.stride(2),
                             dv.data_ptr<IT>() + bb * dv.stride(0) + h * dv.stride(1),
                             dv.stride(2));
    }
    ops.release();
  });
}

// ---------------------------------------------------------------------------------------
// Operators
// ---------------------------------------------------------------------------------------
// The dtype of the products, the softmax, the bias table and the log-sum-exp.
at::ScalarType compute_type(at::ScalarType dt) {
  return dt == at::kDouble ? at::kDouble : at::kFloat;
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& table, const c10::optional<at::Tensor>& key_term,
                  const at::Tensor& run_ptr, const at::Tensor& runs,
                  const at::Tensor& head_group, int64_t H, int64_t W, int64_t th, int64_t tw,
                  int64_t J) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "fused LookHere attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be (B, heads, T, d)");
  const at::ScalarType dt = q.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kDouble || dt == at::kBFloat16 || dt == at::kHalf,
              "fused LookHere attention: float32, float64, bfloat16 or float16, got ", dt);
  for (const at::Tensor* t : {&k, &v})
    TORCH_CHECK(t->scalar_type() == dt, "q, k and v must share a dtype");
  TORCH_CHECK(table.scalar_type() == compute_type(dt), "table must be ", compute_type(dt),
              " for ", dt, " q, got ", table.scalar_type());
  TORCH_CHECK(q.sizes() == k.sizes() && q.sizes() == v.sizes(), "q, k, v shapes differ");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "q, k, v need a contiguous last dimension");
  TORCH_CHECK(H >= 1 && W >= 1 && th >= 1 && tw >= 1 && J >= 0, "bad grid, tile or J");
  TORCH_CHECK(q.size(2) == J + H * W, "q has ", q.size(2), " tokens, the grid needs ", J + H * W);
  TORCH_CHECK(table.is_contiguous() && table.dim() == 3 && table.size(0) == q.size(1) &&
                  table.size(1) == 2 * H - 1 && table.size(2) == 2 * W - 1,
              "table must be a contiguous (heads, 2H-1, 2W-1)");
  if (key_term)
    TORCH_CHECK(key_term->is_contiguous() && key_term->scalar_type() == table.scalar_type() &&
                    key_term->dim() == 2 && key_term->size(0) == q.size(1) &&
                    key_term->size(1) == H * W,
                "key_term must be a contiguous (heads, H*W) in tile order");
  for (const at::Tensor* t : {&run_ptr, &runs, &head_group})
    TORCH_CHECK(t->scalar_type() == at::kInt && t->is_contiguous(), "plan tensors: int32");
  TORCH_CHECK(head_group.numel() == q.size(1), "head_group must have one entry per head");
}

Plan make_plan(const at::Tensor& run_ptr, const at::Tensor& runs, const at::Tensor& head_group,
               const Tiles& tl) {
  TORCH_CHECK(run_ptr.dim() == 2 && run_ptr.size(1) == tl.n + 1,
              "run_ptr must be (groups, tiles + 1) for ", tl.n, " tiles");
  TORCH_CHECK(runs.dim() == 2 && runs.size(1) == 2, "runs must be (R, 2)");
  const int* hg = head_group.data_ptr<int>();
  for (int64_t h = 0; h < head_group.numel(); ++h)
    TORCH_CHECK(hg[h] >= 0 && hg[h] < run_ptr.size(0), "head_group out of range");
  const int* rs = runs.data_ptr<int>();
  for (int64_t r = 0; r < runs.size(0); ++r)
    TORCH_CHECK(0 <= rs[2 * r] && rs[2 * r] < rs[2 * r + 1] && rs[2 * r + 1] <= tl.n,
                "runs out of range");
  const int* rp = run_ptr.data_ptr<int>();
  for (int64_t g = 0; g < run_ptr.size(0); ++g)
    for (int t = 0; t < tl.n; ++t)
      TORCH_CHECK(0 <= rp[g * (tl.n + 1) + t] &&
                      rp[g * (tl.n + 1) + t] <= rp[g * (tl.n + 1) + t + 1] &&
                      rp[g * (tl.n + 1) + t + 1] <= runs.size(0),
                  "run_ptr out of range");
  return Plan{rp, rs, hg, tl.n};
}

int vector_width(at::ScalarType dtype) {
  return compute_type(dtype) == at::kDouble ? (int)Vec<double>::size() : (int)Vec<float>::size();
}

std::tuple<at::Tensor, at::Tensor> fused_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
    const c10::optional<at::Tensor>& key_term, const at::Tensor& run_ptr,
    const at::Tensor& runs, const at::Tensor& head_group, int64_t H, int64_t W, int64_t th,
    int64_t tw, int64_t J, double scale, int64_t max_keys, int64_t gather_bytes,
    bool native_bf16, bool brgemm) {
  check_inputs(q, k, v, table, key_term, run_ptr, runs, head_group, H, W, th, tw, J);
  Tiles tl((int)H, (int)W, (int)th, (int)tw, (int)J, vector_width(q.scalar_type()));
  Plan plan = make_plan(run_ptr, runs, head_group, tl);
  const int64_t B = q.size(0), heads = q.size(1), T = q.size(2), d = q.size(3);
  // (B, T, heads, d) in memory, like SDPA's output: the model's reshape is a view
  at::Tensor out = at::empty({B, T, heads, d}, q.options()).permute({0, 2, 1, 3});
  at::Tensor lse = at::empty({B, heads, T}, q.options().dtype(compute_type(q.scalar_type())));
  if (native_bf16 && q.scalar_type() == at::kBFloat16 && brgemm) {
    TORCH_CHECK(brgemm_bf16_available(), "fused LookHere attention: brgemm=True, but "
                "at::native::cpublas::brgemm takes no bfloat16 VNNI operands here");
    forward_impl<float, bf16, BrgemmBf16Products>(q, k, v, table, key_term, plan, tl, scale,
                                                  (int)max_keys, gather_bytes, out, lse);
    return {out, lse};
  }
  if (native_bf16 && q.scalar_type() == at::kBFloat16 && native_bf16_available()) {
    forward_impl<float, bf16, NativeBf16Products>(q, k, v, table, key_term, plan, tl, scale,
                                                  (int)max_keys, gather_bytes, out, lse);
    return {out, lse};
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(),
                                  "lookhere_fused_forward", [&] {
    using T = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    forward_impl<T, scalar_t, FloatProducts<T, scalar_t>>(q, k, v, table, key_term, plan, tl,
                                                          scale, (int)max_keys, gather_bytes,
                                                          out, lse);
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& table,
    const c10::optional<at::Tensor>& key_term, const at::Tensor& run_ptr,
    const at::Tensor& runs, const at::Tensor& head_group, int64_t H, int64_t W, int64_t th,
    int64_t tw, int64_t J, double scale, int64_t max_keys, bool native_bf16, bool table_grad,
    bool brgemm) {
  check_inputs(q, k, v, table, key_term, run_ptr, runs, head_group, H, W, th, tw, J);
  TORCH_CHECK(dout.sizes() == q.sizes() && out.sizes() == q.sizes() &&
                  dout.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type() &&
                  dout.stride(3) == 1 && out.stride(3) == 1,
              "dout and out must be like q with a contiguous last dimension");
  TORCH_CHECK(lse.dim() == 3 && lse.scalar_type() == compute_type(q.scalar_type()) &&
                  lse.size(0) == q.size(0) && lse.size(1) == q.size(1) && lse.size(2) == q.size(2),
              "lse must be (B, heads, T) in q's compute dtype");
  Tiles tl((int)H, (int)W, (int)th, (int)tw, (int)J, vector_width(q.scalar_type()));
  Plan plan = make_plan(run_ptr, runs, head_group, tl);
  at::Tensor dq = at::zeros(q.sizes(), q.options());
  at::Tensor dk = at::zeros(k.sizes(), k.options());
  at::Tensor dv = at::zeros(v.sizes(), v.options());
  // the table's gradient per (batch, head), summed over the batch by the caller: each
  // backward item owns one slice, no two threads add to the same entry
  at::Tensor dtable = table_grad ? at::zeros({q.size(0), table.size(0), table.size(1),
                                              table.size(2)}, table.options())
                                 : at::empty({0}, table.options());
  at::Tensor dkey = table_grad && key_term
                        ? at::zeros({q.size(0), key_term->size(0), key_term->size(1)},
                                    table.options())
                        : at::empty({0}, table.options());
  if (native_bf16 && q.scalar_type() == at::kBFloat16 && brgemm) {
    TORCH_CHECK(brgemm_bf16_available(), "fused LookHere attention: brgemm=True, but "
                "at::native::cpublas::brgemm takes no bfloat16 VNNI operands here");
    backward_impl<float, bf16, BrgemmBf16Backward>(
        dout, q, k, v, out, lse, table, key_term, plan, tl, scale, (int)max_keys, dq, dk, dv,
        table_grad ? dtable.data_ptr<float>() : nullptr,
        dkey.numel() ? dkey.data_ptr<float>() : nullptr);
    return {dq, dk, dv, dtable, dkey};
  }
  if (native_bf16 && q.scalar_type() == at::kBFloat16 && native_bf16_available()) {
    backward_impl<float, bf16, NativeBf16Backward>(
        dout, q, k, v, out, lse, table, key_term, plan, tl, scale, (int)max_keys, dq, dk, dv,
        table_grad ? dtable.data_ptr<float>() : nullptr,
        dkey.numel() ? dkey.data_ptr<float>() : nullptr);
    return {dq, dk, dv, dtable, dkey};
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(),
                                  "lookhere_fused_backward", [&] {
    using T = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    backward_impl<T, scalar_t, FloatBackward<T, scalar_t>>(
        dout, q, k, v, out, lse, table, key_term, plan, tl, scale, (int)max_keys, dq, dk, dv,
        table_grad ? dtable.data_ptr<T>() : nullptr,
        dkey.numel() ? dkey.data_ptr<T>() : nullptr);
  });
  return {dq, dk, dv, dtable, dkey};
}

}  // namespace

TORCH_LIBRARY(lookhere_fused, m) {
  m.def(
      "forward(Tensor q, Tensor k, Tensor v, Tensor table, Tensor? key_term, Tensor run_ptr, "
      "Tensor runs, Tensor head_group, int H, int W, int th, int tw, int J, float scale, "
      "int max_keys, int gather_bytes, bool native_bf16=True, bool brgemm=False) -> "
      "(Tensor, Tensor)");
  m.def(
      "backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor table, Tensor? key_term, Tensor run_ptr, Tensor runs, Tensor head_group, int H, "
      "int W, int th, int tw, int J, float scale, int max_keys, bool native_bf16=True, "
      "bool table_grad=False, bool brgemm=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // no tensor argument: one kernel for every dispatch key
  m.def("native_bf16() -> bool", &native_bf16_available);
  m.def("brgemm_bf16() -> bool", &brgemm_bf16_available);
  m.def("amx_bf16() -> bool", &amx_bf16_available);
}

TORCH_LIBRARY_IMPL(lookhere_fused, CPU, m) {
  m.impl("forward", &fused_forward);
  m.impl("backward", &fused_backward);
}
