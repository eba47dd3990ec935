"""The asearch exception tree; every error a user can meet derives from `AsearchError`.

    AsearchError
    ├── ConfigError            bad YAML, unknown key, invalid value (names file/line/key)
    ├── DataFormatError        a malformed corpus/dataset line (names file, line, field)
    ├── IndexError_            missing, stale or mismatched index directory
    ├── ToolError              a tool could not run (rendered to the agent as an observation)
    ├── RemoteError            a server we talk to failed or answered badly
    ├── LaunchError            no cluster, or the allocation does not fit it
    │   └── TrainerRankError   a trainer rank failed or stopped answering (names the rank and its node)
    └── TrainingDiverged       a step's loss or gradient norm is not finite
"""

from __future__ import annotations

from pathlib import Path


class AsearchError(Exception):
    """Base class: the CLI prints `TypeName: message` for these and exits non-zero."""


class ConfigError(AsearchError):
    """A configuration file or override is invalid."""


class DataFormatError(AsearchError):
    """A line of an input file does not have the expected shape."""

    def __init__(self, path: str | Path, line: int | None, field: str | None, problem: str):
        self.path, self.line, self.field, self.problem = str(path), line, field, problem
        where = self.path if line is None else f"{self.path}:{line}"
        what = f" field {field!r}:" if field else ""
        super().__init__(f"{where}:{what} {problem}")


class IndexError_(AsearchError):  # trailing underscore: do not shadow the builtin IndexError
    """An index directory is missing, incomplete, stale or built for other data."""


class ToolError(AsearchError):
    """A tool call failed; the agent loop turns this into an observation, never a crash."""


class RemoteError(AsearchError):
    """A remote server (retrieval, inference, web API) failed or answered with bad data."""


class LaunchError(AsearchError):
    """A launcher could not reach its cluster or place what the allocation asks for."""


class TrainerRankError(LaunchError):
    """A trainer rank raised, died or did not answer within its timeout; the run stops (its last checkpoint resumes it)."""


class CheckpointError(AsearchError):
    """A checkpoint cannot be resumed as it was saved: the weights loaded differ from those written."""


class TrainingDiverged(AsearchError):
    """A training step's loss or gradient norm is not finite; the weights keep the last finite step's values."""
