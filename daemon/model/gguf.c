/*
 * daemon/model/gguf.c — the GGUF reader declared in gguf.h.
 *
 * gguf_open() maps the file read-only and walks it once with a bounds-checked
 * cursor: header, metadata key/values, tensor directory. Every count and
 * length read from the file is compared with a named limit and with the
 * bytes left in the mapping before it is used to size an allocation or to
 * advance the cursor, so a hostile file fails fast with -EOVERFLOW or
 * -EBADMSG instead of making kvd allocate or read what the file claims.
 *
 * What open builds, so that accessors are cheap and cannot fail on bounds:
 *   - one struct gguf_kv per key, with the offset of its value in the map;
 *     string arrays (the vocabulary and merges: ~49k entries each) get a
 *     table of element offsets, making element access O(1);
 *   - open-addressing hash tables (FNV-1a, linear probing) over keys and
 *     tensor names, used both to reject duplicates and for lookups;
 *   - struct gguf_tensor entries whose data pointers are known to lie, with
 *     all their bytes, inside the mapping.
 *
 * GGUF is little-endian; values are read with memcpy + le*toh so unaligned
 * fields are fine and a big-endian host would still read correctly.
 */
#include "gguf.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC_LEN 4
#define GGUF_VT_NTYPES 13 /* value type ids are 0 .. GGUF_VT_NTYPES - 1 */

/* Smallest possible encodings, used to reject counts that cannot fit in
 * the bytes left before anything is allocated for them. */
#define GGUF_MIN_KV_BYTES     13 /* key length (8) + empty key + type (4) + a 1-byte value */
#define GGUF_MIN_TENSOR_BYTES 32 /* name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8) */

/* Longest name shown in an error message; the rest is elided. */
#define GGUF_ERR_NAME_MAX 64

struct gguf_kv {
	char *key;          /* first member: see struct name_table */
	uint32_t type;      /* enum gguf_vtype */
	uint32_t arr_type;  /* element type when type == GGUF_VT_ARRAY */
	uint64_t arr_n;     /* element count when type == GGUF_VT_ARRAY */
	size_t val_off;     /* map offset of the value; of a string's length
	                     * prefix; of an array's first element */
	size_t *str_off;    /* string arrays: map offset of each element's
	                     * length prefix (arr_n entries) */
};

/* Open-addressing table: slot holds entry index + 1, 0 when empty. */
struct gguf_index {
	uint32_t *slot;
	size_t mask;
};

/* Where the names of an entry array live: a `const char *` at the start of
 * each element, elements `stride` bytes apart. */
struct name_table {
	const void *base;
	size_t stride;
};

struct gguf_file {
	char *path;
	const uint8_t *map;
	size_t size;
	uint32_t version;
	uint32_t alignment;
	size_t n_kv;
	struct gguf_kv *kv;
	size_t n_tensors;
	struct gguf_tensor *tensors;
	struct gguf_index kv_index;
	struct gguf_index tensor_index;
};

/* The cursor and error sink used while parsing. */
struct parser {
	const char *path;
	const uint8_t *map;
	size_t size;
	size_t pos;
	char *err;
	size_t errlen;
};

struct dtype_info {
	const char *name;
	uint32_t block_elems;
	uint32_t block_bytes;
};

/* Block geometry from ggml's block structs (ggml-common.h). */
static const struct dtype_info dtype_table[GGML_DT_COUNT] = {
	[GGML_DT_F32]  = { "f32", 1, 4 },
	[GGML_DT_F16]  = { "f16", 1, 2 },
	[GGML_DT_Q4_0] = { "q4_0", 32, 18 },   /* fp16 d + 16 nibble bytes */
	[GGML_DT_Q4_1] = { "q4_1", 32, 20 },   /* fp16 d, m + 16 nibble bytes */
	[GGML_DT_Q5_0] = { "q5_0", 32, 22 },   /* fp16 d + 4 high bits + 16 */
	[GGML_DT_Q5_1] = { "q5_1", 32, 24 },   /* fp16 d, m + 4 + 16 */
	[GGML_DT_Q8_0] = { "q8_0", 32, 34 },   /* fp16 d + 32 int8 */
	[GGML_DT_Q8_1] = { "q8_1", 32, 36 },   /* fp16 d, s + 32 int8 */
	[GGML_DT_Q2_K] = { "q2_K", 256, 84 },  /* 16 scales + 64 quants + 2 fp16 */
	[GGML_DT_Q3_K] = { "q3_K", 256, 110 }, /* 32 hmask + 64 + 12 scales + fp16 */
	[GGML_DT_Q4_K] = { "q4_K", 256, 144 }, /* 2 fp16 + 12 scales + 128 */
	[GGML_DT_Q5_K] = { "q5_K", 256, 176 }, /* 2 fp16 + 12 + 32 qh + 128 */
	[GGML_DT_Q6_K] = { "q6_K", 256, 210 }, /* 128 ql + 64 qh + 16 scales + fp16 */
	[GGML_DT_Q8_K] = { "q8_K", 256, 292 }, /* f32 d + 256 int8 + 16 int16 sums */
	[GGML_DT_BF16] = { "bf16", 1, 2 },
};

