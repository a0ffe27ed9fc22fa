/*
 * client/kvctl/stats.c — kvctl stats and kvctl ps: what the daemon's KV cache
 * and scheduler hold (pages, counters) and which requests hold them.
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
#include <unistd.h>

#include "kvctl.h"
#include "kvc_metrics.h"

/* ---- stats --------------------------------------------------------------------------------- */

static const char help_stats[] =
	"NAME\n"
	"    kvctl stats - show kvd's KV-cache pages and scheduler counters\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl stats [--json] [--watch [SECS]]\n"
	"    kvctl stats --map [--color WHEN] [--watch [SECS]]\n"
	"    kvctl stats --prometheus\n"
	"\n"
	"DESCRIPTION\n"
	"    The KV cache is a pool of fixed-size pages (block_size tokens each). A page is\n"
	"    free, used by one or more sequences (shared when by two or more: common\n"
	"    prefixes are stored once), or cached: no longer used but kept so that a later\n"
	"    prompt with the same prefix reuses it. Swapped counts pages' worth of\n"
	"    sequences written to the swap file under memory pressure. Slack is the unused\n"
	"    tail of partly filled pages: the only waste of paging.\n"
	"\n"
	"    The table shows every counter and gauge of --json, grouped: the pool (pages\n"
	"    free, used, shared, cached and swapped, with their bytes and share; the KV\n"
	"    bytes one token costs; slack), the prefix cache (tokens looked up and found:\n"
	"    the hit rate), swap, requests (running, waiting for memory, swapped out),\n"
	"    clients, work done, the ledger, windows (for a model whose layers mostly\n"
	"    attend over a window, Gemma 3: pages released once no windowed layer reads\n"
	"    them, [kv] release_local, and the packed pages that keep their global\n"
	"    layers), grammar (constrained tokens the greedy check alone answered, and\n"
	"    those drawn over a full mask of the allowed tokens) and speculation (decodes\n"
	"    that carried a draft, each verified in one step; draft tokens scored and\n"
	"    accepted; the acceptance histogram: verify steps by the run of draft tokens\n"
	"    they accepted, 0, 1, 2-3, 4-7 or 8-16). For a user who is not an\n"
	"    administrator the prefix and speculation counters are its own requests'.\n"
	"\n"
	"OPTIONS\n"
	"    --json          print one JSON object with integer members pages_total,\n"
	"                    pages_free, pages_used, pages_shared, pages_cached,\n"
	"                    pages_swapped, page_bytes, block_size, kv_bytes_per_token,\n"
	"                    pool_bytes, tokens_resident, slack_tokens, prefix_lookups,\n"
	"                    prefix_query_tokens, prefix_hit_tokens, pages_evicted,\n"
	"                    cow_copies, swap_out_pages, swap_in_pages, swap_bytes,\n"
	"                    requests_running, requests_waiting, requests_swapped,\n"
	"                    requests_completed, requests_rejected, clients, sessions,\n"
	"                    prompt_tokens_total, generated_tokens_total, steps, uptime_ns,\n"
	"                    ledger_records_dropped, swap_errors, swap_fallback_recomputes, pages_demoted,\n"
	"                    samples_forked, pages_adopted, pages_packed, pages_released,\n"
	"                    adopted_hit_tokens, gram_checked, gram_masked,\n"
	"                    spec_verify_steps, spec_drafted_tokens, spec_accepted_tokens,\n"
	"                    spec_runs_0, spec_runs_1, spec_runs_2_3, spec_runs_4_7,\n"
	"                    spec_runs_8_16, spec_mode (1 off, 2 lookup, 3 draft, 4 auto),\n"
	"                    spec_draft_pages_total, spec_draft_pages_used,\n"
	"                    spec_draft_reclaims,\n"
	"                    and the strings model and server_version\n"
	"    --watch [SECS]  repeat every SECS seconds (default 1) until interrupted; with\n"
	"                    --json, one object per line\n"
	"    --map           draw the pool, one cell per page: . free, o private (one\n"
	"                    sequence), 2-9 or + shared (the digit: how many sequences\n"
	"                    map it), c cached (unused, kept on the LRU for prefix\n"
	"                    reuse); then the swap file, one cell per page: s swapped\n"
	"                    (a preempted request's), d demoted (a cached prefix page\n"
	"                    kept in swap), _ free. A legend gives the totals. Rows are\n"
	"                    as wide as the terminal ($COLUMNS, else 80, in a pipe).\n"
	"                    The picture is read from the daemon's page metadata, shared\n"
	"                    read-only: redrawing it costs the daemon nothing\n"
	"    --color WHEN    colour the map: auto (default: on a terminal, unless NO_COLOR\n"
	"                    is set), always or never\n"
	"    --prometheus    every counter and gauge, and the histograms of time to first\n"
	"                    token, inter-token latency and accepted draft runs\n"
	"                    (kvd_spec_accepted_run_tokens), in Prometheus' text format\n"
	"                    (counters end in _total; hit rates are left to the query)\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl stats\n"
	"    kvctl stats --json | jq .pages_shared\n"
	"    kvctl stats --watch 0.5\n"
	"    kvctl stats --map --watch\n"
	"    kvctl stats --prometheus > /var/lib/node_exporter/kvd.prom\n";

