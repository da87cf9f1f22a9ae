#!/usr/bin/python3
# make_corpus.py: writes the seed and hostile files of the fuzz corpora for
# the .npy parser (corpus/npy), the PNG and JPEG decoders (corpus/png,
# corpus/jpeg) and the hostile half of corpus/safetensors, with nothing but
# the Python standard library (struct, zlib), byte for byte the same on
# every run. The committed files are its output; run it from tests/fuzz/ to
# regenerate them. The JPEG seeds (grey8.jpg, rgb8.jpg, progressive16.jpg:
# 8x8 and 16x16 gradients written by libjpeg-turbo's cjpeg-like API) are
# not made here, since the standard library has no JPEG encoder; the
# hostile JPEGs are derived from them by patching markers.
#
# Each hostile file differs from a good one in one way that a reader must
# catch: a header that lies about a size, data cut short, a dimension that
# would make a bomb, a dtype not read, a shape whose product overflows.
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))


def put(folder, name, data):
    path = os.path.join(HERE, "corpus", folder)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, name), "wb") as f:
        f.write(data)


# ---- PNG -------------------------------------------------------------------

def chunk(kind, body, crc=None):
    if crc is None:
        crc = zlib.crc32(kind + body)
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def png(width, height, bit_depth, color_type, rows, interlace=0, extra=b""):
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, interlace)
    raw = b"".join(b"\x00" + r for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra +
            chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


grey4 = png(4, 4, 8, 0, [bytes(range(r * 16, r * 16 + 4)) for r in range(4)])
rgb3 = png(3, 2, 8, 2, [bytes(range(r * 9, r * 9 + 9)) for r in range(2)])
rgba2 = png(2, 2, 8, 6, [bytes([255, 0, 0, 255, 0, 255, 0, 128]),
                         bytes([0, 0, 255, 0, 9, 9, 9, 255])])
grey16 = png(2, 2, 16, 0, [b"\x12\x34\xff\xff", b"\x00\x00\x80\x00"])
palette = png(2, 2, 8, 3, [b"\x00\x01", b"\x01\x00"],
              extra=chunk(b"PLTE", b"\xff\x00\x00\x00\x00\xff") + chunk(b"tRNS", b"\x80"))
put("png", "grey4.png", grey4)
put("png", "rgb3.png", rgb3)
put("png", "rgba2.png", rgba2)
put("png", "grey16.png", grey16)
put("png", "palette_trns.png", palette)
def adam7(pixels, width, height):
    """The rows of an 8-bit grey image's seven Adam7 passes, in order."""
    rows = []
    for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4),
                           (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)):
        for y in range(y0, height, dy):
            row = bytes(pixels[y][x] for x in range(x0, width, dx))
            if row:
                rows.append(row)
    return rows


put("png", "interlaced.png", png(5, 5, 8, 0, adam7([[x * 40 + y for x in range(5)]
                                                   for y in range(5)], 5, 5), interlace=1))
# bomb: a valid file whose IHDR (with a correct CRC) declares 60000 x 60000
put("png", "bomb_60000.png", png(60000, 60000, 8, 2, [b"\x00" * 9]))
# a 1-pixel-high image 16384 wide: each side allowed, the product too; the
# data is missing
put("png", "wide_no_data.png", png(16384, 1, 8, 0, [b""]))
put("png", "truncated.png", rgb3[:-20])
# the IDAT length field lies: 2^31 - 1 bytes
i = rgb3.index(b"IDAT") - 4
put("png", "idat_length_lies.png", rgb3[:i] + b"\x7f\xff\xff\xff" + rgb3[i + 4:])
# a bad CRC on IHDR
put("png", "bad_crc.png", grey4[:29] + b"\x00\x00\x00\x00" + grey4[33:])
# more image data than the header declares rows for
put("png", "extra_rows.png", png(2, 1, 8, 0, [b"\x01\x02", b"\x03\x04", b"\x05\x06"]))
# zero width
put("png", "zero_width.png", png(0, 4, 8, 0, [b""] * 4))

# ---- JPEG (hostile variants of the committed seeds) --------------------------

def read(folder, name):
    with open(os.path.join(HERE, "corpus", folder, name), "rb") as f:
        return f.read()


def patch_sof(data, width=None, height=None, components=None):
    b = bytearray(data)
    for k in range(2, len(b) - 9):
        if b[k] == 0xFF and b[k + 1] in (0xC0, 0xC2):
            if height is not None:
                b[k + 5:k + 7] = struct.pack(">H", height)
            if width is not None:
                b[k + 7:k + 9] = struct.pack(">H", width)
            if components is not None:
                b[k + 9] = components
            return bytes(b)
    raise SystemExit("no SOF marker")


