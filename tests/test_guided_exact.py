"""Guided decoding is exact: π(y) ∝ π_ref(y) · e^{η r(y)}, checked by enumerating every sequence.

Setting: a random tiny Llama over tokens {0, 1, 2} plus EOS (3, also the pad id), horizon 3, reward
r(y) = 1 when y contains token 1 at least twice, else 0 (a 0/1 correctness-like reward). For a
Bernoulli Z, E[e^{ηZ} | s, a] = 1 − p + p e^η with p = P_ref(r = 1 | s, a), which the oracle
guide computes exactly by enumeration. Then the per-step rule ref_lp + log E[e^{ηZ}|s,a] must
give, for every full sequence, log π(y) = log π_ref(y) + η r(y) − log Z (to 1e-5), and sampled
frequencies must pass a chi-square test at a fixed seed.
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from pita.guidance.offsets import bernoulli_offset
from pita.models.lm import LM

EOS, PAD, H, ETA = 3, 3, 3, 1.5  # pad = EOS, as in many real tokenizers


def reward(tokens) -> int:
    return int(sum(1 for t in tokens if t == 1) >= 2)


@pytest.fixture(scope="module")
def lm():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=32, eos_token_id=EOS, pad_token_id=PAD,
                      bos_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper than a random init, so the tilt matters
        model.lm_head.weight.mul_(4.0)
    tok = SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD)
    return LM(model, tok)


PROMPT = [0, 2]


def step_lp(lm, prefix):
    with torch.no_grad():
        logits = lm.model(torch.tensor([PROMPT + prefix])).logits[0, -1].float()
    return torch.log_softmax(logits, -1)


def sequences():
    """Every outcome: (tokens, ended_with_eos) for horizon H."""
    out = []
    for n in range(H + 1):
        for toks in itertools.product([0, 1, 2], repeat=n):
            if n < H:
                out.append((list(toks), True))
            else:
                out.append((list(toks), False))
    return out


def log_ref(lm, toks, eos):
    lp = 0.0
    for t in range(len(toks)):
        lp += float(step_lp(lm, toks[:t])[toks[t]])
    if eos:
        lp += float(step_lp(lm, toks)[EOS])
    return lp


def success_prob(lm, prefix, cache) -> float:
    """P_ref(r = 1 | prefix) by enumeration (prefix not yet ended)."""
    key = tuple(prefix)
    if key in cache:
        return cache[key]
    if len(prefix) == H:
        cache[key] = float(reward(prefix))
        return cache[key]
    lp = step_lp(lm, prefix)
    p = math.exp(float(lp[EOS])) * reward(prefix)
    for a in (0, 1, 2):
        p += math.exp(float(lp[a])) * success_prob(lm, prefix + [a], cache)
    cache[key] = p
    return p


class OracleGuide:
    """Exact E[e^{ηZ} | s, a] from enumeration; follows the tokens the sampler feeds it."""

    def __init__(self, lm, eta):
        self.lm, self.eta, self.cache, self.prefixes = lm, eta, {}, None

    def begin(self, ids, mask, pos):
        self.prefixes = [[] for _ in range(ids.shape[0])]

    def advance(self, feed, mask, pos):
        for i, t in enumerate(feed[:, 0].tolist()):
            if mask[i, -1]:
                self.prefixes[i].append(t)

    def adjust(self, ref_lp):
        out = torch.full_like(ref_lp, float("-inf"))
        for i, prefix in enumerate(self.prefixes):
            for a in range(ref_lp.shape[-1]):
                if not math.isfinite(float(ref_lp[i, a])):
                    continue
                p = float(reward(prefix)) if a == EOS else success_prob(self.lm, prefix + [a], self.cache)
                out[i, a] = ref_lp[i, a] + bernoulli_offset(torch.tensor(p), self.eta)
        return out


def target(lm):
    seqs = sequences()
    logw = [log_ref(lm, t, e) + ETA * reward(t) for t, e in seqs]
    logz = torch.logsumexp(torch.tensor(logw), 0).item()
    return {tuple(t): lw - logz for (t, _), lw in zip(seqs, logw)}


def test_guided_sequence_log_probs_equal_the_tilted_reference(lm):
    want = target(lm)
    assert abs(sum(math.exp(v) for v in want.values()) - 1) < 1e-6
    n = 400
    got = lm.generate_ids([PROMPT] * n, H, seeds=list(range(n)), temperature=1.0, guide=OracleGuide(lm, ETA))
    seen = set()
    for toks, finish, logp, _ in got:
        assert finish == ("eos" if len(toks) < H else "length") or len(toks) == H
        assert logp == pytest.approx(want[tuple(toks)], rel=1e-5, abs=1e-5)
        seen.add(tuple(toks))
    assert len(seen) > 10


def test_sampled_frequencies_pass_a_chi_square_test(lm):
    from scipy.stats import chisquare

    want = target(lm)
    n = 6000
    got = lm.generate_ids([PROMPT] * n, H, seeds=list(range(10_000, 10_000 + n)), temperature=1.0,
                          guide=OracleGuide(lm, ETA))
    counts = {k: 0 for k in want}
    for toks, *_ in got:
        counts[tuple(toks)] += 1
    # pool outcomes expected fewer than 5 times into one cell, as the test requires
    keys = sorted(want, key=lambda k: -want[k])
    exp = [n * math.exp(want[k]) for k in keys]
    big = [i for i, e in enumerate(exp) if e >= 5]
    small = [i for i in range(len(keys)) if i not in big]
    obs_cells = [counts[keys[i]] for i in big] + ([sum(counts[keys[i]] for i in small)] if small else [])
    exp_cells = [exp[i] for i in big] + ([sum(exp[i] for i in small)] if small else [])
    exp_cells = [e * n / sum(exp_cells) for e in exp_cells]  # float32 round-off in the target
    stat, pvalue = chisquare(obs_cells, exp_cells)
    assert pvalue > 0.001, (stat, pvalue)


def test_eta_zero_is_the_reference_and_kl_is_exactly_zero(lm):
    got = lm.generate_ids([PROMPT] * 50, H, seeds=list(range(50)), temperature=1.0, guide=OracleGuide(lm, 0.0))
    plain = lm.generate_ids([PROMPT] * 50, H, seeds=list(range(50)), temperature=1.0)
    # exactly: η = 0 adds exact zeros to the same logits (x + 0.0 == x in IEEE arithmetic)
    assert [g[0] for g in got] == [p[0] for p in plain]
    assert all(g[2] == g[3] for g in got) and all(p[2] == p[3] for p in plain)


class TableVM(torch.nn.Module):
    """A value model stand-in: the head's logit for candidate a after token s is W[s, a]."""

    def __init__(self, vocab=4):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.W = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g) * 2.0, requires_grad=False)
        self.spec = SimpleNamespace(vocab_size=vocab, loss="bce")

    def hidden(self, ids, mask, pos, past_key_values=None, use_cache=True):
        return ids.unsqueeze(-1).float(), None  # the "state" is the last token

    def scores(self, h, cands):
        return self.W[h[:, 0].long()].gather(-1, cands).unsqueeze(-1)


