"""Fully asynchronous RL: staleness-bounded rollout, advantages, decoupled PPO loss, the trainer."""
