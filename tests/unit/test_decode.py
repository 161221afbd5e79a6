"""gpufeed.decode: headers, both backends, DCT scaling, EXIF orientation, bad input."""

from __future__ import annotations

import io
import warnings

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufeed.decoders import (
    ImageHeader,
    _backends,
    apply_orientation,
    backends,
    choose_factor,
    decode,
    decode_planes,
    plane_subsampling,
    read_header,
    scaled_size,
)
from gpufeed.decoders._backends import FACTORS
from gpufeed.errors import BackendFallbackWarning, BackendUnavailableError, DecodeError
from gpufeed.synth import encode, photo_like, with_exif_orientation

TURBO = backends()["turbojpeg"]["available"]
requires_turbojpeg = pytest.mark.skipif(
    not TURBO, reason=f"libturbojpeg not loadable: {backends()['turbojpeg']['reason']}")

# Both backends are libjpeg-turbo underneath (OpenCV bundles it) with the same IDCT, so they agree
# to within this many 8-bit levels per pixel (measured: identical; the slack covers an OpenCV
# built against another libjpeg).
PARITY_MAX_ABS = 4
PARITY_MEAN_ABS = 0.5

SIZES = [(350, 400), (17, 23), (480, 640), (1, 1)]


def _jpeg_variants():
    img = photo_like(120, 161, seed=3, noise=2)
    return {
        "baseline420": encode(img, quality=90),
        "baseline444": encode(img, quality=90, subsampling="444"),
        "baseline422": encode(img, quality=90, subsampling="422"),
        "progressive420": encode(img, quality=90, progressive=True),
        "progressive444": encode(img, quality=85, progressive=True, subsampling="444"),
        "gray": encode(img[..., 1], quality=90),
    }


JPEGS = _jpeg_variants()


def _cmyk_jpeg(img: np.ndarray) -> bytes:
    pil = pytest.importorskip("PIL.Image", reason="pillow is needed to write a CMYK JPEG")
    bio = io.BytesIO()
    pil.fromarray(img).convert("CMYK").save(bio, "JPEG", quality=95)
    return bio.getvalue()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("fmt", ["jpeg", "png", "webp", "bmp"])
def test_header_matches_decoded_shape(size, fmt):
    data = encode(photo_like(*size, seed=1), fmt)
    header = read_header(data)
    assert (header.height, header.width) == size
    assert header.fmt == (fmt if fmt in ("jpeg", "png") else "other")
    img = decode(data)
    assert img.shape == (*size, 3) and img.dtype == np.uint8 and img.flags.c_contiguous


@pytest.mark.parametrize("name", sorted(JPEGS))
def test_jpeg_variants_decode_close_to_source(name):
    data = JPEGS[name]
    header = read_header(data)
    assert header.progressive == name.startswith("progressive")
    assert header.channels == (1 if name == "gray" else 3)
    img = decode(data)
    assert img.shape == (120, 161, 3)
    source = photo_like(120, 161, seed=3, noise=2)
    if name == "gray":
        assert np.array_equal(img[..., 0], img[..., 1]) and np.array_equal(img[..., 1], img[..., 2])
        source = np.repeat(source[..., 1:2], 3, axis=2)
    assert np.abs(img.astype(np.int16) - source).mean() < 5  # JPEG loss at quality 85-90


@requires_turbojpeg
@pytest.mark.parametrize("name", sorted(JPEGS))
@pytest.mark.parametrize("min_side", [None, 20, 40, 60])
def test_backend_parity(name, min_side):
    data = JPEGS[name]
    a = decode(data, min_height=min_side, min_width=min_side, backend="turbojpeg")
    b = decode(data, min_height=min_side, min_width=min_side, backend="opencv")
    assert a.shape == b.shape
    diff = np.abs(a.astype(np.int16) - b)
    assert diff.max() <= PARITY_MAX_ABS and diff.mean() <= PARITY_MEAN_ABS


def test_png_variants_decode_exactly():
    img = photo_like(31, 47, seed=5)
    assert np.array_equal(decode(encode(img, "png")), img)
    gray = decode(encode(img[..., 0], "png"))
    assert np.array_equal(gray, np.repeat(img[..., :1], 3, axis=2))
    alpha = np.full(img.shape[:2], 7, np.uint8)
    ok, rgba = cv2.imencode(".png", np.dstack([img[..., ::-1], alpha]))
    assert ok
    assert read_header(rgba.tobytes()).channels == 4
    assert np.array_equal(decode(rgba.tobytes()), img)  # alpha dropped, as PIL's convert("RGB")