/* Bytes of one scalar of each value type; 0 for string and array. */
static const uint8_t vtype_size[GGUF_VT_NTYPES] = {
	[GGUF_VT_UINT8] = 1, [GGUF_VT_INT8] = 1, [GGUF_VT_UINT16] = 2,
	[GGUF_VT_INT16] = 2, [GGUF_VT_UINT32] = 4, [GGUF_VT_INT32] = 4,
	[GGUF_VT_FLOAT32] = 4, [GGUF_VT_BOOL] = 1, [GGUF_VT_STRING] = 0,
	[GGUF_VT_ARRAY] = 0, [GGUF_VT_UINT64] = 8, [GGUF_VT_INT64] = 8,
	[GGUF_VT_FLOAT64] = 8,
};

static const char *const vtype_names[GGUF_VT_NTYPES] = {
	"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
	"bool", "string", "array", "uint64", "int64", "float64",
};

uint32_t ggml_dtype_block_elems(uint32_t type)
{
	return type < GGML_DT_COUNT ? dtype_table[type].block_elems : 0;
}

uint32_t ggml_dtype_block_bytes(uint32_t type)
{
	return type < GGML_DT_COUNT ? dtype_table[type].block_bytes : 0;
}

const char *ggml_dtype_name(uint32_t type)
{
	if (type < GGML_DT_COUNT && dtype_table[type].name)
		return dtype_table[type].name;
	return "unknown";
}

/* ---- little-endian loads (callers have checked the bounds) ---- */

static uint16_t ld16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, sizeof(v));
	return le16toh(v);
}

static uint32_t ld32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, sizeof(v));
	return le32toh(v);
}

static uint64_t ld64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof(v));
	return le64toh(v);
}

/* ---- errors ---- */

/* Writes "<path>: <message>" into the caller's buffer; returns r. */
__attribute__((format(printf, 3, 4)))
static int fail(struct parser *ps, int r, const char *fmt, ...)
{
	if (ps->errlen == 0)
		return r;
	int n = snprintf(ps->err, ps->errlen, "%s: ", ps->path);
	if (n >= 0 && (size_t)n < ps->errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(ps->err + n, ps->errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return r;
}

/* A name from the file made safe for a one-line message: at most
 * GGUF_ERR_NAME_MAX bytes, control bytes shown as '?'. */
static const char *shown(const char *s, size_t len, char buf[GGUF_ERR_NAME_MAX + 4])
{
	size_t n = len < GGUF_ERR_NAME_MAX ? len : GGUF_ERR_NAME_MAX;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
	}
	if (n < len)
		memcpy(buf + n, "...", 3), n += 3;
	buf[n] = '\0';
	return buf;
}

void gguf_strip_controls(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
}

/* ---- cursor ---- */

static size_t left(const struct parser *ps)
{
	return ps->size - ps->pos;
}

static int need(struct parser *ps, uint64_t n, const char *what)
{
	if (n <= left(ps))
		return 0;
	return fail(ps, -EBADMSG, "truncated: %s at offset %zu needs %llu bytes, %zu left",
		    what, ps->pos, (unsigned long long)n, left(ps));
}

static int rd_u32(struct parser *ps, uint32_t *ret, const char *what)
{
	int r = need(ps, 4, what);
	if (r < 0)
		return r;
	*ret = ld32(ps->map + ps->pos);
	ps->pos += 4;
	return 0;
}

static int rd_u64(struct parser *ps, uint64_t *ret, const char *what)
{
	int r = need(ps, 8, what);
	if (r < 0)
		return r;
	*ret = ld64(ps->map + ps->pos);
	ps->pos += 8;
	return 0;
}

/* A GGUF string (u64 length + bytes): checks the length against `limit`
 * (-EOVERFLOW) and the bytes left (-EBADMSG); leaves the cursor after it. */
static int rd_str(struct parser *ps, uint64_t limit, const char *what,
		  const char **ret, size_t *ret_len)
{
	uint64_t len;
	int r = rd_u64(ps, &len, what);
	if (r < 0)
		return r;
	if (len > limit)
		return fail(ps, -EOVERFLOW, "%s at offset %zu claims %llu bytes (limit %llu)",
			    what, ps->pos - 8, (unsigned long long)len, (unsigned long long)limit);
	r = need(ps, len, what);
	if (r < 0)
		return r;
	*ret = (const char *)ps->map + ps->pos;
	*ret_len = (size_t)len;
	ps->pos += (size_t)len;
	return 0;
}

/* A key or tensor name, copied and NUL-terminated into *ret. */
static int rd_name(struct parser *ps, const char *what, char **ret)
{
	const char *s;
	size_t len;
	int r = rd_str(ps, GGUF_MAX_KEY_LEN, what, &s, &len);
	if (r < 0)
		return r;
	if (memchr(s, '\0', len))
		return fail(ps, -EBADMSG, "%s at offset %zu contains a NUL byte", what, ps->pos - len);
	char *copy = malloc(len + 1);
	if (!copy)
		return fail(ps, -ENOMEM, "out of memory");
	memcpy(copy, s, len);
	copy[len] = '\0';
	*ret = copy;
	return 0;
}

/* ---- name index ---- */

static uint64_t hash_name(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= 0x100000001b3ull;
	}
	return h;
}

