/* suggest.c: edit distance (optimal string alignment) and the nearest name. */
#include "common/suggest.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define WORD_MAX 64

static size_t min3(size_t a, size_t b, size_t c) {
  size_t m = a < b ? a : b;
  return m < c ? m : c;
}

size_t td_suggest_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la >= WORD_MAX || lb >= WORD_MAX)
    return (size_t)-1;
  size_t d[WORD_MAX][WORD_MAX];
  for (size_t i = 0; i <= la; i++)
    d[i][0] = i;
  for (size_t j = 0; j <= lb; j++)
    d[0][j] = j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      size_t cost = a[i - 1] != b[j - 1];
      d[i][j] = min3(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost);
      bool swapped = i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1];
      if (swapped && d[i - 2][j - 2] + 1 < d[i][j])
        d[i][j] = d[i - 2][j - 2] + 1;
    }
  return d[la][lb];
}

const char *td_suggest_nearest(const char *word, const char *const *names, size_t n) {
  const char *best = NULL;
  size_t best_d = (size_t)-1;
  for (size_t i = 0; i < n; i++) {
    size_t d = td_suggest_distance(word, names[i]);
    size_t longer = strlen(word) > strlen(names[i]) ? strlen(word) : strlen(names[i]);
    size_t allowed = longer / 3 > 2 ? longer / 3 : 2;
    if (d <= allowed && d < best_d) {
      best = names[i];
      best_d = d;
    }
  }
  return best;
}

const char *td_suggest_unknown(char *buf, size_t len, const char *what, const char *word,
                               const char *const *names, size_t n) {
  const char *near = td_suggest_nearest(word, names, n);
  int w = snprintf(buf, len, "unknown %s '%.64s'", what, word);
  size_t used = w > 0 ? (size_t)w : 0;
  if (near != NULL && used < len)
    used += (size_t)snprintf(buf + used, len - used, ": did you mean '%s'?", near);
  for (size_t i = 0; i < n && used < len; i++)
    used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : " (known: ", names[i]);
  if (used < len)
    snprintf(buf + used, len - used, ")");
  return buf;
}
