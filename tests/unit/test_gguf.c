/*
 * tests/unit/test_gguf.c — the GGUF reader (daemon/model/gguf.h).
 *
 * Files are written by a small GGUF writer in this file into a private
 * temporary directory: valid v2 and v3 files carrying every metadata type
 * (scalars and arrays) and tensors at alignments 32 and 64, then hostile
 * variants, each of which must fail with the documented negative errno and
 * a one-line message starting with the file's path. Every prefix of a valid
 * file must be rejected without crashing. When scripts/setup has installed
 * the default model, facts about it (cross-checked with the Python gguf
 * package) are verified and the open time is bounded; otherwise that test is
 * skipped.
 *
 * Set KVD_GGUF_CORPUS=<dir> to also save the valid files written here as
 * seeds for tests/fuzz/fuzz_gguf.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gguf.h"

#define REAL_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

#include "gguf_writer.h"

static void w_header(struct wbuf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
	w_bytes(b, "GGUF", 4);
	w_u32(b, version);
	w_u64(b, n_tensors);
	w_u64(b, n_kv);
}

/* A file under construction: metadata, tensor directory and data kept apart
 * until gw_finish() knows the counts. */
struct gw {
	uint32_t align;
	struct wbuf kv, ti, data;
	uint64_t n_kv, n_ti;
};

/* Writes a key and its type; the caller writes the value into g->kv. */
static struct wbuf *gw_key(struct gw *g, const char *key, uint32_t type)
{
	w_str(&g->kv, key);
	w_u32(&g->kv, type);
	g->n_kv++;
	return &g->kv;
}

static struct wbuf *gw_arr(struct gw *g, const char *key, uint32_t elem_type, uint64_t n)
{
	struct wbuf *b = gw_key(g, key, GGUF_VT_ARRAY);
	w_u32(b, elem_type);
	w_u64(b, n);
	return b;
}

/* Expected block geometry, written down here independently of gguf.c. */
static const struct {
	uint32_t type, elems, bytes;
	const char *name;
} dtypes[] = {
	{ GGML_DT_F32, 1, 4, "f32" },     { GGML_DT_F16, 1, 2, "f16" },
	{ GGML_DT_BF16, 1, 2, "bf16" },   { GGML_DT_Q4_0, 32, 18, "q4_0" },
	{ GGML_DT_Q4_1, 32, 20, "q4_1" }, { GGML_DT_Q5_0, 32, 22, "q5_0" },
	{ GGML_DT_Q5_1, 32, 24, "q5_1" }, { GGML_DT_Q8_0, 32, 34, "q8_0" },
	{ GGML_DT_Q8_1, 32, 36, "q8_1" }, { GGML_DT_Q2_K, 256, 84, "q2_K" },
	{ GGML_DT_Q3_K, 256, 110, "q3_K" }, { GGML_DT_Q4_K, 256, 144, "q4_K" },
	{ GGML_DT_Q5_K, 256, 176, "q5_K" }, { GGML_DT_Q6_K, 256, 210, "q6_K" },
	{ GGML_DT_Q8_K, 256, 292, "q8_K" },
};

static uint64_t expect_nbytes(uint32_t type, const uint64_t *ne, uint32_t n_dims)
{
	uint64_t n = 1;
	for (uint32_t d = 0; d < n_dims; d++)
		n *= ne[d];
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
		if (dtypes[i].type == type)
			return n / dtypes[i].elems * dtypes[i].bytes;
	fail_msg("no size for type %u", type);
	return 0;
}

/* Byte j of tensor i's data. */
static uint8_t pattern(uint64_t i, uint64_t j)
{
	return (uint8_t)(i * 37 + j * 11 + 5);
}

/* Appends a tensor with patterned data at the next aligned offset. */
static void gw_tensor(struct gw *g, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type)
{
	w_pad(&g->data, g->align);
	uint64_t off = g->data.n, nbytes = expect_nbytes(type, ne, n_dims);
	for (uint64_t j = 0; j < nbytes; j++)
		w_u8(&g->data, pattern(g->n_ti, j));
	w_str(&g->ti, name);
	w_u32(&g->ti, n_dims);
	for (uint32_t d = 0; d < n_dims; d++)
		w_u64(&g->ti, ne[d]);
	w_u32(&g->ti, type);
	w_u64(&g->ti, off);
	g->n_ti++;
}

static void gw_finish(struct gw *g, uint32_t version, struct wbuf *out)
{
	w_header(out, version, g->n_ti, g->n_kv);
	w_bytes(out, g->kv.p, g->kv.n);
	w_bytes(out, g->ti.p, g->ti.n);
	if (g->n_ti > 0) {
		w_pad(out, g->align);
		w_bytes(out, g->data.p, g->data.n);
	}
	w_free(&g->kv);
	w_free(&g->ti);
	w_free(&g->data);
}

/* ---- the sample file: every metadata type and four tensors ---- */

static const struct {
	const char *name;
	uint32_t n_dims;
	uint64_t ne[4];
	uint32_t type;
} sample_tensors[] = {
	{ "w.f32", 2, { 4, 3 }, GGML_DT_F32 },
	{ "blk.0.attn_q.weight", 2, { 64, 2 }, GGML_DT_Q4_1 },
	{ "w.q8_0", 1, { 32 }, GGML_DT_Q8_0 },
	{ "w.f16", 4, { 2, 2, 3, 1 }, GGML_DT_F16 },
};
#define N_SAMPLE_TENSORS (sizeof(sample_tensors) / sizeof(sample_tensors[0]))

