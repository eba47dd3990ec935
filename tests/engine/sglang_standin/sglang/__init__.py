"""A stand-in for the `sglang` package in tests: SGLang has no CPU build to install here (docs/engines-remote.md)."""