def _pil_rgb(data: bytes) -> np.ndarray:
    pil = pytest.importorskip("PIL.Image", reason="pillow is the reference for deep and low-bit images")
    return np.asarray(pil.open(io.BytesIO(data)).convert("RGB"))


def _cv2_encoded(arr: np.ndarray, ext: str) -> bytes:
    ok, data = cv2.imencode(ext, arr)
    assert ok
    return data.tobytes()


_DEEP = np.random.default_rng(3)


@pytest.mark.parametrize("name, data", [
    ("grey16.png", _cv2_encoded(_DEEP.integers(0, 65536, (21, 33)).astype(np.uint16), ".png")),
    ("grey16-low.png", _cv2_encoded(_DEEP.integers(0, 300, (21, 33)).astype(np.uint16), ".png")),
    ("rgb16.png", _cv2_encoded(_DEEP.integers(0, 65536, (21, 33, 3)).astype(np.uint16), ".png")),
    ("rgba16.png", _cv2_encoded(_DEEP.integers(0, 65536, (21, 33, 4)).astype(np.uint16), ".png")),
    ("grey16.tif", _cv2_encoded(_DEEP.integers(0, 65536, (21, 33)).astype(np.uint16), ".tiff")),
    ("float.tif", _cv2_encoded((_DEEP.random((21, 33)) * 400 - 50).astype(np.float32), ".tiff")),
])
def test_deep_images_decode_as_pil_converts_them(name, data):
    """16-bit and float greyscale images: PIL's convert("RGB") (what torchvision's loaders give)
    clips their values to 0-255; OpenCV's colour decode would keep the high byte instead."""
    header = read_header(data)
    assert header.bit_depth == (32 if name.startswith("float") else 16)
    out = decode(data)
    assert out.shape == (21, 33, 3) and out.dtype == np.uint8 and out.flags.c_contiguous
    assert np.array_equal(out, _pil_rgb(data))


@pytest.mark.parametrize("mode, bits", [("1", 1), ("L", 2), ("L", 4), ("P", 1), ("P", 4)])
def test_low_bit_pngs_decode_as_pil_converts_them(mode, bits):
    pil = pytest.importorskip("PIL.Image", reason="pillow writes low-bit PNGs")
    grey = photo_like(19, 27, seed=bits)[..., 0]
    if mode == "L":  # levels that a 2- or 4-bit PNG keeps exactly
        step = 255 // (2 ** bits - 1)
        image = pil.fromarray((grey >> (8 - bits)) * step)
    else:
        image = pil.fromarray(grey).convert(mode) if mode == "1" else pil.fromarray(
            photo_like(19, 27, seed=bits)).convert("P", palette=pil.ADAPTIVE, colors=2 ** bits)
    buf = io.BytesIO()
    image.save(buf, "png", **({"bits": bits} if mode == "L" else {}))
    data = buf.getvalue()
    assert read_header(data).bit_depth == bits
    assert np.array_equal(decode(data), _pil_rgb(data))


def test_buffer_types_accepted():
    data = JPEGS["baseline420"]
    ref = decode(data)
    for buf in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert np.array_equal(decode(buf), ref)
    with pytest.raises(TypeError, match="encoded image must be bytes"):
        decode("not bytes")  # type: ignore[arg-type]


# --- DCT scaling ----------------------------------------------------------------------------