static const char *name_at(struct name_table t, size_t i)
{
	const char *const *p = (const void *)((const char *)t.base + i * t.stride);
	return *p;
}

/* Room for n entries at a load factor of at most 1/2. */
static int index_init(struct gguf_index *ix, size_t n)
{
	size_t cap = 8;
	while (cap < 2 * n)
		cap *= 2;
	ix->slot = calloc(cap, sizeof(*ix->slot));
	if (!ix->slot)
		return -ENOMEM;
	ix->mask = cap - 1;
	return 0;
}

/* Index of `name`, or -ENOENT. */
static int index_find(const struct gguf_index *ix, struct name_table t, const char *name)
{
	if (!ix->slot)
		return -ENOENT;
	for (size_t h = hash_name(name) & ix->mask;; h = (h + 1) & ix->mask) {
		uint32_t s = ix->slot[h];
		if (s == 0)
			return -ENOENT;
		if (strcmp(name_at(t, s - 1), name) == 0)
			return (int)(s - 1);
	}
}

/* Adds entry i; -EEXIST when its name is already present. */
static int index_add(struct gguf_index *ix, struct name_table t, size_t i)
{
	const char *name = name_at(t, i);
	for (size_t h = hash_name(name) & ix->mask;; h = (h + 1) & ix->mask) {
		uint32_t s = ix->slot[h];
		if (s == 0) {
			ix->slot[h] = (uint32_t)i + 1;
			return 0;
		}
		if (strcmp(name_at(t, s - 1), name) == 0)
			return -EEXIST;
	}
}

static struct name_table kv_names(const struct gguf_file *f)
{
	return (struct name_table){ f->kv, sizeof(*f->kv) };
}

static struct name_table tensor_names(const struct gguf_file *f)
{
	return (struct name_table){ f->tensors, sizeof(*f->tensors) };
}

/* ---- parsing ---- */

