"""Multi-turn sessions: simulated users of an agentic coding assistant (``matrix.multi_turn``).

Each of a cell's C streams is a user. A user holds one conversation at a time: a long system prompt shared by every
user of the cell (its tag in it, so cells share none), then ``turns`` turns, each a user message carrying tool output
and a short request. Every turn sends the whole conversation so far — the system prompt, every earlier turn and the
model's own replies to them — plus the new message, to the chat endpoint, after the user's think time; a finished
conversation is followed by a new one. Open-loop, sessions arrive instead at a session rate (a Poisson process), each
running its turns the same way. So the context grows turn by turn and most of each turn's prompt is the
previous turn's, which a prefix cache can serve. The texts are cut from the synthetic word list with seeds of
(cell, user, conversation, turn): the same in every config, except the replies, which are the model's.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from servesweep.loadgen.prompts import Prompt
from servesweep.workloads.base import MatrixView, PromptSets, Tokenize, Workload
from servesweep.workloads.synthetic import corpus_text

# Chat-template tokens a turn adds around its messages, allowed for when the longest prompt is planned.
TEMPLATE_TOKENS_PER_TURN = 16


def _words(tokens: int, tokens_per_word: float) -> int:
    return max(1, round(tokens / tokens_per_word))


@dataclass(frozen=True)
class Sessions:
    """The conversations of one cell: ``conversation(user, number)`` is the same in every config."""

    system: str
    system_tokens: int
    tokens_per_word: float
    turns: int
    tool_tokens: int
    user_tokens: int
    think_s: float
    tag: int = 0

    def system_text(self) -> str:
        return f"You are the coding assistant of workspace {self.tag}.\n{self.system}"

    def turn_text(self, user: int, number: int, turn: int) -> str:
        seed = ((self.tag * 1_000_003 + user) * 10_007 + number) * 101 + turn
        tool = corpus_text(_words(self.tool_tokens, self.tokens_per_word), seed=seed) if self.tool_tokens else ""
        ask = corpus_text(_words(self.user_tokens, self.tokens_per_word), seed=seed + 50)
        return (f"Turn {turn} of session {self.tag}-{user}-{number}.\n"
                + (f"Tool output:\n{tool}\n" if tool else "") + f"Request: {ask}")

    def conversation(self, user: int, number: int) -> "Conversation":
        return Conversation(self, user, number)


class Conversation:
    """One user's conversation: the messages so far, and the turn to send next."""

    def __init__(self, sessions: Sessions, user: int, number: int):
        self.sessions, self.user, self.number = sessions, user, number
        self.think_s = sessions.think_s
        self.turn = 1
        self.messages = [{"role": "system", "content": sessions.system_text()},
                         {"role": "user", "content": sessions.turn_text(user, number, 1)}]
        self.id = f"{sessions.tag}-{user}-{number}"

    def _prompt(self, shared: int, group: str) -> Prompt:
        return Prompt(list(self.messages), None, f"multi_turn:{self.id}:{self.turn}", shared_prefix_tokens=shared,
                      prefix_group=group, fields=(("session", self.id), ("turn", self.turn)))

    def first(self) -> Prompt:
        # the system prompt is the cell's: every conversation but the cell's first could take it from the cache
        first_of_cell = self.user == 0 and self.number == 0
        return self._prompt(0 if first_of_cell else self.sessions.system_tokens, f"{self.sessions.tag}:system")

    def next(self, record: dict) -> Prompt | None:
        if self.turn >= self.sessions.turns:
            return None
        self.turn += 1
        self.messages += [{"role": "assistant", "content": record.get("text") or ""},
                          {"role": "user", "content": self.sessions.turn_text(self.user, self.number, self.turn)}]
        # everything the last turn sent and got back is this turn's prefix (up to the chat template's tokens)
        shared = (record.get("prompt_tokens") or 0) + (record.get("completion_tokens") or 0)
        return self._prompt(shared, self.id)


class MultiTurn(Workload):
    name = "multi_turn"
    summary = ("simulated users of a coding assistant: a shared system prompt, then turns that resend the growing "
               "conversation plus tool output and a short request, with think time")
    endpoints = ("chat",)
    reuses_prefixes = True
    sessions = True
    length_key = "matrix.multi_turn"

    def request_rates(self, matrix: MatrixView) -> list[float]:
        """Its open-loop cells: sessions arriving at each of ``matrix.multi_turn.session_rates`` per second."""
        return list(matrix.multi_turn["session_rates"])

    def longest_prompt(self, matrix: MatrixView) -> int:
        m = matrix.multi_turn
        per_turn = m["tool_tokens"] + m["user_tokens"] + TEMPLATE_TOKENS_PER_TURN
        return m["system_tokens"] + m["turns"] * per_turn + (m["turns"] - 1) * matrix.output_tokens

    async def prompt_sets(self, matrix: MatrixView, tokenize: Tokenize) -> PromptSets:
        m = matrix.multi_turn
        sample = corpus_text(2000, seed=29)
        tokens_per_word = len(await tokenize(sample)) / len(sample.split())
        system = corpus_text(_words(m["system_tokens"], tokens_per_word), seed=31)
        sessions = Sessions(system, 0, tokens_per_word, m["turns"], m["tool_tokens"], m["user_tokens"],
                            float(m["think_s"]))
        counted = len(await tokenize(sessions.system_text()))
        sessions = replace(sessions, system_tokens=counted)
        return PromptSets({0: sessions}, {"workload": self.name, **m, "system_prompt_tokens": counted,
                                           "tokens_per_word": tokens_per_word,
                                           "replies": "the model's own, sent back in the next turn"})

    def cell_columns(self, measured: list[dict]) -> dict:
        return per_turn_columns(measured)


def per_turn_columns(measured: list[dict]) -> dict:
    """Per turn k of a session workload's measured requests: ``ttft_p50_s_turn<k>`` (the turn's median TTFT) and
    ``prompt_tokens_turn<k>`` (its mean context, as the server counted it)."""
    out: dict = {}
    done = [r for r in measured if not r.get("error") and r.get("chunks") and r.get("turn")]
    for turn in sorted({r["turn"] for r in done}):
        these = [r for r in done if r["turn"] == turn]
        out[f"ttft_p50_s_turn{turn}"] = statistics.median(r["chunks"][0][0] - r["send"] for r in these)
        lengths = [r["prompt_tokens"] for r in these if r.get("prompt_tokens")]
        out[f"prompt_tokens_turn{turn}"] = statistics.fmean(lengths) if lengths else math.nan
    return out
