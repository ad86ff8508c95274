"""Shared pytest setup."""

from __future__ import annotations

import os

from hypothesis import settings

# CI runs hypothesis derandomized: the same examples every run, so a red CI is always
# reproducible (and never a lucky draw). Locally the default random search keeps exploring.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")
