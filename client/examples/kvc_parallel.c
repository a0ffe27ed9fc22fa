/*
 * client/examples/kvc_parallel.c — several generations at once on one
 * connection with the blocking-read API, then the KV-cache statistics.
 *
 * Each argument is a prompt; all are sent before any answer is read, so
 * kvd batches them (continuous batching) and, since they share the same
 * system prompt, stores that prefix's KV pages once. The system prompt is
 * several KV pages long (about 80 tokens with the chat template; a page
 * holds 16 tokens by default): only full pages are shared, so a prefix
 * shorter than one page would never show it. Each answer's line says how
 * many of its prompt tokens came from the cache, and the page counts taken
 * while the requests run show the shared pages. Answers are printed one
 * after the other: events of a request wait in its own queue until it is
 * read. Ctrl-C cancels every request.
 *
 *     cc kvc_parallel.c $(pkg-config --cflags --libs kvclient) -o kvc_parallel
 *     ./kvc_parallel "Name a color." "Name a fruit." "Name a planet."
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <kvclient.h>

#define MAX_REQ 16

static kvc_client *volatile g_client;
static volatile uint64_t g_ids[MAX_REQ];

static void on_sigint(int sig)
{
	(void)sig;
	for (int i = 0; i < MAX_REQ; i++)
		if (g_ids[i])
			kvc_cancel(g_client, g_ids[i]); /* async-signal-safe */
}

int main(int argc, char **argv)
{
	kvc_request *req[MAX_REQ];
	int n = argc - 1 < MAX_REQ ? argc - 1 : MAX_REQ;
	kvc_client *c;
	int r;

	if (n < 1) {
		fprintf(stderr, "usage: kvc_parallel PROMPT...\n");
		return 2;
	}
	if ((r = kvc_connect(NULL, &c)) < 0) {
		fprintf(stderr, "kvc_parallel: cannot connect to kvd: %s\n", kv_strerror(r));
		return 1;
	}
	g_client = c;
	signal(SIGINT, on_sigint);

	struct kvc_gen_params p;
	kvc_gen_params_init(&p);
	p.max_tokens = 64;
	p.system = "You are a concise assistant for a trivia game. Answer every question in one short "
		   "sentence of at most ten words. Do not explain the answer, do not add greetings, lists "
		   "or follow-up questions, and never repeat the question. If you do not know, say so in "
		   "three words. Use plain words that a child understands: no jargon and no emoji.";
	if ((unsigned)n > kvc_server_info(c)->max_requests)
		n = (int)kvc_server_info(c)->max_requests;
	for (int i = 0; i < n; i++) {
		if ((r = kvc_request_start(c, argv[i + 1], KVC_NTS, &p, &req[i])) < 0) {
			fprintf(stderr, "kvc_parallel: %s: %s\n", argv[i + 1], kv_strerror(r));
			n = i;
			break;
		}
		g_ids[i] = kvc_request_id(req[i]);
	}

	int failed = 0;
	struct kvc_stats st;
	bool seen = false;
	for (int i = 0; i < n; i++) {
		const struct kvc_event *ev;
		printf("> %s\n", argv[i + 1]);
		while ((r = kvc_request_next(req[i], &ev)) == 1) {
			fwrite(ev->text, 1, ev->text_len, stdout);
			/* once the first answer streams, the others are running too */
			if (!seen && kvc_stats(c, &st) == 0)
				seen = true;
		}
		const struct kvc_result *res = kvc_request_result(req[i]);
		if (r < 0 && r != -ECANCELED) {
			failed = 1;
			printf("\n[failed: %s%s%s]\n", kv_strerror(r), res && res->error_message[0] ? ": " : "",
			       res ? res->error_message : "");
		} else if (res) {
			printf("\n[%s; %u of %u prompt tokens were cached]\n", kvc_finish_name(res->finish_reason),
			       res->cached_tokens, res->prompt_tokens);
		}
		if (i == 0 && seen)
			printf("[while the %d requests ran: %llu KV pages used, %llu of them shared]\n", n,
			       (unsigned long long)st.pages_used, (unsigned long long)st.pages_shared);
		g_ids[i] = 0;
		kvc_request_finish(req[i]);
	}

	if ((r = kvc_stats(c, &st)) == 0)
		printf("KV pool: %llu pages, %llu used (%llu shared), %llu cached, %llu free; prefix hits %llu of %llu tokens\n",
		       (unsigned long long)st.pages_total, (unsigned long long)st.pages_used,
		       (unsigned long long)st.pages_shared, (unsigned long long)st.pages_cached,
		       (unsigned long long)st.pages_free, (unsigned long long)st.prefix_hit_tokens,
		       (unsigned long long)st.prefix_query_tokens);
	kvc_close(c);
	return failed;
}
