/*
 * client/examples/kvc_hello.c — the smallest libkvclient program: connect
 * to kvd, stream the answer to a question to stdout through a callback,
 * and report how long the first token took.
 *
 *     cc kvc_hello.c $(pkg-config --cflags --libs kvclient) -o kvc_hello
 *     ./kvc_hello "Why is the sky blue?"
 */
#include <errno.h>
#include <stdio.h>

#include <kvclient.h>

static int on_token(void *userdata, const struct kvc_event *ev)
{
	(void)userdata;
	fwrite(ev->text, 1, ev->text_len, stdout);
	fflush(stdout);
	return 0; /* non-zero would cancel the generation */
}

int main(int argc, char **argv)
{
	const char *prompt = argc > 1 ? argv[1] : "Write a haiku about memory pages.";
	kvc_client *c;
	int r = kvc_connect(NULL, &c); /* $KVD_SOCKET, else /run/kvd/kvd.sock */
	if (r < 0) {
		fprintf(stderr, "kvc_hello: cannot connect to kvd: %s\n", kv_strerror(r));
		return 1;
	}

	struct kvc_gen_params p;
	kvc_gen_params_init(&p);
	p.max_tokens = 128;
	p.temperature = 0; /* greedy: the same answer every time */

	struct kvc_result res;
	r = kvc_generate(c, prompt, KVC_NTS, &p, on_token, NULL, &res);
	putchar('\n');
	if (r < 0)
		fprintf(stderr, "kvc_hello: %s%s%s\n", kv_strerror(r), r != -ECANCELED && res.error_message[0] ? ": " : "",
			r != -ECANCELED ? res.error_message : "");
	else
		fprintf(stderr, "[%u prompt tokens (%u cached), %u generated, first token after %.1f ms, %s]\n",
			res.prompt_tokens, res.cached_tokens, res.generated_tokens, res.ttft_ns / 1e6,
			kvc_finish_name(res.finish_reason));
	kvc_close(c);
	return r < 0;
}
