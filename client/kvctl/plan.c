/*
 * client/kvctl/plan.c — kvctl plan: the KV-cache capacity bill of a model
 * (bytes per token, per page, per request, and how many sequences fit a
 * budget), for the daemon's model or for one described on the command line.
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

/* ---- plan ---------------------------------------------------------------------------------------- */

static const char help_plan[] =
	"NAME\n"
	"    kvctl plan - the KV-cache capacity bill of a model\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl plan [--context N] [--memory SIZE] [--json]\n"
	"    kvctl plan --layers N --kv-heads N --head-dim N [--dtype-bytes B | --cache-type T]\n"
	"               [--block-size N] [--context N] [--memory SIZE]\n"
	"               [--window W --global-layers G] [--json]\n"
	"\n"
	"DESCRIPTION\n"
	"    Every token a sequence holds costs, in every layer, one key and one value\n"
	"    vector per KV head:\n"
	"\n"
	"        KV bytes per token = 2 x layers x kv_heads x head_dim x bytes_per_element\n"
	"\n"
	"    kvd stores them in pages of block-size tokens, allocated as a sequence grows,\n"
	"    so a request of C tokens of context holds ceil(C / block) pages, and a memory\n"
	"    budget M holds floor(M / page bytes) pages, i.e. that many pages divided by\n"
	"    the pages of one request concurrent sequences at full length. Models with\n"
	"    grouped-query attention (fewer KV heads than attention heads) are cheaper,\n"
	"    and so are quantized caches ([kv] cache_type): q8_0 and q4_0 keep blocks of\n"
	"    32 elements in 34 and 18 bytes (8 or 4 bits each and one 16-bit scale).\n"
	"\n"
	"    Without the model options, the figures are those of the model loaded in kvd,\n"
	"    the context defaults to its context length and the budget to its KV pool.\n"
	"    With --layers, --kv-heads and --head-dim no daemon is needed; the context\n"
	"    then defaults to 4096 and, without --memory, budgets of 1, 4, 16 and 64 GiB\n"
	"    are shown.\n"
	"\n"
	"    Models whose other layers attend over a window of W positions (Gemma 3: five\n"
	"    local layers of six, W = 512) need less: kvd releases a page once every\n"
	"    windowed layer is done with it ([kv] release_local) and keeps only the G\n"
	"    global layers' share, layers / G pages' worth packed into one page. A request\n"
	"    of C tokens then holds the pages of its last W tokens whole, r = floor((C -\n"
	"    W) / block) released ones in ceil(r / floor(layers / G)) packed pages (none\n"
	"    when G is 0), as it finishes; while a prompt is computed it holds one\n"
	"    prefill step of whole pages more.\n"
	"\n"
	"OPTIONS\n"
	"    --layers N       transformer layers\n"
	"    --kv-heads N     key/value heads per layer\n"
	"    --head-dim N     dimension of one head\n"
	"    --dtype-bytes B  bytes per K or V element: 2 for F16/BF16 (default), 4 for F32,\n"
	"                     1 for 8-bit caches\n"
	"    --cache-type T   instead of --dtype-bytes: kvd's KV element type, f16, bf16,\n"
	"                     f32, q8_0 (34 bytes per 32 elements) or q4_0 (18 per 32)\n"
	"    --block-size N   tokens per page (default 16, or the daemon's)\n"
	"    --context N      tokens of context per request (prompt + generated)\n"
	"    --memory SIZE    memory for the KV cache: bytes, or with a K, M, G or T suffix\n"
	"                     (powers of 1024; KiB, MB and the like are accepted too)\n"
	"    --window W       with --global-layers: the window of the windowed layers\n"
	"    --global-layers G  layers without a window (0: every layer has one)\n"
	"    --json           print {\"kv_bytes_per_token\", \"cache_type\", \"page_bytes\", \"block_size\",\n"
	"                     \"context_tokens\", \"pages_per_request\", \"released_pages\",\n"
	"                     \"packed_pages\",\n"
	"                     \"bytes_per_request\", \"budgets\": [{\"memory_bytes\",\n"
	"                     \"pages\", \"sequences\"}...]}\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl plan\n"
	"    kvctl plan --context 32768\n"
	"    kvctl plan --layers 32 --kv-heads 8 --head-dim 128 --context 8192 --memory 24G\n"
	"    kvctl plan --layers 30 --kv-heads 3 --head-dim 64 --cache-type q8_0 --memory 256M\n"
	"    kvctl plan --layers 18 --kv-heads 1 --head-dim 256 --window 512 --global-layers 3 \\\n"
	"               --context 32768 --memory 1G\n";

