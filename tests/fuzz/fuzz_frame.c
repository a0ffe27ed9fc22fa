/*
 * tests/fuzz/fuzz_frame.c — libFuzzer target for kvd's wire format
 * (ipc/frame.c): the header check and every payload decoder, as the
 * server runs them on a client's socket frames and ring records and as
 * libkvclient runs them on the server's.
 *
 * Input: one selector byte (bit 0: sent by the server rather than the
 * client; bit 1: via the ring rather than the socket; bits 2-3: the number
 * of fds that came with it), then the frame. The frame is copied into a
 * buffer of exactly its size, so a decoder reading past the payload is an
 * ASan error. Promises checked: a frame that passes ipc_frame_check has the
 * length it claims and a type allowed in that direction and transport;
 * every pointer a decoder returns lies inside the payload with the length
 * it states; a decoded GENERATE re-encodes (ipc_encode_generate) to the
 * same bytes; decoded fields respect the limits in ipc.h.
 */
#include <errno.h>
#include <math.h>

#include "ipc.h"
#include "fuzz_util.h"

static const uint8_t *pay_lo, *pay_hi;

static void in_payload(const void *p, uint64_t len)
{
	const uint8_t *q = p;
	CHECK(q >= pay_lo && q <= pay_hi && len <= (uint64_t)(pay_hi - q));
}

