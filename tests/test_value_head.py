"""The reference value head (pita/guidance/value_model.py): each candidate runs through the
backbone in one batched pass over the prefix's KV cache, scored as training scores it."""

import pytest
import torch

from pita.core.errors import ConfigError
from pita.guidance.value_model import HeadSpec, ValueModel


def _gemma3(window: int = 4):
    """A two-kind model built here: three sliding-window layers (window 4) and one full layer."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=window,
                           layer_types=["sliding_attention"] * 3 + ["full_attention"], max_position_embeddings=256)
    torch.manual_seed(0)
    return Gemma3ForCausalLM(cfg).eval()


def _reference_vm(backbone):
    tc = backbone.config.get_text_config()
    vm = ValueModel(backbone, HeadSpec("bce", vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, head="reference")).eval()
    torch.manual_seed(1)
    torch.nn.init.normal_(vm.score.weight, std=1.0)  # scores that differ visibly between candidates
    return vm


@pytest.mark.parametrize("model", ["tiny", "gemma3-eager", "gemma3-sdpa"])
def test_candidates_scored_in_one_pass_equal_each_candidate_appended_alone(tiny, model):
    """Left-padded rows, a prompt and two cached steps; then k candidates in one pass: each score
    equals the score of the prefix + that candidate run from scratch, and the cache (every layer,
    sliding-window ones included, the prefix longer than their window) is unchanged."""
    from transformers import AutoModelForCausalLM

    if model == "tiny":
        bb = AutoModelForCausalLM.from_pretrained(tiny["guidance"]).eval()
    else:
        bb = _gemma3()
        bb.config._attn_implementation = model.split("-")[1]
    vm = _reference_vm(bb)
    V = vm.spec.vocab_size
    g = torch.Generator().manual_seed(2)
    B, L, k = 3, 9, 6
    ids = torch.randint(3, min(V, 200), (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[0, :3], mask[1, :1] = 0, 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        _, past = vm.hidden(ids, mask, pos, use_cache=True)
        for _ in range(2):
            feed = torch.randint(3, min(V, 200), (B, 1), generator=g)
            mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.long)], 1)
            step = pos[:, -1:] + 1
            _, past = vm.hidden(feed, mask, step, past_key_values=past, use_cache=True)
            ids, pos = torch.cat([ids, feed], 1), torch.cat([pos, step], 1)
        before = [(layer.keys.clone(), layer.values.clone()) for layer in past.layers]
        cands = torch.randint(3, min(V, 200), (B, k), generator=g)
        got = vm.candidate_scores(past, mask, pos[:, -1] + 1, cands)[..., 0]
        assert all(torch.equal(a, layer.keys) and torch.equal(b, layer.values)
                   for (a, b), layer in zip(before, past.layers))
        for b in range(B):
            real = ids[b][mask[b].bool()]
            each = torch.cat([real.expand(k, -1), cands[b].unsqueeze(-1)], 1)
            want = vm.token_scores(each, torch.ones_like(each))[:, -1, 0]
            assert torch.allclose(got[b], want, atol=1e-4), (got[b], want)
    assert float(got.std()) > 0.1  # the candidates' scores differ: the check is not of constants


@pytest.mark.parametrize("window", [4, 64])
def test_the_candidate_pass_leaves_no_cache_behind_for_the_cyclic_collector(window):
    """The pass's view of the cache is freed when the pass returns: nothing of it (a layer, the
    prefix's keys and values) waits for the cyclic garbage collector, which a job's GPU memory
    cannot wait for (a leaked view held a whole value-model cache beside the grown one)."""
    import gc

    from transformers.cache_utils import DynamicLayer

    vm = _reference_vm(_gemma3(window))
    B, L, k = 2, 7, 3
    ids = torch.randint(3, 200, (B, L), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(B, L, dtype=torch.long)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        _, past = vm.hidden(ids, mask, pos, use_cache=True)
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            vm.candidate_scores(past, mask, pos[:, -1] + 1, torch.randint(3, 200, (B, k)))
            gc.collect()
            cyclic = [o for o in gc.garbage if isinstance(o, DynamicLayer) or
                      (isinstance(o, torch.Tensor) and any(o.data_ptr() == layer.keys.data_ptr() for layer in past.layers))]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert not cyclic, f"{len(cyclic)} objects of the candidate pass's cache view left for the cyclic collector"


def test_the_reference_head_saves_loads_and_refuses_another_head(tiny, tmp_path):
    vm = ValueModel.create(tiny["guidance"], loss="mle", num_atoms=5, v_min=0, v_max=1)
    assert vm.spec.head == "reference" and not hasattr(vm, "w_lm")
    vm.save(tmp_path / "ck")
    back = ValueModel.load(tmp_path / "ck", expect=HeadSpec("mle", 5, 0.0, 1.0, 128, head="reference"))
    assert torch.equal(back.score.weight, vm.score.weight)
    with pytest.raises(ConfigError, match="head: checkpoint 'reference' vs config 'embedding'"):
        ValueModel.load(tmp_path / "ck", expect=HeadSpec("mle", 5, 0.0, 1.0, 128, head="embedding"))
    with pytest.raises(ConfigError, match="head='V' is not known"):
        HeadSpec(head="V").check()


@pytest.mark.parametrize("loss", ["bce", "mle"])
def test_the_q_head_is_qsharps_vocabulary_wide_linear_layer_read_at_the_candidates(tiny, tmp_path, loss):
    """Q#'s Q classifier: Linear(H, vocabulary x n_out) on the state before the candidate, indexed
    by the candidate. pita gathers the candidates' rows instead of computing the whole vocabulary:
    the same numbers, at decoding (k candidates of one state) and in training (position t's state
    scores token t + 1). No LM prior; it saves, loads and is refused as another head."""
    vm = ValueModel.create(tiny["guidance"], loss=loss, num_atoms=5, head="q").eval()
    V, H, n_out = vm.spec.vocab_size, vm.spec.hidden_size, vm.spec.n_out
    assert tuple(vm.q.weight.shape) == (V, n_out, H) and not hasattr(vm, "w_lm") and not vm.lm_weight.any()
    torch.manual_seed(3)
    with torch.no_grad():
        vm.q.weight.normal_(0, 0.5)
        vm.q.bias.normal_(0, 0.5)
    full = torch.nn.Linear(H, V * n_out)  # the reference's layer, with the same numbers
    with torch.no_grad():
        full.weight.copy_(vm.q.weight.reshape(V * n_out, H))
        full.bias.copy_(vm.q.bias.repeat(V))
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        h, _ = vm.hidden(ids, torch.ones_like(ids))
        want = full(h).view(1, ids.shape[1], V, n_out)
        cands = torch.tensor([3, 40, 41, 99])
        assert torch.allclose(vm.scores(h[0, -1], cands), want[0, -1, cands], atol=1e-5)
        got = vm.token_scores(ids, torch.ones_like(ids))  # [1, T-1, n_out]
        assert torch.allclose(got[0], want[0, :-1][torch.arange(ids.shape[1] - 1), ids[0, 1:]], atol=1e-5)
    vm.save(tmp_path / "ck")
    back = ValueModel.load(tmp_path / "ck", expect=HeadSpec(loss, 5, 0.0, 1.0, 128, head="q"))
    assert torch.equal(back.q.weight, vm.q.weight) and torch.equal(back.q.bias, vm.q.bias)
    with pytest.raises(ConfigError, match="head: checkpoint 'q' vs config 'reference'"):
        ValueModel.load(tmp_path / "ck", expect=HeadSpec(loss, 5, 0.0, 1.0, 128, head="reference"))


def test_the_candidate_pass_attends_without_repeating_keys_and_values_per_head():
    """packed_gqa_sdpa: the query heads sharing a KV head attend as extra query rows of it, each
    with its own position's mask: equal to transformers' SDPA (which repeats K/V per head when a
    mask is given and several positions are queried), and no [rows, heads, positions, dim] tensor
    is made."""
    from types import SimpleNamespace

    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from pita.guidance.value_model import packed_gqa_sdpa

    g = torch.Generator().manual_seed(0)
    B, H, kv, q, L, D = 2, 8, 2, 5, 37, 16
    module = SimpleNamespace(num_key_value_groups=H // kv, training=False, is_causal=True)
    query, key, value = (torch.randn(B, h, n, D, generator=g) for h, n in ((H, q), (kv, L), (kv, L)))
    allowed = torch.rand(B, 1, q, L, generator=g) > 0.3
    allowed[..., 0] = True
    for mask in (allowed, torch.where(allowed, 0.0, torch.finfo(torch.float32).min)):
        want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)

        class Shapes(TorchDispatchMode):
            seen: list = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in torch.utils._pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        self.seen.append(tuple(t.shape))
                return out

        with Shapes() as s:
            got, _ = packed_gqa_sdpa(module, query, key, value, mask, scaling=0.25)
        assert torch.allclose(got, want, atol=1e-5)
        assert (B, H, L, D) not in s.seen  # keys and values never repeated per query head
