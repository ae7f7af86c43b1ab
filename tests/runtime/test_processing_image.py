"""Image pre-processing against a hand-written reference: Pillow's decode and resize, then the
crop, scale and normalisation formulas in numpy; declarations stored, read back, refused."""

from __future__ import annotations

import io

import numpy as np
import pytest
from onnx import TensorProto
from PIL import Image
from pipeline_testing import encode, image_model, random_image

from modelpress.errors import InputError, ModelLoadError, OptionError
from modelpress.runtime.processing import METADATA_KEY, Processing

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def reference(
    data: bytes, *, resize, crop, mode="RGB", scale=1 / 255, mean=(0.0,), std=(1.0,), layout="nchw"
):
    img = Image.open(io.BytesIO(data)).convert(mode)
    w, h = img.size
    if len(resize) == 1:  # the shorter side to N, the longer truncated
        n = resize[0]
        size = (n, int(n * h / w)) if w <= h else (int(n * w / h), n)
    else:
        size = (resize[1], resize[0])
    a = np.asarray(img.resize(size, Image.Resampling.BILINEAR), dtype=np.float64)
    if a.ndim == 2:
        a = a[:, :, None]
    ch, cw = crop
    top, left = int(round((a.shape[0] - ch) / 2)), int(round((a.shape[1] - cw) / 2))
    a = a[top : top + ch, left : left + cw]
    x = (a * scale - np.array(mean)) / np.array(std)
    return x.transpose(2, 0, 1) if layout == "nchw" else x


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_resize_crop_normalise_equal_the_formula(fmt):
    model = image_model()
    proc = Processing.declare(
        model,
        pre=f"image:resize=10,crop=8,mean={','.join(map(str, MEAN))},std={','.join(map(str, STD))}",
    )
    rng = np.random.default_rng(1)
    items = [encode(random_image(rng, 13, 17), fmt), encode(random_image(rng, 20, 11), fmt)]
    feeds = proc.preprocess(items)
    assert (
        list(feeds) == ["x"] and feeds["x"].shape == (2, 3, 8, 8) and feeds["x"].dtype == np.float32
    )
    for row, data in zip(feeds["x"], items):
        want = reference(data, resize=(10,), crop=(8, 8), mean=MEAN, std=STD)
        np.testing.assert_allclose(row, want, rtol=1e-5, atol=1e-5)


def test_gray_bgr_nhwc_exact_resize_and_defaults():
    rng = np.random.default_rng(2)
    data = encode(random_image(rng, 9, 14, "RGBA"))
    gray = Processing.declare(
        image_model(channels=1), pre="image:resize=8x8"
    )  # color follows the model
    assert gray.pre.color == "gray" and gray.pre.scale == pytest.approx(1 / 255)
    np.testing.assert_allclose(
        gray.preprocess([data])["x"][0],
        reference(data, resize=(8, 8), crop=(8, 8), mode="L"),
        atol=1e-6,
    )

    nhwc = Processing.declare(
        image_model(layout="nhwc", size=6), pre="image:color=bgr,scale=1,mean=100"
    )
    assert nhwc.pre.layout == "nhwc" and nhwc.pre.size == (6, 6)  # the model's own size
    got = nhwc.preprocess([data])["x"][0]
    want = reference(data, resize=(6, 6), crop=(6, 6), scale=1, mean=(100,), layout="nhwc")[
        :, :, ::-1
    ]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_uint8_model_gets_pixels_as_they_are_and_small_images_are_padded():
    model = image_model(dtype=TensorProto.UINT8, size=8)
    proc = Processing.declare(model, pre="image:crop=8")  # no resize: a 5x6 image is padded
    img = random_image(np.random.default_rng(3), 5, 6)
    x = proc.preprocess([encode(img)])["x"][0]
    assert x.dtype == np.uint8
    want = np.zeros((8, 8, 3), np.uint8)
    want[1:6, 1:7] = np.asarray(img)  # torchvision's padding: (8-5)//2 above, (8-6)//2 left
    np.testing.assert_array_equal(x, want.transpose(2, 0, 1))
    with pytest.raises(OptionError, match=r"^pre\.mean: the model takes uint8 pixels"):
        Processing.declare(model, pre="image:crop=8,mean=0.5")


def test_declaration_is_stored_and_read_back_complete():
    model = image_model()
    proc = Processing.declare(
        model, pre="image:resize=10,crop=8,mean=0.5,std=0.25", post="softmax,topk=2"
    )
    proc.store(model)
    assert METADATA_KEY in model.metadata_props
    again = Processing.from_model(model)
    assert again == proc
    assert again.to_dict()["pre"] == {
        "kind": "image", "input": "x", "resize": [10], "crop": [8, 8], "interp": "bilinear", "color": "rgb",
        "scale": 1 / 255, "mean": [0.5], "std": [0.25], "layout": "nchw", "dtype": "float32",
    }  # fmt: skip
    assert Processing.from_model(image_model()) is None


@pytest.mark.parametrize(
    ("pre", "field"),
    [
        ("image:resize=10,crop=8,mean=0.1,0.2", "pre.mean"),  # 2 values for 3 channels
        ("image:color=gray,crop=8", "pre.color"),  # 1 channel, the model has 3
        ("image:crop=9", "pre.crop"),  # the model takes 8
        ("image:resize=10", "pre.crop"),  # size not fixed
        ("image:crop=8,sharpen=1", "pre.sharpen"),  # unknown key
        ("image:crop=8,std=0", "pre.std"),
        ("image:crop=8,dtype=float16", "pre.dtype"),
        ("image:crop=8,interp=cubic", "pre.interp"),
        ("image:crop=8,input=y", "pre.input"),
        ("image:crop=8,resize=ten", "pre.resize"),
        ("video:crop=8", "pre"),
    ],
)
def test_bad_declarations_are_refused_naming_the_field(pre, field):
    with pytest.raises(OptionError) as info:
        Processing.declare(image_model(), pre=pre)
    msg = str(info.value)
    assert msg.startswith(f"{field}:") and "\n" not in msg


def test_unreadable_items_name_the_item():
    proc = Processing.declare(image_model(), pre="image:crop=8")
    good = encode(random_image(np.random.default_rng(4), 8, 8))
    with pytest.raises(InputError, match=r"^item 1: not a PNG, JPEG"):
        proc.preprocess([good, b"not an image"])
    with pytest.raises(InputError, match=r"^item 0: not a readable image"):
        proc.preprocess([good[: len(good) // 2]])  # truncated PNG
    with pytest.raises(InputError, match=r"an image model takes the file's bytes, got str"):
        proc.preprocess(["/etc/passwd"])  # a string is never opened as a path


def test_stored_declaration_that_no_longer_fits_is_refused():
    model = image_model()
    Processing.declare(model, pre="image:crop=8").store(model)
    other = image_model(size=6)
    other.metadata_props.update(model.metadata_props)
    with pytest.raises(ModelLoadError, match=r"does not fit it: pre\.crop"):
        Processing.from_model(other)
    other.metadata_props[METADATA_KEY] = "{not json"
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        Processing.from_model(other)
