/*
 * kernels/cpu/gemm_avx512.c — quantized matrix products with AVX-512 VNNI
 * over weights repacked at load time so that the 16 lanes of a vector are
 * 16 weight rows.
 *
 * Packed layout (gemm_pack): rows in groups of GEMM_ROWS = 16, a missing
 * row of the last group being zero. A group stores, for each block of 32
 * columns in order, a "group block":
 *   q4_0, q4_1: four 64-byte vectors; vector j holds, in lane r, bytes
 *               4j..4j+3 of row r's 16 nibble bytes, so its low nibbles are
 *               elements 4j..4j+3 and its high nibbles 16+4j..16+4j+3;
 *   q8_0:       eight 64-byte vectors; vector j holds, in lane r, elements
 *               4j..4j+3 of row r, each XORed with 0x80 (stored unsigned);
 *   q5_0:       as q8_0: its quants minus 16 are q8_0 quants with the same
 *               scale, so the conversion is exact (34 bytes a block
 *               against the file's 22);
 * followed by the 16 rows' f16 scales d and, for q4_1, their f16 minimums m.
 * Except for q5_0, a group block is exactly as large as the 16 rows' blocks
 * were, so the packed weights take no more memory than the file's.
 *
 * Kernel: for a group and a tile of up to GEMM_COLS tokens, each block
 * costs 8 vpdpbusd per token (4 quant bytes of the token broadcast against
 * a vector of 16 rows), whose exact int32 sums are converted once and
 * scaled:
 *   acc += float(isum) * (d_w * d_x)          (+ m_w * s_x for q4_1)
 * where the activation block (struct q8_block) gives d_x, s_x = d_x * sum(q)
 * and the row's integer sum of quants (for the offsets of q4_0 and q8_0,
 * applied in integers: isum starts at -8 or -128 times that sum).
 * Every (row, token) value is one lane following one fixed sequence of
 * operations, whatever the number of tokens in the tile or of valid rows,
 * so a token's result is bit-identical in a prefill tile, a batch or a
 * single-token decode — what kvd's determinism rests on. gemm_avx2.c runs
 * the same products, with the same bits, on CPUs without AVX-512 VNNI.
 */
#include <string.h>

#include "ops.h"

size_t gemm_group_block_bytes(enum kvd_wtype t)
{
	switch (t) {
	case KVD_WTYPE_Q4_0: return GEMM_ROWS * 18;
	case KVD_WTYPE_Q4_1: return GEMM_ROWS * 20;
	case KVD_WTYPE_Q8_0:
	case KVD_WTYPE_Q5_0: return GEMM_ROWS * 34;
	default: return 0;
	}
}

size_t gemm_packed_bytes(enum kvd_wtype t, int64_t rows, int64_t cols)
{
	size_t gb = gemm_group_block_bytes(t);
	if (!gb || rows <= 0 || cols <= 0 || cols % QK)
		return 0;
	return (size_t)((rows + GEMM_ROWS - 1) / GEMM_ROWS) * (size_t)(cols / QK) * gb;
}

