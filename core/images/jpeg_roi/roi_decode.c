/* Region-of-interest JPEG decoding on the system libjpeg-turbo (libjpeg API).
 *
 * One context per decoding thread. roi_header() reads a file's header (the
 * caller draws its crop from the size); roi_decode() then decodes only that
 * crop: libjpeg DCT scaling by 1/denom, jpeg_skip_scanlines() over the rows
 * above the crop (entropy decoding only), jpeg_crop_scanline() so only the
 * crop's columns (widened to whole iMCUs) are transformed and colour
 * converted, and decoding stops after the crop's last row. A progressive
 * file decoded at 1/8 scale is decoded from its DC scans alone.
 *
 * Loaded with ctypes, which releases the GIL around every call.
 * Every libjpeg error and warning (corrupt or truncated data) ends the call
 * with -1 and a message; memory libjpeg may take is bounded by
 * ROI_MAX_MEMORY (a progressive file keeps all its coefficients).
 */
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jpeglib.h>
#include <jpegint.h> /* the entropy decoder's insufficient_data, DSTATE_PRELOAD */

#define ROI_MAX_MEMORY (256L << 20)
#define ROI_FAST 1     /* flags: fast integer IDCT and merged (non-fancy) chroma upsampling */
#define ROI_DC_SCANS 2 /* flags: decode a progressive file at 1/8 scale from its DC scans alone */
#define ROI_SKIP_BELOW 4 /* flags: in a multi-scan file, skip each scan's rows below the crop */
#define ROI_ROWS_PER_CALL 64 /* more than an iMCU row of any scale (at most 16 rows) */
/* At most this many scans in a file, as djpeg -maxscans bounds them: libjpeg entropy-decodes every scan of a
 * progressive file whatever the crop, so a "scan bomb" (one AC scan repeated thousands of times in a few
 * hundred KB) would cost seconds of CPU per file. Encoders write about 10 (libjpeg's progressive script) and
 * at most a few dozen (mozjpeg's optimised scans). */
#define ROI_MAX_SCANS 100

typedef struct {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
} roi_error;

typedef struct {
  struct jpeg_decompress_struct cinfo;
  roi_error err;
  int has_header;
  unsigned char *row4; /* one CMYK row, converted to RGB by hand */
  size_t row4_cap;
  const unsigned char *data; /* the file being decoded (the caller keeps it alive) */
  unsigned long size;
  unsigned char *dc; /* a progressive file's DC scans alone, for a decode at 1/8 scale */
  size_t dc_cap;
  struct jpeg_progress_mgr progress; /* called between iMCU rows while a multi-scan file is read */
  JDIMENSION stop_row;               /* iMCU rows of each scan the crop needs */
  int skipped_scan;                  /* the last scan whose rows below stop_row were skipped */
  int skip_below;                    /* the progress monitor skips rows below stop_row (ROI_SKIP_BELOW) */
  long skipped_rows;                 /* iMCU rows skipped so far (for tests) */
  char message[JMSG_LENGTH_MAX + 64];
} roi_ctx;

static void on_error(j_common_ptr c) {
  roi_ctx *ctx = (roi_ctx *)c->client_data;
  c->err->format_message(c, ctx->message);
  longjmp(ctx->err.jump, 1);
}

