/*
 * kernels/cpu/gemm_avx512.c — quantized matrix products with AVX-512 VNNI
 * over weights repacked at load time so that the 16 lanes of a vector are
 * 16 weight rows.
 *
 * Packed layout (cpu_gemm_pack): rows in groups of GEMM_ROWS = 16, a missing
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
 *   q5_1:       eight 64-byte vectors of its unsigned quants (0..31), as
 *               q8_0's but not flipped;
 * followed by the 16 rows' f16 scales d and, for q4_1 and q5_1, their f16
 * minimums m. Except for q5_0 and q5_1, a group block is exactly as large
 * as the 16 rows' blocks were, so the packed weights take no more memory
 * than the file's.
 *
 * K-quants are packed per "group super-block" of 256 columns: first, per
 * sub-block j of 32 columns, its quants as a q4_1 group block's four
 * nibble vectors (q4_K) or as eight byte vectors of unsigned quants (q5_K
 * 0..31, q6_K 0..63 without CPU_PACK_Q6_SPLIT; with it, as both kernels
 * read them, q6_K is as
 * q4_K's four nibble vectors of the quants' low 4 bits followed by two
 * 64-byte vectors of their top 2 bits, vector u holding in bits 2v, 2v+1
 * of lane r's byte i those of element 16u + 4v + i: 384 bytes against
 * 512, as many as the file's; CPU_PACK_Q5_SPLIT (the AVX2 kernel's: the
 * AMX tiles read q5_K as bytes) likewise q5_K's with one
 * vector of their fifth bits, bit v of lane r's byte i element 4v + i's
 * and bit 4 + v element 16 + 4v + i's: 320 bytes); then the integer
 * scales, lane r of sub-block j at 16 j + r (q4_K, q5_K: 8 x 16 6-bit
 * scales then 8 x 16 6-bit mins; q6_K: 16 x 16 int8 scales, one per 16
 * columns); then the 16 rows' f16 d (and
 * dmin for q4_K and q5_K). The K-quants' activations have one scale d_x
 * per super-block (quantize_q8k), so the sub-block scales and mins apply
 * in integers and one sum per lane and super-block is converted:
 *   q4_K, q5_K: S = sum_j sc_j * isum_j, M = sum_j m_j * xsum_j (exact
 *               int32; xsum_j the activation's integer sum over
 *               sub-block j, from the row's sums);
 *               acc += float(S) * (d * d_x); acc -= float(M) * (dmin * d_x)
 *   q6_K:       S = sum_j sc0_j * isum0_j + sc1_j * isum1_j (the two
 *               halves of 16, each with its own int8 scale);
 *               acc += float(S) * (d * d_x)
 * with q6_K's offset -32 applied in integers to the two halves of 16
 * (the activation row carries each block's first-half sum). Bounds: a
 * q5_K sub-block's |isum| <= 32 * 31 * 127, times 63 and 8 sub-blocks
 * 6.4e7; q6_K's halves 16 * 32 * 127 times 128 and 16: 1.3e8; M <= 8 *
 * 63 * 32 * 127: all within int32. Per 32 columns: 8 vpdpbusd and one
 * vpmulld a token (q6_K two), against 8 vpdpbusd and three float
 * products when each sub-block was converted and scaled in floats.
 *
 * Float weights (f32, f16, bf16) are packed column by column: for each
 * column, the 16 rows' values in their stored type (64 or 32 bytes), and
 * each lane sums w * x over even and odd columns in two fused
 * multiply-add chains, added at the end.
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

/* a K-quant type's group super-block bytes (GSB_*, ops.h) in layout pack */
static size_t gsb_of(enum kvd_wtype t, unsigned pack)
{
	return t == KVD_WTYPE_Q4_K ? GSB_Q4_K
	       : t == KVD_WTYPE_Q5_K ? (pack & CPU_PACK_Q5_SPLIT ? GSB_Q5_KS : GSB_Q5_K)
	       : pack & CPU_PACK_Q6_SPLIT ? GSB_Q6_KS
					 : GSB_Q6_K;
}

