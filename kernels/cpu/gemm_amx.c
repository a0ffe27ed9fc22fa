/*
 * kernels/cpu/gemm_amx.c — the quantized matrix products of gemm_avx512.c
 * for tiles of 16 tokens, their integer dot products on the AMX tile unit
 * (Intel Advanced Matrix Extensions, AMX-INT8), with the same bits.
 *
 * The packed weights (gemm_avx512.c's layout) are already what a TDPBSUD
 * takes as its second operand: a vector of a group block holds, in lane r,
 * four consecutive quant bytes of weight row r, which is one row of a
 * "B" tile (K/4 rows of N = 16 columns of 4 bytes) with the weight rows as
 * its columns. So for each block of 32 columns:
 *   A (16 tokens x 32 bytes): the tokens' int8 quants, straight from their
 *     q8 blocks (one tile row per token, ldq blocks apart);
 *   B (8 rows x 64 bytes): the 8 quant vectors of q8_0, q5_0, q5_1 and
 *     q5_K as stored; those of q4_0, q4_1 and q4_K are their 4 nibble
 *     vectors' low nibbles then high nibbles (elements 0..15, 16..31);
 *   C (16 x 16 int32) = A . B: row t is token t's exact int32 sum for the
 *     16 weight rows, lane r for row r, as the VNNI kernel's accumulators
 *     hold it;
 * q4_0's and q8_0's B rows are made signed (their offsets of 8 and 128
 * taken off each quant, once a group for all its token tiles), so their
 * sums are exact without a correction (TDPBSSD); the other types' quants
 * are unsigned (TDPBSUD, their minimums applied as in the VNNI kernel:
 * q4_1's and q5_1's in floats, the K-quants' in integers). q6_K, whose
 * scales change every 16 columns, is left to the VNNI kernel (products of
 * K = 16 cost as much as those of 32 here). Every (row, token) value then
 * goes through the same integer and float operations in the same order as
 * in gemm_avx512.c's tile() and tile_k() (the K-quants' sub-block scales
 * and mins applied to the exact sums over each super-block, then one
 * conversion): the results are bit-identical to that kernel's, so a
 * token's logits do not depend on whether its step was a prefill (tiles
 * of 16, here) or a decode (the VNNI kernel).
 *
 * AMX needs the kernel's permission (arch_prctl ARCH_REQ_XCOMP_PERM for
 * the tile data state, Linux 5.16 and later) and a tile configuration in
 * each thread: each call (one group of rows, all its token tiles) loads
 * the configuration and releases the tiles when it ends, so no thread
 * carries AMX state between steps (what a signal handler or a context
 * switch would have to save).
 */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>

#include "gemm_kq512.h"
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TGT                                                                                                  \
	__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,f16c,fma")))

#ifndef ARCH_REQ_XCOMP_PERM
#define ARCH_REQ_XCOMP_PERM 0x1023
#endif
#define XFEATURE_XTILEDATA 18

enum amx_kind { A_Q4_0, A_Q4_1, A_Q8_0, A_Q5_1, A_Q4_K, A_Q5_K };

/* The tile configuration (palette 1): two blocks are in flight, so the
 * tile unit multiplies one while the vector units scale the other: tmm0,
 * tmm1 C (16 x 16 int32); tmm2, tmm3 A (16 tokens x 32 bytes); tmm4, tmm5
 * B (8 x 64). */
struct amx_cfg {
	uint8_t palette, start_row;
	uint8_t reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
};

static const struct amx_cfg cfg = {
	.palette = 1,
	.colsb = { 64, 64, 32, 32, 64, 64 },
	.rows = { 16, 16, 16, 16, 8, 8 },
};

#define UNROLL _Pragma("GCC unroll 16")
#define AMX_T 16 /* tokens a tile */

static inline int amx_kquant(enum amx_kind kind)
{
	return kind == A_Q4_K || kind == A_Q5_K;
}
/* B as stored in the group block (unsigned 5-bit quants) */
static inline int amx_b_direct(enum amx_kind kind)
{
	return kind == A_Q5_1 || kind == A_Q5_K;
}
/* B made signed, the offset (q4_0's 8, q8_0's 128) taken off each quant
 * once, so its products need no correction (TDPBSSD) */