def guided_step(lm, vm, prefix, eta, k):
    """(reference log-probs, guided log-probs) after ``prefix``: δ on the top-k scored tokens only."""
    ref = step_lp(lm, prefix)
    last = (PROMPT + prefix)[-1]
    cands = torch.topk(ref, k).indices
    delta = torch.zeros_like(ref)
    delta[cands] = bernoulli_offset(torch.sigmoid(vm.W[last, cands]), eta)
    return ref, torch.log_softmax(ref + delta, -1), cands


def test_top_k_scores_candidates_but_every_token_stays_sampleable_and_log_probs_are_exact(lm):
    """With top_k smaller than the vocabulary: log π(y) = log π_ref(y) + Σ_t δ_t(y_t) − Σ_t log Z_t
    (δ the offset on scored tokens, 0 elsewhere), the sampler reports exactly that, logp_ref is the
    untruncated reference, and tokens outside the top-k are still drawn."""
    from pita.guidance.decode import GuidedDecoder

    vm = TableVM()
    k, n = 2, 600
    got = lm.generate_ids([PROMPT] * n, H, seeds=list(range(n)), temperature=1.0,
                          guide=GuidedDecoder(vm, "bernoulli", ETA, top_k=k))
    outside = 0
    for toks, finish, logp, logp_ref in got:
        want, want_ref = 0.0, 0.0
        steps = toks + ([EOS] if finish == "eos" else [])
        for t, a in enumerate(steps):
            ref, guided, cands = guided_step(lm, vm, toks[:t], ETA, k)
            want += float(guided[a])
            want_ref += float(ref[a])
            outside += a not in cands.tolist()
        assert logp == pytest.approx(want, rel=1e-5, abs=1e-5)
        assert logp_ref == pytest.approx(want_ref, rel=1e-5, abs=1e-5)
    assert outside > 0  # the reference's other tokens were sampled


