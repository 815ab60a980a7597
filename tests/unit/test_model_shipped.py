"""The shipped weights: they load and generate; batching, padding and the KV cache change
nothing; a seed's output does not depend on its batch companions; the CLI's bad-input table."""

from __future__ import annotations

import threading
from functools import cache

import pytest
import torch

from chunlian.cli import main as cli_main
from chunlian.engine.request import BeamHyp, SeqSpec
from chunlian.engine.runner import ModelRunner
from chunlian.model.checkpoint import DEFAULT_WEIGHTS, QUALITY_WEIGHTS, LoadedModel, load_weights
from chunlian.model.tokenizer import PREFIX_LEN, lower_role, upper_role
from chunlian.model.transformer import KVCache
from chunlian.text import is_han, tone_class
from tests.unit.runner_util import run_all

torch.set_num_threads(1)

# different lengths (5 to 15 characters, one with a clause break), none from training
UPPERS = ["春回大地", "瑞雪兆丰年", "春风送暖入屠苏", "一帆风顺年年好", "和顺一门有百福",
          "天增岁月人增寿", "爆竹声中辞旧岁，梅花香里迎新春", "红梅含苞傲冬雪", "江山如画",
          "门迎百福福星照", "国泰民安家家乐，人寿年丰户户春"]


@cache
def shipped() -> LoadedModel:
    return load_weights(None, "cpu")


def specs(greedy: bool = True, first_id: int = 0) -> list[SeqSpec]:
    return [SeqSpec(seq_id=first_id + i, style="traditional", upper=u, upper_len=len(u),
                    greedy=greedy, seed=1000 + i, temperature=0.9, top_k=50, top_p=0.95)
            for i, u in enumerate(UPPERS)]


def lowers(runner: ModelRunner, batch: list[SeqSpec]) -> dict[str, str]:
    out = run_all(runner, batch)
    by_id = {s.seq_id: s.upper for s in batch}
    return {by_id[o.seq_id]: o.lower for o in out.values()}  # type: ignore[misc]


def test_shipped_weights_load_and_every_rule_holds() -> None:
    loaded = shipped()
    assert loaded.model.num_params() > 1_000_000
    got = lowers(ModelRunner(loaded, 16), specs())
    assert set(got) == set(UPPERS)
    for upper, lower in got.items():
        assert_rules(upper, lower)


def assert_rules(upper: str, lower: str) -> None:
    assert len(lower) == len(upper)
    for i, (a, b) in enumerate(zip(upper, lower, strict=True)):
        assert is_han(a) == is_han(b) and (is_han(a) or a == b)  # punctuation mirrored
        for j in range(i + 1, len(upper)):
            assert (upper[i] == upper[j]) == (lower[i] == lower[j])
    assert not {c for c in upper if is_han(c)} & set(lower)
    if tone_class(upper[-1]) == "ze":
        assert tone_class(lower[-1]) == "ping"


def beams(items: list[tuple[str, str]], width: int, capacity: int = 256) -> list[list[BeamHyp]]:
    """The final lines of each item's beam, best first, from the engine core."""
    from chunlian.offline import OfflineGenerator

    gen = OfflineGenerator(shipped(), ModelRunner(shipped(), capacity), None)
    return [list(h) for h in gen.beam_nbest(items, width)]


def test_beam_of_width_one_is_greedy() -> None:
    greedy = lowers(ModelRunner(shipped(), 16), specs())
    beam = beams([(u, "traditional") for u in UPPERS], 1)
    assert [b[0].lower for b in beam] == [greedy[u] for u in UPPERS]


def test_beam_search_keeps_every_rule_and_ignores_its_companions() -> None:
    """Width 4 over lines of mixed lengths: every rule holds; a line's answer is the same
    alone and among the others (rows of one request never mix with another's)."""
    items = [(u, "traditional") for u in UPPERS]
    together = beams(items, 4)
    alone = [beams([it], 4)[0] for it in items[:4]]
    for (upper, _), res in zip(items, together, strict=True):
        assert_rules(upper, res[0].lower)
        assert res[0].logprob_mean <= 0.0
    assert [a[0].lower for a in alone] == [t[0].lower for t in together[:4]]
    # rows freed and refilled as requests come and go (2 requests of 4 beams at a time) agree too
    assert [r[0].lower for r in beams(items, 4, capacity=8)] == [t[0].lower for t in together]


