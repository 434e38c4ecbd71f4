"""The `headway` command line and the tooling both machines of a deployment use: launching
and stopping Flower's SuperLink and SuperNodes (:mod:`headway.deploy`, :mod:`headway.processes`),
TLS certificates and SuperNode keys (:mod:`headway.credentials`), and per-node data folders
(:mod:`headway.split`). Nothing that runs inside the FAB (the ServerApp, the ClientApp) imports it.
"""

from pathlib import Path as _Path

# The code packages live beside this folder in the repository (core/, client/, server/, strategies/,
# simulation/) and are installed as headway.core, headway.client, ... (pyproject.toml's package-dir).
# Run from a checkout or an unpacked FAB (pyproject.toml beside them), headway.<package> finds them there.
CODE_PACKAGES = ("core", "client", "server", "strategies", "simulation")
_root = _Path(__file__).resolve().parent.parent
if (_root / "pyproject.toml").is_file() and any((_root / name / "__init__.py").is_file() for name in CODE_PACKAGES):
    __path__.append(str(_root))