/* A warning means corrupt or missing data (libjpeg would fill in grey): refuse the file. */
static void on_message(j_common_ptr c, int level) {
  if (level < 0) on_error(c);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

const char *roi_message(roi_ctx *ctx) { return ctx->message; }

long roi_max_memory(void) { return ROI_MAX_MEMORY; }

void roi_free(roi_ctx *ctx) {
  if (!ctx) return;
  jpeg_destroy_decompress(&ctx->cinfo);
  free(ctx->row4);
  free(ctx->dc);
  free(ctx);
}

static int create(roi_ctx *ctx) {
  if (setjmp(ctx->err.jump)) return -1;
  jpeg_create_decompress(&ctx->cinfo);
  ctx->cinfo.mem->max_memory_to_use = ROI_MAX_MEMORY;
  return 0;
}

roi_ctx *roi_new(void) {
  roi_ctx *ctx = calloc(1, sizeof(roi_ctx));
  if (!ctx) return NULL;
  ctx->cinfo.err = jpeg_std_error(&ctx->err.pub);
  ctx->err.pub.error_exit = on_error;
  ctx->err.pub.emit_message = on_message;
  ctx->cinfo.client_data = ctx; /* kept by jpeg_create_decompress */
  if (create(ctx) != 0) {
    free(ctx);
    return NULL;
  }
  return ctx;
}

/* End a call that failed; `message` NULL keeps the one libjpeg wrote. */
static int fail(roi_ctx *ctx, const char *message) {
  if (message) snprintf(ctx->message, sizeof(ctx->message), "%s", message);
  jpeg_abort_decompress(&ctx->cinfo);
  ctx->has_header = 0;
  return -1;
}

/* info: width, height, colour space (J_COLOR_SPACE), progressive (0/1), components. */
int roi_header(roi_ctx *ctx, const unsigned char *data, unsigned long size, int *info) {
  struct jpeg_decompress_struct *ci = &ctx->cinfo;
  ctx->message[0] = 0;
  ctx->has_header = 0;
  /* A fresh decompressor per file: libjpeg-turbo keeps some of a cropped, skipped, abandoned decode's
   * state in its permanent pool, which corrupts the next file's decode. Creating one costs microseconds. */
  jpeg_destroy_decompress(ci);
  if (create(ctx) != 0) return fail(ctx, "cannot create a JPEG decompressor");
  if (setjmp(ctx->err.jump)) return fail(ctx, NULL); /* after create(), whose setjmp this replaces */
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) return fail(ctx, "not a JPEG (no start-of-image marker)");
  ctx->data = data;
  ctx->size = size;
  jpeg_mem_src(ci, data, size);
  jpeg_read_header(ci, TRUE);
  info[0] = (int)ci->image_width;
  info[1] = (int)ci->image_height;
  info[2] = (int)ci->jpeg_color_space;
  info[3] = ci->progressive_mode ? 1 : 0;
  info[4] = ci->num_components;
  ctx->has_header = 1;
  return 0;
}

/* Adobe CMYK/YCCK as written by Photoshop is inverted: R = C*K/255 etc. on the stored values. */
static void cmyk_to_rgb(const unsigned char *in, unsigned char *out, JDIMENSION n, int inverted) {
  for (JDIMENSION i = 0; i < n; i++, in += 4, out += 3) {
    unsigned c = in[0], m = in[1], y = in[2], k = in[3];
    if (!inverted) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
    out[0] = (unsigned char)((c * k + 127) / 255);
    out[1] = (unsigned char)((m * k + 127) / 255);
    out[2] = (unsigned char)((y * k + 127) / 255);
  }
}

/* Rows [output_scanline, y1) into `out`. Many rows per call: libjpeg then writes each row group (two rows of
 * 4:2:0) straight into the output, where one row per call would go through its spare row and a copy. */
static void read_rows(roi_ctx *ctx, unsigned char *out, long stride, JDIMENSION y0, JDIMENSION y1, int cmyk) {
  struct jpeg_decompress_struct *ci = &ctx->cinfo;
  if (!cmyk) {
    JSAMPROW rows[ROI_ROWS_PER_CALL];
    while (ci->output_scanline < y1) {
      JDIMENSION n = y1 - ci->output_scanline;
      if (n > ROI_ROWS_PER_CALL) n = ROI_ROWS_PER_CALL;
      for (JDIMENSION i = 0; i < n; i++) rows[i] = out + (long)(ci->output_scanline + i - y0) * stride;
      jpeg_read_scanlines(ci, rows, n);
    }
    return;
  }
  while (ci->output_scanline < y1) {
    JSAMPROW row = out + (long)(ci->output_scanline - y0) * stride, tmp = ctx->row4;
    jpeg_read_scanlines(ci, &tmp, 1);
    cmyk_to_rgb(ctx->row4, row, ci->output_width, ci->saw_Adobe_marker);
  }
}

/* Output parameters: scale 1/denom, RGB (CMYK converted by hand), the IDCT and upsampling asked for. */
static void set_output(struct jpeg_decompress_struct *ci, int denom, int fast) {
  int cmyk = ci->jpeg_color_space == JCS_CMYK || ci->jpeg_color_space == JCS_YCCK;
  ci->scale_num = 1;
  ci->scale_denom = (unsigned)denom;
  ci->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  ci->dct_method = fast ? JDCT_IFAST : JDCT_ISLOW;
  ci->do_fancy_upsampling = fast ? FALSE : TRUE;
  jpeg_calc_output_dimensions(ci);
}

