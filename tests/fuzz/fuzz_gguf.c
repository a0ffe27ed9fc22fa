/*
 * tests/fuzz/fuzz_gguf.c — libFuzzer target for the GGUF reader
 * (daemon/model/gguf.h).
 *
 * Each input is written to a memfd and opened through /proc/self/fd/N, so
 * the real open/fstat/mmap path runs. A rejected input must come with a
 * negative errno and a message naming the path; an accepted one is walked
 * through every accessor, and the reader's promises are checked: every
 * key and tensor is found again by name, every string and every tensor's
 * data lies inside the mapping, sizes agree with the type table. A broken
 * promise traps.
 *
 * Built and run by `make fuzz` (tests/fuzz/run.sh; seeds in
 * tests/fuzz/corpus/fuzz_gguf/, among them the files test_gguf writes with
 * KVD_GGUF_CORPUS=DIR and the seed model).
 *
 * Without clang, -DKVD_FUZZ_STANDALONE gives a main() that replays files
 * named on the command line (e.g. crash reproducers) under gcc + ASan:
 *
 *   gcc -std=c11 -D_GNU_SOURCE -g -fsanitize=address,undefined -DKVD_FUZZ_STANDALONE \
 *       -Idaemon/model tests/fuzz/fuzz_gguf.c daemon/model/gguf.c -o build/fuzz_gguf_replay
 *   build/fuzz_gguf_replay crash-*
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gguf.h"

#define CHECK(cond) do { if (!(cond)) __builtin_trap(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int inside(const struct gguf_file *f, const void *p, uint64_t len)
{
	const uint8_t *base = gguf_map_base(f), *q = p;
	size_t size = gguf_map_size(f);
	return q >= base && (size_t)(q - base) <= size && len <= size - (size_t)(q - base);
}

static void walk_kv(const struct gguf_file *f, int i)
{
	const char *key = gguf_key_name(f, i);
	CHECK(key != NULL);
	CHECK(gguf_find_key(f, key) == i);
	enum gguf_vtype t = gguf_kv_type(f, i);
	CHECK((int)t >= 0 && (int)t <= GGUF_VT_FLOAT64);

	uint32_t u32;
	int32_t i32;
	uint64_t u64;
	float f32;
	int b;
	const char *s;
	size_t len;
	(void)gguf_get_u32(f, key, &u32);
	(void)gguf_get_i32(f, key, &i32);
	(void)gguf_get_u64(f, key, &u64);
	(void)gguf_get_f32(f, key, &f32);
	(void)gguf_get_bool(f, key, &b);
	if (gguf_get_str(f, key, &s, &len) == 0)
		CHECK(t == GGUF_VT_STRING && inside(f, s, len));

	enum gguf_vtype et;
	uint64_t n;
	int r = gguf_get_arr(f, key, &et, &n);
	CHECK((r == 0) == (t == GGUF_VT_ARRAY));
	if (r < 0)
		return;
	CHECK(et != GGUF_VT_ARRAY && n <= GGUF_MAX_ARRAY_LEN);
	for (uint64_t j = 0; j < n; j++) {
		if (et == GGUF_VT_STRING) {
			CHECK(gguf_arr_str(f, key, j, &s, &len) == 0);
			CHECK(inside(f, s, len));
		} else {
			(void)gguf_arr_i32(f, key, j, &i32);
			(void)gguf_arr_f32(f, key, j, &f32);
		}
	}
	CHECK(gguf_arr_str(f, key, n, &s, &len) == -ERANGE);
}

static void walk_tensor(const struct gguf_file *f, int i)
{
	const struct gguf_tensor *t = gguf_tensor_at(f, i);
	CHECK(t != NULL && t->name != NULL);
	CHECK(gguf_find_tensor(f, t->name) == t);
	CHECK(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS);
	uint64_t nelem = 1;
	for (int d = 0; d < GGUF_MAX_DIMS; d++) {
		CHECK(t->ne[d] >= 1);
		CHECK(!__builtin_mul_overflow(nelem, t->ne[d], &nelem));
	}
	uint32_t be = ggml_dtype_block_elems(t->type), bb = ggml_dtype_block_bytes(t->type);
	CHECK(be > 0 && bb > 0 && t->ne[0] % be == 0);
	CHECK(t->nbytes == nelem / be * bb);
	CHECK(t->offset % gguf_alignment(f) == 0);
	CHECK(inside(f, t->data, t->nbytes));
	CHECK(((const uint8_t *)t->data - (const uint8_t *)gguf_map_base(f)) % gguf_alignment(f) == 0);
	if (t->nbytes > 0) { /* the first and last bytes are readable */
		volatile uint8_t x = ((const uint8_t *)t->data)[0];
		x = ((const uint8_t *)t->data)[t->nbytes - 1];
		(void)x;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fd = memfd_create("fuzz.gguf", MFD_CLOEXEC);
	if (fd < 0)
		return 0;
	size_t off = 0;
	while (off < size) {
		ssize_t w = write(fd, data + off, size - off);
		if (w <= 0) {
			close(fd);
			return 0;
		}
		off += (size_t)w;
	}
	char path[64], err[512];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);

	struct gguf_file *f = NULL;
	int r = gguf_open(path, &f, err, sizeof(err));
	if (r < 0) {
		CHECK(f == NULL);
		CHECK(strncmp(err, path, strlen(path)) == 0 && strchr(err, '\n') == NULL);
	} else {
		CHECK(r == 0 && f != NULL);
		uint32_t a = gguf_alignment(f);
		CHECK(a != 0 && (a & (a - 1)) == 0);
		CHECK(gguf_version(f) == 2 || gguf_version(f) == 3);
		for (int i = 0; i < gguf_n_kv(f); i++)
			walk_kv(f, i);
		for (int i = 0; i < gguf_n_tensors(f); i++)
			walk_tensor(f, i);
		CHECK(gguf_key_name(f, gguf_n_kv(f)) == NULL);
		CHECK(gguf_tensor_at(f, gguf_n_tensors(f)) == NULL);
		CHECK(gguf_close(f) == NULL);
	}
	close(fd);
	return 0;
}

#ifdef KVD_FUZZ_STANDALONE
int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		FILE *fp = fopen(argv[i], "rb");
		if (!fp) {
			perror(argv[i]);
			return 1;
		}
		uint8_t *buf = NULL;
		size_t n = 0, cap = 0, got;
		do {
			if (n == cap) {
				cap = cap ? cap * 2 : 65536;
				uint8_t *nb = realloc(buf, cap);
				if (!nb)
					return 1;
				buf = nb;
			}
			got = fread(buf + n, 1, cap - n, fp);
			n += got;
		} while (got > 0);
		fclose(fp);
		LLVMFuzzerTestOneInput(buf, n);
		free(buf);
		printf("%s: ok\n", argv[i]);
	}
	return 0;
}
#endif
