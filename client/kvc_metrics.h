/*
 * client/kvc_metrics.h — the one list of kvd's counters and gauges, and the
 * Prometheus rendering every client program shares.
 *
 * KVC_STATS_METRICS is an X-macro: one row per member of struct kvc_stats
 * (client/kvclient.h), in the struct's order, saying what kind of value it
 * is, its unit, its exported name and one sentence of help. From it come
 * libkvclient's copy of the STATS reply (kvc_admin.c, which also checks at
 * compile time that struct ipc_stats and struct kvc_stats agree with the
 * list field by field), `kvctl stats --json` (the field names),
 * `kvctl stats --prometheus` and kvd-http's /metrics (both through
 * kvc_metrics_prometheus() below, so they cannot disagree), and the metric
 * table of docs/operations.md, which tests/checks/t_docs.sh checks against
 * `build/scripts/kvd-docgen metrics`.
 *
 * Adding a counter: a field at the end of struct ipc_stats (ipc/ipc.h)
 * filled by the daemon, the same field at the end of struct kvc_stats, and
 * a row here. Nothing else: `kvctl stats` shows it in its text table too.
 *
 * Prometheus names: "kvd_" + name, and "_total" after a counter's name.
 * Counters are cumulative since the daemon started; ratios (the prefix
 * cache's hit rate) are left to the query, so they stay right across scrapes
 * and restarts. A row whose unit is "ns" is exported in seconds.
 *
 * Not part of libkvclient's installed interface: a header for the programs
 * of this tree (kvctl, kvd-http, the documentation generator).
 */
#ifndef KVC_METRICS_H
#define KVC_METRICS_H

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvclient.h"

#define KVC_METRIC_GAUGE   0
#define KVC_METRIC_COUNTER 1

/*
 * X(field, kind, unit, name, group, label, of, help): kind GAUGE or COUNTER
 * (KVC_METRIC_*); group and label place the row in `kvctl stats`' text
 * table (rows of one group together, under the group's name, in the order
 * groups first appear here); of names the field the row is a part of
 * (shown as its share; "" for none).
 */