/* kvd's KV element types, as libkvclient knows them (kvc_kv_type(), from
 * the wire's list in ipc/ipc.h): bytes per block of 32 elements. By size
 * alone, the first match names a daemon's type (f16 before bf16); rows 0
 * and 1 are f16 and f32 (the plain --dtype-bytes 2 and 4). */
#define PLAN_MAX_TYPES 16
struct cache_type {
	const char *name;
	uint32_t bytes_per_32;
};

static size_t cache_types_load(struct cache_type out[PLAN_MAX_TYPES])
{
	uint32_t be, bb;
	size_t n = 0;

	for (const char *name; n < PLAN_MAX_TYPES && (name = kvc_kv_type((unsigned)n, &be, &bb)); n++)
		out[n] = (struct cache_type){ name, be && 32 % be == 0 ? bb * (32 / be) : 0 };
	return n;
}

const char *kv_cache_type_name(uint64_t kv_bytes_per_token, uint32_t layers, uint32_t kv_heads, uint32_t head_dim)
{
	struct cache_type cache_types[PLAN_MAX_TYPES];
	size_t n_types = cache_types_load(cache_types);
	uint64_t elems = (uint64_t)2 * layers * kv_heads * head_dim;
	for (size_t k = 0; elems && k < n_types; k++)
		if (cache_types[k].bytes_per_32 && elems * cache_types[k].bytes_per_32 == kv_bytes_per_token * 32)
			return cache_types[k].name;
	return NULL;
}