/* align == 0: no general.alignment key (the default, 32, applies). */
static void build_sample(struct wbuf *out, uint32_t version, uint32_t align)
{
	struct gw g = { .align = align ? align : GGUF_DEFAULT_ALIGNMENT };
	w_u8(gw_key(&g, "t.u8", GGUF_VT_UINT8), 200);
	w_u8(gw_key(&g, "t.i8", GGUF_VT_INT8), (uint8_t)-100);
	w_u16(gw_key(&g, "t.u16", GGUF_VT_UINT16), 60000);
	w_u16(gw_key(&g, "t.i16", GGUF_VT_INT16), (uint16_t)-30000);
	w_u32(gw_key(&g, "t.u32", GGUF_VT_UINT32), 4000000000u);
	w_u32(gw_key(&g, "t.i32", GGUF_VT_INT32), (uint32_t)-2000000000);
	w_f32(gw_key(&g, "t.f32", GGUF_VT_FLOAT32), 1.5f);
	w_u8(gw_key(&g, "t.bool", GGUF_VT_BOOL), 1);
	w_str(gw_key(&g, "t.str", GGUF_VT_STRING), "hello, gguf");
	w_str(gw_key(&g, "t.empty", GGUF_VT_STRING), "");
	w_u64(gw_key(&g, "t.u64", GGUF_VT_UINT64), 1ull << 40);
	w_u64(gw_key(&g, "t.i64", GGUF_VT_INT64), (uint64_t)-(1ll << 40));
	w_f64(gw_key(&g, "t.f64", GGUF_VT_FLOAT64), 0.25);
	w_u64(gw_key(&g, "t.small_u64", GGUF_VT_UINT64), 7);
	w_u64(gw_key(&g, "t.neg_i64", GGUF_VT_INT64), (uint64_t)INT64_MIN);

	struct wbuf *b;
	b = gw_arr(&g, "a.u8", GGUF_VT_UINT8, 3);
	w_u8(b, 1), w_u8(b, 2), w_u8(b, 255);
	b = gw_arr(&g, "a.i8", GGUF_VT_INT8, 2);
	w_u8(b, (uint8_t)-1), w_u8(b, (uint8_t)-128);
	b = gw_arr(&g, "a.u16", GGUF_VT_UINT16, 2);
	w_u16(b, 65535), w_u16(b, 9);
	b = gw_arr(&g, "a.i16", GGUF_VT_INT16, 2);
	w_u16(b, (uint16_t)-32768), w_u16(b, 32767);
	b = gw_arr(&g, "a.u32", GGUF_VT_UINT32, 2);
	w_u32(b, 1), w_u32(b, 3000000000u);
	b = gw_arr(&g, "a.i32", GGUF_VT_INT32, 3);
	w_u32(b, (uint32_t)-5), w_u32(b, 7), w_u32(b, (uint32_t)INT32_MIN);
	b = gw_arr(&g, "a.f32", GGUF_VT_FLOAT32, 2);
	w_f32(b, 0.5f), w_f32(b, -2.0f);
	b = gw_arr(&g, "a.bool", GGUF_VT_BOOL, 2);
	w_u8(b, 1), w_u8(b, 0);
	b = gw_arr(&g, "a.str", GGUF_VT_STRING, 4);
	w_str(b, ""), w_str(b, "x"), w_str(b, "hello"), w_strn(b, "a\0b", 3);
	b = gw_arr(&g, "a.u64", GGUF_VT_UINT64, 2);
	w_u64(b, 5), w_u64(b, UINT64_MAX);
	b = gw_arr(&g, "a.i64", GGUF_VT_INT64, 2);
	w_u64(b, (uint64_t)-3), w_u64(b, (uint64_t)1 << 35);
	b = gw_arr(&g, "a.f64", GGUF_VT_FLOAT64, 1);
	w_f64(b, 1.25);
	gw_arr(&g, "a.empty", GGUF_VT_UINT32, 0);
	gw_arr(&g, "a.empty_str", GGUF_VT_STRING, 0);
	if (align)
		w_u32(gw_key(&g, "general.alignment", GGUF_VT_UINT32), align);

	for (size_t i = 0; i < N_SAMPLE_TENSORS; i++)
		gw_tensor(&g, sample_tensors[i].name, sample_tensors[i].n_dims, sample_tensors[i].ne,
			  sample_tensors[i].type);
	gw_finish(&g, version, out);
}

/* ---- files on disk ---- */

struct fixture {
	char dir[64];
	char path[128];
};

static int setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof(*fx));
	if (!fx)
		return -1;
	const char *tmp = getenv("TMPDIR");
	snprintf(fx->dir, sizeof(fx->dir), "%s/kvd-gguf-XXXXXX", tmp && strlen(tmp) < 40 ? tmp : "/tmp");
	if (!mkdtemp(fx->dir)) {
		free(fx);
		return -1;
	}
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *fx = *state;
	rmdir(fx->dir);
	free(fx);
	return 0;
}

static const char *write_file(struct fixture *fx, const char *name, const void *data, size_t n)
{
	snprintf(fx->path, sizeof(fx->path), "%s/%s.gguf", fx->dir, name);
	int fd = open(fx->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, n), (ssize_t)n);
	close(fd);
	return fx->path;
}

static void save_seed(const char *name, const struct wbuf *b)
{
	const char *dir = getenv("KVD_GGUF_CORPUS");
	if (!dir)
		return;
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s.gguf", dir, name);
	FILE *fp = fopen(path, "wb");
	if (fp) {
		fwrite(b->p, 1, b->n, fp);
		fclose(fp);
	}
}

/* Writes b, opens it, removes it. */
static int open_buf(struct fixture *fx, const char *name, const struct wbuf *b,
		    struct gguf_file **ret, char *err, size_t errlen)
{
	const char *path = write_file(fx, name, b->p, b->n);
	int r = gguf_open(path, ret, err, errlen);
	unlink(path);
	return r;
}

/* Opening b must fail with -expect_errno and an error naming the file and
 * containing `needle`. */
static void expect_reject(struct fixture *fx, const char *name, const struct wbuf *b,
			  int expect_errno, const char *needle)
{
	struct gguf_file *f = (struct gguf_file *)0x1;
	char err[512];
	int r = open_buf(fx, name, b, &f, err, sizeof(err));
	if (r != -expect_errno)
		fail_msg("%s: got %d (%s), expected %d", name, r, err, -expect_errno);
	assert_ptr_equal(f, (struct gguf_file *)0x1); /* untouched on failure */
	size_t plen = strlen(fx->path);
	if (strncmp(err, fx->path, plen) != 0 || strncmp(err + plen, ": ", 2) != 0)
		fail_msg("%s: message does not start with the path: '%s'", name, err);
	assert_null(strchr(err, '\n'));
	if (needle && !strstr(err, needle))
		fail_msg("%s: message '%s' lacks '%s'", name, err, needle);
}

/* ---- valid files ---- */

