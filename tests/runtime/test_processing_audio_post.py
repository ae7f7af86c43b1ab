"""Audio pre-processing (WAV written by the standard library, raw PCM) and post-processing
(softmax, sigmoid, top-k, labels, thresholds) against numpy formulas."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest
from mp_testing import model_from_text
from pipeline_testing import audio_model, image_model

from modelpress.errors import InputError, OptionError
from modelpress.runtime.processing import Processing


def wav_bytes(samples: np.ndarray, rate: int = 8000, width: int = 2) -> bytes:
    """``samples`` (frames, channels) int16 (width 2) or uint8 (width 1) as a WAV file."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2" if width == 2 else np.uint8).tobytes())
    return buf.getvalue()


def test_wav_to_float_samples_padded_and_mixed_down():
    rng = np.random.default_rng(0)
    proc = Processing.declare(audio_model(length=16), pre="audio:rate=8000")
    short = rng.integers(-32768, 32767, (10, 1))
    stereo = rng.integers(-32768, 32767, (20, 2))
    x = proc.preprocess([wav_bytes(short), wav_bytes(stereo)])["x"]
    want0 = np.zeros(16)
    want0[:10] = short[:, 0] / 32768
    want1 = (stereo[:16] / 32768).mean(axis=1)
    np.testing.assert_allclose(x[0], want0, atol=1e-7)
    np.testing.assert_allclose(x[1], want1, atol=1e-6)
    u8 = rng.integers(0, 256, (16, 1))
    np.testing.assert_allclose(
        proc.preprocess([wav_bytes(u8, width=1)])["x"][0], (u8[:, 0] - 128) / 128, atol=1e-7
    )
    with pytest.raises(InputError, match=r"^item 0: sampled at 16000 Hz, .*pre\.rate"):
        proc.preprocess([wav_bytes(short, rate=16000)])
    with pytest.raises(InputError, match=r"^item 0: WAV file without a data chunk"):
        proc.preprocess([wav_bytes(short)[:40]])  # truncated inside the header
    with pytest.raises(InputError, match=r"^item 0: not a WAV file"):
        proc.preprocess([b"ID3 not a wav"])


def test_raw_pcm_in_overlapping_frames():
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[N, F, 4] x) => (float[N, F] y) <int64[1] a = {2}> { y = ReduceSumSquare<keepdims=0>(x, a) }
        """
    )
    proc = Processing.declare(model, pre="audio:format=f32le,frame=4,hop=2,length=10")
    sig = np.random.default_rng(1).standard_normal(12).astype("<f4")
    x = proc.preprocess([sig.tobytes()])["x"][0]
    want = np.stack([sig[s : s + 4] for s in range(0, 7, 2)])  # 1 + (10 - 4) // 2 = 4 frames
    np.testing.assert_array_equal(x, want)
    with pytest.raises(InputError, match="not a whole number of f32le frames"):
        proc.preprocess([sig.tobytes()[:-1]])
    with pytest.raises(OptionError, match=r"^pre\.frame: 5 given"):
        Processing.declare(model, pre="audio:format=f32le,frame=5,length=10")


def test_audio_declarations_name_the_field():
    cases = [
        (audio_model(length="L"), "audio:rate=8000", "pre.length"),  # any length: say one
        (audio_model(length=16), "audio:length=20", "pre.length"),
        (audio_model(length=16), "audio:channels=2", "pre.channels"),
        (audio_model(length=16), "audio:hop=2", "pre.hop"),
        (image_model(), "audio:length=8", "pre.input"),  # 4-D input
    ]
    for model, pre, field in cases:
        with pytest.raises(OptionError) as info:
            Processing.declare(model, pre=pre)
        assert str(info.value).startswith(f"{field}:"), (pre, str(info.value))


def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_softmax_topk_labels_threshold_equal_numpy(tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\nbird\nfish\n")
    logits = np.array([[1.0, 3.0, 2.0, 0.5], [0.1, 0.1, 0.3, -2.0]], np.float32)
    proc = Processing.declare(image_model(), post=f"softmax,topk=3,labels={labels}")
    got = proc.postprocess({"y": logits})
    p = softmax(logits.astype(np.float64))
    for row, answer in zip(p, got):
        order = np.argsort(-row, kind="stable")[:3]
        assert [c["index"] for c in answer["classes"]] == order.tolist()
        assert [c["label"] for c in answer["classes"]] == [
            ["cat", "dog", "bird", "fish"][i] for i in order
        ]
        np.testing.assert_allclose([c["score"] for c in answer["classes"]], row[order], rtol=1e-12)
    assert got[1]["classes"][:2] == [  # a tie keeps the lower index first
        {"index": 2, "score": pytest.approx(p[1, 2]), "label": "bird"},
        {"index": 0, "score": pytest.approx(p[1, 0]), "label": "cat"},
    ]
    sig = Processing.declare(image_model(), post="sigmoid,threshold=0.7").postprocess({"y": logits})
    s = 1 / (1 + np.exp(-logits.astype(np.float64)))
    assert [[c["index"] for c in a["classes"]] for a in sig] == [
        np.flatnonzero(r >= 0.7)[np.argsort(-r[r >= 0.7], kind="stable")].tolist() for r in s
    ]
    top1 = Processing.declare(image_model(), post="argmax").postprocess({"y": logits})
    assert [a["classes"][0]["index"] for a in top1] == logits.argmax(1).tolist()
    plain = Processing.declare(image_model(), post="softmax").postprocess({"y": logits})
    np.testing.assert_allclose([a["y"] for a in plain], p, rtol=1e-12)


def test_post_declarations_name_the_field(tmp_path):
    three = tmp_path / "three.txt"
    three.write_text("a\nb\nc\n")
    cases = [
        (f"labels={three}", "post.labels"),  # 3 labels, 4 classes
        (f"labels={tmp_path / 'missing.txt'}", "post.labels"),
        ("topk=5", "post.topk"),
        ("softmax,sigmoid", "post.sigmoid"),
        ("argmax,topk=2", "post.argmax"),
        ("output=logits", "post.output"),
        ("topk=two", "post.topk"),
        ("threshold=nan", "post.threshold"),
        ("temperature=2", "post.temperature"),
    ]
    for post, field in cases:
        with pytest.raises(OptionError) as info:
            Processing.declare(image_model(), post=post)
        assert str(info.value).startswith(f"{field}:"), (post, str(info.value))
