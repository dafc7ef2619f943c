"""python -m vecgpt.cli ... (the same as `vecgpt ...`)."""

import sys

from vecgpt.cli import main

sys.exit(main())
