"""The model runner: the only torch code of the engine.

Slot-based KV cache with ``capacity`` rows. Live sequences always occupy rows
``0 .. n_live-1`` (a finished or released sequence's row is filled by moving the last live
row into it), so a decode step attends over a plain slice of the cache, with no gather.

* ``prefill(specs)``: one padded, masked forward over the new prompts (right padding,
  per-row lengths), written into rows ``n_live ..``; each new sequence emits its first token.
  The prompt prefix ``[BOS][STYLE][REGISTER]`` is not recomputed: its keys and values are
  the same for every sequence of a style and register, and are copied in (``_prefix``).
* ``decode()``: one token for every live row, each at its own position.
* ``step(specs)``: continuous batching's iteration - ``decode()`` of the live rows and the
  prefill of ``specs`` in one forward pass (``CoupletTransformer.forward_groups``).
All apply the couplet rules (``model.decoding``) as batched logit masks and return the
sequences that finished during the call; finished sequences leave at once.

``padded_batches`` (the engine sets it for ``batching = "static"``) makes the runner batch
as request-level batching does (the seeds, HF ``generate``): an admitted batch is one
rectangle - one prefill forward padded to its longest prompt, and every row stays in the
decode forward (fed padding) until the batch's longest sequence finishes. A finished row's
answer is still returned at once, and its rule work is skipped.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor

from chunlian.data.blocklist import Blocklist, default_blocklist
from chunlian.engine import beams
from chunlian.engine.prefill import GROUP_FIXED_TOKENS, prefill_chunks
from chunlian.engine.request import BeamHyp, SeqOutput, SeqSpec
from chunlian.engine.rows import BeamGroup, Row
from chunlian.engine.sampling import MAX_BATCHED_TOP_K, sample_one, sample_top_k
from chunlian.model.checkpoint import LoadedModel, load_weights
from chunlian.model.decoding import Constrainer, LineState
from chunlian.model.lean import decode_step
from chunlian.model.tokenizer import PREFIX_LEN, lower_role, upper_role
from chunlian.model.transformer import GroupInput, KVCache

DEFAULT_TONE_BIAS = 2.0


class ModelRunner:
    """Runs prefill and decode steps for up to ``capacity`` concurrent sequences."""

    def __init__(
        self,
        loaded: LoadedModel,
        capacity: int,
        device: str = "cpu",
        blocklist: Blocklist | None = None,
        tone_bias: float = DEFAULT_TONE_BIAS,
        threads: int = 0,
    ) -> None:
        self.loaded = loaded
        self.threads = threads  # torch threads of the thread that runs the steps (0: as is)
        self.model = loaded.model.to(device).eval()
        self.tok = loaded.tokenizer
        self.device = torch.device(device)
        self.capacity = capacity
        self.cfg = self.model.cfg
        self.cache = KVCache(self.cfg, capacity, self.device, torch.float32)
        self.blocklist = blocklist or default_blocklist()  # shared: its indexes are built once
        self.constrainer = Constrainer(self.tok, self.blocklist, self.device)
        self.tone_bias = tone_bias
        self.rows: list[Row] = []
        self.tokens_emitted = 0
        self.padded_batches = False  # request-level batches (module docstring)
        # (style, register) -> the prompt prefix's keys and values, each [layers, H, P, hd]
        self._prefix_kv: dict[tuple[str, str], tuple[Tensor, Tensor]] = {}

    @classmethod
    def from_path(cls, path: Path | None, capacity: int, device: str = "cpu") -> ModelRunner:
        return cls(load_weights(path, device), capacity, device)

    def bind_thread(self) -> None:
        """Called on the thread that will run the steps, before the first one.

        torch's OpenMP teams belong to the thread that starts them; while another thread
        holds an idle team of its own, libgomp manages more threads than there are CPUs and
        cuts its spin-wait to almost nothing, so every parallel op pays a sleep/wake-up and
        a batch takes more than twice as long (``docs/performance.md``). So the
        loading thread runs torch single-threaded (``single_threaded_here``) and the step
        thread alone gets ``threads``.
        """
        if self.threads:
            torch.set_num_threads(self.threads)

    @property
    def n_live(self) -> int:
        return len(self.rows)

    def live_ids(self) -> list[int]:
        return [r.spec.seq_id for r in self.rows]

    # ---- slot management -------------------------------------------------------------
    def release(self, seq_ids: set[int] | list[int]) -> None:
        """Free the rows of these sequences (cancelled, dropped); unknown ids are ignored."""
        drop = set(seq_ids)
        i = 0
        while i < len(self.rows):
            if self.rows[i].spec.seq_id in drop:
                self._remove_row(i)
            else:
                i += 1
        if all(r.retired for r in self.rows):  # what is left of a padded batch is padding
            self.rows.clear()

    def _remove_row(self, i: int) -> None:
        last = len(self.rows) - 1
        if i != last:
            self.cache.move_row(last, i, self.rows[last].next_pos)
            self.rows[i] = self.rows[last]
        self.rows.pop()

    # ---- steps -------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, specs: list[SeqSpec]) -> list[SeqOutput]:
        """Admit new sequences (at most the free rows) and emit their first token.

        Prompts are grouped by length (``prefill_chunks``) so that a mix of short and long
        lines does not pad every short one to the longest.
        """
        if not specs:
            return []
        self._check_room(specs)
        chunks = [specs] if self.padded_batches else prefill_chunks(specs, self._prompt_len)
        out: list[SeqOutput] = []
        for chunk in chunks:
            out.extend(self._prefill(chunk))
        return out

    def _check_room(self, specs: list[SeqSpec]) -> None:
        need = sum(s.rows for s in specs)
        if need > self.capacity - self.n_live:
            raise ValueError(f"prefill of {need} rows exceeds free rows {self.capacity - self.n_live}")
        if self.padded_batches and self.rows:
            raise ValueError("a padded batch admits nothing until it has finished")

    def _prompt_len(self, spec: SeqSpec) -> int:
        """Prompt tokens a prefill computes: its prompt characters, SEP for a 下联 (the
        prefix comes from ``_prefix``)."""
        return len(spec.prompt_chars) + (spec.upper is not None)

    def _prefix(self, style: str, register: str) -> tuple[Tensor, Tensor]:
        """Keys and values of the prompt prefix ``[BOS][STYLE][REGISTER]`` at every layer,
        ``[layers, H, PREFIX_LEN, hd]`` each: the same for every sequence of that style and
        register (causal attention), so computed once and copied into each new row."""
        kv = self._prefix_kv.get((style, register))
        if kv is None:
            dev = self.device
            scratch = KVCache(self.cfg, 1, dev, torch.float32)
            idx = torch.tensor([self.tok.prefix(style, register)], device=dev)
            pos = torch.arange(PREFIX_LEN, device=dev)[None]
            mask = torch.ones(1, PREFIX_LEN, PREFIX_LEN, dtype=torch.bool, device=dev).tril()
            self.model(idx, pos, torch.zeros_like(pos), mask, scratch)
            kv = (scratch.k[:, 0, :, :PREFIX_LEN].clone(), scratch.v[:, 0, :, :PREFIX_LEN].clone())
            self._prefix_kv[(style, register)] = kv
        return kv

    def _prefill(self, specs: list[SeqSpec]) -> list[SeqOutput]:
        """One forward over the prompts after their prefix (``_prefill_input``)."""
        gi, new_rows = self._prefill_input(specs, self.n_live)
        logits = self.model.forward_groups([gi], self.cache)  # [B, V]
        self.rows.extend(new_rows)
        return self._emit(logits, new_rows)

    def _prefill_input(self, specs: list[SeqSpec], row0: int) -> tuple[GroupInput, list[Row]]:
        """The model input of a prefill into rows ``row0 ..`` and the rows' states. The
        prompt prefix's keys and values are copied into those rows here from ``_prefix``
        (a quarter of a short line's prompt): the input is the rest of each prompt."""
        tok = self.tok
        prompts: list[list[int]] = []
        roles: list[list[int]] = []
        new_rows: list[Row] = []
        for s in specs:
            chars = s.prompt_chars
            ids = tok.encode(chars)
            rl = [upper_role(i) for i in range(len(chars))]
            if s.upper is not None:
                ids.append(tok.sep_id)
                rl.append(lower_role(0))
                state = LineState(style=s.style, upper=s.upper, upper_len=s.upper_len, phase="lower",
                                  lower_forced=s.lower_forced, named=s.named)
            else:
                state = LineState(
                    style=s.style, upper=chars, upper_len=s.upper_len, phase="upper",
                    upper_forced=s.upper_forced, lower_forced=s.lower_forced, upper_banned=s.upper_banned,
                    named=s.named,
                )
            prompts.append(ids)
            roles.append(rl)
            gen = None
            if not s.greedy:
                gen = torch.Generator(device="cpu").manual_seed(s.seed)
            row = Row(s, state, 0, 0, 0, gen=gen)
            if s.beam is not None:  # one prompt row; its first choice fans it out (engine.beams)
                row.group = BeamGroup(s.beam.width, [row])
            new_rows.append(row)
        B = len(prompts)
        T = max(len(p) for p in prompts)  # prompt tokens after the prefix (at least 1)
        lens = torch.tensor([len(p) for p in prompts])
        # one tensor each from padded lists (a copy per row cost more than the rows' work)
        idx = torch.tensor([p + [tok.pad_id] * (T - len(p)) for p in prompts])
        role = torch.tensor([r + [0] * (T - len(r)) for r in roles])
        P = PREFIX_LEN
        pos = torch.arange(P, P + T).expand(B, T)
        key_ok = torch.arange(T)[None, :] < lens[:, None]  # [B, T]
        new = torch.ones(T, T, dtype=torch.bool).tril()[None] & key_ok[:, None, :]  # [B, T, T]
        # a padded query row attends to at least itself, keeping softmax finite
        new |= torch.eye(T, dtype=torch.bool)[None]
        mask = torch.cat([torch.ones(B, T, P, dtype=torch.bool), new], dim=2)  # [B, T, P + T]
        dev = self.device
        by_prefix: dict[tuple[str, str], list[int]] = {}
        for b, s in enumerate(specs):
            by_prefix.setdefault((s.style, s.register), []).append(row0 + b)
        for (style, register), rows in by_prefix.items():
            pk, pv = self._prefix(style, register)
            at = torch.tensor(rows, device=dev)
            self.cache.k[:, at, :, :P] = pk[:, None]
            self.cache.v[:, at, :, :P] = pv[:, None]
        for b, row in enumerate(new_rows):
            row.next_pos = P + len(prompts[b])
        gi = GroupInput(idx.to(dev), pos.to(dev), role.to(dev), mask.to(dev), row0=row0,
                        select=(lens - 1).to(dev))
        return gi, new_rows

    def _decode_input(self) -> GroupInput:
        """The model input of one decode step over every live row (advances their positions)."""
        dev = self.device
        feed = torch.tensor([(r.next_id, r.next_pos, r.next_role) for r in self.rows], device=dev)  # [B, 3]
        idx, pos, role = feed[:, 0:1], feed[:, 1], feed[:, 2:3]
        S = max(r.next_pos for r in self.rows) + 1
        mask = (torch.arange(S, device=dev)[None, :] <= pos[:, None])[:, None, :]  # [B, 1, S]
        for r in self.rows:
            r.next_pos += 1
        return GroupInput(idx, pos[:, None], role, mask, cache_pos=pos)

    @torch.inference_mode()
    def decode(self) -> list[SeqOutput]:
        """One token for every live sequence."""
        if not self.rows:
            return []
        logits = decode_step(self.model, self._decode_input(), self.cache)  # [B, V]; model.lean
        if not self.padded_batches:
            return self._emit(logits, list(self.rows))
        live = [b for b, r in enumerate(self.rows) if not r.retired]
        if len(live) < len(self.rows):  # its finished rows were computed, unused
            logits = logits[torch.tensor(live, device=self.device)]
        return self._emit(logits, [self.rows[b] for b in live])

    @torch.inference_mode()
    def step(self, specs: list[SeqSpec]) -> list[SeqOutput]:
        """Continuous batching's iteration: one token for every live sequence and the
        admission of ``specs`` (their first token), in one forward pass.

        The decode rows and the prefill chunks are groups of one ``forward_groups`` call:
        its linear layers run once over all their tokens, so a step that admits a few
        sequences pays one pass's fixed cost (six layers of small ops), not two. A
        new sequence's second token comes at the next step; an idle runner's pass holds the
        prefill chunks alone. Padded batches (static) take ``prefill`` / ``decode``.
        """
        if not specs:
            return self.decode()
        if self.padded_batches:
            return self.prefill(specs)
        self._check_room(specs)
        dec_rows = list(self.rows)
        inputs = [self._decode_input()] if dec_rows else []
        new_rows: list[Row] = []
        row0 = self.n_live
        for chunk in prefill_chunks(specs, self._prompt_len, GROUP_FIXED_TOKENS):
            gi, rows = self._prefill_input(chunk, row0)
            inputs.append(gi)
            new_rows += rows
            row0 += len(chunk)
        logits = self.model.forward_groups(inputs, self.cache)  # [live + new, V]
        self.rows.extend(new_rows)
        return self._emit(logits, dec_rows + new_rows)

    # ---- token choice --------------------------------------------------------------------
    def _emit(self, logits: Tensor, rows: list[Row]) -> list[SeqOutput]:
        """Apply the rules, choose one token per row, advance states, retire finished rows."""
        tok = self.tok
        sep_rows = {b for b, r in enumerate(rows) if r.pending_sep}
        states = [r.state for r in rows]
        con = self.constrainer.apply(logits.float(), states, self.tone_bias)
        logits, forced, choice = con.scores, con.forced, con.top_id  # [B, V], B, [B]
        sampled = [b for b, r in enumerate(rows) if r.gen is not None and forced[b] is None]
        if sampled:
            choice = choice.clone()
            batched = [b for b in sampled if 0 < rows[b].spec.top_k <= MAX_BATCHED_TOP_K]
            if batched:
                sel = torch.tensor(batched, device=logits.device)
                choice[sel] = sample_top_k(logits[sel], [rows[b].spec for b in batched],
                                           [rows[b].gen for b in batched])
            for b in sorted(set(sampled) - set(batched)):
                choice[b] = sample_one(logits[b], rows[b].spec, rows[b].gen)
        choice_l = choice.tolist()
        chosen_lp = self._chosen_logprobs(logits, choice, rows, forced)
        beam_idx = [b for b, r in enumerate(rows) if r.group is not None and b not in sep_rows]
        if beam_idx:  # the beams choose together, per request (engine.beams)
            beams.advance(logits, forced, rows, beam_idx, self.rows, self.cache, tok)
        for b, r in enumerate(rows):
            self.tokens_emitted += 1
            if b in sep_rows:  # the composed 上联 is complete: feed the separator next
                r.pending_sep = False
                r.next_id, r.next_role = tok.sep_id, lower_role(0)
                continue
            if r.group is not None:
                continue
            f = forced[b]
            ch = f if f is not None else tok.itos[choice_l[b]]
            was_upper = r.state.phase == "upper"
            if b in chosen_lp:
                r.logprob_sum += chosen_lp[b]
                r.n_scored += 1
            if was_upper:
                r.next_role = upper_role(len(r.state.upper))
            else:
                r.next_role = lower_role(len(r.state.lower) + 1)
            r.state.push(ch)
            r.next_id = tok.stoi.get(ch, tok.unk_id)
            if was_upper and r.state.phase == "lower":
                r.pending_sep = True
        return self._retire_finished()

    def _retire_finished(self) -> list[SeqOutput]:
        """The outputs of the rows whose lines are complete (one per beam search), and
        their rows freed (retired as padding in a padded batch)."""
        tok = self.tok
        finished: list[SeqOutput] = []
        done = [i for i, r in enumerate(self.rows) if r.state.done and not r.retired]
        for i in reversed(done):
            r = self.rows[i]
            if r.group is None:
                finished.append(SeqOutput(r.spec.seq_id, r.state.upper, r.state.lower,
                                          r.logprob_sum / max(1, r.n_scored)))
            elif r is r.group.rows[0]:  # a group's rows all finish at this step
                finished.append(_beam_output(r.group))
            if self.padded_batches:
                r.retired, r.next_id = True, tok.pad_id
            else:
                self._remove_row(i)
        if self.padded_batches and all(r.retired for r in self.rows):
            self.rows.clear()  # the batch is over: its slots are free at once
        return finished

    def _chosen_logprobs(
        self, logits: Tensor, choice: Tensor, rows: list[Row], forced: list[str | None]
    ) -> dict[int, float]:
        """Log-probability of each scored row's choice, renormalised over its allowed tokens
        (forced characters are not scored; ``SeqSpec.scored``). log_softmax, not logsumexp:
        several times faster on rows full of -inf (``docs/performance.md``), and finite,
        since a row always has a choice."""
        # a beam's rows score their choices themselves (``engine.beams``)
        want = [b for b, r in enumerate(rows) if r.spec.scored and forced[b] is None and r.group is None]
        if not want:
            return {}
        if len(want) < len(rows):
            sel = torch.tensor(want, device=logits.device)
            logits, choice = logits[sel], choice[sel]
        lp = torch.log_softmax(logits, dim=-1).gather(1, choice[:, None])[:, 0].tolist()
        return dict(zip(want, lp, strict=True))


def _beam_output(g: BeamGroup) -> SeqOutput:
    """A finished beam search: its best line, with every surviving line best first."""
    assert g.score is not None
    n = max(1, g.n_scored)
    hyps = tuple(BeamHyp(r.state.lower, sc, sc / n, r.state.upper if r.spec.composed_search else "")
                 for r, sc in zip(g.rows, g.score.tolist(), strict=True) if math.isfinite(sc))
    best = g.rows[0].state
    return SeqOutput(g.rows[0].spec.seq_id, best.upper, best.lower, hyps[0].logprob_mean, hyps)


def single_threaded_here() -> None:
    """Make the calling thread run torch ops on one thread: call it before loading a model
    on a thread other than the one that will run it (see ``ModelRunner.bind_thread``)."""
    torch.set_num_threads(1)
