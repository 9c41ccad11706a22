"""Token-id workloads on an endpoint that takes only text are refused at planning, with the key and the fix:
sglang-router 0.3.2 answered every synthetic (token-id) prompt with HTTP 422 on an H100
(examples/h100-sglang-pd-1gpu)."""
import copy
from pathlib import Path

import pytest
import yaml

from servesweep.config import ConfigError, check_config

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = yaml.safe_load((ROOT / "config" / "gpu-sglang-pd-1gpu.yaml").read_text())


def _with_workloads(workloads, config=None):
    cfg = copy.deepcopy(SHIPPED)
    cfg["matrix"]["workloads"] = workloads
    return cfg


def test_the_shipped_pd_config_sends_text():
    check_config(copy.deepcopy(SHIPPED))


@pytest.mark.parametrize("workload", ["synthetic", "shared_prefix"])
def test_token_id_workloads_behind_the_router_are_refused(workload):
    cfg = _with_workloads([workload])
    cfg["matrix"].pop("real_text", None)
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    text = str(err.value)
    assert f"server_configs.pd.workloads" in text and f"{workload} send token ids" in text
    assert "server_configs.single.workloads" not in text            # one server takes token ids


def test_a_router_config_with_text_workloads_of_its_own_plans():
    cfg = _with_workloads(["synthetic"])
    cfg["matrix"].pop("real_text", None)
    cfg["server_configs"]["pd"]["workloads"] = ["multi_turn"]
    check_config(cfg)
