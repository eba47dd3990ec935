"""Engines that talk to an inference server over HTTP (vLLM, SGLang, asearch's own server, any OpenAI-compatible
chat endpoint), the pool that spreads rollouts over several servers, and each kind's hook that starts its server."""