static int parse_header(struct parser *ps, struct gguf_file *f, uint64_t *ret_n_tensors, uint64_t *ret_n_kv)
{
	int r = need(ps, GGUF_MAGIC_LEN, "magic");
	if (r < 0)
		return r;
	if (memcmp(ps->map, "GGUF", GGUF_MAGIC_LEN) != 0)
		return fail(ps, -EBADMSG, "bad magic (not a GGUF file)");
	ps->pos = GGUF_MAGIC_LEN;

	uint32_t version;
	r = rd_u32(ps, &version, "version");
	if (r < 0)
		return r;
	if (version == 1)
		return fail(ps, -EPROTONOSUPPORT, "GGUF version 1 is not supported (only 2 and 3)");
	if (version != 2 && version != 3) {
		uint32_t swapped = __builtin_bswap32(version);
		if (swapped >= 1 && swapped <= 3)
			return fail(ps, -EPROTONOSUPPORT, "big-endian GGUF is not supported");
		return fail(ps, -EPROTONOSUPPORT, "GGUF version %u is not supported (only 2 and 3)", version);
	}
	f->version = version;

	uint64_t n_tensors, n_kv;
	if ((r = rd_u64(ps, &n_tensors, "tensor count")) < 0 ||
	    (r = rd_u64(ps, &n_kv, "metadata count")) < 0)
		return r;
	if (n_tensors > GGUF_MAX_TENSORS)
		return fail(ps, -EOVERFLOW, "claims %llu tensors (limit %u)",
			    (unsigned long long)n_tensors, GGUF_MAX_TENSORS);
	if (n_kv > GGUF_MAX_KV)
		return fail(ps, -EOVERFLOW, "claims %llu metadata entries (limit %u)",
			    (unsigned long long)n_kv, GGUF_MAX_KV);
	/* Both are at most 2^16, so this cannot overflow. */
	uint64_t min_bytes = n_kv * GGUF_MIN_KV_BYTES + n_tensors * GGUF_MIN_TENSOR_BYTES;
	if (min_bytes > left(ps))
		return fail(ps, -EBADMSG, "truncated: claims %llu metadata entries and %llu tensors "
			    "but only %zu bytes follow the header",
			    (unsigned long long)n_kv, (unsigned long long)n_tensors, left(ps));
	*ret_n_tensors = n_tensors;
	*ret_n_kv = n_kv;
	return 0;
}

/* The value of kv (its type already read and checked not to be ARRAY). */
static int parse_scalar(struct parser *ps, struct gguf_kv *kv, const char *key)
{
	char nb[GGUF_ERR_NAME_MAX + 4];
	kv->val_off = ps->pos;
	if (kv->type == GGUF_VT_STRING) {
		const char *s;
		size_t len;
		return rd_str(ps, GGUF_MAX_STRING_LEN, "string value", &s, &len);
	}
	int r = need(ps, vtype_size[kv->type], shown(key, strlen(key), nb));
	if (r < 0)
		return r;
	ps->pos += vtype_size[kv->type];
	return 0;
}

static int parse_array(struct parser *ps, struct gguf_kv *kv)
{
	char nb[GGUF_ERR_NAME_MAX + 4];
	const char *key = shown(kv->key, strlen(kv->key), nb);
	uint32_t et;
	uint64_t n;
	int r;
	if ((r = rd_u32(ps, &et, "array element type")) < 0 ||
	    (r = rd_u64(ps, &n, "array length")) < 0)
		return r;
	if (et == GGUF_VT_ARRAY)
		return fail(ps, -EBADMSG, "key '%s' is a nested array (not supported)", key);
	if (et >= GGUF_VT_NTYPES)
		return fail(ps, -EBADMSG, "key '%s' has unknown array element type %u", key, et);
	if (n > GGUF_MAX_ARRAY_LEN)
		return fail(ps, -EOVERFLOW, "key '%s' claims %llu array elements (limit %u)",
			    key, (unsigned long long)n, GGUF_MAX_ARRAY_LEN);
	kv->arr_type = et;
	kv->arr_n = n;
	kv->val_off = ps->pos;

	if (et != GGUF_VT_STRING) {
		/* n <= 2^24 and size <= 8: no overflow. */
		r = need(ps, n * vtype_size[et], "array data");
		if (r < 0)
			return r;
		ps->pos += (size_t)(n * vtype_size[et]);
		return 0;
	}
	/* Every element has at least its 8-byte length: check before allocating. */
	r = need(ps, n * 8, "string array");
	if (r < 0)
		return r;
	if (n == 0)
		return 0;
	kv->str_off = malloc((size_t)n * sizeof(*kv->str_off));
	if (!kv->str_off)
		return fail(ps, -ENOMEM, "out of memory");
	for (uint64_t i = 0; i < n; i++) {
		const char *s;
		size_t len;
		kv->str_off[i] = ps->pos;
		r = rd_str(ps, GGUF_MAX_STRING_LEN, "string array element", &s, &len);
		if (r < 0)
			return r;
	}
	return 0;
}

