"""A checkpoint carries a digest of the weights it saved, and a resume checks the weights it loaded against it:
equal weights resume (and say so), other weights are refused (CheckpointError), an older checkpoint without a
digest resumes unchecked."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from asearch.errors import CheckpointError
from asearch.rl.checkpoint import resume_from_checkpoint, save_checkpoint
from asearch.rl.staleness import StalenessManager
from asearch.rl.trainer import PolicyTrainer, TrainerConfig, weights_digest
from asearch.runs import RunDir

torch.set_num_threads(1)


def controller_state() -> dict:
    staleness = StalenessManager(batch_size=2, max_staleness=1, max_concurrent=4).state_dict()
    return {"ready": [], "redo": [], "staleness": staleness, "data_position": 0}


@pytest.fixture
def saved(tmp_path, tiny_policy):
    """(run, the trainer that saved step 3, the digest of its weights then)."""
    _, model = tiny_policy
    trainer = PolicyTrainer(copy.deepcopy(model), TrainerConfig())
    with torch.no_grad():
        next(trainer.model.parameters()).add_(0.25)  # weights no fresh copy of the model has
    run = RunDir(tmp_path / "run", tensorboard=False)
    save_checkpoint(run.path, 3, trainer, {"step": 3, "rl_wall_s": 1.0, "controller": controller_state()}, keep=2)
    return run, trainer, trainer.weights_digest()


def test_the_weights_loaded_are_checked_against_those_saved(saved, tiny_policy) -> None:
    run, _, digest = saved
    state = json.loads((run.path / "checkpoints" / "step_3" / "state.json").read_text())
    assert state["weights_digest"] == digest
    fresh = PolicyTrainer(copy.deepcopy(tiny_policy[1]), TrainerConfig())
    assert fresh.weights_digest() != pytest.approx(digest)
    said: list[str] = []
    resume = resume_from_checkpoint(run, fresh, said.append)
    assert resume.step == 3 and fresh.weights_digest() == digest
    assert "weights as saved: digest" in said[-1], said


def test_a_checkpoint_whose_weights_are_not_those_saved_is_refused(saved, tiny_policy) -> None:
    run, trainer, digest = saved
    ckpt = run.path / "checkpoints" / "step_3"
    other = PolicyTrainer(copy.deepcopy(tiny_policy[1]), TrainerConfig())
    other.save_checkpoint(ckpt)  # another run's trainer state in place of the saved one
    with pytest.raises(CheckpointError, match="not those saved"):
        resume_from_checkpoint(run, PolicyTrainer(copy.deepcopy(tiny_policy[1]), TrainerConfig()), print)


def test_a_checkpoint_without_a_digest_resumes_unchecked(saved, tiny_policy) -> None:
    run, _, _ = saved
    state_file = run.path / "checkpoints" / "step_3" / "state.json"
    state = json.loads(state_file.read_text())
    del state["weights_digest"]
    state_file.write_text(json.dumps(state))
    said: list[str] = []
    resume_from_checkpoint(run, PolicyTrainer(copy.deepcopy(tiny_policy[1]), TrainerConfig()), said.append)
    assert "weights not checked" in said[-1], said


def test_the_digest_sums_every_parameter_once(tiny_policy) -> None:
    _, model = tiny_policy
    params = dict(model.named_parameters())  # a tied LM head is listed once
    total = sum(p.detach().double().sum().item() for p in params.values())
    squares = sum((p.detach().double() ** 2).sum().item() for p in params.values())
    assert weights_digest(model) == pytest.approx([total, squares], rel=1e-12)
