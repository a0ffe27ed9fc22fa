/*
 * client/kvctl/session.c — kvctl session and kvctl version: sessions
 * (conversations kept in the daemon's KV cache) and the versions of client and
 * daemon.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvctl.h"

/* ---- session ---------------------------------------------------------------------------------------- */

static const char help_session[] =
	"NAME\n"
	"    kvctl session - open and close kvd sessions\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl session open [--idle SECS] [--context-policy P [--window W] [--sinks S]]\n"
	"    kvctl session close ID\n"
	"\n"
	"DESCRIPTION\n"
	"    A session keeps a conversation's KV cache in kvd between requests, so each\n"
	"    turn given with 'kvctl generate --session ID' processes only its new text.\n"
	"    'open' prints the new session's id. A session belongs to the user who opened\n"
	"    it and outlives the connection; kvd closes it after SECS seconds without use\n"
	"    (default: the daemon's session idle timeout). 'close' frees its memory now.\n"
	"\n"
	"OPTIONS\n"
	"    --idle SECS   with 'open': close the session after SECS seconds without a\n"
	"                  request (default: the daemon's scheduler.session_idle_timeout)\n"
	"    --context-policy P, --window W, --sinks S\n"
	"                  with 'open': what the session's turns do when the history would\n"
	"                  overflow the context (see 'kvctl generate --help'); with\n"
	"                  truncate-oldest the oldest turns are dropped, the system prompt\n"
	"                  kept. A turn's own --context-policy overrides it.\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    s=$(kvctl session open)\n"
	"    kvctl generate --session \"$s\" \"My name is Ada.\"\n"
	"    kvctl generate --session \"$s\" \"What is my name?\"\n"
	"    kvctl session close \"$s\"\n";