#define KVC_STATS_METRICS(X) \
	X(pages_total, GAUGE, "pages", "pages_total", "pool", "total", "", \
	  "KV pages in the pool.") \
	X(pages_free, GAUGE, "pages", "pages_free", "pool", "free", "pages_total", \
	  "KV pages on the free list.") \
	X(pages_used, GAUGE, "pages", "pages_used", "pool", "used", "pages_total", \
	  "KV pages mapped by at least one sequence.") \
	X(pages_shared, GAUGE, "pages", "pages_shared", "pool", "  shared", "pages_used", \
	  "KV pages mapped by two or more sequences (of pages_used).") \
	X(pages_cached, GAUGE, "pages", "pages_cached", "pool", "cached", "pages_total", \
	  "KV pages no sequence uses, kept for prefix reuse.") \
	X(pages_swapped, GAUGE, "pages", "pages_swapped", "pool", "swapped (in the swap file)", "", \
	  "Pages' worth of KV in the swap file.") \
	X(page_bytes, GAUGE, "bytes", "page_bytes", "pool", "page size", "", \
	  "Bytes of one KV page.") \
	X(block_size, GAUGE, "tokens", "block_size_tokens", "pool", "tokens per page", "", \
	  "Tokens one KV page holds.") \
	X(kv_bytes_per_token, GAUGE, "bytes", "kv_bytes_per_token", "pool", "KV per token", "", \
	  "KV bytes one token costs.") \
	X(pool_bytes, GAUGE, "bytes", "pool_bytes", "pool", "pool size", "", \
	  "Size of the KV pool.") \
	X(tokens_resident, GAUGE, "tokens", "tokens_resident", "pool", "tokens resident", "", \
	  "Tokens whose K/V are in the pool.") \
	X(slack_tokens, GAUGE, "tokens", "slack_tokens", "pool", "slack (unused slots)", "", \
	  "Unused token slots in partly filled pages.") \
	X(prefix_lookups, COUNTER, "prompts", "prefix_lookups", "prefix", "lookups", "", \
	  "Prompts looked up in the prefix cache (session turns included).") \
	X(prefix_query_tokens, COUNTER, "tokens", "prefix_query_tokens", "prefix", "tokens looked up", "", \
	  "Prompt tokens looked up in the prefix cache (session turns included).") \
	X(prefix_hit_tokens, COUNTER, "tokens", "prefix_hit_tokens", "prefix", "tokens found", "prefix_query_tokens", \
	  "Prompt tokens found in the prefix cache or a session's kept KV.") \
	X(pages_evicted, COUNTER, "pages", "pages_evicted", "prefix", "pages evicted", "", \
	  "Cached pages dropped from the pool.") \
	X(cow_copies, COUNTER, "pages", "cow_copies", "prefix", "copy-on-write copies", "", \
	  "Shared pages copied before a write (copy-on-write).") \
	X(swap_out_pages, COUNTER, "pages", "swap_out_pages", "swap", "pages written", "", \
	  "Pages written to the swap file.") \
	X(swap_in_pages, COUNTER, "pages", "swap_in_pages", "swap", "pages read back", "", \
	  "Pages read back from the swap file.") \
	X(swap_bytes, GAUGE, "bytes", "swap_bytes", "swap", "file size", "", \
	  "Capacity of the swap file.") \
	X(requests_running, GAUGE, "requests", "requests_running", "requests", "running", "", \
	  "Requests in the batch.") \
	X(requests_waiting, GAUGE, "requests", "requests_waiting", "requests", "waiting", "", \
	  "Requests waiting for admission.") \
	X(requests_swapped, GAUGE, "requests", "requests_swapped", "requests", "swapped out", "", \
	  "Requests preempted, waiting to resume.") \
	X(requests_completed, COUNTER, "requests", "requests_completed", "requests", "completed", "", \
	  "Requests finished (any way).") \
	X(requests_rejected, COUNTER, "requests", "requests_rejected", "requests", "rejected", "", \
	  "Requests refused before they ran.") \
	X(clients, GAUGE, "clients", "clients", "clients", "connected", "", \
	  "Connected clients.") \
	X(sessions, GAUGE, "sessions", "sessions", "clients", "sessions", "", \
	  "Open sessions.") \
	X(prompt_tokens_total, COUNTER, "tokens", "prompt_tokens", "work", "prompt tokens", "", \
	  "Prompt tokens of requests.") \
	X(generated_tokens_total, COUNTER, "tokens", "generated_tokens", "work", "generated tokens", "", \
	  "Tokens generated.") \
	X(steps, COUNTER, "steps", "steps", "work", "scheduler steps", "", \
	  "Scheduler steps run.") \
	X(uptime_ns, GAUGE, "ns", "uptime_seconds", "work", "uptime", "", \
	  "Seconds since the daemon started.") \
	X(ledger_records_dropped, COUNTER, "records", "ledger_records_dropped", "ledger", "records not written", "", \
	  "Ledger records that could not be written.") \
	X(swap_errors, COUNTER, "transfers", "swap_errors", "swap", "I/O errors", "", \
	  "Swap page transfers that failed.") \
	X(swap_fallback_recomputes, COUNTER, "requests", "swap_fallback_recomputes", "swap", "requests recomputed", "", \
	  "Requests whose KV was recomputed after a failed swap.") \
	X(pages_demoted, GAUGE, "pages", "pages_demoted", "swap", "cached prefix pages", "pages_swapped", \
	  "Cached prefix pages kept in the swap file (of pages_swapped).") \
	X(samples_forked, COUNTER, "sequences", "samples_forked", "requests", "samples forked", "", \
	  "Sequences forked from a computed prompt for parallel samples.") \
	X(pages_adopted, COUNTER, "pages", "pages_adopted", "prefix", "pages adopted at start", "", \
	  "Cached prefix pages adopted from the previous run at start.") \
	X(pages_packed, GAUGE, "pages", "pages_packed", "windows", "packed pages", "pages_used", \
	  "Packed pages holding released pages' global layers (of pages_used).") \
	X(pages_released, COUNTER, "pages", "pages_released", "windows", "pages released", "", \
	  "Pages windowed layers were done with, released.") \
	X(adopted_hit_tokens, COUNTER, "tokens", "adopted_hit_tokens", "prefix", "found in adopted pages", "prefix_hit_tokens", \
	  "Prompt tokens found in cached pages adopted from the previous run (of prefix_hit_tokens).") \
	X(gram_checked, COUNTER, "tokens", "constraint_fast_tokens", "grammar", "fast-path tokens", "", \
	  "Constrained tokens the greedy check alone answered (the fast path).") \
	X(gram_masked, COUNTER, "tokens", "constraint_masked_tokens", "grammar", "full-mask tokens", "", \
	  "Constrained tokens drawn over a full mask of the allowed tokens.") \
	X(spec_verify_steps, COUNTER, "steps", "spec_verify_steps", "speculation", "verify steps", "", \
	  "Decodes that carried a speculative draft, each verified in one step.") \
	X(spec_drafted_tokens, COUNTER, "tokens", "spec_drafted_tokens", "speculation", "drafted tokens", "", \
	  "Draft tokens scored by speculative decoding.") \
	X(spec_accepted_tokens, COUNTER, "tokens", "spec_accepted_tokens", "speculation", "accepted tokens", \
	  "spec_drafted_tokens", "Draft tokens accepted: emitted without a step of their own (of spec_drafted_tokens).") \
	X(spec_runs_0, COUNTER, "steps", "spec_runs_0", "speculation", "  accepting 0", "spec_verify_steps", \
	  "Verify steps that accepted none of their draft.") \
	X(spec_runs_1, COUNTER, "steps", "spec_runs_1", "speculation", "  accepting 1", "spec_verify_steps", \
	  "Verify steps that accepted 1 draft token.") \
	X(spec_runs_2_3, COUNTER, "steps", "spec_runs_2_3", "speculation", "  accepting 2-3", "spec_verify_steps", \
	  "Verify steps that accepted 2 or 3 draft tokens.") \
	X(spec_runs_4_7, COUNTER, "steps", "spec_runs_4_7", "speculation", "  accepting 4-7", "spec_verify_steps", \
	  "Verify steps that accepted 4 to 7 draft tokens.") \
	X(spec_runs_8_16, COUNTER, "steps", "spec_runs_8_16", "speculation", "  accepting 8-16", "spec_verify_steps", \
	  "Verify steps that accepted 8 to 16 draft tokens.") \
	X(spec_mode, GAUGE, "mode", "spec_mode", "speculation", "mode", "", \
	  "The drafter in use: 1 off, 2 lookup, 3 draft, 4 auto (0: a daemon before 0.10.0).") \
	X(spec_draft_pages_total, GAUGE, "pages", "spec_draft_pool_pages", "speculation", "draft model's pool", "", \
	  "Pages of the draft model's own KV pool (0: no draft model loaded).") \
	X(spec_draft_pages_used, GAUGE, "pages", "spec_draft_pool_pages_used", "speculation", "  held by drafts", \
	  "spec_draft_pages_total", "Draft-pool pages held by draft sequences (of spec_draft_pages_total).") \
	X(spec_draft_reclaims, COUNTER, "sequences", "spec_draft_reclaims", "speculation", "draft seqs reclaimed", "", \
	  "Draft sequences given up so that an owner under its share of the draft pool could draft.")

