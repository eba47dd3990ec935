"""Engines that run the model in this process: the in-process engine (continuous batching over a slot KV
cache, its lean decoder, sampler and CPU kernels) and the scripted engine (a Python policy, for tests and experts)."""
