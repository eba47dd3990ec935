"""The embedded synthetic world: a seeded knowledge graph, its encyclopedia pages and k-hop questions.

`WorldCorpus(seed, n_entities)` builds everything in memory in about a second; different seeds
(modulo `NAME_PARTITIONS`) share no entity names, so a held-out seed tests search, not memory.
"""

from asearch.corpus.world.generate import (
    GENERATOR_VERSION,
    MIN_ENTITIES,
    WorldSizes,
    check_world_size,
    generate_graph,
)
from asearch.corpus.world.graph import ATTRIBUTES, ENTITY_TYPES, RELATIONS, Entity, KnowledgeGraph, Range
from asearch.corpus.world.names import NAME_PARTITIONS
from asearch.corpus.world.questions import (
    Evidence,
    WorldQuestion,
    follow_path,
    generate_questions,
    read_questions_jsonl,
    write_questions_jsonl,
)
from asearch.corpus.world.render import RenderedPage
from asearch.corpus.world.source import DEFAULT_ENTITIES, WorldCorpus

__all__ = [
    "ATTRIBUTES",
    "DEFAULT_ENTITIES",
    "ENTITY_TYPES",
    "GENERATOR_VERSION",
    "MIN_ENTITIES",
    "NAME_PARTITIONS",
    "RELATIONS",
    "Entity",
    "Evidence",
    "KnowledgeGraph",
    "Range",
    "RenderedPage",
    "WorldCorpus",
    "WorldQuestion",
    "WorldSizes",
    "check_world_size",
    "follow_path",
    "generate_graph",
    "generate_questions",
    "read_questions_jsonl",
    "write_questions_jsonl",
]
