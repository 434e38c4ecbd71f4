"""Shell commands printed in a docs page, extracted from the text itself so a test can run them.

A docs test reads the page, takes every command from its fenced ```bash/```sh/```shell/```console
blocks and runs them: the docs stay true because the test runs what the reader copies. Rules (bash's):
a trailing backslash continues a line; ``#`` starts a comment at the start of a word outside quotes;
blank and comment-only lines are skipped; in ```console blocks only ``$ ``-prompted lines are
commands (the rest is output). Leading ``NAME=value`` words are the command's environment.

Placeholders: the page may define them for its tests in an HTML comment, invisible when rendered,
``<!-- doc-test: ROOT=/path/to/ROOT SERVER=127.0.0.1 -->``; :func:`placeholders` reads them, and
:meth:`DocCommand.substitute` replaces each placeholder's text in every word with a test's value.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PLACEHOLDERS = re.compile(r"<!--\s*doc-test:(?P<body>.*?)-->", re.S)
_OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1"}


@dataclass(frozen=True)
class DocCommand:
    """One command of a docs page: its words, where it is, and the comment beside it."""

    argv: list[str]
    line: int  # 1-based line of the page where the command starts
    block: int  # 0-based index of its fenced block in the page
    language: str
    comment: str = ""  # the trailing comment, without '#'
    env: dict[str, str] = field(default_factory=dict)  # leading NAME=value words

    @property
    def text(self) -> str:
        """The command as one shell line (environment words first), for messages and ``bash -c``."""
        words = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()] + [shlex.quote(w) for w in self.argv]
        return " ".join(words)

    @property
    def program(self) -> str:
        """The program's name without its directory (``.venv/bin/headway`` -> ``headway``)."""
        return Path(self.argv[0]).name if self.argv else ""

    @property
    def uses_shell(self) -> bool:
        """True when the command holds pipes, ``&&``, redirections: run it with ``bash -c text``."""
        return any(word in _OPERATORS for word in self.argv)

    def substitute(self, values: Mapping[str, str]) -> DocCommand:
        """The command with each key's text replaced by its value in every word (longest keys first,
        so ``/path/to/ROOT`` wins over ``ROOT``)."""
        keys = sorted(values, key=len, reverse=True)

        def sub(word: str) -> str:
            for key in keys:
                word = word.replace(key, values[key])
            return word

        return replace(self, argv=[sub(w) for w in self.argv], env={k: sub(v) for k, v in self.env.items()})

    def option(self, name: str) -> list[str]:
        """Every value given to option ``name`` (``--set``: each ``--set`` value; ``--out=x`` too)."""
        found: list[str] = []
        for i, word in enumerate(self.argv):
            if word == name and i + 1 < len(self.argv):
                found.append(self.argv[i + 1])
            elif word.startswith(name + "="):
                found.append(word[len(name) + 1 :])
        return found


def strip_comment(line: str) -> tuple[str, str]:
    """Split a shell line into (code, comment): ``#`` starts a comment at a word's start outside quotes."""
    quote = ""
    escaped = False
    for i, ch in enumerate(line):
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def fenced_blocks(text: str, languages: Iterable[str] = SHELL_LANGUAGES) -> list[tuple[int, int, str, list[str]]]:
    """Every fenced block in ``languages``: (block index among all fenced blocks, 1-based line of its
    first content line, language, its lines)."""
    wanted = set(languages)
    blocks: list[tuple[int, int, str, list[str]]] = []
    lines = text.splitlines()
    i, index = 0, 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, lang = match.group("fence"), match.group("lang").lower()
        body: list[str] = []
        start = i + 2
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if lang in wanted:
            blocks.append((index, start, lang, body))
        index += 1
    return blocks


def _logical_lines(body: list[str], first_line: int, console: bool) -> list[tuple[int, str]]:
    """Join backslash continuations; in console blocks keep only ``$ `` lines (and their continuations)."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for offset, raw in enumerate(body):
        line = raw.strip()
        if pending is None:
            if console:
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            pending = (first_line + offset, "")
        code, _ = strip_comment(line) if not line.endswith("\\") else (line, "")
        if code.endswith("\\"):
            pending = (pending[0], pending[1] + code[:-1] + " ")
            continue
        out.append((pending[0], pending[1] + line))
        pending = None
    if pending is not None:
        out.append(pending)
    return out


def commands(source: str | Path, languages: Iterable[str] = SHELL_LANGUAGES) -> list[DocCommand]:
    """Every command in a docs page (a path, or the page's text), in page order."""
    text = Path(source).read_text(encoding="utf-8") if isinstance(source, Path) else source
    found: list[DocCommand] = []
    for index, first_line, lang, body in fenced_blocks(text, languages):
        for line_no, line in _logical_lines(body, first_line, lang == "console"):
            code, comment = strip_comment(line)
            if not code.strip():
                continue
            try:
                words = shlex.split(code)
            except ValueError as err:
                raise ValueError(f"line {line_no}: cannot parse {code!r} as a shell command: {err}") from err
            env: dict[str, str] = {}
            while words and _ENV_WORD.match(words[0]):
                name, _, value = words.pop(0).partition("=")
                env[name] = value
            found.append(DocCommand(argv=words, line=line_no, block=index, language=lang, comment=comment, env=env))
    return found


def placeholders(source: str | Path) -> dict[str, str]:
    """The placeholders a page defines for its tests: ``<!-- doc-test: NAME=example ... -->``
    comments, as {NAME: the text the page uses for it}."""
    text = Path(source).read_text(encoding="utf-8") if isinstance(source, Path) else source
    values: dict[str, str] = {}
    for match in _PLACEHOLDERS.finditer(text):
        for word in shlex.split(match.group("body")):
            name, sep, value = word.partition("=")
            if sep:
                values[name] = value
    return values
