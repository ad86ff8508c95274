import sys

from llm_health.demo import main

sys.exit(main())