static int cmd_session(struct ctx *x, int argc, char **argv)
{
	enum { O_IDLE = OPT_FIRST_CMD, O_CTX_POLICY, O_CTX_WINDOW, O_CTX_SINKS };
	static const struct option longopts[] = {
		{ "idle", required_argument, NULL, O_IDLE },
		{ "context-policy", required_argument, NULL, O_CTX_POLICY },
		{ "window", required_argument, NULL, O_CTX_WINDOW },
		{ "sinks", required_argument, NULL, O_CTX_SINKS },
		COMMON_LONGOPTS,
		{ 0 },
	};
	const char *cmd = "session";
	uint32_t idle = 0, window = 0, sinks = 0;
	int o, r, policy = -1;

	while ((o = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		if ((r = common_opt(x, cmd, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		switch (o) {
		case 'h':
			fputs(help_session, stdout);
			return EXIT_OK;
		case O_IDLE:
			if (!parse_u32(optarg, &idle) || idle == 0)
				return usage_error(cmd, "--idle: '%s' is not a number of seconds > 0", optarg);
			break;
		case O_CTX_POLICY:
			if ((policy = kvc_context_policy_parse(optarg)) < 0)
				return usage_error(cmd, "--context-policy: '%s' is not error, truncate-oldest, "
						   "sliding-window or sinks", optarg);
			break;
		case O_CTX_WINDOW:
			if (!parse_u32(optarg, &window) || !window)
				return usage_error(cmd, "--window: '%s' is not a positive integer", optarg);
			break;
		case O_CTX_SINKS:
			if (!parse_u32(optarg, &sinks) || !sinks)
				return usage_error(cmd, "--sinks: '%s' is not a positive integer", optarg);
			break;
		default:
			return option_error(cmd, argv, o);
		}
	}
	int rest = argc - optind;
	char **args = argv + optind;
	bool open_ = rest == 1 && strcmp(args[0], "open") == 0;
	bool close_ = rest == 2 && strcmp(args[0], "close") == 0;
	uint64_t id = 0;
	if (!open_ && !close_)
		return usage_error(cmd, "expected 'open' or 'close ID'");
	if (window && policy != KVC_CONTEXT_SLIDING_WINDOW && policy != KVC_CONTEXT_SINKS)
		return usage_error(cmd, "--window goes with --context-policy sliding-window or sinks");
	if (sinks && policy != KVC_CONTEXT_SINKS)
		return usage_error(cmd, "--sinks goes with --context-policy sinks");
	if (close_ && policy >= 0)
		return usage_error(cmd, "--context-policy goes with 'open'");
	if (close_ && (!parse_u64(args[1], &id) || id == 0))
		return usage_error(cmd, "'%s' is not a session id", args[1]);
	kvc_client *c;
	if ((r = connect_daemon(x, &c)) != 0)
		return r;
	int status = EXIT_OK;
	if (open_) {
		r = policy >= 0 ? kvc_session_open_policy(c, idle, (uint32_t)policy, window, sinks, &id)
				: kvc_session_open(c, idle, &id);
		if (r < 0)
			status = fail(c, "session open", r);
		else
			printf("%" PRIu64 "\n", id);
	} else {
		r = kvc_session_close(c, id);
		if (r < 0)
			status = fail(c, "session close", r);
	}
	kvc_close(c);
	if (fflush(stdout) != 0 && status == EXIT_OK)
		status = EXIT_IO;
	return status;
}

/* ---- version ----------------------------------------------------------------------------------------- */

static const char help_version[] =
	"NAME\n"
	"    kvctl version - print the versions of kvctl, libkvclient and kvd\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl version [--json]\n"
	"\n"
	"DESCRIPTION\n"
	"    Prints kvctl's version (and that of the libkvclient it was built with and the\n"
	"    one it runs with), then connects to kvd and prints its version and model.\n"
	"    The client's versions are always printed; exit status 3 then says that the\n"
	"    daemon could not be reached.\n"
	"\n"
	"OPTIONS\n"
	"    --json   print {\"kvctl\", \"libkvclient\", \"kvd\", \"model\", \"n_ctx\",\n"
	"             \"n_vocab\", \"block_size\"}; kvd and model are null when the daemon\n"
	"             cannot be reached\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl version\n"
	"    kvctl version --json | jq .n_ctx      # the model's context window, in tokens\n";

static int cmd_version(struct ctx *x, int argc, char **argv)
{
	const char *cmd = "version";
	bool json;
	int r = parse_json_only(x, cmd, help_version, argc, argv, &json);

	if (r >= 0)
		return r;
	kvc_client *c = NULL;
	r = kvc_connect(x->socket, &c);
	const struct kvc_info *i = r == 0 ? kvc_server_info(c) : NULL;
	char sv[32] = "";
	if (i)
		fmt_version(sv, sizeof(sv), i->server_version);
	if (json) {
		printf("{\"kvctl\":\"%s\",\"libkvclient\":\"%s\",\"kvd\":", KVC_VERSION_STRING, kvc_version_string());
		if (i) {
			printf("\"%s\",\"model\":", sv);
			json_str(stdout, i->model_name, strlen(i->model_name));
			printf(",\"n_ctx\":%" PRIu32 ",\"n_vocab\":%" PRIu32 ",\"block_size\":%" PRIu32 "}\n", i->n_ctx,
			       i->n_vocab, i->block_size);
		} else {
			printf("null,\"model\":null,\"n_ctx\":null,\"n_vocab\":null,\"block_size\":null}\n");
		}
	} else {
		printf("kvctl %s (built with libkvclient %s, running with %s)\n", KVC_VERSION_STRING, KVC_VERSION_STRING,
		       kvc_version_string());
		if (i)
			printf("kvd %s, model %s (context %" PRIu32 " tokens, vocabulary %" PRIu32 ", %" PRIu32
			       " tokens per KV page)\n",
			       sv, i->model_name, i->n_ctx, i->n_vocab, i->block_size);
	}
	fflush(stdout);
	if (r < 0) {
		if (!json)
			log_warn("kvd: not reachable: %s", kv_strerror(r));
		return exit_for(r);
	}
	kvc_close(c);
	return EXIT_OK;
}

const struct kvctl_command kvctl_cmd_session = {
	"session", "open and close sessions (conversations kept in the KV cache)", cmd_session, help_session,
};
const struct kvctl_command kvctl_cmd_version = {
	"version", "versions of kvctl, libkvclient and kvd", cmd_version, help_version,
};