def test_kl_under_a_sampling_nucleus_is_finite_and_equals_the_brute_force_log_ratio(lm):
    """eval.top_p < 1 is part of the policy, not of the reference: logp is the guided policy's
    log-prob within its nucleus (renormalised: what was sampled), logp_ref the reference's with
    no nucleus, so a sample outside the reference's own nucleus (top_p 0.6 here) is finite there
    (it used to score -inf, and its row's KL +inf)."""
    from pita.guidance.decode import GuidedDecoder
    from pita.models.lm import nucleus

    vm = TableVM()
    n = 600
    got = lm.generate_ids([PROMPT] * n, H, seeds=list(range(n)), temperature=1.0, top_p=0.6,
                          guide=GuidedDecoder(vm, "bernoulli", ETA, top_k=4))
    outside = 0
    for toks, finish, logp, logp_ref in got:
        want, want_ref = 0.0, 0.0
        steps = toks + ([EOS] if finish == "eos" else [])
        for t, a in enumerate(steps):
            ref, guided, _ = guided_step(lm, vm, toks[:t], ETA, 4)
            sampled = torch.log_softmax(guided.masked_fill(~nucleus(guided.unsqueeze(0), 0.6)[0], float("-inf")), -1)
            want += float(sampled[a])
            want_ref += float(ref[a])
            outside += not bool(nucleus(ref.unsqueeze(0), 0.6)[0, a])
        assert math.isfinite(logp) and math.isfinite(logp_ref)
        assert logp == pytest.approx(want, rel=1e-5, abs=1e-5)
        assert logp_ref == pytest.approx(want_ref, rel=1e-5, abs=1e-5)
    assert outside > 0  # samples the reference's own nucleus would have excluded were drawn


@pytest.mark.parametrize("head", ["reference", "embedding", "q"])
def test_value_model_step_matches_the_formula_with_its_incremental_cache(tiny, head):
    """The real GuidedDecoder: after a few cached steps, the guided next-token distribution equals
    normalise(π_ref^{1/T} · w) with w = 1 − p + p e^η on the top-k scored tokens and 1 on every
    other token, p from the value model run on the whole prefix from scratch (no cache): with the
    reference head, each candidate appended to the prefix and read at its own position."""
    from pita.guidance.decode import GuidedDecoder
    from pita.guidance.value_model import ValueModel

    ref = LM.load(tiny["reference"])
    vm = ValueModel.create(tiny["guidance"], loss="bce", head=head).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in (vm.out_layer.weight, vm.out_layer.bias):
            p.normal_(0, 1.0)
    eta, k, T = 2.0, 12, 0.8
    guide = GuidedDecoder(vm, "bernoulli", eta, top_k=k)
    prompt = ref.encode([ref.chat_prompt("Tom has 5 cups. Tom gets 7 more. How many cups does Tom have?")])[0]
    ids = torch.tensor([prompt])
    mask = torch.ones_like(ids)
    pos = torch.arange(ids.shape[1]).unsqueeze(0)
    guide.begin(ids, mask, pos)
    fed = []
    for t in (5, 9, 11):  # feed three tokens through the cache
        fed.append(t)
        mask = torch.ones((1, len(prompt) + len(fed)), dtype=torch.long)
        guide.advance(torch.tensor([[t]]), mask, torch.tensor([[len(prompt) + len(fed) - 1]]))
    full = torch.tensor([prompt + fed])
    with torch.no_grad():
        ref_lp = torch.log_softmax(ref.model(full).logits[0, -1].float() / T, -1)
        got = torch.softmax(guide.adjust(ref_lp.unsqueeze(0))[0], -1)
        h, _ = vm.hidden(full, torch.ones_like(full))
        cands = torch.topk(ref_lp, k).indices
        if head != "reference":  # the embedding and q heads: from the prefix's last state
            p = torch.sigmoid(vm.scores(h[0, -1], cands)[..., 0])
        else:
            each = torch.cat([full.expand(k, -1), cands.unsqueeze(-1)], dim=1)
            p = torch.sigmoid(vm.token_scores(each, torch.ones_like(each))[:, -1, 0])
    w = torch.ones_like(ref_lp)
    w[cands] = 1 - p + p * math.exp(eta)
    want = torch.exp(ref_lp) * w
    want = want / want.sum()
    assert torch.allclose(got, want, atol=1e-5)
    assert bool((got > 0).all())  # the whole vocabulary stays sampleable