def test_beams_share_a_batch_with_greedy_and_sampled_rows() -> None:
    """A beam request decodes in the same steps as greedy and sampled requests, and each
    answer is the one it gets alone."""
    from chunlian.errors import ChunlianError
    from chunlian.offline import OfflineGenerator
    from chunlian.types import BeamParams, CoupletRequest, CoupletResult, DecodeParams

    gen = OfflineGenerator(shipped(), ModelRunner(shipped(), 32), None)
    mixed = [CoupletRequest(upper=UPPERS[0], params=DecodeParams(beam=BeamParams(4))),
             CoupletRequest(upper=UPPERS[1]),
             CoupletRequest(upper=UPPERS[2], params=DecodeParams(n=2, seed=5)),
             CoupletRequest(heads="李明", length=7),
             CoupletRequest(upper=UPPERS[3], params=DecodeParams(n=3, beam=BeamParams(4)))]
    together = gen.generate(mixed)
    alone = [gen.generate([r])[0] for r in mixed]

    def lines(results: list[CoupletResult | ChunlianError]) -> list[list[str]]:
        return [[c.lower for c in (r.best, *r.candidates)] for r in results if not isinstance(r, ChunlianError)]

    assert len(lines(together)) == len(mixed)
    assert lines(together) == lines(alone)  # the scores may differ in the last float digits
    fourth = together[4]
    assert not isinstance(fourth, Exception) and len(fourth.candidates) == 3
    assert fourth.candidates[0].lower == beams([(UPPERS[3], "traditional")], 4)[0][0].lower
    assert gen.runner.n_live == 0


def test_nbest_beams_are_distinct_ruled_lines_best_first() -> None:
    items = [(u, "traditional") for u in UPPERS[:6]]
    for (upper, _), hyps in zip(items, beams(items, 4), strict=True):
        assert 1 <= len(hyps) <= 4 and len({h.lower for h in hyps}) == len(hyps)
        assert [h.logprob for h in hyps] == sorted((h.logprob for h in hyps), reverse=True)
        for h in hyps:
            assert_rules(upper, h.lower)


def test_channel_scores_are_the_reverse_teacher_forced_log_probabilities() -> None:
    """``log p(upper | lower)`` equals the sum of per-step log-probabilities computed one
    prefix at a time; a batch of mixed lengths gives each triple what it gets alone."""
    from chunlian.engine.channel import ChannelScorer
    from chunlian.model.tokenizer import sequence_roles

    loaded = shipped()
    scorer = ChannelScorer(loaded)
    assert scorer.register == "modern"  # the shipped weights have no <r:reversed> token
    tok, model = loaded.tokenizer, loaded.model
    upper, lower = "春回大地", "福满人间"
    prompt = tok.prefix("traditional") + tok.encode(lower) + [tok.sep_id]
    manual = 0.0
    with torch.inference_mode():
        for j, ch in enumerate(upper):
            ids = prompt + tok.encode(upper[:j])
            idx = torch.tensor([ids])
            pos = torch.arange(len(ids))[None]
            role = torch.tensor(sequence_roles(4, j))[None]
            logp = torch.log_softmax(model(idx, pos, role)[0, -1].float(), dim=-1)
            manual += float(logp[tok.stoi[ch]])
    triples = [(upper, lower, "traditional"), ("瑞雪兆丰年", "红梅报早春", "family"),
               (upper, "花开富贵", "traditional")]
    together = scorer.score(triples)
    assert abs(together[0] - manual) < 1e-3
    assert [round(x, 3) for x in together] == [round(scorer.score([t])[0], 3) for t in triples]
    assert together[0] > together[2]  # the couplet's own 下联 explains its 上联 better
    with pytest.raises(ValueError, match="length"):
        scorer.score([("春回大地", "福满人", "traditional")])