size_t cpu_gemm_group_block_bytes(enum kvd_wtype t, unsigned pack)
{
	switch (t) {
	case KVD_WTYPE_Q4_0: return GEMM_ROWS * 18;
	case KVD_WTYPE_Q4_1: return GEMM_ROWS * 20;
	case KVD_WTYPE_Q8_0:
	case KVD_WTYPE_Q5_0: return GEMM_ROWS * 34;
	case KVD_WTYPE_Q5_1: return GEMM_ROWS * 36;
	/* K-quants: per 32 columns, an eighth of a super-block */
	case KVD_WTYPE_Q4_K: return GSB_Q4_K / 8;
	case KVD_WTYPE_Q5_K:
	case KVD_WTYPE_Q6_K: return gsb_of(t, pack) / 8;
	case KVD_WTYPE_F32: return GEMM_ROWS * QK * 4;
	case KVD_WTYPE_F16:
	case KVD_WTYPE_BF16: return GEMM_ROWS * QK * 2;
	default: return 0;
	}
}

static int is_kquant(enum kvd_wtype t)
{
	return t == KVD_WTYPE_Q4_K || t == KVD_WTYPE_Q5_K || t == KVD_WTYPE_Q6_K;
}

size_t cpu_gemm_packed_bytes(enum kvd_wtype t, int64_t rows, int64_t cols, unsigned pack)
{
	size_t gb = cpu_gemm_group_block_bytes(t, pack);
	if (!gb || rows <= 0 || cols <= 0 || cols % (is_kquant(t) ? 256 : QK))
		return 0;
	return (size_t)((rows + GEMM_ROWS - 1) / GEMM_ROWS) * (size_t)(cols / QK) * gb;
}

/* One group super-block of a K-quant type from rows[0..nr) (NULL past the
 * matrix: zero). */
static void pack_kquant(enum kvd_wtype t, unsigned pack, const uint8_t *const *blk, int nr, uint8_t *out)
{
	const int split6 = t == KVD_WTYPE_Q6_K && (pack & CPU_PACK_Q6_SPLIT);
	const int split5 = t == KVD_WTYPE_Q5_K && (pack & CPU_PACK_Q5_SPLIT);
	const int qb = t == KVD_WTYPE_Q4_K ? 256 : split6 ? 384 : split5 ? 320 : 512;
	const size_t gsb = gsb_of(t, pack);
	uint8_t *tail = out + 8 * qb;
	uint16_t *dd = (uint16_t *)(void *)(tail + 256);

	memset(out, 0, gsb);
	for (int r = 0; r < nr; r++) {
		uint8_t q[256], sc[16], mn[8];
		uint16_t d, dmin;
		kq_block_ints(t, blk[r], q, sc, mn, &d, &dmin);
		for (int j = 0; j < 8; j++) {
			const uint8_t *qj = q + 32 * j;
			uint8_t *o = out + (size_t)qb * j;
			if (t == KVD_WTYPE_Q4_K || split6 || split5) /* byte 4v+i: elements 4v+i and 16+4v+i */
				for (int v = 0; v < 4; v++)
					for (int i = 0; i < 4; i++)
						o[64 * v + 4 * r + i] =
							(uint8_t)((qj[4 * v + i] & 15) | (qj[16 + 4 * v + i] & 15) << 4);
			if (split6) /* then their top two bits: bits 2v, 2v+1 of byte 4r+i */
				for (int u = 0; u < 2; u++)
					for (int i = 0; i < 4; i++) {
						uint8_t hb = 0;
						for (int v = 0; v < 4; v++)
							hb = (uint8_t)(hb | (qj[16 * u + 4 * v + i] >> 4) << 2 * v);
						o[256 + 64 * u + 4 * r + i] = hb;
					}
			else if (split5) /* then their fifth bits: bit v and 4+v of byte 4r+i */
				for (int i = 0; i < 4; i++) {
					uint8_t hb = 0;
					for (int v = 0; v < 4; v++)
						hb = (uint8_t)(hb | (qj[4 * v + i] >> 4) << v |
							       (qj[16 + 4 * v + i] >> 4) << (4 + v));
					o[256 + 4 * r + i] = hb;
				}
			else if (t != KVD_WTYPE_Q4_K)
				for (int v = 0; v < 8; v++)
					for (int i = 0; i < 4; i++)
						o[64 * v + 4 * r + i] = qj[4 * v + i];
		}
		if (t == KVD_WTYPE_Q6_K) {
			for (int k = 0; k < 16; k++)
				tail[16 * k + r] = sc[k];
		} else {
			for (int j = 0; j < 8; j++) {
				tail[16 * j + r] = sc[j];
				tail[128 + 16 * j + r] = mn[j];
			}
			memcpy(&dd[GEMM_ROWS + r], &dmin, 2);
		}
		memcpy(&dd[r], &d, 2);
	}
}

/* One group's columns of a float matrix: column i's 16 values at
 * i * 16 * es. */
