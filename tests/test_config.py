"""Configuration checks: command-line overrides (pita.cli.check_overrides), the checks on a
composed config (pita.config.validate.validate_config), and run_experiment's exit code 2."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from pita.cli import check_overrides, run_experiment
from pita.config.schema import PitaConfig
from pita.config.validate import validate_config
from pita.core.errors import ConfigError


def make_cfg(**groups):
    return OmegaConf.merge(OmegaConf.structured(PitaConfig), groups)


# ---------------------------------------------------------------- check_overrides
def test_unknown_top_level_key():
    with pytest.raises(ConfigError) as ei:
        check_overrides(["foo=1"])
    msg = str(ei.value)
    assert "unknown key 'foo'" in msg
    assert "keys at top level" in msg and "executor" in msg


def test_typo_in_nested_key_suggests_the_right_one():
    with pytest.raises(ConfigError) as ei:
        check_overrides(["executor.backnd=local"])
    msg = str(ei.value)
    assert "'executor.backnd'" in msg
    assert "(did you mean 'backend'?)" in msg


def test_every_unknown_key_reported_at_once():
    with pytest.raises(ConfigError) as ei:
        check_overrides(["foo=1", "system.devcies=[0]", "executor.oom_retries=1"])
    assert len(ei.value.problems) == 2
    assert "(did you mean 'devices'?)" in str(ei.value)


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError) as ei:
        check_overrides(["executor.oom_retries=abc"])
    assert "executor.oom_retries" in str(ei.value)
    assert "abc" in str(ei.value)


@pytest.mark.parametrize("overrides", [
    [],
    ["executor.oom_retries=3", "experiment.name=my_run"],
    ["system.devices=[0,1]", "executor.backend=inline", "executor.memory_margin=0.1"],
    ["executor.job_timeout_s=null", "synthetic.families=[tiny,small]"],
])
def test_valid_overrides_pass(overrides):
    check_overrides(overrides)  # must not raise


# ---------------------------------------------------------------- validate_config
def test_default_config_is_valid():
    validate_config(make_cfg())


@pytest.mark.parametrize("groups,fragment", [
    ({"executor": {"backend": "nope"}}, "executor.backend='nope' is not known; choose one of: inline, local"),
    ({"executor": {"backend": "locl"}}, "(did you mean 'local'?)"),
    ({"executor": {"oom_retries": -1}}, "executor.oom_retries=-1: must be >= 0"),
    ({"executor": {"memory_margin": 1.5}}, "executor.memory_margin=1.5: must be a fraction in [0, 1)"),
    ({"executor": {"max_jobs_per_device": 0}}, "executor.max_jobs_per_device=0"),
    ({"executor": {"progress": "fancy"}}, "executor.progress='fancy' is not known"),
    ({"system": {"devices": [-1]}}, "system.devices=[-1]"),
    ({"system": {"devices": []}}, "system.devices=[]"),
    ({"system": {"devices": "gpu"}}, "system.devices='gpu'"),
    ({"system": {"cpu_devices": 0}}, "system.cpu_devices=0"),
    ({"experiment": {"name": "a/b"}}, "experiment.name='a/b'"),
    ({"experiment": {"workload": "real"}}, "experiment.workload='real' is not known"),
    ({"synthetic": {"memory_gb": -1}}, "synthetic.memory_gb=-1.0: must be >= 0"),
    ({"synthetic": {"rounds": 0}}, "synthetic.rounds=0"),
    ({"synthetic": {"algos": []}}, "synthetic.algos=[]"),
])
def test_each_problem_is_reported(groups, fragment):
    with pytest.raises(ConfigError) as ei:
        validate_config(make_cfg(**groups))
    assert len(ei.value.problems) == 1, ei.value.problems
    assert fragment in ei.value.problems[0]


@pytest.mark.parametrize("devices", ["auto", "cpu", [0], [0, 3]])
def test_valid_device_selections(devices):
    validate_config(make_cfg(system={"devices": devices}))


def test_all_problems_in_one_error():
    cfg = make_cfg(
        executor={"backend": "nope", "oom_retries": -1, "memory_margin": 1.5},
        system={"devices": [-1]},
        experiment={"name": "a/b"},
        synthetic={"memory_gb": -1},
    )
    with pytest.raises(ConfigError) as ei:
        validate_config(cfg)
    probs = ei.value.problems
    assert len(probs) == 6, probs
    for key in ("executor.backend", "executor.oom_retries", "executor.memory_margin", "system.devices",
                "experiment.name", "synthetic.memory_gb"):
        assert sum(p.startswith(key) for p in probs) == 1, (key, probs)
    assert str(ei.value).startswith("invalid configuration (6 problems):")


# ---------------------------------------------------------------- run_experiment
def test_run_experiment_bad_config_exits_2_and_creates_nothing(tmp_path, capsys):
    cfg = make_cfg(executor={"backend": "nope"}, system={"output_dir": str(tmp_path)},
                   experiment={"name": "t"})
    assert run_experiment(cfg) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert "executor.backend" in err
    assert list(tmp_path.iterdir()) == []