static void check_sample(const struct gguf_file *f, uint32_t version, uint32_t align_key)
{
	uint32_t align = align_key ? align_key : GGUF_DEFAULT_ALIGNMENT;
	assert_int_equal(gguf_version(f), version);
	assert_int_equal(gguf_alignment(f), align);
	assert_int_equal(gguf_n_kv(f), 29 + (align_key ? 1 : 0));
	assert_int_equal(gguf_n_tensors(f), N_SAMPLE_TENSORS);

	/* keys by index and by name */
	assert_string_equal(gguf_key_name(f, 0), "t.u8");
	assert_int_equal(gguf_kv_type(f, 0), GGUF_VT_UINT8);
	assert_int_equal(gguf_find_key(f, "t.str"), 8);
	assert_int_equal(gguf_kv_type(f, 8), GGUF_VT_STRING);
	assert_int_equal(gguf_find_key(f, "no.such.key"), -ENOENT);
	assert_int_equal(gguf_find_key(f, "t.u"), -ENOENT);
	assert_null(gguf_key_name(f, -1));
	assert_null(gguf_key_name(f, gguf_n_kv(f)));
	assert_int_equal((int)gguf_kv_type(f, gguf_n_kv(f)), -1);
	for (int i = 0; i < gguf_n_kv(f); i++)
		assert_int_equal(gguf_find_key(f, gguf_key_name(f, i)), i);

	uint32_t u32;
	int32_t i32;
	uint64_t u64;
	float f32;
	int b;
	const char *s;
	size_t len;

	/* integers convert when the value fits, in every direction */
	assert_int_equal(gguf_get_u32(f, "t.u8", &u32), 0);
	assert_int_equal(u32, 200);
	assert_int_equal(gguf_get_i32(f, "t.u8", &i32), 0);
	assert_int_equal(i32, 200);
	assert_int_equal(gguf_get_i32(f, "t.i8", &i32), 0);
	assert_int_equal(i32, -100);
	u32 = 77;
	assert_int_equal(gguf_get_u32(f, "t.i8", &u32), -EINVAL);
	assert_int_equal(u32, 77); /* untouched on failure */
	assert_int_equal(gguf_get_u64(f, "t.i8", &u64), -EINVAL);
	assert_int_equal(gguf_get_u32(f, "t.u16", &u32), 0);
	assert_int_equal(u32, 60000);
	assert_int_equal(gguf_get_i32(f, "t.i16", &i32), 0);
	assert_int_equal(i32, -30000);
	assert_int_equal(gguf_get_u32(f, "t.u32", &u32), 0);
	assert_int_equal(u32, 4000000000u);
	assert_int_equal(gguf_get_i32(f, "t.u32", &i32), -EINVAL);
	assert_int_equal(gguf_get_u64(f, "t.u32", &u64), 0);
	assert_int_equal(u64, 4000000000u);
	assert_int_equal(gguf_get_i32(f, "t.i32", &i32), 0);
	assert_int_equal(i32, -2000000000);
	assert_int_equal(gguf_get_u64(f, "t.u64", &u64), 0);
	assert_int_equal(u64, 1ull << 40);
	assert_int_equal(gguf_get_u32(f, "t.u64", &u32), -EINVAL);
	assert_int_equal(gguf_get_u32(f, "t.small_u64", &u32), 0);
	assert_int_equal(u32, 7);
	assert_int_equal(gguf_get_i32(f, "t.i64", &i32), -EINVAL);
	assert_int_equal(gguf_get_u64(f, "t.i64", &u64), -EINVAL);
	assert_int_equal(gguf_get_i32(f, "t.neg_i64", &i32), -EINVAL);

	/* floats, bools, strings; wrong types are -EINVAL */
	assert_int_equal(gguf_get_f32(f, "t.f32", &f32), 0);
	assert_true(f32 == 1.5f);
	assert_int_equal(gguf_get_f32(f, "t.f64", &f32), 0);
	assert_true(f32 == 0.25f);
	assert_int_equal(gguf_get_f32(f, "t.u32", &f32), -EINVAL);
	assert_int_equal(gguf_get_u32(f, "t.f32", &u32), -EINVAL);
	assert_int_equal(gguf_get_bool(f, "t.bool", &b), 0);
	assert_int_equal(b, 1);
	assert_int_equal(gguf_get_bool(f, "t.u8", &b), -EINVAL);
	assert_int_equal(gguf_get_u32(f, "t.bool", &u32), -EINVAL);
	assert_int_equal(gguf_get_str(f, "t.str", &s, &len), 0);
	assert_int_equal(len, 11);
	assert_memory_equal(s, "hello, gguf", 11);
	assert_int_equal(gguf_get_str(f, "t.empty", &s, &len), 0);
	assert_int_equal(len, 0);
	assert_int_equal(gguf_get_str(f, "t.u8", &s, &len), -EINVAL);
	assert_int_equal(gguf_get_u32(f, "t.str", &u32), -EINVAL);
	assert_int_equal(gguf_get_u32(f, "missing", &u32), -ENOENT);
	assert_int_equal(gguf_get_i32(f, "missing", &i32), -ENOENT);
	assert_int_equal(gguf_get_u64(f, "missing", &u64), -ENOENT);
	assert_int_equal(gguf_get_f32(f, "missing", &f32), -ENOENT);
	assert_int_equal(gguf_get_bool(f, "missing", &b), -ENOENT);
	assert_int_equal(gguf_get_str(f, "missing", &s, &len), -ENOENT);

	/* arrays */
	enum gguf_vtype et;
	uint64_t n;
	static const struct { const char *key; enum gguf_vtype type; uint64_t n; } arrs[] = {
		{ "a.u8", GGUF_VT_UINT8, 3 },   { "a.i8", GGUF_VT_INT8, 2 },
		{ "a.u16", GGUF_VT_UINT16, 2 }, { "a.i16", GGUF_VT_INT16, 2 },
		{ "a.u32", GGUF_VT_UINT32, 2 }, { "a.i32", GGUF_VT_INT32, 3 },
		{ "a.f32", GGUF_VT_FLOAT32, 2 }, { "a.bool", GGUF_VT_BOOL, 2 },
		{ "a.str", GGUF_VT_STRING, 4 }, { "a.u64", GGUF_VT_UINT64, 2 },
		{ "a.i64", GGUF_VT_INT64, 2 },  { "a.f64", GGUF_VT_FLOAT64, 1 },
		{ "a.empty", GGUF_VT_UINT32, 0 }, { "a.empty_str", GGUF_VT_STRING, 0 },
	};
	for (size_t i = 0; i < sizeof(arrs) / sizeof(arrs[0]); i++) {
		assert_int_equal(gguf_get_arr(f, arrs[i].key, &et, &n), 0);
		assert_int_equal(et, arrs[i].type);
		assert_int_equal(n, arrs[i].n);
		int idx = gguf_find_key(f, arrs[i].key);
		assert_true(idx >= 0);
		assert_int_equal(gguf_kv_type(f, idx), GGUF_VT_ARRAY);
	}
	assert_int_equal(gguf_get_arr(f, "t.u8", &et, &n), -EINVAL);
	assert_int_equal(gguf_get_arr(f, "missing", &et, &n), -ENOENT);
	assert_int_equal(gguf_get_u32(f, "a.u32", &u32), -EINVAL);

	static const struct { const char *key; uint64_t i; int32_t v; } ints[] = {
		{ "a.u8", 0, 1 }, { "a.u8", 2, 255 }, { "a.i8", 0, -1 }, { "a.i8", 1, -128 },
		{ "a.u16", 0, 65535 }, { "a.i16", 0, -32768 }, { "a.i16", 1, 32767 },
		{ "a.u32", 0, 1 }, { "a.i32", 0, -5 }, { "a.i32", 1, 7 }, { "a.i32", 2, INT32_MIN },
		{ "a.u64", 0, 5 }, { "a.i64", 0, -3 },
	};
	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
		i32 = 0;
		assert_int_equal(gguf_arr_i32(f, ints[i].key, ints[i].i, &i32), 0);
		assert_int_equal(i32, ints[i].v);
	}
	assert_int_equal(gguf_arr_i32(f, "a.u32", 1, &i32), -EINVAL);   /* 3e9 does not fit */
	assert_int_equal(gguf_arr_i32(f, "a.u64", 1, &i32), -EINVAL);
	assert_int_equal(gguf_arr_i32(f, "a.i64", 1, &i32), -EINVAL);
	assert_int_equal(gguf_arr_i32(f, "a.f32", 0, &i32), -EINVAL);
	assert_int_equal(gguf_arr_i32(f, "a.str", 0, &i32), -EINVAL);
	assert_int_equal(gguf_arr_i32(f, "a.bool", 0, &i32), -EINVAL);
	assert_int_equal(gguf_arr_i32(f, "a.u8", 3, &i32), -ERANGE);
	assert_int_equal(gguf_arr_i32(f, "a.empty", 0, &i32), -ERANGE);
	assert_int_equal(gguf_arr_i32(f, "a.i32", UINT64_MAX, &i32), -ERANGE);
	assert_int_equal(gguf_arr_i32(f, "t.i32", 0, &i32), -EINVAL);
	assert_int_equal(gguf_arr_i32(f, "missing", 0, &i32), -ENOENT);

	assert_int_equal(gguf_arr_f32(f, "a.f32", 1, &f32), 0);
	assert_true(f32 == -2.0f);
	assert_int_equal(gguf_arr_f32(f, "a.f64", 0, &f32), 0);
	assert_true(f32 == 1.25f);
	assert_int_equal(gguf_arr_f32(f, "a.f64", 1, &f32), -ERANGE);
	assert_int_equal(gguf_arr_f32(f, "a.i32", 0, &f32), -EINVAL);
	assert_int_equal(gguf_arr_f32(f, "missing", 0, &f32), -ENOENT);

	static const struct { const char *s; size_t len; } strs[] = {
		{ "", 0 }, { "x", 1 }, { "hello", 5 }, { "a\0b", 3 },
	};
	for (uint64_t i = 0; i < 4; i++) {
		assert_int_equal(gguf_arr_str(f, "a.str", i, &s, &len), 0);
		assert_int_equal(len, strs[i].len);
		assert_memory_equal(s, strs[i].s, len);
	}
	assert_int_equal(gguf_arr_str(f, "a.str", 4, &s, &len), -ERANGE);
	assert_int_equal(gguf_arr_str(f, "a.empty_str", 0, &s, &len), -ERANGE);
	assert_int_equal(gguf_arr_str(f, "a.u8", 0, &s, &len), -EINVAL);
	assert_int_equal(gguf_arr_str(f, "t.str", 0, &s, &len), -EINVAL);
	assert_int_equal(gguf_arr_str(f, "missing", 0, &s, &len), -ENOENT);

	/* tensors */
	const uint8_t *base = gguf_map_base(f);
	size_t size = gguf_map_size(f);
	const uint8_t *prev_end = NULL;
	for (size_t i = 0; i < N_SAMPLE_TENSORS; i++) {
		const struct gguf_tensor *t = gguf_tensor_at(f, (int)i);
		assert_non_null(t);
		assert_ptr_equal(gguf_find_tensor(f, sample_tensors[i].name), t);
		assert_string_equal(t->name, sample_tensors[i].name);
		assert_int_equal(t->n_dims, sample_tensors[i].n_dims);
		assert_int_equal(t->type, sample_tensors[i].type);
		for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
			assert_int_equal(t->ne[d], d < t->n_dims ? sample_tensors[i].ne[d] : 1);
		uint64_t nbytes = expect_nbytes(t->type, sample_tensors[i].ne, sample_tensors[i].n_dims);
		assert_int_equal(t->nbytes, nbytes);
		assert_int_equal(t->offset % align, 0);
		const uint8_t *d = t->data;
		assert_true(d > base && d + t->nbytes <= base + size);
		assert_int_equal((size_t)(d - base) % align, 0);
		assert_int_equal((uintptr_t)d % align, 0); /* the map is page aligned */
		assert_true(!prev_end || d >= prev_end);
		prev_end = d + t->nbytes;
		for (uint64_t j = 0; j < t->nbytes; j++)
			assert_int_equal(d[j], pattern(i, j));
	}
	assert_ptr_equal(prev_end, base + size); /* the last tensor ends the file */
	assert_null(gguf_tensor_at(f, -1));
	assert_null(gguf_tensor_at(f, (int)N_SAMPLE_TENSORS));
	assert_null(gguf_find_tensor(f, "missing"));
	assert_null(gguf_find_tensor(f, "w.f3"));
}