static void pack_float(size_t es, const uint8_t *const *row, int nr, int64_t cols, uint8_t *out)
{
	memset(out, 0, (size_t)cols * GEMM_ROWS * es);
	for (int r = 0; r < nr; r++)
		for (int64_t i = 0; i < cols; i++)
			memcpy(out + ((size_t)i * GEMM_ROWS + (size_t)r) * es, row[r] + (size_t)i * es, es);
}

void cpu_gemm_pack(enum kvd_wtype t, const void *src, size_t row_bytes, int64_t rows, int64_t cols, void *dst,
		   unsigned pack)
{
	const size_t gb = cpu_gemm_group_block_bytes(t, pack);
	const int64_t nb = cols / QK, ng = (rows + GEMM_ROWS - 1) / GEMM_ROWS;
	const size_t sb = row_bytes / (size_t)nb; /* source block bytes */
	const int nq = t == KVD_WTYPE_Q8_0 || t == KVD_WTYPE_Q5_0 || t == KVD_WTYPE_Q5_1 ? 8 : 4; /* quant vectors */
	const int hdr = t == KVD_WTYPE_Q4_1 ? 4 : 2;
	const uint32_t flip = t == KVD_WTYPE_Q8_0 ? 0x80808080u : 0;
	uint8_t *out = dst;

	for (int64_t g = 0; g < ng; g++) {
		int nr = rows - g * GEMM_ROWS < GEMM_ROWS ? (int)(rows - g * GEMM_ROWS) : GEMM_ROWS;
		const uint8_t *rowp[GEMM_ROWS];
		for (int r = 0; r < nr; r++)
			rowp[r] = (const uint8_t *)src + (size_t)(g * GEMM_ROWS + r) * row_bytes;
		if (t == KVD_WTYPE_F32 || t == KVD_WTYPE_F16 || t == KVD_WTYPE_BF16) {
			pack_float(t == KVD_WTYPE_F32 ? 4 : 2, rowp, nr, cols, out);
			out += (size_t)nb * gb;
			continue;
		}
		if (is_kquant(t)) {
			size_t kb = row_bytes / (size_t)(cols / 256); /* source super-block bytes */
			for (int64_t s = 0; s < cols / 256; s++, out += 8 * gb) {
				const uint8_t *blk[GEMM_ROWS];
				for (int r = 0; r < nr; r++)
					blk[r] = rowp[r] + (size_t)s * kb;
				pack_kquant(t, pack, blk, nr, out);
			}
			continue;
		}
		for (int64_t b = 0; b < nb; b++, out += gb) {
			uint32_t *q = (uint32_t *)(void *)out;
			uint16_t *dm = (uint16_t *)(void *)(out + 64 * nq);
			if (nr < GEMM_ROWS)
				memset(out, 0, gb);
			for (int r = 0; r < nr; r++) {
				const uint8_t *blk = rowp[r] + (size_t)b * sb;
				if (t == KVD_WTYPE_Q5_0 || t == KVD_WTYPE_Q5_1) {
					/* q5_0: q - 16 in [-16, 15] is a q8_0 quant with
					 * the same scale: stored as q8_0, exactly;
					 * q5_1: its unsigned quants */
					int q51 = t == KVD_WTYPE_Q5_1;
					uint8_t q5[QK];
					cpu_q5_block_quants(blk + 2 + 2 * q51, blk + 6 + 2 * q51, q5);
					for (int j = 0; j < nq; j++)
						for (int i = 0; i < 4; i++)
							out[64 * j + 4 * r + i] =
								q51 ? q5[4 * j + i] : (uint8_t)((q5[4 * j + i] - 16) ^ 0x80);
					memcpy(&dm[r], blk, 2);
					if (q51)
						memcpy(&dm[GEMM_ROWS + r], blk + 2, 2);
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

int cpu_gemm_unpack_row(enum kvd_wtype t, const void *packed, int64_t cols, int64_t r, void *row)
{
	const size_t gb = cpu_gemm_group_block_bytes(t, 0); /* (no K-quant is unpacked) */
	const int64_t nb = cols / QK, g = r / GEMM_ROWS;
	const int lane = (int)(r % GEMM_ROWS);
	const uint8_t *grp = (const uint8_t *)packed + (size_t)g * (size_t)nb * gb;
	uint8_t *out = row;

	if (t == KVD_WTYPE_F32 || t == KVD_WTYPE_F16 || t == KVD_WTYPE_BF16) {
		size_t es = t == KVD_WTYPE_F32 ? 4 : 2;
		for (int64_t i = 0; i < cols; i++)
			memcpy(out + (size_t)i * es, grp + ((size_t)i * GEMM_ROWS + (size_t)lane) * es, es);
		return 0;
	}
	if (t != KVD_WTYPE_Q4_0 && t != KVD_WTYPE_Q4_1 && t != KVD_WTYPE_Q8_0)
		return -1;
	const int nq = t == KVD_WTYPE_Q8_0 ? 8 : 4, hdr = t == KVD_WTYPE_Q4_1 ? 4 : 2;
	const uint32_t flip = t == KVD_WTYPE_Q8_0 ? 0x80808080u : 0;
	const size_t sb = (size_t)hdr + 4 * (size_t)nq; /* stored block bytes */
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *blk = grp + (size_t)b * gb;
		uint8_t *o = out + (size_t)b * sb;
		for (int j = 0; j < nq; j++) {
			uint32_t w;
			memcpy(&w, blk + 64 * j + 4 * lane, 4);
			w ^= flip;
			memcpy(o + hdr + 4 * j, &w, 4);
		}
		memcpy(o, blk + 64 * nq + 2 * lane, 2);
		if (t == KVD_WTYPE_Q4_1)
			memcpy(o + 2, blk + 64 * nq + 2 * (GEMM_ROWS + lane), 2);
	}
	return 0;
}

#if defined(__x86_64__)
#include <immintrin.h>

#include "gemm_kq512.h"

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,f16c,fma")))
/* the packed layout these kernels read (cpu_kernels.pack_flags) */
#define AVX512_PACK CPU_PACK_Q6_SPLIT
/* Weights are streamed once per step, far more of them than the caches
 * hold: on AMD cores non-temporal prefetches (which bring a line close to
 * the core without making it displace the cache's other contents, as a
 * normal fill would) leave L2 and L3 to what a step reuses, the K/V
 * pages and activations. On Intel cores a prefetchnta line goes to L1
 * alone and is lost before it is read at this distance: single-stream
 * decode of a 1B Q8_0 model ran at 7.2-8.9 tokens/s with it and about 25 with
 * prefetcht0 on a Sapphire Rapids-class host. So the tiles of one and two
 * tokens come in both, and cpu_kernels_init_gemm_avx512 picks by vendor.
 * On AMD the wider tiles prefetch too: a batch's first tile over a group
 * finds its weights in DRAM (32 sequences decoding, 1B Q4_K_M on Zen 4:
 * 190.9 -> 242.9 tokens/s, Q8_0 219.6 -> 241.3; prefill, whose later
 * tiles find them in L2, level); on Intel tiles of three or more tokens
 * do not prefetch (their prefetchnta lines would go to L1 alone).
 * The kernels' t0: 0 prefetchnta, 1 prefetcht0, 2 none.
 * PF(t0, p) fetches ahead of p: GEMM_PF_DIST bytes (NTA), GEMM_PF_DIST_T0
 * with prefetcht0, whose lines land in L2 and L1, where a shorter lead
 * suffices (on that host 1B Q8_0 decode 25.0 tokens/s at 4 KiB, 26.8 at
 * 2 KiB and at 1 KiB; Q4_K_M 35.0, 35.5, 34.0). */
#ifndef GEMM_PF_DIST_T0
#define GEMM_PF_DIST_T0 2048
#endif
#define PF(t0, p)                                                          \
	do {                                                               \
		if (t0 == 1)                                               \
			_mm_prefetch((p) + GEMM_PF_DIST_T0, _MM_HINT_T0);  \
		else                                                       \
			_mm_prefetch((p) + GEMM_PF_DIST, _MM_HINT_NTA);    \
	} while (0)

enum gemm_kind { K_Q4_0, K_Q4_1, K_Q8_0, K_Q5_1, K_Q4_K, K_Q5_K, K_Q6_K, K_F32, K_F16, K_BF16 };

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
							    const int C, const int t0, float *y, size_t ldy)
{
	const size_t gb = kind == K_Q8_0 ? GEMM_ROWS * 34 : kind == K_Q5_1 ? GEMM_ROWS * 36
			  : kind == K_Q4_1 ? GEMM_ROWS * 20 : GEMM_ROWS * 18;
	const int qbytes = kind == K_Q8_0 || kind == K_Q5_1 ? 512 : 256;
	const int has_m = kind == K_Q4_1 || kind == K_Q5_1;
	const __m512i lo4 = _mm512_set1_epi8(0x0f);
	__m512 acc[GEMM_COLS];

	UNROLL for (int t = 0; t < C; t++)
		acc[t] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++, wp += gb) {
		__m512i ia[GEMM_COLS], ib[GEMM_COLS];
		if (t0 != 2) {
			UNROLL for (size_t o = 0; o < gb; o += 64)
				PF(t0, (const char *)wp + o);
		}
		UNROLL for (int t = 0; t < C; t++) {
			const struct q8_block *row = xq + (size_t)t * ldq;
			int32_t s = q8_row_sums(row, nb)[b];
			ia[t] = has_m ? _mm512_setzero_si512() : _mm512_set1_epi32(kind == K_Q4_0 ? -8 * s : -128 * s);
			ib[t] = _mm512_setzero_si512();
		}
		if (kind == K_Q8_0 || kind == K_Q5_1) {
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
		__m512 wm = has_m ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wp + qbytes + 32)))
				  : _mm512_setzero_ps();
		UNROLL for (int t = 0; t < C; t++) {
			const struct q8_block *x = xq + (size_t)t * ldq + b;
			__m512 p = _mm512_cvtepi32_ps(_mm512_add_epi32(ia[t], ib[t]));
			acc[t] = _mm512_fmadd_ps(p, _mm512_mul_ps(wd, _mm512_set1_ps(x->d)), acc[t]);
			if (has_m)
				acc[t] = _mm512_fmadd_ps(wm, _mm512_set1_ps(x->s), acc[t]);
		}
	}
	UNROLL for (int t = 0; t < C; t++)
		_mm512_mask_storeu_ps(y + (size_t)t * ldy, m, acc[t]);
}

