import sys

from vecgpt.cli import main

sys.exit(main())
