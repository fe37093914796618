"""Local Hugging Face scorer: batched, padded, sliding windows, chunked log-softmax.

Precision (`dtype` for the decoder body, `bf16_matmuls` for `dtype: mixed` (scoring/precision.py),
`head` for the output layer and its log-softmax):
- head "model": the output layer runs in the body's dtype; logits are upcast for the log-softmax.
- head "float32": the output layer runs in fp32 on the upcast hidden states (fp32 weights kept).
- head "refined": the output layer runs in the body's dtype over the whole vocabulary, then the
  `refine_top` largest logits and the target's are recomputed in fp32, so the terms that decide
  the log-softmax are exact; the rest of the vocabulary only adds rounding-sized tails: as
  accurate as "float32" with the head's matmul in bf16 (numbers: benchmarks/bench_precision.py).

The "float32" and "refined" heads stream the vocabulary in blocks of `VOCAB_BLOCK` rows with an
online log-sum-exp, so a block's logits are still in cache when they are summed: on Gemma's
262k-token vocabulary, writing out and re-reading the full logits (then a top-k over them) cost
as much as the head's matmul itself (benchmarks/bench_precision.py, variant `mixed-refined-unstreamed`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from bbox_sae.errors import ConfigError, ScoringError
from bbox_sae.scoring.base import TokenScores, Window, plan_windows
from bbox_sae.scoring.cpu import use_causal_query_blocks
from bbox_sae.scoring.precision import Bf16Linear, use_bf16_matmuls

log = logging.getLogger(__name__)


def start_token_id(tokenizer, override: str | None) -> int:
    """The token every document is conditioned on: the override, else BOS, else EOS."""
    if override is not None:
        tid = tokenizer.convert_tokens_to_ids(override)
        if tid is None or tid == tokenizer.unk_token_id and override != tokenizer.unk_token:
            raise ConfigError(f"start_token '{override}' is not in the tokenizer's vocabulary")
        return int(tid)
    for tid in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    raise ConfigError("tokenizer defines neither BOS nor EOS; set `start_token` in the model config")


def tokenize_with_offsets(tokenizer, text: str) -> tuple[np.ndarray, np.ndarray]:
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"{type(tokenizer).__name__} gives no character offsets; a fast tokenizer is needed")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    return ids, offsets


HEADS = ("model", "float32", "refined")
VOCAB_BLOCK = 8192


@dataclass
class _Job:
    doc: int
    input_ids: list[int]
    window: Window


class HFScorer:
    def __init__(
        self,
        name: str,
        model,
        tokenizer,
        *,
        start_token: str | None = None,
        window: int = 1024,
        stride: int = 512,
        batch_size: int = 8,
        logprob_chunk: int = 256,
        dtype: torch.dtype | None = None,
        bf16_matmuls: bool = False,
        head: str = "model",
        refine_top: int = 32,
        alternatives: int = 0,
    ):
        self.name = name
        self.model = model
        self.tokenizer = tokenizer
        # Whole documents are tokenized before windowing; the length warning would be noise.
        tokenizer.model_max_length = 10**12
        self.start_id = start_token_id(tokenizer, start_token)
        max_positions = getattr(model.config, "max_position_embeddings", None)
        self.window = min(window, max_positions) if max_positions else window
        self.stride = min(stride, self.window - 1)
        self.batch_size = batch_size
        self.logprob_chunk = logprob_chunk
        self.device = next(model.parameters()).device
        self._body = model.base_model
        self._head = model.get_output_embeddings()
        self._softcap = getattr(model.config, "final_logit_softcapping", None)
        if head not in HEADS:
            raise ConfigError(f"model '{name}': head '{head}' is not one of {HEADS}")
        self.head = head
        self.refine_top = refine_top
        self.alternatives = alternatives
        self._token_texts: dict[int, str] = {}
        self._head_weight = self._head_bias = None
        if head != "model":
            # Keeps the loaded (fp32) tensors: converting the model below gives them new storage.
            self._head_weight = self._head.weight.detach().float()
            bias = getattr(self._head, "bias", None)
            self._head_bias = None if bias is None else bias.detach().float()
        # The head check compares our path with the model's own logits, so it runs before any
        # conversion, in the precision the model was loaded in.
        self._check_head()
        if dtype is not None and dtype != next(model.parameters()).dtype:
            model.to(dtype)
        # What the run records of how it scored (`dtype: auto` resolves by host).
        body = "mixed: bf16 matmuls, fp32 elsewhere" if bf16_matmuls else str(next(model.parameters()).dtype).removeprefix("torch.")
        self.precision = f"{body}; head {head}; {self.device.type}"
        if self.device.type == "cpu":
            use_causal_query_blocks(model)
        if bf16_matmuls:
            use_bf16_matmuls(model)
            if head == "refined":
                # The refined head's full-vocabulary pass is the one worth running in bf16.
                self._head = Bf16Linear(self._head)

    def _check_head(self) -> None:
        """Our decoder-body + chunked-head path must equal the model's own logits."""
        ids = torch.tensor([[self.start_id, *range(5, 13)]], device=self.device)
        with torch.inference_mode():
            full = torch.log_softmax(self.model(ids).logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])[:, 0]
            ours = self._target_logprobs(self._body(input_ids=ids).last_hidden_state[0, :-1], ids[0, 1:])[0]
        if not torch.allclose(full, ours, atol=1e-3, rtol=1e-3):
            raise ScoringError(
                f"model '{self.name}': chunked log-softmax disagrees with the model's logits "
                f"(max diff {float((full - ours).abs().max()):.3g}); unsupported output head"
            )

    def _cap(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.tanh(logits / self._softcap) * self._softcap if self._softcap else logits

    def _head_rows(self) -> torch.Tensor:
        """The output layer's weight in the precision its full-vocabulary pass runs in."""
        return self._head_weight if self.head == "float32" else self._head.weight

    def _block_logits(self, hidden: torch.Tensor, begin: int, end: int) -> torch.Tensor:
        """fp32 logits (after any softcap) of vocabulary rows [begin, end), from hidden states
        already in the head weight's dtype."""
        logits = torch.nn.functional.linear(hidden, self._head_rows()[begin:end]).float()
        if self._head_bias is not None:
            logits += self._head_bias[begin:end]
        return self._cap(logits)

    def _streamed_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log p(target) through an online log-sum-exp over vocabulary blocks, and the
        `alternatives` likeliest tokens with their log-probs; for the refined head, the
        `refine_top` largest block logits (tracked across blocks) and the target's are then
        swapped for their fp32 values in the sum."""
        n, vocab = len(targets), self._head_weight.shape[0]
        refine = self.head == "refined"
        top = min(max(self.refine_top if refine else 0, self.alternatives), vocab)
        running_max = torch.full((n,), -torch.inf, device=hidden.device)
        running_sum = torch.zeros(n, device=hidden.device)
        target_logit = torch.empty(n, device=hidden.device)
        top_values = torch.full((n, top), -torch.inf, device=hidden.device)
        top_index = torch.zeros((n, top), dtype=torch.long, device=hidden.device)
        head_hidden = hidden.to(self._head_rows().dtype)
        for begin in range(0, vocab, VOCAB_BLOCK):
            end = min(begin + VOCAB_BLOCK, vocab)
            logits = self._block_logits(head_hidden, begin, end)
            block_max = logits.amax(dim=-1)
            here = (targets >= begin) & (targets < end)
            target_logit[here] = logits[here, targets[here] - begin]
            if top:
                # Only rows with a logit above their current top-k's smallest can change their top
                # k: past the first blocks that is a few rows, and topk over every row of every block
                # had cost about a fifth of Gemma's head (benchmarks/RESULTS.md, issue 43).
                rows = (block_max > top_values[:, -1]).nonzero()[:, 0]
                if len(rows):
                    values, index = logits[rows].topk(min(top, end - begin), dim=-1)
                    merged_values, pick = torch.cat([top_values[rows], values], 1).topk(top, dim=-1)
                    top_index[rows] = torch.cat([top_index[rows], index + begin], 1).gather(1, pick)
                    top_values[rows] = merged_values
            new_max = torch.maximum(running_max, block_max)
            # In place: the block's logits are not needed past this point.
            running_sum = running_sum * torch.exp(running_max - new_max) + logits.sub_(new_max[:, None]).exp_().sum(dim=-1)
            running_max = new_max
        if not refine:
            log_total = running_max + torch.log(running_sum)
            return target_logit - log_total, top_index[:, : self.alternatives], top_values[:, : self.alternatives] - log_total[:, None]
        rows = torch.cat([top_index, targets[:, None]], dim=1)
        rounded = torch.cat([top_values, target_logit[:, None]], dim=1).double()
        exact = torch.einsum("nd,nkd->nk", hidden.float(), self._head_weight[rows])
        if self._head_bias is not None:
            exact += self._head_bias[rows]
        exact = self._cap(exact).double()
        # The target's term is already among the top ones when it is one of them.
        counted = torch.ones_like(rounded)
        counted[:, -1] = (top_index != targets[:, None]).all(dim=1).double()
        shift = running_max.double()[:, None]
        total = running_sum.double() + (counted * (torch.exp(exact - shift) - torch.exp(rounded - shift))).sum(dim=1)
        exact_lp = (exact - shift - torch.log(total)[:, None]).float()
        # Ranked by their fp32 values: the bf16 pass only chose which tokens to recompute.
        best_lp, best = exact_lp[:, :-1].topk(min(self.alternatives, top), dim=-1)
        return exact_lp[:, -1], top_index.gather(1, best), best_lp

    def _target_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log p(target) per position, and the ids and log-probs of the `alternatives` likeliest
        tokens there, most likely first."""
        # Under a device_map the last hidden state, the inputs and the head may sit on different GPUs.
        hidden, targets = hidden.to(self._head.weight.device), targets.to(self._head.weight.device)
        out = torch.empty(len(targets), dtype=torch.float32, device=hidden.device)
        top_ids = torch.zeros((len(targets), self.alternatives), dtype=torch.long, device=hidden.device)
        top_lp = torch.zeros((len(targets), self.alternatives), dtype=torch.float32, device=hidden.device)
        for s in range(0, len(targets), self.logprob_chunk):
            at = slice(s, s + self.logprob_chunk)
            if self.head == "model":
                logits = self._cap(self._head(hidden[at]).float())
                log_total = torch.logsumexp(logits, dim=-1)
                out[at] = logits.gather(1, targets[at, None])[:, 0] - log_total
                if self.alternatives:
                    values, top_ids[at] = logits.topk(self.alternatives, dim=-1)
                    top_lp[at] = values - log_total[:, None]
            else:
                out[at], top_ids[at], top_lp[at] = self._streamed_logprobs(hidden[at], targets[at])
        # A near-certain token's log-prob can round a hair above 0.
        return out, top_ids, top_lp.clamp_(max=0.0)

    def _run_batch(self, jobs: list[_Job]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        lengths = [j.window.end - j.window.begin for j in jobs]
        width = max(lengths)
        ids = torch.zeros((len(jobs), width), dtype=torch.long)
        mask = torch.zeros((len(jobs), width), dtype=torch.long)
        for r, job in enumerate(jobs):
            ids[r, : lengths[r]] = torch.tensor(job.input_ids[job.window.begin : job.window.end])
            mask[r, : lengths[r]] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = self._body(input_ids=ids, attention_mask=mask).last_hidden_state
        rows, cols, targets, sizes = [], [], [], []
        for r, job in enumerate(jobs):
            w = job.window
            target_pos = torch.arange(w.first_target, w.end) - w.begin
            rows.append(torch.full_like(target_pos, r))
            cols.append(target_pos - 1)
            targets.append(ids[r, target_pos.to(self.device)])
            sizes.append(len(target_pos))
        rows_t, cols_t = torch.cat(rows).to(hidden.device), torch.cat(cols).to(hidden.device)
        lp, top_ids, top_lp = self._target_logprobs(hidden[rows_t, cols_t], torch.cat(targets))
        return [
            (part.double().cpu().numpy(), ids.cpu().numpy(), alt.cpu().numpy())
            for part, ids, alt in zip(torch.split(lp, sizes), torch.split(top_ids, sizes), torch.split(top_lp, sizes))
        ]

    def _token_text(self, token_id: int) -> str:
        if token_id not in self._token_texts:
            self._token_texts[token_id] = self.tokenizer.decode([token_id])
        return self._token_texts[token_id]

    def score(self, documents: Iterable[tuple[str, str]]) -> Iterator[TokenScores]:
        docs = list(documents)
        tokenized = [tokenize_with_offsets(self.tokenizer, text) for _, text in docs]
        jobs: list[_Job] = []
        for d, (ids, _) in enumerate(tokenized):
            input_ids = [self.start_id, *ids.tolist()]
            jobs.extend(_Job(d, input_ids, w) for w in plan_windows(len(ids), self.window, self.stride))
        pieces: list[list[np.ndarray]] = [[] for _ in docs]
        # Longest windows first keeps padding low; results are reassembled per document.
        order = sorted(range(len(jobs)), key=lambda i: -(jobs[i].window.end - jobs[i].window.begin))
        per_job: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        with torch.inference_mode():
            for s in range(0, len(order), self.batch_size):
                batch = [jobs[i] for i in order[s : s + self.batch_size]]
                for i, scored in zip(order[s : s + self.batch_size], self._run_batch(batch)):
                    per_job[i] = scored
        for i, job in enumerate(jobs):
            pieces[job.doc].append(per_job[i])
        k = self.alternatives
        for d, (doc_id, _) in enumerate(docs):
            ids, offsets = tokenized[d]
            lp = np.concatenate([p[0] for p in pieces[d]]) if pieces[d] else np.zeros(0)
            if len(lp) != len(ids):
                raise ScoringError(f"document '{doc_id}': scored {len(lp)} of {len(ids)} tokens")
            top_ids = np.concatenate([p[1] for p in pieces[d]]) if pieces[d] else np.zeros((0, k), np.int64)
            top_lp = np.concatenate([p[2] for p in pieces[d]]).astype(np.float64) if pieces[d] else np.zeros((0, k))
            top_tokens = [[self._token_text(int(t)) for t in row] for row in top_ids] if k else None
            yield TokenScores(doc_id, offsets, lp, ids, top_tokens, top_lp if k else None)
