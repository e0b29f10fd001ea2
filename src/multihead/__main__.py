"""``python -m multihead`` (and ``torchrun -m multihead``): the command line."""

import sys

from multihead.cli import main

sys.exit(main())