class AtomVM(torch.nn.Module):
    """An mle value model stand-in: per candidate a histogram's logits over 3 atoms in [v_min, v_max]."""

    def __init__(self, vocab=4, v_min=0.0, v_max=1.0):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.L = torch.nn.Parameter(torch.randn(vocab, 3, generator=g) * 2.0, requires_grad=False)
        self.spec = SimpleNamespace(vocab_size=vocab, loss="mle", v_min=v_min, v_max=v_max, num_atoms=3)

    def hidden(self, ids, mask, pos, past_key_values=None, use_cache=True):
        return ids.unsqueeze(-1).float(), None

    def scores(self, h, cands):
        return self.L[cands]


def _guided(vm, ref_lp, **kw):
    from pita.guidance.decode import GuidedDecoder

    d = GuidedDecoder(vm, "mle", 1.5, **kw)
    d.h = torch.zeros(ref_lp.shape[0], 1)
    return torch.log_softmax(d.adjust(ref_lp), -1)


def test_mle_offsets_shifted_to_the_candidate_minimum_do_not_depend_on_the_rewards_origin():
    """Q#'s reference code shifts each state's mle offsets to the candidates' minimum. With top_k
    below the vocabulary the tokens outside it keep offset 0, so without the shift adding a
    constant to every reward (the atoms) changes the guided policy; with it, it does not."""
    ref = torch.log_softmax(torch.tensor([[1.0, 0.5, 0.0, -0.5]]), -1)
    low, high = AtomVM(v_min=0.0, v_max=1.0), AtomVM(v_min=5.0, v_max=6.0)  # the same head, rewards + 5
    shifted = [_guided(vm, ref, top_k=2, offset_shift="min") for vm in (low, high)]
    assert torch.allclose(shifted[0], shifted[1], atol=1e-6)
    raw = [_guided(vm, ref, top_k=2, offset_shift="none") for vm in (low, high)]
    assert not torch.allclose(raw[0], raw[1], atol=1e-3)
    # every token a candidate: the shift is a constant per state and changes nothing
    assert torch.allclose(_guided(low, ref, top_k=-1, offset_shift="min"),
                          _guided(low, ref, top_k=-1, offset_shift="none"), atol=1e-6)


@pytest.mark.parametrize("where", ["before", "after"])
def test_offsets_enter_before_the_temperature_as_the_references_do(lm, where):
    """offset_temperature=before: log π ∝ (logits + δ) / T, i.e. the tempered log-probs plus δ/T;
    after: the tempered log-probs plus δ (the earlier behaviour). Checked on sampled sequences."""
    from pita.guidance.decode import GuidedDecoder

    vm, T, n = TableVM(), 0.5, 200
    got = lm.generate_ids([PROMPT] * n, H, seeds=list(range(n)), temperature=T,
                          guide=GuidedDecoder(vm, "bernoulli", ETA, top_k=4, offset_temperature=where))
    for toks, finish, logp, _ in got[:50]:
        want = 0.0
        for t, a in enumerate(toks + ([EOS] if finish == "eos" else [])):
            with torch.no_grad():
                logits = lm.model(torch.tensor([PROMPT + toks[:t]])).logits[0, -1].float()
            last = (PROMPT + toks[:t])[-1]
            delta = bernoulli_offset(torch.sigmoid(vm.W[last]), ETA)
            tempered = torch.log_softmax(logits / T, -1)
            want += float(torch.log_softmax(tempered + (delta / T if where == "before" else delta), -1)[a])
        assert logp == pytest.approx(want, rel=1e-5, abs=1e-5)


