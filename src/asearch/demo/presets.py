"""Named starting points of `asearch demo --preset NAME`: settings laid under the config file and overrides.

`default` is today's demo (search-only, 1-3 hops, `make demo`). `long` trains the whole ASearcher behaviour
on long pages (docs/demo.md, "The long-horizon preset"): search, open a page with `access`, read it chunk by
chunk writing a `<summary>` of each, keep reading until the asked line is found, 1-6 hops (30+ turns),
and old reading blocks are cut from the context once it is full, inside RL episodes too. `smollm2` warm-starts
and trains the real pretrained SmolLM2-135M-Instruct (LoRA adapters) on prose pages instead of the tiny model.
"""

from __future__ import annotations

from typing import Any

from asearch.agent.expert import READING_STYLE

# A page of the long world is 17 lines (~330 characters): three or four chunks of 120 characters.
_LONG_TOOLS = {
    "search": {"topk": 3, "max_doc_chars": 400, "show_urls": True, "compact": True},
    "access": {"chunk_chars": 120, "chunks_per_call": 1},
}
_LONG_CONTEXT = 1280  # a 6-hop expert episode needs ~1,400 tokens whole: compaction happens in 5-6-hop episodes

PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "long": {
        "preset": "long",
        "pages": "long",
        "hops": [1, 2, 3, 4, 5, 6],
        # the model names the key it looks for on every page: with natural wordings it named the wrong one in
        # 40% of its reading turns (docs/demo.md, run 12)
        "phrasing": "keys",
        # 18,000 questions to read over: with 12,000 (300 a world) seed 2's reader copied names worse, even
        # after more SFT steps (docs/demo.md, runs 16-18)
        "train_questions": 450,
        "rl_questions": 120,
        "train_worlds": 40,
        "expert_episodes": 24000,
        # the expert's one habit to break: 60% of its episodes never read past a page's first chunk, so the greedy
        # start stops reading early while SFT still sees whole chains (docs/demo.md, runs 12+)
        "p_skim": 0.6,
        "p_skip": 0.0,
        "p_stop": 0.0,
        "p_distract": 0.0,
        "max_positions": 2048,
        "attention": "sdpa",
        "sft": {"steps": 2400, "batch_size": 16, "token_budget": 2048},
        "rl": {
            "tools": _LONG_TOOLS,
            "agent": {
                "style": "search-r1",
                # a summary holds what matters, so a read chunk is cut to nothing once the context is full
                "style_options": {**READING_STYLE, "compact_read_blocks": 0, "compact_when": "full", "read_max_new_tokens": 24},
                "max_turns": 64, "max_new_tokens": 40, "max_context_tokens": _LONG_CONTEXT, "temperature": 0.7,
                "stop_repeats": 3,  # a policy asking for the page after the last one again is stuck (docs/demo.md)
            },  # fmt: skip
            "engine": {"max_seq_len": _LONG_CONTEXT, "max_batch": 128},
            # at the default demo's 2e-4 the greedy held-out accuracy fell 0.1-0.2 in the first versions (docs/demo.md)
            "trainer": {"token_budget": 2048, "epochs": 2, "optim": {"lr": 5e-5}},
            "rollout": {"batch_size": 8, "group_size": 8, "max_staleness": 2, "max_concurrent": 16},
            # the held-out curve was flat from RL's third to fifth minute (runs 13-18): SFT gets the time
            "max_rl_seconds": 540.0,
            "heldout": {"every_s": 180.0},
        },
    },
    "smollm2": {
        "preset": "smollm2",
        "model": "smollm2-135m-instruct",
        "pages": "prose",  # real sentences, so the pretrained model reads what it knows how to read
        "train_worlds": 8,
        "train_questions": 150,
        "rl_questions": 150,
        "expert_episodes": 800,
        "heldout_questions": 150,
        "heldout_during_rl": 60,
        "attention": "sdpa",
        "sft": {"steps": 100, "batch_size": 8, "token_budget": 4096, "context_loss_weight": 0.0,
                "lora": {"r": 16, "alpha": 32}, "optim": {"lr": 1e-3, "warmup_steps": 5, "schedule": "cosine"}},
        "rl": {
            # memory: a 4,096-token micro-batch of SmolLM2 holds ~9 GB of activations; with the engine's KV
            # cache beside it the process outgrew 24 GB (docs/demo.md)
            "engine": {"max_seq_len": 1024, "max_batch": 32},
            "trainer": {"token_budget": 2048, "epochs": 1, "lora": {"r": 16, "alpha": 32},
                        "optim": {"lr": 2e-4, "schedule": "cosine", "min_lr_ratio": 0.1}},
            "rollout": {"batch_size": 4, "group_size": 8, "max_staleness": 2, "max_concurrent": 8},
            "max_rl_seconds": 2700.0,  # the target's 45 minutes of RL
            "heldout": {"every_s": 600.0},
        },
    },
}


def preset(name: str) -> dict[str, Any]:
    """The settings of preset `name`; ConfigError naming the known presets otherwise."""
    from asearch.errors import ConfigError

    if name not in PRESETS:
        raise ConfigError(f"unknown demo preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]