static void print_stats_json(const struct kvc_stats *s, const struct kvc_info *i)
{
	char v[32];
	const struct kvc_metric *m = kvc_metrics();

	fputc('{', stdout);
	for (int k = 0; k < KVC_STATS_N_METRICS; k++)
		fprintf(stdout, "\"%s\":%" PRIu64 ",", m[k].field, kvc_metric_value(&m[k], s));
	fputs("\"model\":", stdout);
	json_str(stdout, i->model_name, strlen(i->model_name));
	fmt_version(v, sizeof(v), i->server_version);
	fprintf(stdout, ",\"server_version\":\"%s\"}\n", v);
}

static double pct(uint64_t a, uint64_t b)
{
	return b ? 100.0 * (double)a / (double)b : 0.0;
}

/* The row of field `name`, or NULL. */
static const struct kvc_metric *metric_named(const char *name)
{
	const struct kvc_metric *m = kvc_metrics();

	for (int k = 0; k < KVC_STATS_N_METRICS; k++)
		if (!strcmp(m[k].field, name))
			return &m[k];
	return NULL;
}

/* One row of the text table: its value in its unit (bytes and durations
 * readable, pages also in bytes) and, for a part of another row, its share. */
static void print_metric_row(const char *group, const struct kvc_metric *m, const struct kvc_stats *s)
{
	uint64_t x = kvc_metric_value(m, s);
	char line[256], b[32];
	size_t n = 0;

#define ADD(...) (n += (size_t)snprintf(line + n, n < sizeof(line) ? sizeof(line) - n : 0, __VA_ARGS__))
	ADD("%-10s%s%-26s", group, strlen(group) >= 10 ? " " : "", m->label);
	if (!strcmp(m->unit, "bytes")) {
		fmt_bytes(b, sizeof(b), (double)x);
		ADD("%12s %-9s", b, "");
	} else if (!strcmp(m->unit, "mode")) {
		const char *mn = kvc_spec_mode_name(x);
		ADD("%12s %-9s", mn ? mn : "-", "");
	} else if (!strcmp(m->unit, "ns")) {
		uint64_t sec = x / 1000000000u;
		snprintf(b, sizeof(b), "%" PRIu64 "h%02" PRIu64 "m%02" PRIu64 "s", sec / 3600, (sec / 60) % 60, sec % 60);
		ADD("%12s %-9s", b, "");
	} else {
		ADD("%12" PRIu64 " %-9s", x, m->unit);
	}
	const struct kvc_metric *of = m->of[0] ? metric_named(m->of) : NULL;
	/* (the draft model's pages are of another size than the pool's) */
	if (!strcmp(m->unit, "pages") && m->kind == KVC_METRIC_GAUGE && s->page_bytes && strncmp(m->field, "spec_draft_", 11)) {
		fmt_bytes(b, sizeof(b), (double)x * (double)s->page_bytes);
		ADD(" %10s", b);
	} else if (of) {
		ADD(" %10s", ""); /* shares in one column */
	}
	if (of && kvc_metric_value(of, s)) {
		const char *l = of->label;
		while (*l == ' ')
			l++;
		ADD("  %5.1f%% of %s", pct(x, kvc_metric_value(of, s)), l);
	}
#undef ADD
	if (n >= sizeof(line))
		n = sizeof(line) - 1;
	while (n > 0 && line[n - 1] == ' ')
		n--;
	line[n] = 0;
	puts(line);
}