#define NO_MARKER ((size_t)-1)

/* The end of the entropy-coded data starting at d[j]: the offset of the next marker (0xFF, then neither 0x00
 * nor a restart marker nor another 0xFF fill byte), which may be j itself, or NO_MARKER when the data ends
 * first. */
static size_t scan_end(const unsigned char *d, size_t n, size_t j) {
  for (;;) {
    const unsigned char *f = j < n ? memchr(d + j, 0xFF, n - j) : NULL;
    if (!f || (size_t)(f - d) + 1 >= n) return NO_MARKER;
    j = (size_t)(f - d);
    unsigned char b = d[j + 1];
    if (b != 0x00 && b != 0xFF && (b < 0xD0 || b > 0xD7)) return j;
    j += b == 0xFF ? 1 : 2;
  }
}

/* The segment at d[*at] after any fill bytes: its marker in *m and its length in *seg (an SOS's with its
 * entropy-coded data), *at moved to it. 1 for a segment, 2 at the end-of-image marker, 0 where the stream
 * does not parse. */
static int next_segment(const unsigned char *d, size_t n, size_t *at, unsigned char *m, size_t *seg) {
  size_t i = *at;
  while (i + 1 < n && d[i] == 0xFF && d[i + 1] == 0xFF) i++; /* fill bytes */
  *at = i;
  if (i + 1 >= n || d[i] != 0xFF) return 0;
  *m = d[i + 1];
  if (*m == 0xD9) return 2;
  if (i + 4 > n || (*m >= 0xD0 && *m <= 0xD8) || *m == 0x01 || *m == 0x00) return 0; /* no segment here */
  *seg = 2 + ((size_t)d[i + 2] << 8 | d[i + 3]);
  if (*seg < 4 || i + *seg > n) return 0;
  if (*m == 0xDA) { /* SOS: Ns, Ns (component, tables) pairs, Ss, Se, Ah/Al; then the entropy-coded data */
    if (i + 5 + 2 * (size_t)d[i + 4] + 2 >= i + *seg) return 0;
    size_t end = scan_end(d, n, i + *seg);
    if (end == NO_MARKER) return 0;
    *seg = end - i;
  }
  return 1;
}

/* Copy a progressive JPEG into `out` (at least n bytes) without the AC scans (spectral selection starting
 * above 0) of the components whose ids are set in `dc_only`; return its length, or 0 if the stream does not
 * parse up to its end-of-image marker. A component libjpeg transforms with its 1x1 IDCT (at 1/8 scale: the
 * luma, and the chroma too unless subsampled) uses its DC coefficient alone, so its DC scans give the same
 * pixels as the whole file, without entropy-decoding its AC scans (most of the file and of the time). */
static size_t dc_scans(const unsigned char *d, size_t n, const unsigned char *dc_only, unsigned char *out) {
  size_t i = 2, o = 2, seg = 0;
  unsigned char m = 0;
  memcpy(out, d, 2);
  for (;;) {
    int got = next_segment(d, n, &i, &m, &seg);
    if (got == 0) return 0;
    if (got == 2) {
      out[o] = 0xFF, out[o + 1] = 0xD9;
      return o + 2;
    }
    int keep = 1;
    if (m == 0xDA) {
      size_t ss = i + 5 + 2 * (size_t)d[i + 4];
      keep = d[ss] == 0;
      for (size_t k = i + 5; k < ss; k += 2) keep |= !dc_only[d[k]];
    }
    if (keep) memcpy(out + o, d + i, seg), o += seg;
    i += seg;
  }
}

/* What the scans of a multi-scan file hold, from its SOS headers: how many there are, and whether every
 * component's coefficients 0..9 reach full precision (a scan with Al = 0 covers them). Where they do not (AC
 * scans never sent, a refinement missing), libjpeg's block smoothing estimates them from the neighbouring
 * blocks, so the whole decode differs from the shortcuts' (which leave rows out or read DC scans alone).
 * Returns 0 where the stream does not parse. */
