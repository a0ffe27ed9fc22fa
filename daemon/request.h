/*
 * daemon/request.h — the text of a request, in one place.
 *
 * The scheduler deals only in tokens; everything that turns text into
 * tokens and tokens back into text is here: the tokens of a chat turn
 * through the model's template, tokenizing a raw prompt, and, for the stream a client sees,
 * detokenizing each sampled token (holding back an incomplete UTF-8
 * character) and applying the request's stop strings (holding back text
 * that could be the start of one). The server owns one kvd_request per
 * generation and feeds it the tokens the scheduler reports; the answer
 * (continue or stop) goes back to the scheduler.
 *
 * The tokenizer is borrowed and must outlive every kvd_request made from
 * it. A kvd_request belongs to one thread.
 */
#ifndef KVD_REQUEST_H
#define KVD_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "sched.h"

struct kvd_tokenizer;
struct kvd_request;

/*
 * Tokenize text[0..len) into a fresh array (*ret, freed by the caller with
 * free()). With add_bos the model's BOS token is prepended when the model
 * asks for one; with parse_special the texts of control tokens are matched
 * as those tokens. Returns the number of tokens (*ret is set even for 0),
 * or -ENOMEM, -E2BIG past KVD_TOKENIZE_MAX_BYTES, -EINVAL; *ret untouched
 * on failure.
 */
int kvd_request_tokenize(const struct kvd_tokenizer *tok, const char *text, size_t len, int add_bos,
			 int parse_special, size_t upto, int32_t **ret);
/* upto for the three functions here: KVD_REQUEST_ALL tokenizes the whole
 * text; a limit stops once more than upto tokens are known to be needed
 * (kvd_tokenize_upto, KVD_CHAT_UPTO_MAX), returning then a lower bound
 * > upto, so a prompt far over the context costs about the context. */
#define KVD_REQUEST_ALL SIZE_MAX

/*
 * The prompt tokens of one chat turn in a fresh array (*ret, freed by the
 * caller with free()), made by kvd_chat_tokenize(): the template's markers
 * are the only control tokens, the system and user texts stay text
 * whatever they spell. A first turn (continuation 0) is the model's
 * template over [system], user, ending with the assistant's header, with
 * the model's BOS when it asks for one. A later turn of a session
 * continues a sequence that ends with the assistant's last token
 * (last_token, or -1 when not known): it is what the template puts between
 * the end of an assistant message and the next assistant header, then the
 * user's turn, with the end-of-turn token the model already produced not
 * repeated, and no BOS. Returns the number of tokens, -ENOTSUP for a
 * template that is not recognised or lacks its marker tokens, -EINVAL
 * (NULL user), -E2BIG, -ENOMEM; on failure why[0 .. why_cap) (may be NULL)
 * says what was wrong and *ret is untouched.
 */
int kvd_request_chat_turn(const struct kvd_tokenizer *tok, const char *system, const char *user,
			  int continuation, int32_t last_token, size_t upto, int32_t **ret, char *why, size_t why_cap);

/*
 * The prompt tokens of a request that carries its conversation as chat
 * turns (IPC_GEN_CHAT_TURNS): turns[0 .. len) is the list of records
 * described in ipc/ipc.h, checked here in full (it may have come through
 * the upload ring unchecked). Every turn goes through kvd_chat_tokenize()
 * (markers as tokens, contents as text), the prompt ending where the
 * assistant's reply begins, with the model's BOS when it asks for one, in a
 * fresh array (*ret, freed by the caller). Because the tokens of earlier
 * turns do not depend on later ones, a conversation re-sent with one more
 * turn shares its earlier tokens (and so its prefix-cache pages) with the
 * last request. Returns the number of tokens, or -EBADMSG / -EPROTO /
 * -EINVAL / -E2BIG for a malformed list (see ipc_chat_turns_check),
 * -ENOTSUP for a template that is not recognised or lacks its marker
 * tokens, -ENOMEM; on failure why[0 .. why_cap) (may be NULL) says what was
 * wrong, for the client's error message.
 */
int kvd_request_chat_turns(const struct kvd_tokenizer *tok, const char *turns, size_t len, size_t upto, int32_t **ret,
			   char *why, size_t why_cap);

/* The raw bytes token stands for, as a log-probability entry names it
 * (byte-level pieces decoded, possibly part of a UTF-8 character; a control
 * token's text), cut to cap bytes. Returns the length, -EINVAL for an id
 * out of range. */
int kvd_request_token_piece(const struct kvd_tokenizer *tok, int32_t token, char *buf, size_t cap);

/* True when token ends generation for this model (the predicate a
 * scheduler's is_eog wants). */
int kvd_request_is_eog(const struct kvd_tokenizer *tok, int32_t token);

/*
 * A request's output stream: its stop strings (copied; n_stops 0: none)
 * and its detokenizer. Returns 0, -E2BIG for more than
 * KVD_SAMPLER_MAX_STOPS strings or one longer than KVD_SAMPLER_MAX_STOP_LEN,
 * -EINVAL for an empty one, -ENOMEM; *ret untouched on failure.
 */
int kvd_request_new(const struct kvd_tokenizer *tok, const char *const *stops, size_t n_stops,
		    struct kvd_request **ret);
/* Accepts NULL; returns NULL. */
struct kvd_request *kvd_request_free(struct kvd_request *rq);

/*
 * One sampled token, as the scheduler's on_token reports it (`ending` as
 * there). Sets *ret_text / *ret_len to the text that token releases to the
 * client — possibly nothing while a multi-byte character or a possible
 * stop string is held back; valid until the next call. When the stream
 * ends with this token (ending EOS or LENGTH, or a stop string completes)
 * everything held back is released, except a stop string and what follows
 * it, and an end-of-generation token adds no text of its own (a text token
 * ending with EOS — a completed constraint — adds its text). Returns
 * KVD_TOKEN_STOP when a stop string has completed (the text then ends just
 * before it; feed nothing more), else KVD_TOKEN_CONTINUE.
 */
enum kvd_token_verdict kvd_request_token(struct kvd_request *rq, int32_t token, enum kvd_finish ending,
					 const char **ret_text, size_t *ret_len);

#endif
