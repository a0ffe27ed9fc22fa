/*
 * client/http/main.c — kvd-http: the OpenAI-compatible HTTP gateway of kvd.
 *
 * Start-up only: options and the [http] configuration, the listening
 * socket (its own, on loopback by default, or the one systemd passes from
 * kvd-http.socket), readiness for systemd (Type=notify), and a clean stop
 * on SIGTERM/SIGINT. The serving is in server.c.
 */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "kvclient.h"
#include "server.h"

#define EXIT_CONFIG 78 /* EX_CONFIG: systemd does not restart on it (RestartPreventExitStatus) */

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kvd-http [--config FILE] [--KEY=VALUE]...\n"
		"\n"
		"The OpenAI-compatible HTTP API of kvd. A client of the kvd daemon (through\n"
		"libkvclient), it serves on loopback by default, 127.0.0.1:8484:\n");
	http_routes_help(f);
	fprintf(f,
		"Request parameters: model, stream, stream_options.include_usage, max_tokens,\n"
		"max_completion_tokens, temperature, top_p, stop, seed, n (parallel samples of\n"
		"one prompt), logprobs and top_logprobs (chat) / logprobs (completions), and\n"
		"kvd's top_k, min_p, repeat_penalty; priority (lower first among the same\n"
		"API key's requests) and cache_salt (cached prompts are shared only with\n"
		"requests of the same API key and cache_salt).\n"
		"Structured output (kvd constrains decoding; one constraint a request):\n"
		"response_format json_object or json_schema (strict or not, the schema is\n"
		"enforced), llama.cpp's grammar (GBNF) and json_schema, vLLM's guided_json,\n"
		"guided_regex, guided_choice and guided_grammar (GBNF). A bad grammar or\n"
		"schema gets 400 code invalid_constraint with line/column or pointer.\n"
		"Tools (chat): tools, tool_choice none/auto/required/a named function, and\n"
		"parallel_tool_calls; assistant tool_calls and tool messages. kvd (0.9.0)\n"
		"renders tools in the model family's own format: Qwen's <tool_call> in\n"
		"ChatML, Llama 3.1's JSON calls and ipython turns, Mistral's [TOOL_CALLS],\n"
		"and the generic <tools>/<tool_call>/<tool_response> texts for the others\n"
		"(an older kvd gets those as text). required or named constrains the output\n"
		"to a call of the tool's parameter schema (with parallel_tool_calls true: a\n"
		"list of 1 to 8 calls); auto reads every family's call shape.\n"
		"Refused with 400 naming the parameter: presence/frequency penalties,\n"
		"logit_bias, functions, best_of, echo, suffix, and other servers' extras that\n"
		"change the output (ignore_eos, structured_outputs, ...). Other unknown keys\n"
		"are ignored.\n"
		"Requests share kvd_connections connections to kvd; beyond their capacity they\n"
		"wait in a queue of max_queued, and further ones get 429.\n"
		"\n"
		"OPTIONS\n"
		"    --config FILE    read the [http] section of FILE (default: none)\n"
		"    --KEY=VALUE      any configuration key below, e.g. --listen=127.0.0.1:9000\n"
		"    --help           this text\n"
		"    --version        versions of kvd-http and libkvclient\n"
		"\n"
		"%s"
		"\n"
		"Under systemd, kvd-http.socket passes the listening socket (sd_listen_fds) and\n"
		"listen is ignored. Exit status: 0 after SIGTERM/SIGINT, 1 on a start-up failure,\n"
		"78 for a configuration error.\n",
		http_config_help);
}

/* A listening TCP socket for "host:port" / "[v6]:port". */
static int open_listener(const char *spec, int backlog, const char **ret_why)
{
	char host[256];
	const char *port;
	const char *colon = strrchr(spec, ':');

	if (!colon || !colon[1] || (size_t)(colon - spec) >= sizeof(host)) {
		*ret_why = "expected host:port";
		return -EINVAL;
	}
	memcpy(host, spec, (size_t)(colon - spec));
	host[colon - spec] = '\0';
	port = colon + 1;
	char *h = host;
	size_t hl = strlen(h);
	if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
		h[hl - 1] = '\0';
		h++;
	}
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE | AI_NUMERICSERV }, *ai;
	int r = getaddrinfo(h[0] ? h : NULL, port, &hints, &ai);
	if (r != 0) {
		*ret_why = gai_strerror(r);
		return -EINVAL;
	}
	int fd = -1, err = -EADDRNOTAVAIL;
	for (struct addrinfo *a = ai; a; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
		if (fd < 0) {
			err = -errno;
			continue;
		}
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, backlog) == 0)
			break;
		err = -errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	if (fd < 0)
		*ret_why = strerror(-err);
	return fd < 0 ? err : fd;
}

