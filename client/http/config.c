/*
 * client/http/config.c — kvd-http's configuration: the [http] section of
 * an ini file (inih) and the same keys as command-line options.
 *
 * Every limit the gateway applies to its HTTP clients is a key here, with
 * its default from http.h; http_config_help is printed by --help and
 * mirrored in etc/kvd-http.conf.
 */
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

const char http_config_help[] =
	"CONFIGURATION KEYS (section [http] of --config FILE, or --KEY=VALUE; the\n"
	"command line wins; sizes take K/M/G suffixes)\n"
	"    listen = 127.0.0.1:8484      address:port to listen on (\"[::1]:8484\" for IPv6);\n"
	"                                 ignored when systemd passes a socket (kvd-http.socket)\n"
	"    kvd_socket =                 kvd's socket; empty: $KVD_SOCKET, else /run/kvd/kvd.sock\n"
	"    api_key_file =               file holding the API keys clients must send as\n"
	"                                 \"Authorization: Bearer KEY\", one a line (up to 64);\n"
	"                                 empty: no key needed. Each key is a cache tenant:\n"
	"                                 requests share cached prompts only with the same key\n"
	"                                 (and the same cache_salt)\n"
	"    model_id =                   the model's id in /v1/models and in answers;\n"
	"                                 empty: the model file's base name without .gguf\n"
	"                                 (from kvd 0.8.0; older kvd: its general.name).\n"
	"                                 Requests may name the id, general.name or the\n"
	"                                 file's base name; any other name gets 404\n"
	"    max_body_bytes = 1M          larger request bodies get 413\n"
	"    max_header_bytes = 32K       request line + headers; larger requests are refused\n"
	"    max_connections = 256        HTTP connections open at once; more are closed\n"
	"    max_connections_per_ip = 0   per client address; 0: no bound\n"
	"    client_timeout = 60          seconds a connection may make no progress (slow\n"
	"                                 uploads, a reader that stops reading) before it is\n"
	"                                 closed and its generation cancelled\n"
	"    request_timeout = 30         seconds from a request's first byte (or the\n"
	"                                 connection's start) until its headers and body\n"
	"                                 are all in, however steadily they trickle;\n"
	"                                 later, the connection is closed unanswered\n"
	"    kvd_connections = 4          kvd connections that carry every request, each up\n"
	"                                 to kvd's max_requests_per_client at once (keep it\n"
	"                                 below kvd's max_clients_per_user)\n"
	"    max_queued = 256             requests waiting for room on those connections;\n"
	"                                 more get 429 rate_limit_exceeded\n"
	"    default_max_tokens = 256     max_tokens of a request that names none\n"
	"    backlog = 128                listen() backlog\n";

void http_config_defaults(struct http_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	snprintf(cfg->listen, sizeof(cfg->listen), "%s", HTTP_DEFAULT_LISTEN);
	cfg->max_body_bytes = HTTP_DEFAULT_MAX_BODY;
	cfg->max_header_bytes = HTTP_DEFAULT_MAX_HEADER;
	cfg->max_connections = HTTP_DEFAULT_MAX_CONNECTIONS;
	cfg->max_connections_per_ip = HTTP_DEFAULT_MAX_PER_IP;
	cfg->client_timeout_s = HTTP_DEFAULT_CLIENT_TIMEOUT;
	cfg->default_max_tokens = HTTP_DEFAULT_MAX_TOKENS;
	cfg->backlog = 128;
	cfg->kvd_connections = HTTP_DEFAULT_KVD_CONNECTIONS;
	cfg->max_queued = HTTP_DEFAULT_MAX_QUEUED;
	cfg->request_timeout_s = HTTP_DEFAULT_REQUEST_TIMEOUT;
}

