"""Issue 24, deployed: every SuperNode reads only its own data (``dataset='local'``).

Two SuperNodes on hosts of their own (network namespaces, TLS, SuperNode authentication)
hold different data: node0 an npz written by the split command (a Dirichlet share of an
MNIST slice), node1 a PNG folder this test writes (other MNIST rows, only digits 0-4, 32x32
pixels, its own counts). They run FedLog with two body architectures, one a user's factory
imported by path; the server holds no data. Each host's processes run in a mount namespace
of their own where the folders they must not read are covered by an empty tmpfs, so no node
can open the other's files (nor the shared data folder), and the server can open neither
node's folder nor the shared data folder; the test checks that the covering is in place.

A second, shorter test on 127.0.0.1 checks the refusals: a node whose data holds a class
outside the run's ``classes`` list, and a node started with ``--partition-id`` in a
``dataset='local'`` run, are refused with reasons that say why; the run goes on with the others,
which get the client indices the refused nodes were offered first (a unit test checks that
without processes).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.cluster import Cluster, Netns, free_port, read_rounds, run_folder
from tests.conftest import ROOT
from tests.fakes import GridStub

EXAMPLE_BODY_DIR = ROOT / "examples" / "custom_body"
USER_BODY = "headway_example_body:small_cnn"
DIGITS = [str(d) for d in range(10)]
LISTING = "import json, os, sys; print(json.dumps({p: sorted(os.listdir(p)) for p in sys.argv[1:]}))"


class HidingNetns(Netns):
    """:class:`Netns` whose hosts also get a private mount namespace: on host ``h`` every
    folder in ``hidden[h]`` is covered by an empty tmpfs before the command starts (and for
    the processes it starts: they inherit the namespace). Nothing mounted there is seen
    outside; it all goes when the last process of the namespace ends."""

    def __init__(self, hosts: list[str]):
        super().__init__(hosts)
        self.hidden: dict[str, list[Path]] = {}

    def prefix(self, host: str) -> list[str]:
        folders = self.hidden.get(host, [])
        if not folders:
            return super().prefix(host)
        mounts = " && ".join(f"mount -t tmpfs -o size=1m,mode=0755 tmpfs '{f}'" for f in folders)
        # `ip netns exec` has made a mount namespace (mounts of the host propagate into it); unshare makes
        # one more, private, so the tmpfs stays on this host; sh mounts, then execs the command (same PID)
        return [*super().prefix(host), "unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh"]


def mounted_tmpfs(pid: int) -> set[str]:
    """Mount points of the tmpfs file systems in the mount namespace of process ``pid``."""
    points = set()
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[0] == "tmpfs":
            points.add(left.split()[4].replace("\\040", " "))
    return points


def class_counts(train_labels, test_labels) -> dict[str, list[int]]:
    """class name -> [train, test] rows, as a node declares them (classes it holds only)."""
    tr, te = Counter(map(str, train_labels)), Counter(map(str, test_labels))
    return {c: [tr[c], te[c]] for c in sorted(set(tr) | set(te), key=lambda c: (not c.isdigit(), int(c) if c.isdigit() else 0, c))}


def write_png_folder(folder: Path, images: dict[str, tuple[np.ndarray, np.ndarray]], pad: int = 0) -> dict[str, list[int]]:
    """folder/train/<class>/*.png and folder/test/<class>/*.png from uint8 (n, 1, H, W) images
    per class name, padded by ``pad`` zero pixels on every side; the [train, test] counts."""
    from PIL import Image

    counts = {}
    for name, splits in images.items():
        for split, x in zip(("train", "test"), splits):
            target = folder / split / name
            target.mkdir(parents=True, exist_ok=True)
            for i, img in enumerate(x):
                Image.fromarray(np.pad(img[0], pad)).save(target / f"{i:05d}.png")
        counts[name] = [len(splits[0]), len(splits[1])]
    return counts


def mnist(data_dir: str):
    from headway.core.data import load_dataset

    return load_dataset("mnist", data_dir)


def digit_rows(ds, digit: int, avoid: set[bytes], count: int, start: int) -> np.ndarray:
    """``count`` MNIST training images of ``digit`` from row ``start`` on, none of them in ``avoid``."""
    rows = [i for i in np.flatnonzero(ds.y_train == digit) if i >= start and ds.x_train[i].tobytes() not in avoid][:count]
    assert len(rows) == count
    return ds.x_train[rows]


# ----- two hosts, two data sources, nothing shared ---------------------------------------


@pytest.fixture
def hosts():
    net = HidingNetns(["server", "node0", "node1"])
    try:
        yield net
    finally:
        net.close()


@pytest.mark.deployment
@pytest.mark.system  # three network namespaces, TLS, two SuperNodes: about 2 minutes, so make test-system (it kept make test at the 15-minute edge)
def test_nodes_read_only_their_own_data_across_hosts(tmp_path, data_dir, hosts):
    assert (EXAMPLE_BODY_DIR / "headway_example_body" / "__init__.py").is_file(), "examples/custom_body is missing"
    server = hosts.addresses["server"]
    certs, keys, results, split_out = tmp_path / "certs", tmp_path / "keys", tmp_path / "results", tmp_path / "nodes"
    node0, node1 = split_out / "node-0", tmp_path / "digits"
    with Cluster(tmp_path, data_dir, netns=hosts) as c:
        # node0's data: the split command's npz (a Dirichlet share of 2% of MNIST's training rows, and of its test rows);
        # seed 8 leaves this share without digits 1 and 2, so only the union of both nodes' classes is 0-9
        c.command(
            c.launcher(
                "split",
                "mnist",
                "--partition",
                "dirichlet",
                "--num-clients",
                "2",
                "--seed",
                "8",
                "--out",
                str(split_out),
                "--set",
                "train-fraction=0.02",
            )
        )
        with np.load(node0 / "data.npz") as z:
            declared0 = class_counts(z["y_train"], z["y_test"])
            seen = {img.tobytes() for img in (*z["x_train"], *z["x_test"])}
        assert set(DIGITS) - set(declared0) == {"1", "2"}, declared0
        # node1's data: other MNIST rows (none of node0's), digits 0-4 only, 32x32 PNGs (image-size=28 resizes them), counts of its own
        ds = mnist(data_dir)
        declared1 = write_png_folder(
            node1, {str(d): (digit_rows(ds, d, seen, 30 + 10 * d, 30000), digit_rows(ds, d, seen, 8 + d, 50000)) for d in range(5)}, pad=2
        )
        shared = Path(data_dir)
        spare = split_out / "node-1"  # the split's other share: no one's data in this run
        hosts.hidden = {"server": [split_out, node1, shared], "node0": [spare, node1, shared], "node1": [split_out, shared]}
        # from here on nobody is told where the shared data is; each host sees only what it may
        c.env.pop("HEADWAY_DATA_DIR")
        # the hiding has teeth: a command started as the launchers are sees the other node's folder empty
        expect = {
            "server": {split_out: False, node1: False, shared: False},
            "node0": {node0: True, spare: False, node1: False, shared: False},
            "node1": {split_out: False, node1: True, shared: False},
        }
        for host, wanted in expect.items():
            listing = json.loads(c.command([sys.executable, "-c", LISTING, *map(str, wanted)], host=host).stdout)
            assert {Path(p): bool(files) for p, files in listing.items()} == wanted, (host, listing)
        outside = json.loads(c.command([sys.executable, "-c", LISTING, str(node0), str(spare), str(node1), str(shared)]).stdout)
        assert all(outside.values()), outside  # ... and only there: the folders themselves are full

        c.command(c.launcher("certs", str(certs), "--host", server))
        for name in ("node0", "node1"):
            c.command(c.launcher("keys", str(keys), "--name", name), host=name)
        # the user's body must import in the ServerApp (it builds every body the run config names) and in every
        # ClientApp (each resolves the whole run config, both bodies included)
        user_path = {"PYTHONPATH": f"{ROOT}:{EXAMPLE_BODY_DIR}"}
        c.launch("superlink", ["superlink", "--certs", str(certs)], host="server", env=user_path)
        c.wait_for_port("superlink", 9092, host="server")
        c.wait_for_port("superlink", 8000, host="server")
        c.command(c.launcher("connect", "lab", "--address", "127.0.0.1:8000", "--root-cert", str(certs / "ca.crt")), host="server")
        for name in ("node0", "node1"):
            c.command(c.launcher("register", str(keys / f"{name}.pub"), "lab"), host="server")
        for name, data, body in (("node0", node0, "mnist-cnn"), ("node1", node1, USER_BODY)):
            c.launch(
                name,
                [
                    "supernode",
                    "--superlink",
                    f"{server}:9092",
                    "--root-cert",
                    str(certs / "ca.crt"),
                    "--auth-key",
                    str(keys / name),
                    "--data",
                    str(data),
                    "--body",
                    body,
                ],
                host=name,
                env=user_path,
            )
        run_config = (
            "algorithm='fedlog' dataset='local' image-size=28 channels=1 server-data='' num-clients=2 num-server-rounds=2 "
            f"local-epochs=1 batch-size=10 body='mnist-cnn' bodies='mnist-cnn,{USER_BODY}' feature-dim=50 "
            "sample-timeout=60.0 round-timeout=120.0"
        )
        out = c.submit("lab", run_config, results, host="server")
        folder = run_folder(results, out, c.log("superlink"), c.log("node0"), c.log("node1"))
        # the running launchers (whose children ran the ServerApp and the ClientApps) had the folders covered
        for name in ("superlink", "node0", "node1"):
            covered = mounted_tmpfs(c.procs[name].pid)
            hidden = {os.path.realpath(p) for p in hosts.hidden["server" if name == "superlink" else name]}  # a mount follows symlinks
            assert hidden <= covered, (name, covered)

    summary = json.loads((folder / "summary.json").read_text())
    rounds = read_rounds(folder)
    assert summary["status"] == "complete" and summary["rounds"] == 2 and summary["failures"] == 0, summary
    assert len(rounds) == 2 and all(r["clients"] == 2 for r in rounds), rounds
    assert rounds[-1]["accuracy"] > 0.3, rounds  # chance is 0.1
    # the server numbered the nodes; each declared exactly what its own folder holds
    bodies = summary["participants"]
    assert sorted(bodies.values()) == sorted(["mnist-cnn", USER_BODY]) and sorted(bodies) == ["0", "1"], bodies
    mine = {body: declared for body, declared in (("mnist-cnn", declared0), (USER_BODY, declared1))}
    for index, body in bodies.items():
        got = summary["declared_data"][index]
        assert got["classes"] == mine[body], (body, got)
        assert got["train_examples"] == sum(v[0] for v in mine[body].values())
        assert got["test_examples"] == sum(v[1] for v in mine[body].values())
    assert list(summary["declared_data"][next(i for i, b in bodies.items() if b == USER_BODY)]["classes"]) == ["0", "1", "2", "3", "4"]
    found = summary["discovery"]  # 1 and 2 come from node1 only, 5-9 from node0 only: both descriptions were merged
    assert found["nodes"] == 2 and found["classes"] == DIGITS and found["input_shape"] == [1, 28, 28] and found["left_out"] == [], found
    assert found["bytes_down"] > 0 and found["bytes_up"] > 0
    assert summary["server_data"].startswith("none: no global score"), summary.get("server_data")
    assert summary["refused_nodes"] == []


# ----- refusals: a class outside the run's list, a node with a partition id -------------------


@pytest.mark.deployment
@pytest.mark.system  # four SuperNodes, one run: about 3 minutes on 2 busy cores (make test-system)
def test_nodes_whose_data_or_start_do_not_fit_a_local_run_are_refused(tmp_path, data_dir):
    ds = mnist(data_dir)
    rng = np.random.default_rng(0)
    from headway.core.sources import write_npz

    good = []
    for k in range(2):  # two nodes with disjoint MNIST slices (all ten digits)
        rows_tr, rows_te = rng.permutation(30000)[:200] + 30000 * k, rng.permutation(5000)[:50] + 5000 * k
        folder = tmp_path / f"good{k}"
        write_npz(
            folder, ds.x_train[rows_tr], [str(y) for y in ds.y_train[rows_tr]], ds.x_test[rows_te], [str(y) for y in ds.y_test[rows_te]]
        )
        good.append(folder)
    cats = tmp_path / "cats"  # digits 0 and 1 and a class the run does not list
    write_png_folder(
        cats,
        {
            "0": (ds.x_train[ds.y_train == 0][:20], ds.x_test[ds.y_test == 0][:5]),
            "1": (ds.x_train[ds.y_train == 1][:20], ds.x_test[ds.y_test == 1][:5]),
            "cat": (ds.x_train[ds.y_train == 7][:20], ds.x_test[ds.y_test == 7][:5]),
        },
    )
    fleet, control = free_port(), free_port()
    results = tmp_path / "results"
    with Cluster(tmp_path, data_dir) as c:
        c.launch(
            "superlink", ["superlink", "--insecure", "--bind", "127.0.0.1", "--fleet-port", str(fleet), "--control-port", str(control)]
        )
        c.wait_for_port("superlink", fleet)
        c.wait_for_port("superlink", control)
        starts = {
            "good0": ["--data", str(good[0])],
            "good1": ["--data", str(good[1])],
            "cats": ["--data", str(cats)],
            "partitioned": ["--partition-id", "0", "--num-partitions", "2"],
        }
        for name, args in starts.items():
            c.launch(name, ["supernode", "--insecure", "--superlink", f"127.0.0.1:{fleet}", "--port", str(free_port()), *args])
        c.command(c.launcher("connect", "test", "--address", f"127.0.0.1:{control}", "--insecure"))
        # num-clients=4: the server waits for all four before asking them to describe their data, and offers each an index
        # at once, so each refusal is for the node's own reason (with fewer, a refused node's index goes to one still waiting)
        run_config = (
            "algorithm='fedlog' dataset='local' classes='0,1,2,3,4,5,6,7,8,9' num-clients=4 num-server-rounds=1 "
            "local-epochs=1 batch-size=10 body='mlp' sample-timeout=60.0 round-timeout=120.0"
        )
        out = c.submit("test", run_config, results)
        folder = run_folder(results, out, c.log("superlink"), *(c.log(n) for n in starts))
    summary = json.loads((folder / "summary.json").read_text())
    r = read_rounds(folder)[0]
    assert summary["status"] == "complete" and summary["rounds"] == 1, summary
    assert r["clients"] == 2 and r["accuracy"] > 0.3, r
    assert sorted(summary["declared_data"]) == sorted(summary["participants"]) and len(summary["participants"]) == 2
    assert sorted(d["train_examples"] for d in summary["declared_data"].values()) == [200, 200]
    refused = summary["refused_nodes"]
    assert len(refused) == 2, refused
    # the node itself finds, encoding its rows with the run's schema, that a label is not in the run's list, and says which
    cat = next(x for x in refused if "'cat'" in x)
    assert (
        cat.startswith("registration error")
        and f"{cats} (train): labels ['cat'] are not among the run's classes (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)" in cat
    ), cat
    assert cat.endswith("add them to run-config key 'classes' or drop those rows"), cat
    partitioned = next(x for x in refused if x is not cat)
    assert partitioned.startswith("registration error"), partitioned
    assert "the run has dataset='local', so every node reads its own data, but this node's config has no 'data'" in partitioned
    assert partitioned.endswith('start the SuperNode with --node-config "data=PATH" (the launcher: --data PATH)'), partitioned
    # both refusals are counted in round 1 with the node named; discovery left out both: the node that could not describe
    # its data, and the cat node, whose classes fall outside the pinned list (so it shapes nothing of the schema)
    assert r["failures"] == 2 and sorted(f.split(": ", 1)[1] for f in r["failure_reasons"]) == sorted(refused), r
    found = summary["discovery"]
    assert found["classes"] == DIGITS and found["nodes"] == 2, found
    assert len(found["left_out"]) == 2, found
    assert any("--data PATH" in x for x in found["left_out"]), found
    assert any("classes not in the run's list: ['cat']" in x for x in found["left_out"]), found


# ----- the index of a refused node goes to one that had none (no processes) -------------------


class DescribingGrid(GridStub):
    """Nodes 201, 202, ... that answer a registration query with their body and ``profiles[i]``
    (None: never answers)."""

    def __init__(self, profiles):
        self.profiles = {201 + i: p for i, p in enumerate(profiles)}
        self.sent = []

    def get_node_ids(self):
        return list(self.profiles)

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.app import ConfigRecord, Message, RecordDict
        from headway.core import protocol as P

        self.sent.extend(messages)
        return [
            Message(
                content=RecordDict(
                    {P.CONFIG: ConfigRecord({P.BODY: "mnist-cnn", P.DATA_PROFILE: json.dumps(self.profiles[m.metadata.dst_node_id])})}
                ),
                reply_to=m,
            )
            for m in messages
            if self.profiles[m.metadata.dst_node_id] is not None
        ]


def test_a_refused_nodes_client_index_is_offered_to_a_node_still_waiting(task_identity):
    """num-clients=2 and five nodes: the two with the lowest node ids are offered the indices
    first, one's data has a class outside the run's list and one never answers; the indices
    then go to the next two, which fit; the fifth finds none left."""
    from headway.core import protocol as P
    from headway.core.config import resolve_settings
    from headway.core.extractors import input_spec
    from headway.core.run_data import local_spec, source_options
    from headway.core.sources import merge
    from headway.strategies.engine import Engine
    from headway.strategies.registry import STRATEGIES
    from headway.strategies.services import Services

    cfg = resolve_settings(
        {
            "algorithm": "fedlog",
            "dataset": "local",
            "classes": "0,1",
            "num-clients": 2,
            "sample-timeout": 0.0,
            "round-timeout": 5.0,
            "feature-dim": 8,
        }
    )
    digits = {"kind": "image", "format": "npz", "classes": {"0": [6, 2], "1": [5, 1]}, "channels": 1, "size": [4, 4]}
    cat = {**digits, "classes": {"0": [6, 2], "cat": [6, 2]}}
    schema = merge([digits], source_options(cfg))
    strategy = STRATEGIES["fedlog"](cfg, input_spec(cfg, local_spec(schema)), Services(cfg, schema))
    grid = DescribingGrid([cat, None, digits, digits, digits])
    engine = Engine(grid, cfg, strategy.services, admit=strategy.body_problem)
    engine.begin_round(1)
    assert {n: c.partition_id for n, c in engine.registry.clients.items()} == {203: 0, 204: 1}
    assert engine.registry.clients[203].declared == {"0": [6, 2], "1": [5, 1]}
    refused = engine.registry.refused
    assert sorted(refused) == [201, 202, 205], refused
    assert "classes not in the run's list: ['cat']" in refused[201]
    assert refused[202] == "did not answer its registration"
    assert refused[205] == "every one of the num-clients=2 client indices is taken"
    offers = [(m.metadata.dst_node_id, m.content.config_records[P.CONFIG][P.CLIENT_INDEX]) for m in grid.sent]
    assert offers == [(201, 0), (202, 1), (203, 0), (204, 1)]