/*
 * The text form: a heading (version, model, uptime; the pool's geometry and
 * KV type), then every row of client/kvc_metrics.h's list, group by group in
 * the order groups first appear there, so a counter added to the list shows
 * here with no change to this file.
 */
static void print_stats_table(const struct kvc_stats *s, const struct kvc_info *i)
{
	char b1[32], b2[32], b3[32], v[32];
	uint64_t up = s->uptime_ns / 1000000000u;
	const struct kvc_metric *m = kvc_metrics();

	fmt_version(v, sizeof(v), i->server_version);
	printf("kvd %s, model %s, up %" PRIu64 "h%02" PRIu64 "m%02" PRIu64 "s\n", v, i->model_name, up / 3600,
	       (up / 60) % 60, up % 60);
	fmt_bytes(b1, sizeof(b1), (double)s->page_bytes);
	fmt_bytes(b2, sizeof(b2), (double)s->pages_total * (double)s->page_bytes);
	fmt_bytes(b3, sizeof(b3), (double)s->kv_bytes_per_token);
	const char *kt = i->kv_cache_type[0] ? i->kv_cache_type
					     : kv_cache_type_name(s->kv_bytes_per_token, i->n_layers, i->n_kv_heads, i->head_dim);
	printf("KV pool   %" PRIu64 " pages x %s = %s   (%" PRIu64 " tokens/page, %s per token%s%s)\n", s->pages_total,
	       b1, b2, s->block_size, b3, kt ? ", " : "", kt ? kt : "");
	for (int g = 0; g < KVC_STATS_N_METRICS; g++) {
		bool first = true;
		for (int k = 0; k < g; k++)
			first = first && strcmp(m[k].group, m[g].group) != 0;
		if (!first)
			continue; /* the group was shown with its first row */
		fputc('\n', stdout);
		for (int k = g; k < KVC_STATS_N_METRICS; k++)
			if (!strcmp(m[k].group, m[g].group))
				print_metric_row(k == g ? m[g].group : "", &m[k], s);
	}
}

