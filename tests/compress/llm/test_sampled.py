"""Calibration text sampled from the model itself (``compress/llm/sampled.py``)."""

import pytest
from llm_convert_testing import tiny_llm

from modelpress.compress.llm.sampled import sample_windows, sampled_text
from modelpress.errors import InputError


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_llm(tmp_path_factory.mktemp("sampled"))


def test_windows_are_the_models_own_seeded_samples(folder):
    from modelpress.runtime.generate import Request, SamplingParams, Scheduler, open_llm

    llm = open_llm(folder, threads=1)
    seen = []
    ids = sample_windows(llm, windows=5, seq_len=20, seed=3, progress=lambda d, t: seen.append(t))
    special = set(llm.tokenizer.get_added_tokens_decoder())
    prefix = [llm.config.bos_token_id] if llm.config.add_bos_token else []
    assert len(ids) == 5 and all(len(w) == 20 - len(prefix) for w in ids)
    assert not {w[0] for w in ids} & special
    assert seen and set(seen) == {5 * (19 - len(prefix))}
    # sampled together, each window is what its prompt and seed give alone
    for i in (0, 4):
        params = SamplingParams(
            max_tokens=19 - len(prefix), temperature=1.0, seed=3 + i, ignore_eos=True
        )
        request = Request(prompt_ids=[*prefix, ids[i][0]], params=params)
        assert Scheduler(llm, max_seqs=1).run([request])[0].token_ids == ids[i][1:]
    assert sample_windows(llm, windows=5, seq_len=20, seed=3) == ids
    assert sample_windows(llm, windows=5, seq_len=20, seed=4) != ids
    text = sampled_text(folder, windows=5, seq_len=20, seed=3, threads=1)
    assert text == "\n\n".join(llm.decode(w) for w in ids)


def test_bad_sizes_are_one_line(folder):
    from modelpress.runtime.generate import open_llm

    llm = open_llm(folder, threads=1)
    with pytest.raises(InputError, match="cannot sample calibration text: 0 windows"):
        sample_windows(llm, windows=0, seq_len=20)
    with pytest.raises(InputError, match="of 1 tokens"):
        sample_windows(llm, windows=2, seq_len=1)