#define ROI_SMOOTHED_COEFS 10 /* libjpeg-turbo 2.1's smoothing reads coefficients 0..9 */
static int scan_census(const unsigned char *d, size_t n, const struct jpeg_decompress_struct *ci, int *scans,
                       int *complete) {
  unsigned short sent[256] = {0}; /* per component id: bit k set once coefficient k has all its bits */
  size_t i = 2, seg = 0;
  unsigned char m = 0;
  *scans = 0;
  for (;;) {
    int got = next_segment(d, n, &i, &m, &seg);
    if (got == 0) return 0;
    if (got == 2) break;
    if (m == 0xDA) {
      size_t ss = i + 5 + 2 * (size_t)d[i + 4];
      unsigned se = d[ss + 1], al = d[ss + 2] & 15;
      *scans += 1;
      for (unsigned k = d[ss]; al == 0 && k <= se && k < ROI_SMOOTHED_COEFS; k++)
        for (size_t c = i + 5; c < ss; c += 2) sent[d[c]] |= (unsigned short)(1u << k);
    }
    i += seg;
  }
  *complete = 1;
  for (int c = 0; c < ci->num_components; c++)
    if (sent[ci->comp_info[c].component_id & 0xFF] != (1u << ROI_SMOOTHED_COEFS) - 1) *complete = 0;
  return 1;
}

/* For a progressive file decoded at 1/8: restart the decompressor without the AC scans of the components that
 * need only their DC coefficients (set_output() done). No block smoothing: it would estimate the missing AC
 * coefficients (and, in libjpeg-turbo 2.1, adjust DC) from neighbouring blocks. */
static int use_dc_scans(roi_ctx *ctx) {
  struct jpeg_decompress_struct *ci = &ctx->cinfo;
  unsigned char dc_only[256] = {0};
  for (int i = 0; i < ci->num_components; i++)
    if (ci->comp_info[i].DCT_scaled_size == 1) dc_only[ci->comp_info[i].component_id & 0xFF] = 1;
  if (ctx->dc_cap < ctx->size) {
    free(ctx->dc);
    ctx->dc_cap = 0;
    if (!(ctx->dc = malloc(ctx->size))) return 0;
    ctx->dc_cap = ctx->size;
  }
  size_t n = dc_scans(ctx->data, ctx->size, dc_only, ctx->dc);
  if (!n) return 0; /* not parsed: the whole file is decoded, and libjpeg says what is wrong with it */
  jpeg_abort_decompress(ci);
  jpeg_mem_src(ci, ctx->dc, n);
  jpeg_read_header(ci, TRUE);
  ci->do_block_smoothing = FALSE;
  return 1;
}

/* The progress monitor, called before each step of jpeg_start_decompress()'s reading of a multi-scan
 * (progressive) file, one iMCU row of one scan per step. Once a scan has reached the last iMCU row the crop
 * needs, the source jumps to the scan's end (its next marker) and the entropy decoder is told the data ran
 * out, so it leaves the remaining rows' blocks untouched without reading them: the rows below the crop are
 * never entropy-decoded. The rows above must be (their end-of-band runs and DC predictions carry on); the
 * rows output are the same as a whole decode's. Not with restart markers (the decoder would look for them
 * past the jump) nor arithmetic coding; nor when the data ends before a marker (a truncated file fails as
 * it would otherwise). */
static void skip_rest_of_scan(j_common_ptr c) {
  roi_ctx *ctx = (roi_ctx *)c->client_data;
  struct jpeg_decompress_struct *ci = &ctx->cinfo;
  if (ci->global_state != DSTATE_PRELOAD || ci->restart_interval || ci->arith_code || !ci->entropy) return;
  if (ci->input_iMCU_row < ctx->stop_row || ci->input_iMCU_row >= ci->total_iMCU_rows ||
      ctx->skipped_scan == ci->input_scan_number)
    return;
  if (!ci->unread_marker) { /* else the decoder has already read up to the scan's end */
    size_t end = scan_end(ci->src->next_input_byte, ci->src->bytes_in_buffer, 0);
    if (end == NO_MARKER) return; /* (0: the scan's last bytes are already in the decoder's bit buffer) */
    ci->src->next_input_byte += end;
    ci->src->bytes_in_buffer -= end;
  }
  ci->entropy->insufficient_data = TRUE;
  ctx->skipped_scan = ci->input_scan_number;
  ctx->skipped_rows += ci->total_iMCU_rows - ci->input_iMCU_row;
}

