/* Fuzzes the ROI JPEG decoder (core/images/jpeg_roi/roi_decode.c) under ASan and UBSan: each input is a
 * mutated seed JPEG, read with roi_header() and, when that succeeds, decoded at a random scale, crop and
 * flags (every shortcut on or off), then halved. Usage: fuzz_roi SECONDS SEED FILE...; prints the inputs
 * tried. Any sanitizer report ends the process with an error. */
#include "mutate.h"

typedef struct roi_ctx roi_ctx;
roi_ctx *roi_new(void);
void roi_free(roi_ctx *);
int roi_header(roi_ctx *, const unsigned char *, unsigned long, int *);
int roi_decode(roi_ctx *, int, int, int, int, int, unsigned char *, long, long, int, int *, double *);
void roi_halve(const unsigned char *, long, int, int, int, int, unsigned char *, long);

#define CAP (4u << 20)
#define MAX_PIXELS (4u << 20)

static void one(roi_ctx *ctx, const unsigned char *data, size_t n, long *decoded) {
  int info[5], got[2];
  double times[3];
  if (roi_header(ctx, data, n, info) != 0) return;
  static const int denoms[] = {1, 2, 4, 8};
  int denom = denoms[fz_below(4)];
  long h = (info[1] + denom - 1) / denom, w = (info[0] + denom - 1) / denom;
  if (h < 1 || w < 1) return;
  long y0 = (long)fz_below((size_t)h), x0 = (long)fz_below((size_t)w);
  long y1 = y0 + 1 + (long)fz_below((size_t)(h - y0)), x1 = x0 + 1 + (long)fz_below((size_t)(w - x0));
  if ((y1 - y0) * (x1 - x0 + 32) > MAX_PIXELS) y1 = y0 + 1, x1 = x0 + 1; /* the Python side's bound */
  long stride = (x1 - x0 + 32) * 3, need = (y1 - y0) * stride;
  unsigned char *out = (unsigned char *)malloc((size_t)need);
  int flags = (int)fz_below(8); /* fast, DC scans, skip below */
  if (roi_decode(ctx, denom, (int)y0, (int)y1, (int)x0, (int)x1, out, stride, need, flags, got, times) == 0) {
    *decoded += 1;
    int rows = (int)(y1 - y0), cols = (int)(x1 - x0), fy = 1 + (int)fz_below(2), fx = 1 + (int)fz_below(2);
    long half_stride = (long)cols * 3 + 3;
    unsigned char *half = (unsigned char *)malloc((size_t)(rows * half_stride));
    roi_halve(out + (x0 - got[0]) * 3, stride, rows, cols, fy, fx, half, half_stride);
    free(half);
  }
  free(out);
}

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  double seconds = atof(argv[1]);
  fz_state ^= strtoull(argv[2], NULL, 10) * 0x9E3779B97F4A7C15ull;
  size_t n_seeds = (size_t)argc - 3;
  fz_buf *seeds = (fz_buf *)calloc(n_seeds, sizeof(fz_buf));
  for (size_t i = 0; i < n_seeds; i++)
    if (fz_read(argv[3 + i], &seeds[i]) != 0) return 2;
  unsigned char *buf = (unsigned char *)malloc(CAP);
  roi_ctx *ctx = roi_new();
  long inputs = 0, decoded = 0;
  double end = fz_now() + seconds;
  while (fz_now() < end) {
    size_t n = fz_mutate(seeds, n_seeds, buf, CAP);
    one(ctx, buf, n, &decoded);
    inputs++;
  }
  roi_free(ctx);
  for (size_t i = 0; i < n_seeds; i++) free(seeds[i].data);
  free(seeds);
  free(buf);
  printf("{\"target\": \"roi\", \"inputs\": %ld, \"decoded\": %ld}\n", inputs, decoded);
  return 0;
}