static int cmd_plan(struct ctx *x, int argc, char **argv)
{
	enum { O_LAYERS = OPT_FIRST_CMD, O_KVH, O_HDIM, O_DTYPE, O_BLOCK, O_CTX, O_MEM, O_JSON, O_CTYPE, O_WIN, O_GLOB };
	static const struct option longopts[] = {
		{ "layers", required_argument, NULL, O_LAYERS },
		{ "kv-heads", required_argument, NULL, O_KVH },
		{ "head-dim", required_argument, NULL, O_HDIM },
		{ "dtype-bytes", required_argument, NULL, O_DTYPE },
		{ "block-size", required_argument, NULL, O_BLOCK },
		{ "context", required_argument, NULL, O_CTX },
		{ "memory", required_argument, NULL, O_MEM },
		{ "json", no_argument, NULL, O_JSON },
		{ "cache-type", required_argument, NULL, O_CTYPE },
		{ "window", required_argument, NULL, O_WIN },
		{ "global-layers", required_argument, NULL, O_GLOB },
		COMMON_LONGOPTS,
		{ 0 },
	};
	const char *cmd = "plan";
	uint32_t layers = 0, kvh = 0, hdim = 0, dtype = 0, block = 0, ctx = 0, window = 0, glob = 0;
	bool glob_given = false;
	uint64_t mem = 0;
	bool json = false;
	int o, r, ctype = -1; /* index in cache_types, -1: none named */
	struct cache_type cache_types[PLAN_MAX_TYPES];
	size_t n_types = cache_types_load(cache_types);
	char daemon_type[8] = "";

	while ((o = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		if ((r = common_opt(x, cmd, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		uint32_t *dst = NULL;
		const char *name = NULL;
		switch (o) {
		case 'h':
			fputs(help_plan, stdout);
			return EXIT_OK;
		case O_LAYERS: dst = &layers; name = "--layers"; break;
		case O_KVH: dst = &kvh; name = "--kv-heads"; break;
		case O_HDIM: dst = &hdim; name = "--head-dim"; break;
		case O_DTYPE: dst = &dtype; name = "--dtype-bytes"; break;
		case O_BLOCK: dst = &block; name = "--block-size"; break;
		case O_CTX: dst = &ctx; name = "--context"; break;
		case O_WIN: dst = &window; name = "--window"; break;
		case O_GLOB:
			if (!parse_u32(optarg, &glob) || glob > (1u << 24))
				return usage_error(cmd, "--global-layers: '%s' is not an integer in 0..16777216", optarg);
			glob_given = true;
			break;
		case O_MEM:
			if (!parse_size(optarg, &mem) || mem == 0)
				return usage_error(cmd, "--memory: '%s' is not a size (e.g. 512M, 24G)", optarg);
			break;
		case O_JSON:
			json = true;
			break;
		case O_CTYPE:
			for (size_t i = 0; i < n_types; i++)
				if (!strcmp(optarg, cache_types[i].name))
					ctype = (int)i;
			if (ctype < 0)
				return usage_error(cmd, "--cache-type: '%s' is not f16, bf16, f32, q8_0 or q4_0", optarg);
			break;
		default:
			return option_error(cmd, argv, o);
		}
		if (dst && (!parse_u32(optarg, dst) || *dst == 0 || *dst > (1u << 24)))
			return usage_error(cmd, "%s: '%s' is not an integer in 1..16777216", name, optarg);
	}
	if (optind < argc)
		return usage_error(cmd, "unexpected argument '%s'", argv[optind]);

	bool given = layers || kvh || hdim;
	if (!window != !glob_given)
		return usage_error(cmd, "--window and --global-layers go together");
	if (window && !given)
		return usage_error(cmd, "--window and --global-layers need --layers, --kv-heads and --head-dim");
	if (window && glob >= layers)
		return usage_error(cmd, "--global-layers %u: a windowed model has fewer global layers than its %u layers",
				   glob, layers);
	uint64_t daemon_per_token = 0; /* the daemon's exact figure, scales included */
	char model[80] = "";
	if (given) {
		if (!layers || !kvh || !hdim)
			return usage_error(cmd, "--layers, --kv-heads and --head-dim go together");
		if (dtype && ctype >= 0)
			return usage_error(cmd, "--dtype-bytes and --cache-type exclude each other");
		if (ctype >= 0 && cache_types[ctype].bytes_per_32 % 32 && hdim % 32)
			return usage_error(cmd, "--cache-type %s needs a head dimension that is a multiple of 32",
					   cache_types[ctype].name);
		if (ctype >= 0)
			dtype = (cache_types[ctype].bytes_per_32 + 31) / 32;
		if (!dtype)
			dtype = 2;
		if (!block)
			block = 16;
		if (!ctx)
			ctx = 4096;
		snprintf(model, sizeof(model), "given");
	} else {
		if (dtype || ctype >= 0)
			return usage_error(cmd, "--dtype-bytes and --cache-type need --layers, --kv-heads and --head-dim");
		kvc_client *c;
		if ((r = connect_daemon(x, &c)) != 0)
			return r;
		const struct kvc_info *i = kvc_server_info(c);
		layers = i->n_layers;
		kvh = i->n_kv_heads;
		hdim = i->head_dim;
		dtype = i->kv_dtype_bytes;
		daemon_per_token = i->kv_bytes_per_token;
		snprintf(daemon_type, sizeof(daemon_type), "%s", i->kv_cache_type);
		if (!block)
			block = i->block_size;
		if (!ctx)
			ctx = i->n_ctx;
		if (!mem)
			mem = i->pool_bytes;
		snprintf(model, sizeof(model), "%s", i->model_name);
		kvc_close(c);
		if (!layers || !kvh || !hdim || !dtype || !block || !ctx) {
			log_err("plan: the daemon did not describe its model's KV layout");
			return EXIT_FAIL;
		}
	}

	/* All factors are at most 2^24 and the product is kept in 128 bits'
	 * worth of checks: overflow is reported, never wrapped. */
	uint64_t per_token, page_bytes, pages_per_req, req_bytes, elems;
	uint32_t b32 = ctype >= 0 ? cache_types[ctype].bytes_per_32 : dtype * 32;
	if (__builtin_mul_overflow((uint64_t)2 * layers * kvh, (uint64_t)hdim, &elems) ||
	    __builtin_mul_overflow(elems, (uint64_t)b32, &per_token)) {
		log_err("plan: these figures overflow 64 bits");
		return EXIT_USAGE;
	}
	per_token /= 32;
	if (daemon_per_token) {
		/* the daemon's cache type: the one it names (0.5.0), else the
		 * first whose size it reports (f16 and bf16 cost the same) */
		per_token = daemon_per_token;
		for (size_t k = 0; k < n_types; k++)
			if (daemon_type[0] ? !strcmp(daemon_type, cache_types[k].name)
					   : ctype < 0 && elems * cache_types[k].bytes_per_32 == per_token * 32)
				ctype = (int)k;
	}
	if (ctype < 0) /* a plain element size: name it when it is one of kvd's */
		ctype = dtype == 2 ? 0 : dtype == 4 ? 1 : -1;
	const char *tname = ctype >= 0 ? cache_types[ctype].name : "";
	bool blocked = ctype >= 0 && cache_types[ctype].bytes_per_32 % 32;
	if (__builtin_mul_overflow(per_token, (uint64_t)block, &page_bytes)) {
		log_err("plan: these figures overflow 64 bits");
		return EXIT_USAGE;
	}
	pages_per_req = ((uint64_t)ctx + block - 1) / block;
	/* windowed layers: what a request holds as it finishes (see the help) */
	uint64_t released = 0, packed = 0;
	if (window && (uint64_t)ctx >= (uint64_t)window + block) {
		released = ((uint64_t)ctx - window) / block;
		packed = glob ? (released + layers / glob - 1) / (layers / glob) : 0;
		pages_per_req = pages_per_req - released + packed;
	}
	if (__builtin_mul_overflow(pages_per_req, page_bytes, &req_bytes)) {
		log_err("plan: these figures overflow 64 bits");
		return EXIT_USAGE;
	}
	uint64_t budgets[4];
	size_t n_budgets = 0;
	if (mem)
		budgets[n_budgets++] = mem;
	else
		for (int k = 0; k < 4; k++)
			budgets[n_budgets++] = (1ull << 30) << (2 * k);

	char b1[32], b2[32], b3[32];
	if (json) {
		printf("{\"model\":");
		json_str(stdout, model, strlen(model));
		printf(",\"cache_type\":\"%s\"", tname);
		/* bytes per element: a block type's share of its block (q8_0: 34 bytes
		 * for 32 elements, 1.0625), not a rounded whole byte */
		printf(",\"layers\":%u,\"kv_heads\":%u,\"head_dim\":%u,\"dtype_bytes\":%.6g,\"kv_bytes_per_token\":%" PRIu64
		       ",\"block_size\":%u,\"page_bytes\":%" PRIu64 ",\"context_tokens\":%u,\"pages_per_request\":%" PRIu64
		       ",\"bytes_per_request\":%" PRIu64 ",\"released_pages\":%" PRIu64 ",\"packed_pages\":%" PRIu64
		       ",\"budgets\":[",
		       layers, kvh, hdim, ctype >= 0 ? cache_types[ctype].bytes_per_32 / 32.0 : (double)dtype, per_token, block, page_bytes, ctx, pages_per_req, req_bytes, released, packed);
		for (size_t k = 0; k < n_budgets; k++) {
			uint64_t pages = budgets[k] / page_bytes;
			printf("%s{\"memory_bytes\":%" PRIu64 ",\"pages\":%" PRIu64 ",\"sequences\":%" PRIu64 "}",
			       k ? "," : "", budgets[k], pages, pages / pages_per_req);
		}
		printf("]}\n");
	} else {
		fmt_bytes(b1, sizeof(b1), (double)per_token);
		printf("model              %s\n", model);
		if (blocked)
			printf("KV per token       2 x %u layers x %u KV heads x %u dims x %u/32 bytes (%s) = %" PRIu64
			       " B (%s)\n", layers, kvh, hdim, cache_types[ctype].bytes_per_32, tname, per_token, b1);
		else
			printf("KV per token       2 x %u layers x %u KV heads x %u dims x %u bytes%s%s%s = %" PRIu64 " B (%s)\n",
			       layers, kvh, hdim, dtype, tname[0] ? " (" : "", tname, tname[0] ? ")" : "", per_token, b1);
		fmt_bytes(b1, sizeof(b1), (double)page_bytes);
		printf("page               %u %s = %" PRIu64 " B (%s)\n", block, block == 1 ? "token" : "tokens", page_bytes, b1);
		fmt_bytes(b1, sizeof(b1), (double)req_bytes);
		fmt_bytes(b2, sizeof(b2), (double)ctx * (double)per_token);
		printf("per request        %u %s -> %" PRIu64 " %s = %s", ctx, ctx == 1 ? "token" : "tokens", pages_per_req,
		       pages_per_req == 1 ? "page" : "pages", b1);
		if (window)
			printf(" (%" PRIu64 " of %" PRIu64 " pages released, their %u global %s in %" PRIu64 " packed)",
			       released, ((uint64_t)ctx + block - 1) / block, glob, glob == 1 ? "layer" : "layers", packed);
		else if ((uint64_t)ctx != pages_per_req * block) /* the last page is partly empty */
			printf(" (%s hold tokens)", b2);
		fputc('\n', stdout);
		for (size_t k = 0; k < n_budgets; k++) {
			uint64_t pages = budgets[k] / page_bytes;
			fmt_bytes(b3, sizeof(b3), (double)budgets[k]);
			uint64_t seqs = pages / pages_per_req;
			printf("%-18s %s -> %" PRIu64 " %s -> %" PRIu64 " %s of %u %s\n", k == 0 ? "budget" : "", b3, pages,
			       pages == 1 ? "page" : "pages", seqs, seqs == 1 ? "sequence" : "sequences", ctx,
			       ctx == 1 ? "token" : "tokens");
		}
	}
	return fflush(stdout) != 0 ? EXIT_IO : EXIT_OK;
}

const struct kvctl_command kvctl_cmd_plan = {
	"plan", "the KV-cache capacity bill: bytes per token, per request, and\n"
		"               how many sequences fit a memory budget",
	cmd_plan, help_plan,
};
