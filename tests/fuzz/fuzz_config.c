/*
 * tests/fuzz/fuzz_config.c — libFuzzer target for the configuration
 * parser (daemon/config.c over inih): the file an administrator writes,
 * or `kvd --config` points at.
 *
 * Input: the file. It is loaded over the defaults with kvd_config_load();
 * an accepted file also goes through kvd_config_validate(). Separately,
 * the first line is given to kvd_parse_size() and compared with a small
 * reference parser.
 *
 * Promises checked: load returns 0 or -EINVAL, and on -EINVAL one line of
 * message that starts with "path:"; every string field stays
 * NUL-terminated inside its array; id lists stay within KVD_CONF_MAX_IDS;
 * validate returns 0 or -EINVAL with a one-line message; kvd_parse_size
 * accepts exactly the strings the reference accepts, with the same value.
 */
#include <ctype.h>
#include <errno.h>

#include "daemon/config.h"
#include "daemon/log.h"
#include "fuzz_util.h"

/* Reference: spaces, decimal digits, an optional K/M/G/T (powers of 1024)
 * with an optional i, an optional B. 1: parsed; 0: rejected. */
static int ref_size(const char *s, uint64_t *ret)
{
	uint64_t v = 0;
	unsigned shift = 0;

	while (isspace((unsigned char)*s))
		s++;
	if (!isdigit((unsigned char)*s))
		return 0;
	for (; isdigit((unsigned char)*s); s++)
		if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(*s - '0'), &v))
			return 0;
	switch (toupper((unsigned char)*s)) {
	case 'K': shift = 10; s++; break;
	case 'M': shift = 20; s++; break;
	case 'G': shift = 30; s++; break;
	case 'T': shift = 40; s++; break;
	}
	if (shift && (*s == 'i' || *s == 'I'))
		s++;
	if (*s == 'b' || *s == 'B')
		s++;
	if (*s || (shift && v > (UINT64_MAX >> shift)))
		return 0;
	*ret = v << shift;
	return 1;
}

static void one_line(const char *msg, const char *prefix)
{
	CHECK(msg[0] != 0 && strchr(msg, '\n') == NULL);
	if (prefix)
		CHECK(strncmp(msg, prefix, strlen(prefix)) == 0);
}

static void check_strings(const struct kvd_config *c)
{
	CHECK(memchr(c->model, 0, sizeof(c->model)) && memchr(c->backend, 0, sizeof(c->backend)));
	CHECK(memchr(c->swap_file, 0, sizeof(c->swap_file)) && memchr(c->socket, 0, sizeof(c->socket)));
	CHECK(memchr(c->socket_group, 0, sizeof(c->socket_group)) && memchr(c->ledger_log, 0, sizeof(c->ledger_log)));
	CHECK(memchr(c->model_origin, 0, sizeof(c->model_origin)));
	CHECK(c->n_allowed_uids <= KVD_CONF_MAX_IDS && c->n_allowed_gids <= KVD_CONF_MAX_IDS);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	kvd_log_level = 0; /* the parser does not log; keep it that way */
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[64], err[1024], line[80];
	struct kvd_config c;

	/* kvd_parse_size on the first line */
	size_t n = 0;
	while (n < size && n < sizeof(line) - 1 && data[n] != '\n' && data[n] != 0)
		n++;
	memcpy(line, data, n);
	line[n] = 0;
	uint64_t v = 0, want = 0;
	int r = kvd_parse_size(line, &v);
	int ok = ref_size(line, &want);
	CHECK(r == 0 || r == -EINVAL || r == -ERANGE);
	CHECK((r == 0) == ok);
	if (ok)
		CHECK(v == want);

	int fd = fuzz_memfd(data, size, path, sizeof(path));
	if (fd < 0)
		return 0;
	kvd_config_defaults(&c);
	err[0] = 0;
	r = kvd_config_load(&c, path, err, sizeof(err));
	CHECK(r == 0 || r == -EINVAL);
	check_strings(&c);
	if (r < 0) {
		char prefix[80];
		snprintf(prefix, sizeof(prefix), "%s:", path);
		one_line(err, prefix);
	} else {
		err[0] = 0;
		r = kvd_config_validate(&c, err, sizeof(err));
		CHECK(r == 0 || r == -EINVAL);
		if (r < 0)
			one_line(err, NULL);
	}
	close(fd);
	return 0;
}