static int parse_kvs(struct parser *ps, struct gguf_file *f, uint64_t n_kv)
{
	char nb[GGUF_ERR_NAME_MAX + 4];
	int r;
	if (n_kv > 0) {
		f->kv = calloc((size_t)n_kv, sizeof(*f->kv));
		if (!f->kv)
			return fail(ps, -ENOMEM, "out of memory");
	}
	if (index_init(&f->kv_index, (size_t)n_kv) < 0)
		return fail(ps, -ENOMEM, "out of memory");

	for (uint64_t i = 0; i < n_kv; i++) {
		struct gguf_kv *kv = &f->kv[i];
		r = rd_name(ps, "key", &kv->key);
		if (r < 0)
			return r;
		f->n_kv = (size_t)i + 1; /* kv->key is owned by f from here on */
		const char *key = shown(kv->key, strlen(kv->key), nb);
		if (index_add(&f->kv_index, kv_names(f), (size_t)i) < 0)
			return fail(ps, -EBADMSG, "duplicate key '%s'", key);
		r = rd_u32(ps, &kv->type, "value type");
		if (r < 0)
			return r;
		if (kv->type >= GGUF_VT_NTYPES)
			return fail(ps, -EBADMSG, "key '%s' has unknown value type %u", key, kv->type);
		r = kv->type == GGUF_VT_ARRAY ? parse_array(ps, kv) : parse_scalar(ps, kv, kv->key);
		if (r < 0)
			return r;
	}
	return 0;
}

static int parse_alignment(struct parser *ps, struct gguf_file *f)
{
	f->alignment = GGUF_DEFAULT_ALIGNMENT;
	int i = index_find(&f->kv_index, kv_names(f), "general.alignment");
	if (i < 0)
		return 0;
	const struct gguf_kv *kv = &f->kv[i];
	if (kv->type != GGUF_VT_UINT32)
		return fail(ps, -EBADMSG, "general.alignment has type %s, expected uint32",
			    vtype_names[kv->type]);
	uint32_t a = ld32(f->map + kv->val_off);
	if (a == 0 || (a & (a - 1)) != 0)
		return fail(ps, -EBADMSG, "general.alignment %u is not a power of two", a);
	f->alignment = a;
	return 0;
}

static int parse_tensor_info(struct parser *ps, struct gguf_file *f, struct gguf_tensor *t)
{
	char nb[GGUF_ERR_NAME_MAX + 4];
	const char *name = shown(t->name, strlen(t->name), nb);
	int r;

	r = rd_u32(ps, &t->n_dims, "tensor dimension count");
	if (r < 0)
		return r;
	if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
		return fail(ps, -EBADMSG, "tensor '%s' has %u dimensions (1 to %d allowed)",
			    name, t->n_dims, GGUF_MAX_DIMS);
	uint64_t nelem = 1;
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
		t->ne[d] = 1;
		if (d >= t->n_dims)
			continue;
		r = rd_u64(ps, &t->ne[d], "tensor dimension");
		if (r < 0)
			return r;
		if (t->ne[d] == 0)
			return fail(ps, -EBADMSG, "tensor '%s' dimension %u is 0", name, d);
		if (__builtin_mul_overflow(nelem, t->ne[d], &nelem) || nelem > INT64_MAX)
			return fail(ps, -EOVERFLOW, "tensor '%s' element count overflows", name);
	}

	r = rd_u32(ps, &t->type, "tensor type");
	if (r < 0)
		return r;
	uint32_t be = ggml_dtype_block_elems(t->type), bb = ggml_dtype_block_bytes(t->type);
	if (t->type >= GGML_DT_COUNT)
		return fail(ps, -EBADMSG, "tensor '%s' has unknown type id %u", name, t->type);
	if (be == 0)
		return fail(ps, -ENOTSUP, "tensor '%s' has ggml type id %u, which kvd does not support",
			    name, t->type);
	if (t->ne[0] % be != 0)
		return fail(ps, -EBADMSG, "tensor '%s' row length %llu is not a multiple of the %s block (%u)",
			    name, (unsigned long long)t->ne[0], ggml_dtype_name(t->type), be);
	if (__builtin_mul_overflow(nelem / be, (uint64_t)bb, &t->nbytes) || t->nbytes > INT64_MAX)
		return fail(ps, -EOVERFLOW, "tensor '%s' byte size overflows", name);

	r = rd_u64(ps, &t->offset, "tensor offset");
	if (r < 0)
		return r;
	if (t->offset % f->alignment != 0)
		return fail(ps, -EBADMSG, "tensor '%s' offset %llu is not a multiple of the alignment %u",
			    name, (unsigned long long)t->offset, f->alignment);
	return 0;
}