def test_logits_of_the_last_positions_are_the_tail_of_the_full_pass() -> None:
    loaded = shipped()
    tok, model = loaded.tokenizer, loaded.model
    idx = torch.tensor([tok.prefix("traditional") + tok.encode("福满人间") + [tok.sep_id] + tok.encode("春回大")] * 2)
    pos = torch.arange(idx.shape[1]).expand_as(idx)
    role = torch.zeros_like(idx)
    with torch.inference_mode():
        full, tail = model(idx, pos, role), model(idx, pos, role, last=3)
    assert tail.shape == (2, 3, len(tok))
    assert torch.allclose(tail, full[:, -3:], atol=1e-5)
    for bad in (0, idx.shape[1] + 1):
        with pytest.raises(ValueError, match="last must be"):
            model(idx, pos, role, last=bad)


def test_channel_rerank_keeps_the_rules_and_picks_among_the_beam() -> None:
    """The generator's reranked answer is the candidate of its own beam with the best
    ``logprob + W * channel (+ F * rescore)``; without a term it is the beam's best."""
    from chunlian.engine.channel import ChannelScorer
    from chunlian.offline import OfflineGenerator
    from chunlian.types import CoupletRequest

    plain = OfflineGenerator.load(None, "cpu", capacity=16, beam_width=4)
    reranked = OfflineGenerator.load(None, "cpu", capacity=16, beam_width=4, channel_weight=1.0)
    rescored = OfflineGenerator.load(None, "cpu", capacity=16, beam_width=4, channel_weight=1.0,
                                     rescore=(DEFAULT_WEIGHTS,), rescore_weight=2.0)
    reqs = [CoupletRequest(upper=u) for u in UPPERS[:6]]
    items = [(u, "traditional") for u in UPPERS[:6]]
    nbest = beams(items, 4, capacity=16)
    triples = [[(u, h.lower, st) for h in hyps] for (u, st), hyps in zip(items, nbest, strict=True)]
    channel = [ChannelScorer(plain.loaded).score(t) for t in triples]
    forward = [ChannelScorer(plain.loaded, forward=True).score(t) for t in triples]

    def best(w: float, f: float) -> list[str]:
        return [max(enumerate(hyps), key=lambda kh: kh[1].logprob + w * channel[r][kh[0]]
                    + f * forward[r][kh[0]])[1].lower for r, hyps in enumerate(nbest)]

    want = {"plain": [hyps[0].lower for hyps in nbest], "reranked": best(1.0, 0.0), "rescored": best(1.0, 2.0)}
    for name, gen in (("plain", plain), ("reranked", reranked), ("rescored", rescored)):
        got = gen.generate(reqs)
        for req, res, hyps in zip(reqs, got, nbest, strict=True):
            assert not isinstance(res, Exception)
            assert_rules(req.upper or "", res.best.lower)
            assert res.best.lower in {h.lower for h in hyps}
        assert [r.best.lower for r in got] == want[name], name  # type: ignore[union-attr]


def test_rerank_adds_every_weighted_term_and_breaks_ties_by_beam_order() -> None:
    """``logprob + channel_weight * channel + rescore_weight * forward``, computed by hand
    for each case in the comments (``engine.rescore``, scores stubbed)."""
    from chunlian.engine.rescore import BeamJob, Rescorer
    from chunlian.types import BeamParams

    hyps = (BeamHyp("甲", -1.0, -1.0), BeamHyp("乙", -1.5, -1.5))

    class Stub:
        def __init__(self, values: list[float]) -> None:
            self.values = values

        def score(self, triples: list[tuple[str, str, str]]) -> list[float]:
            return self.values[: len(triples)]

    def ranked(cw: float, rw: float) -> list[str]:
        r = Rescorer(shipped())
        r._channel, r._forward = Stub([-3.0, -1.0]), (Stub([-1.0, -2.0]),)  # type: ignore[assignment]
        return [h.lower for h in r.rerank([BeamJob("春回", "traditional", BeamParams(2, cw, rw), hyps)])[0]]

    assert ranked(0.0, 0.0) == ["甲", "乙"]
    assert ranked(1.0, 0.0) == ["乙", "甲"]  # -4 vs -2.5
    assert ranked(1.0, 1.0) == ["乙", "甲"]  # -5 vs -4.5
    assert ranked(1.0, 1.5) == ["甲", "乙"]  # tie -5.5: beam order
    assert ranked(1.0, 2.0) == ["甲", "乙"]  # -6 vs -6.5