/* The progress monitor of a multi-scan file: refuses the file at its (ROI_MAX_SCANS + 1)th scan (the census
 * of roi_decode() refuses it before any decoding where the stream parses), then skips rows below the crop. */
static void on_progress(j_common_ptr c) {
  roi_ctx *ctx = (roi_ctx *)c->client_data;
  if (ctx->cinfo.input_scan_number > ROI_MAX_SCANS) {
    snprintf(ctx->message, sizeof(ctx->message), "JPEG has more than %d scans (a scan bomb?): refused",
             ROI_MAX_SCANS);
    longjmp(ctx->err.jump, 1);
  }
  if (ctx->skip_below) skip_rest_of_scan(c);
}

/* Before a multi-scan file is decoded: refuse one with more than ROI_MAX_SCANS scans (-1), and turn the
 * shortcuts off where block smoothing would make the whole decode differ from them (scan_census); the flags
 * to decode with. */
static int check_scans(roi_ctx *ctx, int flags) {
  struct jpeg_decompress_struct *ci = &ctx->cinfo;
  int scans = 0, complete = 0;
  if (scan_census(ctx->data, ctx->size, ci, &scans, &complete) && scans > ROI_MAX_SCANS) {
    snprintf(ctx->message, sizeof(ctx->message), "JPEG has %d scans, more than %d (a scan bomb?): refused", scans,
             ROI_MAX_SCANS);
    return -1;
  }
  if (!complete) flags &= ~(ROI_DC_SCANS | ROI_SKIP_BELOW);
  ctx->skip_below = (flags & ROI_SKIP_BELOW) != 0;
  ctx->progress.progress_monitor = on_progress;
  ci->progress = &ctx->progress;
  return flags;
}

long roi_skipped_rows(roi_ctx *ctx) { return ctx->skipped_rows; }

static int decode_crop(roi_ctx *ctx, int denom, int y0, int y1, int x0, int x1, unsigned char *out, long stride,
                       long capacity, int flags, int *got, double *times, double t0);

/* Decode rows [y0, y1) and columns [x0, x1) of the image scaled by 1/denom into `out`
 * (RGB, rows `stride` bytes apart, `capacity` bytes). The columns decoded start at
 * got[0] (<= x0) and are got[1] wide; times: header-to-start, skip, rows (seconds). */
int roi_decode(roi_ctx *ctx, int denom, int y0, int y1, int x0, int x1, unsigned char *out, long stride,
               long capacity, int flags, int *got, double *times) {
  if (!ctx->has_header) return fail(ctx, "no header read");
  double t0 = now();
  /* no libjpeg call fails in the state roi_header() leaves */
  if (jpeg_has_multiple_scans(&ctx->cinfo)) flags = check_scans(ctx, flags);
  if (flags < 0) return fail(ctx, NULL);
  return decode_crop(ctx, denom, y0, y1, x0, x1, out, stride, capacity, flags, got, times, t0);
}