/* The K-quants: one group (16 rows) times C tokens, super-block by
 * super-block (layout above). */
TGT static inline __attribute__((always_inline)) void tile_k(enum gemm_kind kind, const uint8_t *wp, int64_t nb,
							      __mmask16 m, const struct q8_block *xq, size_t ldq,
							      const int C, const int t0, float *y, size_t ldy)
{
	const int qb = kind == K_Q4_K ? 256 : kind == K_Q6_K ? 384 : 512;
	const size_t gsb =
		gsb_of(kind == K_Q4_K ? KVD_WTYPE_Q4_K : kind == K_Q5_K ? KVD_WTYPE_Q5_K : KVD_WTYPE_Q6_K, AVX512_PACK);
	const __m512i lo4 = _mm512_set1_epi8(0x0f), top = _mm512_set1_epi8(0x30);
	__m512 acc[GEMM_COLS];

	UNROLL for (int t = 0; t < C; t++)
		acc[t] = _mm512_setzero_ps();
	for (int64_t s = 0; s < nb / 8; s++, wp += gsb) {
		const uint8_t *tail = wp + 8 * qb;
		__m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tail + 256)));
		__m512 dmin = kind == K_Q6_K ? _mm512_setzero_ps()
					     : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tail + 288)));
		__m512i is[GEMM_COLS]; /* S, per token */
		UNROLL for (int t = 0; t < C; t++)
			is[t] = _mm512_setzero_si512();
		for (int j = 0; j < 8; j++) {
			const int64_t b = 8 * s + j;
			const uint8_t *wq = wp + (size_t)qb * j;
			/* the sub-block's exact sums: ia all 32 columns (q6_K:
			 * 0..15, ib 16..31) */
			__m512i ia[GEMM_COLS], ib[GEMM_COLS];
			if (t0 != 2) {
				UNROLL for (size_t o = 0; o < gsb / 8; o += 64)
					PF(t0, (const char *)wp + gsb / 8 * j + o);
			}
			UNROLL for (int t = 0; t < C; t++) {
				if (kind == K_Q6_K) {
					const struct q8_block *row = xq + (size_t)t * ldq;
					int32_t h0 = q8_row_half_sums(row, nb)[b], h1 = q8_row_sums(row, nb)[b] - h0;
					ia[t] = _mm512_set1_epi32(-32 * h0);
					ib[t] = _mm512_set1_epi32(-32 * h1);
				} else {
					ia[t] = _mm512_setzero_si512();
				}
			}
			if (kind == K_Q4_K) {
				UNROLL for (int v = 0; v < 4; v++) {
					__m512i raw = _mm512_loadu_si512(wq + 64 * v);
					__m512i wl = _mm512_and_si512(raw, lo4);
					__m512i wh = _mm512_and_si512(_mm512_srli_epi16(raw, 4), lo4);
					UNROLL for (int t = 0; t < C; t++) {
						const int8_t *q = xq[(size_t)t * ldq + b].q;
						ia[t] = _mm512_dpbusd_epi32(ia[t], wl, bcast4(q + 4 * v));
						ia[t] = _mm512_dpbusd_epi32(ia[t], wh, bcast4(q + 16 + 4 * v));
					}
				}
			} else if (kind == K_Q6_K) {
				/* ia elements 0..15, ib 16..31 (two scales). The low
				 * nibbles as q4_K's, joined with their top two bits
				 * (hb0: elements 0..15, hb1: 16..31; bits 2v, 2v+1 of a
				 * byte those of vector v's element) moved to bits 4, 5:
				 * (a & 0x0f) | b in one vpternlogd (0xec: a & c | b) */
				const __m512i hb0 = _mm512_loadu_si512(wq + 256), hb1 = _mm512_loadu_si512(wq + 320);
				UNROLL for (int v = 0; v < 4; v++) {
					__m512i raw = _mm512_loadu_si512(wq + 64 * v), h0, h1;
					if (v < 2) {
						h0 = _mm512_slli_epi16(hb0, 4 - 2 * v);
						h1 = _mm512_slli_epi16(hb1, 4 - 2 * v);
					} else {
						h0 = v == 2 ? hb0 : _mm512_srli_epi16(hb0, 2);
						h1 = v == 2 ? hb1 : _mm512_srli_epi16(hb1, 2);
					}
					__m512i w0 = _mm512_ternarylogic_epi32(raw, _mm512_and_si512(h0, top), lo4, 0xec);
					__m512i w1 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(raw, 4),
									       _mm512_and_si512(h1, top), lo4, 0xec);
					UNROLL for (int t = 0; t < C; t++) {
						const int8_t *q = xq[(size_t)t * ldq + b].q;
						ia[t] = _mm512_dpbusd_epi32(ia[t], w0, bcast4(q + 4 * v));
						ib[t] = _mm512_dpbusd_epi32(ib[t], w1, bcast4(q + 16 + 4 * v));
					}
				}
				const __m512i s0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(tail + 32 * j)));
				const __m512i s1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(tail + 32 * j + 16)));
				UNROLL for (int t = 0; t < C; t++) {
					is[t] = _mm512_add_epi32(is[t], _mm512_mullo_epi32(ia[t], s0));
					is[t] = _mm512_add_epi32(is[t], _mm512_mullo_epi32(ib[t], s1));
				}
			} else {
				/* q5_K: unsigned bytes, elements 0..15 then 16..31 */
				UNROLL for (int v = 0; v < 4; v++) {
					__m512i w0 = _mm512_loadu_si512(wq + 64 * v);
					__m512i w1 = _mm512_loadu_si512(wq + 64 * (v + 4));
					UNROLL for (int t = 0; t < C; t++) {
						const int8_t *q = xq[(size_t)t * ldq + b].q;
						ia[t] = _mm512_dpbusd_epi32(ia[t], w0, bcast4(q + 4 * v));
						ia[t] = _mm512_dpbusd_epi32(ia[t], w1, bcast4(q + 16 + 4 * v));
					}
				}
			}
			if (kind != K_Q6_K) {
				__m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(tail + 16 * j)));
				UNROLL for (int t = 0; t < C; t++)
					is[t] = _mm512_add_epi32(is[t], _mm512_mullo_epi32(ia[t], sc));
			}
		}
		if (kind == K_Q6_K) {
			UNROLL for (int t = 0; t < C; t++) {
				__m512 dx = _mm512_set1_ps(xq[(size_t)t * ldq + 8 * s].d);
				acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[t]), _mm512_mul_ps(d, dx), acc[t]);
			}
		} else {
			/* M: the mins of sub-blocks 2k, 2k+1 as int16 pairs per
			 * lane, times the activation's sums over those sub-blocks */
			__m512i mp[4];
			kq512_min_pairs(tail, mp);
			UNROLL for (int t = 0; t < C; t++) {
				const struct q8_block *row = xq + (size_t)t * ldq;
				__m512i ms = kq512_min_sum(mp, q8_row_sums(row, nb) + 8 * s);
				__m512 dx = _mm512_set1_ps(row[8 * s].d);
				acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[t]), _mm512_mul_ps(d, dx), acc[t]);
				acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(dmin, dx), acc[t]);
			}
		}
	}
	UNROLL for (int t = 0; t < C; t++)
		_mm512_mask_storeu_ps(y + (size_t)t * ldy, m, acc[t]);
}