int main(int argc, char **argv)
{
	struct http_config cfg;
	const char *msg;
	int line;

	http_config_defaults(&cfg);
	/* --config first, so the other options override the file */
	for (int i = 1; i < argc; i++) {
		const char *path = NULL;
		if (!strcmp(argv[i], "--config") && i + 1 < argc)
			path = argv[i + 1];
		else if (!strncmp(argv[i], "--config=", 9))
			path = argv[i] + 9;
		if (path) {
			int r = http_config_load(&cfg, path, &line, &msg);
			if (r == -EINVAL) {
				fprintf(stderr, "<3>kvd-http: %s:%d: %s\n", path, line, msg);
				return EXIT_CONFIG;
			}
			if (r < 0) {
				fprintf(stderr, "<3>kvd-http: %s: %s\n", path, strerror(-r));
				return EXIT_CONFIG;
			}
		}
	}
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		}
		if (!strcmp(a, "--version")) {
			printf("kvd-http %s (libkvclient %s)\n", KVC_VERSION_STRING, kvc_version_string());
			return 0;
		}
		if (!strcmp(a, "--config")) {
			i++;
			continue;
		}
		if (!strncmp(a, "--config=", 9))
			continue;
		const char *eq = strchr(a, '=');
		char key[64];
		const char *value;
		if (strncmp(a, "--", 2) != 0) {
			fprintf(stderr, "<3>kvd-http: unexpected argument '%s' (see --help)\n", a);
			return EXIT_CONFIG;
		}
		if (eq) {
			snprintf(key, sizeof(key), "%.*s", (int)(eq - a - 2), a + 2);
			value = eq + 1;
		} else if (i + 1 < argc) {
			snprintf(key, sizeof(key), "%s", a + 2);
			value = argv[++i];
		} else {
			fprintf(stderr, "<3>kvd-http: %s needs a value (see --help)\n", a);
			return EXIT_CONFIG;
		}
		for (char *k = key; *k; k++)
			if (*k == '-')
				*k = '_';
		if (http_config_set(&cfg, "http", key, value, &msg) < 0) {
			fprintf(stderr, "<3>kvd-http: --%s: %s (see --help)\n", key, msg);
			return EXIT_CONFIG;
		}
	}

	signal(SIGPIPE, SIG_IGN);
	sigset_t stop;
	sigemptyset(&stop);
	sigaddset(&stop, SIGTERM);
	sigaddset(&stop, SIGINT);
	pthread_sigmask(SIG_BLOCK, &stop, NULL); /* before any thread starts: they inherit it */

	int fd, n = sd_listen_fds(1);
	if (n > 1) {
		fprintf(stderr, "<3>kvd-http: systemd passed %d sockets; expected one\n", n);
		return EXIT_CONFIG;
	}
	if (n == 1) {
		fd = SD_LISTEN_FDS_START;
		if (sd_is_socket(fd, AF_UNSPEC, SOCK_STREAM, 1) <= 0) {
			fprintf(stderr, "<3>kvd-http: the socket systemd passed is not a listening stream socket\n");
			return EXIT_CONFIG;
		}
	} else {
		const char *why = "";
		fd = open_listener(cfg.listen, (int)cfg.backlog, &why);
		if (fd < 0) {
			fprintf(stderr, "<3>kvd-http: cannot listen on %s: %s\n", cfg.listen, why);
			return 1;
		}
	}

	struct http_server *s;
	int r = http_server_start(&cfg, fd, &s);
	if (r < 0) {
		if (r != -EIO)
			fprintf(stderr, "<3>kvd-http: api_key_file %s: %s\n", cfg.api_key_file,
				r == -EINVAL ? "no key, a key over 512 bytes, more than 64 keys or one twice" : strerror(-r));
		close(fd);
		return r == -EIO ? 1 : EXIT_CONFIG;
	}
	fprintf(stderr, "<6>kvd-http: listening on %s%s, kvd at %s\n", n == 1 ? "the socket from systemd" : cfg.listen,
		cfg.api_key_file[0] ? " (API key required)" : "",
		cfg.kvd_socket[0] ? cfg.kvd_socket : getenv(KVC_SOCKET_ENV) ? getenv(KVC_SOCKET_ENV) : KVC_DEFAULT_SOCKET);
	sd_notify(0, "READY=1\nSTATUS=serving");

	int sig = 0;
	sigwait(&stop, &sig);
	sd_notify(0, "STOPPING=1");
	fprintf(stderr, "<6>kvd-http: stopping (signal %d)\n", sig);
	http_server_stop(s);
	return 0;
}
