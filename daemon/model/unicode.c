/*
 * daemon/model/unicode.c — code point classes and UTF-8 coding for the
 * tokenizer (contracts in unicode.h).
 *
 * Classes: a direct table for U+0000..U+00FF, a binary search over the
 * generated ranges above. White space is the Unicode White_Space property,
 * listed here because it is not a general category (U+0085 and U+00A0 are
 * spaces to \s but Cc/Zs to the categories).
 */
#include "unicode.h"

unsigned kvd_unicode_class(uint32_t cp)
{
	if (cp < 256)
		return kvd_uclass_latin1[cp];
	if (cp > 0x10FFFF)
		return KVD_UCLASS_OTHER;
	size_t lo = 0, hi = kvd_uclass_n_ranges;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct kvd_urange *r = &kvd_uclass_ranges[mid];
		if (cp < r->first)
			hi = mid;
		else if (cp > r->last)
			lo = mid + 1;
		else
			return r->uclass;
	}
	return KVD_UCLASS_OTHER;
}

static int is_white_space(uint32_t cp)
{
	if (cp <= 0x20)
		return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
	if (cp < 0x85)
		return 0;
	switch (cp) {
	case 0x0085: case 0x00A0: case 0x1680: case 0x2028: case 0x2029:
	case 0x202F: case 0x205F: case 0x3000:
		return 1;
	default:
		return cp >= 0x2000 && cp <= 0x200A;
	}
}

unsigned kvd_unicode_flags(uint32_t cp)
{
	static const uint8_t class_flag[] = {
		[KVD_UCLASS_OTHER] = 0,
		[KVD_UCLASS_L] = KVD_CPF_LETTER,
		[KVD_UCLASS_N] = KVD_CPF_NUMBER,
		[KVD_UCLASS_P] = KVD_CPF_PUNCT,
		[KVD_UCLASS_M] = KVD_CPF_MARK,
		[KVD_UCLASS_S] = KVD_CPF_SYMBOL,
	};
	if (cp > 0x10FFFF)
		return 0;
	unsigned f = KVD_CPF_CP | class_flag[kvd_unicode_class(cp)];
	if (is_white_space(cp))
		f |= KVD_CPF_SPACE;
	return f;
}

size_t kvd_utf8_decode_lenient(const unsigned char *s, size_t n, uint32_t *ret_cp)
{
	unsigned b0 = s[0];
	size_t len;
	uint32_t cp;

	if (b0 < 0x80) {
		*ret_cp = b0;
		return 1;
	}
	if ((b0 & 0xE0) == 0xC0) {
		len = 2;
		cp = b0 & 0x1F;
	} else if ((b0 & 0xF0) == 0xE0) {
		len = 3;
		cp = b0 & 0x0F;
	} else if ((b0 & 0xF8) == 0xF0) {
		len = 4;
		cp = b0 & 0x07;
	} else {
		goto invalid; /* continuation byte or 0xF8.. as lead */
	}
	if (len > n)
		goto invalid;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xC0) != 0x80)
			goto invalid;
		cp = (cp << 6) | (s[i] & 0x3F);
	}
	*ret_cp = cp;
	return len;
invalid:
	*ret_cp = 0xFFFD;
	return 1;
}

int kvd_utf8_decode_strict(const unsigned char *s, size_t n, uint32_t *ret_cp)
{
	unsigned b0 = s[0];
	size_t len;
	unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
	uint32_t cp;

	if (b0 < 0x80) {
		*ret_cp = b0;
		return 1;
	}
	if (b0 >= 0xC2 && b0 <= 0xDF) {
		len = 2;
		cp = b0 & 0x1F;
	} else if (b0 >= 0xE0 && b0 <= 0xEF) {
		len = 3;
		cp = b0 & 0x0F;
		if (b0 == 0xE0)
			lo = 0xA0; /* no overlongs */
		else if (b0 == 0xED)
			hi = 0x9F; /* no surrogates */
	} else if (b0 >= 0xF0 && b0 <= 0xF4) {
		len = 4;
		cp = b0 & 0x07;
		if (b0 == 0xF0)
			lo = 0x90;
		else if (b0 == 0xF4)
			hi = 0x8F; /* <= U+10FFFF */
	} else {
		return -1;
	}
	for (size_t i = 1; i < len; i++) {
		if (i >= n)
			return 0; /* valid so far, incomplete */
		unsigned b = s[i];
		unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
		if (b < l || b > h)
			return -(int)i;
		cp = (cp << 6) | (b & 0x3F);
	}
	*ret_cp = cp;
	return (int)len;
}

size_t kvd_utf8_encode(uint32_t cp, char *out)
{
	unsigned char *o = (unsigned char *)out;
	if (cp < 0x80) {
		o[0] = (unsigned char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (unsigned char)(0xC0 | (cp >> 6));
		o[1] = (unsigned char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (unsigned char)(0xE0 | (cp >> 12));
		o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
		o[2] = (unsigned char)(0x80 | (cp & 0x3F));
		return 3;
	}
	o[0] = (unsigned char)(0xF0 | (cp >> 18));
	o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
	o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
	o[3] = (unsigned char)(0x80 | (cp & 0x3F));
	return 4;
}
