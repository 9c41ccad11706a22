import copy
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture
def default_config() -> dict:
    """The embedded default config as a fresh dict."""
    return copy.deepcopy(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
