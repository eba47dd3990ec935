"""asearch's own inference server (`asearch engine serve`): the in-process engine behind SGLang's native protocol
(`app`) and OpenAI's API (`openai_api`, with its request models in `openai_requests`)."""