static void roundtrip(struct fixture *fx, const char *name, uint32_t version, uint32_t align_key)
{
	struct wbuf b = { 0 };
	build_sample(&b, version, align_key);
	save_seed(name, &b);
	struct gguf_file *f = NULL;
	char err[256] = "unset";
	int r = open_buf(fx, name, &b, &f, err, sizeof(err));
	if (r != 0)
		fail_msg("%s: %d %s", name, r, err);
	assert_string_equal(err, ""); /* cleared on success */
	assert_string_equal(gguf_path(f), fx->path);
	check_sample(f, version, align_key);
	assert_null(gguf_close(f));
	w_free(&b);
}

static void test_v3_roundtrip(void **state) { roundtrip(*state, "v3", 3, 0); }
static void test_v2_roundtrip(void **state) { roundtrip(*state, "v2", 2, 0); }
static void test_explicit_alignment_32(void **state) { roundtrip(*state, "align32", 3, 32); }
static void test_alignment_64(void **state) { roundtrip(*state, "align64", 3, 64); }
static void test_alignment_4096_v2(void **state) { roundtrip(*state, "align4096", 2, 4096); }

static void test_close_null(void **state)
{
	(void)state;
	assert_null(gguf_close(NULL));
}

/* No tensors: the data section (and its padding) may be absent. */
static void test_no_tensors(void **state)
{
	struct wbuf b = { 0 };
	w_header(&b, 3, 0, 1);
	w_str(&b, "general.architecture");
	w_u32(&b, GGUF_VT_STRING);
	w_str(&b, "llama");
	struct gguf_file *f = NULL;
	char err[256];
	assert_int_equal(open_buf(*state, "notensors", &b, &f, err, sizeof(err)), 0);
	assert_int_equal(gguf_n_tensors(f), 0);
	assert_null(gguf_tensor_at(f, 0));
	assert_null(gguf_find_tensor(f, "x"));
	const char *s;
	size_t len;
	assert_int_equal(gguf_get_str(f, "general.architecture", &s, &len), 0);
	assert_int_equal(len, 5);
	gguf_close(f);

	/* and nothing at all */
	b.n = 0;
	w_header(&b, 3, 0, 0);
	assert_int_equal(open_buf(*state, "empty_gguf", &b, &f, err, sizeof(err)), 0);
	assert_int_equal(gguf_n_kv(f), 0);
	assert_int_equal(gguf_find_key(f, "x"), -ENOENT);
	uint32_t u;
	assert_int_equal(gguf_get_u32(f, "x", &u), -ENOENT);
	gguf_close(f);
	w_free(&b);
}