static void decode(const struct ipc_frame *f, const uint8_t *frame, size_t n)
{
	int r;

	switch (f->hdr.type) {
	case IPC_MSG_HELLO: {
		struct ipc_hello h;
		if (ipc_decode_hello(f, &h) == 0) {
			CHECK(!(h.capabilities & ~IPC_CAP_ALL));
			CHECK(memchr(h.client_name, 0, sizeof(h.client_name)) != NULL);
		}
		break;
	}
	case IPC_MSG_WELCOME: {
		struct ipc_welcome w;
		if (ipc_decode_welcome(f, &w) == 0) {
			CHECK(w.max_text_bytes <= IPC_MAX_TEXT_BYTES && w.max_gen_tokens <= IPC_MAX_GEN_TOKENS);
			CHECK(memchr(w.model_name, 0, sizeof(w.model_name)) != NULL);
		}
		break;
	}
	case IPC_MSG_GENERATE: {
		struct ipc_generate_msg m;
		if (ipc_decode_generate(f, &m) < 0)
			break;
		CHECK(m.g.max_tokens >= 1 && m.g.max_tokens <= IPC_MAX_GEN_TOKENS);
		CHECK(isfinite(m.g.temperature) && m.g.n_stop <= IPC_MAX_STOP_STRINGS);
		in_payload(m.system, m.g.system_bytes);
		for (unsigned i = 0; i < m.g.n_stop; i++) {
			CHECK(m.stop_len[i] >= 1 && m.stop_len[i] <= IPC_MAX_STOP_BYTES);
			in_payload(m.stop[i], m.stop_len[i]);
		}
		if (m.g.gen_flags & IPC_GEN_PROMPT_IN_RING) {
			CHECK(m.prompt == NULL && m.g.prompt_bytes > 0);
		} else {
			CHECK(m.g.prompt_bytes <= IPC_MAX_INLINE_TEXT_BYTES);
			in_payload(m.prompt, m.g.prompt_bytes);
			/* an inline turn list was checked whole with the frame */
			if (m.g.gen_flags & IPC_GEN_CHAT_TURNS)
				CHECK(ipc_chat_turns_check(m.prompt, m.g.prompt_bytes) >= 1);
		}
		if (m.g.gen_flags & IPC_GEN_CHAT_TURNS)
			CHECK(!(m.g.gen_flags & IPC_GEN_RAW) && m.g.system_bytes == 0 && m.g.session_id == 0);
		/* a constraint's block is in form, its inline text inside the frame */
		if (m.g.gen_flags & IPC_GEN_CONSTRAINT) {
			CHECK(ipc_gen_constraint_check(&m.cons) == 0);
			if (m.g.gen_flags & IPC_GEN_PROMPT_IN_RING)
				CHECK(m.cons_text == NULL);
			else
				in_payload(m.cons_text, m.cons.text_bytes);
		} else {
			CHECK(m.cons.kind == 0 && m.cons_text == NULL);
		}
		/* The client's encoder produces exactly these bytes. */
		static uint8_t buf[IPC_MAX_FRAME_BYTES];
		ssize_t len = ipc_encode_generate(buf, sizeof(buf), f->hdr.request_id, &m);
		CHECK(len == (ssize_t)n && memcmp(buf, frame, n) == 0);
		break;
	}
	case IPC_MSG_PROMPT_DATA: {
		struct ipc_prompt_data_msg m;
		if (ipc_decode_prompt_data(f, &m) == 0) {
			CHECK(m.bytes >= 1 && (uint64_t)m.offset + m.bytes <= IPC_MAX_TEXT_BYTES);
			in_payload(m.data, m.bytes);
		}
		break;
	}
	case IPC_MSG_TOKEN: {
		struct ipc_token_msg m;
		if (ipc_decode_token(f, &m) == 0) {
			CHECK(m.t.n_tokens >= 1 && m.t.n_tokens <= IPC_MAX_TOKENS_PER_RECORD);
			in_payload(m.ids, 4ull * m.t.n_ids);
			in_payload(m.text, m.t.text_bytes);
			for (uint32_t i = 0; i < m.t.n_ids; i++)
				(void)ipc_token_id(&m, i);
		}
		break;
	}
	case IPC_MSG_DONE: {
		struct ipc_done d;
		if (ipc_decode_done(f, &d) == 0) {
			CHECK(d.finish_reason >= IPC_FINISH_EOS && d.finish_reason <= IPC_FINISH_ERROR);
			CHECK(strcmp(ipc_finish_name(d.finish_reason), "?") != 0);
			CHECK(d.error == 0 || ipc_error_code_valid(d.error));
		}
		break;
	}
	case IPC_MSG_ERROR: {
		struct ipc_error_msg m;
		if (ipc_decode_error(f, &m) == 0) {
			CHECK(ipc_error_code_valid(m.code) && m.msg_bytes <= IPC_MAX_ERROR_MSG_BYTES);
			in_payload(m.msg, m.msg_bytes);
		}
		break;
	}
	case IPC_MSG_STATS_REPLY: {
		struct ipc_stats s;
		if (ipc_decode_stats(f, &s) == 0)
			CHECK(s.pages_free <= s.pages_total && s.pages_shared <= s.pages_used);
		break;
	}
	case IPC_MSG_TOKENIZE: {
		struct ipc_tokenize_msg m;
		if (ipc_decode_tokenize(f, &m) == 0) {
			if (m.t.tok_flags & IPC_TOK_TEXT_IN_RING)
				CHECK(m.text == NULL && m.t.text_bytes > 0);
			else
				in_payload(m.text, m.t.text_bytes);
		}
		break;
	}
	case IPC_MSG_TOKENIZE_REPLY: {
		struct ipc_tokenize_reply_msg m;
		if (ipc_decode_tokenize_reply(f, &m) == 0) {
			CHECK((uint64_t)m.r.offset + m.r.n_ids <= m.r.n_tokens);
			in_payload(m.ids, 4ull * m.r.n_ids);
			for (uint32_t i = 0; i < m.r.n_ids; i++)
				(void)ipc_reply_id(&m, i);
		}
		break;
	}
	case IPC_MSG_SESSION_OPEN: {
		struct ipc_session_open s;
		struct ipc_gen_context c;
		if (ipc_decode_session_open_ctx(f, &s, &c) == 0) {
			/* only the context flag, and its block exactly when flagged */
			CHECK((s.flags & ~IPC_SESSION_CONTEXT) == 0);
			CHECK(f->hdr.length == sizeof(s) + (s.flags & IPC_SESSION_CONTEXT ? sizeof(c) : 0));
			CHECK(ipc_gen_context_check(&c) == 0);
		}
		break;
	}
	case IPC_MSG_SESSION_OPENED:
	case IPC_MSG_SESSION_CLOSE:
	case IPC_MSG_SESSION_CLOSED: {
		struct ipc_session s;
		if (ipc_decode_session(f, &s) == 0)
			CHECK(s.session_id != 0);
		break;
	}
	case IPC_MSG_PING:
	case IPC_MSG_PONG: {
		struct ipc_ping p;
		r = ipc_decode_ping(f, &p);
		CHECK(r == 0);
		break;
	}
	case IPC_MSG_PS_REPLY: {
		struct ipc_ps_reply_msg m;
		if (ipc_decode_ps_reply(f, &m) == 0) {
			CHECK(m.r.n_entries <= m.r.n_total && m.r.n_entries <= IPC_MAX_PS_PER_FRAME);
			in_payload(m.entries, (uint64_t)m.r.n_entries * sizeof(struct ipc_ps_entry));
			for (uint32_t i = 0; i < m.r.n_entries; i++) {
				struct ipc_ps_entry e;
				ipc_ps_entry_at(&m, i, &e);
				CHECK(strcmp(ipc_req_state_name(e.state), "?") != 0);
			}
		}
		break;
	}
	case IPC_MSG_KVMAP_REPLY: {
		struct ipc_kvmap k;
		if (ipc_decode_kvmap(f, &k) == 0)
			CHECK(k.n_pages > 0 && k.page_words_offset + 4ull * k.n_pages <= k.file_bytes &&
			      k.word_slots_used < k.n_words);
		break;
	}
	case IPC_MSG_HIST_REPLY: {
		struct ipc_hist_reply h;
		if (ipc_decode_hist(f, &h) == 0)
			CHECK(h.ttft.n_bounds <= IPC_HIST_MAX_BOUNDS && h.itl.n_bounds <= IPC_HIST_MAX_BOUNDS);
		break;
	}
	case IPC_MSG_LEDGER: {
		struct ipc_ledger_req q;
		if (ipc_decode_ledger_req(f, &q) == 0)
			CHECK(q.max_records <= IPC_LEDGER_MAX_RECORDS && q.flags == 0);
		break;
	}
	case IPC_MSG_LEDGER_REPLY: {
		struct ipc_ledger_reply_msg m;
		if (ipc_decode_ledger_reply(f, &m) == 0) {
			struct ipc_ledger_record rec;
			size_t off = 0;
			uint32_t k = 0;
			while (ipc_ledger_record_next(&m, &off, &rec) == 1) {
				in_payload(rec.json, rec.bytes);
				CHECK(rec.bytes > 0 && !memchr(rec.json, '\n', rec.bytes));
				k++;
			}
			CHECK(k == m.r.n_records);
		}
		break;
	}
	case IPC_MSG_CACHE: {
		struct ipc_cache_req q;
		if (ipc_decode_cache_req(f, &q) == 0)
			CHECK((q.op == IPC_CACHE_SAVE || q.op == IPC_CACHE_DROP) && q.flags == 0);
		break;
	}
	case IPC_MSG_CACHE_REPLY: {
		struct ipc_cache_reply r;
		if (ipc_decode_cache_reply(f, &r) == 0)
			CHECK(r.reserved == 0 && r.file_removed <= 1 && (r.op != IPC_CACHE_SAVE || r.pages <= r.candidates));
		break;
	}
	default: /* CANCEL, STATS, PS, KVMAP, HIST: no payload to decode */
		CHECK(f->hdr.length == 0);
		break;
	}
}

