/*
 * client/kvctl/ledger.c — kvctl ledger: the last per-request ledger records,
 * as a table or as the JSON lines themselves.
 *
 * The records come from the daemon, not from the ledger file: the file holds
 * every user's requests and is readable by kvd's group only, while the
 * daemon shows a user only that user's own (administrators see all), as
 * kvctl ps does, and keeps them even when no file is configured. The table
 * reads a few top-level members of each record with the small scanner below
 * (the records are kvd's own, one flat object with one nested "kv" object).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvctl.h"
#include "ledger.h"

static const char help_ledger[] =
	"NAME\n"
	"    kvctl ledger - show the last per-request ledger records\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl ledger [-n N] [--json]\n"
	"    kvctl ledger --report [--since TIME] [--json]\n"
	"\n"
	"DESCRIPTION\n"
	"    kvd keeps one record per finished or rejected request: who asked (client,\n"
	"    pid, uid), how it ended, its prompt, cached and generated tokens, its\n"
	"    latencies and the KV pages it used. The records are appended to the\n"
	"    ledger file when [log] ledger names one, and the daemon keeps the last 1024\n"
	"    of them in memory, which this command shows, oldest first: every user's\n"
	"    to root and members of server.admin_groups, only your own to anyone else.\n"
	"\n"
	"    Columns: local time of the record, client and request id, uid, how it\n"
	"    ended (eos, length, stop, cancelled, error, rejected), prompt tokens and\n"
	"    how many came from the prefix cache or session, and of those how many from\n"
	"    cached pages adopted from kvd's previous run (the restart hand-over or the\n"
	"    cache file, [kv] persist_path), tokens generated, time to\n"
	"    first token and mean inter-token latency in milliseconds, the most KV pages\n"
	"    it held, its session, and for a rejected request the reason it was given.\n"
	"\n"
	"OPTIONS\n"
	"    -n, --records N  the last N records (default 20; 0: all the daemon keeps)\n"
	"    --json           the records as JSON lines, exactly as in the ledger file;\n"
	"                     with --report, the report as one JSON object\n"
	"    --report         a short page over the records the daemon keeps (yours, or\n"
	"                     everyone's for administrators; the newest that fit in one\n"
	"                     512 KiB reply) and its counters, answering:\n"
	"                     (1) what the KV is held and read for: bytes by prompt length\n"
	"                     (short < 256 tokens <= medium < 1024 <= long), by batch width\n"
	"                     (alone, or batched: 1.5 or more sequences per step), and the\n"
	"                     KV heads against the query heads; (2) prefix sharing: the hit\n"
	"                     ratio of the prefix cache and of the records, and the prompt\n"
	"                     tokens recomputed although an identical prefix had been\n"
	"                     cached and evicted (evicted_tokens.prefix_eviction, tokens);\n"
	"                     (3) page slack\n"
	"                     against the KV allocated (under 10%: small enough to ignore);\n"
	"                     (4) per KV element type: requests, KV held per request, bytes\n"
	"                     read per generated token; (5) per requester (uid): preemptions\n"
	"                     and the tokens evicted (recomputed after a preemption, recomputed\n"
	"                     after an eviction of the uid's own cached prefix, swapped,\n"
	"                     dropped by the context policy), the recomputed prefix tokens\n"
	"                     of anyone that the uid's own allocations had evicted\n"
	"                     (evicted_tokens.prefix_evicted_by), time waiting for compute\n"
	"                     and for memory;\n"
	"                     (6) rejections by cause, with an example reason. What the\n"
	"                     ledger does not measure is printed as \"not measured\"\n"
	"    --since TIME     with --report, only records from TIME on: a duration ago\n"
	"                     (90s, 15m, 2h, 1d) or @SECONDS since the epoch\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl ledger\n"
	"    kvctl ledger -n 100 --json | jq 'select(.finish == \"error\")'\n"
	"    kvctl ledger --report --since 1h\n";

#define LEDGER_DEFAULT_RECORDS 20
#define LEDGER_MAX_RECORDS     1024

static const char *skip_ws(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
		p++;
	return p;
}

static const char *skip_string(const char *p)
{
	for (p++; *p && *p != '"'; p++)
		if (*p == '\\' && !*++p)
			return NULL;
	return *p == '"' ? p + 1 : NULL;
}

/* Skip the JSON value at p: returns where it ends (the ',', '}' or ']'
 * after it), NULL when malformed. */
static const char *skip_value(const char *p)
{
	int depth = 0;

	p = skip_ws(p);
	for (;;) {
		if (!*p)
			return NULL;
		if (depth == 0 && (*p == ',' || *p == '}' || *p == ']'))
			return p;
		if (*p == '"') {
			if (!(p = skip_string(p)))
				return NULL;
			continue;
		}
		if (*p == '{' || *p == '[')
			depth++;
		else if (*p == '}' || *p == ']')
			depth--;
		p++;
	}
}