static void test_dtype_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++) {
		assert_int_equal(ggml_dtype_block_elems(dtypes[i].type), dtypes[i].elems);
		assert_int_equal(ggml_dtype_block_bytes(dtypes[i].type), dtypes[i].bytes);
		assert_string_equal(ggml_dtype_name(dtypes[i].type), dtypes[i].name);
	}
	uint32_t unknown[] = { 4, 5, 16, 29, 31, 39, 40, 1000, UINT32_MAX };
	for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
		assert_int_equal(ggml_dtype_block_elems(unknown[i]), 0);
		assert_int_equal(ggml_dtype_block_bytes(unknown[i]), 0);
		assert_string_equal(ggml_dtype_name(unknown[i]), "unknown");
	}
}

/* ---- hostile and corrupt files ---- */

/* One tensor "t" after one metadata key; fields as given. */
static void build_one_tensor(struct wbuf *b, uint32_t align_key, uint32_t n_dims, const uint64_t *ne,
			     uint32_t type, uint64_t offset, uint64_t data_bytes)
{
	w_header(b, 3, 1, align_key ? 1 : 0);
	if (align_key) {
		w_str(b, "general.alignment");
		w_u32(b, GGUF_VT_UINT32);
		w_u32(b, align_key);
	}
	w_str(b, "t");
	w_u32(b, n_dims);
	for (uint32_t d = 0; d < n_dims; d++)
		w_u64(b, ne[d]);
	w_u32(b, type);
	w_u64(b, offset);
	w_pad(b, align_key ? align_key : GGUF_DEFAULT_ALIGNMENT);
	for (uint64_t i = 0; i < data_bytes; i++)
		w_u8(b, 0);
}

static void test_one_tensor_valid(void **state)
{
	/* the helper itself makes valid files; the hostile ones below differ in one field */
	struct wbuf b = { 0 };
	uint64_t ne[] = { 8, 2 };
	build_one_tensor(&b, 0, 2, ne, GGML_DT_F32, 0, 64);
	struct gguf_file *f = NULL;
	char err[256];
	assert_int_equal(open_buf(*state, "one", &b, &f, err, sizeof(err)), 0);
	assert_int_equal(gguf_find_tensor(f, "t")->nbytes, 64);
	gguf_close(f);
	w_free(&b);
}

static void test_bad_magic(void **state)
{
	struct wbuf b = { 0 };
	build_sample(&b, 3, 0);
	memcpy(b.p, "GGUG", 4);
	expect_reject(*state, "badmagic", &b, EBADMSG, "magic");
	memcpy(b.p, "ggjt", 4);
	expect_reject(*state, "ggjt", &b, EBADMSG, "magic");
	b.n = 3; /* too short to hold a magic at all */
	expect_reject(*state, "short", &b, EBADMSG, "truncated");
	w_free(&b);
}

static void test_versions_rejected(void **state)
{
	struct wbuf b = { 0 };
	build_sample(&b, 1, 0);
	expect_reject(*state, "v1", &b, EPROTONOSUPPORT, "version 1");
	uint32_t v = 4;
	memcpy(b.p + 4, &v, 4);
	expect_reject(*state, "v4", &b, EPROTONOSUPPORT, "version 4");
	v = 0;
	memcpy(b.p + 4, &v, 4);
	expect_reject(*state, "v0", &b, EPROTONOSUPPORT, "version 0");
	v = 0x03000000; /* version 3 written big-endian */
	memcpy(b.p + 4, &v, 4);
	expect_reject(*state, "bigendian", &b, EPROTONOSUPPORT, "big-endian");
	w_free(&b);
}

/* Every proper prefix of a valid file is truncated: -EBADMSG, never a crash. */
static void test_truncated_every_prefix(void **state)
{
	struct fixture *fx = *state;
	struct wbuf b = { 0 };
	build_sample(&b, 3, 64);
	for (size_t n = 0; n < b.n; n++) {
		char name[32];
		struct gguf_file *f = NULL;
		char err[512];
		snprintf(name, sizeof(name), "prefix");
		const char *path = write_file(fx, name, b.p, n);
		int r = gguf_open(path, &f, err, sizeof(err));
		if (r != -EBADMSG)
			fail_msg("prefix of %zu/%zu bytes: got %d (%s)", n, b.n, r, err);
		assert_null(f);
		assert_true(strncmp(err, path, strlen(path)) == 0);
	}
	unlink(fx->path);
	/* and the whole file opens */
	struct gguf_file *f = NULL;
	char err[256];
	assert_int_equal(open_buf(fx, "whole", &b, &f, err, sizeof(err)), 0);
	gguf_close(f);
	w_free(&b);
}

static void test_huge_counts(void **state)
{
	struct wbuf b = { 0 };
	w_header(&b, 3, 1ull << 60, 0);
	expect_reject(*state, "tensors60", &b, EOVERFLOW, "tensors");
	b.n = 0;
	w_header(&b, 3, 0, 1ull << 60);
	expect_reject(*state, "kv60", &b, EOVERFLOW, "metadata");
	b.n = 0;
	w_header(&b, 3, GGUF_MAX_TENSORS + 1ull, 0);
	expect_reject(*state, "tensors_limit", &b, EOVERFLOW, "limit");
	b.n = 0;
	w_header(&b, 3, UINT64_MAX, UINT64_MAX);
	expect_reject(*state, "max", &b, EOVERFLOW, NULL);
	/* within the limits but not within the file: rejected before allocating */
	b.n = 0;
	w_header(&b, 3, GGUF_MAX_TENSORS, GGUF_MAX_KV);
	w_u64(&b, 0);
	expect_reject(*state, "counts_vs_size", &b, EBADMSG, "truncated");

	/* arrays */
	b.n = 0;
	w_header(&b, 3, 0, 1);
	w_str(&b, "arr");
	w_u32(&b, GGUF_VT_ARRAY);
	w_u32(&b, GGUF_VT_UINT32);
	w_u64(&b, 1ull << 60);
	expect_reject(*state, "arr60", &b, EOVERFLOW, "'arr'");
	b.n -= 8;
	w_u64(&b, GGUF_MAX_ARRAY_LEN + 1ull);
	expect_reject(*state, "arr_limit", &b, EOVERFLOW, "limit");
	b.n -= 8;
	w_u64(&b, GGUF_MAX_ARRAY_LEN);
	expect_reject(*state, "arr_short", &b, EBADMSG, "truncated");
	b.n -= 12;
	w_u32(&b, GGUF_VT_STRING);
	w_u64(&b, GGUF_MAX_ARRAY_LEN); /* 2^24 strings claimed: no 128 MiB offset table */
	w_str(&b, "only one");
	expect_reject(*state, "strarr_short", &b, EBADMSG, "truncated");
	w_free(&b);
}

