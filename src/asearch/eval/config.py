"""Config of an eval run (datasets, passes, sharding, output, judge), and building the judge from it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from asearch.config import Config
from asearch.errors import AsearchError

__all__ = ["EvalConfig", "JudgeConfig", "build_judge", "default_out_dir"]


class JudgeConfig(Config):
    """An OpenAI-compatible chat endpoint used as LLM judge; no url = no judge."""

    url: str | None = Field(
        None, description="Base url, e.g. http://127.0.0.1:8000/v1 (vLLM) or https://api.openai.com/v1."
    )
    model: str = Field("", description="Model name sent to the endpoint.")
    api_key_env: str = Field(
        "OPENAI_API_KEY", description="Environment variable holding the API key (may be unset)."
    )
    max_concurrency: int = Field(8, ge=1, description="Judge requests in flight at once.")
    timeout_s: float = Field(60.0, gt=0, description="Per request.")
    transport_retries: int = Field(2, ge=0, description="HTTP-level retries inside the client.")
    max_retries: int = Field(2, ge=0, description="Judge-level retries on bad JSON or transport errors.")
    max_prediction_chars: int = Field(500, ge=1, description="The prediction is cut to this before judging.")

    @model_validator(mode="after")
    def _url_needs_model(self) -> JudgeConfig:
        if self.url and not self.model:
            raise ValueError(f"judge.url={self.url!r} needs judge.model (the model name the endpoint serves)")
        return self


class EvalConfig(Config):
    """What to evaluate and where results go (the agent itself is the runtime config: engine, tools, agent)."""

    datasets: list[str] = Field(
        default_factory=lambda: ["world"],
        description="Built-in sets (world[:...], wiki10k[:...]), files, directories, or names under data_dir.",
    )
    split: str = Field("test", description="File name under data_dir/<name>/ (test.jsonl).")
    data_dir: Path = Field(Path("data"), description="Where `asearch data fetch` put the datasets.")
    limit: int | None = Field(None, ge=1, description="First N questions of each dataset.")
    k: int = Field(
        1,
        ge=1,
        description="Passes per question (Avg@k, Pass@k); defaults to len(seeds) when seeds are given.",
    )
    seeds: list[int] | None = Field(
        None, description="One seed per pass (default 0..k-1); sets k when given."
    )
    concurrency: int = Field(16, ge=1, description="Questions in flight at once.")
    shard: str = Field(
        "0/1", description="i/n: run the i-th of n hash-chosen parts (results under out/shard-i-of-n)."
    )
    out: Path | None = Field(None, description="Output dir (default runs/eval/<datasets>); rerun to resume.")
    max_failures: int | None = Field(
        20, ge=1, description="Stop after this many questions raised (null: never)."
    )
    judge: JudgeConfig = Field(default_factory=JudgeConfig)

    @model_validator(mode="before")
    @classmethod
    def _k_from_seeds(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("seeds") is not None:
            seeds = data["seeds"]
            if data.get("k") is None:
                data = {**data, "k": len(seeds)}
            elif isinstance(seeds, list) and data["k"] != len(seeds):
                raise ValueError(f"k={data['k']} but {len(seeds)} seeds {seeds}: give one seed per pass")
        return data

    @field_validator("shard")
    @classmethod
    def _shard_form(cls, v: str) -> str:
        from asearch.eval.runner import parse_shard

        parse_shard(v)  # raises ConfigError naming the value
        return v

    @field_validator("datasets")
    @classmethod
    def _some_dataset(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("give at least one dataset")
        return v


def default_out_dir(datasets: list[str]) -> Path:
    """runs/eval/<datasets joined by +, made path-safe>: the same command resumes the same run."""
    name = "+".join(re.sub(r"[^A-Za-z0-9_.=,-]+", "_", Path(d).stem if "/" in d else d) for d in datasets)
    return Path("runs") / "eval" / name[:120]


def build_judge(cfg: JudgeConfig) -> tuple[Any, Any]:
    """(LLMJudge, its chat client) for a configured url, else (None, None). Close the client when done."""
    if not cfg.url:
        return None, None
    try:
        from asearch.engine.openai_chat import OpenAIChatClient
    except ImportError as e:
        raise AsearchError(
            f"the LLM judge needs asearch.engine.openai_chat, which failed to import: {e}"
        ) from None
    from asearch.metrics.judge import LLMJudge

    client = OpenAIChatClient(
        cfg.url,
        cfg.model,
        api_key_env=cfg.api_key_env,
        max_concurrency=cfg.max_concurrency,
        timeout=cfg.timeout_s,
        retries=cfg.transport_retries,
    )
    judge = LLMJudge(client, max_retries=cfg.max_retries, max_prediction_chars=cfg.max_prediction_chars)
    return judge, client