static int parse_tensors(struct parser *ps, struct gguf_file *f, uint64_t n_tensors)
{
	char nb[GGUF_ERR_NAME_MAX + 4];
	int r;
	if (n_tensors > 0) {
		f->tensors = calloc((size_t)n_tensors, sizeof(*f->tensors));
		if (!f->tensors)
			return fail(ps, -ENOMEM, "out of memory");
	}
	if (index_init(&f->tensor_index, (size_t)n_tensors) < 0)
		return fail(ps, -ENOMEM, "out of memory");

	for (uint64_t i = 0; i < n_tensors; i++) {
		struct gguf_tensor *t = &f->tensors[i];
		char *name;
		r = rd_name(ps, "tensor name", &name);
		if (r < 0)
			return r;
		t->name = name;
		f->n_tensors = (size_t)i + 1; /* t->name is owned by f from here on */
		if (index_add(&f->tensor_index, tensor_names(f), (size_t)i) < 0)
			return fail(ps, -EBADMSG, "duplicate tensor name '%s'", shown(name, strlen(name), nb));
		r = parse_tensor_info(ps, f, t);
		if (r < 0)
			return r;
	}

	/* The data section starts at the next multiple of the alignment. With
	 * no tensors the padding may be absent, so nothing is required. */
	uint64_t data_off = ((uint64_t)ps->pos + f->alignment - 1) / f->alignment * f->alignment;
	for (size_t i = 0; i < f->n_tensors; i++) {
		struct gguf_tensor *t = &f->tensors[i];
		uint64_t start, end;
		if (__builtin_add_overflow(data_off, t->offset, &start) ||
		    __builtin_add_overflow(start, t->nbytes, &end))
			return fail(ps, -EBADMSG, "tensor '%s' data offset %llu overflows",
				    shown(t->name, strlen(t->name), nb), (unsigned long long)t->offset);
		if (end > ps->size)
			return fail(ps, -EBADMSG, "tensor '%s' data ends at %llu past file size %zu",
				    shown(t->name, strlen(t->name), nb), (unsigned long long)end, ps->size);
		t->data = f->map + start;
	}
	return 0;
}

/* Maps path read-only into f. */
static int map_file(struct parser *ps, struct gguf_file *f)
{
	char eb[128];
	int fd = open(ps->path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		int e = errno;
		return fail(ps, -e, "cannot open: %s", strerror_r(e, eb, sizeof(eb)));
	}
	struct stat st;
	int r = 0;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		r = fail(ps, -e, "cannot stat: %s", strerror_r(e, eb, sizeof(eb)));
	} else if (S_ISDIR(st.st_mode)) {
		r = fail(ps, -EISDIR, "is a directory");
	} else if (!S_ISREG(st.st_mode)) {
		r = fail(ps, -EINVAL, "not a regular file");
	} else if (st.st_size == 0) {
		r = fail(ps, -EBADMSG, "truncated: the file is empty");
	} else {
		void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (m == MAP_FAILED) {
			int e = errno;
			r = fail(ps, -e, "cannot mmap: %s", strerror_r(e, eb, sizeof(eb)));
		} else {
			f->map = m;
			f->size = (size_t)st.st_size;
		}
	}
	close(fd);
	return r;
}

int gguf_open(const char *path, struct gguf_file **ret, char *err, size_t errlen)
{
	struct parser ps = { .path = path, .err = err, .errlen = errlen };
	uint64_t n_tensors = 0, n_kv = 0;
	int r;

	if (errlen > 0)
		err[0] = '\0';
	struct gguf_file *f = calloc(1, sizeof(*f));
	if (!f || !(f->path = strdup(path))) {
		r = fail(&ps, -ENOMEM, "out of memory");
		goto fail;
	}
	r = map_file(&ps, f);
	if (r < 0)
		goto fail;
	ps.map = f->map;
	ps.size = f->size;

	if ((r = parse_header(&ps, f, &n_tensors, &n_kv)) < 0 ||
	    (r = parse_kvs(&ps, f, n_kv)) < 0 ||
	    (r = parse_alignment(&ps, f)) < 0 ||
	    (r = parse_tensors(&ps, f, n_tensors)) < 0)
		goto fail;

	*ret = f;
	return 0;
fail:
	gguf_close(f);
	return r;
}