void gemm_pack(enum kvd_wtype t, const void *src, size_t row_bytes, int64_t rows, int64_t cols, void *dst)
{
	const size_t gb = gemm_group_block_bytes(t);
	const int64_t nb = cols / QK, ng = (rows + GEMM_ROWS - 1) / GEMM_ROWS;
	const size_t sb = row_bytes / (size_t)nb; /* source block bytes */
	const int nq = t == KVD_WTYPE_Q8_0 || t == KVD_WTYPE_Q5_0 ? 8 : 4; /* quant vectors per group block */
	const int hdr = t == KVD_WTYPE_Q4_1 ? 4 : 2;
	const uint32_t flip = t == KVD_WTYPE_Q8_0 ? 0x80808080u : 0;
	uint8_t *out = dst;

	for (int64_t g = 0; g < ng; g++) {
		int nr = rows - g * GEMM_ROWS < GEMM_ROWS ? (int)(rows - g * GEMM_ROWS) : GEMM_ROWS;
		for (int64_t b = 0; b < nb; b++, out += gb) {
			uint32_t *q = (uint32_t *)(void *)out;
			uint16_t *dm = (uint16_t *)(void *)(out + 64 * nq);
			if (nr < GEMM_ROWS)
				memset(out, 0, gb);
			for (int r = 0; r < nr; r++) {
				const uint8_t *blk = (const uint8_t *)src + (size_t)(g * GEMM_ROWS + r) * row_bytes + (size_t)b * sb;
				if (t == KVD_WTYPE_Q5_0) {
					/* q - 16 in [-16, 15] is a q8_0 quant with the
					 * same scale: stored as q8_0, exactly */
					uint8_t q5[QK];
					q5_block_quants(blk + 2, blk + 6, q5);
					for (int j = 0; j < nq; j++)
						for (int i = 0; i < 4; i++)
							out[64 * j + 4 * r + i] = (uint8_t)((q5[4 * j + i] - 16) ^ 0x80);
					memcpy(&dm[r], blk, 2);
					continue;
				}
				for (int j = 0; j < nq; j++) {
					uint32_t w;
					memcpy(&w, blk + hdr + 4 * j, 4);
					q[16 * j + r] = w ^ flip;
				}
				memcpy(&dm[r], blk, 2);
				if (t == KVD_WTYPE_Q4_1)
					memcpy(&dm[GEMM_ROWS + r], blk + 2, 2);
			}
		}
	}
}

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,f16c,fma")))

enum gemm_kind { K_Q4_0, K_Q4_1, K_Q8_0 };

/* every loop over tokens and quant vectors fully unrolled, so the
 * per-token accumulators are registers */
#define UNROLL _Pragma("GCC unroll 8")

TGT static inline __attribute__((always_inline)) __m512i bcast4(const int8_t *p)
{
	int32_t v;
	memcpy(&v, p, 4);
	return _mm512_set1_epi32(v);
}

/* One group (16 rows, lane mask m) times C tokens; KIND and C are
 * compile-time constants so the accumulators live in registers. */
TGT static inline __attribute__((always_inline)) void tile(enum gemm_kind kind, const uint8_t *wp, int64_t nb,
							    __mmask16 m, const struct q8_block *xq, size_t ldq,
							    const int C, float *y, size_t ldy)
{
	const size_t gb = kind == K_Q8_0 ? GEMM_ROWS * 34 : kind == K_Q4_1 ? GEMM_ROWS * 20 : GEMM_ROWS * 18;
	const int qbytes = kind == K_Q8_0 ? 512 : 256;
	const __m512i lo4 = _mm512_set1_epi8(0x0f);
	__m512 acc[GEMM_COLS];

	UNROLL for (int t = 0; t < C; t++)
		acc[t] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++, wp += gb) {
		__m512i ia[GEMM_COLS], ib[GEMM_COLS];
		if (C <= 2) {
			UNROLL for (size_t o = 0; o < gb; o += 64)
				_mm_prefetch((const char *)wp + GEMM_PF_DIST + o, _MM_HINT_T0);
		}
		UNROLL for (int t = 0; t < C; t++) {
			const struct q8_block *row = xq + (size_t)t * ldq;
			int32_t s = q8_row_sums(row, nb)[b];
			ia[t] = kind == K_Q4_1 ? _mm512_setzero_si512()
					       : _mm512_set1_epi32(kind == K_Q4_0 ? -8 * s : -128 * s);
			ib[t] = _mm512_setzero_si512();
		}
		if (kind == K_Q8_0) {
			UNROLL for (int j = 0; j < 8; j += 2) {
				__m512i w0 = _mm512_loadu_si512(wp + 64 * j);
				__m512i w1 = _mm512_loadu_si512(wp + 64 * (j + 1));
				UNROLL for (int t = 0; t < C; t++) {
					const int8_t *q = xq[(size_t)t * ldq + b].q;
					ia[t] = _mm512_dpbusd_epi32(ia[t], w0, bcast4(q + 4 * j));
					ib[t] = _mm512_dpbusd_epi32(ib[t], w1, bcast4(q + 4 * j + 4));
				}
			}
		} else {
			UNROLL for (int j = 0; j < 4; j++) {
				__m512i raw = _mm512_loadu_si512(wp + 64 * j);
				__m512i wl = _mm512_and_si512(raw, lo4);
				__m512i wh = _mm512_and_si512(_mm512_srli_epi16(raw, 4), lo4);
				UNROLL for (int t = 0; t < C; t++) {
					const int8_t *q = xq[(size_t)t * ldq + b].q;
					ia[t] = _mm512_dpbusd_epi32(ia[t], wl, bcast4(q + 4 * j));
					ib[t] = _mm512_dpbusd_epi32(ib[t], wh, bcast4(q + 16 + 4 * j));
				}
			}
		}
		__m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wp + qbytes)));
		__m512 wm = kind == K_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wp + qbytes + 32)))
					   : _mm512_setzero_ps();
		UNROLL for (int t = 0; t < C; t++) {
			const struct q8_block *x = xq + (size_t)t * ldq + b;
			__m512 p = _mm512_cvtepi32_ps(_mm512_add_epi32(ia[t], ib[t]));
			acc[t] = _mm512_fmadd_ps(p, _mm512_mul_ps(wd, _mm512_set1_ps(x->d)), acc[t]);
			if (kind == K_Q4_1)
				acc[t] = _mm512_fmadd_ps(wm, _mm512_set1_ps(x->s), acc[t]);
		}
	}
	UNROLL for (int t = 0; t < C; t++)
		_mm512_mask_storeu_ps(y + (size_t)t * ldy, m, acc[t]);
}

