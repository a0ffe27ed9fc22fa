/*
 * tests/fuzz/fuzz_util.h — helpers shared by kvd's libFuzzer targets
 * (header-only: each target is one translation unit).
 *
 *   CHECK(cond)        a broken promise of the code under test: trap, so
 *                      libFuzzer saves the input as a crash.
 *   fuzz_memfd()       the input as a file (memfd, read through
 *                      /proc/self/fd/N), so the real open/fstat/mmap paths run.
 *   fuzz_data_path()   a file the target needs (a seed model), found
 *                      relative to the repository root or $KVD_FUZZ_ROOT.
 *
 * Built with -DKVD_FUZZ_STANDALONE (gcc, no libFuzzer), a main() replays
 * the files and directories named on the command line through
 * LLVMFuzzerTestOneInput, e.g. a committed corpus under ASan.
 */
#ifndef KVD_FUZZ_UTIL_H
#define KVD_FUZZ_UTIL_H

#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECK(cond) do { if (!(cond)) __builtin_trap(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A memfd holding data[0..size), its path in path (>= 64 bytes). Returns
 * the fd or -1. */
static inline int fuzz_memfd(const void *data, size_t size, char *path, size_t pathlen)
{
	int fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -1;
	size_t off = 0;
	while (off < size) {
		ssize_t w = write(fd, (const uint8_t *)data + off, size - off);
		if (w <= 0) {
			close(fd);
			return -1;
		}
		off += (size_t)w;
	}
	snprintf(path, pathlen, "/proc/self/fd/%d", fd);
	return fd;
}

/* Path of rel under $KVD_FUZZ_ROOT (default: the working directory, the
 * repository root when run by make fuzz or tests/fuzz/t_fuzz.sh). */
static inline const char *fuzz_data_path(const char *rel, char *buf, size_t cap)
{
	const char *root = getenv("KVD_FUZZ_ROOT");
	snprintf(buf, cap, "%s/%s", root && *root ? root : ".", rel);
	return buf;
}

/* Read a whole file; NULL on failure. */
static inline uint8_t *fuzz_read_file(const char *path, size_t *ret_len)
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return NULL;
	uint8_t *buf = NULL;
	size_t n = 0, cap = 0, got;
	do {
		if (n == cap) {
			cap = cap ? cap * 2 : 65536;
			uint8_t *nb = realloc(buf, cap);
			if (!nb) {
				free(buf);
				fclose(fp);
				return NULL;
			}
			buf = nb;
		}
		got = fread(buf + n, 1, cap - n, fp);
		n += got;
	} while (got > 0);
	fclose(fp);
	*ret_len = n;
	return buf;
}

#ifdef KVD_FUZZ_STANDALONE
static int fuzz_replay(const char *path)
{
	struct stat st;
	if (stat(path, &st) < 0) {
		perror(path);
		return 1;
	}
	if (S_ISDIR(st.st_mode)) {
		DIR *d = opendir(path);
		struct dirent *e;
		int bad = 0;
		if (!d)
			return 1;
		while ((e = readdir(d))) {
			if (e->d_name[0] == '.')
				continue;
			char sub[4096];
			snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
			bad |= fuzz_replay(sub);
		}
		closedir(d);
		return bad;
	}
	size_t n;
	uint8_t *buf = fuzz_read_file(path, &n);
	if (!buf)
		return 1;
	LLVMFuzzerTestOneInput(buf, n);
	free(buf);
	printf("%s: ok\n", path);
	return 0;
}

int main(int argc, char **argv)
{
	int bad = 0;
	LLVMFuzzerInitialize(&argc, &argv);
	for (int i = 1; i < argc; i++)
		bad |= fuzz_replay(argv[i]);
	return bad;
}
#endif

#endif