static void write_seeds(const char *dir);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *dir = getenv("KVD_FUZZ_WRITE_SEEDS");
	if (dir && *dir) {
		write_seeds(dir);
		exit(0);
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	unsigned sel = data[0];
	unsigned from = (sel & 1) ? IPC_FROM_SERVER : IPC_FROM_CLIENT;
	unsigned via = (sel & 2) ? IPC_VIA_RING : IPC_VIA_SOCKET;
	unsigned n_fds = (sel >> 2) & 3;
	size_t n = size - 1;

	/* Exactly n bytes (malloc's alignment is 16), so ASan sees any read
	 * past the frame. */
	uint8_t *frame = malloc(n ? n : 1);
	if (!frame)
		return 0;
	memcpy(frame, data + 1, n);
	struct ipc_frame f = { .payload = frame + IPC_HDR_BYTES, .n_fds = 0 };
	int r = ipc_frame_check(frame, n, n_fds, from, via, &f.hdr);
	CHECK(r <= 0);
	CHECK(ipc_type_name(f.hdr.type) != NULL);
	if (r == 0) {
		CHECK(f.hdr.magic == IPC_MAGIC && f.hdr.version == IPC_PROTO_VERSION);
		CHECK(n >= IPC_HDR_BYTES && f.hdr.length == n - IPC_HDR_BYTES && n <= IPC_MAX_FRAME_BYTES);
		CHECK(strcmp(ipc_type_name(f.hdr.type), "?") != 0);
		pay_lo = f.payload;
		pay_hi = f.payload + f.hdr.length;
		decode(&f, frame, n);
	} else {
		CHECK(r == -EBADMSG || r == -EPROTONOSUPPORT || r == -ENOMSG || r == -EPROTO || r == -E2BIG ||
		      r == -ETOOMANYREFS);
	}
	free(frame);
	return 0;
}

