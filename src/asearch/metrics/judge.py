"""LLM-as-judge: ask a chat model whether a prediction means the same as a gold answer.

The judge replies with JSON `{"rationale": ..., "judgement": "correct" | "incorrect"}`; replies are
parsed tolerantly (prose, code fences), unusable replies are asked for again a bounded number of times,
and a judge that still fails returns `correct=None` with `error` set: it is counted and reported, never
scored as 0 or 1. Transport failures are the client's to retry (`asearch.net`'s one policy): the judge
does not retry them again on top. The client is injected (anything with `async chat(messages)`), so
this module imports no HTTP library.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "JUDGE_PROMPT_VERSION",
    "JUDGE_SYSTEM_PROMPT",
    "VERDICT_PREFILL",
    "ChatClient",
    "JudgeVerdict",
    "LLMJudge",
    "parse_judgement",
]

# Bump whenever JUDGE_SYSTEM_PROMPT or _USER_TEMPLATE changes: every verdict records it, so a summary
# shows when its verdicts came from different prompts.
JUDGE_PROMPT_VERSION = "judge-v1"
VERDICT_PREFILL = '{"judgement": "'  # what LLMJudge(prefill=...) starts a small model's reply with

JUDGE_SYSTEM_PROMPT = """You grade answers to questions. You see a question, one or more reference \
answers (any one of them is right), and a predicted answer. Decide whether the predicted answer \
means the same thing as a reference answer.

- Judge meaning, not wording: aliases, abbreviations, spelling variants, a missing or extra article, \
and equivalent units or date formats are fine ("JFK" = "John F. Kennedy", "5 km" = "5,000 metres").
- Extra words are fine if the answer is still clearly the reference ("It was Paris, in 1889" for \
"Paris"), but an answer that hedges between several candidates, or adds a claim that contradicts \
the reference, is incorrect.
- A number must match the reference to its stated precision; a partial answer to a question that \
asks for several things is incorrect.
- Do not use your own knowledge of the true answer: only the references count.

Reply with one JSON object and nothing else:
{"rationale": "<one or two sentences>", "judgement": "correct" or "incorrect"}"""

_USER_TEMPLATE = """Question: {question}

Reference answer(s):
{golds}