/* One row of the list, for code that walks it at run time. */
struct kvc_metric {
	const char *field;   /* the member of struct kvc_stats (and of --json) */
	int kind;            /* KVC_METRIC_GAUGE or KVC_METRIC_COUNTER */
	const char *unit;    /* "pages", "bytes", "tokens", ...; "ns": exported in seconds */
	const char *name;    /* the Prometheus name without "kvd_" and a counter's "_total" */
	const char *group;   /* kvctl stats' text table: the group the row is shown in */
	const char *label;   /* ... and its label there */
	const char *of;      /* the field this row is a part of, or "" */
	const char *help;
	size_t off;          /* offsetof(struct kvc_stats, field) */
};

#define KVC_METRIC_ROW_(f, kind, unit, name, group, label, of, help) \
	{ #f, KVC_METRIC_##kind, unit, name, group, label, of, help, offsetof(struct kvc_stats, f) },
#define KVC_METRIC_ONE_(...) +1
/* Rows in the list. */
enum { KVC_STATS_N_METRICS = 0 KVC_STATS_METRICS(KVC_METRIC_ONE_) };

/* The list as an array of KVC_STATS_N_METRICS rows (static storage). */
static inline const struct kvc_metric *kvc_metrics(void)
{
	static const struct kvc_metric rows[] = { KVC_STATS_METRICS(KVC_METRIC_ROW_) };
	return rows;
}

/* A row's value in s. */
/* A spec_mode value's name: "off", "lookup", "draft", "auto"; NULL for 0
 * (a daemon that does not say) and values this build does not know. */
static inline const char *kvc_spec_mode_name(uint64_t mode)
{
	static const char *const names[] = { NULL, "off", "lookup", "draft", "auto" };
	return mode < sizeof(names) / sizeof(names[0]) ? names[mode] : NULL;
}

static inline uint64_t kvc_metric_value(const struct kvc_metric *m, const struct kvc_stats *s)
{
	return *(const uint64_t *)(const void *)((const char *)s + m->off);
}

/* Write a Prometheus label value: backslash, double quote and newline escaped. */
static inline void kvc_metrics_label_value(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fputc('\\', f);
		if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
}

static inline void kvc_metrics_histogram_(FILE *f, const char *name, const char *help, const struct kvc_histogram *h)
{
	uint64_t cum = 0;

	fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	for (uint32_t i = 0; i < h->n_bounds && i < KVC_HIST_MAX_BOUNDS; i++) {
		cum += h->bucket[i];
		fprintf(f, "%s_bucket{le=\"%.9g\"} %" PRIu64 "\n", name, (double)h->bound_ns[i] / 1e9, cum);
	}
	cum += h->bucket[h->n_bounds < KVC_HIST_MAX_BOUNDS ? h->n_bounds : KVC_HIST_MAX_BOUNDS];
	fprintf(f, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
	fprintf(f, "%s_sum %.9f\n", name, (double)h->sum_ns / 1e9);
	fprintf(f, "%s_count %" PRIu64 "\n", name, h->count);
}

/*
 * Write kvd's metrics in Prometheus' text exposition format (0.0.4) to f:
 * kvd_info (version and model as labels, value 1), every row of the list,
 * two families for fleet routers (kvd_kv_cache_usage_perc,
 * kvd_cache_config_info), and, when h is not NULL, the histograms of time to first token and
 * inter-token latency. kvctl stats --prometheus and kvd-http's /metrics
 * both print exactly this (kvd-http adds its own kvd_http_* families and
 * kvd_up). Write errors are left in f's error indicator.
 */
static inline void kvc_metrics_prometheus(FILE *f, const struct kvc_stats *s, const struct kvc_histograms *h,
					  const struct kvc_info *i)
{
	const struct kvc_metric *m = kvc_metrics();
	unsigned v = i->server_version;

	fputs("# HELP kvd_info The daemon's version and model (always 1).\n# TYPE kvd_info gauge\n", f);
	fprintf(f, "kvd_info{version=\"%u.%u.%u\",model=\"", (v >> 16) & 0xff, (v >> 8) & 0xff, v & 0xff);
	kvc_metrics_label_value(f, i->model_name);
	fputs("\"} 1\n", f);
	for (int k = 0; k < KVC_STATS_N_METRICS; k++) {
		const char *sfx = m[k].kind == KVC_METRIC_COUNTER ? "_total" : "";
		const char *type = m[k].kind == KVC_METRIC_COUNTER ? "counter" : "gauge";
		uint64_t x = kvc_metric_value(&m[k], s);
		fprintf(f, "# HELP kvd_%s%s %s\n# TYPE kvd_%s%s %s\n", m[k].name, sfx, m[k].help, m[k].name, sfx, type);
		if (m[k].unit[0] == 'n' && m[k].unit[1] == 's' && !m[k].unit[2])
			fprintf(f, "kvd_%s%s %.3f\n", m[k].name, sfx, (double)x / 1e9);
		else
			fprintf(f, "kvd_%s%s %" PRIu64 "\n", m[k].name, sfx, x);
	}
	/* For fleet routers (the Gateway API Inference Extension's model-server
	 * protocol, which llm-d's endpoint picker reads): KVCacheUtilization as
	 * a gauge from 0 to 1, and the page size and count its prefix-cache
	 * scorer takes from a cache_config_info family. Requests waiting and
	 * running are kvd_requests_waiting and kvd_requests_running above. */
	fputs("# HELP kvd_kv_cache_usage_perc Fraction of the KV pool's pages mapped by sequences, 0 to 1 "
	      "(pages_used / pages_total).\n# TYPE kvd_kv_cache_usage_perc gauge\n", f);
	fprintf(f, "kvd_kv_cache_usage_perc %.6f\n",
		s->pages_total ? (double)s->pages_used / (double)s->pages_total : 0.0);
	fputs("# HELP kvd_cache_config_info The KV cache's page size in tokens and its number of pages (always 1).\n"
	      "# TYPE kvd_cache_config_info gauge\n", f);
	fprintf(f, "kvd_cache_config_info{block_size=\"%" PRIu64 "\",num_gpu_blocks=\"%" PRIu64 "\"} 1\n", s->block_size,
		s->pages_total);
	/* the acceptance histogram as one Prometheus histogram too: verify
	 * steps by accepted run (le: tokens), its sum the accepted tokens */
	const uint64_t runs[] = { s->spec_runs_0, s->spec_runs_1, s->spec_runs_2_3, s->spec_runs_4_7, s->spec_runs_8_16 };
	static const unsigned le[] = { 0, 1, 3, 7, 16 };
	uint64_t cum = 0;
	fputs("# HELP kvd_spec_accepted_run_tokens Draft tokens each speculative verify step accepted.\n"
	      "# TYPE kvd_spec_accepted_run_tokens histogram\n", f);
	for (unsigned k = 0; k < 5; k++) {
		cum += runs[k];
		fprintf(f, "kvd_spec_accepted_run_tokens_bucket{le=\"%u\"} %" PRIu64 "\n", le[k], cum);
	}
	fprintf(f, "kvd_spec_accepted_run_tokens_bucket{le=\"+Inf\"} %" PRIu64 "\n", cum);
	fprintf(f, "kvd_spec_accepted_run_tokens_sum %" PRIu64 "\nkvd_spec_accepted_run_tokens_count %" PRIu64 "\n",
		s->spec_accepted_tokens, cum);
	if (h) {
		kvc_metrics_histogram_(f, "kvd_time_to_first_token_seconds", "Request arrival to its first token.",
				       &h->ttft);
		kvc_metrics_histogram_(f, "kvd_inter_token_latency_seconds",
				       "Gap before each token after a request's first.", &h->itl);
	}
}

#endif
