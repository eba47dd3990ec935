"""The LLM backend: every operator and gate is a prompt to an OpenAI-compatible endpoint.

Seeds are pages of a corpus (wiki10k, a world, any jsonl corpus); INJECT reads a page linked from the
pages used so far. Replies are JSON objects (have the server constrain them with `json_mode:
json_schema` when the model is small); a reply that cannot be used fails the quality gate with the
reason, so the filter report shows how often the generator misbehaved. Uniqueness asks the judge whether any of
the solver's wrong answers also satisfies every statement: a check, not a proof, and the output
says so (`uniqueness.method = "llm-candidates"`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from typing import Any

from asearch.corpus.types import Page
from asearch.metrics.judge import LLMJudge
from asearch.metrics.normalize import normalize_answer
from asearch.synth.backend import Draft, EditAction, GateResult, Seed, register_synth_backend
from asearch.synth.config import EndpointConfig, GateConfig, LLMBackendConfig, SynthConfig
from asearch.synth.graph_backend import text_problems
from asearch.synth.records import Statement, Uniqueness
from asearch.synth.solver import chat_client

# ----------------------------------------------------------------------------- prompts
# Role markers open each system prompt so logs (and scripted test servers) can tell the calls apart.

BASE_PROMPT = """[base] You write quiz questions from one web page.
Pick one fact the page states and ask a simple question whose answer is a short name, date or number \
from the page (at most a few words). Copy, word for word, the sentence of the page that states the fact. \
List other ways to write the same answer (a full name, a common short form), or none.
Reply with one JSON object and nothing else:
{"question": "...", "answer": "...", "statement": "...", "aliases": ["...", ...]}"""

INJECT_PROMPT = """[inject] You make a quiz question harder by adding one fact from a linked page.
You get the question, its answer, and a page about something related. Pick an entity mentioned in the \
question that the page is about or mentions, and rewrite the question so that it also uses one fact \
the page states about it (for example, replace the entity's name with that fact). The question must \
stay one single question and its answer must stay exactly the same. Copy, word for word, the sentence \
of the page that states the fact you used.
Reply with one JSON object and nothing else:
{"question": "...", "statement": "..."}"""

FUZZ_PROMPT = """[fuzz] You make a quiz question harder to answer from memory by blurring one detail.
Blur exactly one detail: a year becomes a period ("in the 1980s"), a name becomes a description \
("a city in the north"), or a number becomes a range ("between 1 and 2 million"). Keep everything \
else, keep it one single question, and keep the answer exactly the same.
Reply with one JSON object and nothing else:
{"question": "...", "blurred": "what you changed"}"""

QUALITY_PROMPT = """[quality] You check quiz questions. You get a question, its answer and the \
statements (with sources) the question is built from. Check four things:
- fluent: the question is one clear, grammatical English question;
- single: it is not several questions joined together;
- solvable: a reader who knows only the statements can work out the answer;
- answer_fits: the given answer is the correct and complete answer to the question.
Reply with one JSON object and nothing else:
{"fluent": true or false, "single": true or false, "solvable": true or false, \
"answer_fits": true or false, "reason": "one sentence"}"""

UNIQUE_PROMPT = """[unique] You check whether a quiz question has more than one correct answer. \
You get the question, its intended answer, the statements it is built from, and another candidate \
answer. Decide whether the candidate also satisfies every condition in the question (it would be a \
second correct answer), as far as the statements and general knowledge tell.
Reply with one JSON object and nothing else:
{"satisfies": true or false, "reason": "one sentence"}"""

QUALITY_SCHEMA = {k: {"type": "boolean"} for k in ("fluent", "single", "solvable", "answer_fits")} | {
    "reason": {"type": "string"}
}
UNIQUE_SCHEMA = {"satisfies": {"type": "boolean"}, "reason": {"type": "string"}}
JUDGE_SCHEMA = {
    "rationale": {"type": "string"},
    "judgement": {"type": "string", "enum": ["correct", "incorrect"]},
}


def _keys(*names: str) -> dict[str, Any]:
    return {n: {"type": "string"} for n in names}


BASE_SCHEMA = _keys("question", "answer", "statement") | {
    "aliases": {"type": "array", "items": {"type": "string"}}
}


_LINK = re.compile(r"^- (?P<title>.+): (?P<url>\S+)$")


def split_links(contents: str) -> tuple[str, list[tuple[str, str]]]:
    """(text, [(title, url)]) from a page whose contents end in a `Links:` section (world, wiki10k)."""
    text, sep, tail = contents.partition("\n\nLinks:\n")
    links = [(m["title"], m["url"]) for line in tail.splitlines() if (m := _LINK.match(line.strip()))]
    return (text if sep else contents), links


def json_reply(text: str, required: tuple[str, ...]) -> dict[str, Any] | None:
    """The last JSON object in a reply that has every `required` key (prose and code fences are fine)."""
    decoder = json.JSONDecoder()
    found = None
    for i, ch in enumerate(text):
        if ch != "{":
            continue
        try:
            obj, _ = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and all(k in obj for k in required):
            found = obj
    return found


def as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "no"):
        return False
    return None


def grounded(statement: str, page_text: str, need: float) -> bool:
    """True when `need` of the statement's word bigrams (words, for one-word statements) occur on the page."""
    words = normalize_answer(statement).split()
    page = normalize_answer(page_text).split()
    if not words:
        return False
    if len(words) == 1:
        return words[0] in set(page)
    grams = list(zip(words, words[1:], strict=False))
    page_grams = set(zip(page, page[1:], strict=False))
    return sum(g in page_grams for g in grams) / len(grams) >= need


class LLMBackend:
    """Seeds = the corpus's pages in a seeded order; operators and gates = generator and judge prompts."""

    name = "llm"
    candidates_for_uniqueness = True

    def __init__(
        self,
        cfg: LLMBackendConfig,
        gates: GateConfig,
        run_seed: int = 0,
        *,
        generator: Any = None,
        judge: Any = None,
        source: Any = None,
    ):
        from asearch.corpus import open_corpus

        self.cfg, self.gates, self.run_seed = cfg, gates, run_seed
        self.source = source if source is not None else open_corpus(cfg.corpus)
        self.corpus = self.source.name
        if generator is None:
            assert cfg.generator is not None, "LLMBackend needs a generator endpoint"
            generator = chat_client(cfg.generator)
        self.generator = generator
        self.judge_client = (
            judge if judge is not None else (chat_client(cfg.judge) if cfg.judge else generator)
        )
        self.gen_cfg, self.judge_cfg = cfg.generator, cfg.judge or cfg.generator
        judge_sampling = self._sampling(self.judge_cfg, JUDGE_SCHEMA, judge=True)
        self.judge = LLMJudge(self.judge_client, sampling=judge_sampling)
        self._pages: dict[str, Page] | None = None
        self._read: dict[str, Page] = {}  # pages read outside the corpus (the agent backend's web pages)

    def models(self) -> dict[str, str]:
        return {"generator": str(self.generator.model), "judge": str(self.judge_client.model)}

    async def aclose(self) -> None:
        await self.generator.aclose()
        if self.judge_client is not self.generator:
            await self.judge_client.aclose()

    def _sampling(
        self, endpoint: EndpointConfig | None, keys: dict[str, Any], *, judge: bool = False
    ) -> dict:
        """Sampling fields of one call: judges are greedy; JSON mode as the endpoint is configured."""
        if endpoint is None:  # clients injected without config (tests): defaults
            return {"temperature": 0.0 if judge else 0.7, "max_tokens": 256}
        out: dict[str, Any] = {
            "temperature": 0.0 if judge else endpoint.temperature,
            "max_tokens": endpoint.max_tokens,
        }
        if endpoint.json_mode == "json_object":
            out["response_format"] = {"type": "json_object"}
        elif endpoint.json_mode == "json_schema":
            schema = {
                "type": "object",
                "properties": keys,
                "required": list(keys),
                "additionalProperties": False,
            }
            out["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": schema},
            }
        return out

    def _gen(self, keys: dict[str, Any]) -> dict[str, Any]:
        return self._sampling(self.gen_cfg, keys)

    def _judging(self, keys: dict[str, Any]) -> dict[str, Any]:
        return self._sampling(self.judge_cfg, keys, judge=True)

    # ---------------------------------------------------------------- pages
    def _all_pages(self) -> dict[str, Page]:
        if self._pages is None:
            self._pages = {p.url: p for p in self.source.pages()}
        return self._pages

    def page(self, url: str) -> Page | None:
        return self._read.get(url) or self._all_pages().get(url)

    def find_page(self, raw_url: str) -> Page | None:
        """The page a url as an agent wrote it names (wrappers, #fragment and trailing slash tolerated)."""
        from asearch.retrieval.protocol import url_variants

        return next((p for key in url_variants(raw_url) if (p := self.page(key)) is not None), None)

    def remember(self, page: Page) -> None:
        """Let the gates check statements against a page read outside the corpus (e.g. from the web)."""
        if self.page(page.url) is None:
            self._read[page.url] = page

    def seeds(self) -> list[Seed]:
        pages = list(self._all_pages().values())
        random.Random(f"asearch-synth/{self.corpus}/{self.run_seed}").shuffle(pages)
        return [Seed(i, p.url, p.url, p.title) for i, p in enumerate(pages)]

    def _shown(self, page: Page) -> str:
        text, _ = split_links(page.contents)
        return f"Page title: {page.title}\nURL: {page.url}\n\n{text[: self.cfg.page_chars]}"

    async def _ask(self, system: str, user: str, sampling: dict[str, Any], client: Any = None) -> str:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        reply = await (client or self.generator).chat(messages, **sampling)
        return reply.text

    # ---------------------------------------------------------------- operators
    async def base(self, seed: Seed, rng: random.Random) -> Draft | None:
        page = self.page(seed.url)
        if page is None:
            return None
        reply = await self._ask(BASE_PROMPT, self._shown(page), self._gen(BASE_SCHEMA))
        obj = json_reply(reply, ("question", "answer", "statement"))
        if obj is None:
            return _broken(
                f"generator reply has no JSON with question, answer and statement: {reply[:200]!r}"
            )
        question, answer, statement = (str(obj[k]).strip() for k in ("question", "answer", "statement"))
        problem = ""
        if not answer:
            problem = "empty answer"
        elif len(answer.split()) > self.cfg.max_answer_words:
            problem = f"answer of {len(answer.split())} words > max_answer_words={self.cfg.max_answer_words}"
        elif normalize_answer(answer) not in normalize_answer(statement):
            problem = "the statement does not contain the answer"
        return Draft(
            question=question,
            answers=[answer or "?"],
            statements=[Statement(statement, page.url)],
            state={"urls": [page.url], "problem": problem},
            paraphrases=self._aliases(obj.get("aliases"), answer),
            note=f"base from {page.url}",
        )

    def _aliases(self, value: Any, answer: str) -> list[str]:
        """The generator's other spellings of the answer: short strings, distinct, not the answer itself."""
        if not isinstance(value, list):
            return []
        seen = {normalize_answer(answer)}
        out: list[str] = []
        for a in value:
            text = str(a).strip()
            key = normalize_answer(text)
            if key and key not in seen and len(text.split()) <= self.cfg.max_answer_words:
                seen.add(key)
                out.append(text)
        return out[: self.cfg.max_aliases]

    async def edit(self, draft: Draft, action: EditAction, rng: random.Random) -> Draft | None:
        return await (self._inject(draft, rng) if action == "inject" else self._fuzz(draft))

    def _links(self, urls: list[str]) -> Iterator[str]:
        for url in urls:
            page = self.page(url)
            if page is not None:
                for _, link in split_links(page.contents)[1]:
                    if link not in urls and self.page(link) is not None:
                        yield link

    async def _inject(self, draft: Draft, rng: random.Random) -> Draft | None:
        urls = list(draft.state["urls"])
        links = list(dict.fromkeys(self._links(urls)))
        if not links:
            return None
        page = self.page(rng.choice(links))
        assert page is not None
        user = f"Question: {draft.question}\nAnswer: {draft.answer}\n\nLinked page:\n{self._shown(page)}"
        reply = await self._ask(INJECT_PROMPT, user, self._gen(_keys("question", "statement")))
        obj = json_reply(reply, ("question", "statement"))
        if obj is None:
            return _broken(f"generator reply has no JSON with question and statement: {reply[:200]!r}", draft)
        problem = answer_changed(obj, draft.answer)
        return Draft(
            question=str(obj["question"]).strip(),
            answers=list(draft.answers),
            statements=[*draft.statements, Statement(str(obj["statement"]).strip(), page.url)],
            state={"urls": [*urls, page.url], "problem": problem},
            paraphrases=list(draft.paraphrases),
            note=f"inject from {page.url}",
        )

    async def _fuzz(self, draft: Draft) -> Draft | None:
        user = f"Question: {draft.question}\nAnswer: {draft.answer}"
        reply = await self._ask(FUZZ_PROMPT, user, self._gen(_keys("question", "blurred")))
        obj = json_reply(reply, ("question",))
        if obj is None:
            return _broken(f"generator reply has no JSON with a question: {reply[:200]!r}", draft)
        return Draft(
            question=str(obj["question"]).strip(),
            answers=list(draft.answers),
            statements=list(draft.statements),
            state={"urls": list(draft.state["urls"]), "problem": answer_changed(obj, draft.answer)},
            paraphrases=list(draft.paraphrases),
            note=f"fuzz: {str(obj.get('blurred', '')).strip()[:200]}",
        )

    # ---------------------------------------------------------------- gates
    async def quality(self, before: Draft | None, after: Draft) -> GateResult:
        if after.state.get("problem"):
            return GateResult(False, after.state["problem"])
        problem = text_problems(after.question, self.gates.max_words)
        if problem:
            return GateResult(False, problem)
        if before is not None and normalize_answer(after.question) == normalize_answer(before.question):
            return GateResult(False, "the edit changed nothing")
        if f" {normalize_answer(after.answer)} " in f" {normalize_answer(after.question)} ":
            return GateResult(False, "the answer appears in the question")
        for s in after.statements:
            page = self.page(s.url)
            if page is None or not grounded(s.text, split_links(page.contents)[0], self.cfg.grounding):
                return GateResult(False, f"statement not found on {s.url}: {s.text[:120]!r}")
        statements = "\n".join(f"- {s.text} (source: {s.url})" for s in after.statements)
        user = f"Question: {after.question}\nAnswer: {after.answer}\nStatements:\n{statements}"
        reply = await self._ask(QUALITY_PROMPT, user, self._judging(QUALITY_SCHEMA), self.judge_client)
        obj = json_reply(reply, ("fluent", "single", "solvable", "answer_fits"))
        if obj is None:
            return GateResult(False, f"judge reply unusable: {reply[:120]!r}")
        failed = [k for k in ("fluent", "single", "solvable", "answer_fits") if as_bool(obj[k]) is not True]
        if failed:
            return GateResult(False, f"judge: not {', '.join(failed)} ({str(obj.get('reason', ''))[:160]})")
        return GateResult(True)

    async def uniqueness(self, draft: Draft, wrong_answers: list[str]) -> Uniqueness:
        """Ask the judge, for each distinct wrong direct answer, whether it also fits every statement."""
        golds = {normalize_answer(a) for a in (*draft.answers, *draft.paraphrases)}
        candidates = [a for a in wrong_answers if normalize_answer(a) not in golds][: self.cfg.max_candidates]
        if not candidates:
            return Uniqueness("llm-candidates", False, True, "no wrong candidate answers to check")
        statements = "\n".join(f"- {s.text} (source: {s.url})" for s in draft.statements)
        unusable, fits = 0, []
        for c in candidates:
            user = (
                f"Question: {draft.question}\nIntended answer: {draft.answer}\nStatements:\n{statements}\n"
                f"Candidate answer: {c}"
            )
            reply = await self._ask(UNIQUE_PROMPT, user, self._judging(UNIQUE_SCHEMA), self.judge_client)
            obj = json_reply(reply, ("satisfies",))
            verdict = None if obj is None else as_bool(obj["satisfies"])
            if verdict is None:
                unusable += 1
            elif verdict:
                fits.append(c)
        if fits:
            return Uniqueness("llm-candidates", True, False, f"also satisfied by: {', '.join(fits)}")
        checked = unusable == 0
        detail = f"{len(candidates)} candidate(s) ruled out" + (
            f"; {unusable} judge replies unusable" if unusable else ""
        )
        return Uniqueness("llm-candidates", checked, True, detail)


def _broken(problem: str, before: Draft | None = None) -> Draft:
    """A draft that fails the quality gate with `problem` (so the report counts what went wrong)."""
    return Draft(
        question="",
        answers=list(before.answers) if before else ["?"],
        statements=list(before.statements) if before else [],
        state={"urls": list(before.state["urls"]) if before else [], "problem": problem},
        note=problem[:120],
    )


def answer_changed(obj: dict[str, Any], answer: str) -> str:
    """Why an edit reply that also gives an `answer` is refused: the answer must never change ("" if same)."""
    if "answer" in obj and normalize_answer(str(obj["answer"])) != normalize_answer(answer):
        return f"answer changed: {answer!r} -> {str(obj['answer'])!r}"
    return ""


@register_synth_backend("llm", uses_generator=True, judges=True)
def build_llm_backend(cfg: SynthConfig) -> LLMBackend:
    """One prompt per operator and gate to llm.generator (and llm.judge)."""
    return LLMBackend(cfg.llm, cfg.gates, cfg.seed)