static int decode_crop(roi_ctx *ctx, int denom, int y0, int y1, int x0, int x1, unsigned char *out, long stride,
                       long capacity, int flags, int *got, double *times, double t0) {
  struct jpeg_decompress_struct *ci = &ctx->cinfo;
  if (setjmp(ctx->err.jump)) return fail(ctx, NULL);
  set_output(ci, denom, flags & ROI_FAST);
  if ((flags & ROI_DC_SCANS) && denom == 8 && ci->progressive_mode && use_dc_scans(ctx))
    set_output(ci, denom, flags & ROI_FAST);
  int cmyk = ci->out_color_space == JCS_CMYK;
  if (y0 < 0 || x0 < 0 || y1 <= y0 || x1 <= x0 || (JDIMENSION)y1 > ci->output_height ||
      (JDIMENSION)x1 > ci->output_width)
    return fail(ctx, "crop box outside the scaled image");
  if (ci->progressive_mode || ci->buffered_image) {
    /* all of a progressive file's coefficients are held at once: 128 bytes per 8x8 block */
    double need = 0;
    for (int i = 0; i < ci->num_components; i++)
      need += 128.0 * ci->comp_info[i].width_in_blocks * ci->comp_info[i].height_in_blocks;
    if (need > ROI_MAX_MEMORY) {
      snprintf(ctx->message, sizeof(ctx->message),
               "progressive JPEG of %ux%u needs %.0f MiB for its coefficients, over the %ld MiB bound",
               ci->image_width, ci->image_height, need / (1 << 20), ROI_MAX_MEMORY >> 20);
      return fail(ctx, NULL);
    }
  }
  if (flags & ROI_SKIP_BELOW) {
    /* iMCU rows are max_v_samp_factor * min_DCT_scaled_size output rows; one more for fancy upsampling's context */
    JDIMENSION imcu = (JDIMENSION)(ci->max_v_samp_factor * ci->min_DCT_scaled_size);
    ctx->stop_row = (JDIMENSION)(y1 - 1) / imcu + 2;
    ctx->skipped_scan = -1;
  }
  /* a progressive file is entropy-decoded here: the rows the crop needs of each scan (of its DC scans alone
   * at 1/8 scale) */
  jpeg_start_decompress(ci);
  ci->progress = NULL;
  JDIMENSION xoff = (JDIMENSION)x0, width = (JDIMENSION)(x1 - x0);
  if (width < ci->output_width) jpeg_crop_scanline(ci, &xoff, &width);
  if ((long)width * 3 > stride || (long)(y1 - y0 - 1) * stride + (long)width * 3 > capacity)
    return fail(ctx, "output buffer too small for the crop");
  if (cmyk && ctx->row4_cap < (size_t)width * 4) {
    free(ctx->row4);
    ctx->row4_cap = 0;
    ctx->row4 = malloc((size_t)width * 4);
    if (!ctx->row4) return fail(ctx, "out of memory for a CMYK row");
    ctx->row4_cap = (size_t)width * 4;
  }
  double t1 = now();
  if (y0 > 0) jpeg_skip_scanlines(ci, (JDIMENSION)y0);
  double t2 = now();
  read_rows(ctx, out, stride, (JDIMENSION)y0, (JDIMENSION)y1, cmyk);
  double t3 = now();
  jpeg_abort_decompress(ci); /* stop after the crop's last row */
  ctx->has_header = 0;
  got[0] = (int)xoff;
  got[1] = (int)width;
  times[0] = t1 - t0;
  times[1] = t2 - t1;
  times[2] = t3 - t2;
  return 0;
}

/* Halve an RGB image (rows x cols, rows `src_stride` bytes apart) along y if fy == 2 and along x if fx == 2
 * (each 1 or 2), averaging each pair or 2x2 block with rounding, into `dst`: ceil(rows / fy) x ceil(cols / fx),
 * rows `dst_stride` bytes apart (an odd last row or column is averaged with itself). The antialiasing step
 * before a bilinear resize of a crop shrunk 2x or more along an axis, at a fraction of INTER_AREA's cost. */
void roi_halve(const unsigned char *src, long src_stride, int rows, int cols, int fy, int fx, unsigned char *dst,
               long dst_stride) {
  int out_rows = (rows + fy - 1) / fy;
  for (int r = 0; r < out_rows; r++) {
    const unsigned char *a = src + (long)r * fy * src_stride;
    const unsigned char *b = fy == 2 && r * 2 + 1 < rows ? a + src_stride : a;
    unsigned char *o = dst + (long)r * dst_stride;
    int pairs = fx == 2 ? cols / 2 : 0;
    if (fx == 2) {
      for (int c = 0; c < pairs * 3; c += 3)
        for (int k = 0; k < 3; k++) {
          const unsigned char *p = a + 2 * c + k, *q = b + 2 * c + k;
          o[c + k] = (unsigned char)((p[0] + p[3] + q[0] + q[3] + 2) >> 2);
        }
    } else {
      for (int c = 0; c < cols * 3; c++) o[c] = (unsigned char)((a[c] + b[c] + 1) >> 1);
    }
    if (fx == 2 && cols % 2) /* the odd last column: its own pixel(s) */
      for (int k = 0; k < 3; k++) o[pairs * 3 + k] = (unsigned char)((a[(cols - 1) * 3 + k] + b[(cols - 1) * 3 + k] + 1) >> 1);
  }
}