/* "123", "64K", "1M", "2G" within [lo, hi]. */
static int parse_size(const char *v, uint64_t lo, uint64_t hi, uint32_t *ret)
{
	char *end;
	errno = 0;
	unsigned long long n = strtoull(v, &end, 10);
	if (errno || end == v || *v == '-')
		return -EINVAL;
	unsigned shift = 0;
	switch (*end) {
	case 'K': case 'k': shift = 10; end++; break;
	case 'M': case 'm': shift = 20; end++; break;
	case 'G': case 'g': shift = 30; end++; break;
	default: break;
	}
	if (*end || n > (hi >> shift) || (n << shift) < lo)
		return -EINVAL;
	*ret = (uint32_t)(n << shift);
	return 0;
}

static int set_str(char *dst, size_t cap, const char *v, const char **ret_msg)
{
	if (strlen(v) >= cap) {
		if (ret_msg)
			*ret_msg = "value too long";
		return -E2BIG;
	}
	snprintf(dst, cap, "%s", v);
	return 0;
}

int http_config_set(struct http_config *cfg, const char *section, const char *key, const char *value,
		    const char **ret_msg)
{
	static const struct {
		const char *key;
		size_t off;
		uint64_t lo, hi;
	} nums[] = {
		{ "max_body_bytes", offsetof(struct http_config, max_body_bytes), 1, 1u << 30 },
		{ "max_header_bytes", offsetof(struct http_config, max_header_bytes), 1024, 16u << 20 },
		{ "max_connections", offsetof(struct http_config, max_connections), 1, 65536 },
		{ "max_connections_per_ip", offsetof(struct http_config, max_connections_per_ip), 0, 65536 },
		{ "client_timeout", offsetof(struct http_config, client_timeout_s), 1, 86400 },
		{ "default_max_tokens", offsetof(struct http_config, default_max_tokens), 1, 1u << 24 },
		{ "backlog", offsetof(struct http_config, backlog), 1, 65535 },
		{ "kvd_connections", offsetof(struct http_config, kvd_connections), 1, HTTP_MAX_KVD_CONNECTIONS },
		{ "max_queued", offsetof(struct http_config, max_queued), 0, 1u << 20 },
		{ "request_timeout", offsetof(struct http_config, request_timeout_s), 1, 86400 },
	};

	if (section && section[0] && strcmp(section, "http") != 0) {
		if (ret_msg)
			*ret_msg = "unknown section (kvd-http reads [http])";
		return -ENOENT;
	}
	if (!strcmp(key, "listen"))
		return set_str(cfg->listen, sizeof(cfg->listen), value, ret_msg);
	if (!strcmp(key, "kvd_socket"))
		return set_str(cfg->kvd_socket, sizeof(cfg->kvd_socket), value, ret_msg);
	if (!strcmp(key, "api_key_file"))
		return set_str(cfg->api_key_file, sizeof(cfg->api_key_file), value, ret_msg);
	if (!strcmp(key, "model_id"))
		return set_str(cfg->model_id, sizeof(cfg->model_id), value, ret_msg);
	for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
		if (strcmp(key, nums[i].key) != 0)
			continue;
		if (parse_size(value, nums[i].lo, nums[i].hi, (uint32_t *)((char *)cfg + nums[i].off)) < 0) {
			if (ret_msg)
				*ret_msg = "not a number in the allowed range";
			return -EINVAL;
		}
		return 0;
	}
	if (ret_msg)
		*ret_msg = "unknown key";
	return -ENOENT;
}

struct load_state {
	struct http_config *cfg;
	const char *msg;
};

static int on_ini_line(void *user, const char *section, const char *name, const char *value)
{
	struct load_state *s = user;
	return http_config_set(s->cfg, section, name, value, &s->msg) < 0 ? 0 : 1;
}

int http_config_load(struct http_config *cfg, const char *path, int *ret_line, const char **ret_msg)
{
	struct load_state s = { .cfg = cfg, .msg = "syntax error" };
	FILE *f = fopen(path, "re");

	if (!f)
		return -errno;
	int line = ini_parse_file(f, on_ini_line, &s);
	fclose(f);
	if (line != 0) {
		*ret_line = line;
		*ret_msg = s.msg;
		return -EINVAL;
	}
	return 0;
}
