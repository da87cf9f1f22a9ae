/* suggest.h: "did you mean ...?" for a word a person mistyped.
 *
 * The nearest of a list of known names by edit distance (insertions,
 * deletions, substitutions and swaps of two neighbours each cost 1), for the
 * one-line errors of trainctl's commands and the run and daemon keys. Pure
 * functions, any thread. */
#ifndef TD_SUGGEST_H
#define TD_SUGGEST_H

#include <stddef.h>

/* The edit distance between a and b (both NUL-terminated; words longer than
 * 63 characters count as far from everything). */
size_t td_suggest_distance(const char *a, const char *b);
/* The name of `names` (n of them) nearest to `word`, or NULL when none is
 * within a third of the longer word's length (at least 2 edits allowed):
 * a suggestion should look like what was meant. Borrowed from `names`. */
const char *td_suggest_nearest(const char *word, const char *const *names, size_t n);
/* "unknown WHAT 'WORD': did you mean 'NEAR'? (known: A, B, ...)" into buf,
 * the question only when a name is near, every name listed (none cut off
 * while buf has room). Returns buf. */
const char *td_suggest_unknown(char *buf, size_t len, const char *what, const char *word,
                               const char *const *names, size_t n);

#endif
