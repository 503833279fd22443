"""scripts/gpu_torch_run.sh fits its budget: each wanted step's cap is its share of it, and run.log starts with the
code's commit; --fake-location takes the list of paths it measures (every default one but cpu)."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu_torch_run.sh"


def caps(out, budget: int, steps: str) -> dict[str, int]:
    """Run the script's cheapest steps (no trainer) and read each step's cap from its log."""
    p = subprocess.run(["bash", str(SCRIPT), str(out), str(budget), steps], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHON": "true"})  # fmt: skip
    assert p.returncode == 0, p.stderr
    log = (out / "run.log").read_text()
    return log, {m[0]: int(m[1]) for m in re.findall(r"^== (\S+) \(cap (\d+) s\)", log, re.M)}


def test_run_log_starts_with_the_commit_measured(tmp_path):
    log, _ = caps(tmp_path / "a", 60, "env")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert log.splitlines()[0].startswith(f"== code: feedbench {commit}")
    assert (tmp_path / "a" / "results.tar.gz").exists()


@pytest.mark.parametrize("budget", [60, 420])
def test_each_cap_is_a_share_of_the_time_left_and_a_quick_step_leaves_its_time_to_the_next(tmp_path, budget):
    script = SCRIPT.read_text()
    weights = dict(re.findall(r"\[([a-z-]+)\]=(\d+)", script.split("declare -A WEIGHTS=")[1].splitlines()[0]))
    assert set(weights) == {"env", "gpu-tests", "headline", "shm", "dataset", "real-data", "emulated", "ceiling",
                            "bandwidth", "input-only", "check", "capacity"}  # fmt: skip
    default = re.search(r"^STEPS=\$\{3:-([a-z,-]+)\}", script, re.M)[1].split(",")
    _, got = caps(tmp_path / "b", budget, "env,bandwidth")
    assert set(got) == {"env", "bandwidth"}
    env, bandwidth = int(weights["env"]), int(weights["bandwidth"])
    assert got["env"] <= (budget - 10) * env // (env + bandwidth)  # its share of the budget, less RESERVE_S
    # `env` ends within seconds here (no GPU): `bandwidth`, the last step, gets what is left, not its share.
    assert (budget - 10) * bandwidth // (env + bandwidth) < got["bandwidth"] <= budget - 10, got
    total = sum(int(weights[name]) for name in default)
    # The default steps: their shares of the whole budget at the start, which the first cap never exceeds.
    shares = {name: (budget - 10) * int(weights[name]) // total for name in default}
    assert sum(shares.values()) <= budget - 10
    if budget >= 420:  # the default budget: no step so short that it is skipped (the script skips a cap under 10 s)
        assert min(shares.values()) >= 12, shares


def test_fake_location_takes_a_list_of_paths_after_the_baseline():
    from bench_input import config_from, parse_args
    from consumers import declared

    choices = declared.of("torch")
    args = parse_args(["--framework", "torch", "--fake-location", "python-queue,zmq-consume,gpu"], choices)
    assert config_from(args, choices).paths == ["gpu", "python-queue", "zmq-consume"]
    from core.errors import ConfigError

    with pytest.raises(ConfigError, match="invalid choice: 'nope'"):
        parse_args(["--fake-location", "python-queue,nope"], choices)