/* The value of top-level member key of the object in json, or NULL. */
const char *ledger_member(const char *json, const char *key)
{
	const char *p = skip_ws(json);
	size_t kl = strlen(key);

	if (*p++ != '{')
		return NULL;
	for (;;) {
		p = skip_ws(p);
		if (*p != '"')
			return NULL;
		const char *k = p + 1, *e = skip_string(p);
		if (!e)
			return NULL;
		p = skip_ws(e);
		if (*p++ != ':')
			return NULL;
		p = skip_ws(p);
		if ((size_t)(e - 1 - k) == kl && memcmp(k, key, kl) == 0)
			return p;
		if (!(p = skip_value(p)))
			return NULL;
		p = skip_ws(p);
		if (*p++ != ',')
			return NULL;
	}
}

bool ledger_member_u64(const char *json, const char *key, uint64_t *ret)
{
	const char *v = ledger_member(json, key);

	if (!v || *v < '0' || *v > '9')
		return false;
	*ret = strtoull(v, NULL, 10);
	return true;
}

bool ledger_member_double(const char *json, const char *key, double *ret)
{
	const char *v = ledger_member(json, key);

	if (!v || ((*v < '0' || *v > '9') && *v != '-'))
		return false;
	*ret = strtod(v, NULL);
	return true;
}