static inline int amx_b_signed(enum amx_kind kind)
{
	return kind == A_Q4_0 || kind == A_Q8_0;
}
static inline size_t amx_qbytes(enum amx_kind kind)
{
	return kind == A_Q4_0 || kind == A_Q4_1 || kind == A_Q4_K ? 256 : 512;
}
/* bytes of a group block (or, for the K-quants, group super-block) */
static inline size_t amx_gb(enum amx_kind kind)
{
	switch (kind) {
	case A_Q8_0: return GEMM_ROWS * 34;
	case A_Q5_1: return GEMM_ROWS * 36;
	case A_Q4_1: return GEMM_ROWS * 20;
	case A_Q4_0: return GEMM_ROWS * 18;
	case A_Q4_K: return GSB_Q4_K;
	default: return GSB_Q5_K;
	}
}
/* block b's quants in the packed group */
static inline const uint8_t *amx_wq(enum amx_kind kind, const uint8_t *wp, int64_t b)
{
	if (!amx_kquant(kind))
		return wp + (size_t)b * amx_gb(kind);
	return wp + (size_t)(b / 8) * amx_gb(kind) + amx_qbytes(kind) * (size_t)(b % 8);
}

/* Block b's 8 B rows (512 bytes) at bt, made once for all token tiles:
 * nibbles as low halves then high halves (elements 0..15, 16..31), q4_0's
 * minus 8; q8_0's quants back to signed. */
TGT static inline __attribute__((always_inline)) void amx_make_b(enum amx_kind kind, const uint8_t *wq, uint8_t *bt)
{
	if (kind == A_Q8_0) {
		const __m512i flip = _mm512_set1_epi8((char)0x80);
		UNROLL for (int v = 0; v < 8; v++)
			_mm512_store_si512(bt + 64 * v, _mm512_xor_si512(_mm512_loadu_si512(wq + 64 * v), flip));
		return;
	}
	const __m512i lo4 = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
	UNROLL for (int v = 0; v < 4; v++) {
		__m512i raw = _mm512_loadu_si512(wq + 64 * v);
		__m512i l = _mm512_and_si512(raw, lo4), h = _mm512_and_si512(_mm512_srli_epi16(raw, 4), lo4);
		if (kind == A_Q4_0) {
			l = _mm512_sub_epi8(l, eight);
			h = _mm512_sub_epi8(h, eight);
		}
		_mm512_store_si512(bt + 64 * v, l);
		_mm512_store_si512(bt + 64 * (v + 4), h);
	}
}

/* Start block b's product into C tile TC (A tile TA, B tile TB). Tile
 * numbers are constants, so this is a macro. */
#define AMX_ISSUE(kind, b, TC, TA, TB)                                                                       \
	do {                                                                                                 \
		_tile_zero(TC);                                                                              \
		_tile_loadd(TA, (const char *)(xq + (b)) + offsetof(struct q8_block, q), lda);                \
		if (amx_b_direct(kind))                                                                      \
			_tile_loadd(TB, amx_wq(kind, wp, b), 64);                                            \
		else                                                                                         \
			_tile_loadd(TB, bts + 512 * (size_t)(b), 64);                                        \
		if (amx_b_signed(kind))                                                                      \
			_tile_dpbssd(TC, TA, TB);                                                            \
		else                                                                                         \
			_tile_dpbsud(TC, TA, TB);                                                            \
	} while (0)

/* Block b's scaling from its exact sums c: the integer and float
 * operations of gemm_avx512.c's tile() and tile_k(), in their order (is:
 * the K-quants' sums S of the super-block so far; nb: the row's blocks). */
