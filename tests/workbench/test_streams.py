"""HD stream analyses."""

import pytest
import torch
from helpers import tokens

from models import expand_streams
from workbench import build_model
from workbench.runtime.tokenizer import CharTokenizer
from workbench.studies.streams import attention_mass, stream_logit_lens, stream_similarity


def test_replicated_streams_are_identical_until_a_cross_stream_layer():
    base = build_model("baseline", "debug", n_layers=3)
    hd = expand_streams(base, 2, cross_layers=(1,))
    sim = stream_similarity(hd, tokens(2, 10))
    assert sim.shape == (3, 2, 2)
    torch.testing.assert_close(sim[0], torch.ones(2, 2))  # E_2 = E_1, intra-stream block 0
    assert sim[1, 0, 1] < 1 - 1e-4  # block 1 mixes streams causally: stream 1 sees stream 0, not vice versa
    torch.testing.assert_close(torch.diagonal(sim, dim1=1, dim2=2), torch.ones(3, 2))


def test_attention_mass_sums_to_one_and_is_all_own_stream_in_intra_layers():
    hd = build_model("hd", "debug", n_streams=3, n_layers=3, cross_layers=(2,))
    mass = attention_mass(hd, tokens(2, 8))
    assert mass[0] == {"own_stream": 1.0, "other_stream_same_token": 0.0, "other_stream_earlier_tokens": 0.0}
    cross = mass[2]
    assert abs(sum(cross.values()) - 1) < 1e-5 and 0 < cross["own_stream"] < 1 and cross["other_stream_same_token"] > 0


def test_logit_lens_last_stream_is_the_model_prediction():
    hd = build_model("hd", "debug", n_streams=2)
    toks = tokens(2, 12)
    lens = stream_logit_lens(hd, toks)
    with torch.no_grad():
        logits = hd(toks)[:, :-1]
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), toks[:, 1:].flatten())
    assert abs(lens["loss"][-1] - float(want)) < 1e-5 and len(lens["accuracy"]) == 2
    with pytest.raises(ValueError, match="Hidden Decoding model"):
        stream_logit_lens(build_model("fbt", "debug"), toks)


def test_stream_norms_start_equal_for_replicated_streams_and_windows_are_held_out():
    from workbench.studies.streams import stream_norms, task_windows

    base = build_model("baseline", "debug", n_layers=2)
    hd = expand_streams(base, 3, cross_layers=(1,))
    x, _ = task_windows("flipflop", 4, 16, tokenizer=CharTokenizer())
    assert x.shape == (4, 16) and x.dtype == torch.long
    norms = stream_norms(hd, x)
    assert norms.shape == (3, 3)
    torch.testing.assert_close(norms[0], norms[0, :1].expand(3))  # E_k replicated: equal inputs
    torch.testing.assert_close(norms[1], norms[1, :1].expand(3))  # intra-stream block 0 keeps them equal
    with pytest.raises(ValueError, match="seq_len=1"):
        task_windows("flipflop", 4, 1, tokenizer=CharTokenizer())