/* ---- seeds: one well-formed frame of every type (KVD_FUZZ_WRITE_SEEDS=DIR) */

static void seed(const char *dir, const char *name, unsigned sel, uint16_t type, uint32_t flags, const void *p1,
		 size_t n1, const void *p2, size_t n2)
{
	static uint8_t buf[IPC_MAX_FRAME_BYTES];
	char path[4096];
	struct iovec iov[2] = { { (void *)p1, n1 }, { (void *)p2, n2 } };
	ssize_t n = ipc_frame_build(buf, sizeof(buf), type, flags, 7, iov, 2);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *fp = fopen(path, "wb");
	if (n < 0 || !fp)
		exit(1);
	fputc((int)sel, fp);
	fwrite(buf, 1, (size_t)n, fp);
	fclose(fp);
}

#define C_SOCK 0u
#define S_SOCK 1u
#define C_RING 2u
#define S_RING 3u

static void write_seeds(const char *dir)
{
	static uint8_t buf[IPC_MAX_FRAME_BYTES];
	struct ipc_hello h = { 0x000100, IPC_CAP_RING_PROMPT, "kvctl" };
	seed(dir, "hello", C_SOCK, IPC_MSG_HELLO, 0, &h, sizeof(h), NULL, 0);
	struct ipc_welcome w = { .server_version = 0x100, .capabilities = IPC_CAP_SESSIONS, .client_id = 3,
				 .n_vocab = 49152, .n_ctx = 8192, .block_size = 16, .max_text_bytes = 1 << 20,
				 .max_requests = 16, .max_gen_tokens = 8192, .shm_bytes = 1 << 20, .model_name = "m" };
	seed(dir, "welcome", S_SOCK | 3u << 2, IPC_MSG_WELCOME, 0, &w, sizeof(w), NULL, 0);
	struct ipc_generate_msg m = { .g = { .gen_flags = IPC_GEN_WANT_IDS, .max_tokens = 32, .temperature = 0.7f,
					     .top_p = 0.9f, .min_p = 0.05f, .repeat_penalty = 1.1f, .top_k = 40,
					     .repeat_last_n = 64, .seed = 1, .prompt_bytes = 5, .system_bytes = 4,
					     .n_stop = 2 } };
	m.system = "Sys.";
	m.prompt = "Hello";
	m.stop[0] = "\n\n";
	m.stop_len[0] = 2;
	m.stop[1] = "User:";
	m.stop_len[1] = 5;
	ssize_t n = ipc_encode_generate(buf, sizeof(buf), 7, &m);
	if (n < 0)
		exit(1);
	seed(dir, "generate", C_SOCK, IPC_MSG_GENERATE, 0, buf + IPC_HDR_BYTES, (size_t)n - IPC_HDR_BYTES, NULL, 0);
	m.g.gen_flags = IPC_GEN_PROMPT_IN_RING | IPC_GEN_RAW;
	m.g.system_bytes = 0;
	m.g.prompt_bytes = 100000;
	m.g.n_stop = 0;
	n = ipc_encode_generate(buf, sizeof(buf), 7, &m);
	if (n < 0)
		exit(1);
	seed(dir, "generate-ring", C_SOCK, IPC_MSG_GENERATE, 0, buf + IPC_HDR_BYTES, (size_t)n - IPC_HDR_BYTES, NULL, 0);
	static const struct ipc_chat_turn turns[] = { { IPC_CHAT_SYSTEM, 4, "Sys." }, { IPC_CHAT_USER, 2, "Hi" },
						      { IPC_CHAT_ASSISTANT, 3, "Yo." }, { IPC_CHAT_USER, 5, "Again" } };
	static char tl[128];
	ssize_t tn = ipc_chat_turns_encode(tl, sizeof(tl), turns, 4);
	m.g.gen_flags = IPC_GEN_CHAT_TURNS;
	m.g.prompt_bytes = (uint32_t)tn;
	m.prompt = tl;
	n = ipc_encode_generate(buf, sizeof(buf), 7, &m);
	if (tn < 0 || n < 0)
		exit(1);
	seed(dir, "generate-turns", C_SOCK, IPC_MSG_GENERATE, 0, buf + IPC_HDR_BYTES, (size_t)n - IPC_HDR_BYTES, NULL, 0);
	m.g.gen_flags = IPC_GEN_CONSTRAINT | IPC_GEN_PRIORITY;
	m.prio.priority = -2;
	m.cons = (struct ipc_gen_constraint){ .kind = IPC_CONSTRAINT_JSON_SCHEMA, .text_bytes = 17 };
	m.cons_text = "{\"type\":\"object\"}";
	m.prompt = "Hello";
	m.g.prompt_bytes = 5;
	n = ipc_encode_generate(buf, sizeof(buf), 7, &m);
	if (n < 0)
		exit(1);
	seed(dir, "generate-constraint", C_SOCK, IPC_MSG_GENERATE, 0, buf + IPC_HDR_BYTES, (size_t)n - IPC_HDR_BYTES, NULL,
	     0);
	m.g.gen_flags = IPC_GEN_CONSTRAINT | IPC_GEN_PROMPT_IN_RING;
	n = ipc_encode_generate(buf, sizeof(buf), 7, &m);
	if (n < 0)
		exit(1);
	seed(dir, "generate-constraint-ring", C_SOCK, IPC_MSG_GENERATE, 0, buf + IPC_HDR_BYTES, (size_t)n - IPC_HDR_BYTES,
	     NULL, 0);
	struct ipc_prompt_data pd = { 10, 5 };
	seed(dir, "prompt-data", C_RING, IPC_MSG_PROMPT_DATA, 0, &pd, sizeof(pd), "abcde", 5);
	struct {
		struct ipc_token t;
		int32_t ids[2];
	} tk = { { 4, 2, 2, 3 }, { 100, 200 } };
	seed(dir, "token", S_RING, IPC_MSG_TOKEN, 0, &tk, sizeof(tk), "a b", 3);
	struct ipc_done d = { .finish_reason = IPC_FINISH_ERROR, .error = IPC_ERR_ENGINE, .prompt_tokens = 5,
			      .cached_tokens = 2, .generated_tokens = 3 };
	seed(dir, "done", S_RING, IPC_MSG_DONE, 0, &d, sizeof(d), NULL, 0);
	seed(dir, "cancel", C_SOCK, IPC_MSG_CANCEL, 0, NULL, 0, NULL, 0);
	struct ipc_error e = { -EINVAL, 6 };
	seed(dir, "error", S_SOCK, IPC_MSG_ERROR, 0, &e, sizeof(e), "no way", 6);
	seed(dir, "stats", C_SOCK, IPC_MSG_STATS, 0, NULL, 0, NULL, 0);
	struct ipc_stats st = { .pages_total = 10, .pages_free = 4, .pages_used = 6, .pages_shared = 1 };
	seed(dir, "stats-reply", S_SOCK, IPC_MSG_STATS_REPLY, 0, &st, sizeof(st), NULL, 0);
	struct ipc_tokenize tz = { IPC_TOK_ADD_BOS | IPC_TOK_PARSE_SPECIAL, 5 };
	seed(dir, "tokenize", C_SOCK, IPC_MSG_TOKENIZE, 0, &tz, sizeof(tz), "hello", 5);
	struct {
		struct ipc_tokenize_reply r;
		int32_t ids[3];
	} tr = { { 10, 4, 3, 0 }, { 1, 2, 3 } };
	seed(dir, "tokenize-reply", S_SOCK, IPC_MSG_TOKENIZE_REPLY, IPC_F_MORE, &tr, sizeof(tr), NULL, 0);
	struct ipc_session_open so = { 0, 60 };
	seed(dir, "session-open", C_SOCK, IPC_MSG_SESSION_OPEN, 0, &so, sizeof(so), NULL, 0);
	struct ipc_session ss = { 9 };
	seed(dir, "session-opened", S_SOCK, IPC_MSG_SESSION_OPENED, 0, &ss, sizeof(ss), NULL, 0);
	seed(dir, "session-close", C_SOCK, IPC_MSG_SESSION_CLOSE, 0, &ss, sizeof(ss), NULL, 0);
	struct ipc_ping pg = { 12345 };
	seed(dir, "ping", C_SOCK, IPC_MSG_PING, 0, &pg, sizeof(pg), NULL, 0);
	seed(dir, "ps", C_SOCK, IPC_MSG_PS, 0, NULL, 0, NULL, 0);
	struct {
		struct ipc_ps_reply r;
		struct ipc_ps_entry e;
	} ps = { { 1, 1 }, { .request_id = 1, .client_id = 2, .state = IPC_REQ_RUNNING, .pages = 3, .pages_shared = 1,
			     .prompt_tokens = 10, .cached_tokens = 5 } };
	seed(dir, "ps-reply", S_SOCK, IPC_MSG_PS_REPLY, 0, &ps, sizeof(ps), NULL, 0);
	seed(dir, "kvmap", C_SOCK, IPC_MSG_KVMAP, 0, NULL, 0, NULL, 0);
	struct ipc_kvmap km = { .file_bytes = 8192, .seq_offset = 64, .words_offset = 128, .page_words_offset = 1024,
				.page_bytes = 4096, .n_pages = 100, .block_size = 16, .n_words = 64,
				.swap_slots = 10, .word_slots_used = 5, .word_pages_demoted = 4 };
	seed(dir, "kvmap-reply", S_SOCK | (1u << 2), IPC_MSG_KVMAP_REPLY, 0, &km, sizeof(km), NULL, 0);
	seed(dir, "hist", C_SOCK, IPC_MSG_HIST, 0, NULL, 0, NULL, 0);
	struct ipc_hist_reply hr = { .ttft = { .n_bounds = 2, .count = 3, .bound_ns = { 10, 20 }, .bucket = { 1, 1, 1 } },
				     .itl = { .n_bounds = 1, .bound_ns = { 5 } } };
	seed(dir, "hist-reply", S_SOCK, IPC_MSG_HIST_REPLY, 0, &hr, sizeof(hr), NULL, 0);
	struct ipc_ledger_req lq = { .max_records = 10 };
	seed(dir, "ledger", C_SOCK, IPC_MSG_LEDGER, 0, &lq, sizeof(lq), NULL, 0);
	struct {
		struct ipc_ledger_reply r;
		uint32_t uid, bytes;
		char json[8];
	} lr = { { 1, 1 }, 1000, 7, "{\"a\":1}" };
	seed(dir, "ledger-reply", S_SOCK, IPC_MSG_LEDGER_REPLY, 0, &lr, sizeof(lr), NULL, 0);
	struct ipc_cache_req cq = { .op = IPC_CACHE_SAVE };
	seed(dir, "cache", C_SOCK, IPC_MSG_CACHE, 0, &cq, sizeof(cq), NULL, 0);
	struct ipc_cache_reply cr = { .op = IPC_CACHE_SAVE, .pages = 3, .candidates = 4, .bytes = 1 << 20, .ns = 1000 };
	seed(dir, "cache-reply", S_SOCK, IPC_MSG_CACHE_REPLY, 0, &cr, sizeof(cr), NULL, 0);
}
