"""Checkpoint and resume in simulation (issue 40): real `headway run` processes killed by SIGKILL and
resumed with `headway run --resume`, compared round by round with an unbroken run of the same config.

The kill points come from the server's test-only fault hook (``headway.server.resume.KILL_ENV``): ``record:K`` kills
the process after round K's record went to rounds.jsonl and before its checkpoint (the resume redoes round
K, and rounds.jsonl holds it once), ``checkpoint:K`` right after round K's checkpoint. A kill during round 1
is a plain SIGKILL from outside once the clients are up and before any record.

What must be equal: every round's accuracy, the clients selected, and every bytes field (bytes_down/up,
values_bytes_*, each phase's), exactly: in simulation Flower's run id and node ids, which every message's
header carries as varints, are drawn from the run's seed (simulation/flower_fixes.py), so a resumed run's
messages are the size of the unbroken run's.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from headway.core.schema import ConfigError
from headway.server.checkpoint import Checkpoint, decode, encode
from headway.server.resume import resume_point
from headway.strategies.arrays import to_record
from headway.strategies.base import Step
from headway.strategies.fedprof import SECRET_ENV
from headway.strategies.meter import RoundMeter
from headway.strategies.registration import ClientRegistry
from headway.strategies.round_loop import Pending
from headway.strategies.state import ServerState

ROOT = Path(__file__).resolve().parents[1]
TINY = ["dataset=mnist", "partition=iid", "num-clients=3", "train-fraction=0.02", "local-epochs=1", "num-server-rounds=3"]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    # FedProf's D^V comes from OS entropy unless this is set: without it two FedProf runs score, and may select,
    # differently, and the unbroken run would not be the run the resumed one continues (the resume keeps its D^V)
    env[SECRET_ENV] = "test-resume-simulation"
    env.pop("HEADWAY_TEST_KILL", None)  # only the run a test kills gets the fault hook
    return {**env, **extra}


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def headway_run(args: list[str], log: Path, kill: str | None = None, kill_in_round_1: bool = False, timeout: float = 400) -> int:
    """Run `headway run ARGS` in its own process group; ``kill``: the fault hook's point; ``kill_in_round_1``: SIGKILL
    it from here once Ray's client actors exist and no round is recorded. Ray's processes it leaves are killed after."""
    out = Path(args[args.index("--out") + 1]) if "--out" in args else Path(args[args.index("--resume") + 1])
    env = _env(**({"HEADWAY_TEST_KILL": kill} if kill else {}))
    tree: set[int] = set()
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "headway", "run", *args], cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    kids = psutil.Process(proc.pid).children(recursive=True)
                except psutil.NoSuchProcess:
                    kids = []
                tree.update(p.pid for p in kids)
                actors = any("ClientAppActor" in " ".join(_cmdline(p)) for p in kids)
                if kill_in_round_1 and actors and (out / "rounds.jsonl").exists() and not (out / "rounds.jsonl").read_text():
                    time.sleep(1.0)  # inside round 1: its clients are training
                    os.kill(proc.pid, signal.SIGKILL)
                time.sleep(0.2)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait(timeout=30)
        finally:
            for pid in tree:  # Ray's reaper ends its group when the runner dies; whatever it left, by pid
                if _running(pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def rounds(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]


def wire_bytes(record: dict[str, Any]) -> dict[str, int]:
    """A round's bytes fields (bytes_down/up, values_bytes_*, every <phase>_bytes_*, the cumulative ones), less the
    resume's re-registration, which the unbroken run did not have."""
    return {k: v for k, v in record.items() if "bytes" in k and not k.startswith("resume_")}


def assert_same_rounds(unbroken: Path, resumed: Path) -> None:
    """Every round recorded once, and its accuracy, selected clients and every bytes field (wire, values, each
    phase's) equal to the unbroken run's, byte for byte."""
    a, b = rounds(unbroken), rounds(resumed)
    assert [r["round"] for r in b] == [r["round"] for r in a] == list(range(1, len(a) + 1))
    for x, y in zip(a, b):
        assert y["accuracy"] == x["accuracy"], (x["round"], x["accuracy"], y["accuracy"])
        assert y["selected"] == x["selected"], x["round"]
        assert wire_bytes(y) == wire_bytes(x), x["round"]
        assert not any(k.startswith("register_") for k in y if x["round"] > 1), y  # re-registration is reported apart


def resume(out: Path, tmp: Path, *more: str) -> int:
    return headway_run(["--resume", str(out), *more], tmp / f"resume-{out.name}.log")


