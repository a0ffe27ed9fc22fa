/*
 * client/kvctl/ledger_report.c — kvctl ledger --report: the ledger's
 * records and the daemon's counters summed up as answers to six questions
 * an operator asks of the KV cache, a short page or one JSON object.
 *
 *   1. memory: KV bytes held and read, split by prompt length, by batch
 *      width, and the KV heads against the query heads;
 *   2. prefix sharing: hit ratios (counters and records), and the prompt
 *      tokens recomputed although the same owner's identical prefix had
 *      been cached and evicted (records' evicted_tokens.prefix_eviction);
 *   3. page slack against the KV bytes allocated;
 *   4. per KV element type: requests, KV held and read per token;
 *   5. per requester (uid): tokens evicted by cause (a prefix evicted and
 *      then recomputed counts for the uid that recomputes it: the index is
 *      scoped by owner, so it was that uid's own prefix), the recomputed
 *      prefix tokens its own allocations had evicted, whoever recomputed
 *      them (records' evicted_tokens.prefix_evicted_by), and waits;
 *   6. rejections by cause.
 *
 * Everything comes from kvc_ledger() and kvc_stats() (libkvclient only);
 * records are read with the scanner in ledger.c. What the ledger does not
 * measure is said so ("not measured"), never guessed.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvctl.h"
#include "ledger.h"

#define REPORT_PROMPT_SHORT 256u  /* prompts under this many tokens are "short" */
#define REPORT_PROMPT_LONG  1024u /* at least this many: "long" */
#define REPORT_WIDE_BATCH   1.5   /* mean sequences per step from which a request ran "batched" */
#define REPORT_SLACK_IGNORE 0.10  /* slack under this share of the KV allocated: small enough to ignore */
#define REPORT_MAX_UIDS     64u   /* requesters listed; more are summed as "others" */
#define REPORT_MAX_TYPES    8u
#define REPORT_MAX_CAUSES   16u

struct split { uint64_t n, kv_bytes, read_bytes; };

struct who {
	uint64_t uid, n, preemptions, recompute, swapped, dropped, compute_wait_ns, mem_wait_ns;
	uint64_t prefix_again; /* prompt tokens recomputed after their cached prefix was evicted */
	uint64_t prefix_caused; /* prefix_again tokens of any uid that this uid's allocations evicted */
};

struct ktype { char name[16]; uint64_t n, kv_bytes, read_bytes, generated; };

struct cause { int64_t code; uint64_t n; char example[160]; };

struct report {
	uint64_t n, done, rejected, prompt, cached, generated;
	uint64_t prefix_again, prefix_measured; /* the sum, and records that carry it (kvd 0.9.0 on) */
	/* Of prefix_again: tokens whose record names no evictor (null: an
	 * explicit drop, a tenant's allocation), and tokens of records from a
	 * kvd that did not record it (no prefix_evicted_by member). */
	uint64_t by_unknown, by_not_recorded;
	uint64_t by_recorded; /* records with prefix_again tokens that carry prefix_evicted_by */
	struct split by_len[3], by_batch[2];
	uint64_t kv_alloc, slack, kv_read, read_max;
	uint64_t kv_heads, query_heads;
	struct who who[REPORT_MAX_UIDS + 1]; /* the last: others */
	size_t n_who;
	struct ktype types[REPORT_MAX_TYPES];
	size_t n_types;
	struct cause causes[REPORT_MAX_CAUSES];
	size_t n_causes;
};

static const char *const len_names[] = { "short", "medium", "long" };
static const char *const batch_names[] = { "alone", "batched" };

static const char *cause_name(int64_t code)
{
	switch (code) {
	case KVC_ERR_CONTEXT: return "context window (prompt + max_tokens)";
	case KVC_ERR_LIMIT: return "per-client limit";
	case KVC_ERR_SESSION: return "session";
	case KVC_ERR_DENIED: return "denied";
	case KVC_ERR_SHUTDOWN: return "shutting down";
	case KVC_ERR_ENGINE: return "engine";
	case -ENOMEM: case -ENOSPC: return "KV cache (no memory for the request)";
	case -EINVAL: return "invalid request";
	default: return "other";
	}
}

static uint64_t u64_of(const char *json, const char *key)
{
	uint64_t v = 0;

	ledger_member_u64(json, key, &v);
	return v;
}

