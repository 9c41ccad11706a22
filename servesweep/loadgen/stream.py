"""One streamed request: its JSON, its send and chunk times, the server-sent events parsed, and what went wrong.

A request succeeds only when its stream completed; otherwise its record says which of :data:`ERROR_KINDS` it was.
"""
from __future__ import annotations

import asyncio
import json
from typing import Callable

from servesweep.clock import now
from servesweep.loadgen.http import StreamedResponse, Target
from servesweep.loadgen.prompts import Prompt
from servesweep.loadgen.spec import LoadSpec


ERROR_KINDS = {
    "connect": "no connection to the server (refused, unreachable, reset while sending)",
    "timeout": "no complete response within request_timeout_s",
    "no_response": "the connection closed before any status line",
    "malformed_http": "a status line, header or chunk size that does not parse",
    "http_status": "an HTTP status other than 200",
    "not_sse": "a 200 response that is not an event stream (an HTML page, a JSON body)",
    "truncated": "the connection ended mid-body, or the event stream ended without [DONE]",
    "malformed_sse": "an event whose data is not one JSON object",
    "server_error": "an error event inside the stream",
    "no_tokens": "a complete stream without any token, and no usage event that reports generated tokens",
    "no_text": "a complete stream whose usage event reports generated tokens, but whose chunks carried no text for "
               "them",
    "no_finish_reason": "a complete stream whose choices never gave a finish reason",
    "short_output": "fewer tokens than a fixed-length request (ignore_eos, min_tokens = max_tokens) asked for",
    "usage_mismatch": "a usage count that cannot be true: negative or not a whole number, above max_tokens, below "
                      "the token chunks streamed, or (a config that streams one chunk per token) far above them",
}

# A config whose chunks are its tokens may still stream fewer chunks than tokens: llama.cpp holds back a token that
# ends inside a multi-byte character and sends its text with the next one. Usage above this many chunks is a lie
# (the over-reporting fault server claims 10x).
CHUNK_USAGE_SLACK = (1.25, 4)


def usage_problem(reported, max_tokens: int | None, text_chunks: int, chunks_are_tokens: bool,
                  empty_chunks: int = 0) -> str | None:
    """Why a stream's ``usage.completion_tokens`` cannot be true, or None when it can: it is not a whole number
    ≥ 0; it exceeds ``max_tokens`` (no request may generate more); it is below the chunks that carried text (each
    carries at least one token); or, where the chunks are the tokens, it exceeds them — text chunks and
    ``empty_chunks`` together — beyond :data:`CHUNK_USAGE_SLACK`. SGLang streams a chunk with empty text for a token
    that ends inside a multi-byte character (a random-weight 13 B model's stream: 129 text and 127 empty chunks for
    256 tokens), so an empty chunk counts as a token here."""
    if reported is None:
        return None
    if isinstance(reported, bool) or not isinstance(reported, int) or reported < 0:
        return f"usage.completion_tokens is {reported!r}, not a whole number ≥ 0"
    if max_tokens is not None and reported > max_tokens:
        return f"usage.completion_tokens {reported} exceeds the request's max_tokens {max_tokens}"
    if reported < text_chunks:
        return f"usage.completion_tokens {reported} is below the {text_chunks} chunks that streamed text"
    factor, extra = CHUNK_USAGE_SLACK
    if chunks_are_tokens and reported > factor * (text_chunks + empty_chunks) + extra:
        empty = f" (and {empty_chunks} empty ones)" if empty_chunks else ""
        return (f"usage.completion_tokens {reported} but only {text_chunks} token chunks streamed{empty}, and this "
                "config streams one chunk per token")
    return None

def _fail(rec: dict, kind: str, message: str) -> None:
    """Record the first thing that went wrong with a request: its kind (one of :data:`ERROR_KINDS`) and message."""
    if not rec["error"]:
        rec["error"] = message[:500]
        rec["error_kind"] = kind


def fixed_length(spec: LoadSpec, max_tokens: int | None = None) -> bool:
    """Whether the requests of ``spec`` ask for exactly their ``max_tokens`` (default: the spec's ``output_tokens``)
    tokens, with no early stop at EOS."""
    extra = spec.extra_fields
    min_tokens = extra.get("min_tokens")
    wanted = spec.output_tokens if max_tokens is None else max_tokens
    return bool(extra.get("ignore_eos")) or (isinstance(min_tokens, int) and min_tokens >= wanted)


