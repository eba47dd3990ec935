"""Inference engines behind one `Engine` protocol (`types`), picked by kind through one `EngineConfig` (`registry`).

    local/    the model runs in this process: `inprocess` (transformers weights, own decoder), `scripted`
    remote/   clients of a server: `vllm`, `sglang`, `sglang_server`, `openai_chat`, and `pool` over several
    server/   asearch's own server (`asearch engine serve`): SGLang's native protocol and OpenAI's API

Shared by all three: `chat_tools` (function calling), `weight_group` (collective weight sync) and `supervisor`
(every server runs as its supervised subprocess); `vllm_ext` runs inside vLLM's server, not in asearch.
"""
