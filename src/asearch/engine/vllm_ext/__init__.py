"""Code that runs inside vLLM's server, not in asearch: this folder goes first on the server's PYTHONPATH
(`vllm_server_env`), so `asearch_vllm_ext` imports there with vLLM's own torch and nothing of asearch."""
