"""No [rows x length x vocabulary] tensor on any inference path, at a real vocabulary size.

A two-layer Llama with Llama 3's 128,256-token vocabulary runs each path under a torch dispatch
mode that records every tensor an op makes (views of their inputs aside). The bound: a
[rows x vocabulary] tensor of 8-byte elements (the nucleus sort's indices; the last position's
logits and the sampler's fp32 copies are half that) times 1.01; scored positions come in chunks
of ``SCORE_CHUNK``, set to the number of rows here so that a whole-sequence tensor would show. At
``rows x length`` = 8 x 40 positions, a [rows x length x vocabulary] fp32 tensor is 20 times the
bound.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

VOCAB = 128256
ROWS, PROMPT, NEW = 8, 24, 16


class LargestTensors(TorchDispatchMode):
    """Records the op and shape of every output tensor above ``bound`` bytes."""

    def __init__(self, bound: int):
        super().__init__()
        self.bound, self.seen = bound, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {x.untyped_storage().data_ptr() for x in tree_flatten((args, kwargs))[0]
                  if isinstance(x, torch.Tensor)}
        for t in tree_flatten(out)[0]:  # a view of an input (a weight's transpose) allocates nothing
            if isinstance(t, torch.Tensor) and t.numel() * t.element_size() > self.bound \
                    and t.untyped_storage().data_ptr() not in inputs:
                self.seen.append((str(func), tuple(t.shape)))
        return out


def _llama(hidden=32, layers=2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def lm():
    from pita.models.lm import LM

    torch.set_num_threads(1)
    tok = SimpleNamespace(eos_token_id=2, pad_token_id=0, bos_token_id=1)
    return LM(_llama(), tok, "cpu")


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    import pita.guidance.decode as decode
    import pita.models.lm as lm_mod

    monkeypatch.setattr(lm_mod, "SCORE_CHUNK", ROWS)  # well below ROWS x (PROMPT + NEW) positions
    monkeypatch.setattr(decode, "CANDIDATE_CHUNK", 4096)


BOUND = int(ROWS * VOCAB * 8 * 1.01)  # int64 indices of a [rows x vocabulary] sort are the widest


def _prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, VOCAB, (PROMPT - i,), generator=g).tolist() for i in range(ROWS)]


def test_sampling_keeps_one_position_of_logits(lm):
    with LargestTensors(BOUND) as mode:
        out = lm.generate_ids(_prompts(), NEW, seeds=list(range(ROWS)), temperature=1.0)
    assert len(out) == ROWS
    assert mode.seen == [], mode.seen[:5]


def test_sequence_logprobs_score_completion_positions_in_chunks(lm):
    comps = [list(range(10, 10 + NEW)) for _ in range(ROWS)]
    with LargestTensors(BOUND) as mode:
        got = lm.sequence_logprobs(_prompts(), comps, batch_size=ROWS, top_p=0.9)
    assert mode.seen == [], mode.seen[:5]
    # the same numbers as the whole-sequence computation they replace
    p = _prompts()
    for i in (0, ROWS - 1):
        ids = torch.tensor([p[i] + comps[i]])
        with torch.no_grad():
            logp = torch.log_softmax(lm.model(input_ids=ids).logits.float(), -1)[0]
        from pita.models.lm import nucleus

        logp = torch.log_softmax(logp.masked_fill(~nucleus(logp, 0.9), float("-inf")), -1)
        start = len(p[i])
        want = logp[start - 1:start - 1 + NEW].gather(-1, torch.tensor(comps[i]).unsqueeze(-1)).sum().item()
        assert got[i] == pytest.approx(want, rel=1e-5, abs=1e-4)


def test_proxy_rewards_read_the_last_state_only(lm):
    from pita.guidance.proxy import score_sequences
    from pita.guidance.value_model import HeadSpec, ValueModel

    vm = ValueModel(_llama(), HeadSpec(loss="bradley_terry", head_dim=16, vocab_size=VOCAB, hidden_size=32)).eval()
    seqs = [p + [5, 6, 7] for p in _prompts()]
    with LargestTensors(BOUND) as mode:
        got = score_sequences(vm, seqs, "cpu", batch=ROWS)
    assert mode.seen == [], mode.seen[:5]
    # as the per-position scores read at the last token
    ids = torch.tensor([seqs[0]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want = vm.token_scores(ids, mask)[0, -1, 0].item()
    assert got[0] == pytest.approx(want, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("head,top_k", [("embedding", 20), ("embedding", -1), ("reference", 20), ("reference", -1),
                                        ("q", 20), ("q", -1)])
def test_guided_sampling_scores_candidates_within_the_bound(lm, head, top_k):
    """The whole vocabulary as candidates (top_k=-1) is scored in chunks: the embedding head's
    [rows x candidates x head_dim] tensors, the reference head's candidate pass (its 4-D mask
    rows x chunk x (prefix + chunk), its activations) stay below the bound."""
    from pita.guidance.decode import GuidedDecoder
    from pita.guidance.value_model import HeadSpec, ValueModel

    vm = ValueModel(_llama(), HeadSpec(loss="bce", head_dim=16, vocab_size=VOCAB, hidden_size=32, head=head)).eval()
    guide = GuidedDecoder(vm, mode="bernoulli", eta=2.0, top_k=top_k)
    # the head's [rows x candidates x head_dim] tensors: bounded by the candidate chunk
    bound = max(BOUND, ROWS * 4096 * 16 * 4 * 2)
    with LargestTensors(bound) as mode:
        out = lm.generate_ids(_prompts(), 2 if head == "reference" else 4, seeds=list(range(ROWS)), temperature=1.0,
                              guide=guide)
    assert len(out) == ROWS
    assert mode.seen == [], mode.seen[:5]