def test_forward_scores_are_the_teacher_forced_lower_log_probabilities() -> None:
    """``forward=True`` reads ``log p(lower | upper)``: the channel scorer's number on the
    swapped lines (whose teacher forcing the test above checks step by step)."""
    from chunlian.engine.channel import ChannelScorer

    loaded = shipped()
    fwd, rev = ChannelScorer(loaded, forward=True), ChannelScorer(loaded)
    assert fwd.register == "modern"
    triples = [("春回大地", "福满人间", "traditional"), ("瑞雪兆丰年", "红梅报早春", "family")]
    swapped = [(lo, up, st) for up, lo, st in triples]
    assert [round(x, 4) for x in fwd.score(triples)] == [round(x, 4) for x in rev.score(swapped)]
    assert all(x < 0 for x in fwd.score(triples))


def test_forward_scores_share_each_prompt_and_equal_a_full_teacher_forced_pass() -> None:
    """The scorer runs each distinct prompt once and every candidate after its keys and
    values; the numbers are a plain full pass's over ``prefix upper [SEP] lower``, for
    candidates sharing a prompt, prompts of two styles and one-character lines."""
    from chunlian.engine.channel import ChannelScorer
    from chunlian.model.tokenizer import sequence_roles

    loaded = shipped()
    tok, model = loaded.tokenizer, loaded.model
    triples = [("春回大地", "福满人间", "traditional"), ("春回大地", "花开富贵", "traditional"),
               ("春回大地", "福满人间", "family"), ("瑞雪兆丰", "红梅报早", "traditional"),
               ("福", "春", "traditional"), ("福", "喜", "business")]

    def full_pass(upper: str, lower: str, style: str) -> float:
        n = len(upper)
        ids = tok.prefix(style) + tok.encode(upper) + [tok.sep_id] + tok.encode(lower)
        idx = torch.tensor([ids[:-1]])
        with torch.inference_mode():
            logp = torch.log_softmax(model(idx, torch.arange(idx.shape[1])[None],
                                           torch.tensor(sequence_roles(n, n - 1))[None]).float(), dim=-1)[0]
        return sum(float(logp[len(ids) - 1 - n + j, t]) for j, t in enumerate(ids[-n:]))

    got = ChannelScorer(loaded, forward=True).score(triples)
    want = [full_pass(*t) for t in triples]
    assert got == pytest.approx(want, abs=1e-3)
    assert got[0] != got[1] and got[0] != got[2]  # same prompt, other 下联; same lines, other style


def test_candidates_sharing_prefixes_score_as_full_passes_in_both_directions() -> None:
    """The scorer computes a prefix its candidates share once (prefix trees): each number is
    still a plain full pass's, for the channel reading (candidates' prompts share a stem)
    and the forward one (their continuations do), with two requests in one call."""
    from chunlian.engine.channel import ChannelScorer
    from chunlian.model.tokenizer import sequence_roles

    loaded = shipped()
    tok, model = loaded.tokenizer, loaded.model
    triples = [("春回大地", low, "traditional") for low in ("福满人间", "福满人家", "福到人间", "花开富贵")]
    triples += [("瑞雪兆丰", low, "family") for low in ("红梅报早", "红梅报春")]

    def full_pass(given: str, scored: str, style: str, register: str) -> float:
        n = len(given)
        ids = tok.prefix(style, register) + tok.encode(given) + [tok.sep_id] + tok.encode(scored)
        idx = torch.tensor([ids[:-1]])
        with torch.inference_mode():
            logp = torch.log_softmax(model(idx, torch.arange(idx.shape[1])[None],
                                           torch.tensor(sequence_roles(n, n - 1))[None]).float(), dim=-1)[0]
        return sum(float(logp[len(ids) - 1 - n + j, t]) for j, t in enumerate(ids[-n:]))

    fwd, rev = ChannelScorer(loaded, forward=True), ChannelScorer(loaded)
    assert fwd.score(triples) == pytest.approx([full_pass(u, lo, s, fwd.register) for u, lo, s in triples], abs=1e-3)
    assert rev.score(triples) == pytest.approx([full_pass(lo, u, s, rev.register) for u, lo, s in triples], abs=1e-3)


