"""``python -m multihead`` (and ``torchrun -m multihead``): the command line of :mod:`multihead.app`."""

import sys

from multihead.app.cli import main

sys.exit(main())