static void test_huge_strings(void **state)
{
	struct wbuf b = { 0 };
	/* key length */
	w_header(&b, 3, 0, 1);
	w_u64(&b, 1ull << 62);
	w_bytes(&b, "key-key-key-key-", 16);
	expect_reject(*state, "keylen", &b, EOVERFLOW, "key");
	b.n = 0;
	w_header(&b, 3, 0, 1);
	w_u64(&b, GGUF_MAX_KEY_LEN + 1ull);
	w_bytes(&b, "key-key-key-key-", 16);
	expect_reject(*state, "keylen_limit", &b, EOVERFLOW, "limit");
	b.n = 0;
	w_header(&b, 3, 0, 1);
	w_u64(&b, 1000); /* within the limit, past the end */
	w_bytes(&b, "key-key-key-key-", 16);
	expect_reject(*state, "keylen_eof", &b, EBADMSG, "truncated");

	/* string value length */
	b.n = 0;
	w_header(&b, 3, 0, 1);
	w_str(&b, "s");
	w_u32(&b, GGUF_VT_STRING);
	w_u64(&b, 1ull << 62);
	w_bytes(&b, "abc", 3);
	expect_reject(*state, "strlen", &b, EOVERFLOW, "string");
	b.n -= 11;
	w_u64(&b, UINT64_MAX);
	expect_reject(*state, "strlen_max", &b, EOVERFLOW, "string");
	b.n -= 8;
	w_u64(&b, 4);
	expect_reject(*state, "strlen_eof", &b, EBADMSG, "truncated");

	/* a string array element */
	b.n = 0;
	w_header(&b, 3, 0, 1);
	w_str(&b, "a");
	w_u32(&b, GGUF_VT_ARRAY);
	w_u32(&b, GGUF_VT_STRING);
	w_u64(&b, 2);
	w_str(&b, "fine");
	w_u64(&b, 1ull << 62);
	w_bytes(&b, "12345678", 8);
	expect_reject(*state, "arrstrlen", &b, EOVERFLOW, "string array element");

	/* tensor name length */
	b.n = 0;
	w_header(&b, 3, 1, 0);
	w_u64(&b, 1ull << 62);
	for (int i = 0; i < 40; i++)
		w_u8(&b, 'x');
	expect_reject(*state, "namelen", &b, EOVERFLOW, "tensor name");
	w_free(&b);
}

static void test_nested_array(void **state)
{
	struct wbuf b = { 0 };
	w_header(&b, 3, 0, 1);
	w_str(&b, "nest");
	w_u32(&b, GGUF_VT_ARRAY);
	w_u32(&b, GGUF_VT_ARRAY);
	w_u64(&b, 1);
	w_u32(&b, GGUF_VT_UINT8);
	w_u64(&b, 1);
	w_u8(&b, 1);
	expect_reject(*state, "nested", &b, EBADMSG, "nested");
	w_free(&b);
}

static void test_bad_types(void **state)
{
	struct wbuf b = { 0 };
	w_header(&b, 3, 0, 1);
	w_str(&b, "k");
	w_u32(&b, 13);
	w_u32(&b, 0);
	expect_reject(*state, "vtype13", &b, EBADMSG, "unknown value type 13");
	b.n = 0;
	w_header(&b, 3, 0, 1);
	w_str(&b, "k");
	w_u32(&b, GGUF_VT_ARRAY);
	w_u32(&b, 0xffffffffu);
	w_u64(&b, 0);
	expect_reject(*state, "elemtype", &b, EBADMSG, "element type");
	w_free(&b);
}

static void test_key_with_nul(void **state)
{
	struct wbuf b = { 0 };
	w_header(&b, 3, 0, 1);
	w_strn(&b, "gen\0eral", 8);
	w_u32(&b, GGUF_VT_UINT8);
	w_u8(&b, 0);
	expect_reject(*state, "keynul", &b, EBADMSG, "NUL");
	w_free(&b);
}

static void test_duplicate_key(void **state)
{
	struct wbuf b = { 0 };
	w_header(&b, 3, 0, 3);
	w_str(&b, "a.b");
	w_u32(&b, GGUF_VT_UINT8);
	w_u8(&b, 1);
	w_str(&b, "a.c");
	w_u32(&b, GGUF_VT_UINT8);
	w_u8(&b, 1);
	w_str(&b, "a.b");
	w_u32(&b, GGUF_VT_UINT32);
	w_u32(&b, 1);
	expect_reject(*state, "dupkey", &b, EBADMSG, "duplicate key 'a.b'");
	w_free(&b);
}

static void test_bad_alignment(void **state)
{
	uint32_t bad[] = { 0, 3, 48, 0x80000001u };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct wbuf b = { 0 };
		w_header(&b, 3, 0, 1);
		w_str(&b, "general.alignment");
		w_u32(&b, GGUF_VT_UINT32);
		w_u32(&b, bad[i]);
		expect_reject(*state, "badalign", &b, EBADMSG, "power of two");
		w_free(&b);
	}
	struct wbuf b = { 0 };
	w_header(&b, 3, 0, 1);
	w_str(&b, "general.alignment");
	w_u32(&b, GGUF_VT_UINT64);
	w_u64(&b, 32);
	expect_reject(*state, "aligntype", &b, EBADMSG, "uint32");
	w_free(&b);
}

static void test_tensor_offset_misaligned(void **state)
{
	struct wbuf b = { 0 };
	uint64_t ne[] = { 4 };
	build_one_tensor(&b, 0, 1, ne, GGML_DT_F32, 16, 64);
	expect_reject(*state, "misaligned32", &b, EBADMSG, "not a multiple of the alignment 32");
	b.n = 0;
	build_one_tensor(&b, 64, 1, ne, GGML_DT_F32, 32, 128);
	expect_reject(*state, "misaligned64", &b, EBADMSG, "alignment 64");
	w_free(&b);
}

static void test_tensor_past_eof(void **state)
{
	struct wbuf b = { 0 };
	uint64_t ne[] = { 16, 2 };
	build_one_tensor(&b, 0, 2, ne, GGML_DT_F32, 0, 127); /* needs 128 */
	expect_reject(*state, "pasteof", &b, EBADMSG, "tensor 't' data ends at");
	b.n = 0;
	build_one_tensor(&b, 0, 2, ne, GGML_DT_F32, 64, 128);
	expect_reject(*state, "pasteof_off", &b, EBADMSG, "past file size");
	b.n = 0;
	build_one_tensor(&b, 0, 2, ne, GGML_DT_F32, UINT64_MAX - 31, 128); /* offset + size wraps */
	expect_reject(*state, "offset_wrap", &b, EBADMSG, "tensor 't'");
	/* data section padding itself missing */
	b.n = 0;
	build_one_tensor(&b, 4096, 2, ne, GGML_DT_F32, 0, 0);
	b.n -= 1;
	expect_reject(*state, "nopad", &b, EBADMSG, "past file size");
	w_free(&b);
}

