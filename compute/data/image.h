/* image.h: one PNG or JPEG image, from bytes in memory to model features.
 *
 * The images:DIR dataset (compute/data/images.c) reads each file whole and
 * hands the bytes here: PNG goes through Debian's libpng (its simplified
 * API), JPEG through libjpeg-turbo. The format is told by the first bytes,
 * never by the file name. A header is read and checked against the limits
 * below BEFORE anything is decoded or allocated from it, so a file declaring
 * a huge picture (a "bomb" of a few hundred bytes) costs nothing. Decoding is
 * strict: a truncated or corrupt file is an error, not a grey-filled
 * picture. Nothing here keeps state; any thread may call it. */
#ifndef TD_IMAGE_H
#define TD_IMAGE_H

#include <stddef.h>
#include <stdint.h>

/* Largest side and largest pixel count an image may declare. A model input
 * never has more than TD_DATASET_MAX_DIM (1 Mi) values, so no image that
 * could become one needs more pixels than that. */
#define TD_IMAGE_MAX_SIDE 16384u
#define TD_IMAGE_MAX_PIXELS 1048576u
/* Largest image file read (a PNG of TD_IMAGE_MAX_PIXELS RGBA16 pixels
 * stored uncompressed is about 8 MiB). */
#define TD_IMAGE_MAX_FILE_BYTES ((uint64_t)64 << 20)

typedef enum { TD_IMAGE_PNG = 1, TD_IMAGE_JPEG = 2 } td_image_format_t;

/* What a header declares. color is 1 when the image holds colour (RGB,
 * palette, YCbCr), 0 for greyscale (with or without alpha). */
typedef struct {
  td_image_format_t format;
  uint32_t width, height;
  int color;
} td_image_info_t;

/* The format of bytes by their magic (PNG signature, JPEG SOI marker), or 0. */
int td_image_sniff(const uint8_t *bytes, size_t len);

/* Read the header of the PNG or JPEG in bytes[0..len) into *info; name is
 * only used in why. TD_ECORRUPT + why (one line naming `name`) for an unknown
 * format, a bad header, or a size beyond the limits above. */
int td_image_probe(td_image_info_t *info, const uint8_t *bytes, size_t len, const char *name,
                   char *why, size_t why_len);

/* Decode bytes into out[channels][height][width] (channels first), each
 * value a pixel byte / 255. channels 1 converts colour to grey (libpng's
 * sRGB weights; JPEG's luma plane), 3 replicates grey into R, G and B;
 * transparent pixels are composited onto black. The image must be exactly
 * width x height: a different size is TD_ESHAPE + why (nothing is resized).
 * TD_ECORRUPT for a bad or truncated file, TD_ENOMEM. out must hold
 * channels * height * width floats and is written only on success. */
int td_image_decode(float *out, int channels, uint32_t width, uint32_t height, const uint8_t *bytes,
                    size_t len, const char *name, char *why, size_t why_len);

#endif
