# bench/spec_prompts.sh — the tasks of bench/spec_bench.sh and bench/peer_spec.sh
# (sourced): PROMPT[quote], PROMPT[rewrite] (input-grounded: the answer copies
# the prompt) and PROMPT[story] (free text).
DOC="The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lantern and a small notebook \
in which he recorded the color of the sea, the direction of the wind, and the names of the ships that passed. Over \
forty years the notebooks filled three shelves of the keeper's cottage. When the lighthouse was automated, the \
keeper gave the notebooks to the town library, where they are still read by sailors, historians and children who \
want to know what the sea looked like on the day they were born."
FUNC='static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *ret)
{
	char *end;
	unsigned long v;
	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoul(s, &end, 0);
	if (errno || *end || v < lo || v > hi)
		return -EINVAL;
	*ret = (uint32_t)v;
	return 0;
}'
declare -A PROMPT=(
	[quote]="Repeat the following text exactly, word for word: $DOC"
	[rewrite]="Rewrite this C function so that it returns -ERANGE instead of -EINVAL when the value is out of range. Give the whole function.
$FUNC"
	[story]="Write a story about a dragon who learns to paint."
)
