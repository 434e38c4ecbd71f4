"""The docs-commands helper reads a page's shell commands as bash would: continuations, comments,
console prompts, environment words, placeholders; other fenced blocks are not commands."""

from __future__ import annotations

from tests.doc_commands import commands, placeholders, strip_comment

PAGE = """Intro `not a command`.
<!-- doc-test: ROOT=/path/to/ROOT SERVER=SERVER -->

```bash
# a comment line
.venv/bin/headway run --out results/mine --set dataset=/path/to/ROOT \\
    --set num-clients=10   # trailing comment
HEADWAY_DATA_DIR=/d .venv/bin/flwr run . lab --run-config "a='x' b=2"  # server
echo 'a # not a comment' http://h/#frag
```

```python
print("not shell")
```

```console
$ .venv/bin/headway split mnist --out nodes/
nodes/node-0/data.npz
```
"""


def test_commands_follow_bash_rules() -> None:
    found = commands(PAGE)
    assert [c.argv for c in found] == [
        [".venv/bin/headway", "run", "--out", "results/mine", "--set", "dataset=/path/to/ROOT", "--set", "num-clients=10"],
        [".venv/bin/flwr", "run", ".", "lab", "--run-config", "a='x' b=2"],
        ["echo", "a # not a comment", "http://h/#frag"],
        [".venv/bin/headway", "split", "mnist", "--out", "nodes/"],
    ]
    assert [c.line for c in found] == [6, 8, 9, 17]
    assert found[0].comment == "trailing comment" and found[1].comment == "server"
    assert found[1].env == {"HEADWAY_DATA_DIR": "/d"} and found[1].program == "flwr"
    assert found[0].option("--set") == ["dataset=/path/to/ROOT", "num-clients=10"]
    assert [c.block for c in found] == [0, 0, 0, 2] and found[3].language == "console"


def test_placeholders_substitute_in_every_word() -> None:
    names = placeholders(PAGE)
    assert names == {"ROOT": "/path/to/ROOT", "SERVER": "SERVER"}
    cmd = commands(PAGE)[0].substitute({names["ROOT"]: "/tmp/x"})
    assert "dataset=/tmp/x" in cmd.argv
    assert strip_comment("a 'b # c' # d") == ("a 'b # c'", "d")
