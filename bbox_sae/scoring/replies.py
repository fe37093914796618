"""Checks that a completions server's answer scored the very tokens we sent.

- echo: one entry per prompt token plus exactly `max_tokens` generated ones, the first entry
  without a log-prob, and `text_offset` tiling the echoed token strings; each echoed token is
  the one sent (`check_tokens`: a count alone would take an answer to another prompt of the
  same length), or in text mode the echoed strings spell the window's text with our token
  boundaries (`check_text`);
- prompt_logprobs: one entry per prompt token, each naming the very token id we planned.
Anything else raises Misaligned, which the scorer turns into an EndpointError naming the document.
"""

from __future__ import annotations

import numpy as np


class Misaligned(Exception):
    """The answer does not provably score the tokens we sent."""


def echo_entries(choice, n_sent: int, max_tokens: int) -> tuple[list[str], list[float | None]]:
    """Token strings and log-probs of the prompt positions of an `echo` answer."""
    lp = choice.logprobs
    if lp is None:
        raise Misaligned("no `logprobs` in the answer (does the server support echo with logprobs?)")
    tokens, logprobs, offsets = lp.tokens, lp.token_logprobs, lp.text_offset
    if not len(tokens) == len(logprobs) == len(offsets):
        raise Misaligned(f"{len(tokens)} tokens, {len(logprobs)} token_logprobs and {len(offsets)} text_offsets")
    if len(tokens) != n_sent + max_tokens:
        raise Misaligned(
            f"{len(tokens)} echoed entries for a prompt of {n_sent} tokens with max_tokens={max_tokens} "
            f"(expected {n_sent + max_tokens}): the server tokenized differently or does not echo every prompt token"
        )
    if logprobs[0] is not None:
        raise Misaligned("the first echoed token has a log-prob, so it is not the first token sent")
    for j in range(n_sent - 1):
        if offsets[j + 1] != offsets[j] + len(tokens[j]):
            raise Misaligned(f"text_offset does not tile the echoed tokens at entry {j} ({offsets[j]} + {len(tokens[j])} != {offsets[j + 1]})")
    return tokens[:n_sent], logprobs[:n_sent]


def prompt_logprob_entries(choice, sent: list[int]) -> list[float | None]:
    """vLLM's prompt_logprobs (a field the client keeps as parsed JSON): one entry per prompt
    token, a dict keyed by token id."""
    entries = getattr(choice, "prompt_logprobs", None)
    if not isinstance(entries, list):
        raise Misaligned("no `prompt_logprobs` in the answer (is the server vLLM?)")
    if len(entries) != len(sent):
        raise Misaligned(f"{len(entries)} prompt_logprobs entries for a prompt of {len(sent)} tokens")
    if entries[0] is not None:
        raise Misaligned("the first prompt token has a log-prob, so it is not the first token sent")
    out: list[float | None] = [None]
    for j in range(1, len(sent)):
        entry = (entries[j] or {}).get(str(sent[j]))
        if entry is None:
            raise Misaligned(f"prompt token {j} is not token id {sent[j]} (got ids {sorted(entries[j] or {})[:5]})")
        out.append(entry["logprob"] if isinstance(entry, dict) else entry)
    return out


# vLLM's `return_tokens_as_token_ids` names each echoed token by its id.
TOKEN_ID_PREFIX = "token_id:"


def check_tokens(echoed: list[str], sent: list[int], decoded: list[str]) -> None:
    """Token prompts: echoed entry j is token `sent[j]`. By id where the server names ids;
    otherwise by its text against `decoded[j]` (our tokenizer's `sent[j]` alone), ignoring
    whitespace (servers render a token alone, ' world' as 'world', or as the text it adds), and
    taking on trust a piece of a character (empty, or U+FFFD on either side)."""
    for j, (got, sent_id, want) in enumerate(zip(echoed, sent, decoded)):
        if got.startswith(TOKEN_ID_PREFIX):
            if got != f"{TOKEN_ID_PREFIX}{sent_id}":
                raise Misaligned(f"echoed token {j} is {got!r}, but token id {sent_id} was sent")
        elif "".join(got.split()) != "".join(want.split()) and got and "\ufffd" not in got + want:
            raise Misaligned(f"echoed token {j} is {got!r}, but token id {sent_id} ({want!r}) was sent: is this the answer to another prompt?")


def check_text(tokens: list[str], text: str, c0: int, ends: np.ndarray) -> None:
    """Text prompts are tokenized by the server: its echoed tokens must spell the window's text
    with our token boundaries. Tokens sharing an end (the byte pieces of one character) are
    compared as a group; a group the server could not render (empty, or with U+FFFD, as byte
    pieces decoded one by one come out) is taken on trust, since the token count matched."""
    at = c0
    j = 0
    while j < len(tokens):
        k = j + 1
        while k < len(tokens) and ends[k] == ends[j]:
            k += 1
        got, want = "".join(tokens[j:k]), text[at : ends[j]]
        if got != want and got and "\ufffd" not in got:
            raise Misaligned(f"token {j} is {got!r} on the server but {want!r} locally (characters {at}-{int(ends[j])})")
        at, j = int(ends[j]), k