#define INST1(KIND, CC)                                                                                      \
	TGT static void gemm_##KIND##_##CC(const void *wp, int64_t nb, __mmask16 m, const struct q8_block *xq, \
					   size_t ldq, float *y, size_t ldy)                                   \
	{                                                                                                    \
		tile(KIND, wp, nb, m, xq, ldq, CC, y, ldy);                                                 \
	}
#define INSTK(KIND)                                                                                             \
	INST1(KIND, 1) INST1(KIND, 2) INST1(KIND, 3) INST1(KIND, 4) INST1(KIND, 5) INST1(KIND, 6) INST1(KIND, 7) \
		INST1(KIND, 8)
INSTK(K_Q4_0)
INSTK(K_Q4_1)
INSTK(K_Q8_0)
_Static_assert(GEMM_COLS == 8, "one instance per tile width");

typedef void (*tile_fn)(const void *wp, int64_t nb, __mmask16 m, const struct q8_block *xq, size_t ldq, float *y,
			size_t ldy);
#define TABLE(KIND)                                                                                      \
	{                                                                                                \
		gemm_##KIND##_1, gemm_##KIND##_2, gemm_##KIND##_3, gemm_##KIND##_4, gemm_##KIND##_5,     \
			gemm_##KIND##_6, gemm_##KIND##_7, gemm_##KIND##_8                                \
	}
static const tile_fn tiles_q4_0[GEMM_COLS] = TABLE(K_Q4_0);
static const tile_fn tiles_q4_1[GEMM_COLS] = TABLE(K_Q4_1);
static const tile_fn tiles_q8_0[GEMM_COLS] = TABLE(K_Q8_0);

#define ENTRY(T)                                                                                                 \
	static void gemm_##T(const void *wp, int64_t nb, int R, const struct q8_block *xq, size_t ldq, int C, float *y, \
			     size_t ldy)                                                                         \
	{                                                                                                        \
		tiles_##T[C - 1](wp, nb, (__mmask16)((1u << R) - 1), xq, ldq, y, ldy);                              \
	}
ENTRY(q4_0)
ENTRY(q4_1)
ENTRY(q8_0)

int cpu_kernels_init_gemm_avx512(struct cpu_kernels *k)
{
	if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
	    !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512vnni") ||
	    !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("f16c") ||
	    !__builtin_cpu_supports("fma"))
		return 0;
	k->gemm[KVD_WTYPE_Q4_0] = gemm_q4_0;
	k->gemm[KVD_WTYPE_Q4_1] = gemm_q4_1;
	k->gemm[KVD_WTYPE_Q8_0] = gemm_q8_0;
	k->gemm[KVD_WTYPE_Q5_0] = gemm_q8_0; /* packed as q8_0 (gemm_pack) */
	k->isa = "avx512-vnni";
	return 1;
}
#else
int cpu_kernels_init_gemm_avx512(struct cpu_kernels *k)
{
	(void)k;
	return 0;
}
#endif
