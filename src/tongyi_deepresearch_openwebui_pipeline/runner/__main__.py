"""``python -m tongyi_deepresearch_openwebui_pipeline.runner``: the console script."""

import sys

from .cli import main

sys.exit(main())