static void test_overflowing_dims(void **state)
{
	struct wbuf b = { 0 };
	uint64_t ne3[] = { 1ull << 32, 1ull << 32, 1ull << 32 };
	build_one_tensor(&b, 0, 3, ne3, GGML_DT_F32, 0, 0);
	expect_reject(*state, "dims_overflow", &b, EOVERFLOW, "element count");
	/* element count fits but bytes do not: 2^62 f32 elements */
	b.n = 0;
	uint64_t ne2[] = { 1ull << 31, 1ull << 31 };
	build_one_tensor(&b, 0, 2, ne2, GGML_DT_F32, 0, 0);
	expect_reject(*state, "bytes_overflow", &b, EOVERFLOW, "byte size");
	b.n = 0;
	uint64_t ne1[] = { UINT64_MAX };
	build_one_tensor(&b, 0, 1, ne1, GGML_DT_F32, 0, 0);
	expect_reject(*state, "dim_max", &b, EOVERFLOW, NULL);
	/* fits in 64 bits, far past the end of the file */
	b.n = 0;
	uint64_t ne4[] = { 1024, 1024, 1024, 1024 };
	build_one_tensor(&b, 0, 4, ne4, GGML_DT_Q4_0, 0, 0);
	expect_reject(*state, "big_tensor", &b, EBADMSG, "past file size");
	w_free(&b);
}

static void test_bad_n_dims(void **state)
{
	struct wbuf b = { 0 };
	uint64_t ne[] = { 1, 1, 1, 1, 1 };
	build_one_tensor(&b, 0, 0, ne, GGML_DT_F32, 0, 4);
	expect_reject(*state, "ndims0", &b, EBADMSG, "0 dimensions");
	b.n = 0;
	build_one_tensor(&b, 0, 5, ne, GGML_DT_F32, 0, 4);
	expect_reject(*state, "ndims5", &b, EBADMSG, "5 dimensions");
	b.n = 0;
	w_header(&b, 3, 1, 0);
	w_str(&b, "t");
	w_u32(&b, UINT32_MAX);
	for (int i = 0; i < 40; i++)
		w_u8(&b, 0);
	expect_reject(*state, "ndims_max", &b, EBADMSG, "dimensions");
	/* and a zero dimension */
	b.n = 0;
	uint64_t ne0[] = { 4, 0 };
	build_one_tensor(&b, 0, 2, ne0, GGML_DT_F32, 0, 16);
	expect_reject(*state, "dim0", &b, EBADMSG, "dimension 1 is 0");
	w_free(&b);
}

static void test_tensor_types(void **state)
{
	struct wbuf b = { 0 };
	uint64_t ne[] = { 32 };
	build_one_tensor(&b, 0, 1, ne, 99, 0, 128);
	expect_reject(*state, "type99", &b, EBADMSG, "unknown type id 99");
	b.n = 0;
	build_one_tensor(&b, 0, 1, ne, GGML_DT_COUNT, 0, 128);
	expect_reject(*state, "type_count", &b, EBADMSG, "unknown type");
	b.n = 0;
	build_one_tensor(&b, 0, 1, ne, 4, 0, 128); /* a removed ggml type (Q4_2) */
	expect_reject(*state, "type4", &b, ENOTSUP, "type id 4");
	b.n = 0;
	build_one_tensor(&b, 0, 1, ne, 20, 0, 128); /* IQ4_NL: not sized by kvd */
	expect_reject(*state, "type20", &b, ENOTSUP, "type id 20");
	/* a row that is not a whole number of blocks */
	b.n = 0;
	uint64_t ne16[] = { 16, 2 };
	build_one_tensor(&b, 0, 2, ne16, GGML_DT_Q4_0, 0, 128);
	expect_reject(*state, "partial_block", &b, EBADMSG, "not a multiple of the q4_0 block (32)");
	b.n = 0;
	uint64_t ne_k[] = { 128 };
	build_one_tensor(&b, 0, 1, ne_k, GGML_DT_Q4_K, 0, 1024);
	expect_reject(*state, "partial_kblock", &b, EBADMSG, "q4_K block (256)");
	w_free(&b);
}

static void test_duplicate_tensor(void **state)
{
	struct gw g = { .align = 32 };
	uint64_t ne[] = { 8 };
	gw_tensor(&g, "blk.0.w", 1, ne, GGML_DT_F32);
	gw_tensor(&g, "blk.1.w", 1, ne, GGML_DT_F32);
	gw_tensor(&g, "blk.0.w", 1, ne, GGML_DT_F32);
	struct wbuf b = { 0 };
	gw_finish(&g, 3, &b);
	expect_reject(*state, "duptensor", &b, EBADMSG, "duplicate tensor name 'blk.0.w'");
	w_free(&b);
}