@pytest.fixture(scope="module")
def fedavg_runs(tmp_path_factory: pytest.TempPathFactory, data_dir: str) -> Path:
    """An unbroken 3-round FedAvg run (folder 'unbroken'), and one killed between round 2's record and its checkpoint."""
    root = tmp_path_factory.mktemp("fedavg")
    config = sets("algorithm=fedavg", *TINY)
    assert headway_run(["--out", str(root / "unbroken"), *config], root / "unbroken.log") == 0
    rc = headway_run(["--out", str(root / "killed"), *config], root / "killed.log", kill="record:2")
    assert rc == -signal.SIGKILL, (root / "killed.log").read_text()[-2000:]
    return root


def test_fedavg_killed_between_record_and_checkpoint_resumes_to_the_unbroken_runs_rounds(fedavg_runs: Path) -> None:
    killed = fedavg_runs / "killed"
    assert [r["round"] for r in rounds(killed)] == [1, 2]  # round 2 recorded, its checkpoint never written
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["round-000001.ckpt"]
    assert resume(killed, fedavg_runs) == 0, (fedavg_runs / "resume-killed.log").read_text()[-3000:]
    assert_same_rounds(fedavg_runs / "unbroken", killed)
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["rounds"] == 3
    (note,) = summary["resumed"]
    assert note["after_round"] == 1 and note["from"] == "checkpoints/round-000001.ckpt"
    assert note["resume_bytes_down"] > 0 and note["resume_bytes_up"] > 0  # the re-registration, apart from bytes_down/up
    assert summary["checkpoint_bytes"] > 0 and summary["checkpoints_written"] == 2  # rounds 2 and 3 in the resumed process
    assert summary["total_values_bytes"] == json.loads((fedavg_runs / "unbroken" / "summary.json").read_text())["total_values_bytes"]


def test_a_changed_key_is_refused_in_one_line_and_the_same_rounds_say_complete(fedavg_runs: Path) -> None:
    unbroken = fedavg_runs / "unbroken"
    log = fedavg_runs / "refused.log"
    assert headway_run(["--resume", str(unbroken), *sets("local-epochs=2")], log) == 2
    said = log.read_text().strip().splitlines()
    assert len(said) == 1 and said[0].startswith("error: cannot resume") and "'local-epochs'" in said[0], said
    log = fedavg_runs / "complete.log"
    assert headway_run(["--resume", str(unbroken)], log) == 0
    assert "already complete" in log.read_text()