struct gguf_file *gguf_close(struct gguf_file *f)
{
	if (!f)
		return NULL;
	for (size_t i = 0; i < f->n_kv; i++) {
		free(f->kv[i].key);
		free(f->kv[i].str_off);
	}
	for (size_t i = 0; i < f->n_tensors; i++)
		free((char *)f->tensors[i].name);
	free(f->kv);
	free(f->tensors);
	free(f->kv_index.slot);
	free(f->tensor_index.slot);
	if (f->map)
		munmap((void *)f->map, f->size);
	free(f->path);
	free(f);
	return NULL;
}

/* ---- accessors ---- */

uint32_t gguf_version(const struct gguf_file *f) { return f->version; }
const char *gguf_path(const struct gguf_file *f) { return f->path; }
uint32_t gguf_alignment(const struct gguf_file *f) { return f->alignment; }
const void *gguf_map_base(const struct gguf_file *f) { return f->map; }
size_t gguf_map_size(const struct gguf_file *f) { return f->size; }
int gguf_n_kv(const struct gguf_file *f) { return (int)f->n_kv; }
int gguf_n_tensors(const struct gguf_file *f) { return (int)f->n_tensors; }

int gguf_find_key(const struct gguf_file *f, const char *key)
{
	return index_find(&f->kv_index, kv_names(f), key);
}

const char *gguf_key_name(const struct gguf_file *f, int idx)
{
	if (idx < 0 || (size_t)idx >= f->n_kv)
		return NULL;
	return f->kv[idx].key;
}

enum gguf_vtype gguf_kv_type(const struct gguf_file *f, int idx)
{
	if (idx < 0 || (size_t)idx >= f->n_kv)
		return (enum gguf_vtype)-1;
	return (enum gguf_vtype)f->kv[idx].type;
}

static const struct gguf_kv *kv_get(const struct gguf_file *f, const char *key)
{
	int i = gguf_find_key(f, key);
	return i < 0 ? NULL : &f->kv[i];
}

/* An integer of any width and sign: negative flag plus magnitude. */
struct int_val {
	bool neg;
	uint64_t mag;
};

/* Loads an integer of value type `type` at p; -EINVAL when not an integer type. */
static int load_int(uint32_t type, const uint8_t *p, struct int_val *v)
{
	int64_t s;
	switch (type) {
	case GGUF_VT_UINT8: *v = (struct int_val){ false, p[0] }; return 0;
	case GGUF_VT_UINT16: *v = (struct int_val){ false, ld16(p) }; return 0;
	case GGUF_VT_UINT32: *v = (struct int_val){ false, ld32(p) }; return 0;
	case GGUF_VT_UINT64: *v = (struct int_val){ false, ld64(p) }; return 0;
	case GGUF_VT_INT8: s = (int8_t)p[0]; break;
	case GGUF_VT_INT16: s = (int16_t)ld16(p); break;
	case GGUF_VT_INT32: s = (int32_t)ld32(p); break;
	case GGUF_VT_INT64: s = (int64_t)ld64(p); break;
	default: return -EINVAL;
	}
	/* Magnitude computed in unsigned arithmetic so INT64_MIN is fine. */
	*v = s < 0 ? (struct int_val){ true, 0 - (uint64_t)s } : (struct int_val){ false, (uint64_t)s };
	return 0;
}

static int int_to_i32(struct int_val v, int32_t *ret)
{
	if (v.neg ? v.mag > (uint64_t)INT32_MAX + 1 : v.mag > INT32_MAX)
		return -EINVAL;
	*ret = v.neg ? (int32_t)(-(int64_t)v.mag) : (int32_t)v.mag;
	return 0;
}

/* Loads a float32 or float64 at p as a float; -EINVAL for other types. */
static int load_f32(uint32_t type, const uint8_t *p, float *ret)
{
	if (type == GGUF_VT_FLOAT32) {
		uint32_t u = ld32(p);
		memcpy(ret, &u, sizeof(*ret));
		return 0;
	}
	if (type == GGUF_VT_FLOAT64) {
		uint64_t u = ld64(p);
		double d;
		memcpy(&d, &u, sizeof(d));
		*ret = (float)d;
		return 0;
	}
	return -EINVAL;
}

