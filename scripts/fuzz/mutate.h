/* A small mutation engine for the native fuzzers (scripts/fuzz_native.py): seeds read from files, each
 * input one seed changed in a few random ways (bit flips, bytes, cut, inserted or repeated bytes, a splice
 * of another seed, integers that sit on bounds written over 2, 4 or 8 bytes). No libFuzzer: gcc has none. */
#ifndef FEEDBENCH_FUZZ_MUTATE_H_
#define FEEDBENCH_FUZZ_MUTATE_H_

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  unsigned char *data;
  size_t size;
} fz_buf;

static uint64_t fz_state = 88172645463325252ull;

static uint64_t fz_rand(void) { /* xorshift64 */
  fz_state ^= fz_state << 13;
  fz_state ^= fz_state >> 7;
  fz_state ^= fz_state << 17;
  return fz_state;
}

static size_t fz_below(size_t n) { return n ? (size_t)(fz_rand() % n) : 0; }

static double fz_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int fz_read(const char *path, fz_buf *out) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  out->data = (unsigned char *)malloc(n > 0 ? (size_t)n : 1);
  out->size = n > 0 && fread(out->data, 1, (size_t)n, f) == (size_t)n ? (size_t)n : 0;
  fclose(f);
  return 0;
}

/* `out` (capacity `cap`) becomes seed `s` mutated, or `s` itself one time in 16; returns its size. */
static size_t fz_mutate(const fz_buf *seeds, size_t n_seeds, unsigned char *out, size_t cap) {
  const fz_buf *s = &seeds[fz_below(n_seeds)];
  size_t n = s->size < cap ? s->size : cap;
  memcpy(out, s->data, n);
  if (fz_below(16) == 0) return n;
  static const uint64_t bounds[] = {0, 1, 0x7f, 0x80, 0xff, 0x7fff, 0x8000, 0xffff, 0x7fffffff, 0x80000000u,
                                    0xffffffffu, 0x7fffffffffffffffull, 0x8000000000000000ull, ~0ull, 1024, 1025, 8, 9};
  int steps = 1 + (int)fz_below(8);
  for (int k = 0; k < steps; k++) {
    size_t at = fz_below(n + 1);
    switch (fz_below(7)) {
      case 0: if (n) out[fz_below(n)] ^= (unsigned char)(1u << fz_below(8)); break;
      case 1: if (n) out[fz_below(n)] = (unsigned char)fz_rand(); break;
      case 2: n = at; break; /* cut */
      case 3: { /* insert random bytes */
        size_t len = 1 + fz_below(16);
        if (n + len > cap) break;
        memmove(out + at + len, out + at, n - at);
        for (size_t i = 0; i < len; i++) out[at + i] = (unsigned char)fz_rand();
        n += len;
        break;
      }
      case 4: { /* repeat a piece */
        if (!n) break;
        size_t from = fz_below(n), len = 1 + fz_below(n - from < 4096 ? n - from : 4096);
        if (n + len > cap || at > n) break;
        memmove(out + at + len, out + at, n - at);
        memmove(out + at, out + from + (from >= at ? len : 0), len);
        n += len;
        break;
      }
      case 5: { /* an integer on a bound */
        size_t w = (size_t)1 << (1 + fz_below(3));
        if (n < w) break;
        uint64_t v = bounds[fz_below(sizeof(bounds) / sizeof(bounds[0]))];
        memcpy(out + fz_below(n - w + 1), &v, w);
        break;
      }
      default: { /* splice the tail of another seed */
        const fz_buf *t = &seeds[fz_below(n_seeds)];
        size_t from = fz_below(t->size + 1), len = t->size - from;
        if (at + len > cap) len = cap - at;
        memcpy(out + at, t->data + from, len);
        n = at + len;
      }
    }
  }
  return n;
}

#endif