/* Float weights: one group times C float tokens (x rows ldx apart). */
TGT static inline __attribute__((always_inline)) __m512 load_f(enum gemm_kind kind, const uint8_t *p)
{
	if (kind == K_F32)
		return _mm512_loadu_ps(p);
	__m256i h = _mm256_loadu_si256((const __m256i *)p);
	if (kind == K_F16)
		return _mm512_cvtph_ps(h);
	return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

TGT static inline __attribute__((always_inline)) void tile_f(enum gemm_kind kind, const uint8_t *wp, int64_t nb,
							      __mmask16 m, const float *x, size_t ldx, const int C,
							      const int t0, float *y, size_t ldy)
{
	const size_t cb = kind == K_F32 ? 64 : 32; /* bytes of a column */
	__m512 a0[GEMM_COLS], a1[GEMM_COLS];

	UNROLL for (int t = 0; t < C; t++) {
		a0[t] = _mm512_setzero_ps();
		a1[t] = _mm512_setzero_ps();
	}
	for (int64_t i = 0; i < nb * QK; i += 2, wp += 2 * cb) {
		if (t0 != 2) {
			UNROLL for (size_t o = 0; o < 2 * cb; o += 64)
				PF(t0, (const char *)wp + o);
		}
		__m512 w0 = load_f(kind, wp), w1 = load_f(kind, wp + cb);
		UNROLL for (int t = 0; t < C; t++) {
			const float *xt = x + (size_t)t * ldx + i;
			a0[t] = _mm512_fmadd_ps(w0, _mm512_set1_ps(xt[0]), a0[t]);
			a1[t] = _mm512_fmadd_ps(w1, _mm512_set1_ps(xt[1]), a1[t]);
		}
	}
	UNROLL for (int t = 0; t < C; t++)
		_mm512_mask_storeu_ps(y + (size_t)t * ldy, m, _mm512_add_ps(a0[t], a1[t]));
}

#define INST1(KIND, CC, T0, SUF)                                                                                \
	TGT static void gemm_##KIND##_##CC##SUF(const void *wp, int64_t nb, __mmask16 m, const struct q8_block *xq, \
						size_t ldq, float *y, size_t ldy)                                \
	{                                                                                                      \
		tile(KIND, wp, nb, m, xq, ldq, CC, T0, y, ldy);                                               \
	}
