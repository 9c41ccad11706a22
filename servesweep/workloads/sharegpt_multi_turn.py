"""ShareGPT's own multi-turn conversations replayed as sessions (``matrix.sharegpt_multi_turn``).

Each session is one real conversation: its human turns are sent one by one to the chat endpoint, each with the
conversation so far — the earlier human turns and the model's own replies to them (not ShareGPT's) — after the
user's think time. Each turn asks for its reference reply's length (counted by the server's tokenizer), capped at
``matrix.output_tokens``, with ``ignore_eos``. A conversation is cut before the turn whose context (its human turns
so far plus the replies before it) would pass ``matrix.real_text.max_prompt_tokens``, and after ``max_turns``.
Closed-loop, each of C users holds one conversation after another; open-loop, sessions arrive at
``session_rates`` per second. The conversations come from :func:`sharegpt_dialogues` in a seeded order.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

from servesweep.loadgen.prompts import Prompt
from servesweep.workloads.base import MatrixView, PromptSets, Tokenize, Workload
from servesweep.workloads.multi_turn import TEMPLATE_TOKENS_PER_TURN, per_turn_columns
from servesweep.workloads.sharegpt import SHAREGPT_PACKAGE, sharegpt_dialogues

SETTING = "matrix.sharegpt_multi_turn"


@dataclass(frozen=True)
class Dialogue:
    id: str
    humans: tuple[str, ...]
    outputs: tuple[int, ...]    # max_tokens of each turn's reply
    contexts: tuple[int, ...]   # the tokens each turn is planned to send (human turns and replies so far)


@dataclass(frozen=True)
class DialogueSessions:
    """The sessions of one cell: user ``user``'s ``number``-th conversation is dialogue
    ``(offset + user + number × 1009) mod n`` — the same in every config."""

    dialogues: tuple[Dialogue, ...]
    think_s: float
    tag: int = 0
    offset: int = 0

    def conversation(self, user: int, number: int) -> "DialogueConversation":
        at = (self.offset + user + number * 1009) % len(self.dialogues)
        return DialogueConversation(self, self.dialogues[at], f"{self.tag}-{user}-{number}")


class DialogueConversation:
    """One replayed conversation: the messages so far and the turn to send next."""

    def __init__(self, sessions: DialogueSessions, dialogue: Dialogue, sid: str):
        self.dialogue, self.id, self.think_s = dialogue, sid, sessions.think_s
        self.turn = 1
        # a first line unique to the cell and session, so no other cell's conversation shares its prefix
        self.messages = [{"role": "user", "content": f"Conversation {sid}.\n{dialogue.humans[0]}"}]

    def _prompt(self, shared: int) -> Prompt:
        d = self.dialogue
        return Prompt(list(self.messages), d.outputs[self.turn - 1], f"sharegpt_multi_turn:{d.id}:{self.turn}",
                      shared_prefix_tokens=shared, prefix_group=self.id,
                      fields=(("session", self.id), ("turn", self.turn), ("conversation", d.id)))

    def first(self) -> Prompt:
        return self._prompt(0)

    def next(self, record: dict) -> Prompt | None:
        if self.turn >= len(self.dialogue.humans):
            return None
        self.turn += 1
        self.messages += [{"role": "assistant", "content": record.get("text") or ""},
                          {"role": "user", "content": self.dialogue.humans[self.turn - 1]}]
        # what the last turn sent and got back is this turn's prefix (up to the chat template's tokens)
        return self._prompt((record.get("prompt_tokens") or 0) + (record.get("completion_tokens") or 0))


class ShareGPTMultiTurn(Workload):
    name = "sharegpt_multi_turn"
    summary = ("ShareGPT's own multi-turn conversations replayed turn by turn over chat: the human turns sent, the "
               "model's own replies resent, think time between turns")
    endpoints = ("chat",)
    reuses_prefixes = True
    sessions = True
    length_key = "matrix.real_text.max_prompt_tokens"

    def longest_prompt(self, matrix: MatrixView) -> int:
        return matrix.real_text["max_prompt_tokens"]

    def request_rates(self, matrix: MatrixView) -> list[float]:
        return list(matrix.sharegpt_multi_turn["session_rates"])

    async def prompt_sets(self, matrix: MatrixView, tokenize: Tokenize) -> PromptSets:
        m, cap, most = matrix.sharegpt_multi_turn, matrix.output_tokens, matrix.real_text["max_prompt_tokens"]
        dialogues, facts = sharegpt_dialogues()
        order = list(dialogues)
        random.Random(matrix.real_text["seed"]).shuffle(order)
        kept: list[Dialogue] = []
        tried = cut = calls = 0
        for d in order:
            if len(kept) == m["conversations"]:
                break
            tried += 1
            humans, outputs, contexts, context = [], [], [], 0
            for human, reply in d["turns"][:m["max_turns"]]:
                h = len(await tokenize(human)) + TEMPLATE_TOKENS_PER_TURN
                out = max(1, min(cap, len(await tokenize(reply))))
                calls += 2
                if context + h > most:
                    cut += 1
                    break
                humans.append(human)
                outputs.append(out)
                contexts.append(context + h)
                context += h + out + TEMPLATE_TOKENS_PER_TURN
            if len(humans) >= 2:
                kept.append(Dialogue(d["id"], tuple(humans), tuple(outputs), tuple(contexts)))
        if len(kept) < m["conversations"]:
            raise ValueError(f"{SETTING}.conversations: asked for {m['conversations']} conversations but only "
                             f"{len(kept)} of {len(order)} keep two turns within real_text.max_prompt_tokens {most} "
                             f"— fix: ask for at most {len(kept)}, or raise matrix.real_text.max_prompt_tokens")
        turns = [len(d.humans) for d in kept]
        source = {"package": SHAREGPT_PACKAGE, **{k: v for k, v in facts.items() if k != "loaded_from"}}
        return PromptSets({0: DialogueSessions(tuple(kept), float(m["think_s"]))}, {
            "workload": self.name, **m, "source": source, "seed": matrix.real_text["seed"],
            "tried": tried, "conversations_cut_at_max_prompt_tokens": cut, "tokenize_calls": calls,
            "turns": {"total": sum(turns), "mean": sum(turns) / len(turns), "max": max(turns)},
            "longest_context_planned": max(c for d in kept for c in d.contexts),
            "output_tokens": f"each turn's reference reply length, capped at {cap}",
            "replies": "the model's own, sent back in the next turn"})

    def for_cell(self, source, tag: int, position: int):
        return replace(source, tag=tag, offset=position * 101)

    def cell_columns(self, measured: list[dict]) -> dict:
        return per_turn_columns(measured)

