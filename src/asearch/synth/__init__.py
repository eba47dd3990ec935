"""QA synthesis: hard, grounded questions with a single right answer, by INJECT/FUZZ edits behind gates.

Three backends share one run: `GraphBackend` edits knowledge-graph patterns over the embedded world
(uniqueness checked exactly), `LLMBackend` prompts an OpenAI-compatible endpoint once per operator, and
the agent backend (`asearch.synth.agentic.SynthAgentWorkflow`) has an LLM choose each step in the agent
loop. `run_synthesis` writes ASearcher-shaped jsonl that `asearch train` and `asearch eval` read as it is.
"""

from asearch.synth.backend import Draft, GateResult, Seed, SynthBackend
from asearch.synth.config import (
    AgentBackendConfig,
    DedupConfig,
    EndpointConfig,
    GateConfig,
    GradingConfig,
    GraphBackendConfig,
    LLMBackendConfig,
    SolverConfig,
    SynthConfig,
)
from asearch.synth.dedup import NearDuplicateIndex, near_duplicates
from asearch.synth.graph_backend import GraphBackend
from asearch.synth.pattern import GraphQuestion, Matcher, Renderer
from asearch.synth.pipeline import (
    Attempt,
    Synthesizer,
    SynthSummary,
    finalize,
    run_synthesis,
    run_synthesis_async,
)
from asearch.synth.records import EditStep, Statement, SynthQuestion, Uniqueness
from asearch.synth.solver import ChatDirectSolver, DirectResult, DirectSolver, EngineDirectSolver, Grader

__all__ = [
    "AgentBackendConfig",
    "Attempt",
    "ChatDirectSolver",
    "DedupConfig",
    "DirectResult",
    "DirectSolver",
    "Draft",
    "EditStep",
    "EndpointConfig",
    "EngineDirectSolver",
    "GateConfig",
    "GateResult",
    "GradingConfig",
    "Grader",
    "GraphBackend",
    "GraphBackendConfig",
    "GraphQuestion",
    "LLMBackendConfig",
    "Matcher",
    "NearDuplicateIndex",
    "Renderer",
    "Seed",
    "SolverConfig",
    "Statement",
    "SynthBackend",
    "SynthConfig",
    "SynthQuestion",
    "SynthSummary",
    "Synthesizer",
    "Uniqueness",
    "finalize",
    "near_duplicates",
    "run_synthesis",
    "run_synthesis_async",
]
