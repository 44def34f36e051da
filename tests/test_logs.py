"""run.log for people: what the log pump keeps of the jobs' output, the CPU devices' memory line,
and the live progress table redrawing in place on a terminal."""

from __future__ import annotations

import io
import logging
import re
import sys
from collections import Counter

import pytest

from helpers import run_graph
from pita.core.job import Job, Resources
from pita.core.logs import LogPump, keep_line, setup_logging
from pita.core.progress import Progress

# Lines as the jobs write them (Hugging Face's and tqdm's bars redraw with "\r"; TRL prints a dict
# per logging step; the worker's log records start with a timestamp).
BAR_LOAD = ("\rLoading weights:   0%|          | 0/38 [00:00<?, ?it/s]"
            "\rLoading weights: 100%|██████████| 38/38 [00:00<00:00, 22410.51it/s]\n")
BAR_SAVE = ("\rSaving the dataset (0/1 shards):   0%|          | 0/72 [00:00<?, ? examples/s]"
            "\rSaving the dataset (1/1 shards): 100%|██████████| 72/72 [00:00<00:00, 3402.32 examples/s]"
            "\rSaving the dataset (1/1 shards): 100%|██████████| 72/72 [00:00<00:00, 3369.11 examples/s]\n")
BAR_MAP = "\rMap (num_proc=4):  50%|█████     | 8/16 [00:01<00:01,  5.12 examples/s]\n"
BAR_NO_TOTAL = "Generating train split: 16 examples [00:00, 1532.45 examples/s]\n"
BAR_TRAIN = "  3%|▎         | 2/64 [00:05<02:41,  2.60s/it, loss=0.69]\n"
BAR_DOWNLOAD = "model.safetensors: 100%|##########| 1.2G/1.2G [1:00:10<00:00, 120MB/s]\n"
BAR_NESTED = "\x1b[A\rEpoch 1:  10%|█         | 1/10 [00:01<00:09,  1.00it/s]\x1b[A\n"
TRL_STEP = ("{'loss': '0.6931', 'grad_norm': '3.893', 'learning_rate': '0.0001', 'entropy': '0.2642', "
            "'num_tokens': '696', 'logits/chosen': '-1.703', 'epoch': '0.5'}\n")
TRL_END = "{'train_runtime': '0.8649', 'train_samples_per_second': '18.5', 'train_loss': '-0.007683', 'epoch': '0.1111'}\n"
INFO = "2026-11-23 09:05:21,908 INFO pita.job: attempt 1 of DPO.tiny.arith.r0.train (algo.dpo_train) on cpu1\n"
INFO_DICT = ("2026-11-23 09:05:30,838 INFO pita.job: head calibrated to the targets: "
             "{'mean_lm_logprob': -0.3262215554714203, 'bias': [0.3262]}\n")
WARN = ("2026-11-23 09:05:23,857 WARNING math_verify.parser: Timeout is disabled as parsing_timeout is None\n")
FUTURE = ("/venv/lib/python3.11/site-packages/transformers/training_args.py:1541: FutureWarning: "
          "`gradient_checkpointing` is deprecated\n  warnings.warn(f\"`{old}` is deprecated\", FutureWarning)\n")
TRACEBACK = ("Traceback (most recent call last):\n  File \"/x/trainer.py\", line 3, in step\n"
             "    logs = {'loss': loss}\nKeyError: {'loss': 1}\n")
NOISE = [BAR_LOAD, BAR_SAVE, BAR_MAP, BAR_NO_TOTAL, BAR_TRAIN, BAR_DOWNLOAD, BAR_NESTED, TRL_STEP, TRL_END]
KEPT = [INFO, INFO_DICT, WARN, FUTURE, TRACEBACK]


@pytest.mark.parametrize("text", NOISE)
def test_progress_bars_and_metric_dicts_stay_out_of_run_log(text):
    assert [seg for line in text.encode().rstrip(b"\n").split(b"\n") for seg in keep_line(line)] == []


@pytest.mark.parametrize("text", KEPT)
def test_log_records_warnings_and_tracebacks_reach_run_log_whole(text):
    lines = text.encode().rstrip(b"\n").split(b"\n")
    assert [seg for line in lines for seg in keep_line(line)] == lines


def test_text_written_over_a_bar_is_kept():
    line = "\rMap:  50%|█████     | 8/16 [00:01<00:01,  5.12 examples/s]\rUserWarning: tokenizer truncated 3 rows"
    assert keep_line(line.encode()) == [b"UserWarning: tokenizer truncated 3 rows"]