def _step_kl(q: torch.Tensor, r: torch.Tensor) -> float:
    fin = torch.isfinite(q)
    return float((q[fin].exp() * (q[fin] - r[fin])).sum())


def _guided_policy(lm, vm, k, top_p: float = 1.0):
    """{sequence: log π(y)} and {sequence: Σ_t KL(π_t || π_ref,t) along y}, by enumeration; π
    within its ``top_p`` nucleus, renormalised (what is sampled)."""
    from pita.models.lm import nucleus

    logp, path_kl = {}, {}
    for toks, eos in sequences():
        lp, kl = 0.0, 0.0
        for t, a in enumerate(toks + ([EOS] if eos else [])):
            ref, guided, _ = guided_step(lm, vm, toks[:t], ETA, k)
            guided = torch.log_softmax(guided.masked_fill(~nucleus(guided.unsqueeze(0), top_p)[0], float("-inf")), -1)
            lp += float(guided[a])
            kl += _step_kl(guided, ref)
        logp[tuple(toks)], path_kl[tuple(toks)] = lp, kl
    return logp, path_kl


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_exact_per_step_kl_along_each_path_equals_brute_force(lm, top_p):
    """``kl_out``: per sampled row, Σ_t KL(π_t || π_ref,t) over the steps it took, π_t what was
    sampled (within its nucleus at top_p 0.9, the references' setting), π_ref never truncated;
    finite, never negative."""
    from pita.guidance.decode import GuidedDecoder

    vm, n = TableVM(), 300
    kls: list[float] = []
    got = lm.generate_ids([PROMPT] * n, H, seeds=list(range(n)), temperature=1.0, top_p=top_p,
                          guide=GuidedDecoder(vm, "bernoulli", ETA, top_k=2), kl_out=kls)
    _, want = _guided_policy(lm, vm, 2, top_p)
    assert len(kls) == n
    for (toks, *_), kl in zip(got, kls):
        assert math.isfinite(kl) and kl >= 0.0
        assert kl == pytest.approx(want[tuple(toks)], rel=1e-4, abs=1e-6)


def test_exact_kl_is_unbiased_for_the_sequence_kl_and_less_noisy_than_the_log_ratio(lm):
    """Over samples of the guided policy, the mean of the per-path KL and the mean of
    log π − log π_ref both estimate KL(π || π_ref) over whole sequences (enumerated here); the
    per-path KL has the smaller standard error and no sample below 0."""
    from pita.eval.metrics import kl_metrics
    from pita.guidance.decode import GuidedDecoder

    vm, n = TableVM(), 2000
    logp, _ = _guided_policy(lm, vm, 2)
    exact = sum(math.exp(lp) * (lp - log_ref(lm, list(y), len(y) < H)) for y, lp in logp.items())
    kls: list[float] = []
    got = lm.generate_ids([PROMPT] * n, H, seeds=list(range(50_000, 50_000 + n)), temperature=1.0,
                          guide=GuidedDecoder(vm, "bernoulli", ETA, top_k=2), kl_out=kls)
    recs = [{"logp": lp, "logp_ref": lr, "kl_path": kl, "n_tokens": len(toks), "finish": fin}
            for (toks, fin, lp, lr), kl in zip(got, kls)]
    m = kl_metrics(recs)
    assert m["kl_estimator"] == "exact per-step"
    assert abs(m["kl"] - exact) < 4 * m["kl_stderr"] + 1e-6
    assert abs(m["kl_logratio"] - exact) < 4 * m["kl_logratio_stderr"] + 1e-6
    assert m["kl_stderr"] < m["kl_logratio_stderr"]
    assert m["kl_per_token"] == pytest.approx(sum(kls) / sum(r["n_tokens"] + (r["finish"] == "eos") for r in recs))


