/*
 * daemon/model/unicode.h — the little Unicode kvd's tokenizer needs: lenient
 * UTF-8 decoding and per-code-point class flags (letter, number,
 * punctuation, white space), for pre-tokenizers written by hand instead of
 * with a regex engine.
 *
 * Classes come from generated range tables (daemon/model/unicode_tables.c,
 * made by scripts/gen_unicode_tables.py); everything here is const data and
 * pure functions, safe from any thread. Private to daemon/model/.
 */
#ifndef KVD_UNICODE_H
#define KVD_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* General-category classes, as stored in the tables. */
enum {
	KVD_UCLASS_OTHER = 0, /* C*, Z*, unassigned */
	KVD_UCLASS_L = 1,     /* letters */
	KVD_UCLASS_N = 2,     /* numbers */
	KVD_UCLASS_P = 3,     /* punctuation */
	KVD_UCLASS_M = 4,     /* marks */
	KVD_UCLASS_S = 5,     /* symbols */
};

struct kvd_urange {
	uint32_t first, last; /* inclusive */
	uint8_t uclass;
};

extern const char kvd_unicode_version[];
extern const uint8_t kvd_uclass_latin1[256];
extern const struct kvd_urange kvd_uclass_ranges[];
extern const size_t kvd_uclass_n_ranges;

/* Flag bits returned by kvd_unicode_flags(). */
#define KVD_CPF_LETTER 0x01u /* \p{L} */
#define KVD_CPF_NUMBER 0x02u /* \p{N} */
#define KVD_CPF_PUNCT  0x04u /* \p{P} */
#define KVD_CPF_SPACE  0x08u /* \s: Unicode White_Space */
#define KVD_CPF_MARK   0x10u /* \p{M} */
#define KVD_CPF_SYMBOL 0x20u /* \p{S} */
#define KVD_CPF_CP     0x80u /* set for every code point <= U+10FFFF */

/* Class (KVD_UCLASS_*) of a code point; OTHER beyond U+10FFFF. */
unsigned kvd_unicode_class(uint32_t cp);

/* Flags (KVD_CPF_*) of a code point; 0 beyond U+10FFFF. */
unsigned kvd_unicode_flags(uint32_t cp);

/*
 * Decode one character of s[0..n), n >= 1, the lenient way tokenizers do:
 * the lead byte gives the length, continuation bytes must be 10xxxxxx and
 * present; overlong forms and surrogates are accepted as the value they
 * spell. Returns the length (1..4) and stores the code point. An invalid
 * byte (stray continuation, bad lead, truncated sequence) returns 1 and
 * stores U+FFFD, the way the byte is classified.
 */
size_t kvd_utf8_decode_lenient(const unsigned char *s, size_t n, uint32_t *ret_cp);

/*
 * Strict decoding for output (RFC 3629): returns the length of a complete
 * valid character at s[0..n) and stores it; 0 when s[0..n) is a valid but
 * incomplete prefix of a character (more bytes may complete it); or
 * -(length of the maximal invalid subpart, >= 1) for an invalid sequence,
 * which the caller replaces with one U+FFFD.
 */
int kvd_utf8_decode_strict(const unsigned char *s, size_t n, uint32_t *ret_cp);

/* Encode cp (<= U+10FFFF) into out[0..4); returns the length. */
size_t kvd_utf8_encode(uint32_t cp, char *out);

/* The value of hexadecimal digit c (either case), or -1. */
static inline int kvd_hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

#endif /* KVD_UNICODE_H */