static int cmd_stats(struct ctx *x, int argc, char **argv)
{
	enum { O_JSON = OPT_FIRST_CMD, O_WATCH, O_MAP, O_COLOR, O_PROM };
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, O_JSON },
		{ "watch", optional_argument, NULL, O_WATCH },
		{ "map", no_argument, NULL, O_MAP },
		{ "color", required_argument, NULL, O_COLOR },
		{ "prometheus", no_argument, NULL, O_PROM },
		COMMON_LONGOPTS,
		{ 0 },
	};
	const char *cmd = "stats";
	bool json = false, map = false, prom = false;
	int color = -1;
	double watch = 0;
	int o, r;

	while ((o = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		if ((r = common_opt(x, cmd, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		switch (o) {
		case 'h':
			fputs(help_stats, stdout);
			return EXIT_OK;
		case O_JSON:
			json = true;
			break;
		case O_WATCH:
			watch = 1;
			if (optarg) {
				if (!parse_double(optarg, &watch) || watch <= 0)
					return usage_error(cmd, "--watch: '%s' is not a number of seconds > 0", optarg);
			} else if (optind < argc && parse_double(argv[optind], &watch)) {
				if (watch <= 0)
					return usage_error(cmd, "--watch: '%s' is not a number of seconds > 0", argv[optind]);
				optind++;
			}
			break;
		case O_MAP:
			map = true;
			break;
		case O_COLOR:
			if (strcmp(optarg, "auto") == 0)
				color = -1;
			else if (strcmp(optarg, "always") == 0)
				color = 1;
			else if (strcmp(optarg, "never") == 0)
				color = 0;
			else
				return usage_error(cmd, "--color: '%s' is not auto, always or never", optarg);
			break;
		case O_PROM:
			prom = true;
			break;
		default:
			return option_error(cmd, argv, o);
		}
	}
	if (optind < argc)
		return usage_error(cmd, "unexpected argument '%s'", argv[optind]);
	if (json + map + prom > 1)
		return usage_error(cmd, "--json, --map and --prometheus exclude one another");
	if (prom && watch > 0)
		return usage_error(cmd, "--prometheus prints one scrape: no --watch");

	kvc_client *c;
	if ((r = connect_daemon(x, &c)) != 0)
		return r;
	if (map) {
		r = map_main(c, watch, color);
		kvc_close(c);
		return r;
	}
	if (prom) {
		struct kvc_stats s;
		struct kvc_histograms h;
		if ((r = kvc_stats(c, &s)) < 0 || (r = kvc_histograms(c, &h)) < 0) {
			int st = fail(c, "stats --prometheus", r);
			kvc_close(c);
			return st;
		}
		prom_print(stdout, &s, &h, kvc_server_info(c));
		kvc_close(c);
		return fflush(stdout) != 0 ? EXIT_IO : EXIT_OK;
	}
	if (watch > 0) {
		install_sigint_flag();
	}
	bool tty = isatty(STDOUT_FILENO);
	int status = EXIT_OK;
	do {
		struct kvc_stats s;
		r = kvc_stats(c, &s);
		if (r < 0) {
			if (g_interrupted)
				break;
			status = fail(c, "stats", r);
			break;
		}
		if (json) {
			print_stats_json(&s, kvc_server_info(c));
		} else {
			if (watch > 0 && tty)
				fputs("\033[H\033[2J", stdout);
			else if (watch > 0)
				fputs("\n", stdout);
			print_stats_table(&s, kvc_server_info(c));
		}
		if (fflush(stdout) != 0) {
			status = EXIT_IO;
			break;
		}
		if (watch > 0)
			sleep_s(watch);
	} while (watch > 0 && !g_interrupted);
	kvc_close(c);
	return status;
}

/* ---- ps -------------------------------------------------------------------------------------------- */

static const char help_ps[] =
	"NAME\n"
	"    kvctl ps - list the requests live in kvd and the KV pages they hold\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl ps [--json]\n"
	"\n"
	"DESCRIPTION\n"
	"    One line per request of any client: the client's id (as kvd numbers its\n"
	"    connections) and the request's id within it, the client's pid and uid, the\n"
	"    state (uploading its prompt, waiting for memory, prefill, running, swapped),\n"
	"    prompt tokens and how many of them came from the prefix cache or session,\n"
	"    tokens generated out of the maximum, KV pages held and how many of those are\n"
	"    shared with other sequences, age, session, and which sample of its request\n"
	"    the line is ('kvctl generate -n N': one line per sample once the prompt is\n"
	"    computed; the samples share the prompt's full pages).\n"
	"\n"
	"OPTIONS\n"
	"    --json   print {\"requests\": [{...}, ...]} with the members client_id,\n"
	"             request_id, pid, uid, state, prompt_tokens, cached_tokens,\n"
	"             generated_tokens, max_tokens, pages, pages_shared, age_ms, session_id,\n"
	"             sample\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl ps\n"
	"    kvctl ps --json | jq '.requests[] | select(.state == \"swapped\")'\n"
	"\n"
	"SEE ALSO\n"
	"    kvctl stats --help\n";

static int cmd_ps(struct ctx *x, int argc, char **argv)
{
	const char *cmd = "ps";
	bool json;
	int r = parse_json_only(x, cmd, help_ps, argc, argv, &json);

	if (r >= 0)
		return r;
	kvc_client *c;
	if ((r = connect_daemon(x, &c)) != 0)
		return r;
	struct kvc_ps_entry *e;
	size_t n;
	r = kvc_ps(c, &e, &n);
	if (r < 0) {
		int st = fail(c, cmd, r);
		kvc_close(c);
		return st;
	}
	if (json) {
		fputs("{\"requests\":[", stdout);
		for (size_t i = 0; i < n; i++)
			printf("%s{\"client_id\":%" PRIu64 ",\"request_id\":%" PRIu64 ",\"pid\":%" PRIu32 ",\"uid\":%" PRIu32
			       ",\"state\":\"%s\",\"prompt_tokens\":%" PRIu32 ",\"cached_tokens\":%" PRIu32
			       ",\"generated_tokens\":%" PRIu32 ",\"max_tokens\":%" PRIu32 ",\"pages\":%" PRIu32
			       ",\"pages_shared\":%" PRIu32 ",\"age_ms\":%" PRIu64 ",\"session_id\":%" PRIu64
			       ",\"sample\":%" PRIu32 "}",
			       i ? "," : "", e[i].client_id, e[i].request_id, e[i].pid, e[i].uid,
			       kvc_req_state_name((int)e[i].state), e[i].prompt_tokens, e[i].cached_tokens,
			       e[i].generated_tokens, e[i].max_tokens, e[i].pages, e[i].pages_shared,
			       e[i].age_ns / 1000000, e[i].session_id, e[i].sample);
		fputs("]}\n", stdout);
	} else {
		printf("%8s %8s %8s %6s %-9s %7s %7s %13s %6s %6s %9s %-20s %s\n", "CLIENT", "REQ", "PID", "UID",
		       "STATE", "PROMPT", "CACHED", "GEN/MAX", "PAGES", "SHARED", "AGE", "SESSION", "SAMPLE");
		for (size_t i = 0; i < n; i++) {
			char gen[32], sess[24] = "-";
			snprintf(gen, sizeof(gen), "%" PRIu32 "/%" PRIu32, e[i].generated_tokens, e[i].max_tokens);
			if (e[i].session_id)
				snprintf(sess, sizeof(sess), "%" PRIu64, e[i].session_id);
			printf("%8" PRIu64 " %8" PRIu64 " %8" PRIu32 " %6" PRIu32 " %-9s %7" PRIu32 " %7" PRIu32
			       " %13s %6" PRIu32 " %6" PRIu32 " %8.1fs %-20s %" PRIu32 "\n",
			       e[i].client_id, e[i].request_id, e[i].pid, e[i].uid, kvc_req_state_name((int)e[i].state),
			       e[i].prompt_tokens, e[i].cached_tokens, gen, e[i].pages, e[i].pages_shared,
			       (double)e[i].age_ns / 1e9, sess, e[i].sample);
		}
	}
	kvc_free(e);
	kvc_close(c);
	return fflush(stdout) != 0 ? EXIT_IO : EXIT_OK;
}

const struct kvctl_command kvctl_cmd_stats = {
	"stats", "KV-cache pages (free, used, shared, cached, swapped) and counters", cmd_stats, help_stats,
};
const struct kvctl_command kvctl_cmd_ps = {
	"ps", "live requests and the pages they hold", cmd_ps, help_ps,
};