def test_a_trained_policys_path_kl_to_its_reference_equals_brute_force(lm):
    """``LM.path_kl``: a second model (the reference with a perturbed head) scored on given paths,
    its per-step KL to the reference at temperature 0.7, summed over tokens and the EOS."""
    import copy

    other = copy.deepcopy(lm)
    with torch.no_grad():
        other.model.lm_head.weight.add_(torch.randn(other.model.lm_head.weight.shape,
                                                    generator=torch.Generator().manual_seed(5)))
    T = 0.7
    paths = [([], EOS), ([1], EOS), ([0, 2, 1], None), ([2, 2], EOS)]
    lrs: list[float] = []
    got = other.path_kl(lm, [PROMPT] * len(paths), [p for p, _ in paths], [e for _, e in paths], temperature=T,
                        batch_size=3, logp_ref_out=lrs)
    # the reference's log-prob of each path, from the same forward: what sequence_logprobs returns.
    # Both run the reference on the same padded batches; float32 kernels promise no more than
    # rounding where shapes could differ, so the margin is float32's (~1e-7 of the value), x10
    assert lrs == pytest.approx(lm.sequence_logprobs([PROMPT] * len(paths), [p for p, _ in paths], batch_size=3,
                                                     eos_ids=[e for _, e in paths], temperature=T), rel=1e-6, abs=1e-6)
    for (toks, eos), kl in zip(paths, got):
        want = 0.0
        for t in range(len(toks) + (eos is not None)):
            with torch.no_grad():
                q = torch.log_softmax(other.model(torch.tensor([PROMPT + toks[:t]])).logits[0, -1].float() / T, -1)
                r = torch.log_softmax(lm.model(torch.tensor([PROMPT + toks[:t]])).logits[0, -1].float() / T, -1)
            want += _step_kl(q, r)
        assert kl == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert lm.path_kl(lm, [PROMPT] * 2, [[1], [0, 2]], [EOS, None]) == [0.0, 0.0]


def _policy_log_probs(lm, temperature: float, top_p: float) -> dict:
    """log q(y) of every outcome under the reference sampled at ``temperature`` within its ``top_p``
    nucleus (what LM.generate_ids draws from), by enumeration."""
    from pita.models.lm import nucleus

    def step(prefix):
        with torch.no_grad():
            logits = lm.model(torch.tensor([PROMPT + prefix])).logits[0, -1].float()
        lp = torch.log_softmax(logits / temperature, -1)
        return torch.log_softmax(lp.masked_fill(~nucleus(lp, top_p), float("-inf")), -1)

    out = {}
    for toks, eos in sequences():
        lq = sum(float(step(toks[:t])[toks[t]]) for t in range(len(toks)))
        out[tuple(toks)] = lq + (float(step(toks)[EOS]) if eos else 0.0)
    return out


@pytest.mark.parametrize("temperature,top_p", [(1.0, 0.6), (0.6, 1.0), (0.6, 0.7)])
def test_the_reported_kl_is_the_sampled_policys_under_a_nucleus_or_a_colder_temperature(lm, temperature, top_p):
    """The policy is what is sampled: with top_p < 1 (the nucleus renormalised) or a colder
    temperature against the reference at 1 (the temperature control), each sample's logp is its
    exact log-probability under that policy and logp_ref under the untruncated reference at 1,
    and the mean of kl_path estimates the exact sequence KL(q || ref), enumerated here. Before, the
    untruncated policy's KL was reported under a nucleus (2.219 for 2.544 in one such case) and an
    unguided row's KL was 0 whatever it sampled from."""
    q = _policy_log_probs(lm, temperature, top_p)
    r = {tuple(t): log_ref(lm, t, e) for t, e in sequences()}
    assert abs(sum(math.exp(v) for v in q.values()) - 1) < 1e-5
    exact = sum(math.exp(q[y]) * (q[y] - r[y]) for y in q if math.isfinite(q[y]))
    assert exact > 0.01  # the policy differs from the reference
    n = 3000
    kls: list = []
    got = lm.generate_ids([PROMPT] * n, H, seeds=list(range(n)), temperature=temperature, top_p=top_p, kl_out=kls,
                          reference_temperature=1.0)
    for toks, _finish, logp, logp_ref in got:
        # float32 per step, summed over at most 4 steps in float64
        assert logp == pytest.approx(q[tuple(toks)], abs=1e-4) and logp_ref == pytest.approx(r[tuple(toks)], abs=1e-4)
    mean = sum(kls) / n
    se = (sum((k - mean) ** 2 for k in kls) / (n - 1) / n) ** 0.5
    assert abs(mean - exact) < 4 * se + 1e-6, (mean, exact, se)
    assert min(kls) >= 0