@requires_turbojpeg
def test_turbojpeg_scaled_sizes_follow_ceil_rule():
    data = encode(photo_like(349, 401, seed=2))
    header = read_header(data)
    for num, den in FACTORS:
        min_h, min_w = scaled_size(349, 401, (num, den))
        img = decode(data, min_height=min_h, min_width=min_w, backend="turbojpeg")
        assert img.shape[:2] == (-(-349 * num // den), -(-401 * num // den))
        assert choose_factor(header, min_h, min_w, "turbojpeg") == (num, den)


def test_opencv_scaled_sizes_follow_ceil_rule():
    data = encode(photo_like(349, 401, seed=2))
    for den, expect in [(8, (44, 51)), (4, (88, 101)), (2, (175, 201)), (1, (349, 401))]:
        img = decode(data, min_height=expect[0], min_width=expect[1], backend="opencv")
        assert img.shape[:2] == expect, den


@requires_turbojpeg
@settings(max_examples=200, deadline=None)
@given(h=st.integers(1, 5000), w=st.integers(1, 5000), mh=st.integers(1, 6000),
       mw=st.integers(1, 6000))
def test_choose_factor_is_smallest_sufficient(h, w, mh, mw):
    header = ImageHeader(height=h, width=w, fmt="jpeg")
    factors = FACTORS
    chosen = choose_factor(header, mh, mw, "turbojpeg")
    ch, cw = scaled_size(h, w, chosen)
    if chosen != (1, 1):
        assert ch >= mh and cw >= mw
    for f in factors:
        if f[0] / f[1] < chosen[0] / chosen[1]:
            fh, fw = scaled_size(h, w, f)
            assert fh < mh or fw < mw, f"{f} is smaller than {chosen} and still large enough"


def test_non_jpeg_ignores_min_size():
    data = encode(photo_like(64, 80, seed=1), "png")
    assert decode(data, min_height=8, min_width=8).shape == (64, 80, 3)


def test_min_size_larger_than_image_gives_full_size():
    data = JPEGS["baseline420"]
    assert decode(data, min_height=1000, min_width=1000).shape == (120, 161, 3)


# --- EXIF orientation -----------------------------------------------------------------------

def _reference_orientation(img: np.ndarray, o: int) -> np.ndarray:
    # As PIL's ImageOps.exif_transpose, written with numpy.
    t = img.transpose(1, 0, 2)
    return {1: img, 2: img[:, ::-1], 3: img[::-1, ::-1], 4: img[::-1], 5: t,
            6: t[:, ::-1], 7: t[::-1, ::-1], 8: t[::-1]}[o]


@pytest.mark.parametrize("orientation", range(1, 9))
def test_apply_orientation_matches_reference(orientation):
    img = photo_like(5, 7, seed=0)
    assert np.array_equal(apply_orientation(img, orientation),
                          _reference_orientation(img, orientation))


@pytest.mark.parametrize("backend", [None, "opencv"])
@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("big_endian", [False, True])
def test_exif_orientation_applied(backend, orientation, big_endian):
    plain = JPEGS["baseline444"]
    data = with_exif_orientation(plain, orientation, big_endian=big_endian)
    header = read_header(data)
    assert header.orientation == orientation
    expect = _reference_orientation(decode(plain, backend=backend), orientation)
    assert (header.height, header.width) == expect.shape[:2]
    assert np.array_equal(decode(data, backend=backend), expect)


def test_exif_orientation_matches_pillow():
    pil = pytest.importorskip("PIL.Image", reason="pillow compares EXIF handling")
    ops = pytest.importorskip("PIL.ImageOps")
    data = with_exif_orientation(JPEGS["baseline444"], 6)
    ref = np.asarray(ops.exif_transpose(pil.open(io.BytesIO(data))).convert("RGB"))
    assert np.abs(decode(data).astype(np.int16) - ref).mean() < 1.5


@pytest.mark.parametrize("backend", [None, "opencv"])
def test_exif_min_size_is_in_displayed_axes(backend):
    data = with_exif_orientation(encode(photo_like(160, 320, seed=4)), 6)
    assert read_header(data).height == 320
    img = decode(data, min_height=160, min_width=40, backend=backend)
    assert img.shape == (160, 80, 3)  # 1/2 scale; 1/4 would give width 40 but height 80


# --- CMYK -----------------------------------------------------------------------------------

def test_cmyk_jpeg_decodes_through_opencv():
    img = photo_like(64, 96, seed=6)
    data = _cmyk_jpeg(img)
    header = read_header(data)
    assert header.cmyk and header.channels == 4
    full = decode(data)
    assert full.shape == (64, 96, 3)
    assert np.abs(full.astype(np.int16) - img).mean() < 6
    small = decode(data, min_height=16, min_width=16)  # OpenCV DCT-scales CMYK too
    assert small.shape == (16, 24, 3)
    ref = cv2.resize(full, (24, 16), interpolation=cv2.INTER_AREA)
    assert np.abs(small.astype(np.int16) - ref).mean() < 6


# --- bad input ------------------------------------------------------------------------------

def _bad_inputs():
    jpeg = JPEGS["baseline420"]
    png = encode(photo_like(40, 40, seed=1), "png")
    return {
        "empty": b"",
        "text": b"hello, this is not an image",
        "zeros": bytes(1000),
        "jpeg_soi_only": b"\xff\xd8\xff",
        "jpeg_header_cut": jpeg[:120],
        "jpeg_truncated_half": jpeg[: len(jpeg) // 2],
        "jpeg_truncated_end": jpeg[:-2],
        "progressive_truncated": JPEGS["progressive420"][: len(JPEGS["progressive420"]) * 2 // 3],
        "png_truncated": png[: len(png) // 2],
        "png_header_cut": png[:20],
    }


BAD = _bad_inputs()


@pytest.mark.parametrize("backend", [None, "opencv"])
@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_raises_decode_error(name, backend):
    with pytest.raises(DecodeError) as info:
        decode(BAD[name], backend=backend)
    assert str(info.value)  # says what failed
    assert isinstance(info.value, ValueError)


@requires_turbojpeg
def test_truncated_jpeg_message_says_premature_end():
    with pytest.raises(DecodeError, match="Premature end of JPEG"):
        decode(BAD["jpeg_truncated_half"], backend="turbojpeg")


def test_trailing_bytes_after_eoi_are_fine():
    data = JPEGS["baseline420"]
    assert np.array_equal(decode(data + b"\x00" * 100), decode(data))


# --- backends and the fallback --------------------------------------------------------------

@pytest.fixture
def without_turbojpeg():
    state = _backends.load_turbojpeg("/nonexistent/libturbojpeg.so.0")
    _backends.set_turbo_state(state)
    yield state
    _backends.set_turbo_state(None)


def test_fallback_to_opencv_warns_once(without_turbojpeg):
    assert not without_turbojpeg.available and "nonexistent" in without_turbojpeg.reason
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = decode(JPEGS["baseline420"])
        b = decode(JPEGS["baseline420"], min_height=30, min_width=30)
    fallback = [w for w in caught if issubclass(w.category, BackendFallbackWarning)]
    assert len(fallback) == 1 and "apt-get install libturbojpeg0" in str(fallback[0].message)
    assert a.shape == (120, 161, 3) and b.shape == (30, 41, 3)
    info = backends()
    assert info["jpeg"] == "opencv" and "nonexistent" in info["turbojpeg"]["reason"]
    with pytest.raises(BackendUnavailableError, match="backend='turbojpeg'"):
        decode(JPEGS["baseline420"], backend="turbojpeg")


def test_unknown_backend_rejected():
    with pytest.raises(ValueError, match="`backend` must be None or one of"):
        decode(JPEGS["baseline420"], backend="pil")


# --- planes ---------------------------------------------------------------------------------

_SAMPLING = {"420": ((2, 2), (2, 2)), "422": ((2, 1), (1, 2)), "444": ((1, 1), (1, 1)),
             "440": ((1, 2), (2, 1))}  # name: (luma (h, v) sampling, (sub_y, sub_x))


def _jpeg_440(img: np.ndarray, quality: int = 90) -> bytes:
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR),
                           [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
                            cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440])
    assert ok
    return buf.tobytes()


def _layout_jpeg(layout: str, img: np.ndarray) -> bytes:
    return _jpeg_440(img) if layout == "440" else encode(img, quality=90, subsampling=layout)


@pytest.mark.parametrize("layout", sorted(_SAMPLING))
def test_header_reads_sampling_and_colorspace(layout):
    header = read_header(_layout_jpeg(layout, photo_like(40, 50, seed=1)))
    luma, sub = _SAMPLING[layout]
    assert header.sampling == (luma, (1, 1), (1, 1)) and header.colorspace == "ycbcr"
    assert plane_subsampling(header) == sub


def test_header_colorspace_of_grey_cmyk_rgb_and_non_jpeg():
    gray = read_header(JPEGS["gray"])
    assert (gray.colorspace, gray.sampling, plane_subsampling(gray)) == ("gray", ((1, 1),), (1, 1))
    cmyk = read_header(_cmyk_jpeg(photo_like(32, 48, seed=6)))
    assert cmyk.colorspace in ("cmyk", "ycck") and plane_subsampling(cmyk) is None
    # APP14/Adobe with transform 0 instead of APP0/JFIF: libjpeg reads the components as RGB.
    ycc = _jpeg_440(photo_like(32, 48, seed=6))
    adobe = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"
    rgb = read_header(ycc[:2] + adobe + ycc[4 + int.from_bytes(ycc[4:6], "big"):])
    assert rgb.colorspace == "rgb" and plane_subsampling(rgb) is None
    png = read_header(encode(photo_like(20, 20, seed=1), "png"))
    assert (png.colorspace, png.sampling, plane_subsampling(png)) == ("", (), None)


@requires_turbojpeg
@pytest.mark.parametrize("factor", [(1, 1), (1, 2), (1, 8)])
@pytest.mark.parametrize("size", [(120, 161), (17, 23), (1, 1)])
@pytest.mark.parametrize("layout", sorted(_SAMPLING))
def test_decode_planes_sizes_and_colour(layout, size, factor):
    data = _layout_jpeg(layout, photo_like(*size, seed=2, noise=2))
    y, cb, cr = decode_planes(data, factor=factor)
    h, w = scaled_size(*size, factor)
    sub_y, sub_x = _SAMPLING[layout][1]
    assert y.shape == (h, w) and cb.shape == cr.shape == (-(-h // sub_y), -(-w // sub_x))
    if factor == (1, 1) and min(size) > 1:
        # Upsampled and converted with OpenCV, the planes give the RGB decode back (libjpeg
        # upsamples chroma with the same centred bilinear weights at 2x): measured max 2 levels.
        padded = (cb.shape[1] * sub_x, cb.shape[0] * sub_y)  # libjpeg pads luma to whole samples
        up = [cv2.resize(c, padded, interpolation=cv2.INTER_LINEAR)[:h, :w] for c in (cr, cb)]
        rgb = cv2.cvtColor(cv2.merge([y, *up]), cv2.COLOR_YCrCb2RGB)
        assert np.abs(rgb.astype(np.int16) - decode(data)).max() <= 3


@requires_turbojpeg
@pytest.mark.parametrize("factor", [(1, 1), (1, 4)])
def test_decode_planes_grey_is_the_rgb_decode(factor):
    (y,) = decode_planes(JPEGS["gray"], factor=factor)
    rgb = decode(JPEGS["gray"], min_height=-(-120 * factor[0] // factor[1]),
                 min_width=-(-161 * factor[0] // factor[1]))
    assert np.array_equal(y, rgb[..., 0])


@requires_turbojpeg
@pytest.mark.parametrize("name", ["jpeg_truncated_half", "progressive_truncated"])
def test_decode_planes_truncated_raises_like_decode(name):
    with pytest.raises(DecodeError, match="Premature end of JPEG|truncated or corrupt"):
        decode_planes(BAD[name])
    grey = JPEGS["gray"]
    with pytest.raises(DecodeError, match="Premature end of JPEG"):
        decode_planes(grey[: len(grey) // 2])


@requires_turbojpeg
def test_decode_planes_checks_plane_sizes_against_header():
    data = JPEGS["baseline420"]
    wrong = ImageHeader(height=121, width=161, fmt="jpeg", sampling=((2, 2), (1, 1), (1, 1)),
                        colorspace="ycbcr")
    with pytest.raises(DecodeError, match="differ from the header"):
        decode_planes(data, header=wrong)


@pytest.mark.parametrize("kind", ["png", "cmyk"])
def test_decode_planes_refuses_what_has_no_ycbcr_planes(kind):
    data = (encode(photo_like(20, 20, seed=1), "png") if kind == "png"
            else _cmyk_jpeg(photo_like(20, 20, seed=1)))
    with pytest.raises(ValueError, match="YCbCr or greyscale JPEG"):
        decode_planes(data)


def test_truncation_is_caught_when_threads_decode_at_once():
    # PyTurboJPEG reports it by a warning; threads decoding together must not lose one.
    from concurrent.futures import ThreadPoolExecutor

    data = encode(photo_like(96, 128, seed=4))
    cut = data[: len(data) // 2]

    def caught(_: int) -> bool:
        try:
            decode(cut, min_height=12, min_width=16)
        except DecodeError:
            return True
        return False

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(caught, range(200)))
