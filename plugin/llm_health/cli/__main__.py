"""``python -m llm_health.cli``: the same as the ``llm-health`` command."""

import sys

from llm_health.cli import main

sys.exit(main())
