/*
 * daemon/model/gguf.h — a read-only, bounds-checked GGUF (v2, v3) reader.
 *
 * The file is mmap()ed once; gguf_open() walks the header, the metadata
 * key/value section and the tensor directory, validating every count, length
 * and offset against named limits and the mapping size before anything
 * points into it. After a successful open every accessor is a lookup into
 * already-validated tables and can never read past the mapping.
 *
 * Strings in GGUF are length-prefixed, not NUL-terminated: accessors hand
 * out (pointer, length) pairs into the mapping. Keys and tensor names are
 * copied and NUL-terminated at open time.
 *
 * A gguf_file is immutable after open and may be read from any thread.
 * The mapping is MAP_PRIVATE of a file kvd expects nobody to truncate while
 * it is open (a shrunk file would fault on access, as with any mmap).
 *
 * Only little-endian GGUF files are read (big-endian ones are rejected).
 */
#ifndef KVD_GGUF_H
#define KVD_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* Limits on what a file may claim; anything beyond is rejected as hostile. */
#define GGUF_MAX_KV            (1u << 16)  /* metadata entries */
#define GGUF_MAX_TENSORS       (1u << 16)
#define GGUF_MAX_KEY_LEN       (1u << 16)  /* key or tensor name, bytes */
#define GGUF_MAX_STRING_LEN    (1u << 24)  /* one string value or array element, bytes */
#define GGUF_MAX_ARRAY_LEN     (1u << 24)  /* elements in one metadata array */
#define GGUF_MAX_DIMS          4
#define GGUF_DEFAULT_ALIGNMENT 32

enum gguf_vtype {
	GGUF_VT_UINT8 = 0,
	GGUF_VT_INT8 = 1,
	GGUF_VT_UINT16 = 2,
	GGUF_VT_INT16 = 3,
	GGUF_VT_UINT32 = 4,
	GGUF_VT_INT32 = 5,
	GGUF_VT_FLOAT32 = 6,
	GGUF_VT_BOOL = 7,
	GGUF_VT_STRING = 8,
	GGUF_VT_ARRAY = 9,
	GGUF_VT_UINT64 = 10,
	GGUF_VT_INT64 = 11,
	GGUF_VT_FLOAT64 = 12,
};

/* ggml tensor types as numbered in GGUF. Only some are computable by kvd
 * (see kernels/backend.h); the rest are named so errors can say which. */
enum ggml_dtype {
	GGML_DT_F32 = 0, GGML_DT_F16 = 1, GGML_DT_Q4_0 = 2, GGML_DT_Q4_1 = 3,
	GGML_DT_Q5_0 = 6, GGML_DT_Q5_1 = 7, GGML_DT_Q8_0 = 8, GGML_DT_Q8_1 = 9,
	GGML_DT_Q2_K = 10, GGML_DT_Q3_K = 11, GGML_DT_Q4_K = 12, GGML_DT_Q5_K = 13,
	GGML_DT_Q6_K = 14, GGML_DT_Q8_K = 15, GGML_DT_BF16 = 30,
	GGML_DT_COUNT = 40, /* exclusive bound on known type ids */
};

struct gguf_tensor {
	const char *name;      /* NUL-terminated copy */
	uint32_t n_dims;
	uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the innermost (row length); unused dims are 1 */
	uint32_t type;         /* enum ggml_dtype */
	uint64_t offset;       /* relative to the data section */
	uint64_t nbytes;
	const void *data;      /* inside the mapping, aligned to the file's alignment */
};

struct gguf_file;

/*
 * Open and validate `path`. On failure returns -errno (-ENOENT, -EACCES as
 * from open(2); -EISDIR for a directory, -EINVAL for another non-regular
 * file; -EBADMSG for a malformed or truncated file; -EPROTONOSUPPORT for a
 * GGUF version other than 2 or 3, or a big-endian file; -ENOTSUP for a
 * tensor of a ggml type kvd cannot size (an id below GGML_DT_COUNT without a
 * block size here; ids at or above it are -EBADMSG); -EOVERFLOW for a count,
 * length or size beyond the limits above; -ENOMEM) and writes one line into
 * err (if errlen > 0, truncated to fit) of the form "<path>: <problem>", e.g.
 * "model.gguf: tensor 'blk.3.attn_q.weight' data ends at 1234 past file size 1000".
 * *ret is set only on success.
 *
 * Beyond the limits, open also rejects: duplicate keys or tensor names,
 * keys or names containing a NUL byte, unknown value types, nested arrays,
 * a general.alignment that is not a uint32 power of two, tensors with 0 or
 * more than GGUF_MAX_DIMS dimensions, a zero dimension, ne[0] not a
 * multiple of the type's block, an offset not a multiple of the alignment,
 * and data not entirely inside the file. Each check happens before any
 * allocation sized by the value checked. Cost: one pass over the metadata
 * (string arrays get an offset table so element access is O(1)); tensor
 * data is not touched.
 */