def patch_segment_length(data, marker, length):
    b = bytearray(data)
    k = b.index(bytes([0xFF, marker]), 2)
    b[k + 2:k + 4] = struct.pack(">H", length)
    return bytes(b)


rgb8 = read("jpeg", "rgb8.jpg")
prog = read("jpeg", "progressive16.jpg")
put("jpeg", "bomb_65000.jpg", patch_sof(rgb8, 65000, 65000))
put("jpeg", "bomb_progressive.jpg", patch_sof(prog, 60000, 60000))
put("jpeg", "over_pixels_1025x1024.jpg", patch_sof(rgb8, 1025, 1024))
put("jpeg", "zero_height.jpg", patch_sof(rgb8, 8, 0))
put("jpeg", "truncated.jpg", rgb8[:len(rgb8) // 2])
put("jpeg", "truncated_progressive.jpg", prog[:len(prog) * 2 // 3])
put("jpeg", "dqt_length_lies.jpg", patch_segment_length(rgb8, 0xDB, 0xFFFF))
put("jpeg", "sof_length_lies.jpg", patch_segment_length(rgb8, 0xC0, 2))
put("jpeg", "soi_only.jpg", b"\xff\xd8\xff")

# ---- NumPy .npy --------------------------------------------------------------

def npy(header, data, version=1):
    text = header.encode("latin1")
    prefix = 10 if version == 1 else 12
    pad = (64 - (prefix + len(text) + 1) % 64) % 64
    text += b" " * pad + b"\n"
    size = struct.pack("<H", len(text)) if version == 1 else struct.pack("<I", len(text))
    return b"\x93NUMPY" + bytes([version, 0]) + size + text + data


f4 = struct.pack("<6f", 0.0, 0.5, -1.0, 2.0, 3.25, 1e-3)
good_x = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", f4)
put("npy", "x_f4_3x2.npy", good_x)
put("npy", "x_u1_v2.npy", npy("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 2), }",
                              bytes(range(0, 240, 30)), version=2))
put("npy", "y_i8.npy", npy("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
                           struct.pack("<3q", 0, 2, 1)))
put("npy", "y_i4.npy", npy("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }",
                           struct.pack("<3i", 1, 0, 7)))
put("npy", "scalar.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
                             struct.pack("<f", 1.0)))
put("npy", "fortran.npy", npy("{'descr': '<f4', 'fortran_order': True, 'shape': (3, 2), }", f4))
put("npy", "big_endian.npy", npy("{'descr': '>f4', 'fortran_order': False, 'shape': (3, 2), }",
                                 f4))
put("npy", "f8.npy", npy("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }",
                         struct.pack("<3d", 1, 2, 3)))
put("npy", "shape_overflows.npy",
    npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, "
        "4294967296, 4294967296), }", f4))
put("npy", "shape_lies.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (300, 2), }",
                                 f4))
put("npy", "truncated.npy", good_x[:-5])
put("npy", "header_length_lies.npy", good_x[:8] + b"\xff\xff" + good_x[10:])
put("npy", "repeated_key.npy",
    npy("{'descr': '<f4', 'descr': '<i8', 'fortran_order': False, 'shape': (3, 2), }", f4))
put("npy", "negative_label.npy", npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
                                     struct.pack("<2q", 0, -5)))
put("npy", "nan.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }",
                          struct.pack("<2f", 1.0, float("nan"))))

# ---- safetensors: the hostile cases -------------------------------------------

def safetensors(header, data):
    text = header.encode()
    return struct.pack("<Q", len(text)) + text + data


two = struct.pack("<2f", 1.0, 2.0)
put("safetensors", "hostile_offsets_past_end.safetensors",
    safetensors('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4096]}}', two))
put("safetensors", "hostile_overlapping.safetensors",
    safetensors('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                '"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', two))
put("safetensors", "hostile_dtype_f16.safetensors",
    safetensors('{"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}}', two))
put("safetensors", "hostile_shape_overflows.safetensors",
    safetensors('{"a":{"dtype":"F32","shape":[4294967295,4294967295,4294967295,4294967295],'
                '"data_offsets":[0,8]}}', two))
put("safetensors", "hostile_header_length_lies.safetensors",
    struct.pack("<Q", 1 << 40) + b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' + two)
