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
