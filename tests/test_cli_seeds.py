"""``pita seeds K``: one experiment over K seeds, pooled (pita/cli/seeds.py)."""

import pytest

from pita.cli import console_main


@pytest.mark.parametrize("argv,says", [(["seeds", "0", "experiment=demo"], "K=0 must be >= 1"),
                                       (["seeds", "3", "experiment=demo", "system.seed=4"], "system.seed is set by pita seeds")])
def test_a_bad_seeds_command_is_exit_2_naming_what_to_change(argv, says, capsys):
    assert console_main(argv) == 2
    assert says in capsys.readouterr().err


def test_seeds_runs_each_seed_under_its_own_name_and_pools_them(monkeypatch, tmp_path, capsys):
    """Each seed is ``pita run ... system.seed=s experiment.name=<name>-seed<s>``; the finished
    runs are pooled by ``pita report`` into <output_dir>/<name>/seeds-<K>."""
    import subprocess
    from types import SimpleNamespace

    from pita.cli import seeds

    calls, pooled = [], []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        d = tmp_path / f"run{len(calls)}"
        d.mkdir()
        return SimpleNamespace(returncode=0, stdout=f"... run folder: {d}\n")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr("pita.cli.report.report_main", lambda runs, out=None: pooled.append((runs, out)) or 0)
    rc = seeds.seeds_main(["2", "--first", "5", "experiment=demo", f"system.output_dir={tmp_path}"])
    assert rc == 0
    assert [c[-2:] for c in calls] == [["system.seed=5", "experiment.name=demo-seed5"],
                                      ["system.seed=6", "experiment.name=demo-seed6"]]
    assert pooled == [([str(tmp_path / "run1"), str(tmp_path / "run2")], str(tmp_path / "demo" / "seeds-2"))]


def test_the_same_seeds_command_again_keeps_finished_seeds_and_resumes_a_stopped_one(tmp_path):
    """A sitting that ends part-way through seed 1 (the command and its run SIGKILLed): the same
    command again keeps seed 0's finished run as it is, resumes seed 1's run in its own folder
    (the jobs it had finished are not run again) and pools the two (here the pooling finds no
evaluation: the stand-in workload has none). Other overrides than a seed's
    recorded ones start a new run for it, saying which differ."""
    import json
    import os
    import signal
    import subprocess
    import sys

    from pita.cli.seeds import _earlier
    from tests.helpers import ROOT, wait_for

    small = ["synthetic.algos=[PITA,DPO]", "synthetic.datasets=[arith]", "synthetic.rounds=2"]
    overrides = ["experiment.workload=synthetic", "synthetic.job_seconds=0.5", *small, "executor.progress=plain",
                 f"system.output_dir={tmp_path}", "experiment.name=sd"]
    cmd = [sys.executable, "-m", "pita", "seeds", "2", *overrides]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    seed1 = tmp_path / "sd-seed1"
    try:
        assert wait_for(lambda: len(list(seed1.glob("*/jobs/*/.done"))) >= 3, 300), "seed 1 never got going"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    done_before = {p.parent.name for p in seed1.glob("*/jobs/*/.done")}
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = again.stdout + again.stderr
    # both seeds ran to the end; the synthetic workload evaluates nothing, so there is nothing to pool
    assert again.returncode == 2 and "no evaluation finished in" in out, out[-3000:]
    assert "seed 0: finished earlier with these overrides" in out and "(kept)" in out
    assert "seed 1: resuming" in out and "stopped part-way" in out
    [run0] = [p for p in (tmp_path / "sd-seed0").iterdir() if p.is_dir()]
    [run1] = [p for p in seed1.iterdir() if p.is_dir()]
    jobs = json.loads((run1 / "state.json").read_text())["jobs"]
    assert all(j["state"] == "COMPLETED" for j in jobs.values())
    assert all(len(jobs[j].get("attempts", [])) <= 1 for j in done_before)  # not run again
    assert _earlier(seed1, overrides) == (run1, "finished")
    changed = [o.replace("job_seconds=0.5", "job_seconds=0.4") for o in overrides]
    run, why = _earlier(seed1, changed)
    assert run is None and "other overrides (synthetic.job_seconds=0.4 synthetic.job_seconds=0.5)" in why