#define INSTKQ(KIND, CC, T0, SUF)                                                                               \
	TGT static void gemm_##KIND##_##CC##SUF(const void *wp, int64_t nb, __mmask16 m, const struct q8_block *xq, \
						size_t ldq, float *y, size_t ldy)                                \
	{                                                                                                      \
		tile_k(KIND, wp, nb, m, xq, ldq, CC, T0, y, ldy);                                             \
	}
#define INSTF(KIND, CC, T0, SUF)                                                                                \
	TGT static void gemm_##KIND##_##CC##SUF(const void *wp, int64_t nb, __mmask16 m, const float *x,          \
						size_t ldx, float *y, size_t ldy)                                \
	{                                                                                                      \
		tile_f(KIND, wp, nb, m, x, ldx, CC, T0, y, ldy);                                              \
	}
/* widths 1..8 with non-temporal prefetches (AMD); for Intel (_t0) 1 and 2
 * with prefetcht0, 3..8 without prefetches */
#define INST8(I, KIND)                                                                                        \
	I(KIND, 1, 0, ) I(KIND, 2, 0, ) I(KIND, 3, 0, ) I(KIND, 4, 0, ) I(KIND, 5, 0, ) I(KIND, 6, 0, )          \
		I(KIND, 7, 0, ) I(KIND, 8, 0, ) I(KIND, 1, 1, _t0) I(KIND, 2, 1, _t0) I(KIND, 3, 2, _t0)       \
		I(KIND, 4, 2, _t0) I(KIND, 5, 2, _t0) I(KIND, 6, 2, _t0) I(KIND, 7, 2, _t0) I(KIND, 8, 2, _t0)
