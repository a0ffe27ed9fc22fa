/*
 * client/kvctl/cache.c — kvctl cache: an administrator's hands on the
 * daemon's prefix cache. 'save' writes the hibernation file now, while kvd
 * serves (what a clean stop writes, so a crash or a kill after it loses
 * nothing computed before); 'drop' empties the cache and removes the file.
 * Both are kvc_cache_save / kvc_cache_drop; the daemon decides who may.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kvctl.h"

static const char help_cache[] =
	"NAME\n"
	"    kvctl cache - save the prefix cache to its file now, or drop it\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl cache save [--json]\n"
	"    kvctl cache drop [--json]\n"
	"\n"
	"DESCRIPTION\n"
	"    kvd writes its cached prompt prefixes to a file ([kv] persist_path) when it\n"
	"    stops cleanly and adopts them at the next start. 'save' writes that file\n"
	"    now, while kvd keeps serving: hottest pages first, up to [kv] persist_size\n"
	"    and within [kv] persist_timeout, replacing the old file only once the new\n"
	"    one is complete, so a crash or a kill -9 afterwards still finds it. It\n"
	"    prints the pages and bytes written and the time taken; requests wait while\n"
	"    it writes. Without a persist_path it fails, saying so.\n"
	"\n"
	"    'drop' empties the prefix cache: every cached page that no running request\n"
	"    uses is freed (running requests keep theirs), every user's, and the cache\n"
	"    file is removed. It prints the pages dropped.\n"
	"\n"
	"    Both are for root and members of [server] admin_groups; anyone else is\n"
	"    refused (exit status 3).\n"
	"\n"
	"OPTIONS\n"
	"    --json   one JSON object: {\"op\", \"pages\", \"candidates\", \"bytes\", \"ms\",\n"
	"             \"timed_out\", \"file_removed\"}\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    sudo kvctl cache save\n"
	"    sudo kvctl cache drop\n";

static int cmd_cache(struct ctx *x, int argc, char **argv)
{
	enum { O_JSON = OPT_FIRST_CMD };
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, O_JSON },
		COMMON_LONGOPTS,
		{ 0 },
	};
	const char *cmd = "cache", *op;
	struct kvc_cache_result res;
	bool json = false, save;
	kvc_client *c;
	int o, r;

	while ((o = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		if ((r = common_opt(x, cmd, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		switch (o) {
		case 'h':
			fputs(help_cache, stdout);
			return EXIT_OK;
		case O_JSON:
			json = true;
			break;
		default:
			return option_error(cmd, argv, o);
		}
	}
	if (optind >= argc)
		return usage_error(cmd, "say what to do: save or drop");
	op = argv[optind++];
	if (strcmp(op, "save") && strcmp(op, "drop"))
		return usage_error(cmd, "unknown action '%s' (save or drop)", op);
	if (optind < argc)
		return usage_error(cmd, "unexpected argument '%s'", argv[optind]);
	save = !strcmp(op, "save");

	if ((r = connect_daemon(x, &c)) != 0)
		return r;
	r = save ? kvc_cache_save(c, &res) : kvc_cache_drop(c, &res);
	if (r < 0) {
		char what[32];

		snprintf(what, sizeof(what), "cache %s", op);
		r = fail(c, what, r);
		kvc_close(c);
		return r;
	}
	kvc_close(c);
	if (json)
		printf("{\"op\":\"%s\",\"pages\":%" PRIu64 ",\"candidates\":%" PRIu64 ",\"bytes\":%" PRIu64
		       ",\"ms\":%.3f,\"timed_out\":%s,\"file_removed\":%s}\n",
		       op, res.pages, res.candidates, res.bytes, (double)res.ns / 1e6, res.timed_out ? "true" : "false",
		       res.file_removed ? "true" : "false");
	else if (save)
		printf("saved %" PRIu64 " of %" PRIu64 " cached pages, %.1f MiB, in %.1f ms%s\n", res.pages,
		       res.candidates, (double)res.bytes / 1048576.0, (double)res.ns / 1e6,
		       res.timed_out ? " (stopped by kv.persist_timeout)" : "");
	else
		printf("dropped %" PRIu64 " cached pages%s\n", res.pages,
		       res.file_removed ? "; removed the cache file" : "");
	return fflush(stdout) != 0 ? EXIT_IO : EXIT_OK;
}

const struct kvctl_command kvctl_cmd_cache = {
	"cache", "save the prefix cache to its file now, or drop it (admins)", cmd_cache, help_cache,
};