def test_beam_reparenting_of_generated_positions_equals_copying_the_prompt_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reparented beam gets only its parent's generated positions (a request's beams share
    their prompt); copying every written position finds the same beams."""
    from chunlian.engine import beams as beams_mod

    items = [(u, "traditional") for u in UPPERS[:6]]
    fast = beams(items, 4, capacity=16)
    original = beams_mod._copy_kv
    monkeypatch.setattr(beams_mod, "_copy_kv",
                        lambda moves, live, cache: original([(d, s, 0) for d, s, _ in moves], live, cache))
    slow = beams(items, 4, capacity=16)
    assert [[(h.lower, round(h.logprob, 4)) for h in hs] for hs in fast] == \
        [[(h.lower, round(h.logprob, 4)) for h in hs] for hs in slow]


def test_batched_greedy_equals_one_at_a_time() -> None:
    """Padding, masks and per-row positions are right: a batch of mixed lengths (joined as
    rows free up, so prefill and decode mix) gives what each request gets alone."""
    loaded = shipped()
    batched = lowers(ModelRunner(loaded, 4), specs())
    alone = {s.upper: lowers(ModelRunner(loaded, 1), [s])[s.upper] for s in specs()}  # type: ignore[index]
    assert batched == alone


def test_a_fused_step_equals_its_decode_and_prefills_apart() -> None:
    """``ModelRunner.step`` runs the live rows' decode and the new prompts' prefill (here
    two length groups, one a composed line) as groups of one forward pass: the logits and
    the cache equal those of separate passes, and the new rows join with their first token."""
    loaded = shipped()
    model = loaded.model
    compose = SeqSpec(seq_id=90, style="family", upper=None, upper_len=5, upper_forced={0: "福"})
    new = [*specs(first_id=50)[6:9], compose]
    runners = [ModelRunner(loaded, 8), ModelRunner(loaded, 8)]
    with torch.inference_mode():
        for r in runners:
            r.prefill(specs()[:3])
            r.decode()
        fused_r, apart_r = runners
        inputs = {}
        for name, r in (("fused", fused_r), ("apart", apart_r)):
            groups = [r._decode_input()]
            at = r.n_live
            for chunk in (new[:2], new[2:]):
                groups.append(r._prefill_input(chunk, at)[0])
                at += len(chunk)
            inputs[name] = groups
        fused = model.forward_groups(inputs["fused"], fused_r.cache)
        apart = torch.cat([model.forward_groups([g], apart_r.cache) for g in inputs["apart"]])
    assert fused.shape == (3 + len(new), len(loaded.tokenizer))
    assert torch.allclose(fused, apart, atol=1e-4, rtol=1e-4)
    assert torch.equal(fused.argmax(-1), apart.argmax(-1))
    used = 3 + len(new)
    assert torch.allclose(fused_r.cache.k[:, :used], apart_r.cache.k[:, :used], atol=1e-5)
    runner = ModelRunner(loaded, 8)
    runner.prefill(specs()[:3])
    runner.step(new)
    assert runner.n_live == 3 + len(new)  # none of these lines ends after two tokens
    assert sorted(r.spec.seq_id for r in runner.rows[3:]) == [s.seq_id for s in new]
    # each new row took its first token: a 下联 character, or the composed line's second
    assert all(len(r.state.lower) == 1 if r.spec.upper else r.state.upper[:1] == "福" and len(r.state.upper) == 2
               for r in runner.rows[3:])


def test_a_padded_batch_gives_the_same_answers_and_holds_its_rows_to_the_end() -> None:
    """Static batching's padded rectangle: one prefill padded to the longest prompt, finished
    rows kept in the decode forward (fed padding) until the longest ends - and yet every
    answer is the one the request gets alone, returned as soon as it is complete."""
    loaded = shipped()
    runner = ModelRunner(loaded, 16)
    runner.padded_batches = True
    batch = specs()
    finished = runner.prefill(batch)
    rows_per_step = [runner.n_live]
    while runner.n_live:
        finished += runner.decode()
        rows_per_step.append(runner.n_live)
    longest = max(len(u) for u in UPPERS)
    # every row stays until the longest line's last character, then all leave at once
    assert rows_per_step == [len(batch)] * (longest - 1) + [0]
    by_id = {s.seq_id: s.upper for s in batch}
    got = {by_id[o.seq_id]: o.lower for o in finished}
    alone = {s.upper: lowers(ModelRunner(loaded, 1), [s])[s.upper] for s in batch}  # type: ignore[index]
    assert got == alone
    runner.prefill(specs(first_id=100)[:1])  # the next batch starts on an empty runner
    with pytest.raises(ValueError, match="padded batch"):  # nothing joins a running one
        runner.prefill(specs(first_id=200)[:1])


def test_a_seed_gives_the_same_sample_whatever_the_batch() -> None:
    loaded = shipped()
    batched = lowers(ModelRunner(loaded, 16), specs(greedy=False))
    alone = {s.upper: lowers(ModelRunner(loaded, 1), [s])[s.upper]  # type: ignore[index]
             for s in specs(greedy=False)[:4]}
    assert {u: batched[u] for u in alone} == alone
    other_seeds = lowers(ModelRunner(loaded, 16), [
        SeqSpec(seq_id=i, style="traditional", upper=u, upper_len=len(u), greedy=False, seed=7 + i)
        for i, u in enumerate(UPPERS)])
    assert other_seeds != batched  # the seed matters


def test_cached_decoding_equals_a_full_recompute() -> None:
    """Logits from the KV cache (one token per step) match a forward over the whole prefix."""
    loaded = shipped()
    model, tok = loaded.model.eval(), loaded.tokenizer
    upper, lower = "春风送暖入屠苏", "瑞气盈门满室春"
    ids = tok.prefix("traditional", "modern") + tok.encode(upper) + [tok.sep_id] + tok.encode(lower)
    roles = ([0] * PREFIX_LEN + [upper_role(i) for i in range(len(upper))]
             + [lower_role(i) for i in range(len(lower) + 1)])
    T = len(ids)
    idx, role = torch.tensor([ids]), torch.tensor([roles])
    pos = torch.arange(T)[None]
    with torch.inference_mode():
        full = model(idx, pos, role)[0]  # [T, V]
        runner = ModelRunner(loaded, 1)
        cache_ = runner.cache
        P = PREFIX_LEN + len(upper) + 1
        mask = torch.ones(P, P, dtype=torch.bool).tril()[None]
        step = [model(idx[:, :P], pos[:, :P], role[:, :P], mask, cache_, row0=0,
                      select=torch.tensor([P - 1]))[0]]
        for t in range(P, T):
            m = (torch.arange(t + 1) <= t)[None, None, :]
            step.append(model(idx[:, t:t + 1], pos[:, t:t + 1], role[:, t:t + 1], m, cache_,
                              cache_pos=torch.tensor([t]))[0, 0])
    got = torch.stack(step)
    want = full[P - 1:]
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_the_cached_prompt_prefix_equals_computing_it_with_the_prompt() -> None:
    """A prefill copies the keys and values of ``[BOS][STYLE][REGISTER]`` from a per-style
    table and computes only the rest: every cached position matches a forward over the
    whole prompt into an empty cache."""
    loaded = shipped()
    model, tok = loaded.model, loaded.tokenizer
    runner = ModelRunner(loaded, 8)
    styles = ["traditional", "business", "family", "literary"]
    batch = [SeqSpec(seq_id=i, style=styles[i % 4], upper=u, upper_len=len(u))
             for i, u in enumerate(UPPERS[:6])]
    runner.prefill(batch)
    with torch.inference_mode():
        for r, row in enumerate(runner.rows):  # cache row r holds runner.rows[r]
            s = row.spec
            assert s.upper is not None
            ids = tok.prefix(s.style, s.register) + tok.encode(s.upper) + [tok.sep_id]
            n = len(ids)
            roles = [0] * PREFIX_LEN + [upper_role(i) for i in range(len(s.upper))] + [lower_role(0)]
            ref = KVCache(model.cfg, 1, torch.device("cpu"), torch.float32)
            model(torch.tensor([ids]), torch.arange(n)[None], torch.tensor([roles]),
                  torch.ones(1, n, n, dtype=torch.bool).tril(), ref)
            assert torch.allclose(runner.cache.k[:, r, :, :n], ref.k[:, 0, :, :n], atol=1e-5)
            assert torch.allclose(runner.cache.v[:, r, :, :n], ref.v[:, 0, :, :n], atol=1e-5)
            assert row.next_pos == n


@pytest.mark.parametrize(("argv", "needle"), [
    (["generate", "hello"], "Chinese"),
    (["generate", "春" * 33], "32"),
    (["generate", "春回大地", "--style", "foo"], "style"),
    (["generate", "春回大地", "--n", "9"], "n must be"),
    (["generate", "春回大地", "--n", "0"], "n must be"),
    (["generate", "春回大地", "--beam", "0"], "beam"),
    (["generate", "春回大地", "--beam", "33"], "beam"),
    (["generate", "春回大地", "--channel", "1"], "beam width"),
    (["generate", "春回大地", "--beam", "4", "--channel", "-1"], "channel weight"),
    (["generate", "春回大地", "--beam", "4", "--rescore-weight", "1"], "rescore with"),
    (["generate", "春回大地", "--rescore", "x.safetensors"], "beam width"),
    (["generate", "春回大地", "--beam", "4", "--rescore", "x.safetensors", "--rescore-weight", "-1"], "rescore weight"),
    (["generate", "   "], "upper"),
    (["compose", "--heads", "欧阳小明明"], "heads"),
    (["compose", "--heads", "ab"], "heads"),
    (["compose", "--keyword", "新春", "--length", "6"], "length"),
])
def test_cli_bad_input_exits_2_with_one_line_and_nothing_on_stdout(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = cli_main(argv)
    except SystemExit as exc:  # argparse's own errors exit; ours return
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_bind_thread_sets_the_torch_threads_of_the_step_thread_only() -> None:
    """The engine thread gets the runner's thread count; the loading thread keeps its own
    (a second multi-thread OpenMP team, even idle, slows the first: ``bind_thread``)."""
    runner = ModelRunner(shipped(), 2, threads=3)
    seen: list[int] = []

    def step_thread() -> None:
        runner.bind_thread()
        seen.append(torch.get_num_threads())

    t = threading.Thread(target=step_thread)
    t.start()
    t.join()
    assert seen == [3]
    assert torch.get_num_threads() == 1  # this module's setting, untouched


def test_eval_with_channel_reranking_reports_its_weight_and_refuses_it_without_a_beam(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    from pathlib import Path

    data = Path(str(tmp_path)) / "pairs.tsv"
    data.write_text("upper\tlower\n春回大地\t福满人间\n瑞雪兆丰年\t红梅报早春\n", encoding="utf-8")
    assert cli_main(["eval", "--data", str(data), "--json", "--beam", "4", "--channel", "0.5"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["beam"] == 4 and report["channel_weight"] == 0.5 and report["pairs"] == 2
    assert report["length_ok"] == 1.0 and report["no_shared_char"] == 1.0
    assert cli_main(["eval", "--data", str(data), "--json", "--channel", "0.5"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "beam width of 2 or more" in err
    # the quality preset: the reverse-trained weights, a beam of 32, channel weight 0.75,
    # rescored by the shipped weights at 0.5
    assert cli_main(["eval", "--data", str(data), "--json", "--quality"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == load_weights(QUALITY_WEIGHTS).tag
    assert report["beam"] == 32 and report["channel_weight"] == 0.75 and report["no_shared_char"] == 1.0
    assert report["rescore"] == [load_weights(DEFAULT_WEIGHTS).tag] and report["rescore_weight"] == 0.5
    # an explicit --beam 1 is greedy on the quality weights, with no channel term
    assert cli_main(["eval", "--data", str(data), "--json", "--quality", "--beam", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == load_weights(QUALITY_WEIGHTS).tag and "beam" not in report
    assert "channel_weight" not in report and "rescore" not in report
    assert cli_main(["generate", "春回大地", "--quality", "--json"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["upper"] == "春回大地" and len(line["lower"]) == 4 and len(line["hengpi"]) == 4


def test_load_quality_is_the_preset() -> None:
    from chunlian.offline import QUALITY, OfflineGenerator

    gen = OfflineGenerator.load_quality("cpu", capacity=4)
    assert gen.loaded.version == load_weights(QUALITY_WEIGHTS).version and gen.beam_width == QUALITY.width
    assert gen.channel_weight == QUALITY.channel_weight and gen.rescore_weight == QUALITY.rescore_weight
    assert [m.version for m in gen.rescorers] == [shipped().version]