INST8(INST1, K_Q4_0)
INST8(INST1, K_Q4_1)
INST8(INST1, K_Q8_0)
INST8(INST1, K_Q5_1)
INST8(INSTKQ, K_Q4_K)
INST8(INSTKQ, K_Q5_K)
INST8(INSTKQ, K_Q6_K)
INST8(INSTF, K_F32)
INST8(INSTF, K_F16)
INST8(INSTF, K_BF16)
_Static_assert(GEMM_COLS == 8, "one instance per tile width");

typedef void (*tile_fn)(const void *wp, int64_t nb, __mmask16 m, const struct q8_block *xq, size_t ldq, float *y,
			size_t ldy);
#define TABLE(KIND, S1)                                                                                  \
	{                                                                                                \
		gemm_##KIND##_1##S1, gemm_##KIND##_2##S1, gemm_##KIND##_3##S1, gemm_##KIND##_4##S1,      \
			gemm_##KIND##_5##S1, gemm_##KIND##_6##S1, gemm_##KIND##_7##S1, gemm_##KIND##_8##S1 \
	}
#define TABLES(TYPE, T, KIND)                                                                            \
	static const TYPE tiles_##T[GEMM_COLS] = TABLE(KIND, );                                         \
	static const TYPE tiles_##T##_t0[GEMM_COLS] = TABLE(KIND, _t0);