Predicted answer: {prediction}"""


class ChatClient(Protocol):
    """What the judge needs from a chat endpoint (asearch.engine.remote.openai_chat.OpenAIChatClient fits)."""

    async def chat(self, messages: list[dict[str, str]], **sampling: Any) -> Any:
        """Return an object whose `.text` is the reply."""
        ...


@dataclass(frozen=True, slots=True)
class JudgeVerdict:
    """`correct` is None when the judge failed after its retries; then `error` says why."""

    correct: bool | None
    rationale: str = ""
    raw: str = ""  # the last reply text (empty when no reply came)
    error: str | None = None
    attempts: int = 0  # chat calls made (0 when no call was needed)
    model: str = ""  # the judge model (the name its endpoint serves)
    prompt_version: str = JUDGE_PROMPT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "correct": self.correct,
            "rationale": self.rationale,
            "raw": self.raw,
            "error": self.error,
            "attempts": self.attempts,
            "model": self.model,
            "prompt_version": self.prompt_version,
        }


def parse_judgement(text: str) -> tuple[bool, str]:
    """(correct, rationale) from a reply; ValueError saying what is wrong when there is no usable verdict.

    Accepts the bare JSON object, one inside a ``` fence, or one embedded in prose; when several
    objects carry a judgement the last one wins. `judgment` (US spelling) is accepted; the value is
    compared case-insensitively and must be exactly correct or incorrect.
    """
    # Objects are found wherever they start, so code fences and surrounding prose need no special case.
    verdicts = [
        c for c in _json_objects(text) if isinstance(c, dict) and ("judgement" in c or "judgment" in c)
    ]
    if not verdicts:
        raise ValueError("no JSON object with a 'judgement' key in the reply")
    obj = verdicts[-1]
    value = obj.get("judgement", obj.get("judgment"))
    label = value.strip().lower() if isinstance(value, str) else None
    if label not in ("correct", "incorrect"):
        raise ValueError(f"judgement must be 'correct' or 'incorrect', got {value!r}")
    rationale = obj.get("rationale", "")
    return label == "correct", rationale if isinstance(rationale, str) else json.dumps(rationale)


def _json_objects(text: str) -> list[Any]:
    """Every JSON object that starts at some `{` of `text` (nested ones included), in text order."""
    decoder = json.JSONDecoder()
    out = []
    for i, ch in enumerate(text):
        if ch == "{":
            try:
                obj, _ = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                continue
            out.append(obj)
    return out


class LLMJudge:
    """Grades predictions with a chat model; one instance can judge many questions concurrently.

    `max_retries` bounds the extra attempts after an unusable reply (no verdict in it); a failed call
    is final, its client having retried it already. The prediction is cut to `max_prediction_chars` so a rambling answer cannot flood the
    judge's context. Verdicts carry `model` (default: the client's `model`) and `prompt_version`.

    `prefill` starts the judge's reply for it: the chat ends with an assistant turn holding it, which the
    server continues (`continue_final_message`: vLLM and `asearch engine serve` support it, hosted APIs do
    not), and the reply is read as prefill + continuation. `VERDICT_PREFILL` leaves a model too small to
    follow the JSON instruction only the verdict word to write.
    """

    def __init__(
        self,
        client: ChatClient,
        *,
        max_retries: int = 2,
        max_prediction_chars: int = 500,
        retry_delay_s: float = 0.5,
        sampling: dict[str, Any] | None = None,
        model: str | None = None,
        prefill: str = "",
    ):
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if max_prediction_chars < 1:
            raise ValueError(f"max_prediction_chars must be >= 1, got {max_prediction_chars}")
        self.client = client
        self.max_retries = max_retries
        self.max_prediction_chars = max_prediction_chars
        self.retry_delay_s = retry_delay_s
        self.model = model if model is not None else str(getattr(client, "model", "") or "")
        self.sampling = {"temperature": 0.0, "max_tokens": 512} if sampling is None else dict(sampling)
        self.prefill = prefill
        if prefill:
            self.sampling.update(add_generation_prompt=False, continue_final_message=True)
        # the prefill is part of how the verdict is asked for, so verdicts say whether there was one
        self.prompt_version = JUDGE_PROMPT_VERSION + ("+prefill" if prefill else "")

    def messages(self, question: str, prediction: str, golds: Sequence[str]) -> list[dict[str, str]]:
        """The chat sent for one verdict (system rubric + the case)."""
        if len(prediction) > self.max_prediction_chars:
            prediction = prediction[: self.max_prediction_chars] + " …[truncated]"
        user = _USER_TEMPLATE.format(
            question=question.strip(), golds="\n".join(f"- {g}" for g in golds), prediction=prediction.strip()
        )
        chat = [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}]
        return [*chat, {"role": "assistant", "content": self.prefill}] if self.prefill else chat

    async def judge(self, question: str, prediction: str | None, golds: Sequence[str]) -> JudgeVerdict:
        """Verdict on one prediction. A missing or blank prediction is incorrect without asking the model."""
        if isinstance(golds, str):
            golds = [golds]
        if not golds:
            raise ValueError("golds is empty: the judge needs at least one reference answer")
        if prediction is None or not prediction.strip():
            return JudgeVerdict(
                correct=False,
                rationale="no answer was given",
                model=self.model,
                prompt_version=self.prompt_version,
            )
        messages = self.messages(question, prediction, golds)
        raw, error = "", ""
        for attempt in range(1, self.max_retries + 2):
            try:
                reply = await self.client.chat(messages, **self.sampling)
                raw = getattr(reply, "text", reply)
                if not isinstance(raw, str):
                    raise TypeError(f"chat reply has no text (got {type(raw).__name__})")
                raw = self.prefill + raw
            except asyncio.CancelledError:
                raise
            except Exception as e:  # transport, HTTP status, timeout: the client's retries are spent
                return JudgeVerdict(
                    correct=None,
                    raw=raw,
                    error=f"judge call failed: {type(e).__name__}: {e}",
                    attempts=attempt,
                    model=self.model,
                    prompt_version=self.prompt_version,
                )
            else:
                try:
                    correct, rationale = parse_judgement(raw)
                    return JudgeVerdict(
                        correct=correct,
                        rationale=rationale,
                        raw=raw,
                        attempts=attempt,
                        model=self.model,
                        prompt_version=self.prompt_version,
                    )
                except ValueError as e:
                    error = f"attempt {attempt}: unusable reply: {e}"
            if attempt <= self.max_retries and self.retry_delay_s > 0:
                await asyncio.sleep(self.retry_delay_s * 2 ** (attempt - 1))
        return JudgeVerdict(
            correct=None,
            raw=raw,
            error=f"judge failed after {self.max_retries + 1} attempts; last: {error}",
            attempts=self.max_retries + 1,
            model=self.model,
            prompt_version=self.prompt_version,
        )
