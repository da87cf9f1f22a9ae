/* suggest.c: edit distance (optimal string alignment) and the nearest name. */
#include "common/suggest.h"

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
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < d[i][j])
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