def _request_payload(spec: LoadSpec, prompt) -> tuple[dict, int | None]:
    """The request's JSON for ``prompt`` (ids, text, chat messages or a ``Prompt``), and its prompt length in ids.

    To the chat endpoint, text is sent as one user message and messages as they are; token ids cannot be (the
    server applies the chat template to text), which is a ValueError.
    """
    if isinstance(prompt, Prompt):
        payload, out_tokens = prompt.payload, prompt.output_tokens or spec.output_tokens
    else:
        payload, out_tokens = prompt, spec.output_tokens
    if spec.endpoint == "chat":
        if isinstance(payload, str):
            payload = [{"role": "user", "content": payload}]
        elif not (isinstance(payload, list) and payload and all(isinstance(m, dict) for m in payload)):
            raise ValueError("the chat endpoint takes text or messages, not token ids: send this workload to "
                             "completions")
        field = "messages"
    else:
        if isinstance(payload, list) and payload and isinstance(payload[0], dict):
            raise ValueError("chat messages go to the chat endpoint, not completions")
        field = "prompt"
    body = {
        "model": spec.model,
        field: payload,
        "max_tokens": out_tokens,
        "temperature": spec.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        **spec.extra_fields,
    }
    return body, (len(payload) if field == "prompt" and isinstance(payload, list) else None)


async def stream_one(target: Target, spec: LoadSpec, prompt, index: int) -> dict:
    """Send one streaming request to the spec's endpoint; record send time, every chunk's arrival and token count, usage, errors.

    The request succeeds (``error`` None) only when its stream completed: a 200 event stream that ends with
    ``[DONE]``, gave a finish reason and at least one token, and — for a fixed-length request — as many tokens as
    it asked for. Otherwise ``error`` says what went wrong and ``error_kind`` which of :data:`ERROR_KINDS` it was;
    what did arrive is kept. A stream without any token chunk is ``no_text`` when its usage event reports generated
    tokens, ``no_tokens`` when it does not.

    Besides the timings, the record keeps what tells such streams apart afterwards: ``finish_reason`` (None when no
    choice gave one), ``usage_completion_tokens`` (the usage event's count, None without one; ``completion_tokens``
    falls back to the token chunks) and ``empty_chunks`` (choices whose chunk carried no text). A chat stream's
    reasoning chunks are token chunks like its answer's (``reasoning_chunks`` counts them, ``reasoning_text`` keeps
    their text apart from ``text``). A :class:`Prompt`'s ``source`` and ``shared_prefix_tokens`` are kept too.
    """
    payload, prompt_ids = _request_payload(spec, prompt)
    rec: dict = {"index": index, "endpoint": spec.endpoint, "requested_prompt_tokens": prompt_ids,
                 "requested_output_tokens": payload["max_tokens"], "send": now(), "chunks": [],
                 "prompt_tokens": None, "completion_tokens": None, "usage_completion_tokens": None,
                 "finish_reason": None, "empty_chunks": 0, "error": None, "error_kind": None, "text": "",
                 "reasoning_chunks": 0, "done": False}
    if isinstance(prompt, Prompt):
        rec["source"], rec["shared_prefix_tokens"] = prompt.source, prompt.shared_prefix_tokens
        if prompt.prefix_group:
            rec["prefix_group"] = prompt.prefix_group
        rec.update(prompt.fields)
    response = StreamedResponse(target.request(json.dumps(payload).encode()), asyncio.get_running_loop(),
                                target.read_buffer)

    async def exchange() -> None:
        rec["send"] = now()  # when the request really starts: wait_for runs this in a task of its own, a step later
        await target.start(response)
        await response.done

    try:
        await asyncio.wait_for(exchange(), spec.request_timeout_s)
        if response.error:
            _fail(rec, response.error_kind or "truncated", response.error)
    except asyncio.TimeoutError:
        _fail(rec, "timeout", f"TimeoutError: no complete response within request_timeout_s = "
                              f"{spec.request_timeout_s:g} s")
    except OSError as exc:
        _fail(rec, "connect" if response.transport is None else "truncated", f"{type(exc).__name__}: {exc}")
    finally:
        if response.transport is not None:
            response.transport.close()
    rec["end"] = response.end if response.end is not None else now()
    body = b"".join(response.body)
    if response.status is not None and response.status != 200:
        rec["error"] = None  # the status says more than how the body ended
        _fail(rec, "http_status", f"HTTP {response.status}: {body.decode('utf-8', 'replace')[:500]}")
        return rec
    if response.status == 200 and response.content_type and "event-stream" not in response.content_type.lower():
        _fail(rec, "not_sse", f"HTTP 200 with Content-Type {response.content_type!r}, not an event stream: "
                              f"{body[:200].decode('utf-8', 'replace')}")
        return rec
    counted = _read_events(rec, response, spec.chunk_tokens)
    if rec["completion_tokens"] is None and rec["chunks"]:
        rec["completion_tokens"] = sum(n for _, n in rec["chunks"])
    if response.status is None:
        return rec  # nothing arrived: the error says why
    if not rec["done"]:
        if not rec["chunks"] and body.strip() and b"data:" not in body:
            _fail(rec, "not_sse", f"HTTP 200 without any event: {body[:200].decode('utf-8', 'replace')}")
        _fail(rec, "truncated", "event stream ended without [DONE]")
    if not rec["chunks"]:
        reported = rec["usage_completion_tokens"]
        if reported:
            _fail(rec, "no_text", f"the server reports {reported} generated tokens but streamed no text for them "
                                  f"({rec['empty_chunks']} chunks with empty text, finish reason "
                                  f"{rec['finish_reason']!r})")
        else:
            _fail(rec, "no_tokens", "stream ended without any token")
    if not rec.get("finish_reason"):
        _fail(rec, "no_finish_reason", "stream ended without a finish reason")
    wanted = rec["requested_output_tokens"]
    lie = usage_problem(rec["usage_completion_tokens"], wanted, len(rec["chunks"]), spec.chunks_are_tokens,
                        rec["empty_chunks"])
    if lie:
        _fail(rec, "usage_mismatch", lie)
        return rec
    if fixed_length(spec, wanted) and (counted or rec["completion_tokens"] is not None):
        got = rec["completion_tokens"] if rec["completion_tokens"] is not None else 0
        if got < wanted:
            _fail(rec, "short_output", f"fixed-length request for {wanted} tokens got {got} "
                                       f"(finish reason {rec.get('finish_reason')!r})")
    return rec


