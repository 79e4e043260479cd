"""The benchmark scripts' tests import the project's packages from its root, as the scripts do."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