int gguf_open(const char *path, struct gguf_file **ret, char *err, size_t errlen);

/* Unmap and free; accepts NULL; returns NULL. */
struct gguf_file *gguf_close(struct gguf_file *f);

/* Accessors below take a file returned by gguf_open (never NULL). */
uint32_t gguf_version(const struct gguf_file *f);
const char *gguf_path(const struct gguf_file *f);

/* Replace control bytes (< 0x20 and 0x7f) in the NUL-terminated s with '?',
 * as the reader does for the names it quotes, so that text taken from a
 * file and put into a message (or a field sent to clients) stays one
 * printable line. */
void gguf_strip_controls(char *s);
uint32_t gguf_alignment(const struct gguf_file *f);
/* The whole mapping, for callers that need its bounds. */
const void *gguf_map_base(const struct gguf_file *f);
size_t gguf_map_size(const struct gguf_file *f);

/* Metadata. Keys are looked up by exact name (hash table, O(1)); indexes
 * follow file order. Index-returning functions return >= 0 or -ENOENT.
 * gguf_key_name returns NULL and gguf_kv_type (enum gguf_vtype)-1 for an
 * index out of range. */
int gguf_n_kv(const struct gguf_file *f);
int gguf_find_key(const struct gguf_file *f, const char *key);
const char *gguf_key_name(const struct gguf_file *f, int idx);
enum gguf_vtype gguf_kv_type(const struct gguf_file *f, int idx);

/*
 * Typed getters by key. Return 0 and store the value, -ENOENT when the key
 * is absent, -EINVAL when its type does not convert losslessly (any integer
 * type is accepted for u32/i32/u64 when the value fits; float32 or float64
 * for f32; bool for bool). *ret is untouched on failure.
 */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *ret);
int gguf_get_i32(const struct gguf_file *f, const char *key, int32_t *ret);
int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *ret);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *ret);
int gguf_get_bool(const struct gguf_file *f, const char *key, int *ret);
/* String value: pointer into the mapping (not NUL-terminated) and length. */
int gguf_get_str(const struct gguf_file *f, const char *key, const char **ret, size_t *ret_len);

/*
 * Arrays. gguf_get_arr returns 0 with the element type and count, -ENOENT,
 * or -EINVAL when the key is not an array. Elements are read by index;
 * out-of-range indexes or a wrong element type return -EINVAL (-ERANGE for
 * an index past the end). Nested arrays are rejected at open time.
 */
int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype *ret_type, uint64_t *ret_n);
int gguf_arr_str(const struct gguf_file *f, const char *key, uint64_t i, const char **ret, size_t *ret_len);
int gguf_arr_i32(const struct gguf_file *f, const char *key, uint64_t i, int32_t *ret); /* any int type that fits */
int gguf_arr_f32(const struct gguf_file *f, const char *key, uint64_t i, float *ret);

/* Tensors, in file order. gguf_tensor_at returns NULL for i out of range. */
int gguf_n_tensors(const struct gguf_file *f);
const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, int i);
/* NULL when not found. */
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/* Elements per block and bytes per block of a ggml type; 0 when unknown.
 * Sizes follow ggml's block structs (ggml-common.h); Q8_1 is 36 bytes
 * (two fp16 + 32 int8), as in current ggml. */
uint32_t ggml_dtype_block_elems(uint32_t type);
uint32_t ggml_dtype_block_bytes(uint32_t type);
/* "q4_1", "f32", ...: static storage; ids it does not know return "unknown". */
const char *ggml_dtype_name(uint32_t type);

#endif /* KVD_GGUF_H */