@pytest.mark.system
def test_a_complete_run_resumed_with_more_rounds_is_extended(fedavg_runs: Path) -> None:
    unbroken = fedavg_runs / "extended"  # a copy: the unbroken run stays the 3-round run the other tests compare with
    shutil.copytree(fedavg_runs / "unbroken", unbroken)
    before = rounds(unbroken)
    assert resume(unbroken, fedavg_runs, *sets("num-server-rounds=4")) == 0, (fedavg_runs / "resume-extended.log").read_text()[-3000:]
    after = rounds(unbroken)
    assert [r["round"] for r in after] == [1, 2, 3, 4]
    assert [r["accuracy"] for r in after[:3]] == [r["accuracy"] for r in before]
    summary = json.loads((unbroken / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["resumed"][0]["after_round"] == 3
    assert json.loads((unbroken / "config.json").read_text())["num-server-rounds"] == 4


# ---- the matrix: methods x kill points (make test-system) ------------------------------------------------

METHODS = {
    "fedlog": ["algorithm=fedlog"],
    "fedprof-partial": ["algorithm=fedprof", "fraction-train=0.67", "num-clients=3", "fedprof-val-size=200"],
    "lg-fedavg": ["algorithm=lg-fedavg"],
    "fedpft-chain": ["algorithm=fedpft", "fedpft-topology=chain", "fedpft-extractor=identity", "num-server-rounds=1"],  # one-shot
    "fedavg-with-next-train": ["algorithm=fedavg", "client-evaluation=with-next-train"],
    "fedavg-secagg": ["algorithm=fedavg", "secure-aggregation=secagg+"],
}
# Every method once at the kill point that tells most about it; the other kill points on FedAvg and FedLog are in
# the tests below (checkpoint:1: DP-FedLog, secure-aggregation FedAvg; a lost checkpoint:2: the truncated one), so
# each kill point runs once (the whole product repeats what these find at several minutes more on two cores).
# round-1: SIGKILL from outside while round 1 trains. fedpft-chain is one round long: killed after that round's
# record, before its checkpoint, it starts again from round 1.
MATRIX = (
    ("fedavg-with-next-train", "record:2"),  # a round record waiting for the next round's scores goes through the checkpoint
    ("fedavg-with-next-train", "round-1"),
    ("fedlog", "checkpoint:2"),
    ("fedprof-partial", "checkpoint:1"),  # the sampling stream and the per-client scores
    ("lg-fedavg", "record:2"),  # the clients' bodies: round 2 re-run must not see what the killed round 2 wrote
    ("fedpft-chain", "record:1"),
)


@pytest.fixture(scope="module")
def unbroken_runs(tmp_path_factory: pytest.TempPathFactory, data_dir: str) -> Callable[[str], Path]:
    """The unbroken run of a method's config, run once for all its kill points."""
    root = tmp_path_factory.mktemp("unbroken")
    done: dict[str, Path] = {}

    def run(method: str) -> Path:
        if method not in done:
            out = root / method
            assert headway_run(["--out", str(out), *sets(*TINY, *METHODS[method])], root / f"{method}.log") == 0
            done[method] = out
        return done[method]

    return run


def killed_run(config: list[str], tmp_path: Path, kill: str) -> Path:
    """A run of ``config`` SIGKILLed at ``kill`` (a fault hook point, or round-1 from outside)."""
    killed = tmp_path / "killed"
    if kill == "round-1":
        rc = headway_run(["--out", str(killed), *config], tmp_path / "killed.log", kill_in_round_1=True)
    else:
        rc = headway_run(["--out", str(killed), *config], tmp_path / "killed.log", kill=kill)
    assert rc == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-2000:]
    return killed


@pytest.mark.system
@pytest.mark.parametrize(("method", "kill"), MATRIX)
def test_killed_and_resumed_runs_equal_an_unbroken_run(
    method: str, kill: str, tmp_path: Path, unbroken_runs: Callable[[str], Path]
) -> None:
    unbroken = unbroken_runs(method)
    killed = killed_run(sets(*TINY, *METHODS[method]), tmp_path, kill)
    assert resume(killed, tmp_path) == 0, (tmp_path / "resume-killed.log").read_text()[-3000:]
    assert_same_rounds(unbroken, killed)
    again = [line for line in (tmp_path / "resume-killed.log").read_text().splitlines() if "starts again from round 1" in line]
    assert len(again) == (kill in ("round-1", "record:1")), again  # said once, where no checkpoint was written


@pytest.mark.system
def test_a_truncated_newest_checkpoint_falls_back_to_the_one_before_and_redoes_its_rounds(fedavg_runs: Path, tmp_path: Path) -> None:
    killed = killed_run(sets("algorithm=fedavg", *TINY), tmp_path, "checkpoint:2")
    newest = killed / "checkpoints" / "round-000002.ckpt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a disk that lost the file's tail
    assert resume(killed, tmp_path) == 0, (tmp_path / "resume-killed.log").read_text()[-3000:]
    warned = [line for line in (tmp_path / "resume-killed.log").read_text().splitlines() if "round-000002.ckpt is unreadable" in line]
    assert len(warned) == 1, (tmp_path / "resume-killed.log").read_text()[-3000:]
    assert_same_rounds(fedavg_runs / "unbroken", killed)
    (note,) = json.loads((killed / "summary.json").read_text())["resumed"]
    assert note["after_round"] == 1  # round 2 was run again


@pytest.mark.system
def test_a_secure_aggregation_run_resumed_runs_a_fresh_key_exchange(tmp_path: Path, unbroken_runs: Callable[[str], Path]) -> None:
    """The clients' secure-aggregation session (their keys and shares) is never on disk: the resumed round
    sets up and shares new keys, and its masked sum unmasks to the unbroken run's model."""
    unbroken = unbroken_runs("fedavg-secagg")
    killed = killed_run(sets(*TINY, *METHODS["fedavg-secagg"]), tmp_path, "checkpoint:1")
    assert resume(killed, tmp_path) == 0, (tmp_path / "resume-killed.log").read_text()[-3000:]
    assert_same_rounds(unbroken, killed)
    resumed = rounds(killed)[1]
    assert resumed["resumed"]["after_round"] == 1
    stages = [k for k in resumed if k.startswith("secagg_") and k.endswith("_bytes_up")]
    assert stages and all(resumed[k] > 0 for k in stages), resumed  # every key stage answered in the resumed round
    assert resumed["failures"] == 0 and resumed["clients"] == 3 and resumed["aggregated"], resumed


@pytest.mark.system
def test_dp_fedlog_central_resumed_spends_the_epsilon_of_the_unbroken_run(tmp_path: Path, data_dir: str) -> None:
    config = sets(*TINY, "algorithm=fedlog", "fedlog-dp=central", "fedlog-epsilon=1.0", "fedlog-clip=2.0")
    assert headway_run(["--out", str(tmp_path / "unbroken"), *config], tmp_path / "unbroken.log") == 0
    killed = tmp_path / "killed"
    assert headway_run(["--out", str(killed), *config], tmp_path / "killed.log", kill="checkpoint:1") == -signal.SIGKILL
    assert resume(killed, tmp_path) == 0, (tmp_path / "resume-killed.log").read_text()[-3000:]

    def epsilons(summary: Any) -> list[Any]:
        if isinstance(summary, dict):
            return [v for k, v in sorted(summary.items()) if "epsilon" in k and not isinstance(v, dict)] + [
                e for k, v in sorted(summary.items()) for e in epsilons(v)
            ]
        return []

    spent = [epsilons(json.loads((d / "summary.json").read_text())) for d in (tmp_path / "unbroken", killed)]
    assert spent[0] and spent[0] == spent[1]
    assert [r["round"] for r in rounds(killed)] == [1, 2, 3]


# ---- the parts, without processes ------------------------------------------------------------------------


def test_a_pending_round_goes_through_a_checkpoint_file_and_back() -> None:
    """A with-next-train round waiting for its scores becomes plain values that the checkpoint's restricted
    unpickler takes back, with what its record needs."""
    meter = RoundMeter(bytes={"train": [10, 20]}, selected={0, 2})
    step: Step[Any] = Step(None, 2, {"loss": 0.5}, {"scores": {"0": 1.0}}, kept=False)
    pending = Pending(3, step, {"prepare_clients": 2}, meter, 1.5, 9.0, True, {0: 5, 2: 7}, [0, 2])
    plain = pending.plain()
    state = ServerState(to_record({"w": np.ones(3, dtype=np.float32)}), None, {"bit_generator": "PCG64"})
    ckpt = Checkpoint(3, state, {"registry": {}}, plain, [], "7", 1.0, {}, "code")
    back = Pending.from_plain(decode(encode(ckpt)).pending or {})
    assert back.round == 3 and back.step.clients == 2 and back.step.metrics == {"loss": 0.5} and back.step.details == step.details
    assert back.meter.bytes == {"train": [10, 20]} and back.meter.selected == {0, 2} and back.counts == {0: 5, 2: 7}
    assert back.expected == [0, 2] and back.aggregated
    pickle.dumps(plain)


def test_a_returning_node_must_come_back_as_the_client_that_left() -> None:
    before = ClientRegistry(3)
    for node, pid in ((101, 0), (102, 1)):
        assert before.claim(node, pid, "mlp", {101, 102}) is None
    before.clients[101].last_round, before.clients[101].consecutive_failures = 4, 2
    registry = ClientRegistry(3)
    registry.restore(pickle.loads(pickle.dumps(before.snapshot())))
    problem = registry.claim(7, 0, "cnn", {7})  # partition 0 ran body mlp
    assert problem is not None and "body 'mlp'" in problem and "'cnn'" in problem
    problem = registry.claim(8, 1, "mlp", {8, 102})  # node 102, partition 1's, is still connected (authentication keeps ids)
    assert problem is not None and "node 102" in problem
    assert registry.claim(9, 0, "mlp", {9}) is None  # simulation: the same partition under a new node id
    info = registry.clients[9]
    assert (info.partition_id, info.last_round, info.consecutive_failures) == (0, 4, 2)
    assert 101 not in registry.clients and 0 not in registry.returning
    assert registry.rejoining(102) and not registry.rejoining(9)  # node 102 must register again, to learn the lineage
    assert registry.claim(102, 1, "mlp", {9, 102}) is None and not registry.returning


def test_a_run_stopped_before_round_1s_checkpoint_starts_again_and_one_with_later_rounds_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "rounds.jsonl").write_text(json.dumps({"round": 1, "accuracy": 0.5}) + "\n")
    assert resume_point(tmp_path).checkpoint is None  # only round 1 is lost: it is redone
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps({"round": r}) + "\n" for r in (1, 2)))
    with pytest.raises(ConfigError, match="no usable checkpoint"):
        resume_point(tmp_path)


def test_a_complete_run_that_kept_no_checkpoint_says_it_cannot_be_resumed(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps({"round": r}) + "\n" for r in (1, 2)))
    (tmp_path / "summary.json").write_text(json.dumps({"status": "complete", "rounds": 2}))
    with pytest.raises(ConfigError, match=r"is complete and kept no checkpoint \(checkpoint-keep=0\)"):
        resume_point(tmp_path)
