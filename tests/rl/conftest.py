"""The RL tests need torch; their tiny policy (`tiny_policy`) is tests/conftest.py's."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