/* Error text stays one line and bounded whatever the names hold. */
static void test_error_message_hygiene(void **state)
{
	struct fixture *fx = *state;
	struct wbuf b = { 0 };
	char longname[300];
	memset(longname, 'n', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	longname[5] = '\n';
	uint64_t ne[] = { 4, 0 };
	w_header(&b, 3, 1, 0);
	w_str(&b, longname);
	w_u32(&b, 2);
	w_u64(&b, ne[0]);
	w_u64(&b, ne[1]);
	w_u32(&b, GGML_DT_F32);
	w_u64(&b, 0);
	expect_reject(fx, "hygiene", &b, EBADMSG, "...' dimension 1 is 0");

	/* a tiny or absent error buffer is fine */
	struct gguf_file *f = NULL;
	char small[8];
	memset(small, 'z', sizeof(small));
	assert_int_equal(open_buf(fx, "small", &b, &f, small, sizeof(small)), -EBADMSG);
	assert_int_equal(strlen(small), sizeof(small) - 1);
	assert_int_equal(open_buf(fx, "noerr", &b, &f, NULL, 0), -EBADMSG);
	w_free(&b);
}

static void test_not_a_file(void **state)
{
	struct fixture *fx = *state;
	struct gguf_file *f = NULL;
	char err[512], path[256];
	snprintf(path, sizeof(path), "%s/does-not-exist.gguf", fx->dir);
	assert_int_equal(gguf_open(path, &f, err, sizeof(err)), -ENOENT);
	assert_null(f);
	assert_true(strncmp(err, path, strlen(path)) == 0);
	assert_non_null(strstr(err, ": cannot open"));

	assert_int_equal(gguf_open(fx->dir, &f, err, sizeof(err)), -EISDIR);
	assert_true(strncmp(err, fx->dir, strlen(fx->dir)) == 0);

	struct wbuf b = { 0 };
	expect_reject(fx, "zero_bytes", &b, EBADMSG, "empty");
}

/* ---- the real model ---- */

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void expect_arr_str(const struct gguf_file *f, const char *key, uint64_t i, const char *want)
{
	const char *s;
	size_t len;
	assert_int_equal(gguf_arr_str(f, key, i, &s, &len), 0);
	assert_int_equal(len, strlen(want));
	assert_memory_equal(s, want, len);
}

static void test_real_model(void **state)
{
	(void)state;
	const char *path = getenv("KVD_TEST_MODEL") ? getenv("KVD_TEST_MODEL") : REAL_MODEL;
	if (access(path, R_OK) != 0) {
		print_message("skipped: %s not present (run scripts/setup)\n", path);
		skip();
	}
	struct gguf_file *f = NULL;
	char err[512];
	/* the fastest of three opens: other load on the machine only adds
	 * time, and the limit is about what open reads (the metadata, not the
	 * tensors' bytes), not about the machine */
	double ms = 1e30;
	for (int k = 0; k < 3; k++) {
		f = gguf_close(f);
		double t0 = now_ms();
		int r = gguf_open(path, &f, err, sizeof(err));
		double dt = now_ms() - t0;
		if (r != 0)
			fail_msg("%d: %s", r, err);
		ms = dt < ms ? dt : ms;
	}
#if defined(__SANITIZE_ADDRESS__)
	const double limit_ms = 500; /* sanitizers slow the metadata walk */
#else
	const double limit_ms = 50;
#endif
	print_message("opened %s in %.2f ms\n", path, ms);
	if (ms > limit_ms)
		fail_msg("open took %.2f ms (limit %.0f)", ms, limit_ms);

	/* Facts cross-checked with the Python gguf package (GGUFReader). */
	assert_int_equal(gguf_version(f), 3);
	assert_int_equal(gguf_alignment(f), 32);
	assert_int_equal(gguf_n_kv(f), 33);
	assert_int_equal(gguf_n_tensors(f), 272);
	const char *s;
	size_t len;
	assert_int_equal(gguf_get_str(f, "general.architecture", &s, &len), 0);
	assert_int_equal(len, 5);
	assert_memory_equal(s, "llama", 5);
	assert_int_equal(gguf_get_str(f, "tokenizer.ggml.model", &s, &len), 0);
	assert_memory_equal(s, "gpt2", len);
	assert_int_equal(gguf_get_str(f, "tokenizer.chat_template", &s, &len), 0);
	assert_int_equal(len, 368);
	uint32_t u;
	assert_int_equal(gguf_get_u32(f, "llama.block_count", &u), 0);
	assert_int_equal(u, 30);
	assert_int_equal(gguf_get_u32(f, "llama.embedding_length", &u), 0);
	assert_int_equal(u, 576);
	assert_int_equal(gguf_get_u32(f, "llama.attention.head_count_kv", &u), 0);
	assert_int_equal(u, 3);
	assert_int_equal(gguf_get_u32(f, "llama.context_length", &u), 0);
	assert_int_equal(u, 8192);
	float x;
	assert_int_equal(gguf_get_f32(f, "llama.rope.freq_base", &x), 0);
	assert_true(x == 100000.0f);
	int b = -1;
	assert_int_equal(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b), 0);
	assert_int_equal(b, 0);

	enum gguf_vtype et;
	uint64_t n;
	assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n), 0);
	assert_int_equal(et, GGUF_VT_STRING);
	assert_int_equal(n, 49152);
	expect_arr_str(f, "tokenizer.ggml.tokens", 0, "<|endoftext|>");
	expect_arr_str(f, "tokenizer.ggml.tokens", 1, "<|im_start|>");
	expect_arr_str(f, "tokenizer.ggml.tokens", 100, "t");
	expect_arr_str(f, "tokenizer.ggml.tokens", 49151, "ectable");
	assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.merges", &et, &n), 0);
	assert_int_equal(n, 48900);
	expect_arr_str(f, "tokenizer.ggml.merges", 0, "\xc4\xa0 t");
	expect_arr_str(f, "tokenizer.ggml.merges", 48899, "ect able");
	int32_t tt;
	assert_int_equal(gguf_arr_i32(f, "tokenizer.ggml.token_type", 0, &tt), 0);
	assert_int_equal(tt, 3);
	assert_int_equal(gguf_arr_i32(f, "tokenizer.ggml.token_type", 100, &tt), 0);
	assert_int_equal(tt, 1);

	const uint8_t *base = gguf_map_base(f);
	const struct gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
	assert_non_null(t);
	assert_int_equal(t->type, GGML_DT_Q8_0);
	assert_int_equal(t->n_dims, 2);
	assert_int_equal(t->ne[0], 576);
	assert_int_equal(t->ne[1], 49152);
	assert_int_equal(t->offset, 0);
	assert_int_equal(t->nbytes, 30081024);
	assert_int_equal((const uint8_t *)t->data - base, 1785664);
	t = gguf_find_tensor(f, "blk.0.attn_q.weight");
	assert_non_null(t);
	assert_int_equal(t->type, GGML_DT_Q4_1);
	assert_int_equal(t->offset, 32020992);
	assert_int_equal(t->nbytes, 207360);
	t = gguf_find_tensor(f, "blk.29.ffn_down.weight");
	assert_non_null(t);
	assert_int_equal(t->ne[0], 1536);
	assert_int_equal(t->ne[1], 576);
	assert_int_equal(t->offset, 78845184);
	t = gguf_tensor_at(f, 271);
	assert_string_equal(t->name, "output_norm.weight");
	assert_int_equal(t->type, GGML_DT_F32);
	assert_int_equal(t->nbytes, 2304);
	assert_ptr_equal((const uint8_t *)t->data + t->nbytes, base + gguf_map_size(f));

	int n_q41 = 0, n_f32 = 0, n_q80 = 0;
	for (int i = 0; i < gguf_n_tensors(f); i++) {
		const struct gguf_tensor *ti = gguf_tensor_at(f, i);
		assert_ptr_equal(gguf_find_tensor(f, ti->name), ti);
		n_q41 += ti->type == GGML_DT_Q4_1;
		n_f32 += ti->type == GGML_DT_F32;
		n_q80 += ti->type == GGML_DT_Q8_0;
	}
	assert_int_equal(n_q41, 210);
	assert_int_equal(n_f32, 61);
	assert_int_equal(n_q80, 1);
	gguf_close(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_v3_roundtrip),
		cmocka_unit_test(test_v2_roundtrip),
		cmocka_unit_test(test_explicit_alignment_32),
		cmocka_unit_test(test_alignment_64),
		cmocka_unit_test(test_alignment_4096_v2),
		cmocka_unit_test(test_close_null),
		cmocka_unit_test(test_no_tensors),
		cmocka_unit_test(test_dtype_table),
		cmocka_unit_test(test_one_tensor_valid),
		cmocka_unit_test(test_bad_magic),
		cmocka_unit_test(test_versions_rejected),
		cmocka_unit_test(test_truncated_every_prefix),
		cmocka_unit_test(test_huge_counts),
		cmocka_unit_test(test_huge_strings),
		cmocka_unit_test(test_nested_array),
		cmocka_unit_test(test_bad_types),
		cmocka_unit_test(test_key_with_nul),
		cmocka_unit_test(test_duplicate_key),
		cmocka_unit_test(test_bad_alignment),
		cmocka_unit_test(test_tensor_offset_misaligned),
		cmocka_unit_test(test_tensor_past_eof),
		cmocka_unit_test(test_overflowing_dims),
		cmocka_unit_test(test_bad_n_dims),
		cmocka_unit_test(test_tensor_types),
		cmocka_unit_test(test_duplicate_tensor),
		cmocka_unit_test(test_error_message_hygiene),
		cmocka_unit_test(test_not_a_file),
		cmocka_unit_test(test_real_model),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