TGT static inline __attribute__((always_inline)) void amx_epilogue(enum amx_kind kind, const uint8_t *wp, int64_t b,
								   int64_t nb, const struct q8_block *xq, size_t ldq,
								   const int32_t (*c)[16], int32_t (*is)[16], __m512 *acc)
{
	if (!amx_kquant(kind)) {
		const int has_m = kind == A_Q4_1 || kind == A_Q5_1;
		const uint8_t *g = wp + (size_t)b * amx_gb(kind) + amx_qbytes(kind);
		__m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g));
		__m512 wm = has_m ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + 32))) : _mm512_setzero_ps();
		UNROLL for (int t = 0; t < AMX_T; t++) {
			const struct q8_block *x = xq + (size_t)t * ldq + b;
			__m512 p = _mm512_cvtepi32_ps(_mm512_load_si512(c[t]));
			acc[t] = _mm512_fmadd_ps(p, _mm512_mul_ps(wd, _mm512_set1_ps(x->d)), acc[t]);
			if (has_m)
				acc[t] = _mm512_fmadd_ps(wm, _mm512_set1_ps(x->s), acc[t]);
		}
		return;
	}
	/* the K-quants: S and M over the super-block (gemm_avx512.c), S
	 * kept in is between its sub-blocks */
	const int64_t j = b % 8, s0 = b - j;
	const uint8_t *tail = wp + (size_t)(b / 8) * amx_gb(kind) + 8 * amx_qbytes(kind);
	const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(tail + 16 * j)));
	UNROLL for (int t = 0; t < AMX_T; t++) {
		__m512i p = _mm512_mullo_epi32(_mm512_load_si512(c[t]), sc);
		_mm512_store_si512(is[t], j ? _mm512_add_epi32(_mm512_load_si512(is[t]), p) : p);
	}
	if (j != 7)
		return;
	__m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tail + 256)));
	__m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tail + 288)));
	__m512i mp[4];
	kq512_min_pairs(tail, mp);
	UNROLL for (int t = 0; t < AMX_T; t++) {
		const struct q8_block *row = xq + (size_t)t * ldq;
		__m512i ms = kq512_min_sum(mp, q8_row_sums(row, nb) + s0);
		__m512 dx = _mm512_set1_ps(row[s0].d);
		acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(is[t])), _mm512_mul_ps(d, dx), acc[t]);
		acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(dmin, dx), acc[t]);
	}
}

/* One group (16 rows, lane mask m) times one tile of 16 tokens, blocks in
 * pairs: the product of the next block runs on the tile unit while this
 * one's sums are scaled. bts: the B rows amx_make_b made (unused for the
 * types read as stored). */
TGT static inline __attribute__((always_inline)) void amx_tile(enum amx_kind kind, const uint8_t *wp, int64_t nb,
							       __mmask16 m, const struct q8_block *xq, size_t ldq,
							       const uint8_t *bts, float *y, size_t ldy)
{
	const size_t lda = ldq * sizeof(struct q8_block);
	_Alignas(64) int32_t c[2][AMX_T][16], is[AMX_T][16];
	__m512 acc[AMX_T];

	if (amx_kquant(kind)) /* (each super-block's first sub-block sets it) */
		memset(is, 0, sizeof(is));

	UNROLL for (int t = 0; t < AMX_T; t++)
		acc[t] = _mm512_setzero_ps();
	AMX_ISSUE(kind, 0, 0, 2, 4);
	for (int64_t b = 0; b < nb; b += 2) {
		if (b + 1 < nb)
			AMX_ISSUE(kind, b + 1, 1, 3, 5);
		_tile_stored(0, c[0], 64);
		amx_epilogue(kind, wp, b, nb, xq, ldq, c[0], is, acc);
		if (b + 2 < nb)
			AMX_ISSUE(kind, b + 2, 0, 2, 4);
		if (b + 1 < nb) {
			_tile_stored(1, c[1], 64);
			amx_epilogue(kind, wp, b + 1, nb, xq, ldq, c[1], is, acc);
		}
	}
	UNROLL for (int t = 0; t < AMX_T; t++)
		_mm512_mask_storeu_ps(y + (size_t)t * ldy, m, acc[t]);
}

/* A thread's B rows for one group: 512 bytes a block, grown as needed
 * (the widest matrix sets it once), freed when the thread ends. */
struct amx_scratch {
	size_t bytes;
	uint8_t *p;
};
static pthread_key_t amx_key;
static pthread_once_t amx_key_once = PTHREAD_ONCE_INIT;
static int amx_key_ok;

static void amx_scratch_free(void *v)
{
	struct amx_scratch *s = v;
	free(s->p);
	free(s);
}

static void amx_key_make(void)
{
	amx_key_ok = pthread_key_create(&amx_key, amx_scratch_free) == 0;
}

