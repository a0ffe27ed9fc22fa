/*
 * tests/tools/tool_util.h — what the evaluation tools (kvd_stream,
 * kvd_policy_eval, kvd_perplexity, kvd_eval) read and compute alike: token
 * id files, whole text files, the argmax of a logits row. Header-only, as
 * each tool is one translation unit.
 */
#ifndef KVD_TOOL_UTIL_H
#define KVD_TOOL_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/*
 * Token ids from a file: decimal integers 0 .. INT32_MAX separated by
 * commas and white space. Anything else (a sign, a letter, a number out of
 * range) is -EINVAL, not the end of the list. 0 with *ret (malloc'd, NULL
 * when empty) and *ret_n, or -errno.
 */
static inline int tool_read_ids(const char *path, int32_t **ret, int *ret_n)
{
	FILE *f = fopen(path, "r");
	int32_t *v = NULL;
	int n = 0, cap = 0;
	long x;

	if (!f)
		return -errno;
	for (;;) {
		int c = fgetc(f);
		if (c == EOF)
			break;
		if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r')
			continue;
		if (c < '0' || c > '9' || ungetc(c, f) == EOF || fscanf(f, "%ld", &x) != 1 || x > INT32_MAX) {
			free(v);
			fclose(f);
			return -EINVAL;
		}
		if (n == cap) {
			cap = cap ? cap * 2 : 1024;
			int32_t *nv = realloc(v, sizeof(*v) * (size_t)cap);
			if (!nv) {
				free(v);
				fclose(f);
				return -ENOMEM;
			}
			v = nv;
		}
		v[n++] = (int32_t)x;
	}
	fclose(f);
	*ret = v;
	*ret_n = n;
	return 0;
}

/*
 * A whole file, NUL-terminated (the NUL not counted in *ret_len). NULL on
 * any failure, errno set (E2BIG: longer than max bytes).
 */
static inline char *tool_read_file(const char *path, size_t max, size_t *ret_len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
		errno = EIO;
	} else if ((unsigned long)n > max) {
		errno = E2BIG;
	} else if ((buf = malloc((size_t)n + 1)) != NULL) {
		if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
			free(buf);
			buf = NULL;
			errno = EIO;
		} else {
			buf[n] = 0;
			*ret_len = (size_t)n;
		}
	}
	fclose(f);
	return buf;
}

/* The first index of the largest of x[0 .. n). */
static inline int32_t tool_argmax(const float *x, int n)
{
	int32_t best = 0;

	for (int i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

#endif