TABLES(tile_fn, q4_0, K_Q4_0)
TABLES(tile_fn, q4_1, K_Q4_1)
TABLES(tile_fn, q8_0, K_Q8_0)
TABLES(tile_fn, q5_1, K_Q5_1)
TABLES(tile_fn, q4_K, K_Q4_K)
TABLES(tile_fn, q5_K, K_Q5_K)
TABLES(tile_fn, q6_K, K_Q6_K)
typedef void (*tilef_fn)(const void *wp, int64_t nb, __mmask16 m, const float *x, size_t ldx, float *y, size_t ldy);
TABLES(tilef_fn, f32, K_F32)
TABLES(tilef_fn, f16, K_F16)
TABLES(tilef_fn, bf16, K_BF16)

#define ENTRY1(T)                                                                                                \
	static void gemm_##T(const void *wp, int64_t nb, int R, const struct q8_block *xq, size_t ldq, int C, float *y, \
			     size_t ldy)                                                                         \
	{                                                                                                        \
		tiles_##T[C - 1](wp, nb, (__mmask16)((1u << R) - 1), xq, ldq, y, ldy);                              \
	}
#define ENTRY(T) ENTRY1(T) ENTRY1(T##_t0)
ENTRY(q4_0)
ENTRY(q4_1)
ENTRY(q8_0)
ENTRY(q5_1)
ENTRY(q4_K)
ENTRY(q5_K)
ENTRY(q6_K)
#define ENTRYF1(T)                                                                                              \
	static void gemm_##T(const void *wp, int64_t nb, int R, const float *x, size_t ldx, int C, float *y,     \
			     size_t ldy)                                                                         \
	{                                                                                                       \
		tiles_##T[C - 1](wp, nb, (__mmask16)((1u << R) - 1), x, ldx, y, ldy);                              \
	}
#define ENTRYF(T) ENTRYF1(T) ENTRYF1(T##_t0)
ENTRYF(f32)
ENTRYF(f16)
ENTRYF(bf16)

int cpu_kernels_init_gemm_avx512(struct cpu_kernels *k)
{
	if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
	    !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512vnni") ||
	    !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("f16c") ||
	    !__builtin_cpu_supports("fma"))
		return 0;
	const int t0 = cpu_vendor() == CPU_VENDOR_INTEL; /* prefetcht0 for the weights (above) */
	k->gemm[KVD_WTYPE_Q4_0] = t0 ? gemm_q4_0_t0 : gemm_q4_0;
	k->gemm[KVD_WTYPE_Q4_1] = t0 ? gemm_q4_1_t0 : gemm_q4_1;
	k->gemm[KVD_WTYPE_Q8_0] = t0 ? gemm_q8_0_t0 : gemm_q8_0;
	k->gemm[KVD_WTYPE_Q5_0] = k->gemm[KVD_WTYPE_Q8_0]; /* packed as q8_0 (cpu_gemm_pack) */
	k->gemm[KVD_WTYPE_Q5_1] = t0 ? gemm_q5_1_t0 : gemm_q5_1;
	k->gemm[KVD_WTYPE_Q4_K] = t0 ? gemm_q4_K_t0 : gemm_q4_K;
	k->gemm[KVD_WTYPE_Q5_K] = t0 ? gemm_q5_K_t0 : gemm_q5_K;
	k->gemm[KVD_WTYPE_Q6_K] = t0 ? gemm_q6_K_t0 : gemm_q6_K;
	k->gemmf[KVD_WTYPE_F32] = t0 ? gemm_f32_t0 : gemm_f32;
	k->gemmf[KVD_WTYPE_F16] = t0 ? gemm_f16_t0 : gemm_f16;
	k->gemmf[KVD_WTYPE_BF16] = t0 ? gemm_bf16_t0 : gemm_bf16;
	k->pack_flags = AVX512_PACK; /* q6_K as 4 + 2 bits, q5_K widened to bytes */
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