static uint8_t *amx_b_scratch(size_t bytes)
{
	pthread_once(&amx_key_once, amx_key_make);
	if (!amx_key_ok)
		return NULL;
	struct amx_scratch *s = pthread_getspecific(amx_key);
	if (!s) {
		if (!(s = calloc(1, sizeof(*s))))
			return NULL;
		if (pthread_setspecific(amx_key, s)) {
			free(s);
			return NULL;
		}
	}
	if (bytes > s->bytes) {
		bytes = (bytes + 4095) & ~(size_t)4095;
		uint8_t *p = aligned_alloc(64, bytes);
		if (!p)
			return NULL;
		free(s->p);
		s->p = p;
		s->bytes = bytes;
	}
	return s->p;
}

/* The group's B rows once, then each tile of 16 tokens; -ENOMEM (nothing
 * written) where the scratch cannot be had, and the caller uses gemm. */
TGT static inline __attribute__((always_inline)) int amx_group(enum amx_kind kind, const uint8_t *wp, int64_t nb,
							       int R, const struct q8_block *xq, size_t ldq, int ntile,
							       float *y, size_t ldy)
{
	uint8_t *bts = NULL;
	if (!amx_b_direct(kind)) {
		if (!(bts = amx_b_scratch(512 * (size_t)nb)))
			return -ENOMEM;
		for (int64_t b = 0; b < nb; b++)
			amx_make_b(kind, amx_wq(kind, wp, b), bts + 512 * (size_t)b);
	}
	_tile_loadconfig(&cfg);
	for (int i = 0; i < ntile; i++)
		amx_tile(kind, wp, nb, (__mmask16)((1u << R) - 1), xq + (size_t)i * AMX_T * ldq, ldq, bts,
			 y + (size_t)i * AMX_T * ldy, ldy);
	_tile_release();
	return 0;
}

#define AMX_ENTRY(T, KIND)                                                                                     \
	TGT static int gemm16_##T(const void *wp, int64_t nb, int R, const struct q8_block *xq, size_t ldq,    \
				  int ntile, float *y, size_t ldy)                                            \
	{                                                                                                      \
		return amx_group(KIND, wp, nb, R, xq, ldq, ntile, y, ldy);                                      \
	}
AMX_ENTRY(q4_0, A_Q4_0)
AMX_ENTRY(q4_1, A_Q4_1)
AMX_ENTRY(q8_0, A_Q8_0)
AMX_ENTRY(q5_1, A_Q5_1)
AMX_ENTRY(q4_K, A_Q4_K)
AMX_ENTRY(q5_K, A_Q5_K)

/* CPUID.(7,0):EDX bits 24 (AMX-TILE) and 25 (AMX-INT8), the OS enabling
 * the tile state in XCR0 (bits 17, 18), and the kernel's permission */
static int amx_usable(void)
{
	unsigned a, b, c, d;
	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25)))
		return 0;
	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) /* OSXSAVE */
		return 0;
	unsigned lo, hi;
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	if ((lo & (3u << 17)) != (3u << 17))
		return 0;
	return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

static pthread_once_t amx_usable_once = PTHREAD_ONCE_INIT;
static int amx_ok;

static void amx_usable_check(void)
{
	amx_ok = amx_usable();
}

int cpu_kernels_init_gemm_amx(struct cpu_kernels *k)
{
	/* the permission is the process's: asked once */
	pthread_once(&amx_usable_once, amx_usable_check);
	if (!amx_ok)
		return 0;
	k->gemm16[KVD_WTYPE_Q4_0] = gemm16_q4_0;
	k->gemm16[KVD_WTYPE_Q4_1] = gemm16_q4_1;
	k->gemm16[KVD_WTYPE_Q8_0] = gemm16_q8_0;
	k->gemm16[KVD_WTYPE_Q5_0] = gemm16_q8_0; /* packed as q8_0 */
	k->gemm16[KVD_WTYPE_Q5_1] = gemm16_q5_1;
	k->gemm16[KVD_WTYPE_Q4_K] = gemm16_q4_K;
	k->gemm16[KVD_WTYPE_Q5_K] = gemm16_q5_K;
	/* q6_K's scales change every 16 columns: a tile product of 16 costs
	 * as much as one of 32 and the scaling is twice as long, slower than
	 * the VNNI kernel (tile_bench: 125 against 153 GMAC/s); it stays
	 * there */
	return 1;
}
#else
int cpu_kernels_init_gemm_amx(struct cpu_kernels *k)
{
	(void)k;
	return 0;
}
#endif
