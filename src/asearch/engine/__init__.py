"""Inference engines behind one `Engine` protocol: in-process transformers, vLLM, SGLang, OpenAI-compatible chat."""
