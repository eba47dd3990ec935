"""asearch: long-horizon LLM search agents trained with fully asynchronous RL."""

__version__ = "0.1.0"
