"""Launchers: place rollout servers and trainer ranks by an allocation spec (`local`: subprocesses here)."""
