"""verify(): generated inputs respect dtypes and index ranges; differences are found and reported."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from mp_testing import model_from_text

from modelpress.cli.main import main
from modelpress.errors import InputError, VerificationError
from modelpress.ir import save
from modelpress.verify import compare_arrays, generate_inputs, verify

EMBED = """
<ir_version: 8, opset_import: ["" : 17]>
g (int64[batch, seq] ids, int64[batch, seq] mask) => (float[batch, seq, 2] y) <float[7, 2] table = {0,1,2,3,4,5,6,7,8,9,10,11,12,13}> {
  ax = Constant<value = int64[1] {-1}>()
  i32 = Cast<to = 6>(ids)
  e = Gather(table, i32)
  mf = Cast<to = 1>(mask)
  mu = Unsqueeze(mf, ax)
  y = Mul(e, mu)
}
"""


def embed_model():
    return model_from_text(EMBED)


def test_generated_indices_stay_in_the_table_and_dims_follow_names():
    feeds = generate_inputs(embed_model(), dims={"batch": 3, "seq": 11}, seed=4)
    assert feeds["ids"].shape == (3, 11) and feeds["ids"].dtype == np.int64
    assert feeds["ids"].min() >= 0 and feeds["ids"].max() < 7
    assert set(np.unique(feeds["mask"])) <= {0, 1}


def test_same_model_passes_and_a_changed_weight_fails():
    a = embed_model()
    assert verify(a, embed_model(), dims={"seq": 5}).passed
    b = embed_model()
    table = b.graph.initializers["table"]
    arr = table.const_value.numpy().copy()
    arr[3, 1] += 0.01
    table.const_value = ir.tensor(arr, name="table")
    result = verify(a, b, input_sets=4, dims={"seq": 16})
    assert not result.passed
    assert result.outputs[0].max_abs == pytest.approx(0.01, rel=1e-3)
    with pytest.raises(VerificationError, match="output 'y'"):
        result.raise_if_failed()


def test_relative_error_is_relative_to_the_output_scale():
    d = compare_arrays(
        "o", np.array([100.0, 0.0], np.float32), np.array([100.0, 0.001], np.float32)
    )
    assert d.max_rel == pytest.approx(1e-5) and d.passed
    d = compare_arrays("o", np.array([1.0, np.nan], np.float32), np.array([1.0, 2.0], np.float32))
    assert not d.passed
    assert not compare_arrays("i", np.array([1, 2]), np.array([1, 3])).passed


def test_user_inputs_are_checked(tmp_path):
    with pytest.raises(InputError, match="missing input 'mask'"):
        verify(embed_model(), embed_model(), data={"ids": np.zeros((1, 2), np.int64)})


def test_cli_verify_exit_codes(tmp_path, capsys):
    a = save(embed_model(), tmp_path / "a.onnx")
    assert main(["verify", str(a), str(a), "--dim", "seq=3"]) == 0
    assert "PASS" in capsys.readouterr().out
    np.savez(tmp_path / "in.npz", ids=np.array([[1, 9]], np.int64), mask=np.ones((1, 2), np.int64))
    # index 9 is outside the 7-row table: the model cannot run on these inputs
    assert main(["verify", str(a), str(a), "--inputs", str(tmp_path / "in.npz")]) == 1
    assert capsys.readouterr().err.startswith(
        "error: the original model failed to run on the given inputs"
    )