static struct who *who_of(struct report *rp, uint64_t uid)
{
	for (size_t i = 0; i < rp->n_who; i++)
		if (rp->who[i].uid == uid)
			return &rp->who[i];
	if (rp->n_who == REPORT_MAX_UIDS) {
		rp->who[REPORT_MAX_UIDS].uid = UINT64_MAX;
		return &rp->who[REPORT_MAX_UIDS];
	}
	rp->who[rp->n_who].uid = uid;
	return &rp->who[rp->n_who++];
}

static void add_rejected(struct report *rp, const char *json)
{
	double d = 0;
	int64_t code;
	size_t i;

	ledger_member_double(json, "error", &d);
	code = (int64_t)d;
	rp->rejected++;
	for (i = 0; i < rp->n_causes && rp->causes[i].code != code; i++)
		;
	if (i == rp->n_causes) {
		if (i == REPORT_MAX_CAUSES)
			i--; /* too many kinds: the last one gathers them */
		else
			rp->n_causes++;
		rp->causes[i].code = code;
		ledger_member_str(json, "reason", rp->causes[i].example, sizeof(rp->causes[i].example));
	}
	rp->causes[i].n++;
}

static void add_done(struct report *rp, const char *json, const struct kvc_stats *st)
{
	const char *kv = ledger_member(json, "kv"), *model = ledger_member(json, "model"), *ev;
	uint64_t prompt = u64_of(json, "prompt_tokens"), page_bytes = 0, held = 0, read = 0;
	char type[16] = "?";
	double width = 0;
	struct who *w;
	size_t t;

	rp->done++;
	rp->prompt += prompt;
	rp->cached += u64_of(json, "cached_tokens");
	rp->generated += u64_of(json, "generated_tokens");
	if (model && *model == '{') {
		page_bytes = u64_of(model, "page_bytes");
		ledger_member_str(model, "kv_type", type, sizeof(type));
		if (!rp->kv_heads) {
			rp->kv_heads = u64_of(model, "kv_heads");
			rp->query_heads = u64_of(model, "query_heads");
		}
	}
	if (!page_bytes) /* a record of a kvd before the "model" member: this pool's */
		page_bytes = st->page_bytes;
	if (kv && *kv == '{') {
		held = u64_of(kv, "pages_peak") * page_bytes;
		read = u64_of(kv, "kv_read_bytes");
		rp->kv_alloc += u64_of(kv, "kv_bytes_allocated");
	}
	rp->kv_read += read;
	rp->slack += u64_of(json, "slack_bytes");
	if (u64_of(json, "decode_read_bytes_max") > rp->read_max)
		rp->read_max = u64_of(json, "decode_read_bytes_max");
	struct split *s = &rp->by_len[prompt < REPORT_PROMPT_SHORT ? 0 : prompt < REPORT_PROMPT_LONG ? 1 : 2];
	*s = (struct split){ s->n + 1, s->kv_bytes + held, s->read_bytes + read };
	ledger_member_double(json, "batch_width_mean", &width);
	s = &rp->by_batch[width >= REPORT_WIDE_BATCH];
	*s = (struct split){ s->n + 1, s->kv_bytes + held, s->read_bytes + read };

	for (t = 0; t < rp->n_types && strcmp(rp->types[t].name, type) != 0; t++)
		;
	if (t < REPORT_MAX_TYPES) {
		if (t == rp->n_types) {
			rp->n_types++;
			snprintf(rp->types[t].name, sizeof(rp->types[t].name), "%s", type);
		}
		rp->types[t].n++;
		rp->types[t].kv_bytes += held;
		rp->types[t].read_bytes += read;
		rp->types[t].generated += u64_of(json, "generated_tokens");
	}

	w = who_of(rp, u64_of(json, "uid"));
	w->n++;
	w->preemptions += u64_of(json, "preemptions");
	w->compute_wait_ns += u64_of(json, "compute_wait_ns");
	if (kv && *kv == '{')
		w->mem_wait_ns += u64_of(kv, "mem_wait_ns");
	ev = ledger_member(json, "evicted_tokens");
	if (ev && *ev == '{') {
		w->recompute += u64_of(ev, "preemption_recompute");
		w->swapped += u64_of(ev, "swap");
		w->dropped += u64_of(ev, "context_drop");
		if (ledger_member(ev, "prefix_eviction")) {
			uint64_t again = u64_of(ev, "prefix_eviction");

			w->prefix_again += again;
			rp->prefix_again += again;
			rp->prefix_measured++;
			if (!again) {
				/* nothing recomputed: no evictor to name */
			} else if (ledger_member(ev, "prefix_evicted_by")) {
				uint64_t by;

				rp->by_recorded++;
				if (ledger_member_u64(ev, "prefix_evicted_by", &by))
					who_of(rp, by)->prefix_caused += again;
				else
					rp->by_unknown += again;
			} else {
				rp->by_not_recorded += again;
			}
		}
	}
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

/* Whether the evictors are known: records carry prefix_eviction, and some
 * of its tokens name an evictor or none came from an older kvd. */
static bool caused_known(const struct report *rp)
{
	return rp->prefix_measured && (rp->by_recorded || !rp->by_not_recorded);
}

static void print_split(const char *name, const struct split *s, uint64_t kv_all, uint64_t read_all)
{
	char kvb[32], rdb[32];

	fmt_bytes(kvb, sizeof(kvb), (double)s->kv_bytes);
	fmt_bytes(rdb, sizeof(rdb), (double)s->read_bytes);
	printf("    %-8s %6" PRIu64 " requests  KV held %10s (%5.1f%%)  read %10s (%5.1f%%)\n", name, s->n, kvb,
	       100 * ratio(s->kv_bytes, kv_all), rdb, 100 * ratio(s->read_bytes, read_all));
}

static void print_text(const struct report *rp, const struct kvc_stats *st)
{
	uint64_t kv_all = 0, read_all = 0;
	char b1[32], b2[32];

	for (int i = 0; i < 3; i++)
		kv_all += rp->by_len[i].kv_bytes, read_all += rp->by_len[i].read_bytes;
	printf("kvd ledger report: %" PRIu64 " records (%" PRIu64 " served, %" PRIu64 " rejected)\n\n", rp->n,
	       rp->done, rp->rejected);
	printf("1. Memory: KV held (pages at peak) and read, by cause\n");
	printf("  by prompt length (short < %u tokens <= medium < %u <= long):\n", REPORT_PROMPT_SHORT,
	       REPORT_PROMPT_LONG);
	for (int i = 0; i < 3; i++)
		print_split(len_names[i], &rp->by_len[i], kv_all, read_all);
	printf("  by batch width (batched: %.1f or more sequences per step on average):\n", REPORT_WIDE_BATCH);
	for (int i = 0; i < 2; i++)
		print_split(batch_names[i], &rp->by_batch[i], kv_all, read_all);
	if (rp->kv_heads)
		printf("  KV heads: %" PRIu64 " for %" PRIu64 " query heads: the KV is %.2fx what one KV head per query "
		       "head would hold\n", rp->kv_heads, rp->query_heads, ratio(rp->kv_heads, rp->query_heads));
	else
		printf("  KV heads: not recorded\n");
	fmt_bytes(b1, sizeof(b1), (double)rp->read_max);
	printf("  most KV one step of a request read: %s\n\n", b1);

	printf("2. Prefix sharing\n");
	printf("  prefix cache (daemon counters): %" PRIu64 " of %" PRIu64 " looked-up tokens hit (%.1f%%)\n",
	       st->prefix_hit_tokens, st->prefix_query_tokens, 100 * ratio(st->prefix_hit_tokens, st->prefix_query_tokens));
	printf("  these records: %" PRIu64 " of %" PRIu64 " prompt tokens came from cache (%.1f%%)\n", rp->cached,
	       rp->prompt, 100 * ratio(rp->cached, rp->prompt));
	if (rp->prefix_measured)
		printf("  tokens recomputed although an identical prefix had been cached and evicted: %" PRIu64
		       " (%.1f%% of prompt tokens; pages evicted: %" PRIu64 ")%s\n\n", rp->prefix_again,
		       100 * ratio(rp->prefix_again, rp->prompt), st->pages_evicted,
		       rp->prefix_measured < rp->done ? " (records from an older kvd not counted)" : "");
	else
		printf("  tokens recomputed although an identical prefix had been cached and evicted: not measured "
		       "(pages evicted: %" PRIu64 ")\n\n", st->pages_evicted);

	fmt_bytes(b1, sizeof(b1), (double)rp->slack);
	fmt_bytes(b2, sizeof(b2), (double)rp->kv_alloc);
	printf("3. Page slack\n  %s of %s allocated at the requests' ends (%.1f%%): %s\n", b1, b2,
	       100 * ratio(rp->slack, rp->kv_alloc),
	       ratio(rp->slack, rp->kv_alloc) < REPORT_SLACK_IGNORE ? "small enough to ignore" : "not negligible");
	printf("  pool now: %" PRIu64 " slack slots for %" PRIu64 " resident tokens\n\n", st->slack_tokens,
	       st->tokens_resident);

	printf("4. KV element types\n");
	for (size_t i = 0; i < rp->n_types; i++) {
		const struct ktype *t = &rp->types[i];

		fmt_bytes(b1, sizeof(b1), ratio(t->kv_bytes, t->n));
		fmt_bytes(b2, sizeof(b2), ratio(t->read_bytes, t->generated));
		printf("  %-6s %6" PRIu64 " requests, KV held %s per request, read %s per generated token\n", t->name,
		       t->n, b1, b2);
	}
	printf("  quality per type: not in the ledger; the evaluation reports measure it (docs/eval/, bench/eval/report.py)\n\n");

	printf("5. Evictions by requester (tokens)\n");
	printf("  %10s %6s %11s %12s %14s %14s %8s %12s %14s %12s\n", "UID", "REQS", "PREEMPTIONS", "RECOMPUTED",
	       "PREFIX_AGAIN", "PREFIX_CAUSED", "SWAPPED", "CTX_DROPPED", "COMPUTE_WAIT_MS", "MEM_WAIT_MS");
	for (size_t i = 0; i <= rp->n_who; i++) {
		const struct who *w = &rp->who[i];
		char uid[24], caused[24] = "-";

		if (i == rp->n_who && !((i == REPORT_MAX_UIDS && w->n) || w->prefix_caused))
			break;
		if (w->uid == UINT64_MAX)
			snprintf(uid, sizeof(uid), "others");
		else
			snprintf(uid, sizeof(uid), "%" PRIu64, w->uid);
		if (caused_known(rp))
			snprintf(caused, sizeof(caused), "%" PRIu64, w->prefix_caused);
		printf("  %10s %6" PRIu64 " %11" PRIu64 " %12" PRIu64 " %14" PRIu64 " %14s %8" PRIu64 " %12" PRIu64
		       " %14.1f %12.1f\n", uid, w->n, w->preemptions, w->recompute, w->prefix_again, caused, w->swapped,
		       w->dropped, (double)w->compute_wait_ns / 1e6, (double)w->mem_wait_ns / 1e6);
	}
	printf("  RECOMPUTED: K/V dropped by a preemption and computed again; PREFIX_AGAIN: prompt tokens\n"
	       "  computed again because the requester's identical cached prefix had been evicted;\n"
	       "  PREFIX_CAUSED: PREFIX_AGAIN tokens of any requester (itself included) whose prefix this\n"
	       "  uid's allocations evicted\n");
	if (rp->prefix_measured && !caused_known(rp))
		printf("  PREFIX_CAUSED: not recorded (records from an older kvd)\n");
	else if (rp->prefix_measured)
		printf("  PREFIX_AGAIN tokens with no requester as evictor (explicit drops, tenants): %" PRIu64 "\n",
		       rp->by_unknown);
	if (rp->by_not_recorded)
		printf("  PREFIX_AGAIN tokens whose evictor is not recorded (records from an older kvd): %" PRIu64 "\n",
		       rp->by_not_recorded);
	printf("\n6. Rejections by cause\n");
	if (!rp->n_causes)
		printf("  none\n");
	for (size_t i = 0; i < rp->n_causes; i++)
		printf("  %6" PRIu64 "  %s (code %" PRId64 "), e.g. \"%s\"\n", rp->causes[i].n,
		       cause_name(rp->causes[i].code), rp->causes[i].code, rp->causes[i].example);
	printf("  the model's weights are loaded at start: no request is refused for them\n");
}

static void json_split(const char *name, const struct split *s, bool last)
{
	printf("\"%s\":{\"requests\":%" PRIu64 ",\"kv_bytes\":%" PRIu64 ",\"read_bytes\":%" PRIu64 "}%s", name, s->n,
	       s->kv_bytes, s->read_bytes, last ? "" : ",");
}

static void print_json(const struct report *rp, const struct kvc_stats *st)
{
	printf("{\"records\":%" PRIu64 ",\"served\":%" PRIu64 ",\"rejected\":%" PRIu64 ",", rp->n, rp->done,
	       rp->rejected);
	printf("\"memory\":{\"by_prompt_length\":{");
	for (int i = 0; i < 3; i++)
		json_split(len_names[i], &rp->by_len[i], i == 2);
	printf("},\"by_batch_width\":{");
	for (int i = 0; i < 2; i++)
		json_split(batch_names[i], &rp->by_batch[i], i == 1);
	printf("},\"kv_heads\":%" PRIu64 ",\"query_heads\":%" PRIu64 ",\"read_bytes_max_step\":%" PRIu64 "},",
	       rp->kv_heads, rp->query_heads, rp->read_max);
	printf("\"prefix\":{\"lookup_tokens\":%" PRIu64 ",\"hit_tokens\":%" PRIu64 ",\"hit_ratio\":%.4f,"
	       "\"prompt_tokens\":%" PRIu64 ",\"cached_tokens\":%" PRIu64 ",\"record_hit_ratio\":%.4f,"
	       "\"recomputed_after_eviction_tokens\":", st->prefix_query_tokens, st->prefix_hit_tokens,
	       ratio(st->prefix_hit_tokens, st->prefix_query_tokens), rp->prompt, rp->cached, ratio(rp->cached, rp->prompt));
	if (rp->prefix_measured)
		printf("%" PRIu64, rp->prefix_again);
	else
		printf("null");
	printf(",\"pages_evicted\":%" PRIu64 ",\"evictor_unknown_tokens\":", st->pages_evicted);
	if (caused_known(rp))
		printf("%" PRIu64, rp->by_unknown);
	else
		printf("null");
	printf(",\"evictor_not_recorded_tokens\":%" PRIu64 "},", rp->by_not_recorded);
	printf("\"slack\":{\"slack_bytes\":%" PRIu64 ",\"kv_bytes_allocated\":%" PRIu64 ",\"ratio\":%.4f,\"ignorable\":%s},",
	       rp->slack, rp->kv_alloc, ratio(rp->slack, rp->kv_alloc),
	       ratio(rp->slack, rp->kv_alloc) < REPORT_SLACK_IGNORE ? "true" : "false");
	printf("\"kv_types\":[");
	for (size_t i = 0; i < rp->n_types; i++)
		printf("%s{\"kv_type\":\"%s\",\"requests\":%" PRIu64 ",\"kv_bytes\":%" PRIu64 ",\"read_bytes\":%" PRIu64
		       ",\"generated_tokens\":%" PRIu64 "}", i ? "," : "", rp->types[i].name, rp->types[i].n,
		       rp->types[i].kv_bytes, rp->types[i].read_bytes, rp->types[i].generated);
	printf("],\"requesters\":[");
	for (size_t i = 0, k = 0; i <= rp->n_who; i++) {
		const struct who *w = &rp->who[i];

		if (i == rp->n_who && !((i == REPORT_MAX_UIDS && w->n) || w->prefix_caused))
			break;
		printf("%s{\"uid\":", k++ ? "," : "");
		if (w->uid == UINT64_MAX)
			printf("null");
		else
			printf("%" PRIu64, w->uid);
		printf(",\"requests\":%" PRIu64 ",\"preemptions\":%" PRIu64 ",\"recompute_tokens\":%" PRIu64
		       ",\"prefix_eviction_tokens\":%" PRIu64 ",\"swap_tokens\":%" PRIu64 ",\"context_drop_tokens\":%" PRIu64
		       ",\"compute_wait_ns\":%" PRIu64 ",\"mem_wait_ns\":%" PRIu64, w->n, w->preemptions, w->recompute,
		       w->prefix_again, w->swapped, w->dropped, w->compute_wait_ns, w->mem_wait_ns);
		if (caused_known(rp))
			printf(",\"prefix_evictions_caused_tokens\":%" PRIu64 "}", w->prefix_caused);
		else
			printf(",\"prefix_evictions_caused_tokens\":null}");
	}
	printf("],\"rejections\":[");
	for (size_t i = 0; i < rp->n_causes; i++) {
		printf("%s{\"code\":%" PRId64 ",\"cause\":\"%s\",\"count\":%" PRIu64 ",\"example\":", i ? "," : "",
		       rp->causes[i].code, cause_name(rp->causes[i].code), rp->causes[i].n);
		json_str(stdout, rp->causes[i].example, strlen(rp->causes[i].example));
		printf("}");
	}
	printf("]}\n");
}

int ledger_report(const struct kvc_ledger_record *recs, size_t n, uint64_t since_ns, const struct kvc_stats *st,
		  bool json)
{
	struct report *rp = calloc(1, sizeof(*rp));
	char finish[16];

	if (!rp)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const char *j = recs[i].json;

		if (u64_of(j, "time_ns") < since_ns)
			continue;
		rp->n++;
		finish[0] = 0;
		ledger_member_str(j, "finish", finish, sizeof(finish));
		if (strcmp(finish, "rejected") == 0)
			add_rejected(rp, j);
		else
			add_done(rp, j, st);
	}
	if (json)
		print_json(rp, st);
	else
		print_text(rp, st);
	free(rp);
	return 0;
}