bool ledger_member_str(const char *json, const char *key, char *out, size_t cap)
{
	const char *v = ledger_member(json, key);
	size_t o = 0;

	if (!v || *v != '"' || cap == 0)
		return false;
	for (v++; *v && *v != '"' && o + 1 < cap; v++) {
		if (*v == '\\') {
			v++;
			if (*v == 'u') {
				unsigned c = 0;
				if (sscanf(v + 1, "%4x", &c) != 1)
					break;
				out[o++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
				v += 4;
				continue;
			}
			out[o++] = *v == 'n' ? ' ' : *v == 't' ? ' ' : *v;
			if (!*v)
				break;
			continue;
		}
		out[o++] = *v;
	}
	out[o] = 0;
	return true;
}

static void print_row(const char *json)
{
	uint64_t t = 0, cid = 0, rid = 0, uid = 0, sess = 0, prompt = 0, cached = 0, adopted = 0, gen = 0, ttft = 0,
		 itl = 0, peak = 0;
	char finish[16] = "?", when[16] = "?", sess_s[24] = "-", reason[256] = "", ttft_s[24] = "-", itl_s[24] = "-",
	     peak_s[24] = "-";
	const char *kv;

	ledger_member_u64(json, "time_ns", &t);
	ledger_member_u64(json, "client_id", &cid);
	ledger_member_u64(json, "request_id", &rid);
	ledger_member_u64(json, "uid", &uid);
	ledger_member_u64(json, "session_id", &sess);
	ledger_member_str(json, "finish", finish, sizeof(finish));
	if (t) {
		time_t s = (time_t)(t / 1000000000u);
		struct tm tm;
		if (localtime_r(&s, &tm))
			strftime(when, sizeof(when), "%H:%M:%S", &tm);
	}
	if (sess)
		snprintf(sess_s, sizeof(sess_s), "%" PRIu64, sess);
	if (strcmp(finish, "rejected") == 0) {
		ledger_member_str(json, "reason", reason, sizeof(reason));
		printf("%-8s %7" PRIu64 " %7" PRIu64 " %6" PRIu64 " %-9s %7s %7s %7s %6s %9s %8s %6s %8s  %s\n", when,
		       cid, rid, uid, finish, "-", "-", "-", "-", "-", "-", "-", sess_s, reason);
		return;
	}
	ledger_member_u64(json, "prompt_tokens", &prompt);
	ledger_member_u64(json, "cached_tokens", &cached);
	ledger_member_u64(json, "adopted_tokens", &adopted); /* absent from kvd before 0.6: 0 */
	ledger_member_u64(json, "generated_tokens", &gen);
	if (ledger_member_u64(json, "ttft_ns", &ttft) && gen)
		snprintf(ttft_s, sizeof(ttft_s), "%.1f", (double)ttft / 1e6);
	if (ledger_member_u64(json, "itl_ns", &itl) && gen > 1)
		snprintf(itl_s, sizeof(itl_s), "%.2f", (double)itl / 1e6);
	kv = ledger_member(json, "kv");
	if (kv && *kv == '{' && ledger_member_u64(kv, "pages_peak", &peak))
		snprintf(peak_s, sizeof(peak_s), "%" PRIu64, peak);
	printf("%-8s %7" PRIu64 " %7" PRIu64 " %6" PRIu64 " %-9s %7" PRIu64 " %7" PRIu64 " %7" PRIu64 " %6" PRIu64
	       " %9s %8s %6s %8s\n",
	       when, cid, rid, uid, finish, prompt, cached, adopted, gen, ttft_s, itl_s, peak_s, sess_s);
}

/* --since: "N[smhd]" ago, or "@N" seconds since the epoch, as ns since the
 * epoch. */
static bool parse_since(const char *s, uint64_t *ret)
{
	uint64_t v, mult = 1;
	char *end;
	struct timespec now;

	if (s[0] == '@') {
		if (!parse_u64(s + 1, &v) || v > UINT64_MAX / 1000000000u)
			return false;
		*ret = v * 1000000000u;
		return *ret != 0;
	}
	if (s[0] < '0' || s[0] > '9')
		return false;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return false;
	if (*end == 's' || *end == 'm' || *end == 'h' || *end == 'd') {
		mult = *end == 's' ? 1 : *end == 'm' ? 60 : *end == 'h' ? 3600 : 86400;
		end++;
	}
	if (*end || v > UINT64_MAX / 1000000000u / mult)
		return false;
	clock_gettime(CLOCK_REALTIME, &now);
	uint64_t t = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec, ago = v * mult * 1000000000u;
	*ret = t > ago ? t - ago : 1;
	return true;
}

static int cmd_ledger(struct ctx *x, int argc, char **argv)
{
	enum { O_JSON = OPT_FIRST_CMD, O_REPORT, O_SINCE };
	static const struct option longopts[] = {
		{ "records", required_argument, NULL, 'n' },
		{ "json", no_argument, NULL, O_JSON },
		{ "report", no_argument, NULL, O_REPORT },
		{ "since", required_argument, NULL, O_SINCE },
		COMMON_LONGOPTS,
		{ 0 },
	};
	const char *cmd = "ledger";
	uint32_t n = LEDGER_DEFAULT_RECORDS;
	bool json = false, report = false;
	uint64_t since = 0;
	int o, r;

	while ((o = getopt_long(argc, argv, ":hn:", longopts, NULL)) != -1) {
		if ((r = common_opt(x, cmd, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		switch (o) {
		case 'h':
			fputs(help_ledger, stdout);
			return EXIT_OK;
		case 'n':
			if (!parse_u32(optarg, &n) || n > LEDGER_MAX_RECORDS)
				return usage_error(cmd, "-n: '%s' is not a number of records 0..%d", optarg,
						   LEDGER_MAX_RECORDS);
			break;
		case O_JSON:
			json = true;
			break;
		case O_REPORT:
			report = true;
			break;
		case O_SINCE:
			if (!parse_since(optarg, &since))
				return usage_error(cmd, "--since: '%s' is not a duration ago (90s, 15m, 2h, 1d) or @SECONDS",
						   optarg);
			break;
		default:
			return option_error(cmd, argv, o);
		}
	}
	if (optind < argc)
		return usage_error(cmd, "unexpected argument '%s'", argv[optind]);
	if (since && !report)
		return usage_error(cmd, "--since goes with --report");
	if (report)
		n = 0; /* all the daemon keeps */

	kvc_client *c;
	if ((r = connect_daemon(x, &c)) != 0)
		return r;
	struct kvc_ledger_record *recs;
	size_t nr;
	r = kvc_ledger(c, n, &recs, &nr);
	if (r < 0) {
		int st = fail(c, cmd, r);
		kvc_close(c);
		return st;
	}
	if (report) {
		struct kvc_stats st;

		r = kvc_stats(c, &st);
		if (r == 0)
			r = ledger_report(recs, nr, since, &st, json);
		kvc_free(recs);
		if (r < 0) {
			int stat = fail(c, cmd, r);
			kvc_close(c);
			return stat;
		}
		kvc_close(c);
		return fflush(stdout) != 0 ? EXIT_IO : EXIT_OK;
	}
	if (!json)
		printf("%-8s %7s %7s %6s %-9s %7s %7s %7s %6s %9s %8s %6s %8s\n", "TIME", "CLIENT", "REQ", "UID",
		       "FINISH", "PROMPT", "CACHED", "ADOPTED", "GEN", "TTFT_MS", "ITL_MS", "PAGES", "SESSION");
	for (size_t i = 0; i < nr; i++) {
		if (json)
			printf("%s\n", recs[i].json);
		else
			print_row(recs[i].json);
	}
	kvc_free(recs);
	kvc_close(c);
	return fflush(stdout) != 0 ? EXIT_IO : EXIT_OK;
}

const struct kvctl_command kvctl_cmd_ledger = {
	"ledger", "the last per-request ledger records (yours; everyone's for admins)", cmd_ledger, help_ledger,
};