static int scalar_int(const struct gguf_file *f, const char *key, struct int_val *v)
{
	const struct gguf_kv *kv = kv_get(f, key);
	if (!kv)
		return -ENOENT;
	return load_int(kv->type, f->map + kv->val_off, v);
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *ret)
{
	struct int_val v;
	int r = scalar_int(f, key, &v);
	if (r < 0)
		return r;
	if (v.neg || v.mag > UINT32_MAX)
		return -EINVAL;
	*ret = (uint32_t)v.mag;
	return 0;
}

int gguf_get_i32(const struct gguf_file *f, const char *key, int32_t *ret)
{
	struct int_val v;
	int r = scalar_int(f, key, &v);
	return r < 0 ? r : int_to_i32(v, ret);
}

int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *ret)
{
	struct int_val v;
	int r = scalar_int(f, key, &v);
	if (r < 0)
		return r;
	if (v.neg)
		return -EINVAL;
	*ret = v.mag;
	return 0;
}

int gguf_get_f32(const struct gguf_file *f, const char *key, float *ret)
{
	const struct gguf_kv *kv = kv_get(f, key);
	if (!kv)
		return -ENOENT;
	return load_f32(kv->type, f->map + kv->val_off, ret);
}

int gguf_get_bool(const struct gguf_file *f, const char *key, int *ret)
{
	const struct gguf_kv *kv = kv_get(f, key);
	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_VT_BOOL)
		return -EINVAL;
	*ret = f->map[kv->val_off] != 0;
	return 0;
}

/* The string whose u64 length prefix is at map offset off (validated at open). */
static void load_str(const struct gguf_file *f, size_t off, const char **ret, size_t *ret_len)
{
	*ret_len = (size_t)ld64(f->map + off);
	*ret = (const char *)f->map + off + 8;
}

int gguf_get_str(const struct gguf_file *f, const char *key, const char **ret, size_t *ret_len)
{
	const struct gguf_kv *kv = kv_get(f, key);
	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_VT_STRING)
		return -EINVAL;
	load_str(f, kv->val_off, ret, ret_len);
	return 0;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype *ret_type, uint64_t *ret_n)
{
	const struct gguf_kv *kv = kv_get(f, key);
	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_VT_ARRAY)
		return -EINVAL;
	*ret_type = (enum gguf_vtype)kv->arr_type;
	*ret_n = kv->arr_n;
	return 0;
}

/* The array under key, checked to exist, be an array and hold element i. */
static int arr_elem(const struct gguf_file *f, const char *key, uint64_t i, const struct gguf_kv **ret)
{
	const struct gguf_kv *kv = kv_get(f, key);
	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_VT_ARRAY)
		return -EINVAL;
	if (i >= kv->arr_n)
		return -ERANGE;
	*ret = kv;
	return 0;
}

int gguf_arr_str(const struct gguf_file *f, const char *key, uint64_t i, const char **ret, size_t *ret_len)
{
	const struct gguf_kv *kv;
	int r = arr_elem(f, key, i, &kv);
	if (r < 0)
		return r;
	if (kv->arr_type != GGUF_VT_STRING)
		return -EINVAL;
	load_str(f, kv->str_off[i], ret, ret_len);
	return 0;
}

int gguf_arr_i32(const struct gguf_file *f, const char *key, uint64_t i, int32_t *ret)
{
	const struct gguf_kv *kv;
	struct int_val v;
	int r = arr_elem(f, key, i, &kv);
	if (r < 0)
		return r;
	r = load_int(kv->arr_type, f->map + kv->val_off + i * vtype_size[kv->arr_type], &v);
	return r < 0 ? r : int_to_i32(v, ret);
}

int gguf_arr_f32(const struct gguf_file *f, const char *key, uint64_t i, float *ret)
{
	const struct gguf_kv *kv;
	int r = arr_elem(f, key, i, &kv);
	if (r < 0)
		return r;
	return load_f32(kv->arr_type, f->map + kv->val_off + i * vtype_size[kv->arr_type], ret);
}

const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, int i)
{
	if (i < 0 || (size_t)i >= f->n_tensors)
		return NULL;
	return &f->tensors[i];
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name)
{
	int i = index_find(&f->tensor_index, tensor_names(f), name);
	return i < 0 ? NULL : &f->tensors[i];
}