def _read_events(rec: dict, response: StreamedResponse, chunk_tokens: Callable[[dict], int | None]) -> bool:
    """Fill ``rec`` from the events of a 200 response: token chunks at their arrival times, text, usage, the count
    of choices with empty text, whether ``[DONE]`` came (``rec["done"]``); flag malformed events and error events.
    Returns whether the token count is known (a usage event, or ``chunk_tokens`` counted the chunks) rather than
    one guessed token per chunk."""
    stamps, payloads = response.events()
    rec["done"] = bool(payloads) and payloads[-1] == b"[DONE]"
    kept = [(t, p) for t, p in zip(stamps, payloads) if p != b"[DONE]"]
    if not kept:
        return False
    try:
        chunks = json.loads(b"[" + b",".join(p for _, p in kept) + b"]")  # one parse for the whole stream
    except json.JSONDecodeError:
        chunks = None
    if chunks is None or len(chunks) != len(kept) or not all(isinstance(c, dict) for c in chunks):
        bad = next((p for _, p in kept if not _is_json_object(p)), b"")
        _fail(rec, "malformed_sse", f"event stream has a data line that is not one JSON object: "
                                    f"{bad[:200].decode('utf-8', 'replace')!r}")
        return False
    text_parts, reasoning_parts = [], []
    counted = False
    for (t, _), chunk in zip(kept, chunks):
        if "error" in chunk:
            rec["error"] = str(chunk["error"])[:500]  # the server's own word beats how the stream ended
            rec["error_kind"] = "server_error"
            continue
        usage = chunk.get("usage")
        if usage:
            rec["prompt_tokens"] = usage.get("prompt_tokens")
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                # the OpenAI field, where the server reports it: prompt tokens served from its prefix cache
                rec["cached_prompt_tokens"] = details["cached_tokens"]
            rec["completion_tokens"] = rec["usage_completion_tokens"] = usage.get("completion_tokens")
            counted = counted or rec["completion_tokens"] is not None
        for choice in chunk.get("choices") or []:
            answer, reasoning = _choice_text(choice)
            if reasoning:
                rec["reasoning_chunks"] += 1
                reasoning_parts.append(reasoning)
            piece = answer + reasoning
            if not piece:
                rec["empty_chunks"] += 1
            n = chunk_tokens(chunk)
            if n is None:
                n = 1 if piece else 0
            else:
                counted = True
            if n:
                rec["chunks"].append((t, n))
                text_parts.append(answer)
            if choice.get("finish_reason"):
                rec["finish_reason"] = choice["finish_reason"]
    rec["text"] = "".join(text_parts)
    if reasoning_parts:
        rec["reasoning_text"] = "".join(reasoning_parts)
    return counted


def _choice_text(choice: dict) -> tuple[str, str]:
    """(answer text, reasoning text) of one streamed choice: a completion's ``text``, or a chat chunk's
    ``delta.content`` and its reasoning (``delta.reasoning_content``, or ``delta.reasoning`` as newer servers name
    it). A chunk of either kind is a token chunk, so TTFT is the first streamed token of any kind and a model's
    reasoning is never charged to prefill."""
    if "delta" not in choice:
        return choice.get("text") or "", ""
    delta = choice.get("delta") or {}
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    return delta.get("content") or "", reasoning if isinstance(reasoning, str) else ""


def _is_json_object(payload: bytes) -> bool:
    try:
        return isinstance(json.loads(payload), dict)
    except ValueError:
        return False