def test_the_pump_filters_a_job_log_written_in_pieces(tmp_path):
    """A job's output arriving as it does: bars redrawn without a newline for a while (consumed as
    they come, not held until the line ends), records, warnings, a traceback, a last line with no
    newline when the job ends. run.log gets the people's lines, prefixed; job.log keeps all."""
    job_log, run_log = tmp_path / "job.log", tmp_path / "run.log"
    job_log.write_bytes(b"")
    pump = LogPump(run_log)
    pump.add("j", job_log, "j cpu0")

    def write(text):
        with open(job_log, "ab") as f:
            f.write(text.encode())
        pump.pump()

    write(INFO)
    write(BAR_LOAD)
    write("\r  0%|          | 0/64 [00:00<?, ?it/s]")
    for step in range(1, 4):
        write(f"\r  {step}%|▎         | {step}/64 [00:0{step}<02:41,  2.60s/it]")
    assert pump.follow["j"][1] > len((INFO + BAR_LOAD).encode())  # the redraws were consumed
    write("\n" + TRL_STEP + WARN + FUTURE + TRL_END + BAR_SAVE + INFO_DICT + TRACEBACK)
    write("pita worker: ended 1 process(es) the job left running")  # no newline: the job's last words
    pump.remove("j")
    pump.close()
    assert run_log.read_text().splitlines() == [
        "[j cpu0] " + ln for ln in (INFO + WARN + FUTURE + INFO_DICT + TRACEBACK).splitlines()
    ] + ["[j cpu0] pita worker: ended 1 process(es) the job left running"]
    assert "38/38" in job_log.read_text() and "'grad_norm'" in job_log.read_text()


def test_crlf_output_is_one_line_each(tmp_path):
    job_log, run_log = tmp_path / "job.log", tmp_path / "run.log"
    job_log.write_bytes(b"")
    pump = LogPump(run_log)
    pump.add("j", job_log, "j")
    with open(job_log, "ab") as f:
        f.write(b"first\r\nsecond\r")
    pump.pump()
    with open(job_log, "ab") as f:
        f.write(b"\nthird\r\n")
    pump.close()
    assert run_log.read_text() == "[j] first\n[j] second\n[j] third\n"


# ---------------------------------------------------------------- the CPU devices' memory line
def test_cpu_device_lines_show_the_rss_of_their_running_jobs(tmp_path):
    jobs = [Job("slow", "synthetic.work", params={"seconds": 2.5}, resources=Resources(1, 0.5))]
    summary, state, run = run_graph(jobs, tmp_path, devices=1, memory_refresh_s=0.1, gpu_summary_interval_s=0.3)
    assert summary.exit_code == 0
    text = run.run_log.read_text()
    busy = re.findall(r"CPU 0 \(Simulated GPU 0\): (\d+\.\d\d) GB RSS of its jobs, 8\.00 GB total, 1 job", text)
    assert busy and all(float(x) > 0.01 for x in busy), text  # a worker holds more than 10 MB
    assert "CPU 0 (Simulated GPU 0): 8.00 GB total, 0 jobs" in text
    assert "GB used" not in text


# ---------------------------------------------------------------- the live table on a terminal
class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


_SEQ = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|[\r\n]|[^\x1b\r\n]+")


def terminal_screen(text: str, height: int) -> list[str]:
    """What a terminal of ``height`` rows shows (screen and scrollback) after ``text``: the control
    sequences rich's Live uses (cursor up, erase line, carriage return); cursor up stops at the
    top of the screen, as on a real terminal."""
    lines, row, col = [""], 0, 0
    for m in _SEQ.finditer(text):
        s = m.group(0)
        if s == "\n":
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        elif s == "\r":
            col = 0
        elif s.startswith("\x1b"):
            arg, cmd = m.group(1), m.group(2)
            if cmd == "A":
                row = max(len(lines) - height, 0, row - int(arg or 1))
            elif cmd == "K":
                lines[row] = "" if arg == "2" else lines[row][:col]
        else:
            old = lines[row].ljust(col)
            lines[row] = old[:col] + s + old[col + len(s):]
            col += len(s)
    return [ln.rstrip() for ln in lines]


def test_the_live_table_redraws_in_place_while_the_run_logs_to_the_console(monkeypatch):
    """Warnings and the final summary line are logged to the console while the table is live; each
    must appear once, above the table, and the terminal must end with exactly one table."""
    from rich.console import Console

    height = 24
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    setup_logging(None, console=True)
    log = logging.getLogger("pita.executor")
    try:
        p = Progress("rich", console=Console(stderr=True, force_terminal=True, width=100, height=height,
                                             color_system=None))
        p.start()
        for i in range(6):
            groups = {"base": Counter(COMPLETED=min(i, 4), PENDING=4 - min(i, 4)),
                      "round 0": Counter(COMPLETED=i, RUNNING=1, PENDING=9 - i)}
            p.update(groups, ["CPU 0 (2 cores): 0.43 GB RSS of its jobs, 11.67 GB total, 1 job"])
            log.warning("job %d ran out of memory on cpu0; retrying with batch_size=4", i)
        p.update({"base": Counter(COMPLETED=4), "round 0": Counter(COMPLETED=10)}, ["CPU 0 (x): 0 jobs"], force=True)
        log.info("finished after 19.8s: 14 completed, 0 failed, 0 skipped, 0 not run")
        p.stop()
    finally:
        setup_logging(None, console=False)
    screen = terminal_screen(tty.getvalue(), height)
    assert [ln.split()[0] for ln in screen if ln.split()[:1] == ["group"]] == ["group"], "\n".join(screen)
    for i in range(6):
        assert sum(f"job {i} ran out of memory" in ln for ln in screen) == 1, "\n".join(screen)
    [done] = [n for n, ln in enumerate(screen) if ln == "INFO finished after 19.8s: 14 completed, 0 failed, 0 skipped, 0 not run"]
    [header] = [n for n, ln in enumerate(screen) if ln.split()[:1] == ["group"]]
    assert done < header and "14/14" in screen[header + 1]  # the lines above, the last frame below
