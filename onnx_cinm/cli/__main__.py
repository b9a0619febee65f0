"""``python -m onnx_cinm.cli``."""
import sys

from . import main

sys.exit(main())
